/* Writes the descriptors it was started with, one "N TARGET" a line, to
 * the file it is given (or standard output): what a launched program
 * inherits from whatever started it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return 1;
    char listing[4096];
    size_t used = 0;
    struct dirent *entry;
    /* Read before the output is opened: only what the program was given. */
    while ((entry = readdir(dir)) != NULL && used < sizeof listing - 512) {
        if (entry->d_name[0] == '.' || atoi(entry->d_name) == dirfd(dir))
            continue;
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        used += snprintf(listing + used, sizeof listing - used, "%s %s\n", entry->d_name, target);
    }
    closedir(dir);
    FILE *out = argc > 1 ? fopen(argv[1], "w") : stdout;
    if (!out)
        return 1;
    fputs(listing, out);
    return fclose(out) != 0;
}

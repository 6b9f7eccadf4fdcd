/* Writes the descriptors it was started with, one "N TARGET" a line, to
 * the file it is given (or standard output): what a launched program
 * inherits from whatever started it. A BPF map's line says whether the
 * program can map it to write ("writable") or not ("read-only"). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *writable(int fd)
{
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED)
        return " read-only";
    munmap(page, 4096);
    return " writable";
}

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
        const char *how = strcmp(target, "anon_inode:bpf-map") == 0 ? writable(atoi(entry->d_name)) : "";
        used += snprintf(listing + used, sizeof listing - used, "%s %s%s\n", entry->d_name, target, how);
    }
    closedir(dir);
    FILE *out = argc > 1 ? fopen(argv[1], "w") : stdout;
    if (!out)
        return 1;
    fputs(listing, out);
    return fclose(out) != 0;
}

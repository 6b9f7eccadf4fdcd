/* Calls `work`, then prints each mapping of the C library's code as the
 * process sees it in /proc/self/smaps: its size and how much of it is the
 * process's own copy (pages written to, as patches are), in kB, one
 * mapping a line.
 * Usage: libcmaps */
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) int work(int x)
{
    return x * 3 + 1;
}

int main(void)
{
    volatile int sink = work(2);
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (!smaps) {
        perror("/proc/self/smaps");
        return 1;
    }
    char line[512];
    unsigned long size = 0, anonymous;
    int code = 0;
    while (fgets(line, sizeof line, smaps)) {
        unsigned long start, end;
        char perms[5];
        /* A mapping's line starts with its range (the others with a name,
         * which may start with a hexadecimal digit). */
        if (line[strspn(line, "0123456789abcdef")] == '-' && sscanf(line, "%lx-%lx %4s", &start, &end, perms) == 3) {
            code = strcmp(perms, "r-xp") == 0 && strstr(line, "/libc.so");
            size = (end - start) / 1024;
        } else if (code && sscanf(line, "Anonymous: %lu kB", &anonymous) == 1)
            printf("%lu %lu\n", size, anonymous);
    }
    fclose(smaps);
    return sink == 7 ? 0 : 1;
}

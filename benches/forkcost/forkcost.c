/* What a fork and an exit cost a process for the memory it holds: maps
 * PAGES private pages (each touched) and MAPPINGS more one-page mappings
 * (rights alternating, so that none merge), then forks COUNT children
 * that exit at once, one after another. Prints the microseconds of a
 * fork, and from the fork to the child reaped, on average.
 * Usage: forkcost PAGES MAPPINGS COUNT */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: forkcost PAGES MAPPINGS COUNT\n");
        return 2;
    }
    long pages = atol(argv[1]), mappings = atol(argv[2]);
    int count = atoi(argv[3]);
    char *p = mmap(0, (pages + 1) * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *m = mmap(0, (mappings + 1) * 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (long i = 0; i < pages; i++)
        p[i * 4096] = 1;
    for (long i = 0; i < mappings; i++)
        mprotect(m + (2 * i + 1) * 4096, 4096, PROT_READ);
    double forking = 0, whole = 0;
    for (int i = 0; i < count; i++) {
        double start = now_ns();
        pid_t child = fork();
        if (child == 0)
            _exit(0);
        double forked = now_ns();
        waitpid(child, 0, 0);
        forking += forked - start;
        whole += now_ns() - start;
    }
    printf("%ld pages, %ld mappings: fork %.1f us, fork to reaped %.1f us\n", pages, mappings, forking / count / 1000,
           whole / count / 1000);
    return 0;
}

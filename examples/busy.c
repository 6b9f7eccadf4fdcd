/* A function doing a little work per call (about a hundred nanoseconds),
 * called millions of times: instrumented throughout, it would cost the
 * program a third of its time, so the overhead governor throttles it; it
 * is still where the program spends its time.
 * Usage: busy [MILLIONS [CHILDREN]]   default 5, no children: each forked
 * child makes as many calls as the parent, first. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) unsigned long step(unsigned long x)
{
    for (int i = 0; i < 100; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

int main(int argc, char **argv)
{
    long calls = (long)((argc > 1 ? atof(argv[1]) : 5) * 1e6);
    int children = argc > 2 ? atoi(argv[2]) : 0;
    unsigned long x = 1;
    for (int c = 0; c < children; c++) {
        pid_t child = fork();
        if (child == 0) {
            for (long i = 0; i < calls; i++)
                x = step(x);
            sink = x;
            _exit(0);
        }
        waitpid(child, NULL, 0);
    }
    for (long i = 0; i < calls; i++)
        x = step(x);
    sink = x;
    printf("%lu\n", x % 1000);
    return 0;
}

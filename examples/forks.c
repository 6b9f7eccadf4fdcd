/* Forked children: the parent calls work() N times, its child M times, and
 * a second child executes another program (given as arguments).
 *
 * Usage: forks [N [M [PROGRAM ARGS...]]]   defaults: 100, 50, no exec.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100;
    long m = argc > 2 ? atol(argv[2]) : 50;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < m; i++)
            work(i);
        _exit(0);
    }
    for (long i = 0; i < n; i++)
        work(i);
    waitpid(child, NULL, 0);
    if (argc > 3) {
        pid_t runner = fork();
        if (runner == 0) {
            execvp(argv[3], argv + 3);
            _exit(127);
        }
        waitpid(runner, NULL, 0);
    }
    printf("parent %ld, child %ld\n", n, m);
    return 0;
}

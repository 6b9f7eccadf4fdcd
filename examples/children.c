/* Forks N children one after another, waiting for each: the parent calls
 * work() before each fork, the child once before it exits. Prints the
 * microseconds each child took, fork to wait.
 *
 * Usage: children [N]   default 1000.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        work(i);
        pid_t child = fork();
        if (child == 0) {
            work(i);
            _exit(0);
        }
        if (child < 0 || waitpid(child, NULL, 0) != child) {
            perror("children");
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1000);
    return 0;
}

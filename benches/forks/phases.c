/* Where a forked child's time goes: N times, the parent calls work(),
 * forks a child that calls work() once and exits, and waits for it.
 * Prints the mean microseconds from fork() to the child's first
 * instruction after it, of the child's own run (its call into the
 * runtime included, where it is patched), and from the child's exit to
 * the parent's wait returning.
 *
 * Usage: phases N
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    /* The child's two times, where the parent reads them. */
    double *child = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (n < 1 || child == MAP_FAILED)
        return 1;
    double forking = 0, running = 0, ending = 0;
    for (long i = 0; i < n; i++) {
        work(i);
        double forked = now_us();
        pid_t pid = fork();
        if (pid == 0) {
            child[0] = now_us();
            work(i);
            child[1] = now_us();
            _exit(0);
        }
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) != pid)
            return 1;
        double waited = now_us();
        forking += child[0] - forked;
        running += child[1] - child[0];
        ending += waited - child[1];
    }
    printf("fork to child %.1f us, child %.1f us, exit to wait %.1f us\n", forking / n, running / n, ending / n);
    return 0;
}

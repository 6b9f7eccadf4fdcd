/* Two threads calling one function, a couple of hundred nanoseconds of
 * work a call, millions of times: throttled, its calls go on being
 * counted. In one counter both threads increment, each increment would
 * wait for the other CPU to give the counter's cache line back; each CPU
 * counts in a counter of its own.
 * Usage: contended [MILLIONS [STEPS [traced-child]]]   calls per thread,
 * default 5; steps of work a call, default 200; with traced-child, a
 * forked child that its parent traces (so that no one else can) does the
 * same beside it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

volatile unsigned long sink;
static int steps = 200;

__attribute__((noinline)) unsigned long work(unsigned long x)
{
    for (int i = 0; i < steps; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

static void *calls(void *millions)
{
    unsigned long x = 1, n = (unsigned long)millions * 1000000;
    for (unsigned long i = 0; i < n; i++)
        x = work(x);
    sink = x;
    return 0;
}

int main(int argc, char **argv)
{
    unsigned long millions = argc > 1 ? strtoul(argv[1], 0, 10) : 5;
    if (argc > 2)
        steps = atoi(argv[2]);
    pid_t child = -1;
    if (argc > 3 && strcmp(argv[3], "traced-child") == 0) {
        child = fork();
        if (child < 0)
            return 1;
        if (child == 0 && ptrace(PTRACE_TRACEME, 0, 0, 0) != 0)
            return 1;
    }
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], 0, calls, (void *)millions);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], 0);
    if (child > 0) {
        int status;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 1;
    }
    printf("%lu\n", sink);
    return 0;
}

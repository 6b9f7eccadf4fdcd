/* Two threads calling one function, a couple of hundred nanoseconds of
 * work a call, millions of times: throttled, its calls go on being
 * counted in one counter both threads increment, and each increment
 * waits for the other CPU to give the counter's cache line back.
 * Usage: contended [MILLIONS [STEPS]]   calls per thread, default 5; steps
 * of work a call, default 200. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

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
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], 0, calls, (void *)millions);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], 0);
    printf("%lu\n", sink);
    return 0;
}

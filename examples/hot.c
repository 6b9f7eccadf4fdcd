/* A tiny function called tens of millions of times, next to a function
 * called a few times: what the overhead governor is for.
 * Usage: hot [MILLIONS]   default 30 (may be fractional).
 * Prints its result, and on stderr how long main took in milliseconds. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

volatile long sink;

__attribute__((noinline)) void tiny(long i)
{
    sink += i;
}

__attribute__((noinline)) long rare(long n)
{
    long total = 0;
    for (long i = 0; i < n; i++)
        total += i % 7;
    return total;
}

int main(int argc, char **argv)
{
    double start = now_ms();
    long n = (long)((argc > 1 ? atof(argv[1]) : 30) * 1e6);
    long total = 0;
    for (int round = 0; round < 10; round++) {
        for (long i = 0; i < n / 10; i++)
            tiny(i);
        total += rare(1000000);
    }
    printf("%ld %ld\n", total, sink);
    fprintf(stderr, "elapsed_ms %.3f\n", now_ms() - start);
    return 0;
}

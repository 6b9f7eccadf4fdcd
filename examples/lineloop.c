/* Loops for line-count benchmarks: N iterations of a loop of a few lines,
 * a branch and a call, about 6 line entries each; then a loop of N turns
 * in spin(), which burst() calls last (its call is followed by nothing but
 * its return: a counter there can only count in the call's stub).
 * Usage: lineloop [N]   default 10000000. */
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;

static long step(long x)
{
    return x * 3 + 1;
}

static void spin(long n)
{
    for (long k = 0; k < n; k++)
        sink += k;
}

static void burst(long n)
{
    spin(n);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    long total = 0;
    for (long i = 0; i < n; i++) {
        if (i % 3 == 0)
            total += step(i);
        else
            total -= i;
        total ^= i;
    }
    burst(n);
    printf("%ld\n", total);
    return 0;
}

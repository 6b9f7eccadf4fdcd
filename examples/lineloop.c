/* Loops for line-count benchmarks: N iterations of a loop of a few lines,
 * a branch and a call, about 6 line entries each.
 * Usage: lineloop [N]   default 10000000. */
#include <stdio.h>
#include <stdlib.h>

static long step(long x)
{
    return x * 3 + 1;
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
    printf("%ld\n", total);
    return 0;
}

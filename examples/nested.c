/* A recursive walk whose outermost call lasts the whole run, calling a
 * leaf millions of times: the governor throttles walk and leaf while that
 * outermost call is under way, and the probes time it to its end. Its
 * measured exclusive time then holds all that the calls below it took
 * after the throttle, which the samples give back to leaf, where the
 * program spends its time.
 * Usage: nested [FAN]   default 1000 (FAN * FAN walks of 3 leaf calls) */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) unsigned long leaf(unsigned long x)
{
    for (int i = 0; i < 30; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

unsigned long walk(int depth, long fan, unsigned long x);

/* Inlined into walk: the return addresses of walk's calls below sit in it,
 * so a sampled stack names it, inlined, beside each walk frame. */
static inline __attribute__((always_inline)) unsigned long descend(int depth, long fan, unsigned long x)
{
    for (long i = 0; i < fan; i++)
        x = walk(depth - 1, fan, x);
    return x;
}

__attribute__((noinline)) unsigned long walk(int depth, long fan, unsigned long x)
{
    if (depth == 0) {
        for (int i = 0; i < 3; i++)
            x = leaf(x);
        return x;
    }
    x = descend(depth, fan, x);
    sink += x; /* not a tail call */
    return x;
}

int main(int argc, char **argv)
{
    long fan = argc > 1 ? atol(argv[1]) : 1000;
    unsigned long x = walk(2, fan, 1);
    printf("%lu\n", x % 1000);
    return 0;
}

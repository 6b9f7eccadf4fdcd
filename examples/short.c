/* A function too short to patch (it returns within its first five bytes,
 * where the engine's jump would go, and the next function starts right
 * after it: no padding to take), called from one that can be patched and
 * that the governor throttles: under a governor, with sampling off, the
 * short one is left unmeasured, not given a kernel probe.
 * Usage: short [MILLIONS]   default 3 */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

/* Four bytes (lea eax, [rdi+rdi]; ret), and thrice() placed right after
 * it, unaligned. */
__attribute__((noinline)) unsigned twice(unsigned x)
{
    return x + x;
}

__attribute__((noinline, optimize("align-functions=1"))) unsigned thrice(unsigned x)
{
    return x * 3;
}

__attribute__((noinline)) unsigned long step(unsigned long x)
{
    for (int i = 0; i < 20; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return twice((unsigned)x) + (x & 1 ? 0 : thrice((unsigned)x));
}

int main(int argc, char **argv)
{
    long calls = (long)((argc > 1 ? atof(argv[1]) : 3) * 1e6);
    unsigned long x = 1;
    for (long i = 0; i < calls; i++)
        x = step(x);
    sink = x;
    printf("%lu\n", x % 1000);
    return 0;
}

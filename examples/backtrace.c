// Calls backtrace() from three instrumented frames deep, through a fourth
// that tail-calls it (at -O2, a jump): the stack it reports must be the
// program's own, whatever instruments the calls.
//
// Usage: backtrace [N]   default 10. Prints how deep the stack was and
// whether outer, middle, inner and main were in it (names need -rdynamic).
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int depth_seen, names_seen;

__attribute__((noinline)) int walk(void **frames, int most)
{
    return backtrace(frames, most);
}

__attribute__((noinline)) int inner(int n)
{
    void *frames[64];
    int depth = walk(frames, 64);
    char **names = backtrace_symbols(frames, depth);
    const char *wanted[] = {"(inner+", "(middle+", "(outer+", "(main+"};
    int seen = 0;
    for (int i = 0; i < depth && names; i++)
        for (int w = 0; w < 4; w++)
            if (strstr(names[i], wanted[w]))
                seen |= 1 << w;
    free(names);
    depth_seen = depth;
    names_seen = seen;
    return n + 1;
}

__attribute__((noinline)) int middle(int n)
{
    return inner(n) * 2;
}

__attribute__((noinline)) int outer(int n)
{
    int sum = 0;
    for (int i = 0; i < 3; i++)
        sum += middle(n + i);
    return sum;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    long total = 0;
    for (int i = 0; i < n; i++)
        total += outer(i);
    printf("total=%ld depth=%d inner=%d middle=%d outer=%d main=%d\n", total, depth_seen, names_seen & 1, (names_seen >> 1) & 1,
           (names_seen >> 2) & 1, (names_seen >> 3) & 1);
    return 0;
}

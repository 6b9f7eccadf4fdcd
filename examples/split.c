/* A known CPU split: work_a does 70% of the work and work_b 30%, in
 * alternating slices, both reached through main -> run -> middle. mix() is
 * inlined into both; clear() spends time in libc's memset.
 *
 * Usage: split [MILLIONS]   default 200 (iterations in millions, in all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline __attribute__((always_inline)) unsigned mix(unsigned x)
{
    x ^= x << 13;
    x ^= x >> 17;
    return x ^ (x << 5);
}

volatile unsigned sink;

__attribute__((noinline)) void work_a(long n)
{
    unsigned x = 1;
    for (long i = 0; i < n; i++)
        x = mix(x + i);
    sink = x;
}

__attribute__((noinline)) void work_b(long n)
{
    unsigned x = 2;
    for (long i = 0; i < n; i++)
        x = mix(x + i);
    sink = x;
}

static char buffer[1 << 16];

__attribute__((noinline)) void clear(int rounds)
{
    for (int r = 0; r < rounds; r++) {
        memset(buffer, r, sizeof buffer);
        sink += buffer[r & 0xffff];
    }
}

__attribute__((noinline)) void middle(long slice)
{
    work_a(slice * 7);
    work_b(slice * 3);
}

__attribute__((noinline)) void run(long total)
{
    long slice = 100000;
    for (long done = 0; done < total; done += slice * 10)
        middle(slice);
}

int main(int argc, char **argv)
{
    long millions = argc > 1 ? atol(argv[1]) : 200;
    run(millions * 1000000);
    clear(3000);
    printf("%u\n", sink);
    return 0;
}

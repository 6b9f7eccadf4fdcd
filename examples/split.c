/* A known CPU split: work_a does 70% of the work and work_b 30%, in
 * alternating slices, both reached through main -> run -> middle. mix() is
 * inlined into both; clear() spends time in libc's memset.
 *
 * Usage: split [MILLIONS [CLEARS]]   default 200 (iterations in millions, in
 * all) and 3000 (rounds of clear). */
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

/* Slices of varying length, so that no sampling period can keep meeting
 * the same phase of the alternation (a fixed slice near a multiple of the
 * period would be sampled unevenly). */
__attribute__((noinline)) void run(long total)
{
    unsigned long seed = 12345;
    long slice;
    for (long done = 0; done < total; done += slice * 10) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        slice = 5000 + (long)(seed >> 33) % 10000;
        middle(slice);
    }
}

int main(int argc, char **argv)
{
    long millions = argc > 1 ? atol(argv[1]) : 200;
    int clears = argc > 2 ? atoi(argv[2]) : 3000;
    run(millions * 1000000);
    clear(clears);
    printf("%u\n", sink);
    return 0;
}

/* setjmp/longjmp through instrumented functions: dive() recurses and, at
 * the bottom, longjmps back to main, so its calls never return; surface()
 * is then called from the very stack slot the first dive() used. With
 * PAUSE_MS, each round sleeps that long after the jump, in the C library.
 * Usage: jumps [ROUNDS [DEPTH [PAUSE_MS]]]   defaults: 100 rounds, depth 5, 0. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static jmp_buf back;
volatile long sink;

__attribute__((noinline)) void dive(int depth)
{
    sink += depth;
    if (depth == 0)
        longjmp(back, 1);
    dive(depth - 1);
    sink -= 1; /* not a tail call */
}

__attribute__((noinline)) long surface(long x)
{
    sink += x;
    return x * 2;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    int depth = argc > 2 ? atoi(argv[2]) : 5;
    int pause_ms = argc > 3 ? atoi(argv[3]) : 0;
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        if (setjmp(back) == 0)
            dive(depth);
        else if (pause_ms)
            usleep(pause_ms * 1000);
        total += surface(r);
    }
    printf("%ld %ld\n", total, sink);
    return 0;
}

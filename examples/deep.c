/* Recursion DEPTH calls deep, ROUNDS times: down() is called (DEPTH + 1) *
 * ROUNDS times, as deep as DEPTH + 1 frames.
 * Usage: deep [DEPTH [ROUNDS]]   defaults: 1000 and 3. */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) long down(int n)
{
    if (n == 0)
        return 0;
    long below = down(n - 1);
    sink = below; /* work after the call: no tail call, no loop */
    return below + 1;
}

int main(int argc, char **argv)
{
    int depth = argc > 1 ? atoi(argv[1]) : 1000;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    long total = 0;
    for (int r = 0; r < rounds; r++)
        total += down(depth);
    printf("%ld\n", total);
    return 0;
}

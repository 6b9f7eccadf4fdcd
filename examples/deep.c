/* Recursion DEPTH calls deep, ROUNDS times: down() is called (DEPTH + 1) *
 * ROUNDS times, as deep as DEPTH + 1 frames. With FORK 1, the first round's
 * deepest call forks a child, which returns from all of them and goes on
 * as the parent does (forking no more); the parent waits for it.
 * Usage: deep [DEPTH [ROUNDS [FORK]]]   defaults: 1000, 3 and 0. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;
static int fork_at_bottom;

__attribute__((noinline)) long down(int n)
{
    if (n == 0 && fork_at_bottom) {
        fork_at_bottom = 0;
        pid_t child = fork();
        if (child > 0)
            waitpid(child, 0, 0);
    }
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
    fork_at_bottom = argc > 3 && atoi(argv[3]);
    long total = 0;
    for (int r = 0; r < rounds; r++)
        total += down(depth);
    printf("%ld\n", total);
    return 0;
}

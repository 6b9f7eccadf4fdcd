/* Calls counter_add() N times through the shared library libcounter.so.
 * Usage: uselib [N]   default 100. */
#include <stdio.h>
#include <stdlib.h>
#include "counter.h"

/* Counted in memory by main itself: work of its own, where samples land
 * in its lines (a loop of register moves and a call would give them all
 * to the callee and the PLT). */
static volatile long calls_made;

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100;
    for (long i = 0; i < n; i++) {
        counter_add(i);
        calls_made++;
    }
    printf("total=%ld\n", counter_total());
    return 0;
}

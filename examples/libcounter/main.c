/* Calls counter_add() N times through the shared library libcounter.so.
 * Usage: uselib [N]   default 100. */
#include <stdio.h>
#include <stdlib.h>
#include "counter.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100;
    for (long i = 0; i < n; i++)
        counter_add(i);
    printf("total=%ld\n", counter_total());
    return 0;
}

/* Reads the monotonic clock N times: the C library's clock_gettime calls
 * the kernel's vDSO, code the kernel maps into every process and no file
 * holds.
 * Usage: clock [N]   default 3000000. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3000000;
    long sum = 0;
    struct timespec t;
    for (long i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        sum += t.tv_nsec & 1;
    }
    printf("%ld odd readings\n", sum);
    return 0;
}

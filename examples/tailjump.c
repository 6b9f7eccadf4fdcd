/* Functions whose entry is also their only exit: wrapper() is one tail
 * jump to body() at -O2, nothing() one `ret`. main calls each N times.
 *
 * Usage: tailjump [N]   default 1000.
 */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) long body(long x)
{
    sink += x;
    return sink * 3;
}

__attribute__((noinline)) long wrapper(long x)
{
    return body(x);
}

__attribute__((noinline)) void nothing(void)
{
    __asm__ volatile("");
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long total = 0;
    for (long i = 0; i < n; i++) {
        total += wrapper(i);
        nothing();
    }
    printf("%ld\n", total & 0xff);
    return 0;
}

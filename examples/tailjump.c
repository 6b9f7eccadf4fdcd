/* Functions whose entry is also their only exit: wrapper() is one tail
 * jump to body() at -O2, nothing() one `ret`; and none(), whose 5 bytes
 * end with its `ret` (`xor eax,eax; xor edx,edx; ret`). main calls each N
 * times.
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

struct pair {
    long a, b;
};

__attribute__((noinline)) struct pair none(void)
{
    return (struct pair){0, 0};
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long total = 0;
    for (long i = 0; i < n; i++) {
        total += wrapper(i);
        nothing();
        total += none().b;
    }
    printf("%ld\n", total & 0xff);
    return 0;
}

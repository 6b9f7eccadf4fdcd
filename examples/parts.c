/* One function called often enough for the overhead governor to take its
 * probes out, then 128 small functions, each called three times: the uprobe
 * engine keeps its probes in parts, and defines again only the part of a
 * function whose probes change.
 * Usage: parts [HOT_CALLS]   default 300000 */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

#define F(n) __attribute__((noinline)) void f##n(long i) { sink += i + n; }
#define F8(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7)
F8(1) F8(2) F8(3) F8(4) F8(5) F8(6) F8(7) F8(8)
F8(9) F8(10) F8(11) F8(12) F8(13) F8(14) F8(15) F8(16)

#define C(n) f##n(i);
#define C8(n) C(n##0) C(n##1) C(n##2) C(n##3) C(n##4) C(n##5) C(n##6) C(n##7)
__attribute__((noinline)) void each(long i)
{
    C8(1) C8(2) C8(3) C8(4) C8(5) C8(6) C8(7) C8(8)
    C8(9) C8(10) C8(11) C8(12) C8(13) C8(14) C8(15) C8(16)
}

__attribute__((noinline)) void hot(long i)
{
    sink += i;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 300000;
    for (long i = 0; i < calls; i++)
        hot(i);
    for (long i = 0; i < 3; i++)
        each(i);
    printf("%ld\n", sink);
    return 0;
}

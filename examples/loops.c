/* Loops written on one line, which gcov counts once per entry and once per
 * turn: a for, a while, two nested fors, a string walk.
 * Usage: loops [N]   default 10 (at most 1000). */
#include <stdlib.h>

static volatile long sink;
static int nums[32];

static void reset(void)
{
    int i;
    for (i = 0; i < 32; i++) nums[i] = 0;
}

static long count_down(long n)
{
    while (n > 0) n--;
    return n;
}

static long nested(int n)
{
    long s = 0;
    for (int i = 0; i < n; i++) for (int j = 0; j < i; j++) s += j;
    return s;
}

static long length(const char *p)
{
    const char *q = p;
    while (*q) q++;
    return q - p;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    if (n > 1000)
        n = 1000;
    for (int k = 0; k < n; k++) {
        reset();
        sink += count_down(k);
        sink += nested(k % 20);
        sink += length("a string of some length");
    }
    return 0;
}

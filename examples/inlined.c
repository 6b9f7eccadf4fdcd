/* Statements that run code inlined from a header (inlined.h): a read in
 * the middle of a statement, and a loop inside a call. Their lines count
 * the same whether the header's lines are counted too or not. */
#include <stdio.h>
#include <stdlib.h>
#include "inlined.h"

__attribute__((noinline)) unsigned histogram(const unsigned char *ip, const unsigned char *end, unsigned *h)
{
    unsigned cached = read32(ip);
    ip += 4;
    while (ip < end - 8) {
        unsigned c = cached;
        cached = read32(ip);
        ip += 4;
        h[c & 0xff]++;
        h[(c >> 8) & 0xff]++;
    }
    return cached;
}

__attribute__((noinline)) unsigned matches(const unsigned char *buf, unsigned n)
{
    unsigned total = 0;
    for (unsigned i = 1; i < n; i++) {
        total += count_equal(buf + i, buf, buf + n);
    }
    return total;
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;
    unsigned char *buf = malloc(n + 16);
    if (!buf)
        return 1;
    for (unsigned i = 0; i < n + 16; i++)
        buf[i] = (unsigned char)((i * 7 + i / 13) % 3);
    unsigned h[256] = {0};
    unsigned r = 0;
    for (int k = 0; k < 10; k++)
        r += histogram(buf, buf + n, h) + matches(buf, n / 10);
    printf("%u %u\n", r, h[1]);
    free(buf);
    return 0;
}

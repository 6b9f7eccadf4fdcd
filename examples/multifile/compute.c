#include "compute.h"

__attribute__((noinline)) static unsigned long checksum(unsigned long seed, int n)
{
    unsigned long h = seed;
    for (int i = 0; i < n; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
    }
    return h;
}

unsigned long process(const struct record *rec, int rounds)
{
    unsigned long total = 0;
    for (int r = 0; r < rounds; r++)
        total += checksum((unsigned long)rec->id * 31 + rec->value + r, 100);
    return total;
}

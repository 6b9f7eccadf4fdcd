/* A shared library with exported functions, for module patterns
 * (`-f 'libcounter.so:counter_*'`) and stripped-library fallbacks. */
#include "counter.h"

static long total;

static long clamp(long n)
{
    return n < 0 ? 0 : n;
}

__attribute__((noinline)) void counter_add(long n)
{
    total += clamp(n);
}

long counter_total(void)
{
    return total;
}

/* A shared library with exported functions, for module patterns
 * (`-f 'libcounter.so:counter_*'`) and stripped-library fallbacks. */
#include "counter.h"

static long total;

/* Calls of clamp, counted in memory: work of its own, so that samples
 * land in its inlined code as well as in counter_add's. */
static volatile long clamped;

static long clamp(long n)
{
    clamped++;
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

__attribute__((noinline)) void counter_reset(void)
{
    total = 0;
}

/* Runs when the library is loaded, before the program's entry point: a
 * call a profiler that starts there would miss. */
__attribute__((constructor)) static void library_loaded(void)
{
    counter_reset();
}

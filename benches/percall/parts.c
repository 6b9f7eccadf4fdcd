/* What the instructions a counted or timed call cannot do without cost
 * here, each in a loop of its own: reading the TSC (twice a timed call),
 * the running CPU's id (`rdpid`, once a counted call), and a counter's
 * increment with and without `lock` after four stores (a counted call
 * in code that has just stored, where a locked increment waits for them).
 * Prints one line each: name, nanoseconds an iteration (`rdpid` left out
 * where the processor lacks it). */
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static long counters[64];
static long stored[1 << 20];

static void stores(long i)
{
    long *p = &stored[(i * 64) & ((1 << 20) - 1)];
    p[0] = i, p[8] = i, p[16] = i, p[24] = i;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    uint64_t sink = 0;
    double t = now_ns();
    for (long i = 0; i < n; i++) {
        uint32_t lo, hi;
        __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
        sink += lo;
    }
    printf("rdtsc %.2f\n", (now_ns() - t) / n);
    unsigned a, b, c, d;
    /* CPUID leaf 7: ECX bit 22 says the processor has RDPID. */
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22))) {
        t = now_ns();
        for (long i = 0; i < n; i++) {
            uint64_t cpu;
            __asm__ volatile("rdpid %0" : "=r"(cpu));
            sink += cpu;
        }
        printf("rdpid %.2f\n", (now_ns() - t) / n);
    }
    const char *names[] = {"stores", "stores+inc", "stores+lock-inc"};
    for (int mode = 0; mode < 3; mode++) {
        t = now_ns();
        for (long i = 0; i < n; i++) {
            stores(i);
            if (mode == 1)
                __asm__ volatile("incq %0" : "+m"(counters[8])::"memory");
            else if (mode == 2)
                __asm__ volatile("lock incq %0" : "+m"(counters[8])::"memory");
            else
                __asm__ volatile("" ::: "memory");
        }
        printf("%s %.2f\n", names[mode], (now_ns() - t) / n);
    }
    volatile uint64_t kept = sink;
    (void)kept;
    return 0;
}

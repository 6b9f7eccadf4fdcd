/* A program to judge `proftap diff` on: each constant below stands for a
 * change between two builds (gcc -DBURN_UNITS=40 ...).
 *   regress few    outer() -> middle() -> burn() 3 times: few, long calls
 *   regress tiny   tiny() called 20,000 times: many short calls
 *   regress runs [N]  slowed() and steady() N times each (300), the same work
 *                  unless SLOWED_PCT says slowed() does more */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef BURN_UNITS
#define BURN_UNITS 20
#endif
#ifndef TINY_SPIN
#define TINY_SPIN 40
#endif
#ifndef SLOWED_PCT
#define SLOWED_PCT 100
#endif

volatile unsigned long sink;

/* Work in a register, n steps: a loop storing to memory runs at one speed
 * or half of it depending on where the loader put the data. */
static void spin(long n)
{
    unsigned long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += (unsigned long)i * i;
        __asm__ volatile("" : "+r"(sum));
    }
    sink += sum;
}

/* A unit is about a millisecond here. */
__attribute__((noinline)) void burn(void)
{
    spin(BURN_UNITS * 1250000L);
}

__attribute__((noinline)) void middle(void)
{
    for (int i = 0; i < 3; i++)
        burn();
}

__attribute__((noinline)) void outer(void)
{
    middle();
    sink++;
}

/* One instruction: too short for the in-process engine's jump. */
__attribute__((naked)) void bare(void)
{
    __asm__("ret");
}

__attribute__((noinline)) void tiny(void)
{
    spin(TINY_SPIN);
}

/* Work and fresh memory: 20 pages, each a page fault, 10% more of both
 * when SLOWED_PCT is 110. */
static void work(int pct)
{
    long pages = 20L * pct / 100, size = pages * 4096;
    char *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
        abort();
    for (long i = 0; i < size; i += 4096)
        memory[i] = 1;
    munmap(memory, size);
    spin(20000L * pct / 100);
}

__attribute__((noinline)) void slowed(void)
{
    work(SLOWED_PCT);
}

__attribute__((noinline)) void steady(void)
{
    work(100);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "few";
    if (strcmp(mode, "few") == 0) {
        bare();
        outer();
    } else if (strcmp(mode, "tiny") == 0) {
        for (int i = 0; i < 20000; i++)
            tiny();
    } else if (strcmp(mode, "runs") == 0) {
        int calls = argc > 2 ? atoi(argv[2]) : 300;
        for (int i = 0; i < calls; i++) {
            slowed();
            steady();
        }
    } else {
        fprintf(stderr, "usage: regress [few|tiny|runs]\n");
        return 2;
    }
    printf("%lu\n", sink);
    return 0;
}

/* Two functions doing the same work per unit: steady() always one unit per
 * call, scaled() as many units per call as asked. Comparing profiles of
 * `workload 1` and `workload 2` shows scaled() doubling and steady() not.
 * Usage: workload [UNITS [CALLS]]   defaults: 1 unit, 40 calls each. */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

/* Work in a register: a loop storing to memory runs at one speed or half
 * of it depending on where the loader put the stack and the data, so two
 * runs of the same program would differ by two. */
static void unit(void)
{
    unsigned long sum = 0;
    for (int i = 0; i < 200000; i++) {
        sum += (unsigned long)i * i;
        __asm__ volatile("" : "+r"(sum));
    }
    sink += sum;
}

__attribute__((noinline)) void steady(void)
{
    unit();
}

__attribute__((noinline)) void scaled(int units)
{
    for (int u = 0; u < units; u++)
        unit();
}

int main(int argc, char **argv)
{
    int units = argc > 1 ? atoi(argv[1]) : 1;
    int calls = argc > 2 ? atoi(argv[2]) : 40;
    for (int c = 0; c < calls; c++) {
        steady();
        scaled(units);
    }
    printf("%lu\n", sink);
    return 0;
}

/* A program in phases, each calling a tiny function of its own millions of
 * times: the overhead governor takes each out in turn, as it does the new
 * hot functions of each phase of a real program (a parser, then a sort).
 * Usage: phases [PHASES] [MILLIONS]   defaults 8 and 2. */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

#define PHASE(n)                                                                                                                           \
    __attribute__((noinline)) void phase##n(long i)                                                                                         \
    {                                                                                                                                      \
        sink += i ^ n;                                                                                                                     \
    }
PHASE(0)
PHASE(1)
PHASE(2)
PHASE(3)
PHASE(4)
PHASE(5)
PHASE(6)
PHASE(7)

static void (*const phases[])(long) = { phase0, phase1, phase2, phase3, phase4, phase5, phase6, phase7 };

int main(int argc, char **argv)
{
    int count = argc > 1 ? atoi(argv[1]) : 8;
    long calls = (long)((argc > 2 ? atof(argv[2]) : 2.0) * 1e6);
    if (count < 0 || count > 8) {
        fprintf(stderr, "phases: between 0 and 8 phases\n");
        return 2;
    }
    for (int p = 0; p < count; p++)
        for (long i = 0; i < calls; i++)
            phases[p](i);
    printf("%ld\n", sink);
    return 0;
}

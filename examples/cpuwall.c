/* Tells CPU time from wall time: burn(ms) spins on the CPU for MS
 * milliseconds of thread CPU time; nap(ms) sleeps for MS milliseconds.
 * main calls each ROUNDS times.
 *
 * Usage: cpuwall [MS [ROUNDS]]   defaults: 20 and 3.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

volatile unsigned long spin;

__attribute__((noinline)) void burn(int ms)
{
    long long end = now_ns(CLOCK_THREAD_CPUTIME_ID) + ms * 1000000LL;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) < end)
        for (int i = 0; i < 1000; i++)
            spin++;
}

__attribute__((noinline)) void nap(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    int ms = argc > 1 ? atoi(argv[1]) : 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    for (int r = 0; r < rounds; r++) {
        burn(ms);
        nap(ms);
    }
    printf("burned and napped %d x %d ms\n", rounds, ms);
    return 0;
}

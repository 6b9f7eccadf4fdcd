/* Two threads of one process, both on the first CPU, hand a byte to each
 * other through two pipes N times (argument, default 100000): two context
 * switches a round trip and little else, what a server answering a client
 * on one CPU does. Prints the round trips made and their average time. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int there[2], back[2];
static long rounds;

static void *answer(void *unused)
{
    char byte;
    for (long i = 0; i < rounds; i++)
        if (read(there[0], &byte, 1) != 1 || write(back[1], &byte, 1) != 1)
            exit(2);
    return unused;
}

int main(int argc, char **argv)
{
    rounds = argc > 1 ? atol(argv[1]) : 100000;
    cpu_set_t first;
    CPU_ZERO(&first);
    CPU_SET(0, &first);
    if (sched_setaffinity(0, sizeof first, &first) != 0 || pipe(there) != 0 || pipe(back) != 0)
        return 1;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pthread_t other;
    if (pthread_create(&other, NULL, answer, NULL) != 0)
        return 1;
    char byte = 'x';
    for (long i = 0; i < rounds; i++)
        if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1)
            return 2;
    pthread_join(other, NULL);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("%ld round trips, %.2f us each\n", rounds, ns / rounds / 1000.0);
    return 0;
}

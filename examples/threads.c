/* Threads with known per-thread call counts: thread t (0-based) calls work()
 * (t + 1) * PER_THREAD times. The main thread calls work() PER_THREAD times.
 *
 * Usage: threads [THREADS [PER_THREAD [serial]]]   defaults: 4 and 1000;
 * with "serial", each thread ends before the next starts (the C library
 * then gives the next one the same stack and thread control block).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long per_thread = 1000;
volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static void *worker(void *arg)
{
    long t = (long)arg;
    for (long i = 0; i < (t + 1) * per_thread; i++)
        work(i);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        per_thread = atol(argv[2]);
    int serial = argc > 3 && strcmp(argv[3], "serial") == 0;
    pthread_t ids[64];
    if (threads > 64)
        threads = 64;
    for (long t = 0; t < threads; t++) {
        if (pthread_create(&ids[t], NULL, worker, (void *)t) != 0) {
            perror("pthread_create");
            return 1;
        }
        if (serial)
            pthread_join(ids[t], NULL);
    }
    for (long i = 0; i < per_thread; i++)
        work(i);
    for (int t = 0; t < threads && !serial; t++)
        pthread_join(ids[t], NULL);
    printf("threads=%d per_thread=%ld\n", threads, per_thread);
    return 0;
}

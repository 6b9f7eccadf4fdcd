/* Threads with known per-thread call counts: thread t (0-based) calls work()
 * (t + 1) * PER_THREAD times. The main thread calls work() PER_THREAD times.
 *
 * Usage: threads [THREADS [PER_THREAD [serial|together]]]   defaults: 4 and
 * 1000; with "serial", each thread ends before the next starts (the C
 * library then gives the next one the same stack and thread control block);
 * with "together", every thread calls work() PER_THREAD times, all of them
 * alive at once (they start calling when the last has been made).
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

static int together;
static pthread_barrier_t all_made;

static void *worker(void *arg)
{
    long t = (long)arg;
    if (together)
        pthread_barrier_wait(&all_made);
    long calls = together ? per_thread : (t + 1) * per_thread;
    for (long i = 0; i < calls; i++)
        work(i);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        per_thread = atol(argv[2]);
    int serial = argc > 3 && strcmp(argv[3], "serial") == 0;
    together = argc > 3 && strcmp(argv[3], "together") == 0;
    if (threads < 0 || threads > 100000)
        threads = 4;
    pthread_t *ids = calloc(threads ? threads : 1, sizeof *ids);
    if (!ids)
        return 1;
    pthread_attr_t small;
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, 64 * 1024);
    if (together)
        pthread_barrier_init(&all_made, NULL, threads + 1);
    for (long t = 0; t < threads; t++) {
        if (pthread_create(&ids[t], &small, worker, (void *)t) != 0) {
            perror("pthread_create");
            return 1;
        }
        if (serial)
            pthread_join(ids[t], NULL);
    }
    if (together)
        pthread_barrier_wait(&all_made);
    for (long i = 0; i < per_thread; i++)
        work(i);
    for (int t = 0; t < threads && !serial; t++)
        pthread_join(ids[t], NULL);
    printf("threads=%d per_thread=%ld\n", threads, per_thread);
    free(ids);
    return 0;
}

/* A threaded program that changes its user id again and again (to the
 * one it has): the C library has each thread change its own, by a signal
 * of its own it sends them and heeds only when it comes from the process
 * itself, and waits for every thread to have done it. A profiler holding
 * the program must pass that signal on as it came, or setuid() never
 * returns. THREADS threads (default 8) and the main thread call work()
 * meanwhile, more than the CPUs: a thread sent the signal waits its turn
 * to heed it. It says "started" as it starts, and stops when its input
 * ends; then it prints how many times it changed its user id.
 *
 * Usage: setxid [THREADS] < input
 */
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

volatile long sink;
static volatile int stop;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static void *calling(void *unused)
{
    (void)unused;
    for (long i = 0; !stop; i++)
        work(i);
    return 0;
}

static void *watch_input(void *unused)
{
    (void)unused;
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0)
        ;
    stop = 1;
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 8;
    if (n < 0 || n > 64)
        n = 8;
    pthread_t threads[65];
    pthread_create(&threads[0], 0, watch_input, 0);
    for (int t = 1; t <= n; t++)
        pthread_create(&threads[t], 0, calling, 0);
    printf("started\n");
    fflush(stdout);
    long changes = 0;
    for (long i = 0; !stop; i++) {
        work(i);
        if (i % 10 == 0) {
            if (setuid(getuid()) != 0) {
                perror("setuid");
                return 1;
            }
            changes++;
        }
    }
    for (int t = 0; t <= n; t++)
        pthread_join(threads[t], 0);
    printf("%ld changes\n", changes);
    return 0;
}

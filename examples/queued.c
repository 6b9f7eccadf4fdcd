/* A program sent real-time signals all the time: a thread queues SIGRTMIN
 * to the main thread, each with its number, as the main thread calls
 * work() in a loop. Real-time signals are queued, never merged, so every
 * one sent is delivered once: a profiler holding the program must pass
 * each on, in the order they came. It says "started" as the signals
 * start, and stops sending when its input ends; then it prints how many
 * it sent, how many arrived, whether their numbers add up and whether
 * they came in order.
 *
 * Usage: queued < input
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

volatile long sink;
static volatile sig_atomic_t stop;
static volatile long received, received_sum, out_of_order;
static long sent, sent_sum;
static pthread_t main_thread;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static void on_signal(int signal, siginfo_t *info, void *context)
{
    (void)signal;
    (void)context;
    if (info->si_value.sival_int != (int)(received % 1000) + 1)
        out_of_order++;
    received++;
    received_sum += info->si_value.sival_int;
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *send_signals(void *unused)
{
    (void)unused;
    while (!stop) {
        union sigval value = {.sival_int = (int)(sent % 1000) + 1};
        int error = pthread_sigqueue(main_thread, SIGRTMIN, value);
        if (error == EAGAIN) {
            sched_yield();
            continue;
        }
        if (error)
            return 0;
        sent++;
        sent_sum += value.sival_int;
        for (long until = now_ns() + 20000; now_ns() < until;)
            ;
    }
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

int main(void)
{
    struct sigaction sa = {0};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGRTMIN, &sa, 0);
    main_thread = pthread_self();
    pthread_t sender, watcher;
    pthread_create(&sender, 0, send_signals, 0);
    pthread_create(&watcher, 0, watch_input, 0);
    printf("started\n");
    fflush(stdout);
    for (long i = 0; !stop; i++)
        work(i);
    pthread_join(sender, 0);
    pthread_join(watcher, 0);
    /* Those queued still are delivered as this thread runs on. */
    for (long until = now_ns() + 2000000000L; received < sent && now_ns() < until;)
        work(0);
    printf("%ld sent, %ld received, sums %s, %s\n", sent, received, sent_sum == received_sum ? "equal" : "differ",
           out_of_order ? "out of order" : "in order");
    return 0;
}

/* A program whose signal handler calls the same function as its main
 * loop, 10,000 times a second: a profiler must not harm it, and must count
 * every call. With "altstack" the handler runs on an alternate signal stack.
 * With "linger" the handler runs 1,000 times a second and stays 0.9 ms:
 * the program is in it most of the time, having interrupted its loop
 * (it says "started" as the loop starts). With "linger-deep" it stays
 * in a function whose frame takes 256 KiB of the stack, far below the
 * signal's frame. With "relay" no timer runs: the first SIGALRM comes
 * from outside, and the handler stays 0.9 ms and raises it again before
 * it returns, so it is delivered again as the handler returns and the
 * loop gets no further (it says "started" as the loop starts). With
 * "nested" the handler, 1,000 times a second, raises SIGUSR1, whose
 * handler runs on an alternate signal stack and stays 0.8 ms: the
 * program is mostly in a handler on another stack than the one its
 * loop was interrupted on.
 *
 * Usage: alarm [ITERATIONS [altstack|linger|linger-deep|relay|nested]]   default 20,000,000.
 * Prints the calls of work() made by the loop and by the handler.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

volatile long sink;
volatile sig_atomic_t in_handler_calls;
static int linger;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void stay(void)
{
    for (long end = now_ns() + 900000; now_ns() < end;)
        sink++;
}

__attribute__((noinline)) static void stay_deep(void)
{
    volatile char frame[256 << 10];
    frame[0] = frame[sizeof frame - 1] = 1;
    stay();
    sink += frame[0];
}

static void on_nested(int signal)
{
    (void)signal;
    for (long end = now_ns() + 800000; now_ns() < end;)
        sink++;
}

static void on_alarm(int signal)
{
    (void)signal;
    work(1);
    work(2);
    in_handler_calls += 2;
    if (linger == 4)
        raise(SIGUSR1);
    else if (linger == 3) {
        stay();
        raise(SIGALRM);
    } else if (linger == 2)
        stay_deep();
    else if (linger)
        stay();
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    const char *mode = argc > 2 ? argv[2] : "";
    linger = !strcmp(mode, "linger") ? 1 : !strcmp(mode, "linger-deep") ? 2 : !strcmp(mode, "relay") ? 3 : !strcmp(mode, "nested") ? 4 : 0;
    if (!strcmp(mode, "altstack") || linger == 4) {
        static char stack[1 << 16];
        stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack};
        sigaltstack(&ss, 0);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART | (!strcmp(mode, "altstack") ? SA_ONSTACK : 0);
    sigaction(SIGALRM, &sa, 0);
    struct sigaction nested = {0};
    nested.sa_handler = on_nested;
    nested.sa_flags = SA_RESTART | SA_ONSTACK;
    sigaction(SIGUSR1, &nested, 0);
    struct itimerval every = {{0, linger ? 1000 : 100}, {0, linger ? 1000 : 100}};
    if (linger != 3)
        setitimer(ITIMER_REAL, &every, 0);
    if (linger) {
        printf("started\n");
        fflush(stdout);
    }
    for (long i = 0; i < n; i++)
        work(i);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    printf("%ld %ld\n", n, (long)in_handler_calls);
    return 0;
}

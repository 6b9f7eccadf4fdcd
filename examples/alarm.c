/* A program whose signal handler calls the same function as its main
 * loop, 10,000 times a second: a profiler must not harm it, and must count
 * every call. With "altstack" the handler runs on an alternate signal stack.
 *
 * Usage: alarm [ITERATIONS [altstack]]   default 20,000,000.
 * Prints the calls of work() made by the loop and by the handler.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

volatile long sink;
volatile sig_atomic_t in_handler_calls;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static void on_alarm(int signal)
{
    (void)signal;
    work(1);
    work(2);
    in_handler_calls += 2;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    if (argc > 2 && !strcmp(argv[2], "altstack")) {
        static char stack[1 << 16];
        stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack};
        sigaltstack(&ss, 0);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART | (argc > 2 ? SA_ONSTACK : 0);
    sigaction(SIGALRM, &sa, 0);
    struct itimerval every = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &every, 0);
    for (long i = 0; i < n; i++)
        work(i);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    printf("%ld %ld\n", n, (long)in_handler_calls);
    return 0;
}

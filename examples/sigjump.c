/* A signal handler on an alternate stack that leaves by siglongjmp, back
 * into main, from the middle of an instrumented call: as interpreters
 * recover from a fault. Each round, fail() raises SIGUSR1; the handler
 * calls leaf() and jumps out of both.
 * Usage: sigjump [ROUNDS]   default: 1000. Prints what leaf saw.
 *
 *        sigjump timer [ROUNDS [altstack|shared]]   a timer's handler
 *        (SIGALRM, every 100 us, on the thread's own stack) calls leaf(),
 *        then, every tenth time, jumps out of a loop calling spin(),
 *        wherever the signal lands: as a time limit does; else it returns. altstack: the handler runs on an alternate stack in
 *        main's frame, near the loop's. shared: a thread made with clone()
 *        that shares main's thread pointer ran first. Prints the rounds;
 *        on stderr, the calls spin() began and the handler's runs. */
#define _GNU_SOURCE
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static sigjmp_buf back;
volatile long sink;

__attribute__((noinline)) void leaf(long x)
{
    sink += x;
}

__attribute__((noinline)) void handler(int signal)
{
    leaf(signal);
    siglongjmp(back, 1);
}

__attribute__((noinline)) void fail(long round)
{
    leaf(round);
    raise(SIGUSR1);
    leaf(-1000000); /* never reached */
}

static sigjmp_buf out_of_time;
/* Set while the loop may be jumped out of. */
static volatile sig_atomic_t armed;
static volatile long spins, handled;

__attribute__((noinline)) void spin(long x)
{
    spins++;
    sink += x;
}

static void on_timer(int signal)
{
    if (!armed)
        return;
    leaf(signal);
    if (++handled % 10)
        return;
    armed = 0;
    siglongjmp(out_of_time, 1);
}

__attribute__((noinline)) long spin_until_the_timer(void)
{
    if (sigsetjmp(out_of_time, 1) == 0) {
        armed = 1;
        for (long i = 0;; i++)
            spin(i);
    }
    return 1;
}

static volatile int clone_ran;

static int run_once(void *arg)
{
    (void)arg;
    clone_ran = 1;
    return 0;
}

static int timer_rounds(long rounds, const char *how)
{
    char alternate[1 << 16];
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_timer;
    if (strcmp(how, "altstack") == 0) {
        stack_t stack = { .ss_sp = alternate, .ss_size = sizeof alternate };
        sigaltstack(&stack, NULL);
        action.sa_flags = SA_ONSTACK;
    } else if (strcmp(how, "shared") == 0) {
        static char stack[1 << 16];
        int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
        if (clone(run_once, stack + sizeof stack, flags, NULL) < 0)
            return 1;
        while (!clone_ran)
            ;
    }
    sigaction(SIGALRM, &action, NULL);
    struct itimerval every = { { 0, 100 }, { 0, 100 } };
    setitimer(ITIMER_REAL, &every, NULL);
    long done = 0;
    for (long r = 0; r < rounds; r++)
        done += spin_until_the_timer();
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%ld rounds\n", done);
    fprintf(stderr, "%ld spins %ld handled\n", spins, handled);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "timer") == 0)
        return timer_rounds(argc > 2 ? atol(argv[2]) : 200, argc > 3 ? argv[3] : "");
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    static char alternate[1 << 16];
    stack_t stack = { .ss_sp = alternate, .ss_size = sizeof alternate };
    sigaltstack(&stack, NULL);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &action, NULL);
    for (long i = 0; i < rounds; i++) {
        if (sigsetjmp(back, 1) == 0)
            fail(i);
        leaf(1);
    }
    printf("%ld\n", sink);
    return 0;
}

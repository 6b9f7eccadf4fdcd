/* A signal handler on an alternate stack that leaves by siglongjmp, back
 * into main, from the middle of an instrumented call: as interpreters
 * recover from a fault. Each round, fail() raises SIGUSR1; the handler
 * calls leaf() and jumps out of both.
 * Usage: sigjump [ROUNDS]   default: 1000. Prints what leaf saw. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
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

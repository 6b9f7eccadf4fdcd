/* A signal handler walks the stack (backtrace()) on an alternate signal
 * stack that lies in main's frame, above the frames it interrupts: the
 * stack it reports must be the program's own, through the signal into
 * the interrupted calls, whatever instruments them.
 *
 * Usage: altstack [WALKS]   default 50. Prints how many frames deep the
 * walks most often were. */
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static volatile int depths[64];
static volatile int walks;
volatile long sink;

__attribute__((noinline)) int walk(void)
{
    void *frames[64];
    return backtrace(frames, 64);
}

static void handler(int sig)
{
    (void)sig;
    int depth = walk();
    if (depth < 64)
        depths[depth]++;
    walks++;
}

__attribute__((noinline)) long inner(long n)
{
    long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += i % 7;
        sink = sum;
    }
    return sum;
}

__attribute__((noinline)) long outer(long n)
{
    return inner(n) + 1;
}

int main(int argc, char **argv)
{
    int wanted = argc > 1 ? atoi(argv[1]) : 50;
    char alternate[1 << 16];
    stack_t stack = {.ss_sp = alternate, .ss_size = sizeof alternate, .ss_flags = 0};
    sigaltstack(&stack, 0);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_ONSTACK | SA_RESTART;
    sigaction(SIGALRM, &action, 0);
    struct itimerval every = {{0, 2000}, {0, 2000}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &every, 0);
    while (walks < wanted)
        outer(100000);
    setitimer(ITIMER_REAL, &off, 0);
    int most = 0;
    for (int i = 0; i < 64; i++)
        if (depths[i] > depths[most])
            most = i;
    printf("most often %d frames deep\n", most);
    return 0;
}

// Exceptions thrown while a timer's signal handler (10 kHz) calls a
// function and walks the stack with backtrace(), as a sampling profiler's
// handler does: the signal often lands while an exception unwinds.
// Usage: walkthrow ROUNDS [STACK [WALK]]
//   STACK: where the handler runs: "same" (the thread's stack, the
//          default), "heap" (an alternate signal stack in static memory)
//          or "frame" (an alternate stack in main's frame, above the
//          frames it interrupts).
//   WALK:  "walk" (the default) calls tick() and backtrace(); "call" only tick().
// Prints "caught N sum S"; the handler's runs and deepest walk go to stderr.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>
#include <stdexcept>
#include <sys/time.h>

static volatile long handled, deepest;
static bool walking = true;

__attribute__((noinline)) long tick(long n)
{
    return n + 1;
}

static void on_timer(int)
{
    handled = tick(handled);
    if (!walking)
        return;
    void *frames[64];
    int n = backtrace(frames, 64);
    if (n > deepest)
        deepest = n;
}

// Throws when i is a multiple of 3.
__attribute__((noinline)) int check(int i)
{
    if (i % 3 == 0)
        throw std::runtime_error("multiple of three");
    return i;
}

// Calls check() on i, i + 1, ... until it throws (at most 3 calls).
__attribute__((noinline)) int validate(int i)
{
    int sum = 0;
    for (int k = 0; k < 5; k++)
        sum += check(i + k);
    return sum;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    const char *stack = argc > 2 ? argv[2] : "same";
    walking = argc <= 3 || strcmp(argv[3], "call") != 0;
    static char static_stack[1 << 16];
    char frame_stack[1 << 16];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_timer;
    sa.sa_flags = SA_RESTART;
    if (strcmp(stack, "same") != 0) {
        stack_t st;
        st.ss_sp = strcmp(stack, "frame") == 0 ? frame_stack : static_stack;
        st.ss_size = sizeof static_stack;
        st.ss_flags = 0;
        sigaltstack(&st, nullptr);
        sa.sa_flags |= SA_ONSTACK;
    }
    // The first backtrace() loads the unwinder: not in a handler.
    void *first[4];
    backtrace(first, 4);
    sigaction(SIGALRM, &sa, nullptr);
    struct itimerval every = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &every, nullptr);
    long caught = 0, sum = 0;
    for (long i = 0; i < rounds; i++) {
        try {
            sum += validate((int)i);
        } catch (const std::exception &) {
            caught++;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, nullptr);
    printf("caught %ld sum %ld\n", caught, sum);
    fprintf(stderr, "handled %ld, deepest walk %ld frames\n", handled, deepest);
    return 0;
}

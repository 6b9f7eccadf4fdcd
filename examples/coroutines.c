/* Two coroutines on stacks of their own take turns with swapcontext, each
 * switching away in the middle of an instrumented call (yield_to) and
 * coming back to finish it: a thread's calls return on another stack than
 * the one they were made on last.
 * Usage: coroutines [ROUNDS]   default: 1000. Prints the sum of what leaf saw. */
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

static ucontext_t main_context, a_context, b_context;
static int rounds = 1000;
volatile long sink;

__attribute__((noinline)) void leaf(long x)
{
    sink += x;
}

__attribute__((noinline)) void yield_to(ucontext_t *from, ucontext_t *to)
{
    leaf(1);
    swapcontext(from, to);
    leaf(2);
}

__attribute__((noinline)) void body_a(void)
{
    for (int i = 0; i < rounds; i++)
        yield_to(&a_context, &b_context);
}

__attribute__((noinline)) void body_b(void)
{
    for (int i = 0; i < rounds; i++)
        yield_to(&b_context, &a_context);
}

static void start(ucontext_t *context, void (*body)(void))
{
    const size_t size = 1 << 20;
    getcontext(context);
    context->uc_stack.ss_sp = malloc(size);
    context->uc_stack.ss_size = size;
    context->uc_link = &main_context;
    makecontext(context, body, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atoi(argv[1]);
    start(&a_context, body_a);
    start(&b_context, body_b);
    /* A runs first; when its loop ends it returns to main, leaving B's
     * last call of yield_to switched away for good. */
    swapcontext(&main_context, &a_context);
    printf("%ld\n", sink);
    return 0;
}

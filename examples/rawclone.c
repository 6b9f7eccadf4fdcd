/* Threads made with a raw clone that share their creator's thread-local
 * storage (no CLONE_SETTLS): to a runtime keyed by the thread pointer, two
 * threads look like one. Both call work() in a loop at the same time.
 *
 * Usage: rawclone [ITERATIONS]   default 2,000,000.
 * Prints the calls of work() made in all.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

volatile long sink;
static long iterations;
static volatile int child_done;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static int child(void *arg)
{
    (void)arg;
    for (long i = 0; i < iterations; i++)
        work(i);
    __atomic_store_n(&child_done, 1, __ATOMIC_RELEASE);
    return 0;
}

int main(int argc, char **argv)
{
    iterations = argc > 1 ? atol(argv[1]) : 2000000;
    size_t size = 1 << 20;
    char *stack = malloc(size);
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    if (clone(child, stack + size, flags, 0) < 0)
        return 1;
    for (long i = 0; i < iterations; i++)
        work(i);
    while (!__atomic_load_n(&child_done, __ATOMIC_ACQUIRE))
        ;
    printf("%ld\n", 2 * iterations);
    return 0;
}

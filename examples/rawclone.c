/* Threads made with a raw clone that share their creator's thread-local
 * storage (no CLONE_SETTLS): to a runtime keyed by the thread pointer, two
 * threads look like one. Both call work() in a loop at the same time.
 *
 * Usage: rawclone [ITERATIONS]   default 2,000,000.
 *        rawclone until-signal   both loop until SIGUSR1 (after printing
 *                                "running" once both do).
 *        rawclone forked [ITERATIONS]   the same in a forked child, both
 *                                threads starting together: the child's
 *                                first calls are made by both at once.
 * Prints the calls of work() made in all.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;
static long iterations;
static volatile sig_atomic_t stop;
static volatile long child_calls;
static volatile int child_running, child_done;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static void on_signal(int signal)
{
    (void)signal;
    stop = 1;
}

/* Calls work() `iterations` times, or until stopped when that is 0;
 * returns how many times. */
static long loop(void)
{
    long i = 0;
    for (; iterations ? i < iterations : !stop; i++)
        work(i);
    return i;
}

static int child(void *arg)
{
    (void)arg;
    __atomic_store_n(&child_running, 1, __ATOMIC_RELEASE);
    child_calls = loop();
    __atomic_store_n(&child_done, 1, __ATOMIC_RELEASE);
    return 0;
}

int main(int argc, char **argv)
{
    int until_signal = argc > 1 && strcmp(argv[1], "until-signal") == 0;
    int forked = argc > 1 && strcmp(argv[1], "forked") == 0;
    if (forked) {
        argv++;
        argc--;
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid > 0) {
            int status;
            return waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        }
    }
    iterations = until_signal ? 0 : argc > 1 ? atol(argv[1]) : 2000000;
    signal(SIGUSR1, on_signal);
    size_t size = 1 << 20;
    char *stack = malloc(size);
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    if (clone(child, stack + size, flags, 0) < 0)
        return 1;
    if (until_signal || forked)
        while (!__atomic_load_n(&child_running, __ATOMIC_ACQUIRE))
            ;
    if (until_signal) {
        printf("running\n");
        fflush(stdout);
    }
    long calls = loop();
    while (!__atomic_load_n(&child_done, __ATOMIC_ACQUIRE))
        ;
    printf("%ld\n", calls + child_calls);
    return 0;
}

/* A program that executes itself again: the image proftap patched goes
 * with the exec, and the new one runs unpatched. Usage:
 *   execs CALLS [next]   CALLS calls of work(), then executes `execs next`
 *   execs 0 [next]       calls work() until SIGUSR1, then the same
 *   execs CALLS fork     then forks a child that calls work() once and
 *                        executes `sleep 1`, and ends once it has
 *   execs CALLS keep     then forks a child that prints "child PID PARENT"
 *                        and calls work() until SIGUSR1, and executes
 *                        `execs 0` itself
 *   execs CALLS thread   starts a thread that waits in parked() for ever,
 *                        then executes `execs 20000000` (which ends it)
 * Each image prints "started" first and "CALLS SUM" at its end. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_usr1(int signal)
{
    (void)signal;
    stop = 1;
}

__attribute__((noinline)) long work(long i)
{
    __asm__ volatile("");
    return i % 7 + 1;
}

static int parked_pipe[2];

/* Never returns: the exec ends its thread. Says it is in by a byte. */
__attribute__((noinline)) void *parked(void *unused)
{
    (void)unused;
    if (write(parked_pipe[1], "", 1) != 1)
        return NULL;
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t waiting;
    char in;
    if (argc > 2 && strcmp(argv[2], "thread") == 0
        && (pipe2(parked_pipe, O_CLOEXEC) != 0 || pthread_create(&waiting, NULL, parked, NULL) != 0 || read(parked_pipe[0], &in, 1) != 1))
        return 1;
    signal(SIGUSR1, on_usr1);
    printf("started\n");
    fflush(stdout);
    long calls = argc > 1 ? atol(argv[1]) : 1000;
    long sum = 0, made = 0;
    for (; calls == 0 ? !stop : made < calls; made++)
        sum += work(made);
    printf("%ld %ld\n", made, sum);
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "fork") == 0) {
        /* The pipe closes in the child at its exec: the end of file says so. */
        int exec_seen[2];
        if (pipe2(exec_seen, O_CLOEXEC) != 0)
            return 1;
        if (fork() == 0) {
            close(exec_seen[0]);
            sum += work(made);
            char *sleep_1[] = {"sleep", "1", NULL};
            execvp(sleep_1[0], sleep_1);
            _exit(1);
        }
        close(exec_seen[1]);
        char byte;
        return read(exec_seen[0], &byte, 1) == 0 ? 0 : 1;
    }
    if (argc > 2 && strcmp(argv[2], "keep") == 0 && fork() == 0) {
        printf("child %d %d\n", getpid(), getppid());
        fflush(stdout);
        for (made = 0, sum = 0; !stop; made++)
            sum += work(made);
        printf("%ld %ld\n", made, sum);
        return 0;
    }
    if (argc > 2) {
        char *next = strcmp(argv[2], "keep") == 0 ? "0" : strcmp(argv[2], "thread") == 0 ? "20000000" : argv[2];
        char *again[] = {argv[0], next, NULL};
        execv(argv[0], again);
        perror("execv");
        return 1;
    }
    return 0;
}

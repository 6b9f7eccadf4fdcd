/* A program traced by a process of its own (as under a debugger or
 * strace), which proftap cannot hold still to change its probes, with a
 * function called often enough for the governor to want its probes out.
 * Usage: traced [CALLS]   default 200000 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void work(unsigned long i)
{
    sink += i;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    int ready[2];
    if (pipe(ready) != 0)
        return 1;
    pid_t parent = getpid();
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY);
    pid_t tracer = fork();
    if (tracer == 0) {
        close(ready[0]);
        if (ptrace(PTRACE_SEIZE, parent, 0, 0) != 0) {
            perror("PTRACE_SEIZE");
            _exit(1);
        }
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "the tracer failed\n");
        return 1;
    }
    for (long i = 0; i < calls; i++)
        work(i);
    kill(tracer, SIGKILL);
    waitpid(tracer, NULL, 0);
    printf("%lu\n", sink);
    return 0;
}

/* A process to attach to. It prints "ready PID ADDRESS" (ADDRESS: where
 * tick() is loaded), then calls tick() once per line it reads on stdin and
 * exits at end of input, printing how many ticks it made. Tests drive it by
 * writing lines: no sleeping, no races.
 *
 * "fork N": forks a child that calls tick() N times, prints "forked PID"
 * once it has, then waits for SIGUSR1, calls tick() N times again and
 * exits 0. "reap": waits for that child and prints "reaped STATUS".
 *
 * Usage: wait [mdwe|noexec]   first refusing itself memory that is or
 * becomes executable after being writable (PR_SET_MDWE), or any mmap of
 * executable memory (a seccomp filter: EPERM); "ready" is then followed by
 * " refused" where that is in place, " allowed" where not.
 */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

volatile long sink;

__attribute__((noinline)) void tick(long i)
{
    sink += i;
}

/* A seccomp filter refusing mmap of executable memory (EPERM), as
 * SELinux without execmem or a sandbox may; whether it is in place. */
static int refuse_executable_mmap(void)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1 /* EPERM */),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {sizeof filter / sizeof filter[0], filter};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) == 0;
}

/* PR_SET_MDWE: whether a page of its own can no longer be made executable. */
static int refuse_executable_gain(void)
{
    void *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int set = prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0;
    return set && page != MAP_FAILED && mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0;
}

/* The refusal asked for on the command line, if any: whether it is in place. */
static const char *refusal(int argc, char **argv)
{
    if (argc < 2)
        return "";
    int refused = strcmp(argv[1], "mdwe") == 0 ? refuse_executable_gain() : strcmp(argv[1], "noexec") == 0 && refuse_executable_mmap();
    return refused ? " refused" : " allowed";
}

static pid_t fork_ticking(long n)
{
    int ready[2];
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    if (pipe(ready) != 0)
        return -1;
    pid_t child = fork();
    if (child == 0) {
        for (long k = 0; k < n; k++)
            tick(k);
        char done = 1;
        if (write(ready[1], &done, 1) != 1)
            _exit(2);
        int signal = 0;
        sigwait(&usr1, &signal);
        for (long k = 0; k < n; k++)
            tick(k);
        _exit(0);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    char done = 0;
    if (child < 0 || read(ready[0], &done, 1) != 1)
        child = -1;
    close(ready[0]);
    close(ready[1]);
    return child;
}

int main(int argc, char **argv)
{
    printf("ready %d %p%s\n", (int)getpid(), (void *)&tick, refusal(argc, argv));
    fflush(stdout);
    long ticks = 0;
    char line[256];
    pid_t child = -1;
    while (fgets(line, sizeof line, stdin)) {
        long n = 0;
        if (sscanf(line, "fork %ld", &n) == 1) {
            child = fork_ticking(n);
            printf("forked %d\n", (int)child);
            fflush(stdout);
            continue;
        }
        if (strncmp(line, "reap", 4) == 0) {
            int status = -1;
            waitpid(child, &status, 0);
            printf("reaped %d\n", status);
            fflush(stdout);
            continue;
        }
        sscanf(line, "%ld", &n);
        for (long i = 0; i < n; i++)
            tick(i);
        ticks += n;
        printf("ticked %ld\n", ticks);
        fflush(stdout);
    }
    printf("done %ld\n", ticks);
    return 0;
}

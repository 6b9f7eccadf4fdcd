/* Forked children, one of them in a network namespace of its own: the
 * parent calls work() N times; one child calls it M times; another first
 * moves to a new network namespace (where proftap's abstract socket name
 * is not), then calls it M times. Exits 2, saying why, if the namespace
 * cannot be made (it needs CAP_SYS_ADMIN).
 *
 * Usage: netns [N [M]]   defaults: 100, 50.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static pid_t child(long m, int own_network)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (own_network && unshare(CLONE_NEWNET) != 0) {
            perror("netns: cannot make a network namespace");
            _exit(2);
        }
        for (long i = 0; i < m; i++)
            work(i);
        _exit(0);
    }
    return pid;
}

static int waited(pid_t pid)
{
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100;
    long m = argc > 2 ? atol(argv[2]) : 50;
    for (long i = 0; i < n; i++)
        work(i);
    int plain = waited(child(m, 0));
    int moved = waited(child(m, 1));
    printf("children exited %d and %d\n", plain, moved);
    return plain ? plain : moved;
}

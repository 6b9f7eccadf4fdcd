/* Forked children, one of them in a network namespace of its own: the
 * parent calls work() N times; one child calls it M times; another first
 * moves to a new network namespace (where proftap's abstract socket name
 * is not), then calls it M times. With `hidden`, that child also moves to
 * a mount namespace of its own where the temporary directory ($TMPDIR, or
 * /tmp) is an empty one. Exits 2, saying why, if a namespace cannot be
 * made (it needs CAP_SYS_ADMIN).
 *
 * Usage: netns [N [M [hidden]]]   defaults: 100, 50.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

/* Moves to a network namespace of its own and, if `hidden`, to a mount
 * namespace where the temporary directory is an empty one. */
static int move(int hidden)
{
    if (unshare(CLONE_NEWNET | (hidden ? CLONE_NEWNS : 0)) != 0) {
        perror("netns: cannot make a namespace");
        return -1;
    }
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    if (hidden && (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 || mount("netns", tmp, "tmpfs", 0, NULL) != 0)) {
        perror("netns: cannot hide the temporary directory");
        return -1;
    }
    return 0;
}

static pid_t child(long m, int own_network, int hidden)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (own_network && move(hidden) != 0)
            _exit(2);
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
    int hidden = argc > 3 && strcmp(argv[3], "hidden") == 0;
    int plain = waited(child(m, 0, 0));
    int moved = waited(child(m, 1, hidden));
    printf("children exited %d and %d\n", plain, moved);
    return plain ? plain : moved;
}

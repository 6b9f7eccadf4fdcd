/* A child forked in a call its parent leaves at once: the parent returns
 * from forker() and is inside other() before the child makes its first
 * instrumented call, work(), from forker(). The child's calls in progress
 * are forker's, as the fork left them.
 *
 * Usage: forkleft
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;
static int to_child[2];

__attribute__((noinline)) void work(void)
{
    sink++;
}

__attribute__((noinline)) pid_t forker(void)
{
    pid_t child = fork();
    if (child == 0) {
        char go;
        /* Until the parent is in other(). */
        if (read(to_child[0], &go, 1) != 1)
            _exit(1);
        work();
        _exit(0);
    }
    return child;
}

__attribute__((noinline)) void other(pid_t child)
{
    if (write(to_child[1], "x", 1) != 1 || waitpid(child, NULL, 0) != child)
        exit(1);
}

int main(void)
{
    if (pipe(to_child) != 0)
        return 1;
    pid_t child = forker();
    if (child < 0)
        return 1;
    other(child);
    work();
    printf("done\n");
    return 0;
}

/* A child forked in a call its parent leaves at once: the parent returns
 * from forker() and is inside other() before the child makes its first
 * instrumented call, work(), from forker(). The child's calls in progress
 * are forker's, as the fork left them. With `twice`, the child then forks
 * a grandchild from again(), which calls work() too: its calls in
 * progress are main, forker and again.
 *
 * Usage: forkleft [twice]
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;
static int to_child[2];
static int twice;

__attribute__((noinline)) void work(void)
{
    sink++;
}

__attribute__((noinline)) pid_t again(void)
{
    pid_t grandchild = fork();
    if (grandchild == 0) {
        work();
        _exit(0);
    }
    return grandchild;
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
        if (twice) {
            pid_t grandchild = again();
            if (grandchild < 0 || waitpid(grandchild, NULL, 0) != grandchild)
                _exit(1);
        }
        _exit(0);
    }
    return child;
}

__attribute__((noinline)) void other(pid_t child)
{
    if (write(to_child[1], "x", 1) != 1 || waitpid(child, NULL, 0) != child)
        exit(1);
}

int main(int argc, char **argv)
{
    twice = argc > 1;
    (void)argv;
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

/* Threads made and joined one after another, as a server making a thread
 * per request does: each calls leaf() 10 times.
 * Usage: churn [THREADS [fork CHILD_THREADS]]   default 3000; with fork, a
 * child forked after them makes CHILD_THREADS the same way. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void leaf(long i)
{
    sink += i;
}

static void *body(void *arg)
{
    for (long i = 0; i < 10; i++)
        leaf(i);
    return arg;
}

/* Makes `threads` threads one after another; 0 when all ran. */
static int churn(int threads)
{
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, 0, body, 0) != 0 || pthread_join(t, 0) != 0) {
            perror("pthread");
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 3000;
    if (churn(threads))
        return 1;
    if (argc > 3 && strcmp(argv[2], "fork") == 0) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0)
            _exit(churn(atoi(argv[3])));
        int status;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 1;
    }
    printf("%ld\n", sink);
    return 0;
}

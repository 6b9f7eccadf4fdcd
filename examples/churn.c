/* Threads made and joined one after another, as a server making a thread
 * per request does: each calls leaf() 10 times.
 * Usage: churn [THREADS]   default 3000. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 3000;
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, 0, body, 0) != 0 || pthread_join(t, 0) != 0) {
            perror("pthread");
            return 1;
        }
    }
    printf("%ld\n", sink);
    return 0;
}

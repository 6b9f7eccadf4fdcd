/* A thread cancelled while it waits in an instrumented function.
 * Usage: cancel   prints cancelled=1 when the thread was cancelled. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) void wait_here(void)
{
    for (;;) {
        pthread_testcancel();
        usleep(1000);
    }
}

__attribute__((noinline)) void *worker(void *arg)
{
    wait_here();
    return arg;
}

int main(void)
{
    pthread_t thread;
    void *result;
    pthread_create(&thread, NULL, worker, NULL);
    usleep(20000);
    pthread_cancel(thread);
    pthread_join(thread, &result);
    printf("cancelled=%d\n", result == PTHREAD_CANCELED);
    return 0;
}

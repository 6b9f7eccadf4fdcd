/* A thread cancelled while it waits in an instrumented function that the
 * C library calls back (scandir's filter): the library's cleanup, which
 * closes the directory, runs only where the unwinder gets past the
 * function's frame. The thread that cancels goes on in cancel_it.
 * Usage: cancel   prints cancelled=1 when the thread was cancelled and
 * closed=1 when the directory scandir opened was closed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static volatile int waiting;

__attribute__((noinline)) void wait_here(void)
{
    waiting = 1;
    for (;;) {
        pthread_testcancel();
        usleep(1000);
    }
}

__attribute__((noinline)) int keep(const struct dirent *entry)
{
    (void)entry;
    wait_here();
    return 1;
}

__attribute__((noinline)) void *worker(void *arg)
{
    struct dirent **entries;
    scandir("/", &entries, keep, alphasort);
    return arg;
}

__attribute__((noinline)) int cancel_it(pthread_t thread)
{
    return pthread_cancel(thread);
}

/* The lowest descriptor free: the one open would give next. */
static int lowest_free(void)
{
    int fd = open("/dev/null", O_RDONLY);
    close(fd);
    return fd;
}

int main(void)
{
    pthread_t thread;
    void *result;
    int free_before = lowest_free();
    pthread_create(&thread, NULL, worker, NULL);
    while (!waiting)
        usleep(1000);
    cancel_it(thread);
    pthread_join(thread, &result);
    printf("cancelled=%d closed=%d\n", result == PTHREAD_CANCELED, lowest_free() == free_before);
    return 0;
}

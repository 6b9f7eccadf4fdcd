/* A thread that ends with pthread_exit from within instrumented calls,
 * which never return; the main thread then works on for a while.
 * Usage: exits N   prints exited=7 and the sum of N squares. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void leave_from(int depth)
{
    if (depth == 0)
        pthread_exit((void *)7);
    leave_from(depth - 1);
    __asm__ volatile("");
}

__attribute__((noinline)) void *exiting(void *arg)
{
    leave_from(3);
    return arg;
}

__attribute__((noinline)) unsigned long work(unsigned long n)
{
    unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++) {
        sum += i * i;
        __asm__ volatile("" : "+r"(sum));
    }
    return sum;
}

int main(int argc, char **argv)
{
    pthread_t thread;
    void *result;
    pthread_create(&thread, NULL, exiting, NULL);
    pthread_join(thread, &result);
    unsigned long sum = work(argc > 1 ? strtoul(argv[1], NULL, 10) : 100000000);
    printf("exited=%ld %lu\n", (long)result, sum);
    return 0;
}

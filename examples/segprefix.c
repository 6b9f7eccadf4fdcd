/* A function whose first instruction carries a segment prefix, and a line
 * of main's that starts with a lock-prefixed one, which the kernel's
 * uprobes refuse on a running process (and skip without a word when the
 * probe is placed before the program starts), beside a function called
 * often enough for the governor to want its probes out.
 * Usage: segprefix [CALLS]   default 200000 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__asm__(".globl odd\n.type odd,@function\nodd:\n.byte 0x2e\nnop\nret\n.size odd, .-odd\n");
void odd(void);

volatile unsigned long sink;
unsigned long started;

__attribute__((noinline)) void work(unsigned long i)
{
    sink += i;
}

static pthread_barrier_t calls_done;

static void *waiter(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&calls_done);
    return NULL;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    if (threads < 0 || threads > 10000)
        threads = 0;
    pthread_t ids[10000];
    pthread_barrier_init(&calls_done, NULL, threads + 1);
    for (int t = 0; t < threads; t++)
        if (pthread_create(&ids[t], NULL, waiter, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    __atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST);
    odd();
    for (long i = 0; i < calls; i++)
        work(i);
    pthread_barrier_wait(&calls_done);
    for (int t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    printf("%lu\n", sink);
    return 0;
}

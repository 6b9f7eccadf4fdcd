/* A program that refuses itself the right to make memory writable and
 * executable at once (PR_SET_MDWE) before it starts threads: once the
 * FIFO named first gives a byte, work() is called 1,000 times alone, then
 * by two threads at once. Prints whether a page of its own could still be
 * made writable and executable after the prctl ("refused" or "allowed"),
 * then what the calls computed.
 * Usage: mdwe FIFO [MILLIONS]   calls per thread, default 2. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

volatile unsigned long sink;

__attribute__((noinline)) unsigned long work(unsigned long x)
{
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

static void *calls(void *millions)
{
    unsigned long x = 1, n = (unsigned long)millions * 1000000;
    for (unsigned long i = 0; i < n; i++)
        x = work(x);
    sink += x;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    unsigned long millions = argc > 2 ? strtoul(argv[2], 0, 10) : 2, x = 1;
    char go;
    int fifo = open(argv[1], O_RDONLY);
    if (fifo < 0 || read(fifo, &go, 1) != 1)
        return 3;
    for (int i = 0; i < 1000; i++)
        x = work(x);
    sink = x;
    if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0) {
        perror("prctl(PR_SET_MDWE)");
        return 4;
    }
    void *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int refused = page == MAP_FAILED || mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC) != 0;
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&threads[i], 0, calls, (void *)millions) != 0)
            return 5;
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], 0);
    printf("%s %lu\n", refused ? "refused" : "allowed", sink);
    return 0;
}

/* Spends much of its time in the kernel on its own behalf: fault_in(mb)
 * maps fresh memory and writes to each of its pages, which the kernel
 * clears at the first touch; spin(n) counts in user code only. main calls
 * each ROUNDS times.
 *
 * Usage: faults [MB [ROUNDS]]   defaults: 64 and 10.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

volatile unsigned long sink;

__attribute__((noinline)) long fault_in(long mb)
{
    long bytes = mb << 20;
    char *p = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    long sum = 0;
    for (long i = 0; i < bytes; i += 4096) {
        p[i] = (char)i;
        sum += p[i];
    }
    munmap(p, bytes);
    return sum;
}

__attribute__((noinline)) void spin(long n)
{
    for (long i = 0; i < n; i++)
        sink += i;
}

int main(int argc, char **argv)
{
    long mb = argc > 1 ? atol(argv[1]) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 10;
    long sum = 0;
    for (int r = 0; r < rounds; r++) {
        sum += fault_in(mb);
        spin(mb << 20);
    }
    printf("%ld\n", sum);
    return 0;
}

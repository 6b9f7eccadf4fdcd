/* The floor of timing a call by replacing its return address: a call
 * whose return address is swapped for a landing pad that jumps back (as
 * the in-process engine's return trampoline is reached), against the same
 * work with the address put back as it was, a plain call, and a call that
 * reads the TSC at its entry and its return. The processor predicts a
 * return from its own stack of calls: a return elsewhere is mispredicted.
 * Usage: return [CALLS]   prints nanoseconds per call of each. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

volatile long sink;
extern long plain(long), swapped(long), kept(long);

__asm__(".text\n"
        ".globl plain\n"
        "plain:\n"
        "  add %rdi, sink(%rip)\n"
        "  mov %rdi, %rax\n"
        "  ret\n"
        ".globl swapped\n"
        "swapped:\n"
        "  mov (%rsp), %r11\n"
        "  mov %r11, saved(%rip)\n"
        "  lea pad(%rip), %r11\n"
        "  mov %r11, (%rsp)\n"
        "  add %rdi, sink(%rip)\n"
        "  mov %rdi, %rax\n"
        "  ret\n"
        "pad:\n"
        "  jmp *saved(%rip)\n"
        ".globl kept\n"
        "kept:\n"
        "  mov (%rsp), %r11\n"
        "  mov %r11, saved(%rip)\n"
        "  lea pad(%rip), %r10\n"
        "  mov %r11, (%rsp)\n"
        "  add %rdi, sink(%rip)\n"
        "  mov %rdi, %rax\n"
        "  ret\n"
        ".data\n"
        "saved: .quad 0\n"
        ".text\n");

__attribute__((noinline)) long read_twice(long x)
{
    unsigned long t = __rdtsc();
    sink += x;
    return x + (long)(__rdtsc() - t);
}

static double per_call(long (*f)(long), long n)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        f(i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000000;
    double p = per_call(plain, n), k = per_call(kept, n), s = per_call(swapped, n), t = per_call(read_twice, n);
    printf("plain %.2f ns  address put back %.2f ns  address swapped %.2f ns  two TSC reads %.2f ns\n", p, k, s, t);
    return 0;
}

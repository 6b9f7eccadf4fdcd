/* Functions whose own code jumps back into their first five bytes (a loop
 * whose head is the second instruction, as a compiler makes of a tail
 * call: Lua's reallymarkobject, SQLite's btreePrevious): a 5-byte jump
 * over the entry would be landed in the middle of, so the in-process
 * engine writes a 2-byte jump to five bytes of padding nearby, before the
 * function or after its own return, which hold the jump to its
 * trampoline; and one whose loop comes back to its first instruction.
 * Usage: looped [CALLS] (each function; 0: until SIGUSR1,
 * then the calls made are printed too) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile sig_atomic_t stop;

static void on_usr1(int signal)
{
    (void)signal;
    stop = 1;
}

/* The sum of 1..n (n >= 1), looping back to +2. Padding after its `ret`
 * that no code runs. */
__attribute__((naked, noinline)) long sum_down(long n) {
    __asm__("xor %eax, %eax\n"
            "1: add %rdi, %rax\n"
            "sub $1, %rdi\n"
            "jg 1b\n"
            "ret\n"
            ".nops 7\n"
            "int3\n");
}

/* The same, its loop one instruction later: push, then back to +1... +3. */
__attribute__((naked, noinline)) long sum_down_saved(long n) {
    __asm__("push %rbx\n"
            "xor %ebx, %ebx\n"
            "1: add %rdi, %rbx\n"
            "sub $1, %rdi\n"
            "jg 1b\n"
            "mov %rbx, %rax\n"
            "pop %rbx\n"
            "ret\n"
            ".nops 9\n"
            "int3\n");
}

/* acc + the sum of 1..n, its loop back to its very first instruction (a
 * loop tested at the top of a function with no frame, as gcc makes of
 * one): each turn enters the entry again, and is no call. */
__attribute__((naked, noinline)) long sum_from_entry(long n, long acc) {
    __asm__("mov %rsi, %rax\n"
            "test %rdi, %rdi\n"
            "jle 1f\n"
            "add %rdi, %rsi\n"
            "sub $1, %rdi\n"
            "jmp sum_from_entry\n"
            "1: ret\n");
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000;
    long sum = 0, i = 0;
    if (calls == 0) {
        signal(SIGUSR1, on_usr1);
        for (; !stop; i++)
            sum += sum_down(i % 7 + 1) + sum_down_saved(i % 5 + 1) + sum_from_entry(i % 3 + 1, 0);
        printf("%ld ", i);
    }
    for (; i < calls; i++)
        sum += sum_down(i % 7 + 1) + sum_down_saved(i % 5 + 1) + sum_from_entry(i % 3 + 1, 0);
    printf("%ld\n", sum);
    return 0;
}

/* Hand-written code that goes on in the middle of another function's
 * first instructions, as glibc's mempcpy goes on at memcpy+3:
 * entry_skipper(x) adds 10 and jumps past inner_target's first
 * instruction, which adds 1 and returns.
 * Usage: entered [ROUNDS]   default: 1000. Prints the sum of both. */
#include <stdio.h>
#include <stdlib.h>

long inner_target(long x);
long entry_skipper(long x);

__asm__(".text\n"
        ".globl inner_target\n"
        ".type inner_target, @function\n"
        "inner_target:\n"
        "    mov %rdi, %rax\n"
        "    add $1, %rax\n"
        "    ret\n"
        ".size inner_target, .-inner_target\n"
        ".globl entry_skipper\n"
        ".type entry_skipper, @function\n"
        "entry_skipper:\n"
        "    mov %rdi, %rax\n"
        "    add $10, %rax\n"
        "    jmp inner_target+3\n"
        ".size entry_skipper, .-entry_skipper\n");

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < rounds; i++)
        sum += inner_target(i) + entry_skipper(i);
    printf("%ld\n", sum);
    return 0;
}

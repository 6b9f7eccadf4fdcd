/* A tiny bytecode interpreter dispatching with computed gotos, as Lua and
 * CPython do: at -O2 every handler ends in its own copy of the dispatch
 * jump through one table of labels.
 * Usage: interp [N]   default 1000: runs a loop of N turns in bytecode. */
#include <stdio.h>
#include <stdlib.h>

enum { PUSH, ADD, SUB, DUP, JNZ, SWAP, DROP, PRINT, HALT };

__attribute__((noinline)) static long run(const int *code, long n)
{
    static const void *const table[] = { &&push, &&add, &&sub, &&dup, &&jnz, &&swap, &&drop, &&print, &&halt };
    long stack[16];
    long *top = stack;
    const int *pc = code;
    *top++ = n;
    goto *table[*pc];
push:
    *top++ = pc[1];
    pc += 2;
    goto *table[*pc];
add:
    top--;
    top[-1] += top[0];
    pc++;
    goto *table[*pc];
sub:
    top--;
    top[-1] -= top[0];
    pc++;
    goto *table[*pc];
dup:
    top[0] = top[-1];
    top++;
    pc++;
    goto *table[*pc];
jnz:
    if (*--top)
        pc = code + pc[1];
    else
        pc += 2;
    goto *table[*pc];
swap: {
    long t = top[-1];
    top[-1] = top[-2];
    top[-2] = t;
    pc++;
    goto *table[*pc];
}
drop:
    top--;
    pc++;
    goto *table[*pc];
print:
    printf("%ld\n", top[-1]);
    pc++;
    goto *table[*pc];
halt:
    return top > stack ? top[-1] : 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    /* counter on the stack: PUSH 1, SUB, DUP, JNZ back to PUSH; then 42. */
    static const int code[] = { PUSH, 1, SUB, DUP, JNZ, 0, PUSH, 42, SWAP, DROP, PRINT, HALT };
    return run(code, n) == 42 ? 0 : 1;
}

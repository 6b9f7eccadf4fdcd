/* A function whose first instruction carries a segment prefix, and a line
 * of main's that starts with a lock-prefixed one, which the kernel's
 * uprobes refuse on a running process (and skip without a word when the
 * probe is placed before the program starts), beside a function called
 * often enough for the governor to want its probes out.
 * Usage: segprefix [CALLS]   default 200000 */
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

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    __atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST);
    odd();
    for (long i = 0; i < calls; i++)
        work(i);
    printf("%lu\n", sink);
    return 0;
}

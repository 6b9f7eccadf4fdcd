/* Code under a label of no type, as hand-written assembly leaves it (the
 * dynamic loader's _start is one): a loop the program spends its time in.
 * Usage: label [MILLIONS]   default 300 (at least one) */
#include <stdlib.h>

void spin_label(long n);
__asm__(".text\n"
        ".globl spin_label\n"
        "spin_label:\n"
        "1:  dec %rdi\n"
        "    jnz 1b\n"
        "    ret\n");

int main(int argc, char **argv)
{
    long n = (long)((argc > 1 ? atof(argv[1]) : 300) * 1e6);
    spin_label(n > 0 ? n : 1);
    return 0;
}

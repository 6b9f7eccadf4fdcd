/* Gives one page of the C library's code (abort's) read, write and execute
 * rights and takes them back, as a JIT or a patcher changes the protection
 * of code, then clears a buffer in a loop: the samples in memset, elsewhere
 * in the library, are to be named still.
 * Usage: reprotect [ROUNDS]   default 100000. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static char buffer[1 << 16];
volatile unsigned sink;

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    char *page = (char *)((uintptr_t)&abort & ~(uintptr_t)4095);
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC) || mprotect(page, 4096, PROT_READ | PROT_EXEC)) {
        perror("mprotect");
        return 1;
    }
    for (long r = 0; r < rounds; r++) {
        memset(buffer, (int)r, sizeof buffer);
        sink += buffer[r & 0xffff];
    }
    printf("%u\n", sink);
    return 0;
}

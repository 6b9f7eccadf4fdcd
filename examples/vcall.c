/* A function whose first bytes, those a patch's jump replaces, end with a
 * call through memory (`sub rsp, 8; call [rip+table]` at -O2), as C++ and
 * Rust dispatch code often starts: the in-process engine patches it and
 * makes the call from the original return address. The table's entry
 * changes half way. Usage: vcall [CALLS] (each half) */
#include <stdio.h>
#include <stdlib.h>

typedef long (*op_t)(long);

__attribute__((noinline)) long twice(long x) { return 2 * x + 1; }
__attribute__((noinline)) long halve(long x) { return x / 2; }

op_t table[1] = {twice};

__attribute__((noinline)) long through_table(long x) { return table[0](x) + 1; }

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000;
    long sum = 0;
    for (long i = 0; i < calls; i++)
        sum += through_table(i);
    table[0] = halve;
    for (long i = 0; i < calls; i++)
        sum += through_table(i);
    printf("%ld\n", sum);
    return 0;
}

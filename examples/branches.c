/* Branch shapes for the edge-count tests: a switch dense enough for a jump
 * table, an unlikely error path that -O2 moves into a .cold part, loops
 * with continue and break, a tail call, and a call that does not return
 * (main ends in exit through die()).
 * Usage: branches [N]   default 200; exits 0. */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) int dispatch(int op, int x)
{
    switch (op) {
    case 0:
        return x + 1;
    case 1:
        return x * 3;
    case 2:
        return x - 7;
    case 3:
        return x << 2;
    case 4:
        return x ^ 0x55;
    case 5:
        return x / 3;
    case 6:
        return -x;
    default:
        return 0;
    }
}

__attribute__((cold, noinline)) static void complain(long x)
{
    fprintf(stderr, "odd value %ld\n", x);
}

__attribute__((noinline)) long checked(long x)
{
    if (__builtin_expect(x % 97 == 96, 0)) {
        complain(x);
        sink++;
    }
    return x * 2;
}

__attribute__((noinline)) long tail(long x)
{
    return checked(x + 1);
}

__attribute__((noinline)) long scan(const int *v, int n)
{
    long total = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] < 0)
            continue;
        if (v[i] > 80)
            break;
        total += v[i];
    }
    return total;
}

__attribute__((noreturn, noinline)) static void die(int status)
{
    fflush(stdout);
    exit(status);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200;
    int v[64];
    long total = 0;
    for (int i = 0; i < 64; i++)
        v[i] = (i * 37) % 101 - 10;
    for (int i = 0; i < n; i++) {
        total += dispatch(i % 9, i);
        total += tail(i);
        total += scan(v, i % 64);
    }
    printf("%ld\n", total);
    die(total == 42);
}

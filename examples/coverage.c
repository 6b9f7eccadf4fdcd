/* Line counts to compare with gcov: loops of every kind, a switch, goto,
 * early returns, short-circuit conditions and a function never called.
 * Usage: coverage [N]   default 10 (at most 100). */
#include <stdio.h>
#include <stdlib.h>

volatile int g;

static int classify(int x)
{
    switch (x % 4) {
    case 0:
        return 10;
    case 1:
    case 2:
        return 20;
    default:
        break;
    }
    return 30;
}

static int never(int x)
{
    return x * 2;
}

int search(const int *v, int n, int key)
{
    int i = 0;
    while (i < n) {
        if (v[i] == key)
            goto found;
        i++;
    }
    return -1;
found:
    return i;
}

int both(int a, int b) { return a > 0 && b > 0; }

static void bump(int n)
{
    for (int i = 0; i < n; i++)
        g++;
}

static void early(int x)
{
    if (x > 2)
        return;
    g += x;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    if (n > 100)
        n = 100;
    int v[100];
    long total = 0;
    for (int i = 0; i < n; i++)
        v[i] = i * 3;
    for (int i = 0; i < n; i++) {
        total += classify(i);
        if (both(i, n - i) || i == 0)
            total++;
        bump(i % 3);
        early(i);
    }
    do {
        total--;
    } while (total > 1000000);
    total += search(v, n, 9) + search(v, n, 1000);
    int x = g > 3 ? 1 :
        2;
    if (x == 1 && g != 7)
        g = 0;
    if (argc > 5)
        total += never(argc);
    printf("%ld\n", total);
    return 0;
}

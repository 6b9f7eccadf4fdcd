/* Known call counts: leaf() is reached from two callers, fib() recurses,
 * never_called() is never called.
 *
 *   main -> run(n) -> left(i)  x n     -> leaf  x n
 *                  -> right(i) x n/2   -> leaf  x n   (twice per call)
 *        -> fib(depth)                 (recursive: fib(k) calls fib(k-1), fib(k-2))
 *
 * Usage: calls [N [DEPTH]]   defaults: N = 1000, DEPTH = 15.
 */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) long leaf(long x)
{
    sink += x;
    return x * 2;
}

__attribute__((noinline)) long left(long i)
{
    return leaf(i) + 1;
}

__attribute__((noinline)) long right(long i)
{
    return leaf(i) + leaf(i + 1);
}

__attribute__((noinline)) long fib(int k)
{
    if (k < 2)
        return k;
    return fib(k - 1) + fib(k - 2);
}

__attribute__((noinline)) int never_called(int x)
{
    return x * 3;
}

__attribute__((noinline)) long run(long n)
{
    long total = 0;
    for (long i = 0; i < n; i++)
        total += left(i);
    for (long i = 0; i < n / 2; i++)
        total += right(i);
    return total;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    int depth = argc > 2 ? atoi(argv[2]) : 15;
    long total = run(n);
    long f = fib(depth);
    printf("total=%ld fib(%d)=%ld\n", total, depth, f);
    if (argc > 3)
        return never_called(argc);
    return 0;
}

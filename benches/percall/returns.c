/* Nanoseconds a call of each of returns.S's ways takes, four calls deep,
 * 20 M times, three runs each:
 *   gcc -O2 -o returns returns.c returns.S && ./returns
 *   gcc -O2 -DCLOCK -o returns-clock returns.c returns.S && ./returns-clock */
#include <stdio.h>
#include <time.h>

void plain(void);
void replaced(void);
void balanced(void);

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) static void down(void (*f)(void), int depth)
{
    if (depth)
        down(f, depth - 1);
    else
        f();
}

static void measure(const char *name, void (*f)(void))
{
    const long calls = 20000000;
    for (int run = 0; run < 3; run++) {
        double start = now_ns();
        for (long i = 0; i < calls; i++)
            down(f, 3);
        printf("%-9s %.2f ns\n", name, (now_ns() - start) / calls);
    }
}

int main(void)
{
    measure("plain", plain);
    measure("replaced", replaced);
    measure("balanced", balanced);
    return 0;
}

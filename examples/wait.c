/* A process to attach to. It prints "ready PID ADDRESS" (ADDRESS: where
 * tick() is loaded), then calls tick() once per line it reads on stdin and
 * exits at end of input, printing how many ticks it made. Tests drive it by
 * writing lines: no sleeping, no races.
 */
#include <stdio.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void tick(long i)
{
    sink += i;
}

int main(void)
{
    printf("ready %d %p\n", (int)getpid(), (void *)&tick);
    fflush(stdout);
    long ticks = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        long n = 0;
        sscanf(line, "%ld", &n);
        for (long i = 0; i < n; i++)
            tick(i);
        ticks += n;
        printf("ticked %ld\n", ticks);
        fflush(stdout);
    }
    printf("done %ld\n", ticks);
    return 0;
}

// wait.c with exceptions: a process to attach to while they fly. It prints
// "ready PID ADDRESS", then for each number N read from stdin calls tick()
// N times through round_of(); every tenth call throws and round_of()
// catches. Prints "ticked TOTAL" per line, "done TOTAL caught CAUGHT" at the end.
#include <cstdio>
#include <stdexcept>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void tick(long i)
{
    if (i % 10 == 9)
        throw std::runtime_error("tick rejected");
    sink += i;
}

__attribute__((noinline)) long round_of(long n)
{
    long caught = 0;
    for (long i = 0; i < n; i++) {
        try {
            tick(i);
        } catch (const std::exception &) {
            caught++;
        }
    }
    return caught;
}

int main()
{
    std::printf("ready %d %p\n", (int)getpid(), (void *)&tick);
    std::fflush(stdout);
    long ticks = 0, caught = 0;
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) {
        long n = 0;
        std::sscanf(line, "%ld", &n);
        caught += round_of(n);
        ticks += n;
        std::printf("ticked %ld\n", ticks);
        std::fflush(stdout);
    }
    std::printf("done %ld caught %ld\n", ticks, caught);
    return 0;
}

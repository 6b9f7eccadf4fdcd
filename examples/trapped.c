/* A program with a SIGTRAP handler of its own (as debuggers' helpers, crash
 * reporters and some runtimes have): held and stepped by a profiler, it
 * must keep it. It says "started", runs until its input ends, then raises
 * SIGTRAP and prints "handled" if its handler ran.
 *
 * Usage: trapped < input
 */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_trap(int signal)
{
    (void)signal;
    handled = 1;
}

int main(void)
{
    signal(SIGTRAP, on_trap);
    printf("started\n");
    fflush(stdout);
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0)
        ;
    raise(SIGTRAP);
    printf(handled ? "handled\n" : "not handled\n");
    return 0;
}

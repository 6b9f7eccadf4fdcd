/* A process that is always busy, to attach to while it runs its own code.
 * It prints "ready PID", then turns a loop until SIGTERM, and prints how
 * many turns it made, and how many were odd and even. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile long turns, odd, even;

static void on_term(int signal)
{
    (void)signal;
    stop = 1;
}

int main(void)
{
    signal(SIGTERM, on_term);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (!stop) {
        turns++;
        if (turns & 1)
            odd++;
        else
            even++;
    }
    printf("spun %ld odd %ld even %ld\n", turns, odd, even);
    return odd + even == turns ? 0 : 1;
}

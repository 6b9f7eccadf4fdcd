/* A process that is always busy, to attach to while its threads run their
 * own code. It starts N threads (argument, default 1), prints "ready PID",
 * and each thread turns a loop until SIGTERM; then it prints how many turns
 * they made in all, and exits 0 if each thread's odd and even turns add up
 * to its turns. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MOST 16

static volatile sig_atomic_t stop;
static struct turns {
    volatile long turns, odd, even;
} each[MOST];

static void on_term(int signal)
{
    (void)signal;
    stop = 1;
}

static void *spin(void *arg)
{
    struct turns *t = arg;
    while (!stop) {
        t->turns++;
        if (t->turns & 1)
            t->odd++;
        else
            t->even++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > MOST)
        return 2;
    pthread_t started[MOST];
    signal(SIGTERM, on_term);
    for (int i = 0; i < threads; i++)
        pthread_create(&started[i], NULL, spin, &each[i]);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    long all = 0;
    int wrong = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(started[i], NULL);
        all += each[i].turns;
        wrong |= each[i].odd + each[i].even != each[i].turns;
    }
    printf("spun %ld\n", all);
    return wrong;
}

/* Threads that sleep in a function, then a forked child that does too,
 * its thread id past the next 9,000 ids (threads that end at once take
 * those): past the pages of the off-CPU array proftap maps as a program
 * starts. Usage: offcpu THREADS [close]; with `close`, it first closes
 * every descriptor past the standard streams. Writes, for itself and then for the
 * child, the kB resident of the mappings of proftap's off-CPU array and
 * how many pages of 256 thread ids its threads' ids (and, in the child,
 * its parent's) fall in: "parent KB PAGES", "child KB PAGES". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MOST_THREADS 64

static int pages_of[MOST_THREADS + 2];
static int pages;

__attribute__((noinline)) void nap(int ms)
{
    usleep(ms * 1000);
}

static void note_page(void)
{
    int page = gettid() / 256;
    for (int i = 0; i < pages; i++)
        if (pages_of[i] == page)
            return;
    pages_of[pages++] = page;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *passes(void *unused)
{
    return unused;
}

static void *sleeper(void *unused)
{
    (void)unused;
    nap(20);
    pthread_mutex_lock(&lock);
    note_page();
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* kB resident of the mappings of a BPF map. */
static long resident_of_bpf_maps(void)
{
    FILE *smaps = fopen("/proc/self/smaps", "r");
    char line[512];
    long kb = 0, value;
    int in_map = 0;
    while (smaps && fgets(line, sizeof line, smaps)) {
        if (strchr(line, '-') && strchr(line, ':') && line[0] != ' ' && sscanf(line, "%*s %*s %*s %*s %ld", &value) == 1)
            in_map = strstr(line, "anon_inode:bpf-map") != NULL;
        else if (in_map && sscanf(line, "Rss: %ld kB", &value) == 1)
            kb += value;
    }
    if (smaps)
        fclose(smaps);
    return kb;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (threads < 0 || threads > MOST_THREADS)
        return 2;
    if (argc > 2 && strcmp(argv[2], "close") == 0)
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    pthread_t made[MOST_THREADS];
    for (int i = 0; i < threads; i++)
        pthread_create(&made[i], NULL, sleeper, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(made[i], NULL);
    nap(20);
    note_page();
    printf("parent %ld %d\n", resident_of_bpf_maps(), pages);
    fflush(stdout);
    for (int i = 0; i < 9000; i++) {
        pthread_t passing;
        if (pthread_create(&passing, NULL, passes, NULL) == 0)
            pthread_join(passing, NULL);
    }
    pid_t child = fork();
    if (child == 0) {
        nap(100);
        note_page();
        printf("child %ld %d\n", resident_of_bpf_maps(), pages);
        fflush(stdout);
        _exit(0);
    }
    int status;
    return waitpid(child, &status, 0) == child && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

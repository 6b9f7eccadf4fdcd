/* A tiny function called millions of times, which the overhead governor
 * throttles while the program runs, then a wait of up to five seconds for
 * the probe set it withdrew to be unregistered: prints how many uprobe
 * groups of its recorder (its parent: the groups' names carry the
 * recorder's pid) tracefs still had when the wait ended.
 * Usage: withdrawn [MILLIONS]   default 50 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void tiny(long i)
{
    sink += i;
}

/* Distinct groups named proftap_<recorder>_<n> in tracefs's uprobe
 * events; -1 when tracefs cannot be read. */
static int groups_of(pid_t recorder)
{
    FILE *events = fopen("/sys/kernel/tracing/uprobe_events", "r");
    if (!events)
        events = fopen("/sys/kernel/debug/tracing/uprobe_events", "r");
    if (!events)
        return -1;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "proftap_%d_", (int)recorder);
    static char seen[64][64];
    int groups = 0;
    char line[8192];
    while (fgets(line, sizeof line, events)) {
        char *group = strstr(line, prefix);
        char *slash = group ? strchr(group, '/') : NULL;
        if (!slash || slash - group >= 64)
            continue;
        *slash = '\0';
        int known = 0;
        for (int i = 0; i < groups; i++)
            known |= strcmp(seen[i], group) == 0;
        if (!known && groups < 64)
            strcpy(seen[groups++], group);
    }
    fclose(events);
    return groups;
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long calls = (long)((argc > 1 ? atof(argv[1]) : 50) * 1e6);
    for (long i = 0; i < calls; i++)
        tiny(i);
    pid_t recorder = getppid();
    double start = seconds();
    int groups;
    do {
        groups = groups_of(recorder);
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    } while (groups > 1 && seconds() - start < 5);
    printf("%d\n", groups);
    return 0;
}

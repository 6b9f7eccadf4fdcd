/* The kernel floor: a counting uprobe and uretprobe on one function through
 * the uprobe PMU, and nothing else. Runs the command, prints its output, and
 * checks the counts.
 * Usage: floor BINARY OFFSET COMMAND [ARGS...] */
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int open_uprobe(const char *path, uint64_t offset, int is_return, pid_t pid)
{
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int type = 0;
    if (!f || fscanf(f, "%d", &type) != 1)
        return -1;
    fclose(f);
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = type;
    attr.config = is_return ? 1 : 0; /* bit 0: return probe */
    attr.config1 = (uint64_t)(uintptr_t)path;
    attr.config2 = offset;
    attr.disabled = 1;
    attr.enable_on_exec = 1;
    return syscall(SYS_perf_event_open, &attr, pid, -1, -1, 0);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: floor BINARY OFFSET COMMAND [ARGS...]\n");
        return 2;
    }
    uint64_t offset = strtoull(argv[2], NULL, 0);
    int go[2];
    if (pipe(go))
        return 1;
    pid_t child = fork();
    if (child == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(126);
        execv(argv[3], argv + 3);
        _exit(127);
    }
    int entry = open_uprobe(argv[1], offset, 0, child);
    int ret = open_uprobe(argv[1], offset, 1, child);
    if (entry < 0 || ret < 0) {
        perror("perf_event_open");
        kill(child, 9);
        return 1;
    }
    write(go[1], "x", 1);
    int status;
    waitpid(child, &status, 0);
    uint64_t n_entry = 0, n_ret = 0;
    read(entry, &n_entry, sizeof n_entry);
    read(ret, &n_ret, sizeof n_ret);
    fprintf(stderr, "floor: %llu entries, %llu returns\n", (unsigned long long)n_entry, (unsigned long long)n_ret);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

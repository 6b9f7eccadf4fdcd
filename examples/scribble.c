/* A hostile target: it calls work() (for proftap's in-process engine to
 * patch), then writes into the memory it shares with proftap, as a program
 * may do by mistake or on purpose, and calls work() again. proftap must
 * end the recording with a sentence, never crash, hang or believe it.
 *
 * Usage: scribble MODE    MODE is one of
 *   header    the shared header is overwritten
 *   nodes     its thread's block says it has 2^40 calling contexts
 *   parents   a calling context names itself as its parent
 *   counts    a function's call count says 2^62
 *   noise     pseudo-random bytes over the header and the block's counters
 * It prints "done" and exits 0 after its last call.
 */
#include <stdio.h>
#include <string.h>

#include "../probes/runtime/runtime.h"

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

static unsigned char *shared_memory(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long start = 0;
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "memfd:proftap") && sscanf(line, "%lx-", &start) == 1)
            break;
    if (maps)
        fclose(maps);
    return (unsigned char *)start;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "noise";
    for (long i = 0; i < 1000; i++)
        work(i);
    unsigned char *base = shared_memory();
    /* The first block, at the page after the header: where this thread's totals are. */
    struct block *block = (struct block *)(base + ((sizeof(struct header) + 4095) & ~4095UL));
    if (base) {
        if (!strcmp(mode, "header")) {
            ((struct header *)base)->magic = 0;
        } else if (!strcmp(mode, "nodes")) {
            block->nodes = 1UL << 40;
        } else if (!strcmp(mode, "parents")) {
            block->node[1].parent = 1;
        } else if (!strcmp(mode, "counts")) {
            /* The calls by function follow the block's fixed part. */
            *(u64 *)((char *)block + sizeof(struct block)) = 1UL << 62;
        } else {
            unsigned long x = 88172645463325252ul;
            for (size_t i = 0; i < 64; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                base[i] = (unsigned char)x;
                ((unsigned char *)block)[i] = (unsigned char)(x >> 8);
            }
        }
    }
    for (long i = 0; i < 1000; i++)
        work(i);
    printf("done\n");
    return base ? 0 : 3;
}

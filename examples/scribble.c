/* A hostile target: it calls work() (for proftap's in-process engine to
 * patch), then writes into the memory it shares with proftap, as a program
 * may do by mistake or on purpose, and calls work() again. proftap must
 * end the recording with a sentence, never crash, hang or believe it.
 *
 * Usage: scribble MODE    MODE is one of
 *   head      every ring says it holds far more records than it can
 *   lost      the lost-record counters say 2^64 - 68
 *   records   records of functions that were never patched
 *   threads   records of 20,000 threads the program never had
 *   noise     pseudo-random bytes over the rings' control blocks
 * It prints "done" and exits 0 after its last call.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

volatile long sink;

__attribute__((noinline)) void work(long i)
{
    sink += i;
}

/* Layout of proftap's shared memory (probes/src/inject/runtime.rs). */
enum { HEADER = 64, SLOTS = 64, CONTROL = 64, RING = 1 << 19, RECORD = 32 };
enum { TID = 0, HEAD = 8, TAIL = 16, LOST = 24 };

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

static uint64_t *control(unsigned char *base, int slot, int field)
{
    return (uint64_t *)(base + HEADER + slot * CONTROL + field);
}

/* Appends a record to slot 0's ring, as the runtime would. */
static void append(unsigned char *base, uint64_t payload)
{
    uint64_t head = *control(base, 0, HEAD);
    uint64_t *record = (uint64_t *)(base + HEADER + SLOTS * CONTROL + (head & (RING - 1)) * RECORD);
    record[0] = __rdtsc();
    record[1] = payload;
    record[2] = record[3] = 0;
    __atomic_store_n(control(base, 0, HEAD), head + 1, __ATOMIC_RELEASE);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "noise";
    for (long i = 0; i < 1000; i++)
        work(i);
    unsigned char *base = shared_memory();
    if (base) {
        if (!strcmp(mode, "head")) {
            for (int slot = 0; slot < SLOTS; slot++)
                *control(base, slot, HEAD) = 0x7fffffffffffull;
        } else if (!strcmp(mode, "lost")) {
            for (int slot = 0; slot < SLOTS; slot++)
                *control(base, slot, LOST) = UINT64_MAX - 67;
        } else if (!strcmp(mode, "records")) {
            for (int i = 0; i < 1000; i++)
                append(base, 0xfffffffful);
        } else if (!strcmp(mode, "threads")) {
            for (uint64_t i = 0; i < 20000; i++)
                append(base, (4000000 - i) << 40);
        } else {
            unsigned long x = 88172645463325252ul;
            for (size_t i = 0; i < HEADER + SLOTS * CONTROL; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                base[i] = (unsigned char)x;
            }
        }
    }
    for (long i = 0; i < 1000; i++)
        work(i);
    printf("done\n");
    return base ? 0 : 3;
}

/* A multi-file C program with a hot loop: main -> process -> checksum (hot)
 * and parse_record/format_record from io.c.
 *
 * Usage: multifile [RECORDS [ROUNDS]]   defaults: 200 and 50.
 */
#include <stdio.h>
#include <stdlib.h>
#include "compute.h"
#include "io.h"

int main(int argc, char **argv)
{
    int records = argc > 1 ? atoi(argv[1]) : 200;
    int rounds = argc > 2 ? atoi(argv[2]) : 50;
    unsigned long total = 0;
    char line[64];
    for (int r = 0; r < records; r++) {
        format_record(line, sizeof line, r);
        struct record rec = parse_record(line);
        total += process(&rec, rounds);
    }
    printf("records=%d total=%lu\n", records, total);
    return 0;
}

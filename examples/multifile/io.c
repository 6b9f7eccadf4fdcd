#include "io.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const char **p)
{
    int v = 0;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    return v;
}

void format_record(char *buf, size_t size, int id)
{
    snprintf(buf, size, "%d,%d", id, (id * 7919) % 1000);
}

struct record parse_record(const char *line)
{
    struct record rec;
    rec.id = parse_int(&line);
    if (*line == ',')
        line++;
    rec.value = parse_int(&line);
    return rec;
}

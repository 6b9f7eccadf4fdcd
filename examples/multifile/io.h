#ifndef IO_H
#define IO_H
#include <stddef.h>

struct record {
    int id;
    int value;
};

void format_record(char *buf, size_t size, int id);
struct record parse_record(const char *line);

#endif

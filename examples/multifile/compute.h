#ifndef COMPUTE_H
#define COMPUTE_H
#include "io.h"

unsigned long process(const struct record *rec, int rounds);

#endif

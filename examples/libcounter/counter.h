#ifndef COUNTER_H
#define COUNTER_H

void counter_add(long n);
long counter_total(void);
void counter_reset(void);

#endif

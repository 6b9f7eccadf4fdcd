/* What `lock` adds to an increment at a function's entry, after the
 * caller's and the function's stores: the same function with no
 * increment, a plain `inc` and a `lock inc`, 100 M calls each.
 * gcc -O2 -o lockcost lockcost.c; ./lockcost */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
long counter[64]; long buf[4096];
#define F(name, count) __attribute__((noinline)) long name(long *p, long i) { count; p[i & 4095] = i; p[(i*7) & 4095] += 1; return p[(i*13)&4095]; }
F(none, (void)0)
F(plain, __asm__ volatile("incq %0":"+m"(counter[0])))
F(locked, __asm__ volatile("lock incq %0":"+m"(counter[8])))
int main(int argc, char **argv){ long m=100000000, s=0; double t;
 for (int r=0;r<2;r++){
 t=now(); for(long i=0;i<m;i++){ buf[(i*3)&4095]=i; s+=none(buf,i);} printf("none   %.2f ns\n",(now()-t)*1e9/m);
 t=now(); for(long i=0;i<m;i++){ buf[(i*3)&4095]=i; s+=plain(buf,i);} printf("plain  %.2f ns\n",(now()-t)*1e9/m);
 t=now(); for(long i=0;i<m;i++){ buf[(i*3)&4095]=i; s+=locked(buf,i);} printf("locked %.2f ns\n",(now()-t)*1e9/m);}
 return s==42;}

/* What counting a call costs processes that share a counter, against a
 * counter per CPU: N forked processes each increment 50 M times, with
 * mode 0 one shared counter (`lock inc`), mode 1 the running CPU's
 * (`rdpid`, then `lock inc`), mode 2 the same without `lock`.
 * gcc -O2 -o contend contend.c; ./contend N MODE 50000000 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int n=atoi(argv[1]); int mode=atoi(argv[2]); long m=atol(argv[3]);
  long *c = mmap(0, 4096L * 4096, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  double t0=now();
  for(int k=0;k<n;k++) if(fork()==0){
    for(long i=0;i<m;i++){
      if(mode==0) __asm__ volatile("lock incq %0":"+m"(c[0]));
      else if(mode==1){ unsigned long cpu; __asm__ volatile("rdpid %0":"=r"(cpu)); __asm__ volatile("lock incq %0":"+m"(c[(cpu&0xfff)*512]));}
      else { unsigned long cpu; __asm__ volatile("rdpid %0":"=r"(cpu)); c[(cpu&0xfff)*512]++; __asm__ volatile("":::"memory");}
    }
    _exit(0);}
  while(wait(0)>0){}
  double t=now()-t0; long s=0; for(int i=0;i<4096;i++) s+=c[i*512];
  printf("n=%d mode=%d %.2f ns/op per process, total %ld\n", n, mode, t * 1e9 / m, mode ? s : c[0]);
}

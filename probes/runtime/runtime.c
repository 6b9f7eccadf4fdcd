/* proftap's runtime in a patched process: it times every call of the
 * patched functions and adds it up in place, per thread and per calling
 * context, in memory shared with proftap. Nothing per call leaves the
 * process, so nothing can be lost on the way: proftap reads the totals.
 *
 * A patched entry jumps to the function's trampoline, which saves the
 * registers a call may use and calls proftap_entry(slot, function), slot
 * being where the caller's return address is. proftap_entry finds the
 * thread's block (keyed by its thread pointer, fs:[0]), finds or makes the
 * node of this function under the caller's node, pushes a frame with the
 * return address and returns the `call` before a return trampoline. The
 * trampoline steps over the slot and goes through that `call` into the
 * function, which writes the return trampoline's address in the slot: the
 * function's return lands where the processor predicted. The return
 * trampoline calls proftap_exit(slot), which pops the frame, adds its
 * times to the node and puts the original return address back, and
 * returns there, again where the processor predicted (the caller's call).
 *
 * Built freestanding (no C library, no SSE registers, position independent)
 * into a flat blob that proftap copies next to each patched module; the
 * configuration at proftap_config is written into each copy. Every address
 * of the runtime's memory comes from it. Layout facts proftap needs are
 * exported in proftap_layout (see runtime.h).
 */
#include "runtime.h"

__attribute__((used, aligned(64))) struct config proftap_config;

/* The configuration, all zero when compiled and written per copy: a
 * global another object could write, which the compiler cannot take for
 * zero. Read at its rip-relative address, it takes no register. */
static inline const struct config *config(void)
{
    return &proftap_config;
}

__attribute__((used)) const u64 proftap_layout[] = {
    LAYOUT_MAGIC,
    sizeof(struct config),
    sizeof(struct header),
    sizeof(struct block),
    sizeof(struct frame),
    sizeof(struct node),
    sizeof(struct seat),
    sizeof(struct private_block),
    sizeof(struct ret),
    SEATS,
    STACK_DEPTH,
    NODES,
    HASH_SLOTS,
    __builtin_offsetof(struct block, frame),
    __builtin_offsetof(struct block, returns),
    __builtin_offsetof(struct block, hash),
    __builtin_offsetof(struct block, node),
    __builtin_offsetof(struct private_block, ret),
    sizeof(struct traced),
    __builtin_offsetof(struct block, traced),
    sizeof(struct regions),
    sizeof(struct region_total),
    OPEN_REGIONS,
    SITES,
    SITE_BYTES,
    CALL_BEFORE_TRAMPOLINE,
    PRIVATE_HEAD, /* where the private blocks start */
    FORK_SOCKET_NAME,
    FORK_SOCKET_PATH,
    __builtin_offsetof(struct config, fork_path),
    __builtin_offsetof(struct header, children_unreached),
    OFF_CPU_PAGE_WORDS,
    __builtin_offsetof(struct header, off_cpu_unmapped),
    __builtin_offsetof(struct header, lock_refused),
    HOOK_FIRST_ARGUMENT,
};

static inline u64 rdtsc(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

static inline u64 thread_pointer(void)
{
    u64 tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
}

static inline long syscall6(long number, long a, long b, long c, long d, long e, long f)
{
    long result;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "0"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return result;
}

#define SYS_close 3
#define SYS_mmap 9
#define SYS_mprotect 10
#define SYS_munmap 11
#define SYS_rt_sigprocmask 14
#define SYS_pwrite64 18
#define SYS_sched_yield 24
#define SYS_getpid 39
#define SYS_socket 41
#define SYS_connect 42
#define SYS_recvfrom 45
#define SYS_sendmsg 46
#define SYS_setsockopt 54
#define SYS_ftruncate 77
#define SYS_process_vm_readv 310
#define SYS_memfd_create 319
/* What the C library's fstat makes (since glibc 2.33; before, and musl's
 * and Go's, fstat): a program whose system calls are filtered allows
 * the one its library makes. */
#define SYS_fstat 5
#define SYS_newfstatat 262
#define AT_EMPTY_PATH 0x1000
#define EPERM 1
#define ENOSYS 38

/* futex(2), on memory shared with proftap (not private to the process). */
#define SYS_FUTEX 202
#define FUTEX_WAIT 0
#define FUTEX_WAKE 1

static inline u64 gettid(void)
{
    return (u64)syscall6(186, 0, 0, 0, 0, 0, 0);
}

/* The thread's id as the C library keeps it, or 0 when its place is unknown. */
static inline u32 library_tid(const struct config *c)
{
    if (!c->tcb_tid)
        return 0;
    u32 tid;
    __asm__("movl %%fs:(%1), %0" : "=r"(tid) : "r"(c->tcb_tid));
    return tid;
}

static inline int live(const struct config *c)
{
    return *(volatile u64 *)c->live == LIVE_RECORDING;
}

static inline struct header *header(const struct config *c)
{
    return (struct header *)c->shared;
}

static inline struct block *shared_block(const struct config *c, u64 index)
{
    return (struct block *)(c->shared + c->blocks_offset + index * c->block_bytes);
}

static inline u64 *entries_of(const struct config *c, struct block *b)
{
    return (u64 *)((char *)b + c->entries_offset);
}

/* Whether two return-address slots are on the same stack, as far as the
 * runtime can tell: a thread's frames are within a few MiB of each other;
 * another stack (an alternate signal stack, another thread's that shares
 * this thread's thread pointer) is farther. */
static inline int near(u64 a, u64 b)
{
    return (a > b ? a - b : b - a) < NEAR_STACK;
}

/* The thread's alternate signal stack, as [*lo, *hi) (empty when it has
 * none); returns whether the thread runs on it now: a handler's. */
static int alternate_stack(u64 *lo, u64 *hi)
{
    struct {
        u64 sp;
        int flags;
        u64 size;
    } stack = {0, 0, 0};
    *lo = *hi = 0;
    if (syscall6(131 /* sigaltstack */, 0, (long)&stack, 0, 0, 0, 0) != 0 || (stack.flags & 2 /* SS_DISABLE */))
        return 0;
    *lo = stack.sp;
    *hi = stack.sp + stack.size;
    return stack.flags & 1 /* SS_ONSTACK */;
}

static int on_alternate_stack(void)
{
    u64 lo, hi;
    return alternate_stack(&lo, &hi);
}

/* Whether the call at `slot` holding the thread's block (`was`) was left
 * by a jump (a handler that interrupted the runtime and left by
 * siglongjmp), seen from a call at `slot` of this thread. A handler that
 * did not leave calls from below the held call, or from its alternate
 * stack; another thread calls from its own stack. So a held slot between
 * this code's frame and the call's is in frames this thread left. On a
 * block of one thread (not `shared`), so is a held slot below the call's
 * on its stack, unless this is a handler's call on its alternate stack,
 * which may lie near, above the held call. */
static __attribute__((noinline)) int left_by_a_jump(u64 was, u64 slot, int shared)
{
    u64 here = (u64)__builtin_frame_address(0);
    if (here < was && was <= slot)
        return 1;
    return !shared && was <= slot && near(slot, was) && !on_alternate_stack();
}

/* Takes the thread's block for one call into the runtime, that of the
 * call whose return address is at `slot` (a region hook's stack pointer):
 * returns 0 when it was free, or held by a call a jump left (and is now
 * the caller's), else 1. One thread's signal handlers nest (a handler
 * that finds the block free leaves it free again before the code it
 * interrupted goes on), so a plain read and write do; two threads on one
 * block need the compare-and-swap, which costs a sixth of a call's
 * bookkeeping. No two threads share a block before the flag is set: it is
 * set as a thread that may share a thread pointer is made. */
static inline int take_block_busy(const struct config *c, struct private_block *p, u64 slot)
{
    u64 was = 0;
    if (__atomic_load_n(&header(c)->shared_seats, __ATOMIC_RELAXED)) {
        if (__atomic_compare_exchange_n(&p->busy, &was, slot, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return 0;
        return !(left_by_a_jump(was, slot, 1) && __atomic_compare_exchange_n(&p->busy, &was, slot, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED));
    }
    was = __atomic_load_n(&p->busy, __ATOMIC_RELAXED);
    int held = was && !left_by_a_jump(was, slot, 0);
    if (!held)
        __atomic_store_n(&p->busy, slot, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    return held;
}

/* Takes the thread's block for a return, which cannot be skipped. On a
 * block of one thread no call can hold it meanwhile (a handler's calls
 * while it is held are not hijacked, and return without the runtime): a
 * hold found is one a jump left, and is taken over. Threads sharing a
 * block wait for each other. */
static inline void take_block_to_return(const struct config *c, struct private_block *p, u64 slot)
{
    if (!__atomic_load_n(&header(c)->shared_seats, __ATOMIC_RELAXED)) {
        __atomic_store_n(&p->busy, slot, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        return;
    }
    while (take_block_busy(c, p, slot))
        __asm__ volatile("pause");
}

/* Calls made while the block was busy (a signal handler, or another thread
 * on the same thread pointer): counted apart, atomically, so that the
 * plain count under the busy flag never races with them. */
static inline u64 *busy_entries_of(const struct config *c, struct block *b)
{
    return entries_of(c, b) + c->functions;
}

/* Which seats were ever taken (see SEAT_WORDS). */
static inline u64 *seats_taken(const struct config *c)
{
    return (u64 *)(c->private_base + sizeof(struct seat) * SEATS);
}

/* Which pages of the array of times off CPU this process mapped, a bit
 * each, then which it could not (see map_off_cpu_entry). */
static inline u64 *off_cpu_pages(const struct config *c)
{
    return seats_taken(c) + SEAT_WORDS;
}

static inline struct private_block *private_block(const struct config *c, u64 index)
{
    return (struct private_block *)(c->private_base + PRIVATE_HEAD + index * sizeof(struct private_block));
}

/* Makes private block `index` writable (see PRIVATE_HEAD), as a thread
 * takes it, unless its bit says it is: each block alone, so that blocks
 * refused while memory was short leave the next ones no dearer. A forked
 * child inherits the blocks' rights and their bits. Returns 0 where the
 * kernel refuses (the memory the process may commit is spent). */
static __attribute__((noinline)) int private_block_writable(const struct config *c, u64 index)
{
    u64 *writable = off_cpu_pages(c) + 2 * OFF_CPU_PAGE_WORDS + index / 64, bit = 1UL << (index % 64);
    if (index < MOST_BLOCKS && (__atomic_load_n(writable, __ATOMIC_ACQUIRE) & bit))
        return 1;
    u64 from = (u64)private_block(c, index) & ~4095UL, to = ((u64)private_block(c, index + 1) + 4095) & ~4095UL;
    if (syscall6(SYS_mprotect, (long)from, (long)(to - from), 3 /* PROT_READ | PROT_WRITE */, 0, 0, 0) != 0)
        return 0;
    if (index < MOST_BLOCKS)
        __atomic_fetch_or(writable, bit, __ATOMIC_RELEASE);
    return 1;
}

static inline u64 ns_to_tsc(const struct config *c, u64 ns)
{
    struct header *h = header(c);
    return (u64)(((unsigned __int128)ns * h->ns_to_tsc_mult) >> h->ns_to_tsc_shift);
}

#define SYS_clock_gettime 228
#define CLOCK_THREAD_CPUTIME_ID 3

/* Thread tid's entry in the array of times off CPU (offcpu.rs: its time
 * off CPU up to its last switch or accounting, then when it left or came
 * onto a CPU), or 0 where there is none. The array's room is readable
 * and all zero (a thread never seen) but for the pages mapped from the
 * array, those of the threads that took a block (map_off_cpu_entry):
 * a thread reads its entry with no test of its own. */
static inline volatile const u64 *off_cpu_entry(const struct config *c, u32 tid)
{
    if (!c->off_cpu || !tid || tid >= c->off_cpu_entries)
        return 0;
    return (volatile const u64 *)c->off_cpu + 2 * (u64)tid;
}

/* The TSC and the time off CPU (nanoseconds) of the thread whose entry is
 * `entry`, at one moment. The time off CPU changes only between two of
 * the thread's instructions (as it comes back onto a CPU, or as the
 * kernel accounts it, at a tick or as it reads its CPU clock): a pair
 * read with the same time off CPU before and after is one moment's, where
 * a pair read apart could count a stretch off CPU in one and not the
 * other (a call preempted there would be off by a whole time slice). */
static inline u64 read_pair(volatile const u64 *entry, u64 *off)
{
    u64 before, now;
    /* A thread proftap single-steps (out of this code, at a detach) is
     * switched out at every instruction: after a few tries the pair is
     * taken as it is. */
    int tries = 0;
    do {
        before = entry[0];
        now = rdtsc();
    } while (entry[0] != before && ++tries < 4);
    *off = before;
    return now;
}

/* The TSC and the time off CPU of the thread whose entry is `entry` (0:
 * none, no time off CPU) at one moment. */
static inline u64 now_and_off_of(volatile const u64 *entry, u64 *off)
{
    if (!entry) {
        *off = 0;
        return rdtsc();
    }
    return read_pair(entry, off);
}

/* Maps the page of the array of times off CPU that holds thread tid's
 * entry where it belongs in its room, from the array's descriptor
 * proftap left in the process, as tid takes a block: a process maps only
 * its threads' pages, and a fork copies a few entries of them rather
 * than the whole array's (64 MiB where thread ids go up to 4 M). A forked
 * child inherits the pages and their bits, and maps its own threads'.
 * A page mapped twice (a signal handler, another thread, between the
 * mapping and its bit) is the same page again. Where the descriptor is
 * no longer the array's (the program closed or replaced it), the page
 * stays all zero, once, and is counted: its threads' time off CPU is
 * not seen. */
static __attribute__((noinline)) void map_off_cpu_entry(const struct config *c, u32 tid)
{
    u64 page = tid / OFF_CPU_PER_PAGE, bit = 1UL << (page % 64), *mapped = off_cpu_pages(c) + page / 64,
        *refused = mapped + OFF_CPU_PAGE_WORDS;
    if (!c->off_cpu || !tid || tid >= c->off_cpu_entries || (__atomic_load_n(mapped, __ATOMIC_RELAXED) & bit) ||
        (__atomic_load_n(refused, __ATOMIC_RELAXED) & bit))
        return;
    u64 status[18]; /* the kernel's struct stat: st_dev, then st_ino */
    char no_path[1] = {0};
    long at = (long)(c->off_cpu + page * 4096);
    long stat = syscall6(SYS_newfstatat, (long)c->off_cpu_fd, (long)no_path, (long)status, AT_EMPTY_PATH, 0, 0);
    if (stat == -EPERM || stat == -ENOSYS)
        stat = syscall6(SYS_fstat, (long)c->off_cpu_fd, (long)status, 0, 0, 0, 0);
    if (stat == 0 && status[0] == c->off_cpu_device && status[1] == c->off_cpu_inode) {
        if (syscall6(SYS_mmap, at, 4096, 1 /* PROT_READ */, 1 | 0x10 /* MAP_SHARED | MAP_FIXED */, (long)c->off_cpu_fd, (long)(page * 4096)) == at) {
            __atomic_fetch_or(mapped, bit, __ATOMIC_RELAXED);
            return;
        }
        /* Another object's mapping that failed (the number holds one of
         * the many that share the anonymous inode) may have taken the
         * page away first (kernels before 6.12): zeros go back, which
         * every thread reads unchecked, over another thread's mapping of
         * the page meanwhile too, which is no longer so. */
        syscall6(SYS_mmap, at, 4096, 1 /* PROT_READ */, 2 | 0x20 | 0x10 /* MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED */, -1, 0);
        __atomic_fetch_and(mapped, ~bit, __ATOMIC_RELAXED);
    }
    /* Called where the shared memory is the process's own (a block is
     * taken, or a child's is made). */
    __atomic_fetch_or(refused, bit, __ATOMIC_RELAXED);
    __atomic_fetch_add(&header(c)->off_cpu_unmapped, 1, __ATOMIC_RELAXED);
}

/* Thread tid's entry where its page is mapped in this process, else 0:
 * for a read made before the thread may have taken its block. */
static inline volatile const u64 *mapped_off_cpu_entry(const struct config *c, u32 tid)
{
    u64 page = tid / OFF_CPU_PER_PAGE;
    if (!c->off_cpu || !tid || tid >= c->off_cpu_entries || !(__atomic_load_n(&off_cpu_pages(c)[page / 64], __ATOMIC_RELAXED) >> (page % 64) & 1))
        return 0;
    return off_cpu_entry(c, tid);
}

/* The same of thread tid. */
static inline u64 now_and_off(const struct config *c, u32 tid, u64 *off)
{
    return now_and_off_of(off_cpu_entry(c, tid), off);
}

/* Whether block b's thread, which runs this code, finds its entry has it
 * off every CPU, or never seen (the second word without the mark of a
 * time on one): its coming back was not seen (some kernels raise no
 * sched_switch for a switch away from some tasks), and its time off CPU
 * is stale until the kernel next accounts it. Once for each such mark:
 * where the accounting cannot mend the entry (a kernel without the
 * program on sched_stat_runtime), the calls after do not each ask again. */
static inline int back_unseen(volatile const u64 *entry, const struct block *b)
{
    if (!entry)
        return 0;
    u64 when = entry[1];
    return (long)when >= 0 && b->accounted != when + 1;
}

/* The pair read again once the kernel accounted block b's thread, whose
 * entry is `entry` (see back_unseen): reading its CPU clock makes the
 * kernel account it now, and the program on that accounting mends the
 * entry before the pair is read. Else this call would count the time away
 * as CPU time, and a later one, read after the kernel's next accounting,
 * as time off CPU. */
static __attribute__((noinline, cold)) u64 now_and_off_accounted(volatile const u64 *entry, struct block *b, u64 *off)
{
    b->accounted = entry[1] + 1;
    u64 cpu_time[2];
    syscall6(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, (long)cpu_time, 0, 0, 0, 0);
    return read_pair(entry, off);
}

/* The TSC and block b's thread's time off CPU at one moment, read by the
 * thread itself, its entry mended first where it needs it: from the pair
 * `now` and `off` read already of the thread whose entry is `read` where
 * that is b's thread's, else read now. */
static inline u64 own_time(const struct config *c, struct block *b, volatile const u64 *read, u64 now, u64 *off)
{
    volatile const u64 *entry = off_cpu_entry(c, (u32)b->tid);
    if (entry != read)
        now = now_and_off_of(entry, off);
    if (__builtin_expect(back_unseen(entry, b), 0))
        return now_and_off_accounted(entry, b, off);
    return now;
}

/* The same, read now. */
static inline u64 own_now_and_off(const struct config *c, struct block *b, u64 *off)
{
    volatile const u64 *entry = off_cpu_entry(c, (u32)b->tid);
    u64 now = now_and_off_of(entry, off);
    if (__builtin_expect(back_unseen(entry, b), 0))
        return now_and_off_accounted(entry, b, off);
    return now;
}

/* The code that makes a forked child's memory, kept together in the
 * image: proftap tells its samples apart from the probes' (whose cost per
 * call the overhead governor judges), as it runs once per child. */
#define FORK_CODE __attribute__((section(".text.fork")))

/* Forked children. A forked child inherits the parent's shared memory
 * (a shared mapping stays shared) and a copy of its private memory; its
 * live word reads LIVE_CHILD. At its first call into the runtime it makes
 * shared memory of its own, carrying over the forking thread's block (its
 * calling contexts with no calls yet, its frames in progress timed from
 * now), reaches proftap's socket, maps the memory where the parent's was
 * and hands it to proftap. If any of that fails, the child runs
 * unrecorded, its returns still right. */

/* Blocks every signal that can be (for work a handler must not
 * interrupt: it would find it half done); returns the mask to put back. */
static inline __attribute__((always_inline)) u64 block_signals(void)
{
    u64 every_signal = ~0UL, before = 0;
    syscall6(SYS_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&every_signal, (long)&before, sizeof before, 0, 0);
    return before;
}

static inline __attribute__((always_inline)) void restore_signals(u64 before)
{
    syscall6(SYS_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&before, 0, sizeof before, 0, 0);
}

/* Stops the compiler from turning a copying loop into a call to memcpy,
 * which a freestanding image does not have. */
#define NOT_A_MEMCPY() __asm__ volatile("" ::: "memory")

static inline u64 home_of(u64 key);

/* Whether the thread control block at `key` (a seat's: a thread of the
 * parent's, whose memory the child may no longer have) holds the C
 * library's thread id `tid`. Read with process_vm_readv, which fails on
 * memory not mapped rather than faulting. */
FORK_CODE static int thread_id_at(const struct config *c, u64 key, u32 tid)
{
    u32 there = 0;
    u64 local[2] = {(u64)&there, sizeof there};
    u64 remote[2] = {key + c->tcb_tid, sizeof there};
    return syscall6(SYS_process_vm_readv, (long)gettid(), (long)local, 1, (long)remote, 1, 0) == sizeof there && there == tid;
}

/* Whether seat s is a thread's seat as the fork left it, rather than one
 * left from a thread that ended before: its block is in use; or proftap
 * retired it since the fork, or is retiring it, or another parent thread
 * is taking it (the thread returned from its calls in the parent and
 * ended there), and the child's copy of its private block has frames in
 * progress (a block is retired with none; a seat with none has nothing
 * to carry anyway). */
FORK_CODE static int seat_as_forked(const struct config *c, const struct seat *s)
{
    if (!s->key || !s->block || s->block > c->blocks)
        return 0;
    /* The parent's shared memory, the child's until it makes its own. */
    u64 state = __atomic_load_n(&shared_block(c, s->block - 1)->state, __ATOMIC_ACQUIRE);
    return state == BLOCK_USED || private_block(c, s->block - 1)->depth;
}

/* Leaves the forking thread's seat alone in the table, at its home place,
 * with its thread id in the child: the parent's other threads are not in
 * the child. The forking thread is the calling one when its C library
 * thread id is now the child's pid (the usual case) or where that id's
 * place is unknown; else the one whose thread control block holds that
 * id; else (a child the C library did not make, whose ids it did not
 * write) the calling one again. Returns the seat, or 0 when the forking
 * thread had none. Only the seats ever taken are read and cleared: the
 * table is the parent's private memory, its pages copied (or made) as the
 * child touches them. */
FORK_CODE static struct seat *keep_forking_seat(const struct config *c)
{
    u64 key = thread_pointer();
    u32 pid = (u32)syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    u32 own_tid = library_tid(c);
    int calling_forked = !c->tcb_tid || own_tid == pid;
    struct seat *seats = (struct seat *)c->private_base;
    u64 *taken = seats_taken(c);
    struct seat own = {0, 0, 0, 0}, other = {0, 0, 0, 0};
    for (u64 w = 0; w < SEAT_WORDS; w++) {
        for (u64 bits = taken[w]; bits; bits &= bits - 1) {
            struct seat *s = &seats[w * 64 + (u64)__builtin_ctzll(bits)];
            if (s->key == key && seat_as_forked(c, s))
                own = *s;
            else if (s->key != key && !calling_forked && !other.block && seat_as_forked(c, s) && thread_id_at(c, s->key, pid))
                other = *s;
            s->key = s->block = s->tid = s->claimer = 0;
            NOT_A_MEMCPY();
        }
        if (taken[w])
            taken[w] = 0;
    }
    /* Not the forking thread's: a parent thread's whose stack the C library
     * gave a thread of the child (its thread id is the parent thread's). */
    if (!calling_forked && (u32)own.tid != own_tid)
        own.block = 0;
    struct seat forking = other.block ? other : own;
    if (!forking.block)
        return 0;
    u64 at = home_of(forking.key);
    struct seat *home = &seats[at];
    home->block = forking.block;
    home->tid = other.block ? pid : own_tid ? own_tid : (u32)gettid();
    home->key = forking.key;
    taken[at / 64] |= 1UL << (at % 64);
    return home;
}

static u32 child_node(struct block *b, u32 parent, u32 function);

/* The thread's block as the child's first: the contexts of the child's
 * frames in progress, with nothing counted. Its private copy says which,
 * as the fork left them (the parent's shared block has moved on). Only
 * those contexts: the parent's others have nothing to carry, and each
 * context made writes a page of the new memory's hash table, which costs
 * the child a page fault. Their times start once the memory is handed
 * over (start_carried_frames). */
FORK_CODE static void carry_block(struct block *to, const struct private_block *p, u64 tid)
{
    u64 depth = p->depth < STACK_DEPTH ? p->depth : STACK_DEPTH;
    to->nodes = 1; /* node 0: the thread itself */
    u32 parent = 0;
    for (u64 d = 0; d < depth; d++) {
        u32 function = p->function[d];
        parent = child_node(to, parent, function);
        to->frame[d].node = parent;
        to->frame[d].function = function;
        /* No time until start_carried_frames: proftap reading the child
         * meanwhile (it was killed) ends the frame without one. */
        to->frame[d].entry_tsc = ~0UL;
        to->returns[d] = p->ret[d];
    }
    to->tid = tid;
    map_off_cpu_entry(config(), (u32)tid);
    /* The frames that have a context: past the node table's room (a stack
     * deeper than NODES), the others have none. */
    to->carried = to->nodes - 1;
    to->depth = depth;
    to->mixed = p->mixed;
    to->state = BLOCK_USED;
}

/* Gives frame f its entry time `now` and the thread's time off CPU then:
 * the time last, for proftap, which takes a frame whose time is not all
 * ones as started. */
static inline void start_frame(struct frame *f, u64 now, u64 off)
{
    f->entry_off = off;
    __atomic_store_n(&f->entry_tsc, now, __ATOMIC_RELEASE);
}

/* The carried frames of block b (see carry_block) start now: making and
 * handing over the child's memory is no call's time. */
FORK_CODE static void start_carried_frames(const struct config *c, struct block *b)
{
    u64 off, now = now_and_off(c, (u32)b->tid, &off);
    for (u64 d = 0; d < b->depth && d < STACK_DEPTH; d++)
        start_frame(&b->frame[d], now, off);
}

/* Moves private block `from` to `to`: its frames in progress, its flags. */
FORK_CODE static void move_private_block(const struct config *c, u64 from, u64 to)
{
    const struct private_block *a = private_block(c, from);
    struct private_block *b = private_block(c, to);
    u64 depth = a->depth < STACK_DEPTH ? a->depth : STACK_DEPTH;
    for (u64 d = 0; d < depth; d++) {
        b->ret[d] = a->ret[d];
        b->function[d] = a->function[d];
        NOT_A_MEMCPY();
    }
    b->depth = depth;
    b->busy = 0;
    b->unhooked = a->unhooked;
    b->mixed = a->mixed;
}

/* Whether the child waits for proftap to say it has its memory: where
 * proftap does not see its threads leave CPUs (no time off CPU), it ends
 * the child's calls in progress when it sees the child end, and the child
 * must not end unseen. */
static inline int waits_for_proftap(const struct config *c, u64 pid)
{
    /* Its first thread's id is its pid. */
    return !c->off_cpu || pid >= c->off_cpu_entries;
}

/* A socket connected to `address` (`length` bytes of it), or -errno;
 * with a timeout on receiving where the child is to `wait` for proftap. */
FORK_CODE static long connected(const void *address, long length, int wait)
{
    long sock = syscall6(SYS_socket, 1 /* AF_UNIX */, 5 /* SOCK_SEQPACKET */ | 0x80000 /* SOCK_CLOEXEC */, 0, 0, 0, 0);
    if (sock < 0)
        return sock;
    long timeout[2] = {5, 0};
    if (wait)
        syscall6(SYS_setsockopt, sock, 1 /* SOL_SOCKET */, 20 /* SO_RCVTIMEO */, (long)timeout, sizeof timeout, 0);
    syscall6(SYS_setsockopt, sock, 1, 21 /* SO_SNDTIMEO */, (long)timeout, sizeof timeout, 0);
    long error = syscall6(SYS_connect, sock, (long)address, length, 0, 0, 0);
    if (error == 0)
        return sock;
    syscall6(SYS_close, sock, 0, 0, 0, 0, 0);
    return error < 0 ? error : -1;
}

#define ECONNREFUSED 111

/* A socket connected to proftap's, or -errno: by its abstract name, else
 * (a child in a network namespace of its own, where abstract names are
 * another's) by its path. proftap knows the child by the socket's peer, as
 * the kernel does, even once it has ended. */
FORK_CODE static long reach_proftap(const struct config *c, int wait)
{
    struct {
        unsigned short family;
        char path[FORK_SOCKET_PATH];
    } address;
    address.family = 1; /* AF_UNIX */
    address.path[0] = 0; /* abstract */
    for (int i = 0; i < FORK_SOCKET_NAME; i++)
        address.path[1 + i] = c->fork_socket[i];
    /* The length names the abstract address: no padding in it. */
    long sock = connected(&address, sizeof address.family + 1 + FORK_SOCKET_NAME, wait);
    if (sock >= 0 || !c->fork_path[0])
        return sock;
    int length = 0;
    for (; length < FORK_SOCKET_PATH - 1 && c->fork_path[length]; length++) {
        address.path[length] = c->fork_path[length];
        NOT_A_MEMCPY();
    }
    address.path[length] = 0;
    return connected(&address, sizeof address.family + length + 1, wait);
}

/* Sends the memfd of child `pid` to proftap over `sock` (see
 * reach_proftap); the child goes on at once, unless it is to `wait` for
 * proftap to say it has it (waits_for_proftap). */
FORK_CODE static int hand_over(long sock, long memfd, u64 pid, int wait)
{
    u64 iov[2] = {(u64)&pid, sizeof pid};
    /* One SCM_RIGHTS message: length 20 (header 16 + one int), level
     * SOL_SOCKET, type SCM_RIGHTS, the descriptor. */
    u64 control[3] = {20, 1 | (1UL << 32), (u64)(u32)memfd};
    u64 message[7] = {0, 0, (u64)iov, 1, (u64)control, sizeof control, 0};
    char ack = 0;
    return syscall6(SYS_sendmsg, sock, (long)message, 0x4000 /* MSG_NOSIGNAL */, 0, 0, 0) == sizeof pid
           && (!wait || (syscall6(SYS_recvfrom, sock, (long)&ack, 1, 0, 0, 0) == 1 && ack == 1));
}

/* The child's thread that makes its memory, by its kernel thread id (two
 * threads may share a thread pointer; a signal handler of the adopting
 * thread has its id): the word after the live word, zeroed in a forked
 * child with it. */
static inline u64 *adopter_of(const struct config *c)
{
    return (u64 *)c->live + 1;
}

/* How long a call of a forked child waits for another thread to make
 * the child's memory before it goes on unrecorded (an adopting thread
 * that a signal handler holds, or that left its handler by a jump). */
#define ADOPTION_WAIT_NS 100000000UL

/* Waits while another thread makes the child's memory. Returns 0 when
 * this thread is to make it (it took the adopter's word), else 1: the
 * memory is made (or the child runs unrecorded), or the wait gave up. */
FORK_CODE static int wait_for_adopter(const struct config *c, u64 *word, u64 tid)
{
    u64 deadline = rdtsc() + ns_to_tsc(c, ADOPTION_WAIT_NS);
    for (;;) {
        u64 adopter = 0;
        /* Taken again when no thread holds it (a grandchild forked by a
         * waiting thread's handler). */
        if (__atomic_compare_exchange_n(adopter_of(c), &adopter, tid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 0;
        /* A signal handler interrupting the adopting thread itself cannot
         * wait: its calls go unrecorded. */
        if (adopter == tid)
            return 1;
        u64 live = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if ((live != LIVE_CHILD && live != LIVE_ADOPTING) || rdtsc() > deadline)
            return 1;
        syscall6(SYS_sched_yield, 0, 0, 0, 0, 0, 0);
    }
}

/* Whether private block p is held by a call of this thread under way
 * above this code: a handler that interrupted the runtime called fork. */
FORK_CODE static __attribute__((noinline)) int held_above_here(const struct private_block *p)
{
    u64 was = p->busy, here = (u64)__builtin_frame_address(0);
    return was > here && near(was, here);
}

/* Writes `bytes` of `from` at `offset` of memfd; whether it could. */
FORK_CODE static int written(long memfd, const void *from, u64 bytes, u64 offset)
{
    return syscall6(SYS_pwrite64, memfd, (long)from, (long)bytes, (long)offset, 0, 0) == (long)bytes;
}

_Static_assert(__builtin_offsetof(struct header, ns_to_tsc_shift) == __builtin_offsetof(struct header, magic) + 16,
               "the clock's words follow the magic number");

/* Sites a page of the table holds. */
#define SITES_PER_PAGE (4096 / sizeof(u64))

/* Whether any site of page `page` of the table is taken. */
FORK_CODE static int page_taken(const struct header *h, u64 page)
{
    for (u64 w = page * SITES_PER_PAGE / 64; w < (page + 1) * SITES_PER_PAGE / 64; w++)
        if (__atomic_load_n(&h->sites_taken[w], __ATOMIC_RELAXED))
            return 1;
    return 0;
}

/* Writes the header of the child's memory into memfd, `blocks_taken`
 * blocks taken, from the parent's; the rest stays zero. Written, not
 * mapped and stored to: a store to each new page of shared memory is a
 * page fault, and the table of return sites is up to 32 pages. Frames hijacked
 * before the fork stand for their return sites by the parent's table:
 * the child's starts as a copy of the pages where sites were taken, each
 * run of them in one write. Returns whether it could. */
FORK_CODE static int fill_own_header(const struct config *c, long memfd, u64 blocks_taken)
{
    const struct header *from = header(c);
    u64 clock[3] = {from->magic, from->ns_to_tsc_mult, from->ns_to_tsc_shift};
    int ok = written(memfd, clock, sizeof clock, __builtin_offsetof(struct header, magic))
             && written(memfd, &blocks_taken, sizeof blocks_taken, __builtin_offsetof(struct header, blocks_taken))
             && written(memfd, &from->shared_seats, sizeof from->shared_seats, __builtin_offsetof(struct header, shared_seats));
    /* The process's part of the table: whole pages (it has 4,096 sites at least). */
    const u64 sites = 1UL << c->site_bits, pages = sites / SITES_PER_PAGE;
    for (u64 first = 0; ok && first < pages; first++) {
        if (!page_taken(from, first))
            continue;
        u64 end = first + 1;
        while (end < pages && page_taken(from, end))
            end++;
        u64 start = first * SITES_PER_PAGE, bytes = (end - first) * 4096;
        ok = written(memfd, &from->sites[start], bytes, __builtin_offsetof(struct header, sites) + start * sizeof(u64));
        first = end;
    }
    /* The marks last: a site is marked before it is set, so every site
     * copied above is marked in what is read now, and a grandchild copies
     * it in turn (a mark whose page was not copied marks a free site). */
    return ok && written(memfd, from->sites_taken, sites / 8, __builtin_offsetof(struct header, sites_taken));
}

/* Makes the child's own shared memory and hands it to proftap; returns
 * the live word it leads to. The forking thread's block (`own`'s) is
 * carried over as the child's first, its other threads taking the
 * others, whatever the parent had taken; or, where a call of its own
 * holds it (`keep_index`), where that call has it. */
FORK_CODE static u64 make_own_memory(const struct config *c, struct seat *own, int keep_index)
{
    u64 outcome = LIVE_STOPPED;
    char name[] = "proftap";
    u64 index = own ? own->block - 1 : 0, first = keep_index ? index : 0;
    /* The first block may be one the parent could not make writable. */
    if (first != index && !private_block_writable(c, first))
        first = index;
    /* Sealing allowed: proftap seals it against shrinking before it maps it.
     * Never executable, said so: Linux 6.3 to 6.5 under vm.memfd_noexec=2
     * refuse a memfd that does not say (before 6.3 the flag is unknown; a
     * filter may refuse it). */
    long memfd = syscall6(SYS_memfd_create, (long)name, 11 /* MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL */, 0, 0, 0, 0);
    if (memfd < 0)
        memfd = syscall6(SYS_memfd_create, (long)name, 3 /* MFD_CLOEXEC | MFD_ALLOW_SEALING */, 0, 0, 0, 0);
    int made = memfd >= 0 && syscall6(SYS_ftruncate, memfd, c->shared_bytes, 0, 0, 0, 0) == 0 && fill_own_header(c, memfd, own ? first + 1 : 0);
    /* proftap is reached while the parent's memory is still mapped: a
     * child that cannot reach it (one in a network and a mount namespace
     * of its own) is counted there, and runs unrecorded. Refused at the
     * socket's path, which it found, it came as proftap stopped taking
     * children: it is not followed, as it would not be later. */
    u64 pid = (u64)syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    int wait = waits_for_proftap(c, pid);
    long sock = made ? reach_proftap(c, wait) : -1;
    if (sock < 0 && !(c->fork_path[0] && sock == -ECONNREFUSED))
        __atomic_fetch_add(&header(c)->children_unreached, 1, __ATOMIC_RELAXED);
    /* Mapped over the parent's, in one step: nothing the child does from
     * here on reaches the parent's, recorded or not (a child that drops
     * its rights cannot write where its parent returns). (Moving it there
     * with mremap costs the kernel five times more, walking the 132 GiB,
     * and is no safer: where the kernel runs out of memory making either,
     * one before 6.12 leaves nothing mapped there, and the child's next
     * call faults.) Then it is handed over: proftap knows no child that
     * does not map its memory. */
    if (made && syscall6(SYS_mmap, c->shared, c->shared_bytes, 3, 1 | 0x10 /* MAP_SHARED | MAP_FIXED */, memfd, 0) == (long)c->shared) {
        /* The forking thread's block is carried over in place: no other
         * thread of the child calls in meanwhile (they wait for it). Its
         * frames return through it, recorded or not: an unwinder's too. */
        if (own)
            carry_block(shared_block(c, first), private_block(c, index), own->tid);
        if (own && first != index) {
            move_private_block(c, index, first);
            own->block = first + 1;
        }
        if (sock >= 0 && hand_over(sock, memfd, pid, wait)) {
            outcome = LIVE_RECORDING;
            if (own)
                start_carried_frames(c, shared_block(c, first));
        }
    }
    if (memfd >= 0)
        syscall6(SYS_close, memfd, 0, 0, 0, 0, 0);
    if (sock >= 0)
        syscall6(SYS_close, sock, 0, 0, 0, 0, 0);
    return outcome;
}

FORK_CODE static __attribute__((noinline)) void adopt(const struct config *c)
{
    u64 *word = (u64 *)c->live;
    /* Another thread makes it: this call waits for its memory, to be
     * counted there. */
    if (wait_for_adopter(c, word, gettid()))
        return;
    /* No handler runs while the child's memory is made: one that left by
     * a jump would leave its blocks half moved. */
    u64 before = block_signals();
    __atomic_store_n(word, LIVE_ADOPTING, __ATOMIC_RELEASE);
    struct seat *own = keep_forking_seat(c);
    int held = own && held_above_here(private_block(c, own->block - 1));
    /* Another thread on the forking thread's pointer may have held its
     * block at the fork: that thread is not in the child. */
    if (own && !held)
        private_block(c, own->block - 1)->busy = 0;
    /* Children not followed run unrecorded. */
    u64 outcome = c->fork_socket[0] ? make_own_memory(c, own, held) : LIVE_STOPPED;
    __atomic_store_n(word, outcome, __ATOMIC_RELEASE);
    restore_signals(before);
}

/* A forked child's first call into the runtime adopts it; its other
 * threads' calls meanwhile wait for it. */
static inline void adopt_if_forked(const struct config *c)
{
    u64 live = *(volatile u64 *)c->live;
    if (__builtin_expect(live == LIVE_CHILD || live == LIVE_ADOPTING, 0))
        adopt(c);
}

/* A block no thread has had, else one proftap retired; c->blocks when
 * every block is taken. */
static u64 take_block(const struct config *c)
{
    if (__atomic_load_n(&header(c)->blocks_taken, __ATOMIC_RELAXED) < c->blocks) {
        u64 index = __atomic_fetch_add(&header(c)->blocks_taken, 1, __ATOMIC_RELAXED);
        if (index < c->blocks)
            return index;
    }
    for (u64 index = 0; index < c->blocks; index++) {
        u64 expected = BLOCK_RETIRED;
        struct block *b = shared_block(c, index);
        if (__atomic_load_n(&b->state, __ATOMIC_RELAXED) == BLOCK_RETIRED &&
            __atomic_compare_exchange_n(&b->state, &expected, BLOCK_TAKING, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return index;
    }
    return c->blocks;
}

#define PROFTAP_WAIT_NS 10000000

/* Asks proftap to look now and waits for its answer, PROFTAP_WAIT_NS at
 * most, unless it answered since `answered` was read. */
static void ask_proftap(struct header *h, u32 answered)
{
    __atomic_fetch_add(&h->blocks_wanted, 1, __ATOMIC_RELEASE);
    syscall6(SYS_FUTEX, (long)&h->blocks_wanted, FUTEX_WAKE, 1, 0, 0, 0);
    struct {
        long seconds, nanoseconds;
    } timeout = {0, PROFTAP_WAIT_NS};
    syscall6(SYS_FUTEX, (long)&h->blocks_answered, FUTEX_WAIT, answered, (long)&timeout, 0, 0);
}

/* Every block taken: proftap hands back those of threads that ended as it
 * reads them, every few milliseconds. A thread that finds none asks it to
 * look now and waits for its answer, a little: a program that makes threads
 * faster than proftap looks loses no thread's calls, one with more threads
 * than blocks at once waits at most BLOCK_WAITS times. */
#define BLOCK_WAITS 2
static u64 wait_for_block(const struct config *c)
{
    struct header *h = header(c);
    for (int tries = 0; tries < BLOCK_WAITS; tries++) {
        u32 answered = __atomic_load_n(&h->blocks_answered, __ATOMIC_ACQUIRE);
        u64 index = take_block(c);
        if (index < c->blocks)
            return index;
        ask_proftap(h, answered);
    }
    return take_block(c);
}

/* Whether seat s, whose key is this thread's pointer, holds its block:
 * one proftap has not retired (a thread that ended had it), taken by the
 * thread with this C library thread id. */
static inline int seated_here(const struct config *c, struct seat *s, u64 seated, u32 tid)
{
    int own = __atomic_load_n(&shared_block(c, seated - 1)->state, __ATOMIC_ACQUIRE) == BLOCK_USED;
    return own && (!tid || s->tid == tid);
}

static inline u64 home_of(u64 key)
{
    return (key >> 8) * 0x9e3779b97f4a7c15ULL >> (64 - SEATS_BITS);
}

/* How long a thread waits for another thread on its thread pointer to
 * finish taking their seat's block (which may wait for proftap to retire
 * one) before its call goes unseated; and for the thread that took the
 * seat's key to say who it is. */
#define SEATING_WAIT_NS 100000000UL
#define CLAIMER_WAIT_NS 20000UL

/* The block of seat s, whose key is this thread's pointer, once the thread
 * that took the key has taken it: another thread on the same pointer is
 * waited for. A signal handler that interrupted this very thread as it
 * took it cannot wait: it finds its own id, or (interrupted before the id
 * was written) no id for longer than the claimer takes to write it; then
 * 0. A claimer that never finishes (a handler left it by a jump) leaves
 * the seat with none, so that later calls do not wait again. */
static u64 seated_block(const struct config *c, struct seat *s)
{
    u64 seated = __atomic_load_n(&s->block, __ATOMIC_ACQUIRE);
    if (seated)
        return seated;
    u64 own = gettid(), started = rdtsc();
    u64 deadline = started + ns_to_tsc(c, SEATING_WAIT_NS), nameless_until = started + ns_to_tsc(c, CLAIMER_WAIT_NS);
    while (!(seated = __atomic_load_n(&s->block, __ATOMIC_ACQUIRE))) {
        u64 claimer = __atomic_load_n(&s->claimer, __ATOMIC_ACQUIRE), now = rdtsc();
        if (claimer == own || (!claimer && now > nameless_until))
            return 0;
        if (now > deadline) {
            u64 none = 0;
            __atomic_compare_exchange_n(&s->block, &none, SEAT_NONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            return 0;
        }
        syscall6(SYS_sched_yield, 0, 0, 0, 0, 0, 0);
    }
    return seated;
}

/* The thread's block (its index + 1), found by its thread pointer in the
 * seats. A thread the C library gave the thread control block of one that
 * ended (same pointer, another tid) takes a new block: the old one's
 * totals are the old thread's. Threads sharing a thread pointer share a
 * seat. Returns 0 when every block is taken. The block is returned, not
 * the seat, whose block another thread on the pointer may change. */
static u64 seat_of(const struct config *c, int claim)
{
    u64 key = thread_pointer();
    u32 tid = library_tid(c);
    struct seat *seats = (struct seat *)c->private_base;
    u64 i = home_of(key);
    /* A thread takes its seat and block with no handler running: one that
     * interrupted the claim could only count its calls as no thread's. */
    u64 blocked = 0, before = 0, seated = 0;
    for (u64 n = 0; n < SEATS; n++, i = (i + 1) & (SEATS - 1)) {
        struct seat *s = &seats[i];
        u64 k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
        int taken = 0;
        u64 kernel_tid = 0;
        if (k == 0) {
            if (!claim || !live(c))
                break;
            if (!blocked) {
                before = block_signals();
                blocked = 1;
                /* A handler may have taken it before the signals were blocked. */
                k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
            }
        }
        if (k == 0) {
            /* Known before the key is taken, and written right after: a
             * handler interrupting the claim finds it at once. */
            kernel_tid = gettid();
            /* Marked before the key is taken: a fork meanwhile leaves the
             * child no seat it would not clear (a mark for a seat another
             * thread took is one it clears anyway). */
            __atomic_fetch_or(&seats_taken(c)[i / 64], 1UL << (i % 64), __ATOMIC_RELAXED);
            u64 expected = 0;
            taken = __atomic_compare_exchange_n(&s->key, &expected, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            /* Another thread on this thread pointer took it first: its seat is this one's. */
            k = taken ? key : expected;
            if (taken)
                __atomic_store_n(&s->claimer, kernel_tid, __ATOMIC_RELEASE);
        }
        if (k != key)
            continue;
        if (!taken) {
            u64 found = seated_block(c, s);
            if (found - 1 >= c->blocks) /* none (0, SEAT_NONE) */
                break;
            if (seated_here(c, s, found, tid)) {
                seated = found;
                break;
            }
            if (!claim || !live(c))
                break;
            /* Same thread control block, another thread: a new block. */
            if (!blocked) {
                before = block_signals();
                blocked = 1;
            }
        }
        u64 index = take_block(c);
        if (index >= c->blocks)
            index = wait_for_block(c);
        if (index < c->blocks && !private_block_writable(c, index)) {
            /* Free for a thread that may find the memory later. */
            __atomic_store_n(&shared_block(c, index)->state, BLOCK_RETIRED, __ATOMIC_RELEASE);
            index = c->blocks;
        }
        if (index >= c->blocks) {
            __atomic_store_n(&s->block, SEAT_NONE, __ATOMIC_RELEASE);
            break;
        }
        if (!kernel_tid)
            kernel_tid = gettid();
        struct private_block *p = private_block(c, index);
        p->depth = 0;
        p->busy = 0;
        p->unhooked = 0;
        p->mixed = 0;
        struct block *b = shared_block(c, index);
        b->tid = (u32)kernel_tid;
        map_off_cpu_entry(c, (u32)kernel_tid);
        b->nodes = 1; /* node 0: the thread itself */
        __atomic_store_n(&b->state, BLOCK_USED, __ATOMIC_RELEASE);
        s->tid = tid ? tid : (u32)kernel_tid;
        __atomic_store_n(&s->block, index + 1, __ATOMIC_RELEASE);
        seated = index + 1;
        break;
    }
    if (blocked)
        restore_signals(before);
    return seated;
}

/* seat_of, inline for a thread at its home place in the table: most. */
static inline u64 seat_of_fast(const struct config *c, int claim)
{
    u64 key = thread_pointer();
    struct seat *s = &((struct seat *)c->private_base)[home_of(key)];
    if (__builtin_expect(__atomic_load_n(&s->key, __ATOMIC_ACQUIRE) == key, 1)) {
        u64 seated = __atomic_load_n(&s->block, __ATOMIC_ACQUIRE);
        /* Neither being taken (0) nor none left (SEAT_NONE). */
        if (seated - 1 < c->blocks && seated_here(c, s, seated, library_tid(c)))
            return seated;
    }
    return seat_of(c, claim);
}

static inline u64 hash_bits(const struct block *b)
{
    return b->hash_bits ? b->hash_bits : HASH_FIRST_BITS;
}

/* Where the hash of a thread's contexts, of 2^bits slots, looks first
 * for the node of `function` called from node `parent`. */
static inline u64 context_hash(u32 parent, u32 function, u64 bits)
{
    return ((u64)parent * 0x9e3779b97f4a7c15ULL ^ (u64)function * 0xc2b2ae3d27d4eb4fULL) >> (64 - bits);
}

/* The hash slot of the node of `function` called from node `parent` in
 * block b, or the empty slot where it would go; HASH_SLOTS when the table
 * is full. */
static u64 node_slot(const struct block *b, u32 parent, u32 function)
{
    u64 bits = hash_bits(b), slots = 1UL << bits;
    u64 h = context_hash(parent, function, bits);
    for (u64 n = 0; n < slots; n++, h = (h + 1) & (slots - 1)) {
        u32 at = b->hash[h];
        if (at == 0 || (b->node[at].parent == parent && b->node[at].function == function))
            return h;
    }
    return HASH_SLOTS;
}

/* Doubles block b's hash table, its nodes placed again. The table past
 * the slots in use was never written: zero. Doubling as the nodes fill
 * half of it places each node twice on average over a thread's life.
 * No signal handler runs meanwhile: one that left by a jump would leave
 * the table half placed for the calls after. */
static __attribute__((noinline, cold)) void grow_hash(struct block *b)
{
    u64 before = block_signals();
    u64 slots = 1UL << hash_bits(b);
    for (u64 h = 0; h < slots; h++)
        b->hash[h] = 0;
    b->hash_bits = hash_bits(b) + 1;
    for (u64 made = 1; made < b->nodes; made++) {
        u64 h = node_slot(b, b->node[made].parent, b->node[made].function);
        if (h < HASH_SLOTS)
            b->hash[h] = (u32)made;
    }
    restore_signals(before);
}

/* The child node of `parent` for `function`, made if new; NO_NODE when
 * the parent has none or the thread's node table is full (its calls are
 * then counted, not timed). */
static u32 child_node(struct block *b, u32 parent, u32 function)
{
    if (parent == NO_NODE)
        return NO_NODE;
    u64 h = node_slot(b, parent, function);
    if (h >= HASH_SLOTS)
        return NO_NODE;
    if (b->hash[h])
        return b->hash[h];
    u64 made = b->nodes;
    if (made >= NODES)
        return NO_NODE;
    /* At most half full, for short searches. */
    if (2 * (made + 1) > 1UL << hash_bits(b) && hash_bits(b) < HASH_BITS) {
        grow_hash(b);
        h = node_slot(b, parent, function);
        if (h >= HASH_SLOTS)
            return NO_NODE;
    }
    struct node *node = &b->node[made];
    node->parent = parent;
    node->function = function;
    node->incl_wall.min = node->excl_wall.min = node->incl_cpu.min = node->excl_cpu.min = node->greatest_min = ~0ULL;
    /* Published after the node: proftap reads nodes below b->nodes. */
    __atomic_store_n(&b->nodes, made + 1, __ATOMIC_RELEASE);
    b->hash[h] = (u32)made;
    return (u32)made;
}

/* Writes a finished call into the block's trace ring, over the oldest one
 * if proftap has not read it yet: proftap counts what it missed. */
static inline void trace(const struct config *c, struct block *b, const struct frame *f, u64 d, u64 now)
{
    u64 n = b->traced;
    struct traced *t = (struct traced *)((char *)b + c->trace_offset) + (n & (c->trace_slots - 1));
    t->entry_tsc = f->entry_tsc;
    t->exit_tsc = now;
    t->function = f->function;
    t->depth = (u32)d;
    /* Published after the call: proftap reads calls below b->traced. */
    __atomic_store_n(&b->traced, n + 1, __ATOMIC_RELEASE);
}


/* The times of the call of frame f ending at `now`, when the thread's
 * time off CPU is `off_now`. */
struct ended {
    u64 incl_wall, excl_wall, incl_cpu, excl_cpu;
};

static inline __attribute__((always_inline)) struct ended times_of(const struct config *c, const struct frame *f, u64 now, u64 off_now)
{
    u64 wall = now > f->entry_tsc ? now - f->entry_tsc : 0;
    /* Times off CPU are kept in nanoseconds: most calls have none to
     * convert. */
    u64 off = off_now > f->entry_off ? ns_to_tsc(c, off_now - f->entry_off) : 0;
    u64 cpu = wall > off ? wall - off : 0;
    return (struct ended){wall, wall > f->child_wall ? wall - f->child_wall : 0, cpu, cpu > f->child_cpu ? cpu - f->child_cpu : 0};
}

/* The minima and maxima of frame d's node after its call ended at `now`
 * (see finish_totals). Saving every register it uses, a call of it
 * leaves the caller's. */
static __attribute__((noinline, no_caller_saved_registers)) void new_extremes(struct block *b, u64 d, u64 now, u64 off_now)
{
    const struct frame *f = &b->frame[d];
    struct node *n = &b->node[f->node];
    struct ended ended = times_of(config(), f, now, off_now);
    struct stat *stats[4] = {&n->incl_wall, &n->excl_wall, &n->incl_cpu, &n->excl_cpu};
    u64 times[4] = {ended.incl_wall, ended.excl_wall, ended.incl_cpu, ended.excl_cpu};
    u64 greatest_min = 0, least_max = ~0UL;
    for (int i = 0; i < 4; i++) {
        if (times[i] < stats[i]->min)
            stats[i]->min = times[i];
        if (times[i] > stats[i]->max)
            stats[i]->max = times[i];
        greatest_min = stats[i]->min > greatest_min ? stats[i]->min : greatest_min;
        least_max = stats[i]->max < least_max ? stats[i]->max : least_max;
    }
    n->greatest_min = greatest_min;
    n->least_max = least_max;
}

/* Ends frame d of the thread at `now`: its times go to its node's totals,
 * and its inclusive times to its caller's frame. Returns whether a
 * minimum or a maximum of its node changes too (see new_extremes), which
 * the quick return does last, after what it does with the registers it
 * has. */
static inline __attribute__((always_inline)) int finish_totals(const struct config *c, struct block *b, u64 d, u64 now, u64 off_now,
                                                               int unwound)
{
    struct frame *f = &b->frame[d];
    /* The frame's and the node's addresses are kept in registers: the
     * compiler would compute them again at each use, a tenth of a
     * return's instructions. */
    __asm__("" : "+r"(f));
    struct ended ended = times_of(c, f, now, off_now);
    int extremes = 0;
    if (f->node != NO_NODE) {
        struct node *n = &b->node[f->node];
        __asm__("" : "+r"(n));
        n->calls++;
        n->unwound += unwound;
        n->incl_wall.total += ended.incl_wall;
        n->excl_wall.total += ended.excl_wall;
        n->incl_cpu.total += ended.incl_cpu;
        n->excl_cpu.total += ended.excl_cpu;
        /* The inclusive wall time is the greatest of the four times, the
         * least of the exclusive ones the least: one comparison each way
         * tells whether a minimum or a maximum changes, which few calls
         * do. */
        u64 least = ended.excl_wall < ended.excl_cpu ? ended.excl_wall : ended.excl_cpu;
        extremes = least < n->greatest_min || ended.incl_wall > n->least_max;
    } else {
        b->untimed++;
    }
    if (c->trace_slots)
        trace(c, b, f, d, now);
    if (d > 0) {
        b->frame[d - 1].child_wall += ended.incl_wall;
        b->frame[d - 1].child_cpu += ended.incl_cpu;
    }
    return extremes;
}

/* finish_totals, and the node's minima and maxima. */
static inline __attribute__((always_inline)) void finish(const struct config *c, struct block *b, u64 d, u64 now, u64 off_now, int unwound)
{
    if (finish_totals(c, b, d, now, off_now, unwound))
        new_extremes(b, d, now, off_now);
}

/* Ends the frames above the first `kept` as left without a return, now. */
static void end_unwound(const struct config *c, struct private_block *p, struct block *b, u64 kept)
{
    u64 now = 0, off = 0;
    for (u64 d = p->depth; d > kept; d--) {
        if (b && !p->mixed) {
            if (!now)
                now = own_now_and_off(c, b, &off);
            finish(c, b, d - 1, now, off, 1);
        }
    }
    p->depth = kept;
    if (b)
        __atomic_store_n(&b->depth, kept, __ATOMIC_RELEASE);
}

/* Whether two return-address slots are on one stack: near, and both on
 * the alternate signal stack [alt_lo, alt_hi) or both off it (it may lie
 * near the thread's stack: in main's frame, or mapped beside it). */
static inline int same_stack(u64 a, u64 b, u64 alt_lo, u64 alt_hi)
{
    return near(a, b) && (a - alt_lo < alt_hi - alt_lo) == (b - alt_lo < alt_hi - alt_lo);
}

/* How many of the thread's frames are still in progress when a call is
 * made at `slot` (or at it too, with at_too): not those deeper on this
 * stack, which a longjmp or an exception left; nor those of other stacks
 * made after such a frame (a signal handler on an alternate stack that
 * longjmp'd out, back here). A frame of another stack above the live ones
 * (a handler running now) stays. The alternate stack is [alt_lo, alt_hi). */
static u64 frames_still_in(const struct private_block *p, u64 slot, int at_too, u64 alt_lo, u64 alt_hi)
{
    u64 kept = p->depth;
    for (u64 i = p->depth; i > 0; i--) {
        u64 at = p->ret[i - 1].slot;
        if (!same_stack(at, slot, alt_lo, alt_hi))
            continue;
        if (!(at < slot || (at_too && at == slot)))
            break;
        kept = i - 1;
    }
    return kept;
}

/* frames_still_in, telling the alternate signal stack apart where frames
 * would end: a system call, made only then. */
static inline u64 frames_in_progress(const struct private_block *p, u64 slot, int at_too)
{
    /* Most calls: none in progress, or the newest is the caller's, above
     * this call on its stack. */
    u64 d = p->depth;
    if (!d || (p->ret[d - 1].slot > slot && near(p->ret[d - 1].slot, slot)))
        return d;
    u64 kept = frames_still_in(p, slot, at_too, 0, 0);
    u64 lo, hi;
    if (kept < p->depth) {
        alternate_stack(&lo, &hi);
        if (hi)
            kept = frames_still_in(p, slot, at_too, lo, hi);
    }
    return kept;
}

/* Pops the frames whose return-address slot is below `slot` (or at it,
 * with at_too) on the same stack: a longjmp or an exception left them.
 * They end now. The frames a signal handler on an alternate stack
 * interrupted are not its stack's, however near the two lie. */
static void drop_below(const struct config *c, struct private_block *p, struct block *b, u64 slot, int at_too)
{
    end_unwound(c, p, b, frames_in_progress(p, slot, at_too));
}

/* Takes frame i out of the middle of the stack (threads sharing a thread
 * pointer took turns on it): what is above moves down, and the block's
 * times are no longer kept, since its frames no longer nest. */
static void remove_frame(struct private_block *p, struct block *b, u64 i)
{
    for (u64 j = i; j + 1 < p->depth; j++) {
        p->ret[j] = p->ret[j + 1];
        p->function[j] = p->function[j + 1];
        if (b) {
            b->frame[j] = b->frame[j + 1];
            b->returns[j] = b->returns[j + 1];
        }
    }
    p->depth--;
    p->mixed = 1;
    if (b) {
        b->mixed = 1;
        __atomic_store_n(&b->depth, p->depth, __ATOMIC_RELEASE);
    }
}

/* Whether `value` is one of the return trampolines: a return hijacked. */
static inline int is_trampoline(const struct config *c, u64 value)
{
    return value == c->return_trampoline || (c->site_trampolines && value - c->site_trampolines < (SITE_BYTES << c->site_bits));
}

/* Where the table of return sites looks first for `ret`. */
static inline u64 site_hash(const struct config *c, u64 ret)
{
    return (ret * 0x9e3779b97f4a7c15UL) >> (64 - c->site_bits);
}

/* The trampoline a return to `ret` goes through: the one of its return
 * site, the same for every call that returns there, so that an unwinder
 * reading a sampled stack finds the return address from the trampoline
 * alone (header.sites) even after the call ended and another took its
 * depth; the shared one when the site finds no slot. A slot is taken
 * with a compare-and-swap before its trampoline is ever written to a
 * stack, and never changes after. */
static inline u64 trampoline_for(const struct config *c, u64 ret)
{
    /* A site is a return address of the program's: not 0 (a frame made
     * up as a stack's outermost), not a trampoline (a tail call's). */
    if (!c->site_trampolines || !ret || is_trampoline(c, ret))
        return c->return_trampoline;
    u64 *sites = header(c)->sites;
    u64 i = site_hash(c, ret), last = (1UL << c->site_bits) - 1;
    for (u64 n = 0; n < SITE_PROBES; n++, i = (i + 1) & last) {
        u64 seen = __atomic_load_n(&sites[i], __ATOMIC_RELAXED);
        if (!seen) {
            /* Marked before the address is written, for a child forked in
             * between to copy it (a mark for a site another return took is
             * one it copies anyway). */
            __atomic_fetch_or(&header(c)->sites_taken[i / 64], 1UL << (i % 64), __ATOMIC_RELAXED);
            if (!__atomic_compare_exchange_n(&sites[i], &seen, ret, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED) && seen != ret)
                continue;
        }
        if (!seen || seen == ret)
            return c->site_trampolines + i * SITE_BYTES;
    }
    return c->return_trampoline;
}

/* Over the return addresses of the live frames that called the one at
 * `slot` (and its own, with at_too): hijacks them again (`hijack`), or
 * puts the originals back where a trampoline is. They are those above it
 * on its stack and, where a signal handler runs on the alternate stack,
 * those off that stack, which it interrupted; other stacks' (a coroutine
 * that moved to another thread) are left alone, and so is the frame of a
 * call the handler interrupted in the runtime (p->busy), whose entry or
 * return goes on after it. */
static void rewrite(const struct config *c, struct private_block *p, u64 slot, int at_too, int hijack)
{
    u64 lo, hi, busy = __atomic_load_n(&p->busy, __ATOMIC_RELAXED);
    alternate_stack(&lo, &hi);
    int handler = slot - lo < hi - lo;
    for (u64 d = 0; d < p->depth; d++) {
        u64 *where = (u64 *)p->ret[d].slot;
        int above = (u64)where > slot || (at_too && (u64)where == slot);
        int interrupted = handler && (u64)where - lo >= hi - lo;
        if ((!above && !interrupted) || (u64)where == busy)
            continue;
        u64 ret = p->ret[d].ret;
        /* A tail call's frame shares its caller's slot, whose trampoline
         * the caller's frame puts back. */
        if (hijack && *where == ret && !is_trampoline(c, ret))
            *where = trampoline_for(c, ret);
        else if (!hijack && is_trampoline(c, *where))
            *where = ret;
    }
}

_Static_assert(__builtin_offsetof(struct frame, last_child) == __builtin_offsetof(struct frame, last_function) + 4 &&
                   __builtin_offsetof(struct block, root_last_child) == __builtin_offsetof(struct block, root_last_function) + 4,
               "a caller's last callee and its node are written as one word");

/* Caches `node` as the context of the caller's last callee, `function`,
 * at `last_function` (the last child follows it), in one store: a signal
 * handler that interrupts the entry there and leaves by a jump never
 * leaves the cache with one callee's function and another's node. */
static inline __attribute__((always_inline)) void remember_callee(u32 *last_function, u32 function, u32 node)
{
    *(u64_alias4 *)last_function = (u64)(function + 1) | (u64)node << 32;
}

_Static_assert(__builtin_offsetof(struct frame, node) % 8 == 0 &&
                   __builtin_offsetof(struct frame, last_function) == __builtin_offsetof(struct frame, node) + 4,
               "a frame's node and last function are written as one word");

/* Opens frame d of block b's thread (private block p) for a call of
 * `function` whose return address is at `slot`, in context `node`.
 * Until its entry time is read, the frame has no time: proftap, reading
 * the return address below for a sample taken before this call, must
 * not pair it with the entry time of the call this depth held before.
 * The return address is copied where proftap reads it with
 * `copy_return`; without, the copy the depth held before is taken away
 * (see struct block's returns). */
static inline __attribute__((always_inline)) struct frame *open_frame(struct private_block *p, struct block *b, u64 *slot, u32 function,
                                                                      u64 d, u32 node, int copy_return)
{
    struct frame *f = &b->frame[d];
    /* The node and the cache of its last callee (none) in one store. */
    *(u64_alias *)&f->node = node;
    f->function = function;
    f->child_wall = f->child_cpu = 0;
    __atomic_store_n(&f->entry_tsc, ~0UL, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_RELEASE);
    p->ret[d].ret = *slot;
    p->ret[d].slot = (u64)slot;
    p->function[d] = function;
    if (copy_return)
        b->returns[d] = p->ret[d];
    else
        b->returns[d].slot = 0;
    p->depth = d + 1;
    __atomic_store_n(&b->depth, d + 1, __ATOMIC_RELEASE);
    return f;
}

/* Whether this entry of `function` at `slot` is no call but the function
 * jumping back to its own first instruction: a loop whose head is the
 * entry (gcc's for a frameless loop tested at the top), or a tail call
 * to itself made as a jump. The stack is then as at its call's entry, so
 * the slot holds the return trampoline of that call under way, on top.
 * (A tail call to another function has another's frame on top.) */
static inline int jumped_back_to_entry(const struct config *c, const struct private_block *p, const u64 *slot, u32 function)
{
    u64 d = p->depth;
    return d && p->ret[d - 1].slot == (u64)slot && p->function[d - 1] == function && is_trampoline(c, *slot);
}

/* Whether a call or a stack walk at `slot` is made while the unwinder
 * entered at p->unhooked still runs: by the unwinder itself (its
 * personality routines, a backtrace's callback), below it on its stack, or
 * by a signal handler that interrupted it, there or on an alternate signal
 * stack the unwinder is not on (a profiler's handler walking the stack
 * while an exception unwinds). The unwinder goes on walking the frames it
 * was given back once the handler returns: they stay given back until it
 * is done. The alternate stack is asked of the kernel only when the slot
 * is not below. */
static int within_unwind(const struct private_block *p, u64 slot)
{
    u64 lo, hi, at = p->unhooked;
    if (!at || slot == at)
        return 0;
    if (slot < at && near(slot, at))
        return 1;
    return alternate_stack(&lo, &hi) && slot - lo < hi - lo && at - lo >= hi - lo;
}

/* proftap_entry for every call: whatever the thread, its stack and the
 * state of the recording. */
static __attribute__((noinline)) u64 enter(u64 *slot, u32 function)
{
    const struct config *c = config();
    adopt_if_forked(c);
    u64 seated = seat_of_fast(c, 1);
    if (!seated) {
        if (live(c))
            __atomic_fetch_add(&header(c)->unseated, 1, __ATOMIC_RELAXED);
        return 0;
    }
    struct private_block *p = private_block(c, seated - 1);
    struct block *b = live(c) ? shared_block(c, seated - 1) : 0;
    u64 call_through = 0;
    /* A signal handler that interrupted the runtime and calls a patched
     * function, or another thread on the same thread pointer: this call
     * is counted and goes untimed; the other goes on. */
    if (take_block_busy(c, p, (u64)slot)) {
        if (b && function < c->functions)
            __atomic_fetch_add(&busy_entries_of(c, b)[function], 1, __ATOMIC_RELAXED);
        return 0;
    }
    if (jumped_back_to_entry(c, p, slot, function))
        goto out;
    /* Every call is counted, timed or not. */
    if (b && function < c->functions)
        entries_of(c, b)[function]++;
    if (p->unhooked) {
        /* Made while the unwinder runs: it would meet the trampolines
         * again, so nothing is hijacked until it is done; the call goes
         * untimed. */
        if (within_unwind(p, (u64)slot)) {
            if (b)
                b->untimed++;
            goto out;
        }
        /* Past it (a cleanup or a catch runs, or the walk returned): the
         * frames it left are gone, the others are hijacked again. */
        p->unhooked = 0;
        drop_below(c, p, b, (u64)slot, 0);
        rewrite(c, p, (u64)slot, 0, 1);
    }
    /* Frames a longjmp or an exception left: those deeper than this call,
     * and one in this very slot unless the slot still holds the return
     * trampoline (then this is its tail call, and it lives on). */
    u64 d = p->depth;
    int hijacked = is_trampoline(c, *slot);
    u64 kept = frames_in_progress(p, (u64)slot, !hijacked);
    if (kept < d)
        end_unwound(c, p, b, kept);
    d = p->depth;
    if (!b)
        goto out;
    if (p->mixed)
        goto out;
    if (d >= STACK_DEPTH) {
        b->too_deep++;
        goto out;
    }
    /* The caller's cache of its last callee (+1, so that zeroed memory
     * caches nothing). */
    u32 *last_function = d ? &b->frame[d - 1].last_function : &b->root_last_function;
    u32 node = d ? b->frame[d - 1].last_child : b->root_last_child;
    if (*last_function != function + 1) {
        node = child_node(b, d ? b->frame[d - 1].node : 0, function);
        remember_callee(last_function, function, node);
    }
    struct frame *f = open_frame(p, b, slot, function, d, node, 1);
    /* A tail call's slot holds its caller's trampoline already: it stays,
     * and the tail call is made through it too, so that both returns
     * through it are predicted. The slot holds the trampoline before the
     * call is made, for proftap reading the stack meanwhile, or detaching. */
    if (!hijacked)
        *slot = trampoline_for(c, *slot);
    call_through = *slot - CALL_BEFORE_TRAMPOLINE;
    u64 off, now = own_now_and_off(c, b, &off);
    start_frame(f, now, off);
out:
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
    return call_through;
}

/* A return with no frame of its own (its frame was taken for one a longjmp
 * left when the program switched stacks: coroutines, swapcontext, a
 * coroutine resumed on another thread) goes back to its call site: the
 * site trampoline it came through, still in its slot, names it in the
 * table. Returns 0 when it came through the shared trampoline, which
 * names no site. */
static int back_to_site(const struct config *c, u64 *slot)
{
    u64 offset = *slot - c->site_trampolines;
    if (!c->site_trampolines || offset >= (SITE_BYTES << c->site_bits) || offset % SITE_BYTES)
        return 0;
    u64 ret = __atomic_load_n(&header(c)->sites[offset / SITE_BYTES], __ATOMIC_RELAXED);
    if (!ret)
        return 0;
    *slot = ret;
    return 1;
}

/* proftap_exit for every return, `now` and `off` read of the thread
 * whose off-CPU entry is `early`. */
static __attribute__((noinline)) void leave(u64 *slot, volatile const u64 *early, u64 now, u64 off)
{
    const struct config *c = config();
    adopt_if_forked(c);
    u64 seated = seat_of_fast(c, 0);
    if (!seated) {
        if (!back_to_site(c, slot))
            __builtin_trap(); /* nowhere known to return to: nothing to do but stop */
        if (live(c))
            __atomic_fetch_add(&header(c)->unseated_returns, 1, __ATOMIC_RELAXED);
        return;
    }
    struct private_block *p = private_block(c, seated - 1);
    take_block_to_return(c, p, (u64)slot);
    struct block *b = live(c) ? shared_block(c, seated - 1) : 0;
    if (b)
        now = own_time(c, b, early, now, &off);
    u64 d = p->depth;
    /* This frame, from the top: deeper frames on this stack never returned
     * (longjmp, exception) and end here too. */
    u64 i = d;
    while (i && p->ret[i - 1].slot != (u64)slot)
        i--;
    if (!i) {
        if (!back_to_site(c, slot))
            __builtin_trap(); /* nowhere known to return to: nothing to do but stop */
        if (b)
            b->unpaired++;
        __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
        return;
    }
    while (d > i && p->ret[d - 1].slot < (u64)slot && near(p->ret[d - 1].slot, (u64)slot)) {
        d--;
        if (b && !p->mixed)
            finish(c, b, d, now, off, 1);
    }
    p->depth = d;
    *slot = p->ret[i - 1].ret;
    if (d > i) {
        remove_frame(p, b, i - 1);
    } else {
        if (b && !p->mixed)
            finish(c, b, i - 1, now, off, 0);
        p->depth = i - 1;
        if (b)
            __atomic_store_n(&b->depth, i - 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
}

/* Most calls and returns take the paths below, which leave the rest to
 * enter and leave: those of a thread at its home seat while calls are
 * recorded, no two threads sharing a thread pointer, no unwinder under
 * way, the call's frame on top of the caller's. They do what enter and
 * leave would, in fewer instructions: no call, and the configuration read
 * once. */

/* The thread's home seat (see seat_of_fast) and the block it holds
 * (index + 1) if it is this thread's pointer's, else 0. */
struct home {
    struct seat *seat;
    u64 seated;
};

static inline struct home home_seat(const struct config *c)
{
    u64 key = thread_pointer();
    struct seat *s = &((struct seat *)c->private_base)[home_of(key)];
    u64 seated = __atomic_load_n(&s->block, __ATOMIC_ACQUIRE);
    return (struct home){s, __atomic_load_n(&s->key, __ATOMIC_ACQUIRE) == key ? seated : 0};
}

/* Whether calls are recorded: read before the thread's seat, as
 * adopt_if_forked has it, so that a forked child's thread finds the seats
 * its adopting thread cleared. */
static inline int recording(const struct config *c)
{
    return __atomic_load_n((u64 *)c->live, __ATOMIC_ACQUIRE) == LIVE_RECORDING;
}

/* The blocks of the thread whose home seat is `h` (read after
 * `recorded` was) and whose C library thread id is `tid`, if it may take
 * the quick paths. */
static inline int seated_quickly(const struct config *c, int recorded, struct home h, u32 tid, struct private_block **p,
                                 struct block **b)
{
    if (!recorded || __atomic_load_n(&header(c)->shared_seats, __ATOMIC_RELAXED) || h.seated - 1 >= c->blocks)
        return 0;
    /* As seated_here, with the block's address computed once. */
    *b = shared_block(c, h.seated - 1);
    if (__atomic_load_n(&(*b)->state, __ATOMIC_ACQUIRE) != BLOCK_USED || (tid && h.seat->tid != tid))
        return 0;
    *p = private_block(c, h.seated - 1);
    return 1;
}

/* The trampoline of return site `ret` where the site has its own at the
 * first place the table looks, else 0 (see trampoline_for). */
static inline u64 site_trampoline_at_home(const struct config *c, u64 ret)
{
    u64 i = site_hash(c, ret);
    if (!c->site_trampolines || !ret || __atomic_load_n(&header(c)->sites[i], __ATOMIC_RELAXED) != ret)
        return 0;
    return c->site_trampolines + i * SITE_BYTES;
}

/* The node of `function` called from node `parent` in block b where it
 * was made before and sits where the hash looks first (see node_slot),
 * else 0. */
static inline u32 context_at_home(const struct block *b, u32 parent, u32 function)
{
    u32 at = b->hash[context_hash(parent, function, hash_bits(b))];
    return at && b->node[at].parent == parent && b->node[at].function == function ? at : 0;
}

/* The end of a quick entry whose time off CPU went stale (see back_unseen). */
static __attribute__((noinline, cold)) u64 entered_accounted(struct private_block *p, struct block *b, struct frame *f,
                                                           volatile const u64 *entry, u64 call_through)
{
    u64 off, now = now_and_off_accounted(entry, b, &off);
    start_frame(f, now, off);
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
    return call_through;
}

/* The end of a quick entry at depth d in context `node`, once block b is
 * taken: the call is counted, its frame pushed, its slot given
 * `trampoline` and its time read. Returns the `call` to make it through. */
static inline __attribute__((always_inline)) u64 push_frame(const struct config *c, struct private_block *p, struct block *b, u64 *slot,
                                                            u32 function, u64 d, u64 trampoline, u32 node)
{
    entries_of(c, b)[function]++;
    /* A site's return address is in the site table. */
    struct frame *f = open_frame(p, b, slot, function, d, node, 0);
    *slot = trampoline;
    volatile const u64 *entry = off_cpu_entry(c, (u32)b->tid);
    u64 off, now = now_and_off_of(entry, &off);
    if (__builtin_expect(back_unseen(entry, b), 0))
        return entered_accounted(p, b, f, entry, trampoline - CALL_BEFORE_TRAMPOLINE);
    start_frame(f, now, off);
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
    return trampoline - CALL_BEFORE_TRAMPOLINE;
}

/* A quick entry (block b taken) whose caller's last callee was another
 * function: its context is found where the hash looks first, else the
 * call takes the full path. Apart, so that the common entry keeps fewer
 * values. */
static __attribute__((noinline)) u64 enter_another_callee(struct private_block *p, struct block *b, u64 *slot, u32 function, u64 d,
                                                         u64 trampoline)
{
    u32 node = context_at_home(b, d ? b->frame[d - 1].node : 0, function);
    if (!node) {
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&p->busy, 0, __ATOMIC_RELAXED);
        return enter(slot, function);
    }
    remember_callee(d ? &b->frame[d - 1].last_function : &b->root_last_function, function, node);
    return push_frame(config(), p, b, slot, function, d, trampoline, node);
}

/* Returns the `call` (before a return trampoline) the function is to be
 * called through when this call is timed, else 0: the function is
 * entered as it was called, its return address in place. */
u64 proftap_entry(u64 *slot, u32 function)
{
    const struct config *c = config();
    struct private_block *p;
    struct block *b;
    int recorded = recording(c);
    if (!seated_quickly(c, recorded, home_seat(c), library_tid(c), &p, &b) || __atomic_load_n(&p->busy, __ATOMIC_RELAXED))
        return enter(slot, function);
    __atomic_store_n(&p->busy, (u64)slot, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    u64 d = p->depth;
    u64 trampoline = site_trampoline_at_home(c, *slot);
    /* Not a tail call (its slot holds a trampoline), not one that ends
     * frames a longjmp left. */
    if (p->unhooked || p->mixed || function >= c->functions || d >= STACK_DEPTH || !trampoline ||
        (d && !(p->ret[d - 1].slot > (u64)slot && near(p->ret[d - 1].slot, (u64)slot)))) {
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&p->busy, 0, __ATOMIC_RELAXED);
        return enter(slot, function);
    }
    /* Most often in the context the caller called last. */
    u32 last_function = d ? b->frame[d - 1].last_function : b->root_last_function;
    if (last_function != function + 1)
        return enter_another_callee(p, b, slot, function, d, trampoline);
    return push_frame(c, p, b, slot, function, d, trampoline, d ? b->frame[d - 1].last_child : b->root_last_child);
}

/* `slot` is where the return address was and is to be put back. */
void proftap_exit(u64 *slot)
{
    const struct config *c = config();
    /* The thread's seat is looked up before the clock is read, to be
     * found meanwhile, not after. */
    int recorded = recording(c);
    struct home home = home_seat(c);
    __asm__ volatile("" ::"r"(home.seated));
    /* The C library's thread id is the kernel's, for the threads it made:
     * the time off CPU can be read with the TSC, before the thread's block
     * is found. */
    u32 tid = library_tid(c);
    volatile const u64 *early = off_cpu_entry(c, tid);
    u64 off;
    u64 now = now_and_off_of(early, &off);
    struct private_block *p;
    struct block *b;
    if (!seated_quickly(c, recorded, home, tid, &p, &b))
        return leave(slot, early, now, off);
    /* Taken as take_block_to_return takes it on a thread's own block. */
    __atomic_store_n(&p->busy, (u64)slot, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    u64 d = p->depth;
    /* The time off CPU was read of this thread's entry, if there is one. */
    int own_entry = (u32)b->tid == tid || !c->off_cpu;
    if (!own_entry || back_unseen(early, b) || p->mixed || !d || p->ret[d - 1].slot != (u64)slot)
        return leave(slot, early, now, off);
    *slot = p->ret[d - 1].ret;
    int extremes = finish_totals(c, b, d - 1, now, off, 0);
    p->depth = d - 1;
    __atomic_store_n(&b->depth, d - 1, __ATOMIC_RELEASE);
    /* Still holding the block: a signal handler's call of the same
     * function meanwhile goes untimed rather than race for its node. The
     * frame keeps its times until a call takes its depth again. */
    if (__builtin_expect(extremes, 0))
        new_extremes(b, d - 1, now, off);
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
}

/* The private block of the thread a hook runs on, and in *b its shared
 * block while calls are recorded (else 0); none when it has no seat: no
 * call of its was recorded. */
static struct private_block *hooked_thread(const struct config *c, struct block **b)
{
    adopt_if_forked(c);
    u64 seated = seat_of(c, 0);
    *b = seated && live(c) ? shared_block(c, seated - 1) : 0;
    return seated ? private_block(c, seated - 1) : 0;
}

/* proftap_unhook, below; `walk_within`: within an unwind under way, the
 * return addresses above the slot are given back too (a walk a handler
 * started reads them); else they are back already. */
static void unhook(u64 *slot, int walk_within)
{
    const struct config *c = config();
    struct block *b;
    struct private_block *p = hooked_thread(c, &b);
    if (!p)
        return;
    int tail_call = is_trampoline(c, *slot);
    /* A walk while another unwinder runs (a handler's that interrupted
     * it, or backtrace()'s _Unwind_Backtrace): the return addresses above
     * are given back for it too, and the other's entry stays the one whose
     * end hijacks them again. */
    if (within_unwind(p, (u64)slot)) {
        if (walk_within)
            rewrite(c, p, (u64)slot, tail_call, 0);
        return;
    }
    /* Marked first: a handler that interrupts what follows and walks the
     * stack finds its walk within this one. */
    p->unhooked = (u64)slot;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    drop_below(c, p, b, (u64)slot, !tail_call);
    rewrite(c, p, (u64)slot, tail_call, 0);
}

/* Where an unwinder starts (rdi: the return-address slot of its call):
 * frames below are gone; the others get their return addresses back for
 * it to read. A frame at the slot whose trampoline is there tail-called
 * the unwinder (`return backtrace(b, n);`): it lives on, its return
 * address back too, or the walk would stop at the trampoline. */
void proftap_unhook(u64 *slot)
{
    unhook(slot, 1);
}

/* Where glibc links libgcc_s's unwinder, which it loads only when first
 * needed (a thread cancelled, pthread_exit, backtrace): too late for
 * libgcc_s's entries to be patched, so a cancelled thread comes here
 * just before it unwinds, and gets its return addresses back as at an
 * unwinder's entry. Not where pthread_cancel takes the link, in the
 * thread that cancels another: that thread goes on, its returns timed.
 * The unwinder takes it again for each frame it passes (glibc's wrappers
 * of _Unwind_GetCFA and of the personality routine), from deeper: those
 * find the addresses given back already. */
void proftap_unwinder_link(u64 *slot)
{
    const struct config *c = config();
    if (*slot - c->canceller < c->canceller_bytes)
        return;
    unhook(slot, 0);
}

/* Where a handler catches, or a stack walk returns (its call's
 * return-address slot): frames below it are gone, and so is one at it
 * (the catch's call took the slot of a call the throw left, made by the
 * frame that catches), unless it lives on: the slot holds its trampoline,
 * or the unwinder was entered at this very slot by its tail call, whose
 * return goes through its trampoline again. Those above do too. */
void proftap_rehook(u64 *slot)
{
    const struct config *c = config();
    struct block *b;
    struct private_block *p = hooked_thread(c, &b);
    if (!p)
        return;
    int entered_here = p->unhooked == (u64)slot;
    p->unhooked = 0;
    drop_below(c, p, b, (u64)slot, !entered_here && !is_trampoline(c, *slot));
    rewrite(c, p, (u64)slot, entered_here, 1);
}

/* glibc's jmp_buf keeps the stack pointer to go back to in its seventh
 * word, mangled with the thread's pointer guard (its PTR_MANGLE: xor with
 * the guard at %fs:0x30, then rotated left 17 bits). */
#define JMPBUF_SP 6

static inline u64 pointer_demangled(u64 value)
{
    u64 guard;
    __asm__("mov %%fs:0x30, %0" : "=r"(guard));
    return ((value >> 17) | (value << 47)) ^ guard;
}

/* Where a longjmp starts (glibc's longjmp, siglongjmp and __longjmp_chk;
 * the jmp_buf its first argument): the frames it leaves end now, as left
 * without a return, rather than when the thread is next seen shallower,
 * after whatever the program did uninstrumented meanwhile. They are those
 * below the stack pointer the jump goes back to, on its stack, as the
 * next call would find them (frames_in_progress: coroutine stacks within
 * NEAR_STACK of each other pass for one there too). A jump to a stack far
 * from this one (a signal handler's way back from its alternate stack, a
 * coroutine's), a buffer that is not glibc's, or one whose thread holds
 * its block (a handler that interrupted the runtime) ends nothing here:
 * the thread's next call or return ends what the jump left. */
void proftap_jump(u64 *slot)
{
    const struct config *c = config();
    struct block *b;
    struct private_block *p = hooked_thread(c, &b);
    if (!p)
        return;
    const u64 *jmp_buf = (const u64 *)slot[-HOOK_FIRST_ARGUMENT];
    u64 sp = pointer_demangled(jmp_buf[JMPBUF_SP]);
    if (sp <= (u64)slot || !near(sp, (u64)slot) || p->unhooked || take_block_busy(c, p, (u64)slot))
        return;
    drop_below(c, p, b, sp, 0);
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
}

/* Where a stack walker returns: the frames it had put back are hijacked again. */
void proftap_resume(u64 *slot)
{
    const struct config *c = config();
    u64 seated = seat_of(c, 0);
    if (!seated)
        return;
    struct private_block *p = private_block(c, seated - 1);
    if (!p->unhooked)
        return;
    /* The end of a walk within another unwinder's (see proftap_unhook):
     * the other unwinder is not done. */
    if (within_unwind(p, (u64)slot))
        return;
    proftap_rehook(slot);
}

/* The process refused the runtime the rights to write its code: its one
 * thread asks proftap to write the bytes (it can, holding the process)
 * and waits for the answer, LOCK_WAIT_NS at most, through the words a
 * thread that finds no block waits on. The thread or process about to
 * start does not exist yet: no count goes without `lock` while two may
 * count. Unanswered in time (proftap gone or busy, its hold refused), it
 * goes on, marked late, so that an answer after cannot hide it: proftap
 * says the counts may be short. */
#define LOCK_WAIT_NS 200000000UL
static __attribute__((noinline, cold)) void ask_proftap_to_lock(const struct config *c)
{
    struct header *h = header(c);
    __atomic_store_n(&h->lock_refused, LOCK_ASKED, __ATOMIC_SEQ_CST);
    u64 deadline = rdtsc() + ns_to_tsc(c, LOCK_WAIT_NS);
    while (rdtsc() < deadline) {
        u32 answered = __atomic_load_n(&h->blocks_answered, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&h->lock_refused, __ATOMIC_ACQUIRE) != LOCK_ASKED)
            return;
        ask_proftap(h, answered);
    }
    u64 asked = LOCK_ASKED;
    __atomic_compare_exchange_n(&h->lock_refused, &asked, LOCK_LATE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* Where a thread or a process is about to start (`pthread_create`,
 * `clone`, `fork`): the counts made without `lock` while one thread
 * counted become atomic. Each entry of a table is the address of one byte
 * (its low 56 bits) and the byte to write there (its top 8): the `nop`
 * before an edge counter's increment becomes the `lock` prefix; the `jmp
 * +0` before an entry's plain count comes to lead past it to a locked
 * count (of the running CPU's counter where the processor tells it). The
 * one thread of the process runs here, the first
 * time only: the table is emptied as it is taken. The code stays
 * executable while it is written (a signal handler, or a thread started
 * some way not hooked, may run it; each byte written leaves whole
 * instructions either way); where the process refuses that (a seccomp
 * filter, PR_SET_MDWE), proftap is asked to write them. */
void proftap_lock_counters(u64 *slot)
{
    (void)slot;
    const struct config *c = config();
    struct header *h = header(c);
    u64 table = __atomic_exchange_n(&h->lock_table, 0, __ATOMIC_ACQ_REL);
    int refused = 0;
    while (table) {
        const u64 *t = (const u64 *)table;
        u64 region = t[1], bytes = t[2], count = t[3];
        if (syscall6(SYS_mprotect, region, bytes, 7 /* PROT_READ|PROT_WRITE|PROT_EXEC */, 0, 0, 0) == 0) {
            for (u64 i = 0; i < count; i++)
                *(volatile unsigned char *)(t[4 + i] & ((1ULL << 56) - 1)) = (unsigned char)(t[4 + i] >> 56);
            syscall6(SYS_mprotect, region, bytes, 5 /* PROT_READ|PROT_EXEC */, 0, 0, 0);
        } else {
            refused = 1;
        }
        table = t[0];
    }
    if (refused)
        ask_proftap_to_lock(c);
}

/* Where a thread that may share its creator's thread pointer is made
 * (`clone`; `pthread_create` gives each thread its own and reaches it
 * only where the kernel has no clone3): blocks are taken with
 * an atomic exchange from here on, before the thread exists; and counts
 * made without `lock` become atomic, as at any thread start. */
void proftap_clone(u64 *slot)
{
    const struct config *c = config();
    adopt_if_forked(c);
    __atomic_store_n(&header(c)->shared_seats, 1, __ATOMIC_SEQ_CST);
    proftap_lock_counters(slot);
}

/* Regions. A region's hooks are patched where a frame moves onto one of
 * its lines from outside it (enter) and where it moves off them or
 * returns from them (leave); `sp` is the frame's stack pointer there.
 * Hooks nest as frames do, but a frame may leave one region while in
 * another it entered later: a leave closes the newest entry of its region,
 * and entries above it from deeper stack (frames a longjmp or an exception
 * left) end unwound. */

static inline struct regions *regions_of(const struct config *c, struct block *b)
{
    return (struct regions *)((char *)b + c->regions_offset);
}

static inline struct region_total *region_totals(const struct config *c, struct block *b)
{
    return (struct region_total *)(regions_of(c, b) + 1);
}

static inline void observe_timed(struct stat *s, u64 v, int first)
{
    s->total += v;
    if (first || v < s->min)
        s->min = v;
    if (v > s->max)
        s->max = v;
}

static void leave_region(const struct config *c, struct block *b, u64 region, u64 now, u64 off)
{
    struct regions *r = regions_of(c, b);
    struct region_total *totals = region_totals(c, b);
    /* The region's newest entries are the ones past the stack, if any. */
    if (totals[region].overflow) {
        totals[region].overflow--;
        totals[region].untimed++;
        return;
    }
    u64 open = r->open < OPEN_REGIONS ? r->open : OPEN_REGIONS;
    u64 i = open;
    while (i && r->stack[i - 1].region != region)
        i--;
    if (!i) {
        totals[region].unpaired++;
        return;
    }
    struct open_region *o = &r->stack[i - 1];
    u64 wall = now > o->entry_tsc ? now - o->entry_tsc : 0;
    u64 off_since = off > o->entry_off ? ns_to_tsc(c, off - o->entry_off) : 0;
    u64 cpu = wall > off_since ? wall - off_since : 0;
    struct region_total *t = &totals[region];
    observe_timed(&t->wall, wall, t->timed == 0);
    observe_timed(&t->cpu, cpu, t->timed == 0);
    t->timed++;
    /* Keep what is above it, but entries of deeper frames: those ended. */
    u64 kept = i - 1;
    for (u64 j = i; j < open; j++) {
        struct open_region *above = &r->stack[j];
        if (above->sp < o->sp && near(above->sp, o->sp)) {
            if (above->region < c->regions)
                totals[above->region].unwound++;
            continue;
        }
        r->stack[kept++] = *above;
        NOT_A_MEMCPY();
    }
    r->open = kept;
}

/* A region hook: `code` is the region's index times two, plus one for a
 * leave. */
void proftap_region(u64 code, u64 sp)
{
    const struct config *c = config();
    /* Read before the thread may take its block and map its page: read
     * of an entry not mapped yet, it is read again after. */
    volatile const u64 *early = mapped_off_cpu_entry(c, library_tid(c));
    u64 off;
    u64 now = now_and_off_of(early, &off);
    adopt_if_forked(c);
    u64 region = code >> 1;
    if (region >= c->regions || !live(c))
        return;
    u64 seated = seat_of(c, 1);
    if (!seated) {
        __atomic_fetch_add(&header(c)->unseated_hooks, 1, __ATOMIC_RELAXED);
        return;
    }
    struct private_block *p = private_block(c, seated - 1);
    struct block *b = shared_block(c, seated - 1);
    struct regions *r = regions_of(c, b);
    if (take_block_busy(c, p, sp)) {
        __atomic_fetch_add(&r->busy, 1, __ATOMIC_RELAXED);
        return;
    }
    now = own_time(c, b, early, now, &off);
    if (code & 1) {
        leave_region(c, b, region, now, off);
    } else {
        region_totals(c, b)[region].entries++;
        if (r->open < OPEN_REGIONS) {
            struct open_region *o = &r->stack[r->open];
            o->region = region;
            o->sp = sp;
            o->entry_tsc = now;
            o->entry_off = off;
            r->open++;
        } else {
            region_totals(c, b)[region].overflow++;
        }
    }
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
}

/* The memory of proftap's runtime in a patched process, as the runtime
 * (runtime.c) and proftap (probes/src/inject/totals/mod.rs, which checks the
 * sizes below against proftap_layout) both see it.
 *
 * Private memory (a forked child gets its own copy, so its returns work):
 *   seats[SEATS]                   threads by thread pointer -> block
 *   u64[SEAT_WORDS]                which seats were ever taken, a bit each
 *   u64[2 * OFF_CPU_PAGE_WORDS]    pages of the times off CPU mapped, and
 *                                  refused, a bit each
 *   u64[MOST_BLOCKS / 64]          private blocks made writable, a bit each
 *   (to PRIVATE_HEAD, a page boundary; only this much is writable at first)
 *   private_block[blocks]          depth, flags, and each frame's return
 *                                  address, where it was and its function:
 *                                  made writable as threads take them, so
 *                                  that where the kernel counts every
 *                                  writable page a process may use
 *                                  (vm.overcommit_memory 2) a process is
 *                                  charged for its threads' blocks only
 * Shared memory (proftap reads it while the process runs and after):
 *   header
 *   block[blocks], block_bytes apart: the thread's counters, its frames'
 *   times, its nodes (one per calling context) and calls by function.
 */
#ifndef PROFTAP_RUNTIME_H
#define PROFTAP_RUNTIME_H

typedef unsigned long u64;
typedef unsigned int u32;
/* A u64 that may be written over smaller fields. */
typedef u64 __attribute__((may_alias)) u64_alias;
/* The same at a 4-byte boundary: two u32 fields written in one instruction. */
typedef u64 __attribute__((may_alias, aligned(4))) u64_alias4;

#define LAYOUT_MAGIC 0x70726f6674617032UL

/* Threads with a block at once (a power of two). */
#define SEATS_BITS 14
#define SEATS (1UL << SEATS_BITS)
/* Calls deep a thread's frames go; deeper calls are counted, not timed. */
#define STACK_DEPTH (1UL << 18)
/* Calling contexts per thread; calls in more are counted, not timed. */
#define NODES (1UL << 17)
#define HASH_BITS 18
#define HASH_SLOTS (1UL << HASH_BITS)
/* The hash table of a thread's contexts starts at this many slots (a
 * page) and doubles as they fill it: a forked child, whose memory is new,
 * makes its few contexts in a page or two rather than one page fault each
 * across the whole table. */
#define HASH_FIRST_BITS 10
/* Frames farther apart than this are on different stacks. */
#define NEAR_STACK (8UL << 20)
/* Return sites with a trampoline of their own, at most (a power of two:
 * a process has 1 << config.site_bits of them), and the bytes of each
 * site trampoline's code; a return site past them (or past SITE_PROBES
 * slots of the table from where its hash points) returns through the
 * shared one. */
#define SITES_BITS 14
#define SITES (1UL << SITES_BITS)
#define SITE_BYTES 16UL
/* Bytes of the `call` before each return trampoline, through which a
 * timed call is made, so that the return trampoline is the address the
 * call pushed and the processor predicted. */
#define CALL_BEFORE_TRAMPOLINE 4

/* Where a hook's trampoline keeps the hooked function's first argument:
 * words below the return-address slot it passes to the runtime (two words
 * set aside, then rax, rcx, rdx, rsi and rdi pushed). */
#define HOOK_FIRST_ARGUMENT 7
#define SITE_PROBES 8
/* A frame with no node: its context did not fit. */
#define NO_NODE 0xffffffffU

#define BLOCK_FREE 0
#define BLOCK_USED 1
/* proftap read the block of a thread that ended and emptied it: free to
 * take again (BLOCK_TAKING while a thread takes it). */
#define BLOCK_RETIRED 2
#define BLOCK_TAKING 3

/* The live word (config.live), in a page a forked child gets zeroed; the
 * word after it names the child's thread that makes its memory. */
#define LIVE_CHILD 0     /* a forked child that has not made its own memory yet */
#define LIVE_RECORDING 1 /* calls are recorded */
#define LIVE_STOPPED 2   /* proftap stopped recording, or the child could not reach it */
#define LIVE_ADOPTING 3  /* a thread of the child is making its memory */

/* Bytes of the name of the socket a forked child sends its memory to. */
#define FORK_SOCKET_NAME 32
/* Bytes of the path of the same socket's second address (a Unix socket's
 * sun_path, with its terminating 0). */
#define FORK_SOCKET_PATH 108

/* Written by proftap into each copy of the runtime. */
struct config {
    u64 shared;            /* address of the shared memory */
    u64 private_base;      /* address of the private memory */
    u64 live;              /* the live word: LIVE_RECORDING, ... */
    u64 return_trampoline; /* where hijacked returns go when their site has no trampoline of its own */
    u64 site_trampolines;  /* 1 << site_bits trampolines, SITE_BYTES apart, each for the return site header.sites names, or 0 */
    u64 tcb_tid;           /* offset of the C library's thread id from fs:0, or 0 */
    u64 off_cpu;           /* time off CPU by thread id (ns, every other word), or 0 */
    u64 off_cpu_entries;   /* thread ids it covers */
    u64 blocks;            /* blocks in the shared memory */
    u64 blocks_offset;     /* where the first block is in it */
    u64 block_bytes;       /* bytes from one block to the next */
    u64 entries_offset;    /* where a block's calls by function are in it */
    u64 functions;         /* patched functions */
    u64 shared_bytes;      /* size of the shared memory */
    u64 trace_slots;       /* calls a block's trace ring holds (a power of two), 0: no trace */
    u64 trace_offset;      /* where a block's trace ring is in it */
    /* Abstract socket proftap takes forked children's memory on (its
     * first byte is 0: no socket). */
    char fork_socket[FORK_SOCKET_NAME];
    u64 regions;        /* regions timed (their hooks pass an index below) */
    u64 regions_offset; /* where a block's struct regions is in it */
    /* The same socket's path, for a child in a network namespace of its
     * own, where abstract names are not proftap's (first byte 0: none). */
    char fork_path[FORK_SOCKET_PATH];
    /* The process's site trampolines are 1 << site_bits (at most
     * SITES_BITS): sized to its functions, so that the table's slots in
     * use, which a forked child copies, are few where they are few. */
    u64 site_bits;
    /* The array of times off CPU, which config.off_cpu reserves room
     * for: its descriptor in the process, which the runtime maps a page
     * of at a time (runtime.c: map_off_cpu_entry), and what fstat says of
     * it (st_dev, st_ino), to tell it is still the array's. */
    u64 off_cpu_fd;
    u64 off_cpu_device;
    u64 off_cpu_inode;
    /* pthread_cancel's code [canceller, canceller + canceller_bytes), or
     * 0: it takes glibc's link to the unwinder (proftap_unwinder_link) to
     * check that one can be had, in the thread that cancels another. */
    u64 canceller;
    u64 canceller_bytes;
};

/* Thread ids whose time off CPU one page of the array holds, and the most
 * it covers (offcpu.rs), in words of bits a page each. */
#define OFF_CPU_PER_PAGE (4096 / 16)
#define OFF_CPU_MOST_ENTRIES (1UL << 22)
#define OFF_CPU_PAGE_WORDS (OFF_CPU_MOST_ENTRIES / OFF_CPU_PER_PAGE / 64)

/* Values of header.lock_refused. */
#define LOCK_ASKED 1
#define LOCK_GIVEN_UP 2
#define LOCK_LATE 3

struct header {
    u64 magic;
    u64 ns_to_tsc_mult;  /* TSC cycles = ns * mult >> shift (proftap's measurement) */
    u64 ns_to_tsc_shift;
    u64 blocks_taken;    /* blocks handed out so far */
    u64 unseated;        /* calls of threads that found no block */
    u64 unseated_hooks;  /* region hooks of threads that found no block */
    u32 blocks_wanted;   /* bumped (and woken) by a thread that asks proftap to look now (it found no block, or lock_refused) */
    u32 blocks_answered; /* bumped (and woken) by proftap after it looked for ended threads' blocks, or answered lock_refused */
    u64 lock_table;      /* counts to make atomic as a thread or process starts (lock_table.rs), 0: none */
    u64 unseated_returns; /* returns of threads that found no block, sent back to their call site */
    /* Nonzero once two threads may share a thread pointer, and so a block
     * (a `clone` ran, or proftap found two such threads as it attached):
     * blocks are then taken with a compare-and-swap (see take_block_busy). */
    u64 shared_seats;
    /* Forked children that could not hand their memory over to proftap
     * (one in network and mount namespaces of its own reaches neither
     * its socket's abstract name nor its path): counted here, in their
     * parent's memory, before they run on unrecorded. */
    u64 children_unreached;
    /* Pages of the array of times off CPU the process could not map: the
     * program closed or replaced the descriptor proftap left it. Its
     * threads there had their time off CPU counted as CPU time. */
    u64 off_cpu_unmapped;
    /* LOCK_ASKED while the one thread of a process waits at a thread's or
     * process's start for proftap to make the counts atomic, where the
     * process refused the runtime the rights to write its code (a seccomp
     * filter, PR_SET_MDWE); 0 once proftap did, LOCK_GIVEN_UP where it
     * could not, LOCK_LATE where it did not answer in time. */
    u64 lock_refused;
    /* The return address each site trampoline stands for, 0 while free:
     * set once, never changed, so that an unwinder reading a sampled stack
     * names a frame from its trampoline alone, after the call has ended. */
    u64 sites[SITES];
    /* Which sites were ever taken, a bit each: a forked child copies only
     * those into its memory. */
    u64 sites_taken[SITES / 64];
};

struct stat {
    u64 total, min, max;
};

/* One calling context of a thread: a function called from its parent's. */
struct node {
    u32 parent, function;
    u64 calls;
    u64 unwound; /* calls left by a longjmp or an exception */
    struct stat incl_wall, excl_wall, incl_cpu, excl_cpu;
    /* The greatest of the four minima and the least of the four maxima:
     * a call whose times all lie between them changes none. */
    u64 greatest_min, least_max;
};

/* The times of a frame in progress. */
struct frame {
    u64 entry_tsc, entry_off /* the thread's time off CPU then, ns */, child_wall, child_cpu;
    u32 node;
    /* The last function this frame called and that call's node: a loop
     * calling the same function finds its node without the hash. */
    u32 last_function, last_child;
    u32 function;
};

/* Regions a thread has open at once; more are counted, not timed. */
#define OPEN_REGIONS 4096

/* A region a thread is in: since when, and where its frame's stack was. */
struct open_region {
    u64 region, sp, entry_tsc, entry_off /* ns */;
};

/* One region's totals in a thread. */
struct region_total {
    u64 entries;
    u64 timed;    /* entries left and timed */
    u64 untimed;  /* entries left past OPEN_REGIONS open at once */
    u64 unwound;  /* entries whose frame a longjmp or an exception left */
    u64 unpaired; /* leaves with no entry (the hook ran while the thread was busy, or before recording) */
    u64 overflow; /* entries open now past OPEN_REGIONS, not timed */
    struct stat wall, cpu;
};

/* A thread's regions, at config.regions_offset in its block: those open,
 * then a struct region_total per region. */
struct regions {
    u64 open;     /* entries in use of `stack` */
    u64 busy;     /* hooks that ran while the runtime was busy on the thread: not seen */
    u64 reserved[2];
    struct open_region stack[OPEN_REGIONS];
};

/* A finished call in a block's trace ring. */
struct traced {
    u64 entry_tsc, exit_tsc;
    u32 function, depth;
};

/* Where a frame's return address was, and what it was. */
struct ret {
    u64 ret, slot;
};

struct seat {
    u64 key;     /* thread pointer, 0 while free */
    u64 block;   /* index + 1, 0 while being taken, SEAT_NONE when none was left */
    u64 tid;     /* the thread's id (the C library's, or the kernel's) */
    u64 claimer; /* the kernel's id of the thread that took the key, once it is known */
};
#define SEAT_NONE (~0ULL)

/* After the seat table in the private memory, which seats were ever
 * taken, a bit each (then the private blocks): a forked child clears the
 * seats of its parent's threads without reading the whole table. */
#define SEAT_WORDS (SEATS / 64)

/* The most blocks a process has (totals/mod.rs: BLOCKS). */
#define MOST_BLOCKS 4096

/* Where the private blocks start in the private memory. */
#define PRIVATE_HEAD \
    ((sizeof(struct seat) * SEATS + SEAT_WORDS * 8 + 2 * OFF_CPU_PAGE_WORDS * 8 + MOST_BLOCKS / 8 + 4095) & ~4095UL)

struct private_block {
    u64 depth;
    u64 busy;     /* the slot of the call in the runtime on the block, 0: none (see take_block_busy) */
    u64 unhooked; /* where an unwinder that put the return addresses back was entered (its slot), 0: none */
    u64 mixed; /* threads sharing a thread pointer took turns: times no longer kept */
    struct ret ret[STACK_DEPTH];
    /* Each frame's function: a forked child's copy holds them as the fork
     * left them, where the shared block holds the parent's frames of later. */
    u32 function[STACK_DEPTH];
};

struct block {
    u64 state;      /* BLOCK_FREE, BLOCK_USED, BLOCK_RETIRED, BLOCK_TAKING */
    u64 tid;        /* the kernel's id of the thread */
    u64 depth;      /* frames in progress */
    u64 nodes;      /* nodes made (node 0 is the thread) */
    u64 untimed;    /* calls whose context did not fit */
    u64 too_deep;   /* calls deeper than STACK_DEPTH */
    u64 unpaired;   /* returns that found no frame of their own, sent back to their call site */
    u32 root_last_function, root_last_child; /* as in struct frame, for calls at depth 0 */
    u64 mixed;      /* see struct private_block */
    u64 traced;     /* calls written to the trace ring, ever (slot: traced % trace_slots) */
    u64 hash_bits;  /* log2 of the hash slots in use (0: HASH_FIRST_BITS) */
    /* The mark of the thread's off-CPU entry (+1) it last had the kernel
     * account it for (runtime.c: back_unseen), 0: none */
    u64 accounted;
    /* Frames a forked child carried over from its parent (carry_block):
     * their contexts are nodes 1 to `carried` */
    u64 carried;
    u64 reserved[3];
    struct frame frame[STACK_DEPTH];
    /* A copy of the frames' return addresses, for unwinding samples
     * through the shared trampoline; a frame that returns through its
     * site's may have slot 0 here (the site table names it). */
    struct ret returns[STACK_DEPTH];
    u32 hash[HASH_SLOTS];
    struct node node[NODES];
    /* then u64 calls by function, at config.entries_offset, then as many
     * made while the block was busy; then, at config.trace_offset, the
     * trace ring: struct traced[config.trace_slots]; then, at
     * config.regions_offset, struct regions and config.regions struct
     * region_total */
};

#endif

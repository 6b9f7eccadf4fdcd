//! The code proftap puts in a target to time calls and add them up there,
//! and the memory it uses.
//!
//! The runtime proper is C (`probes/runtime/runtime.c`, with its memory in
//! `runtime.h`), built by the crate's build script into a flat image: it
//! adds up every call's times in place, per thread and calling context, in
//! memory shared with proftap. Here: that image with its configuration
//! written in, the return trampoline and the trampolines' call into it
//! (which save the registers the C code may change), and the memory's
//! layout as proftap reads it.

use iced_x86::code_asm::*;

#[cfg_attr(not(test), allow(dead_code))]
mod symbols {
    include!(concat!(env!("OUT_DIR"), "/runtime_symbols.rs"));
}

/// The runtime, compiled: code, constants, then its configuration.
const IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/runtime.bin"));

/// Bytes set aside for the runtime's code that [`assemble`] makes of
/// `config` and `shared`: its image, the return trampoline, the return
/// sites' trampolines (the first copy's alone) and the region trampoline.
/// What the room holds besides is written too, and is the process's own
/// memory, which each fork copies: no more than the copy takes.
pub fn code_room(config: &Config, shared: Option<Trampolines>) -> usize {
    let sites = if shared.is_some() { 0 } else { sites_for(config.functions) };
    (IMAGE.len() + 64).next_multiple_of(64) + 128 + (sites * SITE_BYTES) as usize + 128
}

/// Return sites with a trampoline of their own, at most (`SITES` in
/// runtime.h); a process has [`sites_for`] its functions.
pub const SITES: u64 = 1 << 14;

/// Return sites with a trampoline of their own, at least: a few functions
/// named may be called from thousands of sites (`-f malloc`).
const FEWEST_SITES: u64 = 1 << 12;
const _: () = assert!(FEWEST_SITES >= 512, "the runtime copies the table by whole pages of 512 sites");

/// The site trampolines of a process whose functions probed (those asked
/// for, refused ones too) are `functions`: eight a function, rounded up to
/// a power of two (a program returns to about as many sites as it has
/// functions: dash to 228 of its 246), so that the table stays sparse, and
/// no more: a forked child copies the pages of the table in use, and the
/// trampolines' pages are the process's own, which each fork copies.
pub fn sites_for(functions: u64) -> u64 {
    functions.saturating_mul(8).next_power_of_two().clamp(FEWEST_SITES, SITES)
}

/// Bytes of each return site's trampoline (`SITE_BYTES`).
pub const SITE_BYTES: u64 = 16;
/// Bytes of the `call` before each return trampoline
/// (`CALL_BEFORE_TRAMPOLINE`): `call [rsp-16]`.
pub const CALL_BEFORE_TRAMPOLINE: u64 = 4;

/// Threads with a block at once (`SEATS` in runtime.h: the seat table's size).
pub const SEATS: u64 = 1 << 14;
/// Calls deep a thread's frames go; deeper calls are counted, not timed.
pub const STACK_DEPTH: u64 = 1 << 18;
/// Calling contexts per thread; calls in more are counted, not timed.
pub const NODES: u64 = 1 << 17;
/// Slots of a thread's context hash.
const HASH_SLOTS: u64 = 1 << 18;
/// A frame whose context did not fit.
pub const NO_NODE: u32 = u32::MAX;
/// A block a thread has (`BLOCK_USED` in runtime.h).
pub const BLOCK_USED: u64 = 1;
/// A block proftap read and emptied after its thread ended, free to take again.
pub const BLOCK_RETIRED: u64 = 2;
/// Blocks (threads timed at once) in the shared memory.
pub const BLOCKS: u64 = 4096;

/// `struct config` of runtime.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Address of the shared memory.
    pub shared: u64,
    /// Address of the private memory.
    pub private_base: u64,
    /// The live word ([`LIVE_RECORDING`], ...).
    pub live: u64,
    /// Where hijacked returns go when their site has no trampoline of its own.
    pub return_trampoline: u64,
    /// The return sites' trampolines (see [`Trampolines`]), or 0.
    pub site_trampolines: u64,
    /// Offset of the C library's thread id from the thread pointer, or 0.
    pub tcb_tid: u64,
    /// Time off CPU by thread id (ns, every other word), or 0.
    pub off_cpu: u64,
    /// Thread ids `off_cpu` covers.
    pub off_cpu_entries: u64,
    /// Blocks in the shared memory.
    pub blocks: u64,
    /// Where the first block is in it.
    pub blocks_offset: u64,
    /// Bytes from one block to the next.
    pub block_bytes: u64,
    /// Where a block's calls by function are in it.
    pub entries_offset: u64,
    /// Patched functions.
    pub functions: u64,
    /// Size of the shared memory.
    pub shared_bytes: u64,
    /// Calls a block's trace ring holds (a power of two), 0: no trace.
    pub trace_slots: u64,
    /// Where a block's trace ring is in it.
    pub trace_offset: u64,
    /// The abstract socket forked children send their memory to (all zero: none).
    pub fork_socket: [u8; 32],
    /// Regions timed.
    pub regions: u64,
    /// Where a block's regions are in it.
    pub regions_offset: u64,
    /// A path of the same socket, for a child in a network namespace of
    /// its own (all zero: none).
    pub fork_path: SocketPath,
    /// The process's site trampolines are `1 << site_bits` (set as the
    /// runtime is assembled, from its [`Trampolines`]).
    pub site_bits: u64,
    /// The off-CPU array's descriptor in the process: the runtime maps
    /// the pages of its threads into the room `off_cpu` reserves.
    pub off_cpu_fd: u64,
    /// What `fstat` says of that descriptor (`st_dev`, `st_ino`), for the
    /// runtime to tell it is still the array's.
    pub off_cpu_device: u64,
    /// See [`Config::off_cpu_device`].
    pub off_cpu_inode: u64,
    /// Where `pthread_cancel`'s code is in the process (0: nowhere), and
    /// its bytes: it takes glibc's link to the unwinder, hooked
    /// ([`super::hooks::Hook::UnwinderLink`]), in the thread that cancels.
    pub canceller: u64,
    /// See [`Config::canceller`].
    pub canceller_bytes: u64,
}

/// Words of bits, a page of the off-CPU array each (`OFF_CPU_PAGE_WORDS`
/// in runtime.h): 256 thread ids a page, up to the 4 M ids the array covers.
pub const OFF_CPU_PAGE_WORDS: u64 = (1 << 22) / 256 / 64;

/// A Unix socket's path as `sockaddr_un` holds it, 0-terminated.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketPath(pub [u8; SocketPath::BYTES]);

impl SocketPath {
    /// `FORK_SOCKET_PATH` in runtime.h: `sun_path`'s size.
    pub const BYTES: usize = 108;
}

impl Default for SocketPath {
    fn default() -> Self {
        SocketPath([0; SocketPath::BYTES])
    }
}

/// The live word while calls are recorded (`LIVE_RECORDING` in runtime.h);
/// a forked child's reads 0 until it has memory of its own.
pub const LIVE_RECORDING: u64 = 1;
/// The live word once recording stopped (`LIVE_STOPPED`).
pub const LIVE_STOPPED: u64 = 2;

/// `struct header` of runtime.h, up to its table of return sites
/// ([`Geometry::SITES`]: `u64 sites[SITES]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// TSC cycles = ns * mult >> shift.
    pub ns_to_tsc_mult: u64,
    /// See `ns_to_tsc_mult`.
    pub ns_to_tsc_shift: u64,
    /// Blocks handed out so far.
    pub blocks_taken: u64,
    /// Calls of threads that found no block.
    pub unseated: u64,
    /// Region hooks of threads that found no block.
    pub unseated_hooks: u64,
    /// Bumped (and woken) by a thread that asks proftap to look now: it
    /// found no block, or set [`Header::lock_refused`].
    pub blocks_wanted: u32,
    /// Bumped (and woken) by proftap after it looked for ended threads'
    /// blocks to hand back, or answered [`Header::lock_refused`].
    pub blocks_answered: u32,
    /// The first table of increments to make atomic when a thread or a
    /// process starts; the runtime empties it as it does so (see
    /// `lock_table`).
    pub lock_table: u64,
    /// Returns of threads that found no block, sent back to their call
    /// site by the site trampoline they came through.
    pub unseated_returns: u64,
    /// Nonzero once two threads may share a thread pointer: the runtime
    /// then takes a thread's block with an atomic exchange. proftap clears
    /// it where no thread can be made so unseen.
    pub shared_seats: u64,
    /// Forked children that could not hand their memory over to proftap
    /// (one in network and mount namespaces of its own cannot reach it):
    /// counted in their parent's memory, they ran unrecorded.
    pub children_unreached: u64,
    /// Pages of the off-CPU array the process could not map (the program
    /// closed or replaced the descriptor proftap left it): its threads
    /// there had their time off CPU counted as CPU time.
    pub off_cpu_unmapped: u64,
    /// [`LOCK_ASKED`] while the one thread of the process waits at a
    /// thread's or process's start for proftap to make the counts atomic,
    /// where the process refused the runtime the rights to write its code;
    /// 0 once proftap did, [`LOCK_GIVEN_UP`] where it could not,
    /// [`LOCK_LATE`] where it did not answer in time.
    pub lock_refused: u64,
}

/// See [`Header::lock_refused`].
pub const LOCK_ASKED: u64 = 1;
/// See [`Header::lock_refused`].
pub const LOCK_GIVEN_UP: u64 = 2;
/// See [`Header::lock_refused`].
pub const LOCK_LATE: u64 = 3;

/// `struct stat` of runtime.h: total, min and max, in TSC cycles.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Sum.
    pub total: u64,
    /// Smallest (`u64::MAX` before the first).
    pub min: u64,
    /// Largest.
    pub max: u64,
}

/// `struct node` of runtime.h: one calling context of a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// The caller's node (0: the thread).
    pub parent: u32,
    /// The function's index.
    pub function: u32,
    /// Calls ended.
    pub calls: u64,
    /// Of them, left by a longjmp or an exception.
    pub unwound: u64,
    /// Inclusive wall time.
    pub incl_wall: Stat,
    /// Exclusive wall time.
    pub excl_wall: Stat,
    /// Inclusive CPU time.
    pub incl_cpu: Stat,
    /// Exclusive CPU time.
    pub excl_cpu: Stat,
    /// The runtime's own: the greatest minimum and the least maximum.
    bounds: [u64; 2],
}

/// `struct frame` of runtime.h: a call in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Frame {
    /// When it started (TSC).
    pub entry_tsc: u64,
    /// The thread's time off CPU then (nanoseconds: converted to TSC
    /// cycles only as a difference, which is 0 for most calls).
    pub entry_off: u64,
    /// Wall time of the calls it made that ended.
    pub child_wall: u64,
    /// CPU time of the same.
    pub child_cpu: u64,
    /// Its node.
    pub node: u32,
    last_function: u32,
    last_child: u32,
    /// Its function.
    pub function: u32,
}

/// `struct traced` of runtime.h: a finished call in a block's trace ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traced {
    /// When it started (TSC).
    pub entry_tsc: u64,
    /// When it returned (TSC).
    pub exit_tsc: u64,
    /// Its function.
    pub function: u32,
    /// Calls in progress on its thread when it started.
    pub depth: u32,
}

/// `struct ret` of runtime.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ret {
    /// The original return address.
    pub ret: u64,
    /// Where it was on the stack.
    pub slot: u64,
}

/// The counters at the start of `struct block` of runtime.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockHeader {
    /// 0 free, [`BLOCK_USED`], [`BLOCK_RETIRED`], 3 being taken.
    pub state: u64,
    /// The kernel's id of the thread.
    pub tid: u64,
    /// Frames in progress.
    pub depth: u64,
    /// Nodes made (node 0 is the thread).
    pub nodes: u64,
    /// Calls whose context did not fit.
    pub untimed: u64,
    /// Calls deeper than [`STACK_DEPTH`].
    pub too_deep: u64,
    /// Returns that found no frame of their own (the program switched
    /// stacks), sent back to their call site by the site trampoline they
    /// came through.
    pub unpaired: u64,
    root_last_function: u32,
    root_last_child: u32,
    /// Threads sharing a thread pointer took turns on this block: its
    /// calls are counted, no longer timed.
    pub mixed: u64,
    /// Calls written to the trace ring, ever.
    pub traced: u64,
    /// Log2 of the context hash table's slots in use (0: the first size).
    hash_bits: u64,
    /// The runtime's own (see runtime.h).
    accounted: u64,
    /// Frames a forked child carried over from its parent: their contexts
    /// are nodes 1 to `carried`.
    pub carried: u64,
    reserved: [u64; 3],
}

/// Regions a thread has open at once (`OPEN_REGIONS`); more are counted, not timed.
pub const OPEN_REGIONS: u64 = 4096;

/// `struct open_region` of runtime.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct OpenRegion {
    region: u64,
    sp: u64,
    entry_tsc: u64,
    entry_off: u64,
}

/// The counters at the start of `struct regions` of runtime.h, before the
/// regions open.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionsHeader {
    /// Regions open.
    pub open: u64,
    /// Hooks that ran while the runtime was busy on the thread: not seen.
    pub busy: u64,
    reserved: [u64; 2],
}

/// `struct region_total` of runtime.h: one region's totals in a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionTotal {
    /// Times a frame entered it.
    pub entries: u64,
    /// Entries left and timed (`wall` and `cpu` are of these).
    pub timed: u64,
    /// Entries left past [`OPEN_REGIONS`] open at once.
    pub untimed: u64,
    /// Entries whose frame a longjmp or an exception left.
    pub unwound: u64,
    /// Leaves with no entry.
    pub unpaired: u64,
    /// Entries open now past [`OPEN_REGIONS`], not timed.
    pub overflow: u64,
    /// Wall time per timed entry (TSC cycles).
    pub wall: Stat,
    /// CPU time per timed entry (TSC cycles).
    pub cpu: Stat,
}

/// `struct seat` of runtime.h.
#[repr(C)]
struct Seat {
    key: u64,
    block: u64,
    tid: u64,
    claimer: u64,
}

/// The flags at the start of `struct private_block` of runtime.h.
#[repr(C)]
struct PrivateHeader {
    depth: u64,
    busy: u64,
    unhooked: u64,
    mixed: u64,
}

/// The first word of the shared memory once set up.
pub const MAGIC: u64 = 0x7072_6f66_7461_7032;

/// Where things are in the shared and private memory, for `functions`
/// patched functions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    /// Patched functions.
    pub functions: u64,
    /// Blocks.
    pub blocks: u64,
    /// Calls each block's trace ring holds (a power of two), 0: no trace.
    pub trace_slots: u64,
    /// Regions timed.
    pub regions: u64,
}

const fn page(bytes: u64) -> u64 {
    bytes.next_multiple_of(4096)
}

impl Geometry {
    /// Offset of a block's frames, returns, hash and nodes within it.
    pub const FRAMES: u64 = size_of::<BlockHeader>() as u64;
    /// See [`Geometry::FRAMES`].
    pub const RETURNS: u64 = Self::FRAMES + STACK_DEPTH * size_of::<Frame>() as u64;
    const HASH: u64 = Self::RETURNS + STACK_DEPTH * size_of::<Ret>() as u64;
    /// See [`Geometry::FRAMES`].
    pub const NODES: u64 = Self::HASH + HASH_SLOTS * 4;
    const BLOCK: u64 = Self::NODES + NODES * size_of::<Node>() as u64;
    /// A private block: its header, each frame's return address and slot,
    /// then each frame's function (a `u32`).
    const PRIVATE_BLOCK: u64 = size_of::<PrivateHeader>() as u64 + STACK_DEPTH * (size_of::<Ret>() as u64 + 4);

    /// Where the return sites' table is in the shared memory: the return
    /// address each site trampoline stands for, 0 while free.
    pub const SITES: u64 = size_of::<Header>() as u64;
    /// Bytes of `struct header`: the sites, then a bit for each ever taken.
    pub const HEADER: u64 = Self::SITES + SITES * 8 + SITES / 8;

    /// Where the first block is in the shared memory.
    pub const fn blocks_offset(&self) -> u64 {
        page(Self::HEADER)
    }
    /// Where a block's calls by function are in it.
    pub const fn entries_offset(&self) -> u64 {
        Self::BLOCK
    }
    /// Where a block's calls by function made while it was busy are in it.
    pub const fn busy_entries_offset(&self) -> u64 {
        Self::BLOCK + 8 * self.functions
    }
    /// Where a block's trace ring is in it.
    pub const fn trace_offset(&self) -> u64 {
        page(Self::BLOCK + 16 * self.functions)
    }
    /// Where a block's regions are in it.
    pub const fn regions_offset(&self) -> u64 {
        page(self.trace_offset() + self.trace_slots * size_of::<Traced>() as u64)
    }
    /// Where a block's totals of its regions are in it.
    pub const fn region_totals_offset(&self) -> u64 {
        self.regions_offset() + Self::REGIONS
    }
    /// Bytes of a block's `struct regions`.
    pub const REGIONS: u64 = size_of::<RegionsHeader>() as u64 + OPEN_REGIONS * size_of::<OpenRegion>() as u64;
    /// Bytes from one block to the next.
    pub const fn block_bytes(&self) -> u64 {
        if self.regions == 0 {
            return self.regions_offset();
        }
        page(self.region_totals_offset() + self.regions * size_of::<RegionTotal>() as u64)
    }
    /// Bytes of shared memory.
    pub const fn shared_bytes(&self) -> u64 {
        self.blocks_offset() + self.blocks * self.block_bytes()
    }
    /// Bytes of private memory.
    pub const fn private_bytes(&self) -> u64 {
        page(Self::PRIVATE_BLOCKS + self.blocks * Self::PRIVATE_BLOCK)
    }
    /// Where the private blocks start in the private memory, at a page:
    /// after the seats, the bits of those ever taken (`SEAT_WORDS` in
    /// runtime.h), the bits of the off-CPU array's pages mapped and
    /// refused, and those of the private blocks made writable. Only this
    /// much is writable at first, the blocks as threads take them
    /// (`PRIVATE_HEAD` in runtime.h).
    pub const PRIVATE_BLOCKS: u64 = page(Self::OFF_CPU_PAGES + 2 * OFF_CPU_PAGE_WORDS * 8 + BLOCKS / 8);
    /// Where the bits of the off-CPU array's pages mapped, then refused,
    /// are in the private memory.
    pub const OFF_CPU_PAGES: u64 = SEATS * size_of::<Seat>() as u64 + SEATS / 8;
    /// Where a thread's return addresses start in its private block.
    pub const PRIVATE_RETURNS: u64 = size_of::<PrivateHeader>() as u64;

    /// Offset of private block `index` in the private memory.
    pub const fn private_block(index: u64) -> u64 {
        Self::PRIVATE_BLOCKS + index * Self::PRIVATE_BLOCK
    }

    /// Offset of block `index` in the shared memory.
    pub const fn block(&self, index: u64) -> u64 {
        self.blocks_offset() + index * self.block_bytes()
    }
}

/// The runtime's code, made for an address.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// The code.
    pub code: Vec<u8>,
    /// Where `entry` is.
    pub entry: u64,
    /// Where hijacked returns go.
    pub trampolines: Trampolines,
    /// Where `unhook` is: called where an unwinder starts, it puts the
    /// thread's original return addresses back.
    pub unhook: u64,
    /// Where `unwinder_link` is: called where glibc links libgcc_s's
    /// unwinder, it unhooks, but in the thread that cancels another.
    pub unwinder_link: u64,
    /// Where `rehook` is: called where a handler catches, it hijacks the
    /// live frames' return addresses again.
    pub rehook: u64,
    /// Where `resume` is: called where a stack walker returns, it hijacks
    /// the return addresses it had put back.
    pub resume: u64,
    /// Where `jump` is: called where a `longjmp` starts, it ends the
    /// frames the jump leaves.
    pub jump: u64,
    /// Where the region trampoline is (see [`region_hook`]).
    pub region_trampoline: u64,
    /// Where `lock_counters` is: called where a thread or a process
    /// starts, it makes the edge counters' increments atomic.
    pub lock_counters: u64,
    /// Where `clone` is: called where a thread that may share its
    /// creator's thread pointer is made, it makes the runtime take a
    /// thread's block atomically from then on (and locks the counters).
    pub clone: u64,
    /// Where the code that makes a forked child's memory is.
    pub fork_code: std::ops::Range<u64>,
}

fn asm_error(e: IcedError) -> String {
    format!("cannot assemble the runtime: {e}")
}

/// Where hijacked returns go: the return trampoline, and the return
/// sites' own trampolines, each a jump to it. A return site (the address a
/// call returns to) takes one of those the first time a call returning
/// there is hijacked and keeps it: the runtime's table in the shared
/// memory ([`Geometry::SITES`]) says which site each stands for, so that a
/// sampled stack names its frames from the trampolines on it, without the
/// frames' state, which has changed by the time proftap reads the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trampolines {
    /// The one a return goes through when its site found no trampoline.
    pub shared: u64,
    /// The first of `count` site trampolines, [`SITE_BYTES`] apart.
    pub sites: u64,
    /// How many: a power of two, at most [`SITES`].
    pub count: u64,
}

impl Trampolines {
    /// Whether `address` is one of them: a return hijacked.
    pub fn contains(&self, address: u64) -> bool {
        address == self.shared || self.site(address).is_some()
    }

    /// The index in the table of the site trampoline at `address`.
    pub fn site(&self, address: u64) -> Option<u64> {
        let offset = address.checked_sub(self.sites)?;
        (offset < self.count.min(SITES) * SITE_BYTES && offset % SITE_BYTES == 0).then_some(offset / SITE_BYTES)
    }
}

/// The runtime at `address` with `config`, whose trampolines are filled
/// in: those given (shared by every copy in the process: the addresses
/// unwinders are kept from, the table's indexes) or this copy's own.
pub fn assemble(address: u64, config: &Config, shared: Option<Trampolines>) -> Result<Runtime, String> {
    let mut code = IMAGE.to_vec();
    code.resize(IMAGE.len().next_multiple_of(64), 0xcc);
    code.extend_from_slice(&CALL_THROUGH_STACK);
    let own_trampoline = address + code.len() as u64;
    let trampoline = return_trampoline_code(own_trampoline, address + symbols::PROFTAP_EXIT).map_err(asm_error)?;
    code.extend_from_slice(&trampoline);
    code.resize(code.len().next_multiple_of(64), 0xcc);
    // Every copy in the process shares the first one's table and its size.
    let count = shared.map_or_else(|| sites_for(config.functions), |t| t.count);
    let own = Trampolines { shared: own_trampoline, sites: address + code.len() as u64 + CALL_BEFORE_TRAMPOLINE, count };
    // Only the first copy's site trampolines are used: the others have none.
    if shared.is_none() {
        code.extend_from_slice(&site_trampolines(own));
    }
    code.resize(code.len().next_multiple_of(16), 0xcc);
    let region_trampoline = address + code.len() as u64;
    code.extend_from_slice(&region_trampoline_code(region_trampoline, address + symbols::PROFTAP_REGION).map_err(asm_error)?);
    let trampolines = shared.unwrap_or(own);
    let site_bits = u64::from(trampolines.count.trailing_zeros());
    let config = Config { return_trampoline: trampolines.shared, site_trampolines: trampolines.sites, site_bits, ..*config };
    let at = symbols::PROFTAP_CONFIG as usize;
    // SAFETY: Config is plain old data of u64s.
    let bytes = unsafe { std::slice::from_raw_parts((&raw const config).cast::<u8>(), size_of::<Config>()) };
    code[at..at + bytes.len()].copy_from_slice(bytes);
    Ok(Runtime {
        code,
        entry: address + symbols::PROFTAP_ENTRY,
        trampolines,
        unhook: address + symbols::PROFTAP_UNHOOK,
        unwinder_link: address + symbols::PROFTAP_UNWINDER_LINK,
        rehook: address + symbols::PROFTAP_REHOOK,
        resume: address + symbols::PROFTAP_RESUME,
        jump: address + symbols::PROFTAP_JUMP,
        region_trampoline,
        lock_counters: address + symbols::PROFTAP_LOCK_COUNTERS,
        clone: address + symbols::PROFTAP_CLONE,
        fork_code: address + symbols::PROFTAP_FORK_CODE..address + symbols::PROFTAP_FORK_CODE_END,
    })
}

/// `call [rsp-16]`, before each return trampoline: a timed call is made
/// through it, with the return-address slot just stepped over (the stack
/// pointer 8 above it) and the function's address in the word below the
/// slot, so that the call writes the trampoline's address in the slot and
/// the processor predicts the function's return to it.
const CALL_THROUGH_STACK: [u8; CALL_BEFORE_TRAMPOLINE as usize] = [0xff, 0x54, 0x24, 0xf0];

/// The site trampolines, the first at `at.sites`: each after its
/// [`CALL_THROUGH_STACK`], a `jmp` to `at.shared`, padded.
fn site_trampolines(at: Trampolines) -> Vec<u8> {
    let mut code = Vec::with_capacity((at.count * SITE_BYTES) as usize);
    for i in 0..at.count {
        code.extend_from_slice(&CALL_THROUGH_STACK);
        let next = at.sites + i * SITE_BYTES + 5;
        let rel = at.shared.wrapping_sub(next) as i64 as i32;
        code.push(0xe9);
        code.extend_from_slice(&rel.to_le_bytes());
        code.resize(((i + 1) * SITE_BYTES) as usize, 0xcc);
    }
    code
}

/// A hijacked return lands here: with the registers the return may carry
/// saved, `exit(rdi = where the return address was)` puts it back there,
/// and the return goes on with a `ret`, which the processor predicts: the
/// call the function was made through (see [`CALL_THROUGH_STACK`]) had the
/// function's return predicted, and this one is the caller's call's. (A
/// return hijacked by another way, an unwinder's frames hijacked again,
/// mispredicts here.)
fn return_trampoline_code(address: u64, exit: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    a.sub(rsp, 8)?;
    for r in SAVED {
        a.push(r)?;
    }
    a.lea(rdi, qword_ptr(rsp + 8 * SAVED.len() as i32))?;
    a.call(exit)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.ret()?;
    a.assemble(address)
}

/// Bytes of the stack a region hook steps over before it pushes anything:
/// the red zone a leaf function may keep below rsp.
pub const RED_ZONE: i32 = 128;

/// The region trampoline, which a region hook calls (see [`region_hook`])
/// with its code pushed: with the flags and every register the C code may
/// change saved, and the stack aligned for it, `region(rdi = code, rsi =
/// the frame's stack pointer at the hook)`.
fn region_trampoline_code(address: u64, region: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    a.pushfq()?;
    for r in SAVED {
        a.push(r)?;
    }
    a.push(rbx)?;
    a.mov(rbx, rsp)?;
    a.and(rsp, -16)?;
    // Above rbx: rbx, the saved registers, the flags, the return address, the code.
    let code_at = 8 * (SAVED.len() as i32 + 3);
    a.mov(rdi, qword_ptr(rbx + code_at))?;
    a.lea(rsi, qword_ptr(rbx + (code_at + 8 + RED_ZONE)))?;
    a.call(region)?;
    a.mov(rsp, rbx)?;
    a.pop(rbx)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.popfq()?;
    a.ret()?;
    a.assemble(address)
}

/// The instructions of a region hook for `region` (`leave`: its leave,
/// else its entry), the region trampoline's address being the 8 bytes at
/// `slot`: `lea rsp,[rsp-128]; push code; call [rip+slot];
/// lea rsp,[rsp+136]`. Nothing changes but memory below the red zone.
pub fn region_hook(region: u32, leave: bool, slot: u64) -> Result<Vec<iced_x86::Instruction>, IcedError> {
    use iced_x86::{Code, Instruction, MemoryOperand, Register};
    let code = (i64::from(region) << 1 | i64::from(leave)) as i32;
    let step = |offset: i64| Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, offset));
    let call = Instruction::with1(Code::Call_rm64, MemoryOperand::with_base_displ(Register::RIP, slot as i64))?;
    Ok(vec![step(-i64::from(RED_ZONE))?, Instruction::with1(Code::Pushq_imm32, code)?, call, step(i64::from(RED_ZONE) + 8)?])
}

/// Where a hook's trampoline keeps the hooked function's first argument,
/// in words below the return-address slot it passes to the runtime: two
/// words set aside, then [`SAVED`] pushed up to rdi (runtime.h's).
pub const HOOK_FIRST_ARGUMENT: usize = 7;

/// The registers a trampoline saves: those a call may pass arguments or
/// return values in, and the others the C code may change (the ABI's
/// caller-saved ones; it uses no vector registers).
const SAVED: [AsmRegister64; 9] = [rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11];

/// The start of a function's trampoline: save registers, call `entry`
/// with the return-address slot and `function`, restore, and when the
/// call is timed make it through the `call` that `entry` returned (see
/// [`CALL_THROUGH_STACK`]), else go on into the function.
pub fn call_entry(address: u64, entry: u64, function: u32) -> Result<Vec<u8>, String> {
    CallTemplate::get(Made::ThroughEntry)?.filled(address, entry, function)
}

/// The start of a hook's trampoline: save registers, call `routine`
/// (`unhook`, `rehook` and the like) with the return-address slot, restore.
pub fn call_routine(address: u64, routine: u64, function: u32) -> Result<Vec<u8>, String> {
    CallTemplate::get(Made::AsCalled)?.filled(address, routine, function)
}

/// How the code after a call into the runtime goes on into the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// As it was called.
    AsCalled,
    /// Through the `call` the entry routine returned, if any.
    ThroughEntry,
}

/// [`call_routine`]'s code assembled once, with where its function number
/// and its call's displacement go: a program's thousands of trampolines
/// differ only there, and assembling each took most of a held start.
struct CallTemplate {
    code: Vec<u8>,
    /// The `mov esi, imm32`'s immediate.
    function_at: usize,
    /// The `call rel32`'s displacement.
    call_at: usize,
}

impl CallTemplate {
    fn get(made: Made) -> Result<&'static CallTemplate, String> {
        static TEMPLATES: std::sync::OnceLock<[Result<CallTemplate, String>; 2]> = std::sync::OnceLock::new();
        let templates = TEMPLATES.get_or_init(|| [Made::AsCalled, Made::ThroughEntry].map(CallTemplate::assemble));
        templates[usize::from(made == Made::ThroughEntry)].as_ref().map_err(Clone::clone)
    }

    fn assemble(made: Made) -> Result<CallTemplate, String> {
        let code = assemble_call_routine(0, 0x1_0000, 0, made).map_err(asm_error)?;
        let (mut function_at, mut call_at) = (None, None);
        for instruction in iced_x86::Decoder::with_ip(64, &code, 0, iced_x86::DecoderOptions::NONE) {
            // Both end in their 4-byte immediate.
            let immediate_at = || instruction.next_ip() as usize - 4;
            match instruction.code() {
                iced_x86::Code::Mov_r32_imm32 => function_at = Some(immediate_at()),
                iced_x86::Code::Call_rel32_64 => call_at = Some(immediate_at()),
                _ => {}
            }
        }
        match (function_at, call_at) {
            (Some(function_at), Some(call_at)) => Ok(CallTemplate { code, function_at, call_at }),
            _ => Err("cannot assemble the runtime: the trampoline's call has no immediate operands".into()),
        }
    }

    /// The code at `address`, calling `routine` with `function`.
    fn filled(&self, address: u64, routine: u64, function: u32) -> Result<Vec<u8>, String> {
        let mut code = self.code.clone();
        code[self.function_at..self.function_at + 4].copy_from_slice(&function.to_le_bytes());
        let next = address.wrapping_add(self.return_offset() as u64);
        let rel =
            i32::try_from(routine.wrapping_sub(next) as i64).map_err(|_| "the runtime is out of reach of the trampoline".to_string())?;
        code[self.call_at..self.call_at + 4].copy_from_slice(&rel.to_le_bytes());
        Ok(code)
    }

    /// Bytes from the start to the instruction after the call.
    fn return_offset(&self) -> usize {
        self.call_at + 4
    }
}

/// [`call_routine`] or [`call_entry`], instruction by instruction. Two
/// words below the slot are set aside first, whatever the routine, so
/// that every trampoline's saves sit alike for an unwinder: the routine's
/// result (for the entry, the `call` to go through, or 0) and the address
/// the function goes on at, after this code.
fn assemble_call_routine(address: u64, routine: u64, function: u32, made: Made) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut function_goes_on = a.create_label();
    a.lea(rsp, qword_ptr(rsp - 16))?;
    for r in SAVED {
        a.push(r)?;
    }
    let saves = 8 * SAVED.len() as i32;
    a.lea(rdi, qword_ptr(rsp + saves + 16))?;
    a.mov(esi, function)?;
    a.call(routine)?;
    a.mov(qword_ptr(rsp + saves), rax)?;
    a.lea(rax, qword_ptr(function_goes_on))?;
    a.mov(qword_ptr(rsp + saves + 8), rax)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.lea(rsp, qword_ptr(rsp + 16))?;
    if made == Made::ThroughEntry {
        // The stack pointer at the slot again; the call to go through two
        // words below it, in the red zone no signal frame is written over.
        a.cmp(qword_ptr(rsp - 16), 0)?;
        a.je(function_goes_on)?;
        a.lea(rsp, qword_ptr(rsp + 8))?;
        a.jmp(qword_ptr(rsp - 24))?;
    }
    a.set_label(&mut function_goes_on)?;
    a.zero_bytes()?;
    a.assemble(address)
}

/// Bytes from the start of [`call_routine`]'s code to the instruction
/// after its call: where the routine returns to, for an unwinder of a
/// stack sampled inside it.
pub fn call_routine_return_offset() -> u64 {
    CallTemplate::get(Made::AsCalled).map_or(0, |t| t.return_offset() as u64)
}

/// The same in the return trampoline.
pub fn return_trampoline_return_offset() -> u64 {
    let code = return_trampoline_code(0, 0x1_0000).unwrap_or_default();
    let decoder = iced_x86::Decoder::with_ip(64, &code, 0, iced_x86::DecoderOptions::NONE);
    decoder.into_iter().find(|i| i.code() == iced_x86::Code::Call_rel32_64).map_or(0, |call| call.next_ip())
}

/// Which code around a call into the runtime a thread is in (see
/// [`words_pushed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutineCall {
    /// A trampoline's [`call_routine`] (at an entry, or a return site).
    Trampoline,
    /// The shared return trampoline.
    Return,
}

/// How many words the code of a call into the runtime has pushed above
/// the patched call's return-address slot when a thread is at
/// `from_return` bytes from where the runtime returns to in it (negative:
/// before the call), at an instruction of its register saves, its call or
/// its restores; `None` elsewhere, or where the slot is below the stack
/// pointer. A stack sampled there finds the call it was timing at the
/// stack pointer plus that many words.
pub fn words_pushed(kind: RoutineCall, from_return: i64) -> Option<u64> {
    static TABLES: std::sync::OnceLock<[Vec<(i64, u64)>; 2]> = std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        // A hook's trampoline, whose code a function's shares up to where
        // a function's goes through the entry's call: past it, the one
        // goes on into the function's moved instructions, the other
        // decides, and neither is in the table.
        let call = assemble_call_routine(0, 0x1_0000, 0, Made::AsCalled).unwrap_or_default();
        let ret = return_trampoline_code(0, 0x1_0000).unwrap_or_default();
        // The return trampoline is entered with the slot just popped.
        [pushes_by_offset(&call, 0), pushes_by_offset(&ret, -1)]
    });
    let table = &tables[usize::from(kind == RoutineCall::Return)];
    let i = table.binary_search_by_key(&from_return, |&(at, _)| at).ok()?;
    Some(table[i].1)
}

/// For each instruction of `code` (a call into the runtime at address 0),
/// its offset from the call's return and the words pushed above the
/// return-address slot before it runs (`start` at the first), where that
/// is not negative.
fn pushes_by_offset(code: &[u8], start: i64) -> Vec<(i64, u64)> {
    use iced_x86::{Code, Mnemonic};
    let instructions: Vec<iced_x86::Instruction> =
        iced_x86::Decoder::with_ip(64, code, 0, iced_x86::DecoderOptions::NONE).into_iter().collect();
    let Some(back) = instructions.iter().find(|i| i.mnemonic() == Mnemonic::Call).map(|i| i.next_ip() as i64) else { return Vec::new() };
    let mut words = start;
    let mut table = Vec::new();
    for i in &instructions {
        if let Ok(at) = u64::try_from(words) {
            table.push((i.ip() as i64 - back, at));
        }
        let on_rsp = i.op0_register() == iced_x86::Register::RSP;
        words += match (i.mnemonic(), i.code()) {
            (Mnemonic::Push, _) => 1,
            (Mnemonic::Pop, _) => -1,
            (_, Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32) if on_rsp => i.immediate(1) as i64 / 8,
            // `lea rsp, [rsp + n]` gives n bytes back.
            (_, Code::Lea_r64_m) if on_rsp => -(i.memory_displacement64() as i64) / 8,
            _ => 0,
        };
    }
    table
}

/// The code that ends a trampoline over a return: save registers (the
/// return value among them), call `routine` with the return-address slot,
/// restore, return.
pub fn call_routine_and_return(address: u64, routine: u64) -> Result<Vec<u8>, String> {
    let mut code = call_routine(address, routine, 0)?;
    code.push(0xc3);
    Ok(code)
}

#[cfg(test)]
mod tests;

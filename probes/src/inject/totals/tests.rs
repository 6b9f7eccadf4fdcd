//! The runtime run in this process: its routines called with made-up
//! return-address slots, its memory read back as proftap reads it.

use super::*;
use crate::inject::children::Children;
use std::ops::Range;

fn layout_word(i: usize) -> u64 {
    let at = symbols::PROFTAP_LAYOUT as usize + 8 * i;
    u64::from_ne_bytes(IMAGE[at..at + 8].try_into().expect("eight bytes"))
}

#[test]
fn the_c_and_rust_views_of_the_memory_agree() {
    let expected = [
        0x7072_6f66_7461_7032,
        size_of::<Config>() as u64,
        Geometry::HEADER,
        Geometry::BLOCK,
        size_of::<Frame>() as u64,
        size_of::<Node>() as u64,
        size_of::<Seat>() as u64,
        Geometry::PRIVATE_BLOCK,
        size_of::<Ret>() as u64,
        SEATS,
        STACK_DEPTH,
        NODES,
        HASH_SLOTS,
        Geometry::FRAMES,
        Geometry::RETURNS,
        Geometry::HASH,
        Geometry::NODES,
        size_of::<PrivateHeader>() as u64,
        size_of::<Traced>() as u64,
        std::mem::offset_of!(BlockHeader, traced) as u64,
        Geometry::REGIONS,
        size_of::<RegionTotal>() as u64,
        OPEN_REGIONS,
        SITES,
        SITE_BYTES,
        CALL_BEFORE_TRAMPOLINE,
        Geometry::PRIVATE_BLOCKS,
        crate::inject::children::NAME_BYTES as u64,
        SocketPath::BYTES as u64,
        std::mem::offset_of!(Config, fork_path) as u64,
        std::mem::offset_of!(Header, children_unreached) as u64,
        OFF_CPU_PAGE_WORDS,
        std::mem::offset_of!(Header, off_cpu_unmapped) as u64,
        std::mem::offset_of!(Header, lock_refused) as u64,
        HOOK_FIRST_ARGUMENT as u64,
    ];
    // Two words set aside, then the registers pushed up to rdi.
    assert_eq!(HOOK_FIRST_ARGUMENT, 2 + SAVED.iter().position(|&r| r == rdi).expect("rdi is saved") + 1);
    for (i, &value) in expected.iter().enumerate() {
        assert_eq!(layout_word(i), value, "layout word {i}");
    }
    let config = Config { functions: 1, ..Config::default() };
    assert!(code_room(&config, None) >= IMAGE.len() + 64);
}

/// The runtime in this process's memory, with `blocks` blocks.
struct Local {
    code: *mut u8,
    code_len: usize,
    shared: *mut u8,
    private: *mut u8,
    geometry: Geometry,
    /// The live word and the word after it (the adopting thread of a forked child).
    live: Box<[u64; 2]>,
    runtime: Runtime,
}

/// The code that makes a forked child's memory is one stretch of the
/// image, apart from the routines each call runs.
#[test]
fn the_fork_code_is_apart_from_the_routines_of_calls() {
    let fork = symbols::PROFTAP_FORK_CODE..symbols::PROFTAP_FORK_CODE_END;
    assert!(fork.end - fork.start >= 64, "{fork:x?}");
    for routine in [symbols::PROFTAP_ENTRY, symbols::PROFTAP_EXIT, symbols::PROFTAP_REGION, symbols::PROFTAP_CLONE] {
        assert!(!fork.contains(&routine), "{routine:#x} in {fork:x?}");
    }
}

/// Unmaps proftap's view of a parent's memory (see [`parent_memory`]).
fn unmap(memory: *mut u8, geometry: Geometry) {
    // SAFETY: a whole mapping made by parent_memory, not used after.
    assert_eq!(unsafe { libc::munmap(memory.cast(), geometry.shared_bytes() as usize) }, 0);
}

/// A parent's shared memory laid out as `geometry` says, mapped twice:
/// where the runtime is to use it, which a forked child maps its own
/// over, and as proftap sees it, which stays the parent's.
fn parent_memory(geometry: Geometry) -> (*mut u8, *mut u8) {
    use std::os::fd::AsRawFd;
    let bytes = geometry.shared_bytes() as usize;
    // SAFETY: a name that is a C string; the descriptor is checked and owned.
    let file = unsafe { libc::memfd_create(c"parent".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(file >= 0, "a memfd");
    // SAFETY: just made, owned by nothing else.
    let file = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(file) };
    nix::unistd::ftruncate(&file, bytes as i64).expect("its size");
    let map = || {
        // SAFETY: a fresh shared mapping of the file just made; checked below.
        let at =
            unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        assert_ne!(at, libc::MAP_FAILED);
        at.cast::<u8>()
    };
    (map(), map())
}

fn map(len: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping; checked below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED);
    at.cast()
}

/// Private memory as proftap maps it in a process: the seats and the
/// words after them writable, the private blocks not until taken.
fn private_memory(geometry: Geometry) -> *mut u8 {
    let len = geometry.private_bytes() as usize;
    // SAFETY: a fresh anonymous mapping, checked, then its head made writable.
    unsafe {
        let at =
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0);
        assert_ne!(at, libc::MAP_FAILED);
        assert_eq!(libc::mprotect(at, Geometry::PRIVATE_BLOCKS as usize, libc::PROT_READ | libc::PROT_WRITE), 0);
        at.cast()
    }
}

/// The rights of this process's mapping holding `address`, as /proc says ("rw-p").
fn rights_at(address: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("its maps");
    maps.lines()
        .find_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            let (start, end) = range.split_once('-')?;
            let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
            (start..end).contains(&address).then(|| rest[..4].to_string())
        })
        .unwrap_or_default()
}

impl Local {
    fn new(functions: u64, blocks: u64) -> Local {
        Local::with_fork_socket(functions, blocks, [0; 32])
    }

    fn with_fork_socket(functions: u64, blocks: u64, fork_socket: [u8; 32]) -> Local {
        Local::with(Geometry { functions, blocks, trace_slots: 0, regions: 2 }, fork_socket)
    }

    fn with(geometry: Geometry, fork_socket: [u8; 32]) -> Local {
        Local::with_shared(geometry, (fork_socket, SocketPath::default()), map(geometry.shared_bytes() as usize))
    }

    /// A runtime whose forked children hand their memory to the socket
    /// of name and path `fork_socket`, and whose shared memory is `shared`
    /// (mapped, of the geometry's size).
    fn with_shared(geometry: Geometry, fork_socket: ([u8; 32], SocketPath), shared: *mut u8) -> Local {
        Local::with_canceller(geometry, fork_socket, shared, 0..0)
    }

    /// The same, with `canceller` as pthread_cancel's code.
    fn with_canceller(geometry: Geometry, fork_socket: ([u8; 32], SocketPath), shared: *mut u8, canceller: Range<u64>) -> Local {
        let (functions, blocks) = (geometry.functions, geometry.blocks);
        let private = private_memory(geometry);
        let live = Box::new([1u64, 0]);
        let code_len = code_room(&Config { functions, ..Config::default() }, None).next_multiple_of(4096);
        let code = map(code_len);
        let config = Config {
            shared: shared as u64,
            private_base: private as u64,
            live: live.as_ptr() as u64,
            blocks,
            blocks_offset: geometry.blocks_offset(),
            block_bytes: geometry.block_bytes(),
            entries_offset: geometry.entries_offset(),
            functions,
            shared_bytes: geometry.shared_bytes(),
            trace_slots: geometry.trace_slots,
            trace_offset: geometry.trace_offset(),
            regions: geometry.regions,
            regions_offset: geometry.regions_offset(),
            fork_socket: fork_socket.0,
            fork_path: fork_socket.1,
            canceller: canceller.start,
            canceller_bytes: canceller.end - canceller.start,
            ..Config::default()
        };
        let runtime = assemble(code as u64, &config, None).expect("assembles");
        // SAFETY: writing the code into its own mapping, then making it executable.
        unsafe {
            std::ptr::copy_nonoverlapping(runtime.code.as_ptr(), code, runtime.code.len());
            assert_eq!(libc::mprotect(code.cast(), code_len, libc::PROT_READ | libc::PROT_EXEC), 0);
            let header = &mut *shared.cast::<Header>();
            header.magic = MAGIC;
            header.ns_to_tsc_mult = 1;
        }
        Local { code, code_len, shared, private, geometry, live, runtime }
    }

    /// The `call` the function is to be made through, or 0.
    fn entry(&self, slot: &mut u64, function: u32) -> u64 {
        // SAFETY: the runtime's entry point, with the C calling convention.
        let entry: extern "C" fn(*mut u64, u32) -> u64 = unsafe { std::mem::transmute(self.runtime.entry as usize) };
        entry(slot, function)
    }

    fn exit(&self, slot: &mut u64) {
        // SAFETY: the runtime's exit, found from the image's symbols.
        let exit: extern "C" fn(*mut u64) = unsafe { std::mem::transmute(self.code as usize + symbols::PROFTAP_EXIT as usize) };
        exit(slot);
    }

    /// The runtime's hook at an unwinder's start (`unhook`) or at a catch (`rehook`).
    fn hook(&self, address: u64, slot: &mut u64) {
        // SAFETY: one of the runtime's hooks, with the C calling convention.
        let hook: extern "C" fn(*mut u64) = unsafe { std::mem::transmute(address as usize) };
        hook(slot);
    }

    fn region(&self, code: u64, stack: u64) {
        // SAFETY: the runtime's region hook, found from the image's symbols.
        let region: extern "C" fn(u64, u64) = unsafe { std::mem::transmute(self.code as usize + symbols::PROFTAP_REGION as usize) };
        region(code, stack);
    }

    fn regions(&self, index: u64) -> Vec<RegionTotal> {
        let at = self.geometry.block(index) + self.geometry.region_totals_offset();
        // SAFETY: in bounds.
        unsafe { std::slice::from_raw_parts(self.shared.add(at as usize).cast::<RegionTotal>(), self.geometry.regions as usize).to_vec() }
    }

    fn header(&self) -> Header {
        // SAFETY: in bounds of the shared mapping.
        unsafe { *self.shared.cast::<Header>() }
    }

    /// Whether site `index` is marked taken (which a forked child copies).
    fn site_taken(&self, index: u64) -> bool {
        assert!(index < SITES);
        // SAFETY: in bounds of the shared mapping's marks, after the table.
        let word = unsafe { *self.shared.add((Geometry::SITES + 8 * SITES + 8 * (index / 64)) as usize).cast::<u64>() };
        word & (1 << (index % 64)) != 0
    }

    /// The return address site trampoline `index` stands for.
    fn site(&self, index: u64) -> u64 {
        assert!(index < SITES);
        // SAFETY: in bounds of the shared mapping's table.
        unsafe { *self.shared.add((Geometry::SITES + 8 * index) as usize).cast::<u64>() }
    }

    fn block(&self, index: u64) -> BlockHeader {
        // SAFETY: in bounds of the shared mapping.
        unsafe { *self.shared.add(self.geometry.block(index) as usize).cast::<BlockHeader>() }
    }

    fn nodes(&self, index: u64) -> Vec<Node> {
        let count = self.block(index).nodes as usize;
        let at = self.geometry.block(index) + Geometry::NODES;
        // SAFETY: nodes below the published count, in bounds.
        unsafe { std::slice::from_raw_parts(self.shared.add(at as usize).cast::<Node>(), count).to_vec() }
    }

    fn entries(&self, index: u64) -> Vec<u64> {
        let at = self.geometry.block(index) + self.geometry.entries_offset();
        // SAFETY: in bounds.
        unsafe { std::slice::from_raw_parts(self.shared.add(at as usize).cast::<u64>(), self.geometry.functions as usize).to_vec() }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped.
        unsafe {
            libc::munmap(self.code.cast(), self.code_len);
            libc::munmap(self.shared.cast(), self.geometry.shared_bytes() as usize);
            libc::munmap(self.private.cast(), self.geometry.private_bytes() as usize);
        }
        let _ = &self.live;
    }
}

/// Made-up return-address slots on a made-up stack: higher index, older frame.
struct Stack([u64; 64]);

impl Stack {
    fn new() -> Stack {
        Stack(std::array::from_fn(|i| 0x1000 + i as u64))
    }
}

#[test]
fn calls_add_up_per_context_and_return_where_they_came_from() {
    let rt = Local::new(3, 4);
    let mut stack = Stack::new();
    // f0 calls f1 twice; f1 calls f2 the second time.
    rt.entry(&mut stack.0[60], 0);
    let site = rt.runtime.trampolines.site(stack.0[60]).expect("the return goes through its site's trampoline");
    assert_eq!(rt.site(site), 0x1000 + 60, "the table names the site");
    rt.entry(&mut stack.0[50], 1);
    rt.exit(&mut stack.0[50]);
    assert_eq!(stack.0[50], 0x1000 + 50, "the original return address is back");
    rt.entry(&mut stack.0[50], 1);
    rt.entry(&mut stack.0[40], 2);
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[50]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60);

    let block = rt.block(0);
    assert_eq!((block.state, block.depth, block.nodes), (1, 0, 4));
    assert_eq!(block.tid, nix::unistd::gettid().as_raw() as u64);
    let nodes = rt.nodes(0);
    let shape: Vec<(u32, u32, u64)> = nodes[1..].iter().map(|n| (n.parent, n.function, n.calls)).collect();
    assert_eq!(shape, [(0, 0, 1), (1, 1, 2), (2, 2, 1)]);
    let (f0, f1, f2) = (&nodes[1], &nodes[2], &nodes[3]);
    assert_eq!(f0.excl_wall.total, f0.incl_wall.total - f1.incl_wall.total);
    assert_eq!(f1.excl_wall.total, f1.incl_wall.total - f2.incl_wall.total);
    assert!(f1.incl_wall.min <= f1.incl_wall.max && f1.incl_wall.min > 0);
    // No off-CPU map: CPU time is wall time.
    assert_eq!(f0.incl_cpu, f0.incl_wall);
    assert_eq!(rt.entries(0), [1, 2, 1]);
    assert_eq!(rt.header().blocks_taken, 1);
}

/// Two functions one caller calls are two contexts, even where the hash
/// of contexts looks for both first in one place.
#[test]
fn a_callee_is_its_own_context_where_another_callees_is_first_in_the_hash() {
    // The place the runtime's hash of contexts (1,024 slots while under
    // 512 are made) looks first for function `f` called from a node: the
    // same for two functions whose product with the second multiplier
    // agrees in its top 10 bits.
    let first_place = |f: u64| f.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) >> (64 - 10);
    let (one, other) = (1..3_000u64)
        .flat_map(|a| (a + 1..3_000).map(move |b| (a, b)))
        .find(|&(a, b)| first_place(a) == first_place(b))
        .expect("two functions the hash looks for in one place");
    let rt = Local::new(other + 1, 4);
    let mut stack = Stack::new();
    // f0 calls `one`, then `other` (its last callee is not `other`), then
    // `one` again after `other`.
    rt.entry(&mut stack.0[60], 0);
    for f in [one, other, one, other] {
        rt.entry(&mut stack.0[50], f as u32);
        rt.exit(&mut stack.0[50]);
    }
    rt.exit(&mut stack.0[60]);
    let shape: Vec<(u32, u64, u64)> = rt.nodes(0)[1..].iter().map(|n| (n.parent, u64::from(n.function), n.calls)).collect();
    assert_eq!(shape, [(0, 0, 1), (1, one, 2), (1, other, 2)]);
}

#[test]
fn a_thread_finds_each_of_thousands_of_contexts_again_as_its_table_grows() {
    let callees = 5_000;
    let rt = Local::new(callees + 1, 4);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    // Each callee twice, a pass apart: the second finds the first's node
    // in a table grown several times since.
    for _pass in 0..2 {
        for f in 1..=callees as u32 {
            rt.entry(&mut stack.0[50], f);
            rt.exit(&mut stack.0[50]);
        }
    }
    rt.exit(&mut stack.0[60]);
    let block = rt.block(0);
    assert_eq!((block.depth, block.untimed), (0, 0));
    assert_eq!(block.nodes, callees + 2, "the thread, f0 and one node a callee");
    let nodes = rt.nodes(0);
    assert!(nodes[2..].iter().all(|n| n.parent == 1 && n.calls == 2));
}

#[test]
fn with_a_trace_every_finished_call_is_written_with_its_function_depth_and_times() {
    let rt = Local::with(Geometry { functions: 3, blocks: 1, trace_slots: 4, regions: 0 }, [0; 32]);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    rt.entry(&mut stack.0[40], 2);
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[50]);
    rt.entry(&mut stack.0[50], 2);
    rt.exit(&mut stack.0[50]);
    rt.exit(&mut stack.0[60]);
    rt.entry(&mut stack.0[60], 1);
    rt.exit(&mut stack.0[60]);
    assert_eq!(rt.block(0).traced, 5);
    let ring = rt.geometry.block(0) + rt.geometry.trace_offset();
    // SAFETY: the ring's four slots, in bounds of the shared mapping.
    let traced = unsafe { std::slice::from_raw_parts(rt.shared.add(ring as usize).cast::<Traced>(), 4).to_vec() };
    // In the order they returned; the fifth call took the first's slot.
    let shape: Vec<(u32, u32)> = traced.iter().map(|t| (t.function, t.depth)).collect();
    assert_eq!(shape, [(1, 0), (1, 1), (2, 1), (0, 0)]);
    assert!(traced.iter().all(|t| t.exit_tsc >= t.entry_tsc && t.entry_tsc > 0));
    let (outer, inner) = (&traced[3], &traced[2]);
    assert!(outer.entry_tsc <= inner.entry_tsc && inner.exit_tsc <= outer.exit_tsc, "a callee within its caller");
}

/// Each of a context's minima and maxima, inclusive and exclusive, is
/// its calls' own, though most calls change none and the runtime looks
/// at them only when one does: a caller whose calls' inclusive and
/// exclusive times move apart, checked against the trace of every call.
/// Each round is f0's own work before and after its call of f1, and f1's;
/// each change by a factor of two or more, whatever a round of f0's costs
/// against one of f1's.
#[test]
fn minima_and_maxima_are_each_their_calls_own() {
    // The third call's exclusive time is a new minimum, and no time of it
    // a new maximum, nor its inclusive time a new minimum; the fourth's
    // inclusive time is a new maximum, and no time of it a new minimum,
    // nor its exclusive time a new maximum.
    calls_extremes_against_their_trace(&[(5, 1, 5), (20, 1, 20), (1, 20, 1), (10, 80, 10)]);
    // Only the inclusive minimum moves at the third call.
    calls_extremes_against_their_trace(&[(50, 1, 50), (5, 20, 5), (6, 1, 6)]);
    // Only the exclusive maximum moves at the third call.
    calls_extremes_against_their_trace(&[(2, 2, 2), (1, 80, 1), (30, 1, 30)]);
}

/// Calls ended as a longjmp left them (on the runtime's full path) have
/// their minima and maxima too: f1 called again and again from one slot
/// whose return address a longjmp put back, each call ending the last.
#[test]
fn calls_a_longjmp_left_have_their_minima_and_maxima() {
    let rt = Local::with(Geometry { functions: 2, blocks: 1, trace_slots: 8, regions: 0 }, [0; 32]);
    let mut stack = Stack::new();
    let spin = |rounds: u64| (0..rounds * 20_000).fold(0u64, |a, i| std::hint::black_box(a ^ i));
    let rounds = [4, 1, 16, 2];
    for round in rounds {
        stack.0[50] = 0x1000 + 50;
        rt.entry(&mut stack.0[50], 1);
        spin(round);
    }
    rt.exit(&mut stack.0[50]);
    let ring = rt.geometry.block(0) + rt.geometry.trace_offset();
    // SAFETY: the ring's slots, in bounds of the shared mapping.
    let traced = unsafe { std::slice::from_raw_parts(rt.shared.add(ring as usize).cast::<Traced>(), rounds.len()).to_vec() };
    let times: Vec<u64> = traced.iter().map(|t| t.exit_tsc - t.entry_tsc).collect();
    let node = rt.nodes(0)[1];
    assert_eq!((node.calls, node.unwound), (4, 3));
    let extremes = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    assert_eq!((node.incl_wall.min, node.incl_wall.max), extremes, "{times:?}");
    assert_eq!((node.excl_cpu.min, node.excl_cpu.max), extremes, "{times:?}");
}

/// f0 calling f1 in `rounds` (see minima_and_maxima_are_each_their_calls_own):
/// their nodes' minima, maxima and totals are those of their calls' times
/// in the trace.
fn calls_extremes_against_their_trace(rounds: &[(u64, u64, u64)]) {
    let calls = rounds.len();
    let rt = Local::with(Geometry { functions: 2, blocks: 1, trace_slots: 16, regions: 0 }, [0; 32]);
    let mut stack = Stack::new();
    let spin = |rounds: u64| (0..rounds * 20_000).fold(0u64, |a, i| std::hint::black_box(a ^ i));
    for &(before, callee, after) in rounds {
        rt.entry(&mut stack.0[60], 0);
        spin(before);
        rt.entry(&mut stack.0[50], 1);
        spin(callee);
        rt.exit(&mut stack.0[50]);
        spin(after);
        rt.exit(&mut stack.0[60]);
    }
    let ring = rt.geometry.block(0) + rt.geometry.trace_offset();
    // SAFETY: the ring's slots, in bounds of the shared mapping.
    let traced = unsafe { std::slice::from_raw_parts(rt.shared.add(ring as usize).cast::<Traced>(), 2 * calls).to_vec() };
    // In the order they returned: f1's call, then f0's.
    let (mut inner, mut outer_incl, mut outer_excl) = (Vec::new(), Vec::new(), Vec::new());
    for pair in traced.chunks_exact(2) {
        let (callee, caller) = (&pair[0], &pair[1]);
        assert_eq!((callee.function, caller.function), (1, 0));
        inner.push(callee.exit_tsc - callee.entry_tsc);
        outer_incl.push(caller.exit_tsc - caller.entry_tsc);
        outer_excl.push((caller.exit_tsc - caller.entry_tsc) - (callee.exit_tsc - callee.entry_tsc));
    }
    let extremes = |times: &[u64]| (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    let nodes = rt.nodes(0);
    let (f0, f1) = (&nodes[1], &nodes[2]);
    assert_eq!((f0.incl_wall.min, f0.incl_wall.max), extremes(&outer_incl), "{rounds:?}");
    assert_eq!((f0.excl_wall.min, f0.excl_wall.max), extremes(&outer_excl), "{rounds:?}");
    assert_eq!((f1.incl_wall.min, f1.incl_wall.max), extremes(&inner), "{rounds:?}");
    assert_eq!((f1.excl_wall.min, f1.excl_wall.max), extremes(&inner), "{rounds:?}");
    // No off-CPU map: CPU time is wall time.
    assert_eq!((f0.incl_cpu, f0.excl_cpu), (f0.incl_wall, f0.excl_wall));
    assert_eq!(f0.incl_wall.total, outer_incl.iter().sum::<u64>());
}

/// Each return site keeps its trampoline: a frame on a sampled stack is
/// named from it after its call ended and another took its depth; past
/// the table's room, returns go through the shared trampoline.
#[test]
fn return_sites_keep_their_trampolines_and_the_table_names_them() {
    let rt = Local::new(1, 1);
    let trampolines = rt.runtime.trampolines;
    let hijacked = |ret: u64| {
        let mut slot = ret;
        rt.entry(&mut slot, 0);
        let trampoline = slot;
        rt.exit(&mut slot);
        assert_eq!(slot, ret, "the return address is back");
        trampoline
    };
    let first = hijacked(0x40_1000);
    assert_eq!(hijacked(0x40_1000), first, "the same site, the same trampoline");
    let other = hijacked(0x40_2000);
    assert_ne!(other, first);
    assert_eq!(rt.site(trampolines.site(first).unwrap()), 0x40_1000);
    assert_eq!(rt.site(trampolines.site(other).unwrap()), 0x40_2000);
    let (mut own, mut shared) = (0, 0);
    let sites = trampolines.count;
    assert_eq!(sites, sites_for(1), "a process of one function has the fewest");
    for i in 0..sites + 1000 {
        let ret = 0x50_0000 + 16 * i;
        let trampoline = hijacked(ret);
        match trampolines.site(trampoline) {
            Some(site) => {
                assert_eq!(rt.site(site), ret);
                own += 1;
            }
            None => {
                assert_eq!(trampoline, trampolines.shared);
                shared += 1;
            }
        }
    }
    assert!(
        own > sites * 3 / 4 && own <= sites && shared >= 1000,
        "{own} sites with their own trampoline, {shared} through the shared one"
    );
}

/// A process's table of return sites is sized to its functions, within
/// bounds: a forked child copies the pages of it in use. Every copy of the
/// runtime in a process uses the first one's table, and says its size to
/// the runtime.
#[test]
fn the_site_table_is_sized_to_the_functions_and_every_copy_uses_the_first() {
    assert_eq!((sites_for(0), sites_for(246), sites_for(1000), sites_for(100_000)), (1 << 12, 1 << 12, 1 << 13, SITES));
    let site_bits = |rt: &Runtime| {
        let at = symbols::PROFTAP_CONFIG as usize + std::mem::offset_of!(Config, site_bits);
        u64::from_ne_bytes(rt.code[at..at + 8].try_into().unwrap())
    };
    let first = assemble(0x40_0000, &Config { functions: 1000, ..Config::default() }, None).unwrap();
    assert_eq!((first.trampolines.count, site_bits(&first)), (8192, 13));
    // The code holds as many site trampolines, the region's right after.
    assert_eq!(
        first.region_trampoline.next_multiple_of(16),
        (first.trampolines.sites - CALL_BEFORE_TRAMPOLINE + 8192 * SITE_BYTES).next_multiple_of(16)
    );
    let config = Config { functions: 5000, ..Config::default() };
    let second = assemble(0x80_0000, &config, Some(first.trampolines)).unwrap();
    assert_eq!((second.trampolines, site_bits(&second)), (first.trampolines, 13));
    // Each copy fits the room set aside for it, a later one's without site trampolines.
    assert!(first.code.len() <= code_room(&Config { functions: 1000, ..Config::default() }, None));
    assert!(second.code.len() <= code_room(&config, Some(first.trampolines)));
    assert!(code_room(&config, Some(first.trampolines)) < (SITE_BYTES * 1024) as usize + IMAGE.len());
}

/// A tail call's frame shares its caller's slot: an unwinder's unhook and
/// a catch's rehook put the caller's trampoline back there, and the table
/// only ever holds the program's return addresses (not a trampoline's, not
/// the 0 of a made-up outermost frame).
#[test]
fn a_tail_call_survives_unhook_and_rehook_and_the_table_holds_only_return_addresses() {
    let rt = Local::new(3, 1);
    let trampolines = rt.runtime.trampolines;
    let mut stack = Stack::new();
    let call = rt.entry(&mut stack.0[60], 0);
    let hijacked = stack.0[60];
    assert_eq!(call, hijacked - CALL_BEFORE_TRAMPOLINE, "a timed call is made through the call before its trampoline");
    let tail = rt.entry(&mut stack.0[60], 1);
    assert_eq!((tail, stack.0[60]), (call, hijacked), "a tail call is made through its caller's trampoline, which stays");
    // The tail-called function calls backtrace(): from a deeper slot, the
    // frames above get their return addresses back, then are hijacked again.
    rt.hook(rt.runtime.unhook, &mut stack.0[40]);
    assert_eq!(stack.0[60], 0x1000 + 60);
    rt.hook(rt.runtime.rehook, &mut stack.0[40]);
    assert_eq!(stack.0[60], hijacked);
    let mut outermost = 0u64;
    rt.entry(&mut outermost, 2);
    assert_eq!(outermost, trampolines.shared, "a return address of 0 takes no site");
    rt.exit(&mut outermost);
    for i in 0..SITES {
        let ret = rt.site(i);
        assert!(ret == 0 || ret == 0x1000 + 60, "site {i} stands for {ret:#x}");
    }
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], hijacked, "the tail call returns through its caller's trampoline");
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60);
}

/// glibc's link to the unwinder: taken where pthread_cancel checks that
/// the unwinder can be had (the link returns into the canceller's code),
/// the thread's frames keep their trampolines; taken anywhere else (a
/// cancelled thread about to unwind), they get their return addresses
/// back, as at an unwinder's entry.
#[test]
fn the_link_to_the_unwinder_unhooks_but_where_pthread_cancel_takes_it() {
    let geometry = Geometry { functions: 2, blocks: 1, trace_slots: 0, regions: 2 };
    // A slot's return address is 0x1000 and its index: the one at slot 40
    // is the canceller's last byte.
    let shared = map(geometry.shared_bytes() as usize);
    let rt = Local::with_canceller(geometry, ([0; 32], SocketPath::default()), shared, 0x1000 + 39..0x1000 + 41);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    let hijacked = (stack.0[60], stack.0[50]);
    rt.hook(rt.runtime.unwinder_link, &mut stack.0[40]);
    assert_eq!((stack.0[60], stack.0[50]), hijacked, "the thread that cancels goes on, its returns timed");
    rt.hook(rt.runtime.unwinder_link, &mut stack.0[41]);
    assert_eq!((stack.0[60], stack.0[50]), (0x1000 + 60, 0x1000 + 50), "past the canceller's code: unhooked");
    // The unwinder's own calls of the link (for each frame it passes)
    // change nothing more; the thread's end finds its frames unfinished.
    rt.hook(rt.runtime.unwinder_link, &mut stack.0[30]);
    assert_eq!((stack.0[60], stack.0[50]), (0x1000 + 60, 0x1000 + 50));
    assert_eq!(rt.block(0).depth, 2);
}

#[test]
fn calls_the_unwinder_makes_as_it_walks_leave_its_frames_alone() {
    let rt = Local::new(3, 1);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    // A throw: the unwinder, entered at slot 45, puts the return addresses
    // back and calls the personality routine (patched) from deeper slots.
    rt.hook(rt.runtime.unhook, &mut stack.0[45]);
    assert_eq!((stack.0[60], stack.0[50]), (0x1000 + 60, 0x1000 + 50));
    rt.entry(&mut stack.0[40], 2);
    assert_eq!(stack.0[40], 0x1000 + 40, "its own return is left alone");
    assert_eq!((stack.0[60], stack.0[50]), (0x1000 + 60, 0x1000 + 50), "the walked frames are left alone");
    // The catch in the first frame: the frame the throw left is gone.
    rt.hook(rt.runtime.rehook, &mut stack.0[55]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60);
    let block = rt.block(0);
    assert_eq!((block.depth, block.untimed), (0, 1));
    assert_eq!(rt.entries(0), [1, 1, 1], "every call is counted");
    let unwound: u64 = rt.nodes(0).iter().map(|n| n.unwound).sum();
    assert_eq!(unwound, 1);
}

/// A throw caught in the frame that made the call it left: the catch's
/// own call (to `__cxa_begin_catch`) is at the slot of the call that
/// threw, which is over then, not at the next timed call from that slot
/// (none may come: its callees' probes removed, main's loop took the rest
/// of the run as that call's).
#[test]
fn a_catch_at_the_slot_of_the_call_that_threw_ends_that_call() {
    let rt = Local::new(3, 1);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    rt.entry(&mut stack.0[40], 2);
    rt.hook(rt.runtime.unhook, &mut stack.0[30]);
    // The landing pad in f0 calls the catch from slot 50, as f0 called f1.
    stack.0[50] = 0x2000 + 50;
    rt.hook(rt.runtime.rehook, &mut stack.0[50]);
    assert_eq!(stack.0[50], 0x2000 + 50, "the catch returns where it was called from");
    assert_ne!(stack.0[60], 0x1000 + 60, "f0's return goes through its trampoline again");
    let block = rt.block(0);
    assert_eq!(block.depth, 1, "only f0's call is left");
    let unwound: u64 = rt.nodes(0).iter().map(|n| n.unwound).sum();
    assert_eq!(unwound, 2);
    rt.exit(&mut stack.0[60]);
    assert_eq!((stack.0[60], rt.block(0).depth), (0x1000 + 60, 0));
}

/// A function that tail-calls a stack walk (`return backtrace(b, n);`)
/// keeps its frame: the walk reads its return address, not its
/// trampoline, which goes back when the walk returns, so that its call
/// ends as a return.
#[test]
fn a_tail_call_into_a_stack_walk_keeps_its_frame_and_the_walk_reads_its_return_address() {
    let rt = Local::new(3, 1);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    let hijacked = (stack.0[60], stack.0[50]);
    // f1 jumps to backtrace(), whose entry finds f1's trampoline in its slot.
    rt.hook(rt.runtime.unhook, &mut stack.0[50]);
    assert_eq!((stack.0[60], stack.0[50]), (0x1000 + 60, 0x1000 + 50), "the walk reads the return addresses");
    rt.hook(rt.runtime.resume, &mut stack.0[50]);
    assert_eq!((stack.0[60], stack.0[50]), hijacked, "hijacked again as the walk returns");
    rt.exit(&mut stack.0[50]);
    assert_eq!((stack.0[50], rt.block(0).depth), (0x1000 + 50, 1), "f1's call returns through its trampoline");
    rt.exit(&mut stack.0[60]);
    assert_eq!(rt.block(0).depth, 0);
    let unwound: u64 = rt.nodes(0).iter().map(|n| n.unwound).sum();
    assert_eq!(unwound, 0, "no call was cut short");
}

/// A signal handler that walks the stack while an exception unwinds (its
/// walk's hooks nested in the unwinder's), run by `run_handler`: its call
/// is not hijacked, the frames stay given back when its walk returns, for
/// the unwinder that goes on after the handler; the catch hijacks them
/// again.
fn a_handler_interrupts_an_unwinder(run_handler: impl FnOnce(&mut dyn FnMut())) {
    let rt = Local::new(3, 3);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    let hijacked = stack.0[60];
    // f1 throws: the unwinder is entered from slot 40.
    rt.hook(rt.runtime.unhook, &mut stack.0[40]);
    let given_back = (0x1000 + 60, 0x1000 + 50);
    assert_eq!((stack.0[60], stack.0[50]), given_back);
    // A handler interrupts it, calls f2 and walks the stack, from slots of
    // the stack it runs on.
    // Nothing panics in the handler (a panic cannot leave a C handler): what
    // its call returned is looked at after.
    let mut called_through = None;
    run_handler(&mut || {
        let mut slots = [0x2000u64; 4];
        called_through = Some(rt.entry(&mut slots[3], 2));
        rt.hook(rt.runtime.unhook, &mut slots[2]);
        rt.hook(rt.runtime.resume, &mut slots[2]);
    });
    assert_eq!(called_through, Some(0), "the handler ran, and its call while the unwinder runs is not hijacked");
    assert_eq!((stack.0[60], stack.0[50]), given_back, "the unwinder goes on with the return addresses");
    // f0 catches at the slot it called f1 from.
    rt.hook(rt.runtime.rehook, &mut stack.0[50]);
    assert_eq!(stack.0[60], hijacked, "hijacked again at the catch");
    rt.exit(&mut stack.0[60]);
    let block = rt.block(0);
    assert_eq!(block.depth, 0);
    let nodes = rt.nodes(0);
    let unwound: u64 = nodes.iter().map(|n| n.unwound).sum();
    assert_eq!(unwound, 1, "f1's call ended at the catch: {nodes:?}");
}

/// The handler on the thread's stack, below the unwinder's frames.
#[test]
fn a_walk_in_a_handler_that_interrupted_an_unwinder_leaves_its_frames_given_back() {
    a_handler_interrupts_an_unwinder(|handler| handler());
}

/// Runs `f` in a signal handler on an alternate signal stack of the
/// calling thread, as a profiler's handler runs, then puts the thread's
/// alternate stack and the signal's action back.
fn on_alternate_stack(f: &mut dyn FnMut()) {
    thread_local! {
        static HANDLED: std::cell::Cell<Option<*mut (dyn FnMut() + 'static)>> = const { std::cell::Cell::new(None) };
    }
    extern "C" fn handler(_: libc::c_int) {
        if let Some(f) = HANDLED.with(|h| h.take()) {
            // SAFETY: set below to a closure that outlives the raise, on this thread.
            unsafe { (*f)() };
        }
    }
    let signal = libc::SIGRTMIN() + 7;
    // 64 KiB at the end of a 32 MiB reservation farther from this thread's
    // stack: 16 MiB or more from it wherever the reservation lands.
    let (reserved, size) = (32usize << 20, 64usize << 10);
    let here = &reserved as *const _ as u64;
    let base = map(reserved);
    let (low, high) = (base as u64, base as u64 + (reserved - size) as u64);
    let stack_at = if here.abs_diff(low) > here.abs_diff(high) { low } else { high };
    assert!(stack_at.abs_diff(here) > 8 << 20, "the alternate stack lies far from the thread's");
    // SAFETY: plain C calls on zeroed structs and a stack that outlives them.
    unsafe {
        let stack = libc::stack_t { ss_sp: stack_at as *mut libc::c_void, ss_flags: 0, ss_size: size };
        let mut old_stack: libc::stack_t = std::mem::zeroed();
        assert_eq!(libc::sigaltstack(&stack, &mut old_stack), 0);
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        action.sa_flags = libc::SA_ONSTACK;
        let mut old_action: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(signal, &action, &mut old_action), 0);
        let f: *mut (dyn FnMut() + '_) = f;
        HANDLED.with(|h| h.set(Some(std::mem::transmute::<*mut (dyn FnMut() + '_), *mut (dyn FnMut() + 'static)>(f))));
        assert_eq!(libc::raise(signal), 0);
        HANDLED.with(|h| h.set(None));
        libc::sigaction(signal, &old_action, std::ptr::null_mut());
        libc::sigaltstack(&old_stack, std::ptr::null_mut());
        libc::munmap(base.cast(), reserved);
    }
}

/// The handler on an alternate signal stack far from the thread's.
#[test]
fn a_walk_in_a_handler_on_an_alternate_stack_that_interrupted_an_unwinder_leaves_its_frames_given_back() {
    a_handler_interrupts_an_unwinder(on_alternate_stack);
}

/// Rust's catch ends a panic in a function the catching frame calls
/// (`__rust_panic_cleanup`), which may lie below the frame whose cleanup
/// last resumed the unwinding: still the unwinder's end, the frames above
/// are hijacked again.
#[test]
fn a_catch_below_where_the_unwinding_last_resumed_ends_it() {
    let rt = Local::new(2, 2);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    let hijacked = stack.0[60];
    rt.hook(rt.runtime.unhook, &mut stack.0[40]);
    // A cleanup resumes the unwinding from slot 45, then the catch's cleanup call comes from 43.
    rt.hook(rt.runtime.unhook, &mut stack.0[45]);
    assert_eq!(stack.0[60], 0x1000 + 60);
    rt.hook(rt.runtime.rehook, &mut stack.0[43]);
    assert_eq!(stack.0[60], hijacked, "hijacked again at the catch");
    assert_ne!(rt.entry(&mut stack.0[43], 1), 0, "the calls after it are timed");
}

#[test]
fn frames_a_longjmp_skipped_end_as_unwound_and_a_tail_call_lives_on() {
    let rt = Local::new(3, 4);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    rt.entry(&mut stack.0[40], 2);
    // A longjmp back into f0's frame, which then calls f1 from slot 55:
    // the frames at 50 and 40 are gone.
    rt.entry(&mut stack.0[55], 1);
    rt.exit(&mut stack.0[55]);
    // A tail call from f0 reuses its slot, still holding the trampoline:
    // its return goes through the trampoline twice, once per frame.
    let hijacked = stack.0[60];
    rt.entry(&mut stack.0[60], 2);
    assert_eq!(stack.0[60], hijacked, "the tail call leaves its caller's trampoline");
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], hijacked);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60);
    let block = rt.block(0);
    assert_eq!(block.depth, 0);
    let nodes = rt.nodes(0);
    let unwound: u64 = nodes.iter().map(|n| n.unwound).sum();
    assert_eq!(unwound, 2, "{nodes:?}");
    let calls: u64 = nodes.iter().map(|n| n.calls).sum();
    assert_eq!(calls, 5);
    // The tail call is f0's child.
    assert!(nodes.iter().any(|n| n.function == 2 && n.parent == 1 && n.calls == 1), "{nodes:?}");
}

/// `value` as glibc keeps a pointer in a jmp_buf (PTR_MANGLE): xored
/// with this thread's pointer guard, then rotated left 17 bits.
fn pointer_mangled(value: u64) -> u64 {
    let guard: u64;
    // SAFETY: glibc's thread control block, which fs points at, keeps the
    // pointer guard at 0x30; reading it changes nothing.
    unsafe { std::arch::asm!("mov {}, fs:[0x30]", out(reg) guard, options(nostack, readonly, preserves_flags)) };
    (value ^ guard).rotate_left(17)
}

#[test]
fn a_longjmp_ends_the_frames_it_leaves_as_it_starts() {
    let rt = Local::new(3, 4);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 1);
    rt.entry(&mut stack.0[40], 2);
    // f2 calls longjmp (its slot 30, the jmp_buf its first argument, kept
    // below the slot) back to f0's frame, whose stack pointer is slot 55.
    // Read by the runtime through the address it is given.
    let jmp_buf: [std::cell::Cell<u64>; 8] = Default::default();
    jmp_buf[6].set(pointer_mangled(&stack.0[55] as *const u64 as u64));
    stack.0[30 - HOOK_FIRST_ARGUMENT] = jmp_buf.as_ptr() as u64;
    rt.hook(rt.runtime.jump, &mut stack.0[30]);
    assert_eq!(rt.block(0).depth, 1, "the frames at 50 and 40 end at the jump");
    let nodes = rt.nodes(0);
    assert_eq!(nodes.iter().map(|n| (n.function, n.calls, n.unwound)).filter(|n| n.1 > 0).collect::<Vec<_>>(), [(1, 1, 1), (2, 1, 1)]);
    // A jump to another stack, or a buffer not glibc's, ends nothing. (f0
    // calls f1 again: the call puts its return address in the slot.)
    stack.0[50] = 0x1000 + 50;
    rt.entry(&mut stack.0[50], 1);
    for to in [&stack.0[55] as *const u64 as u64 + (64 << 20), &stack.0[20] as *const u64 as u64] {
        jmp_buf[6].set(pointer_mangled(to));
        rt.hook(rt.runtime.jump, &mut stack.0[30]);
        assert_eq!(rt.block(0).depth, 2, "{to:#x}");
    }
    jmp_buf[6].set(&stack.0[55] as *const u64 as u64);
    rt.hook(rt.runtime.jump, &mut stack.0[30]);
    assert_eq!(rt.block(0).depth, 2, "a stack pointer not mangled");
    rt.exit(&mut stack.0[50]);
    rt.exit(&mut stack.0[60]);
    assert_eq!((stack.0[50], stack.0[60]), (0x1000 + 50, 0x1000 + 60));
}

#[test]
fn a_return_whose_frame_is_gone_goes_back_to_its_call_site() {
    let rt = Local::new(2, 4);
    let mut stack = Stack::new();
    // A coroutine's call at slot 40 switches to another coroutine whose
    // stack lies just above; its call at slot 50 looks like the first
    // frame's caller after a longjmp, and the first frame ends unwound.
    rt.entry(&mut stack.0[40], 0);
    rt.entry(&mut stack.0[50], 1);
    rt.exit(&mut stack.0[50]);
    assert_eq!(stack.0[50], 0x1000 + 50);
    // Back on the first coroutine, the call at slot 40 returns: no frame
    // of the thread's is its, and its site's trampoline names its return.
    rt.exit(&mut stack.0[40]);
    assert_eq!(stack.0[40], 0x1000 + 40, "back at its call site");
    let block = rt.block(0);
    assert_eq!((block.depth, block.unpaired), (0, 1));
    assert_eq!(rt.entries(0), [1, 1], "every call is counted");
}

/// A process's private blocks are writable as its threads take them, not
/// before: where the kernel counts every writable page a process may use
/// (vm.overcommit_memory 2), the 20 GiB of all of them would not map.
#[test]
fn private_blocks_become_writable_as_threads_take_them() {
    let rt = std::sync::Arc::new(Local::new(1, 8));
    let block = |index: u64| rt.private as u64 + Geometry::private_block(index);
    assert_eq!(rights_at(block(0)), "---p");
    // Each thread stays until both have called: a thread made after one
    // ended may have its thread pointer, and so its block.
    let done = std::sync::Arc::new(std::sync::Barrier::new(3));
    let mut threads = Vec::new();
    for taken in 1..=2u64 {
        let (caller, done) = (rt.clone(), done.clone());
        let (called, call) = std::sync::mpsc::channel();
        threads.push(std::thread::spawn(move || {
            let mut stack = Stack::new();
            caller.entry(&mut stack.0[60], 0);
            caller.exit(&mut stack.0[60]);
            called.send(()).expect("told");
            done.wait();
        }));
        call.recv().expect("called");
        assert_eq!(rt.header().blocks_taken, taken);
        assert_eq!(rights_at(block(taken - 1)), "rw-p");
        // The block's last page too, and not the next block's first past it.
        assert_eq!(rights_at(block(taken) - 1), "rw-p");
        assert_eq!(rights_at(block(taken) + 4096), "---p");
    }
    done.wait();
    threads.into_iter().for_each(|t| t.join().expect("thread"));
    assert_eq!(rt.entries(1)[0], 1);
}

#[test]
fn each_thread_has_its_own_block() {
    let rt = std::sync::Arc::new(Local::new(1, 8));
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let mut stack = Stack::new();
                for _ in 0..=i {
                    rt.entry(&mut stack.0[60], 0);
                    rt.exit(&mut stack.0[60]);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().expect("thread"));
    assert_eq!(rt.header().blocks_taken, 3);
    let mut calls: Vec<u64> = (0..3).map(|b| rt.entries(b)[0]).collect();
    calls.sort();
    assert_eq!(calls, [1, 2, 3]);
}

#[test]
fn a_forked_child_not_followed_runs_unrecorded_and_returns_right() {
    let mut rt = Local::new(1, 4);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    // In a forked child the live word reads 0: with no socket to hand its
    // memory to, frames hijacked before the fork still return; new calls
    // are neither hijacked nor counted.
    *rt.live = [0, 0];
    rt.entry(&mut stack.0[50], 0);
    assert_eq!(rt.live[0], LIVE_STOPPED);
    assert_eq!(stack.0[50], 0x1000 + 50);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60);
    assert_eq!(rt.entries(0), [1]);
    assert_eq!(rt.nodes(0)[1].calls, 0, "its frame ended where nothing is recorded");
}

/// A runtime of one function and four blocks whose forked children hand
/// their memory to a listener, and a stack for its calls.
fn ready_to_fork() -> (Geometry, Children, Local, Stack) {
    let geometry = Geometry { functions: 1, blocks: 4, regions: 2, ..Geometry::default() };
    let shared = map(geometry.shared_bytes() as usize);
    // SAFETY: getuid has no preconditions.
    let children = Children::listen(unsafe { libc::getuid() }, geometry, shared as u64).expect("a socket");
    let rt = Local::with_shared(geometry, (children.name(), children.path()), shared);
    (geometry, children, rt, Stack::new())
}

/// A forked child that cannot reach proftap's socket (in network and mount
/// namespaces of its own: here, a name and a path no one listens at) is
/// counted in its parent's memory, then runs unrecorded on memory of its
/// own (nothing of its parent's mapped in it), its frames from before the
/// fork returning where they came from, through their site's trampoline
/// or the shared one; one that reaches the socket's path as proftap stops
/// taking children is not followed, and not counted.
#[test]
fn a_forked_child_that_cannot_reach_proftap_is_counted_in_its_parents_memory() {
    let geometry = Geometry { functions: 1, blocks: 4, regions: 2, ..Geometry::default() };
    let mut nowhere = SocketPath::default();
    let path = b"/proc/self/no-such-socket";
    nowhere.0[..path.len()].copy_from_slice(path);
    let unreached = std::mem::offset_of!(Header, children_unreached);
    let read = |memory: *const u8| {
        // SAFETY: the header's word, in a memory laid out as `geometry` says.
        unsafe { *memory.add(unreached).cast::<u64>() }
    };
    for refused in [false, true] {
        let (shared, parents) = parent_memory(geometry);
        // SAFETY: getuid has no preconditions.
        let mut children = Children::listen(unsafe { libc::getuid() }, geometry, shared as u64).expect("a socket");
        let socket = if refused {
            children.stop();
            (children.name(), children.path())
        } else {
            (*b"proftap-no-one-listens-at-this-0", nowhere)
        };
        let mut rt = Local::with_shared(geometry, socket, shared);
        let mut stack = Stack::new();
        // A stack's outermost frame (its return address 0) returns through
        // the shared trampoline, the next through its site's.
        stack.0[62] = 0;
        rt.entry(&mut stack.0[62], 0);
        rt.entry(&mut stack.0[60], 0);
        assert!(stack.0[62] != 0 && stack.0[60] != 0x1000 + 60, "both hijacked");
        *rt.live = [0, 0];
        rt.entry(&mut stack.0[50], 0);
        assert_eq!(rt.live[0], LIVE_STOPPED);
        assert_eq!(stack.0[50], 0x1000 + 50, "its new calls are not hijacked");
        rt.exit(&mut stack.0[60]);
        rt.exit(&mut stack.0[62]);
        assert_eq!((stack.0[60], stack.0[62]), (0x1000 + 60, 0), "its frames from before the fork return where they came from");
        assert_eq!(read(parents), u64::from(!refused), "counted in its parent's memory unless refused (refused: {refused})");
        assert_eq!(read(rt.shared), 0, "and runs on its own");
        unmap(parents, geometry);
    }
}

#[test]
fn a_forked_child_records_in_memory_of_its_own_that_it_hands_over() {
    let (geometry, mut children, mut rt, mut stack) = ready_to_fork();
    rt.entry(&mut stack.0[60], 0);
    rt.entry(&mut stack.0[50], 0);
    rt.exit(&mut stack.0[50]);
    let parent = rt.shared;
    // SAFETY: the parent's block, as it was before the fork.
    let parents_calls = unsafe { *parent.add((geometry.block(0) + geometry.entries_offset()) as usize).cast::<u64>() };
    assert_eq!(parents_calls, 2);
    let sites = |rt: &Local| (0..SITES).map(|i| (i, rt.site(i))).filter(|&(_, ret)| ret != 0).collect::<Vec<_>>();
    let parents_sites = sites(&rt);
    assert_eq!(parents_sites.len(), 2, "{parents_sites:x?}");

    // As the child sees it after a fork: its live word zeroed.
    *rt.live = [0, 0];
    rt.entry(&mut stack.0[40], 0);
    assert_eq!(rt.live[0], LIVE_RECORDING, "the child reached proftap");
    // Its memory holds the sites its parent's frames stand for, and its own.
    let childs_sites = sites(&rt);
    assert!(parents_sites.iter().all(|s| childs_sites.contains(s)), "{parents_sites:x?} in {childs_sites:x?}");
    assert_eq!(childs_sites.len(), 3, "{childs_sites:x?}");
    // Each marked taken too, for a child it forks to copy in turn.
    assert!(childs_sites.iter().all(|&(i, _)| rt.site_taken(i)), "{childs_sites:x?}");
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60, "the frame from before the fork returns where it came from");
    assert_eq!(rt.entries(0), [1], "only the child's call counts in its memory");
    let nodes = rt.nodes(0);
    assert_eq!((nodes[1].function, nodes[1].calls), (0, 1), "the call in progress at the fork ends in the child");
    assert_eq!((nodes[2].parent, nodes[2].calls), (1, 1), "the child's call, under it");

    children.stop();
    let (views, refused) = children.views(0, geometry, rt.shared as u64);
    assert_eq!(refused, 0);
    let [child] = <[_; 1]>::try_from(views).ok().expect("one child");
    assert_eq!(child.pid, std::process::id() as i32);
    let totals = child.totals().expect("its totals");
    assert_eq!(totals.threads.len(), 1);
    assert_eq!(totals.threads[0].calls, [1]);
    assert_eq!(totals.threads[0].nodes[1..], nodes[1..]);
}

/// A forked child carries its forking thread's block over as its first,
/// which the parent may never have made writable (its thread's block was
/// refused while memory was short): the child makes it writable before it
/// moves the thread's frames there, and records in it.
#[test]
fn a_forked_child_makes_its_first_block_writable_before_it_moves_there() {
    let (_geometry, mut children, mut rt, mut stack) = ready_to_fork();
    // Another thread takes block 0; this one takes block 1.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut stack = Stack::new();
            rt.entry(&mut stack.0[60], 0);
            rt.exit(&mut stack.0[60]);
        });
    });
    rt.entry(&mut stack.0[60], 0);
    assert_eq!(rt.header().blocks_taken, 2);
    // Block 0 as the kernel would have left it refused: its own pages not
    // writable, its bit clear.
    let (block0, block1) = (rt.private as u64 + Geometry::private_block(0), rt.private as u64 + Geometry::private_block(1));
    let bits = rt.private as u64 + Geometry::OFF_CPU_PAGES + 2 * OFF_CPU_PAGE_WORDS * 8;
    // SAFETY: pages of the private memory this test mapped, none in use; a word of its head.
    unsafe {
        assert_eq!(libc::mprotect(block0 as *mut libc::c_void, ((block1 & !4095) - block0) as usize, libc::PROT_NONE), 0);
        *(bits as *mut u64) &= !1;
    }
    assert_eq!(rights_at(block0), "---p");

    // As the child sees it after a fork: its live word zeroed.
    *rt.live = [0, 0];
    rt.entry(&mut stack.0[40], 0);
    assert_eq!(rt.live[0], LIVE_RECORDING, "the child reached proftap");
    assert_eq!(rights_at(block0), "rw-p");
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60, "the frame from before the fork returns where it came from");
    assert_eq!(rt.entries(0), [1], "the child's call counts in its first block");
    children.stop();
}

/// Once a forked child has memory of its own, nothing of its parent's is
/// mapped in it: its calls and the return sites it takes go to its own,
/// and the parent's (seen here through a second mapping, as proftap sees
/// it) stays as the fork left it. A child that dropped its rights can
/// then neither change the parent's counts nor where its returns go.
#[test]
fn a_forked_child_with_memory_of_its_own_cannot_write_its_parents() {
    let geometry = Geometry { functions: 1, blocks: 4, regions: 2, ..Geometry::default() };
    let bytes = geometry.shared_bytes() as usize;
    let (shared, parents) = parent_memory(geometry);
    // SAFETY: getuid has no preconditions.
    let mut children = Children::listen(unsafe { libc::getuid() }, geometry, shared as u64).expect("a socket");
    let mut rt = Local::with_shared(geometry, (children.name(), children.path()), shared);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    // SAFETY: the parent's whole memory, in proftap's view of it.
    let parents = unsafe { std::slice::from_raw_parts(parents, bytes) };
    let before = parents.to_vec();

    // As the child sees it after a fork: its live word zeroed.
    *rt.live = [0, 0];
    rt.entry(&mut stack.0[40], 0);
    assert_eq!(rt.live[0], LIVE_RECORDING, "the child reached proftap");
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(rt.entries(0), [1], "the child's call counted in its own memory");
    let site = |memory: &[u8], i: u64| u64::from_ne_bytes(memory[(Geometry::SITES + 8 * i) as usize..][..8].try_into().unwrap());
    let taken = |memory: &[u8]| (0..SITES).filter(|&i| site(memory, i) != 0).count();
    // SAFETY: the child's memory, mapped where the parent's was.
    let childs = unsafe { std::slice::from_raw_parts(rt.shared, bytes) };
    assert_eq!((taken(&before), taken(childs)), (1, 2), "the child's table: the parent's site and its own");
    let changed = parents.iter().zip(&before).position(|(now, then)| now != then);
    assert_eq!(changed, None, "the parent's memory is as the fork left it");
    children.stop();
    unmap(parents.as_ptr().cast_mut(), geometry);
}

/// A forked child whose parent's thread returned from its calls and ended
/// before the child's first call, its block retired by proftap meanwhile:
/// the child still has the frames the fork left it, and keeps them.
#[test]
fn a_forked_child_keeps_its_frames_when_the_parents_block_was_retired_since() {
    let (geometry, mut children, mut rt, mut stack) = ready_to_fork();
    rt.entry(&mut stack.0[60], 0);
    // As the child sees it after a fork, the parent's block retired since.
    // SAFETY: the first word of block 0, its state.
    unsafe { *rt.shared.add(geometry.block(0) as usize).cast::<u64>() = BLOCK_RETIRED };
    *rt.live = [0, 0];
    rt.entry(&mut stack.0[40], 0);
    assert_eq!(rt.live[0], LIVE_RECORDING, "the child reached proftap");
    rt.exit(&mut stack.0[40]);
    rt.exit(&mut stack.0[60]);
    assert_eq!(stack.0[60], 0x1000 + 60, "the frame from before the fork returns where it came from");
    assert_eq!(rt.block(0).unpaired, 0);
    let nodes = rt.nodes(0);
    assert_eq!((nodes[1].function, nodes[1].calls), (0, 1), "the call in progress at the fork ends in the child");
    assert_eq!((nodes[2].parent, nodes[2].calls), (1, 1), "the child's call, under it");
    children.stop();
}

// SAFETY: the mapped memory is used by one test at a time through these pointers.
unsafe impl Send for Local {}
// SAFETY: the runtime is made for concurrent threads.
unsafe impl Sync for Local {}

#[test]
#[ignore = "a measurement, not a check: cargo test -p proftap-probes --release -- --ignored --nocapture per_call"]
fn per_call_cost() {
    let rt = Local::new(4, 4);
    let mut stack = Stack::new();
    rt.entry(&mut stack.0[60], 0);
    let n = 10_000_000u64;
    for (pattern, functions) in [("one function in a loop", 1), ("four in turn", 4)] {
        let start = std::time::Instant::now();
        for i in 0..n {
            rt.entry(&mut stack.0[50], (i % functions) as u32);
            rt.exit(&mut stack.0[50]);
        }
        let ns = start.elapsed().as_nanos() as f64 / n as f64;
        eprintln!("entry + exit, {pattern}: {ns:.1} ns a call");
    }
}

/// Two made-up stacks 16 MiB apart: slots near each other and far from the other's.
struct TwoStacks {
    base: *mut u64,
    len: usize,
}

impl TwoStacks {
    fn new() -> TwoStacks {
        TwoStacks::apart(16 << 20)
    }
    /// Two stacks of `apart` bytes, one right above the other.
    fn apart(apart: usize) -> TwoStacks {
        TwoStacks { base: map(2 * apart).cast(), len: 2 * apart }
    }
    /// Slot `i` (counted down from the top, as a stack grows) of stack
    /// `which`, holding a made-up return address.
    fn slot(&self, which: usize, i: usize) -> *mut u64 {
        let words = self.len / 8;
        let at = if which == 0 { words / 2 - 1 - i } else { words - 1 - i };
        // SAFETY: within the mapping.
        unsafe {
            let slot = self.base.add(at);
            *slot = 0x5000 + (which * 100 + i) as u64;
            slot
        }
    }
}

#[test]
fn a_handler_on_another_stack_leaves_the_interrupted_frames_alone() {
    let rt = Local::new(3, 4);
    let stacks = TwoStacks::new();
    // SAFETY: distinct slots of the mapping.
    let (f, g) = unsafe { (&mut *stacks.slot(0, 1), &mut *stacks.slot(0, 2)) };
    rt.entry(f, 0);
    rt.entry(g, 1);
    // A signal arrives; its handler runs on an alternate stack, above.
    // SAFETY: a slot of the mapping.
    let h = unsafe { &mut *stacks.slot(1, 1) };
    rt.entry(h, 2);
    rt.exit(h);
    assert_eq!(*h, 0x5000 + 101);
    rt.exit(g);
    rt.exit(f);
    assert_eq!((*f, *g), (0x5001, 0x5002));
    let nodes = rt.nodes(0);
    assert_eq!(nodes.iter().map(|n| n.unwound).sum::<u64>(), 0, "{nodes:?}");
    assert_eq!(nodes.iter().map(|n| n.calls).sum::<u64>(), 3);
    assert!(nodes.iter().any(|n| n.function == 2 && n.parent == 2), "the handler's call nests in the interrupted one");
}

#[test]
fn a_handler_that_longjmps_out_of_its_stack_ends_with_the_frames_it_left() {
    let rt = Local::new(3, 4);
    let stacks = TwoStacks::new();
    // SAFETY: distinct slots of the mapping.
    let (f, g, h) = unsafe { (&mut *stacks.slot(0, 1), &mut *stacks.slot(0, 2), &mut *stacks.slot(1, 1)) };
    rt.entry(f, 0);
    rt.entry(g, 1);
    // A signal interrupts g; its handler, on an alternate stack, calls h
    // and longjmps back into f, which calls g again from the same slot.
    rt.entry(h, 2);
    *g = 0x5002;
    rt.entry(g, 1);
    assert_eq!(rt.block(0).depth, 2, "g's first call and the handler's call are gone");
    rt.exit(g);
    rt.exit(f);
    assert_eq!((*f, *g), (0x5001, 0x5002));
    let nodes = rt.nodes(0);
    assert_eq!(nodes.iter().map(|n| n.unwound).sum::<u64>(), 2, "{nodes:?}");
    assert_eq!(nodes.iter().map(|n| n.calls).sum::<u64>(), 4);
    assert_eq!(rt.block(0).mixed, 0, "times are still kept");
}

/// A handler walks the stack (`backtrace()`) on an alternate stack mapped
/// right above the thread's, near enough to pass for one stack: the frames
/// it interrupted lie below its slot, yet are no calls the walk left.
#[test]
fn a_stack_walk_on_an_alternate_stack_near_the_threads_leaves_the_interrupted_frames_alone() {
    let rt = Local::new(3, 1);
    let stacks = TwoStacks::apart(1 << 20);
    // SAFETY: distinct slots of the mapping.
    let (f, g, h, walk) = unsafe { (&mut *stacks.slot(0, 1), &mut *stacks.slot(0, 2), &mut *stacks.slot(1, 1), &mut *stacks.slot(1, 2)) };
    rt.entry(f, 0);
    rt.entry(g, 1);
    let hijacked = (*f, *g);
    // SAFETY: the upper stack is this thread's alternate signal stack while
    // the hooks run (never run on: only asked where it is); the one before is
    // put back.
    let before = unsafe {
        let upper = libc::stack_t { ss_sp: stacks.slot(1, 0).add(1).cast::<u8>().sub(1 << 20).cast(), ss_flags: 0, ss_size: 1 << 20 };
        let mut before: libc::stack_t = std::mem::zeroed();
        assert_eq!(libc::sigaltstack(&upper, &mut before), 0, "{}", std::io::Error::last_os_error());
        before
    };
    rt.entry(h, 2);
    rt.hook(rt.runtime.unhook, walk);
    let read = (*f, *g);
    rt.hook(rt.runtime.resume, walk);
    let depth = rt.block(0).depth;
    // SAFETY: putting back the alternate stack the thread had.
    unsafe { libc::sigaltstack(&before, std::ptr::null_mut()) };
    assert_eq!(read, (0x5001, 0x5002), "the walk reads the interrupted frames' return addresses");
    assert_eq!(((*f, *g), depth), (hijacked, 3), "and they are hijacked again after, still in progress");
    rt.exit(h);
    rt.exit(g);
    rt.exit(f);
    assert_eq!((*f, *g, *h), (0x5001, 0x5002, 0x5000 + 101));
    assert_eq!(rt.nodes(0).iter().map(|n| n.unwound).sum::<u64>(), 0);
}

/// A frame on another stack below (a coroutine's, switched away from
/// without returning, which another thread may run by now) is no caller
/// of an unwinder entered on this one: its slot is left as it is.
#[test]
fn an_unwinder_leaves_the_slots_of_another_stack_alone() {
    let rt = Local::new(3, 1);
    let stacks = TwoStacks::new();
    // SAFETY: distinct slots of the mapping.
    let (f, k, g, walk) = unsafe { (&mut *stacks.slot(1, 1), &mut *stacks.slot(0, 1), &mut *stacks.slot(1, 2), &mut *stacks.slot(1, 3)) };
    rt.entry(f, 0);
    rt.entry(k, 1);
    // The coroutine switched back to f's stack; another thread runs it now,
    // whose call at the same slot returns through a trampoline.
    let others = rt.runtime.trampolines.shared;
    *k = others;
    rt.entry(g, 2);
    rt.hook(rt.runtime.unhook, walk);
    assert_eq!((*f, *g, *k), (0x5000 + 101, 0x5000 + 102, others));
    rt.hook(rt.runtime.resume, walk);
    assert_eq!(*k, others, "nor hijacked after");
    assert_ne!((*f, *g), (0x5000 + 101, 0x5000 + 102), "the walked frames are");
}

#[test]
fn calls_taking_turns_on_one_thread_pointer_return_right_and_go_untimed() {
    let rt = Local::new(2, 4);
    let stacks = TwoStacks::new();
    // SAFETY: distinct slots of the mapping.
    let (a, b) = unsafe { (&mut *stacks.slot(0, 1), &mut *stacks.slot(1, 1)) };
    // Two threads on one thread pointer (a raw clone): A calls, B calls,
    // A returns first.
    rt.entry(a, 0);
    rt.entry(b, 1);
    rt.exit(a);
    assert_eq!(*a, 0x5001);
    // SAFETY: a slot of the mapping.
    let c = unsafe { &mut *stacks.slot(0, 2) };
    rt.entry(c, 0);
    assert_eq!(*c, 0x5002, "once mixed, calls are not hijacked");
    rt.exit(b);
    assert_eq!(*b, 0x5000 + 101);
    let block = rt.block(0);
    assert_eq!((block.depth, block.mixed), (0, 1));
    assert_eq!(rt.entries(0), [2, 1], "every call is still counted");
}

const ENTER: u64 = 0;
const LEAVE: u64 = 1;

#[test]
fn regions_are_timed_from_entry_to_leave_and_overlap_within_a_frame() {
    let rt = Local::new(1, 2);
    let frame = 0x7000_0000;
    // Region 0 entered, region 1 entered, 0 left while in 1, 1 left.
    rt.region(ENTER, frame);
    rt.region(2 | ENTER, frame);
    rt.region(LEAVE, frame);
    rt.region(2 | LEAVE, frame);
    // Region 1 again, then a deeper frame enters it too (recursion) and
    // both leave, the deeper first.
    rt.region(2 | ENTER, frame);
    rt.region(2 | ENTER, frame - 0x100);
    rt.region(2 | LEAVE, frame - 0x100);
    rt.region(2 | LEAVE, frame);
    let regions = rt.regions(0);
    assert_eq!((regions[0].entries, regions[0].timed), (1, 1));
    assert_eq!((regions[1].entries, regions[1].timed), (3, 3));
    assert!(regions[1].wall.min <= regions[1].wall.max && regions[1].wall.max <= regions[1].wall.total);
    assert_eq!(regions[1].cpu, regions[1].wall, "no off-CPU map: CPU time is wall time");
    assert!([regions[0].unpaired, regions[1].unpaired, regions[0].unwound, regions[1].unwound].iter().all(|&n| n == 0));
}

#[test]
fn a_region_left_by_a_longjmp_ends_unwound_and_a_stray_leave_is_counted() {
    let rt = Local::new(1, 2);
    let frame = 0x7000_0000;
    rt.region(ENTER, frame);
    // A deeper frame enters region 1 and is left by a longjmp: never leaves it.
    rt.region(2 | ENTER, frame - 0x100);
    rt.region(LEAVE, frame + 8);
    // A leave with no entry (recording started inside the region).
    rt.region(2 | LEAVE, frame);
    let regions = rt.regions(0);
    assert_eq!((regions[0].entries, regions[0].timed, regions[0].unwound), (1, 1, 0));
    assert_eq!((regions[1].entries, regions[1].timed, regions[1].unwound, regions[1].unpaired), (1, 0, 1, 1));
}

#[test]
fn regions_open_past_the_stack_are_counted_untimed_and_pair_in_order() {
    let rt = Local::new(1, 2);
    let depth = OPEN_REGIONS + 3;
    for d in 0..depth {
        rt.region(ENTER, 0x7000_0000 - 0x100 * d);
    }
    for d in (0..depth).rev() {
        rt.region(LEAVE, 0x7000_0000 - 0x100 * d);
    }
    let r = rt.regions(0)[0];
    assert_eq!((r.entries, r.timed, r.untimed, r.unpaired, r.unwound), (depth, OPEN_REGIONS, 3, 0, 0));
}

#[test]
fn a_region_past_the_stack_leaves_the_others_paired() {
    let rt = Local::new(1, 2);
    let frame = |d: u64| 0x7000_0000 - 0x100 * d;
    // Region 0 fills the stack but one; a frame enters region 0 (the last
    // place) then region 1 (past the stack), and leaves 0 first.
    for d in 0..OPEN_REGIONS {
        rt.region(ENTER, frame(d));
    }
    rt.region(2 | ENTER, frame(OPEN_REGIONS - 1));
    rt.region(LEAVE, frame(OPEN_REGIONS - 1));
    rt.region(2 | LEAVE, frame(OPEN_REGIONS - 1));
    for d in (0..OPEN_REGIONS - 1).rev() {
        rt.region(LEAVE, frame(d));
    }
    let regions = rt.regions(0);
    assert_eq!((regions[0].entries, regions[0].timed, regions[0].unpaired), (OPEN_REGIONS, OPEN_REGIONS, 0));
    assert_eq!((regions[1].entries, regions[1].timed, regions[1].untimed, regions[1].unpaired), (1, 0, 1, 0));
}

#[test]
fn a_region_hook_calls_the_runtime_through_its_trampoline() {
    use iced_x86::{BlockEncoder, BlockEncoderOptions, Code, Instruction, InstructionBlock};
    let rt = Local::new(1, 2);
    let page = map(4096);
    let at = page as u64;
    let slot = at + 2048;
    let mut hook = region_hook(1, false, slot).unwrap();
    hook.extend(region_hook(1, true, slot).unwrap());
    hook.push(Instruction::with(Code::Retnq));
    let code = BlockEncoder::encode(64, InstructionBlock::new(&hook, at), BlockEncoderOptions::NONE).unwrap().code_buffer;
    // SAFETY: code and the slot written into a fresh page, then made executable and run.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), page, code.len());
        *(page.add(2048).cast::<u64>()) = rt.runtime.region_trampoline;
        assert_eq!(libc::mprotect(page.cast(), 4096, libc::PROT_READ | libc::PROT_EXEC), 0);
        let run: extern "C" fn() = std::mem::transmute(page as usize);
        run();
        libc::munmap(page.cast(), 4096);
    }
    let r = rt.regions(0)[1];
    assert_eq!((r.entries, r.timed, r.unpaired), (1, 1, 0));
}

/// A trampoline's start filled in from the template is what the
/// assembler makes of it, wherever it is and whatever function it counts.
#[test]
fn trampolines_from_the_template_are_the_assemblers() {
    for (address, routine, function) in
        [(0x40_0000u64, 0x40_8000u64, 7u32), (0x7f00_1234_5678, 0x7f00_0000_0010, 65_535), (0x1000, 0x7fff_0000, u32::MAX)]
    {
        let expected = assemble_call_routine(address, routine, function, Made::AsCalled).unwrap();
        assert_eq!(call_routine(address, routine, function).unwrap(), expected, "{address:#x} -> {routine:#x}");
        let expected = assemble_call_routine(address, routine, function, Made::ThroughEntry).unwrap();
        assert_eq!(call_entry(address, routine, function).unwrap(), expected, "{address:#x} -> {routine:#x}");
    }
    assert!(call_routine(0x1000, 0x1_0000_1000, 0).is_err(), "a routine beyond 2 GiB has no rel32 call");
}

/// An unwinder of a stack sampled inside the runtime finds the call it
/// was timing from where the runtime returns to: right after the call
/// instruction of each trampoline.
#[test]
fn routines_return_right_after_their_trampolines_calls() {
    let (address, routine) = (0x40_0000u64, 0x40_8000u64);
    let code = call_routine(address, routine, 7).unwrap();
    let at = call_routine_return_offset() as usize;
    assert_eq!(code[at - 5], 0xe8, "{code:x?}");
    let rel = i32::from_le_bytes(code[at - 4..at].try_into().unwrap());
    assert_eq!((address + at as u64).wrapping_add(rel as i64 as u64), routine);
    let trampoline = return_trampoline_code(address, routine).unwrap();
    let at = return_trampoline_return_offset() as usize;
    assert_eq!(trampoline[at - 5], 0xe8, "{trampoline:x?}");
    let rel = i32::from_le_bytes(trampoline[at - 4..at].try_into().unwrap());
    assert_eq!((address + at as u64).wrapping_add(rel as i64 as u64), routine);
}

/// The return trampoline goes on to the caller with a `ret`, and every
/// trampoline comes after a `call` through the word below the slot: a
/// timed call made through it has its return predicted, and so does the
/// trampoline's own.
#[test]
fn return_trampolines_come_after_a_call_through_the_stack_and_return_with_a_ret() {
    let code = return_trampoline_code(0x40_0000, 0x40_8000).unwrap();
    let instructions: Vec<_> = iced_x86::Decoder::with_ip(64, &code, 0x40_0000, iced_x86::DecoderOptions::NONE).into_iter().collect();
    assert_eq!(instructions.last().unwrap().code(), iced_x86::Code::Retnq, "{instructions:?}");
    let call = iced_x86::Decoder::with_ip(64, &CALL_THROUGH_STACK, 0, iced_x86::DecoderOptions::NONE).decode();
    assert_eq!(call.code(), iced_x86::Code::Call_rm64, "{call:?}");
    assert_eq!((call.memory_base(), call.memory_displacement64() as i64), (iced_x86::Register::RSP, -16));
    assert_eq!(call.len() as u64, CALL_BEFORE_TRAMPOLINE);
    let config = Config { functions: 1, ..Config::default() };
    let rt = assemble(0x40_0000, &config, None).unwrap();
    let before = |trampoline: u64| {
        let at = (trampoline - CALL_BEFORE_TRAMPOLINE - 0x40_0000) as usize;
        rt.code[at..at + CALL_BEFORE_TRAMPOLINE as usize].to_vec()
    };
    assert_eq!(before(rt.trampolines.shared), CALL_THROUGH_STACK);
    for site in [0, 1, rt.trampolines.count - 1] {
        assert_eq!(before(rt.trampolines.sites + site * SITE_BYTES), CALL_THROUGH_STACK, "site {site}");
    }
}

/// A stack sampled among a call into the runtime's register saves and
/// restores finds the patched call's return-address slot that many words
/// above the stack pointer: none at the trampoline's start, two (the words
/// set aside) at the first save, eleven at the call and right after it,
/// none past the code every trampoline shares, and none where the slot is
/// below the stack pointer (the return trampoline is entered with the slot
/// just popped by its caller's `ret`, and steps back over it).
#[test]
fn the_words_pushed_above_the_slot_follow_the_saves_and_restores() {
    let kept = SAVED.len() as u64 + 2;
    let call = assemble_call_routine(0, 0x1_0000, 0, Made::ThroughEntry).unwrap();
    let back = call_routine_return_offset() as i64;
    let instructions: Vec<_> = iced_x86::Decoder::with_ip(64, &call, 0, iced_x86::DecoderOptions::NONE).into_iter().collect();
    let at = |i: &iced_x86::Instruction| i.ip() as i64 - back;
    let first_push = instructions.iter().find(|i| i.mnemonic() == iced_x86::Mnemonic::Push).unwrap();
    let last_pop = instructions.iter().rfind(|i| i.mnemonic() == iced_x86::Mnemonic::Pop).unwrap();
    let compare = instructions.iter().find(|i| i.mnemonic() == iced_x86::Mnemonic::Cmp).unwrap();
    let jump = instructions.iter().find(|i| i.code() == iced_x86::Code::Jmp_rm64).unwrap();
    assert_eq!(words_pushed(RoutineCall::Trampoline, -back), Some(0), "at the start");
    assert_eq!(words_pushed(RoutineCall::Trampoline, at(first_push)), Some(2), "at the first push");
    assert_eq!(words_pushed(RoutineCall::Trampoline, at(first_push) + 1), Some(3), "after push rax");
    assert_eq!(words_pushed(RoutineCall::Trampoline, -5), Some(kept), "at the call");
    assert_eq!(words_pushed(RoutineCall::Trampoline, 0), Some(kept), "where the runtime returns");
    assert_eq!(words_pushed(RoutineCall::Trampoline, at(last_pop)), Some(3), "at the last pop");
    // Past the code a hook's trampoline shares: there a hook's goes on
    // into its function's moved instructions, which may push.
    assert_eq!(words_pushed(RoutineCall::Trampoline, at(compare)), None, "where a function's decides");
    assert_eq!(words_pushed(RoutineCall::Trampoline, at(jump)), None, "the slot stepped over");
    assert_eq!(words_pushed(RoutineCall::Trampoline, -back - 1), None, "before the trampoline");
    assert_eq!(words_pushed(RoutineCall::Trampoline, 1), None, "inside the `mov` after the call");
    let ret = return_trampoline_code(0, 0x1_0000).unwrap();
    let back = return_trampoline_return_offset() as i64;
    assert_eq!(words_pushed(RoutineCall::Return, -back), None, "at `sub rsp, 8`: the slot is below the stack pointer");
    assert_eq!(words_pushed(RoutineCall::Return, -back + 4), Some(0), "after it");
    assert_eq!(words_pushed(RoutineCall::Return, 0), Some(SAVED.len() as u64), "where the runtime returns");
    assert_eq!(words_pushed(RoutineCall::Return, ret.len() as i64 - back - 1), Some(0), "at the `ret`");
}

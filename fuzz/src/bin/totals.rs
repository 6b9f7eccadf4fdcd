//! The in-process engine's totals on any bytes as the memory a patched
//! target shares with proftap: the reader (`TotalsView`: calls by function,
//! every thread's totals, return addresses), then each thread's totals
//! made a profile as the recorder makes it (calling-context tree, calls in
//! progress ended, exclusive times, compensation). The profile must be one
//! that `read_profile` would accept.
//!
//! The runtime's capacities are constants (a block is 34 MiB), so the input
//! is not the memory itself: it is a list of little-endian words written at
//! the places the reader looks, in this order, a missing word being 0:
//!
//! - the conversion: the end (TSC), the time off CPU at the end (0: none),
//!   a word of settings (bits 0-2: functions - 1, bit 3: a second block, bit
//!   4: two metrics, bit 5: compensation, bit 6: a budget of bits 8 and up
//!   (mod 8192 bytes) for the contexts read, bit 7: a trace ring of
//!   [`TRACE_SLOTS`] calls per block), then the compensation's costs
//!   (own and call, wall then CPU);
//! - the header (`Header`, every word of it);
//! - for each block: its header (`BlockHeader`, 16 words), its calls by
//!   function (timed, then made while busy: 8 words each, the first
//!   `functions` used), its first [`NODES`] nodes, its first [`FRAMES`]
//!   frames, its first [`RETURNS`] return addresses, its trace ring (when
//!   there is one);
//! - the first [`SITES_GIVEN`] entries of the return sites' table, then a
//!   sampled stack: its stack pointer and [`STACK_WORDS`] words, read for
//!   the site trampolines on it (at [`SITE_TRAMPOLINES`]).
//!
//! The trace rings are read twice, then the blocks retired (as if every
//! thread had ended): what is read must be what the runtime writes.
//!
//! Everything past what the input gives stays 0, as memory the runtime has
//! not touched.

use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::reading::{MOST_CONTEXT_BYTES, TotalsView, TraceCursor};
use proftap_probes::inject::remote::Shared;
use proftap_probes::inject::threads::{Conversion, Cost, thread_profile};
use proftap_probes::inject::totals::{BlockHeader, Frame, Geometry, Header, Node, Ret, SITES, STACK_DEPTH, Traced, Trampolines};
use proftap_profile::{FunctionInfo, Profile};

proftap_fuzz::target!(run);

/// Nodes, frames and return addresses of each block the input gives.
const NODES: usize = 8;
const FRAMES: usize = 8;
const RETURNS: usize = 8;
/// Calls a block's trace ring holds, when it has one.
const TRACE_SLOTS: u64 = 4;
/// Patched functions at most (the settings' 3 bits).
const MOST_FUNCTIONS: usize = 8;
/// Words of the conversion's settings.
const SETTINGS: usize = 7;
/// Entries of the return sites' table the input gives.
const SITES_GIVEN: usize = 8;
/// Words of a sampled stack.
const STACK_WORDS: usize = 16;
/// Where the made-up site trampolines are, and the shared one.
const SITE_TRAMPOLINES: Trampolines = Trampolines { shared: 0x7000_0000, sites: 0x7000_0040, count: SITES };

fn words<T>() -> usize {
    size_of::<T>() / 8
}

fn run(data: &[u8]) {
    let mut input = data.chunks(8).map(|c| {
        let mut word = [0u8; 8];
        word[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(word)
    });
    let mut next = || input.next().unwrap_or(0);
    let settings: Vec<u64> = (0..SETTINGS).map(|_| next()).collect();
    let (end_tsc, off_cpu_now, flags) = (settings[0], settings[1], settings[2]);
    let trace_slots = if flags & 128 != 0 { TRACE_SLOTS } else { 0 };
    let geometry =
        Geometry { functions: (flags % MOST_FUNCTIONS as u64) + 1, blocks: 1 + (flags >> 3 & 1), trace_slots, regions: flags >> 4 & 3 };
    let shared = Shared::anonymous(geometry.shared_bytes() as usize).expect("memory for the totals");
    // `count` words of the input, the first `keep` written where the
    // runtime would have: a field is at the same place in every input.
    let mut fill = |shared: &Shared, at: u64, count: usize, keep: usize| {
        for i in 0..count {
            let word = next();
            if word != 0 && i < keep {
                shared.store(at as usize + 8 * i, word);
            }
        }
    };
    fill(&shared, 0, words::<Header>(), usize::MAX);
    let mut tids = Vec::new();
    for block in 0..geometry.blocks {
        let at = geometry.block(block);
        fill(&shared, at, words::<BlockHeader>(), usize::MAX);
        tids.push(shared.load(at as usize + 8) as u32);
        let functions = geometry.functions as usize;
        fill(&shared, at + geometry.entries_offset(), MOST_FUNCTIONS, functions);
        fill(&shared, at + geometry.busy_entries_offset(), MOST_FUNCTIONS, functions);
        fill(&shared, at + Geometry::NODES, NODES * words::<Node>(), usize::MAX);
        fill(&shared, at + Geometry::FRAMES, FRAMES * words::<Frame>(), usize::MAX);
        fill(&shared, at + Geometry::RETURNS, RETURNS * words::<Ret>(), usize::MAX);
        fill(&shared, at + geometry.trace_offset(), trace_slots as usize * words::<Traced>(), usize::MAX);
    }
    fill(&shared, Geometry::SITES, SITES_GIVEN, usize::MAX);
    let sp = next();
    let stack: Vec<u8> = (0..STACK_WORDS).flat_map(|_| next().to_le_bytes()).collect();

    let view = TotalsView::new(shared, geometry);
    let mut calls = vec![0u64; geometry.functions as usize];
    view.calls(&mut calls);
    for tid in tids {
        let _ = view.return_addresses(tid, u64::MAX, u64::MAX);
    }
    for (slot, ret) in view.site_returns(&SITE_TRAMPOLINES, sp, &stack) {
        let offset = slot.wrapping_sub(sp) as usize;
        assert!(slot % 8 == 0 && offset + 8 <= stack.len() && ret != 0, "slot {slot:#x} of a stack at {sp:#x}");
        let value = u64::from_le_bytes(stack[offset..offset + 8].try_into().expect("eight bytes"));
        assert!(SITE_TRAMPOLINES.site(value).is_some(), "{value:#x} is no site trampoline");
    }
    // A small budget reads some threads' contexts and leaves the others'.
    let budget = if flags & 64 != 0 { (flags >> 8) % 8192 } else { MOST_CONTEXT_BYTES };
    let Ok(totals) = view.totals_within(budget) else { return };
    read_traces(&view, geometry, budget);

    let clock = TscClock::with_rate(3_000_000_000, 1_000_000_000);
    let metrics = if flags & 16 != 0 { 2 } else { 1 };
    let cost = |own: u64, call: u64| Cost { own, call };
    let compensation = (flags & 32 != 0).then(|| [cost(settings[3], settings[4]), cost(settings[5], settings[6])]);
    let how = Conversion { clock: &clock, metrics, end_tsc, compensation };
    let off_now = (off_cpu_now != 0).then_some(off_cpu_now);
    let threads = totals.threads.iter().map(|t| thread_profile(1, format!("thread {}", t.tid), t, off_now, &how)).collect();
    // What the recorder makes of them is a profile like any other.
    let profile = Profile {
        metrics: ["wall_ns", "cpu_ns"][..metrics].iter().map(|m| m.to_string()).collect(),
        functions: vec![FunctionInfo::default(); geometry.functions as usize],
        threads,
        ..Profile::default()
    };
    if let Err(e) = profile.validate() {
        panic!("the totals made a profile no reader accepts: {e}");
    }
}

/// Reads the trace rings twice and retires every block: what is handed
/// over must be calls the runtime could have written.
fn read_traces(view: &TotalsView, geometry: Geometry, budget: u64) {
    let mut cursor = TraceCursor::default();
    for _ in 0..2 {
        view.drain_trace(&mut cursor, &mut |_, calls| {
            for c in calls {
                assert!(u64::from(c.function) < geometry.functions && c.exit_tsc >= c.entry_tsc && u64::from(c.depth) < STACK_DEPTH);
            }
        });
    }
    let _ = view.retire_ended(|_| false, &mut budget.clone(), &mut cursor);
    view.drain_trace(&mut cursor, &mut |_, calls| assert!(calls.is_empty(), "a retired block's ring is empty"));
}

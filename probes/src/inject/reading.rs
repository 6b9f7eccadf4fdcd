//! Reading what the runtime in a patched process added up (see
//! [`super::totals`]): calls by function for the governor, every thread's
//! totals, a thread's original return addresses for the sampler. The
//! process can write anything into that memory: every count, index and
//! size is checked before it is used, and the first lie ends the reading
//! with why.

use super::remote::Shared;
use super::totals::{self, BlockHeader, Frame, Geometry, Header, Node};
use std::sync::Arc;

/// Larger counts than this (over a trillion calls) are lies.
pub const MOST_COUNT: u64 = 1 << 40;

/// One thread's totals, as the runtime added them up.
#[derive(Clone, Debug, Default)]
pub struct ThreadTotals {
    /// The kernel's id of the thread.
    pub tid: u32,
    /// Its calling contexts; node 0 is the thread, each node's parent
    /// comes before it.
    pub nodes: Vec<Node>,
    /// Calls by function, timed or not.
    pub calls: Vec<u64>,
    /// Calls in progress, outermost first.
    pub open: Vec<Frame>,
    /// Calls counted but not timed: their context did not fit, they went
    /// deeper than the runtime's stack, or a signal handler made them
    /// while the runtime ran.
    pub untimed: u64,
}

/// Every thread's totals.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// By thread.
    pub threads: Vec<ThreadTotals>,
    /// Calls of threads beyond the runtime's blocks: counted, not timed, no function known.
    pub unseated: u64,
}

/// Why the shared memory cannot be believed.
fn corrupted(why: String) -> String {
    format!("the target corrupted proftap's buffers ({why}); what it wrote cannot be believed")
}

/// The runtime's memory of one patched process, as proftap maps it.
#[derive(Clone)]
pub struct TotalsView {
    shared: Arc<Shared>,
    geometry: Geometry,
}

impl TotalsView {
    /// A view of `shared`, laid out as `geometry` says.
    pub fn new(shared: Shared, geometry: Geometry) -> Self {
        TotalsView { shared: Arc::new(shared), geometry }
    }

    /// Where the memory is in the process.
    pub fn remote_address(&self) -> u64 {
        self.shared.remote
    }

    /// Adds the calls made so far, by function over every thread, to
    /// `into` (one entry per function). Cheap enough to call every few
    /// milliseconds; what a lying process wrote is skipped, not believed.
    pub fn calls(&self, into: &mut [u64]) {
        let shared = &self.shared;
        let taken = shared.load(HEADER_BLOCKS_TAKEN).min(self.geometry.blocks);
        let functions = (self.geometry.functions as usize).min(into.len());
        for block in 0..taken {
            for offset in [self.geometry.entries_offset(), self.geometry.busy_entries_offset()] {
                let at = (self.geometry.block(block) + offset) as usize;
                for (f, total) in into.iter_mut().enumerate().take(functions) {
                    let count = shared.load(at + 8 * f);
                    if count <= MOST_COUNT {
                        *total = total.saturating_add(count);
                    }
                }
            }
        }
    }

    /// Every thread's totals so far, checked: the first thing no runtime of
    /// proftap's writes ends the reading with why.
    pub fn totals(&self) -> Result<Totals, String> {
        let shared = &self.shared;
        let header: Header = read_struct(shared, 0);
        if header.magic != totals::MAGIC {
            return Err(corrupted("its header was overwritten".into()));
        }
        let taken = header.blocks_taken.min(self.geometry.blocks);
        let mut all = Totals { threads: Vec::new(), unseated: checked_count("calls without a block", header.unseated)? };
        for block in 0..taken {
            if let Some(thread) = self.thread_totals(shared, block)? {
                all.threads.push(thread);
            }
        }
        Ok(all)
    }

    fn thread_totals(&self, shared: &Shared, block: u64) -> Result<Option<ThreadTotals>, String> {
        let at = self.geometry.block(block) as usize;
        let h: BlockHeader = read_struct(shared, at);
        if h.state != 1 {
            return Ok(None);
        }
        if h.nodes == 0 || h.nodes > totals::NODES || h.depth > totals::STACK_DEPTH || h.tid == 0 || h.tid > u64::from(u32::MAX) {
            return Err(corrupted(format!("block {block} says it has {} nodes, {} frames, thread {}", h.nodes, h.depth, h.tid)));
        }
        let nodes: Vec<Node> = read_array(shared, at + Geometry::NODES as usize, h.nodes as usize);
        for (i, n) in nodes.iter().enumerate().skip(1) {
            if n.parent as usize >= i || u64::from(n.function) >= self.geometry.functions || n.calls > MOST_COUNT || n.unwound > n.calls {
                return Err(corrupted(format!("node {i} of thread {} names parent {} and function {}", h.tid, n.parent, n.function)));
            }
        }
        let functions = self.geometry.functions as usize;
        let timed: Vec<u64> = read_array(shared, at + self.geometry.entries_offset() as usize, functions);
        let busy: Vec<u64> = read_array(shared, at + self.geometry.busy_entries_offset() as usize, functions);
        if let Some(lie) = timed.iter().chain(&busy).find(|&&c| c > MOST_COUNT) {
            return Err(corrupted(format!("thread {} reports {lie} calls of a function", h.tid)));
        }
        let calls: Vec<u64> = timed.iter().zip(&busy).map(|(a, b)| a + b).collect();
        let untimed_busy: u64 = busy.iter().sum();
        let open: Vec<Frame> = read_array(shared, at + Geometry::FRAMES as usize, h.depth as usize);
        let untimed = [("calls out of context", h.untimed), ("calls too deep", h.too_deep), ("calls while busy", untimed_busy)]
            .into_iter()
            .try_fold(0u64, |sum, (what, n)| checked_count(what, n).map(|n| sum.saturating_add(n)))?;
        Ok(Some(ThreadTotals { tid: h.tid as u32, nodes, calls, open, untimed }))
    }

    /// Thread `tid`'s frames' original return addresses, by the stack slot
    /// each was in (the runtime put its return trampoline there): what an
    /// unwinder of a sampled stack reads in its place. Frames a little
    /// deeper than the thread is now are included: a sample read a moment
    /// ago may have them.
    pub fn return_addresses(&self, tid: u32) -> Vec<(u64, u64)> {
        let shared = &self.shared;
        let taken = shared.load(HEADER_BLOCKS_TAKEN).min(self.geometry.blocks);
        let Some(block) = (0..taken).rev().find(|&b| shared.load(self.geometry.block(b) as usize + 8) == u64::from(tid)) else {
            return Vec::new();
        };
        let at = self.geometry.block(block) as usize;
        let depth = shared.load(at + 16).saturating_add(64).min(totals::STACK_DEPTH);
        let returns: Vec<totals::Ret> = read_array(shared, at + Geometry::RETURNS as usize, depth as usize);
        returns.into_iter().filter(|r| r.slot != 0).map(|r| (r.slot, r.ret)).collect()
    }
}

/// Offset of `blocks_taken` in the shared header.
const HEADER_BLOCKS_TAKEN: usize = 24;

fn checked_count(what: &str, value: u64) -> Result<u64, String> {
    if value > MOST_COUNT { Err(corrupted(format!("it reports {value} {what}"))) } else { Ok(value) }
}

/// A plain-old-data value at byte `at` of the shared memory.
fn read_struct<T: Copy + Default>(shared: &Shared, at: usize) -> T {
    read_array(shared, at, 1).pop().unwrap_or_default()
}

/// `count` plain-old-data values from byte `at`.
fn read_array<T: Copy + Default>(shared: &Shared, at: usize, count: usize) -> Vec<T> {
    let mut bytes = Vec::new();
    shared.copy_to(at, count * size_of::<T>(), &mut bytes);
    bytes
        .chunks_exact(size_of::<T>())
        // SAFETY: T is plain old data made of integers (every bit pattern is a value).
        .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<T>()) })
        .collect()
}

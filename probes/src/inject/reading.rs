//! Reading what the runtime in a patched process added up (see
//! [`super::totals`]): calls by function for the governor, every thread's
//! totals, a thread's original return addresses for the sampler. The
//! process can write anything into that memory: every count, index and
//! size is checked before it is used, and the first lie ends the reading
//! with why.

use super::remote::Shared;
use super::totals::{self, BlockHeader, Frame, Geometry, Header, Node, RegionTotal, RegionsHeader, Traced};
use std::sync::Arc;

/// Larger counts than this (over a trillion calls) are lies.
pub const MOST_COUNT: u64 = 1 << 40;

/// Most bytes of calling contexts and calls in progress one reading copies,
/// over every thread: a real program's fit many times over (64 threads of
/// 100,000 contexts each take 800 MiB), while a target that claims full
/// tables in every block would have proftap copy 28 GiB.
pub const MOST_CONTEXT_BYTES: u64 = 2 << 30;

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
    /// Per region, its totals in the thread.
    pub regions: Vec<RegionTotal>,
    /// Region hooks that ran while the runtime was busy on the thread
    /// (a signal handler interrupted it): not seen.
    pub hooks_missed: u64,
    /// Returns that found no frame of their own (the program switched
    /// stacks), sent back to their call sites.
    pub unpaired: u64,
    /// Calls of two stacks interleaved on the thread (threads sharing a
    /// thread pointer, or stacks switched): its later calls are counted,
    /// not timed.
    pub mixed: bool,
    /// Frames a forked child carried over from its parent (in progress at
    /// the fork): their contexts are nodes 1 to `carried`.
    pub carried: u64,
}

/// Every thread's totals.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// By thread.
    pub threads: Vec<ThreadTotals>,
    /// Calls of threads beyond the runtime's blocks: counted, not timed, no function known.
    pub unseated: u64,
    /// Threads whose contexts were not read, to keep a reading within its
    /// budget: their calls are counted, not timed.
    pub over_budget: u64,
    /// Region hooks of threads beyond the runtime's blocks: not seen.
    pub unseated_hooks: u64,
    /// Returns of threads beyond the runtime's blocks, sent back to their
    /// call sites.
    pub unseated_returns: u64,
    /// Forked children that could not hand their memory over, and ran unrecorded.
    pub children_unreached: u64,
    /// Pages of the off-CPU array the process could not map: CPU times there are wall times.
    pub off_cpu_unmapped: u64,
}

impl Totals {
    /// About how many bytes of proftap's memory they take.
    pub fn bytes(&self) -> u64 {
        let thread = |t: &ThreadTotals| {
            t.nodes.len() * size_of::<Node>()
                + t.calls.len() * size_of::<u64>()
                + t.open.len() * size_of::<Frame>()
                + t.regions.len() * size_of::<RegionTotal>()
                + size_of::<ThreadTotals>()
        };
        self.threads.iter().map(thread).sum::<usize>() as u64
    }
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
                for (total, count) in into.iter_mut().zip(shared.loads(at, functions)) {
                    if count <= MOST_COUNT {
                        *total = total.saturating_add(count);
                    }
                }
            }
        }
    }

    /// Every thread's totals so far, checked: the first thing no runtime of
    /// proftap's writes ends the reading with why. Contexts past
    /// [`MOST_CONTEXT_BYTES`] are not read (see [`Totals::over_budget`]).
    pub fn totals(&self) -> Result<Totals, String> {
        self.totals_within(MOST_CONTEXT_BYTES)
    }

    /// [`Self::totals`], copying at most `budget` bytes of contexts and frames.
    pub fn totals_within(&self, mut budget: u64) -> Result<Totals, String> {
        let shared = &self.shared;
        let header: Header = read_struct(shared, 0);
        if header.magic != totals::MAGIC {
            return Err(corrupted("its header was overwritten".into()));
        }
        let taken = header.blocks_taken.min(self.geometry.blocks);
        let unseated = checked_count("calls without a block", header.unseated)?;
        let unseated_hooks = checked_count("region hooks without a block", header.unseated_hooks)?;
        let unseated_returns = checked_count("returns without a block", header.unseated_returns)?;
        let children_unreached = checked_count("children that could not reach proftap", header.children_unreached)?;
        let off_cpu_unmapped = checked_count("pages of the off-CPU array not mapped", header.off_cpu_unmapped)?;
        let mut all = Totals {
            threads: Vec::new(),
            unseated,
            over_budget: 0,
            unseated_hooks,
            unseated_returns,
            children_unreached,
            off_cpu_unmapped,
        };
        for block in 0..taken {
            if let Some((thread, read_whole)) = self.thread_totals(shared, block, &mut budget)? {
                all.over_budget += u64::from(!read_whole);
                all.threads.push(thread);
            }
        }
        Ok(all)
    }

    /// A block's thread, and whether its contexts fitted in `budget` (what
    /// they took is taken from it); if not, its calls, untimed.
    fn thread_totals(&self, shared: &Shared, block: u64, budget: &mut u64) -> Result<Option<(ThreadTotals, bool)>, String> {
        let at = self.geometry.block(block) as usize;
        let h: BlockHeader = read_struct(shared, at);
        if h.state != totals::BLOCK_USED {
            return Ok(None);
        }
        if h.nodes == 0 || h.nodes > totals::NODES || h.depth > totals::STACK_DEPTH || h.tid == 0 || h.tid > i32::MAX as u64 {
            return Err(corrupted(format!("block {block} says it has {} nodes, {} frames, thread {}", h.nodes, h.depth, h.tid)));
        }
        if h.carried >= h.nodes {
            return Err(corrupted(format!("block {block} says it carried {} frames over in {} nodes", h.carried, h.nodes)));
        }
        let functions = self.geometry.functions as usize;
        let timed: Vec<u64> = read_array(shared, at + self.geometry.entries_offset() as usize, functions);
        let busy: Vec<u64> = read_array(shared, at + self.geometry.busy_entries_offset() as usize, functions);
        if let Some(lie) = timed.iter().chain(&busy).find(|&&c| c > MOST_COUNT) {
            return Err(corrupted(format!("thread {} reports {lie} calls of a function", h.tid)));
        }
        let calls: Vec<u64> = timed.iter().zip(&busy).map(|(a, b)| a + b).collect();
        let (regions, hooks_missed) = self.region_totals(shared, at, h.tid)?;
        let stacks = ThreadTotals {
            tid: h.tid as u32,
            unpaired: checked_count("returns without a frame", h.unpaired)?,
            mixed: h.mixed != 0,
            carried: h.carried,
            ..ThreadTotals::default()
        };
        let wanted = h.nodes * size_of::<Node>() as u64 + h.depth * size_of::<Frame>() as u64;
        if wanted > *budget {
            *budget = 0;
            let untimed = calls.iter().sum();
            let thread = ThreadTotals { nodes: vec![Node::default()], calls, untimed, regions, hooks_missed, ..stacks };
            return Ok(Some((thread, false)));
        }
        *budget -= wanted;
        let nodes: Vec<Node> = read_array(shared, at + Geometry::NODES as usize, h.nodes as usize);
        for (i, n) in nodes.iter().enumerate().skip(1) {
            if n.parent as usize >= i || u64::from(n.function) >= self.geometry.functions || n.calls > MOST_COUNT || n.unwound > n.calls {
                return Err(corrupted(format!("node {i} of thread {} names parent {} and function {}", h.tid, n.parent, n.function)));
            }
        }
        let untimed_busy: u64 = busy.iter().sum();
        let open: Vec<Frame> = read_array(shared, at + Geometry::FRAMES as usize, h.depth as usize);
        let untimed = [("calls out of context", h.untimed), ("calls too deep", h.too_deep), ("calls while busy", untimed_busy)]
            .into_iter()
            .try_fold(0u64, |sum, (what, n)| checked_count(what, n).map(|n| sum.saturating_add(n)))?;
        Ok(Some((ThreadTotals { nodes, calls, open, untimed, regions, hooks_missed, ..stacks }, true)))
    }

    /// The totals of the regions of the thread whose block is at `at`, and
    /// its hooks the runtime did not see, checked.
    fn region_totals(&self, shared: &Shared, at: usize, tid: u64) -> Result<(Vec<RegionTotal>, u64), String> {
        if self.geometry.regions == 0 {
            return Ok((Vec::new(), 0));
        }
        let header: RegionsHeader = read_struct(shared, at + self.geometry.regions_offset() as usize);
        let regions: Vec<RegionTotal> =
            read_array(shared, at + self.geometry.region_totals_offset() as usize, self.geometry.regions as usize);
        for r in &regions {
            let counts = [r.entries, r.timed, r.untimed, r.unwound, r.unpaired];
            let timed_lie = r.timed > 0 && (r.wall.min > r.wall.max || r.cpu.min > r.cpu.max || r.cpu.total > r.wall.total);
            if counts.iter().any(|&c| c > MOST_COUNT) || timed_lie {
                return Err(corrupted(format!("thread {tid} reports a region entered {} times, timed {} times", r.entries, r.timed)));
            }
        }
        Ok((regions, checked_count("region hooks missed", header.busy)?))
    }

    /// Hands `keep` the calls each thread finished since `cursor` (where
    /// proftap is in each block's trace ring), with the thread, and moves
    /// the cursor past them. Returns how many calls it could not hand
    /// over: overwritten before they were read, or not what the runtime
    /// writes (a lying process only spoils its own trace).
    pub fn drain_trace(&self, cursor: &mut TraceCursor, keep: &mut dyn FnMut(u32, &[Traced])) -> u64 {
        let slots = self.geometry.trace_slots;
        if slots == 0 {
            return 0;
        }
        let shared = &self.shared;
        let taken = shared.load(HEADER_BLOCKS_TAKEN).min(self.geometry.blocks) as usize;
        if cursor.read.len() < taken {
            cursor.read.resize(taken, 0);
        }
        let mut missed = 0u64;
        for block in 0..taken {
            let at = self.geometry.block(block as u64) as usize;
            let h: BlockHeader = read_struct(shared, at);
            if h.state != totals::BLOCK_USED || h.tid == 0 || h.tid > i32::MAX as u64 {
                continue;
            }
            let written = shared.load(at + BLOCK_TRACED);
            let read = std::mem::replace(&mut cursor.read[block], written);
            if written <= read {
                continue;
            }
            let from = read.max(written - slots.min(written));
            let mut calls = self.ring(at, from, written);
            // What the thread wrote meanwhile may have overwritten the oldest.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let now = shared.load(at + BLOCK_TRACED);
            let torn = (now.saturating_sub(slots).saturating_sub(from) as usize).min(calls.len());
            calls.drain(..torn);
            let functions = self.geometry.functions;
            calls.retain(|c| u64::from(c.function) < functions && c.exit_tsc >= c.entry_tsc && u64::from(c.depth) < totals::STACK_DEPTH);
            missed = missed.saturating_add(written - read - calls.len() as u64);
            keep(h.tid as u32, &calls);
        }
        missed
    }

    /// Calls `from..to` of the trace ring of the block at `at`.
    fn ring(&self, at: usize, from: u64, to: u64) -> Vec<Traced> {
        let slots = self.geometry.trace_slots;
        let ring = at + self.geometry.trace_offset() as usize;
        let (start, count) = ((from % slots) as usize, (to - from) as usize);
        let first = count.min(slots as usize - start);
        let mut calls: Vec<Traced> = read_array(&self.shared, ring + start * size_of::<Traced>(), first);
        calls.extend(read_array::<Traced>(&self.shared, ring, count - first));
        calls
    }

    /// How many times threads that found no block asked for one.
    pub fn blocks_wanted(&self) -> u32 {
        self.shared.load_u32(HEADER_BLOCKS_WANTED)
    }

    /// Tells the threads waiting for a block that proftap looked (see
    /// `wait_for_block` in runtime.c).
    pub fn answer_block_requests(&self) {
        self.shared.bump_and_wake(HEADER_BLOCKS_ANSWERED);
    }

    /// Waits at most `timeout` for a thread to ask for a block, unless one
    /// asked since [`Self::blocks_wanted`] said `seen`.
    pub fn wait_for_block_request(&self, seen: u32, timeout: std::time::Duration) {
        self.shared.wait_while(HEADER_BLOCKS_WANTED, seen, timeout);
    }

    /// Ends a [`Self::wait_for_block_request`] now.
    pub fn end_wait_for_block_request(&self) {
        self.shared.wake(HEADER_BLOCKS_WANTED);
    }

    /// Whether the runtime takes a thread's block atomically: since two
    /// threads may share a thread pointer (a `clone` ran, or two did as
    /// proftap attached), or because it could not know they never would.
    pub fn blocks_taken_atomically(&self) -> bool {
        self.shared.load(HEADER_SHARED_SEATS) != 0
    }

    /// Whether the counts of throttled functions still go without `lock`:
    /// the process was launched with one thread and none has started since
    /// (the runtime empties the table of counts to lock as one does; where
    /// they could not be locked, [`Self::counts_left_unlocked`], they are
    /// priced as locked from then on, the dearer).
    pub fn counts_alone(&self) -> bool {
        self.shared.load(HEADER_LOCK_TABLE) != 0
    }

    /// Whether proftap was asked to make the counts atomic as a thread or
    /// process started, the process having refused the runtime the rights
    /// to write its code (see `ask_proftap_to_lock` in runtime.c), and how
    /// it stands: [`totals::LOCK_ASKED`] while its one thread waits for the
    /// answer, [`totals::LOCK_LATE`] once it gave up waiting,
    /// [`totals::LOCK_GIVEN_UP`] answered that proftap could not; 0 never
    /// asked, or made atomic.
    pub fn lock_request(&self) -> u64 {
        self.shared.load(HEADER_LOCK_REFUSED)
    }

    /// Answers a [`totals::LOCK_ASKED`] request, unless the thread gave up
    /// waiting (then it stays late, to be told): the counts were made
    /// atomic, or could not be.
    pub fn answer_lock_request(&self, locked: bool) {
        let answer = if locked { 0 } else { totals::LOCK_GIVEN_UP };
        self.shared.compare_exchange(HEADER_LOCK_REFUSED, totals::LOCK_ASKED, answer);
        self.answer_block_requests();
    }

    /// Whether counts may have gone without `lock` while several threads
    /// or processes counted: proftap was asked to make them atomic and did
    /// not answer in time, or could not.
    pub fn counts_left_unlocked(&self) -> bool {
        self.lock_request() != 0
    }

    /// Whether three quarters of the blocks have been handed out.
    pub fn blocks_mostly_taken(&self) -> bool {
        self.shared.load(HEADER_BLOCKS_TAKEN) >= self.geometry.blocks / 4 * 3
    }

    /// The blocks of threads that ended (`alive` says which still run),
    /// with no call in progress: read, emptied and handed back for other
    /// threads to take, so that a program that makes threads all the time
    /// never runs out of them. Their totals are returned, their contexts
    /// copied within `budget` bytes (shared by every look: past it, a
    /// thread's calls are counted, untimed, as in [`Self::totals_within`]).
    /// A block whose trace ring holds calls `cursor` has not read waits for
    /// them to be drained; a retired block's ring starts again.
    pub fn retire_ended(
        &self,
        alive: impl Fn(u32) -> bool,
        budget: &mut u64,
        cursor: &mut TraceCursor,
    ) -> Result<Vec<ThreadTotals>, String> {
        let shared = &self.shared;
        let taken = shared.load(HEADER_BLOCKS_TAKEN).min(self.geometry.blocks);
        let mut retired = Vec::new();
        for block in 0..taken {
            let at = self.geometry.block(block) as usize;
            let h: BlockHeader = read_struct(shared, at);
            if h.state != totals::BLOCK_USED || h.depth != 0 || h.tid == 0 || h.tid > i32::MAX as u64 || alive(h.tid as u32) {
                continue;
            }
            // Calls still in its trace ring are read first (by the next
            // drain): the thread may have ended since the last one.
            if cursor.read.get(block as usize).copied().unwrap_or(0) != h.traced {
                continue;
            }
            if let Some((thread, _)) = self.thread_totals(shared, block, budget)? {
                retired.push(thread);
            }
            shared.zero(at, self.geometry.block_bytes() as usize);
            shared.store(at, totals::BLOCK_RETIRED);
            cursor.restart(block);
        }
        Ok(retired)
    }

    /// Thread `tid`'s frames that began by TSC `sampled_tsc`, their
    /// original return addresses by the stack slot each was in (the runtime
    /// put its return trampoline there): what an unwinder of a stack
    /// sampled then reads in its place. Frames deeper than the thread is
    /// now are included, as many as the sample's stack held hijacked return
    /// addresses (`frames_sampled`): they may have been live at the sample.
    /// A frame that began after it is a later call, whose return address
    /// the sampled slot may not have held: left out (its frame goes
    /// unnamed rather than misnamed), however late the sample is read.
    pub fn return_addresses(&self, tid: u32, sampled_tsc: u64, frames_sampled: u64) -> Vec<(u64, u64)> {
        let shared = &self.shared;
        let taken = shared.load(HEADER_BLOCKS_TAKEN).min(self.geometry.blocks);
        let Some(block) = (0..taken).rev().find(|&b| shared.load(self.geometry.block(b) as usize + 8) == u64::from(tid)) else {
            return Vec::new();
        };
        let at = self.geometry.block(block) as usize;
        let deeper = frames_sampled.min(DEEPER_THAN_NOW);
        let depth = shared.load(at + 16).saturating_add(deeper).min(totals::STACK_DEPTH) as usize;
        let returns: Vec<totals::Ret> = read_array(shared, at + Geometry::RETURNS as usize, depth);
        // Read after the returns: the runtime marks a frame's entry time
        // unknown (all ones) before it writes the frame's return address,
        // so a call entered during this read is left out, not paired with
        // the time of the call its depth held before. Only a frame that went
        // through the shared trampoline (its site found no place in the
        // table) is named from here; the others from the site table.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::Acquire);
        let frames: Vec<totals::Frame> = read_array(shared, at + Geometry::FRAMES as usize, depth);
        returns.into_iter().zip(frames).filter(|(r, f)| r.slot != 0 && f.entry_tsc <= sampled_tsc).map(|(r, _)| (r.slot, r.ret)).collect()
    }
}

impl TotalsView {
    /// The return addresses the site trampolines on a sampled stack stand
    /// for (`stack`: its copy from `sp` up), by the stack slot each is in:
    /// what an unwinder reads in their place. A site's entry is set before
    /// its trampoline is ever written to a stack and never changes after,
    /// so that these hold however long ago the sample was taken; a slot
    /// whose entry is 0 (what a lying process could leave) is left out.
    pub fn site_returns(&self, trampolines: &totals::Trampolines, sp: u64, stack: &[u8]) -> Vec<(u64, u64)> {
        // Return addresses are in 8-byte-aligned slots.
        let skip = (sp.wrapping_neg() & 7) as usize;
        let words = stack.get(skip..).unwrap_or_default().chunks_exact(8);
        let mut returns = Vec::new();
        for (i, word) in words.enumerate() {
            let value = u64::from_ne_bytes(word.try_into().unwrap_or_default());
            let Some(site) = trampolines.site(value) else { continue };
            let ret = self.shared.load((Geometry::SITES + 8 * site) as usize);
            if ret != 0 {
                returns.push((sp.wrapping_add((skip + 8 * i) as u64), ret));
            }
        }
        returns
    }
}

/// Return addresses in a sample's 16 KiB copy of its stack, at most.
const DEEPER_THAN_NOW: u64 = 2048;

/// Offset of `blocks_taken` in the shared header.
const HEADER_BLOCKS_TAKEN: usize = std::mem::offset_of!(totals::Header, blocks_taken);
const HEADER_BLOCKS_WANTED: usize = std::mem::offset_of!(totals::Header, blocks_wanted);
const HEADER_BLOCKS_ANSWERED: usize = std::mem::offset_of!(totals::Header, blocks_answered);
const HEADER_SHARED_SEATS: usize = std::mem::offset_of!(totals::Header, shared_seats);
const HEADER_LOCK_TABLE: usize = std::mem::offset_of!(totals::Header, lock_table);
const HEADER_LOCK_REFUSED: usize = std::mem::offset_of!(totals::Header, lock_refused);
/// Offset of `traced` in a block.
const BLOCK_TRACED: usize = std::mem::offset_of!(BlockHeader, traced);

/// Where proftap is in each block's trace ring: calls read so far.
#[derive(Clone, Debug, Default)]
pub struct TraceCursor {
    read: Vec<u64>,
}

impl TraceCursor {
    /// Block `block` was emptied for another thread: its ring starts again.
    pub fn restart(&mut self, block: u64) {
        if let Some(read) = self.read.get_mut(block as usize) {
            *read = 0;
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads of three contexts and 5 calls each of one function.
    fn two_threads() -> TotalsView {
        let geometry = Geometry { functions: 1, blocks: 2, ..Geometry::default() };
        let shared = Shared::anonymous(geometry.shared_bytes() as usize).expect("memory");
        shared.store(0, totals::MAGIC);
        shared.store(HEADER_BLOCKS_TAKEN, 2);
        for block in 0..2 {
            let at = geometry.block(block) as usize;
            for (word, value) in [(0, 1), (1, 100 + block), (3, 3)] {
                shared.store(at + 8 * word, value);
            }
            for node in 1..3u64 {
                // Node i: parent i - 1, function 0, one call.
                let node_at = at + Geometry::NODES as usize + node as usize * size_of::<Node>();
                shared.store(node_at, node - 1);
                shared.store(node_at + 8, 1);
            }
            shared.store(at + geometry.entries_offset() as usize, 5);
        }
        TotalsView::new(shared, geometry)
    }

    #[test]
    fn contexts_past_the_budget_are_not_read_and_their_calls_are_untimed() {
        let view = two_threads();
        let whole = view.totals().expect("totals");
        assert_eq!(whole.over_budget, 0);
        assert!(whole.threads.iter().all(|t| t.nodes.len() == 3 && t.untimed == 0 && t.calls == [5]));

        let one_thread = 3 * size_of::<Node>() as u64;
        let cut = view.totals_within(one_thread + 1).expect("totals");
        assert_eq!(cut.over_budget, 1);
        assert_eq!((cut.threads[0].tid, cut.threads[0].nodes.len(), cut.threads[0].untimed), (100, 3, 0));
        assert_eq!((cut.threads[1].tid, cut.threads[1].nodes.len(), cut.threads[1].untimed), (101, 1, 5));
        assert_eq!(cut.threads[1].calls, [5], "its calls are still counted");
    }

    #[test]
    fn blocks_of_threads_that_ended_are_read_then_emptied_for_others() {
        let view = two_threads();
        // Block 0's thread (100) runs on; block 1's (101) ended.
        let retired = view.retire_ended(|tid| tid == 100, &mut MOST_CONTEXT_BYTES.clone(), &mut TraceCursor::default()).expect("retired");
        assert_eq!(retired.len(), 1);
        assert_eq!((retired[0].tid, retired[0].nodes.len(), retired[0].calls.as_slice()), (101, 3, &[5][..]));
        let at = view.geometry.block(1) as usize;
        assert_eq!(view.shared.load(at), totals::BLOCK_RETIRED);
        assert_eq!(view.shared.load(at + 8 * 3), 0, "its contexts are gone");
        assert_eq!(view.shared.load(at + view.geometry.entries_offset() as usize), 0, "and its calls");
        let left = view.totals().expect("totals");
        assert_eq!(left.threads.iter().map(|t| t.tid).collect::<Vec<_>>(), [100]);
        // A block whose trace ring has calls not read yet waits for them.
        view.shared.store(view.geometry.block(0) as usize + BLOCK_TRACED, 3);
        assert!(view.retire_ended(|_| false, &mut MOST_CONTEXT_BYTES.clone(), &mut TraceCursor::default()).expect("retired").is_empty());
        let mut read = TraceCursor { read: vec![3] };
        assert_eq!(view.retire_ended(|_| false, &mut MOST_CONTEXT_BYTES.clone(), &mut read).expect("retired").len(), 1);
        assert_eq!(read.read[0], 0, "its ring starts again");
        // A block with a call in progress is left alone.
        view.shared.store(view.geometry.block(0) as usize, totals::BLOCK_USED);
        view.shared.store(view.geometry.block(0) as usize + 8, 100);
        view.shared.store(view.geometry.block(0) as usize + 16, 1);
        assert!(view.retire_ended(|_| false, &mut MOST_CONTEXT_BYTES.clone(), &mut TraceCursor::default()).expect("retired").is_empty());
    }

    #[test]
    fn a_frame_that_began_after_a_sample_does_not_name_its_slot() {
        let view = two_threads();
        let at = view.geometry.block(0) as usize;
        // Thread 100 has two frames: entered at TSC 1,000 and 5,000, their
        // return addresses in slots 0x7000 and 0x6f00.
        view.shared.store(at + 16, 2);
        for (depth, (slot, ret, entry)) in [(0x7000, 0x40_1000, 1_000), (0x6f00, 0x40_2000, 5_000)].into_iter().enumerate() {
            let ret_at = at + Geometry::RETURNS as usize + depth * size_of::<totals::Ret>();
            view.shared.store(ret_at, ret);
            view.shared.store(ret_at + 8, slot);
            view.shared.store(at + Geometry::FRAMES as usize + depth * size_of::<totals::Frame>(), entry);
        }
        assert_eq!(view.return_addresses(100, 9_000, 0), [(0x7000, 0x40_1000), (0x6f00, 0x40_2000)]);
        assert_eq!(view.return_addresses(100, 3_000, 0), [(0x7000, 0x40_1000)], "the deeper call began after the sample");
        assert!(view.return_addresses(100, 999, 0).is_empty());
        assert!(view.return_addresses(7, 9_000, 0).is_empty(), "a thread with no block");
        // Returned from the deeper call since: it is read only if the
        // sample's stack held as many hijacked return addresses.
        view.shared.store(at + 16, 1);
        assert_eq!(view.return_addresses(100, 9_000, 0), [(0x7000, 0x40_1000)]);
        assert_eq!(view.return_addresses(100, 9_000, 1).len(), 2);
    }

    /// Writes `calls` finished calls into block 0's trace ring of `view`,
    /// as the runtime does: call n of function n % 2, one cycle long.
    fn write_calls(view: &TotalsView, from: u64, to: u64) {
        let at = view.geometry.block(0) as usize;
        let ring = at + view.geometry.trace_offset() as usize;
        for n in from..to {
            let slot = ring + (n % view.geometry.trace_slots) as usize * size_of::<Traced>();
            view.shared.store(slot, n);
            view.shared.store(slot + 8, n + 1);
            view.shared.store(slot + 16, n % 2);
        }
        view.shared.store(at + BLOCK_TRACED, to);
    }

    fn traced_view(slots: u64) -> TotalsView {
        let geometry = Geometry { functions: 2, blocks: 1, trace_slots: slots, regions: 0 };
        let shared = Shared::anonymous(geometry.shared_bytes() as usize).expect("memory");
        shared.store(0, totals::MAGIC);
        shared.store(HEADER_BLOCKS_TAKEN, 1);
        let at = geometry.block(0) as usize;
        shared.store(at, totals::BLOCK_USED);
        shared.store(at + 8, 42);
        TotalsView::new(shared, geometry)
    }

    fn drain(view: &TotalsView, cursor: &mut TraceCursor) -> (Vec<u64>, u64) {
        let mut starts = Vec::new();
        let missed = view.drain_trace(cursor, &mut |tid, calls| {
            assert_eq!(tid, 42);
            starts.extend(calls.iter().map(|c| c.entry_tsc));
        });
        (starts, missed)
    }

    #[test]
    fn traced_calls_are_read_once_across_the_rings_end_and_overwritten_ones_counted() {
        let view = traced_view(8);
        let mut cursor = TraceCursor::default();
        write_calls(&view, 0, 5);
        assert_eq!(drain(&view, &mut cursor), ((0..5).collect(), 0));
        assert_eq!(drain(&view, &mut cursor), (vec![], 0), "nothing new");
        // Past the ring's end: slots 5, 6, 7, 0, 1, 2.
        write_calls(&view, 5, 11);
        assert_eq!(drain(&view, &mut cursor), ((5..11).collect(), 0));
        // 20 written while proftap looked away: the 12 oldest are gone.
        write_calls(&view, 11, 31);
        assert_eq!(drain(&view, &mut cursor), ((23..31).collect(), 12));
    }

    #[test]
    fn traced_calls_the_runtime_never_writes_are_counted_not_kept() {
        let view = traced_view(8);
        let mut cursor = TraceCursor::default();
        write_calls(&view, 0, 4);
        let ring = view.geometry.block(0) as usize + view.geometry.trace_offset() as usize;
        // Call 1 names function 7 of 2; call 2 returns before it starts.
        view.shared.store(ring + size_of::<Traced>() + 16, 7);
        view.shared.store(ring + 2 * size_of::<Traced>() + 8, 0);
        assert_eq!(drain(&view, &mut cursor), (vec![0, 3], 2));
        // A count going back (the block was emptied behind proftap's back) reads nothing.
        view.shared.store(view.geometry.block(0) as usize + BLOCK_TRACED, 2);
        assert_eq!(drain(&view, &mut cursor), (vec![], 0));
    }

    #[test]
    fn a_thread_id_past_what_the_kernel_gives_is_a_lie() {
        let view = two_threads();
        view.shared.store(view.geometry.block(1) as usize + 8, 1 << 31);
        let error = view.totals().expect_err("a thread id over i32::MAX");
        assert!(error.contains("cannot be believed"), "{error}");
    }
}

//! The in-process engine as a source: its runtime adds every call up in
//! the target, per thread and calling context, so nothing flows per call;
//! a watch thread reads the calls by function for the governor while the
//! program runs, and at the end the totals become per-thread profiles.

use crate::error::RecordError;
use crate::trace::TraceKeeper;
use proftap_probes::arcs;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::patched::Patched;
use proftap_probes::inject::reading::{MOST_CONTEXT_BYTES, ThreadTotals, Totals, TotalsView};
use proftap_probes::inject::threads::{Conversion, Cost, RegionSum, add_regions, thread_profile};
use proftap_probes::inject::watch::{CallTrace, Judge, Unpatched, Watch, Watched};
use proftap_probes::lines::LinePlan;
use proftap_probes::offcpu::{OffCpu, OffCpuSnapshot};
use proftap_probes::parallel;
use proftap_probes::plan::ProbedFunction;
use proftap_probes::target;
use proftap_profile::{BranchRecord, Finding, Note, TRACED_CALL_BYTES, ThreadProfile};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A patched process, watched while it runs.
pub struct InjectSource {
    watch: Watch,
    view: Option<TotalsView>,
    clock: TscClock,
    pid: i32,
    off_cpu: Option<Arc<OffCpu>>,
    /// Calls counted at the last look, by function.
    calls: Vec<u64>,
    /// The trace's limit in bytes, when calls are traced.
    trace_bytes: Option<u64>,
}

/// What the engine left once it stopped.
#[derive(Default)]
pub struct InjectEnding {
    /// Every thread's profile from the engine's totals.
    pub threads: Vec<ThreadProfile>,
    /// Calls it counted, timed or not.
    pub calls: u64,
    /// Per function, its calls after its probes were taken out, which only
    /// its counting trampoline counted (`None`: it had none).
    pub calls_only_counted: Vec<Option<u64>>,
    /// Per function, whether its counting trampoline was taken out too.
    pub counting_stopped: Vec<bool>,
    /// What the user should know of it.
    pub notes: Vec<Note>,
    /// The calls its threads finished one by one, when they were traced.
    pub trace: Option<TraceKeeper>,
    /// Per line id, its entries, when its edge counters counted lines
    /// (`None`: a function on it was not counted).
    pub line_counts: Option<Vec<Option<u64>>>,
    /// Per line id, the conditional jumps counted on it.
    pub line_branches: Vec<Vec<BranchRecord>>,
    /// Per region, what its hooks added up.
    pub regions: Vec<RegionSum>,
}

impl InjectSource {
    /// Watches `patched` from now on; `judge` decides which patched
    /// functions are over budget; `off_cpu` is the array the runtime reads
    /// CPU time from, kept as long as the process may read it; with
    /// `trace_bytes`, finished calls are kept one by one up to that many
    /// bytes. The process goes on from now on.
    pub fn start(
        mut patched: Patched,
        judge: Option<Judge>,
        clock: TscClock,
        off_cpu: Option<Arc<OffCpu>>,
        trace_bytes: Option<u64>,
    ) -> Self {
        let pid = patched.pid();
        let view = patched.view();
        let calls = vec![0; patched.functions()];
        // Let go here, on the thread that holds it (a tracer is a thread),
        // before the watch may need to hold the process again.
        drop(patched.take_hold());
        let trace = trace_bytes.map(|bytes| CallTrace::new(bytes / TRACED_CALL_BYTES));
        let watch = Watch::spawn(patched, judge, trace);
        InjectSource { watch, view, clock, pid, off_cpu, calls, trace_bytes }
    }

    /// Calls counted so far, in all.
    pub fn calls(&mut self) -> u64 {
        let Some(view) = &self.view else { return 0 };
        self.calls.iter_mut().for_each(|c| *c = 0);
        view.calls(&mut self.calls);
        self.calls.iter().fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// Calls by function at the last look ([`Self::calls`]).
    pub fn calls_by_function(&self) -> &[u64] {
        &self.calls
    }

    /// What the judge had unpatched since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.watch.unpatched()
    }

    /// Stops watching, puts the original code back, and makes each
    /// thread's profile of what the runtime added up, calls in progress
    /// ending at `end` (at the exec that replaced the image, if one did).
    /// `names` names threads; the profile measures `metrics` metrics (wall
    /// time, then CPU time); `compensation` is what a patched call costs,
    /// to subtract.
    pub fn finish(
        self,
        end: InjectEnd,
        metrics: usize,
        compensation: Option<[Cost; 2]>,
        lines: Option<(&LinePlan, &[ProbedFunction])>,
        uprobes_held_back: Option<f64>,
        names: &Names<'_>,
    ) -> Result<InjectEnding, RecordError> {
        let mut notes = Vec::new();
        let Watched { mut patched, retired, mut trace } = self.watch.finish();
        // An exec after the code went in replaced the image it patched:
        // nothing of it is to be restored, whatever the new one allows.
        let replaced = end.execs_ns.iter().copied().filter(|&ns| ns > patched.code_since_ns()).min();
        if replaced.is_some() {
            patched.image_replaced();
        }
        // Each live thread's time off CPU as the recording ends: the detach
        // stops them all, which wakes a sleeper and counts its sleep so far.
        // The threads of a process still running, where they could be
        // listed: one not among them has ended.
        let processes: Vec<i32> = std::iter::once(self.pid).chain(patched.running_children()).collect();
        let live: HashMap<i32, HashSet<u32>> = processes
            .iter()
            .filter_map(|&pid| Some((pid, target::threads(pid).ok()?.into_iter().map(|tid| tid as u32).collect())))
            .collect();
        // The runtime keeps times off CPU by the kernel's thread ids, which
        // a process in a pid namespace of its own does not see: none then.
        let off_cpu = self.off_cpu.as_deref().filter(|_| patched.times_off_cpu()).map(|o| o.snapshot(live.values().flatten().copied()));
        if let Err(e) = patched.detach() {
            notes.push(Finding::RestoreFailed { pid: self.pid, error: e.to_string() }.into());
        }
        // Calls finished since the watch's last look, up to the detach.
        if let (Some(trace), Some(view)) = (trace.as_mut(), &self.view) {
            trace.read(view);
        }
        let trace = trace.zip(self.trace_bytes).map(|(trace, bytes)| kept_calls(trace, bytes, &self.clock, self.pid));
        let mut line_branches = Vec::new();
        let line_counts = lines.map(|(plan, functions)| {
            let counted = line_counts(&patched, plan, functions);
            if !counted.not_counted.is_empty() {
                notes.push(Finding::LinesNotCounted { functions: counted.not_counted, budget_percent: uprobes_held_back }.into());
            }
            if !counted.undetermined.is_empty() {
                notes.push(Finding::LinesUndetermined { lines: counted.undetermined }.into());
            }
            line_branches = counted.branches;
            counted.entries
        });
        for (pid, error) in patched.children_not_restored() {
            notes.push(Finding::RestoreFailed { pid: *pid, error: error.clone() }.into());
        }
        let Some(view) = &self.view else {
            return Ok(InjectEnding { notes, trace, line_counts, line_branches, ..InjectEnding::default() });
        };
        let end_ns = end.ns;
        let end_tsc = self.clock.tsc_at(end_ns);
        let how = Conversion { clock: &self.clock, metrics, end_tsc, compensation };
        let mut read = Read::default();
        let off_cpu = off_cpu.as_ref();
        // Calls in progress at an exec never return: they end with the image.
        let image_end = ProcessEnd {
            ns: replaced.map_or(end_ns, |ns| ns.min(end_ns)),
            ended: end.exited && replaced.is_none(),
            live: live.get(&self.pid),
        };
        read.add(self.pid, view.totals().map_err(RecordError::Corrupted)?, &how, image_end, off_cpu, names);
        if let Some(error) = retired.error {
            return Err(RecordError::Corrupted(error));
        }
        read.add_retired(self.pid, &retired.threads, &how, names);
        // A child's memory is its own to spoil: what it wrote is its loss alone.
        let (children, refused) = patched.children();
        // A shell forks hundreds: their threads' profiles are made on every CPU.
        let children = parallel::on_all_cpus(children, CHILDREN_WORTH_THREADS, |child| {
            // Its calls in progress when it ended end then: they never return.
            let end = match child.ended_ns {
                Some(ns) => ProcessEnd { ns: ns.min(end_ns), ended: true, live: None },
                None => ProcessEnd { ns: end_ns, ended: false, live: live.get(&child.pid) },
            };
            let read = child.totals().map(|totals| {
                let profiles = thread_profiles(child.pid, &totals, &how, end, off_cpu, names);
                (totals, profiles)
            });
            (child.pid, read)
        });
        for (pid, child) in children {
            match child {
                Ok((totals, profiles)) => read.add_profiled(&totals, profiles, &how),
                Err(error) => notes.push(Finding::ChildNotRead { pid, error }.into()),
            }
        }
        if refused > 0 {
            notes.push(Finding::ChildrenRefused { children: refused }.into());
        }
        if read.children_unreached > 0 {
            notes.push(Finding::ChildrenUnreached { children: read.children_unreached }.into());
        }
        if read.off_cpu_unmapped > 0 {
            notes.push(Finding::OffCpuUnmapped { pages: read.off_cpu_unmapped }.into());
        }
        if read.untimed > 0 {
            notes.push(Finding::CallsUntimed { calls: read.untimed, unseated: read.unseated }.into());
        }
        if read.unpaired_returns + read.mixed_threads > 0 {
            notes.push(Finding::StacksSwitched { returns: read.unpaired_returns, threads_untimed: read.mixed_threads }.into());
        }
        if read.over_budget > 0 {
            notes.push(Finding::ContextsOverBudget { threads: read.over_budget, budget_bytes: MOST_CONTEXT_BYTES }.into());
        }
        if view.counts_left_unlocked() {
            notes.push(Finding::CountsUnlocked.into());
        }
        if self.off_cpu.is_none() && metrics > 1 {
            notes.push(Finding::CpuIsWall.into());
        }
        let untimed: u64 = read.regions.iter().map(|r| r.untimed).sum();
        let unpaired: u64 = read.regions.iter().map(|r| r.unpaired).sum();
        if untimed + unpaired + read.hooks_missed > 0 {
            notes.push(Finding::RegionsIncomplete { untimed, unpaired, missed: read.hooks_missed }.into());
        }
        let Read { threads, calls, regions, .. } = read;
        let calls_only_counted = patched.calls_only_counted(self.calls.len());
        let counting_stopped = patched.counting_stopped(self.calls.len());
        Ok(InjectEnding { threads, calls, calls_only_counted, counting_stopped, notes, trace, line_counts, line_branches, regions })
    }
}

/// What the edge counters found on the lines of a plan.
struct CountedLines {
    /// Per line id, its entries (`None` for the lines of a function that
    /// was not counted).
    entries: Vec<Option<u64>>,
    /// Per line id, its conditional jumps.
    branches: Vec<Vec<BranchRecord>>,
    /// The functions not counted ("name: why").
    not_counted: Vec<String>,
    /// The lines whose entries the counts do not tell ("file:line").
    undetermined: Vec<String>,
}

/// The lines of `plan` as the edge counters of `patched` counted them.
fn line_counts(patched: &Patched, plan: &LinePlan, functions: &[ProbedFunction]) -> CountedLines {
    let mut counts = vec![Some(0u64); plan.lines.len()];
    let mut branches: Vec<Vec<BranchRecord>> = vec![Vec::new(); plan.lines.len()];
    let mut undetermined: Vec<u32> = Vec::new();
    let name = |i: usize| functions.get(i).map_or_else(|| format!("function {i}"), |f| f.info.name.clone());
    let mut not_counted: Vec<(usize, String)> = patched.uncounted().to_vec();
    let by_function = plan.by_function();
    let lines_of = |f: usize| by_function.get(f).cloned().unwrap_or_default();
    if let Some(counting) = patched.counting() {
        for counted in counting.functions() {
            let lines = lines_of(counted.function).moved_by(counted.bias);
            let counted_lines = counting.counts(counted).and_then(|c| {
                let entered = arcs::line_entries(counted.cfg(), &c, &lines)?;
                Ok((entered, arcs::line_branches(counted.cfg(), &c, &lines)))
            });
            match counted_lines {
                Ok((entries, jumps)) => {
                    for &(line, _) in &entries.undetermined {
                        if let Some(count) = counts.get_mut(line as usize) {
                            *count = None;
                        }
                        undetermined.push(line);
                    }
                    for (line, n) in entries.entered {
                        if let Some(Some(total)) = counts.get_mut(line as usize) {
                            *total = total.saturating_add(n);
                        }
                    }
                    for (line, jump) in jumps {
                        if let Some(on_line) = branches.get_mut(line as usize) {
                            on_line.push(BranchRecord { taken: jump.taken, not_taken: jump.not_taken });
                        }
                    }
                }
                Err(e) => not_counted.push((counted.function, e.to_string())),
            }
        }
    }
    for (function, _) in &not_counted {
        for line in lines_of(*function).ids() {
            if let Some(count) = counts.get_mut(line as usize) {
                *count = None;
            }
        }
    }
    let not_counted = not_counted.into_iter().map(|(i, why)| format!("{}: {why}", name(i))).collect();
    undetermined.sort_unstable();
    undetermined.dedup();
    let undetermined =
        undetermined.iter().filter_map(|&l| plan.lines.get(l as usize)).map(|(file, line)| format!("{file}:{line}")).collect();
    CountedLines { entries: counts, branches, not_counted, undetermined }
}

/// The calls `trace` read from process `pid`, with CLOCK_MONOTONIC times, within `bytes`.
fn kept_calls(trace: CallTrace, bytes: u64, clock: &TscClock, pid: i32) -> TraceKeeper {
    let mut keeper = TraceKeeper::new(bytes);
    keeper.cut(trace.cut);
    keeper.missed(trace.missed);
    for (tid, calls) in trace.threads {
        for c in calls {
            // Timed as the totals are, the same duration to the nanosecond,
            // and ended at its return's own time: a call and its caller may
            // return within a nanosecond (a tick of a virtual machine's
            // TSC), and each start and duration rounded down apart would
            // end the call after its caller.
            let end = clock.ns(c.exit_tsc);
            let start = end.saturating_sub(clock.duration_ns(c.exit_tsc - c.entry_tsc));
            keeper.call(pid, tid as i32, c.function, start, end, c.depth);
        }
    }
    keeper
}

/// Children enough to be read on threads of their own.
const CHILDREN_WORTH_THREADS: usize = 16;

/// What the engine added up, over the patched process and its children.
#[derive(Default)]
struct Read {
    threads: Vec<ThreadProfile>,
    calls: u64,
    untimed: u64,
    unseated: u64,
    over_budget: u64,
    regions: Vec<RegionSum>,
    /// Region hooks the runtime did not see.
    hooks_missed: u64,
    /// Returns that found no frame of their own, sent back to their call sites.
    unpaired_returns: u64,
    /// Threads whose calls interleaved on two stacks: later calls untimed.
    mixed_threads: u64,
    /// Forked children that could not hand their memory over, and ran unrecorded.
    children_unreached: u64,
    /// Pages of the off-CPU array processes could not map.
    off_cpu_unmapped: u64,
}

impl Read {
    /// Adds threads of process `pid` that ended while it ran (their blocks
    /// were emptied for other threads): no call of theirs was in progress.
    fn add_retired(&mut self, pid: i32, threads: &[ThreadTotals], how: &Conversion<'_>, names: &Names<'_>) {
        self.threads.extend(threads.iter().map(|t| thread_profile(pid, names(t.tid), t, None, how)));
        self.calls = threads.iter().flat_map(|t| &t.calls).fold(self.calls, |sum, c| sum.saturating_add(*c));
        self.untimed = threads.iter().fold(self.untimed, |sum, t| sum.saturating_add(t.untimed));
        self.add_incomplete(threads, how);
    }

    /// Adds what `threads` left untimed besides their calls: regions, and
    /// returns of stacks the program switched.
    fn add_incomplete(&mut self, threads: &[ThreadTotals], how: &Conversion<'_>) {
        for thread in threads {
            add_regions(&mut self.regions, thread, how);
            self.hooks_missed = self.hooks_missed.saturating_add(thread.hooks_missed);
            self.unpaired_returns = self.unpaired_returns.saturating_add(thread.unpaired);
            self.mixed_threads += u64::from(thread.mixed);
        }
    }

    /// Adds process `pid`'s `totals`, with each thread's time off CPU from
    /// `off_cpu`, its calls in progress ending at `end`.
    fn add(
        &mut self,
        pid: i32,
        totals: Totals,
        how: &Conversion<'_>,
        end: ProcessEnd,
        off_cpu: Option<&OffCpuSnapshot<'_>>,
        names: &Names<'_>,
    ) {
        let profiles = thread_profiles(pid, &totals, how, end, off_cpu, names);
        self.add_profiled(&totals, profiles, how);
    }

    /// Adds a process's `totals`, whose threads' profiles are `profiles`.
    fn add_profiled(&mut self, totals: &Totals, profiles: Vec<ThreadProfile>, how: &Conversion<'_>) {
        self.threads.extend(profiles);
        self.calls =
            totals.threads.iter().flat_map(|t| &t.calls).fold(self.calls.saturating_add(totals.unseated), |sum, c| sum.saturating_add(*c));
        self.untimed = totals.threads.iter().fold(self.untimed.saturating_add(totals.unseated), |sum, t| sum.saturating_add(t.untimed));
        self.unseated = self.unseated.saturating_add(totals.unseated);
        self.over_budget += totals.over_budget;
        self.add_incomplete(&totals.threads, how);
        self.hooks_missed = self.hooks_missed.saturating_add(totals.unseated_hooks);
        self.unpaired_returns = self.unpaired_returns.saturating_add(totals.unseated_returns);
        self.children_unreached = self.children_unreached.saturating_add(totals.children_unreached);
        self.off_cpu_unmapped = self.off_cpu_unmapped.saturating_add(totals.off_cpu_unmapped);
    }
}

/// Thread names by thread id.
type Names<'a> = dyn Fn(u32) -> String + Sync + 'a;

/// The profiles of the threads of process `pid` in `totals`, with each
/// thread's time off CPU from `off_cpu`, its calls in progress ending at `end`.
fn thread_profiles(
    pid: i32,
    totals: &Totals,
    how: &Conversion<'_>,
    end: ProcessEnd,
    off_cpu: Option<&OffCpuSnapshot<'_>>,
    names: &Names<'_>,
) -> Vec<ThreadProfile> {
    let profile = |t: &ThreadTotals| {
        let entry = off_cpu.and_then(|o| o.entry(t.tid));
        // A thread that ended (with its process, or by `pthread_exit` from
        // within calls that never return) left its CPU for the last time as
        // it ended: its calls in progress end then, not with the recording.
        let ended = end.ended || end.live.is_some_and(|live| !live.contains(&t.tid));
        let left = entry.and_then(|e| e.left_at_ns()).filter(|&left| ended && left <= end.ns);
        let end_ns = left.unwrap_or(end.ns);
        let off_now = entry.map(|e| e.off_cpu_ns_at(end_ns));
        thread_profile(pid, names(t.tid), t, off_now, &Conversion { end_tsc: how.clock.tsc_at(end_ns), ..*how })
    };
    totals.threads.iter().map(profile).collect()
}

/// When an in-process recording ends (CLOCK_MONOTONIC ns).
pub struct InjectEnd {
    /// The end of the recording.
    pub ns: u64,
    /// Whether the process had exited by then.
    pub exited: bool,
    /// When the process executed programs: one after the engine's code
    /// went in ended the image it patched.
    pub execs_ns: Vec<u64>,
}

/// When a process's calls still in progress end.
#[derive(Clone, Copy)]
struct ProcessEnd<'a> {
    /// The end of the recording, or when the process was seen to end
    /// (CLOCK_MONOTONIC).
    ns: u64,
    /// Whether it had ended by then: each of its threads' calls then end
    /// when the thread last left a CPU.
    ended: bool,
    /// Its threads alive as the recording ended, where they were listed:
    /// the calls of one that had ended end as it did.
    live: Option<&'a HashSet<u32>>,
}

/// Refuses a program that may unwind (an exception, a panic, `backtrace()`)
/// when an unwinder entry could not be hooked: an unwinder would meet a
/// hijacked return address.
pub fn check_unwinders(engine: &Patched, may_unwind: bool) -> Result<(), RecordError> {
    if engine.unhooked().is_empty() || !may_unwind {
        return Ok(());
    }
    Err(RecordError::Unhooked { entries: engine.unhooked().join(", ") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_probes::inject::totals::Traced;

    /// A call and its caller that return within a tick of each other end in
    /// that order, however their starts and durations round, and each
    /// lasts what the totals say to the nanosecond.
    #[test]
    fn a_traced_call_ends_no_later_than_its_caller() {
        // Three ticks a nanosecond: the caller starts at tick 2, its call
        // at tick 3, and both return at tick 4. Each start and duration
        // rounded down apart ended the caller at 0 ns and the call at 1.
        let clock = TscClock::with_rate(3, 1);
        let mut trace = CallTrace::default();
        let call = Traced { entry_tsc: 3, exit_tsc: 4, function: 1, depth: 1 };
        let caller = Traced { entry_tsc: 2, exit_tsc: 4, function: 0, depth: 0 };
        trace.threads.insert(7, vec![call, caller]);
        let kept = kept_calls(trace, 1 << 20, &clock, 7).into_trace(0);
        let calls = &kept.threads[0].calls;
        assert_eq!((calls[0].depth, calls[1].depth), (0, 1), "{calls:?}");
        assert!(calls[1].end_ns() <= calls[0].end_ns(), "{calls:?}");
        assert_eq!((calls[0].duration_ns, calls[1].duration_ns), (clock.duration_ns(2), clock.duration_ns(1)));
    }
}

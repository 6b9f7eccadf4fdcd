//! The in-process engine as a source: its runtime adds every call up in
//! the target, per thread and calling context, so nothing flows per call;
//! a watch thread reads the calls by function for the governor while the
//! program runs, and at the end the totals become per-thread profiles.

use crate::error::RecordError;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::patched::Patched;
use proftap_probes::inject::reading::{MOST_CONTEXT_BYTES, ThreadTotals, TotalsView};
use proftap_probes::inject::threads::{Conversion, Cost, thread_profile};
use proftap_probes::inject::watch::{Judge, Unpatched, Watch};
use proftap_probes::offcpu::OffCpu;
use proftap_probes::plan::ProbedFunction;
use proftap_profile::{Finding, Note, ThreadProfile};
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
}

/// What the engine left once it stopped.
pub struct InjectEnding {
    /// Every thread's profile from the engine's totals.
    pub threads: Vec<ThreadProfile>,
    /// Calls it counted, timed or not.
    pub calls: u64,
    /// What the user should know of it.
    pub notes: Vec<Note>,
}

impl InjectSource {
    /// Watches `patched` from now on; `judge` decides which patched
    /// functions are over budget; `off_cpu` is the array the runtime reads
    /// CPU time from, kept as long as the process may read it. The process
    /// goes on from now on.
    pub fn start(mut patched: Patched, judge: Option<Judge>, clock: TscClock, off_cpu: Option<Arc<OffCpu>>) -> Self {
        let pid = patched.pid();
        let view = patched.view();
        let calls = vec![0; patched.functions()];
        // Let go here, on the thread that holds it (a tracer is a thread),
        // before the watch may need to hold the process again.
        drop(patched.take_hold());
        let watch = Watch::spawn(patched, judge);
        InjectSource { watch, view, clock, pid, off_cpu, calls }
    }

    /// Calls counted so far, in all.
    pub fn calls(&mut self) -> u64 {
        let Some(view) = &self.view else { return 0 };
        self.calls.iter_mut().for_each(|c| *c = 0);
        view.calls(&mut self.calls);
        self.calls.iter().fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// A thread's original return addresses by stack slot, for unwinding its samples.
    pub fn return_addresses(&self, tid: u32) -> Vec<(u64, u64)> {
        self.view.as_ref().map(|v| v.return_addresses(tid)).unwrap_or_default()
    }

    /// What the judge had unpatched since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.watch.unpatched()
    }

    /// Stops watching, puts the original code back, and makes each
    /// thread's profile of what the runtime added up, calls in progress
    /// ending at `end_ns` (CLOCK_MONOTONIC). `names` names threads; the
    /// profile measures `metrics` metrics (wall time, then CPU time);
    /// `compensation` is what a patched call costs, to subtract.
    pub fn finish(
        self,
        end_ns: u64,
        metrics: usize,
        compensation: Option<[Cost; 2]>,
        names: &dyn Fn(u32) -> String,
    ) -> Result<InjectEnding, RecordError> {
        let mut notes = Vec::new();
        let mut patched = self.watch.finish();
        if let Err(e) = patched.detach() {
            notes.push(Finding::RestoreFailed { pid: self.pid, error: e.to_string() }.into());
        }
        let Some(view) = &self.view else { return Ok(InjectEnding { threads: Vec::new(), calls: 0, notes }) };
        let totals = view.totals().map_err(RecordError::Corrupted)?;
        let end_tsc = self.clock.tsc_at(end_ns);
        let how = Conversion { clock: &self.clock, metrics, end_tsc, compensation };
        let off_now = |t: &ThreadTotals| self.off_cpu.as_ref().and_then(|o| o.off_cpu_ns(t.tid)).map(|ns| self.clock.cycles_of(ns));
        let threads: Vec<ThreadProfile> =
            totals.threads.iter().map(|t| thread_profile(self.pid, names(t.tid), t, off_now(t), &how)).collect();
        let calls = totals.threads.iter().flat_map(|t| &t.calls).fold(totals.unseated, |sum, c| sum.saturating_add(*c));
        let untimed: u64 = totals.threads.iter().map(|t| t.untimed).sum::<u64>() + totals.unseated;
        if untimed > 0 {
            notes.push(Finding::CallsUntimed { calls: untimed, unseated: totals.unseated }.into());
        }
        if totals.over_budget > 0 {
            notes.push(Finding::ContextsOverBudget { threads: totals.over_budget, budget_bytes: MOST_CONTEXT_BYTES }.into());
        }
        if self.off_cpu.is_none() && metrics > 1 {
            notes.push(Finding::CpuIsWall.into());
        }
        Ok(InjectEnding { threads, calls, notes })
    }
}

/// Refuses a program that may unwind (an exception, a panic, `backtrace()`)
/// when an unwinder entry could not be hooked: an unwinder would meet a
/// hijacked return address.
pub fn check_unwinders(engine: &Patched, functions: &[ProbedFunction]) -> Result<(), RecordError> {
    if engine.unhooked().is_empty() || functions.iter().all(|f| f.exit_sites.is_none()) {
        return Ok(());
    }
    Err(RecordError::Unhooked { entries: engine.unhooked().join(", ") })
}

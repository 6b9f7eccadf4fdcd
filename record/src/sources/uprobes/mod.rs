//! Kernel uprobes as an event source: probes defined in tracefs, opened per
//! task and CPU with `inherit` so every thread and forked child is followed,
//! read from per-CPU ring buffers. The same perf events carry the sideband
//! records (threads, names, mappings), context switches and stack samples.
//! The probe set can be replaced while the target runs.

mod perf_events;
mod reader;

use crate::error::RecordError;
use crate::events::Event;
use crate::sources::monotonic_ns;
pub use perf_events::TaskRecords;
use perf_events::{Defined, PerfEvents, ProbeSet, Unregistering};
use proftap_probes::lines::LinePlan;
use proftap_probes::metrics::Metric;
use proftap_probes::plan::ProbedFunction;
use proftap_probes::target::Frozen;
use reader::RingReader;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The uprobe events of a recording and their ring buffers.
pub struct UprobeSource {
    events: PerfEvents,
    /// Once the events are open on the target.
    reader: Option<RingReader>,
    /// The first parts' probe ids by generation, until the reader takes them.
    first_taps: Vec<(u32, Vec<reader::Tap>)>,
    counters: usize,
    /// Replaced probe sets, out of the targets, unregistered at the end.
    unregistering: Vec<Unregistering>,
    /// The probe set to replace the current one, being defined.
    replacement: Option<Replacement>,
    /// Per function: the part of the probes its own are in (see
    /// [`perf_events::Part`]).
    part_of: Vec<usize>,
    /// Per function: probed now.
    enabled: Vec<bool>,
}

/// A probe set defined on a thread of its own, to replace the current one
/// once defined: meanwhile the rings are read, where a definition made on
/// the reading thread (a second or more with thousands of uprobes defined)
/// let them overflow.
struct Replacement {
    changes: Changes,
    defining: std::thread::JoinHandle<Result<Vec<DefinedPart>, RecordError>>,
}

impl Drop for UprobeSource {
    fn drop(&mut self) {
        // Its definitions go once defined, not left behind by a thread.
        self.drop_replacement();
    }
}

/// What a replacement changes once it is in.
struct Changes {
    /// Functions no longer probed.
    removed: Vec<u32>,
    /// Functions probed before whose parts are defined again.
    redefined: Vec<u32>,
    /// Per function: probed once it is in.
    enabled: Vec<bool>,
}

/// A part of the probes, defined: its number, its uprobes and their ids.
type DefinedPart = (usize, Defined, Vec<reader::Tap>);

/// Defines the probes of the `enabled` functions of `all` in the parts
/// `numbers` (each function's part: `part_of`).
fn define_parts(
    all: &[ProbedFunction],
    lines: Option<&LinePlan>,
    enabled: &[bool],
    part_of: &[usize],
    numbers: &[usize],
) -> Vec<(usize, ProbeSet)> {
    numbers.iter().map(|&n| (n, ProbeSet::new(all, enabled, lines, |f| part_of.get(f) == Some(&n)))).collect()
}

fn define_each(sets: Vec<(usize, ProbeSet)>) -> Result<Vec<DefinedPart>, RecordError> {
    sets.into_iter().map(|(n, set)| Ok((n, Defined::new(&set.specs)?, set.taps))).collect()
}

/// What reading the rings left to tell once they are closed.
pub struct UprobesEnding {
    /// Samples the probe events counted as lost.
    pub lost_samples: u64,
    /// Records that could not be read.
    pub malformed: u64,
    /// Forked processes not sampled (see [`PerfEvents::unsampled_children`]).
    pub unsampled_children: u64,
    /// Stacks were sampled on every CPU.
    pub sampled_on_every_cpu: bool,
    /// The uprobes, out of the targets.
    pub withdrawn: Withdrawn,
}

/// Uprobes out of every target, unregistered when this is dropped (which
/// waits for grace periods, each set for its own, in parallel: best once
/// the targets are gone). Not while they run: the kernel holds its event
/// mutex through those grace periods, and a target's thread that starts
/// or ends copies or frees its inherited probe events under that mutex,
/// stalled for as long (200 ms seen).
pub struct Withdrawn {
    sets: Vec<Unregistering>,
}

impl Drop for Withdrawn {
    fn drop(&mut self) {
        // Each set (one per change of the probes) waits two grace periods,
        // one as its events close and one as its definitions go: the sets
        // wait them together rather than one after another.
        let sets = std::mem::take(&mut self.sets).into_iter().map(|set| Box::new(set) as Box<dyn Send>).collect();
        proftap_probes::perf::close_in_parallel(sets);
    }
}

impl UprobeSource {
    /// The events for `metrics` (and stack sampling at `sampling` (hz,
    /// stack bytes)), with the probes of the `enabled` functions of `all`
    /// and their lines defined; each task's events report `task_records`.
    pub fn new(
        all: &[ProbedFunction],
        enabled: &[bool],
        lines: Option<&LinePlan>,
        metrics: &[Metric],
        sampling: Option<(u64, u32)>,
        buffer_bytes: usize,
        task_records: TaskRecords,
    ) -> Result<Self, RecordError> {
        let mut events = PerfEvents::new(metrics, sampling, buffer_bytes);
        events.task_records = task_records;
        // A hundred-odd functions to a part at least: a replacement defines
        // again the parts of the functions it changes, which takes longer
        // the larger they are, and each part it withdraws waits grace
        // periods to be unregistered at the end, one after another.
        const FEWEST_FUNCTIONS_PER_PART: usize = 128;
        let parts = events.most_parts().min(all.len().div_ceil(FEWEST_FUNCTIONS_PER_PART)).max(1);
        let part_of: Vec<usize> = (0..all.len()).map(|f| f * parts / all.len().max(1)).collect();
        let numbers: Vec<usize> = (0..parts).collect();
        let (_, first_taps) = events.adopt(define_each(define_parts(all, lines, enabled, &part_of, &numbers))?);
        let enabled = (0..all.len()).map(|f| enabled.get(f).copied().unwrap_or(true)).collect();
        Ok(UprobeSource {
            events,
            reader: None,
            first_taps,
            counters: metrics.len() - 1,
            unregistering: Vec::new(),
            replacement: None,
            part_of,
            enabled,
        })
    }

    /// Opens the events on a launched program, held before its `exec`: they
    /// start with it.
    pub fn open_launched(&mut self, pid: i32) -> Result<(), RecordError> {
        self.events.open_task(pid, pid, true)?;
        self.start_reading();
        Ok(())
    }

    /// Opens the events on each thread of running process `pid`, held still.
    pub fn open_attached(&mut self, pid: i32, threads: &[i32]) -> Result<(), RecordError> {
        for &tid in threads {
            self.events.open_task(pid, tid, false)?;
        }
        self.start_reading();
        Ok(())
    }

    fn start_reading(&mut self) {
        let mut reader = RingReader::new(self.events.take_buffers(), self.counters);
        reader.add_sources(self.events.take_sources());
        for (generation, taps) in std::mem::take(&mut self.first_taps) {
            reader.add_generation(generation, taps);
        }
        self.reader = Some(reader);
    }

    /// The descriptors that become readable when the rings have records.
    pub fn readiness(&self) -> Vec<BorrowedFd<'_>> {
        let buffers = self.reader.as_ref().map(|r| r.buffers()).unwrap_or_default();
        // SAFETY: the buffers' events stay open as long as `self`.
        buffers.iter().map(|b| unsafe { BorrowedFd::borrow_raw(b.owner().as_raw_fd()) }).collect()
    }

    /// Moves what the rings hold into `into`.
    pub fn drain(&mut self, into: &mut Vec<Event>) {
        if let Some(reader) = self.reader.as_mut() {
            reader.drain(into);
        }
    }

    /// Entry hits read so far, by function (shorter when the last functions
    /// had none): what the overhead governor judges, as soon as they are
    /// read rather than once ordered.
    pub fn entries(&self) -> &[u64] {
        self.reader.as_ref().map_or(&[], |r| r.entries())
    }

    /// Line probe hits read so far, by line probe (see [`Self::entries`]).
    pub fn line_hits(&self) -> &[u64] {
        self.reader.as_ref().map_or(&[], |r| r.line_hits())
    }

    /// Replaces the probe set by the probes of the `enabled` functions of
    /// `all` while the threads of `processes` are held still (see
    /// [`UprobeSource::install_replacement`]), waiting for its definition.
    pub fn replace(
        &mut self,
        all: &[ProbedFunction],
        lines: Option<&LinePlan>,
        processes: &[i32],
        enabled: &[bool],
        into: &mut Vec<Event>,
    ) -> Result<(), RecordError> {
        self.begin_replacement(all, lines, enabled, Vec::new());
        self.install_replacement(processes, true, into).unwrap_or(Ok(()))
    }

    /// Starts defining the probes of the `enabled` functions of `all`, to
    /// replace the current set; the functions in `removed` will no longer
    /// be instrumented. Only the parts of the functions whose probes change
    /// are defined again. A replacement already under way is dropped.
    pub fn begin_replacement(&mut self, all: &[ProbedFunction], lines: Option<&LinePlan>, enabled: &[bool], removed: Vec<u32>) {
        self.drop_replacement();
        let enabled: Vec<bool> = (0..all.len()).map(|f| enabled.get(f).copied().unwrap_or(true)).collect();
        let mut numbers: Vec<usize> = (0..all.len()).filter(|&f| enabled[f] != self.enabled[f]).map(|f| self.part_of[f]).collect();
        numbers.sort_unstable();
        numbers.dedup();
        let redefined = (0..all.len()).filter(|&f| self.enabled[f] && numbers.contains(&self.part_of[f])).map(|f| f as u32).collect();
        let sets = define_parts(all, lines, &enabled, &self.part_of, &numbers);
        let defining = std::thread::spawn(move || define_each(sets));
        self.replacement = Some(Replacement { changes: Changes { removed, redefined, enabled }, defining });
    }

    /// Whether a replacement is being defined.
    pub fn replacing(&self) -> bool {
        self.replacement.is_some()
    }

    /// Whether a replacement is defined, ready to be put in.
    pub fn defined(&self) -> bool {
        self.replacement.as_ref().is_some_and(|r| r.defining.is_finished())
    }

    /// Puts in the probe set [`UprobeSource::begin_replacement`] started,
    /// once it is defined (`wait`: waiting for that), while the threads of
    /// `processes` are held still, so no call is missed or seen twice;
    /// `into` gets the event that says which functions are no longer
    /// instrumented. None while it is still being defined, or when none is
    /// under way. The old set goes while the threads are still held:
    /// removing a uprobe waits for a grace period that a thread hitting
    /// probes all the time delays.
    pub fn install_replacement(&mut self, processes: &[i32], wait: bool, into: &mut Vec<Event>) -> Option<Result<(), RecordError>> {
        if !wait && !self.defined() {
            return None;
        }
        let replacement = self.replacement.take()?;
        // A panic there is proftap's bug, as it would have been here.
        let defined = replacement.defining.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some(defined.and_then(|defined| self.install(defined, replacement.changes, processes, into)))
    }

    fn install(
        &mut self,
        defined: Vec<DefinedPart>,
        changes: Changes,
        processes: &[i32],
        into: &mut Vec<Event>,
    ) -> Result<(), RecordError> {
        let Some(reader) = self.reader.as_mut() else { return Ok(()) };
        let numbers: Vec<usize> = defined.iter().map(|(n, _, _)| *n).collect();
        let (retired, generations) = self.events.adopt(defined);
        let mut frozen: Vec<Frozen> = Vec::new();
        for &pid in processes {
            match Frozen::freeze(pid) {
                Ok(held) => frozen.push(held),
                // A process that ended meanwhile has nothing to probe.
                Err(_) if !std::path::Path::new(&format!("/proc/{pid}")).exists() => {}
                // Not held, its threads would get none of the new probes.
                Err(e) => {
                    self.events.restore(retired);
                    return Err(e.into());
                }
            }
        }
        let owners = reader.owners();
        // Beside the old set, open until the new one is.
        let tasks = 2 * frozen.iter().map(|f| f.threads().len()).sum::<usize>();
        for tid in frozen.iter().flat_map(Frozen::threads) {
            // A thread that ended meanwhile has nothing to probe.
            match self.events.open_probes(tid, &numbers, tasks, &owners) {
                Ok(()) => {}
                Err(RecordError::Perf { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    // The old set stays, whole, while the threads are still
                    // held: no call goes unseen.
                    drop(owners);
                    self.events.restore(retired);
                    return Err(e);
                }
            }
        }
        drop(owners);
        let at = monotonic_ns();
        for old in retired.generations() {
            reader.retire(old, at);
        }
        let new = generations.iter().map(|(generation, _)| *generation).collect();
        for (generation, taps) in generations {
            reader.add_generation(generation, taps);
        }
        reader.add_sources(self.events.take_sources());
        let Changes { removed, redefined, enabled } = changes;
        into.push(Event::ProbesReplaced { time: at, generations: new, removed, redefined: Some(redefined), uncounted: Vec::new() });
        self.enabled = enabled;
        self.unregistering.extend(retired.withdraw());
        Ok(())
    }

    /// Drops a replacement under way: its definitions go once defined.
    fn drop_replacement(&mut self) {
        if let Some(replacement) = self.replacement.take() {
            drop(replacement.defining.join());
        }
    }

    /// Stops every probe and reads what is left into `into`; a replacement
    /// still being defined is not put in.
    pub fn stop(&mut self, into: &mut Vec<Event>) {
        self.drop_replacement();
        self.events.disable();
        self.drain(into);
    }

    /// Closes the events; the probes come out of the targets at once.
    pub fn finish(mut self) -> UprobesEnding {
        let lost_samples = self.events.lost_samples();
        let malformed = self.reader.as_ref().map_or(0, |r| r.malformed);
        let unsampled_children = self.events.unsampled_children();
        let sampled_on_every_cpu = self.events.samples_on_every_cpu();
        let mut closing = self.reader.take().map(RingReader::into_open).unwrap_or_default();
        closing.extend(self.events.take_open());
        proftap_probes::perf::close_in_parallel(closing);
        self.unregistering.extend(self.events.withdraw());
        UprobesEnding {
            lost_samples,
            malformed,
            unsampled_children,
            sampled_on_every_cpu,
            withdrawn: Withdrawn { sets: std::mem::take(&mut self.unregistering) },
        }
    }
}

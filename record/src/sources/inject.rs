//! The in-process engine as an event source: the records its runtime
//! writes in the target, drained on a thread of their own, become probe
//! hits on the monotonic clock, as a uprobe would report them.

use crate::error::RecordError;
use crate::events::{Event, Hit, ProbeId, Values};
use crate::sources::monotonic_ns;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::runtime::{SLOTS, STACK_DEPTH};
use proftap_probes::inject::tracing::{Call, CallKind, Drainer, Judge, Tracing, Unpatched};
use proftap_probes::metrics::MAX_METRICS;
use proftap_probes::plan::ProbedFunction;
use proftap_profile::{Finding, Note};

/// Records drained and turned into events per turn of the recording, at
/// most: a bounded helping keeps proftap's memory bounded when the program
/// makes calls faster than they can be aggregated.
const MOST_PER_TURN: usize = 1 << 20;

/// A patched process's records.
pub struct InjectSource {
    drainer: Drainer,
    clock: TscClock,
    pid: i32,
    calls: Vec<Call>,
}

/// What the engine left to tell once it stopped.
pub struct InjectEnding {
    /// Entries and returns lost (rings full, calls not timed), also
    /// among the events as losses.
    pub lost: u64,
    /// What the user should know of it.
    pub notes: Vec<Note>,
    /// Why its records cannot be believed, if the target corrupted them.
    pub corrupted: Option<String>,
}

impl InjectSource {
    /// Drains `tracing` from now on, its clock converted with `clock`;
    /// `judge` decides which patched functions are over budget. The process
    /// goes on once the drainer runs (a thread calling a tiny function
    /// fills its ring in milliseconds).
    pub fn start(mut tracing: Tracing, judge: Option<Judge>, clock: TscClock) -> Self {
        let pid = tracing.pid();
        let hold = tracing.take_hold();
        let drainer = Drainer::spawn(tracing, judge);
        drop(hold);
        InjectSource { drainer, clock, pid, calls: Vec::new() }
    }

    /// Moves the records drained so far into `into`, as hits of probe set `generation`.
    pub fn drain(&mut self, into: &mut Vec<Event>, generation: u32) {
        self.calls.clear();
        self.drainer.take(&mut self.calls, MOST_PER_TURN);
        hits(&self.calls, &mut self.clock, self.pid, generation, into);
    }

    /// Functions the judge had unpatched since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.drainer.unpatched()
    }

    /// Why the process's records cannot be believed, if it corrupted them.
    pub fn corrupted(&self) -> Option<String> {
        self.drainer.corrupted()
    }

    /// Stops draining, puts the original code back, and moves what is left
    /// into `into`, with the engine's losses (counted with the kernel's, by
    /// thread).
    pub fn finish(mut self, into: &mut Vec<Event>, generation: u32) -> InjectEnding {
        let mut notes = Vec::new();
        self.calls.clear();
        let mut engine = self.drainer.finish(&mut self.calls);
        if let Err(e) = engine.detach() {
            notes.push(Finding::RestoreFailed { pid: self.pid, error: e.to_string() }.into());
        }
        engine.drain(&mut self.calls);
        hits(&self.calls, &mut self.clock, self.pid, generation, into);
        let now = monotonic_ns();
        let mut lost = 0;
        for (tid, count) in engine.lost() {
            lost += count;
            into.push(Event::Lost { time: now, tid, probe: None, count });
        }
        if lost > 0 {
            notes.push(Finding::EngineRecordsLost { records: lost }.into());
        }
        // Untimed calls: an entry and a return each, lost.
        let (too_deep, without_slot) = engine.untimed();
        for &(tid, calls) in &too_deep {
            lost += 2 * calls;
            into.push(Event::Lost { time: now, tid, probe: None, count: 2 * calls });
        }
        if without_slot > 0 {
            lost += 2 * without_slot;
            into.push(Event::Lost { time: now, tid: 0, probe: None, count: 2 * without_slot });
        }
        let too_deep: u64 = too_deep.iter().map(|&(_, calls)| calls).sum();
        if too_deep + without_slot > 0 {
            notes.push(Finding::Untimed { too_deep, without_slot, stack_depth: STACK_DEPTH, slots: SLOTS }.into());
        }
        InjectEnding { lost, notes, corrupted: engine.corrupted() }
    }
}

/// The engine's records as probe hits of process `pid`.
fn hits(calls: &[Call], clock: &mut TscClock, pid: i32, generation: u32, into: &mut Vec<Event>) {
    clock.refresh();
    for call in calls {
        let mut values: Values = [0; MAX_METRICS];
        values[0] = clock.ns(call.tsc);
        into.push(Event::Hit(Hit {
            pid: pid as u32,
            tid: call.tid,
            probe: match call.kind {
                CallKind::Exit => ProbeId::exit(call.function),
                CallKind::Entry | CallKind::Catch => ProbeId::entry(call.function),
            },
            // As a uprobe reports it: at an entry where the return address
            // is, after a return just above it.
            sp: if call.kind == CallKind::Exit { call.slot + 8 } else { call.slot },
            ret: call.ret,
            cpu: 0,
            generation,
            values,
        }));
    }
}

/// Refuses a program that may unwind (an exception, a panic, `backtrace()`)
/// when an unwinder entry could not be hooked: an unwinder would meet a
/// hijacked return address.
pub fn check_unwinders(engine: &Tracing, functions: &[ProbedFunction]) -> Result<(), RecordError> {
    if engine.unhooked().is_empty() || functions.iter().all(|f| f.exit_sites.is_none()) {
        return Ok(());
    }
    Err(RecordError::Unhooked { entries: engine.unhooked().join(", ") })
}

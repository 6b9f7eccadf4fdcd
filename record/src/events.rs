//! The one event type every source of a recording speaks (kernel uprobes,
//! the in-process engine, the sampler's perf events) and the aggregator
//! consumes, in time order.

use proftap_probes::inject::patcher::CountingStub;
use proftap_probes::metrics::MAX_METRICS;
use proftap_probes::sampling::StackSample;
use serde::{Deserialize, Serialize};

/// Metric values at one moment of one thread: index 0 is the time (wall
/// nanoseconds), the others the counters of the recording's metrics in order.
///
/// In events, counters are the thread's counts *on one CPU* (the kernel
/// keeps an inherited counter per CPU); the aggregator sums them.
pub type Values = [u64; MAX_METRICS];

/// Which probe fired: a function's entry or its return, or a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProbeId(u32);

/// What a probe hit marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitKind {
    /// A function's entry.
    Entry,
    /// A function's return.
    Exit,
    /// A line-table row.
    Line,
}

impl ProbeId {
    /// The entry probe of function `f`.
    pub fn entry(f: u32) -> Self {
        ProbeId(f << 2)
    }
    /// The return probe of function `f`.
    pub fn exit(f: u32) -> Self {
        ProbeId((f << 2) | 1)
    }
    /// Line probe `l` (an index into the recording's line probes).
    pub fn line(l: u32) -> Self {
        ProbeId((l << 2) | 2)
    }
    /// The function (for entry and exit probes) or line probe index.
    pub fn index(self) -> u32 {
        self.0 >> 2
    }
    /// The function of an entry or exit probe.
    pub fn function(self) -> u32 {
        self.index()
    }
    /// What the probe marks.
    pub fn kind(self) -> HitKind {
        match self.0 & 3 {
            0 => HitKind::Entry,
            1 => HitKind::Exit,
            _ => HitKind::Line,
        }
    }
    /// Whether this is a return probe.
    pub fn is_return(self) -> bool {
        self.kind() == HitKind::Exit
    }

    /// The entry (`false`) or return (`true`) probe of function `f`.
    pub fn of_call(f: u32, is_return: bool) -> Self {
        if is_return { ProbeId::exit(f) } else { ProbeId::entry(f) }
    }
}

/// A probe hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hit {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Which probe.
    pub probe: ProbeId,
    /// User stack pointer at the hit, 0 if unknown.
    pub sp: u64,
    /// At an entry: the return address (0 if unknown).
    pub ret: u64,
    /// Which CPU's counters `values` holds (an index among the recorded CPUs).
    pub cpu: u16,
    /// The probe set whose counters `values` holds.
    pub generation: u32,
    /// Time and counters.
    pub values: Values,
}

/// Something that happened in the target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A probe fired.
    Hit(Hit),
    /// The kernel dropped `count` records (full ring buffer).
    Lost {
        /// When the loss was noticed.
        time: u64,
        /// The thread that noticed, 0 if unknown.
        tid: u32,
        /// The probe whose event noticed, if it was a probe.
        probe: Option<ProbeId>,
        /// How many records.
        count: u64,
    },
    /// A thread was named, or its process executed a new program.
    Comm {
        /// When.
        time: u64,
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// The new name.
        name: String,
        /// Whether this comes from exec.
        exec: bool,
    },
    /// A thread or process was created.
    Fork {
        /// When.
        time: u64,
        /// New process id.
        pid: u32,
        /// Its parent process.
        ppid: u32,
        /// New thread id.
        tid: u32,
        /// The thread that made it (0 if unknown): the new thread has its
        /// name until it names itself.
        #[serde(default)]
        ptid: u32,
    },
    /// A thread left a CPU: its counters on that CPU at that moment.
    Switch {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Which CPU (index among the recorded CPUs).
        cpu: u16,
        /// Time and the thread's counters on that CPU.
        values: Values,
    },
    /// A process mapped executable code from a file.
    Mmap {
        /// When.
        time: u64,
        /// Process id.
        pid: u32,
        /// First address.
        start: u64,
        /// Length.
        len: u64,
        /// Offset in the file.
        pgoff: u64,
        /// The file.
        path: String,
    },
    /// A stack sample: a thread's registers and the top of its stack.
    Sample(Box<StackSample>),
    /// proftap replaced probes at `time`, the target held still: the
    /// functions in `removed` are no longer instrumented; the counters of
    /// the new probe sets start from zero for the threads that exist.
    ProbesReplaced {
        /// When.
        time: u64,
        /// The new probe sets (one, `generation`, in streams saved before
        /// the probes were kept in parts).
        #[serde(alias = "generation", deserialize_with = "one_or_many")]
        generations: Vec<u32>,
        /// Functions whose probes were removed.
        removed: Vec<u32>,
        /// Functions whose probes were defined again: the return probes of
        /// their calls under way went with the old ones. Every function's,
        /// when none are named (streams saved before parts).
        #[serde(default)]
        redefined: Option<Vec<u32>>,
        /// Functions whose calls are no longer counted either (the
        /// in-process engine's counting trampolines taken out).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        uncounted: Vec<u32>,
    },
    /// A forked child could not be held as the counting of `functions`
    /// stopped: their calls there are still counted.
    CountingGoesOn {
        /// When.
        time: u64,
        /// The child.
        pid: u32,
        /// The functions still counted there.
        functions: Vec<u32>,
    },
    /// A thread ended.
    Exit {
        /// When.
        time: u64,
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
    /// A thread came onto a CPU or left it.
    Switched {
        /// When.
        time: u64,
        /// Thread id.
        tid: u32,
        /// It left (else it came).
        out: bool,
    },
    /// proftap put code of its own in a process: a return address there is
    /// a return trampoline's, and time spent there is the engine's.
    CodeAdded {
        /// When.
        time: u64,
        /// The process.
        pid: u32,
        /// Where.
        ranges: Vec<std::ops::Range<u64>>,
        /// From each address of its counting stubs on, the address of the
        /// original code it stands for (0: none), for unwinders.
        #[serde(default)]
        origins: Vec<(u64, u64)>,
        /// Where the runtime's routines return to in it (see
        /// `Patched::probe_returns`), for unwinders of stacks sampled there.
        #[serde(default)]
        probe_returns: Vec<u64>,
        /// Those of them in the shared return trampoline.
        #[serde(default)]
        return_trampolines: Vec<u64>,
        /// Where in it the runtime makes a forked child's memory: its
        /// samples are not the probes' cost per call.
        #[serde(default)]
        fork_code: Vec<std::ops::Range<u64>>,
        /// Where each entry's counting trampoline's count starts, where the
        /// function's moved instructions follow it, and the function whose
        /// calls it counts (by index).
        #[serde(default)]
        counting_stubs: Vec<CountingStub>,
    },
}

impl Event {
    /// When it happened (CLOCK_MONOTONIC nanoseconds).
    pub fn time(&self) -> u64 {
        match self {
            Event::Hit(hit) => hit.values[0],
            Event::Switch { values, .. } => values[0],
            Event::Sample(sample) => sample.time,
            Event::Lost { time, .. }
            | Event::Comm { time, .. }
            | Event::Fork { time, .. }
            | Event::Exit { time, .. }
            | Event::Switched { time, .. }
            | Event::Mmap { time, .. }
            | Event::CodeAdded { time, .. }
            | Event::ProbesReplaced { time, .. }
            | Event::CountingGoesOn { time, .. } => *time,
        }
    }
}

/// A list of numbers, or one number alone.
fn one_or_many<'de, D: serde::Deserializer<'de>>(input: D) -> Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match OneOrMany::deserialize(input)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_change_saved_before_the_probes_were_in_parts_still_reads() {
        let old: Event = serde_json::from_str(r#"{"probes_replaced":{"time":5,"generation":2,"removed":[1]}}"#).unwrap();
        assert_eq!(old, Event::ProbesReplaced { time: 5, generations: vec![2], removed: vec![1], redefined: None, uncounted: Vec::new() });
        let new =
            Event::ProbesReplaced { time: 5, generations: vec![2, 3], removed: vec![1], redefined: Some(vec![0]), uncounted: vec![4] };
        assert_eq!(serde_json::from_str::<Event>(&serde_json::to_string(&new).unwrap()).unwrap(), new);
        let goes_on = Event::CountingGoesOn { time: 6, pid: 7, functions: vec![4] };
        assert_eq!(serde_json::from_str::<Event>(&serde_json::to_string(&goes_on).unwrap()).unwrap(), goes_on);
    }

    #[test]
    fn counting_stubs_are_saved_as_triples_and_read_back() {
        let saved = r#"{"code_added":{"time":1,"pid":2,"ranges":[],"counting_stubs":[[4096,4104,7]]}}"#;
        let Event::CodeAdded { counting_stubs, .. } = serde_json::from_str::<Event>(saved).unwrap() else { panic!("code added") };
        assert_eq!(counting_stubs, [CountingStub { count: 4096, moved: 4104, function: 7 }]);
        let json = serde_json::to_string(&counting_stubs).unwrap();
        assert_eq!(json, "[[4096,4104,7]]");
    }
}

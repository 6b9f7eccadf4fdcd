//! The event stream every recording engine produces and the aggregator consumes.

use crate::metrics::MAX_METRICS;

/// Metric values at one moment of one thread: index 0 is the time (wall
/// nanoseconds), the others the counters of the recording's metrics in order.
///
/// In events, counters are the thread's counts *on one CPU* (the kernel
/// keeps an inherited counter per CPU); the aggregator sums them.
pub type Values = [u64; MAX_METRICS];

/// Which probe fired: a function's entry or its return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeId(u32);

impl ProbeId {
    /// The entry probe of function `f`.
    pub fn entry(f: u32) -> Self {
        ProbeId(f << 1)
    }
    /// The return probe of function `f`.
    pub fn exit(f: u32) -> Self {
        ProbeId((f << 1) | 1)
    }
    /// The function.
    pub fn function(self) -> u32 {
        self.0 >> 1
    }
    /// Whether this is a return probe.
    pub fn is_return(self) -> bool {
        self.0 & 1 == 1
    }
}

/// A probe hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Which probe.
    pub probe: ProbeId,
    /// User stack pointer at the hit, 0 if unknown.
    pub sp: u64,
    /// Which CPU's counters `values` holds (an index among the recorded CPUs).
    pub cpu: u16,
    /// Time and counters.
    pub values: Values,
}

/// Something that happened in the target.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// A thread ended.
    Exit {
        /// When.
        time: u64,
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
}

impl Event {
    /// When it happened (CLOCK_MONOTONIC nanoseconds).
    pub fn time(&self) -> u64 {
        match self {
            Event::Hit(hit) => hit.values[0],
            Event::Switch { values, .. } => values[0],
            Event::Lost { time, .. } | Event::Comm { time, .. } | Event::Fork { time, .. } | Event::Exit { time, .. } => *time,
        }
    }
}

//! The event stream every recording engine produces and the aggregator consumes.

use proftap_probes::metrics::MAX_METRICS;
use proftap_probes::sampling::StackSample;

/// Metric values at one moment of one thread: index 0 is the time (wall
/// nanoseconds), the others the counters of the recording's metrics in order.
///
/// In events, counters are the thread's counts *on one CPU* (the kernel
/// keeps an inherited counter per CPU); the aggregator sums them.
pub type Values = [u64; MAX_METRICS];

/// Which probe fired: a function's entry or its return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeId(u32);

/// What a probe marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
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
    pub fn kind(self) -> ProbeKind {
        match self.0 & 3 {
            0 => ProbeKind::Entry,
            1 => ProbeKind::Exit,
            _ => ProbeKind::Line,
        }
    }
    /// Whether this is a return probe.
    pub fn is_return(self) -> bool {
        self.kind() == ProbeKind::Exit
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
    /// proftap replaced the probe set at `time`, the target held still: the
    /// functions in `removed` are no longer instrumented; the new set's
    /// counters start from zero for the threads that exist.
    ProbesReplaced {
        /// When.
        time: u64,
        /// The new set.
        generation: u32,
        /// Functions whose probes were removed.
        removed: Vec<u32>,
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
            | Event::ProbesReplaced { time, .. } => *time,
        }
    }
}

/// Bytes of one hit in a saved event stream.
pub const SAVED_HIT_BYTES: usize = 32 + 8 * MAX_METRICS;

impl Hit {
    /// Appends the hit to a saved event stream (little-endian, fixed size),
    /// for replaying through the aggregator in benchmarks.
    pub fn save(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.tid.to_le_bytes());
        out.extend_from_slice(&self.probe.0.to_le_bytes());
        out.extend_from_slice(&u32::from(self.cpu).to_le_bytes());
        out.extend_from_slice(&self.sp.to_le_bytes());
        out.extend_from_slice(&self.ret.to_le_bytes());
        for v in &self.values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads the hits of a saved event stream; a trailing partial hit is ignored.
    pub fn load_all(bytes: &[u8]) -> Vec<Hit> {
        let u32_at = |c: &[u8], at: usize| u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
        let u64_at = |c: &[u8], at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&c[at..at + 8]);
            u64::from_le_bytes(b)
        };
        bytes
            .chunks_exact(SAVED_HIT_BYTES)
            .map(|c| {
                let mut values = [0; MAX_METRICS];
                for (i, v) in values.iter_mut().enumerate() {
                    *v = u64_at(c, 32 + 8 * i);
                }
                Hit {
                    pid: u32_at(c, 0),
                    tid: u32_at(c, 4),
                    probe: ProbeId(u32_at(c, 8)),
                    cpu: u32_at(c, 12) as u16,
                    sp: u64_at(c, 16),
                    ret: u64_at(c, 24),
                    generation: 0,
                    values,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_hits_read_back() {
        let hit = Hit {
            pid: 1,
            tid: 2,
            probe: ProbeId::exit(7),
            sp: 0x7ffd_1234,
            ret: 0x5555_0000,
            cpu: 1,
            generation: 0,
            values: [9; MAX_METRICS],
        };
        let mut bytes = Vec::new();
        hit.save(&mut bytes);
        hit.save(&mut bytes);
        bytes.push(0);
        assert_eq!(Hit::load_all(&bytes), vec![hit, hit]);
    }
}

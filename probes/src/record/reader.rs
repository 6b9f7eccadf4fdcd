//! Draining the per-CPU ring buffers into one time-ordered event stream.
//!
//! A thread that migrates writes its entry into one CPU's buffer and its
//! return into another's, so buffers are merged by timestamp. An event is
//! handed on only when it is older than a watermark taken before the drain
//! began: anything older is already in some buffer, since the kernel writes
//! a record right after stamping it.

use super::events::{Event, Hit, ProbeId, Values};
use crate::metrics::MAX_METRICS;
use crate::perf::{self, RingBuffer, record_type};
use rustc_hash::FxHashMap;

/// How far behind "now" events must be before they are ordered and released.
pub const ORDERING_MARGIN_NS: u64 = 20_000_000;

/// Reads the ring buffers of a recording.
pub struct EventReader {
    buffers: Vec<RingBuffer>,
    probes: FxHashMap<u64, ProbeId>,
    counters: usize,
    pending: Vec<Event>,
    /// Records the reader could not parse (a kernel or proftap bug; counted, not hidden).
    pub malformed: u64,
}

impl EventReader {
    /// A reader over `buffers`; `probes` maps event ids to probes; each sample
    /// carries `counters` counter values after wall time.
    pub fn new(buffers: Vec<RingBuffer>, probes: FxHashMap<u64, ProbeId>, counters: usize) -> Self {
        EventReader { buffers, probes, counters: counters.min(MAX_METRICS - 1), pending: Vec::new(), malformed: 0 }
    }

    /// The buffers (to poll their owners' file descriptors).
    pub fn buffers(&self) -> &[RingBuffer] {
        &self.buffers
    }

    /// Adds buffers and probe ids (events opened after the start).
    pub fn extend(&mut self, buffers: Vec<RingBuffer>, probes: FxHashMap<u64, ProbeId>) {
        self.buffers.extend(buffers);
        self.probes.extend(probes);
    }

    /// Moves every record out of the buffers into the pending queue.
    pub fn drain(&mut self) -> usize {
        let before = self.pending.len();
        let (probes, counters, pending, malformed) = (&self.probes, self.counters, &mut self.pending, &mut self.malformed);
        for buffer in &mut self.buffers {
            buffer.drain(|kind, misc, body| match decode(kind, misc, body, probes, counters) {
                Decoded::Event(e) => pending.push(e),
                Decoded::Ignored => {}
                Decoded::Malformed => *malformed += 1,
            });
        }
        self.pending.len() - before
    }

    /// Hands every pending event older than `watermark` to `sink`, in time
    /// order; `None` hands on everything (the recording is over).
    pub fn release(&mut self, watermark: Option<u64>, mut sink: impl FnMut(&Event)) -> usize {
        // Stable: events of one buffer with equal stamps keep their order.
        self.pending.sort_by_key(Event::time);
        let ready = match watermark {
            Some(w) => self.pending.partition_point(|e| e.time() < w),
            None => self.pending.len(),
        };
        for event in self.pending.drain(..ready) {
            sink(&event);
        }
        ready
    }
}

enum Decoded {
    Event(Event),
    Ignored,
    Malformed,
}

fn decode(kind: u32, misc: u16, body: &[u8], probes: &FxHashMap<u64, ProbeId>, counters: usize) -> Decoded {
    match kind {
        record_type::SAMPLE => {
            let Some(sample) = perf::parse_sample(body) else { return Decoded::Malformed };
            let Some(&probe) = probes.get(&sample.id) else { return Decoded::Ignored };
            let mut values: Values = [0; MAX_METRICS];
            values[0] = sample.time;
            for (i, v) in values.iter_mut().enumerate().skip(1).take(counters) {
                *v = sample.counter(i - 1);
            }
            Decoded::Event(Event::Hit(Hit { pid: sample.pid, tid: sample.tid, probe, sp: sample.sp.unwrap_or(0), values }))
        }
        record_type::LOST => {
            let Some((id, count)) = perf::parse_lost(body) else { return Decoded::Malformed };
            let sid = perf::parse_sample_id(body);
            Decoded::Event(Event::Lost { time: sid.time, tid: sid.tid, probe: probes.get(&id).copied(), count })
        }
        record_type::LOST_SAMPLES => {
            let Some(count) = body.get(0..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes) else { return Decoded::Malformed };
            let sid = perf::parse_sample_id(body);
            Decoded::Event(Event::Lost { time: sid.time, tid: sid.tid, probe: probes.get(&sid.id).copied(), count })
        }
        record_type::COMM => {
            let Some((pid, tid, name)) = perf::parse_comm(body) else { return Decoded::Malformed };
            let time = perf::parse_sample_id(body).time;
            Decoded::Event(Event::Comm { time, pid, tid, name, exec: misc & perf::MISC_COMM_EXEC != 0 })
        }
        record_type::FORK => {
            let Some((pid, ppid, tid, _, time)) = perf::parse_task(body) else { return Decoded::Malformed };
            Decoded::Event(Event::Fork { time, pid, ppid, tid })
        }
        record_type::EXIT => {
            let Some((pid, _, tid, _, time)) = perf::parse_task(body) else { return Decoded::Malformed };
            Decoded::Event(Event::Exit { time, pid, tid })
        }
        _ => Decoded::Ignored,
    }
}

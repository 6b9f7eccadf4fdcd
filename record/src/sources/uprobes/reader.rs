//! Reading the per-CPU ring buffers of the uprobe events: records decoded
//! into events (ordered with every other source's by the driver).

use crate::events::{Event, Hit, HitKind, ProbeId, Values};
use proftap_probes::metrics::MAX_METRICS;
use proftap_probes::perf::{self, RingBuffer, record_type};
use proftap_probes::sampling::StackSample;
use rustc_hash::FxHashMap;

/// What an event id stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tap {
    /// The probe.
    pub probe: ProbeId,
    /// Added to the sampled stack pointer to report it as the aggregator
    /// expects: at an entry, where the return address is; at a return, just
    /// after it (8 for a probe on a `ret`: the address is still on the stack).
    pub sp_adjust: u64,
}

/// What a perf event's samples are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Probe hits; the probe's id is a `u32` at this offset of the raw record.
    Probe {
        /// Offset of the id.
        id_offset: usize,
        /// Offset of the word on top of the stack, if recorded.
        top_offset: Option<usize>,
        /// The probe set the event belongs to.
        generation: u32,
    },
    /// Context switches: a thread's counters on the CPU it leaves.
    Switch,
    /// Stack samples.
    Stacks,
}

/// A probe set: what its probe ids stand for, and until when its events count.
struct Generation {
    taps: Vec<Tap>,
    /// Samples from this time on belong to the set that replaced it.
    until: u64,
}

/// Reads the ring buffers of a recording.
pub struct RingReader {
    /// One per CPU, in CPU order.
    buffers: Vec<RingBuffer>,
    /// Perf event id -> what its samples are.
    events: FxHashMap<u64, Source>,
    /// Probe sets by generation.
    generations: FxHashMap<u32, Generation>,
    counters: usize,
    /// Entry hits read so far, by function: what the overhead governor
    /// judges, as soon as they are read rather than once ordered.
    entries: Vec<u64>,
    /// Line probe hits read so far, by line probe: the governor judges them too.
    line_hits: Vec<u64>,
    /// Records the reader could not parse (a kernel or proftap bug; counted, not hidden).
    pub malformed: u64,
}

impl RingReader {
    /// Its rings, to close.
    pub fn into_open(self) -> Vec<Box<dyn Send>> {
        self.buffers.into_iter().map(|b| Box::new(b) as Box<dyn Send>).collect()
    }

    /// A reader over `buffers` (one per CPU); each sample carries `counters`
    /// counter values after wall time.
    pub fn new(buffers: Vec<RingBuffer>, counters: usize) -> Self {
        RingReader {
            buffers,
            events: FxHashMap::default(),
            generations: FxHashMap::default(),
            counters: counters.min(MAX_METRICS - 1),
            entries: Vec::new(),
            line_hits: Vec::new(),
            malformed: 0,
        }
    }

    /// Says what newly opened events' samples are.
    pub fn add_sources(&mut self, sources: FxHashMap<u64, Source>) {
        self.events.extend(sources);
    }

    /// A probe set's probe ids.
    pub fn add_generation(&mut self, generation: u32, taps: Vec<Tap>) {
        self.generations.insert(generation, Generation { taps, until: u64::MAX });
    }

    /// A probe set replaced at `at`: its later samples are dropped (the
    /// target was held still then, so there are none but stragglers).
    pub fn retire(&mut self, generation: u32, at: u64) {
        if let Some(g) = self.generations.get_mut(&generation) {
            g.until = at;
        }
    }

    /// The buffers (to poll their owners' file descriptors).
    pub fn buffers(&self) -> &[RingBuffer] {
        &self.buffers
    }

    /// The events owning the buffers, one per CPU (new events write into them).
    pub fn owners(&self) -> Vec<&perf_event::Counter> {
        self.buffers.iter().map(RingBuffer::owner).collect()
    }

    /// Moves every record out of the buffers into `pending`, as events.
    pub fn drain(&mut self, pending: &mut Vec<Event>) -> usize {
        let before = pending.len();
        let (events, generations, counters, malformed) = (&self.events, &self.generations, self.counters, &mut self.malformed);
        let (entries, line_hits) = (&mut self.entries, &mut self.line_hits);
        for (cpu, buffer) in self.buffers.iter_mut().enumerate() {
            let cpu = cpu as u16;
            buffer.drain(|kind, misc, body| match decode(kind, misc, body, cpu, events, generations, counters) {
                Decoded::Event(e) => {
                    if let Event::Hit(hit) = &e {
                        match hit.probe.kind() {
                            HitKind::Entry => count_hit(entries, hit.probe.function()),
                            HitKind::Line => count_hit(line_hits, hit.probe.index()),
                            HitKind::Exit => {}
                        }
                    }
                    pending.push(e)
                }
                Decoded::Ignored => {}
                Decoded::Malformed => *malformed += 1,
            });
        }
        pending.len() - before
    }

    /// Entry hits read from the kernel's buffers so far, by function
    /// (shorter when the last functions had none); the in-process engine's
    /// entries are counted by its drainer.
    pub fn entries(&self) -> &[u64] {
        &self.entries
    }

    /// Line probe hits read so far, by line probe (shorter when the last
    /// probes had none).
    pub fn line_hits(&self) -> &[u64] {
        &self.line_hits
    }
}

enum Decoded {
    Event(Event),
    Ignored,
    Malformed,
}

fn decode(
    kind: u32,
    misc: u16,
    body: &[u8],
    cpu: u16,
    events: &FxHashMap<u64, Source>,
    generations: &FxHashMap<u32, Generation>,
    counters: usize,
) -> Decoded {
    match kind {
        record_type::SAMPLE
            if body.get(0..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes).and_then(|id| events.get(&id))
                == Some(&Source::Stacks) =>
        {
            let Some(s) = perf::parse_stack_sample(body) else { return Decoded::Malformed };
            let in_kernel = misc & perf::MISC_CPUMODE_MASK == perf::MISC_KERNEL;
            Decoded::Event(Event::Sample(Box::new(StackSample {
                time: s.time,
                pid: s.pid,
                tid: s.tid,
                regs: s.regs,
                stack: s.stack.to_vec(),
                in_kernel,
                kernel_ip: if in_kernel { s.ip } else { 0 },
                returns: Vec::new(),
            })))
        }
        record_type::MMAP2 => {
            let Some((pid, start, len, pgoff, path)) = perf::parse_mmap2(body) else { return Decoded::Malformed };
            let time = perf::parse_sample_id(body).time;
            Decoded::Event(Event::Mmap { time, pid, start, len, pgoff, path })
        }
        record_type::SAMPLE => {
            let Some(sample) = perf::parse_sample(body) else { return Decoded::Malformed };
            let mut values: Values = [0; MAX_METRICS];
            values[0] = sample.time;
            for (i, v) in values.iter_mut().enumerate().skip(1).take(counters) {
                *v = sample.counter(i - 1);
            }
            let (id_offset, top_offset, generation) = match events.get(&sample.id) {
                Some(Source::Probe { id_offset, top_offset, generation }) => (*id_offset, *top_offset, *generation),
                Some(Source::Switch) => return Decoded::Event(Event::Switch { pid: sample.pid, tid: sample.tid, cpu, values }),
                Some(Source::Stacks) => return Decoded::Malformed,
                None => return Decoded::Ignored,
            };
            let Some(set) = generations.get(&generation) else { return Decoded::Ignored };
            if sample.time >= set.until {
                return Decoded::Ignored;
            }
            let Some(&tap) = perf::raw_u32(sample.raw, id_offset).and_then(|id| set.taps.get(id as usize)) else {
                return Decoded::Malformed;
            };
            let sp = sample.sp.map_or(0, |sp| sp.wrapping_add(tap.sp_adjust));
            let ret = match (tap.probe.kind(), top_offset) {
                (HitKind::Entry, Some(at)) => {
                    sample.raw.get(at..at + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                }
                _ => 0,
            };
            Decoded::Event(Event::Hit(Hit { pid: sample.pid, tid: sample.tid, probe: tap.probe, sp, ret, cpu, generation, values }))
        }
        record_type::LOST => {
            // The event that noticed serves many probes: the loss is known per thread, not per function.
            let Some((_, count)) = perf::parse_lost(body) else { return Decoded::Malformed };
            let sid = perf::parse_sample_id(body);
            Decoded::Event(Event::Lost { time: sid.time, tid: sid.tid, probe: None, count })
        }
        record_type::LOST_SAMPLES => {
            let Some(count) = body.get(0..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes) else { return Decoded::Malformed };
            let sid = perf::parse_sample_id(body);
            Decoded::Event(Event::Lost { time: sid.time, tid: sid.tid, probe: None, count })
        }
        record_type::COMM => {
            let Some((pid, tid, name)) = perf::parse_comm(body) else { return Decoded::Malformed };
            let time = perf::parse_sample_id(body).time;
            Decoded::Event(Event::Comm { time, pid, tid, name, exec: misc & perf::MISC_COMM_EXEC != 0 })
        }
        record_type::FORK => {
            let Some((pid, ppid, tid, ptid, time)) = perf::parse_task(body) else { return Decoded::Malformed };
            Decoded::Event(Event::Fork { time, pid, ppid, tid, ptid })
        }
        record_type::EXIT => {
            let Some((pid, _, tid, _, time)) = perf::parse_task(body) else { return Decoded::Malformed };
            Decoded::Event(Event::Exit { time, pid, tid })
        }
        record_type::SWITCH => {
            let id = perf::parse_sample_id(body);
            Decoded::Event(Event::Switched { time: id.time, tid: id.tid, out: misc & perf::MISC_SWITCH_OUT != 0 })
        }
        _ => Decoded::Ignored,
    }
}

/// One hit more at `index` of `hits`, which grows to hold it.
fn count_hit(hits: &mut Vec<u64>, index: u32) {
    let i = index as usize;
    if hits.len() <= i {
        hits.resize(i + 1, 0);
    }
    hits[i] += 1;
}

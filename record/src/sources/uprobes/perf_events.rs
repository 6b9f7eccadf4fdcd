//! The perf events of a recording: per task and CPU, a sideband event (task,
//! comm and mmap records; the first one on a CPU owns its ring buffer), the
//! probe events of the current probe set, a context-switch counter group and
//! a stack sampler. The probe set can be replaced while the target runs.

use super::reader::{Source, Tap};
use crate::error::{RecordError, perf_error};
use crate::events::ProbeId;
use perf_event::Counter;
use proftap_probes::lines::LinePlan;
use proftap_probes::metrics::Metric;
use proftap_probes::perf::{self, CounterGroup, EventTarget, RingBuffer};
use proftap_probes::plan::{ProbedFunction, Role};
use proftap_probes::tracefs::{DefinedGroup, ProbeKind, UprobeSpec};
use rustc_hash::FxHashMap;
use std::collections::HashSet;
use std::path::Path;

/// The uprobes of a probe set and what each one's id stands for.
pub(crate) struct ProbeSet {
    pub specs: Vec<UprobeSpec>,
    /// By probe id (index into `specs`).
    pub taps: Vec<Tap>,
}

impl ProbeSet {
    /// The probes of the `enabled` functions (and their lines).
    pub fn new(functions: &[ProbedFunction], enabled: &[bool], lines: Option<&LinePlan>) -> Self {
        let mut specs = Vec::new();
        let mut taps = Vec::new();
        for (i, f) in functions.iter().enumerate() {
            if !enabled.get(i).copied().unwrap_or(true) {
                continue;
            }
            let (entry, sp_adjust) = f.entry_probe.unwrap_or((f.offset, 0));
            specs.push(UprobeSpec { path: f.open_path.clone(), offset: entry, kind: ProbeKind::At });
            taps.push(Tap { probe: ProbeId::entry(i as u32), sp_adjust });
            if f.role != Role::Measured {
                continue;
            }
            match &f.exit_sites {
                None => {
                    specs.push(UprobeSpec { path: f.open_path.clone(), offset: f.offset, kind: ProbeKind::Return });
                    taps.push(Tap { probe: ProbeId::exit(i as u32), sp_adjust: 0 });
                }
                Some(sites) => {
                    for &site in sites {
                        specs.push(UprobeSpec { path: f.open_path.clone(), offset: site, kind: ProbeKind::At });
                        taps.push(Tap { probe: ProbeId::exit(i as u32), sp_adjust: 8 });
                    }
                }
            }
        }
        if let Some(plan) = lines {
            // A row at an entry or a return already probed is left out: two
            // probes on one instruction would race for the frame.
            let taken: HashSet<(&Path, u64)> = specs.iter().map(|s| (s.path.as_path(), s.offset.0)).collect();
            let mut line_specs = Vec::new();
            for (i, probe) in plan.probes.iter().enumerate() {
                // A line the kernel refuses a uprobe on is not counted, and said so.
                let Some(at) = probe.uprobe_at else { continue };
                if enabled.get(probe.function as usize).copied().unwrap_or(true) && !taken.contains(&(probe.open_path.as_path(), at.0)) {
                    line_specs.push(UprobeSpec { path: probe.open_path.clone(), offset: at, kind: ProbeKind::At });
                    taps.push(Tap { probe: ProbeId::line(i as u32), sp_adjust: 0 });
                }
            }
            specs.extend(line_specs);
        }
        ProbeSet { specs, taps }
    }
}

/// A probe set's uprobes, defined in tracefs: a definition takes longer
/// the more uprobes the system has defined (the kernel compares each new
/// one with every other), so it may be made away from the rings' reader.
pub(crate) struct Defined {
    group: Option<Box<dyn DefinedGroup>>,
    tracepoints: Vec<proftap_probes::tracefs::ProbeEvent>,
}

impl Defined {
    /// Defines the uprobes of `specs` (none: nothing to define).
    pub fn new(specs: &[UprobeSpec]) -> Result<Self, RecordError> {
        if specs.is_empty() {
            return Ok(Defined { group: None, tracepoints: Vec::new() });
        }
        let (group, tracepoints) = proftap_probes::tracefs::host().define(specs)?;
        Ok(Defined { group: Some(group), tracepoints })
    }
}

/// A replaced probe set: its events close first, then its uprobes go.
pub(crate) struct Retired {
    probes: Vec<CounterGroup>,
    group: Option<Box<dyn DefinedGroup>>,
    tracepoints: Vec<proftap_probes::tracefs::ProbeEvent>,
}

impl Retired {
    /// Takes the probes out of the targets at once: closes the targets'
    /// events with a keeper holding each uprobe registered (see
    /// [`perf::open_keeper`]). What is returned unregisters the uprobes when
    /// dropped, which takes grace periods: best once the targets are gone.
    pub fn withdraw(mut self) -> Unregistering {
        if let Some(group) = &mut self.group {
            group.keep();
        }
        drop(self.probes);
        Unregistering { _group: self.group }
    }
}

/// Uprobes out of every target, still registered until this is dropped.
pub(crate) struct Unregistering {
    _group: Option<Box<dyn DefinedGroup>>,
}

/// The perf events of a recording. Field order is drop order: events close
/// before the uprobes they use are removed.
pub(crate) struct PerfEvents {
    probes: Vec<CounterGroup>,
    counters: Vec<CounterGroup>,
    sidebands: Vec<Counter>,
    buffers: Vec<Option<RingBuffer>>,
    /// Events opened since the reader last took them: what their samples are.
    sources: FxHashMap<u64, Source>,
    generation: u32,
    tracepoints: Vec<proftap_probes::tracefs::ProbeEvent>,
    cpus: Vec<usize>,
    metrics: Vec<Metric>,
    sampling: Option<(u64, u32)>,
    buffer_bytes: usize,
    group: Option<Box<dyn DefinedGroup>>,
    /// Sideband events also report every context switch.
    pub switches: bool,
}

impl PerfEvents {
    /// Events with no probes yet.
    pub fn new(metrics: &[Metric], sampling: Option<(u64, u32)>, buffer_bytes: usize) -> Self {
        proftap_probes::target::raise_open_files_limit();
        let cpus = online_cpus();
        PerfEvents {
            probes: Vec::new(),
            counters: Vec::new(),
            sidebands: Vec::new(),
            buffers: (0..cpus.len()).map(|_| None).collect(),
            sources: FxHashMap::default(),
            generation: 0,
            tracepoints: Vec::new(),
            cpus,
            metrics: metrics.to_vec(),
            sampling,
            // An unprivileged user's rings fit their share of locked memory.
            buffer_bytes: proftap_probes::perf::unprivileged_ring_bytes().map_or(buffer_bytes, |most| buffer_bytes.min(most)),
            group: None,
            switches: false,
        }
    }

    /// The generation of the current probe set.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Makes `set` the current probe set (defined in tracefs, not yet opened
    /// on any task); returns the previous one, to be dropped once the new
    /// one is open everywhere.
    pub fn define(&mut self, set: &ProbeSet) -> Result<Retired, RecordError> {
        Ok(self.adopt(Defined::new(&set.specs)?))
    }

    /// Makes a probe set defined (by [`Defined::new`]) the current one, as
    /// [`PerfEvents::define`] does.
    pub fn adopt(&mut self, defined: Defined) -> Retired {
        self.generation += 1;
        Retired {
            probes: std::mem::take(&mut self.probes),
            group: std::mem::replace(&mut self.group, defined.group),
            tracepoints: std::mem::replace(&mut self.tracepoints, defined.tracepoints),
        }
    }

    /// Makes `retired` the current probe set again, closing what was
    /// opened of the set defined since: a replacement that could not be
    /// opened everywhere leaves the probes as they were.
    pub fn restore(&mut self, retired: Retired) {
        drop(std::mem::replace(&mut self.probes, retired.probes));
        drop(std::mem::replace(&mut self.group, retired.group));
        self.tracepoints = retired.tracepoints;
        let new = self.generation;
        self.sources.retain(|_, source| !matches!(source, Source::Probe { generation, .. } if *generation == new));
        self.generation -= 1;
    }

    fn descriptors_per_task(&self) -> usize {
        self.cpus.len() * (3 + (self.tracepoints.len() + 1) * self.metrics.len())
    }

    /// Opens every event on task `pid` (and, through inherit, what it
    /// creates later), creating the ring buffers on the first task.
    pub fn open_task(&mut self, pid: i32, enable_on_exec: bool) -> Result<(), RecordError> {
        let need = self.descriptors_per_task();
        for (slot, &cpu) in self.cpus.iter().enumerate() {
            let target = EventTarget { pid, cpu, enable_on_exec };
            let sideband =
                perf::open_sideband(target, self.buffer_bytes, self.switches).map_err(|e| perf_error(format!("process {pid}"), e, need))?;
            match &self.buffers[slot] {
                Some(buffer) => {
                    perf::set_output(&sideband, buffer.owner()).map_err(|e| perf_error(format!("process {pid}"), e, need))?;
                    self.sidebands.push(sideband);
                }
                None => {
                    let buffer = RingBuffer::new(sideband, self.buffer_bytes).map_err(|e| perf_error(format!("CPU {cpu}"), e, need))?;
                    self.buffers[slot] = Some(buffer);
                }
            }
        }
        let owners: Vec<&Counter> = self.buffers.iter().flatten().map(RingBuffer::owner).collect();
        let target = Task { pid, enable_on_exec, of_tasks: 1 };
        let opened = open_on(&self.cpus, &self.tracepoints, &self.metrics, self.sampling, true, self.generation, target, &owners)?;
        self.take_opened(opened);
        Ok(())
    }

    /// Opens the current probe set on task `pid` (running, enabled now),
    /// one of `of_tasks` it is opened on, writing into the buffers `owners`
    /// own, one per CPU.
    pub fn open_probes(&mut self, pid: i32, of_tasks: usize, owners: &[&Counter]) -> Result<(), RecordError> {
        let target = Task { pid, enable_on_exec: false, of_tasks };
        let opened = open_on(&self.cpus, &self.tracepoints, &self.metrics, None, false, self.generation, target, owners)?;
        self.probes.extend(opened.probes);
        self.sources.extend(opened.sources);
        Ok(())
    }

    fn take_opened(&mut self, opened: Opened) {
        self.probes.extend(opened.probes);
        self.counters.extend(opened.counters);
        self.sidebands.extend(opened.samplers);
        self.sources.extend(opened.sources);
    }

    /// The ring buffers, one per CPU, for the reader.
    pub fn take_buffers(&mut self) -> Vec<RingBuffer> {
        self.buffers.drain(..).flatten().collect()
    }

    /// What the events opened since the last call sample.
    pub fn take_sources(&mut self) -> FxHashMap<u64, Source> {
        std::mem::take(&mut self.sources)
    }

    /// Takes every probe out of the targets at once (see [`Retired::withdraw`]).
    pub fn withdraw(&mut self) -> Unregistering {
        Retired { probes: std::mem::take(&mut self.probes), group: self.group.take(), tracepoints: std::mem::take(&mut self.tracepoints) }
            .withdraw()
    }

    /// Its counters, sideband events and rings, to close; the probe events
    /// stay, for [`PerfEvents::withdraw`].
    pub fn take_open(&mut self) -> Vec<Box<dyn Send>> {
        let counters = std::mem::take(&mut self.counters).into_iter().map(|c| Box::new(c) as Box<dyn Send>);
        let sidebands = std::mem::take(&mut self.sidebands).into_iter().map(|c| Box::new(c) as Box<dyn Send>);
        let buffers = self.buffers.iter_mut().filter_map(Option::take).map(|b| Box::new(b) as Box<dyn Send>);
        counters.chain(sidebands).chain(buffers).collect()
    }

    /// Stops every probe.
    pub fn disable(&self) {
        for event in self.probes.iter().chain(&self.counters) {
            let _ = perf::disable(&event.leader);
        }
    }

    /// Samples lost on the current probe events, as the events count them.
    pub fn lost_samples(&self) -> u64 {
        self.probes.iter().map(|e| perf::lost_samples(&e.leader)).sum()
    }
}

struct Opened {
    probes: Vec<CounterGroup>,
    counters: Vec<CounterGroup>,
    samplers: Vec<Counter>,
    sources: FxHashMap<u64, Source>,
}

/// A task to open events on, one of `of_tasks` opened on together (what
/// they all need is what a lack of descriptors is told with).
struct Task {
    pid: i32,
    enable_on_exec: bool,
    of_tasks: usize,
}

#[allow(clippy::too_many_arguments)]
fn open_on(
    cpus: &[usize],
    tracepoints: &[proftap_probes::tracefs::ProbeEvent],
    metrics: &[Metric],
    sampling: Option<(u64, u32)>,
    counters: bool,
    generation: u32,
    Task { pid, enable_on_exec, of_tasks }: Task,
    owners: &[&Counter],
) -> Result<Opened, RecordError> {
    let need = cpus.len() * (3 + (tracepoints.len() + 1) * metrics.len()) * of_tasks.max(1);
    let err = |e| perf_error(format!("thread {pid}"), e, need);
    let mut opened = Opened { probes: Vec::new(), counters: Vec::new(), samplers: Vec::new(), sources: FxHashMap::default() };
    for (slot, &cpu) in cpus.iter().enumerate() {
        let target = EventTarget { pid, cpu, enable_on_exec };
        let Some(owner) = owners.get(slot) else { continue };
        for tracepoint in tracepoints {
            let event = perf::open_probe(tracepoint.tracepoint, target, metrics).map_err(err)?;
            perf::set_output(&event.leader, owner).map_err(err)?;
            opened.sources.insert(
                event.leader.id(),
                Source::Probe { id_offset: tracepoint.id_offset, top_offset: tracepoint.top_offset, generation },
            );
            opened.probes.push(event);
        }
        if let Some((frequency, stack_bytes)) = sampling {
            let sampler = perf::open_stack_sampler(target, frequency, stack_bytes).map_err(err)?;
            perf::set_output(&sampler, owner).map_err(err)?;
            opened.sources.insert(sampler.id(), Source::Stacks);
            opened.samplers.push(sampler);
        }
        // The counter groups belong to the task, whatever the probe set.
        // They count in the kernel, which only a privileged user may
        // observe; an unprivileged one places no uprobes to need them.
        if counters && metrics.len() > 1 && proftap_probes::perf::kernel_observable() {
            let switches = perf::open_switches(target, metrics).map_err(err)?;
            perf::set_output(&switches.leader, owner).map_err(err)?;
            opened.sources.insert(switches.leader.id(), Source::Switch);
            opened.counters.push(switches);
        }
    }
    Ok(opened)
}

fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    if cpus.is_empty() {
        cpus.extend(0..std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
    cpus
}

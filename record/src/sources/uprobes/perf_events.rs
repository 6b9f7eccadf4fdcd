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
use proftap_probes::sampled_processes::SampledProcesses;
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
    /// The probes of the `enabled` functions (and their lines) that `in_part`.
    pub fn new(functions: &[ProbedFunction], enabled: &[bool], lines: Option<&LinePlan>, in_part: impl Fn(usize) -> bool) -> Self {
        let enabled = |i: usize| enabled.get(i).copied().unwrap_or(true) && in_part(i);
        let mut specs = Vec::new();
        let mut taps = Vec::new();
        for (i, f) in functions.iter().enumerate() {
            if !enabled(i) {
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
                if enabled(probe.function as usize) && !taken.contains(&(probe.open_path.as_path(), at.0)) {
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

/// One part of the probes: the probes of some of the functions, defined as
/// a group of their own, so that a change to a few functions defines again
/// only their parts. Field order is drop order: events close before the
/// uprobes they use are removed.
pub(crate) struct Part {
    probes: Vec<CounterGroup>,
    group: Option<Box<dyn DefinedGroup>>,
    tracepoints: Vec<proftap_probes::tracefs::ProbeEvent>,
    /// Names its events' samples to the reader.
    generation: u32,
}

impl Part {
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

/// Replaced parts (by part number), to be withdrawn once the new ones are
/// open everywhere, or restored.
pub(crate) struct Retired {
    parts: Vec<(usize, Part)>,
}

impl Retired {
    /// Takes the probes out of the targets at once (see [`Part::withdraw`]).
    pub fn withdraw(self) -> Vec<Unregistering> {
        self.parts.into_iter().map(|(_, part)| part.withdraw()).collect()
    }

    /// The generations the replaced parts had.
    pub fn generations(&self) -> Vec<u32> {
        self.parts.iter().map(|(_, part)| part.generation).collect()
    }
}

/// Uprobes out of every target, still registered until this is dropped.
pub(crate) struct Unregistering {
    _group: Option<Box<dyn DefinedGroup>>,
}

/// The perf events of a recording. Field order is drop order: events close
/// before the uprobes they use are removed.
pub(crate) struct PerfEvents {
    parts: Vec<Part>,
    counters: Vec<CounterGroup>,
    sidebands: Vec<Counter>,
    buffers: Vec<Option<RingBuffer>>,
    /// Events opened since the reader last took them: what their samples are.
    sources: FxHashMap<u64, Source>,
    /// The generation of the part defined last.
    generation: u32,
    cpus: Vec<usize>,
    metrics: Vec<Metric>,
    sampling: Option<(u64, u32)>,
    buffer_bytes: usize,
    /// What each task's events report beside its probes.
    pub task_records: TaskRecords,
    /// Stacks sampled on every CPU for the recording's processes, where
    /// the kernel lets proftap load the filter; else on each task.
    cpu_sampling: Option<CpuSampling>,
}

/// What each task's events report beside its probes' hits. Each costs the
/// task at every context switch: a record written per switch, about 0.75
/// µs a switch here (a pipe's round trip between two threads on one CPU,
/// two switches, took 7.2 µs against 5.7 with neither), so neither is
/// asked for where no uprobe will hit.
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskRecords {
    /// Every time a thread leaves or comes onto a CPU (the in-process
    /// engine's CPU time of the calls uprobes time, where it takes the
    /// time off CPU from them).
    pub switches: bool,
    /// Each time a thread leaves a CPU, its counters there (see
    /// [`perf::open_switches`]): what adds a thread's counts up over the
    /// CPUs between two hits of its uprobes.
    pub counters: bool,
}

/// Stack samplers on every CPU (see [`proftap_probes::sampled_processes`]),
/// opened with the first task's rings.
struct CpuSampling {
    processes: SampledProcesses,
    opened: bool,
}

impl PerfEvents {
    /// Events with no probes yet.
    pub fn new(metrics: &[Metric], sampling: Option<(u64, u32)>, buffer_bytes: usize) -> Self {
        proftap_probes::target::raise_open_files_limit();
        let cpus = online_cpus();
        PerfEvents {
            parts: Vec::new(),
            counters: Vec::new(),
            sidebands: Vec::new(),
            buffers: (0..cpus.len()).map(|_| None).collect(),
            sources: FxHashMap::default(),
            generation: 0,
            cpus,
            metrics: metrics.to_vec(),
            sampling,
            // An unprivileged user's rings fit their share of locked memory.
            buffer_bytes: proftap_probes::perf::unprivileged_ring_bytes().map_or(buffer_bytes, |most| buffer_bytes.min(most)),
            task_records: TaskRecords::default(),
            cpu_sampling: sampling.and_then(|_| SampledProcesses::load().ok()).map(|processes| CpuSampling { processes, opened: false }),
        }
    }

    /// How many parts the probes may take: each is a set of events per
    /// task and CPU (copied to every thread a task makes), so there are a
    /// few hundred descriptors' worth per task.
    pub fn most_parts(&self) -> usize {
        const MOST_DESCRIPTORS_PER_TASK: usize = 512;
        let per_part = 2 * self.cpus.len().max(1) * (1 + self.metrics.len());
        (MOST_DESCRIPTORS_PER_TASK / per_part).max(1)
    }

    /// Makes the probe sets defined (by [`Defined::new`]), each with its
    /// part number, the current ones (not yet opened on any task); returns
    /// the parts they replace, to be withdrawn once the new ones are open
    /// everywhere, and the new parts' generations.
    pub fn adopt(&mut self, defined: Vec<(usize, Defined, Vec<Tap>)>) -> (Retired, Vec<(u32, Vec<Tap>)>) {
        let mut retired = Vec::new();
        let mut generations = Vec::new();
        for (number, defined, taps) in defined {
            self.generation += 1;
            let part = Part { probes: Vec::new(), group: defined.group, tracepoints: defined.tracepoints, generation: self.generation };
            generations.push((self.generation, taps));
            if self.parts.len() <= number {
                self.parts.resize_with(number + 1, || Part { probes: Vec::new(), group: None, tracepoints: Vec::new(), generation: 0 });
            }
            retired.push((number, std::mem::replace(&mut self.parts[number], part)));
        }
        (Retired { parts: retired }, generations)
    }

    /// Makes `retired` current again, closing what was opened of the parts
    /// that replaced them: a replacement that could not be opened
    /// everywhere leaves the probes as they were.
    pub fn restore(&mut self, retired: Retired) {
        for (number, part) in retired.parts {
            let new = std::mem::replace(&mut self.parts[number], part);
            self.sources.retain(|_, source| !matches!(source, Source::Probe { generation, .. } if *generation == new.generation));
        }
    }

    /// The probe events of the parts `numbers` (every part: `None`) with
    /// their generations.
    fn probe_events(&self, numbers: Option<&[usize]>) -> Vec<(proftap_probes::tracefs::ProbeEvent, u32)> {
        let chosen = |n: &usize| numbers.is_none_or(|numbers| numbers.contains(n));
        let parts = self.parts.iter().enumerate().filter(|(n, _)| chosen(n));
        parts.flat_map(|(_, part)| part.tracepoints.iter().map(|&t| (t, part.generation))).collect()
    }

    fn descriptors_per_task(&self) -> usize {
        let tracepoints: usize = self.parts.iter().map(|p| p.tracepoints.len()).sum();
        descriptors(self.cpus.len(), tracepoints, self.task_records.counters, self.metrics.len())
    }

    /// Opens every event on task `pid` of process `process` (and, through
    /// inherit, what it creates later), creating the ring buffers on the
    /// first task.
    pub fn open_task(&mut self, process: i32, pid: i32, enable_on_exec: bool) -> Result<(), RecordError> {
        let need = self.descriptors_per_task();
        for (slot, &cpu) in self.cpus.iter().enumerate() {
            let target = EventTarget { pid, cpu, enable_on_exec };
            let sideband = perf::open_sideband(target, self.buffer_bytes, self.task_records.switches)
                .map_err(|e| perf_error(format!("process {pid}"), e, need))?;
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
        self.sample_on_cpus(process, enable_on_exec)?;
        let owners: Vec<&Counter> = self.buffers.iter().flatten().map(RingBuffer::owner).collect();
        let target = Task { pid, enable_on_exec, of_tasks: 1 };
        let probes = self.probe_events(None);
        let per_task_sampling = self.sampling.filter(|_| self.cpu_sampling.is_none());
        let counters = self.task_records.counters;
        let opened = open_on(&self.cpus, &probes, &self.metrics, per_task_sampling, counters, target, &owners)?;
        self.take_opened(opened);
        Ok(())
    }

    /// Where stacks are sampled on every CPU: samples process `process`
    /// (from its `exec` with `enable_on_exec`), opening the samplers into
    /// the rings at the first task. Where they cannot all be opened, each
    /// task is sampled instead.
    fn sample_on_cpus(&mut self, process: i32, enable_on_exec: bool) -> Result<(), RecordError> {
        let (Some(cpu_sampling), Some((frequency, stack_bytes))) = (&mut self.cpu_sampling, self.sampling) else { return Ok(()) };
        if !cpu_sampling.opened {
            let owners: Vec<(usize, &Counter)> =
                self.cpus.iter().zip(&self.buffers).filter_map(|(&cpu, b)| Some((cpu, b.as_ref()?.owner()))).collect();
            match open_cpu_samplers(&owners, frequency, stack_bytes, &cpu_sampling.processes) {
                Ok(samplers) => {
                    for sampler in samplers {
                        self.sources.insert(sampler.id(), Source::Stacks);
                        self.sidebands.push(sampler);
                    }
                    cpu_sampling.opened = true;
                }
                Err(_) => {
                    self.cpu_sampling = None;
                    return Ok(());
                }
            }
        }
        cpu_sampling.processes.add(process as u32, enable_on_exec).map_err(|e| perf_error(format!("process {process}"), e, 0))
    }

    /// Opens the probes of parts `numbers` on task `pid` (running, enabled
    /// now), one of `of_tasks` they are opened on, writing into the buffers
    /// `owners` own, one per CPU.
    pub fn open_probes(&mut self, pid: i32, numbers: &[usize], of_tasks: usize, owners: &[&Counter]) -> Result<(), RecordError> {
        let target = Task { pid, enable_on_exec: false, of_tasks };
        let probes = self.probe_events(Some(numbers));
        let opened = open_on(&self.cpus, &probes, &self.metrics, None, false, target, owners)?;
        self.keep_probes(opened.probes);
        self.sources.extend(opened.sources);
        Ok(())
    }

    /// Each probe event with its part, by generation.
    fn keep_probes(&mut self, probes: Vec<(u32, CounterGroup)>) {
        for (generation, event) in probes {
            if let Some(part) = self.parts.iter_mut().find(|p| p.generation == generation) {
                part.probes.push(event);
            }
        }
    }

    fn take_opened(&mut self, opened: Opened) {
        self.keep_probes(opened.probes);
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

    /// Takes every probe out of the targets at once (see [`Part::withdraw`]).
    pub fn withdraw(&mut self) -> Vec<Unregistering> {
        std::mem::take(&mut self.parts).into_iter().map(Part::withdraw).collect()
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
        for event in self.parts.iter().flat_map(|p| &p.probes).chain(&self.counters) {
            let _ = perf::disable(&event.leader);
        }
    }

    /// Whether stacks are sampled on every CPU.
    pub fn samples_on_every_cpu(&self) -> bool {
        self.cpu_sampling.as_ref().is_some_and(|c| c.opened)
    }

    /// Processes forked while the map of the processes sampled on every
    /// CPU was full: not sampled.
    pub fn unsampled_children(&self) -> u64 {
        self.cpu_sampling.as_ref().map_or(0, |c| c.processes.not_sampled())
    }

    /// Samples lost on the current probe events, as the events count them.
    pub fn lost_samples(&self) -> u64 {
        self.parts.iter().flat_map(|p| &p.probes).map(|e| perf::lost_samples(&e.leader)).sum()
    }
}

/// A stack sampler on each CPU, writing into that CPU's ring (`owners`),
/// enabled once all are open.
fn open_cpu_samplers(
    owners: &[(usize, &Counter)],
    frequency: u64,
    stack_bytes: u32,
    processes: &SampledProcesses,
) -> std::io::Result<Vec<Counter>> {
    let mut samplers = Vec::new();
    for &(cpu, owner) in owners {
        let sampler = perf::open_cpu_stack_sampler(cpu, frequency, stack_bytes, processes.filter())?;
        perf::set_output(&sampler, owner)?;
        samplers.push(sampler);
    }
    for sampler in &samplers {
        perf::enable(sampler)?;
    }
    Ok(samplers)
}

struct Opened {
    /// With their parts' generations.
    probes: Vec<(u32, CounterGroup)>,
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

/// The most descriptors one task's events take on `cpus` CPUs, which an
/// error at the limit names: three a CPU besides the counters (a sampler
/// among them), then each metric's counter under each of the
/// `tracepoints`, and under the switches where `counters` are asked.
fn descriptors(cpus: usize, tracepoints: usize, counters: bool, metrics: usize) -> usize {
    cpus * (3 + (tracepoints + usize::from(counters)) * metrics)
}

#[allow(clippy::too_many_arguments)]
fn open_on(
    cpus: &[usize],
    tracepoints: &[(proftap_probes::tracefs::ProbeEvent, u32)],
    metrics: &[Metric],
    sampling: Option<(u64, u32)>,
    counters: bool,
    Task { pid, enable_on_exec, of_tasks }: Task,
    owners: &[&Counter],
) -> Result<Opened, RecordError> {
    let need = descriptors(cpus.len(), tracepoints.len(), counters, metrics.len()) * of_tasks.max(1);
    let err = |e| perf_error(format!("thread {pid}"), e, need);
    let mut opened = Opened { probes: Vec::new(), counters: Vec::new(), samplers: Vec::new(), sources: FxHashMap::default() };
    for (slot, &cpu) in cpus.iter().enumerate() {
        let target = EventTarget { pid, cpu, enable_on_exec };
        let Some(owner) = owners.get(slot) else { continue };
        for &(tracepoint, generation) in tracepoints {
            let event = perf::open_probe(tracepoint.tracepoint, target, metrics).map_err(err)?;
            perf::set_output(&event.leader, owner).map_err(err)?;
            opened.sources.insert(
                event.leader.id(),
                Source::Probe { id_offset: tracepoint.id_offset, top_offset: tracepoint.top_offset, generation },
            );
            opened.probes.push((generation, event));
        }
        if let Some((frequency, stack_bytes)) = sampling {
            let sampler = perf::open_stack_sampler(target, frequency, stack_bytes).map_err(err)?;
            perf::set_output(&sampler, owner).map_err(err)?;
            opened.sources.insert(sampler.id(), Source::Stacks);
            opened.samplers.push(sampler);
        }
        // The counter groups belong to the task, whatever the probe set,
        // where uprobes may hit (see [`TaskRecords::counters`]). They count
        // in the kernel, which only a privileged user may observe; an
        // unprivileged one places no uprobes to need them.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's counters at its switches are opened where asked (uprobes
    /// may hit), and not otherwise: each is a record at every switch.
    #[test]
    fn a_tasks_switch_counters_are_opened_only_where_asked() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "counting in the kernel needs root");
            return;
        }
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep runs");
        let pid = child.id() as i32;
        let metrics = [Metric::Wall, Metric::Cpu];
        let opened = |counters: bool| {
            let mut events = PerfEvents::new(&metrics, None, 64 * 1024);
            events.task_records = TaskRecords { switches: false, counters };
            events.open_task(pid, pid, false).expect("events open on a child");
            events.counters.len()
        };
        let (without, with) = (opened(false), opened(true));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!((without, with), (0, online_cpus().len()));
    }
}

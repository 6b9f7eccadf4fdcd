//! Recording with kernel uprobes: probes defined in tracefs, opened per task
//! and CPU with `inherit` so every thread and forked child is followed, read
//! from per-CPU ring buffers, merged in time order and aggregated on
//! per-thread shadow stacks into a [`Profile`].

pub mod aggregate;
pub mod events;
pub mod reader;

use crate::lines::LinePlan;
use crate::metrics::{MAX_METRICS, Metric};
use crate::perf::{self, EventTarget, ProbeEvent, RingBuffer};
use crate::plan::{EntryKind, ProbedFunction, Role};
use crate::sampling::Sampler;
use crate::target::{self, Ended, Frozen, TargetError};
use crate::tracefs::{ProbeKind, Tracefs, TracefsError, UprobeGroup, UprobeSpec};
use aggregate::{Aggregator, Compensation, LineSetup, NO_LINE};
use events::{Event, ProbeId, Values};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use perf_event::Counter;
use proftap_profile::{LineRecord, Overhead, Profile, Recording, RegionRecord, Target};
use reader::Source;
pub use reader::Tap;
use reader::{EventReader, ORDERING_MARGIN_NS};
use rustc_hash::FxHashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Errors of a recording.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// tracefs trouble.
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    /// Launching or attaching failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// perf_event_open or a ring buffer failed.
    #[error("cannot open perf events on {what}: {source}{hint}")]
    Perf {
        /// Which task or probe.
        what: String,
        /// Why.
        source: std::io::Error,
        /// What to do, starting with "; ".
        hint: String,
    },
    /// Nothing to probe.
    #[error("no function to probe")]
    NothingToProbe,
}

/// The profiled program.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    /// Launch this program with these arguments (`argv[0]` included).
    Launch {
        /// The resolved executable.
        path: PathBuf,
        /// Its argument vector.
        argv: Vec<OsString>,
    },
    /// Attach to this running process.
    Attach {
        /// Its pid.
        pid: i32,
    },
}

/// What one instrumented call costs, measured on this machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallCost {
    /// Wall time one instrumented call adds to its caller.
    pub call_ns: u64,
    /// CPU time it adds to the thread.
    pub call_cpu_ns: u64,
    /// Wall time an empty instrumented function shows as its own inclusive time.
    pub self_ns: u64,
    /// CPU time the same.
    pub self_cpu_ns: u64,
}

/// Calibrated cost of the probes, by how the kernel handles the probed
/// first instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCost {
    /// Emulated first instruction (push, call, jmp, nop).
    pub emulated: CallCost,
    /// Single-stepped first instruction.
    pub stepped: CallCost,
}

impl ProbeCost {
    fn of(&self, kind: EntryKind) -> &CallCost {
        match kind {
            EntryKind::Emulated => &self.emulated,
            EntryKind::Stepped => &self.stepped,
        }
    }
}

/// Signals from the user, set by the command line's signal handlers.
#[derive(Clone, Debug, Default)]
pub struct Control {
    /// Ctrl-C.
    pub interrupt: Arc<AtomicBool>,
    /// SIGTERM.
    pub terminate: Arc<AtomicBool>,
}

/// How to record.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// Metrics; the first must be wall time.
    pub metrics: Vec<Metric>,
    /// Follow forked children.
    pub follow_forks: bool,
    /// Ring buffer size per CPU, bytes.
    pub buffer_bytes: usize,
    /// Stop after this long (attach).
    pub duration: Option<Duration>,
    /// Probe cost, for the overhead estimate.
    pub cost: Option<ProbeCost>,
    /// Subtract the probe cost from the times.
    pub compensate: bool,
    /// Signals.
    pub control: Control,
    /// Line probes, for line counts (and regions).
    pub lines: Option<LinePlan>,
    /// Stack sampling.
    pub sample: Option<SampleSettings>,
    /// Regions to time.
    pub regions: Vec<RegionSpec>,
    /// Called once every probe is live (with the pid and the number of
    /// functions), before the target runs on.
    pub on_started: Option<fn(i32, usize)>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            metrics: vec![Metric::Wall, Metric::Cpu],
            follow_forks: true,
            buffer_bytes: 8 << 20,
            duration: None,
            cost: None,
            compensate: false,
            control: Control::default(),
            lines: None,
            sample: None,
            regions: Vec::new(),
            on_started: None,
        }
    }
}

/// How to sample stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleSettings {
    /// Samples per second of CPU time.
    pub frequency_hz: u64,
    /// Bytes of user stack copied per sample, for unwinding.
    pub stack_bytes: u32,
}

impl Default for SampleSettings {
    fn default() -> Self {
        SampleSettings { frequency_hz: 1000, stack_bytes: 16 * 1024 }
    }
}

/// The event stack samples count: hardware cycles where the machine has them.
fn sampling_event() -> String {
    let cycles = Metric::Hardware(perf_event::events::Hardware::CPU_CYCLES);
    if cycles.check_available().is_ok() { "cycles".into() } else { "cpu-clock".into() }
}

/// A region to time: lines `start..=end` of a source file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Its name.
    pub name: String,
    /// The source file (a path or a path suffix).
    pub file: String,
    /// First line.
    pub start: u32,
    /// Last line.
    pub end: u32,
}

impl RegionSpec {
    /// Parses `NAME=FILE:START-END`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("'{text}' is not a region; write NAME=FILE:START-END, for example parse=src/io.c:40-62");
        let (name, rest) = text.split_once('=').ok_or_else(bad)?;
        let (file, range) = rest.rsplit_once(':').ok_or_else(bad)?;
        let (start, end) = range.split_once('-').ok_or_else(bad)?;
        let (start, end): (u32, u32) = (start.trim().parse().map_err(|_| bad())?, end.trim().parse().map_err(|_| bad())?);
        if name.is_empty() || file.is_empty() || start == 0 || end < start {
            return Err(bad());
        }
        Ok(RegionSpec { name: name.into(), file: file.into(), start, end })
    }

    fn contains(&self, file: &str, line: u32) -> bool {
        (self.start..=self.end).contains(&line) && crate::lines::LineFiles(vec![self.file.clone()]).contains(file)
    }
}

/// A finished recording.
pub struct Recorded {
    /// The profile.
    pub profile: Profile,
    /// How a launched program ended (None for attach while it runs on).
    pub ended: Option<Ended>,
}

/// CLOCK_MONOTONIC now, nanoseconds.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
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

/// Raises the open-file limit to its maximum: every probe is a descriptor
/// per CPU and counter.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

fn perf_error(what: String, source: std::io::Error, descriptors: usize) -> RecordError {
    let hint = match source.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            format!("; this recording needs about {descriptors} file descriptors: raise `ulimit -n` or probe fewer functions")
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
            format!("; uprobes need root or CAP_PERFMON (kernel.perf_event_paranoid is {}): run with sudo", paranoid.trim())
        }
        Some(libc::ESRCH) => "; the process is gone".into(),
        _ => String::new(),
    };
    RecordError::Perf { what, source, hint }
}

/// Perf events and ring buffers of a recording. Field order is drop
/// order: events close before the uprobes they use are removed.
struct Session {
    probes: Vec<ProbeEvent>,
    sidebands: Vec<Counter>,
    buffers: Vec<Option<RingBuffer>>,
    /// Perf event id -> what its samples are.
    events: FxHashMap<u64, Source>,
    /// Probe id -> what it stands for.
    taps: Vec<Tap>,
    tracepoints: Vec<crate::tracefs::ProbeEvent>,
    cpus: Vec<usize>,
    metrics: Vec<Metric>,
    /// Stack sampling: (frequency, bytes of stack copied per sample).
    sampling: Option<(u64, u32)>,
    _group: Option<UprobeGroup>,
}

impl Session {
    fn define(
        functions: &[ProbedFunction],
        lines: Option<&LinePlan>,
        metrics: &[Metric],
        sampling: Option<(u64, u32)>,
    ) -> Result<Self, RecordError> {
        if functions.is_empty() && sampling.is_none() {
            return Err(RecordError::NothingToProbe);
        }
        raise_fd_limit();
        let mut specs = Vec::with_capacity(functions.len() * 2);
        let mut taps = Vec::with_capacity(functions.len() * 2);
        for (i, f) in functions.iter().enumerate() {
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
            let taken: std::collections::HashSet<(&std::path::Path, u64)> = specs.iter().map(|s| (s.path.as_path(), s.offset.0)).collect();
            let mut line_specs = Vec::new();
            for (i, probe) in plan.probes.iter().enumerate() {
                if !taken.contains(&(probe.open_path.as_path(), probe.offset.0)) {
                    line_specs.push(UprobeSpec { path: probe.open_path.clone(), offset: probe.offset, kind: ProbeKind::At });
                    taps.push(Tap { probe: ProbeId::line(i as u32), sp_adjust: 0 });
                }
            }
            specs.extend(line_specs);
        }
        let (group, tracepoints) = if specs.is_empty() {
            (None, Vec::new())
        } else {
            let (group, tracepoints) = UprobeGroup::define(&Tracefs::open()?, &specs)?;
            (Some(group), tracepoints)
        };
        let cpus = online_cpus();
        Ok(Session {
            probes: Vec::new(),
            sidebands: Vec::new(),
            buffers: (0..cpus.len()).map(|_| None).collect(),
            events: FxHashMap::default(),
            taps,
            tracepoints,
            cpus,
            metrics: metrics.to_vec(),
            sampling,
            _group: group,
        })
    }

    fn descriptors_per_task(&self) -> usize {
        self.cpus.len() * (1 + (self.tracepoints.len() + 1) * self.metrics.len())
    }

    /// Opens every probe on task `pid` (and, through inherit, what it creates later).
    fn open_task(&mut self, pid: i32, enable_on_exec: bool, buffer_bytes: usize) -> Result<(), RecordError> {
        let need = self.descriptors_per_task();
        for (slot, &cpu) in self.cpus.iter().enumerate() {
            let target = EventTarget { pid, cpu, enable_on_exec };
            let sideband = perf::open_sideband(target, buffer_bytes).map_err(|e| perf_error(format!("process {pid}"), e, need))?;
            match &self.buffers[slot] {
                Some(buffer) => {
                    perf::set_output(&sideband, buffer.owner()).map_err(|e| perf_error(format!("process {pid}"), e, need))?;
                    self.sidebands.push(sideband);
                }
                None => {
                    let buffer = RingBuffer::new(sideband, buffer_bytes).map_err(|e| perf_error(format!("CPU {cpu}"), e, need))?;
                    self.buffers[slot] = Some(buffer);
                }
            }
            let owner = self.buffers[slot].as_ref().map(RingBuffer::owner).expect("buffer was just created");
            for tracepoint in &self.tracepoints {
                let event = perf::open_probe(tracepoint.tracepoint, target, &self.metrics)
                    .map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                perf::set_output(&event.leader, owner).map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                self.events.insert(event.leader.id(), Source::Probe { id_offset: tracepoint.id_offset, top_offset: tracepoint.top_offset });
                self.probes.push(event);
            }
            if let Some((frequency, stack_bytes)) = self.sampling {
                let sampler =
                    perf::open_stack_sampler(target, frequency, stack_bytes).map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                perf::set_output(&sampler, owner).map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                self.events.insert(sampler.id(), Source::Stacks);
                self.sidebands.push(sampler);
            }
            if self.metrics.len() > 1 && !self.tracepoints.is_empty() {
                let switches = perf::open_switches(target, &self.metrics).map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                perf::set_output(&switches.leader, owner).map_err(|e| perf_error(format!("thread {pid}"), e, need))?;
                self.events.insert(switches.leader.id(), Source::Switch);
                self.probes.push(switches);
            }
        }
        Ok(())
    }

    fn disable(&self) {
        for event in &self.probes {
            let _ = perf::disable(&event.leader);
        }
    }

    /// Samples lost on all probe events, as the events count them.
    fn lost_samples(&self) -> u64 {
        self.probes.iter().map(|e| perf::lost_samples(&e.leader)).sum()
    }

    fn into_reader(mut self) -> (EventReader, SessionGuard) {
        let buffers: Vec<RingBuffer> = self.buffers.drain(..).flatten().collect();
        let reader = EventReader::new(buffers, std::mem::take(&mut self.events), std::mem::take(&mut self.taps), self.metrics.len() - 1);
        (reader, SessionGuard { _session: self })
    }
}

/// Keeps the events and uprobes alive while the reader runs.
struct SessionGuard {
    _session: Session,
}

/// Records `functions` in `target` until it ends (or, attached, until
/// stopped), and builds the profile.
pub fn record(functions: &[ProbedFunction], spec: &TargetSpec, options: &RecordOptions) -> Result<Recorded, RecordError> {
    // Measured functions first: their index is their id in the profile; markers follow.
    let mut ordered: Vec<ProbedFunction> = functions.iter().filter(|f| f.role == Role::Measured).cloned().collect();
    let measured = ordered.len();
    ordered.extend(functions.iter().filter(|f| f.role != Role::Measured).cloned());
    let all = &ordered;
    let functions = &ordered[..measured];
    let metrics = options.metrics.clone();
    debug_assert_eq!(metrics.first(), Some(&Metric::Wall));
    let sampling = options.sample.map(|s| (s.frequency_hz, s.stack_bytes));
    let mut session = Session::define(all, options.lines.as_ref(), &metrics, sampling)?;
    let mut sampler = options.sample.map(|s| Sampler::new(&sampling_event(), s.frequency_hz));
    let started_unix_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);

    let compensation = options.compensate.then(|| compensation(functions, &metrics, options.cost.unwrap_or_default()));
    let mut aggregator = Aggregator::new(functions.len(), metrics.len(), compensation);
    aggregator.set_exit_sites(functions.iter().map(|f| f.exit_sites.is_some()).collect());
    if let Some(plan) = &options.lines {
        aggregator.set_lines(LineSetup {
            probes: plan.probes.iter().map(|p| (p.function, p.lines.clone())).collect(),
            entry_lines: plan.entry_lines.iter().map(|l| l.unwrap_or(NO_LINE)).collect(),
            entry_also: plan.entry_also.clone(),
            lines: plan.lines.len(),
            regions_of: plan
                .lines
                .iter()
                .map(|(file, line)| {
                    options.regions.iter().enumerate().filter(|(_, r)| r.contains(file, *line)).map(|(i, _)| i as u32).collect()
                })
                .collect(),
            regions: options.regions.len(),
        });
    }

    // Launch held or freeze, open the events, then let the program go.
    let (pid, mut child, command, attached) = match spec {
        TargetSpec::Launch { path, argv } => {
            let mut child = target::spawn_held(path, argv)?;
            if let Err(e) = session.open_task(child.pid(), true, options.buffer_bytes) {
                child.abandon();
                return Err(e);
            }
            let pid = child.pid();
            if let Some(announce) = options.on_started {
                announce(pid, functions.len());
            }
            child.release()?;
            (pid, Some(child), argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(), false)
        }
        TargetSpec::Attach { pid } => {
            if let Some(sampler) = sampler.as_mut() {
                for m in crate::procfs::read_maps(*pid).unwrap_or_default().iter().filter(|m| m.executable) {
                    if let Some(path) = &m.path {
                        sampler.mapped(*pid as u32, m.start.0, m.end.0 - m.start.0, m.offset.0, path);
                    }
                }
            }
            let frozen = Frozen::freeze(*pid)?;
            for tid in frozen.threads() {
                aggregator.name_thread(tid as u32, target::thread_name(*pid, tid));
                session.open_task(tid, false, options.buffer_bytes)?;
            }
            drop(frozen);
            if let Some(announce) = options.on_started {
                announce(*pid, functions.len());
            }
            (*pid, None, target::command_line(*pid), true)
        }
    };
    let started_monotonic_ns = monotonic_ns();
    aggregator.add_process(pid);
    let pidfd = target::pidfd(pid).ok();
    let (mut reader, guard) = session.into_reader();

    let follow = options.follow_forks;
    // PROFTAP_SAVE_EVENTS=FILE keeps the ordered hits, for the aggregator benchmark.
    let save_to = std::env::var_os("PROFTAP_SAVE_EVENTS");
    let mut saved = Vec::new();
    let mut last_event = 0u64;
    let mut sink = |event: &Event| {
        last_event = last_event.max(event.time());
        if let Some(sampler) = sampler.as_mut() {
            match event {
                Event::Mmap { pid, start, len, pgoff, path, .. } => sampler.mapped(*pid, *start, *len, *pgoff, path),
                Event::Comm { pid, tid, exec: true, .. } if pid == tid => sampler.exec(*pid),
                Event::Sample(sample) if follow || sample.pid as i32 == pid => {
                    sampler.sample(sample, &aggregator.return_addresses(sample.tid))
                }
                _ => {}
            }
        }
        if save_to.is_some()
            && let Event::Hit(hit) = event
        {
            hit.save(&mut saved);
        }
        if !follow
            && let Event::Hit(hit) = event
            && hit.pid as i32 != pid
        {
            return;
        }
        aggregator.push(event);
    };

    let deadline = options.duration.map(|d| Instant::now() + d);
    let mut ended = None;
    let mut terminated_sent = false;
    let mut peak_rate = 0u64;
    let mut window = (Instant::now(), 0u64);
    loop {
        // SAFETY: the buffers' fds stay open for the whole loop.
        let owners: Vec<BorrowedFd<'_>> =
            reader.buffers().iter().map(|b| unsafe { BorrowedFd::borrow_raw(b.owner().as_raw_fd()) }).collect();
        let mut fds: Vec<PollFd> = owners.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
        if let Some(fd) = &pidfd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(50u16));
        drop(fds);

        let watermark = monotonic_ns().saturating_sub(ORDERING_MARGIN_NS);
        reader.drain();
        let released = reader.release(Some(watermark), &mut sink);
        window.1 += released as u64;
        let elapsed = window.0.elapsed();
        if elapsed >= Duration::from_secs(1) {
            peak_rate = peak_rate.max((window.1 as f64 / elapsed.as_secs_f64()) as u64);
            window = (Instant::now(), 0);
        }

        let process_gone = pidfd.as_ref().is_some_and(|fd| readable(fd.as_fd()));
        match &mut child {
            Some(_) => {
                if options.control.terminate.load(Ordering::Relaxed) && !terminated_sent {
                    target::signal(pid, nix::sys::signal::Signal::SIGTERM);
                    terminated_sent = true;
                }
                if process_gone || pidfd.is_none() {
                    if let Some(status) = target::try_reap(pid)? {
                        ended = Some(status);
                        break;
                    }
                }
            }
            None => {
                let asked = options.control.interrupt.load(Ordering::Relaxed) || options.control.terminate.load(Ordering::Relaxed);
                if asked || process_gone || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
        }
    }
    guard._session.disable();
    reader.drain();
    reader.release(None, &mut sink);
    let lost_samples = guard._session.lost_samples();
    let malformed = reader.malformed;
    if let Some(path) = &save_to {
        let _ = std::fs::write(path, &saved);
    }
    // A launched program's recording ends with its last event, not when
    // proftap noticed it had exited.
    let ended_monotonic = if attached { monotonic_ns() } else { last_event.clamp(started_monotonic_ns, monotonic_ns()) };
    drop(reader);
    drop(guard);
    drop(child);

    let mut aggregate = aggregator.finish();
    let mut notes = Vec::new();
    // The kernel reports a loss as a record only when it next writes to the
    // buffer; the events' own counts also include losses it never reported.
    if lost_samples > aggregate.lost.events {
        aggregate.lost.events = lost_samples;
    }
    if aggregate.lost.events > 0 {
        notes.push(format!(
            "{} probe hits were lost because a ring buffer was full; calls and times of the functions and threads involved are low (raise --buffer-size)",
            aggregate.lost.events
        ));
    }
    if aggregate.unwound_frames > 0 {
        notes.push(format!(
            "{} calls ended without their own return (C++ exception, longjmp, exit, or a call deeper than the kernel's 64 tracked returns per thread); they are marked unwound and timed until the moment proftap saw them gone",
            aggregate.unwound_frames
        ));
    }
    if malformed > 0 {
        notes.push(format!("{malformed} kernel records could not be read and were skipped"));
    }
    for process in &aggregate.processes {
        for exec in &process.execs {
            if process.pid != pid || attached || exec != &functions_module_name(functions) {
                notes.push(format!("process {} executed {exec}: probes on the previous program no longer apply to it", process.pid));
            }
        }
    }
    let mut calls_by_function = vec![0u64; functions.len()];
    for thread in &aggregate.threads {
        for stats in &thread.functions {
            calls_by_function[stats.function as usize] += stats.calls;
        }
    }
    let overhead = overhead(functions, &calls_by_function, aggregate.hits, options.cost, options.compensate);

    let profile = Profile {
        target: Target {
            command,
            pid,
            exe: functions.first().map(|f| f.info.module.clone()).unwrap_or_default(),
            build_id: None,
            exit_code: match ended {
                Some(Ended::Exited(code)) => Some(code),
                _ => None,
            },
            signal: match ended {
                Some(Ended::Signaled(sig)) => Some(sig),
                _ => None,
            },
            attached,
        },
        recording: Recording {
            engine: "uprobe".into(),
            exits: if functions.iter().any(|f| f.exit_sites.is_some()) { "return-sites".into() } else { "uretprobe".into() },
            started_unix_ns,
            started_monotonic_ns,
            duration_ns: ended_monotonic.saturating_sub(started_monotonic_ns),
            events: aggregate.hits,
            peak_events_per_second: peak_rate,
            follow_forks: options.follow_forks,
            proftap_version: env!("CARGO_PKG_VERSION").into(),
        },
        metrics: metrics.iter().map(|m| m.key().to_string()).collect(),
        functions: functions.iter().map(|f| f.info.clone()).collect(),
        threads: aggregate.threads,
        lost: aggregate.lost,
        overhead,
        processes: aggregate.processes,
        notes,
        lines: line_records(options.lines.as_ref(), &aggregate.lines, &calls_by_function, metrics.len()),
        regions: options
            .regions
            .iter()
            .zip(&aggregate.regions)
            .map(|(spec, (entries, stats))| RegionRecord {
                name: spec.name.clone(),
                file: spec.file.clone(),
                start: spec.start,
                end: spec.end,
                entries: *entries,
                inclusive: stats[..metrics.len()].to_vec(),
            })
            .collect(),
        runs: 1,
        samples: sampler.map(Sampler::finish),
    };
    Ok(Recorded { profile, ended })
}

/// Line counts: entries of each line, plus a function's calls on its
/// declaration line.
fn line_records(plan: Option<&LinePlan>, counted: &[(u64, Values)], calls: &[u64], metrics: usize) -> Vec<LineRecord> {
    let Some(plan) = plan else { return Vec::new() };
    let mut records: Vec<LineRecord> = plan
        .lines
        .iter()
        .enumerate()
        .map(|(i, (file, line))| {
            let (count, cost) = counted.get(i).copied().unwrap_or((0, [0; MAX_METRICS]));
            LineRecord { file: file.clone(), line: *line, count, cost: cost[..metrics].to_vec() }
        })
        .collect();
    for (function, decl) in plan.decl_lines.iter().enumerate() {
        if let (Some(decl), Some(&n)) = (decl, calls.get(function)) {
            records[*decl as usize].count += n;
        }
    }
    records
}

fn functions_module_name(functions: &[ProbedFunction]) -> String {
    let module = functions.first().map(|f| f.info.module.as_str()).unwrap_or_default();
    let name = std::path::Path::new(module).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The kernel's comm is at most 15 bytes.
    name.chars().take(15).collect()
}

fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

fn compensation(functions: &[ProbedFunction], metrics: &[Metric], cost: ProbeCost) -> Compensation {
    let values = |wall: u64, cpu: u64| -> Values {
        let mut v: Values = [0; MAX_METRICS];
        for (i, m) in metrics.iter().enumerate() {
            v[i] = match m {
                Metric::Wall => wall,
                Metric::Cpu => cpu,
                _ => 0,
            };
        }
        v
    };
    Compensation {
        call: functions.iter().map(|f| cost.of(f.entry)).map(|c| values(c.call_ns, c.call_cpu_ns)).collect(),
        own: functions.iter().map(|f| cost.of(f.entry)).map(|c| values(c.self_ns, c.self_cpu_ns)).collect(),
    }
}

fn overhead(functions: &[ProbedFunction], calls: &[u64], hits: u64, cost: Option<ProbeCost>, compensated: bool) -> Overhead {
    let Some(cost) = cost else { return Overhead { hits, ..Overhead::default() } };
    let estimated: u64 = functions.iter().zip(calls).map(|(f, &n)| n.saturating_mul(cost.of(f.entry).call_ns)).sum();
    Overhead {
        per_hit_ns: estimated.checked_div(hits).unwrap_or(0),
        hits,
        estimated_ns: estimated,
        compensated,
        call_ns_emulated: cost.emulated.call_ns,
        call_ns_stepped: cost.stepped.call_ns,
        call_cpu_ns: cost.stepped.call_cpu_ns,
        self_ns: cost.stepped.self_ns,
    }
}

//! Recording with kernel uprobes: probes defined in tracefs, opened per task
//! and CPU with `inherit` so every thread and forked child is followed, read
//! from per-CPU ring buffers, merged in time order and aggregated on
//! per-thread shadow stacks into a [`Profile`].

use proftap_probes::lines::LinePlan;
use proftap_probes::metrics::{MAX_METRICS, Metric};

use crate::aggregate::{Aggregator, Compensation, LineSetup, NO_LINE};
use crate::events::{self, Event, Values};
use crate::governor::Governor;
use crate::observer::{Observer, RecordEvent, Unobserved};
use crate::reader::{EventReader, ORDERING_MARGIN_NS};
use crate::request::{RegionSpec, SampleSettings};
use crate::session::{ProbeSet, Session, Unregistering};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use proftap_probes::entry::EntryKind;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::tracing::{CallKind, Drainer, Tracing};
use proftap_probes::plan::{ProbedFunction, Role};
use proftap_probes::sampling::{BackgroundSampler, Sampler};
use proftap_probes::target::{self, Ended, Frozen, TargetError};
use proftap_probes::tracefs::TracefsError;
use proftap_profile::{
    Engine, ExitMode, Finding, FunctionCalls, FunctionInfo, LineRecord, Mode, Note, Overhead, Profile, Recording, Refusal, RegionRecord,
    Target,
};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
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
    /// The in-process engine could not be set up.
    #[error("the in-process engine cannot patch process {pid}: {source}")]
    Inject {
        /// The process.
        pid: i32,
        /// Why.
        source: proftap_probes::inject::remote::RemoteError,
    },
    /// An option the chosen engine does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// A metric other than wall and CPU time, with the in-process engine.
    #[error("the in-process engine measures wall and CPU time only, so far; other metrics need the uprobe engine")]
    InjectMetrics,
    /// Unwinder entries could not be hooked in a program that may unwind.
    #[error(
        "the in-process engine could not hook {entries}, and this program may unwind its stack (exceptions, panics, backtrace()); record it with the uprobe engine"
    )]
    Unhooked {
        /// The entries, and why each could not be hooked.
        entries: String,
    },
    /// The target wrote what proftap's runtime never writes into the memory
    /// they share; the recording stopped and the process runs on.
    #[error("{0}")]
    Corrupted(String),
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
        /// As whom, where and with what environment.
        launch: target::Launch,
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
    /// A function patched by the in-process engine.
    #[serde(default)]
    pub injected: CallCost,
}

impl ProbeCost {
    /// A rough cost when none was measured (this machine's order of magnitude).
    pub const ESTIMATE: ProbeCost = ProbeCost {
        emulated: CallCost { call_ns: 2_000, call_cpu_ns: 2_000, self_ns: 1_000, self_cpu_ns: 1_000 },
        stepped: CallCost { call_ns: 12_000, call_cpu_ns: 12_000, self_ns: 10_000, self_cpu_ns: 10_000 },
        injected: CallCost { call_ns: 30, call_cpu_ns: 30, self_ns: 15, self_cpu_ns: 15 },
    };

    /// What a call of `f` costs: patched by the in-process engine
    /// (`injected`) or probed by uprobes.
    fn of(&self, f: &ProbedFunction, injected: bool) -> &CallCost {
        match (injected, f.entry) {
            (true, _) => &self.injected,
            (false, EntryKind::Emulated) => &self.emulated,
            (false, EntryKind::Stepped) => &self.stepped,
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
    /// End the recording and leave the program running, launched or not.
    pub detach: Arc<AtomicBool>,
}

/// How to record.
#[derive(Clone)]
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
    /// The overhead governor's budget per function, as a share of the
    /// elapsed time (0.05: 5%); `None` keeps every probe to the end.
    pub overhead_budget: Option<f64>,
    /// Sample only for a warm-up, then instrument the hottest functions:
    /// (how many, how long to sample first).
    pub auto_instrument: Option<(usize, Duration)>,
    /// Place no probes: sample only (the functions are listed, as sampled).
    pub sample_only: bool,
    /// Regions to time.
    pub regions: Vec<RegionSpec>,
    /// Hears of the recording's progress.
    pub observer: Arc<dyn Observer>,
    /// How calls are seen.
    pub engine: Engine,
    /// Notes known before the recording starts (how the engine was chosen).
    pub notes: Vec<Note>,
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
            overhead_budget: None,
            auto_instrument: None,
            sample_only: false,
            regions: Vec::new(),
            observer: Arc::new(Unobserved),
            engine: Engine::Uprobe,
            notes: Vec::new(),
        }
    }
}

/// The event stack samples count: hardware cycles where the machine has them.
fn sampling_event() -> String {
    let cycles = Metric::Hardware(perf_event::events::Hardware::CPU_CYCLES);
    if cycles.check_available().is_ok() { "cycles".into() } else { "cpu-clock".into() }
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

pub(crate) fn perf_error(what: String, source: std::io::Error, descriptors: usize) -> RecordError {
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

/// Where the recording's events go: the aggregator and the sampler, in time order.
struct Consumer {
    aggregator: Aggregator,
    sampler: Option<BackgroundSampler>,
    /// The target's pid and whether its forked children count.
    pid: i32,
    follow: bool,
    /// Ordered hits kept for the aggregator benchmark (`PROFTAP_SAVE_EVENTS`).
    saved: Option<Vec<u8>>,
    last_event: u64,
}

impl Consumer {
    fn consume(&mut self, event: Event) {
        self.last_event = self.last_event.max(event.time());
        if let Some(sampler) = self.sampler.as_ref() {
            match event {
                Event::Mmap { pid, start, len, pgoff, ref path, .. } => sampler.mapped(pid, start, len, pgoff, path),
                Event::Comm { pid, tid, exec: true, .. } if pid == tid => sampler.exec(pid),
                Event::Sample(sample) => {
                    if self.follow || sample.pid as i32 == self.pid {
                        let returns = self.aggregator.return_addresses(sample.tid);
                        sampler.sample(sample, returns);
                    }
                    return;
                }
                _ => {}
            }
        }
        if let Event::Hit(hit) = event {
            if let Some(saved) = self.saved.as_mut() {
                hit.save(saved);
            }
            if !self.follow && hit.pid as i32 != self.pid {
                return;
            }
        }
        self.aggregator.push(&event);
    }
}

/// Everything a probe-set replacement needs.
struct Replacer<'a> {
    functions: &'a [ProbedFunction],
    lines: Option<&'a LinePlan>,
}

impl Replacer<'_> {
    /// Replaces the probe set by the probes of the `enabled` functions while
    /// the target's threads are held still, so no call is missed or seen
    /// twice; the functions in `removed` are no longer instrumented. The old
    /// set goes while the threads are still held: removing a uprobe waits for
    /// a grace period that a thread hitting probes all the time delays.
    fn replace(
        &self,
        session: &mut Session,
        reader: &mut EventReader,
        processes: &[i32],
        enabled: &[bool],
        removed: Vec<u32>,
    ) -> Result<Unregistering, RecordError> {
        let set = ProbeSet::new(self.functions, enabled, self.lines);
        let old = session.generation();
        let retired = session.define(&set)?;
        let frozen: Vec<Frozen> = processes.iter().filter_map(|&pid| Frozen::freeze(pid).ok()).collect();
        let owners = reader.owners();
        for tid in frozen.iter().flat_map(Frozen::threads) {
            // A thread that ended meanwhile has nothing to probe.
            match session.open_probes(tid, &owners) {
                Ok(()) => {}
                Err(RecordError::Perf { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
        drop(owners);
        let at = monotonic_ns();
        reader.retire(old, at);
        reader.add_generation(session.generation(), set.taps);
        reader.add_sources(session.take_sources());
        reader.inject(Event::ProbesReplaced { time: at, generation: session.generation(), removed });
        Ok(retired.withdraw())
    }
}

/// Records `functions` in `target` until it ends (or, attached, until
/// stopped), and builds the profile.
pub fn record(functions: &[ProbedFunction], spec: &TargetSpec, options: &RecordOptions) -> Result<Recorded, RecordError> {
    // Measured functions first: their index is their id in the profile; markers follow.
    let mut ordered: Vec<ProbedFunction> = functions.iter().filter(|f| f.role == Role::Measured).cloned().collect();
    let measured = ordered.len();
    ordered.extend(functions.iter().filter(|f| f.role != Role::Measured).cloned());
    let all = &ordered;
    options.observer.event(RecordEvent::Step(crate::observer::Step::PlacingProbes { functions: measured as u64 }));
    let functions = &ordered[..measured];
    let metrics = options.metrics.clone();
    debug_assert_eq!(metrics.first(), Some(&Metric::Wall));
    if functions.is_empty() && options.sample.is_none() {
        return Err(RecordError::NothingToProbe);
    }
    let sampling = options.sample.map(|s| (s.frequency_hz, s.stack_bytes));
    // The in-process engine patches what it can (a running process now, a
    // launched one when it executes the program); uprobes take the rest.
    let mut tracing = None;
    let mut notes = options.notes.clone();
    // The in-process engine records catches with an id past the measured
    // functions: the aggregator takes any such id for a catch marker.
    let catch_id = functions.len() as u32;
    // Sampling only, nothing is patched.
    let engine = if options.sample_only { Engine::Uprobe } else { options.engine };
    let mut refused_by_engine = Vec::new();
    if engine == Engine::Inject {
        if metrics.iter().any(|m| !matches!(m, Metric::Wall | Metric::Cpu)) {
            return Err(RecordError::InjectMetrics);
        }
        match spec {
            // With automatic instrumentation, the hottest functions are patched after the warm-up.
            TargetSpec::Attach { .. } if options.auto_instrument.is_some() => refused_by_engine = Tracing::refusals(functions),
            TargetSpec::Attach { pid } => {
                let engine =
                    Tracing::attach_held(*pid, functions, None, catch_id).map_err(|source| RecordError::Inject { pid: *pid, source })?;
                check_unwinders(&engine, functions)?;
                refused_by_engine = engine.refused().to_vec();
                tracing = Some(engine);
            }
            TargetSpec::Launch { .. } => refused_by_engine = Tracing::refusals(functions),
        }
        if !refused_by_engine.is_empty() {
            notes.push(refusals_note(functions, &refused_by_engine).into());
        }
    }
    let injected: Vec<bool> = {
        let mut patched = vec![true; all.len()];
        for (i, _) in &refused_by_engine {
            patched[*i] = false;
        }
        all.iter().enumerate().map(|(i, f)| engine == Engine::Inject && f.role == Role::Measured && patched[i]).collect()
    };
    let mut tsc = match engine {
        Engine::Inject => {
            Some(TscClock::new().map_err(|e| RecordError::Unsupported(format!("the in-process engine needs the TSC as a clock: {e}")))?)
        }
        Engine::Uprobe => None,
    };
    // With the in-process engine CPU time is wall time minus the time off
    // every CPU, from context switches: perf events count wall time only.
    let cpu_from_switches = (engine == Engine::Inject).then(|| metrics.iter().position(|m| *m == Metric::Cpu)).flatten();
    let perf_metrics: Vec<Metric> = if engine == Engine::Inject { vec![Metric::Wall] } else { metrics.clone() };
    let mut session = Session::new(&perf_metrics, sampling, options.buffer_bytes);
    session.switches = cpu_from_switches.is_some();
    // With automatic instrumentation, nothing is probed until the warm-up ends.
    let mut enabled: Vec<bool> = all
        .iter()
        .zip(&injected)
        .map(|(f, &injected)| {
            // The in-process engine records catches itself.
            let recorded = injected || (engine == Engine::Inject && f.role == Role::CatchMarker);
            !recorded && !options.sample_only && (options.auto_instrument.is_none() || f.role != Role::Measured)
        })
        .collect();
    let first_set = ProbeSet::new(all, &enabled, options.lines.as_ref());
    drop(session.define(&first_set)?);
    let started_unix_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);

    let compensation = options.compensate.then(|| compensation(functions, &injected, &metrics, options.cost.unwrap_or_default()));
    let mut aggregator = Aggregator::new(functions.len(), metrics.len(), compensation);
    if let Some(m) = cpu_from_switches {
        aggregator.set_cpu_from_switches(m);
    }
    // Patched functions return through the return trampoline, exceptions or
    // not, and calls in progress still do once their function is unpatched.
    aggregator.set_exit_sites(functions.iter().zip(&injected).map(|(f, &injected)| f.exit_sites.is_some() && !injected).collect());
    aggregator.set_returns_outlive_probes(injected[..functions.len()].to_vec());
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
    let sampler = options.sample.map(|s| BackgroundSampler::spawn(Sampler::new(&sampling_event(), s.frequency_hz)));

    // Launch held or freeze, open the events, then let the program go.
    let started;
    let (pid, mut child, command, attached) = match spec {
        TargetSpec::Launch { path, argv, launch } => {
            let mut child = target::spawn_held(path, argv, launch)?;
            if let Err(e) = session.open_task(child.pid(), true) {
                child.abandon();
                return Err(e);
            }
            let pid = child.pid();
            options.observer.event(RecordEvent::Started { pid, functions: functions.len() as u64, attached: false });
            if engine == Engine::Inject
                && let Err(e) = nix::sys::ptrace::seize(nix::unistd::Pid::from_raw(pid), nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC)
            {
                child.abandon();
                return Err(RecordError::Unsupported(format!("cannot trace the launched program to patch it: {e}")));
            }
            // Before the program goes: it may run a while before proftap does.
            started = monotonic_ns();
            child.release()?;
            if engine == Engine::Inject {
                // Patched when the program and its libraries are in place and none of their code has run.
                let engine = Tracing::attach_at_start(pid, functions, catch_id).map_err(|source| RecordError::Inject { pid, source })?;
                check_unwinders(&engine, functions)?;
                let missed: Vec<&str> =
                    engine.refused().iter().filter(|(i, _)| injected[*i]).map(|(i, _)| functions[*i].info.name.as_str()).collect();
                if !missed.is_empty() {
                    notes.push(Finding::CodeDiffers { functions: missed.iter().map(|n| n.to_string()).collect() }.into());
                }
                tracing = Some(engine);
            }
            (pid, Some(child), argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(), false)
        }
        TargetSpec::Attach { pid } => {
            if let Some(sampler) = sampler.as_ref() {
                for m in proftap_probes::procfs::read_maps(*pid).unwrap_or_default().iter().filter(|m| m.executable) {
                    if let Some(path) = &m.path {
                        sampler.mapped(*pid as u32, m.start.0, m.end.0 - m.start.0, m.offset.0, path);
                    }
                }
            }
            // Held still already when just patched.
            let held = tracing.as_ref().and_then(Tracing::held_threads);
            let frozen = if held.is_some() { None } else { Some(Frozen::freeze(*pid)?) };
            for tid in held.unwrap_or_else(|| frozen.as_ref().map(Frozen::threads).unwrap_or_default()) {
                aggregator.name_thread(tid as u32, target::thread_name(*pid, tid));
                session.open_task(tid, false)?;
            }
            started = monotonic_ns();
            drop(frozen);
            options.observer.event(RecordEvent::Started { pid: *pid, functions: functions.len() as u64, attached: true });
            (*pid, None, target::command_line(*pid), true)
        }
    };
    let started_monotonic_ns = started;
    // Which functions are patched: those the engine took (after the warm-up,
    // with automatic instrumentation).
    let mut patched: Vec<bool> = match &tracing {
        Some(engine) => {
            let mut patched = injected.clone();
            engine.refused().iter().for_each(|&(i, _)| patched[i] = false);
            patched
        }
        None => vec![false; all.len()],
    };
    let mut injected_code = tracing.as_ref().map(Tracing::code);
    // The kernel's uretprobe trampoline page, and the engine's code.
    let trampolines = |code: &Option<Vec<std::ops::Range<u64>>>| -> Vec<std::ops::Range<u64>> {
        std::iter::once(proftap_probes::sampling::DEFAULT_PROBE_AREA).chain(code.iter().flatten().cloned()).collect()
    };
    aggregator.set_trampolines(trampolines(&injected_code));
    // What a call costs, for the governor: patched functions are judged by
    // the drainer, as their records arrive, the others by the recording loop.
    let call_ns = |patched: bool| -> Vec<u64> {
        let cost = options.cost.unwrap_or(ProbeCost::ESTIMATE);
        let call_ns = |(f, &injected): (&ProbedFunction, &bool)| if injected == patched { cost.of(f, injected).call_ns.max(1) } else { 0 };
        functions.iter().zip(&injected).map(call_ns).collect()
    };
    let judge = || {
        options.overhead_budget.map(|budget| {
            let mut governor = Governor::new(budget, call_ns(true));
            Box::new(move |entries: &[u64]| {
                let elapsed_ns = monotonic_ns().saturating_sub(started_monotonic_ns);
                governor.over_budget(entries, elapsed_ns).into_iter().map(|f| f as usize).collect()
            }) as proftap_probes::inject::tracing::Judge
        })
    };
    let mut tracing = tracing.map(|mut tracing| {
        let hold = tracing.take_hold();
        let drainer = Drainer::spawn(tracing, judge());
        drop(hold);
        drainer
    });
    if let Some(sampler) = sampler.as_ref() {
        for code in injected_code.iter().flatten() {
            sampler.engine_code(pid as u32, code.clone());
        }
    }
    aggregator.add_process(pid);
    let pidfd = target::pidfd(pid).ok();
    let mut reader = EventReader::new(session.take_buffers(), perf_metrics.len() - 1);
    reader.add_sources(session.take_sources());
    reader.add_generation(session.generation(), first_set.taps);

    let save_to = std::env::var_os("PROFTAP_SAVE_EVENTS");
    let mut consumer =
        Consumer { aggregator, sampler, pid, follow: options.follow_forks, saved: save_to.as_ref().map(|_| Vec::new()), last_event: 0 };
    let replacer = Replacer { functions: all, lines: options.lines.as_ref() };
    let mut governor = options.overhead_budget.map(|budget| Governor::new(budget, call_ns(false)));
    let mut auto_pending = options.auto_instrument;
    let mut calls = Vec::new();

    let deadline = options.duration.map(|d| Instant::now() + d);
    let mut ended = None;
    let mut terminated_sent = false;
    let mut peak_rate = 0u64;
    let mut last_counters = (0, 0);
    let mut window = (Instant::now(), 0u64);
    // Replaced probe sets, out of the targets, unregistered at the end.
    let mut unregistering = Vec::new();
    // Probe-set changes are decided as hits are read, so the poll wakes often.
    let poll_ms: u16 = if governor.is_some() || auto_pending.is_some() { 10 } else { 50 };
    loop {
        // SAFETY: the buffers' fds stay open for the whole loop.
        let owners: Vec<BorrowedFd<'_>> =
            reader.buffers().iter().map(|b| unsafe { BorrowedFd::borrow_raw(b.owner().as_raw_fd()) }).collect();
        let mut fds: Vec<PollFd> = owners.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
        if let Some(fd) = &pidfd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(poll_ms));
        drop(fds);

        let watermark = monotonic_ns().saturating_sub(ORDERING_MARGIN_NS);
        reader.drain();
        if let (Some(drainer), Some(clock)) = (tracing.as_ref(), tsc.as_mut()) {
            calls.clear();
            // A bounded helping per turn keeps proftap's memory bounded when the
            // program makes calls faster than they can be aggregated.
            drainer.take(&mut calls, 1 << 20);
            inject_calls(&calls, clock, pid, session.generation(), &mut reader);
        }
        // Patched functions the drainer found over budget and unpatched.
        for unpatched in tracing.as_ref().map(Drainer::unpatched).unwrap_or_default() {
            let names: Vec<FunctionCalls> =
                unpatched.functions.iter().map(|&(f, calls)| FunctionCalls { name: functions[f].info.name.clone(), calls }).collect();
            let note: Note = match unpatched.error {
                None => {
                    let removed = unpatched.functions.iter().map(|&(f, _)| f as u32).collect();
                    reader.inject(Event::ProbesReplaced { time: unpatched.time, generation: session.generation(), removed });
                    over_budget_note(unpatched.time.saturating_sub(started_monotonic_ns), names, options)
                }
                Some(error) => Finding::UnpatchFailed { functions: names, error }.into(),
            };
            options.observer.event(RecordEvent::ProbesChanged(note.clone()));
            notes.push(note);
        }
        // Probe-set changes (the governor's, the end of a warm-up) are decided
        // on the hits just read, before the slower ordering and aggregation.
        let elapsed_ns = monotonic_ns().saturating_sub(started_monotonic_ns);
        let over = governor.as_mut().map(|g| g.over_budget(reader.entries(), elapsed_ns)).unwrap_or_default();
        let warmed_up = auto_pending.filter(|(_, warmup)| elapsed_ns >= warmup.as_nanos() as u64);
        if !over.is_empty() || warmed_up.is_some() {
            // Processes forked in the last ordering margin are not known yet: they
            // keep the probes they inherited.
            let processes: Vec<i32> =
                consumer.aggregator.processes().iter().map(|p| p.pid).filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
            if !over.is_empty() {
                for &f in &over {
                    enabled[f as usize] = false;
                }
                let names: Vec<FunctionCalls> = over
                    .iter()
                    .map(|&f| FunctionCalls { name: functions[f as usize].info.name.clone(), calls: reader.entries()[f as usize] })
                    .collect();
                match replacer.replace(&mut session, &mut reader, &processes, &enabled, over) {
                    Ok(old) => {
                        unregistering.push(old);
                        let note = over_budget_note(elapsed_ns, names, options);
                        options.observer.event(RecordEvent::ProbesChanged(note.clone()));
                        notes.push(note);
                    }
                    Err(e) => {
                        notes.push(Finding::ThrottleFailed { error: e.to_string() }.into());
                        governor = None;
                    }
                }
            }
            if let Some((count, warmup)) = warmed_up {
                auto_pending = None;
                let hot = consumer.sampler.as_ref().map(BackgroundSampler::hottest).unwrap_or_default();
                let chosen: Vec<usize> =
                    hot.iter().filter_map(|(name, _, _)| functions.iter().position(|f| &f.info.name == name)).take(count).collect();
                // Patched where the engine can, probed by uprobes where not.
                let (to_patch, to_probe): (Vec<usize>, Vec<usize>) = chosen.iter().partition(|&&f| injected[f]);
                for &f in &to_probe {
                    enabled[f] = true;
                }
                let patching = if to_patch.is_empty() {
                    Ok(())
                } else {
                    let wanted: Vec<bool> = (0..functions.len()).map(|f| to_patch.contains(&f)).collect();
                    Tracing::attach_held(pid, functions, Some(&wanted), catch_id)
                        .map_err(|source| RecordError::Inject { pid, source })
                        .and_then(|engine| check_unwinders(&engine, functions).map(|()| engine))
                        .map(|mut engine| {
                            for &f in &to_patch {
                                patched[f] = !engine.refused().iter().any(|(i, _)| *i == f);
                            }
                            let code = engine.code();
                            if let Some(sampler) = consumer.sampler.as_ref() {
                                code.iter().for_each(|c| sampler.engine_code(pid as u32, c.clone()));
                            }
                            injected_code = Some(code);
                            consumer.aggregator.set_trampolines(trampolines(&injected_code));
                            let hold = engine.take_hold();
                            tracing = Some(Drainer::spawn(engine, judge()));
                            drop(hold);
                        })
                };
                let replaced = match (chosen.is_empty(), patching) {
                    (true, _) => None,
                    (false, Err(e)) => Some(Err(e)),
                    (false, Ok(())) if to_probe.is_empty() => Some(Ok(None)),
                    (false, Ok(())) => Some(replacer.replace(&mut session, &mut reader, &processes, &enabled, Vec::new()).map(Some)),
                };
                let warmup_ms = warmup.as_millis() as u64;
                let note: Note = match replaced {
                    None => Finding::AutoInstrumented { warmup_ms, functions: Vec::new() }.into(),
                    Some(Ok(old)) => {
                        unregistering.extend(old);
                        let functions = chosen.iter().map(|&f| functions[f].info.name.clone()).collect();
                        Finding::AutoInstrumented { warmup_ms, functions }.into()
                    }
                    Some(Err(e)) => Finding::AutoInstrumentFailed { error: e.to_string() }.into(),
                };
                options.observer.event(RecordEvent::ProbesChanged(note.clone()));
                notes.push(note);
            }
        }

        let released = reader.release(Some(watermark), |e| consumer.consume(e));
        window.1 += released as u64;
        let counters = (consumer.aggregator.hits(), consumer.aggregator.lost_events());
        if counters != last_counters {
            options.observer.event(RecordEvent::Counters { hits: counters.0, lost: counters.1 });
            last_counters = counters;
        }
        let elapsed = window.0.elapsed();
        if elapsed >= Duration::from_secs(1) {
            peak_rate = peak_rate.max((window.1 as f64 / elapsed.as_secs_f64()) as u64);
            window = (Instant::now(), 0);
        }

        if tracing.as_ref().is_some_and(|d| d.corrupted().is_some()) {
            break;
        }
        let process_gone = pidfd.as_ref().is_some_and(|fd| readable(fd.as_fd()));
        match &mut child {
            Some(_) if options.control.detach.load(Ordering::Relaxed) => break,
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
                let asked = [&options.control.interrupt, &options.control.terminate, &options.control.detach]
                    .iter()
                    .any(|f| f.load(Ordering::Relaxed));
                if asked || process_gone || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
        }
    }
    session.disable();
    reader.drain();
    let mut engine_lost = 0;
    let mut corrupted = None;
    if let (Some(drainer), Some(clock)) = (tracing, tsc.as_mut()) {
        calls.clear();
        let mut engine = drainer.finish(&mut calls);
        if let Err(e) = engine.detach() {
            notes.push(Finding::RestoreFailed { pid, error: e.to_string() }.into());
        }
        engine.drain(&mut calls);
        inject_calls(&calls, clock, pid, session.generation(), &mut reader);
        // Counted with the kernel's losses, by thread.
        let now = monotonic_ns();
        for (tid, count) in engine.lost() {
            engine_lost += count;
            reader.inject(Event::Lost { time: now, tid, probe: None, count });
        }
        if engine_lost > 0 {
            notes.push(Finding::EngineRecordsLost { records: engine_lost }.into());
        }
        // Untimed calls: an entry and a return each, lost.
        let (too_deep, unslotted) = engine.untimed();
        for &(tid, calls) in &too_deep {
            engine_lost += 2 * calls;
            reader.inject(Event::Lost { time: now, tid, probe: None, count: 2 * calls });
        }
        if unslotted > 0 {
            engine_lost += 2 * unslotted;
            reader.inject(Event::Lost { time: now, tid: 0, probe: None, count: 2 * unslotted });
        }
        corrupted = engine.corrupted();
        let deep: u64 = too_deep.iter().map(|&(_, calls)| calls).sum();
        if deep + unslotted > 0 {
            notes.push(
                Finding::Untimed {
                    too_deep: deep,
                    without_slot: unslotted,
                    stack_depth: proftap_probes::inject::runtime::STACK_DEPTH,
                    slots: proftap_probes::inject::runtime::SLOTS,
                }
                .into(),
            );
        }
    }
    reader.release(None, |e| consumer.consume(e));
    let lost_samples = session.lost_samples();
    let malformed = reader.malformed;
    if let (Some(path), Some(saved)) = (&save_to, &consumer.saved) {
        let _ = std::fs::write(path, saved);
    }
    // A launched program's recording ends with its last event, not when
    // proftap noticed it had exited.
    let ended_monotonic = if attached { monotonic_ns() } else { consumer.last_event.clamp(started_monotonic_ns, monotonic_ns()) };
    drop(reader);
    unregistering.push(session.withdraw());
    drop(session);
    // Each set waits for its own grace periods: in parallel.
    drop(unregistering);
    drop(child);
    if let Some(why) = corrupted {
        return Err(RecordError::Corrupted(why));
    }
    let Consumer { aggregator, sampler, .. } = consumer;
    let throttled: Vec<bool> = aggregator.throttled().to_vec();

    let mut aggregate = aggregator.finish();
    // The kernel reports a loss as a record only when it next writes to the
    // buffer; the events' own counts also include losses it never reported.
    if lost_samples + engine_lost > aggregate.lost.events {
        aggregate.lost.events = lost_samples + engine_lost;
    }
    let kernel_lost = aggregate.lost.events - engine_lost;
    if kernel_lost > 0 {
        notes.push(Finding::HitsLost { hits: kernel_lost }.into());
    }
    if aggregate.unwound_frames > 0 {
        notes.push(Finding::Unwound { calls: aggregate.unwound_frames }.into());
    }
    if aggregate.orphaned_frames > 0 {
        notes.push(Finding::Orphaned { calls: aggregate.orphaned_frames }.into());
    }
    if malformed > 0 {
        notes.push(Finding::Malformed { records: malformed }.into());
    }
    for process in &aggregate.processes {
        for exec in &process.execs {
            if process.pid != pid || attached || exec != &functions_module_name(functions) {
                notes.push(Finding::Executed { pid: process.pid, program: exec.clone() }.into());
            }
        }
    }
    if injected_code.is_some() && options.follow_forks {
        // The patched code runs on in a forked child, its records disabled.
        let forked: Vec<i32> = aggregate.processes.iter().filter(|p| p.pid != pid).map(|p| p.pid).collect();
        if !forked.is_empty() {
            notes.push(Finding::ForksNotRecorded { pids: forked }.into());
        }
    }
    let mut calls_by_function = vec![0u64; functions.len()];
    for thread in &aggregate.threads {
        for stats in &thread.functions {
            calls_by_function[stats.function as usize] += stats.calls;
        }
    }
    let overhead = overhead(functions, &patched, &calls_by_function, aggregate.hits, options.cost, options.compensate);

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
            engine: if injected_code.is_some() { Engine::Inject } else { Engine::Uprobe },
            exits: if functions.iter().any(|f| f.exit_sites.is_some()) { ExitMode::ReturnSites } else { ExitMode::Uretprobe },
            started_unix_ns,
            started_monotonic_ns,
            duration_ns: ended_monotonic.saturating_sub(started_monotonic_ns),
            events: aggregate.hits,
            peak_events_per_second: peak_rate,
            follow_forks: options.follow_forks,
            proftap_version: env!("CARGO_PKG_VERSION").into(),
        },
        metrics: metrics.iter().map(|m| m.key().to_string()).collect(),
        functions: functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mode = if throttled[i] {
                    Mode::Throttled
                } else if enabled[i] || patched[i] {
                    Mode::Instrumented
                } else {
                    Mode::Sampled
                };
                let engine = match mode {
                    Mode::Sampled => None,
                    _ if patched[i] => Some(Engine::Inject),
                    _ => Some(Engine::Uprobe),
                };
                FunctionInfo { mode, engine, ..f.info.clone() }
            })
            .collect(),
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
        samples: sampler.map(BackgroundSampler::finish),
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

fn compensation(functions: &[ProbedFunction], injected: &[bool], metrics: &[Metric], cost: ProbeCost) -> Compensation {
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
        call: functions.iter().zip(injected).map(|(f, &i)| cost.of(f, i)).map(|c| values(c.call_ns, c.call_cpu_ns)).collect(),
        own: functions.iter().zip(injected).map(|(f, &i)| cost.of(f, i)).map(|c| values(c.self_ns, c.self_cpu_ns)).collect(),
    }
}

fn overhead(
    functions: &[ProbedFunction],
    injected: &[bool],
    calls: &[u64],
    hits: u64,
    cost: Option<ProbeCost>,
    compensated: bool,
) -> Overhead {
    let Some(cost) = cost else { return Overhead { hits, ..Overhead::default() } };
    let estimated: u64 =
        functions.iter().zip(injected).zip(calls).map(|((f, &injected), &n)| n.saturating_mul(cost.of(f, injected).call_ns)).sum();
    Overhead {
        per_hit_ns: estimated.checked_div(hits).unwrap_or(0),
        hits,
        estimated_ns: estimated,
        compensated,
        call_ns_emulated: cost.emulated.call_ns,
        call_ns_stepped: cost.stepped.call_ns,
        call_ns_injected: cost.injected.call_ns,
        call_cpu_ns: cost.stepped.call_cpu_ns,
        self_ns: cost.stepped.self_ns,
    }
}

/// Which functions the in-process engine left to uprobes, by reason, with
/// a few names each (a large program has hundreds).
fn refusals_note(functions: &[ProbedFunction], refused: &[(usize, String)]) -> Finding {
    const NAMED: usize = 3;
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for (i, why) in refused {
        let name = functions[*i].info.name.as_str();
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, names)) => names.push(name),
            None => reasons.push((why, vec![name])),
        }
    }
    reasons.sort_by_key(|(why, names)| (std::cmp::Reverse(names.len()), *why));
    let reasons = reasons
        .into_iter()
        .map(|(why, mut names)| {
            let count = names.len() as u64;
            names.sort_unstable();
            names.dedup();
            Refusal { reason: why.to_string(), count, examples: names.iter().take(NAMED).map(|n| n.to_string()).collect() }
        })
        .collect();
    Finding::NotPatched { functions: refused.len() as u64, reasons }
}

/// What the governor did to functions over budget (`names` with their calls).
fn over_budget_note(elapsed_ns: u64, functions: Vec<FunctionCalls>, options: &RecordOptions) -> Note {
    let budget_percent = options.overhead_budget.unwrap_or_default() * 100.0;
    Finding::Throttled { after_ms: elapsed_ns / 1_000_000, functions, budget_percent }.into()
}

/// Refuses a program that may unwind (an exception, a panic, `backtrace()`)
/// when an unwinder entry could not be hooked: an unwinder would meet a
/// hijacked return address.
fn check_unwinders(engine: &Tracing, functions: &[ProbedFunction]) -> Result<(), RecordError> {
    if engine.unhooked().is_empty() || functions.iter().all(|f| f.exit_sites.is_none()) {
        return Ok(());
    }
    Err(RecordError::Unhooked { entries: engine.unhooked().join(", ") })
}

/// Moves the in-process engine's records into the event stream, as probe hits.
fn inject_calls(
    calls: &[proftap_probes::inject::tracing::Call],
    clock: &mut TscClock,
    pid: i32,
    generation: u32,
    reader: &mut EventReader,
) {
    clock.refresh();
    for call in calls.iter() {
        let mut values = [0; proftap_probes::metrics::MAX_METRICS];
        values[0] = clock.ns(call.tsc);
        reader.inject(Event::Hit(events::Hit {
            pid: pid as u32,
            tid: call.tid,
            probe: match call.kind {
                CallKind::Exit => events::ProbeId::exit(call.function),
                CallKind::Entry | CallKind::Catch => events::ProbeId::entry(call.function),
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

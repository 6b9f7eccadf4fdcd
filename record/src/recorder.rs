//! A recording from start to profile: the engines set up, the target
//! launched held or its threads held still while the events open, the
//! driver run until the end, and the profile assembled.

use crate::aggregate::{Aggregator, AggregatorConfig, LineSetup, NO_LINE};
use crate::assemble::{LineTable, Setup, assemble};
use crate::cost::compensation;
use crate::driver::{CodeAdded, Consumer, Driver, EngineMemory, Finished, Run, Sources};
use crate::error::RecordError;
use crate::events::Event;
use crate::governor::SampledOverhead;
use crate::observer::{RecordEvent, Step, Warning};
use crate::options::{RecordOptions, Recorded, TargetSpec};
use crate::request::{RegionSpec, regions_of_lines};
use crate::samples::SampleAggregator;
use crate::saved::Saver;
use crate::sources::inject::{InjectSource, check_unwinders};
use crate::sources::monotonic_ns;
use crate::sources::sampler::{SamplerThread, sampling_event};
use crate::sources::uprobes::{TaskRecords, UprobeSource};
use proftap_probes::arcs::FunctionLines;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::patched::{ENTRY_COUNTED, Patched, Recording};
use proftap_probes::inject::patcher::Refused;
use proftap_probes::lines::LinePlan;
use proftap_probes::metrics::Metric;
use proftap_probes::offcpu::OffCpu;
use proftap_probes::plan::{ProbedFunction, Role};
use proftap_probes::procfs;
use proftap_probes::sampling::{ANONYMOUS, DEFAULT_PROBE_AREA, FramesAhead, StackResolver};
use proftap_probes::target::{self, Frozen, HeldChild};
use proftap_profile::{Engine, ExitMode, Finding, Note, Refusal, Target};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a function whose lines probes follow is not patched.
const LINES_PROBED: &str = "its lines are followed by uprobes (its control flow cannot be read to count them)";

/// What the in-process engine takes on before the target runs.
struct Patching {
    /// Per function: the engine may patch it.
    injected: Vec<bool>,
    /// A running process, patched and held still.
    tracing: Option<Patched>,
    clock: Option<TscClock>,
    /// What the runtime reads CPU time from, when the kernel lends it.
    off_cpu: Option<Arc<OffCpu>>,
    notes: Vec<Note>,
    /// The functions the engine will not patch, and why.
    refused: Refused,
    /// Functions whose patch is planned again from their whole code at
    /// the start, not from their first instructions alone (see
    /// [`Patched::refusals`]).
    planned_whole: Vec<usize>,
}

/// The target, running with its events open.
struct Started {
    pid: i32,
    child: Option<HeldChild>,
    command: Vec<String>,
    attached: bool,
    started_ns: u64,
    /// Threads that existed at the start, named.
    threads: Vec<(i32, String)>,
    tracing: Option<Patched>,
    notes: Vec<Note>,
    /// Functions the engine found it could not patch once the program was
    /// in place (their entry counts lines), and why.
    refused: Refused,
}

/// Records `functions` in `spec`'s target until it ends (or, attached,
/// until stopped), and builds the profile; `saver` saves its events.
pub fn record(
    functions: &[ProbedFunction],
    spec: &TargetSpec,
    held: Option<HeldChild>,
    options: &RecordOptions,
    saver: Option<Saver>,
) -> Result<Recorded, RecordError> {
    // Measured functions first: their index is their id in the profile; markers follow.
    let mut all: Vec<ProbedFunction> = functions.iter().filter(|f| f.role == Role::Measured).cloned().collect();
    let measured = all.len();
    all.extend(functions.iter().filter(|f| f.role != Role::Measured).cloned());
    options.observer.event(RecordEvent::Step(Step::PlacingProbes { functions: measured as u64 }));
    if measured == 0 && options.sample.is_none() {
        return Err(RecordError::NothingToProbe);
    }
    // Where the program's functions are described, for its samples'
    // inlined frames and lines, read while the probes are planned and placed.
    let frames_ahead = match spec {
        TargetSpec::Launch { path, .. } if options.sample.is_some() => FramesAhead::start(&options.symbols, path),
        _ => None,
    };
    let counted = CountedLines::of(options, measured);
    let patching = patching(&all[..measured], spec, options, &counted)?;
    let changed = match spec {
        TargetSpec::Attach { pid } => changed_in_memory(*pid, &mut all[..measured], &patching.injected),
        TargetSpec::Launch { .. } => Vec::new(),
    };
    // A probe the kernel refuses would be skipped without a word at the
    // launch, and fail a replacement of the probes later.
    let wanted = probed_by_uprobes(&all, &patching.injected, options);
    let refused_by_kernel: Vec<String> = all[..measured]
        .iter()
        .zip(&wanted)
        .filter(|(f, wanted)| **wanted && f.uprobe_refused && !changed.contains(&f.info.name))
        .map(|(f, _)| f.info.name.clone())
        .collect();
    let enabled: Vec<bool> = all.iter().zip(wanted).map(|(f, wanted)| wanted && !f.uprobe_refused).collect();
    let stacks = options.sample.map(|s| (s.frequency_hz, s.stack_bytes));
    // With the in-process engine CPU time is wall time minus the time off
    // every CPU, from context switches: perf events count wall time only.
    let inject = options.engine == Engine::Inject && !options.sample_only;
    let cpu_from_switches = inject.then(|| options.metrics.iter().position(|m| *m == Metric::Cpu)).flatten();
    let perf_metrics = if inject { vec![Metric::Wall] } else { options.metrics.clone() };
    // Uprobes are placed only on what `enabled` picks, or when they may be
    // added later (automatic instrumentation), or for lines.
    let kernel_probes = enabled.iter().any(|&e| e) || options.auto_instrument.is_some() || options.probed_lines.is_some();
    let task_records = TaskRecords { switches: cpu_from_switches.is_some() && kernel_probes, counters: kernel_probes };
    let mut uprobes =
        UprobeSource::new(&all, &enabled, options.probed_lines.as_ref(), &perf_metrics, stacks, options.buffer_bytes, task_records)?;
    let started_unix_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let sampling = options.sample.map(|s| (sampling_event().to_string(), s.frequency_hz));
    // Sampled at a frequency, each sample stands for a period of CPU time.
    let sampled = sampling.as_ref().map(|(_, hz)| (Arc::new(SampledOverhead::of_functions(measured)), 1_000_000_000 / (*hz).max(1)));
    let sampler = sampling.as_ref().map(|(event, hz)| {
        let resolver = sample_resolver(&all[..measured], spec, options, frames_ahead, kernel_probes);
        let injected = |i: usize| patching.injected.get(i).copied().unwrap_or(false);
        let instrumented = |i: usize| enabled.get(i).copied().unwrap_or(false) || injected(i);
        let samples = sample_aggregator(&all[..measured], instrumented, event, *hz, options.trace_bytes.is_some())
            .patching(all[..measured].iter().enumerate().filter(|&(i, _)| injected(i)).map(|(_, f)| f.info.name.clone()));
        let samples = if matches!(spec, TargetSpec::Attach { .. }) { samples.attached() } else { samples };
        let overhead = sampled.as_ref().map(|(overhead, _)| overhead.clone()).unwrap_or_default();
        // The named stacks are kept only to be saved.
        SamplerThread::spawn(resolver, samples, overhead, saver.is_some())
    });
    let Patching { mut injected, tracing, clock, off_cpu, mut notes, refused, planned_whole } = patching;
    if !refused_by_kernel.is_empty() {
        notes.push(Finding::UprobesRefused { functions: refused_by_kernel }.into());
    }
    if !changed.is_empty() {
        // Said now too: the attach is about to say how many it probes.
        options.observer.event(RecordEvent::Warning(Warning::CodeDiffers { functions: changed.clone() }));
        notes.push(Finding::CodeDiffers { functions: changed }.into());
    }
    let how = counted.recording(options.engine_recording(off_cpu.as_deref()));
    let mut checked = injected.clone();
    planned_whole.iter().for_each(|&i| checked[i] = false);
    // Patched now only where the engine is in (after a warm-up, with --auto-instrument, nothing yet).
    let patched_now = injected.iter().filter(|&&patched| patched && tracing.is_some()).count();
    let probed = patched_now + enabled[..measured].iter().filter(|&&probed| probed).count();
    let patch = Patch { functions: &all[..measured], injected: &injected, checked: &checked, how, may_unwind: options.may_unwind, probed };
    let started = start(spec, held, &mut uprobes, tracing, sampler.as_ref(), &patch, options)?;
    notes.extend(started.notes);
    left_out(&mut injected, &started.refused);
    let refused: Refused = refused.into_iter().chain(started.refused).collect();
    if !refused.is_empty() {
        notes.push(refusals_note(&all[..measured], &refused, unpatched_left_to(options)).into());
    }
    let run = Run {
        all: &all,
        measured,
        options,
        injected,
        pid: started.pid,
        started_ns: started.started_ns,
        attached: started.attached,
        sampled,
    };
    let code = started.tracing.as_ref().map(Patched::code).unwrap_or_default();
    let code_added = started.tracing.as_ref().map(CodeAdded::of);
    let mut patched = run.injected.clone();
    match &started.tracing {
        Some(engine) => engine.refused().iter().for_each(|&(i, _)| patched[i] = false),
        None => patched.iter_mut().for_each(|p| *p = false),
    }
    let setup = setup(&run, &started.command, &code, cpu_from_switches, started_unix_ns, sampling);
    let mut saver = saver;
    if let Some(saver) = saver.as_mut() {
        saver.setup(&setup);
    }
    let consumer = Consumer {
        aggregator: Aggregator::new(setup.aggregation.clone()),
        engine: started.tracing.as_ref().zip(clock).map(|(engine, clock)| EngineMemory::of(run.pid, engine, clock)).unwrap_or_default(),
        sampler,
        saver,
        pid: run.pid,
        follow: options.follow_forks,
        last_event: 0,
    };
    let inject = started
        .tracing
        .zip(clock)
        .map(|(engine, clock)| InjectSource::start(engine, run.judge(), clock, off_cpu.clone(), options.trace_bytes));
    let sources = Sources { uprobes, inject, clock, off_cpu, enabled, patched };
    let mut driver = Driver::new(&run, sources, consumer, started.child, notes);
    driver.code_added(run.pid, code_added);
    let named = started.threads.into_iter().map(|(tid, name)| Event::Comm {
        time: run.started_ns,
        pid: run.pid as u32,
        tid: tid as u32,
        name,
        exec: false,
    });
    driver.push(named);
    Ok(recorded(driver.run()?, &setup, options))
}

/// What sees the functions the in-process engine could not patch.
fn unpatched_left_to(options: &RecordOptions) -> UnpatchedLeftTo {
    if !leaves_unpatched_unprobed(options) {
        UnpatchedLeftTo::Uprobes
    } else if options.sample.is_some() {
        UnpatchedLeftTo::Samples
    } else {
        UnpatchedLeftTo::Nothing
    }
}

/// The resolver naming the samples of the `measured` functions' run: the
/// program's inlined frames and lines, and those of the modules whose
/// functions are measured; `kernel_probes` when uprobes may be placed.
fn sample_resolver(
    measured: &[ProbedFunction],
    spec: &TargetSpec,
    options: &RecordOptions,
    frames_ahead: Option<FramesAhead>,
    kernel_probes: bool,
) -> StackResolver {
    let executable = match spec {
        TargetSpec::Launch { path, .. } => path.clone(),
        TargetSpec::Attach { pid } => PathBuf::from(format!("/proc/{pid}/exe")),
    };
    let mut with_lines: Vec<&Path> = measured.iter().map(|f| f.open_path.as_path()).collect();
    with_lines.push(&executable);
    with_lines.sort_unstable();
    with_lines.dedup();
    let resolver = StackResolver::new(options.symbols.clone()).lines_only_of(with_lines).frames_read_ahead(frames_ahead);
    if kernel_probes { resolver } else { resolver.without_kernel_probes() }
}

/// The aggregator of samples of `event` at `hz`, knowing which of the
/// `measured` functions are `instrumented` (for the samples after a
/// throttle); `timed` keeps each sample's time.
fn sample_aggregator(
    measured: &[ProbedFunction],
    instrumented: impl Fn(usize) -> bool,
    event: &str,
    hz: u64,
    timed: bool,
) -> SampleAggregator {
    let names = measured.iter().enumerate().map(|(i, f)| if instrumented(i) { f.info.name.clone() } else { String::new() });
    let samples = SampleAggregator::new(event, hz).measuring(names.collect());
    if timed { samples.timed() } else { samples }
}

/// The profile of a recording that `finished`, with what its sampler counted.
fn recorded(mut finished: Finished, setup: &Setup, options: &RecordOptions) -> Recorded {
    let consumer = finished.consumer;
    let sampled = consumer.sampler.map(SamplerThread::finish);
    let (samples, stacks, timeline) = match sampled {
        Some(s) => (Some(s.profile), Some(s.stacks), s.timeline),
        None => (None, None, Vec::new()),
    };
    // Saved with the ending: a replay of the stacks alone does not know when
    // functions were throttled.
    finished.ending.throttled = samples.as_ref().map(|s| s.throttled.clone()).unwrap_or_default();
    finished.ending.in_counting_stubs = samples.as_ref().map_or(0, |s| s.in_counting_stubs);
    let mut aggregate = consumer.aggregator.finish();
    if let Some(trace) = aggregate.trace.as_mut() {
        if let Some(engine) = finished.ending.engine_trace.take() {
            trace.absorb(engine);
        }
        for at in timeline {
            trace.sample(at.pid, at.tid, at.time, at.stack);
        }
    }
    if let Some(saver) = consumer.saver
        && let Err(e) = saver.finish(stacks.as_deref().unwrap_or_default(), &finished.ending)
    {
        options.observer.event(RecordEvent::Warning(Warning::EventsNotSaved { reason: e.to_string() }));
    }
    let profile = assemble(setup, aggregate, samples, finished.ending);
    Recorded { profile, ended: finished.ended, closing: finished.closing }
}

/// Decides what the in-process engine patches: a running process now
/// (held still until the driver runs), a launched one when it executes the
/// program; with automatic instrumentation, the hottest functions after the
/// warm-up. Uprobes take what it cannot patch.
/// The functions whose lines edge counters count, and their lines.
struct CountedLines {
    /// Per measured function, whether its edges are counted.
    edges: Vec<bool>,
    /// Per measured function, its lines.
    lines: Vec<FunctionLines>,
    /// Per line id, the regions that hold it (their hooks go with the counters).
    regions_of: Vec<Vec<u32>>,
}

impl CountedLines {
    /// `how`, with these lines counted and their regions hooked.
    fn recording<'a>(&'a self, how: Recording<'a>) -> Recording<'a> {
        let regions = if self.regions_of.iter().any(|r| !r.is_empty()) { how.regions } else { 0 };
        Recording { count_edges: &self.edges, lines: &self.lines, regions_of: &self.regions_of, regions, ..how }
    }

    fn of(options: &RecordOptions, measured: usize) -> CountedLines {
        match (&options.lines, options.count_lines) {
            (Some(plan), true) => {
                let mut edges = plan.with_lines();
                edges.resize(measured, false);
                options.line_probed.iter().for_each(|&i| edges[i] = false);
                CountedLines { edges, lines: plan.by_function(), regions_of: regions_of_lines(&plan.lines, &options.regions) }
            }
            _ => CountedLines { edges: Vec::new(), lines: Vec::new(), regions_of: Vec::new() },
        }
    }
}

fn patching(
    functions: &[ProbedFunction],
    spec: &TargetSpec,
    options: &RecordOptions,
    counted: &CountedLines,
) -> Result<Patching, RecordError> {
    let notes = options.notes.clone();
    let mut tracing = None;
    // Sampling only, nothing is patched.
    if options.engine != Engine::Inject || options.sample_only {
        let injected = vec![false; functions.len()];
        return Ok(Patching { injected, tracing, clock: None, off_cpu: None, notes, refused: Vec::new(), planned_whole: Vec::new() });
    }
    if options.metrics.iter().any(|m| !matches!(m, Metric::Wall | Metric::Cpu)) {
        return Err(RecordError::InjectMetrics);
    }
    // The clock's first perf event can take the kernel tens of
    // milliseconds (it switches perf's scheduling hooks on): measured
    // while the functions are planned.
    let clock = std::thread::spawn(TscClock::new);
    // CPU time per call needs the kernel's off-CPU time (BPF); without it,
    // wall time. Loading it reads the kernel's BTF: also while planning.
    let wants_cpu = options.metrics.contains(&Metric::Cpu);
    let off_cpu = std::thread::spawn(move || wants_cpu.then(proftap_probes::offcpu::obtain).flatten().map(Arc::new));
    let mut planned_whole = Vec::new();
    let (refused, off_cpu) = match spec {
        TargetSpec::Attach { pid } if options.auto_instrument.is_none() => {
            let off_cpu = finished(off_cpu, "the off-CPU time")?;
            let how = counted.recording(options.engine_recording(off_cpu.as_deref()));
            match Patched::attach_held(*pid, functions, None, how) {
                Ok(engine) => {
                    check_unwinders(&engine, options.may_unwind)?;
                    let refused = engine.refused().to_vec();
                    tracing = Some(engine);
                    (refused, off_cpu)
                }
                // The process refuses executable memory: where the engine
                // was left to proftap, every function is one it could not
                // patch, and said to be (not where lines or regions would
                // be counted in the process, nor where nothing could probe
                // the functions named instead).
                Err(source) if options.engine_chosen && refuses_code(&source) && may_leave_to_uprobes(options) => {
                    let why = format!("the process refuses proftap's code ({source})");
                    ((0..functions.len()).map(|i| (i, why.clone())).collect(), off_cpu)
                }
                Err(source) => return Err(RecordError::Inject { pid: *pid, source }),
            }
        }
        _ => {
            let (mut refused, whole) = Patched::refusals(functions, options.kept_judgements.as_deref());
            planned_whole = whole;
            let mut taken: Vec<(usize, String)> = options.entries_counted.iter().map(|&i| (i, ENTRY_COUNTED.to_string())).collect();
            taken.extend(options.line_probed.iter().map(|&i| (i, LINES_PROBED.to_string())));
            taken.retain(|(i, _)| !refused.iter().any(|(r, _)| r == i));
            refused.extend(taken);
            (refused, finished(off_cpu, "the off-CPU time")?)
        }
    };
    if !refused.is_empty() && !leaves_unpatched_unprobed(options) && !proftap_probes::perf::may_define_uprobes() {
        let names: Vec<String> = refused.iter().take(3).map(|(i, why)| format!("{}: {why}", functions[*i].info.name)).collect();
        return Err(RecordError::UprobesNeedRoot { count: refused.len(), names: names.join("; ") });
    }
    let mut injected = vec![true; functions.len()];
    left_out(&mut injected, &refused);
    let clock = finished(clock, "the in-process engine's clock")?
        .map_err(|e| RecordError::Unsupported(format!("the in-process engine needs the TSC as a clock: {e}")))?;
    Ok(Patching { injected, tracing, clock: Some(clock), off_cpu, notes, refused, planned_whole })
}

/// `injected` without the functions `refused`.
fn left_out(injected: &mut [bool], refused: &Refused) {
    for (i, _) in refused {
        if let Some(flag) = injected.get_mut(*i) {
            *flag = false;
        }
    }
}

/// What a thread preparing `what` came to.
fn finished<T>(thread: std::thread::JoinHandle<T>, what: &str) -> Result<T, RecordError> {
    thread.join().map_err(|_| RecordError::Unsupported(format!("{what} could not be prepared")))
}

/// Frees `value` on a thread of its own: the symbols and unwind tables of a
/// program and its libraries take milliseconds to free, which the end of
/// a recording need not wait for.
pub(crate) fn drop_aside<T: Send + 'static>(value: T) {
    // Where no thread can be made, the value goes with the closure, here.
    let _ = std::thread::Builder::new().spawn(move || drop(value));
}

/// Which of `all` uprobes see: what the engine does not record (it records
/// catches itself), nothing when sampling only, and with automatic
/// instrumentation no measured function until the warm-up ends.
fn probed_by_uprobes(all: &[ProbedFunction], injected: &[bool], options: &RecordOptions) -> Vec<bool> {
    let inject = options.engine == Engine::Inject && !options.sample_only;
    all.iter()
        .enumerate()
        .map(|(i, f)| {
            let recorded = injected.get(i).copied().unwrap_or(false) || (inject && f.role == Role::CatchMarker);
            let left_out = leaves_unpatched_unprobed(options) && f.role == Role::Measured && !options.line_probed.contains(&i);
            !recorded && !left_out && !options.sample_only && (options.auto_instrument.is_none() || f.role != Role::Measured)
        })
        .collect()
}

/// Whether the in-process engine failed because the process refuses it
/// executable memory (a seccomp filter, SELinux without `execmem`).
fn refuses_code(error: &proftap_probes::inject::remote::RemoteError) -> bool {
    use proftap_probes::inject::remote::RemoteError;
    matches!(error, RemoteError::Call { call: "mmap", source, .. } if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)))
}

/// Whether the recording goes on as one whose every function the
/// in-process engine refused: no line or region counted in the process,
/// and the functions left to uprobes (named) may have them.
fn may_leave_to_uprobes(options: &RecordOptions) -> bool {
    !options.count_lines && options.regions.is_empty() && (leaves_unpatched_unprobed(options) || proftap_probes::perf::may_define_uprobes())
}

/// Whether what the in-process engine cannot patch gets no uprobe
/// (sampling sees it, if on): under a governor, of functions proftap chose
/// (none named), since a kernel probe would cost a hundred times what the
/// governor allows a patched call, and removing the probes it throttled
/// would keep the end of the recording waiting a grace period per probe.
fn leaves_unpatched_unprobed(options: &RecordOptions) -> bool {
    options.engine == Engine::Inject
        && !options.sample_only
        && !options.functions_named
        && options.overhead_budget.is_some_and(|budget| budget > 0.0)
}

/// What covers the functions the in-process engine could not patch.
#[derive(Clone, Copy, PartialEq)]
enum UnpatchedLeftTo {
    Uprobes,
    Samples,
    Nothing,
}

/// What the in-process engine patches in a launched program.
struct Patch<'a> {
    functions: &'a [ProbedFunction],
    /// Per function: the engine may patch it.
    injected: &'a [bool],
    /// Per function: found patchable from its first instructions alone.
    checked: &'a [bool],
    how: Recording<'a>,
    /// See [`RecordOptions::may_unwind`].
    may_unwind: bool,
    /// Functions probed, in the process or by the kernel, as the target
    /// starts: neither those whose code differs from the file's nor those
    /// the kernel refused.
    probed: usize,
}

/// Launches the program held, or holds a running process's threads still,
/// opens the events on it, and lets it go.
fn start(
    spec: &TargetSpec,
    held: Option<HeldChild>,
    uprobes: &mut UprobeSource,
    tracing: Option<Patched>,
    sampler: Option<&SamplerThread>,
    patch: &Patch<'_>,
    options: &RecordOptions,
) -> Result<Started, RecordError> {
    let functions = patch.functions;
    let inject = options.engine == Engine::Inject && !options.sample_only;
    match spec {
        TargetSpec::Launch { path, argv, launch } => {
            let mut child = match held {
                Some(child) => child,
                None => target::spawn_held(path, argv, launch)?,
            };
            child.ready()?;
            // A failure drops the child, ended unrun.
            uprobes.open_launched(child.pid())?;
            let pid = child.pid();
            options.observer.event(RecordEvent::Started { pid, functions: functions.len() as u64, attached: false });
            if inject
                && let Err(e) = nix::sys::ptrace::seize(nix::unistd::Pid::from_raw(pid), nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC)
            {
                return Err(RecordError::Unsupported(format!("cannot trace the launched program to patch it: {e}")));
            }
            // Before the program goes: it may run a while before proftap does.
            let started_ns = monotonic_ns();
            child.release()?;
            let (tracing, notes, refused) = match inject.then(|| patch_at_start(pid, patch)) {
                Some(Ok(patched)) => patched,
                Some(Err(e)) => {
                    // Not left to run unrecorded after proftap said it failed.
                    child.kill();
                    return Err(e);
                }
                None => (None, Vec::new(), Vec::new()),
            };
            let command = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            Ok(Started { pid, child: Some(child), command, attached: false, started_ns, threads: Vec::new(), tracing, notes, refused })
        }
        TargetSpec::Attach { pid } => attach(*pid, uprobes, tracing, sampler, patch.probed, options),
    }
}

/// Marks the functions not patched in process whose code in running
/// process `pid` is not the file's as refused by uprobes (which would run
/// the file's instruction there), and names them.
fn changed_in_memory(pid: i32, functions: &mut [ProbedFunction], injected: &[bool]) -> Vec<String> {
    let places_of = |f: &ProbedFunction| {
        let entry = f.entry_probe.map(|(at, _)| at).into_iter().chain([f.offset]);
        entry.chain(f.exit_sites.iter().flatten().copied()).map(|at| at.0).collect::<Vec<u64>>()
    };
    let candidates: Vec<usize> = (0..functions.len()).filter(|&i| !injected.get(i).copied().unwrap_or(false)).collect();
    let shared: &[ProbedFunction] = functions;
    let places: Vec<(usize, &Path, u64)> =
        candidates.iter().flat_map(|&i| places_of(&shared[i]).into_iter().map(move |at| (i, shared[i].open_path.as_path(), at))).collect();
    let as_in_file = procfs::code_as_in_file(pid, &places.iter().map(|&(_, path, at)| (path, at)).collect::<Vec<_>>());
    let mut differs: Vec<usize> = places.iter().zip(as_in_file).filter(|(_, same)| !same).map(|((i, _, _), _)| *i).collect();
    differs.dedup();
    differs
        .into_iter()
        .map(|i| {
            functions[i].uprobe_refused = true;
            functions[i].info.name.clone()
        })
        .collect()
}

/// Patches a launched program when it and its libraries are in place and
/// none of their code has run; says which functions it could not patch:
/// those whose entry counts their lines, and those whose code differs.
fn patch_at_start(pid: i32, patch: &Patch<'_>) -> Result<(Option<Patched>, Vec<Note>, Refused), RecordError> {
    let functions = patch.functions;
    let engine =
        Patched::attach_at_start(pid, functions, patch.checked, patch.how).map_err(|source| RecordError::Inject { pid, source })?;
    check_unwinders(&engine, patch.may_unwind)?;
    let (entries_counted, missed): (Refused, Refused) = engine
        .refused()
        .iter()
        .filter(|(i, _)| patch.injected.get(*i).copied().unwrap_or(false))
        .cloned()
        .partition(|(_, why)| why == ENTRY_COUNTED);
    let missed: Vec<String> = missed.iter().map(|(i, _)| functions[*i].info.name.clone()).collect();
    let notes = if missed.is_empty() { Vec::new() } else { vec![Finding::CodeDiffers { functions: missed }.into()] };
    Ok((Some(engine), notes, entries_counted))
}

/// Opens the events on a running process's threads, held still (by the
/// in-process engine when it just patched them).
fn attach(
    pid: i32,
    uprobes: &mut UprobeSource,
    tracing: Option<Patched>,
    sampler: Option<&SamplerThread>,
    probed: usize,
    options: &RecordOptions,
) -> Result<Started, RecordError> {
    if let Some(sampler) = sampler {
        for m in proftap_probes::procfs::read_maps(pid).unwrap_or_default().iter().filter(|m| m.executable) {
            // Memory of no file (a JIT's code), as perf's records name it.
            let path = match m.path.as_deref() {
                None => ANONYMOUS,
                Some(named) if named.starts_with("[anon") => ANONYMOUS,
                Some(path) => path,
            };
            sampler.mapped(pid as u32, m.start.0, m.end.0 - m.start.0, m.offset.0, path);
        }
    }
    let held = tracing.as_ref().and_then(Patched::held_threads);
    let frozen = if held.is_some() { None } else { Some(Frozen::freeze(pid)?) };
    let tids = held.unwrap_or_else(|| frozen.as_ref().map(Frozen::threads).unwrap_or_default());
    let threads = tids.iter().map(|&tid| (tid, target::thread_name(pid, tid))).collect();
    uprobes.open_attached(pid, &tids)?;
    let started_ns = monotonic_ns();
    drop(frozen);
    options.observer.event(RecordEvent::Started { pid, functions: probed as u64, attached: true });
    Ok(Started {
        pid,
        child: None,
        command: target::command_line(pid),
        attached: true,
        started_ns,
        threads,
        tracing,
        notes: Vec::new(),
        refused: Vec::new(),
    })
}

/// What the aggregator and the assembly know once the target runs.
fn setup(
    run: &Run<'_>,
    command: &[String],
    code: &[std::ops::Range<u64>],
    cpu_from_switches: Option<usize>,
    started_unix_ns: u64,
    sampling: Option<(String, u64)>,
) -> Setup {
    let (options, functions, injected) = (run.options, run.functions(), &run.injected);
    let entries: Vec<_> = functions.iter().map(|f| f.entry).collect();
    let aggregation = AggregatorConfig {
        functions: functions.len(),
        metrics: options.metrics.len(),
        compensation: options.compensate.then(|| compensation(&entries, injected, &options.metrics, options.cost.unwrap_or_default())),
        // Patched functions return through the return trampoline, exceptions
        // or not, and calls in progress still do once their function is unpatched.
        exit_sites: functions.iter().zip(injected).map(|(f, &injected)| f.exit_sites.is_some() && !injected).collect(),
        returns_outlive_probes: injected.clone(),
        returns_unwatched: functions
            .iter()
            .zip(injected)
            .map(|(f, &injected)| !injected && f.exit_sites.as_ref().is_some_and(Vec::is_empty))
            .collect(),
        lines: options.probed_lines.as_ref().map(|plan| line_setup(plan, &options.regions)),
        // The kernel's uretprobe trampoline page, and the engine's code.
        trampolines: std::iter::once(DEFAULT_PROBE_AREA).chain(code.iter().cloned()).collect(),
        cpu_from_switches,
        processes: vec![run.pid],
        trace_bytes: options.trace_bytes,
    };
    Setup {
        aggregation,
        target: Target {
            command: command.to_vec(),
            pid: run.pid,
            // Where nothing names the program, the process does.
            exe: options.executable.clone().unwrap_or_else(|| {
                std::fs::read_link(format!("/proc/{}/exe", run.pid)).map(|p| p.display().to_string()).unwrap_or_default()
            }),
            build_id: options.build_id.clone(),
            attached: run.attached,
            ..Target::default()
        },
        functions: functions.iter().map(|f| f.info.clone()).collect(),
        entries,
        metrics: options.metrics.iter().map(|m| m.key().to_string()).collect(),
        lines: options.lines.as_ref().map(|plan| LineTable {
            lines: plan.lines.clone(),
            // Counted on edges, a declaration line's count is its function's
            // entries; probed, its calls.
            decl_lines: options.probed_lines.as_ref().map(|p| p.decl_lines.clone()).unwrap_or_default(),
            unprobed: options.probed_lines.as_ref().map(LinePlan::unprobed_lines).unwrap_or_default(),
            probe_kinds: options.probed_lines.iter().flat_map(|p| &p.probes).map(|p| p.kind).collect(),
        }),
        regions: options.regions.clone(),
        cost: options.cost,
        compensate: options.compensate,
        exits: if functions.iter().any(|f| f.exit_sites.is_some()) { ExitMode::ReturnSites } else { ExitMode::Uretprobe },
        follow_forks: options.follow_forks,
        started_unix_ns,
        started_monotonic_ns: run.started_ns,
        sampling,
        proftap_version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// How the aggregator follows lines and regions.
fn line_setup(plan: &LinePlan, regions: &[RegionSpec]) -> LineSetup {
    LineSetup {
        probes: plan.probes.iter().map(|p| (p.function, p.lines.clone())).collect(),
        probe_addresses: plan.probes.iter().map(|p| p.address).collect(),
        entry_lines: plan.entry_lines.iter().map(|l| l.unwrap_or(NO_LINE)).collect(),
        entry_also: plan.entry_also.clone(),
        lines: plan.lines.len(),
        regions_of: regions_of_lines(&plan.lines, regions),
        regions: regions.len(),
    }
}

/// Which functions the in-process engine left to uprobes, by reason, with
/// a few names each (a large program has hundreds).
fn refusals_note(functions: &[ProbedFunction], refused: &[(usize, String)], left_to: UnpatchedLeftTo) -> Finding {
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
    let functions = refused.len() as u64;
    Finding::NotPatched {
        functions,
        reasons,
        sampled: left_to == UnpatchedLeftTo::Samples,
        unmeasured: left_to == UnpatchedLeftTo::Nothing,
    }
}

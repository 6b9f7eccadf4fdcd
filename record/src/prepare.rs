//! From a request to a recording ready to start: the program's modules,
//! their symbols, the functions chosen and how each is probed, the lines,
//! the engine, and the measured cost of a probe.

use crate::calibration::CalibrationError;
use crate::cost::ProbeCost;
use crate::error::RecordError;
use crate::observer::{ObservedDownloads, Observer, RecordEvent, Step, Warning};
use crate::options::{Control, RecordOptions, Recorded, TargetSpec};
use crate::recorder::{drop_aside, record};
use crate::request::{
    DEFAULT_BUDGET, EngineChoice, ExitsChoice, Governor, RecordRequest, RecordTarget, RegionSpec, SampleSettings, regions_of_lines,
};
use crate::saved::Saver;
use proftap_probes::exits::{ExitMode, unwinds};
use proftap_probes::inject::{counting, hooks};
use proftap_probes::lines::{LineFiles, LinePlan, functions_with_lines, plan_lines};
use proftap_probes::metrics::{Metric, MetricError, parse_metrics};
use proftap_probes::plan::{ProbedFunction, Role, catch_marker, plan};
use proftap_probes::select::{Selected, Selection};
use proftap_probes::symbols::{DebugDirs, ElfImage, SymbolCache, SymbolIndex};
use proftap_probes::target::{self, HeldChild, Launch, TargetError};
use proftap_probes::{libs, procfs};
use proftap_profile::{Engine, Finding, Note, UprobeReason};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a recording could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The request contradicts itself.
    #[error(transparent)]
    Request(#[from] crate::request::RequestError),
    /// A function pattern, a module or a process could not be read.
    #[error(transparent)]
    Probes(#[from] proftap_probes::Error),
    /// A metric this machine cannot count.
    #[error(transparent)]
    Metric(#[from] MetricError),
    /// The command could not be found.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Functions were named in a launcher (a shell, `env`, `time`), which
    /// has no symbols: they are in a program it starts.
    #[error(
        "{module} has no symbols, and it is a launcher: the functions named with -f are looked up in the program proftap starts, not in the programs {module} runs; start the program itself (proftap run -f NAME -- PROGRAM ARGS)"
    )]
    Launcher {
        /// The launcher.
        module: String,
    },
    /// A launcher without symbols, and nothing sampled: nothing of it can
    /// be recorded, and what it runs is a program of its own.
    #[error(
        "{module} has no symbols, and it is a launcher: with no stack sampled there is nothing to record of it, and the programs it runs are new images; start the program itself (proftap run -- PROGRAM ARGS)"
    )]
    LauncherUnsampled {
        /// The launcher.
        module: String,
    },
    /// A module's symbols could not be read.
    #[error("cannot read the symbols of {module}: {source}")]
    Symbols {
        /// The module.
        module: String,
        /// Why.
        source: proftap_probes::Error,
    },
    /// Lines were asked for in files without line-table rows.
    #[error("{executable} has no line-table rows for {files}; build it with -g")]
    NoLines {
        /// The executable.
        executable: String,
        /// The files asked for, in words.
        files: String,
    },
    /// Nothing chosen can be probed.
    #[error("no function of {executable} can be probed")]
    NothingToProbe {
        /// The executable.
        executable: String,
    },
    /// The process maps no executable.
    #[error("process {pid} has no executable mapped (a kernel thread or a process that is exiting)")]
    NoExecutable {
        /// The process.
        pid: i32,
    },
}

/// Where the probe cost comes from: measured here, or asked of someone
/// allowed to measure it (a session's daemon).
pub trait ProbeCostSource {
    /// The probe cost of this boot for `exits`, measured again when `fresh`.
    fn probe_cost(&self, exits: ExitMode, fresh: bool) -> Result<ProbeCost, CalibrationError>;
}

/// A recording ready to start.
pub struct Prepared {
    functions: Vec<ProbedFunction>,
    spec: TargetSpec,
    /// The launched program's process, waiting to execute it.
    held: Option<HeldChild>,
    options: RecordOptions,
    exit_mode: ExitMode,
    saver: Option<Saver>,
}

impl Prepared {
    /// How many functions get instrumented (or are listed, sampling only).
    pub fn functions(&self) -> usize {
        self.functions.iter().filter(|f| f.role == Role::Measured).count()
    }

    /// How returns are seen: what the probe cost is measured for.
    pub fn exit_mode(&self) -> ExitMode {
        self.exit_mode
    }

    /// Saves the recording's events to `out` as they are aggregated (see
    /// [`crate::saved`]).
    pub fn save_events(&mut self, out: impl std::io::Write + Send + 'static) {
        self.saver = Some(Saver::new(out));
    }

    /// Records until the program ends or `control` says stop, telling
    /// `observer` as it goes.
    pub fn record(mut self, control: Control, observer: Arc<dyn Observer>) -> Result<Recorded, RecordError> {
        self.options.control = control;
        self.options.observer = observer;
        let symbols = self.options.symbols.clone();
        let recorded = record(&self.functions, &self.spec, self.held, &self.options, self.saver);
        drop(self.options);
        drop_aside(symbols);
        recorded
    }
}

/// Prepares `request`: reads the program's symbols, chooses the functions,
/// the engine and the lines, and gets the probe cost from `costs`.
pub fn prepare(request: &RecordRequest, observer: &dyn Observer, costs: &dyn ProbeCostSource) -> Result<Prepared, PrepareError> {
    request.validate()?;
    proftap_probes::perf::switch_on_scheduling_hooks();
    if request.sample_settings().is_some() {
        // On a thread, while the program's symbols are read and planned.
        proftap_probes::perf::read_kernel_symbols_ahead();
    }
    let selection = Selection::parse(&request.functions)?;
    let metrics = parse_metrics(&request.metrics)?;
    let (modules, spec) = match &request.target {
        RecordTarget::Launch { command, cwd, env } => launched_modules(command, cwd.clone(), env.clone())?,
        RecordTarget::Attach { pid, .. } => (attached_modules(*pid)?, TargetSpec::Attach { pid: *pid }),
    };
    // Forked now, while proftap is small (a fork copies its page tables),
    // to get ready while the symbols are read; it runs nothing of the
    // program before the recording releases it, and ends if it never does.
    let mut held = match &spec {
        TargetSpec::Launch { path, argv, launch } => Some(target::spawn_held(path, argv, launch)?),
        TargetSpec::Attach { .. } => None,
    };
    if let (TargetSpec::Launch { path, .. }, Some((symbols_of, _))) = (&spec, modules.first())
        && path != symbols_of
    {
        let message = format!("{} is a script: proftap profiles its interpreter, {}", path.display(), symbols_of.display());
        observer.event(RecordEvent::Warning(Warning::Planning { message }));
    }
    let debug_dirs = DebugDirs::asked_or_default(&request.debug_dirs);
    // The same build is recorded again and again: its DWARF and symbols
    // are read, and its functions judged for patching, once a boot.
    let kept = proftap_probes::boot_cache::dir();
    if let Some(dir) = &kept {
        // Where earlier builds kept the DWARF alone, in memory until the reboot.
        proftap_probes::boot_cache::remove_own_dir(&dir.join("proftap-dwarf"));
    }
    let kept_reads = kept.as_ref().map(|dir| dir.join("proftap-reads"));
    let kept_judgements = kept.map(|dir| dir.join("proftap-judged"));
    let symbols = Arc::new(SymbolCache::new(debug_dirs).with_debuginfod(request.debuginfod.clone()).keeping_reads_in(kept_reads));
    let chosen = choose(&selection, &modules, request, &metrics, &symbols, observer)?;
    let mut options = options(request, metrics, &chosen);
    // The sampler names frames from the same symbols.
    options.symbols = symbols;
    options.kept_judgements = kept_judgements;
    observer.event(RecordEvent::Step(Step::MeasuringProbeCost));
    options.cost = match costs.probe_cost(chosen.exit_mode, request.recalibrate) {
        Ok(cost) => Some(cost),
        Err(e) => {
            observer.event(RecordEvent::Warning(Warning::NoProbeCost { reason: e.reason().to_string() }));
            None
        }
    };
    observer.event(RecordEvent::StepEnded);
    options.build_id = chosen.build_id;
    options.executable = Some(chosen.executable);
    // Said once the recording can go ahead: a failure says why alone.
    warn_of_launcher(&spec, observer);
    // Said now rather than once the probes are opened (a working directory gone).
    if let Some(child) = held.as_mut() {
        child.ready()?;
    }
    Ok(Prepared { functions: chosen.functions, spec, held, options, exit_mode: chosen.exit_mode, saver: None })
}

/// Says that a command that runs other programs (a shell, `env`,
/// `runuser`) is instrumented alone: the program it executes is a new image.
fn warn_of_launcher(spec: &TargetSpec, observer: &dyn Observer) {
    let TargetSpec::Launch { argv, .. } = spec else { return };
    let Some(name) = argv.first().map(Path::new).filter(|p| is_launcher(p)).and_then(Path::file_name) else { return };
    let name = name.to_string_lossy();
    let message = format!(
        "{name} runs other programs, which are sampled only: their calls are not counted (the program {name} executes is a new image); to count them, start the program itself (proftap run -- PROGRAM ARGS; as another user, run proftap as that user)"
    );
    observer.event(RecordEvent::Warning(Warning::Planning { message }));
}

/// The interpreter a `#!` script names, if `path` is one.
fn interpreter(path: &Path) -> Option<PathBuf> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Never waits: a FIFO or a device named as the program is not a script.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut first = [0u8; 256];
    let read = (&file).read(&mut first).ok()?;
    let line = first[..read].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    let word = line.split(|b| b.is_ascii_whitespace()).find(|w| !w.is_empty())?;
    let interpreter = PathBuf::from(std::ffi::OsStr::from_bytes(word));
    Some(std::fs::canonicalize(&interpreter).unwrap_or(interpreter))
}

/// A launched command's modules (what it links; the loader searches the
/// launch's `LD_LIBRARY_PATH`) and how to launch it. A relative command is
/// resolved against the launch's working directory, or found on `PATH`.
fn launched_modules(
    command: &[OsString],
    cwd: Option<PathBuf>,
    env: Option<Vec<OsString>>,
) -> Result<(Vec<(PathBuf, PathBuf)>, TargetSpec), PrepareError> {
    let Some(program) = command.first() else { return Err(crate::request::RequestError::NoCommand.into()) };
    let program = match &cwd {
        Some(dir) if program.as_bytes().contains(&b'/') && !Path::new(program).is_absolute() => dir.join(program).into_os_string(),
        _ => program.clone(),
    };
    let path = target::resolve_command(&program)?;
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    // A script runs its interpreter: its symbols are the interpreter's.
    let symbols_of = interpreter(&path).unwrap_or_else(|| path.clone());
    let library_path = match &env {
        Some(env) => {
            env.iter().find_map(|v| v.as_bytes().strip_prefix(b"LD_LIBRARY_PATH=").map(|p| OsString::from(std::ffi::OsStr::from_bytes(p))))
        }
        None => std::env::var_os("LD_LIBRARY_PATH"),
    };
    let mut modules = vec![(symbols_of.clone(), symbols_of.clone())];
    modules.extend(libs::needed_libraries(&symbols_of, library_path.as_deref()).into_iter().map(|l| (l.clone(), l)));
    let spec = TargetSpec::Launch { path, argv: command.to_vec(), launch: Launch { cwd, env, stdout: None } };
    Ok((modules, spec))
}

/// A running process's modules, its executable first.
fn attached_modules(pid: i32) -> Result<Vec<(PathBuf, PathBuf)>, PrepareError> {
    let loaded = procfs::loaded_modules(pid)?;
    if loaded.first().is_none_or(|m| !m.is_main) {
        return Err(PrepareError::NoExecutable { pid });
    }
    Ok(loaded.iter().map(|m| (m.path.clone(), m.open_path.clone())).collect())
}

fn options(request: &RecordRequest, metrics: Vec<Metric>, chosen: &Chosen) -> RecordOptions {
    let (engine, engine_note) = choose_engine(request, &metrics, chosen);
    let count_lines = engine == Engine::Inject && chosen.lines.is_some() && counts_lines(request, chosen);
    // The lines of functions whose edges cannot be counted are followed by
    // uprobes where this user may place them and every probe is kept;
    // elsewhere they are not counted, and the profile says so.
    let line_probed: Vec<usize> = match count_lines && follows_uncountable_lines(request) {
        true => chosen.uncountable.iter().map(|(i, _)| *i).collect(),
        false => Vec::new(),
    };
    // Beside functions named, those recorded only for lines counted in
    // process are governed by default; the named ones keep their probes.
    let measured = chosen.functions.iter().filter(|f| f.role == Role::Measured).count();
    let governs_lines_only =
        count_lines && request.governor == Governor::Default && !chosen.kept.is_empty() && chosen.kept.len() < measured;
    let (duration, auto_instrument) = match request.target {
        RecordTarget::Attach { duration, auto_instrument, .. } => (duration, auto_instrument.map(|a| (a.count, a.warmup))),
        RecordTarget::Launch { .. } => (None, None),
    };
    let probed_lines = match (&chosen.lines, count_lines) {
        (Some(plan), true) if !line_probed.is_empty() => Some(plan.for_functions(|f| line_probed.contains(&(f as usize)))),
        (_, true) => None,
        (lines, false) => lines.clone(),
    };
    let mut notes: Vec<Note> = engine_note.into_iter().collect();
    if let Some(plan) = &probed_lines {
        let unprobed: Vec<String> =
            plan.unprobed_lines().iter().map(|&id| format!("{}:{}", plan.lines[id as usize].0, plan.lines[id as usize].1)).collect();
        if !unprobed.is_empty() {
            notes.push(Finding::LinesUnprobed { lines: unprobed }.into());
        }
    }
    let sample = request.sample_settings().map(|settings| {
        let (settings, capped) = capped_sampling(settings, proftap_probes::procfs::sysctl_number("kernel/perf_event_max_sample_rate"));
        notes.extend(capped.map(Note::from));
        settings
    });
    RecordOptions {
        metrics,
        follow_forks: request.follow_forks,
        buffer_bytes: request.buffer_bytes(),
        duration,
        lines: chosen.lines.clone(),
        count_lines,
        probed_lines,
        line_probed: line_probed.clone(),
        counting: chosen.counting,
        entries_counted: if count_lines { chosen.entries_counted.clone() } else { Vec::new() },
        sample,
        overhead_budget: request.overhead_budget(chosen.lines.is_some() && !count_lines).or(governs_lines_only.then_some(DEFAULT_BUDGET)),
        kept: if governs_lines_only { chosen.kept.clone() } else { Vec::new() },
        functions_named: !request.is_hybrid(),
        may_unwind: chosen.exit_mode == ExitMode::ReturnSites,
        auto_instrument,
        sample_only: !request.instrument || chosen.functions.iter().all(|f| f.role != Role::Measured),
        regions: request.regions.clone(),
        compensate: request.compensate,
        live_calls: request.live_calls,
        trace_bytes: request.trace_bytes,
        engine,
        engine_chosen: request.engine == EngineChoice::Auto,
        notes,
        ..RecordOptions::default()
    }
}

/// The engine the request asks for, and when it leaves the choice to the
/// recorder, why it is not the in-process one when it is not.
fn choose_engine(request: &RecordRequest, metrics: &[Metric], chosen: &Chosen) -> (Engine, Option<Note>) {
    let why_not_inject = if metrics.iter().any(|m| !matches!(m, Metric::Wall | Metric::Cpu)) {
        Some(UprobeReason::Metrics)
    } else if chosen.lines.is_some() && !counts_lines(request, chosen) {
        Some(UprobeReason::Lines)
    } else if chosen.cancels_unhooked {
        Some(UprobeReason::CancelsThreads)
    } else {
        None
    };
    let engine = match (request.engine, why_not_inject) {
        (EngineChoice::Uprobe, _) => (Engine::Uprobe, None),
        (EngineChoice::Inject, _) => (Engine::Inject, None),
        (EngineChoice::Auto, None) => (Engine::Inject, None),
        (EngineChoice::Auto, Some(UprobeReason::Lines)) if !request.line_times && !chosen.regions_unhooked.is_empty() => {
            (Engine::Uprobe, Some(Finding::RegionsUnhooked { functions: chosen.regions_unhooked.clone() }.into()))
        }
        (EngineChoice::Auto, Some(reason)) => (Engine::Uprobe, Some(Finding::UprobesChosen { reason }.into())),
    };
    if engine.0 == Engine::Inject && counts_lines(request, chosen) && !chosen.uncountable.is_empty() && follows_uncountable_lines(request) {
        let functions = chosen.uncountable.iter().map(|(_, f)| f.clone()).collect();
        return (engine.0, Some(Finding::LinesUncountable { functions }.into()));
    }
    engine
}

/// Whether something decided before the launch depends on which functions'
/// edges can be counted: lines followed by uprobes, regions (timed by
/// uprobes if a function of theirs cannot be hooked), functions refused
/// and not sampled (then probed). Otherwise the plan made in the held
/// process decides, and the functions whose entry it takes are sampled.
fn counting_decides_before_launch(request: &RecordRequest) -> bool {
    follows_uncountable_lines(request)
        || !request.regions.is_empty()
        || request.overhead_budget(false).is_none()
        || request.sample_settings().is_none()
}

/// Whether the lines the in-process engine cannot count are followed by
/// uprobes: where this user may place them, and only when every probe is
/// kept. A uprobe hit costs what a hundred counted lines do, and one hot
/// function (an interpreter's loop) would make the run thousands of times
/// slower: under an overhead budget they are left out and named instead.
fn follows_uncountable_lines(request: &RecordRequest) -> bool {
    proftap_probes::perf::may_define_uprobes() && request.overhead_budget(false).is_none()
}

/// Whether the in-process engine can count the lines asked for, with
/// counters on edges, and time the regions with hooks: without line times
/// (a clock read per line entry), and only if every function with a line
/// of a region can be hooked. Other functions whose control flow cannot be
/// read have their lines followed by probes.
fn counts_lines(request: &RecordRequest, chosen: &Chosen) -> bool {
    !request.line_times && chosen.regions_unhooked.is_empty() && chosen.lines.is_some()
}

/// The index of an executable without a symbol: no function, its
/// segments (for naming its samples by address), its imports, and why.
fn unnamed(display: &Path, image: &ElfImage) -> Result<SymbolIndex, proftap_probes::Error> {
    Ok(SymbolIndex {
        path: display.to_path_buf(),
        build_id: image.build_id()?,
        kind: image.kind()?,
        debug: proftap_probes::symbols::DebugSource::Missing,
        functions: Vec::new(),
        files: Default::default(),
        units: Vec::new(),
        line_rows: Vec::new(),
        segments: image.segments()?,
        // What it calls of its libraries (pthread_cancel, an unwinder)
        // decides how they may be patched.
        imports: image.imports()?,
        labels: Vec::new(),
        warnings: vec![format!("{} has no symbols at all: its samples are named by module", display.display())],
    })
}

/// What to probe in a target.
struct Chosen {
    functions: Vec<ProbedFunction>,
    /// Measured functions named beside others recorded for their lines
    /// only (by index among the measured; empty otherwise).
    kept: Vec<usize>,
    /// The executable's path, as shown.
    executable: String,
    build_id: Option<String>,
    exit_mode: ExitMode,
    lines: Option<LinePlan>,
    /// Functions with lines whose edges cannot be counted in process
    /// (index among the measured), with their name and why.
    uncountable: Vec<(usize, String)>,
    /// What edge counting may do to the code.
    counting: counting::Choices,
    /// Functions counted at their entry (not patched, if lines are counted).
    entries_counted: Vec<usize>,
    /// The executable calls `pthread_cancel`, no module loaded from the
    /// start unwinds a cancelled thread (glibc loads libgcc_s on demand),
    /// and the C library has no link to that unwinder to hook (glibc
    /// before 2.34).
    cancels_unhooked: bool,
    /// Functions with a line of a region that cannot be counted or hooked
    /// in process ("name: why"): the regions are then timed by uprobes on
    /// lines.
    regions_unhooked: Vec<String>,
}

/// The modules whose symbols a recording reads: the executable's, and those
/// of the libraries the patterns name.
struct Loaded {
    indexes: Vec<Arc<SymbolIndex>>,
    images: Vec<Option<Arc<ElfImage>>>,
    /// The paths to probe them through.
    open_paths: Vec<PathBuf>,
}

/// Reads the symbols of `modules` (`(display, open)` paths, the executable
/// first) into `cache`: the executable's (with its line table when `lines`),
/// and those of the libraries the patterns name. With `unnamed_ok`, an
/// executable without any symbol is read as one with no function (to be
/// sampled, as perf does), not refused.
fn load_symbols(
    selection: &Selection,
    modules: &[(PathBuf, PathBuf)],
    cache: &SymbolCache,
    (lines, unnamed_ok, names_only): (bool, bool, bool),
    observer: &dyn Observer,
) -> Result<Loaded, PrepareError> {
    let mut loaded = Loaded { indexes: Vec::new(), images: Vec::new(), open_paths: Vec::new() };
    for (i, (display, open)) in modules.iter().enumerate() {
        if i > 0 && !selection.names_module(display) {
            continue;
        }
        observer.event(RecordEvent::Step(Step::ReadingSymbols { module: display.display().to_string() }));
        let index = match names_only {
            true => cache.names_fetching(display, open, &ObservedDownloads(observer)),
            false => cache.index_fetching(display, open, i == 0 && lines, &ObservedDownloads(observer)),
        };
        observer.event(RecordEvent::StepEnded);
        let index = match index {
            Err(proftap_probes::Error::NoSymbols { .. }) if i == 0 && unnamed_ok => match cache.image(display, open) {
                Ok(image) => Arc::new(
                    unnamed(display, &image).map_err(|source| PrepareError::Symbols { module: display.display().to_string(), source })?,
                ),
                Err(source) => return Err(PrepareError::Symbols { module: display.display().to_string(), source }),
            },
            // Functions named in it: they are in a program it runs.
            Err(proftap_probes::Error::NoSymbols { .. }) if i == 0 && is_launcher(display) => {
                let module = display.display().to_string();
                return Err(match selection.is_default() {
                    true => PrepareError::LauncherUnsampled { module },
                    false => PrepareError::Launcher { module },
                });
            }
            other => other.map_err(|source| PrepareError::Symbols { module: display.display().to_string(), source })?,
        };
        loaded.indexes.push(index);
        loaded.images.push(cache.image(display, open).ok());
        loaded.open_paths.push(open.clone());
    }
    Ok(loaded)
}

/// Whether `program` is one that runs others: a shell or a command's wrapper.
fn is_launcher(program: &Path) -> bool {
    const LAUNCHERS: &[&str] = &[
        "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "env", "time", "timeout", "nice", "nohup", "xargs", "stdbuf", "taskset",
        "chrt", "ionice", "setpriv", "setsid", "runuser", "sudo", "su", "doas", "numactl", "nsenter", "unshare", "chroot", "flock",
    ];
    program.file_name().and_then(|n| n.to_str()).is_some_and(|name| LAUNCHERS.contains(&name))
}

fn choose(
    selection: &Selection,
    modules: &[(PathBuf, PathBuf)],
    request: &RecordRequest,
    metrics: &[Metric],
    cache: &SymbolCache,
    observer: &dyn Observer,
) -> Result<Chosen, PrepareError> {
    let line_files = line_files(request.lines.as_deref(), &request.regions);
    // An executable without symbols is sampled, as perf does, or left
    // alone where only a library's functions are named (not a launcher's:
    // those are wanted in the program it runs).
    let names_libraries_only = modules.first().is_some_and(|(main, _)| selection.names_other_modules_only(main) && !is_launcher(main));
    let unnamed_ok = (request.sample_settings().is_some() && (!request.instrument || request.functions.is_empty())) || names_libraries_only;
    // Sampling alone names frames from the symbol tables, as for libraries
    // (inlined frames and lines are read where samples fell): a large
    // program's DWARF is not walked before it starts.
    let names_only = !request.instrument && request.functions.is_empty() && line_files.is_none();
    let Loaded { indexes, images, open_paths } =
        load_symbols(selection, modules, cache, (line_files.is_some(), unnamed_ok, names_only), observer)?;
    let refs: Vec<&SymbolIndex> = indexes.iter().map(Arc::as_ref).collect();
    // An error says what matters in one sentence; warnings only when it works.
    let mut selected = selection.select(&refs)?;
    let named = selected.clone();
    if let Some(files) = &line_files {
        // Following a frame's lines needs its function's entry and return.
        let with_lines = functions_with_lines(&indexes[0], files);
        if with_lines.is_empty() {
            return Err(PrepareError::NoLines { executable: modules[0].0.display().to_string(), files: describe_files(files) });
        }
        selected.extend(with_lines.into_iter().map(|function| Selected { module: 0, function }));
        selected.sort();
        selected.dedup();
    }
    for warning in indexes.iter().flat_map(|i| &i.warnings) {
        observer.event(RecordEvent::Warning(Warning::Symbols { message: warning.clone() }));
    }
    let exit_mode = exit_mode(request.exits, &indexes[0], modules);
    let main = &indexes[0];
    let cancels_unhooked = main.imports.iter().any(|i| i == "pthread_cancel")
        && !modules.iter().any(|(d, _)| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libgcc_s")))
        && !modules.iter().any(|(_, open)| hooks::has_unwinder_link(open));
    // Return instructions are found (each function's whole code decoded)
    // only for the probes that may go on them.
    let returns_found = if uprobes_may_take_chosen_functions(request, metrics, cancels_unhooked) { exit_mode } else { ExitMode::Uretprobe };
    let mut warnings = Vec::new();
    let images: Vec<Option<&ElfImage>> = images.iter().map(Option::as_deref).collect();
    let mut functions = plan(&refs, &images, &open_paths, &selected, returns_found, &mut warnings);
    functions.extend(catch_marker_of(modules, cache));
    for message in warnings {
        observer.event(RecordEvent::Warning(Warning::Planning { message }));
    }
    if functions.iter().all(|f| f.role != Role::Measured) {
        // As perf does, a program with nothing to probe (stripped, no
        // debug info) is sampled, unless functions were named.
        let executable = modules[0].0.display().to_string();
        let sampled = request.sample_settings().is_some() && (!request.instrument || request.functions.is_empty());
        if !sampled {
            return Err(PrepareError::NothingToProbe { executable });
        }
        if request.instrument {
            let message = format!("no function of {executable} can be probed: it is sampled only");
            observer.event(RecordEvent::Warning(Warning::Planning { message }));
        }
    }
    let measured: Vec<ProbedFunction> = functions.iter().filter(|f| f.role == Role::Measured).cloned().collect();
    // Functions named (-f) beside others recorded for their lines: the
    // governor may take the others' probes, never theirs.
    let kept = match line_files.is_some() && !request.is_hybrid() {
        true => {
            let key =
                |s: &Selected| Some((refs.get(s.module)?.path.display().to_string(), refs[s.module].functions.get(s.function)?.address.0));
            let named: std::collections::HashSet<(String, u64)> = named.iter().filter_map(key).collect();
            (0..measured.len()).filter(|&i| named.contains(&(measured[i].info.module.clone(), measured[i].info.address))).collect()
        }
        false => Vec::new(),
    };
    let main_image = images.first().copied().flatten().map_or(&[][..], |i| i.data());
    let lines = line_files.as_ref().map(|files| plan_lines(&indexes[0], main_image, &open_paths[0], &measured, files));
    // A stub has no unwind information: calls return into one only in
    // programs that never unwind their stack. A counter takes a function's
    // entry only where what is not patched is sampled.
    let counting = counting::Choices {
        // Calls in progress when counting starts return past the stubs.
        returns_into_stubs: matches!(request.target, RecordTarget::Launch { .. })
            && self::exit_mode(ExitsChoice::Auto, &indexes[0], modules) == ExitMode::Uretprobe,
        may_take_entries: request.is_hybrid(),
    };
    let regions_of = lines.as_ref().map(|l| regions_of_lines(&l.lines, &request.regions)).unwrap_or_default();
    let by_function = lines.as_ref().map(LinePlan::by_function).unwrap_or_default();
    let (uncountable, entries_counted) = match &lines {
        Some(lines) if counting_decides_before_launch(request) => {
            let regions = counting::Regions { of_lines: &regions_of };
            let plan = counting::plan_in_files(&measured, &lines.with_lines(), counting, &by_function, regions);
            let refused = plan.refused.clone();
            // A function refused takes no entry.
            let taken = plan.entries_taken.into_iter().filter(|f| !refused.iter().any(|(r, _)| r == f)).collect();
            (refused, taken)
        }
        _ => (Vec::new(), Vec::new()),
    };
    let in_region = |line: &u32| regions_of.get(*line as usize).is_some_and(|r| !r.is_empty());
    let holds_region = |f: usize| by_function.get(f).is_some_and(|l| l.rows.iter().flat_map(|(_, ls)| ls).any(in_region));
    let uncountable: Vec<(usize, String)> =
        uncountable.into_iter().map(|(i, why)| (i, format!("{}: {why}", measured[i].info.name))).collect();
    let regions_unhooked = uncountable.iter().filter(|(i, _)| holds_region(*i)).map(|(_, why)| why.clone()).collect();
    Ok(Chosen {
        functions,
        executable: main.path.display().to_string(),
        build_id: main.build_id.clone(),
        exit_mode,
        lines,
        uncountable,
        counting,
        entries_counted,
        cancels_unhooked,
        regions_unhooked,
        kept,
    })
}

/// Whether uprobes may go on functions proftap chose, not the user: not
/// when the in-process engine records them under an overhead budget, where
/// what it cannot patch is left to the samples (a kernel probe costs a
/// hundred patched calls), unless what is asked needs uprobes (other
/// metrics, lines, regions, a warm-up before instrumenting) or the program
/// cancels threads the engine cannot follow. Decided before the engine is:
/// when false, the recorder's `leaves_unpatched_unprobed` holds too.
fn uprobes_may_take_chosen_functions(request: &RecordRequest, metrics: &[Metric], cancels_unhooked: bool) -> bool {
    let engine_alone = request.engine != EngineChoice::Uprobe
        && request.instrument
        && request.is_hybrid()
        && request.overhead_budget(false).is_some()
        && request.lines.is_none()
        && request.regions.is_empty()
        && request.auto_instrument().is_none()
        && metrics.iter().all(|m| matches!(m, Metric::Wall | Metric::Cpu))
        && !cancels_unhooked;
    !engine_alone
}

/// How returns are seen: as asked, or at return instructions for programs
/// that may unwind their stack.
fn exit_mode(choice: ExitsChoice, main: &SymbolIndex, modules: &[(PathBuf, PathBuf)]) -> ExitMode {
    match choice {
        ExitsChoice::Uretprobe => ExitMode::Uretprobe,
        ExitsChoice::ReturnSites => ExitMode::ReturnSites,
        ExitsChoice::Auto => {
            let main_unwinds = unwinds(&main.path, main.imports.iter().chain(main.functions.iter().map(|f| &f.raw_name)));
            if main_unwinds || modules.iter().skip(1).any(|(d, _)| unwinds(d, [""; 0])) {
                ExitMode::ReturnSites
            } else {
                ExitMode::Uretprobe
            }
        }
    }
}

/// C++: a catch ends the frames an exception left, at the moment it starts.
fn catch_marker_of(modules: &[(PathBuf, PathBuf)], cache: &SymbolCache) -> Option<ProbedFunction> {
    let (display, open) = modules.iter().find(|(d, _)| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libstdc++")))?;
    let index = cache.index(display, open, false).ok()?;
    let image = cache.image(display, open).ok()?;
    catch_marker(&index, &image, open)
}

fn describe_files(files: &LineFiles) -> String {
    if files.0.is_empty() { "its own source files".into() } else { files.0.join(", ") }
}

/// The source files to count lines of, if lines are asked for (by the
/// request's lines or by a region).
fn line_files(lines: Option<&[String]>, regions: &[RegionSpec]) -> Option<LineFiles> {
    match (lines, regions.is_empty()) {
        (None, true) => None,
        (Some([]), _) => Some(LineFiles::default()),
        (files, _) => {
            let mut all: Vec<String> = files.map(<[String]>::to_vec).unwrap_or_default();
            all.extend(regions.iter().map(|r| r.file.clone()));
            Some(LineFiles(all))
        }
    }
}

/// `settings` sampling at most `most` times a second, where the kernel
/// says so (it refuses an event asked to sample more often), and the
/// finding that says it, if the frequency was lowered.
fn capped_sampling(mut settings: SampleSettings, most: Option<u64>) -> (SampleSettings, Option<Finding>) {
    match most.filter(|&most| most > 0 && most < settings.frequency_hz) {
        Some(most) => {
            let asked_hz = std::mem::replace(&mut settings.frequency_hz, most);
            (settings, Some(Finding::SamplingCapped { asked_hz, hz: most }))
        }
        None => (settings, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampling asked more often than the kernel allows is lowered to its
    /// most, and said; asked at or below it, or where the kernel says
    /// nothing (or 0), it is as asked.
    #[test]
    fn sampling_is_capped_at_the_kernels_most_and_said() {
        let asked = SampleSettings { frequency_hz: 1000, ..SampleSettings::default() };
        let (settings, said) = capped_sampling(asked, Some(500));
        assert_eq!(settings.frequency_hz, 500);
        assert_eq!(settings.stack_bytes, asked.stack_bytes);
        assert_eq!(said, Some(Finding::SamplingCapped { asked_hz: 1000, hz: 500 }));
        for most in [Some(1000), Some(100_000), None, Some(0)] {
            let (settings, said) = capped_sampling(asked, most);
            assert_eq!((settings.frequency_hz, said), (1000, None), "{most:?}");
        }
    }
}

//! `proftap run` and `proftap attach`: choose functions, record, write the profile.

use crate::status::{Activity, RecordingStatus};
use anyhow::{Context, Result, bail};
use proftap_probes::exits::{ExitMode, unwinds};
use proftap_probes::lines::{LineFiles, LinePlan, functions_with_lines, plan_lines};
use proftap_probes::metrics::{Metric, parse_metrics};
use proftap_probes::plan::{ProbedFunction, Role, catch_marker, plan};
use proftap_probes::procfs;
use proftap_probes::select::{Selected, Selection};
use proftap_probes::symbols::{DebugDirs, LoadOptions, SymbolIndex};
use proftap_probes::{libs, target};
use proftap_record::recorder::{Control, Engine, Progress, RecordOptions, Recorded, RegionSpec, SampleSettings, TargetSpec, record};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Options shared by `run` and `attach`.
#[derive(clap::Args, Clone)]
pub struct RecordArgs {
    /// Functions to instrument: a glob on names (`parse_*`, `ns::Class::*`),
    /// `FILE:*` for a source file, `MODULE:PAT` for a shared library, `!PAT`
    /// to exclude. Default: every function of the executable with debug info.
    #[arg(short = 'f', long = "functions", value_name = "PAT")]
    functions: Vec<String>,
    /// Metrics per call, comma-separated: wall, cpu, page-faults,
    /// minor-faults, major-faults, context-switches, cpu-migrations, and
    /// hardware counters (cycles, instructions, ...) where the machine has
    /// them. Default wall,cpu (the in-process engine: wall and cpu only).
    #[arg(long = "metric", value_name = "LIST")]
    metrics: Vec<String>,
    /// How calls are seen: `inject` (jumps patched over function entries to
    /// code proftap puts in the process: about 25 ns a call; wall and CPU
    /// time; functions it cannot patch get uprobes), `uprobe` (kernel probes
    /// on entries and returns: microseconds a call; any metric, line counts,
    /// forked children), or `auto`: inject unless the recording needs what
    /// only uprobes do (other metrics, --lines, --region, a program that
    /// forks or cancels threads); the profile says which.
    #[arg(long, value_enum, default_value = "auto")]
    engine: EngineArg,
    /// Where to write the profile (default proftap.profile).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Do not record forked child processes.
    #[arg(long)]
    no_follow_fork: bool,
    /// Subtract the measured cost of the probes from the times.
    #[arg(long)]
    compensate: bool,
    /// How returns are seen: `uretprobe` (return probes: cheapest, but a C++
    /// exception, Rust panic, backtrace() or pthread_cancel that unwinds
    /// through an instrumented function terminates the program), `ret`
    /// (probes on each return instruction: safe for any unwinding, each
    /// return costs a single-stepped probe), or `auto`: `ret` for programs
    /// that may unwind (C++, Rust, backtrace, thread cancellation), else `uretprobe`.
    #[arg(long, value_enum, default_value = "auto")]
    exits: Exits,
    /// Sample every thread's stack HZ times per second of CPU time as well
    /// (default 1000): where time goes in code that is not instrumented, and
    /// flame graphs. Stacks are unwound with DWARF CFI, so code built without
    /// frame pointers unwinds too. On by default when no -f is given.
    #[arg(long, num_args = 0..=1, default_missing_value = "1000", value_name = "HZ")]
    sample: Option<u64>,
    /// Do not sample (when no -f is given, proftap samples by default).
    #[arg(long, conflicts_with = "sample")]
    no_sample: bool,
    /// Sample only, as `perf record` does: place no probes (no call counts).
    #[arg(long, conflicts_with_all = ["no_sample", "lines", "regions", "overhead_budget"])]
    no_instrument: bool,
    /// The most a function's probes may cost, in percent of the elapsed time,
    /// before they are removed while the program runs (its counts stay exact
    /// up to then; sampling covers it after). Default 5 when no -f is given
    /// (and no --lines), off otherwise; 0 turns it off.
    #[arg(long, value_name = "PCT")]
    overhead_budget: Option<f64>,
    /// Count how often each line runs (gcov's line counts) and time each
    /// line, in these source files (path suffixes), or with no file named,
    /// in every source file of the executable outside the system headers.
    #[arg(long, num_args = 0.., value_name = "SRC")]
    lines: Option<Vec<String>>,
    /// Time a range of lines like a function: NAME=FILE:START-END
    /// (repeatable). Entered when a frame moves onto one of its lines from
    /// outside it, left when it moves off or returns; calls inside count.
    #[arg(long = "region", value_name = "NAME=FILE:START-END", value_parser = parse_region)]
    regions: Vec<RegionSpec>,
    /// Measure the probe cost again instead of using this boot's measurement.
    #[arg(long)]
    pub recalibrate: bool,
    /// Ring buffer per CPU, in MiB (more if events are lost).
    #[arg(long, value_name = "MIB", default_value_t = 8)]
    pub buffer_size: usize,
    /// Where separate debug files are looked for (default /usr/lib/debug).
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
}

/// How calls are seen (see `--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EngineArg {
    Auto,
    Uprobe,
    Inject,
}

impl RecordArgs {
    fn metrics(&self) -> Result<Vec<Metric>> {
        let list = if self.metrics.is_empty() { vec!["wall,cpu".to_string()] } else { self.metrics.clone() };
        Ok(parse_metrics(&list)?)
    }
}

/// How returns are seen (see `--exits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Exits {
    Auto,
    Uretprobe,
    Ret,
}

/// Arguments of `proftap run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// How to record.
    #[command(flatten)]
    pub record: RecordArgs,
    /// The command to profile and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// How long to record a running process, and what to instrument when.
#[derive(clap::Args, Clone)]
pub struct AttachOptions {
    /// Stop after this long (`30s`, `2m`, `500ms`); otherwise when asked to
    /// (Ctrl-C, SIGTERM, `session stop`) or at the process's exit.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Sample first (see --warmup), then instrument the K hottest functions
    /// by sampled time, instead of instrumenting every function from the start.
    #[arg(long, value_name = "K")]
    pub auto_instrument: Option<usize>,
    /// How long to sample before --auto-instrument chooses.
    #[arg(long, value_name = "D", value_parser = parse_duration, default_value = "2s")]
    pub warmup: Duration,
}

/// Arguments of `proftap attach`.
#[derive(clap::Args)]
pub struct AttachArgs {
    /// How to record.
    #[command(flatten)]
    pub record: RecordArgs,
    /// How long, and what when.
    #[command(flatten)]
    pub attach: AttachOptions,
    /// The process to profile.
    pub pid: i32,
}

fn parse_region(text: &str) -> Result<RegionSpec, String> {
    RegionSpec::parse(text)
}

/// A duration as `30s`, `2m`, `500ms` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<f64>() {
        if seconds.is_finite() && seconds >= 0.0 {
            return Ok(Duration::from_secs_f64(seconds));
        }
    }
    humantime::parse_duration(text).map_err(|e| format!("'{text}' is not a duration like 30s, 2m or 500ms ({e})"))
}

/// Catches Ctrl-C and SIGTERM so the recording ends cleanly: probes removed,
/// profile written.
fn control() -> Result<Control> {
    let control = Control::default();
    signal_hook::flag::register(signal_hook::consts::SIGINT, control.interrupt.clone()).context("cannot handle SIGINT")?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, control.terminate.clone()).context("cannot handle SIGTERM")?;
    signal_hook::flag::register(signal_hook::consts::SIGHUP, control.terminate.clone()).context("cannot handle SIGHUP")?;
    Ok(control)
}

/// Hybrid mode, the default when no function is named: sample everything,
/// instrument every function, and let the governor remove costly probes.
fn hybrid(args: &RecordArgs) -> bool {
    args.functions.iter().all(|f| f.starts_with('!'))
}

fn options(
    args: &RecordArgs,
    metrics: Vec<Metric>,
    duration: Option<Duration>,
    chosen: &Chosen,
    auto: Option<(usize, Duration)>,
) -> Result<RecordOptions> {
    let (engine, engine_note) = choose_engine(args, &metrics, chosen);
    Ok(RecordOptions {
        metrics,
        follow_forks: !args.no_follow_fork,
        buffer_bytes: args.buffer_size.clamp(1, 4096) << 20,
        duration,
        // Measured by the front end, which knows where measuring may run.
        cost: None,
        lines: chosen.lines.clone(),
        sample: match (args.sample, hybrid(args) && !args.no_sample || auto.is_some() || args.no_instrument) {
            (Some(0), _) => bail!("--sample needs a frequency above 0"),
            (Some(hz), _) => Some(SampleSettings { frequency_hz: hz.min(100_000), ..SampleSettings::default() }),
            (None, true) => Some(SampleSettings::default()),
            (None, false) => None,
        },
        overhead_budget: match args.overhead_budget {
            Some(pct) if !(0.0..=100.0).contains(&pct) => bail!("--overhead-budget is a percentage between 0 and 100"),
            Some(pct) => (pct > 0.0).then_some(pct / 100.0),
            None if hybrid(args) && args.lines.is_none() && args.regions.is_empty() && !args.no_instrument => Some(0.05),
            None => None,
        },
        auto_instrument: auto,
        sample_only: args.no_instrument,
        regions: args.regions.clone(),
        compensate: args.compensate,
        control: Control::default(),
        on_started: None,
        on_probes_changed: None,
        progress: None,
        engine,
        notes: engine_note.into_iter().collect(),
    })
}

/// Symbols a program calls to fork a process that runs on its code.
const FORKING: &[&str] = &["fork", "_Fork", "daemon", "forkpty"];

/// The engine `--engine` asks for, and with `auto` why it is not the
/// in-process one when it is not.
fn choose_engine(args: &RecordArgs, metrics: &[Metric], chosen: &Chosen) -> (Engine, Option<String>) {
    let why_not_inject = if metrics.iter().any(|m| !matches!(m, Metric::Wall | Metric::Cpu)) {
        Some("the in-process engine measures wall and CPU time only")
    } else if chosen.lines.is_some() {
        Some("line counts and regions are seen by uprobes on lines")
    } else if chosen.forks && !args.no_follow_fork {
        Some("the program calls fork, and the in-process engine does not record forked processes (--no-follow-fork lets it)")
    } else if chosen.cancels_unhooked {
        Some(
            "the program calls pthread_cancel, and libgcc_s, which unwinds a cancelled thread, is loaded only then, too late for the in-process engine to hook it",
        )
    } else {
        None
    };
    match (args.engine, why_not_inject) {
        (EngineArg::Uprobe, _) => (Engine::Uprobe, None),
        (EngineArg::Inject, _) => (Engine::Inject, None),
        (EngineArg::Auto, None) => (Engine::Inject, None),
        (EngineArg::Auto, Some(why)) => (Engine::Uprobe, Some(format!("calls are seen by uprobes, not the in-process engine: {why}"))),
    }
}

/// Tells the user (and scripts waiting for it) that the probes are live.
fn announce(pid: i32, functions: usize) {
    eprintln!("proftap: attached to process {pid}: {functions} functions probed; stop with Ctrl-C");
}

fn load_options(args: &RecordArgs) -> LoadOptions {
    LoadOptions {
        lines: false,
        debug_dirs: if args.debug_dir.is_empty() { DebugDirs::default() } else { DebugDirs(args.debug_dir.clone()) },
    }
}

/// What to probe in a target.
struct Chosen {
    functions: Vec<ProbedFunction>,
    build_id: Option<String>,
    exit_mode: ExitMode,
    lines: Option<LinePlan>,
    /// The executable calls fork (see [`FORKING`]).
    forks: bool,
    /// The executable calls `pthread_cancel` and no module loaded from the
    /// start unwinds a cancelled thread (glibc loads libgcc_s on demand).
    cancels_unhooked: bool,
}

/// Symbols of the main executable and of the libraries the patterns name;
/// `display[i]` is how the profile names module i, `open[i]` where to probe it.
fn choose(selection: &Selection, modules: &[(PathBuf, PathBuf)], args: &RecordArgs, regions: &[RegionSpec]) -> Result<Chosen> {
    let load = load_options(args);
    let line_files = line_files(args, regions);
    let mut indexes = Vec::new();
    let mut open_paths = Vec::new();
    for (i, (display, open)) in modules.iter().enumerate() {
        if i > 0 && !selection.names_module(display) {
            continue;
        }
        // Line counts need the executable's line table.
        let load = LoadOptions { lines: i == 0 && line_files.is_some(), ..load.clone() };
        let reading = Activity::start(format!("reading the symbols of {}", display.display()));
        let mut index = SymbolIndex::load(open, &load).with_context(|| format!("cannot read the symbols of {}", display.display()))?;
        drop(reading);
        index.path.clone_from(display);
        indexes.push(index);
        open_paths.push(open.clone());
    }
    let refs: Vec<&SymbolIndex> = indexes.iter().collect();
    // An error says what matters in one sentence; warnings only when it works.
    let mut selected = selection.select(&refs)?;
    if let Some(files) = &line_files {
        // Following a frame's lines needs its function's entry and return.
        let with_lines = functions_with_lines(&indexes[0], files);
        if with_lines.is_empty() {
            bail!("{} has no line-table rows for {}; build it with -g", modules[0].0.display(), describe_files(files));
        }
        selected.extend(with_lines.into_iter().map(|function| Selected { module: 0, function }));
        selected.sort();
        selected.dedup();
    }
    for index in &indexes {
        for warning in &index.warnings {
            eprintln!("proftap: warning: {warning}");
        }
    }
    let exit_mode = match args.exits {
        Exits::Uretprobe => ExitMode::Uretprobe,
        Exits::Ret => ExitMode::ReturnSites,
        Exits::Auto => {
            let main = &indexes[0];
            let main_unwinds = unwinds(&main.path, main.imports.iter().chain(main.functions.iter().map(|f| &f.raw_name)));
            if main_unwinds || modules.iter().skip(1).any(|(d, _)| unwinds(d, [""; 0])) {
                ExitMode::ReturnSites
            } else {
                ExitMode::Uretprobe
            }
        }
    };
    let mut warnings = Vec::new();
    let mut functions = plan(&refs, &open_paths, &selected, exit_mode, &mut warnings);
    if let Some((display, open)) = modules.iter().find(|(d, _)| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libstdc++")))
    {
        // C++: a catch ends the frames an exception left, at the moment it starts.
        let index = SymbolIndex::load(open, &load).ok();
        if let Some(marker) = index.and_then(|mut i| {
            i.path.clone_from(display);
            catch_marker(&i, open)
        }) {
            functions.push(marker);
        }
    }
    for warning in warnings {
        eprintln!("proftap: warning: {warning}");
    }
    if functions.iter().all(|f| f.role != Role::Measured) {
        bail!("no function of {} can be probed", modules[0].0.display());
    }
    let lines = line_files.as_ref().map(|files| {
        let measured: Vec<ProbedFunction> = functions.iter().filter(|f| f.role == Role::Measured).cloned().collect();
        plan_lines(&indexes[0], &open_paths[0], &measured, files)
    });
    let forks = indexes[0].imports.iter().any(|i| FORKING.contains(&i.as_str()));
    let cancels_unhooked = indexes[0].imports.iter().any(|i| i == "pthread_cancel")
        && !modules.iter().any(|(d, _)| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libgcc_s")));
    Ok(Chosen { functions, build_id: indexes[0].build_id.clone(), exit_mode, lines, forks, cancels_unhooked })
}

fn describe_files(files: &LineFiles) -> String {
    if files.0.is_empty() { "its own source files".into() } else { files.0.join(", ") }
}

/// The source files to count lines of, if lines are asked for (by
/// `--lines` or by a region).
fn line_files(args: &RecordArgs, regions: &[RegionSpec]) -> Option<LineFiles> {
    match (&args.lines, regions.is_empty()) {
        (None, true) => None,
        (Some(files), _) if files.is_empty() && regions.is_empty() => Some(LineFiles::default()),
        (Some(files), _) if files.is_empty() => Some(LineFiles::default()),
        (files, _) => {
            let mut all: Vec<String> = files.clone().unwrap_or_default();
            all.extend(regions.iter().map(|r| r.file.clone()));
            Some(LineFiles(all))
        }
    }
}

/// A recording ready to start: what to probe, in what, and how.
pub struct Prepared {
    /// The functions to probe.
    pub functions: Vec<ProbedFunction>,
    /// The program.
    pub spec: TargetSpec,
    /// How to record (its `control` and callbacks are the caller's to set).
    pub options: RecordOptions,
    /// The executable's build-id.
    pub build_id: Option<String>,
    /// How returns are seen: what the probe cost is measured for.
    pub exit_mode: ExitMode,
}

impl Prepared {
    /// Records, and puts the build-id in the profile.
    pub fn record(&self) -> Result<Recorded> {
        let mut recorded = record(&self.functions, &self.spec, &self.options)?;
        recorded.profile.target.build_id.clone_from(&self.build_id);
        Ok(recorded)
    }
}

/// Prepares `proftap run`: the command is resolved (against `PATH` and the
/// launch's working directory) and launched as `launch` says.
pub fn prepare_run(args: &RunArgs, launch: target::Launch) -> Result<Prepared> {
    let selection = Selection::parse(&args.record.functions)?;
    let metrics = args.record.metrics()?;
    let command = match &launch.cwd {
        Some(dir) if args.command[0].as_bytes().contains(&b'/') && !Path::new(&args.command[0]).is_absolute() => {
            dir.join(&args.command[0]).into_os_string()
        }
        _ => args.command[0].clone(),
    };
    let path = target::resolve_command(&command)?;
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let mut modules = vec![(path.clone(), path.clone())];
    // The loader of the launched program searches its LD_LIBRARY_PATH.
    let library_path = match &launch.env {
        Some(env) => {
            env.iter().find_map(|v| v.as_bytes().strip_prefix(b"LD_LIBRARY_PATH=").map(|p| OsString::from(std::ffi::OsStr::from_bytes(p))))
        }
        None => std::env::var_os("LD_LIBRARY_PATH"),
    };
    modules.extend(libs::needed_libraries(&path, library_path.as_deref()).into_iter().map(|l| (l.clone(), l)));
    let chosen = choose(&selection, &modules, &args.record, &args.record.regions)?;
    let options = options(&args.record, metrics, None, &chosen, None)?;
    let spec = TargetSpec::Launch { path, argv: args.command.clone(), launch };
    Ok(Prepared { functions: chosen.functions, spec, options, build_id: chosen.build_id, exit_mode: chosen.exit_mode })
}

/// Prepares `proftap attach`.
pub fn prepare_attach(args: &AttachArgs) -> Result<Prepared> {
    let AttachOptions { duration, auto_instrument, warmup } = args.attach;
    if auto_instrument.is_some() && args.record.no_instrument {
        bail!("--auto-instrument instruments functions after the warm-up; --no-instrument never does: choose one");
    }
    let selection = Selection::parse(&args.record.functions)?;
    let metrics = args.record.metrics()?;
    let loaded = procfs::loaded_modules(args.pid)?;
    if loaded.first().is_none_or(|m| !m.is_main) {
        bail!("process {} has no executable mapped (a kernel thread or a process that is exiting)", args.pid);
    }
    let modules: Vec<(PathBuf, PathBuf)> = loaded.iter().map(|m| (m.path.clone(), m.open_path.clone())).collect();
    let chosen = choose(&selection, &modules, &args.record, &args.record.regions)?;
    let auto = auto_instrument.map(|k| (k, warmup));
    let options = options(&args.record, metrics, duration, &chosen, auto)?;
    let spec = TargetSpec::Attach { pid: args.pid };
    Ok(Prepared { functions: chosen.functions, spec, options, build_id: chosen.build_id, exit_mode: chosen.exit_mode })
}

/// Tells the user about probe-set changes as they happen.
fn tell_probes_changed(change: &str) {
    eprintln!("proftap: {change}");
}

/// Runs `proftap run`.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let mut prepared = prepare_run(&args, target::Launch::default())?;
    prepared.options.cost = crate::calibration::probe_cost(prepared.exit_mode, args.record.recalibrate);
    prepared.options.control = control()?;
    prepared.options.on_probes_changed = Some(tell_probes_changed);
    // The program's output shares the terminal: no live line, only a
    // spinner while probes are placed.
    let recorded = with_status(&mut prepared, false)?;
    let status = recorded.ended.map_or(0, |e| e.shell_status());
    finish(recorded.profile, &output(&args.record))?;
    Ok(ExitCode::from(status.clamp(0, 255) as u8))
}

/// Runs `proftap attach`.
pub fn attach(args: AttachArgs) -> Result<ExitCode> {
    let mut prepared = prepare_attach(&args)?;
    prepared.options.cost = crate::calibration::probe_cost(prepared.exit_mode, args.record.recalibrate);
    prepared.options.control = control()?;
    prepared.options.on_started = Some(announce);
    prepared.options.on_probes_changed = Some(tell_probes_changed);
    let recorded = with_status(&mut prepared, true)?;
    finish(recorded.profile, &output(&args.record))?;
    Ok(ExitCode::SUCCESS)
}

/// Records with a status on the terminal (see [`RecordingStatus`]).
fn with_status(prepared: &mut Prepared, live: bool) -> Result<Recorded> {
    let progress = Arc::new(Progress::default());
    prepared.options.progress = Some(progress.clone());
    let status = RecordingStatus::start(progress, prepared.functions.len(), live);
    let recorded = prepared.record();
    drop(status);
    recorded
}

fn output(args: &RecordArgs) -> PathBuf {
    args.output.clone().unwrap_or_else(|| PathBuf::from("proftap.profile"))
}

/// Writes the profile and says what is in it.
pub fn finish(profile: proftap_profile::Profile, output: &Path) -> Result<()> {
    proftap_profile::write_profile(output, &profile)?;
    let threads = profile.threads.len();
    let calls = profile.total_calls();
    let lost = profile.lost.events;
    let instrumented = profile.functions.iter().filter(|f| f.mode != proftap_profile::Mode::Sampled).count();
    let mut parts = Vec::new();
    if instrumented > 0 {
        parts.push(format!(
            "{instrumented} functions, {calls} calls in {threads} thread{}, {lost} events lost",
            if threads == 1 { "" } else { "s" }
        ));
    }
    if let Some(samples) = &profile.samples {
        parts.push(format!("{} stack samples", samples.total));
    }
    eprintln!("proftap: {}; profile written to {} (see: proftap report {})", parts.join(", "), output.display(), output.display());
    Ok(())
}

//! `proftap run` and `proftap attach`: the arguments become a
//! [`RecordRequest`]; the recorder prepares and records it while the terminal
//! shows how it goes; the profile is written.

use crate::calibration::OwnHelper;
use crate::report::text::group_digits;
use crate::status::Terminal;
use anyhow::{Context, Result, bail};
use proftap_record::options::{Control, Recorded};
use proftap_record::prepare::prepare;
use proftap_record::request::{
    AutoInstrument, DEFAULT_TRACE_BYTES, EngineChoice, ExitsChoice, Governor, RecordRequest, RecordTarget, RegionSpec, Sampling,
};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
    #[arg(short = 'e', long = "metric", value_name = "LIST")]
    metrics: Vec<String>,
    /// How calls are seen: `inject` (jumps patched over function entries to
    /// code proftap puts in the process: about 45 ns a call; wall and CPU
    /// time; functions it cannot patch get uprobes where named or where
    /// every probe is kept, else only sampling sees them), `uprobe` (kernel probes
    /// on entries and returns: microseconds a call; any metric, line times,
    /// regions), or `auto`: inject unless the recording needs what only
    /// uprobes do (other metrics, --line-times, --region, lines of a running
    /// process, a program that cancels threads with glibc before 2.34);
    /// the profile says which.
    /// Both follow forked children.
    #[arg(long, value_enum, default_value = "auto")]
    engine: EngineArg,
    /// Where to write the profile (default proftap.profile).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Do not record forked child processes.
    #[arg(long)]
    no_follow_fork: bool,
    /// Subtract the measured cost of the probes from the times (the
    /// default when no function is named and the overhead budget is the
    /// default one: the hybrid's exclusive times are then each function's
    /// own code's, as perf's self samples count it).
    #[arg(long, overrides_with = "no_compensate")]
    compensate: bool,
    /// Keep the probes' cost in the times, as measured.
    #[arg(long)]
    no_compensate: bool,
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
    #[arg(short = 'F', long, num_args = 0..=1, default_missing_value = "1000", value_name = "HZ")]
    sample: Option<u64>,
    /// Do not sample (when no -f is given, proftap samples by default).
    #[arg(long, conflicts_with = "sample")]
    no_sample: bool,
    /// Sample only, as `perf record` does: place no probes (no call counts).
    #[arg(long, conflicts_with_all = ["no_sample", "lines", "regions", "overhead_budget"])]
    no_instrument: bool,
    /// The most all probes together may cost, in percent of the elapsed
    /// time: past it, the costliest functions' probes are removed while the
    /// program runs (their counts stay exact up to then; sampling covers
    /// them after). Default 5 when no -f is given (and no line probes), off
    /// otherwise; 0 turns it off.
    #[arg(long, value_name = "PCT")]
    overhead_budget: Option<f64>,
    /// Count how often each line runs (gcov's line counts): with no file
    /// named, in every source file of the executable outside the system
    /// headers; `--lines=a.c,src/b.c` in these source files only (path
    /// suffixes; the `=` keeps the command apart). The in-process engine
    /// counts branches on the machine code, as a `--coverage` build would.
    #[arg(long, num_args = 0..=1, require_equals = true, value_delimiter = ',', default_missing_value = "", value_name = "SRC")]
    lines: Option<Vec<String>>,
    /// Time each line as well (with --lines): a probe on every line, a few
    /// microseconds each time a line is entered.
    #[arg(long, requires = "lines")]
    line_times: bool,
    /// Time a range of lines like a function: NAME=FILE:START-END
    /// (repeatable). Entered when a frame moves onto one of its lines from
    /// outside it, left when it moves off or returns; calls inside count.
    #[arg(long = "region", value_name = "NAME=FILE:START-END", value_parser = parse_region)]
    regions: Vec<RegionSpec>,
    /// Keep every call of the instrumented functions one by one (when it
    /// started, how long it took, its thread) and each sample's time: a
    /// timeline, for `proftap export --format chrome-trace|speedscope|firefox`
    /// and `proftap report --slowest`.
    #[arg(long)]
    trace: bool,
    /// The most the trace keeps, as 64M or 1G (default 64M: about 2.8
    /// million calls); calls past it are counted in the profile, not kept.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "trace")]
    trace_size: Option<u64>,
    /// Measure the probe cost again instead of using this boot's measurement.
    #[arg(long)]
    pub recalibrate: bool,
    /// Ring buffer per CPU, in MiB (more if events are lost).
    #[arg(long, value_name = "MIB", default_value_t = 8)]
    pub buffer_size: usize,
    /// Where separate debug files are looked for (default /usr/lib/debug).
    /// With DEBUGINFOD_URLS set, debuginfod servers are asked for what is
    /// not found there.
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Vec<PathBuf>,
    /// Also write the recording's events, as the aggregator takes them, to
    /// FILE (for replaying: golden tests, the aggregator's benchmark).
    #[arg(long, value_name = "FILE", hide = true)]
    pub save_events: Option<PathBuf>,
}

/// How calls are seen (see `--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EngineArg {
    Auto,
    Uprobe,
    Inject,
}

impl RecordArgs {
    /// The request these arguments make for `target`; what only a command
    /// line can get wrong is said in its flags' words.
    pub fn request(&self, target: RecordTarget) -> Result<RecordRequest> {
        if self.sample == Some(0) {
            bail!("--sample needs a frequency above 0");
        }
        if let Some(pct) = self.overhead_budget
            && !(0.0..=100.0).contains(&pct)
        {
            bail!("--overhead-budget is a percentage between 0 and 100");
        }
        if self.no_instrument && matches!(target, RecordTarget::Attach { auto_instrument: Some(_), .. }) {
            bail!("--auto-instrument instruments functions after the warm-up; --no-instrument never does: choose one");
        }
        Ok(RecordRequest {
            target,
            functions: self.functions.clone(),
            metrics: self.metrics.clone(),
            engine: match self.engine {
                EngineArg::Auto => EngineChoice::Auto,
                EngineArg::Uprobe => EngineChoice::Uprobe,
                EngineArg::Inject => EngineChoice::Inject,
            },
            exits: match self.exits {
                Exits::Auto => ExitsChoice::Auto,
                Exits::Uretprobe => ExitsChoice::Uretprobe,
                Exits::Ret => ExitsChoice::ReturnSites,
            },
            follow_forks: !self.no_follow_fork,
            compensate: self.compensate || (!self.no_compensate && self.functions.is_empty() && self.overhead_budget.is_none()),
            sampling: match (self.sample, self.no_sample) {
                (Some(hz), _) => Sampling::Frequency { hz },
                (None, true) => Sampling::Off,
                (None, false) => Sampling::Default,
            },
            instrument: !self.no_instrument,
            governor: match self.overhead_budget {
                Some(percent) if percent > 0.0 => Governor::Budget { percent },
                Some(_) => Governor::Off,
                None => Governor::Default,
            },
            // `--lines` alone: every file.
            lines: self.lines.as_ref().map(|files| files.iter().filter(|f| !f.is_empty()).cloned().collect()),
            regions: self.regions.clone(),
            line_times: self.line_times,
            buffer_mib: self.buffer_size,
            debug_dirs: self.debug_dir.clone(),
            debuginfod: super::symbols::debuginfod_from_env(),
            recalibrate: self.recalibrate,
            live_calls: false,
            trace_bytes: self.trace.then(|| self.trace_size.unwrap_or(DEFAULT_TRACE_BYTES)),
        })
    }

    /// Where the profile goes.
    fn output(&self) -> PathBuf {
        self.output.clone().unwrap_or_else(|| PathBuf::from("proftap.profile"))
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
    /// Record the command N times, a profile per run, for `proftap diff`
    /// to judge a change on the runs' spread; -o then names a new directory
    /// for them (default proftap.runs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000), conflicts_with = "save_events")]
    pub repeat: Option<u32>,
    /// The command to profile and its arguments (after `--`, or directly:
    /// everything from the first word that is not an option of proftap's).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
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
    #[arg(required_unless_present = "pid_option", conflicts_with = "pid_option", value_name = "PID")]
    pid: Option<i32>,
    /// The process to profile (as `perf record -p`).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pid_option: Option<i32>,
}

impl AttachArgs {
    /// The process to profile, given either way.
    pub fn pid(&self) -> i32 {
        self.pid.or(self.pid_option).unwrap_or_default()
    }
}

impl AttachOptions {
    /// The target these options make of process `pid`.
    pub fn target(&self, pid: i32) -> RecordTarget {
        let auto_instrument = self.auto_instrument.map(|count| AutoInstrument { count, warmup: self.warmup });
        RecordTarget::Attach { pid, duration: self.duration, auto_instrument }
    }
}

fn parse_region(text: &str) -> Result<RegionSpec, String> {
    RegionSpec::parse(text).map_err(|e| e.to_string())
}

/// A size in bytes as `4096`, `64K`, `64M` or `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let shift = match text[digits.len()..].to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("'{text}' is not a size like 4096, 64K, 64M or 1G")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a size like 4096, 64K, 64M or 1G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{text}' is more bytes than proftap can count"))
}

/// A duration as `30s`, `2m`, `500ms`, `0.3s`, `1m30s` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    // A decimal number of one unit (`0.3s`, `1.5m`), as `sleep` takes it.
    const UNITS: [(&str, f64); 6] = [("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    let decimal = UNITS
        .iter()
        .find_map(|(unit, scale)| Some(text.strip_prefix('+').unwrap_or(text).strip_suffix(unit)?.parse::<f64>().ok()? * scale));
    if let Some(seconds) = text.parse::<f64>().ok().or(decimal) {
        // Past 2^64 seconds, or negative, or not a number: not a duration.
        return Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{text}' is not a duration proftap can wait for"));
    }
    humantime::parse_duration(text).map_err(|e| format!("'{text}' is not a duration like 30s, 2m, 0.5s or 500ms ({e})"))
}

/// Catches Ctrl-C and SIGTERM so the recording ends cleanly: probes removed,
/// profile written.
pub fn control() -> Result<Control> {
    let control = Control::default();
    let (interrupt, only_proftap) = (control.interrupt.clone(), control.interrupt_only_proftap.clone());
    // SAFETY: the action only stores to atomics, which is async-signal-safe.
    unsafe {
        signal_hook_registry::register_sigaction(libc::SIGINT, move |info: &libc::siginfo_t| {
            interrupt.store(true, std::sync::atomic::Ordering::Relaxed);
            // The terminal's Ctrl-C comes from the kernel, to the whole
            // foreground process group; a `kill` to proftap alone does not.
            if info.si_code != libc::SI_KERNEL {
                only_proftap.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
    }
    .context("cannot handle SIGINT")?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, control.terminate.clone()).context("cannot handle SIGTERM")?;
    signal_hook::flag::register(signal_hook::consts::SIGHUP, control.terminate.clone()).context("cannot handle SIGHUP")?;
    Ok(control)
}

/// Runs `proftap run`.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let request = args.record.request(RecordTarget::Launch { command: args.command.clone(), cwd: None, env: None })?;
    if let Some(runs) = args.repeat {
        let dir = args.record.output.clone().unwrap_or_else(|| PathBuf::from("proftap.runs"));
        return repeat(&request, runs, &dir);
    }
    proftap_profile::check_writable(&args.record.output())?;
    // The program's output shares the terminal: no live line, only a
    // spinner while probes are placed.
    let recorded = record(&request, args.record.save_events.as_deref(), false, control()?)?;
    let status = recorded.ended.map_or(0, |e| e.shell_status());
    finish(&recorded.profile, &args.record.output())?;
    free_beside(recorded.profile);
    Ok(ExitCode::from(status.clamp(0, 255) as u8))
}

/// Lets `profile` go on a thread of its own: a profile of hundreds of
/// processes takes milliseconds to free, which a command about to exit
/// need not wait for.
fn free_beside(profile: proftap_profile::Profile) {
    let _ = std::thread::Builder::new().name("proftap-free".into()).spawn(move || drop(profile));
}

/// Records `request` `runs` times into `dir` (run-01.profile, ...), until a
/// run fails or the user interrupts.
fn repeat(request: &RecordRequest, runs: u32, dir: &Path) -> Result<ExitCode> {
    let holds_profiles = |dir: &Path| {
        std::fs::read_dir(dir)
            .is_ok_and(|mut entries| entries.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "profile"))))
    };
    if holds_profiles(dir) {
        bail!("{} already holds profiles, which `proftap diff` would count as runs; name another directory with -o", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the directory {}", dir.display()))?;
    let control = control()?;
    let width = runs.to_string().len();
    for run in 1..=runs {
        let recorded = record(request, None, false, control.clone())?;
        let status = recorded.ended.map_or(0, |e| e.shell_status());
        finish(&recorded.profile, &dir.join(format!("run-{run:0width$}.profile")))?;
        let stopped = control.interrupt.load(Ordering::Relaxed) || control.terminate.load(Ordering::Relaxed);
        if status != 0 || (stopped && run < runs) {
            let why = if status != 0 { format!("run {run} exited with status {status}") } else { format!("interrupted after run {run}") };
            eprintln!("proftap: {why}; {run} of {runs} runs recorded in {}", dir.display());
            return Ok(ExitCode::from(status.clamp(1, 255) as u8));
        }
    }
    eprintln!("proftap: {runs} runs recorded in {} (compare: proftap diff BASE_DIR {})", dir.display(), dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Runs `proftap attach`.
pub fn attach(args: AttachArgs) -> Result<ExitCode> {
    let request = args.record.request(args.attach.target(args.pid()))?;
    proftap_profile::check_writable(&args.record.output())?;
    let recorded = record(&request, args.record.save_events.as_deref(), true, control()?)?;
    finish(&recorded.profile, &args.record.output())?;
    free_beside(recorded.profile);
    Ok(ExitCode::SUCCESS)
}

/// Prepares and records `request`, showing on the terminal how it goes
/// (with `live`, a line of counters while recording); `save_events` names
/// a file for the events.
fn record(request: &RecordRequest, save_events: Option<&Path>, live: bool, control: Control) -> Result<Recorded> {
    let terminal = Arc::new(Terminal::start(live));
    let mut prepared = prepare(request, terminal.as_ref(), &OwnHelper)?;
    if let Some(path) = save_events {
        let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        prepared.save_events(file);
    }
    let recorded = prepared.record(control, terminal.clone())?;
    Ok(recorded)
}

/// Writes the profile and says what is in it.
pub fn finish(profile: &proftap_profile::Profile, output: &Path) -> Result<()> {
    proftap_profile::write_profile(output, profile)?;
    let threads = profile.threads.len();
    let calls = profile.total_calls();
    let lost = profile.lost.events;
    let instrumented = profile.functions.iter().filter(|f| f.mode != proftap_profile::Mode::Sampled).count();
    let mut parts = Vec::new();
    if instrumented > 0 {
        parts.push(format!(
            "{instrumented} functions, {} calls in {threads} thread{}, {} events lost",
            group_digits(calls),
            if threads == 1 { "" } else { "s" },
            group_digits(lost)
        ));
    }
    if let Some(samples) = &profile.samples {
        parts.push(format!("{} stack samples", group_digits(samples.total)));
    }
    eprintln!("proftap: {}; profile written to {} (see: proftap report {})", parts.join(", "), output.display(), output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds_past_what_a_duration_holds_are_refused() {
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0.3s"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2.5ms"), Ok(Duration::from_micros(2500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        // Duration::from_secs_f64 panicked on these.
        for text in ["1e30", "-1", "inf", "NaN", "-0.5s", "infs", "1e30h", "s", ".s"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_what_does_not_fit() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        for text in ["", "M", "12X", "-1M", "99999999999999999999G", "18446744073709551615G"] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }
}

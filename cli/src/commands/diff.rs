//! `proftap diff`: what got slower between two profiles, with an exit status
//! for CI.

use crate::report::text::{format_value, group_digits};
use crate::status::paint;
use anyhow::{Context, Result, bail};
use proftap_profile::{Change, Diff, DiffOptions, Reason, Verdict};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap diff`.
#[derive(clap::Args)]
pub struct Args {
    /// The profile to compare against, then the new one. With runs repeated
    /// (`run --repeat`): a directory of profiles for each side, or the base
    /// runs' profiles here and the new runs' after `--`.
    #[arg(required = true, value_name = "PROFILE")]
    profiles: Vec<PathBuf>,
    /// The new runs' profiles (after `--`).
    #[arg(last = true, value_name = "NEW")]
    new: Vec<PathBuf>,
    /// Growth of a function's cost per call, in percent, past which it
    /// regressed.
    #[arg(long, value_name = "PCT", default_value_t = 10.0)]
    threshold: f64,
    /// The metric compared (wall, cpu, page-faults, ...). CPU time moves
    /// less with the machine's load than wall time.
    #[arg(long, default_value = "wall")]
    metric: String,
    /// Fewest calls in each of two single profiles for their averages to be
    /// compared; a function called less is judged call by call (every new
    /// call past the slowest old one).
    #[arg(long, value_name = "N", default_value_t = 10)]
    many_calls: u64,
    /// Smallest growth per call that counts, in the metric's unit (ns for
    /// times). Default: for times, what one probed call costs the engine
    /// that recorded the function.
    #[arg(long, value_name = "VALUE")]
    floor: Option<u64>,
    /// Smallest growth over all of a function's calls that counts, in
    /// percent of the new profile's instrumented total.
    #[arg(long, value_name = "PCT", default_value_t = 1.0)]
    min_share: f64,
    /// Judge many calls on the average per call alone. By default the
    /// fastest call must also have grown past the threshold: preemption
    /// lengthens some calls and moves the average, not the fastest call. A
    /// slowdown of only some calls shows in the average alone.
    #[arg(long)]
    averages_only: bool,
    /// Confidence of the interval over repeated runs, in percent.
    #[arg(long, value_name = "PCT", default_value_t = 95.0)]
    confidence: f64,
    /// Compare profiles of different programs.
    #[arg(long)]
    force: bool,
    /// Show every function, not only those that changed past the guards.
    #[arg(long)]
    all: bool,
    /// text, or json (the comparison as data).
    #[arg(long, default_value = "text")]
    format: String,
}

/// Runs the command: exit status 1 when something regressed.
pub fn run(args: Args) -> Result<ExitCode> {
    if !(args.threshold >= 0.0 && args.min_share >= 0.0) {
        bail!("--threshold and --min-share are percentages of at least 0");
    }
    if !(args.confidence > 0.0 && args.confidence < 100.0) {
        bail!("--confidence is a percentage above 0 and below 100");
    }
    let (base, new) = sides(&args)?;
    let read = |paths: &[PathBuf]| paths.iter().map(|p| Ok(proftap_profile::read_profile(p)?)).collect::<Result<Vec<_>>>();
    let (base_profiles, new_profiles) = (read(&base)?, read(&new)?);
    let key = proftap_probes::metrics::Metric::parse(&args.metric)?.key();
    let options = DiffOptions {
        threshold: args.threshold / 100.0,
        many_calls: args.many_calls,
        floor_per_call: args.floor,
        min_share: args.min_share / 100.0,
        fastest_too: !args.averages_only,
        confidence: args.confidence / 100.0,
        force: args.force,
    };
    let diff = proftap_profile::diff_runs(&base_profiles, &new_profiles, key, &options)?;
    match args.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&diff)?),
        "text" => print!("{}", render(&diff, &args, (&base, &new))),
        other => bail!("unknown format '{other}': text or json"),
    }
    Ok(if diff.regressed() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The profiles of each side: two arguments (files or directories), or
/// base files before `--` and new ones after.
fn sides(args: &Args) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (base, new) = match (args.profiles.as_slice(), args.new.is_empty()) {
        ([base, new], true) => (vec![base.clone()], vec![new.clone()]),
        (_, true) => bail!("diff compares two profiles (or two directories of runs); with several runs a side, put the new ones after --"),
        (base, false) => (base.to_vec(), args.new.clone()),
    };
    Ok((expand(&base)?, expand(&new)?))
}

/// Files as given; a directory stands for the `.profile` files in it.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
        let mut runs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "profile") && p.is_file())
            .collect();
        if runs.is_empty() {
            bail!("{} holds no .profile files", path.display());
        }
        runs.sort();
        files.extend(runs);
    }
    Ok(files)
}

fn render(diff: &Diff, args: &Args, (base, new): (&[PathBuf], &[PathBuf])) -> String {
    let mut out = String::new();
    let key = diff.metric.as_str();
    let regressed: Vec<&str> =
        diff.functions.iter().chain(&diff.regions).filter(|c| c.verdict == Verdict::Regressed).map(|c| c.name.as_str()).collect();
    let side = |paths: &[PathBuf]| match paths {
        [one] => one.display().to_string(),
        many => format!("{} runs ({} ...)", many.len(), many[0].display()),
    };
    let _ = writeln!(
        out,
        "proftap diff: {} against {} ({}, inclusive cost per call)",
        side(new),
        side(base),
        crate::report::text::metric_label(key)
    );
    if let Some((a, b)) = &diff.builds {
        let _ = writeln!(out, "  builds     {} (build-id {a}) and {} (build-id {b})", diff.programs.0, diff.programs.1);
    }
    let judged = if diff.runs.0 > 1 || diff.runs.1 > 1 {
        format!(
            "each run's {}; the ratio new/base with its {}% interval (Hodges-Lehmann, Mann-Whitney) must exclude 1",
            if args.averages_only || proftap_profile::Unit::of(key) != proftap_profile::Unit::Nanoseconds {
                "average per call"
            } else {
                "fastest call"
            },
            args.confidence
        )
    } else {
        format!(
            "with {}+ calls the average{}, with fewer every call",
            args.many_calls,
            if args.averages_only { "" } else { " and the fastest call" }
        )
    };
    let _ = writeln!(
        out,
        "  judged     {judged}; past {}% per call, above the probes' cost per call and {} over all calls",
        args.threshold,
        format_value(key, diff.floor_total)
    );
    let colour = crate::status::colour(&std::io::stdout());
    if regressed.is_empty() {
        let _ = writeln!(out, "  verdict    {}", paint("no regression", 32, colour));
    } else {
        let _ = writeln!(out, "  verdict    {}: {}", paint("REGRESSED", 31, colour), regressed.join(", "));
    }
    table(&mut out, "Functions", "calls", key, &diff.functions, args.all);
    if !diff.regions.is_empty() {
        table(&mut out, "Regions", "entries", key, &diff.regions, args.all);
    }
    if !diff.lines.is_empty() {
        let _ = writeln!(out, "\nLines whose counts changed ({})", diff.lines.len());
        let _ = writeln!(out, "{:>12} {:>12}  line", "base", "new");
        for l in diff.lines.iter().take(if args.all { usize::MAX } else { 20 }) {
            let _ = writeln!(out, "{:>12} {:>12}  {}:{}", group_digits(l.count.0), group_digits(l.count.1), l.file, l.line);
        }
    }
    out
}

/// Why a function got its verdict, in a few words.
fn reason(c: &Change, key: &str) -> String {
    match c.reason {
        Reason::OnlyNew => "only in the new profile".into(),
        Reason::OnlyBase => "only in the base profile".into(),
        Reason::WithinThreshold => "within the threshold".into(),
        Reason::BelowFloor => format!("under {} a call (the probes' cost)", format_value(key, c.floor)),
        Reason::SmallShare => "too small a share of the run".into(),
        Reason::FastestSteady => "the fastest call did not move".into(),
        Reason::AverageAndFastest => "average and fastest call".into(),
        Reason::Average => "average".into(),
        Reason::CallsOverlap => "few calls, overlapping".into(),
        Reason::EveryCall => "few calls, every call".into(),
        Reason::RunsDiffer | Reason::RunsOverlap => match c.ratio {
            Some(r) => format!("x{:.3} [{:.3}, {:.3}]", r.estimate, r.low, r.high),
            None => "runs".into(),
        },
        Reason::TooFewRuns => "too few runs for an interval".into(),
    }
}

fn table(out: &mut String, title: &str, calls: &str, key: &str, changes: &[Change], all: bool) {
    let shown: Vec<&Change> = changes.iter().filter(|c| all || c.verdict != Verdict::Unchanged).collect();
    let _ = writeln!(out, "\n{title} ({} of {} shown{})", shown.len(), changes.len(), if all { "" } else { "; --all shows the rest" });
    if shown.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  {:<11} name  (why)",
        format!("base {calls}"),
        format!("new {calls}"),
        "base avg",
        "new avg",
        "change",
        "fastest",
        "verdict"
    );
    for c in shown {
        let change = c.change_pct.map_or_else(|| "-".to_string(), |p| format!("{p:+.1}%"));
        let fastest = if c.fastest.0 > 0 && c.calls.1 > 0 {
            format!("{:+.1}%", 100.0 * (c.fastest.1 as f64 - c.fastest.0 as f64) / c.fastest.0 as f64)
        } else {
            "-".to_string()
        };
        let colour = crate::status::colour(&std::io::stdout());
        let verdict = match c.verdict {
            Verdict::Regressed => &paint("REGRESSED  ", 31, colour),
            Verdict::Improved => &paint("improved   ", 32, colour),
            Verdict::Unchanged => "unchanged  ",
            Verdict::New => "new        ",
            Verdict::Gone => "gone       ",
        };
        let _ = writeln!(
            out,
            "{:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  {} {}  ({})",
            group_digits(c.calls.0),
            group_digits(c.calls.1),
            format_value(key, c.avg.0),
            format_value(key, c.avg.1),
            change,
            fastest,
            verdict,
            c.name,
            reason(c, key)
        );
    }
}

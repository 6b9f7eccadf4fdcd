//! `proftap diff`: what got slower between two profiles, with an exit status
//! for CI.

use crate::report::text::{format_value, group_digits};
use crate::status::paint;
use anyhow::{Result, bail};
use proftap_profile::{Change, Diff, DiffOptions, Verdict};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap diff`.
#[derive(clap::Args)]
pub struct Args {
    /// The profile to compare against.
    base: PathBuf,
    /// The new profile.
    new: PathBuf,
    /// Growth of a function's average cost per call, in percent, past which
    /// it regressed.
    #[arg(long, value_name = "PCT", default_value_t = 10.0)]
    threshold: f64,
    /// The metric compared (wall, cpu, page-faults, ...). CPU time moves
    /// less with the machine's load than wall time.
    #[arg(long, default_value = "wall")]
    metric: String,
    /// Fewest calls in each profile for a function to be judged.
    #[arg(long, value_name = "N", default_value_t = 10)]
    min_calls: u64,
    /// Smallest growth per call that counts, in the metric's unit (ns for
    /// times). Default: for times, the measured cost of a probed call.
    #[arg(long, value_name = "VALUE")]
    floor: Option<u64>,
    /// Smallest growth over all of a function's calls that counts, in
    /// percent of the new profile's instrumented total.
    #[arg(long, value_name = "PCT", default_value_t = 1.0)]
    min_share: f64,
    /// Judge on the average per call alone. By default the fastest call
    /// must also have grown past the threshold: preemption lengthens some
    /// calls and moves the average, not the fastest call. A slowdown of
    /// only some calls shows in the average alone.
    #[arg(long)]
    averages_only: bool,
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
    let base = proftap_profile::read_profile(&args.base)?;
    let new = proftap_profile::read_profile(&args.new)?;
    let key = proftap_probes::metrics::Metric::parse(&args.metric)?.key();
    let options = DiffOptions {
        metric: 0,
        threshold: args.threshold / 100.0,
        min_calls: args.min_calls,
        floor_per_call: args.floor,
        min_share: args.min_share / 100.0,
        fastest_too: !args.averages_only,
    };
    let diff = proftap_profile::diff(&base, &new, key, &options)?;
    match args.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&diff)?),
        "text" => print!("{}", render(&diff, &args)),
        other => bail!("unknown format '{other}': text or json"),
    }
    Ok(if diff.regressed() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn render(diff: &Diff, args: &Args) -> String {
    let mut out = String::new();
    let key = diff.metric.as_str();
    let regressed: Vec<&str> =
        diff.functions.iter().chain(&diff.regions).filter(|c| c.verdict == Verdict::Regressed).map(|c| c.name.as_str()).collect();
    let _ = writeln!(
        out,
        "proftap diff: {} against {} ({}, average inclusive cost per call)",
        args.new.display(),
        args.base.display(),
        crate::report::text::metric_label(key)
    );
    let _ = writeln!(
        out,
        "  judged     functions with at least {} calls in both; a change counts past {}% per call{}, {} per call and {} over all calls",
        args.min_calls,
        args.threshold,
        if args.averages_only { "" } else { " (average and fastest call)" },
        format_value(key, diff.floor_per_call),
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

fn table(out: &mut String, title: &str, calls: &str, key: &str, changes: &[Change], all: bool) {
    let shown: Vec<&Change> = changes.iter().filter(|c| all || !matches!(c.verdict, Verdict::Unchanged | Verdict::TooFewCalls)).collect();
    let _ = writeln!(out, "\n{title} ({} of {} shown{})", shown.len(), changes.len(), if all { "" } else { "; --all shows the rest" });
    if shown.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  {:<11} name",
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
            Verdict::TooFewCalls => "few calls  ",
            Verdict::New => "new        ",
            Verdict::Gone => "gone       ",
        };
        let _ = writeln!(
            out,
            "{:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  {} {}",
            group_digits(c.calls.0),
            group_digits(c.calls.1),
            format_value(key, c.avg.0),
            format_value(key, c.avg.1),
            change,
            fastest,
            verdict,
            c.name
        );
    }
}

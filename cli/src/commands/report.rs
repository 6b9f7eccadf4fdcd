//! `proftap report`: a profile as text or JSON.

use crate::report::callgraph::{self, Side};
use crate::report::slowest;
use crate::report::text::{TextOptions, render};
use crate::report::{SortKey, json};
use anyhow::{Result, bail};
use proftap_profile::Profile;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `proftap report`.
#[derive(clap::Args)]
pub struct Args {
    /// A profile written by `proftap run` or `proftap attach`.
    #[arg(default_value = "proftap.profile")]
    file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Show the calling-context tree.
    #[arg(long)]
    tree: bool,
    /// Show each thread.
    #[arg(long)]
    threads: bool,
    /// Show the call tree this many levels deep at most (as uftrace's --depth).
    #[arg(long, value_name = "N", requires = "tree")]
    depth: Option<usize>,
    /// Hide calling contexts under PCT percent of the run in the call tree.
    #[arg(long, value_name = "PCT", requires = "tree", default_value_t = 0.0)]
    min_share: f64,
    /// Print straight to the terminal, without a pager (default: $PAGER, or
    /// less, when the output is a terminal).
    #[arg(long)]
    no_pager: bool,
    /// Sort functions by (`self` is exclusive, `total` inclusive).
    #[arg(short = 's', long, value_enum, default_value = "incl")]
    sort: SortKey,
    /// Show each source file with its line counts and times (profiles recorded with --lines).
    #[arg(long)]
    lines: bool,
    /// Show only the first N functions of each table.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Metrics to show (comma-separated: wall, cpu, page-faults, ...); all by default.
    #[arg(long = "metric", value_name = "LIST")]
    metrics: Vec<String>,
    /// Show who called function F, with the calls and time of each caller's calls.
    #[arg(long, value_name = "F", conflicts_with_all = ["callees", "format"])]
    callers: Option<String>,
    /// Show what function F called, with the calls and time of each callee.
    #[arg(long, value_name = "F", conflicts_with = "format")]
    callees: Option<String>,
    /// List the N slowest calls of function F, with when each started and
    /// its thread (profiles recorded with --trace).
    #[arg(long, num_args = 2, value_names = ["N", "F"], conflicts_with_all = ["callers", "callees", "tree", "lines"])]
    slowest: Option<Vec<String>>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    if !(0.0..=100.0).contains(&args.min_share) {
        bail!("--min-share is a percentage between 0 and 100");
    }
    let profile = proftap_profile::read_profile(&args.file)?;
    let mut metrics = Vec::new();
    for name in args.metrics.iter().flat_map(|m| m.split(',')).filter(|n| !n.is_empty()) {
        let key = proftap_probes::metrics::Metric::parse(name)?.key();
        match profile.metric_index(key) {
            Some(i) => metrics.push(i),
            None => bail!("{} has no metric '{name}'; it has: {}", args.file.display(), profile.metrics.join(", ")),
        }
    }
    let graph = match (&args.callers, &args.callees) {
        (Some(f), _) => Some((f, Side::Callers)),
        (_, Some(f)) => Some((f, Side::Callees)),
        _ => None,
    };
    let text = match args.format {
        _ if let Some(asked) = &args.slowest => slowest_calls(&profile, asked, args.format, &args.file)?,
        _ if let Some((name, side)) = graph => {
            let m = metrics.first().copied().unwrap_or(0);
            callgraph::render(&profile, name, side, m).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?
        }
        Format::Json => {
            let order = json::Order { sort: Some((args.sort, metrics.first().copied().unwrap_or(0))), top: args.top };
            let mut s = serde_json::to_string_pretty(&json::report_in_order(&profile, &order))?;
            s.push('\n');
            s
        }
        Format::Text => render(
            &profile,
            &TextOptions {
                sort: args.sort,
                top: args.top,
                tree: args.tree,
                threads: args.threads,
                metrics,
                lines: args.lines,
                depth: args.depth,
                min_share: args.min_share / 100.0,
                width: crate::output::terminal_width(),
            },
        ),
    };
    crate::output::show(&text, args.no_pager || matches!(args.format, Format::Json) && graph.is_none())?;
    Ok(ExitCode::SUCCESS)
}

/// `--slowest N F`, as text or JSON.
fn slowest_calls(profile: &Profile, asked: &[String], format: Format, file: &Path) -> Result<String> {
    let [n, name] = asked else { bail!("--slowest takes a count and a function: --slowest 10 parse") };
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| anyhow::anyhow!("--slowest takes a count first, then a function: '{n}' is not a count of one or more"))?;
    let found = slowest::slowest(profile, name, n).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(match format {
        Format::Text => slowest::render(&found),
        Format::Json => serde_json::to_string_pretty(&found)? + "\n",
    })
}

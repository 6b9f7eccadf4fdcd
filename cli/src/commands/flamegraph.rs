//! `proftap flamegraph`: an SVG flame graph of sampled stacks or of the exact
//! call tree, or the difference between two profiles.

use crate::report::flame::{Source, diff_svg, folded, svg};
use anyhow::{Context, Result, bail};
use proftap_profile::Profile;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap flamegraph`.
#[derive(clap::Args)]
pub struct Args {
    /// A profile (with --diff: the base, then the new profile).
    #[arg(required = true, num_args = 1..=2, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Where to write the SVG (`-`: standard output).
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    output: PathBuf,
    /// Stacks from samples, or from the exact call tree (default: samples
    /// when the profile has them).
    #[arg(long, value_enum)]
    from: Option<Source>,
    /// With --from calls: the metric weighting each call path (wall, cpu, ...).
    #[arg(long, default_value = "wall")]
    metric: String,
    /// Compare two profiles: the flame graph of the second, coloured by the change from the first.
    #[arg(long)]
    diff: bool,
    /// The title.
    #[arg(long)]
    title: Option<String>,
}

fn metric(profile: &Profile, name: &str, file: &std::path::Path) -> Result<usize> {
    let key = proftap_probes::metrics::Metric::parse(name)?.key();
    match profile.metric_index(key) {
        Some(i) => Ok(i),
        None => bail!("{} has no metric '{name}'; it has: {}", file.display(), profile.metrics.join(", ")),
    }
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let profiles: Vec<Profile> = args.files.iter().map(|f| proftap_profile::read_profile(f)).collect::<Result<_, _>>()?;
    if args.diff != (profiles.len() == 2) {
        bail!("give one profile, or --diff with two (the base, then the new one)");
    }
    let mut stacks = Vec::new();
    for (profile, file) in profiles.iter().zip(&args.files) {
        if args.from == Some(Source::Samples) && profile.samples.is_none() {
            bail!("{} has no samples; record it with --sample, or use --from calls", file.display());
        }
        let lines =
            folded(profile, args.from, metric(profile, &args.metric, file)?).with_context(|| format!("cannot draw {}", file.display()))?;
        if lines.is_empty() {
            bail!("{} has no stacks to draw", file.display());
        }
        stacks.push(lines);
    }
    let samples = args.from.unwrap_or(if profiles[0].samples.is_some() { Source::Samples } else { Source::Calls }) == Source::Samples;
    let count_name = if samples { "samples" } else { "ns" };
    let command = profiles[0].target.command.join(" ");
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| if args.diff { format!("proftap: change in {command}") } else { format!("proftap: {command}") });
    let svg = if args.diff { diff_svg(&stacks[0], &stacks[1], &title, count_name)? } else { svg(&stacks[0], &title, count_name)? };
    crate::output::write_output(&args.output, |out| out.write_all(&svg))?;
    Ok(ExitCode::SUCCESS)
}

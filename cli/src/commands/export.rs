//! `proftap export`: a profile in the formats other tools read.

use crate::report::coverage::{gcov_json, lcov, lower_bounds_warning};
use crate::report::{chrome_trace, firefox, json, speedscope};
use anyhow::{Context, Result, bail};
use flate2::Compression;
use flate2::write::GzEncoder;
use proftap_profile::{Profile, Trace};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap export`.
#[derive(clap::Args)]
pub struct Args {
    /// A profile.
    file: PathBuf,
    /// Output format.
    #[arg(long, value_enum)]
    format: Format,
    /// Where to write it (`-`: standard output).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// The JSON report (proftap.report/1).
    Json,
    /// An lcov tracefile (genhtml, coverage services).
    Lcov,
    /// gcov's JSON format (`gcov --json-format`, gzip-compressed), as gcovr reads it.
    GcovJson,
    /// Folded stacks (`outer;inner count`) for any flame graph tool: sampled
    /// stacks if the profile has them, else call paths weighted by exclusive wall time.
    Folded,
    /// pprof (gzip-compressed profile.proto) for `go tool pprof`: exact
    /// call paths with calls and costs, and sampled stacks.
    Pprof,
    /// The trace (recorded with --trace) in the Chrome trace event format,
    /// for the Perfetto UI and chrome://tracing: every call, and the samples.
    ChromeTrace,
    /// The trace (recorded with --trace) in speedscope's format: every call,
    /// one timeline per thread.
    Speedscope,
    /// The trace (recorded with --trace) in the Firefox Profiler's processed
    /// format: the samples, and every call as a marker.
    Firefox,
}

impl Format {
    /// Whether it is a timeline: made of the trace.
    fn needs_trace(self) -> bool {
        matches!(self, Format::ChromeTrace | Format::Speedscope | Format::Firefox)
    }
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let profile = proftap_profile::read_profile(&args.file)?;
    if matches!(args.format, Format::Lcov | Format::GcovJson) && profile.lines.is_empty() {
        bail!("{} has no line counts; record it with --lines", args.file.display());
    }
    if args.format.needs_trace() && profile.trace.is_none() {
        bail!("{} has no trace; record it with --trace", args.file.display());
    }
    let data_name = args.file.display().to_string();
    // Rendered before the output is touched: a profile too large to export
    // leaves no file.
    let bytes = render(&profile, args.format, &data_name).with_context(|| format!("cannot export {}", args.file.display()))?;
    crate::output::write_output(&args.output, |out| out.write_all(&bytes))?;
    if let Some(warning) = lower_bounds_warning(&profile).filter(|_| matches!(args.format, Format::Lcov | Format::GcovJson)) {
        eprintln!("{warning}");
    }
    if let Some(trace) = profile.trace.as_ref().filter(|t| args.format.needs_trace() && t.cut > 0) {
        eprintln!(
            "proftap: warning: the trace of {} lacks {} of the calls the profile counts (it was full, or they were overwritten before proftap read them); a larger --trace-size keeps more",
            args.file.display(),
            trace.cut
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn render(profile: &Profile, format: Format, data_name: &str) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Json => {
            let mut text = serde_json::to_vec_pretty(&json::report(profile))?;
            text.push(b'\n');
            text
        }
        Format::Lcov => lcov(profile).into_bytes(),
        Format::Folded => (crate::report::flame::folded(profile, None, 0)?.join("\n") + "\n").into_bytes(),
        Format::Pprof => gzip(&crate::report::pprof::encode(profile)?)?,
        Format::GcovJson => gzip(&serde_json::to_vec(&gcov_json(profile, data_name))?)?,
        Format::ChromeTrace => chrome_trace::render(profile, trace(profile)?)?,
        Format::Speedscope => speedscope::render(profile, trace(profile)?)?,
        Format::Firefox => firefox::render(profile, trace(profile)?)?,
    })
}

fn trace(profile: &Profile) -> Result<&Trace> {
    profile.trace.as_ref().context("the profile has no trace; record it with --trace")
}

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(bytes)?;
    gz.finish()
}

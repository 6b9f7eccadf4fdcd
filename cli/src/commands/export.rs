//! `proftap export`: a profile in the formats other tools read.

use crate::report::coverage::{gcov_json, lcov};
use crate::report::json;
use anyhow::{Result, bail};
use flate2::Compression;
use flate2::write::GzEncoder;
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
    /// Where to write it.
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
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let profile = proftap_profile::read_profile(&args.file)?;
    if matches!(args.format, Format::Lcov | Format::GcovJson) && profile.lines.is_empty() {
        bail!("{} has no line counts; record it with --lines", args.file.display());
    }
    let data_name = args.file.display().to_string();
    proftap_profile::write_atomically(&args.output, |out| match args.format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &json::report(&profile))?;
            std::io::Write::write_all(out, b"\n")
        }
        Format::Lcov => std::io::Write::write_all(out, lcov(&profile).as_bytes()),
        Format::Folded => {
            let lines = crate::report::flame::folded(&profile, None, 0);
            std::io::Write::write_all(out, (lines.join("\n") + "\n").as_bytes())
        }
        Format::Pprof => {
            let mut gz = GzEncoder::new(out, Compression::default());
            std::io::Write::write_all(&mut gz, &crate::report::pprof::encode(&profile))?;
            gz.finish().map(drop)
        }
        Format::GcovJson => {
            let mut gz = GzEncoder::new(out, Compression::default());
            serde_json::to_writer(&mut gz, &gcov_json(&profile, &data_name))?;
            gz.finish().map(drop)
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

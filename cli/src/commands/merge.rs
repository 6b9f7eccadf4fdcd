//! `proftap merge`: profiles of several runs added into one.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap merge`.
#[derive(clap::Args)]
pub struct Args {
    /// Profiles of the same build of a program.
    #[arg(required = true, num_args = 2..)]
    files: Vec<PathBuf>,
    /// Where to write the sum (`-`: standard output).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: PathBuf,
    /// Merge profiles of different builds too.
    #[arg(long)]
    force: bool,
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let mut merged = proftap_profile::read_profile(&args.files[0])?;
    for file in &args.files[1..] {
        let profile = proftap_profile::read_profile(file)?;
        merged.merge(&profile, args.force).with_context(|| format!("cannot merge {} into {}", file.display(), args.files[0].display()))?;
    }
    // Inputs within the limits readers keep can add up past them.
    merged.validate().map_err(|e| anyhow::anyhow!("the merged profile would be refused by readers ({e}); merge fewer profiles"))?;
    crate::output::write_output(&args.output, |out| proftap_profile::write_profile_to(out, &merged))?;
    let into = if crate::output::is_stdout(&args.output) { "standard output".into() } else { args.output.display().to_string() };
    eprintln!("proftap: {} profiles ({} runs) merged into {into}", args.files.len(), merged.runs);
    Ok(ExitCode::SUCCESS)
}

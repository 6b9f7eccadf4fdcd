//! `proftap gcov`: line counts as gcov's own `.gcov` text files.

use crate::report::coverage::{BranchOutput, by_file, gcov_file_names, gcov_text, lower_bounds_warning};
use crate::sources::read_source;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `proftap gcov`.
#[derive(clap::Args)]
pub struct Args {
    /// A profile recorded with --lines.
    file: PathBuf,
    /// Where to write the .gcov files (created if missing).
    #[arg(short = 'o', long = "output-dir", value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// List each line's branches (its conditional jumps' arcs) with how
    /// often each was taken, in percent, as `gcov -b` does.
    #[arg(short = 'b', long = "branch-probabilities")]
    branch_probabilities: bool,
    /// With -b, counts instead of percentages (`gcov -c`).
    #[arg(short = 'c', long = "branch-counts", requires = "branch_probabilities")]
    branch_counts: bool,
}

/// Runs the command. Each source's `.gcov` file is named after it but
/// always lands in DIR (see `gcov_file_names`); the source text is read
/// with the invoking user's rights (see `crate::sources`).
pub fn run(args: Args) -> Result<ExitCode> {
    let profile = proftap_profile::read_profile(&args.file)?;
    if profile.lines.is_empty() {
        bail!("{} has no line counts; record it with --lines", args.file.display());
    }
    output_dir(&args.dir)?;
    let files = by_file(&profile);
    let data_name = args.file.display().to_string();
    let branches = match (args.branch_probabilities, args.branch_counts) {
        (false, _) => BranchOutput::Hidden,
        (true, false) => BranchOutput::Percent,
        (true, true) => BranchOutput::Counts,
    };
    let mut unnamed = Vec::new();
    for (file, name) in files.iter().zip(gcov_file_names(&files)) {
        let Some(name) = name else {
            unnamed.push(file.path);
            continue;
        };
        let source = read_source(file.path)
            .map_err(|e| eprintln!("proftap: warning: cannot read {:?} ({e}); its .gcov file has counts without source", file.path))
            .ok();
        let text = gcov_text(&profile, file, source.as_deref(), &data_name, branches);
        let name = format!("{name}.gcov");
        proftap_profile::write_in_dir(&args.dir, name.as_ref(), |w| w.write_all(text.as_bytes()))?;
        println!("{}", args.dir.join(name).display());
    }
    if let Some(warning) = lower_bounds_warning(&profile) {
        eprintln!("{warning}");
    }
    if unnamed.len() == files.len() {
        bail!("no source file of {} has a name a .gcov file can take (empty, too long, or taken by another)", args.file.display());
    }
    if !unnamed.is_empty() {
        let shown: Vec<String> = unnamed.iter().take(3).map(|p| format!("{p:?}")).collect();
        eprintln!(
            "proftap: warning: {} source {} no .gcov file, the name being empty, too long or taken by another: {}{}",
            unnamed.len(),
            if unnamed.len() == 1 { "file has" } else { "files have" },
            shown.join(", "),
            if unnamed.len() > 3 { ", ..." } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes sure `dir` is a directory, creating it when missing.
fn output_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create the directory {}", dir.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot use {} as the output directory", dir.display())),
    }
}

//! `proftap gcov`: line counts as gcov's own `.gcov` text files.

use crate::report::coverage::{by_file, gcov_text};
use anyhow::{Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `proftap gcov`.
#[derive(clap::Args)]
pub struct Args {
    /// A profile recorded with --lines.
    file: PathBuf,
    /// Where to write the .gcov files.
    #[arg(short = 'o', long = "output-dir", value_name = "DIR", default_value = ".")]
    dir: PathBuf,
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let profile = proftap_profile::read_profile(&args.file)?;
    if profile.lines.is_empty() {
        bail!("{} has no line counts; record it with --lines", args.file.display());
    }
    if !args.dir.is_dir() {
        bail!("{} is not a directory", args.dir.display());
    }
    let files = by_file(&profile);
    // Like gcov: SOURCE.gcov by file name, or the whole path mangled when
    // two sources share a name.
    let mut names: HashMap<String, usize> = HashMap::new();
    for f in &files {
        *names.entry(file_name(f.path)).or_default() += 1;
    }
    let data_name = args.file.display().to_string();
    for file in &files {
        let source = std::fs::read_to_string(file.path).ok();
        if source.is_none() {
            eprintln!("proftap: warning: cannot read {}; its .gcov file has counts without source", file.path);
        }
        let name = file_name(file.path);
        let out_name = if names[&name] > 1 { file.path.trim_start_matches('/').replace('/', "#") } else { name };
        let out = args.dir.join(format!("{out_name}.gcov"));
        let text = gcov_text(&profile, file, source.as_deref(), &data_name);
        proftap_profile::write_atomically(&out, |w| w.write_all(text.as_bytes()))?;
        println!("{}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn file_name(path: &str) -> String {
    Path::new(path).file_name().map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

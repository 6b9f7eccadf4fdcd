//! What every fuzz target shares: its `main` under afl and outside it, the
//! regression test over its committed corpus, and a scratch file for parsers
//! that read from a path. A target is one file in `src/bin/` that defines
//! `fn run(data: &[u8])` and invokes [`target!`]; its corpus is
//! `corpus/<target>/`. See `docs/FUZZING.md`.

use std::path::{Path, PathBuf};

/// Makes the binary of a fuzz target from its `run` function.
///
/// Built by `cargo afl build`, it is the afl harness (persistent mode: many
/// inputs per process, a panic is a crash). Built by plain cargo, it runs
/// `run` on each file (or every file of each directory) named on its command
/// line, or on standard input: the way to replay a crash under a debugger.
/// Under `cargo test` it runs `run` on every file of `corpus/<target>/`.
#[macro_export]
macro_rules! target {
    ($run:path) => {
        #[cfg(all(fuzzing, not(test)))]
        fn main() {
            afl::fuzz!(|data: &[u8]| $run(data));
        }

        #[cfg(not(any(fuzzing, test)))]
        fn main() -> std::process::ExitCode {
            $crate::replay(std::env::args_os().skip(1).map(std::path::PathBuf::from).collect(), $run)
        }

        #[cfg(test)]
        #[test]
        fn corpus() {
            $crate::check_corpus(env!("CARGO_BIN_NAME"), $run);
        }
    };
}

/// The committed corpus of `target`.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
}

/// Runs `run` on every file of the target's corpus, naming each first so
/// that a panic says which input caused it.
pub fn check_corpus(target: &str, run: fn(&[u8])) {
    let files = inputs(&[corpus_dir(target)]).unwrap_or_else(|e| panic!("{e}"));
    assert!(!files.is_empty(), "the corpus of {target} is empty: add inputs to {}", corpus_dir(target).display());
    for file in &files {
        eprintln!("{target}: {}", file.display());
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        run(&data);
    }
    eprintln!("{target}: {} inputs, none crashed", files.len());
}

/// Runs `run` on each file of `paths` (directories stand for their files),
/// or on standard input when there are none.
pub fn replay(paths: Vec<PathBuf>, run: fn(&[u8])) -> std::process::ExitCode {
    use std::io::Read;
    if paths.is_empty() {
        let mut data = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut data) {
            eprintln!("cannot read standard input: {e}");
            return std::process::ExitCode::FAILURE;
        }
        run(&data);
        return std::process::ExitCode::SUCCESS;
    }
    let files = match inputs(&paths) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    for file in files {
        eprintln!("{}", file.display());
        match std::fs::read(&file) {
            Ok(data) => run(&data),
            Err(e) => {
                eprintln!("cannot read {}: {e}", file.display());
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

/// The files named, with each directory replaced by its files in name order.
fn inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
        let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// Writes `data` to a file alone in a fresh directory of its own and runs
/// `read` on its path. The directory is empty otherwise, so a parser that
/// looks for files beside its input (debug links) finds nothing by chance;
/// both are removed afterwards so that millions of runs leave nothing.
pub fn with_file<T>(name: &str, data: &[u8], read: impl FnOnce(&Path) -> T) -> T {
    let dir = std::env::temp_dir().join(format!("proftap-fuzz-{}", std::process::id()));
    // A crashed run of this process id may have left it behind.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    let result = read(&path);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The profile file an input stands for. An input that starts with the file
/// header is a whole file; any other input is the JSON inside one, compressed
/// here, so that mutations reach the model instead of dying in the gzip
/// checksum.
pub fn profile_file(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::io::Write;
    if data.starts_with(b"proftap-profile") {
        return data.into();
    }
    let mut out = format!("proftap-profile {}\n", proftap_profile::FORMAT_VERSION).into_bytes();
    let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
    // Writing to memory cannot fail.
    let _ = gz.write_all(data).and_then(|()| gz.finish().map(drop));
    out.into()
}

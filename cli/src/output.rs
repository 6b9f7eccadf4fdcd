//! Shared pieces of output: error sentences, writing files atomically.

use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// One line for the user: the error and its causes, without repeating a
/// cause the message already states.
pub fn error_sentence(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Writes `path` through a temporary file in the same directory and a rename,
/// so a failure never leaves a half-written file behind.
#[allow(dead_code)]
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut out = std::io::BufWriter::new(file);
        write(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error()).with_context(|| format!("cannot write {}", path.display()))?;
        file.sync_all().with_context(|| format!("cannot write {}", path.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

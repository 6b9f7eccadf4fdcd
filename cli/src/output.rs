//! Shared pieces of output.

use std::io::Write;
use std::path::Path;

/// One line for the user: the error and its causes, without repeating a
/// cause the message already states. Control characters an error quotes
/// (from a file's names, say) are escaped to keep it one line.
pub fn error_sentence(error: &anyhow::Error) -> String {
    proftap_record::error::sentence(error.as_ref())
}

/// Whether an `-o` argument means standard output.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Writes an output named by `-o`: `-` is standard output (a reader that
/// stops early is no error), anything else a file written atomically.
pub fn write_output(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> anyhow::Result<()> {
    if !is_stdout(path) {
        return Ok(proftap_profile::write_atomically(path, write)?);
    }
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    match write(&mut stdout).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("cannot write to standard output: {e}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentence_stays_one_line() {
        let error = anyhow::anyhow!("p.profile has no metric 'wall'; it has: a\nb").context("cannot draw p.profile");
        assert_eq!(error_sentence(&error), "cannot draw p.profile: p.profile has no metric 'wall'; it has: a\\nb");
    }
}

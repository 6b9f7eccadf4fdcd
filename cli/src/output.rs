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

/// How wide standard output is, when it is a terminal (`COLUMNS` first, as
/// shells set it; then the terminal's own size). `None` for pipes and
/// files: their readers get every column.
pub fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.parse::<usize>().ok()).filter(|&c| c > 0);
    columns.or_else(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
}

/// Shows a report: through a pager when standard output is a terminal
/// (`PAGER`, else `less` with `LESS=FRX` unless set, as git does; `cat` or
/// an empty `PAGER`, or `no_pager`, for none), else written out. A reader
/// that stops early is no error.
pub fn show(text: &str, no_pager: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let pager = std::env::var("PAGER").unwrap_or_else(|_| "less".to_string());
    if no_pager || !std::io::stdout().is_terminal() || pager.trim().is_empty() || pager.trim() == "cat" {
        return write_output(Path::new("-"), |out| out.write_all(text.as_bytes()));
    }
    let mut command = std::process::Command::new("sh");
    command.args(["-c", &pager]).stdin(std::process::Stdio::piped());
    if std::env::var_os("LESS").is_none() {
        command.env("LESS", "FRX");
    }
    let Ok(mut child) = command.spawn() else {
        return write_output(Path::new("-"), |out| out.write_all(text.as_bytes()));
    };
    if let Some(mut input) = child.stdin.take() {
        // The pager quitting before the end is the user's choice.
        let _ = input.write_all(text.as_bytes());
    }
    child.wait().map_err(|e| anyhow::anyhow!("cannot wait for the pager '{pager}': {e}"))?;
    Ok(())
}

/// `text` cut to `width` characters by taking out its middle: the start
/// and the end of a name tell the most (`std::collections::…::insert`).
pub fn shorten_middle(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width || width < 3 {
        return text.to_string();
    }
    let head = (width - 1) / 2;
    let tail = width - 1 - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_shortened_in_the_middle() {
        assert_eq!(shorten_middle("std::collections::hash_map::HashMap::insert", 20), "std::coll…ap::insert");
        assert_eq!(shorten_middle("std::collections::hash_map::HashMap::insert", 20).chars().count(), 20);
        assert_eq!(shorten_middle("main", 20), "main");
    }

    #[test]
    fn a_sentence_stays_one_line() {
        let error = anyhow::anyhow!("p.profile has no metric 'wall'; it has: a\nb").context("cannot draw p.profile");
        assert_eq!(error_sentence(&error), "cannot draw p.profile: p.profile has no metric 'wall'; it has: a\\nb");
    }
}

//! Errors of the probes library. Every message is a sentence a user can act on.

use std::path::PathBuf;

/// What can go wrong reading a binary, its debug info or a process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The path names a directory.
    #[error("{} is a directory, not an executable or shared library", path.display())]
    IsDirectory {
        /// The path.
        path: PathBuf,
    },
    /// The path names a FIFO, socket or device, which is never read.
    #[error("{} is a {what}, not an executable or shared library; give a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// The file is not an ELF file, or its headers are damaged.
    #[error("{} is not a valid ELF file ({reason}); give an executable or shared library", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The ELF file is for an architecture or class proftap does not handle.
    #[error("{} is a {what} ELF file; proftap handles 64-bit little-endian x86-64 and AArch64 binaries", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: String,
    },
    /// Neither a symbol table nor debug info was found.
    #[error("{} has no symbols: no .symtab, no .dynsym functions and no debug info (looked for separate debug info by build-id and .gnu_debuglink too){detail}; install its debug package or rebuild without stripping", path.display())]
    NoSymbols {
        /// The file.
        path: PathBuf,
        /// Debug files found and rejected, starting with "; " when present.
        detail: String,
    },
    /// The DWARF data could not be parsed.
    #[error("the debug info of {} is damaged: {reason}", path.display())]
    BadDwarf {
        /// The file the DWARF came from.
        path: PathBuf,
        /// What gimli said.
        reason: String,
    },
    /// A function pattern is malformed.
    #[error("invalid function pattern '{pattern}': {reason}")]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// Why.
        reason: String,
    },
    /// A function pattern selected nothing.
    #[error("pattern '{pattern}' matches no function in {}{hint}", binary.display())]
    NoMatch {
        /// The pattern as given.
        pattern: String,
        /// The binary (or binaries) searched.
        binary: PathBuf,
        /// A hint, starting with "; " when present.
        hint: String,
    },
    /// A process does not exist.
    #[error("no process with PID {pid} exists")]
    NoSuchProcess {
        /// The PID.
        pid: i32,
    },
    /// A process has no executable: a kernel thread, or a process exiting.
    #[error("process {pid} has no executable (a kernel thread, or a process that is exiting): there is no code to probe")]
    NoExecutable {
        /// The PID.
        pid: i32,
    },
    /// A process's files could not be read.
    #[error("cannot read {} of process {pid}: {source}{hint}", path.display())]
    Process {
        /// The PID.
        pid: i32,
        /// The file under /proc.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
        /// A hint, starting with "; " when present.
        hint: String,
    },
}

/// Result with the probes [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

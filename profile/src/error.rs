//! Why a profile file could not be read or written.

use std::path::PathBuf;

/// Why a profile file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The file could not be opened, read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// "read", "write", ...
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a profile.
    #[error("{} is not a proftap profile (it does not start with the proftap-profile header)", path.display())]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// The file was written by a newer proftap.
    #[error("{} is a format {version} profile from a newer proftap; this proftap reads format {reads} and older", path.display())]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its format version.
        version: u32,
        /// The newest format this proftap reads.
        reads: u32,
    },
    /// The file decompresses to more than a profile may hold.
    #[error("{} holds more than {} MiB of profile data once decompressed, more than proftap reads", path.display(), limit >> 20)]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The file is damaged or cut short.
    #[error("{} is damaged or truncated ({reason}); record it again", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

//! The profile file: a text header line naming the format and its version,
//! then the profile as gzip-compressed JSON. See `docs/FORMAT.md`.

use crate::model::Profile;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// The version this code writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &str = "proftap-profile";

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
    #[error("{} is a format {version} profile from a newer proftap; this proftap reads format {FORMAT_VERSION} and older", path.display())]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its format version.
        version: u32,
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

/// Reads a profile file.
pub fn read_profile(path: &Path) -> Result<Profile, FileError> {
    let file = std::fs::File::open(path).map_err(|source| FileError::Io { action: "read", path: path.into(), source })?;
    let mut reader = BufReader::new(file);
    let mut header = Vec::new();
    reader.by_ref().take(64).read_until(b'\n', &mut header).map_err(|source| FileError::Io {
        action: "read",
        path: path.into(),
        source,
    })?;
    let header = String::from_utf8_lossy(&header);
    let Some(version) = header.trim_end().strip_prefix(MAGIC).and_then(|v| v.trim().parse::<u32>().ok()) else {
        return Err(FileError::Foreign { path: path.into() });
    };
    if version > FORMAT_VERSION {
        return Err(FileError::Newer { path: path.into(), version });
    }
    let mut json = Vec::new();
    GzDecoder::new(reader).read_to_end(&mut json).map_err(|e| FileError::Damaged { path: path.into(), reason: e.to_string() })?;
    serde_json::from_slice(&json).map_err(|e| FileError::Damaged { path: path.into(), reason: e.to_string() })
}

/// Writes a profile file atomically.
pub fn write_profile(path: &Path, profile: &Profile) -> Result<(), FileError> {
    write_atomically(path, |out| write_profile_to(out, profile))
}

/// Writes a profile file's bytes to `out`.
pub fn write_profile_to(out: &mut dyn Write, profile: &Profile) -> std::io::Result<()> {
    writeln!(out, "{MAGIC} {FORMAT_VERSION}")?;
    let mut gz = GzEncoder::new(out, Compression::default());
    serde_json::to_writer(&mut gz, profile).map_err(std::io::Error::from)?;
    gz.finish()?;
    Ok(())
}

/// Writes `path` through a temporary file in the same directory and a rename,
/// so that no failure leaves a half-written file behind.
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    let io = |source| FileError::Io { action: "write", path: path.into(), source };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| io(std::io::Error::other("the path names no file")))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::new(file);
        write(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FunctionInfo, Target};

    fn sample() -> Profile {
        Profile {
            target: Target { command: vec!["./prog".into()], pid: 42, ..Target::default() },
            metrics: vec!["wall_ns".into()],
            functions: vec![FunctionInfo { name: "f".into(), ..FunctionInfo::default() }],
            ..Profile::default()
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.proftap");
        write_profile(&path, &sample()).expect("write");
        let back = read_profile(&path).expect("read");
        assert_eq!(back.target.pid, 42);
        assert_eq!(back.functions[0].name, "f");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }

    #[test]
    fn damaged_foreign_and_newer_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.proftap");
        write_profile(&path, &sample()).expect("write");
        let bytes = std::fs::read(&path).expect("read");

        std::fs::write(&path, &bytes[..bytes.len() - 10]).expect("write");
        let err = read_profile(&path).expect_err("truncated");
        assert!(matches!(err, FileError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("damaged or truncated"));

        std::fs::write(&path, b"hello\n").expect("write");
        assert!(matches!(read_profile(&path), Err(FileError::Foreign { .. })));

        let mut newer = b"proftap-profile 99\n".to_vec();
        newer.extend_from_slice(&bytes[bytes.iter().position(|&b| b == b'\n').expect("header") + 1..]);
        std::fs::write(&path, newer).expect("write");
        let err = read_profile(&path).expect_err("newer");
        assert!(err.to_string().contains("format 99"), "{err}");

        let err = read_profile(&dir.path().join("missing")).expect_err("missing");
        assert!(err.to_string().starts_with("cannot read"), "{err}");
    }

    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out");
        let err = write_atomically(&path, |_| Err(std::io::Error::other("boom"))).expect_err("fails");
        assert!(err.to_string().contains("boom"));
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }
}

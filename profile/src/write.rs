//! Writing an output file so that no failure leaves half of it, and no link
//! another user planted where proftap (often root) writes redirects it.
//!
//! - A new file's content goes to a temporary file created exclusively
//!   (`O_CREAT|O_EXCL`, a random name: a link or file planted at any name
//!   makes the creation pick another, never write through it) in the
//!   destination's directory, is synced, then renamed over the destination.
//! - A destination that is a symbolic link is written through to what it
//!   points to: the link is resolved and the temporary file is renamed over
//!   the file it names, in that file's directory; the link stays.
//! - A destination that exists and is neither a regular file nor a
//!   directory (a terminal, `/dev/null`, `/dev/stdout`, a FIFO) is opened
//!   and written, never replaced.

use crate::error::FileError;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The mode of a new output file (less the umask).
const PUBLIC: u32 = 0o644;

/// The mode of a new file only its owner may read (less the umask).
const PRIVATE: u32 = 0o600;

/// Links followed at most while resolving a destination, as the kernel does.
const MAX_LINKS: usize = 40;

/// Writes `path` through a temporary file in the same directory and a
/// rename, so that no failure leaves a half-written file behind; a new file
/// is readable by all (0644 less the umask). See the module documentation
/// for links, devices and FIFOs.
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    write_file(path, PUBLIC, write)
}

/// As [`write_atomically`], but a new file is readable by its owner only
/// (0600 less the umask): for state a service keeps.
pub fn write_private(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    write_file(path, PRIVATE, write)
}

/// Checks that [`write_atomically`] could write `path` now: that a
/// temporary file can be made beside what it would replace. Checked before
/// a recording starts, so that a profile is not lost to a path that could
/// never take it. A device or a FIFO is opened only when written.
pub fn check_writable(path: &Path) -> Result<(), FileError> {
    let io = |source| FileError::Io { action: "write", path: path.into(), source };
    match destination(path).map_err(io)? {
        Destination::Through => Ok(()),
        Destination::Replace(target) => {
            temporary_beside(&target, PUBLIC).map(drop).map_err(io)?;
            replaceable(&target).map_err(io)
        }
    }
}

/// The directory `target` is in.
fn directory_of(target: &Path) -> &Path {
    match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Whether the rename over `target` would be allowed: in a directory with
/// the sticky bit (`/tmp`), a file of another user may be replaced by the
/// directory's owner or root only.
fn replaceable(target: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(file) = target.symlink_metadata() else { return Ok(()) };
    let dir = directory_of(target).metadata()?;
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    let sticky = dir.mode() & libc::S_ISVTX != 0;
    if sticky && me != 0 && file.uid() != me && dir.uid() != me {
        return Err(std::io::Error::new(
            ErrorKind::PermissionDenied,
            "it belongs to another user, in a directory whose sticky bit lets only its owner replace it",
        ));
    }
    Ok(())
}

/// Writes the file `name` in `dir` atomically (0644 less the umask),
/// replacing whatever entry has that name, a link or a FIFO included,
/// without ever writing through it: for files whose names come from
/// untrusted input. `name` must be one plain file name.
pub fn write_in_dir(dir: &Path, name: &OsStr, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    let path = dir.join(name);
    let mut components = Path::new(name).components();
    let plain = matches!((components.next(), components.next()), (Some(Component::Normal(_)), None))
        && !name.as_bytes().contains(&b'/')
        && !name.as_bytes().contains(&0);
    if !plain {
        let source = std::io::Error::new(ErrorKind::InvalidInput, "its name is not one plain file name");
        return Err(FileError::Io { action: "write", path, source });
    }
    replace(&path, PUBLIC, write).map_err(|source| FileError::Io { action: "write", path, source })
}

fn write_file(path: &Path, mode: u32, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    let io = |source| FileError::Io { action: "write", path: path.into(), source };
    match destination(path).map_err(io)? {
        Destination::Through => write_through(path, write).map_err(io),
        Destination::Replace(target) => replace(&target, mode, write).map_err(io),
    }
}

/// How a destination is written.
enum Destination {
    /// Opened and written in place: a device, a FIFO.
    Through,
    /// Replaced by a rename: this path, a regular file or none yet.
    Replace(PathBuf),
}

fn is_link(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
}

fn destination(path: &Path) -> std::io::Result<Destination> {
    // Following links the kernel's way, so that /dev/stdout reaches the
    // pipe or terminal behind it and fs.protected_symlinks applies.
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(std::io::Error::new(ErrorKind::IsADirectory, "it is a directory")),
        Ok(m) if !m.is_file() => Ok(Destination::Through),
        Ok(_) if is_link(path) => Ok(Destination::Replace(std::fs::canonicalize(path)?)),
        Err(e) if e.kind() == ErrorKind::NotFound && is_link(path) => Ok(Destination::Replace(dangling_target(path)?)),
        Ok(_) => Ok(Destination::Replace(path.to_path_buf())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Destination::Replace(path.to_path_buf())),
        Err(e) => Err(e),
    }
}

/// The file a link to a file not yet created names.
fn dangling_target(path: &Path) -> std::io::Result<PathBuf> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::read_link(&at) {
            Ok(next) => at = at.parent().map_or_else(|| next.clone(), |dir| dir.join(&next)),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidInput) => return Ok(at),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

fn write_through(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
    let file = OpenOptions::new().write(true).custom_flags(libc::O_NOCTTY).open(path)?;
    // Replaced by a regular file since it was looked at: writing it in place
    // would leave old bytes after ours.
    if file.metadata()?.is_file() {
        return Err(std::io::Error::other("it changed into a regular file while being opened"));
    }
    let mut out = BufWriter::new(file);
    write(&mut out)?;
    out.flush()
}

/// A new temporary file (`mode` less the umask) in the directory of
/// `target`, named after it; removed when dropped.
fn temporary_beside(target: &Path, mode: u32) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = directory_of(target);
    let name = target.file_name().ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let prefix = temporary_prefix(name);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp").permissions(std::fs::Permissions::from_mode(mode));
    builder.tempfile_in(dir).map_err(|e| {
        // The error names the temporary file, a random name the user never
        // gave: name the directory instead.
        let text = e.to_string();
        let why = text.split(" at path ").next().unwrap_or_default();
        std::io::Error::new(e.kind(), format!("cannot make a file in {}: {why}", dir.display()))
    })
}

fn replace(target: &Path, mode: u32, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
    let tmp = temporary_beside(target, mode)?;
    let mut out = BufWriter::new(tmp.as_file());
    write(&mut out)?;
    out.flush()?;
    drop(out);
    tmp.as_file().sync_all()?;
    // On failure the temporary file is removed as it is dropped.
    tmp.persist(target).map(drop::<File>).map_err(|e| e.error)
}

/// `.NAME.`, with NAME cut so that the temporary name stays within the
/// 255 bytes a file name may have.
fn temporary_prefix(name: &OsStr) -> OsString {
    let bytes = name.as_bytes();
    let mut prefix = OsString::from(".");
    prefix.push(OsStr::from_bytes(&bytes[..bytes.len().min(200)]));
    prefix.push(".");
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, symlink};

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    fn write(path: &Path, text: &str) -> Result<(), FileError> {
        write_atomically(path, |out| out.write_all(text.as_bytes()))
    }

    #[test]
    fn links_planted_at_temporary_names_are_not_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let pid = std::process::id();
        for planted in [format!(".out.{pid}.tmp"), ".out.tmp".into(), "out.tmp".into(), ".out".into(), "out~".into()] {
            symlink(&victim, dir.path().join(planted)).expect("plant");
        }
        let out = dir.path().join("out");
        write(&out, "report").expect("written");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "precious");
        assert_eq!(std::fs::read_to_string(&out).expect("out"), "report");
        assert!(!is_link(&out));
        // Nothing but the output is added.
        assert_eq!(entries(dir.path()), vec![".out", format!(".out.{pid}.tmp").as_str(), ".out.tmp", "out", "out.tmp", "out~", "victim"]);
    }

    #[test]
    fn a_link_is_written_through_and_stays_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let real = elsewhere.path().join("real.svg");
        std::fs::write(&real, "old").expect("real");
        let link = dir.path().join("out.svg");
        symlink(&real, &link).expect("link");
        write(&link, "new").expect("written");
        assert!(is_link(&link));
        assert_eq!(std::fs::read_to_string(&real).expect("real"), "new");
        assert_eq!(entries(elsewhere.path()), vec!["real.svg"]);
        assert_eq!(entries(dir.path()), vec!["out.svg"]);

        // A link to a file not yet there creates it; a relative link is
        // relative to the link's directory.
        symlink("fresh.svg", dir.path().join("new.svg")).expect("link");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        let nested = dir.path().join("sub/link.svg");
        symlink("../new.svg", &nested).expect("link");
        write(&nested, "fresh").expect("written");
        assert_eq!(std::fs::read_to_string(dir.path().join("fresh.svg")).expect("fresh"), "fresh");
        assert_eq!(entries(dir.path()), vec!["fresh.svg", "new.svg", "out.svg", "sub"]);
    }

    #[test]
    fn devices_and_fifos_are_written_in_place() {
        write(Path::new("/dev/null"), "nothing").expect("written");
        assert!(std::fs::metadata("/dev/null").expect("null").file_type().is_char_device());

        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).expect("read the fifo"))
        };
        write(&fifo, "through the pipe").expect("written");
        assert_eq!(reader.join().expect("reader"), "through the pipe");
        assert!(std::fs::metadata(&fifo).expect("fifo").file_type().is_fifo());
        assert_eq!(entries(dir.path()), vec!["fifo"]);
    }

    #[test]
    fn failures_leave_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("out");
        symlink(elsewhere.path().join("real"), &link).expect("link");
        let err = write_atomically(&link, |_| Err(std::io::Error::other("boom"))).expect_err("fails");
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(entries(elsewhere.path()), Vec::<String>::new());
        assert_eq!(entries(dir.path()), vec!["out"]);

        let err = write(dir.path(), "x").expect_err("a directory");
        assert!(err.to_string().ends_with("it is a directory"), "{err}");
        assert_eq!(entries(dir.path()), vec!["out"]);
    }

    #[test]
    fn a_path_is_checked_as_it_would_be_written_and_left_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        check_writable(&dir.path().join("new.profile")).expect("a new file in a directory");
        assert_eq!(entries(dir.path()), Vec::<String>::new());
        let err = check_writable(&dir.path().join("missing/x.profile")).expect_err("no such directory");
        assert!(err.to_string().contains("missing/x.profile"), "{err}");
        let err = check_writable(dir.path()).expect_err("a directory");
        assert!(err.to_string().ends_with("it is a directory"), "{err}");
        check_writable(Path::new("/dev/null")).expect("a device");
        let link = dir.path().join("out");
        symlink(dir.path().join("nowhere/real"), &link).expect("link");
        check_writable(&link).expect_err("a link into no directory");
        assert_eq!(entries(dir.path()), vec!["out"]);
    }

    #[test]
    fn new_files_are_public_or_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (public, private) = (dir.path().join("public"), dir.path().join("private"));
        write(&public, "a").expect("written");
        write_private(&private, |out| out.write_all(b"b")).expect("written");
        let mode = |p: &Path| std::fs::metadata(p).expect("mode").permissions().mode() & 0o777;
        // The umask may take bits away, never add them.
        assert_eq!(mode(&public) & !PUBLIC, 0);
        assert_eq!(mode(&public) & 0o600, 0o600);
        assert_eq!(mode(&private), 0o600);
    }

    #[test]
    fn names_in_a_directory_are_confined_and_replace_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        symlink(&victim, dir.path().join("a.gcov")).expect("plant");
        write_in_dir(dir.path(), OsStr::new("a.gcov"), |out| out.write_all(b"counts")).expect("written");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "precious");
        assert!(!is_link(&dir.path().join("a.gcov")));
        assert_eq!(std::fs::read_to_string(dir.path().join("a.gcov")).expect("out"), "counts");
        for bad in ["", ".", "..", "../x", "/etc/x", "a/b", "x\0y"] {
            let err = write_in_dir(dir.path(), OsStr::new(bad), |out| out.write_all(b"no")).expect_err(bad);
            assert!(err.to_string().ends_with("its name is not one plain file name"), "{err}");
        }
        assert_eq!(entries(dir.path()), vec!["a.gcov", "victim"]);
    }
}

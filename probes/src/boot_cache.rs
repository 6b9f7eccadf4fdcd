//! State proftap keeps for the rest of a boot (a probe's measured cost, the
//! kernel's symbols): where, and which boot it is of.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A directory only this user can write to (`/run/proftap` for root,
/// `$XDG_RUNTIME_DIR` for others), or none: a shared directory such as
/// /tmp would let another user plant the file proftap reads.
pub fn dir() -> Option<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        Some(PathBuf::from("/run/proftap"))
    } else {
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
    }
}

/// This boot's id (empty when the kernel does not say).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string()
}

/// The name a file of what was read of `version` of a file is kept
/// under, in a directory of such files.
pub fn file_name(version: &crate::symbols::FileVersion) -> String {
    format!("{:x}-{:x}", version.device(), version.inode())
}

/// Whether `name` is one [`file_name`] gives.
pub fn is_file_name(name: &str) -> bool {
    name.split_once('-')
        .is_some_and(|(device, inode)| [device, inode].iter().all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_hexdigit())))
}

/// A hash of `bytes` at compile time: of the code whose results are kept,
/// so that what another build of it kept is not read back.
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Hashes made by [`fnv1a`] as one, in order.
pub const fn combined(hashes: &[u64]) -> u64 {
    let (mut hash, mut i) = (0u64, 0);
    while i < hashes.len() {
        hash = hash.rotate_left(13) ^ hashes[i];
        i += 1;
    }
    hash
}

/// A file changed this recently is read and not kept: file times are
/// kept at the kernel's clock tick, so a change within the same tick as
/// the read would not change them (git's "racily clean" files).
pub const SETTLED_NS: i128 = 2_000_000_000;

/// Whether a file last changed at `changed_ns` (since 1970) changed more
/// than `settled_ns` ago.
pub fn settled(changed_ns: i128, settled_ns: i128) -> bool {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
    changed_ns < now - settled_ns
}

/// Whether `dir` (made if missing) is this user's alone, not a link, in a
/// directory only this user or root may write: no one else can plant,
/// swap or read what is kept there.
pub fn private_dir(dir: &Path) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    let parent = dir.parent().and_then(|p| std::fs::symlink_metadata(p).ok());
    if !parent.is_some_and(|p| p.is_dir() && (p.uid() == me || p.uid() == 0) && p.mode() & 0o022 == 0) {
        return false;
    }
    let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    std::fs::symlink_metadata(dir).is_ok_and(|d| d.is_dir() && d.uid() == me && d.mode() & 0o077 == 0)
}

/// Removes `dir` and what it holds, if it is a directory (not a link) of
/// this user's: what an earlier build kept under another name.
pub fn remove_own_dir(dir: &Path) {
    let me = nix::unistd::geteuid().as_raw();
    if std::fs::symlink_metadata(dir).is_ok_and(|d| d.is_dir() && d.uid() == me) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A kept file's bytes, if this user owns it, no one else may write it,
/// and it holds at most `most_bytes`.
pub fn read_private(path: &Path, most_bytes: u64) -> Option<Vec<u8>> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 || meta.len() > most_bytes {
        return None;
    }
    let mut bytes = Vec::new();
    (&file).take(most_bytes).read_to_end(&mut bytes).ok()?;
    // Used now: [`trim`] takes out the files least recently used first.
    let _ = file.set_modified(SystemTime::now());
    Some(bytes)
}

/// Writes `bytes` at `path` (whole or not at all, readable by this user
/// only), then takes out the least recently used files beside it that
/// `is_kept_name` names while they hold more than `most_bytes` together. Failing to
/// keep only costs the next recording a read.
pub fn keep(path: &Path, bytes: &[u8], most_bytes: u64, is_kept_name: fn(&str) -> bool) {
    let Some(dir) = path.parent() else { return };
    if proftap_profile::write_private(path, |out| out.write_all(bytes)).is_ok() {
        trim(dir, path, most_bytes, is_kept_name);
    }
}

/// Removes the files of `dir` that `is_kept_name` names, least recently
/// written or read first (never `newest`), while they hold more than
/// `most_bytes` together; nothing else in it.
pub fn trim(dir: &Path, newest: &Path, most_bytes: u64, is_kept_name: fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let me = nix::unistd::geteuid().as_raw();
    let mut kept: Vec<(SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(is_kept_name))
        .filter_map(|e| {
            // Of the entry itself: a link is not followed.
            let meta = e.metadata().ok()?;
            (meta.is_file() && meta.uid() == me).then(|| (meta.modified().unwrap_or(UNIX_EPOCH), meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum();
    kept.sort();
    for (_, len, path) in kept {
        if total <= most_bytes {
            break;
        }
        if path != newest && std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// What the tests of the files kept for the boot share.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::{Path, PathBuf};

    /// The only file kept in `dir`.
    pub fn only_file(dir: &Path) -> PathBuf {
        let files: Vec<PathBuf> = std::fs::read_dir(dir).expect("kept").flatten().map(|e| e.path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files.into_iter().next().expect("one file")
    }

    /// `file` written again with `bytes`, its mode as it was.
    pub fn rewrite(file: &Path, bytes: &[u8]) {
        let mode = std::fs::metadata(file).expect("kept").permissions();
        std::fs::write(file, bytes).expect("write kept");
        std::fs::set_permissions(file, mode).expect("mode");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_kept_file_read_lately_outlives_older_ones_written_later() {
        let dir = tempfile::tempdir().expect("temp dir");
        let names = ["1-a", "1-b", "1-c"];
        for (i, name) in names.iter().enumerate() {
            let path = dir.path().join(name);
            std::fs::write(&path, [0u8; 100]).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            let at = UNIX_EPOCH + std::time::Duration::from_secs(1_000 * (i as u64 + 1));
            std::fs::File::options().write(true).open(&path).expect("open").set_modified(at).expect("touch");
        }
        // The first written is read: the second goes first.
        assert_eq!(read_private(&dir.path().join("1-a"), 1000).map(|b| b.len()), Some(100));
        trim(dir.path(), &dir.path().join("1-c"), 200, is_file_name);
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).expect("dir").flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
        left.sort();
        assert_eq!(left, ["1-a", "1-c"]);
    }

    #[test]
    fn an_own_directory_kept_under_an_old_name_is_removed_and_a_link_is_not_followed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let old = dir.path().join("old");
        std::fs::create_dir(&old).expect("mkdir");
        std::fs::write(old.join("1-a"), b"kept").expect("write");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::write(elsewhere.join("1-b"), b"not kept").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).expect("symlink");
        remove_own_dir(&old);
        remove_own_dir(&link);
        assert!(!old.exists(), "removed");
        assert!(elsewhere.join("1-b").exists(), "what a link points to stays");
    }
}

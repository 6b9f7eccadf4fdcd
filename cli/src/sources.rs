//! Reading the source files a profile names, for `gcov`, `report
//! --lines` and `annotate` (and the debug info of a module it names). A
//! profile is untrusted: it may name `/etc/shadow`, a FIFO that never
//! ends, or a device. So a source is read with the file-system
//! identity of the user who ran proftap, never more:
//!
//! - under sudo (root, with `SUDO_UID` and `SUDO_GID` set), as that user,
//!   with that user's groups;
//! - when the real user differs from the effective one, as the real user;
//! - otherwise as proftap runs.
//!
//! Changing identity takes the kernel's own rules (`setfsuid`, `setfsgid`
//! and the groups) in a thread of its own, which ends with the read: no
//! permission bits are judged by hand, and the rest of proftap keeps its
//! rights. Only regular files of at most [`MAX_SOURCE_BYTES`] are read; a
//! FIFO or device is refused without blocking on it.

use nix::libc;
use nix::unistd::{Gid, Uid};
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::OnceLock;

/// The largest source file shown.
pub const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// The user whose rights reading a source takes.
#[derive(Debug)]
struct User {
    uid: Uid,
    gid: Gid,
    /// Supplementary groups to take, when proftap may set them (as root).
    groups: Option<Vec<Gid>>,
}

/// Reads the source file `path` with the rights of the user who ran
/// proftap; the error says why it was not read.
pub fn read_source(path: &str) -> std::io::Result<String> {
    as_invoking_user(|| read_regular(path))
}

/// Runs `work`, which opens files a profile names, with the file-system
/// rights of the user who ran proftap, in a thread of its own.
pub fn as_invoking_user<T: Send>(work: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<T> {
    match invoking_user() {
        None => work(),
        Some(user) => std::thread::scope(|s| {
            s.spawn(|| become_user(user).and_then(|()| work())).join().unwrap_or_else(|_| Err(std::io::Error::other("reading it failed")))
        }),
    }
}

fn invoking_user() -> Option<&'static User> {
    static USER: OnceLock<Option<User>> = OnceLock::new();
    USER.get_or_init(|| {
        let id = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
        if Uid::effective().is_root()
            && let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID"))
            && uid != 0
        {
            let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
            return Some(User { uid, gid, groups: Some(groups_of(uid, gid)) });
        }
        let (uid, gid) = (Uid::current(), Gid::current());
        (uid != Uid::effective() || gid != Gid::effective()).then_some(User { uid, gid, groups: None })
    })
    .as_ref()
}

/// The groups of a user, as login gives them; only `gid` when the user is
/// unknown to the system.
fn groups_of(uid: Uid, gid: Gid) -> Vec<Gid> {
    let name = nix::unistd::User::from_uid(uid).ok().flatten().and_then(|u| std::ffi::CString::new(u.name).ok());
    name.and_then(|n| nix::unistd::getgrouplist(&n, gid).ok()).unwrap_or_else(|| vec![gid])
}

/// Takes `user`'s file-system identity in the calling thread only.
fn become_user(user: &User) -> std::io::Result<()> {
    if let Some(groups) = &user.groups {
        let groups: Vec<libc::gid_t> = groups.iter().map(|g| g.as_raw()).collect();
        // The raw system call changes this thread's groups only; the C
        // library's setgroups would change every thread's.
        // SAFETY: the pointer and length describe a live slice of gid_t.
        let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    nix::unistd::setfsgid(user.gid);
    nix::unistd::setfsuid(user.uid);
    // setfsuid and setfsgid report no failure: each returns the previous
    // value, so a second call tells whether the first took.
    if nix::unistd::setfsgid(user.gid) != user.gid || nix::unistd::setfsuid(user.uid) != user.uid {
        return Err(std::io::Error::other(format!("proftap cannot take the rights of user {} to read it", user.uid)));
    }
    Ok(())
}

/// Reads a regular file of at most [`MAX_SOURCE_BYTES`]; refuses anything
/// else without blocking on it or reading it.
fn read_regular(path: &str) -> std::io::Result<String> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    // Non-blocking and checked again once open: it may have been replaced
    // by a FIFO or a device since.
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    let too_large = || std::io::Error::other(format!("it is larger than {} MiB", MAX_SOURCE_BYTES >> 20));
    if meta.len() > MAX_SOURCE_BYTES {
        return Err(too_large());
    }
    let mut text = Vec::new();
    file.take(MAX_SOURCE_BYTES + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_SOURCE_BYTES {
        return Err(too_large());
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("a.c");
        std::fs::write(&source, "int main() {}\n").expect("write");
        let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
        assert_eq!(read_regular(&path(&source)).expect("read"), "int main() {}\n");
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
        // Refused at once, though no writer will ever come.
        assert_eq!(read_regular(&path(&fifo)).expect_err("a FIFO").to_string(), "it is not a regular file");
        assert_eq!(read_regular("/dev/zero").expect_err("a device").to_string(), "it is not a regular file");
        assert_eq!(read_regular(&path(dir.path())).expect_err("a directory").to_string(), "it is not a regular file");
    }

    #[test]
    fn another_users_identity_stays_in_its_thread() {
        if !Uid::effective().is_root() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root only").expect("write");
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
        let nobody = User { uid: Uid::from_raw(65534), gid: Gid::from_raw(65534), groups: Some(vec![Gid::from_raw(65534)]) };
        let read = std::thread::spawn(move || become_user(&nobody).and_then(|()| read_regular(secret.to_str().expect("utf-8"))));
        let err = read.join().expect("thread").expect_err("nobody cannot read a file only root reads");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        // This thread is still root.
        assert!(std::fs::read_to_string(dir.path().join("secret")).is_ok());
        assert_eq!(nix::unistd::setfsuid(Uid::from_raw(0)), Uid::from_raw(0));
    }
}

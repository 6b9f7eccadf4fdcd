//! One in-process recording of a process at a time. A second proftap would
//! find the first one's jumps where the file has the function's code, and
//! could only refuse function after function; and its detaching must not
//! take out the other's patches. A recording claims the process by binding
//! an abstract Unix socket named after it (its pid and start time, so that
//! a pid used again is another name): the kernel refuses the name to a
//! second proftap, and frees it when the first one closes it or dies.
//!
//! Any local user may bind any abstract name. The claim is proftap's only
//! when the holder answers as root or as the process's owner (asked with
//! `SO_PEERCRED`, so the holder must listen, as a claim does); any other
//! holder is a squatter's and stops nothing. The claim is there to say so
//! in one sentence: what keeps two recordings' patches apart is that
//! proftap patches only code that is still the file's.

use super::remote::RemoteError;
use crate::procfs;
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, getsockopt, listen, socket, sockopt};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// A claimed process; the claim ends when this is dropped.
#[derive(Debug)]
pub struct RecordingClaim {
    /// None when a squatter holds the name.
    _socket: Option<OwnedFd>,
    /// The name, while this process holds it (see [`HELD_HERE`]).
    name: Option<String>,
}

/// The claims this process holds. A claim it dropped can outlive it for a
/// moment: a child another thread is starting holds a copy of every
/// descriptor from its fork until its exec closes them (`SOCK_CLOEXEC`).
/// Such a holder answers as this process, holding no such claim, and is
/// waited for rather than taken for another recording.
static HELD_HERE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// How long a claim this process dropped may linger in a starting child.
const LINGERING: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for RecordingClaim {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            HELD_HERE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|held| *held != name);
        }
    }
}

/// Connections a claim lets wait: each proftap that asks who holds it
/// leaves one, never accepted, while it lives.
const ASKING: i32 = 64;

impl RecordingClaim {
    /// Claims process `pid`, or says that another proftap records it.
    pub fn take(pid: i32) -> Result<RecordingClaim, RemoteError> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let started = stat
            .as_deref()
            .and_then(procfs::start_time)
            .ok_or_else(|| RemoteError::Unsupported(format!("no process with PID {pid} exists")))?;
        let name = format!("proftap-recording-{pid}-{started}");
        let failed = |what: &str, e: nix::errno::Errno| RemoteError::Io {
            what: format!("cannot {what} a socket to claim process {pid}"),
            source: e.into(),
        };
        let socket = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(|e| failed("make", e))?;
        let address = UnixAddr::new_abstract(name.as_bytes()).map_err(|e| failed("name", e))?;
        let since = std::time::Instant::now();
        loop {
            let mut held_here = HELD_HERE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match bind(socket.as_raw_fd(), &address) {
                Ok(()) => {
                    listen(&socket, Backlog::new(ASKING).unwrap_or(Backlog::MAXCONN)).map_err(|e| failed("listen on", e))?;
                    held_here.push(name.clone());
                    return Ok(RecordingClaim { _socket: Some(socket), name: Some(name) });
                }
                Err(nix::errno::Errno::EADDRINUSE) => match holder(pid, &address) {
                    Holder::ThisProcess if !held_here.contains(&name) && since.elapsed() < LINGERING => {}
                    Holder::Proftap | Holder::ThisProcess => {
                        return Err(RemoteError::Unsupported(
                            "another proftap is recording it already, and its code holds that recording's patches; wait for that recording to end"
                                .into(),
                        ));
                    }
                    Holder::Other => return Ok(RecordingClaim { _socket: None, name: None }),
                },
                Err(e) => return Err(failed("bind", e)),
            }
            drop(held_here);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Who holds a claim's name.
enum Holder {
    /// This process (see [`HELD_HERE`]).
    ThisProcess,
    /// Another process of a user who may patch the process: root or its owner.
    Proftap,
    /// Anyone else, or a holder that does not answer.
    Other,
}

/// Who holds the claim of process `pid` at `address`.
fn holder(pid: i32, address: &UnixAddr) -> Holder {
    let Ok(owner) = std::fs::metadata(format!("/proc/{pid}")).map(|m| m.uid()) else { return Holder::Other };
    let Ok(asking) = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None) else {
        return Holder::Other;
    };
    if connect(asking.as_raw_fd(), address).is_err() {
        return Holder::Other;
    }
    match getsockopt(&asking, sockopt::PeerCredentials) {
        Ok(holder) if holder.uid() != 0 && holder.uid() != owner => Holder::Other,
        Ok(holder) if holder.pid() == std::process::id() as i32 => Holder::ThisProcess,
        Ok(_) => Holder::Proftap,
        Err(_) => Holder::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_claimed_by_one_recording_at_a_time() {
        let pid = std::process::id() as i32;
        let first = RecordingClaim::take(pid).expect("the first claim");
        let second = RecordingClaim::take(pid).expect_err("a second claim while the first holds");
        assert!(second.to_string().contains("another proftap is recording it already"), "{second}");
        drop(first);
        RecordingClaim::take(pid).expect("claimed again once the first ended");
        assert!(RecordingClaim::take(i32::MAX).is_err(), "no such process");
    }

    /// A child starting holds a copy of this process's claim until its
    /// exec: the claim, dropped meanwhile, is taken again once it is gone.
    #[test]
    fn a_claim_dropped_but_held_by_a_starting_child_is_waited_for() {
        // Another process than the other tests claim.
        let mut claimed = std::process::Command::new("sleep").arg("10").spawn().expect("sleep");
        let pid = claimed.id() as i32;
        let first = RecordingClaim::take(pid).expect("the first claim");
        let kept = first._socket.as_ref().expect("bound").as_raw_fd() as u32;
        // SAFETY: the child only closes descriptors, sleeps and exits, all
        // async-signal-safe.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
            // SAFETY: as above. Every descriptor but the claim's is closed:
            // the other tests' sockets are not held meanwhile.
            unsafe {
                libc::syscall(libc::SYS_close_range, 3u32, kept - 1, 0u32);
                libc::syscall(libc::SYS_close_range, kept + 1, u32::MAX, 0u32);
                libc::nanosleep(&pause, std::ptr::null_mut());
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
        drop(first);
        let again = RecordingClaim::take(pid);
        let exited = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None);
        let _ = claimed.kill();
        let _ = claimed.wait();
        again.expect("claimed again once the child's copy closed");
        assert!(matches!(exited, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))), "{exited:?}");
    }

    #[test]
    fn a_claim_another_user_holds_does_not_stop_a_recording() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "holding a socket as another user needs root");
            eprintln!("skipped: holding a socket as another user needs root");
            return;
        }
        let mut ours = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
        let pid = ours.id() as i32;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let name = format!("proftap-recording-{pid}-{}", procfs::start_time(&stat).expect("started"));
        let name_again = name.clone();
        // A squatter: a thread of another user (the raw system call changes
        // this thread's ids alone) listening on the claim's name.
        let squatter = std::thread::spawn(move || {
            // SAFETY: setresuid(2) on the calling thread only.
            assert_eq!(unsafe { libc::syscall(libc::SYS_setresuid, -1i64, 65534i64, -1i64) }, 0);
            let socket = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
            bind(socket.as_raw_fd(), &UnixAddr::new_abstract(name.as_bytes()).expect("name")).expect("bind");
            listen(&socket, Backlog::new(1).expect("backlog")).expect("listen");
            socket
        })
        .join()
        .expect("squatter");
        let taken = RecordingClaim::take(pid);
        drop(squatter);
        // A squatter that binds the name and never answers, as root.
        let silent = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
        bind(silent.as_raw_fd(), &UnixAddr::new_abstract(name_again.as_bytes()).expect("name")).expect("bind");
        let taken_beside_silent = RecordingClaim::take(pid);
        let _ = ours.kill();
        let _ = ours.wait();
        taken.expect("a stranger's claim is not a recording's");
        taken_beside_silent.expect("a name no one answers on is not a recording's");
    }
}

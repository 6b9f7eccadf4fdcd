//! proftapd's side of a session worker: starting it, and doing for it the
//! few things that need root, each checked: defining uprobes in files the
//! worker opened as the user, keeping and removing them, and measuring
//! the probe cost with proftapd's own helper.

use crate::channel::Channel;
use crate::messages::{Answer, Assignment, Limits, ProbeRequest, Report};
use crate::worker;
use proftap_record::calibration::{CalibrationError, HELPER_ARGUMENT};
use proftap_record::cost::ProbeCost;
use proftap_record::host::{DefinedGroup, ExitMode, FileOffset, OffCpu, ProbeEvent, Tracefs, UprobeGroup, UprobeSpec};
use proftap_record::observer::RecordEvent;
use std::collections::HashMap;
use std::io::{Read, Seek};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A running worker, as proftapd holds it.
pub struct Worker {
    child: Child,
    channel: Channel,
    /// Signals reach this process and no other, even once it has been reaped.
    pidfd: Arc<OwnedFd>,
}

/// Who a worker records for.
#[derive(Clone, Copy, Debug)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
}

/// Puts descriptor `fd` on `target`, to stay open across an exec. A
/// `dup2` onto itself does nothing, close-on-exec included: a socket made
/// on `target` would close at the exec. Async-signal-safe.
fn kept_across_exec_as(fd: RawFd, target: RawFd) -> std::io::Result<()> {
    // SAFETY: plain system calls on descriptors.
    let moved = unsafe { if fd == target { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, target) } };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Starts a worker for `user` and gives it `assignment` (with the user's
/// standard streams, if any).
pub fn spawn(user: User, assignment: &Assignment, stdio: &[OwnedFd]) -> std::io::Result<Worker> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let mut command = Command::new("/proc/self/exe");
    command
        .arg(worker::ARGUMENT)
        .arg(user.uid.to_string())
        .arg(user.gid.to_string())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only dup2 and fcntl, which are
    // async-signal-safe.
    unsafe {
        command.pre_exec(move || kept_across_exec_as(theirs_fd, worker::CHANNEL_FD));
    }
    let child = command.spawn()?;
    drop(theirs);
    let pidfd = Arc::new(proftap_record::host::pidfd(child.id() as i32)?);
    let channel = Channel::new(ours);
    let fds: Vec<_> = stdio.iter().map(AsFd::as_fd).collect();
    channel.send(assignment, &fds)?;
    Ok(Worker { child, channel, pidfd })
}

/// Sends `signal` to the worker behind `pidfd`.
pub fn signal(pidfd: &OwnedFd, signal: libc::c_int) {
    // SAFETY: a pidfd we own; no siginfo.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0) };
}

/// What a worker tells of its session while it runs.
pub enum Progress {
    /// What it records.
    Target(String),
    /// What the recording told.
    Event(RecordEvent),
}

/// The longest target description kept.
const MOST_TARGET_CHARS: usize = 1000;

/// What is kept of the description of a session's target a worker sent.
pub fn kept_target(description: &str) -> String {
    description.chars().take(MOST_TARGET_CHARS).collect()
}

/// What a session's worker left: its profile file's bytes, or why not.
pub type Outcome = Result<Vec<u8>, String>;

impl Worker {
    /// The handle to signal it with.
    pub fn pidfd(&self) -> Arc<OwnedFd> {
        self.pidfd.clone()
    }

    /// Serves the worker until it ends; `progress` hears of its progress.
    pub fn serve(mut self, limits: &Limits, root: bool, mut progress: impl FnMut(Progress)) -> Outcome {
        let mut uprobes = Uprobes { groups: HashMap::new(), next: 1, limit: (!root).then_some(limits.probes) };
        // Loaded for this session alone: what a worker may write into it
        // (it holds the descriptor) touches only its own numbers.
        let mut off_cpu: Option<OffCpu> = None;
        let mut outcome: Option<Outcome> = None;
        loop {
            let (report, fds) = match self.channel.receive::<Report>() {
                Ok(Some(received)) => received,
                Ok(None) => break,
                Err(e) => {
                    // A worker runs as the user: what it sends is not believed.
                    signal(&self.pidfd, libc::SIGKILL);
                    outcome = Some(Err(format!("the session's recorder sent something proftapd cannot accept ({e}); it was stopped")));
                    break;
                }
            };
            if let Report::OffCpu = report {
                if off_cpu.is_none() {
                    off_cpu = OffCpu::load().map_err(|e| e.to_string()).map(Some).unwrap_or_else(|why| {
                        let _ = self.channel.send(&Answer::Refused(why), &[]);
                        None
                    });
                    if off_cpu.is_none() {
                        continue;
                    }
                }
                let array = off_cpu.as_ref().expect("loaded above");
                if self.channel.send(&Answer::OffCpu { entries: array.entries() }, &[array.map()]).is_err() {
                    break;
                }
                continue;
            }
            let answer = match report {
                Report::OffCpu => None,
                Report::Define { probes } => Some(uprobes.define(&probes, fds)),
                Report::Keep { group } => Some(uprobes.keep(group)),
                Report::Remove { group } => {
                    uprobes.groups.remove(&group);
                    None
                }
                Report::Calibrate { exits, fresh } => {
                    Some(Answer::Cost(probe_cost(exits, fresh && root).map_err(|e| e.reason().to_string())))
                }
                Report::Event(event) => {
                    progress(Progress::Event(event));
                    None
                }
                Report::Target { description } => {
                    progress(Progress::Target(kept_target(&description)));
                    None
                }
                Report::Finished => {
                    outcome = Some(read_profile(fds, limits.profile_mib));
                    None
                }
                Report::Failed { error } => {
                    outcome = Some(Err(error));
                    None
                }
            };
            if let Some(answer) = answer
                && self.channel.send(&answer, &[]).is_err()
            {
                break;
            }
        }
        let status = self.child.wait();
        // Only now are the worker's events on them closed.
        drop(uprobes);
        outcome.unwrap_or_else(|| Err(ended_early(status)))
    }
}

fn ended_early(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) if s.signal() == Some(libc::SIGKILL) => "the session's recorder was killed (stopped, or it did not end when asked to)".into(),
        Ok(s) if s.signal().is_some() => format!("the session's recorder ended with signal {}", s.signal().unwrap_or_default()),
        Ok(s) => format!("the session's recorder ended without a profile (exit status {})", s.code().unwrap_or_default()),
        Err(e) => format!("the session's recorder could not be waited for: {e}"),
    }
}

/// The profile a worker left in a memory file: at most `limit_mib`.
fn read_profile(fds: Vec<OwnedFd>, limit_mib: usize) -> Outcome {
    let [fd] = <[OwnedFd; 1]>::try_from(fds).map_err(|_| "the session's recorder sent its profile wrongly".to_string())?;
    let mut file = std::fs::File::from(fd);
    // Not a FIFO or a socket, which could hold proftapd's reading up for ever.
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err("the session's recorder sent something other than a profile file".into());
    }
    let limit = (limit_mib as u64) << 20;
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|()| file.take(limit + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the session's profile: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("the session's profile is larger than the {limit_mib} MiB proftapd keeps"));
    }
    Ok(bytes)
}

/// The uprobe groups proftapd defined for one worker.
struct Uprobes {
    groups: HashMap<u64, (UprobeGroup, usize)>,
    next: u64,
    /// The most probes defined at once (users other than root).
    limit: Option<usize>,
}

impl Uprobes {
    fn define(&mut self, probes: &[ProbeRequest], files: Vec<OwnedFd>) -> Answer {
        match self.try_define(probes, &files) {
            Ok((group, events)) => {
                let id = self.next;
                self.next += 1;
                self.groups.insert(id, (group, probes.len()));
                Answer::Defined { group: id, events }
            }
            Err(why) => Answer::Refused(why),
        }
    }

    fn try_define(&self, probes: &[ProbeRequest], files: &[OwnedFd]) -> Result<(UprobeGroup, Vec<ProbeEvent>), String> {
        let defined: usize = self.groups.values().map(|(_, n)| n).sum();
        check_definition(probes, files.len(), defined, self.limit)?;
        for fd in files {
            let regular = nix::sys::stat::fstat(fd).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG);
            if !regular {
                return Err("uprobes go in regular files only".into());
            }
        }
        // The kernel resolves this path in proftapd, to the very file the
        // worker opened as the user: nothing else can be named.
        let specs = probes
            .iter()
            .map(|p| {
                let fd = files.get(p.file as usize).ok_or("a probe names a file that was not sent")?;
                Ok(UprobeSpec { path: format!("/proc/self/fd/{}", fd.as_raw_fd()).into(), offset: FileOffset(p.offset), kind: p.kind })
            })
            .collect::<Result<Vec<_>, &str>>()?;
        let tracefs = Tracefs::open().map_err(|e| e.to_string())?;
        UprobeGroup::define(&tracefs, &specs).map_err(|e| e.to_string())
    }

    fn keep(&mut self, group: u64) -> Answer {
        match self.groups.get_mut(&group) {
            Some((group, _)) => {
                group.keep();
                Answer::Done
            }
            None => Answer::Refused(format!("there is no uprobe group {group}")),
        }
    }
}

/// What a worker may ask to define, before any file is looked at: with
/// the `defined` probes it holds, at most `limit` (users other than root),
/// each in one of the `files` descriptors it sent.
pub fn check_definition(probes: &[ProbeRequest], files: usize, defined: usize, limit: Option<usize>) -> Result<(), String> {
    if let Some(limit) = limit
        && defined.saturating_add(probes.len()) > limit
    {
        return Err(format!(
            "this session would place {} uprobes; proftapd lets users other than root place {limit} at most: name fewer functions or lines",
            defined.saturating_add(probes.len())
        ));
    }
    if probes.iter().any(|p| p.file as usize >= files) {
        return Err("a probe names a file that was not sent".into());
    }
    Ok(())
}

/// Measurements run one at a time: each places probes on proftapd's helper.
static MEASURING: Mutex<()> = Mutex::new(());

fn probe_cost(exits: ExitMode, fresh: bool) -> Result<ProbeCost, CalibrationError> {
    let _one = MEASURING.lock().map_err(|_| CalibrationError::new("another measurement failed"))?;
    let exe = std::env::current_exe().map_err(|e| CalibrationError::new(format!("cannot find proftapd's own program: {e}")))?;
    proftap_record::calibration::probe_cost(&exe, HELPER_ARGUMENT, exits, fresh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_record::host::ProbeKind;

    #[test]
    fn a_definition_is_held_to_the_limit_and_the_files_sent() {
        let probe = |file| ProbeRequest { file, offset: 4096, kind: ProbeKind::At };
        assert!(check_definition(&[probe(0), probe(1)], 2, 8, Some(10)).is_ok());
        let over = check_definition(&[probe(0), probe(0), probe(0)], 1, 8, Some(10)).expect_err("over the limit");
        assert!(over.contains("would place 11 uprobes"), "{over}");
        assert!(check_definition(&[probe(0)], 1, usize::MAX, Some(10)).is_err());
        assert!(check_definition(&[probe(0); 3], 1, usize::MAX, None).is_ok(), "root has no limit");
        assert!(check_definition(&[probe(1)], 1, 0, None).expect_err("no such file").contains("not sent"));
    }

    fn closes_on_exec(fd: RawFd) -> bool {
        // SAFETY: a plain system call on a descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert!(flags >= 0, "descriptor {fd} is open");
        flags & libc::FD_CLOEXEC != 0
    }

    /// The worker's channel stays open across its exec wherever the
    /// socket pair was made, on the channel's own number too.
    #[test]
    fn a_descriptor_is_kept_across_exec_on_its_own_number_or_another() {
        let (a, b) = UnixStream::pair().unwrap();
        assert!(closes_on_exec(a.as_raw_fd()) && closes_on_exec(b.as_raw_fd()));
        kept_across_exec_as(a.as_raw_fd(), a.as_raw_fd()).unwrap();
        assert!(!closes_on_exec(a.as_raw_fd()));
        // Onto b's number: b is replaced by a copy of a, kept open.
        kept_across_exec_as(a.as_raw_fd(), b.as_raw_fd()).unwrap();
        assert!(!closes_on_exec(b.as_raw_fd()));
        assert!(kept_across_exec_as(-1, b.as_raw_fd()).is_err());
    }
}

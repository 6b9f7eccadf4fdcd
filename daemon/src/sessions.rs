//! Sessions: each recorded by a worker process of its own that runs as the
//! user who asked (see [`crate::worker`]); its profile kept in the state
//! directory, readable by root alone, when it ends.

use crate::access::Peer;
use crate::broker::{self, User};
use crate::messages::{Assignment, Limits};
use proftap_record::observer::RecordEvent;
use proftap_record::protocol::{Sealed, SessionInfo, State};
use proftap_record::request::RecordRequest;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a worker asked to stop may take before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where a recording is, as its worker told.
#[derive(Clone, Copy, Debug, Default)]
struct Snapshot {
    /// Every probe is live.
    started: bool,
    /// The process recorded.
    pid: i32,
    /// Functions probed.
    functions: u64,
    /// Events so far.
    events: u64,
    /// Events lost so far.
    lost: u64,
}

/// The most warnings and probe-set changes kept per session, and the
/// longest of each: a worker runs as its user, who could send any number.
pub const MOST_TOLD: usize = 64;
/// See [`MOST_TOLD`].
pub const MOST_TOLD_BYTES: usize = 2000;

struct Session {
    info: SessionInfo,
    snapshot: Snapshot,
    since: Instant,
    /// The worker while it runs.
    worker: Option<Arc<OwnedFd>>,
}

/// Every session the daemon knows: running ones and kept profiles.
pub struct Registry {
    sessions: BTreeMap<u64, Session>,
    next_id: u64,
    state_dir: PathBuf,
    keep: usize,
    limits: Limits,
}

/// The registry, shared by connections and session threads.
pub type Shared = Arc<Mutex<Registry>>;

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl Registry {
    /// A registry keeping at most `keep` ended sessions in `state_dir`,
    /// with those it finds there from an earlier run.
    pub fn open(state_dir: PathBuf, keep: usize, limits: Limits) -> std::io::Result<Shared> {
        private_directory(&state_dir)?;
        let mut sessions = BTreeMap::new();
        for entry in std::fs::read_dir(&state_dir)?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Ok(text) = std::fs::read(&path)
                && let Ok(info) = serde_json::from_slice::<SessionInfo>(&text)
            {
                let session = Session { info, snapshot: Snapshot::default(), since: Instant::now(), worker: None };
                sessions.insert(session.info.id, session);
            }
        }
        let next_id = sessions.keys().next_back().map_or(1, |id| id + 1);
        Ok(Arc::new(Mutex::new(Registry { sessions, next_id, state_dir, keep, limits })))
    }

    fn profile_path(&self, id: u64) -> PathBuf {
        self.state_dir.join(format!("{id}.profile"))
    }

    fn info_path(&self, id: u64) -> PathBuf {
        self.state_dir.join(format!("{id}.json"))
    }

    /// The session as `peer` may see it.
    fn visible(&self, peer: &Peer, id: u64) -> Result<&Session, String> {
        match self.sessions.get(&id) {
            Some(s) if peer.is_root() || s.info.uid == peer.uid => Ok(s),
            _ => Err(format!("there is no session {id} of yours (see: proftap session list)")),
        }
    }

    fn live(&self, s: &Session) -> SessionInfo {
        let mut info = s.info.clone();
        if matches!(info.state, State::Starting | State::Running) {
            info.uptime_ms = s.since.elapsed().as_millis() as u64;
            info.pid = s.snapshot.pid;
            info.functions = s.snapshot.functions;
            info.events = s.snapshot.events;
            info.lost = s.snapshot.lost;
            if info.state == State::Starting && s.snapshot.started {
                info.state = State::Running;
            }
        }
        info
    }

    /// The sessions `peer` may see.
    pub fn list(&self, peer: &Peer) -> Vec<SessionInfo> {
        self.sessions.values().filter(|s| peer.is_root() || s.info.uid == peer.uid).map(|s| self.live(s)).collect()
    }

    /// One session.
    pub fn status(&self, peer: &Peer, id: u64) -> Result<SessionInfo, String> {
        self.visible(peer, id).map(|s| self.live(s))
    }

    /// Asks a session to end, leaving its program running.
    pub fn stop(&self, peer: &Peer, id: u64) -> Result<(), String> {
        if let Some(worker) = &self.visible(peer, id)?.worker {
            stop_worker(worker.clone());
        }
        Ok(())
    }

    /// Asks every session to end (the daemon is stopping).
    pub fn stop_all(&self) {
        for worker in self.sessions.values().filter_map(|s| s.worker.clone()) {
            stop_worker(worker);
        }
    }

    /// Whether any session is still recording.
    pub fn any_live(&self) -> bool {
        self.sessions.values().any(|s| matches!(s.info.state, State::Starting | State::Running))
    }

    /// A finished session's profile file.
    pub fn profile(&self, peer: &Peer, id: u64) -> Result<PathBuf, String> {
        let s = self.visible(peer, id)?;
        match s.info.state {
            State::Finished => Ok(self.profile_path(id)),
            State::Failed => {
                Err(format!("session {id} failed ({}); it has no profile", s.info.error.as_deref().unwrap_or("no reason given")))
            }
            _ => Err(format!("session {id} is still recording; stop it first (proftap session stop {id})")),
        }
    }

    /// Forgets a session that failed to start.
    pub fn forget(&mut self, id: u64) {
        self.remove(id);
    }

    /// Forgets an ended session and its profile.
    pub fn delete(&mut self, peer: &Peer, id: u64) -> Result<(), String> {
        if matches!(self.visible(peer, id)?.info.state, State::Starting | State::Running) {
            return Err(format!("session {id} is still recording; stop it first (proftap session stop {id})"));
        }
        self.remove(id);
        Ok(())
    }

    fn remove(&mut self, id: u64) {
        self.sessions.remove(&id);
        let _ = std::fs::remove_file(self.profile_path(id));
        let _ = std::fs::remove_file(self.info_path(id));
    }

    /// Records the end of a session and keeps its profile; drops the oldest
    /// ended sessions past the retention limit.
    fn ended(&mut self, id: u64, outcome: broker::Outcome) {
        let path = self.profile_path(id);
        let Some(live) = self.sessions.get(&id).map(|s| self.live(s)) else { return };
        let Some(s) = self.sessions.get_mut(&id) else { return };
        s.info = live;
        s.worker = None;
        match outcome.and_then(|bytes| write_private(&path, &bytes).map_err(|e| format!("cannot keep the profile: {e}"))) {
            Ok(()) => s.info.state = State::Finished,
            Err(error) => {
                s.info.state = State::Failed;
                s.info.error = Some(error);
            }
        }
        if let Ok(json) = serde_json::to_vec(&s.info) {
            let _ = write_private(&self.info_path(id), &json);
        }
        let ended: Vec<u64> =
            self.sessions.iter().filter(|(_, s)| matches!(s.info.state, State::Finished | State::Failed)).map(|(&id, _)| id).collect();
        for &old in ended.iter().take(ended.len().saturating_sub(self.keep)) {
            self.remove(old);
        }
    }

    fn progress(&mut self, id: u64, progress: broker::Progress) {
        let Some(s) = self.sessions.get_mut(&id) else { return };
        match progress {
            broker::Progress::Target(description) => s.info.target = description,
            broker::Progress::Event(event) => s.told(event),
        }
    }
}

impl Session {
    /// Takes in what a recording told: counters into the snapshot,
    /// warnings and changes kept, within bounds.
    fn told(&mut self, event: RecordEvent) {
        match event {
            RecordEvent::Started { pid, functions, .. } => {
                self.snapshot.started = true;
                self.snapshot.pid = pid;
                self.snapshot.functions = functions;
            }
            RecordEvent::Counters { hits, lost } => (self.snapshot.events, self.snapshot.lost) = (hits, lost),
            RecordEvent::Warning(warning) => keep_told(&mut self.info.warnings, warning),
            RecordEvent::ProbesChanged(change) => keep_told(&mut self.info.changes, change),
            RecordEvent::Step(_) | RecordEvent::StepEnded | RecordEvent::Download(_) | RecordEvent::Calls { .. } => {}
        }
    }
}

/// Keeps `value` among a session's warnings or changes (`kept`) if fewer
/// than [`MOST_TOLD`] are kept and it is small enough.
pub fn keep_told<T: serde::Serialize>(kept: &mut Vec<T>, value: T) {
    if kept.len() < MOST_TOLD && fits(&value) {
        kept.push(value);
    }
}

/// Whether `value` is small enough to keep.
fn fits(value: &impl serde::Serialize) -> bool {
    serde_json::to_vec(value).is_ok_and(|bytes| bytes.len() <= MOST_TOLD_BYTES)
}

/// Asks a worker to end its session, and kills it if it has not within
/// [`STOP_GRACE`] (a pidfd signals only that process, even once it is gone).
fn stop_worker(worker: Arc<OwnedFd>) {
    broker::signal(&worker, libc::SIGTERM);
    std::thread::spawn(move || {
        std::thread::sleep(STOP_GRACE);
        broker::signal(&worker, libc::SIGKILL);
    });
}

/// The state directory: root's alone (0700) however proftapd was started
/// and whatever its umask; refused if someone else owns it.
fn private_directory(dir: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(std::io::Error::other(format!("{} is not a directory of proftapd's user", dir.display())));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes a state file readable by proftapd's user alone, atomically.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), proftap_profile::FileError> {
    proftap_profile::write_private(path, |out| out.write_all(bytes))
}

/// What `session start` carries.
pub struct StartRequest {
    /// What to record, unread.
    pub request: Sealed<RecordRequest>,
    /// The client's standard input, output and error, if it sent them.
    pub stdio: Vec<OwnedFd>,
}

/// Starts a session for `peer` in a worker of its own; returns its id (the
/// caller waits for [`State::Running`] or failure).
pub fn start(registry: &Shared, peer: Peer, request: StartRequest) -> Result<u64, String> {
    let (limits, id) = {
        let mut r = registry.lock().map_err(|_| "proftapd is shutting down".to_string())?;
        let live =
            r.sessions.values().filter(|s| s.info.uid == peer.uid && matches!(s.info.state, State::Starting | State::Running)).count();
        if !peer.is_root() && live >= r.limits.sessions_per_user {
            return Err(format!("you have {live} sessions recording, the most proftapd runs for one user; stop one first"));
        }
        let id = r.next_id;
        r.next_id += 1;
        (r.limits, id)
    };
    let info = SessionInfo::new(id, peer.uid, State::Starting, now_unix_ns());
    let assignment = Assignment { request: request.request, client_pid: peer.pid, limits, root: peer.is_root() };
    let worker = broker::spawn(User { uid: peer.uid, gid: peer.gid }, &assignment, &request.stdio)
        .map_err(|e| format!("cannot start a worker for the session: {e}"))?;
    let session = Session { info, snapshot: Snapshot::default(), since: Instant::now(), worker: Some(worker.pidfd()) };
    registry.lock().map_err(|_| "proftapd is shutting down".to_string())?.sessions.insert(id, session);
    let shared = registry.clone();
    let root = peer.is_root();
    std::thread::Builder::new()
        .name(format!("session {id}"))
        .spawn(move || {
            let progress = |snapshot| {
                if let Ok(mut r) = shared.lock() {
                    r.progress(id, snapshot);
                }
            };
            let outcome = worker.serve(&limits, root, progress);
            if let Ok(mut r) = shared.lock() {
                r.ended(id, outcome);
            }
        })
        .map_err(|e| format!("cannot start a session thread: {e}"))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_and_changes_are_kept_within_bounds() {
        let mut kept = Vec::new();
        keep_told(&mut kept, "x".repeat(MOST_TOLD_BYTES));
        assert!(kept.is_empty(), "with its quotes it is too long");
        for i in 0..MOST_TOLD + 5 {
            keep_told(&mut kept, i.to_string());
        }
        assert_eq!(kept.len(), MOST_TOLD);
        assert_eq!(kept.last().map(String::as_str), Some("63"));
    }
}

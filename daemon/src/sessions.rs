//! Sessions: each a recording on a thread of its own, its profile kept in
//! the state directory when it ends.

use crate::access::{self, Peer};
use clap::Parser;
use proftap_cli::commands::record::{AttachArgs, Prepared, RunArgs, prepare_attach, prepare_run};
use proftap_cli::session::{SessionInfo, StartArgs, State};
use proftap_probes::record::{Control, Progress, TargetSpec};
use proftap_probes::target::Launch;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What users other than root may ask for.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sessions starting or running at once, per user.
    pub sessions_per_user: usize,
    /// Functions probed per session.
    pub functions: usize,
    /// Ring buffer per CPU, MiB.
    pub buffer_mib: usize,
}

struct Session {
    info: SessionInfo,
    control: Control,
    progress: Arc<Progress>,
    since: Instant,
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

/// `session start` arguments as the daemon parses them.
#[derive(Parser)]
#[command(name = "session start", no_binary_name = true)]
struct Start {
    #[command(flatten)]
    args: StartArgs,
}

impl Registry {
    /// A registry keeping at most `keep` ended sessions in `state_dir`,
    /// with those it finds there from an earlier run.
    pub fn open(state_dir: PathBuf, keep: usize, limits: Limits) -> std::io::Result<Shared> {
        std::fs::create_dir_all(&state_dir)?;
        let mut sessions = BTreeMap::new();
        for entry in std::fs::read_dir(&state_dir)?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Ok(text) = std::fs::read(&path)
                && let Ok(info) = serde_json::from_slice::<SessionInfo>(&text)
            {
                let session = Session { info, control: Control::default(), progress: Arc::default(), since: Instant::now() };
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
            info.pid = s.progress.pid.load(Ordering::Relaxed);
            info.functions = s.progress.functions.load(Ordering::Relaxed);
            info.events = s.progress.hits.load(Ordering::Relaxed);
            info.lost = s.progress.lost.load(Ordering::Relaxed);
            if info.state == State::Starting && s.progress.started.load(Ordering::Acquire) {
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
        let s = self.visible(peer, id)?;
        s.control.detach.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Asks every session to end (the daemon is stopping).
    pub fn stop_all(&self) {
        for s in self.sessions.values() {
            s.control.detach.store(true, Ordering::Relaxed);
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
    fn ended(&mut self, id: u64, result: Result<proftap_profile::Profile, String>) {
        let path = self.profile_path(id);
        let Some(live) = self.sessions.get(&id).map(|s| self.live(s)) else { return };
        let Some(s) = self.sessions.get_mut(&id) else { return };
        s.info = live;
        let result = result.and_then(|profile| {
            proftap_profile::write_profile(&path, &profile).map_err(|e| e.to_string())?;
            Ok(profile)
        });
        match result {
            Ok(profile) => {
                s.info.state = State::Finished;
                s.info.events = profile.recording.events;
                s.info.lost = profile.lost.events;
                s.info.uptime_ms = profile.recording.duration_ns / 1_000_000;
            }
            Err(error) => {
                s.info.state = State::Failed;
                s.info.error = Some(error);
            }
        }
        if let Ok(json) = serde_json::to_vec(&s.info) {
            let _ = proftap_profile::write_atomically(&self.info_path(id), |out| out.write_all(&json));
        }
        let ended: Vec<u64> =
            self.sessions.iter().filter(|(_, s)| matches!(s.info.state, State::Finished | State::Failed)).map(|(&id, _)| id).collect();
        for &old in ended.iter().take(ended.len().saturating_sub(self.keep)) {
            self.remove(old);
        }
    }
}

/// Starts a session for `peer`; returns its id once its thread runs (the
/// caller waits for [`State::Running`] or failure).
pub fn start(registry: &Shared, peer: Peer, args: Vec<String>, cwd: PathBuf, env: Vec<String>) -> Result<u64, String> {
    let start = Start::try_parse_from(&args).map_err(|e| first_line(&e.to_string()))?.args;
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
    if !peer.is_root() {
        if start.record.buffer_size > limits.buffer_mib {
            return Err(format!(
                "--buffer-size {} is over the {} MiB proftapd allows users other than root",
                start.record.buffer_size, limits.buffer_mib
            ));
        }
        if !start.record.debug_dir.is_empty() {
            return Err("--debug-dir is for root only through proftapd (it reads files as root)".into());
        }
    }
    let target = match (start.pid, start.command.first()) {
        (Some(pid), _) => {
            access::may_profile(&peer, pid)?;
            format!("pid {pid} ({})", std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim())
        }
        (None, Some(program)) => {
            let groups = access::groups(peer.uid, peer.gid);
            if !peer.is_root() && !access::readable_by(std::path::Path::new(program), peer.uid, &groups) {
                return Err(format!("you may not read {}, so proftapd will not read it for you", program.to_string_lossy()));
            }
            start.command.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
        }
        (None, None) => return Err("session start needs a process (--pid PID) or a command (-- CMD ARGS...)".into()),
    };

    let control = Control::default();
    let progress = Arc::new(Progress::default());
    let info = SessionInfo {
        id,
        uid: peer.uid,
        target,
        pid: start.pid.unwrap_or(0),
        state: State::Starting,
        started_unix_ns: now_unix_ns(),
        uptime_ms: 0,
        functions: 0,
        events: 0,
        lost: 0,
        error: None,
    };
    registry
        .lock()
        .map_err(|_| "proftapd is shutting down".to_string())?
        .sessions
        .insert(id, Session { info, control: control.clone(), progress: progress.clone(), since: Instant::now() });

    let shared = registry.clone();
    std::thread::Builder::new()
        .name(format!("session {id}"))
        .spawn(move || {
            let result = prepare(&start, &peer, cwd, env, limits).and_then(|mut prepared| {
                prepared.options.control = control;
                prepared.options.progress = Some(progress);
                let launched = matches!(prepared.spec, TargetSpec::Launch { .. });
                let recorded = prepared.record().map_err(|e| proftap_cli::output::error_sentence(&e))?;
                // A launched program left running is still the daemon's child.
                if launched && recorded.ended.is_none() {
                    let pid = nix::unistd::Pid::from_raw(recorded.profile.target.pid);
                    std::thread::spawn(move || nix::sys::wait::waitpid(pid, None));
                }
                Ok(recorded.profile)
            });
            if let Ok(mut r) = shared.lock() {
                r.ended(id, result);
            }
        })
        .map_err(|e| format!("cannot start a session thread: {e}"))?;
    Ok(id)
}

fn prepare(start: &StartArgs, peer: &Peer, cwd: PathBuf, env: Vec<String>, limits: Limits) -> Result<Prepared, String> {
    let sentence = |e: anyhow::Error| proftap_cli::output::error_sentence(&e);
    let prepared = match start.pid {
        Some(pid) => prepare_attach(&AttachArgs { record: start.record.clone(), attach: start.attach.clone(), pid }).map_err(sentence)?,
        None => {
            let launch = Launch {
                user: (!peer.is_root()).then(|| (peer.uid, peer.gid, access::groups(peer.uid, peer.gid))),
                cwd: Some(cwd),
                env: Some(env.into_iter().map(Into::into).collect()),
            };
            prepare_run(&RunArgs { record: start.record.clone(), command: start.command.clone() }, launch).map_err(sentence)?
        }
    };
    if !peer.is_root() && prepared.functions.len() > limits.functions {
        return Err(format!(
            "this session would probe {} functions; proftapd lets users other than root probe {} at most: name fewer with -f",
            prepared.functions.len(),
            limits.functions
        ));
    }
    Ok(prepared)
}

/// clap's errors run over several lines; the first says what is wrong.
fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).trim_start_matches("error: ").to_string()
}

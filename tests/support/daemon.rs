//! A proftapd of a test's own, and the users and files access tests need.

use crate::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

/// A daemon on a socket and state directory of its own.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub state: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    /// Starts proftapd and waits until it says it listens.
    pub fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, &[], |_| {})
    }

    /// The same with more arguments, and `prepare` to change the command
    /// (its limits, its umask).
    pub fn start_with(dir: &Path, args: &[&str], prepare: impl FnOnce(&mut Command)) -> Daemon {
        let socket = dir.join("proftapd.sock");
        let state = dir.join("state");
        let mut command = Command::new(binary("proftapd"));
        command.arg("--socket").arg(&socket).arg("--state-dir").arg(&state).args(args).stderr(Stdio::piped());
        prepare(&mut command);
        let mut child = command.spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(line.contains("listening on"), "proftapd: {line}");
        let log = Arc::new(Mutex::new(line));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("{line}");
                kept.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Daemon { child, socket, state, log }
    }

    /// What the daemon has written to its log (standard error) so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `proftap --socket S session ARGS`, as the current user.
    pub fn session(&self, args: &[&str]) -> Output {
        run(proftap().args(["session", "--socket"]).arg(&self.socket).args(args))
    }

    /// The same, as user `uid`/`gid`, with `proftap` at `exe`.
    pub fn session_as(&self, exe: &Path, uid: u32, gid: u32, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        run(Command::new(exe).uid(uid).gid(gid).env_remove("XDG_RUNTIME_DIR").args(["session", "--socket"]).arg(&self.socket).args(args))
    }

    /// Ends the daemon with SIGTERM and waits for it.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        run_ok(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The session id `session start` prints last.
pub fn started(out: &Output) -> String {
    ok(out).lines().last().unwrap_or_default().trim().to_string()
}

/// A user for the access tests: `proftap-test`, created if missing.
pub fn test_user() -> (u32, u32) {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").arg(flag).arg("proftap-test").output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|_| out.status.success())
    };
    if id("-u").is_none() {
        let made = Command::new("useradd").args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "proftap-test"]).status();
        assert!(made.is_ok_and(|s| s.success()), "cannot create the user proftap-test (useradd) to test access between users");
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// A directory every user may read, holding copies of `files`.
pub fn shared_copies(files: &[&Path]) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copies = files
        .iter()
        .map(|f| {
            let to = dir.path().join(f.file_name().unwrap());
            crate::copy_executable(f, &to);
            to
        })
        .collect();
    (dir, copies)
}

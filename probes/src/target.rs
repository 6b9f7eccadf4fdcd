//! The profiled process: launched held until its probes exist, or a running
//! process whose threads are held still while its probes are opened.

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::{self, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
use std::collections::BTreeSet;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Errors launching or attaching.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The command was not found.
    #[error("command not found: {0}")]
    NotFound(String),
    /// The command could not be executed.
    #[error("cannot execute {}: {source}", path.display())]
    Exec {
        /// The program.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    System {
        /// What was being done.
        what: String,
        /// Why.
        source: io::Error,
    },
}

fn system(what: impl Into<String>) -> impl FnOnce(Errno) -> TargetError {
    let what = what.into();
    move |e| TargetError::System { what, source: e.into() }
}

/// Finds a command the way the shell does: a path with a slash as is,
/// otherwise the first executable of that name on `PATH`.
pub fn resolve_command(command: &OsString) -> Result<PathBuf, TargetError> {
    let name = command.to_string_lossy().into_owned();
    if command.as_bytes().contains(&b'/') {
        let path = PathBuf::from(command);
        return if path.exists() { Ok(path) } else { Err(TargetError::NotFound(name)) };
    }
    which::which(command).map_err(|_| TargetError::NotFound(name))
}

/// Where a launched program runs (always as proftap's user: a service
/// launching for others runs proftap as them first).
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// Working directory (`None`: proftap's).
    pub cwd: Option<PathBuf>,
    /// The whole environment, as `KEY=VALUE` (`None`: proftap's).
    pub env: Option<Vec<OsString>>,
    /// A file its standard output goes to, made anew (`None`: proftap's).
    pub stdout: Option<PathBuf>,
}

/// A child process forked and waiting, before `exec`, for [`HeldChild::release`].
pub struct HeldChild {
    pid: Pid,
    go: Option<OwnedFd>,
    /// Readable once the child may be traced (taken when waited for).
    ready: Option<OwnedFd>,
    exec_error: OwnedFd,
    path: PathBuf,
}

/// Forks a child that will execute `path` with `argv` once released. Nothing
/// of the program runs before then, so probes opened on the child's pid
/// with `enable_on_exec` see its first instruction. It is not traceable
/// before [`HeldChild::ready`].
pub fn spawn_held(path: &Path, argv: &[OsString], launch: &Launch) -> Result<HeldChild, TargetError> {
    let program = CString::new(path.as_os_str().as_bytes()).map_err(|_| TargetError::NotFound(path.display().to_string()))?;
    let nul = |what: &str| TargetError::System { what: format!("{what} contains a NUL byte"), source: io::ErrorKind::InvalidInput.into() };
    let args: Vec<CString> = argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().map_err(|_| nul("an argument"))?;
    let env: Option<Vec<CString>> = match &launch.env {
        Some(env) => Some(env.iter().map(|e| CString::new(e.as_bytes())).collect::<Result<_, _>>().map_err(|_| nul("the environment"))?),
        None => None,
    };
    let stdout = match &launch.stdout {
        Some(file) => Some(CString::new(file.as_os_str().as_bytes()).map_err(|_| nul("the output file"))?),
        None => None,
    };
    let cwd = match &launch.cwd {
        Some(dir) => Some(CString::new(dir.as_os_str().as_bytes()).map_err(|_| nul("the working directory"))?),
        None => None,
    };
    let (go_read, go_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(system("cannot create a pipe"))?;
    let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(system("cannot create a pipe"))?;
    let (ready_read, ready_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(system("cannot create a pipe"))?;
    // Built before the fork: the child of a threaded process must not allocate.
    let mut arg_ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    arg_ptrs.push(std::ptr::null());
    let env_ptrs: Option<Vec<*const libc::c_char>> =
        env.as_ref().map(|env| env.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect());

    // SAFETY: the child only calls async-signal-safe functions (prctl,
    // open, dup2, close, signal, chdir, read, execv(e), write, _exit) on
    // data prepared before the fork.
    match unsafe { nix::unistd::fork() }.map_err(system("cannot fork"))? {
        ForkResult::Child => {
            drop(go_write);
            drop(err_read);
            drop(ready_read);
            let fail = |errno: i32| -> ! {
                let bytes = errno.to_ne_bytes();
                // SAFETY: writing a local buffer to an open fd, then exiting.
                unsafe {
                    libc::write(err_write.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(127)
                }
            };
            // A proftap that changed its ids (a session worker) is not
            // dumpable, and neither is this copy of it until it executes the
            // program: the kernel would refuse to let proftap trace it or
            // open its events. Nothing secret is in it.
            // SAFETY: a plain system call.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
            if let Some(file) = &stdout {
                // SAFETY: open and dup2 of a NUL-terminated path onto standard output.
                let fd = unsafe { libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644) };
                if fd < 0 || unsafe { libc::dup2(fd, 1) } < 0 {
                    fail(Errno::last_raw());
                }
                if fd != 1 {
                    // SAFETY: closing the descriptor just opened, now on 1 too.
                    unsafe { libc::close(fd) };
                }
            }
            if let Some(dir) = &cwd {
                // SAFETY: a NUL-terminated path.
                if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                    fail(Errno::last_raw());
                }
            }
            // The Rust runtime ignores SIGPIPE, and an ignored signal
            // stays ignored across exec: the program would fail its writes
            // to a closed pipe instead of ending. (The signal mask is the
            // user's, passed on as a shell passes it: proftap blocks none.)
            // SAFETY: a plain system call.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            let mut byte = [0u8; 1];
            // Ready to be traced; then wait to be released.
            // SAFETY: writing a local buffer to an open fd, then closing it.
            unsafe {
                libc::write(ready_write.as_raw_fd(), byte.as_ptr().cast(), 1);
            }
            drop(ready_write);
            // SAFETY: reading into a local buffer from an open fd.
            let n = unsafe { libc::read(go_read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
            if n != 1 {
                // proftap went away before releasing us: do not run unprofiled.
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(126) };
            }
            match &env_ptrs {
                // SAFETY: NUL-terminated strings and null-terminated arrays.
                Some(vars) => unsafe {
                    libc::execve(program.as_ptr(), arg_ptrs.as_ptr(), vars.as_ptr());
                },
                // SAFETY: NUL-terminated strings and a null-terminated array.
                None => unsafe {
                    libc::execv(program.as_ptr(), arg_ptrs.as_ptr());
                },
            }
            fail(Errno::last_raw())
        }
        ForkResult::Parent { child } => {
            drop(go_read);
            drop(err_write);
            drop(ready_write);
            Ok(HeldChild { pid: child, go: Some(go_write), ready: Some(ready_read), exec_error: err_read, path: path.into() })
        }
    }
}

impl HeldChild {
    /// Waits until the child can be traced and its events opened (see
    /// [`spawn_held`]); a child that could not get there says why.
    pub fn ready(&mut self) -> Result<(), TargetError> {
        let Some(ready) = self.ready.take() else {
            // Ready once, or gone: one that failed, or was released, is not again.
            return self.go.as_ref().map(|_| ()).ok_or_else(no_longer_waiting);
        };
        let mut byte = [0u8; 1];
        if nix::unistd::read(&ready, &mut byte).unwrap_or(0) == 1 {
            return Ok(());
        }
        let source = self.reported_error().unwrap_or_else(|| io::ErrorKind::Other.into());
        self.go = None;
        let _ = waitpid(self.pid, None);
        Err(TargetError::Exec { path: self.path.clone(), source })
    }

    /// The error the child wrote before it exited (one that could not get
    /// ready, or execute the program); none when its pipe closed on exec.
    fn reported_error(&self) -> Option<io::Error> {
        let mut errno = [0u8; 4];
        let n = nix::unistd::read(&self.exec_error, &mut errno).unwrap_or(0);
        (n == 4).then(|| io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
    }

    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Lets the child execute the program; reports an exec failure.
    pub fn release(&mut self) -> Result<(), TargetError> {
        self.ready()?;
        let go = self.go.take().ok_or_else(no_longer_waiting)?;
        if let Err(e) = nix::unistd::write(&go, &[1]) {
            // Gone (killed) before it could start: reaped here, never to run.
            self.go = Some(go);
            self.end_unreleased();
            return Err(system("cannot start the command")(e));
        }
        drop(go);
        self.wait_for_exec();
        if let Some(source) = self.reported_error() {
            let _ = waitpid(self.pid, None);
            return Err(TargetError::Exec { path: self.path.clone(), source });
        }
        Ok(())
    }

    /// Waits until the released child executed the program, or failed to.
    /// A child traced already stops for a signal that reaches it before
    /// its exec, and would wait there for proftap, which would wait on the
    /// exec pipe: such a signal is passed on as it came.
    fn wait_for_exec(&self) {
        let mut pipe = [libc::pollfd { fd: self.exec_error.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        loop {
            // SAFETY: poll reads and writes the array it is given.
            match unsafe { libc::poll(pipe.as_mut_ptr(), 1, 20) } {
                0 => {
                    pass_on_signal_stop(self.pid);
                }
                n if n < 0 && Errno::last() == Errno::EINTR => {}
                // Written to or closed; or a poll that failed, whose read says.
                _ => return,
            }
        }
    }

    /// Ends the child, released or not, and reaps it; nothing if a wait
    /// for a ptrace stop reaped it already (its pid may be another's now).
    pub fn kill(mut self) {
        self.go = None;
        if matches!(try_reap(self.pid.as_raw()), Ok(None)) {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
            while matches!(wait_raw(self.pid, 0), Ok((_, status)) if !libc::WIFEXITED(status) && !libc::WIFSIGNALED(status)) {}
        }
    }

    /// Ends and reaps the child, if it was never released: it has run
    /// nothing of the program, and a stop signal sent to it must not keep
    /// the wait waiting.
    fn end_unreleased(&mut self) {
        if self.go.take().is_some() {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// What [`pass_on_signal_stop`] did.
#[derive(Debug, PartialEq, Eq)]
enum PassedOn {
    /// The child was in no stop for a signal.
    Nothing,
    /// It had stopped for this signal, and was resumed with it.
    Signal(i32),
    /// It had stopped as a stop signal stops a process: it stays stopped
    /// until a SIGCONT, as it would untraced.
    GroupStop,
    /// A SIGCONT ended such a stop: resumed.
    Continued,
}

/// Resumes traced child `pid` with the signal it stopped for, if it is in
/// such a stop, and lets a stop signal stop it as it would stop it
/// untraced (a tracee stopped so waits for its tracer, not for SIGCONT);
/// leaves any other stop (its exec's) to be waited for.
fn pass_on_signal_stop(pid: Pid) -> PassedOn {
    // SAFETY: an all-zero siginfo_t is valid; waitid writes only it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let peek = libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: as above.
    if unsafe { libc::waitid(libc::P_PID, pid.as_raw() as libc::id_t, &mut info, peek) } != 0 {
        return PassedOn::Nothing;
    }
    // SAFETY: waitid filled a child's state change, or nothing (pid 0).
    let (from, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if from != pid.as_raw() || code != libc::CLD_TRAPPED {
        return PassedOn::Nothing;
    }
    // A ptrace event's stop has the event above the signal's number (the
    // exec's is SIGTRAP | PTRACE_EVENT_EXEC << 8).
    let (request, passed, signal) = match (status >> 8, status & 0x7f) {
        (0, signal) if signal > 0 => (libc::PTRACE_CONT, PassedOn::Signal(signal), signal),
        (libc::PTRACE_EVENT_STOP, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU) => {
            (libc::PTRACE_LISTEN, PassedOn::GroupStop, 0)
        }
        // A SIGCONT ended that stop: it stops once more, for its tracer alone.
        (libc::PTRACE_EVENT_STOP, _) => (libc::PTRACE_CONT, PassedOn::Continued, 0),
        _ => return PassedOn::Nothing,
    };
    if !took_trapped_stop(pid) {
        return PassedOn::Nothing;
    }
    // SAFETY: a restart of our tracee, in the stop just taken.
    unsafe { libc::ptrace(request, pid.as_raw(), std::ptr::null_mut::<libc::c_void>(), signal as libc::c_long) };
    passed
}

/// Takes the stop traced child `pid` is in, if it is in one: never its
/// end, which a child killed since it was seen stopped is left to be
/// reaped with (a wait for any change would take it, and the exit status
/// with it).
fn took_trapped_stop(pid: Pid) -> bool {
    // SAFETY: an all-zero siginfo_t is valid; waitid writes only it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let stops_only = libc::WSTOPPED | libc::WNOHANG | libc::__WALL;
    loop {
        // SAFETY: as above.
        match Errno::result(unsafe { libc::waitid(libc::P_PID, pid.as_raw() as libc::id_t, &mut info, stops_only) }) {
            Err(Errno::EINTR) => continue,
            Err(_) => return false,
            // SAFETY: waitid filled a child's state change, or nothing (pid 0).
            Ok(_) => return unsafe { info.si_pid() } == pid.as_raw() && info.si_code == libc::CLD_TRAPPED,
        }
    }
}

/// Why a held child released, or gone, cannot be started.
fn no_longer_waiting() -> TargetError {
    TargetError::System { what: "cannot start the command".into(), source: io::Error::other("it ended, or was started already") }
}

/// A child never released is ended without running the program.
impl Drop for HeldChild {
    fn drop(&mut self) {
        self.end_unreleased();
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Exited with a status.
    Exited(i32),
    /// Killed by a signal.
    Signaled(i32),
}

impl Ended {
    /// The exit status a shell would report.
    pub fn shell_status(self) -> i32 {
        match self {
            Ended::Exited(code) => code,
            Ended::Signaled(signal) => 128 + signal,
        }
    }
}

/// How children ended whose end a wait for a ptrace stop took (the
/// launched command can exit while its threads are being stopped, by any
/// thread of proftap), kept for `try_reap`; told when one is kept.
static ENDED_WHILE_TRACED: std::sync::Mutex<Vec<(i32, Ended)>> = std::sync::Mutex::new(Vec::new());
static ENDED_KEPT: std::sync::Condvar = std::sync::Condvar::new();

/// How long `try_reap` waits, when its child was reaped by a wait for a
/// ptrace stop on another thread, for that wait to keep the status: it
/// does so right after, so this is a bound, not a delay.
const KEEPING: std::time::Duration = std::time::Duration::from_secs(2);

/// A state change of a traced thread, as `waitpid` reports it. Signals are
/// kept as numbers: nix's `WaitStatus` refuses a stop for a real-time
/// signal (32 and up: a `timer_create` timer's, the C library's own for
/// `setuid` in threaded programs) after the kernel has taken the stop, and
/// that signal would be lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Traced {
    /// It exited with this code.
    Exited(i32),
    /// A signal, this one, ended it.
    Killed(i32),
    /// It stopped for this signal, which is delivered only if passed on as
    /// it is resumed.
    Signal(i32),
    /// It stopped at this ptrace event (`PTRACE_EVENT_*`; an interrupt's
    /// stop is `PTRACE_EVENT_STOP`).
    Event(i32),
    /// It stopped at a system call's entry or exit (`PTRACE_O_TRACESYSGOOD`).
    SystemCall,
    /// It runs still: nothing to report now.
    Running,
}

impl Traced {
    fn of(pid: i32, status: i32) -> Traced {
        if pid == 0 {
            Traced::Running
        } else if libc::WIFEXITED(status) {
            Traced::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Traced::Killed(libc::WTERMSIG(status))
        } else if libc::WSTOPSIG(status) == libc::SIGTRAP | 0x80 {
            Traced::SystemCall
        } else if status >> 16 != 0 {
            Traced::Event(status >> 16)
        } else {
            Traced::Signal(libc::WSTOPSIG(status))
        }
    }

    fn ended(self) -> Option<Ended> {
        match self {
            Traced::Exited(code) => Some(Ended::Exited(code)),
            Traced::Killed(signal) => Some(Ended::Signaled(signal)),
            _ => None,
        }
    }
}

/// Waits for a state change of a traced thread (`__WALL`). When that change
/// is the end of a child proftap launched, the wait reaps it: its status is
/// kept for `try_reap`, which would otherwise find no child.
pub(crate) fn wait_traced(tid: Pid) -> nix::Result<Traced> {
    wait_traced_with(tid, libc::__WALL)
}

/// The state change of a traced thread if there is one now
/// (`Traced::Running` if not), kept as `wait_traced` keeps it.
pub(crate) fn poll_traced(tid: Pid) -> nix::Result<Traced> {
    wait_traced_with(tid, libc::__WALL | libc::WNOHANG)
}

fn wait_traced_with(tid: Pid, flags: i32) -> nix::Result<Traced> {
    let (pid, status) = wait_raw(tid, flags)?;
    let traced = Traced::of(pid, status);
    if let Some(ended) = traced.ended() {
        ENDED_WHILE_TRACED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((pid, ended));
        ENDED_KEPT.notify_all();
    }
    Ok(traced)
}

/// `waitpid`, retried when interrupted: the pid reported (0 for none yet,
/// with `WNOHANG`) and its raw status.
fn wait_raw(tid: Pid, flags: i32) -> nix::Result<(i32, i32)> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status it is given.
        let pid = unsafe { libc::waitpid(tid.as_raw(), &mut status, flags) };
        match Errno::result(pid) {
            Ok(pid) => return Ok((pid, status)),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// How a stopped traced thread is let run again.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resume {
    /// On, to its next stop.
    Continue,
    /// To the next system call's entry or exit.
    ToSystemCall,
    /// Untraced.
    Detach,
}

/// Lets stopped traced thread `tid` run again as `how` says, delivering
/// `signal` (0 for none) as it does. nix's own calls take only the signals
/// it names, not real-time ones.
pub(crate) fn resume(tid: Pid, how: Resume, signal: i32) -> nix::Result<()> {
    let request = match how {
        Resume::Continue => libc::PTRACE_CONT,
        Resume::ToSystemCall => libc::PTRACE_SYSCALL,
        Resume::Detach => libc::PTRACE_DETACH,
    };
    // SAFETY: these requests read no memory of proftap's; the data
    // argument is the signal's number.
    let result = unsafe { libc::ptrace(request, tid.as_raw(), std::ptr::null_mut::<libc::c_void>(), signal as libc::c_long) };
    Errno::result(result).map(drop)
}

/// Takes the status `wait_traced` kept for `pid`, waiting up to `most` for
/// it to be kept.
fn kept_end(pid: i32, most: std::time::Duration) -> Option<Ended> {
    let ended = ENDED_WHILE_TRACED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (mut ended, _) = ENDED_KEPT
        .wait_timeout_while(ended, most, |ended| !ended.iter().any(|(p, _)| *p == pid))
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let at = ended.iter().position(|(p, _)| *p == pid)?;
    Some(ended.swap_remove(at).1)
}

/// Reaps a child if it has ended.
pub fn try_reap(pid: i32) -> Result<Option<Ended>, TargetError> {
    if let Some(ended) = kept_end(pid, std::time::Duration::ZERO) {
        return Ok(Some(ended));
    }
    match wait_raw(Pid::from_raw(pid), libc::WNOHANG) {
        Ok((reaped, status)) => Ok(Traced::of(reaped, status).ended()),
        // Reaped meanwhile by a wait for a ptrace stop, which keeps its status.
        Err(Errno::ECHILD) => kept_end(pid, KEEPING).map(Some).ok_or_else(|| system("cannot wait for the command")(Errno::ECHILD)),
        Err(e) => Err(system("cannot wait for the command")(e)),
    }
}

/// A file descriptor that becomes readable when a process ends (any
/// process, not only children).
pub fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process of `pidfd` has exited (its pidfd reads as ready).
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    let mut poll = [nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
    nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO).is_ok_and(|ready| ready > 0)
}

/// Sends a signal, ignoring a process that is already gone.
pub fn signal(pid: i32, sig: Signal) {
    let _ = signal::kill(Pid::from_raw(pid), sig);
}

/// The threads of a process.
pub fn threads(pid: i32) -> io::Result<BTreeSet<i32>> {
    let mut tids = BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.insert(tid);
        }
    }
    Ok(tids)
}

/// The name (`comm`) of a thread.
pub fn thread_name(pid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

/// The command line of a process.
pub fn command_line(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
        .unwrap_or_default()
}

/// Every thread of a process stopped by ptrace, released when dropped.
/// While the threads are stopped their CPU clocks stand still, so counters
/// opened one after another all start from the same point of each thread.
pub struct Frozen {
    stopped: Vec<Pid>,
    /// Signals that arrived while stopping, delivered on release.
    pending: std::sync::Mutex<Vec<(Pid, HeldSignal)>>,
    /// The process whose turn this is (see [`HoldTurns`]).
    turn: Option<i32>,
}

/// Processes one of proftap's threads holds still. A process has one
/// tracer thread at a time: a thread that would hold one another thread
/// holds (the in-process engine unpatching while the uprobes of another
/// part go in) waits for its turn rather than being refused. Holds are
/// short; a turn that does not come in [`TURN_WAIT`] (two threads each
/// holding a process the other waits for) is taken anyway, and ptrace
/// refuses it with a reason rather than proftap hanging.
struct HoldTurns {
    held: std::sync::Mutex<Vec<i32>>,
    released: std::sync::Condvar,
    /// Threads waiting for their turn now.
    waiting: std::sync::atomic::AtomicUsize,
}

/// How long a thread waits for its turn to hold a process.
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

static HOLD_TURNS: HoldTurns = HoldTurns {
    held: std::sync::Mutex::new(Vec::new()),
    released: std::sync::Condvar::new(),
    waiting: std::sync::atomic::AtomicUsize::new(0),
};

impl HoldTurns {
    fn take(&self, pid: i32) {
        use std::sync::atomic::Ordering::SeqCst;
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.waiting.fetch_add(1, SeqCst);
        let (mut held, _) = self
            .released
            .wait_timeout_while(held, TURN_WAIT, |held| held.contains(&pid))
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.waiting.fetch_sub(1, SeqCst);
        held.push(pid);
    }

    fn give_back(&self, pid: i32) {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = held.iter().position(|&p| p == pid) {
            held.swap_remove(at);
        }
        drop(held);
        self.released.notify_all();
    }
}

/// Why tracing `pid` was refused, and what allows it: no other tracer, and
/// root, or a process of one's own where Yama's `ptrace_scope` permits.
fn ptrace_refused(pid: i32) -> String {
    if let Some(tracer) = tracer_of(&pid.to_string()) {
        if std::fs::metadata(format!("/proc/self/task/{tracer}")).is_ok() {
            return format!("cannot hold process {pid} still: proftap's own thread {tracer} traces it still, which is a bug of proftap's");
        }
        return format!(
            "cannot hold process {pid} still: {} traces it already, and a process has one tracer at a time",
            tracer_named(tracer)
        );
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok());
    let why = match scope {
        Some(1) => {
            "kernel.yama.ptrace_scope is 1, which lets a process trace only its descendants: `sudo sysctl kernel.yama.ptrace_scope=0`, or run with sudo"
        }
        Some(2) => "kernel.yama.ptrace_scope is 2, which lets only root trace: run with sudo",
        Some(3) => "kernel.yama.ptrace_scope is 3, which forbids tracing until reboot",
        _ => "tracing another user's process needs root or CAP_SYS_PTRACE",
    };
    format!("cannot trace process {pid} to hold it still: {why}")
}

/// A process's tracer as a refusal names it: by its command, and what it
/// likely is (another proftap recording the process, else a debugger or
/// strace). The command is the tracer's to set: its control characters
/// are not passed to a terminal.
pub(crate) fn tracer_named(tracer: i32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
        .map(|c| c.trim_end().chars().map(|c| if c.is_control() { '?' } else { c }).collect::<String>());
    match comm {
        Ok(comm) if comm.starts_with("proftap") => format!("process {tracer} ({comm}: another proftap, recording it)"),
        Ok(comm) => format!("process {tracer} (its command: {comm}; a debugger or strace?)"),
        Err(_) => format!("process {tracer} (a debugger or strace?)"),
    }
}

/// The process tracing `pid`, if one does.
fn tracer_of(task: &str) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{task}/status")).ok()?;
    let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse::<i32>().ok()?;
    (tracer != 0).then_some(tracer)
}

impl Frozen {
    /// Stops every thread of `pid`, including threads created while stopping.
    pub fn freeze(pid: i32) -> Result<Frozen, TargetError> {
        HOLD_TURNS.take(pid);
        let mut frozen = Frozen { stopped: Vec::new(), pending: Default::default(), turn: Some(pid) };
        let options = ptrace::Options::PTRACE_O_TRACECLONE;
        loop {
            let tids =
                threads(pid).map_err(|e| TargetError::System { what: format!("cannot list the threads of process {pid}"), source: e })?;
            let new: Vec<i32> = tids.into_iter().filter(|t| !frozen.stopped.contains(&Pid::from_raw(*t))).collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                let tid = Pid::from_raw(tid);
                match ptrace::seize(tid, options) {
                    Ok(()) => {}
                    // The thread ended meanwhile.
                    Err(Errno::ESRCH) => continue,
                    // Traced by this thread already: a thread it took as it was
                    // made (PTRACE_O_TRACECLONE) that an earlier hold could not
                    // let go of. Held with the others, and let go with them.
                    Err(Errno::EPERM) if tracer_of(&format!("{pid}/task/{tid}")) == Some(nix::unistd::gettid().as_raw()) => {}
                    Err(Errno::EPERM) => return Err(TargetError::System { what: ptrace_refused(pid), source: Errno::EPERM.into() }),
                    Err(e) => return Err(system(format!("cannot stop thread {tid} of process {pid} with ptrace"))(e)),
                }
                frozen.stopped.push(tid);
                if ptrace::interrupt(tid).is_err() {
                    continue;
                }
                frozen.wait_stopped(tid);
            }
        }
        Ok(frozen)
    }

    /// Process `pid`, whose threads `tids` proftap traces already, stopped:
    /// released like the others.
    pub fn adopt(pid: i32, tids: Vec<i32>) -> Frozen {
        HOLD_TURNS.take(pid);
        Frozen { stopped: tids.into_iter().map(Pid::from_raw).collect(), pending: Default::default(), turn: Some(pid) }
    }

    /// Waits for the interrupt stop of `tid`; threads it created meanwhile
    /// arrive stopped (TRACECLONE) and are added.
    fn wait_stopped(&mut self, tid: Pid) {
        loop {
            match wait_traced(tid) {
                Ok(Traced::Event(libc::PTRACE_EVENT_CLONE)) => {
                    if let Ok(new) = ptrace::getevent(tid) {
                        let new = Pid::from_raw(new as i32);
                        let _ = wait_traced(new);
                        self.stopped.push(new);
                    }
                    // The cloning thread is in an event stop: it counts as stopped.
                    return;
                }
                Ok(Traced::Event(_)) => return,
                // A signal arrived first: the thread is stopped; pass the signal on at release.
                Ok(Traced::Signal(signal)) => {
                    self.defer(tid, signal);
                    return;
                }
                Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    }

    /// Keeps `signal`, which stopped `tid` while proftap ran it and was
    /// not delivered, with its information (a queued value, its sender),
    /// to be sent again when the threads are released.
    pub fn defer(&self, tid: Pid, signal: i32) {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((tid, HeldSignal::of(tid, signal)));
    }

    /// The stopped threads.
    pub fn threads(&self) -> Vec<i32> {
        self.stopped.iter().map(|p| p.as_raw()).collect()
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for tid in &self.stopped {
            let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            let (mine, others): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(t, _)| t == tid);
            *self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = others;
            let mut held: Vec<HeldSignal> = Vec::new();
            for (_, signal) in mine {
                // A signal below the real-time ones (32 and up, the
                // kernel's) held twice is delivered once; a real-time one
                // each time, in the order they came.
                if signal.signal < 32 && held.iter().any(|h| h.signal == signal.signal) {
                    continue;
                }
                held.push(signal);
            }
            // The first, which came first, is delivered as the thread
            // goes, with its own information, where the thread is at a
            // signal's stop: passed on at a stop of ptrace's own, a signal
            // is dropped (an event's, an interrupt's) or loses its
            // information (a system call's).
            let delivered = held.first().is_some_and(|first| first.put_at_signal_stop(*tid));
            let signal = if delivered { held[0].signal } else { 0 };
            // A thread taken as it was made and never seen stopped is
            // running: it can be let go of only once stopped, then with
            // the signal it stopped for, if any.
            if resume(*tid, Resume::Detach, signal) == Err(Errno::ESRCH) && ptrace::interrupt(*tid).is_ok() {
                let arrived = match wait_traced(*tid) {
                    Ok(Traced::Signal(arrived)) => arrived,
                    _ => 0,
                };
                let _ = resume(*tid, Resume::Detach, arrived);
            }
            let pid = self.turn.unwrap_or(tid.as_raw());
            for signal in held.iter().skip(usize::from(delivered)) {
                signal.send_again(pid, tid.as_raw());
            }
        }
        if let Some(pid) = self.turn {
            HOLD_TURNS.give_back(pid);
        }
    }
}

/// A signal that stopped a held thread and was not delivered.
#[derive(Clone, Copy)]
struct HeldSignal {
    signal: i32,
    /// Who or what sent it (`si_code`).
    code: i32,
    /// Its `siginfo_t`, as ptrace read it.
    info: [u8; SIGINFO_BYTES],
}

const SIGINFO_BYTES: usize = std::mem::size_of::<libc::siginfo_t>();

impl HeldSignal {
    /// `signal`, which thread `tid` is stopped for now, with its information.
    fn of(tid: Pid, signal: i32) -> HeldSignal {
        match ptrace::getsiginfo(tid) {
            Ok(info) if info.si_signo == signal => HeldSignal { signal, code: info.si_code, info: siginfo_bytes(&info) },
            _ => HeldSignal { signal, code: libc::SI_TKILL, info: [0; SIGINFO_BYTES] },
        }
    }

    /// Makes it the signal stopped thread `tid` is to be given as it goes
    /// (its information in place of that of the signal it is stopped
    /// for), if it is stopped for a signal: not at a stop of ptrace's own
    /// (an event, a system call, an interrupt), whose signal is dropped.
    /// The kernel keeps the information set so for a signal of its number,
    /// the sender's too (the C library's own signals, for `setuid` in
    /// threads, are heeded only from the process itself).
    fn put_at_signal_stop(&self, tid: Pid) -> bool {
        let Ok(now) = ptrace::getsiginfo(tid) else { return false };
        // ptrace's own stops carry the signal and the event or 0x80 as their code.
        if now.si_code > 0x7f && now.si_code & 0x7f == now.si_signo {
            return false;
        }
        // Not read when held: delivered as a tracer's.
        if self.info == [0; SIGINFO_BYTES] {
            return true;
        }
        // SAFETY: PTRACE_SETSIGINFO reads a siginfo_t, these bytes.
        let set = unsafe { libc::ptrace(libc::PTRACE_SETSIGINFO, tid.as_raw(), std::ptr::null_mut::<libc::c_void>(), self.info.as_ptr()) };
        set == 0
    }

    /// Sends thread `tid` of process `pid` the signal again: with its
    /// information where the kernel lets another process queue it (a
    /// value queued by `sigqueue`, a timer's), else as `tgkill` sends it;
    /// to the process if the thread has ended. Not a fault of the
    /// thread's own, which comes again as its instruction runs again.
    fn send_again(mut self, pid: i32, tid: i32) {
        let fault = matches!(self.signal, libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL);
        if fault && self.code > 0 {
            return;
        }
        // The kernel refuses to queue from another thread the information
        // of a signal it made (si_code ≥ 0) or of a tgkill.
        let mut queued = self.code < 0 && self.code != libc::SI_TKILL;
        // A full queue of real-time signals empties as the program runs on.
        for _ in 0..100 {
            // SAFETY: rt_tgsigqueueinfo reads the siginfo_t; tgkill and
            // kill take plain integers.
            let sent = unsafe {
                if queued {
                    libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, self.signal, self.info.as_mut_ptr())
                } else {
                    libc::syscall(libc::SYS_tgkill, pid, tid, self.signal)
                }
            };
            match (sent, Errno::last()) {
                (0, _) => return,
                (_, Errno::EAGAIN) => std::thread::sleep(std::time::Duration::from_millis(1)),
                // Its information refused: sent as tgkill sends it.
                (_, Errno::EPERM | Errno::EINVAL) if queued => queued = false,
                // The thread ended: the process has it.
                (_, Errno::ESRCH) => {
                    // SAFETY: kill takes plain integers.
                    unsafe { libc::kill(pid, self.signal) };
                    return;
                }
                _ => return,
            }
        }
    }
}

/// The signals sent to a stopped thread held back while proftap steps it
/// through code of its own making, then unblocked as before (when
/// dropped): signals that come meanwhile wait in the kernel, in the order
/// they came, rather than stop the thread and be held here. Not those an
/// instruction raises (a step's own trap among them): the kernel forces
/// one that is blocked through, resetting its handler to the default.
pub(crate) struct SignalsBlocked {
    tid: Pid,
    saved: Option<u64>,
}

impl SignalsBlocked {
    pub(crate) fn new(tid: Pid) -> SignalsBlocked {
        let mut saved = 0u64;
        let raised = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGSYS];
        let raised = raised.iter().fold(0u64, |mask, &signal| mask | 1 << (signal - 1));
        let mask = |request, mask: *const u64| {
            // SAFETY: PTRACE_[GS]ETSIGMASK read or write the 8 bytes of a
            // kernel signal set at `mask`.
            unsafe { libc::ptrace(request, tid.as_raw(), std::mem::size_of::<u64>(), mask) == 0 }
        };
        let blocked = mask(libc::PTRACE_GETSIGMASK, &raw mut saved) && {
            let sent = !raised | (saved & raised);
            mask(libc::PTRACE_SETSIGMASK, &raw const sent)
        };
        SignalsBlocked { tid, saved: blocked.then_some(saved) }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        if let Some(saved) = self.saved {
            // SAFETY: as in `new`.
            unsafe { libc::ptrace(libc::PTRACE_SETSIGMASK, self.tid.as_raw(), std::mem::size_of::<u64>(), &raw const saved) };
        }
    }
}

fn siginfo_bytes(info: &libc::siginfo_t) -> [u8; SIGINFO_BYTES] {
    let mut bytes = [0u8; SIGINFO_BYTES];
    // SAFETY: siginfo_t is plain data of this size.
    unsafe { std::ptr::copy_nonoverlapping((info as *const libc::siginfo_t).cast::<u8>(), bytes.as_mut_ptr(), SIGINFO_BYTES) };
    bytes
}

/// Raises the open-file limit to its maximum: every probe event is a
/// descriptor per task, CPU and counter, every followed child's memory one.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal names the tracer: another proftap (its threads are
    /// named `proftap-...`) as such, any other as a likely debugger.
    #[test]
    fn a_tracer_is_named_by_its_command() {
        // A thread's name is its command in /proc, set before it runs.
        let named_as = |name: &str| {
            let (tid_sent, tid) = std::sync::mpsc::channel();
            let (done, wait) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    tid_sent.send(nix::unistd::gettid().as_raw()).expect("the test waits");
                    let _ = wait.recv();
                })
                .expect("a thread");
            let tid = tid.recv().expect("its thread id");
            let named = tracer_named(tid);
            done.send(()).expect("the thread waits");
            thread.join().expect("the thread ends");
            (tid, named)
        };
        let (tid, named) = named_as("proftap-forks");
        assert_eq!(named, format!("process {tid} (proftap-forks: another proftap, recording it)"));
        let (tid, named) = named_as("strace\x1b[2J");
        assert_eq!(named, format!("process {tid} (its command: strace?[2J; a debugger or strace?)"));
    }

    /// `sh -c 'touch FILE'`, held.
    fn held_touch(file: &Path, launch: &Launch) -> HeldChild {
        let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), "touch \"$0\"".into(), file.into()];
        spawn_held(Path::new("/bin/sh"), &argv, launch).expect("forked")
    }

    /// Whether `pid` is still a child of this process to be waited for.
    fn unreaped(pid: i32) -> bool {
        waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG)) != Err(Errno::ECHILD)
    }

    #[test]
    fn a_held_child_never_released_runs_nothing_and_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let mut held = held_touch(&ran, &Launch::default());
        held.ready().expect("ready");
        let pid = held.pid();
        drop(held);
        assert!(!unreaped(pid), "the child was left to be reaped");
        assert!(!ran.exists(), "the program ran");
        // Dropped before it was ready, as a failed preparation drops it.
        let held = held_touch(&ran, &Launch::default());
        let pid = held.pid();
        drop(held);
        assert!(!unreaped(pid));
        // Stopped by a signal meanwhile: ended all the same, not waited for forever.
        let mut held = held_touch(&ran, &Launch::default());
        held.ready().expect("ready");
        let pid = held.pid();
        nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP).unwrap();
        drop(held);
        assert!(!unreaped(pid));
        assert!(!ran.exists());
    }

    #[test]
    fn a_held_child_that_cannot_get_ready_says_why_and_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let launch = Launch { cwd: Some(dir.path().join("missing")), ..Launch::default() };
        let mut held = held_touch(&ran, &launch);
        let pid = held.pid();
        let error = held.ready().expect_err("no such directory").to_string();
        assert!(error.contains("No such file or directory"), "{error}");
        assert!(!unreaped(pid));
        assert!(held.ready().is_err(), "a child gone is not ready");
        assert!(held.release().is_err(), "a child gone is not released");
        assert!(!ran.exists());
    }

    #[test]
    fn a_released_child_killed_is_ended_and_reaped_and_one_reaped_already_is_left_alone() {
        let argv: Vec<OsString> = vec!["sleep".into(), "60".into()];
        let mut held = spawn_held(Path::new("/bin/sleep"), &argv, &Launch::default()).expect("forked");
        held.release().expect("released");
        let pid = held.pid();
        let started = std::time::Instant::now();
        held.kill();
        assert!(!unreaped(pid));
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "waited for the program to end by itself");
        let dir = tempfile::tempdir().unwrap();
        let mut held = held_touch(&dir.path().join("ran"), &Launch::default());
        held.release().expect("released");
        waitpid(Pid::from_raw(held.pid()), None).expect("reaped here");
        held.kill();
    }

    /// A held child of `ran`, traced as a launch traces it.
    fn held_traced(ran: &Path) -> (HeldChild, Pid) {
        let mut held = held_touch(ran, &Launch::default());
        held.ready().expect("ready");
        let pid = Pid::from_raw(held.pid());
        nix::sys::ptrace::seize(pid, nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC).expect("traced");
        (held, pid)
    }

    fn executed_and_let_go(pid: Pid) {
        let exec = nix::sys::wait::WaitStatus::PtraceEvent(pid, nix::sys::signal::Signal::SIGTRAP, libc::PTRACE_EVENT_EXEC);
        assert_eq!(waitpid(pid, None).expect("waited"), exec);
        nix::sys::ptrace::detach(pid, None).expect("let go");
        assert_eq!(waitpid(pid, None).expect("waited"), nix::sys::wait::WaitStatus::Exited(pid, 0));
    }

    /// A signal that reaches a traced child before its exec stops it for
    /// proftap: it is passed on as it came, and the child goes on to its
    /// exec, or ends if the signal ends it.
    #[test]
    fn a_traced_child_signalled_before_its_exec_is_not_left_stopped() {
        use nix::sys::signal::{Signal, kill};
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        // Ignored by default, and reported to a tracer all the same.
        let (mut held, pid) = held_traced(&ran);
        kill(pid, Signal::SIGWINCH).unwrap();
        held.release().expect("released");
        executed_and_let_go(pid);
        assert!(ran.exists());

        std::fs::remove_file(&ran).unwrap();
        let (mut held, pid) = held_traced(&ran);
        kill(pid, Signal::SIGUSR1).unwrap();
        held.release().expect("released");
        assert_eq!(waitpid(pid, None).expect("waited"), nix::sys::wait::WaitStatus::Signaled(pid, Signal::SIGUSR1, false));
        assert!(!ran.exists(), "ended by the signal before its exec");

        // Stopped as a stop signal stops it, until a SIGCONT.
        let (mut held, pid) = held_traced(&ran);
        kill(pid, Signal::SIGSTOP).unwrap();
        let mut passed = Vec::new();
        while passed.last() != Some(&PassedOn::GroupStop) {
            match pass_on_signal_stop(pid) {
                PassedOn::Nothing => std::thread::yield_now(),
                done => passed.push(done),
            }
        }
        assert_eq!(passed, [PassedOn::Signal(libc::SIGSTOP), PassedOn::GroupStop]);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        assert!(matches!(state, Some(Some('t' | 'T'))), "still stopped: {stat}");
        kill(pid, Signal::SIGCONT).unwrap();
        held.release().expect("released");
        executed_and_let_go(pid);
        assert!(ran.exists());
    }

    /// A child killed after it was seen stopped is not reaped by taking
    /// its stop: its end is left for the wait that records it.
    #[test]
    fn taking_a_stop_leaves_a_killed_childs_end_to_be_reaped() {
        use nix::sys::signal::{Signal, kill};
        let dir = tempfile::tempdir().unwrap();
        let (mut held, pid) = held_traced(&dir.path().join("ran"));
        kill(pid, Signal::SIGUSR1).unwrap();
        // Stopped for the signal, as its tracer sees it.
        while !matches!(waitid_peek(pid), Some(libc::CLD_TRAPPED)) {
            std::thread::yield_now();
        }
        assert!(took_trapped_stop(pid), "the stop is taken");
        assert!(!took_trapped_stop(pid), "and only once");
        kill(pid, Signal::SIGKILL).unwrap();
        while !matches!(waitid_peek(pid), Some(libc::CLD_KILLED)) {
            std::thread::yield_now();
        }
        assert!(!took_trapped_stop(pid), "no stop to take");
        // Reaped below: never killed again, under a pid that may be another's.
        held.go = None;
        assert_eq!(waitpid(pid, None).expect("its end is there"), nix::sys::wait::WaitStatus::Signaled(pid, Signal::SIGKILL, false));
    }

    /// The state change child `pid` has to report, left to be waited for.
    fn waitid_peek(pid: Pid) -> Option<i32> {
        // SAFETY: an all-zero siginfo_t is valid; waitid writes only it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let peek = libc::WSTOPPED | libc::WEXITED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
        // SAFETY: as above.
        let found = unsafe { libc::waitid(libc::P_PID, pid.as_raw() as libc::id_t, &mut info, peek) } == 0
            && unsafe { info.si_pid() } == pid.as_raw();
        found.then_some(info.si_code)
    }

    #[test]
    fn a_held_child_released_runs_the_program() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let mut held = held_touch(&ran, &Launch::default());
        held.release().expect("released");
        let status = waitpid(Pid::from_raw(held.pid()), None).expect("waited");
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(Pid::from_raw(held.pid()), 0));
        assert!(ran.exists());
    }

    #[test]
    fn a_thread_that_would_hold_a_process_another_holds_waits_for_its_turn() {
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("sleep runs");
        let pid = child.id() as i32;
        let first = Frozen::freeze(pid).expect("held");
        let waiting_before = HOLD_TURNS.waiting.load(std::sync::atomic::Ordering::SeqCst);
        let second = std::thread::spawn(move || Frozen::freeze(pid).map(|f| f.threads()));
        // Until the second thread waits for its turn (or ends, refused).
        while HOLD_TURNS.waiting.load(std::sync::atomic::Ordering::SeqCst) == waiting_before && !second.is_finished() {
            std::thread::yield_now();
        }
        drop(first);
        let started = std::time::Instant::now();
        let held = second.join().expect("joined");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(held.expect("held in its turn, not refused"), vec![pid]);
        assert!(started.elapsed() < TURN_WAIT / 2, "the turn came when the first hold ended, not at the wait's end");
    }

    #[test]
    // Reaped by wait_traced, not by the Child.
    #[allow(clippy::zombie_processes)]
    fn an_end_taken_by_a_wait_for_a_ptrace_stop_is_still_reaped() {
        let child = std::process::Command::new("sh").args(["-c", "exit 3"]).spawn().expect("sh runs");
        let pid = child.id() as i32;
        // As when the command exits while its threads are being stopped:
        // the wait meant for a ptrace stop reaps it.
        let status = wait_traced(Pid::from_raw(pid)).expect("the child can be waited for");
        assert_eq!(status, Traced::Exited(3));
        assert_eq!(try_reap(pid).expect("no error"), Some(Ended::Exited(3)));
    }

    #[test]
    #[allow(clippy::zombie_processes)]
    fn an_end_taken_by_another_thread_is_reaped_whenever_it_is_asked_for() {
        for _ in 0..20 {
            let child = std::process::Command::new("sh").args(["-c", "exit 5"]).spawn().expect("sh runs");
            let pid = child.id() as i32;
            let waiter = std::thread::spawn(move || wait_traced(Pid::from_raw(pid)));
            // Asked while, before or after the other thread reaps it: the end, never an error.
            let ended = loop {
                if let Some(ended) = try_reap(pid).expect("no error") {
                    break ended;
                }
                std::thread::yield_now();
            };
            assert_eq!(ended, Ended::Exited(5));
            let _ = waiter.join();
        }
    }
}

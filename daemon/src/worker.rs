//! A session worker: the process that records one session. proftapd starts
//! it as root with the user's ids on its command line and the channel on
//! descriptor 3; it becomes that user (see [`crate::privileges`]) before it
//! reads the session's request, then parses, prepares and records as the
//! user would, asking proftapd only for what needs root: defining uprobes in
//! tracefs and the machine's measured probe cost.

use crate::channel::Channel;
use crate::messages::{Answer, Assignment, ProbeRequest, Report, Snapshot};
use clap::Parser;
use proftap_cli::commands::record::{AttachArgs, Prepared, RunArgs, prepare_attach, prepare_run};
use proftap_cli::session::StartArgs;
use proftap_probes::exits::ExitMode;
use proftap_probes::target::Launch;
use proftap_probes::tracefs::{DefinedGroup, ProbeEvent, TracefsError, UprobeHost, UprobeSpec};
use proftap_record::recorder::{Control, ProbeCost, Progress};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The hidden argument proftapd starts a worker with.
pub const ARGUMENT: &str = "__session-worker";
/// Where the worker finds its channel.
pub const CHANNEL_FD: i32 = 3;

/// The channel, shared by the threads that send on it; a request and its
/// answer are one exchange under the lock.
#[derive(Clone)]
struct Daemon(Arc<Mutex<Channel>>);

impl Daemon {
    fn report(&self, report: &Report, fds: &[std::os::fd::BorrowedFd<'_>]) -> std::io::Result<()> {
        self.0.lock().map_err(|_| std::io::Error::other("the channel broke"))?.send(report, fds)
    }

    fn ask(&self, request: &Report, fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<Answer, String> {
        let channel = self.0.lock().map_err(|_| "the channel to proftapd broke".to_string())?;
        channel.send(request, fds).map_err(|e| format!("cannot ask proftapd: {e}"))?;
        match channel.receive::<Answer>() {
            Ok(Some((answer, _))) => Ok(answer),
            Ok(None) => Err("proftapd went away".into()),
            Err(e) => Err(format!("proftapd's answer is unreadable: {e}")),
        }
    }

    fn probe_cost(&self, exits: ExitMode, fresh: bool) -> Option<ProbeCost> {
        match self.ask(&Report::Calibrate { exits, fresh }, &[]) {
            Ok(Answer::Cost(cost)) => cost,
            _ => None,
        }
    }
}

/// Uprobes defined by proftapd for this process.
struct RemoteHost(Daemon);

struct RemoteGroup {
    daemon: Daemon,
    group: u64,
}

impl UprobeHost for RemoteHost {
    fn define(&self, specs: &[UprobeSpec]) -> Result<(Box<dyn DefinedGroup>, Vec<ProbeEvent>), TracefsError> {
        // Each file is opened here, as the user: proftapd probes only what they may read.
        let mut paths: Vec<&std::path::Path> = Vec::new();
        let mut probes = Vec::with_capacity(specs.len());
        for spec in specs {
            let file = match paths.iter().position(|p| *p == spec.path.as_path()) {
                Some(i) => i,
                None => {
                    paths.push(&spec.path);
                    paths.len() - 1
                }
            };
            probes.push(ProbeRequest { file: file as u32, offset: spec.offset.0, kind: spec.kind });
        }
        let files: Vec<std::fs::File> = paths
            .iter()
            .map(|p| std::fs::File::open(p).map_err(|e| TracefsError::Host(format!("cannot open {} to probe it: {e}", p.display()))))
            .collect::<Result<_, _>>()?;
        let fds: Vec<_> = files.iter().map(AsFd::as_fd).collect();
        match self.0.ask(&Report::Define { probes }, &fds).map_err(TracefsError::Host)? {
            Answer::Defined { group, events } => Ok((Box::new(RemoteGroup { daemon: self.0.clone(), group }), events)),
            Answer::Refused(why) => Err(TracefsError::Host(why)),
            other => Err(TracefsError::Host(format!("proftapd answered a definition with {other:?}"))),
        }
    }
}

impl DefinedGroup for RemoteGroup {
    fn keep(&mut self) {
        let _ = self.daemon.ask(&Report::Keep { group: self.group }, &[]);
    }
}

impl Drop for RemoteGroup {
    fn drop(&mut self) {
        let _ = self.daemon.report(&Report::Remove { group: self.group }, &[]);
    }
}

/// The worker process: `proftapd __session-worker UID GID`.
pub fn main(args: &[String]) -> ExitCode {
    let ids = (args.first().and_then(|u| u.parse::<u32>().ok()), args.get(1).and_then(|g| g.parse::<u32>().ok()));
    let (Some(uid), Some(gid)) = ids else { return ExitCode::from(2) };
    if uid != 0 {
        let groups = crate::access::groups(uid, gid);
        if let Err(e) = crate::privileges::become_user(uid, gid, &groups) {
            eprintln!("proftapd worker: {e}");
            return ExitCode::from(2);
        }
    }
    // The parent's death is the end of the session: detach cleanly.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    // SAFETY: proftapd put the channel on this descriptor and nothing else owns it.
    let channel = Channel::new(UnixStream::from(unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) }));
    let (assignment, stdio) = match channel.receive::<Assignment>() {
        Ok(Some(received)) => received,
        _ => return ExitCode::from(2),
    };
    use_streams(stdio);
    let daemon = Daemon(Arc::new(Mutex::new(channel)));
    if proftap_probes::tracefs::set_host(Box::new(RemoteHost(daemon.clone()))).is_err() {
        return ExitCode::from(2);
    }
    let report = match record(&assignment, &daemon) {
        Ok(profile) => finished(&daemon, &profile),
        Err(error) => daemon.report(&Report::Failed { error }, &[]),
    };
    if report.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// The user's standard streams, when the client sent them, become the
/// worker's, and so the launched program's; else they stay /dev/null.
fn use_streams(stdio: Vec<OwnedFd>) {
    if stdio.len() == 3 {
        for (target, fd) in stdio.iter().enumerate() {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(fd), target as i32) };
        }
    }
}

fn finished(daemon: &Daemon, profile: &proftap_profile::Profile) -> std::io::Result<()> {
    let memfd = nix::sys::memfd::memfd_create("proftap-profile", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(memfd);
    proftap_profile::write_profile_to(&mut file, profile)?;
    daemon.report(&Report::Finished, &[file.as_fd()])
}

/// `session start` arguments, parsed here as the user.
#[derive(Parser)]
#[command(name = "session start", no_binary_name = true)]
struct Start {
    #[command(flatten)]
    args: StartArgs,
}

fn record(assignment: &Assignment, daemon: &Daemon) -> Result<proftap_profile::Profile, String> {
    let start = Start::try_parse_from(&assignment.args).map_err(|e| first_line(&e.to_string()))?.args;
    let _ = daemon.report(&Report::Target { description: describe(&start) }, &[]);
    check_limits(&start, assignment)?;
    let mut prepared = prepare(&start, assignment)?;
    if !assignment.root && prepared.functions.len() > assignment.limits.functions {
        return Err(format!(
            "this session would probe {} functions; proftapd lets users other than root probe {} at most: name fewer with -f",
            prepared.functions.len(),
            assignment.limits.functions
        ));
    }
    prepared.options.cost = daemon.probe_cost(prepared.exit_mode, start.record.recalibrate);
    let control = Control::default();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(signal, control.detach.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    prepared.options.control = control;
    let progress = Arc::new(Progress::default());
    prepared.options.progress = Some(progress.clone());
    let reporter = Reporter::start(daemon.clone(), progress);
    let recorded = prepared.record().map_err(|e| proftap_cli::output::error_sentence(&e));
    reporter.stop();
    Ok(recorded?.profile)
}

fn check_limits(start: &StartArgs, assignment: &Assignment) -> Result<(), String> {
    if start.record.output.is_some() {
        return Err("proftapd returns profiles over its socket, not to a file: use `proftap session fetch ID -o FILE`".into());
    }
    if !assignment.root && start.record.buffer_size > assignment.limits.buffer_mib {
        return Err(format!(
            "--buffer-size {} is over the {} MiB proftapd allows users other than root",
            start.record.buffer_size, assignment.limits.buffer_mib
        ));
    }
    Ok(())
}

fn prepare(start: &StartArgs, assignment: &Assignment) -> Result<Prepared, String> {
    let sentence = |e: anyhow::Error| proftap_cli::output::error_sentence(&e);
    match (start.pid, start.command.is_empty()) {
        (Some(pid), _) => {
            // The kernel decides when the worker opens or traces the process;
            // this says why first, in words.
            crate::access::may_profile(assignment.root, assignment.client_pid, pid)?;
            prepare_attach(&AttachArgs { record: start.record.clone(), attach: start.attach.clone(), pid }).map_err(sentence)
        }
        (None, false) => {
            let launch = Launch { cwd: Some(assignment.cwd.clone()), env: Some(assignment.env.iter().map(Into::into).collect()) };
            prepare_run(&RunArgs { record: start.record.clone(), command: start.command.clone() }, launch).map_err(sentence)
        }
        (None, true) => Err("session start needs a process (--pid PID) or a command (-- CMD ARGS...)".into()),
    }
}

/// Sends the recording's progress to proftapd while it runs.
struct Reporter {
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    fn start(daemon: Daemon, progress: Arc<Progress>) -> Reporter {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let thread = std::thread::spawn(move || {
            let mut last = None;
            loop {
                let ended = stop.load(Ordering::Acquire);
                let now = Snapshot {
                    started: progress.started.load(Ordering::Acquire),
                    pid: progress.pid.load(Ordering::Relaxed),
                    functions: progress.functions.load(Ordering::Relaxed),
                    events: progress.hits.load(Ordering::Relaxed),
                    lost: progress.lost.load(Ordering::Relaxed),
                };
                if last != Some(now) {
                    if daemon.report(&Report::Progress(now), &[]).is_err() {
                        return;
                    }
                    last = Some(now);
                }
                if ended {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Reporter { done, thread: Some(thread) }
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a session records, for `session list`: the command line, or `pid N (command)`.
fn describe(start: &StartArgs) -> String {
    match start.pid {
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        }
        None => start.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
    }
}

/// clap's errors run over several lines; the first says what is wrong.
fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).trim_start_matches("error: ").to_string()
}

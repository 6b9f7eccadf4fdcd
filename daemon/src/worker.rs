//! A session worker: the process that records one session. proftapd starts
//! it as root with the user's ids on its command line and the channel on
//! descriptor 3; it becomes that user (see [`crate::privileges`]) before it
//! reads the session's request, then prepares and records as the user
//! would, asking proftapd only for what needs root: defining uprobes in
//! tracefs and the machine's measured probe cost. What the recording tells
//! goes to proftapd as it happens.

use crate::channel::Channel;
use crate::messages::{Answer, Assignment, ProbeRequest, Report};
use proftap_record::calibration::CalibrationError;
use proftap_record::cost::ProbeCost;
use proftap_record::error::sentence;
use proftap_record::host::{DefinedGroup, ExitMode, ProbeEvent, TracefsError, UprobeHost, UprobeSpec};
use proftap_record::observer::{Observer, RecordEvent};
use proftap_record::options::Control;
use proftap_record::prepare::{ProbeCostSource, prepare};
use proftap_record::request::{RecordRequest, RecordTarget};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

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

    /// The off-CPU array proftapd loads for this session, if it can.
    fn off_cpu(&self) -> Option<proftap_record::host::OffCpu> {
        let channel = self.0.lock().ok()?;
        channel.send(&Report::OffCpu, &[]).ok()?;
        match channel.receive::<Answer>() {
            Ok(Some((Answer::OffCpu { entries }, mut fds))) if fds.len() == 1 => {
                Some(proftap_record::host::OffCpu::lent(fds.remove(0), entries))
            }
            _ => None,
        }
    }
}

impl ProbeCostSource for Daemon {
    fn probe_cost(&self, exits: ExitMode, fresh: bool) -> Result<ProbeCost, CalibrationError> {
        match self.ask(&Report::Calibrate { exits, fresh }, &[]).map_err(CalibrationError::new)? {
            Answer::Cost(cost) => cost.map_err(CalibrationError::new),
            other => Err(CalibrationError::new(format!("proftapd answered with {other:?}"))),
        }
    }
}

/// Forwards what the recording tells to proftapd.
impl Observer for Daemon {
    fn event(&self, event: RecordEvent) {
        let _ = self.report(&Report::Event(event), &[]);
    }
}

/// Forwards what the recording tells to proftapd from a thread of its
/// own, in order: the recording's reading thread must not wait while
/// another holds the channel for an exchange (defining a new probe set
/// takes seconds with thousands of uprobes), or its rings overflow.
struct Forwarder {
    queue: Mutex<Option<std::sync::mpsc::Sender<RecordEvent>>>,
    sending: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Forwarder {
    fn start(daemon: Daemon) -> Self {
        let (queue, events) = std::sync::mpsc::channel::<RecordEvent>();
        let sending = std::thread::spawn(move || {
            for event in events {
                let _ = daemon.report(&Report::Event(event), &[]);
            }
        });
        Forwarder { queue: Mutex::new(Some(queue)), sending: Mutex::new(Some(sending)) }
    }

    /// Waits until everything told so far is sent.
    fn finish(&self) {
        drop(self.queue.lock().ok().and_then(|mut q| q.take()));
        if let Some(sending) = self.sending.lock().ok().and_then(|mut s| s.take()) {
            let _ = sending.join();
        }
    }
}

impl Observer for Forwarder {
    fn event(&self, event: RecordEvent) {
        if let Some(queue) = self.queue.lock().ok().as_ref().and_then(|q| q.as_ref()) {
            let _ = queue.send(event);
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
    let channel = UnixStream::from(unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) });
    // Put there by dup2, which clears close-on-exec: the program a session
    // launches would hold a channel to proftapd as if it were this worker.
    if let Err(e) = nix::fcntl::fcntl(&channel, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)) {
        eprintln!("proftapd worker: cannot keep the channel from the programs it runs: {e}");
        return ExitCode::from(2);
    }
    let channel = Channel::new(channel);
    let (assignment, stdio) = match channel.receive::<Assignment>() {
        Ok(Some(received)) => received,
        _ => return ExitCode::from(2),
    };
    use_streams(stdio);
    let daemon = Daemon(Arc::new(Mutex::new(channel)));
    if proftap_record::host::set_host(Box::new(RemoteHost(daemon.clone()))).is_err() {
        return ExitCode::from(2);
    }
    let lender = daemon.clone();
    if proftap_record::host::set_off_cpu_source(Box::new(move || lender.off_cpu())).is_err() {
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
    let mut file = std::fs::File::from(proftap_probes::memfd::never_executable(c"proftap-profile")?);
    proftap_profile::write_profile_to(&mut file, profile)?;
    daemon.report(&Report::Finished, &[file.as_fd()])
}

fn record(assignment: &Assignment, daemon: &Daemon) -> Result<proftap_profile::Profile, String> {
    let request = assignment.request.open().map_err(|e| format!("proftapd cannot read this request: {e}"))?;
    let _ = daemon.report(&Report::Target { description: describe(&request, comm) }, &[]);
    check_limits(&request, assignment)?;
    if let RecordTarget::Attach { pid, .. } = request.target {
        // The kernel decides when the worker opens or traces the process;
        // this says why first, in words.
        crate::access::may_profile(assignment.root, assignment.client_pid, pid)?;
    }
    let prepared = prepare(&request, daemon, daemon).map_err(|e| sentence(&e))?;
    if !assignment.root && prepared.functions() > assignment.limits.functions {
        return Err(format!(
            "this session would probe {} functions; proftapd lets users other than root probe {} at most: name fewer with -f",
            prepared.functions(),
            assignment.limits.functions
        ));
    }
    let control = Control::default();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(signal, control.detach.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let forwarder = Arc::new(Forwarder::start(daemon.clone()));
    let recorded = prepared.record(control, forwarder.clone());
    forwarder.finish();
    Ok(recorded.map_err(|e| sentence(&e))?.profile)
}

/// The limits proftapd sets on users other than root, on what the request asks.
pub fn check_limits(request: &RecordRequest, assignment: &Assignment) -> Result<(), String> {
    if !assignment.root && request.buffer_mib > assignment.limits.buffer_mib {
        return Err(format!(
            "a ring buffer of {} MiB per CPU is over the {} MiB proftapd allows users other than root (--buffer-size)",
            request.buffer_mib, assignment.limits.buffer_mib
        ));
    }
    Ok(())
}

/// What a session records, for `session list`: the command line, or `pid
/// N (command)`, the command named by `comm`.
pub fn describe(request: &RecordRequest, comm: impl FnOnce(i32) -> String) -> String {
    match &request.target {
        RecordTarget::Attach { pid, .. } => format!("pid {pid} ({})", comm(*pid).trim()),
        RecordTarget::Launch { command, .. } => command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
    }
}

/// The command process `pid` runs, as the kernel names it.
fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default()
}

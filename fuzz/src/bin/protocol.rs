//! The session protocol on any bytes, as proftapd reads them, and the checks
//! it makes of what it reads that need no root.
//!
//! The input is lines. As a client's (any local user's): the lines of its
//! connection, bounded (`take_line`); the first a `Hello`, which must speak
//! proftapd's version; each next a `Request`. A start request's sealed
//! recording request goes to a worker in its assignment and is opened there,
//! described, held to the limits of users other than root and validated;
//! what the recorder derives from it (patterns, metrics, sampling, the
//! governor, the buffer, the deadline) is derived.
//!
//! As a session worker's (which runs as its user): each line is a frame's
//! body on the worker's channel, a real socket, and what proftapd decodes
//! from it is a `Report`, checked as the broker does (uprobe definitions
//! against the limit and the files sent, targets, warnings and changes
//! kept within bounds). A line that starts with a NUL byte goes on the
//! channel as it is, frame header and all.

use proftap_probes::metrics::Metric;
use proftap_probes::select::Selection;
use proftap_record::protocol::{Hello, PROTOCOL_VERSION, Request, SessionInfo, State};
use proftap_record::request::{RecordRequest, RecordTarget};
use proftapd::channel::Channel;
use proftapd::messages::{Assignment, Limits, Report};
use std::io::Write;
use std::os::unix::net::UnixStream;

proftap_fuzz::target!(run);

/// proftapd's limits unless told otherwise (`proftapd --help`).
const LIMITS: Limits = Limits { sessions_per_user: 4, functions: 20_000, probes: 200_000, buffer_mib: 64, profile_mib: 1024 };

fn run(data: &[u8]) {
    client(data);
    worker(data);
}

/// A client's connection.
fn client(data: &[u8]) {
    let mut buffer = data.to_vec();
    let Ok(Some(hello)) = proftapd::connection::take_line(&mut buffer) else { return };
    if !serde_json::from_str::<Hello>(&hello).is_ok_and(|h| h.protocol == PROTOCOL_VERSION) {
        return;
    }
    while let Ok(Some(line)) = proftapd::connection::take_line(&mut buffer) {
        if let Ok(Request::Start { request }) = serde_json::from_str::<Request>(&line) {
            // The daemon sends it to the worker unread, which opens it.
            let assignment = Assignment { request, client_pid: None, limits: LIMITS, root: false };
            let Ok(sent) = serde_json::to_vec(&assignment) else { continue };
            let assignment: Assignment = serde_json::from_slice(&sent).expect("an assignment reads back");
            if let Ok(request) = assignment.request.open() {
                start(&request, &assignment);
            }
        }
    }
}

/// What a worker checks of a start request before it reads a file, and
/// what preparing the recording derives from one it accepts.
fn start(request: &RecordRequest, assignment: &Assignment) {
    let description = proftapd::worker::describe(request, |pid| format!("comm of {pid}\n"));
    let _ = proftapd::broker::kept_target(&description);
    let _ = proftapd::worker::check_limits(request, assignment);
    if request.validate().is_err() {
        return;
    }
    let _ = Selection::parse(&request.functions);
    for name in request.metrics.iter().flat_map(|l| l.split(',')).filter(|n| !n.trim().is_empty()) {
        let _ = Metric::parse(name);
    }
    let _ = (request.is_hybrid(), request.sample_settings(), request.overhead_budget(false), request.buffer_bytes());
    if let RecordTarget::Attach { duration, auto_instrument, .. } = request.target {
        // The recorder's deadline and its warm-up in nanoseconds.
        let _ = duration.map(|d| std::time::Instant::now() + d);
        if let Some(auto) = auto_instrument {
            assert!(u64::try_from(auto.warmup.as_nanos()).is_ok(), "a warm-up of {:?} passed the checks", auto.warmup);
        }
    }
}

/// A worker's side of its channel.
fn worker(data: &[u8]) {
    let Ok((ours, theirs)) = UnixStream::pair() else { return };
    // What fits in the socket's buffer: the rest is lost, as if the worker died.
    let _ = theirs.set_nonblocking(true);
    let mut sent = 0usize;
    for line in data.split(|&b| b == b'\n') {
        let frame = match line.split_first() {
            Some((0, raw)) => raw.to_vec(),
            _ => {
                let mut frame = Vec::with_capacity(8 + line.len());
                frame.extend_from_slice(&(line.len() as u32).to_le_bytes());
                frame.extend_from_slice(&0u32.to_le_bytes());
                frame.extend_from_slice(line);
                frame
            }
        };
        match (&theirs).write(&frame) {
            Ok(n) if n == frame.len() => sent += n,
            _ => break,
        }
    }
    drop(theirs);
    let channel = Channel::new(ours);
    let mut session = SessionInfo::new(1, 1000, State::Running, 0);
    let mut defined = 0usize;
    while let Ok(Some((report, fds))) = channel.receive::<Report>() {
        assert!(fds.is_empty(), "{} descriptors from {sent} bytes that carried none", fds.len());
        match report {
            // As if it had sent three files.
            Report::Define { probes } if proftapd::broker::check_definition(&probes, 3, defined, Some(LIMITS.probes)).is_ok() => {
                defined += probes.len();
            }
            Report::Define { .. } => {}
            Report::Target { description } => session.target = proftapd::broker::kept_target(&description),
            Report::Event(event) => match event {
                proftap_record::observer::RecordEvent::Warning(w) => proftapd::sessions::keep_told(&mut session.warnings, w),
                proftap_record::observer::RecordEvent::ProbesChanged(n) => proftapd::sessions::keep_told(&mut session.changes, n),
                _ => {}
            },
            _ => {}
        }
    }
    assert!(session.warnings.len() <= proftapd::sessions::MOST_TOLD && session.changes.len() <= proftapd::sessions::MOST_TOLD);
}

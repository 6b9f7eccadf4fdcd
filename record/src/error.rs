//! What can go wrong recording, and errors as one line for the user.

use proftap_probes::target::TargetError;
use proftap_probes::tracefs::TracefsError;

/// One line: the error and its causes, without repeating a cause the
/// message already states. Control characters an error quotes (from a
/// file's names, say) are escaped to keep it one line.
pub fn sentence(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    if text.contains(char::is_control) {
        text = text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect();
    }
    text
}

/// Errors of a recording.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// tracefs trouble.
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    /// Launching or attaching failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// perf_event_open or a ring buffer failed.
    #[error("cannot open perf events on {what}: {source}{hint}")]
    Perf {
        /// Which task or probe.
        what: String,
        /// Why.
        source: std::io::Error,
        /// What to do, starting with "; ".
        hint: String,
    },
    /// Nothing to probe.
    #[error("no function to probe")]
    NothingToProbe,
    /// The in-process engine could not be set up.
    #[error("the in-process engine cannot patch process {pid}: {source}; `--engine uprobe` records it with kernel probes instead")]
    Inject {
        /// The process.
        pid: i32,
        /// Why.
        source: proftap_probes::inject::remote::RemoteError,
    },
    /// Functions the in-process engine cannot patch need uprobes, which this user may not place.
    #[error(
        "{count} of the functions cannot be patched by the in-process engine ({names}) and kernel uprobes, which would probe them, need root: run with sudo, or leave them out (-f '!NAME')"
    )]
    UprobesNeedRoot {
        /// How many.
        count: usize,
        /// A few of them with why, as `name (why)`.
        names: String,
    },
    /// An option the chosen engine does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// A metric other than wall and CPU time, with the in-process engine.
    #[error("the in-process engine measures wall and CPU time only, so far; other metrics need the uprobe engine")]
    InjectMetrics,
    /// Unwinder entries could not be hooked in a program that may unwind.
    #[error(
        "the in-process engine could not hook {entries}, and this program may unwind its stack (exceptions, panics, backtrace()); record it with the uprobe engine"
    )]
    Unhooked {
        /// The entries, and why each could not be hooked.
        entries: String,
    },
    /// The target wrote what proftap's runtime never writes into the memory
    /// they share; the recording stopped and the process runs on.
    #[error("{0}")]
    Corrupted(String),
}

/// The kernel's "operation not supported" of uprobes on an instruction.
const ENOTSUPP: i32 = 524;

pub(crate) fn perf_error(what: String, source: std::io::Error, descriptors: usize) -> RecordError {
    let hint = match source.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            format!("; this recording needs about {descriptors} file descriptors: raise `ulimit -n` or probe fewer functions")
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let paranoid = proftap_probes::perf::paranoid();
            if paranoid > 2 && !proftap_probes::perf::kernel_observable() {
                format!(
                    "; kernel.perf_event_paranoid is {paranoid}, which keeps perf events from users: `sudo sysctl kernel.perf_event_paranoid=2` lets you profile your own processes, or run with sudo"
                )
            } else {
                format!("; this needs root or CAP_PERFMON (kernel.perf_event_paranoid is {paranoid}): run with sudo")
            }
        }
        Some(libc::ESRCH) => "; the process is gone".into(),
        // ENOTSUPP, which the C library has no text for.
        Some(ENOTSUPP) => "; the kernel cannot place a uprobe on one of the probed instructions".into(),
        _ => String::new(),
    };
    RecordError::Perf { what, source, hint }
}

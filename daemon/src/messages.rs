//! What proftapd and a session worker say to each other over their
//! [`Channel`](crate::channel::Channel).

use proftap_record::cost::ProbeCost;
use proftap_record::host::{ExitMode, ProbeEvent, ProbeKind};
use proftap_record::observer::RecordEvent;
use proftap_record::protocol::Sealed;
use proftap_record::request::RecordRequest;
use serde::{Deserialize, Serialize};

/// What users other than root may ask for.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Limits {
    /// Sessions starting or running at once, per user.
    pub sessions_per_user: usize,
    /// Functions probed per session.
    pub functions: usize,
    /// Uprobes defined per session.
    pub probes: usize,
    /// Ring buffer per CPU, MiB.
    pub buffer_mib: usize,
    /// A session's profile, MiB.
    pub profile_mib: usize,
}

/// proftapd's first message to a worker: the session to record. It carries
/// the user's standard input, output and error when the client sent them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Assignment {
    /// What the client asked to record, as it sent it: read by the worker
    /// only, once it runs as the user.
    pub request: Sealed<RecordRequest>,
    /// The client's pid, for its capabilities.
    pub client_pid: Option<i32>,
    /// What the user may ask for.
    pub limits: Limits,
    /// Whether the user is root (whose sessions have no limits).
    pub root: bool,
}

/// One uprobe a worker asks for: in the file of the `file`th descriptor sent along.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ProbeRequest {
    /// Which of the descriptors sent with the request.
    pub file: u32,
    /// The file offset.
    pub offset: u64,
    /// At the address or at return.
    pub kind: ProbeKind,
}

/// A worker's messages: requests that proftapd answers with an [`Answer`],
/// and reports that it does not.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// Define these uprobes in a group (answered).
    Define {
        /// The probes; their files come as descriptors.
        probes: Vec<ProbeRequest>,
    },
    /// Keep a group's uprobes registered while the targets' events close (answered).
    Keep {
        /// The group.
        group: u64,
    },
    /// Remove a group.
    Remove {
        /// The group.
        group: u64,
    },
    /// The kernel's time off CPU by thread, for the runtime to read CPU
    /// time from (answered; the array comes as a descriptor).
    OffCpu,
    /// This boot's measured probe cost (answered).
    Calibrate {
        /// How returns are seen.
        exits: ExitMode,
        /// Measure again.
        fresh: bool,
    },
    /// What the session records: the command line, or `pid N (command)`.
    Target {
        /// In words.
        description: String,
    },
    /// What the recording told.
    Event(RecordEvent),
    /// The recording ended; the profile file comes as a descriptor.
    Finished,
    /// The recording failed.
    Failed {
        /// Why, in a sentence.
        error: String,
    },
}

/// proftapd's answer to a worker's request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The group is defined.
    Defined {
        /// Its handle.
        group: u64,
        /// Its events.
        events: Vec<ProbeEvent>,
    },
    /// Done.
    Done,
    /// The probe cost, or why it could not be measured.
    Cost(Result<ProbeCost, String>),
    /// The off-CPU array covers this many thread ids (its descriptor comes along).
    OffCpu {
        /// Thread ids.
        entries: u64,
    },
    /// Refused or failed.
    Refused(String),
}

//! What a recording tells while it prepares and runs: steps that take a
//! while, warnings, the moment the probes are live, live counters, and
//! changes to the probe set. The recorder prints nothing; a front end
//! renders these (a spinner, a status line, stderr) or forwards them (to a
//! session's client).

use proftap_profile::{FunctionCalls, Note};
use serde::{Deserialize, Serialize};

/// Hears what a recording tells, from any thread.
pub trait Observer: Send + Sync {
    /// One event, in the order they happen.
    fn event(&self, event: RecordEvent);
}

/// An observer that hears nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn event(&self, _: RecordEvent) {}
}

/// What a recording tells.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordEvent {
    /// A step that may take a while has begun.
    Step(Step),
    /// The step has ended.
    StepEnded,
    /// Something the user should know before trusting the numbers.
    Warning(Warning),
    /// Every probe is live and the target runs.
    Started {
        /// The process recorded.
        pid: i32,
        /// Functions instrumented.
        functions: u64,
        /// Whether it was running already (attached) or launched.
        attached: bool,
    },
    /// Live counters, sent as they change.
    Counters {
        /// Probe hits aggregated so far.
        hits: u64,
        /// Probe hits lost so far.
        lost: u64,
    },
    /// The probe set changed while the target ran (the profile's notes keep it too).
    ProbesChanged(Note),
    /// Debug info being downloaded from a debuginfod server.
    Download(Download),
    /// Calls by function so far, once a second when asked for (a live view).
    Calls {
        /// Since the probes went live, nanoseconds.
        elapsed_ns: u64,
        /// Every instrumented function with its calls so far.
        functions: Vec<FunctionCalls>,
    },
}

/// How a download of debug info goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Download {
    /// It has begun.
    Started {
        /// The build-id whose debug info is fetched.
        build_id: String,
        /// The server asked.
        server: String,
        /// Its size in bytes, when the server says.
        size: Option<u64>,
    },
    /// Bytes received so far.
    Received {
        /// How many.
        bytes: u64,
    },
    /// It has ended, well or not (a warning says why not).
    Ended,
}

/// Tells an observer about downloads the symbolizer makes.
pub struct ObservedDownloads<'a>(pub &'a dyn Observer);

impl proftap_probes::symbols::FetchProgress for ObservedDownloads<'_> {
    fn started(&self, build_id: &str, server: &str, size: Option<u64>) {
        self.0.event(RecordEvent::Download(Download::Started { build_id: build_id.into(), server: server.into(), size }));
    }

    fn received(&self, bytes: u64) {
        self.0.event(RecordEvent::Download(Download::Received { bytes }));
    }

    fn ended(&self) {
        self.0.event(RecordEvent::Download(Download::Ended));
    }
}

/// A step that may take a while.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Reading the symbols of a module.
    ReadingSymbols {
        /// The module.
        module: String,
    },
    /// Measuring what a probe costs on this machine.
    MeasuringProbeCost,
    /// Placing the probes.
    PlacingProbes {
        /// On how many functions.
        functions: u64,
    },
}

/// Something the user should know before trusting the numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Warning {
    /// What the symbolizer found amiss in a module (stripped, a debug file
    /// of another build, a damaged unit), in its words.
    Symbols {
        /// The sentence.
        message: String,
    },
    /// A function chosen that cannot be probed fully, in the planner's words.
    Planning {
        /// The sentence.
        message: String,
    },
    /// The probe cost could not be measured: the report will not estimate the overhead.
    NoProbeCost {
        /// Why.
        reason: String,
    },
    /// The events could not all be saved.
    EventsNotSaved {
        /// Why.
        reason: String,
    },
    /// Functions chosen whose code in the attached process is not what
    /// the file holds (another tool's breakpoint or patch): not recorded.
    CodeDiffers {
        /// Their names.
        functions: Vec<String>,
    },
}

//! How to record, as the recorder takes it once a request is prepared: the
//! target, the functions' options, the user's signals; and what a recording
//! gives back.

use crate::cost::ProbeCost;
use crate::observer::{Observer, Unobserved};
use crate::request::{RegionSpec, SampleSettings};
use proftap_probes::inject::counting::Choices;
use proftap_probes::inject::patched::Recording;
use proftap_probes::lines::LinePlan;
use proftap_probes::metrics::Metric;
use proftap_probes::offcpu::OffCpu;
use proftap_probes::symbols::SymbolCache;
use proftap_probes::target::{self, Ended};
use proftap_profile::{Engine, Note, Profile};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The profiled program.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    /// Launch this program with these arguments (`argv[0]` included).
    Launch {
        /// The resolved executable.
        path: PathBuf,
        /// Its argument vector.
        argv: Vec<OsString>,
        /// As whom, where and with what environment.
        launch: target::Launch,
    },
    /// Attach to this running process.
    Attach {
        /// Its pid.
        pid: i32,
    },
}

/// Signals from the user, set by the front end's signal handlers.
#[derive(Clone, Debug, Default)]
pub struct Control {
    /// Ctrl-C.
    pub interrupt: Arc<AtomicBool>,
    /// A SIGINT sent to proftap alone (by `kill`, not by the terminal,
    /// which sends it to the launched command as well): the command is
    /// sent it, as the user meant the run to stop.
    pub interrupt_only_proftap: Arc<AtomicBool>,
    /// SIGTERM.
    pub terminate: Arc<AtomicBool>,
    /// End the recording and leave the program running, launched or not.
    pub detach: Arc<AtomicBool>,
}

/// How to record.
#[derive(Clone)]
pub struct RecordOptions {
    /// Metrics; the first must be wall time.
    pub metrics: Vec<Metric>,
    /// Follow forked children.
    pub follow_forks: bool,
    /// Ring buffer size per CPU, bytes.
    pub buffer_bytes: usize,
    /// Stop after this long (attach).
    pub duration: Option<Duration>,
    /// Probe cost, for the overhead estimate.
    pub cost: Option<ProbeCost>,
    /// Subtract the probe cost from the times.
    pub compensate: bool,
    /// Signals.
    pub control: Control,
    /// Lines to count (and regions).
    pub lines: Option<LinePlan>,
    /// The in-process engine counts the lines, with counters on edges
    /// (else line probes see them).
    pub count_lines: bool,
    /// The lines probes follow: all of them, or those of the functions
    /// whose edges cannot be counted (`line_probed`).
    pub probed_lines: Option<LinePlan>,
    /// Functions whose lines probes follow while the others' are counted:
    /// uprobes see their calls.
    pub line_probed: Vec<usize>,
    /// What edge counting may do to the code.
    pub counting: Choices,
    /// Functions a counter takes the entry of, when lines are counted: the
    /// in-process engine leaves them (they are sampled).
    pub entries_counted: Vec<usize>,
    /// Functions the governor never throttles (named ones, when others are
    /// recorded only for their lines).
    pub kept: Vec<usize>,
    /// The program may unwind its stack (exceptions, panics, `backtrace()`):
    /// its unwinders' entries must be hooked.
    pub may_unwind: bool,
    /// The functions were named (`-f`): those the in-process engine cannot
    /// patch keep a uprobe under the governor, as asked.
    pub functions_named: bool,
    /// Stack sampling.
    pub sample: Option<SampleSettings>,
    /// The overhead governor's budget per function, as a share of the
    /// elapsed time (0.05: 5%); `None` keeps every probe to the end.
    pub overhead_budget: Option<f64>,
    /// Sample only for a warm-up, then instrument the hottest functions:
    /// (how many, how long to sample first).
    pub auto_instrument: Option<(usize, Duration)>,
    /// Place no probes: sample only (the functions are listed, as sampled).
    pub sample_only: bool,
    /// Regions to time.
    pub regions: Vec<RegionSpec>,
    /// Hears of the recording's progress.
    pub observer: Arc<dyn Observer>,
    /// How calls are seen.
    pub engine: Engine,
    /// Whether the engine was the recorder's to choose (`--engine auto`):
    /// a process the in-process engine cannot patch at all is then
    /// recorded as one whose every function it refused.
    pub engine_chosen: bool,
    /// Notes known before the recording starts (how the engine was chosen).
    pub notes: Vec<Note>,
    /// The executable's path, as shown.
    pub executable: Option<String>,
    /// The executable's build-id.
    pub build_id: Option<String>,
    /// The binaries' symbols and images, read once for the whole recording.
    pub symbols: Arc<SymbolCache>,
    /// Where the in-process engine's planner keeps what it judged of the
    /// binaries' functions for the rest of the boot (none: judged afresh).
    pub kept_judgements: Option<PathBuf>,
    /// Tell the calls by function once a second ([`crate::observer::RecordEvent::Calls`]).
    pub live_calls: bool,
    /// Keep every finished call for a timeline, up to this many bytes.
    pub trace_bytes: Option<u64>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            metrics: vec![Metric::Wall, Metric::Cpu],
            follow_forks: true,
            buffer_bytes: 8 << 20,
            duration: None,
            cost: None,
            compensate: false,
            control: Control::default(),
            lines: None,
            count_lines: false,
            probed_lines: None,
            line_probed: Vec::new(),
            counting: Choices::default(),
            entries_counted: Vec::new(),
            kept: Vec::new(),
            may_unwind: false,
            functions_named: false,
            sample: None,
            overhead_budget: None,
            auto_instrument: None,
            sample_only: false,
            regions: Vec::new(),
            observer: Arc::new(Unobserved),
            engine: Engine::Uprobe,
            engine_chosen: false,
            notes: Vec::new(),
            executable: None,
            build_id: None,
            symbols: Arc::default(),
            kept_judgements: None,
            live_calls: false,
            trace_bytes: None,
        }
    }
}

impl RecordOptions {
    /// How the in-process engine records, reading CPU time from `off_cpu`.
    pub fn engine_recording<'a>(&self, off_cpu: Option<&'a OffCpu>) -> Recording<'a> {
        let trace_slots = if self.trace_bytes.is_some() { TRACE_SLOTS } else { 0 };
        Recording {
            off_cpu,
            follow_forks: self.follow_forks,
            trace_slots,
            count_edges: &[],
            counting: self.counting,
            lines: &[],
            regions: if self.count_lines { self.regions.len() as u64 } else { 0 },
            regions_of: &[],
        }
    }
}

/// Finished calls a thread's trace ring holds until proftap reads it (every
/// few milliseconds): a thread finishing a call every 50 ns fills it in 50
/// ms. 24 MiB of shared memory per thread, touched as the thread fills it.
const TRACE_SLOTS: u64 = 1 << 20;

/// A finished recording.
pub struct Recorded {
    /// The profile.
    pub profile: Profile,
    /// How a launched program ended (None for attach while it runs on).
    pub ended: Option<Ended>,
    /// The recording's uprobes and kernel events, still closing (each after
    /// a grace period): kept while the profile is written, dropped (which
    /// waits until they are closed and the uprobes removed) after.
    pub closing: crate::sources::Closing,
}

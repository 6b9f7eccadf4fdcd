//! The profile data model.

use crate::notes::Note;
use crate::stats::Stat;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A function id: an index into [`Profile::functions`].
pub type FunctionId = u32;

/// The parent of the root of a call tree, and the function of the root.
pub const ROOT: u32 = u32::MAX;

/// Everything one recording produced.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Profile {
    /// What was profiled.
    pub target: Target,
    /// How and when it was recorded.
    pub recording: Recording,
    /// Metric keys, in the order every per-metric vector uses (`wall_ns`, `cpu_ns`, `page_faults`, ...).
    pub metrics: Vec<String>,
    /// Functions that were instrumented, by [`FunctionId`].
    pub functions: Vec<FunctionInfo>,
    /// One entry per thread that ran instrumented code (or was seen at all).
    pub threads: Vec<ThreadProfile>,
    /// Data the kernel could not deliver.
    pub lost: Lost,
    /// What the instrumentation itself cost.
    pub overhead: Overhead,
    /// Processes seen: the target and the children it forked.
    pub processes: Vec<ProcessInfo>,
    /// Things the user should know about how far to trust the numbers.
    pub notes: Vec<Note>,
    /// Line counts and times, for every line with code in the probed source
    /// files (empty unless lines were recorded), by file then line.
    #[serde(default)]
    pub lines: Vec<LineRecord>,
    /// Regions (line ranges) and their costs.
    #[serde(default)]
    pub regions: Vec<RegionRecord>,
    /// How many runs these counts add up (1, more after merging), as gcov's `Runs`.
    #[serde(default = "one")]
    pub runs: u32,
    /// Stack samples, when sampling was on.
    #[serde(default)]
    pub samples: Option<SampleProfile>,
    /// Every call with when it started and ended, and the samples' times,
    /// when a trace was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// The calls of the instrumented functions one by one, per thread, in the
/// order they started: what a timeline shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// The most bytes of calls the trace could keep.
    pub limit_bytes: u64,
    /// Calls counted in the profile but not in the trace: made once it was
    /// full, or missed (see `missed`).
    pub cut: u64,
    /// Of those, calls a thread's ring in the target overwrote before
    /// proftap read them (the thread finished calls faster than proftap
    /// read), or that were not what the engine writes.
    #[serde(default)]
    pub missed: u64,
    /// By thread.
    pub threads: Vec<ThreadTrace>,
}

/// Bytes one traced call takes in memory, against [`Trace::limit_bytes`].
pub const TRACED_CALL_BYTES: u64 = 24;

/// One thread's calls and samples.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadTrace {
    /// Process id.
    pub pid: i32,
    /// Thread id.
    pub tid: i32,
    /// Its finished calls, by start time (a caller before its callees).
    pub calls: Vec<TracedCall>,
    /// Its stack samples, by time.
    #[serde(default)]
    pub samples: Vec<TracedSample>,
}

/// One finished call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedCall {
    /// Which function.
    pub function: FunctionId,
    /// Nanoseconds from the start of the recording to its entry.
    pub start_ns: u64,
    /// Wall nanoseconds from its entry to its return.
    pub duration_ns: u64,
    /// Instrumented calls it was inside of (0: none).
    pub depth: u32,
}

impl TracedCall {
    /// Nanoseconds from the start of the recording to its return.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// When a stack sample was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedSample {
    /// Nanoseconds from the start of the recording.
    pub time_ns: u64,
    /// The stack: an index into [`SampleProfile::stacks`].
    pub stack: u32,
}

/// Stacks sampled at a fixed frequency of CPU time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleProfile {
    /// The sampling event (`cycles` or `cpu-clock`).
    pub event: String,
    /// Samples per second of CPU time asked for.
    pub frequency_hz: u64,
    /// Samples taken.
    pub total: u64,
    /// Distinct frames, referred to by index.
    pub frames: Vec<SampledFrame>,
    /// Distinct stacks (root first) and how often each was sampled.
    pub stacks: Vec<SampledStack>,
    /// Samples by the source line they were taken on.
    pub lines: Vec<SampledLine>,
    /// What the samples say of the time of functions not instrumented: by
    /// throttled function after its probes were removed, and the share of
    /// that time and of the time of functions never instrumented (a
    /// library's) that their instrumented callers' exclusive time held.
    #[serde(default, skip_serializing_if = "Throttled::is_empty")]
    pub throttled: Throttled,
    /// Samples taken in the counting stubs of the in-process engine (the
    /// entries of functions whose probes were removed, still counting
    /// their calls), in the count itself or at the first of the function's
    /// instructions moved after it: their stacks name the functions, the
    /// time is what counting cost. (Older profiles counted the samples of
    /// all the moved instructions too.)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub in_counting_stubs: u64,
    /// Taken by one event on each CPU that the kernel filtered to the
    /// recording's processes, rather than by an event on each thread.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_every_cpu: bool,
}

/// Samples of functions not instrumented, under instrumented callers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throttled {
    /// By throttled function.
    pub functions: Vec<ThrottledSamples>,
    /// By function instrumented and not throttled: the samples of its
    /// calls no probe timed (begun before the probes were placed, as in an
    /// attach to a loop that never returns, or left untimed by the engine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untimed: Vec<ThrottledSamples>,
    /// Samples in throttled functions, or at the top of the stack in a
    /// function never instrumented, whose nearest caller still
    /// instrumented was timed: by thread and caller, what that caller's
    /// measured exclusive time holds of its callees' time.
    pub held: Vec<HeldSamples>,
    /// By thread and caller in `held`: the samples its exclusive time
    /// keeps (its own code's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<KeptSamples>,
}

impl Throttled {
    /// No sample was of a function not instrumented under one that was.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.untimed.is_empty() && self.held.is_empty()
    }
}

/// A throttled function's samples after its probes were removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottledSamples {
    /// Its name.
    pub name: String,
    /// With it the innermost function measured.
    pub self_samples: u64,
    /// With it anywhere on the stack.
    pub total_samples: u64,
    /// Of those, the samples taken after its calls were no longer counted
    /// either (see [`FunctionInfo::calls_counted_until_stopped`]): what its calls
    /// since are estimated from.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_samples_uncounted: u64,
    /// Of those taken while its calls were counted, the ones in its
    /// counting stub: counting's time, not its calls'.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub counting_samples: u64,
}

/// The fewest samples taken while a throttled function's calls were
/// counted that say how many calls a sample stands for (to about a third).
const FEWEST_COUNTING_SAMPLES: u64 = 10;

impl ThrottledSamples {
    /// Its calls after its counting stopped, at the calls a sample stood
    /// for while they were counted (`counted` calls over the samples taken
    /// between its throttle and then, less those in its counting stub,
    /// which counting stopped for being dear); `None` with too few samples
    /// then. Not at its cost per call when timed: that held its callees'
    /// probes, taken out since, and a short function's timing error.
    pub fn calls_since_counting_stopped(&self, counted: u64) -> Option<u64> {
        let while_counted = self.total_samples.checked_sub(self.total_samples_uncounted)?.saturating_sub(self.counting_samples);
        if while_counted < FEWEST_COUNTING_SAMPLES {
            return None;
        }
        let calls = u128::from(counted) * u128::from(self.total_samples_uncounted) / u128::from(while_counted);
        Some(u64::try_from(calls).unwrap_or(u64::MAX))
    }
}

/// Samples spent in callees not instrumented that a caller's exclusive time holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSamples {
    /// The thread.
    pub tid: i32,
    /// The caller, still instrumented.
    pub name: String,
    /// The function the samples were in, throttled or never instrumented
    /// ("" in files written before it was kept).
    #[serde(default)]
    pub callee: String,
    /// The callee's module: a kernel function and a library's of the same
    /// name (`memcpy`) are two ("" in files written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub callee_module: String,
    /// How many.
    pub samples: u64,
    /// The time taken out of the caller's exclusive CPU time for them:
    /// their estimate, or, where the caller's own samples are fewer than
    /// all it holds, its share of what the caller measured beyond its own
    /// samples' estimate (none in files written before it was kept: the
    /// samples' estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_ns: Option<u64>,
}

/// Samples in a caller's own code, which its exclusive time keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptSamples {
    /// The thread.
    pub tid: i32,
    /// The caller.
    pub name: String,
    /// How many.
    pub samples: u64,
}

/// A frame of a sampled stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SampledFrame {
    /// Function name (demangled), or why it is unknown (`[unknown: unmapped]`).
    pub name: String,
    /// The module it is in.
    pub module: String,
    /// Whether the compiler inlined it into its caller.
    pub inlined: bool,
}

/// A sampled stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledStack {
    /// Frame indexes, outermost first.
    pub frames: Vec<u32>,
    /// Samples of exactly this stack.
    pub count: u64,
}

/// Samples taken on a source line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledLine {
    /// Source file.
    pub file: String,
    /// Line.
    pub line: u32,
    /// Samples whose innermost frame was on it.
    pub count: u64,
}

/// Sampled numbers of one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampledFunction {
    /// Its frame.
    pub frame: SampledFrame,
    /// Samples with it innermost.
    pub self_samples: u64,
    /// Samples with it anywhere on the stack.
    pub total_samples: u64,
}

impl SampleProfile {
    /// The share of the samples whose innermost frame is named `name`
    /// (none without samples).
    pub fn leaf_share(&self, name: &str) -> Option<f64> {
        let named = |s: &&SampledStack| s.frames.last().and_then(|&f| self.frames.get(f as usize)).is_some_and(|f| f.name == name);
        let in_leaf = self.stacks.iter().filter(named).fold(0u64, |n, s| n.saturating_add(s.count));
        self.share(in_leaf)
    }

    /// The share of the samples taken in the counting stubs (none without
    /// samples, or none there).
    pub fn counting_share(&self) -> Option<f64> {
        self.share(self.in_counting_stubs).filter(|&share| share > 0.0)
    }

    fn share(&self, samples: u64) -> Option<f64> {
        // A profile file is anyone's: its counts may add up past u64, and
        // say more samples somewhere than in all.
        let total = self.stacks.iter().fold(0u64, |n, s| n.saturating_add(s.count));
        (total > 0).then(|| samples.min(total) as f64 / total as f64)
    }

    /// Self and total samples per frame, most total first.
    pub fn functions(&self) -> Vec<SampledFunction> {
        let mut own = vec![0u64; self.frames.len()];
        let mut total = vec![0u64; self.frames.len()];
        let mut seen = vec![u64::MAX; self.frames.len()];
        for (i, stack) in self.stacks.iter().enumerate() {
            if let Some(&last) = stack.frames.last() {
                own[last as usize] = own[last as usize].saturating_add(stack.count);
            }
            for &f in &stack.frames {
                // Recursion counts a stack once.
                if seen[f as usize] != i as u64 {
                    seen[f as usize] = i as u64;
                    total[f as usize] = total[f as usize].saturating_add(stack.count);
                }
            }
        }
        let mut functions: Vec<SampledFunction> = self
            .frames
            .iter()
            .enumerate()
            .filter(|(i, _)| total[*i] > 0)
            .map(|(i, frame)| SampledFunction { frame: frame.clone(), self_samples: own[i], total_samples: total[i] })
            .collect();
        functions.sort_by(|a, b| {
            b.total_samples.cmp(&a.total_samples).then(b.self_samples.cmp(&a.self_samples)).then(a.frame.name.cmp(&b.frame.name))
        });
        functions
    }

    /// Estimated CPU time of `samples` samples.
    pub fn estimated_ns(&self, samples: u64) -> u64 {
        samples.saturating_mul(1_000_000_000).checked_div(self.frequency_hz).unwrap_or(0)
    }
}

fn one() -> u32 {
    1
}

/// A source line with code.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineRecord {
    /// Source file.
    pub file: String,
    /// Line number.
    pub line: u32,
    /// Times execution entered the line from a different line (gcov's count);
    /// for a function's declaration line, its calls.
    pub count: u64,
    /// Time from entering the line until its frame entered another line or
    /// returned, calls made from it included; per metric, as
    /// `Profile::metrics`; empty when the line was counted, not timed.
    pub cost: Vec<u64>,
    /// The conditional jumps of the machine code on the line, in address
    /// order (function by function): how often each jumped and went on.
    /// Empty when the line's branches were not counted (line probes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<BranchRecord>,
    /// Counted by probes of a function that the overhead governor took
    /// out during the recording: the count and times are what was seen
    /// until then, a lower bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub throttled: bool,
}

/// How often one conditional jump jumped and went on to the next instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchRecord {
    /// Times it jumped.
    pub taken: u64,
    /// Times it fell through.
    pub not_taken: u64,
}

impl BranchRecord {
    /// Times the jump ran.
    pub fn executed(&self) -> u64 {
        self.taken.saturating_add(self.not_taken)
    }
}

/// A region: a range of lines of one file, timed like a function.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// Its name.
    pub name: String,
    /// Source file.
    pub file: String,
    /// First line.
    pub start: u32,
    /// Last line.
    pub end: u32,
    /// Times a frame moved onto one of its lines from outside it.
    pub entries: u64,
    /// Cost per entry (until the frame left it or returned), per metric.
    pub inclusive: Vec<Stat>,
}

/// The profiled program.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Target {
    /// The command line (for `run`), or the process's command line (for `attach`).
    pub command: Vec<String>,
    /// The process id.
    pub pid: i32,
    /// The executable.
    pub exe: String,
    /// The executable's GNU build-id.
    pub build_id: Option<String>,
    /// Exit status, if it exited while recorded.
    pub exit_code: Option<i32>,
    /// Signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether it ended while recorded: how, only its parent may know when
    /// proftap attached to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
    /// Whether proftap launched it (`run`) or attached to it.
    pub attached: bool,
}

impl Target {
    /// Whether it ended while recorded: said, or told by its status (a
    /// profile written before `ended` was).
    pub fn has_ended(&self) -> bool {
        self.ended || self.exit_code.is_some() || self.signal.is_some()
    }
}

/// How the recording was made.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recording {
    /// What saw the calls: the in-process engine, or kernel uprobes only.
    pub engine: Engine,
    /// How the uprobes saw returns.
    #[serde(default)]
    pub exits: ExitMode,
    /// Start, nanoseconds since the Unix epoch.
    pub started_unix_ns: u64,
    /// CLOCK_MONOTONIC at the start, the time base of every timestamp.
    pub started_monotonic_ns: u64,
    /// Length of the recording.
    pub duration_ns: u64,
    /// Probe hits received.
    pub events: u64,
    /// Peak events per second the reader drained and aggregated.
    pub peak_events_per_second: u64,
    /// Whether forked children were followed.
    pub follow_forks: bool,
    /// proftap's version.
    pub proftap_version: String,
}

/// How a function's numbers were obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Exact throughout: probes on entry and return for the whole recording.
    #[default]
    Instrumented,
    /// Probes removed during the recording; counts are a lower bound.
    Throttled,
    /// Never instrumented; only sampled.
    Sampled,
}

/// A function as the profile knows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FunctionInfo {
    /// Demangled name (`ns::f(int)`).
    pub name: String,
    /// The module (executable or shared library) path.
    pub module: String,
    /// Declaration file.
    pub file: Option<String>,
    /// Declaration line (0 when unknown).
    pub line: u32,
    /// ELF virtual address of the entry.
    pub address: u64,
    /// How its numbers were obtained.
    #[serde(default)]
    pub mode: Mode,
    /// What saw its calls, when instrumented; `None` when it was not, or
    /// the profile does not say.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "engine_or_empty")]
    pub engine: Option<Engine>,
    /// A throttled function's calls after its probes were taken out,
    /// counted (not timed) where its entry jumped to a counter from then
    /// on to the end; `None` when they were not counted, or not to the
    /// end: its calls after are estimated from its samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_after_throttle: Option<u64>,
    /// Its counter was taken out too, later: the calls it counted until
    /// then. Its calls since are estimated from the samples taken since
    /// ([`ThrottledSamples::total_samples_uncounted`]) where enough were
    /// taken while counted ([`ThrottledSamples::calls_since_counting_stopped`]),
    /// unless [`FunctionInfo::calls_after_counting_unknown`]. A reader that does
    /// not know this field estimates all its calls after the throttle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_counted_until_stopped: Option<u64>,
    /// In a recording (or one of the runs merged) without samples, its
    /// counting stopped: nothing counted or estimated its calls since, and
    /// its count is a lower bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub calls_after_counting_unknown: bool,
}

/// What sees calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Kernel uprobes on entries and returns.
    #[default]
    Uprobe,
    /// Jumps patched over function entries to proftap's code in the process.
    Inject,
}

/// How uprobes see returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitMode {
    /// Return probes (uretprobes): cheap; unwinders cannot pass them.
    #[default]
    #[serde(alias = "")]
    Uretprobe,
    /// Probes on each `ret` and tail jump: safe for any unwinder.
    ReturnSites,
}

/// An engine, or an empty string for none (as profiles before engines were
/// typed could write it).
fn engine_or_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Engine>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Engine(Engine),
        Other(String),
    }
    match Option::<Wire>::deserialize(d)? {
        Some(Wire::Engine(engine)) => Ok(Some(engine)),
        Some(Wire::Other(text)) if text.is_empty() => Ok(None),
        Some(Wire::Other(text)) => Err(serde::de::Error::custom(format!("'{text}' is not an engine (uprobe or inject)"))),
        None => Ok(None),
    }
}

/// What a metric's values count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds (`wall_ns`, `cpu_ns`: every key ending in `_ns`).
    Nanoseconds,
    /// Events (page faults, cycles, ...).
    Count,
}

impl Unit {
    /// The unit of metric `key`: the file format names time metrics with an `_ns` suffix.
    pub fn of(key: &str) -> Unit {
        if key.ends_with("_ns") { Unit::Nanoseconds } else { Unit::Count }
    }
}

/// Per-function numbers, in a thread or merged over threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionStats {
    /// Which function.
    pub function: FunctionId,
    /// Entries seen.
    pub calls: u64,
    /// Calls that ended by a non-local exit (exception, longjmp): their
    /// frame ended when an outer frame was seen returning.
    pub unwound: u64,
    /// Calls still running when the recording ended (timed up to the end).
    pub unfinished: u64,
    /// Calls counted but not timed: their returns could not be watched (a
    /// function that returns twice, a program's entry point, one whose
    /// end is unknown), or the engine had no room to time them. Their
    /// cost is their caller's; the statistics are of the other calls.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub untimed: u64,
    /// Calls in progress when this process was forked from its parent, timed
    /// here as they went on in it (the parent counted them as calls): each
    /// is one of the times the statistics are of.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carried: u64,
    /// Inclusive cost per metric.
    pub inclusive: Vec<Stat>,
    /// Exclusive cost per metric.
    pub exclusive: Vec<Stat>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl FunctionStats {
    /// Empty statistics for `metrics` metrics.
    pub fn new(function: FunctionId, metrics: usize) -> Self {
        FunctionStats {
            function,
            calls: 0,
            unwound: 0,
            unfinished: 0,
            untimed: 0,
            carried: 0,
            inclusive: vec![Stat::default(); metrics],
            exclusive: vec![Stat::default(); metrics],
        }
    }

    /// The calls its statistics are of: those timed, and the calls a
    /// forked child carried on.
    pub fn timed_calls(&self) -> u64 {
        self.calls.saturating_sub(self.untimed).saturating_add(self.carried)
    }

    /// Adds another's numbers for the same function.
    pub fn merge(&mut self, other: &FunctionStats) {
        self.calls = self.calls.saturating_add(other.calls);
        self.unwound = self.unwound.saturating_add(other.unwound);
        self.unfinished = self.unfinished.saturating_add(other.unfinished);
        self.untimed = self.untimed.saturating_add(other.untimed);
        self.carried = self.carried.saturating_add(other.carried);
        for (a, b) in self.inclusive.iter_mut().zip(&other.inclusive) {
            a.merge(b);
        }
        for (a, b) in self.exclusive.iter_mut().zip(&other.exclusive) {
            a.merge(b);
        }
    }
}

/// A calling-context tree: a node per distinct call path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallTree {
    /// Node 0 is the root; parents come before their children.
    pub nodes: Vec<TreeNode>,
}

/// A call path: a function called from its parent's path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeNode {
    /// The function ([`ROOT`] for the root).
    pub function: FunctionId,
    /// Index of the parent node ([`ROOT`] for the root).
    pub parent: u32,
    /// Calls along this path.
    pub calls: u64,
    /// Inclusive cost per metric, summed over those calls.
    pub inclusive: Vec<u64>,
    /// Exclusive cost per metric, summed over those calls.
    pub exclusive: Vec<u64>,
    /// The time of a throttled function after its probes were removed, as
    /// the samples estimate it (no calls counted): the part of its
    /// caller's measured exclusive time it took.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl CallTree {
    /// A tree with only the root.
    pub fn new(metrics: usize) -> Self {
        CallTree {
            nodes: vec![TreeNode {
                function: ROOT,
                parent: ROOT,
                calls: 0,
                inclusive: vec![0; metrics],
                exclusive: vec![0; metrics],
                estimated: false,
            }],
        }
    }

    /// Children of each node, in creation order.
    pub fn children(&self) -> Vec<Vec<u32>> {
        let mut children = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            if let Some(list) = children.get_mut(node.parent as usize) {
                list.push(i as u32);
            }
        }
        children
    }

    /// Each node's depth: 0 for the root, 1 for its children, ...
    /// ([`Profile::validate`] bounds it by [`crate::MAX_TREE_DEPTH`]).
    pub fn depths(&self) -> Vec<u32> {
        let mut depths = vec![0u32; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            // Parents come before their children; a node breaking that (in a
            // tree never validated) counts as a child of the root.
            depths[i] = depths.get(node.parent as usize).filter(|_| (node.parent as usize) < i).map_or(1, |d| d.saturating_add(1));
        }
        depths
    }

    /// The nodes from `node` up to the root's child on its path, innermost
    /// first. It always ends, even in a tree never validated: each step
    /// goes to an earlier node.
    pub fn path(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let first = (node != 0 && (node as usize) < self.nodes.len()).then_some(node);
        std::iter::successors(first, move |&i| {
            let parent = self.nodes[i as usize].parent;
            (parent != 0 && parent < i).then_some(parent)
        })
    }

    /// Adds the paths of `other` into this tree, summing the nodes they share.
    pub fn merge(&mut self, other: &CallTree) {
        let mut index: HashMap<(u32, FunctionId, bool), u32> =
            self.nodes.iter().enumerate().skip(1).map(|(i, n)| ((n.parent, n.function, n.estimated), i as u32)).collect();
        let mut mapped = vec![0u32; other.nodes.len()];
        for (i, node) in other.nodes.iter().enumerate() {
            let target = if i == 0 {
                0
            } else {
                let parent = mapped[node.parent as usize];
                *index.entry((parent, node.function, node.estimated)).or_insert_with(|| {
                    let metrics = node.inclusive.len();
                    self.nodes.push(TreeNode {
                        function: node.function,
                        parent,
                        calls: 0,
                        inclusive: vec![0; metrics],
                        exclusive: vec![0; metrics],
                        estimated: node.estimated,
                    });
                    (self.nodes.len() - 1) as u32
                })
            };
            mapped[i] = target;
            let mine = &mut self.nodes[target as usize];
            mine.calls = mine.calls.saturating_add(node.calls);
            for (a, b) in mine.inclusive.iter_mut().zip(&node.inclusive) {
                *a = a.saturating_add(*b);
            }
            for (a, b) in mine.exclusive.iter_mut().zip(&node.exclusive) {
                *a = a.saturating_add(*b);
            }
        }
    }
}

/// One thread's profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadProfile {
    /// Process id.
    pub pid: i32,
    /// Thread id.
    pub tid: i32,
    /// Thread name (`comm`).
    pub name: String,
    /// Per-function numbers, one entry per function it ran.
    pub functions: Vec<FunctionStats>,
    /// Its calling-context tree.
    pub tree: CallTree,
}

/// Lost data.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Lost {
    /// Probe hits the kernel dropped (full ring buffer), in all.
    pub events: u64,
    /// Of those, per function (when the lost record says which probe).
    pub by_function: Vec<LostCount>,
    /// Per thread (when the lost record says which thread).
    pub by_thread: Vec<LostCount>,
    /// Returns seen for calls whose entry was not seen (entered before
    /// recording started, or entry lost).
    pub unmatched_returns: u64,
}

/// A count of lost events for one function or thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostCount {
    /// Function id or thread id.
    pub id: i64,
    /// How many.
    pub count: u64,
}

/// What the instrumentation cost, as measured by proftap on this machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Overhead {
    /// Wall time one probe hit costs the target, on average over this run's hits.
    pub per_hit_ns: u64,
    /// Probe hits in the target.
    pub hits: u64,
    /// Estimated wall time the probes added to the run.
    pub estimated_ns: u64,
    /// Whether the times in this profile have the probes' cost subtracted.
    pub compensated: bool,
    /// Calibrated wall cost of one instrumented call (entry and return), by
    /// the kind of first instruction: the kernel emulates some and
    /// single-steps the rest.
    pub call_ns_emulated: u64,
    /// Same, for a first instruction the kernel single-steps.
    pub call_ns_stepped: u64,
    /// Same, for a function patched by the in-process engine.
    #[serde(default)]
    pub call_ns_injected: u64,
    /// Calibrated CPU time one instrumented call adds to the thread's task-clock.
    pub call_cpu_ns: u64,
    /// Calibrated inclusive time an empty instrumented function shows.
    pub self_ns: u64,
}

/// A process seen during the recording.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: i32,
    /// Parent, when proftap saw the fork.
    pub parent: Option<i32>,
    /// Programs it executed while recorded (after `exec` its probes no longer apply).
    pub execs: Vec<String>,
}

impl Profile {
    /// The unit of metric `metric` (an index into [`Profile::metrics`]).
    pub fn unit(&self, metric: usize) -> Unit {
        self.metrics.get(metric).map_or(Unit::Count, |key| Unit::of(key))
    }

    /// Index of a metric key.
    pub fn metric_index(&self, key: &str) -> Option<usize> {
        self.metrics.iter().position(|m| m == key)
    }

    /// Per-function numbers summed over all threads, by function id order.
    pub fn merged_functions(&self) -> Vec<FunctionStats> {
        let mut merged: Vec<Option<FunctionStats>> = vec![None; self.functions.len()];
        for thread in &self.threads {
            for stats in &thread.functions {
                match merged.get_mut(stats.function as usize) {
                    Some(Some(existing)) => existing.merge(stats),
                    Some(slot) => *slot = Some(stats.clone()),
                    None => {}
                }
            }
        }
        merged.into_iter().flatten().collect()
    }

    /// The calling-context tree merged over all threads.
    pub fn merged_tree(&self) -> CallTree {
        let mut tree = CallTree::new(self.metrics.len());
        for thread in &self.threads {
            tree.merge(&thread.tree);
        }
        tree
    }

    /// By throttled function, its own CPU time after its probes were
    /// removed, as its samples (of CPU time) estimate it: what its exact
    /// part leaves out. Functions with none are left out.
    pub fn own_times_after_throttle(&self) -> HashMap<FunctionId, u64> {
        let Some(samples) = &self.samples else { return HashMap::new() };
        self.own_times(&samples.throttled.functions, |info| info.mode == Mode::Throttled)
    }

    /// By instrumented function, the own CPU time of its calls no probe
    /// timed (begun before the probes were placed, or left untimed by the
    /// engine), as its samples estimate it: what its exact part leaves out.
    /// Functions with none are left out.
    pub fn own_times_untimed(&self) -> HashMap<FunctionId, u64> {
        let Some(samples) = &self.samples else { return HashMap::new() };
        self.own_times(&samples.throttled.untimed, |_| true)
    }

    /// The time the samples in `listed` give each function `kept` of their
    /// names, found through one map of names (a file may list thousands).
    fn own_times(&self, listed: &[ThrottledSamples], kept: impl Fn(&FunctionInfo) -> bool) -> HashMap<FunctionId, u64> {
        let Some(samples) = &self.samples else { return HashMap::new() };
        let mut by_name: HashMap<&str, u64> = HashMap::new();
        for t in listed {
            let own = by_name.entry(t.name.as_str()).or_default();
            *own = own.saturating_add(t.self_samples);
        }
        let own_of = |info: &FunctionInfo| by_name.get(info.name.as_str()).copied().filter(|&n| n > 0 && kept(info));
        let with_time =
            self.functions.iter().enumerate().filter_map(|(id, info)| Some((id as FunctionId, samples.estimated_ns(own_of(info)?))));
        with_time.collect()
    }

    /// Total calls over all functions and threads.
    pub fn total_calls(&self) -> u64 {
        self.threads.iter().flat_map(|t| &t.functions).fold(0u64, |sum, f| sum.saturating_add(f.calls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6,000 calls counted over the 12 samples taken then, and 3 samples
    /// after: 1,500 calls more. With 2 of the 12 in the counting stub, a
    /// sample stood for 600 calls, not 500; with 3, too few are left.
    #[test]
    fn the_calls_after_counting_stopped_are_those_a_sample_stood_for_without_the_stubs() {
        let sampled = |total, counting| ThrottledSamples {
            name: "f".into(),
            total_samples: total,
            total_samples_uncounted: 3,
            counting_samples: counting,
            ..ThrottledSamples::default()
        };
        assert_eq!(sampled(15, 0).calls_since_counting_stopped(6_000), Some(1_500));
        assert_eq!(sampled(15, 2).calls_since_counting_stopped(6_000), Some(1_800));
        assert_eq!(sampled(15, 3).calls_since_counting_stopped(6_000), None);
        assert_eq!(sampled(2, 0).calls_since_counting_stopped(6_000), None);
    }

    #[test]
    fn the_share_of_samples_is_counted_by_their_innermost_frame() {
        let frame = |name: &str| SampledFrame { name: name.into(), ..SampledFrame::default() };
        let stack = |frames: Vec<u32>, count| SampledStack { frames, count };
        let samples = SampleProfile {
            frames: vec![frame("main"), frame("work"), frame("[probe overhead]")],
            stacks: vec![stack(vec![0, 2], 3), stack(vec![0, 1], 1), stack(vec![2, 1], 4)],
            ..SampleProfile::default()
        };
        assert_eq!(samples.leaf_share("[probe overhead]"), Some(3.0 / 8.0));
        assert_eq!(samples.leaf_share("work"), Some(5.0 / 8.0));
        assert_eq!(SampleProfile::default().leaf_share("work"), None);
        // A file's counts may add up past u64: the share is still a number.
        let huge = SampleProfile { stacks: vec![stack(vec![1], u64::MAX), stack(vec![1], 5)], ..samples };
        assert_eq!(huge.leaf_share("work"), Some(1.0));
    }

    fn node(function: u32, parent: u32, calls: u64, incl: u64) -> TreeNode {
        TreeNode { function, parent, calls, inclusive: vec![incl], exclusive: vec![incl], estimated: false }
    }

    #[test]
    fn trees_merge_by_path() {
        let mut a = CallTree::new(1);
        a.nodes.push(node(1, 0, 2, 10)); // root -> f1
        a.nodes.push(node(2, 1, 4, 6)); // root -> f1 -> f2
        let mut b = CallTree::new(1);
        b.nodes.push(node(2, 0, 1, 3)); // root -> f2
        b.nodes.push(node(1, 0, 1, 5)); // root -> f1
        b.nodes.push(node(2, 2, 2, 2)); // root -> f1 -> f2
        a.merge(&b);
        assert_eq!(a.nodes.len(), 4);
        assert_eq!(a.nodes[1], node(1, 0, 3, 15));
        assert_eq!(a.nodes[2], node(2, 1, 6, 8));
        assert_eq!(a.nodes[3], node(2, 0, 1, 3));
        assert_eq!(a.children()[0], vec![1, 3]);
        assert_eq!(a.depths(), vec![0, 1, 2, 1]);
        assert_eq!(a.path(2).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(a.path(0).count(), 0);
    }

    #[test]
    fn paths_end_in_a_tree_with_a_cycle() {
        let mut a = CallTree::new(1);
        a.nodes.push(node(1, 2, 1, 1));
        a.nodes.push(node(2, 1, 1, 1));
        assert_eq!(a.path(2).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(a.path(1).collect::<Vec<_>>(), vec![1]);
        assert_eq!(a.depths(), vec![0, 1, 2]);
    }

    #[test]
    fn functions_merge_over_threads() {
        let mut p = Profile { metrics: vec!["wall_ns".into()], ..Profile::default() };
        p.functions = vec![FunctionInfo::default(), FunctionInfo::default()];
        let mut s1 = FunctionStats::new(1, 1);
        s1.calls = 3;
        s1.inclusive[0] = Stat::new(30, 5, 15);
        let mut s2 = s1.clone();
        s2.calls = 1;
        s2.inclusive[0] = Stat::new(4, 4, 4);
        for (tid, stats) in [(1, s1), (2, s2)] {
            p.threads.push(ThreadProfile { pid: 1, tid, name: String::new(), functions: vec![stats], tree: CallTree::new(1) });
        }
        let merged = p.merged_functions();
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].calls, 4);
        assert_eq!(merged[0].inclusive[0], Stat::new(34, 4, 15));
    }
}

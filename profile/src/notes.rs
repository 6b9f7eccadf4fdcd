//! What a profile says about how far to trust its numbers: typed, so that
//! each front end words them its own way (and may name its own options).

use serde::{Deserialize, Serialize};

/// A note of a profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Note {
    /// A sentence, as profiles written before notes had kinds hold them.
    Text(String),
    /// Something the recorder found.
    Found(Finding),
}

impl From<Finding> for Note {
    fn from(finding: Finding) -> Self {
        Note::Found(finding)
    }
}

/// Something the recorder found while recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The engine was left to the recorder, which chose uprobes.
    UprobesChosen {
        /// Why not the in-process engine.
        reason: UprobeReason,
    },
    /// The in-process engine could not patch some functions; uprobes saw
    /// them, or (`sampled`) only sampling did, or (`unmeasured`) nothing.
    NotPatched {
        /// How many.
        functions: u64,
        /// By reason, most functions first.
        reasons: Vec<Refusal>,
        /// Sampled only: in hybrid mode a kernel probe on them would cost
        /// a hundred times a patched call.
        #[serde(default)]
        sampled: bool,
        /// Neither probed nor sampled: the same, with sampling off.
        #[serde(default)]
        unmeasured: bool,
    },
    /// Functions not recorded: their code in memory was not what the file holds.
    CodeDiffers {
        /// Their names.
        functions: Vec<String>,
    },
    /// Functions uprobes would have seen, left unprobed: the kernel refuses
    /// a uprobe on their first instruction.
    UprobesRefused {
        /// Their names.
        functions: Vec<String>,
    },
    /// The lines of these functions ("name: why") are followed by uprobes:
    /// their control flow cannot be read to count their edges in process.
    LinesUncountable {
        /// Their names, each with why.
        functions: Vec<String>,
    },
    /// The regions are timed by uprobes on lines, and calls seen by uprobes:
    /// the in-process engine cannot hook these functions ("name: why"),
    /// which hold lines of a region.
    RegionsUnhooked {
        /// Their names, each with why.
        functions: Vec<String>,
    },
    /// The lines of these functions ("name: why") were not counted: their
    /// edge counters could not be patched in, or their counts did not add
    /// up, or their control flow cannot be read and the overhead budget
    /// kept uprobes from following them (`budget_percent`).
    LinesNotCounted {
        /// Their names, each with why.
        functions: Vec<String>,
        /// The overhead budget (in percent) that kept uprobes from
        /// following the lines of those whose control flow cannot be read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_percent: Option<f64>,
    },
    /// These lines ("file:line") show no count: how often a frame entered
    /// them depends on the path it took there (through code without a
    /// line), which edge counts do not tell.
    LinesUndetermined {
        /// The lines.
        lines: Vec<String>,
    },
    /// These lines ("file:line") show no count: the kernel refuses a uprobe
    /// where one of their rows starts (a lock prefix, say), and on every
    /// later instruction of it that a run through it surely reaches.
    LinesUnprobed {
        /// The lines.
        lines: Vec<String>,
    },
    /// The overhead governor removed functions' probes; they were sampled after.
    Throttled {
        /// When, in milliseconds from the start.
        after_ms: u64,
        /// The functions, with their calls until then.
        functions: Vec<FunctionCalls>,
        /// The budget, in percent of the elapsed time.
        budget_percent: f64,
        /// Whether the recording sampled them after.
        #[serde(default = "sampled_by_default")]
        sampled: bool,
        /// Whether their calls were still counted after.
        #[serde(default)]
        counted: bool,
    },
    /// Functions whose calls were only counted after a throttle cost more
    /// than the budget that way too: no longer counted.
    CountingStopped {
        /// When, in milliseconds from the start.
        after_ms: u64,
        /// The functions, with their calls counted until then.
        functions: Vec<FunctionCalls>,
        /// The budget, in percent of the elapsed time.
        budget_percent: f64,
        /// Whether the recording sampled them after (their calls since
        /// estimated from the samples; else not counted at all).
        #[serde(default = "sampled_by_default")]
        sampled: bool,
    },
    /// Functions over the overhead budget could not be unpatched.
    UnpatchFailed {
        /// The functions, with their calls until then.
        functions: Vec<FunctionCalls>,
        /// Why.
        error: String,
    },
    /// Functions found over the overhead budget kept their probes to the
    /// end: the probe set without them was still being defined when the
    /// recording ended (the kernel defines one probe set at a time, every
    /// tracer's).
    ThrottleUnfinished {
        /// When they were found over it, in milliseconds from the start.
        after_ms: u64,
        /// How long the definition had taken when the recording ended, ms.
        waited_ms: u64,
        /// The functions, with all their calls.
        functions: Vec<FunctionCalls>,
        /// The budget, in percent of the elapsed time.
        budget_percent: f64,
    },
    /// The probes of functions over the overhead budget could not be removed.
    ThrottleFailed {
        /// Why.
        error: String,
    },
    /// Automatic instrumentation sampled, then instrumented the hottest functions.
    AutoInstrumented {
        /// How long it sampled first, ms.
        warmup_ms: u64,
        /// The functions, hottest first (none: it saw nothing to instrument).
        functions: Vec<String>,
    },
    /// Automatic instrumentation could not instrument the hottest functions.
    AutoInstrumentFailed {
        /// Why.
        error: String,
    },
    /// The patched code of a process could not be restored.
    RestoreFailed {
        /// The process.
        pid: i32,
        /// Why.
        error: String,
    },
    /// The in-process engine's ring of a thread was full: records dropped.
    EngineRecordsLost {
        /// Entries and returns dropped.
        records: u64,
    },
    /// Calls the in-process engine could not time.
    Untimed {
        /// Deeper than a thread's shadow stack holds.
        too_deep: u64,
        /// In threads beyond those it times at once.
        without_slot: u64,
        /// Nested calls a shadow stack holds.
        stack_depth: u64,
        /// Threads timed at once.
        slots: u64,
    },
    /// Calls the in-process engine counted but could not time (their
    /// calling context did not fit, they went deeper than it keeps, a
    /// signal handler or a thread sharing another's thread pointer made them
    /// while it was busy, or an unwinder made them as it walked the stack),
    /// or counted without knowing the function.
    CallsUntimed {
        /// How many.
        calls: u64,
        /// Of them, in threads beyond those it times at once (function unknown).
        unseated: u64,
    },
    /// Region entries the in-process engine counted but could not time, or
    /// hooks it could not pair or did not see.
    RegionsIncomplete {
        /// Entries not timed: still open at the end, left by a longjmp or
        /// an exception, or past the regions a thread keeps open at once.
        untimed: u64,
        /// Leaves with no entry seen (recording started inside the region).
        unpaired: u64,
        /// Hooks not seen: made while the runtime was busy on their thread
        /// (a signal handler) or by threads beyond those it times at once.
        missed: u64,
    },
    /// Returns the in-process engine found no frame of their own for: the
    /// program switched stacks (coroutines, `swapcontext`, a fiber resumed
    /// on another thread). Each went back to its call site; every call is
    /// counted, the times of calls across a switch are approximate.
    StacksSwitched {
        /// How many returns.
        returns: u64,
        /// Threads whose calls of two stacks interleaved: their later
        /// calls are counted, not timed.
        threads_untimed: u64,
    },
    /// Threads whose calling contexts the in-process engine did not read:
    /// together they claimed more than one reading copies. Their calls are
    /// counted (and in `CallsUntimed`), not timed.
    ContextsOverBudget {
        /// How many threads.
        threads: u64,
        /// The most bytes of contexts one reading copies.
        budget_bytes: u64,
    },
    /// CPU time per call could not be measured by the in-process engine
    /// (it needs a BPF program, which needs CAP_BPF): it is wall time.
    CpuIsWall,
    /// The program refused proftap's code the rights to write itself (a
    /// seccomp filter, `PR_SET_MDWE`) as its first thread or process
    /// started, and proftap could not make the counts atomic for it in
    /// time: counts made without `lock` while one thread counted (of calls
    /// after a throttle, of lines) went on so while several did, and may
    /// be short.
    CountsUnlocked,
    /// Probe hits lost because a kernel ring buffer was full.
    HitsLost {
        /// How many.
        hits: u64,
    },
    /// Calls that ended without their own return.
    Unwound {
        /// How many.
        calls: u64,
    },
    /// Calls in progress when the probe set changed, whose return probes went with the old set.
    Orphaned {
        /// How many.
        calls: u64,
    },
    /// Kernel records that could not be read.
    Malformed {
        /// How many.
        records: u64,
    },
    /// A process executed another program: the probes on the previous one no longer apply.
    Executed {
        /// The process.
        pid: i32,
        /// The program, as the kernel names it.
        program: String,
    },
    /// Several processes executed other programs: the probes on the previous
    /// ones no longer apply (`processes` in the profile says which did what).
    ExecutedMany {
        /// How many processes did.
        processes: u64,
        /// The programs, as the kernel names them, each once.
        programs: Vec<String>,
    },
    /// Forked processes ran patched code the in-process engine does not record.
    ForksNotRecorded {
        /// Their pids.
        pids: Vec<i32>,
    },
    /// Still-instrumented functions whose exclusive time had the time of
    /// their callees not instrumented (throttled ones after the throttle,
    /// libraries') taken out, as estimated from samples.
    ThrottledTimeReleased {
        /// How many.
        functions: u64,
    },
    /// A forked child handed its memory to proftap, which could not read it.
    ChildNotRead {
        /// The child.
        pid: i32,
        /// Why.
        error: String,
    },
    /// Forked children refused: past the most one recording follows (at
    /// once or in all), or not what a child of the target sends.
    ChildrenRefused {
        /// How many.
        children: u64,
    },
    /// Forked children that could not hand their memory over to proftap
    /// (one in network and mount namespaces of its own reaches neither
    /// its socket's name nor its path; or the memory could not be made),
    /// and ran unrecorded: their calls are in
    /// no count.
    ChildrenUnreached {
        /// How many.
        children: u64,
    },
    /// Processes forked while the kernel's map of the processes sampled
    /// on every CPU was full: their stacks were not sampled.
    ChildrenUnsampled {
        /// How many.
        children: u64,
    },
    /// Pages of the off-CPU array (256 thread ids each) a patched process
    /// could not map, as the program had closed or replaced the descriptor
    /// proftap left it: the CPU times of its threads there count their
    /// time off CPU.
    OffCpuUnmapped {
        /// How many, over the processes recorded.
        pages: u64,
    },
    /// Stacks sampled less often than asked: the kernel allows no more
    /// samples a second (`kernel.perf_event_max_sample_rate`, which it
    /// lowers itself when sampling interrupts take long).
    SamplingCapped {
        /// Samples a second asked for.
        asked_hz: u64,
        /// Samples a second taken.
        hz: u64,
    },
}

/// Why the recorder chose uprobes over the in-process engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UprobeReason {
    /// A metric other than wall and CPU time.
    Metrics,
    /// Line counts or regions.
    Lines,
    /// The program forks, and forked processes are followed (in profiles of
    /// versions whose in-process engine did not follow them).
    Forks,
    /// The program cancels threads, and the unwinder that does it loads too late to hook.
    CancelsThreads,
}

/// Functions the in-process engine refused for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Why, in the patcher's words.
    pub reason: String,
    /// How many functions.
    pub count: u64,
    /// A few of their names.
    pub examples: Vec<String>,
}

/// A function and its calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCalls {
    /// Its name.
    pub name: String,
    /// Calls.
    pub calls: u64,
}

/// Throttled functions were sampled after, in files from before it was said.
fn sampled_by_default() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_of_both_kinds_read_back() {
        let notes = vec![Note::Text("an old sentence".into()), Finding::Unwound { calls: 3 }.into()];
        let json = serde_json::to_string(&notes).expect("json");
        assert_eq!(json, r#"["an old sentence",{"kind":"unwound","calls":3}]"#);
        assert_eq!(serde_json::from_str::<Vec<Note>>(&json).expect("back"), notes);
    }
}

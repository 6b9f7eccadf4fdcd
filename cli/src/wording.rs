//! What the recorder reports in types, in proftap's words: the sentences
//! that may name proftap's own flags are written here, not below.

use proftap_profile::{Finding, FunctionCalls, Note, Refusal, UprobeReason};
use proftap_record::error::RecordError;
use proftap_record::observer::Warning;

/// An error, as one sentence; those the recorder reports in types with a
/// remedy among proftap's flags name it.
pub fn error(error: &anyhow::Error) -> String {
    match error.downcast_ref::<RecordError>() {
        Some(RecordError::InjectMetrics) => {
            "the in-process engine measures wall and CPU time only, so far: use --metric wall,cpu or --engine uprobe".into()
        }
        Some(RecordError::Unhooked { entries }) => format!(
            "the in-process engine could not hook {entries}, and this program may unwind its stack (exceptions, panics, backtrace()): use --engine uprobe"
        ),
        _ => crate::output::error_sentence(error),
    }
}

/// A warning, as a sentence.
pub fn warning(warning: &Warning) -> String {
    match warning {
        Warning::Symbols { message } | Warning::Planning { message } => message.clone(),
        Warning::NoProbeCost { reason } => {
            format!("cannot measure the cost of a probe: {reason}; the report will not estimate the overhead")
        }
        Warning::EventsNotSaved { reason } => format!("the recording's events could not all be saved: {reason}"),
        Warning::CodeDiffers { functions } => code_differs(functions),
    }
}

/// Functions not recorded, their code in memory not the file's.
fn code_differs(functions: &[String]) -> String {
    format!("not recorded: {} (their code in memory was not what the file holds)", functions.join(", "))
}

/// Changes of the probes the overhead governor made (throttles) are told
/// one by one up to this many; a run of a real program makes dozens, and
/// the rest are told in one line (the report's "Throttled functions" and
/// its JSON name every one).
pub const PROBE_CHANGES_TOLD: usize = 3;

/// A change of the probes the governor made: when (ms into the
/// recording), how many functions it named, and what it did to them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeChange {
    /// When, in ms into the recording.
    pub after_ms: u64,
    /// How many functions it named.
    pub functions: usize,
    /// It stopped their counting (else it removed their probes).
    pub uncounted: bool,
    /// Without samples: their calls since are not estimated.
    pub unestimated: bool,
}

/// The change of the probes `note` tells, if it tells one.
pub fn probe_change(note: &Note) -> Option<ProbeChange> {
    match note {
        Note::Found(Finding::Throttled { after_ms, functions, .. }) => {
            Some(ProbeChange { after_ms: *after_ms, functions: functions.len(), uncounted: false, unestimated: false })
        }
        Note::Found(Finding::CountingStopped { after_ms, functions, sampled, .. }) => {
            Some(ProbeChange { after_ms: *after_ms, functions: functions.len(), uncounted: true, unestimated: !sampled })
        }
        _ => None,
    }
}

/// Changes of the probes past the first [`PROBE_CHANGES_TOLD`], told in one line.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct MoreProbeChanges {
    changes: usize,
    removed: usize,
    uncounted: usize,
    /// Of those, the functions whose calls since no sample estimates.
    unestimated: usize,
    first_ms: u64,
    last_ms: u64,
}

impl MoreProbeChanges {
    /// One more change.
    pub fn add(&mut self, change: ProbeChange) {
        let ProbeChange { after_ms, functions, uncounted, unestimated } = change;
        // Merged runs' notes, and the engine's changes next to uprobes', are not in time order.
        self.first_ms = if self.changes == 0 { after_ms } else { self.first_ms.min(after_ms) };
        self.last_ms = self.last_ms.max(after_ms);
        self.changes += 1;
        *if uncounted { &mut self.uncounted } else { &mut self.removed } += functions;
        self.unestimated += if unestimated { functions } else { 0 };
    }

    /// The line, if there was any.
    pub fn sentence(&self) -> Option<String> {
        let what = [
            (self.removed > 0).then(|| format!("probes removed from {}", counted(self.removed as u64, "more function", "more functions"))),
            (self.uncounted > 0).then(|| format!("counting stopped for {}", counted(self.uncounted as u64, "function", "functions"))),
            (self.unestimated > 0).then(|| {
                let which = match self.unestimated {
                    1 => "1 of them with a count that is a lower bound".to_string(),
                    n => format!("{n} of them with counts that are lower bounds"),
                };
                format!("{which} (no samples estimate the calls since)")
            }),
        ];
        let when = match (self.first_ms, self.last_ms) {
            (first, last) if first == last => format!("{first} ms"),
            (first, last) => format!("{first} to {last} ms"),
        };
        (self.changes > 0).then(|| {
            format!(
                "{} of the probes to keep within the overhead budget, {when} into the recording: {}; `proftap report --format json` lists each",
                counted(self.changes as u64, "more change", "more changes"),
                what.into_iter().flatten().collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// A profile's notes as sentences, the governor's changes of the probes
/// past the first few folded into one.
pub fn notes(notes: &[Note]) -> Vec<String> {
    let (mut told, mut more) = (0, MoreProbeChanges::default());
    let mut sentences = Vec::new();
    for n in notes {
        match probe_change(n) {
            Some(change) if told >= PROBE_CHANGES_TOLD => more.add(change),
            Some(_) => {
                told += 1;
                sentences.push(note(n));
            }
            None => sentences.push(note(n)),
        }
    }
    sentences.extend(more.sentence());
    sentences
}

/// A profile's note, as a sentence.
pub fn note(note: &Note) -> String {
    match note {
        Note::Text(text) => text.clone(),
        Note::Found(finding) => finding_sentence(finding),
    }
}

fn finding_sentence(finding: &Finding) -> String {
    match finding {
        Finding::UprobesChosen { reason } => format!("calls are seen by uprobes, not the in-process engine: {}", uprobe_reason(*reason)),
        Finding::NotPatched { functions, reasons, sampled, unmeasured } => {
            let parts: Vec<String> = reasons.iter().map(refusal).collect();
            let (is, it, its) = if *functions == 1 { ("is", "it", "its") } else { ("are", "them", "their") };
            let how = if *sampled {
                format!("{is} sampled only (a kernel probe costs a hundred patched calls; --overhead-budget 0 probes {it})")
            } else if *unmeasured {
                format!(
                    "{is} not measured: {its} time counts in {its} callers' own (a kernel probe costs a hundred patched calls; --overhead-budget 0 probes {it}, sampling would see {it})"
                )
            } else {
                format!(
                    "{is} probed by uprobes (each call a kernel probe hit, about a hundred patched calls' cost, which {its} callers' times include; in the call tree {is} under the thread, not {its} callers)"
                )
            };
            format!("{} could not be patched and {how}: {}", counted(*functions, "function", "functions"), parts.join("; "))
        }
        Finding::UprobesRefused { functions } => format!(
            "not measured: {} (the kernel refuses a uprobe on {} first instruction: a lock or segment prefix, or one it cannot run out of line)",
            examples(functions),
            if functions.len() == 1 { "its" } else { "their" }
        ),
        Finding::CodeDiffers { functions } => code_differs(functions),
        Finding::LinesUncountable { functions } => format!(
            "the lines of {} are followed by uprobes, not counted by the in-process engine: their control flow cannot be read ({})",
            counted(functions.len() as u64, "function", "functions"),
            examples(functions)
        ),
        Finding::RegionsUnhooked { functions } => format!(
            "calls are seen by uprobes and regions timed by uprobes on lines: the in-process engine cannot hook {} holding lines of a region ({})",
            counted(functions.len() as u64, "function", "functions"),
            examples(functions)
        ),
        Finding::LinesNotCounted { functions, budget_percent } => format!(
            "the lines of {} are not counted, and show no count{}: {}",
            counted(functions.len() as u64, "function", "functions"),
            budget_percent.map_or(String::new(), |percent| format!(
                " (where their control flow cannot be read, a uprobe on every line entry would follow them, far over the {percent}% overhead budget; --overhead-budget 0 keeps every probe)"
            )),
            examples(functions)
        ),
        Finding::LinesUndetermined { lines } => format!(
            "{} show no count: how often a frame entered {} depends on the path it took there through code without a line, which edge counters cannot tell (--line-times follows every line with uprobes): {}",
            counted(lines.len() as u64, "line", "lines"),
            if lines.len() == 1 { "it" } else { "them" },
            examples(lines)
        ),
        Finding::LinesUnprobed { lines } => format!(
            "{} no count: the kernel refuses a uprobe where {} starts (on a lock or segment prefix, ud2, int3, syscall, a fence) and on the instructions after it that a run through the line surely reaches: {}",
            if lines.len() == 1 { "1 line shows".to_string() } else { format!("{} lines show", lines.len()) },
            if lines.len() == 1 { "it" } else { "each" },
            examples(lines)
        ),
        Finding::Throttled { after_ms, functions, budget_percent, sampled, counted } => format!(
            "after {after_ms} ms, removed the probes of {}: the costliest while the probes together were over the {budget_percent}% overhead budget; {} from then on{}",
            with_calls(functions),
            if *sampled { "sampled" } else { "not timed" },
            if *counted { ", their calls still counted" } else { "" }
        ),
        Finding::CountingStopped { after_ms, functions, budget_percent, sampled } => format!(
            "after {after_ms} ms, stopped counting the calls of {} after their probes were removed: counting alone cost more than half the {budget_percent}% overhead budget while the probes together were over it; {}",
            with_calls(functions),
            if *sampled {
                "their calls from then on are estimated from the samples, where enough were taken while they were counted (else they are left unknown)"
            } else {
                "their calls from then on are not counted (without samples nothing estimates them): their counts are lower bounds"
            }
        ),
        Finding::UnpatchFailed { functions, error } => {
            format!("could not unpatch {}, over the overhead budget: {error}", with_calls(functions))
        }
        Finding::ThrottleUnfinished { after_ms, waited_ms, functions, budget_percent } => format!(
            "after {after_ms} ms, found {} over the {budget_percent}% overhead budget, but the kernel was still defining the probes without them {waited_ms} ms later, when the recording ended (it defines one tracer's probes at a time; another's may have held it): they kept their probes, exact and at their cost, to the end",
            with_calls(functions)
        ),
        Finding::ThrottleFailed { error } => {
            format!("could not remove the probes of functions over the overhead budget ({error}): every probe was kept from then on")
        }
        Finding::AutoInstrumented { warmup_ms, functions } if functions.is_empty() => {
            format!("sampled for {warmup_ms} ms and saw no function to instrument")
        }
        Finding::AutoInstrumented { warmup_ms, functions } => format!(
            "sampled for {warmup_ms} ms, then instrumented the {} hottest functions by sampled inclusive time: {}",
            functions.len(),
            functions.join(", ")
        ),
        Finding::AutoInstrumentFailed { error } => format!("could not instrument the hottest functions: {error}"),
        Finding::RestoreFailed { pid, error } => {
            format!("could not restore the code of process {pid}: {error}; it runs on with proftap's jumps, which record nothing")
        }
        Finding::EngineRecordsLost { records } => format!(
            "{records} entries and returns were lost because the in-process engine's ring of a thread was full (proftap did not read them fast enough); calls and times of the functions involved are low"
        ),
        Finding::Untimed { too_deep, without_slot, stack_depth, slots } => format!(
            "{} not timed by the in-process engine ({too_deep} deeper than the {stack_depth} nested calls a thread's shadow stack holds, {without_slot} in threads beyond the {slots} it times at once); counted as lost entries and returns, calls of the functions involved are low",
            counted(too_deep + without_slot, "call was", "calls were"),
        ),
        Finding::CallsUntimed { calls, unseated: 0 } => format!(
            "{} counted but not timed by the in-process engine (deeper than it keeps, beyond the calling contexts it keeps per thread, made by a signal handler while it was busy, or by an unwinder as it walked the stack); their time is in their callers' own time, and the averages of the functions involved are of their timed calls",
            counted(*calls, "call was", "calls were")
        ),
        Finding::CallsUntimed { calls, unseated } => format!(
            "{} counted but not timed by the in-process engine, {unseated} of them in threads beyond those it times at once (their functions unknown); their time is in their callers' own time, and the averages of the functions involved are of their timed calls",
            counted(*calls, "call was", "calls were")
        ),
        Finding::RegionsIncomplete { untimed, unpaired, missed } => format!(
            "regions: {} counted but not timed (still open at the end, left by a longjmp or an exception, or more open at once than a thread keeps), {} without an entry seen, {} not seen (made while the in-process engine was busy on their thread, or by threads beyond those it times at once); the regions' times are low",
            counted(*untimed, "entry", "entries"),
            counted(*unpaired, "leave", "leaves"),
            counted(*missed, "hook", "hooks")
        ),
        Finding::StacksSwitched { returns, threads_untimed } => {
            let mut parts = Vec::new();
            if *returns > 0 {
                parts.push(format!(
                    "{} and went back to the call site; every call is counted, but the times of calls across a switch are approximate",
                    counted(*returns, "return found no frame of its call", "returns found no frame of their calls")
                ));
            }
            if *threads_untimed > 0 {
                parts.push(format!(
                    "in {} whose calls on two stacks interleaved, later calls are counted, not timed",
                    counted(*threads_untimed, "thread", "threads")
                ));
            }
            format!("the program switched stacks (coroutines, swapcontext, a fiber resumed on another thread): {}", parts.join("; "))
        }
        Finding::ContextsOverBudget { threads, budget_bytes } => format!(
            "the calling contexts of {} were not read: with the others they take more than the {} MiB one reading copies; their calls are counted, not timed",
            counted(*threads, "thread", "threads"),
            budget_bytes >> 20
        ),
        Finding::CpuIsWall => {
            "the in-process engine measures CPU time per call with a BPF program, which needs CAP_BPF and CAP_PERFMON (root); here CPU time is wall time".into()
        }
        Finding::CountsUnlocked => {
            "the program refused proftap's code the right to write itself as its first thread or process started (a seccomp filter or PR_SET_MDWE), and proftap could not make its counts atomic in time: calls counted after a throttle, and line counts, may be short from then on; --overhead-budget 0 keeps calls timed".into()
        }
        Finding::HitsLost { hits } => format!(
            "{} lost because a ring buffer was full; calls and times of the functions and threads involved are low (raise --buffer-size)",
            counted(*hits, "probe hit was", "probe hits were")
        ),
        Finding::Unwound { calls } => format!(
            "{} without its own return (C++ exception, longjmp, exit, or a call deeper than the kernel's 64 tracked returns per thread); marked unwound and timed until the moment proftap saw it gone",
            counted(*calls, "call ended", "calls ended")
        ),
        Finding::Orphaned { calls } => format!(
            "{} in progress when the probe set changed, and return probes went with the old set; marked unfinished and timed until proftap saw it gone",
            counted(*calls, "call was", "calls were")
        ),
        Finding::Malformed { records } => format!("{} could not be read and skipped", counted(*records, "kernel record", "kernel records")),
        Finding::Executed { pid, program } => {
            format!("process {pid} executed {program}: probes on the previous program no longer apply to it")
        }
        Finding::ExecutedMany { processes, programs } => format!(
            "{processes} processes executed other programs ({}): probes on the previous programs no longer apply to them",
            examples(programs)
        ),
        Finding::ForksNotRecorded { pids } => format!(
            "forked {} {} recorded no calls: {} made no call of a patched function while proftap took forked children (a child hands its memory over at its first; those that could not are counted apart)",
            if pids.len() == 1 { "process" } else { "processes" },
            examples(&pids.iter().map(i32::to_string).collect::<Vec<_>>()).replace("; ", ", "),
            if pids.len() == 1 { "it" } else { "they" },
        ),
        Finding::ThrottledTimeReleased { functions } => format!(
            "the exclusive times of {} exclude what their callees not instrumented took (throttled ones after their probes were removed, and libraries'): estimated from samples (from a caller's own samples where it has fewer than its callees), shown under \"Throttled functions\" and \"Sampled only\"",
            counted(*functions, "function", "functions")
        ),
        Finding::ChildNotRead { pid, error } => {
            format!("the calls of forked process {pid} are not counted: its memory could not be read ({error})")
        }
        Finding::ChildrenRefused { children } => format!(
            "{} not followed: past the {} running at once or the {} in all one recording follows, or not a child of the target",
            counted(*children, "forked process was", "forked processes were"),
            proftap_probes::inject::children::MOST_HELD_CHILDREN,
            proftap_probes::inject::children::MOST_CHILDREN
        ),
        Finding::ChildrenUnreached { children } => format!(
            "{} not recorded: {} could not hand {} memory over to proftap (a process in network and mount namespaces of its own cannot reach it), so {} calls are in no count; --engine uprobe follows such processes with kernel probes",
            counted(*children, "forked process was", "forked processes were"),
            if *children == 1 { "it" } else { "they" },
            if *children == 1 { "its" } else { "their" },
            if *children == 1 { "its" } else { "their" },
        ),
        Finding::ChildrenUnsampled { children } => format!(
            "{} not sampled, nor the processes they forked: the kernel's list of the processes sampled had no room for them ({} at once)",
            counted(*children, "forked process was", "forked processes were"),
            proftap_probes::sampled_processes::MOST_PROCESSES
        ),
        Finding::OffCpuUnmapped { pages } => format!(
            "the time off CPU of some threads could not be read ({}): the program closed or replaced the descriptor proftap left it to read them from, so their CPU times are their wall times; -e wall records without CPU time",
            counted(*pages, "range of 256 thread ids", "ranges of 256 thread ids")
        ),
        Finding::SamplingCapped { asked_hz, hz } => format!(
            "stacks sampled {hz} times a second, not {asked_hz}: the kernel allows no more (kernel.perf_event_max_sample_rate, which it lowers by itself when sampling interrupts take long; root may raise it again)"
        ),
    }
}

/// The first few of `items`, and how many more.
fn examples(items: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = items.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > SHOWN {
        text.push_str(&format!("; and {} more", items.len() - SHOWN));
    }
    text
}

fn uprobe_reason(reason: UprobeReason) -> &'static str {
    match reason {
        UprobeReason::Metrics => "the in-process engine measures wall and CPU time only",
        UprobeReason::Lines => "line times, and regions in functions the in-process engine cannot hook, are seen by uprobes on lines",
        UprobeReason::Forks => {
            "the program calls fork, and the in-process engine does not record forked processes (--no-follow-fork lets it)"
        }
        UprobeReason::CancelsThreads => {
            "the program calls pthread_cancel, and libgcc_s, which unwinds a cancelled thread, is loaded only then, too late for the in-process engine to hook it (this C library has no link to it to hook; glibc 2.34 and later have one)"
        }
    }
}

/// "2 [too short]: f, g, ..."
fn refusal(refusal: &Refusal) -> String {
    let more = if (refusal.count as usize) > refusal.examples.len() { ", ..." } else { "" };
    format!("{} [{}]: {}{more}", refusal.count, refusal.reason, refusal.examples.join(", "))
}

/// "f (12 calls), g (3 calls)"
/// The functions with their calls, the most called first; past a few, how
/// many more (a build's governor may name hundreds: the profile keeps every
/// name in the note, and the throttled ones each have a row of their own).
fn with_calls(functions: &[FunctionCalls]) -> String {
    const SHOWN: usize = 8;
    let mut by_calls: Vec<&FunctionCalls> = functions.iter().collect();
    by_calls.sort_by_key(|f| std::cmp::Reverse(f.calls));
    let mut text =
        by_calls.iter().take(SHOWN).map(|f| format!("{} ({})", f.name, counted(f.calls, "call", "calls"))).collect::<Vec<_>>().join(", ");
    if functions.len() > SHOWN {
        text.push_str(&format!(" and {} more", functions.len() - SHOWN));
    }
    text
}

/// "1 call was", "2 calls were".
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttled(after_ms: u64, names: &[&str]) -> Note {
        let functions = names.iter().map(|n| FunctionCalls { name: n.to_string(), calls: 1 }).collect();
        Note::Found(Finding::Throttled { after_ms, functions, budget_percent: 5.0, sampled: true, counted: true })
    }

    fn uncounted(after_ms: u64, names: &[&str]) -> Note {
        let functions = names.iter().map(|n| FunctionCalls { name: n.to_string(), calls: 1 }).collect();
        Note::Found(Finding::CountingStopped { after_ms, functions, budget_percent: 5.0, sampled: true })
    }

    /// Without samples, calls no longer counted are not estimated either:
    /// the note says their counts are lower bounds.
    #[test]
    fn counting_stopped_without_samples_says_the_counts_are_lower_bounds() {
        let functions = vec![FunctionCalls { name: "f".into(), calls: 1 }];
        let note = |sampled| {
            super::notes(&[Note::Found(Finding::CountingStopped {
                after_ms: 3,
                functions: functions.clone(),
                budget_percent: 5.0,
                sampled,
            })])
            .remove(0)
        };
        assert!(
            note(false).ends_with("not counted (without samples nothing estimates them): their counts are lower bounds"),
            "{}",
            note(false)
        );
        assert!(note(true).ends_with("where enough were taken while they were counted (else they are left unknown)"), "{}", note(true));
    }

    #[test]
    fn the_governors_changes_past_the_first_few_are_told_in_one_line() {
        let notes = [
            throttled(3, &["a"]),
            Note::Text("other".into()),
            uncounted(4, &["a"]),
            throttled(5, &["b", "c"]),
            throttled(9, &["d", "e", "f"]),
            uncounted(12, &["d"]),
            throttled(20, &["g"]),
        ];
        let told = super::notes(&notes);
        assert_eq!(told.len(), 5, "{told:#?}");
        assert!(told[0].contains("after 3 ms, removed the probes of a"), "{}", told[0]);
        assert_eq!(told[1], "other");
        assert!(told[3].contains("removed the probes of b"), "{}", told[3]);
        assert_eq!(
            told[4],
            "3 more changes of the probes to keep within the overhead budget, 9 to 20 ms into the recording: probes removed from 4 more functions, counting stopped for 1 function; `proftap report --format json` lists each"
        );
        // A few are all told as they are; out of time order, the range still holds.
        assert_eq!(super::notes(&notes[..4]).len(), 4);
        let late_first = [throttled(1, &["a"]), throttled(2, &["b"]), throttled(3, &["c"]), throttled(30, &["d"]), throttled(10, &["e"])];
        assert!(super::notes(&late_first)[3].starts_with("2 more changes of the probes to keep within the overhead budget, 10 to 30 ms"));
        let one = super::notes(&late_first[..4]);
        assert!(one[3].starts_with("1 more change of the probes to keep within the overhead budget, 30 ms into"), "{}", one[3]);
        // Counting stopped without samples, folded: the line says the counts are lower bounds.
        let unsampled = |after_ms, name: &str| {
            let functions = vec![FunctionCalls { name: name.into(), calls: 1 }];
            Note::Found(Finding::CountingStopped { after_ms, functions, budget_percent: 5.0, sampled: false })
        };
        let folded = [throttled(1, &["a"]), throttled(2, &["b"]), throttled(3, &["c"]), unsampled(4, "a"), unsampled(5, "b")];
        let told = super::notes(&folded);
        assert!(
            told[3].ends_with("counting stopped for 2 functions, 2 of them with counts that are lower bounds (no samples estimate the calls since); `proftap report --format json` lists each"),
            "{}",
            told[3]
        );
        assert!(!super::notes(&notes).concat().contains("lower bound"));
    }
}

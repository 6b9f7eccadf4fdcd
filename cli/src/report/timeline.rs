//! What the timeline exports share: a thread's traced calls laid out as
//! properly nested spans, and the names of threads, processes and places.

use proftap_profile::{FunctionId, Profile, TracedCall};
use std::collections::HashMap;
use std::path::Path;

/// One traced call as a timeline draws it: inside its caller's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Which function.
    pub function: FunctionId,
    /// Nanoseconds from the start of the recording to its entry.
    pub start_ns: u64,
    /// Nanoseconds from the start of the recording to its return.
    pub end_ns: u64,
    /// Spans it is drawn inside of (0: none).
    pub level: u32,
}

/// A thread's calls as spans, in the order they open: each inside the
/// latest open span of a smaller depth that has not ended before it
/// starts, and within that span's time; spans open in time order, and each
/// span's callees all open and close before it closes. Recorded calls
/// already nest, and keep their times; calls that do not (a damaged or
/// hand-made profile) are moved just enough, so that viewers which check
/// nesting (speedscope) load every call.
pub fn spans(calls: &[TracedCall]) -> Vec<Span> {
    let mut order: Vec<&TracedCall> = calls.iter().collect();
    // Stable: among calls entered at the same time, a caller stays before its callees.
    order.sort_by_key(|c| c.start_ns);
    // Open spans: their depth and end.
    let mut open: Vec<(u32, u64)> = Vec::new();
    // The time of the latest open or close drawn.
    let mut last = 0u64;
    let mut spans = Vec::with_capacity(order.len());
    for call in order {
        while let Some(&(depth, end)) = open.last() {
            if depth < call.depth && end >= call.start_ns {
                break;
            }
            open.pop();
            last = last.max(end);
        }
        let start = call.start_ns.max(last);
        let mut end = call.end_ns().max(start);
        if let Some(&(_, caller_end)) = open.last() {
            end = end.min(caller_end);
        }
        spans.push(Span { function: call.function, start_ns: start, end_ns: end, level: open.len() as u32 });
        open.push((call.depth, end));
        last = start;
    }
    spans
}

/// The names of a profile's threads and processes, looked up by id.
pub struct Names<'a> {
    profile: &'a Profile,
    threads: HashMap<(i32, i32), &'a str>,
    execs: HashMap<i32, &'a str>,
}

impl<'a> Names<'a> {
    /// Indexes the names `profile` holds.
    pub fn new(profile: &'a Profile) -> Self {
        let threads = profile.threads.iter().filter(|t| !t.name.is_empty()).map(|t| ((t.pid, t.tid), t.name.as_str())).collect();
        let execs = profile.processes.iter().filter_map(|p| Some((p.pid, p.execs.last()?.as_str()))).collect();
        Names { profile, threads, execs }
    }

    /// The name of thread `tid` of process `pid`, when the profile knows it.
    pub fn thread(&self, pid: i32, tid: i32) -> Option<&'a str> {
        self.threads.get(&(pid, tid)).copied()
    }

    /// The thread as the timelines title it: `NAME (TID)`, or the tid alone.
    pub fn thread_title(&self, pid: i32, tid: i32) -> String {
        match self.thread(pid, tid) {
            Some(name) => format!("{name} ({tid})"),
            None => tid.to_string(),
        }
    }

    /// What a process ran: the file name of the last program it executed
    /// while recorded, else of the target's (forked children run it too).
    pub fn process(&self, pid: i32) -> String {
        let target = &self.profile.target;
        let path = self.execs.get(&pid).copied().or(target.command.first().map(String::as_str)).unwrap_or(&target.exe);
        let name = Path::new(path).file_name().map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
        if name.is_empty() { format!("process {pid}") } else { name }
    }
}

/// Where a function is declared, `file:line` (`file` alone when the line is
/// unknown), when the profile says.
pub fn location(profile: &Profile, function: FunctionId) -> Option<String> {
    let f = profile.functions.get(function as usize)?;
    let file = f.file.as_deref().filter(|file| !file.is_empty())?;
    Some(if f.line > 0 { format!("{file}:{}", f.line) } else { file.to_string() })
}

/// A profile with a trace, for the exports' tests: two threads of process
/// 100, `main` > `work` > `leaf` on the first (calls entered and returning
/// together, a call of no time), `work` > `leaf` and a function with no
/// declaration on the second, and sampled stacks on both.
#[cfg(test)]
pub(crate) fn traced_profile() -> Profile {
    use proftap_profile::{
        CallTree, FunctionInfo, SampleProfile, SampledFrame, SampledStack, ThreadProfile, ThreadTrace, Trace, TracedSample,
    };
    let function = |name: &str, line| FunctionInfo {
        name: name.into(),
        module: "/usr/bin/prog".into(),
        file: (line > 0).then(|| "prog.c".to_string()),
        line,
        ..FunctionInfo::default()
    };
    let call = |function, start_ns, duration_ns, depth| TracedCall { function, start_ns, duration_ns, depth };
    let frame = |name: &str, module: &str, inlined| SampledFrame { name: name.into(), module: module.into(), inlined };
    let thread = |tid, name: &str| ThreadProfile { pid: 100, tid, name: name.into(), functions: Vec::new(), tree: CallTree::new(0) };
    let sample = |time_ns, stack| TracedSample { time_ns, stack };
    let mut profile = Profile {
        functions: vec![function("main", 30), function("work", 20), function("leaf", 10), function("odd \"one\"", 0)],
        threads: vec![thread(100, "prog"), thread(101, "worker")],
        samples: Some(SampleProfile {
            event: "cpu-clock".into(),
            frequency_hz: 1000,
            total: 4,
            frames: vec![
                frame("main", "/usr/bin/prog", false),
                frame("work", "/usr/bin/prog", false),
                frame("leaf", "/usr/bin/prog", false),
                frame("memcpy", "/lib/libc.so.6", false),
                frame("mix", "/usr/bin/prog", true),
            ],
            stacks: vec![
                SampledStack { frames: vec![0, 1, 2], count: 2 },
                SampledStack { frames: vec![0, 1, 3], count: 1 },
                SampledStack { frames: vec![1, 2, 4], count: 1 },
            ],
            ..SampleProfile::default()
        }),
        ..Profile::default()
    };
    profile.target.pid = 100;
    profile.target.command = vec!["/usr/bin/prog".into()];
    profile.recording.duration_ns = 12_000;
    profile.recording.started_unix_ns = 1_700_000_000_000_000_000;
    profile.trace = Some(Trace {
        limit_bytes: 1 << 20,
        cut: 0,
        missed: 0,
        threads: vec![
            ThreadTrace {
                pid: 100,
                tid: 100,
                calls: vec![
                    call(0, 1_000, 9_000, 0),
                    call(1, 1_000, 4_001, 1),
                    call(2, 1_500, 1_234, 2),
                    call(2, 3_000, 0, 2),
                    call(2, 4_000, 1_001, 2),
                    call(1, 6_000, 4_000, 1),
                ],
                samples: vec![sample(1_600, 0), sample(3_500, 1), sample(4_500, 0)],
            },
            ThreadTrace {
                pid: 100,
                tid: 101,
                calls: vec![call(1, 2_000, 3_000, 0), call(2, 2_500, 500, 1), call(3, 6_000, 10, 0)],
                samples: vec![sample(2_600, 2)],
            },
        ],
    });
    profile
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{CallTree, ThreadProfile};

    fn call(function: u32, start_ns: u64, duration_ns: u64, depth: u32) -> TracedCall {
        TracedCall { function, start_ns, duration_ns, depth }
    }

    fn span(function: u32, start_ns: u64, end_ns: u64, level: u32) -> Span {
        Span { function, start_ns, end_ns, level }
    }

    #[test]
    fn recorded_calls_keep_their_times_and_nest_by_depth() {
        let calls = [
            call(0, 10, 100, 0),
            call(1, 10, 20, 1), // entered with its caller
            call(2, 15, 0, 2),  // no time at all
            call(1, 30, 80, 1), // ends with its caller
            call(2, 30, 0, 2),
            call(0, 110, 5, 0), // entered as the first returned
        ];
        assert_eq!(
            spans(&calls),
            vec![
                span(0, 10, 110, 0),
                span(1, 10, 30, 1),
                span(2, 15, 15, 2),
                span(1, 30, 110, 1),
                span(2, 30, 30, 2),
                span(0, 110, 115, 0)
            ]
        );
    }

    #[test]
    fn a_zero_time_call_before_a_caller_entered_at_the_same_time_is_not_its_callee() {
        // p returns at 5, x (inside p) takes no time at 5, then y is entered at 5.
        let calls = [call(0, 3, 2, 0), call(1, 5, 0, 1), call(2, 5, 2, 0)];
        assert_eq!(spans(&calls), vec![span(0, 3, 5, 0), span(1, 5, 5, 1), span(2, 5, 7, 0)]);
    }

    #[test]
    fn calls_that_do_not_nest_are_moved_into_their_caller() {
        let calls = [
            call(0, 100, 50, 0),
            call(1, 120, 100, 1), // outlives its caller: cut at 150
            call(2, 90, 10, 0),   // out of order: sorted first
            call(3, 95, 20, 0),   // overlaps its predecessor at its depth: starts when it ends
            call(4, 400, 1, 7),   // deeper than anything open: a top-level call
        ];
        let laid = spans(&calls);
        assert_eq!(laid, vec![span(2, 90, 100, 0), span(3, 100, 115, 0), span(0, 115, 150, 0), span(1, 120, 150, 1), span(4, 400, 401, 0)]);
        // Never earlier than what was drawn before.
        assert!(laid.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
    }

    #[test]
    fn names_fall_back_to_what_is_known() {
        let mut profile = Profile::default();
        profile.target.command = vec!["/usr/bin/prog".into(), "x".into()];
        profile.processes.push(proftap_profile::ProcessInfo { pid: 8, parent: Some(7), execs: vec!["/bin/sh".into()] });
        profile.functions.push(proftap_profile::FunctionInfo { file: Some("a.c".into()), line: 4, ..Default::default() });
        profile.functions.push(proftap_profile::FunctionInfo { file: Some("b.c".into()), ..Default::default() });
        profile.functions.push(proftap_profile::FunctionInfo::default());
        profile.threads.push(ThreadProfile { pid: 7, tid: 9, name: "worker".into(), functions: Vec::new(), tree: CallTree::new(0) });
        let names = Names::new(&profile);
        assert_eq!(names.process(7), "prog");
        assert_eq!(names.process(8), "sh");
        assert_eq!(Names::new(&Profile::default()).process(9), "process 9");
        assert_eq!(location(&profile, 0).as_deref(), Some("a.c:4"));
        assert_eq!(location(&profile, 1).as_deref(), Some("b.c"));
        assert_eq!(location(&profile, 2), None);
        assert_eq!(location(&profile, 3), None);
        assert_eq!(names.thread_title(7, 9), "worker (9)");
        assert_eq!(names.thread_title(7, 7), "7");
    }
}

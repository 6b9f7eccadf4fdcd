//! The slowest calls of a function, from a profile's trace: when each
//! started, on which thread, how long it took.

use super::text::{format_ns, group_digits};
use proftap_profile::Profile;
use serde::Serialize;
use std::fmt::Write;

/// One call of the function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlowCall {
    /// Process id.
    pub pid: i32,
    /// Thread id.
    pub tid: i32,
    /// The thread's name.
    pub thread: String,
    /// Nanoseconds from the start of the recording to its entry.
    pub start_ns: u64,
    /// Wall nanoseconds it took.
    pub duration_ns: u64,
    /// Instrumented calls it was inside of.
    pub depth: u32,
}

/// The slowest calls of a function, and how many calls of it the trace has.
#[derive(Clone, Debug, Serialize)]
pub struct Slowest {
    /// The function.
    pub function: String,
    /// Its calls in the trace.
    pub traced: u64,
    /// Calls the trace did not keep (of every function).
    pub cut: u64,
    /// The slowest, slowest first (the earlier first among equals).
    pub slowest: Vec<SlowCall>,
}

/// The `n` slowest calls of the functions named `name`; an error says why
/// there are none to list.
pub fn slowest(profile: &Profile, name: &str, n: usize) -> Result<Slowest, String> {
    let Some(trace) = &profile.trace else {
        return Err("it has no trace; record it with --trace to keep every call".into());
    };
    let ids: Vec<u32> = profile.functions.iter().enumerate().filter(|(_, f)| f.name == name).map(|(i, _)| i as u32).collect();
    if ids.is_empty() {
        return Err(format!("it has no function named '{name}' (proftap report lists them)"));
    }
    let mut calls: Vec<SlowCall> = Vec::new();
    let mut traced = 0u64;
    for thread in &trace.threads {
        let name = profile.threads.iter().find(|t| t.tid == thread.tid && t.pid == thread.pid).map_or("", |t| t.name.as_str());
        for call in thread.calls.iter().filter(|c| ids.contains(&c.function)) {
            traced += 1;
            let slow = SlowCall {
                pid: thread.pid,
                tid: thread.tid,
                thread: name.to_string(),
                start_ns: call.start_ns,
                duration_ns: call.duration_ns,
                depth: call.depth,
            };
            keep_slowest(&mut calls, slow, n);
        }
    }
    Ok(Slowest { function: name.to_string(), traced, cut: trace.cut, slowest: calls })
}

/// Puts `call` among the `n` slowest in `calls` (kept in order), if it is one.
fn keep_slowest(calls: &mut Vec<SlowCall>, call: SlowCall, n: usize) {
    let order = |c: &SlowCall| (std::cmp::Reverse(c.duration_ns), c.start_ns, c.tid);
    let at = calls.partition_point(|c| order(c) <= order(&call));
    if at < n {
        calls.insert(at, call);
        calls.truncate(n);
    }
}

/// The list as text.
pub fn render(s: &Slowest) -> String {
    let mut out = String::new();
    if s.traced == 0 {
        let _ = writeln!(out, "The trace has no call of {}.", s.function);
        if s.cut > 0 {
            let _ = writeln!(out, "It did not keep {} calls: some may have been of it.", group_digits(s.cut));
        }
        return out;
    }
    let _ = writeln!(out, "The {} slowest calls of {} (of {} in the trace)", s.slowest.len(), s.function, group_digits(s.traced));
    let _ = writeln!(out, "{:>12} {:>14} {:>8} {:>6}  thread", "took", "started at", "tid", "depth");
    for c in &s.slowest {
        let _ = writeln!(out, "{:>12} {:>14} {:>8} {:>6}  {}", format_ns(c.duration_ns), format_ns(c.start_ns), c.tid, c.depth, c.thread);
    }
    if s.cut > 0 {
        let _ = writeln!(out, "The trace did not keep {} calls: slower ones may be among them.", group_digits(s.cut));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{FunctionInfo, ThreadTrace, Trace, TracedCall};

    fn profile() -> Profile {
        let call = |function, start_ns, duration_ns| TracedCall { function, start_ns, duration_ns, depth: 0 };
        let threads = vec![
            ThreadTrace { pid: 1, tid: 1, calls: vec![call(0, 10, 50), call(1, 70, 900), call(0, 100, 70)], samples: vec![] },
            ThreadTrace { pid: 1, tid: 2, calls: vec![call(0, 5, 70), call(0, 20, 10)], samples: vec![] },
        ];
        let named = |name: &str| FunctionInfo { name: name.into(), ..FunctionInfo::default() };
        Profile {
            functions: vec![named("f"), named("g")],
            trace: Some(Trace { limit_bytes: 1 << 20, cut: 0, missed: 0, threads }),
            ..Profile::default()
        }
    }

    #[test]
    fn the_slowest_come_first_and_equals_by_start() {
        let s = slowest(&profile(), "f", 3).unwrap();
        assert_eq!(s.traced, 4);
        let listed: Vec<(u64, i32, u64)> = s.slowest.iter().map(|c| (c.duration_ns, c.tid, c.start_ns)).collect();
        assert_eq!(listed, [(70, 2, 5), (70, 1, 100), (50, 1, 10)]);
        assert!(render(&s).contains("The 3 slowest calls of f (of 4 in the trace)"));
    }

    #[test]
    fn a_function_the_trace_has_no_call_of_is_said_to_have_none() {
        let mut p = profile();
        p.functions.push(FunctionInfo { name: "idle".into(), ..FunctionInfo::default() });
        let s = slowest(&p, "idle", 3).unwrap();
        assert_eq!(render(&s), "The trace has no call of idle.\n");
        p.trace.as_mut().unwrap().cut = 12;
        let s = slowest(&p, "idle", 3).unwrap();
        assert!(render(&s).ends_with("It did not keep 12 calls: some may have been of it.\n"), "{}", render(&s));
    }

    #[test]
    fn no_trace_or_no_such_function_is_said() {
        let mut p = profile();
        assert!(slowest(&p, "h", 3).unwrap_err().contains("no function named 'h'"));
        p.trace = None;
        assert!(slowest(&p, "f", 3).unwrap_err().contains("record it with --trace"));
    }
}

//! The trace in the Chrome trace event format (a JSON object with
//! `traceEvents`), which the Perfetto UI, `chrome://tracing` and speedscope
//! open.
//!
//! Each traced call is a complete event (`"ph": "X"`, category `call`) on
//! its thread, named after its function, with `args.location` its
//! declaration's `file:line`; `ts` and `dur` are microseconds from the start
//! of the recording, written with their fractions, so nanoseconds are kept.
//! Each sampled stack is a thread-scoped instant event (`"ph": "i"`,
//! category `sample`) named after its innermost frame, with `args.stack` its
//! frames innermost first, as a debugger lists them (the Perfetto UI shows
//! one a row). Metadata events (`"ph": "M"`) name each process and thread.

use crate::report::timeline::{self, Names, Span};
use anyhow::{Result, bail};
use proftap_profile::{Profile, ThreadTrace, Trace};
use serde::{Serialize, Serializer};

/// The most bytes a Chrome trace export may take: unlike the other
/// timeline formats it repeats a function's names at each of its calls,
/// and a sampled stack's at each sample.
pub const MAX_BYTES: u64 = 2 << 30;

/// Bytes an event takes besides its names, at most (numbers, keys, punctuation).
const EVENT_BYTES: u64 = 160;

/// One trace event; fields a phase does not use are left out.
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    cat: &'static str,
    ph: &'static str,
    pid: i32,
    tid: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    /// Instant events' scope: `t`, the thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Args::is_empty")]
    args: Args<'a>,
}

#[derive(Default, Serialize)]
struct Args<'a> {
    /// Metadata: the process's or thread's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    /// Calls: `file:line`.
    #[serde(skip_serializing_if = "Option::is_none")]
    location: Option<&'a str>,
    /// Samples: frames, innermost first.
    #[serde(skip_serializing_if = "Option::is_none")]
    stack: Option<&'a [&'a str]>,
}

impl Args<'_> {
    fn is_empty(&self) -> bool {
        self.name.is_none() && self.location.is_none() && self.stack.is_none()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TraceFile<'a> {
    trace_events: Events<'a>,
    display_time_unit: &'static str,
    other_data: OtherData<'a>,
}

/// What the Perfetto UI lists as the trace's metadata.
#[derive(Serialize)]
struct OtherData<'a> {
    command: String,
    proftap_version: &'a str,
    /// Calls the profile counted that the trace does not hold.
    calls_not_traced: u64,
}

/// The trace of `profile` as a Chrome trace (JSON), refused when it would
/// take more than [`MAX_BYTES`].
pub fn render(profile: &Profile, trace: &Trace) -> Result<Vec<u8>> {
    let bytes = size(profile, trace);
    if bytes > MAX_BYTES {
        bail!(
            "its trace would take {} MiB as a Chrome trace, more than the {} MiB this export may: \
             record a smaller trace (--trace-size), or export it --format speedscope or firefox, which name each function once",
            bytes >> 20,
            MAX_BYTES >> 20
        );
    }
    let file = TraceFile {
        trace_events: Events::new(profile, trace),
        display_time_unit: "ns",
        other_data: OtherData {
            command: profile.target.command.join(" "),
            proftap_version: &profile.recording.proftap_version,
            calls_not_traced: trace.cut,
        },
    };
    Ok(serde_json::to_vec(&file)?)
}

/// The events, written one by one as they are made.
struct Events<'a> {
    profile: &'a Profile,
    trace: &'a Trace,
    /// Process and thread names: (pid, tid, `process_name` or `thread_name`, name).
    metadata: Vec<(i32, i32, &'static str, String)>,
    /// Each function's `file:line`.
    locations: Vec<Option<String>>,
    /// Each sampled stack's frame names, innermost first.
    stacks: Vec<Vec<&'a str>>,
}

impl<'a> Events<'a> {
    fn new(profile: &'a Profile, trace: &'a Trace) -> Self {
        let names = Names::new(profile);
        let mut metadata = Vec::new();
        let mut pids = std::collections::HashSet::new();
        for thread in &trace.threads {
            if pids.insert(thread.pid) {
                metadata.push((thread.pid, thread.pid, "process_name", names.process(thread.pid)));
            }
            if let Some(name) = names.thread(thread.pid, thread.tid) {
                metadata.push((thread.pid, thread.tid, "thread_name", name.to_string()));
            }
        }
        let locations = (0..profile.functions.len() as u32).map(|f| timeline::location(profile, f)).collect();
        let stacks = profile.samples.as_ref().map_or_else(Vec::new, |samples| {
            let frame = |f: &u32| samples.frames.get(*f as usize).map_or("?", |frame| frame.name.as_str());
            samples.stacks.iter().map(|stack| stack.frames.iter().rev().map(frame).collect()).collect()
        });
        Events { profile, trace, metadata, locations, stacks }
    }

    fn call(&self, thread: &ThreadTrace, span: &Span) -> Event<'_> {
        Event {
            name: crate::report::function_name(self.profile, span.function),
            cat: "call",
            ph: "X",
            pid: thread.pid,
            tid: thread.tid,
            ts: Some(micros(span.start_ns)),
            dur: Some(micros(span.end_ns - span.start_ns)),
            s: None,
            args: Args { location: self.locations.get(span.function as usize).and_then(Option::as_deref), ..Args::default() },
        }
    }

    fn sample<'s>(&self, thread: &ThreadTrace, time_ns: u64, stack: &'s [&'s str]) -> Event<'s> {
        Event {
            name: stack.first().copied().unwrap_or("[no frames]"),
            cat: "sample",
            ph: "i",
            pid: thread.pid,
            tid: thread.tid,
            ts: Some(micros(time_ns)),
            dur: None,
            s: Some("t"),
            args: Args { stack: Some(stack), ..Args::default() },
        }
    }
}

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let metadata = self.metadata.iter().map(|(pid, tid, kind, name)| Event {
            name: kind,
            cat: "",
            ph: "M",
            pid: *pid,
            tid: *tid,
            ts: None,
            dur: None,
            s: None,
            args: Args { name: Some(name), ..Args::default() },
        });
        let threads = self.trace.threads.iter().flat_map(|thread| {
            let calls = timeline::spans(&thread.calls).into_iter().map(move |span| self.call(thread, &span));
            let samples = thread
                .samples
                .iter()
                .filter_map(move |s| self.stacks.get(s.stack as usize).map(|stack| self.sample(thread, s.time_ns, stack)));
            calls.chain(samples)
        });
        serializer.collect_seq(metadata.chain(threads))
    }
}

/// Microseconds, with the nanoseconds as the fraction.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Bytes `s` takes as a JSON string's contents.
fn json_len(s: &str) -> u64 {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8() as u64,
        })
        .sum()
}

/// Bytes the export takes at most: each call names its function and
/// place, each sample its stack's frames.
fn size(profile: &Profile, trace: &Trace) -> u64 {
    let function_bytes: Vec<u64> =
        profile.functions.iter().map(|f| json_len(&f.name) + f.file.as_deref().map_or(0, json_len) + EVENT_BYTES).collect();
    let stack_bytes: Vec<u64> = profile.samples.as_ref().map_or_else(Vec::new, |samples| {
        let frame_bytes: Vec<u64> = samples.frames.iter().map(|f| json_len(&f.name) + 3).collect();
        let stack = |frames: &[u32]| frames.iter().map(|f| frame_bytes.get(*f as usize).copied().unwrap_or(0)).fold(0, u64::saturating_add);
        // The innermost frame names the event too.
        let innermost = |frames: &[u32]| frames.last().and_then(|f| frame_bytes.get(*f as usize)).copied().unwrap_or(0);
        samples.stacks.iter().map(|s| stack(&s.frames).saturating_add(innermost(&s.frames)) + EVENT_BYTES).collect()
    });
    let mut total = 0u64;
    for thread in &trace.threads {
        let calls = thread.calls.iter().map(|c| function_bytes.get(c.function as usize).copied().unwrap_or(EVENT_BYTES));
        let samples = thread.samples.iter().map(|s| stack_bytes.get(s.stack as usize).copied().unwrap_or(EVENT_BYTES));
        total = calls.chain(samples).fold(total, u64::saturating_add);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn exported(profile: &Profile) -> Value {
        let bytes = render(profile, profile.trace.as_ref().expect("a trace")).expect("rendered");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    fn events<'a>(trace: &'a Value, ph: &str) -> Vec<&'a Value> {
        trace["traceEvents"].as_array().expect("events").iter().filter(|e| e["ph"] == ph).collect()
    }

    /// Microseconds back to nanoseconds.
    fn ns(v: &Value) -> u64 {
        (v.as_f64().expect("a number") * 1000.0).round() as u64
    }

    #[test]
    fn calls_are_complete_events_that_nest_with_nanoseconds_kept() {
        let trace = exported(&timeline::traced_profile());
        assert_eq!(trace["displayTimeUnit"], "ns");
        let calls = events(&trace, "X");
        let mut counts: BTreeMap<(i64, &str), usize> = BTreeMap::new();
        for c in &calls {
            assert_eq!((&c["pid"], &c["cat"]), (&Value::from(100), &Value::from("call")));
            *counts.entry((c["tid"].as_i64().expect("tid"), c["name"].as_str().expect("name"))).or_default() += 1;
        }
        let expected =
            [((100, "leaf"), 3), ((100, "main"), 1), ((100, "work"), 2), ((101, "leaf"), 1), ((101, "odd \"one\""), 1), ((101, "work"), 1)];
        assert_eq!(counts, BTreeMap::from(expected));
        // 1.5 us for 1.234 us: the nanoseconds survive.
        let leaf = calls.iter().find(|c| c["name"] == "leaf").expect("a leaf");
        assert_eq!((ns(&leaf["ts"]), ns(&leaf["dur"])), (1_500, 1_234));
        assert_eq!(leaf["args"]["location"], "prog.c:10");
        assert!(calls.iter().find(|c| c["name"] == "odd \"one\"").expect("odd").get("args").is_none());
        // On each thread any two calls are apart or one holds the other.
        let span = |c: &Value| (ns(&c["ts"]), ns(&c["ts"]) + ns(&c["dur"]));
        for a in &calls {
            for b in calls.iter().filter(|b| b["tid"] == a["tid"]) {
                let ((a0, a1), (b0, b1)) = (span(a), span(b));
                assert!(a1 <= b0 || b1 <= a0 || (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1), "{a} and {b} overlap");
            }
        }
    }

    #[test]
    fn threads_and_processes_are_named_and_samples_are_instants_with_their_stacks() {
        let trace = exported(&timeline::traced_profile());
        let names: Vec<(&str, i64, &str)> = events(&trace, "M")
            .iter()
            .map(|m| (m["name"].as_str().unwrap_or(""), m["tid"].as_i64().unwrap_or(0), m["args"]["name"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(names, vec![("process_name", 100, "prog"), ("thread_name", 100, "prog"), ("thread_name", 101, "worker")]);
        let samples = events(&trace, "i");
        assert_eq!(samples.len(), 4);
        assert!(samples.iter().all(|s| s["s"] == "t" && s["cat"] == "sample"));
        let at = samples.iter().find(|s| ns(&s["ts"]) == 3_500).expect("the sample at 3.5 us");
        assert_eq!(at["tid"], 100);
        assert_eq!(at["name"], "memcpy");
        assert_eq!(at["args"]["stack"], serde_json::json!(["memcpy", "work", "main"]));
    }

    #[test]
    fn a_trace_too_large_for_the_format_is_refused() {
        let mut profile = timeline::traced_profile();
        profile.functions[2].name = "x".repeat(1 << 20);
        let calls = &mut profile.trace.as_mut().expect("a trace").threads[0].calls;
        let leaf = calls[2];
        calls.extend(std::iter::repeat_n(leaf, 3000));
        let err = render(&profile, profile.trace.as_ref().expect("a trace")).expect_err("too large");
        // 3003 calls of a 1 MiB name.
        let mib: u64 =
            err.to_string().strip_prefix("its trace would take ").and_then(|r| r.split(' ').next()?.parse().ok()).expect("a size");
        assert!((3003..3010).contains(&mib), "{err}");
        assert!(err.to_string().contains("more than the 2048 MiB"), "{err}");
        // Escaped names count as written: 6 bytes a control character.
        assert_eq!(json_len("a\u{1}\"é"), 1 + 6 + 2 + 2);
    }
}

//! The trace in speedscope's file format
//! (<https://www.speedscope.app/file-format-schema.json>): the functions as
//! `shared.frames` (name, file, line), and one `evented` profile per traced
//! thread, named `thread NAME (TID)`, whose open (`O`) and close (`C`)
//! events are its calls, in nanoseconds from the start of the recording.
//!
//! speedscope checks that events nest (a callee closes before its caller,
//! times never go back): they are laid out by [`timeline::spans`]. Sampled
//! stacks are not in it (a speedscope profile is evented or sampled, not
//! both); `--format folded` gives speedscope those.

use crate::report::timeline::{self, Names, Span};
use proftap_profile::{Profile, ThreadTrace, Trace};
use serde::{Serialize, Serializer};

/// What speedscope recognizes its format by.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<Evented<'a>>,
    name: String,
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<Frame<'a>>,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Evented<'a> {
    r#type: &'static str,
    name: String,
    unit: &'static str,
    start_value: u64,
    end_value: u64,
    events: Events<'a>,
}

/// A thread's open and close events, made as they are written.
struct Events<'a> {
    thread: &'a ThreadTrace,
}

#[derive(Serialize)]
struct Event {
    r#type: &'static str,
    frame: u32,
    at: u64,
}

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(events(&timeline::spans(&self.thread.calls)))
    }
}

/// Open and close events of `spans` (as [`timeline::spans`] lays them
/// out): each span opens at its start, after the spans it is not inside of
/// closed at their ends, and closes at its end. The frame is the function id.
fn events(spans: &[Span]) -> Vec<Event> {
    let mut events = Vec::with_capacity(2 * spans.len());
    let mut open: Vec<&Span> = Vec::new();
    for span in spans {
        while open.len() > span.level as usize {
            if let Some(done) = open.pop() {
                events.push(Event { r#type: "C", frame: done.function, at: done.end_ns });
            }
        }
        events.push(Event { r#type: "O", frame: span.function, at: span.start_ns });
        open.push(span);
    }
    while let Some(done) = open.pop() {
        events.push(Event { r#type: "C", frame: done.function, at: done.end_ns });
    }
    events
}

/// The trace of `profile` in speedscope's format (JSON).
pub fn render(profile: &Profile, trace: &Trace) -> serde_json::Result<Vec<u8>> {
    let frames = profile
        .functions
        .iter()
        .map(|f| Frame { name: &f.name, file: f.file.as_deref().filter(|f| !f.is_empty()), line: Some(f.line).filter(|&l| l > 0) })
        .collect();
    let names = Names::new(profile);
    let profiles = trace
        .threads
        .iter()
        .map(|thread| {
            let last = thread.calls.iter().map(|c| c.end_ns()).max().unwrap_or(0);
            Evented {
                r#type: "evented",
                name: format!("thread {}", names.thread_title(thread.pid, thread.tid)),
                unit: "nanoseconds",
                start_value: 0,
                end_value: last.max(profile.recording.duration_ns),
                events: Events { thread },
            }
        })
        .collect();
    let pid = trace.threads.first().map_or(profile.target.pid, |t| t.pid);
    let file = File {
        schema: SCHEMA,
        shared: Shared { frames },
        profiles,
        name: names.process(pid),
        active_profile_index: 0,
        exporter: format!("proftap {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_vec(&file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::TracedCall;
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn exported(profile: &Profile) -> Value {
        let bytes = render(profile, profile.trace.as_ref().expect("a trace")).expect("rendered");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    /// Replays a profile's events as speedscope does, failing where it
    /// would; returns the calls per frame.
    fn replay(profile: &Value) -> BTreeMap<u64, usize> {
        let (start, end) = (profile["startValue"].as_u64().expect("start"), profile["endValue"].as_u64().expect("end"));
        let mut open: Vec<u64> = Vec::new();
        let mut last = start;
        let mut calls = BTreeMap::new();
        for event in profile["events"].as_array().expect("events") {
            let (frame, at) = (event["frame"].as_u64().expect("frame"), event["at"].as_u64().expect("at"));
            assert!(at >= last && at <= end, "{event} out of order in {profile}");
            last = at;
            match event["type"].as_str() {
                Some("O") => {
                    open.push(frame);
                    *calls.entry(frame).or_default() += 1;
                }
                Some("C") => assert_eq!(open.pop(), Some(frame), "{event} closes another frame than the innermost open"),
                _ => panic!("{event}: neither O nor C"),
            }
        }
        assert!(open.is_empty(), "frames {open:?} never close");
        calls
    }

    #[test]
    fn each_thread_is_an_evented_profile_whose_calls_nest() {
        let file = exported(&timeline::traced_profile());
        assert_eq!(file["$schema"], SCHEMA);
        let frames = file["shared"]["frames"].as_array().expect("frames");
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[2], serde_json::json!({"name": "leaf", "file": "prog.c", "line": 10}));
        assert_eq!(frames[3], serde_json::json!({"name": "odd \"one\""}));
        let profiles = file["profiles"].as_array().expect("profiles");
        let titles: Vec<&str> = profiles.iter().map(|p| p["name"].as_str().unwrap_or("")).collect();
        assert_eq!(titles, vec!["thread prog (100)", "thread worker (101)"]);
        for p in profiles {
            assert_eq!(
                (&p["type"], &p["unit"], &p["startValue"], &p["endValue"]),
                (&"evented".into(), &"nanoseconds".into(), &0.into(), &12_000.into())
            );
        }
        // main 1, work 2, leaf 3 (one of no time); work 1, leaf 1, odd 1.
        assert_eq!(replay(&profiles[0]), BTreeMap::from([(0, 1), (1, 2), (2, 3)]));
        assert_eq!(replay(&profiles[1]), BTreeMap::from([(1, 1), (2, 1), (3, 1)]));
        let events = profiles[0]["events"].as_array().expect("events");
        let at = |i: usize| {
            (events[i]["type"].as_str().unwrap_or(""), events[i]["frame"].as_u64().unwrap_or(9), events[i]["at"].as_u64().unwrap_or(0))
        };
        // main and work open together, the call of no time opens and closes at once.
        assert_eq!((at(0), at(1), at(2), at(3)), (("O", 0, 1_000), ("O", 1, 1_000), ("O", 2, 1_500), ("C", 2, 2_734)));
        assert_eq!((at(4), at(5)), (("O", 2, 3_000), ("C", 2, 3_000)));
    }

    #[test]
    fn calls_that_do_not_nest_still_make_events_speedscope_loads() {
        let mut profile = timeline::traced_profile();
        let calls = &mut profile.trace.as_mut().expect("a trace").threads[0].calls;
        // A callee outliving its caller, a call deeper than any open, one out of order.
        calls.push(TracedCall { function: 2, start_ns: 9_000, duration_ns: 5_000, depth: 2 });
        calls.push(TracedCall { function: 2, start_ns: 11_000, duration_ns: 10, depth: 9 });
        calls.push(TracedCall { function: 0, start_ns: 500, duration_ns: 600, depth: 0 });
        let file = exported(&profile);
        assert_eq!(replay(&file["profiles"][0]), BTreeMap::from([(0, 2), (1, 2), (2, 5)]));
    }
}

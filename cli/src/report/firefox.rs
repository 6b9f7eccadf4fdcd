//! The trace in the Firefox Profiler's processed format, written with the
//! `fxprof-processed-profile` crate (samply's), for profiler.firefox.com
//! ("Load a profile from file").
//!
//! Each traced thread is a thread of its process, named as the profile
//! names it. Its sampled stacks are samples at their times, and each of its
//! calls an interval marker named after the function (the marker chart
//! shows one row per function), with its declaration's `file:line` and its
//! depth as fields. Times count from the start of the recording, which is
//! the profile's start time.
//!
//! Where the crate falls short of the profile:
//! - sampled frames carry no address, while the crate ties a function to
//!   its module only through an address in a library: each module is a
//!   library whose symbol table gives each of its frames a made-up address
//!   (its index), so that the profiler shows every function with its module
//!   (and marks the profile symbolicated, so it looks nothing up);
//! - the crate writes no inlining: a frame inlined into its caller is a
//!   frame of its own, as if it had been called.

use crate::report::timeline::{self, Names};
use anyhow::{Result, bail};
use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CpuDelta, Frame, FrameFlags, FrameInfo, LibraryHandle, LibraryInfo, MarkerFieldFlags, MarkerFieldFormat,
    MarkerTiming, ProcessHandle, Profile as FxProfile, ReferenceTimestamp, SamplingInterval, StackHandle, StaticSchemaMarker,
    StaticSchemaMarkerField, StringHandle, Symbol, SymbolTable, ThreadHandle, Timestamp, debugid::DebugId,
};
use proftap_profile::{Profile, SampleProfile, ThreadTrace, Trace};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// A traced call, as a marker.
struct Call {
    name: StringHandle,
    location: StringHandle,
    category: CategoryHandle,
    depth: u32,
}

impl StaticSchemaMarker for Call {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "proftap-call";
    const DESCRIPTION: Option<&'static str> = Some("A call of an instrumented function, from its entry to its return.");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.name} ({marker.data.location})");
    const CHART_LABEL: Option<&'static str> = Some("{marker.name}");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[
        StaticSchemaMarkerField {
            key: "location",
            label: "Declared at",
            format: MarkerFieldFormat::String,
            flags: MarkerFieldFlags::SEARCHABLE,
        },
        StaticSchemaMarkerField { key: "depth", label: "Depth", format: MarkerFieldFormat::Integer, flags: MarkerFieldFlags::empty() },
    ];

    fn name(&self, _profile: &mut FxProfile) -> StringHandle {
        self.name
    }

    fn category(&self, _profile: &mut FxProfile) -> CategoryHandle {
        self.category
    }

    fn string_field_value(&self, _field_index: u32) -> StringHandle {
        // The only string field.
        self.location
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        // The only number field.
        f64::from(self.depth)
    }
}

/// The most frames a Firefox Profiler export may look up to build its
/// threads' stacks: each stack sampled in a thread is built from its frames
/// once for that thread.
pub const MAX_FRAMES: u64 = 1 << 26;

/// The trace of `profile` in the Firefox Profiler's processed format
/// (JSON), refused when its threads' stacks hold more than [`MAX_FRAMES`].
pub fn render(profile: &Profile, trace: &Trace) -> Result<Vec<u8>> {
    let frames = stack_frames(profile, trace);
    if frames > MAX_FRAMES {
        bail!(
            "its threads' sampled stacks hold {frames} frames in all (a stack once for each thread sampled in it), \
             more than the {MAX_FRAMES} a Firefox Profiler export may; a lower --sample frequency takes fewer samples"
        );
    }
    let names = Names::new(profile);
    let pid = trace.threads.first().map_or(profile.target.pid, |t| t.pid);
    let start = ReferenceTimestamp::from_millis_since_unix_epoch(profile.recording.started_unix_ns as f64 / 1e6);
    let interval = match profile.samples.as_ref().map_or(0, |s| s.frequency_hz) {
        0 => SamplingInterval::from_millis(1),
        hz => SamplingInterval::from_nanos((1_000_000_000 / hz).max(1)),
    };
    let mut fx = FxProfile::new(&names.process(pid), start, interval);
    fx.set_symbolicated(true);
    let frames = profile.samples.as_ref().map(|samples| SampledFrames::new(&mut fx, samples));
    let calls = fx.add_category("Call", CategoryColor::Blue);
    let mut processes: HashMap<i32, ProcessHandle> = HashMap::new();
    for thread in &trace.threads {
        let process = *processes
            .entry(thread.pid)
            .or_insert_with(|| fx.add_process(&names.process(thread.pid), thread.pid as u32, Timestamp::from_nanos_since_reference(0)));
        let handle = fx.add_thread(process, thread.tid as u32, Timestamp::from_nanos_since_reference(0), thread.tid == thread.pid);
        fx.set_thread_name(handle, names.thread(thread.pid, thread.tid).unwrap_or(&format!("thread {}", thread.tid)));
        if let (Some(frames), Some(samples)) = (&frames, &profile.samples) {
            add_samples(&mut fx, handle, thread, samples, frames);
        }
        add_calls(&mut fx, handle, thread, profile, calls);
    }
    Ok(serde_json::to_vec(&fx)?)
}

/// Frames of the stacks each thread was sampled in, each stack counted once a thread.
fn stack_frames(profile: &Profile, trace: &Trace) -> u64 {
    let Some(samples) = &profile.samples else { return 0 };
    let mut total = 0u64;
    for thread in &trace.threads {
        let stacks: HashSet<u32> = thread.samples.iter().map(|s| s.stack).collect();
        let frames = stacks.into_iter().map(|s| samples.stacks.get(s as usize).map_or(0, |stack| stack.frames.len() as u64));
        total = frames.fold(total, u64::saturating_add);
    }
    total
}

/// Each traced call as an interval marker.
fn add_calls(fx: &mut FxProfile, handle: ThreadHandle, thread: &ThreadTrace, profile: &Profile, category: CategoryHandle) {
    // Interned once per function.
    let mut strings: HashMap<u32, (StringHandle, StringHandle)> = HashMap::new();
    for call in &thread.calls {
        let (name, location) = *strings.entry(call.function).or_insert_with(|| {
            let name = fx.intern_string(crate::report::function_name(profile, call.function));
            (name, fx.intern_string(&timeline::location(profile, call.function).unwrap_or_default()))
        });
        let timing = MarkerTiming::Interval(
            Timestamp::from_nanos_since_reference(call.start_ns),
            Timestamp::from_nanos_since_reference(call.end_ns()),
        );
        fx.add_marker(handle, timing, Call { name, location, category, depth: call.depth });
    }
}

/// The thread's sampled stacks as samples, in time order.
fn add_samples(fx: &mut FxProfile, handle: ThreadHandle, thread: &ThreadTrace, samples: &SampleProfile, frames: &SampledFrames) {
    let mut order: Vec<_> = thread.samples.iter().collect();
    order.sort_by_key(|s| s.time_ns);
    // Interned once per stack.
    let mut stacks: HashMap<u32, Option<StackHandle>> = HashMap::new();
    for sample in order {
        let stack = *stacks.entry(sample.stack).or_insert_with(|| {
            let stack = samples.stacks.get(sample.stack as usize).map_or(&[][..], |s| s.frames.as_slice());
            fx.intern_stack_frames(handle, stack.iter().filter_map(|&f| frames.info(f)))
        });
        fx.add_sample(handle, Timestamp::from_nanos_since_reference(sample.time_ns), stack, CpuDelta::ZERO, 1);
    }
}

/// Each sampled frame as a function of its module: its library and its
/// made-up address there.
struct SampledFrames {
    places: Vec<(LibraryHandle, u32)>,
}

impl SampledFrames {
    fn new(fx: &mut FxProfile, samples: &SampleProfile) -> Self {
        // The modules in the order their first frame comes, each with its
        // frames' names by made-up address.
        let mut modules: Vec<(&str, Vec<Symbol>)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut positions = Vec::with_capacity(samples.frames.len());
        for frame in &samples.frames {
            let module = *index.entry(frame.module.as_str()).or_insert_with(|| {
                modules.push((frame.module.as_str(), Vec::new()));
                modules.len() - 1
            });
            let symbols = &mut modules[module].1;
            let address = symbols.len() as u32;
            symbols.push(Symbol { address, size: Some(1), name: frame.name.clone() });
            positions.push((module, address));
        }
        let libraries: Vec<LibraryHandle> = modules.into_iter().map(|(module, symbols)| fx.add_lib(library(module, symbols))).collect();
        let places = positions.into_iter().map(|(module, address)| (libraries[module], address)).collect();
        SampledFrames { places }
    }

    fn info(&self, frame: u32) -> Option<FrameInfo> {
        let &(library, address) = self.places.get(frame as usize)?;
        Some(FrameInfo {
            frame: Frame::RelativeAddressFromInstructionPointer(library, address),
            category_pair: CategoryHandle::OTHER.into(),
            flags: FrameFlags::empty(),
        })
    }
}

fn library(module: &str, symbols: Vec<Symbol>) -> LibraryInfo {
    let name = Path::new(module).file_name().map_or_else(|| module.to_string(), |n| n.to_string_lossy().into_owned());
    LibraryInfo {
        debug_name: name.clone(),
        name,
        path: module.to_string(),
        debug_path: module.to_string(),
        debug_id: DebugId::nil(),
        code_id: None,
        arch: None,
        symbol_table: Some(Arc::new(SymbolTable::new(symbols))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn exported() -> Value {
        let profile = timeline::traced_profile();
        let bytes = render(&profile, profile.trace.as_ref().expect("a trace")).expect("rendered");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    fn string(thread: &Value, index: &Value) -> String {
        thread["stringArray"][index.as_u64().expect("a string index") as usize].as_str().expect("a string").to_string()
    }

    /// The functions of sample `i`'s stack, innermost first, with their libraries.
    fn sampled_stack(profile: &Value, thread: &Value, i: usize) -> Vec<(String, String)> {
        let mut stack = thread["samples"]["stack"][i].as_u64();
        let mut frames = Vec::new();
        while let Some(s) = stack {
            let frame = thread["stackTable"]["frame"][s as usize].as_u64().expect("a frame") as usize;
            let func = thread["frameTable"]["func"][frame].as_u64().expect("a func") as usize;
            let resource = thread["funcTable"]["resource"][func].as_u64().expect("a resource") as usize;
            let lib = thread["resourceTable"]["lib"][resource].as_u64().expect("a library") as usize;
            let library = profile["libs"][lib]["name"].as_str().expect("a library name").to_string();
            frames.push((string(thread, &thread["funcTable"]["name"][func]), library));
            // Each stack's prefix comes before it: the walk ends.
            let prefix = thread["stackTable"]["prefix"][s as usize].as_u64();
            assert!(prefix.is_none_or(|p| p < s));
            stack = prefix;
        }
        frames
    }

    #[test]
    fn threads_have_their_calls_as_markers_and_their_samples() {
        let p = exported();
        assert_eq!(p["meta"]["symbolicated"], true);
        assert_eq!(p["meta"]["interval"], 1.0);
        assert_eq!(p["meta"]["startTime"], 1_700_000_000_000.0);
        let threads = p["threads"].as_array().expect("threads");
        let who: Vec<(&str, &str, &str, bool)> = threads
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or(""),
                    t["tid"].as_str().unwrap_or(""),
                    t["processName"].as_str().unwrap_or(""),
                    t["isMainThread"] == true,
                )
            })
            .collect();
        assert_eq!(who, vec![("prog", "100", "prog", true), ("worker", "101", "prog", false)]);

        // Markers: one interval per call, by function, in milliseconds.
        let markers = &threads[0]["markers"];
        let mut calls: BTreeMap<String, usize> = BTreeMap::new();
        for name in markers["name"].as_array().expect("names") {
            *calls.entry(string(&threads[0], name)).or_default() += 1;
        }
        assert_eq!(calls, BTreeMap::from([("leaf".into(), 3), ("main".into(), 1), ("work".into(), 2)]));
        assert!(markers["phase"].as_array().expect("phases").iter().all(|p| p == 1), "all intervals");
        assert_eq!((&markers["startTime"][2], &markers["endTime"][2]), (&0.0015.into(), &0.002734.into()));
        assert_eq!(string(&threads[0], &markers["data"][2]["location"]), "prog.c:10");
        assert_eq!(markers["data"][2]["depth"], 2.0);
        let schema = &p["meta"]["markerSchema"][0];
        assert_eq!(schema["name"], markers["data"][0]["type"]);

        // Samples: at their times, with their stacks and modules.
        let samples = &threads[0]["samples"];
        assert_eq!(samples["length"], 3);
        let mut time = 0.0;
        let times: Vec<f64> = samples["timeDeltas"]
            .as_array()
            .expect("deltas")
            .iter()
            .map(|d| {
                time += d.as_f64().expect("a delta");
                (time * 1e6).round()
            })
            .collect();
        assert_eq!(times, vec![1600.0, 3500.0, 4500.0]);
        let named = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(sampled_stack(&p, &threads[0], 1), named(&[("memcpy", "libc.so.6"), ("work", "prog"), ("main", "prog")]));
        // An inlined frame is a frame of its own.
        assert_eq!(sampled_stack(&p, &threads[1], 0), named(&[("mix", "prog"), ("leaf", "prog"), ("work", "prog")]));
    }

    #[test]
    fn stacks_past_the_frame_limit_are_refused() {
        // A stack 70,000 frames deep sampled in 1,000 threads: 70 million frames to look up.
        let mut profile = timeline::traced_profile();
        let samples = profile.samples.as_mut().expect("samples");
        samples.stacks[0].frames = vec![0; 70_000];
        let trace = profile.trace.as_mut().expect("a trace");
        let thread = trace.threads[0].clone();
        trace.threads = (0..1000).map(|tid| ThreadTrace { tid, ..thread.clone() }).collect();
        let err = render(&profile, profile.trace.as_ref().expect("a trace")).expect_err("too many frames");
        assert!(err.to_string().starts_with("its threads' sampled stacks hold 70003000 frames in all"), "{err}");
    }

    #[test]
    fn samples_out_of_order_are_sorted_and_a_profile_without_samples_has_none() {
        let mut profile = timeline::traced_profile();
        let trace = profile.trace.as_mut().expect("a trace");
        trace.threads[0].samples.reverse();
        let bytes = render(&profile, profile.trace.as_ref().expect("a trace")).expect("rendered");
        let p: Value = serde_json::from_slice(&bytes).expect("JSON");
        let deltas = p["threads"][0]["samples"]["timeDeltas"].as_array().expect("deltas").clone();
        assert!(deltas.iter().all(|d| d.as_f64().is_some_and(|d| d >= 0.0)), "{deltas:?}");

        profile.samples = None;
        for thread in &mut profile.trace.as_mut().expect("a trace").threads {
            thread.samples.clear();
        }
        let bytes = render(&profile, profile.trace.as_ref().expect("a trace")).expect("rendered");
        let p: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(p["threads"][0]["samples"]["length"], 0);
        assert_eq!(p["threads"][0]["markers"]["length"], 6);
    }
}

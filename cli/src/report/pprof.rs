//! The profile as pprof's `profile.proto` (gzip-compressed), for
//! `go tool pprof` and everything that reads it.
//!
//! Sample types: `calls/count`, one per metric (`wall/nanoseconds`,
//! `cpu/nanoseconds`, counters as `count`), and `samples/count`. Each call
//! path of each thread's exact call tree is a sample carrying its calls and
//! its exclusive costs, so pprof's flat column is a function's exclusive
//! cost and its cumulative column the inclusive one; each sampled stack is a
//! sample carrying its count in `samples`. Samples are labelled with their
//! thread.

// The message fields mirror profile.proto, where each is documented.
#![allow(missing_docs)]

use anyhow::{Result, bail};
use proftap_profile::{Profile, Unit};
use prost::Message;
use std::collections::HashMap;

/// `perftools.profiles.Profile`, the fields proftap writes.
#[derive(Clone, PartialEq, Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: a type and a unit, as string table indexes.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: a stack (leaf first) and one value per sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// `Mapping`: a module.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `Location`: a place in the code; several lines when functions were inlined
/// there (the caller last).
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Builds the tables: strings, functions, mappings and locations, deduplicated.
#[derive(Default)]
struct Builder {
    out: PprofProfile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    mappings: HashMap<String, u64>,
    locations: HashMap<Vec<(u64, i64)>, u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, module: &str, build_id: Option<&str>) -> u64 {
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.out.mapping.len() as u64 + 1;
        let filename = self.string(module);
        let build_id = build_id.map_or(0, |b| self.string(b));
        // Every location names its functions and lines: nothing to symbolize.
        self.out.mapping.push(Mapping {
            id,
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Mapping::default()
        });
        self.mappings.insert(module.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, module: &str, file: Option<&str>, line: u32) -> u64 {
        let key = (name.to_string(), module.to_string());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.out.function.len() as u64 + 1;
        let name = self.string(name);
        let filename = self.string(file.unwrap_or(""));
        self.out.function.push(Function { id, name, system_name: name, filename, start_line: i64::from(line) });
        self.functions.insert(key, id);
        id
    }

    /// A location of `lines` (function, line), innermost first.
    fn location(&mut self, mapping_id: u64, address: u64, lines: Vec<(u64, i64)>) -> u64 {
        if let Some(&id) = self.locations.get(&lines) {
            return id;
        }
        let id = self.out.location.len() as u64 + 1;
        let line = lines.iter().map(|&(function_id, line)| Line { function_id, line }).collect();
        self.out.location.push(Location { id, mapping_id, address, line });
        self.locations.insert(lines, id);
        id
    }
}

/// What the unit of a metric key is, as pprof names them.
fn value_type(key: &str) -> (String, &'static str) {
    match Unit::of(key) {
        Unit::Nanoseconds => (key.strip_suffix("_ns").unwrap_or(key).to_string(), "nanoseconds"),
        Unit::Count => (key.to_string(), "count"),
    }
}

/// The most frames all call paths of a pprof export may hold in all: each
/// call tree node is a sample listing every frame of its path, so a deep
/// tree costs its depth at every node (8 bytes a frame in memory).
pub const MAX_FRAMES: u64 = 1 << 26;

/// A count as pprof's signed values hold it.
fn value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The profile in pprof's format, not yet compressed; refused when its call
/// paths would hold more than [`MAX_FRAMES`] frames.
pub fn pprof(profile: &Profile) -> Result<PprofProfile> {
    let frames = profile.threads.iter().flat_map(|t| t.tree.depths()).fold(0u64, |sum, d| sum.saturating_add(u64::from(d)));
    if frames > MAX_FRAMES {
        bail!(
            "its call paths hold {frames} frames in all, more than the {MAX_FRAMES} a pprof export may (each path lists all its callers); proftap report --tree shows a tree this deep"
        );
    }
    let mut b = Builder::default();
    b.string("");
    let metrics = profile.metrics.len();
    // calls, one per metric, samples.
    let mut types = vec![("calls".to_string(), "count")];
    types.extend(profile.metrics.iter().map(|k| value_type(k)));
    types.push(("samples".to_string(), "count"));
    for (name, unit) in &types {
        let value = ValueType { r#type: b.string(name), unit: b.string(unit) };
        b.out.sample_type.push(value);
    }
    let width = types.len();
    let thread_key = b.string("thread");

    // One location per instrumented function, at its entry.
    let build_id = profile.target.build_id.as_deref();
    let function_locations: Vec<u64> = profile
        .functions
        .iter()
        .map(|f| {
            let mapping = b.mapping(&f.module, if f.module == profile.target.exe { build_id } else { None });
            let function = b.function(&f.name, &f.module, f.file.as_deref(), f.line);
            b.location(mapping, f.address, vec![(function, i64::from(f.line))])
        })
        .collect();

    for thread in &profile.threads {
        let label = Label { key: thread_key, str: b.string(&format!("{} ({})", thread.name, thread.tid)), num: 0 };
        let tree = &thread.tree;
        for (i, node) in tree.nodes.iter().enumerate().skip(1) {
            let stack =
                tree.path(i as u32).filter_map(|n| function_locations.get(tree.nodes[n as usize].function as usize).copied()).collect();
            let mut values = vec![0i64; width];
            values[0] = value(node.calls);
            for m in 0..metrics {
                values[1 + m] = value(node.exclusive.get(m).copied().unwrap_or(0));
            }
            b.out.sample.push(Sample { location_id: stack, value: values, label: vec![label.clone()] });
        }
    }

    if let Some(samples) = &profile.samples {
        // Each non-inlined frame with the frames inlined into it is one
        // location, the innermost inlined function first.
        let frame_functions: Vec<u64> = samples.frames.iter().map(|f| b.function(&f.name, &f.module, None, 0)).collect();
        for stack in &samples.stacks {
            let mut locations = Vec::new();
            let mut group: Vec<(u64, i64)> = Vec::new();
            let mut module = "";
            for &f in &stack.frames {
                let Some(frame) = samples.frames.get(f as usize) else { continue };
                if !frame.inlined && !group.is_empty() {
                    group.reverse();
                    let mapping = b.mapping(module, None);
                    locations.push(b.location(mapping, 0, std::mem::take(&mut group)));
                }
                if !frame.inlined {
                    module = &frame.module;
                }
                group.push((frame_functions[f as usize], 0));
            }
            if !group.is_empty() {
                group.reverse();
                let mapping = b.mapping(module, None);
                locations.push(b.location(mapping, 0, group));
            }
            locations.reverse();
            let mut values = vec![0i64; width];
            values[width - 1] = value(stack.count);
            b.out.sample.push(Sample { location_id: locations, value: values, label: Vec::new() });
        }
        b.out.period_type = Some(ValueType { r#type: b.string(&samples.event), unit: b.string("count") });
        b.out.period = 1;
    }

    b.out.time_nanos = value(profile.recording.started_unix_ns);
    b.out.duration_nanos = value(profile.recording.duration_ns);
    b.out.default_sample_type = b.string(profile.metrics.first().map_or("calls", |k| k.strip_suffix("_ns").unwrap_or(k)));
    let comments: Vec<i64> = profile.notes.iter().map(|n| b.string(&crate::wording::note(n))).collect();
    b.out.comment = comments;
    Ok(b.out)
}

/// The encoded bytes (before compression).
pub fn encode(profile: &Profile) -> Result<Vec<u8>> {
    Ok(pprof(profile)?.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{CallTree, FunctionInfo, FunctionStats, SampleProfile, SampledFrame, SampledStack, ThreadProfile, TreeNode};

    #[test]
    fn call_paths_and_sampled_stacks_become_samples() {
        let node = |function: u32, parent: u32, calls: u64, excl: u64| TreeNode {
            function,
            parent,
            calls,
            inclusive: vec![excl, excl],
            exclusive: vec![excl, excl],
            estimated: false,
        };
        let mut tree = CallTree::new(2);
        tree.nodes.push(node(0, 0, 1, 100)); // main
        tree.nodes.push(node(1, 1, 3, 30)); // main > f
        let profile = Profile {
            metrics: vec!["wall_ns".into(), "page_faults".into()],
            functions: vec![
                FunctionInfo { name: "main".into(), module: "/bin/p".into(), ..FunctionInfo::default() },
                FunctionInfo { name: "f".into(), module: "/bin/p".into(), address: 0x1040, ..FunctionInfo::default() },
            ],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: "p".into(), functions: vec![FunctionStats::new(0, 2)], tree }],
            samples: Some(SampleProfile {
                event: "cpu-clock".into(),
                frequency_hz: 1000,
                total: 5,
                frames: vec![
                    SampledFrame { name: "main".into(), module: "/bin/p".into(), inlined: false },
                    SampledFrame { name: "g".into(), module: "/bin/p".into(), inlined: false },
                    SampledFrame { name: "mix".into(), module: "/bin/p".into(), inlined: true },
                ],
                stacks: vec![SampledStack { frames: vec![0, 1, 2], count: 5 }],
                lines: Vec::new(),
                throttled: Default::default(),
                in_counting_stubs: 0,
                on_every_cpu: false,
            }),
            ..Profile::default()
        };
        let p = pprof(&profile).expect("small enough");
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, vec![("calls", "count"), ("wall", "nanoseconds"), ("page_faults", "count"), ("samples", "count")]);
        assert_eq!(s(p.default_sample_type), "wall");
        // main > f: leaf first, 3 calls, 30 ns.
        let name_of = |location: u64| -> Vec<&str> {
            let l = &p.location[location as usize - 1];
            l.line.iter().map(|line| s(p.function[line.function_id as usize - 1].name)).collect()
        };
        let f = p.sample.iter().find(|x| x.value[0] == 3).expect("f's path");
        assert_eq!(f.location_id.iter().map(|&l| name_of(l)).collect::<Vec<_>>(), vec![vec!["f"], vec!["main"]]);
        assert_eq!(f.value, vec![3, 30, 30, 0]);
        // The sampled stack: g with mix inlined into it is one location, mix first.
        let sampled = p.sample.iter().find(|x| x.value[3] == 5).expect("sampled stack");
        assert_eq!(sampled.location_id.iter().map(|&l| name_of(l)).collect::<Vec<_>>(), vec![vec!["mix", "g"], vec!["main"]]);
        // It round-trips through prost.
        assert_eq!(PprofProfile::decode(encode(&profile).expect("small enough").as_slice()).expect("decode"), p);
    }

    #[test]
    fn call_paths_past_the_frame_limit_are_refused() {
        // A chain 12,000 calls deep: its paths hold 72 million frames.
        let mut tree = CallTree::new(1);
        for parent in 0..12_000 {
            tree.nodes.push(TreeNode { function: 0, parent, calls: 1, inclusive: vec![1], exclusive: vec![1], estimated: false });
        }
        let profile = Profile {
            metrics: vec!["wall_ns".into()],
            functions: vec![FunctionInfo { name: "down".into(), ..FunctionInfo::default() }],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: "p".into(), functions: Vec::new(), tree }],
            ..Profile::default()
        };
        let err = pprof(&profile).expect_err("too many frames");
        assert!(err.to_string().starts_with("its call paths hold 72006000 frames in all"), "{err}");
    }
}

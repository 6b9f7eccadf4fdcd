//! `--trace`: every call one by one, checked against the profile's own
//! counts (each thread, each function, both engines), nested as the calls
//! were, within its size limit with what it cut counted, and the slowest
//! calls that `report --slowest` lists.
#![allow(clippy::unwrap_used)]

use proftap_profile::{Profile, TRACED_CALL_BYTES, Trace};
use proftap_tests::*;
use std::collections::HashMap;
use std::path::Path;

/// `proftap run -o FILE ARGS -- CMD`, read back.
fn traced_run(dir: &Path, args: &[&str], command: &[&str]) -> Profile {
    let file = dir.join("p.profile");
    run_ok(proftap().arg("run").arg("-o").arg(&file).arg("--trace").args(args).arg("--").args(command));
    proftap_profile::read_profile(&file).unwrap()
}

/// Calls by (tid, function name), from the profile's per-thread numbers.
fn counted(profile: &Profile) -> HashMap<(i32, String), u64> {
    let name = |f: u32| profile.functions[f as usize].name.clone();
    let per_thread = profile.threads.iter().flat_map(|t| t.functions.iter().map(move |f| ((t.tid, f.function), f.calls)));
    per_thread.filter(|(_, calls)| *calls > 0).map(|((tid, f), calls)| ((tid, name(f)), calls)).collect()
}

/// Calls by (tid, function name), from the trace.
fn traced(profile: &Profile, trace: &Trace) -> HashMap<(i32, String), u64> {
    let mut calls = HashMap::new();
    for thread in &trace.threads {
        for call in &thread.calls {
            *calls.entry((thread.tid, profile.functions[call.function as usize].name.clone())).or_default() += 1;
        }
    }
    calls
}

/// Each thread's calls by start, each inside the call one level up.
fn assert_nested(trace: &Trace) {
    for thread in &trace.threads {
        let mut open: Vec<(u64, u32)> = Vec::new();
        for call in &thread.calls {
            while open.last().is_some_and(|&(end, depth)| depth >= call.depth || end < call.end_ns()) {
                open.pop();
            }
            assert_eq!(
                open.len() as u32,
                call.depth,
                "thread {}: a call at depth {} is not inside a caller: {call:?}",
                thread.tid,
                call.depth
            );
            open.push((call.end_ns(), call.depth));
        }
        assert!(thread.calls.windows(2).all(|w| w[0].start_ns <= w[1].start_ns), "thread {}: calls by start", thread.tid);
    }
}

fn every_call_is_traced(engine: &str) {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let calls = Build::c("calls.c", "-O1").build();
    let threads = Build::c("threads.c", "-O1").build();
    let runs = [
        (vec!["-f", "leaf", "-f", "left", "-f", "right", "-f", "fib", "-f", "run"], vec![calls.to_str().unwrap(), "300", "10"]),
        (vec!["-f", "work"], vec![threads.to_str().unwrap(), "3", "200"]),
    ];
    for (functions, command) in runs {
        let args: Vec<&str> = ["--engine", engine].into_iter().chain(functions).collect();
        let profile = traced_run(dir.path(), &args, &command);
        let trace = profile.trace.as_ref().expect("a trace");
        assert_eq!(trace.cut, 0, "{command:?}");
        let counted = counted(&profile);
        assert!(!counted.is_empty());
        assert_eq!(
            traced(&profile, trace),
            counted,
            "{engine}: {command:?}: the trace has every call the profile counts, thread by thread"
        );
        assert_nested(trace);
        let duration = profile.recording.duration_ns;
        for thread in &trace.threads {
            assert!(thread.calls.iter().all(|c| c.end_ns() <= duration + 1_000_000), "calls within the recording ({duration} ns)");
        }
    }
}

#[test]
fn every_call_is_traced_by_the_in_process_engine() {
    every_call_is_traced("inject");
}

#[test]
fn every_call_is_traced_by_uprobes() {
    every_call_is_traced("uprobe");
}

#[test]
fn a_trace_stays_within_its_size_and_counts_what_it_cut() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    // About 1.2 million calls (300,000 left, 150,000 right, 600,000 leaf, fib(20)).
    let calls = Build::c("calls.c", "-O1").build();
    let profile = traced_run(
        dir.path(),
        &["--trace-size", "1M", "-f", "leaf", "-f", "left", "-f", "right", "-f", "fib"],
        &[calls.to_str().unwrap(), "300000", "20"],
    );
    let trace = profile.trace.as_ref().unwrap();
    let kept: u64 = trace.threads.iter().map(|t| t.calls.len() as u64).sum();
    let all: u64 = counted(&profile).values().sum();
    assert!(all > 1_000_000, "{all} calls");
    assert_eq!(trace.limit_bytes, 1 << 20);
    assert_eq!(kept, (1 << 20) / TRACED_CALL_BYTES, "the trace keeps what its size holds");
    assert_eq!(kept + trace.cut, all, "and counts the rest");
    let report = run_ok(proftap().args(["report", "--no-pager"]).arg(dir.path().join("p.profile")));
    assert!(
        report.contains(&format!("{} calls not kept", proftap_cli::report::text::group_digits(trace.cut))),
        "the report says what was cut:\n{report}"
    );
}

#[test]
fn the_slowest_calls_are_listed_slowest_first_with_their_thread_and_start() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let threads = Build::c("threads.c", "-O1").build();
    let profile = traced_run(dir.path(), &["-f", "work"], &[threads.to_str().unwrap(), "3", "300"]);
    let trace = profile.trace.as_ref().unwrap();
    let mut all: Vec<(u64, i32, u64)> =
        trace.threads.iter().flat_map(|t| t.calls.iter().map(move |c| (c.duration_ns, t.tid, c.start_ns))).collect();
    // Slowest first; among equals, the earlier.
    all.sort_by_key(|&(duration, tid, start)| (std::cmp::Reverse(duration), start, tid));
    let out =
        run_ok(proftap().args(["report", "--no-pager", "--format", "json", "--slowest", "5", "work"]).arg(dir.path().join("p.profile")));
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let listed: Vec<(u64, i32, u64)> = listed["slowest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["duration_ns"].as_u64().unwrap(), c["tid"].as_i64().unwrap() as i32, c["start_ns"].as_u64().unwrap()))
        .collect();
    assert_eq!(listed, all[..5], "the five slowest of {} calls", all.len());
    let max = profile.threads.iter().flat_map(|t| &t.functions).map(|f| f.inclusive[0].max).max().unwrap();
    assert_eq!(listed[0].0, max, "the slowest call is the profile's largest");
    let text = run_ok(proftap().args(["report", "--no-pager", "--slowest", "5", "work"]).arg(dir.path().join("p.profile")));
    assert!(text.contains("slowest calls of work"), "{text}");
    let none = run(proftap().args(["report", "--slowest", "0", "work"]).arg(dir.path().join("p.profile")));
    assert_clean_failure(&none, "is not a count of one or more");
    let untraced = dir.path().join("untraced.profile");
    run_ok(proftap().arg("run").arg("-o").arg(&untraced).args(["-f", "work", "--", threads.to_str().unwrap(), "1", "10"]));
    let out = run(proftap().args(["report", "--slowest", "5", "work"]).arg(&untraced));
    assert_clean_failure(&out, "record it with --trace");
}

#[test]
fn an_attached_process_is_traced_from_the_attach_to_the_detach() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O1").build());
    assert_eq!(waiter.tick(5), 5);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let pid = waiter.pid.to_string();
    let profiler = attach_live(&["-o", file.to_str().unwrap(), "--trace", "-f", "tick", &pid]);
    assert_eq!(waiter.tick(20_000), 20_005);
    run_ok(std::process::Command::new("kill").args(["-INT", &profiler.id().to_string()]));
    assert!(profiler.wait_with_output().unwrap().status.success());
    assert_eq!(waiter.tick(3), 20_008, "the program runs on, detached");
    let profile = proftap_profile::read_profile(&file).unwrap();
    let trace = profile.trace.as_ref().unwrap();
    let tick = profile.functions.iter().position(|f| f.name == "tick").unwrap() as u32;
    let traced: usize = trace.threads.iter().map(|t| t.calls.iter().filter(|c| c.function == tick).count()).sum();
    assert_eq!((traced, trace.cut), (20_000, 0), "every call made while attached, one by one");
}

#[test]
fn a_chrome_trace_of_a_short_run_has_a_complete_event_per_call() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let calls = Build::c("calls.c", "-O0").build();
    let profile = traced_run(dir.path(), &["-f", "leaf", "-f", "left", "-f", "right", "-f", "fib"], &[calls.to_str().unwrap(), "200", "8"]);
    let json = dir.path().join("trace.json");
    run_ok(proftap().arg("export").arg(dir.path().join("p.profile")).args(["--format", "chrome-trace", "-o"]).arg(&json));
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let complete = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count() as u64;
    let calls: u64 = counted(&profile).values().sum();
    // left 200, right 100, leaf 400, fib(8) 67.
    assert_eq!((complete, calls), (767, 767));
}

#[test]
fn calls_of_threads_whose_blocks_are_reused_are_all_traced() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    // 2,000 threads one after another, 10 calls each: past the engine's
    // 1,024 blocks, so ended threads' blocks go to new threads.
    let churn = Build::c("churn.c", "-O2").flag("-pthread").build();
    let profile = traced_run(dir.path(), &["-f", "leaf"], &[churn.to_str().unwrap(), "2000"]);
    let trace = profile.trace.as_ref().unwrap();
    let traced: u64 = trace.threads.iter().map(|t| t.calls.len() as u64).sum();
    assert_eq!((traced, trace.cut, counted(&profile).values().sum::<u64>()), (20_000, 0, 20_000));
}

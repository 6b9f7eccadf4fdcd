//! The timeline exports (`proftap export --format chrome-trace|speedscope|firefox`)
//! opened by the viewers people use.
//!
//! The Chrome trace and the speedscope export are opened in speedscope (the
//! npm package, which imports both) in Debian's headless Chromium, driven by
//! `tests/viewers/speedscope.js` with puppeteer-core over a pipe (no port,
//! no server: the page is speedscope's own `index.html`, and the file goes
//! in through its file input). What speedscope loaded is read back through
//! its own export (Ctrl+S, its file format, every thread with its calls as
//! open and close events), and each thread and each function's calls and
//! time are checked against what was recorded. speedscope drops a call of
//! no time (it draws nothing for it): the profiles opened have none.
//!
//! No program reads the Firefox Profiler's processed format offline (the
//! profiler is a web site, not on npm as an application): the Firefox export
//! is checked against the format's invariants instead, as the profiler
//! relies on them (every table's columns as long as the table, every index
//! in range, stacks' prefixes before them, samples in time order, markers'
//! types in the schema), with each thread's samples and each function's
//! calls as markers.
//!
//! scripts/setup.sh installs chromium, node and npm, and speedscope and
//! puppeteer-core into `PROFTAP_NPM` (by default `~/.cache/proftap-npm`).
#![allow(clippy::unwrap_used)]

use proftap_profile::{
    CallTree, FunctionInfo, Profile, SampleProfile, SampledFrame, SampledStack, ThreadProfile, ThreadTrace, Trace, TracedCall, TracedSample,
};
use proftap_tests::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Calls and total nanoseconds, by thread title then function.
type Loaded = BTreeMap<String, BTreeMap<String, (u64, f64)>>;

/// The pid of the hand-made profile's process; its threads' tids.
const PID: i32 = 4242;
const WORKER: i32 = 4243;

/// A profile with a trace: on thread `prog`, main > work > leaf with a
/// recursive work, callees entered and returning with their callers; on
/// thread `worker`, work > leaf; durations with nanoseconds below the
/// microsecond; a few samples.
fn traced_profile() -> Profile {
    let function = |name: &str, line| FunctionInfo {
        name: name.into(),
        module: "/usr/bin/prog".into(),
        file: Some("prog.c".into()),
        line,
        ..FunctionInfo::default()
    };
    let call = |function, start_ns, duration_ns, depth| TracedCall { function, start_ns, duration_ns, depth };
    let (main, work, leaf) = (0, 1, 2);
    let prog = vec![
        call(main, 1_000, 98_000, 0),
        call(work, 1_000, 20_500, 1),
        call(leaf, 2_000, 1_234, 2),
        call(leaf, 5_000, 1_001, 2),
        call(work, 30_000, 40_000, 1),
        call(work, 31_000, 10_000, 2),
        call(leaf, 32_000, 9_000, 3),
        call(leaf, 50_000, 777, 2),
        call(leaf, 80_000, 19_000, 1),
    ];
    let worker = vec![
        call(work, 10_000, 5_500, 0),
        call(leaf, 10_000, 2_000, 1),
        call(leaf, 12_500, 3_000, 1),
        call(work, 20_000, 1_000, 0),
        call(leaf, 20_100, 333, 1),
        call(leaf, 20_500, 250, 1),
    ];
    let frame = |name: &str| SampledFrame { name: name.into(), module: "/usr/bin/prog".into(), inlined: false };
    let sample = |time_ns, stack| TracedSample { time_ns, stack };
    let thread = |tid, name: &str| ThreadProfile { pid: PID, tid, name: name.into(), functions: Vec::new(), tree: CallTree::new(0) };
    let mut profile = Profile {
        functions: vec![function("main", 30), function("work", 20), function("leaf", 10)],
        threads: vec![thread(PID, "prog"), thread(WORKER, "worker")],
        samples: Some(SampleProfile {
            event: "cpu-clock".into(),
            frequency_hz: 1000,
            total: 4,
            frames: vec![frame("main"), frame("work"), frame("leaf")],
            stacks: vec![SampledStack { frames: vec![0, 1, 2], count: 3 }, SampledStack { frames: vec![1, 2], count: 1 }],
            ..SampleProfile::default()
        }),
        runs: 1,
        ..Profile::default()
    };
    profile.target.pid = PID;
    profile.target.command = vec!["/usr/bin/prog".into()];
    profile.target.exe = "/usr/bin/prog".into();
    profile.recording.duration_ns = 100_000;
    profile.trace = Some(Trace {
        limit_bytes: 1 << 20,
        cut: 0,
        missed: 0,
        threads: vec![
            ThreadTrace { pid: PID, tid: PID, calls: prog, samples: vec![sample(2_500, 0), sample(33_000, 0), sample(60_000, 0)] },
            ThreadTrace { pid: PID, tid: WORKER, calls: worker, samples: vec![sample(11_000, 1)] },
        ],
    });
    profile
}

/// What a trace holds: calls and total nanoseconds, by thread title (as
/// `title` makes it of the thread's name and tid) then function.
fn expected(profile: &Profile, title: impl Fn(&str, i32) -> String) -> Loaded {
    let mut loaded = Loaded::new();
    for thread in &profile.trace.as_ref().unwrap().threads {
        let name = &profile.threads.iter().find(|t| t.tid == thread.tid).unwrap().name;
        let functions = loaded.entry(title(name, thread.tid)).or_default();
        // Speedscope draws no frame of zero length: a call of a few cycles,
        // traced as lasting 0 ns, is not among what it loads.
        for call in thread.calls.iter().filter(|c| c.duration_ns > 0) {
            let entry = functions.entry(profile.functions[call.function as usize].name.clone()).or_default();
            entry.0 += 1;
            entry.1 += call.duration_ns as f64;
        }
    }
    loaded
}

/// Where setup.sh puts the npm packages.
fn npm_dir() -> PathBuf {
    std::env::var_os("PROFTAP_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/proftap-npm"))
}

/// Fails the test, saying what to install, unless speedscope can run.
fn require_speedscope() -> PathBuf {
    require("node", "to drive speedscope");
    require("chromium", "to run speedscope in");
    let npm = npm_dir();
    for (package, file) in [("speedscope", "dist/release/index.html"), ("puppeteer-core", "package.json")] {
        let path = npm.join("node_modules").join(package).join(file);
        assert!(
            path.exists(),
            "{package} is missing from {} (needed to open the timeline exports); scripts/setup.sh installs it",
            npm.display()
        );
    }
    let chromium = run_ok(Command::new("sh").args(["-c", "command -v chromium"]));
    PathBuf::from(chromium.trim())
}

/// Kills a process group when dropped: whatever way the test leaves,
/// neither node nor the browser it started outlives it.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) only sends a signal; the group is the one this test started.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// Opens `file` in speedscope; returns what speedscope loaded, as its own
/// export writes it.
fn open_in_speedscope(chromium: &Path, file: &Path, dir: &Path) -> Value {
    use std::os::unix::process::CommandExt;
    let out = dir.join(format!("{}.loaded.json", file.file_name().unwrap().to_string_lossy()));
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let child = Command::new("node")
        .arg(repo().join("tests/viewers/speedscope.js"))
        .arg(npm_dir())
        .arg(chromium)
        .arg(file)
        .arg(&out)
        // The browser's profile, caches and crash reports stay in the test's directory.
        .env("HOME", &home)
        .env("TMPDIR", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("XDG_CACHE_HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run node");
    let _group = Group(child.id() as i32);
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    // The script gives speedscope 60 s; this is its own deadline.
    let output = wait.recv_timeout(Duration::from_secs(120)).expect("speedscope still running after 120 s").unwrap();
    assert!(
        output.status.success(),
        "speedscope did not load {} ({}):\n{}",
        file.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// Calls and total time by thread then function, from speedscope's export:
/// replays each profile's open and close events, which must nest.
fn loaded(export: &Value, frame_name: impl Fn(&str) -> String) -> Loaded {
    let frames = export["shared"]["frames"].as_array().unwrap();
    let mut loaded = Loaded::new();
    for profile in export["profiles"].as_array().unwrap() {
        assert_eq!(profile["type"], "evented", "{profile}");
        let scale = match profile["unit"].as_str() {
            Some("nanoseconds") => 1.0,
            Some("microseconds") => 1e3,
            unit => panic!("unit {unit:?}"),
        };
        let functions = loaded.entry(profile["name"].as_str().unwrap().to_string()).or_default();
        let mut open: Vec<(u64, f64)> = Vec::new();
        for event in profile["events"].as_array().unwrap() {
            let (frame, at) = (event["frame"].as_u64().unwrap(), event["at"].as_f64().unwrap() * scale);
            if event["type"] == "O" {
                open.push((frame, at));
                continue;
            }
            let (opened, since) = open.pop().unwrap_or_else(|| panic!("{event} closes nothing"));
            assert_eq!(opened, frame, "{event} closes another frame than the innermost open");
            let entry = functions.entry(frame_name(frames[frame as usize]["name"].as_str().unwrap())).or_default();
            entry.0 += 1;
            entry.1 += at - since;
        }
        assert!(open.is_empty(), "{} left open", open.len());
    }
    loaded
}

/// Calls must match; times to a hundredth of a nanosecond (speedscope
/// keeps microseconds as doubles).
fn assert_same(loaded: &Loaded, expected: &Loaded, what: &str) {
    let counts = |l: &Loaded| -> BTreeMap<String, BTreeMap<String, u64>> {
        l.iter().map(|(t, f)| (t.clone(), f.iter().map(|(n, (c, _))| (n.clone(), *c)).collect())).collect()
    };
    assert_eq!(counts(loaded), counts(expected), "{what}: threads and calls as speedscope loaded them");
    for (thread, functions) in expected {
        for (function, (_, ns)) in functions {
            let got = loaded[thread][function].1;
            assert!((got - ns).abs() < 0.01, "{what}: {thread} {function}: {got} ns in speedscope, {ns} ns recorded");
        }
    }
}

/// `proftap export FILE --format FORMAT -o OUT`, returning OUT.
fn export(file: &Path, format: &str, out: &Path) -> PathBuf {
    run_ok(proftap().arg("export").arg(file).args(["--format", format, "-o"]).arg(out));
    out.to_path_buf()
}

#[test]
fn chrome_trace_and_speedscope_exports_load_in_speedscope() {
    let chromium = require_speedscope();
    let dir = tempfile::tempdir().unwrap();
    let profile = traced_profile();
    let file = dir.path().join("traced.profile");
    proftap_profile::write_profile(&file, &profile).unwrap();

    // speedscope titles a Chrome trace's threads by process and thread, and
    // names a frame by the event's name and its args.
    let chrome = export(&file, "chrome-trace", &dir.path().join("trace.json"));
    let from_chrome = loaded(&open_in_speedscope(&chromium, &chrome, dir.path()), |name| {
        name.split_once(" {\"location\":").map_or(name, |(function, _)| function).to_string()
    });
    assert_same(&from_chrome, &expected(&profile, |name, tid| format!("prog (pid {PID}), {name} (tid {tid})")), "chrome-trace");

    let speedscope = export(&file, "speedscope", &dir.path().join("trace.speedscope.json"));
    let from_speedscope = loaded(&open_in_speedscope(&chromium, &speedscope, dir.path()), str::to_string);
    assert_same(&from_speedscope, &expected(&profile, |name, tid| format!("thread {name} ({tid})")), "speedscope");
}

/// The columns of `table` all hold `length` values.
fn columns(table: &Value, what: &str) -> usize {
    let length = table["length"].as_u64().unwrap_or_else(|| panic!("{what} has no length")) as usize;
    for (key, column) in table.as_object().unwrap() {
        if let Some(values) = column.as_array() {
            assert_eq!(values.len(), length, "{what}.{key}");
        }
    }
    length
}

/// Indexes in `column` of `table` are below `bound` (or null where `nullable`).
fn indexes(table: &Value, column: &str, bound: usize, nullable: bool) {
    for (i, v) in table[column].as_array().unwrap().iter().enumerate() {
        match v.as_u64() {
            Some(index) => assert!((index as usize) < bound, "{column}[{i}] = {index}, beyond {bound}"),
            None => assert!(nullable && (v.is_null() || v == -1), "{column}[{i}] = {v}"),
        }
    }
}

/// Checks one thread of a processed profile; returns its markers by name
/// and its samples' count.
fn check_thread(thread: &Value, libs: usize, categories: usize, schemas: &[&str]) -> (BTreeMap<String, u64>, usize) {
    let strings = thread["stringArray"].as_array().unwrap().len();
    let stacks = columns(&thread["stackTable"], "stackTable");
    let frames = columns(&thread["frameTable"], "frameTable");
    let funcs = columns(&thread["funcTable"], "funcTable");
    let resources = columns(&thread["resourceTable"], "resourceTable");
    indexes(&thread["stackTable"], "frame", frames, false);
    for (i, prefix) in thread["stackTable"]["prefix"].as_array().unwrap().iter().enumerate() {
        assert!(prefix.is_null() || prefix.as_u64().is_some_and(|p| (p as usize) < i), "stack {i}'s prefix {prefix}");
    }
    indexes(&thread["frameTable"], "func", funcs, false);
    indexes(&thread["frameTable"], "category", categories, false);
    indexes(&thread["funcTable"], "name", strings, false);
    indexes(&thread["funcTable"], "resource", resources, true);
    indexes(&thread["resourceTable"], "lib", libs, true);
    indexes(&thread["resourceTable"], "name", strings, false);
    let samples = columns(&thread["samples"], "samples");
    indexes(&thread["samples"], "stack", stacks, true);
    let deltas = thread["samples"]["timeDeltas"].as_array().unwrap();
    assert!(deltas.iter().all(|d| d.as_f64().is_some_and(|d| d >= 0.0)), "samples out of time order: {deltas:?}");
    let markers = &thread["markers"];
    columns(markers, "markers");
    indexes(markers, "name", strings, false);
    indexes(markers, "category", categories, false);
    let mut calls = BTreeMap::new();
    for i in 0..markers["length"].as_u64().unwrap() as usize {
        let (start, end) = (markers["startTime"][i].as_f64().unwrap(), markers["endTime"][i].as_f64().unwrap());
        assert!(start <= end && markers["phase"][i] == 1, "marker {i}: an interval from {start} to {end}");
        let data = &markers["data"][i];
        assert!(schemas.contains(&data["type"].as_str().unwrap()), "marker {i}'s type {} has no schema", data["type"]);
        assert!(data["location"].as_u64().is_some_and(|s| (s as usize) < strings), "marker {i}'s location {}", data["location"]);
        let name = thread["stringArray"][markers["name"][i].as_u64().unwrap() as usize].as_str().unwrap();
        *calls.entry(name.to_string()).or_default() += 1;
    }
    (calls, samples)
}

#[test]
fn firefox_export_is_a_consistent_processed_profile() {
    let dir = tempfile::tempdir().unwrap();
    let profile = traced_profile();
    let file = dir.path().join("traced.profile");
    proftap_profile::write_profile(&file, &profile).unwrap();
    let out = export(&file, "firefox", &dir.path().join("trace.firefox.json"));
    let fx: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    let meta = &fx["meta"];
    assert!(meta["preprocessedProfileVersion"].as_u64().is_some_and(|v| v > 0), "{meta}");
    assert_eq!(meta["symbolicated"], true);
    let libs = fx["libs"].as_array().unwrap();
    assert!(libs.iter().all(|l| l["name"].is_string() && l["path"].is_string() && l["breakpadId"].is_string()), "{libs:?}");
    let categories = meta["categories"].as_array().unwrap().len();
    let schemas: Vec<&str> = meta["markerSchema"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();

    let mut got = BTreeMap::new();
    for thread in fx["threads"].as_array().unwrap() {
        let (calls, samples) = check_thread(thread, libs.len(), categories, &schemas);
        let title = format!("{} ({})", thread["name"].as_str().unwrap(), thread["tid"].as_str().unwrap());
        assert_eq!(thread["pid"], PID.to_string(), "{title}");
        got.insert(title, (calls, samples));
    }
    let samples = |tid: i32| profile.trace.as_ref().unwrap().threads.iter().find(|t| t.tid == tid).unwrap().samples.len();
    let want: BTreeMap<String, (BTreeMap<String, u64>, usize)> = expected(&profile, |name, tid| format!("{name} ({tid})"))
        .into_iter()
        .map(|(title, functions)| {
            let tid = title.trim_end_matches(')').rsplit('(').next().unwrap().parse().unwrap();
            (title, (functions.into_iter().map(|(f, (c, _))| (f, c)).collect(), samples(tid)))
        })
        .collect();
    assert_eq!(got, want, "threads, calls as markers, and samples");
}

#[test]
fn a_profile_without_a_trace_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = traced_profile();
    profile.trace = None;
    let file = dir.path().join("plain.profile");
    proftap_profile::write_profile(&file, &profile).unwrap();
    for format in ["chrome-trace", "speedscope", "firefox"] {
        let out = dir.path().join(format!("{format}.json"));
        let result = run(proftap().arg("export").arg(&file).args(["--format", format, "-o"]).arg(&out));
        assert_clean_failure(&result, &format!("{} has no trace; record it with --trace", file.display()));
        assert!(!out.exists(), "{format}: {} written", out.display());
    }
}

#[test]
fn an_export_of_a_trace_that_lost_calls_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = traced_profile();
    profile.trace.as_mut().unwrap().cut = 17;
    let file = dir.path().join("cut.profile");
    proftap_profile::write_profile(&file, &profile).unwrap();
    let out = dir.path().join("trace.json");
    let result = run(proftap().arg("export").arg(&file).args(["--format", "chrome-trace", "-o"]).arg(&out));
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("lacks 17 of the calls the profile counts"), "{stderr}");
    let trace: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(trace["otherData"]["calls_not_traced"], 17);
}

/// A real traced run (`proftap run --trace`) opened in speedscope:
/// `threads` (its main thread and two workers, each calling `work` a known
/// number of times from `worker`).
#[test]
fn a_traced_run_loads_in_speedscope() {
    let chromium = require_speedscope();
    let binary = Build::c("threads.c", "-O0").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("threads.profile");
    run_ok(proftap().args(["run", "--trace", "-f", "work", "-f", "worker", "-o"]).arg(&file).arg("--").arg(&binary).args(["2", "50"]));
    let profile = proftap_profile::read_profile(&file).unwrap();
    let trace = profile.trace.as_ref().expect("run --trace wrote no trace");
    assert_eq!(trace.cut, 0, "calls cut from the trace");
    // By tid: the main thread calls work 50 times; worker t calls it (t + 1) * 50 times.
    let mut calls: Vec<(bool, u64, u64)> = trace
        .threads
        .iter()
        .map(|t| {
            let count = |name: &str| t.calls.iter().filter(|c| profile.functions[c.function as usize].name == name).count() as u64;
            (t.tid == t.pid, count("worker"), count("work"))
        })
        .collect();
    calls.sort();
    assert_eq!(calls, vec![(false, 1, 50), (false, 1, 100), (true, 0, 50)]);
    let speedscope = export(&file, "speedscope", &dir.path().join("threads.speedscope.json"));
    let from_speedscope = loaded(&open_in_speedscope(&chromium, &speedscope, dir.path()), str::to_string);
    // A thread whose name the recording did not get is titled by its tid.
    let expected = expected(&profile, |name, tid| if name.is_empty() { format!("thread {tid}") } else { format!("thread {name} ({tid})") });
    let counts = |l: &Loaded| -> Vec<(String, BTreeMap<String, u64>)> {
        l.iter().map(|(t, f)| (t.clone(), f.iter().map(|(n, (c, _))| (n.clone(), *c)).collect())).collect()
    };
    assert_eq!(counts(&from_speedscope), counts(&expected));
    let chrome = export(&file, "chrome-trace", &dir.path().join("threads.json"));
    let from_chrome = loaded(&open_in_speedscope(&chromium, &chrome, dir.path()), |name| {
        name.split_once(" {\"location\":").map_or(name, |(function, _)| function).to_string()
    });
    let total = |l: &Loaded| -> u64 { l.values().flat_map(|f| f.values()).map(|(c, _)| c).sum() };
    assert_eq!(total(&from_chrome), total(&expected), "calls speedscope loaded from the Chrome trace");
}

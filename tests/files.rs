//! Profile files across commands: merging runs, comparing them with
//! `proftap diff`, and what a damaged file says.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use serde_json::{Value, json};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The tests of this file, one at a time: `diff` compares timings and the
/// pprof export sample shares, which any other work on the same two cores
/// would disturb (one of two hyperthreads busy slows the other by half).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held for a whole test: it runs alone among this file's.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `workload UNITS 100` into DIR/NAME, scaled() and steady() only.
fn record(binary: &Path, units: &str, dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(name);
    run_ok(proftap().args(["run", "-f", "steady", "-f", "scaled", "-o"]).arg(&file).arg("--").arg(binary).args([units, "100"]));
    file
}

#[test]
fn merged_runs_add_up() {
    require_probes();
    let _alone = alone();
    let binary = Build::c("workload.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let one = record(&binary, "1", dir.path(), "one.profile");
    let two = record(&binary, "2", dir.path(), "two.profile");
    let sum = dir.path().join("sum.profile");
    run_ok(proftap().arg("merge").arg(&one).arg(&two).arg("-o").arg(&sum));
    let report = report_json(&sum);
    assert_eq!(calls_by_name(&report)["scaled"], 200);
    assert_eq!(report["runs"], 2);
}

#[test]
fn damaged_truncated_and_foreign_files_are_named_in_one_sentence() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let good = record(&Build::c("workload.c", "-O2").build(), "1", dir.path(), "good.profile");
    let bytes = std::fs::read(&good).unwrap();

    let truncated = dir.path().join("truncated.profile");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let out = run(proftap().arg("report").arg(&truncated));
    assert_clean_failure(&out, "truncated.profile is damaged or truncated");

    let corrupted = dir.path().join("corrupted.profile");
    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    for b in &mut flipped[middle..middle + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&corrupted, &flipped).unwrap();
    let out = run(proftap().arg("diff").arg(&good).arg(&corrupted));
    assert_clean_failure(&out, "corrupted.profile is damaged or truncated");

    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, "hello\n").unwrap();
    let out = run(proftap().arg("merge").arg(&good).arg(&foreign).arg("-o").arg(dir.path().join("out.profile")));
    assert_clean_failure(&out, "notes.txt is not a proftap profile");
    assert!(!dir.path().join("out.profile").exists());
}

#[test]
fn pprof_export_is_read_by_go_tool_pprof() {
    require_probes();
    require("go", "to read the pprof export");
    let binary = Build::c("workload.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    // Every function instrumented and the whole program sampled.
    let _alone = alone();
    run_ok(
        proftap().args(["run", "--overhead-budget", "0", "--sample", "2000", "-o"]).arg(&file).arg("--").arg(&binary).args(["9", "100"]),
    );
    let pprof = dir.path().join("p.pb.gz");
    run_ok(proftap().arg("export").arg(&file).args(["--format", "pprof", "-o"]).arg(&pprof));
    let go_pprof = |index: &str| -> String {
        let out = run(std::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-nodecount=50", &format!("-sample_index={index}")])
            .arg(&pprof));
        assert!(out.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Exact calls: flat column of the function's row.
    let calls = go_pprof("calls");
    let flat = |text: &str, name: &str| -> Option<String> {
        text.lines().find(|l| l.split_whitespace().last() == Some(name)).and_then(|l| l.split_whitespace().next()).map(str::to_string)
    };
    assert_eq!(flat(&calls, "scaled").as_deref(), Some("100"), "{calls}");
    assert_eq!(flat(&calls, "steady").as_deref(), Some("100"), "{calls}");
    assert_eq!(flat(&calls, "main").as_deref(), Some("1"), "{calls}");
    // Wall time by call path, and the build-id.
    let wall = go_pprof("wall");
    assert!(wall.contains("Type: wall") && wall.contains("Build ID:"), "{wall}");
    assert!(flat(&wall, "scaled").is_some(), "{wall}");
    // Samples: the sampled stacks, with the inlined loop as its own frame,
    // and scaled (nine units of work per call) on more than steady (one):
    // a ratio wide enough to hold on a loaded machine with ~100 samples.
    let samples = go_pprof("samples");
    assert!(samples.contains("unit (inline)"), "{samples}");
    let cum = |name: &str| -> u64 {
        samples
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    };
    assert!(cum("scaled") > cum("steady") && cum("steady") > 0, "{samples}");
}

// Hostile files: every reader refuses a damaged profile in one sentence,
// with no panic, hang or unbounded allocation, and every output stays
// where the user asked.

/// The longest a command may take on a hostile file (a debug build on a
/// loaded machine takes a second at most).
const TIME_BOUND: Duration = Duration::from_secs(30);

/// The address space a command may take: an unbounded allocation aborts.
const MEMORY_BOUND_KB: u64 = 4 << 20;

/// How a command ended.
struct Ended {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs proftap with ARGS within [`TIME_BOUND`] and [`MEMORY_BOUND_KB`],
/// with ENV added; fails the test on a timeout.
fn run_bounded(dir: &Path, args: &[OsString], env: &[(&str, &str)]) -> Ended {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_BOUND_KB}; exec \"$0\" \"$@\""))
        .arg(binary("proftap"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIME_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("proftap {args:?} ran longer than {TIME_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let stderr = String::from_utf8_lossy(&std::fs::read(&err).unwrap()).into_owned();
    let ended = Ended { code: status.code(), stdout: std::fs::read(&out).unwrap(), stderr };
    assert!(ended.code.is_some(), "proftap {args:?} was killed by a signal ({status}): {}", ended.stderr);
    assert_ne!(ended.code, Some(101), "proftap {args:?} panicked: {}", ended.stderr);
    ended
}

/// Asserts a run failed in one sentence naming each of `expect`.
fn assert_one_sentence(ended: &Ended, args: &[OsString], expect: &[&str]) {
    assert_eq!(ended.code, Some(2), "proftap {args:?}: {}", ended.stderr);
    assert!(ended.stderr.starts_with("proftap: "), "proftap {args:?}: {}", ended.stderr);
    assert_eq!(ended.stderr.trim_end().lines().count(), 1, "proftap {args:?}: {}", ended.stderr);
    for expect in expect {
        assert!(ended.stderr.contains(expect), "proftap {args:?}: expected '{expect}' in {}", ended.stderr);
    }
}

/// A profile file of `json`: the header, then the JSON gzip-compressed.
fn profile_file(json: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = b"proftap-profile 1\n".to_vec();
    let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::default());
    gz.write_all(json).unwrap();
    gz.finish().unwrap();
    out
}

fn write_profile(path: &Path, profile: &Value) {
    std::fs::write(path, profile_file(&serde_json::to_vec(profile).unwrap())).unwrap();
}

/// A node of a call tree with one metric.
fn node(function: u64, parent: u64, calls: u64, cost: u64) -> Value {
    json!({ "function": function, "parent": parent, "calls": calls, "inclusive": [cost], "exclusive": [cost] })
}

/// Call tree nodes: the root, then `depth` calls of `function`, each
/// called by the one before.
fn chain(function: u64, depth: u64) -> Value {
    let mut nodes = vec![node(4_294_967_295, 4_294_967_295, 0, 0)];
    nodes.extend((0..depth).map(|parent| node(function, parent, 1, 1)));
    Value::Array(nodes)
}

/// A small valid profile as a recording writes it: main calls f twice,
/// lines of `source`, two sampled stacks.
fn small_profile(source: &str) -> Value {
    let stats = |function: u64, calls: u64, cost: u64| {
        let stat = json!({ "total": cost, "min": cost, "max": cost });
        json!({ "function": function, "calls": calls, "unwound": 0, "unfinished": 0, "inclusive": [stat], "exclusive": [stat] })
    };
    let function = |name: &str, line: u64| json!({ "name": name, "module": "/bin/prog", "file": source, "line": line, "address": 4096 });
    let frame = |name: &str| json!({ "name": name, "module": "/bin/prog", "inlined": false });
    json!({
        "target": { "command": ["./prog"], "pid": 1, "exe": "/bin/prog", "attached": false },
        "recording": { "engine": "uprobe", "started_unix_ns": 0, "started_monotonic_ns": 0, "duration_ns": 1_000_000,
            "events": 6, "peak_events_per_second": 0, "follow_forks": true, "proftap_version": "0.1.0" },
        "metrics": ["wall_ns"],
        "functions": [function("main", 1), function("f", 3)],
        "threads": [{ "pid": 1, "tid": 1, "name": "prog", "functions": [stats(0, 1, 100), stats(1, 2, 40)],
            "tree": { "nodes": [node(4_294_967_295, 4_294_967_295, 0, 0), node(0, 0, 1, 100), node(1, 1, 2, 40)] } }],
        "lost": { "events": 0, "by_function": [], "by_thread": [], "unmatched_returns": 0 },
        "overhead": { "per_hit_ns": 0, "hits": 0, "estimated_ns": 0, "compensated": false, "call_ns_emulated": 0,
            "call_ns_stepped": 0, "call_cpu_ns": 0, "self_ns": 0 },
        "processes": [{ "pid": 1, "parent": null, "execs": [] }],
        "notes": [],
        "lines": [{ "file": source, "line": 1, "count": 1, "cost": [100] }, { "file": source, "line": 3, "count": 2, "cost": [40] }],
        "runs": 1,
        "samples": { "event": "cpu-clock", "frequency_hz": 1000, "total": 3, "frames": [frame("main"), frame("f")],
            "stacks": [{ "frames": [0, 1], "count": 2 }, { "frames": [0], "count": 1 }], "lines": [] },
    })
}

/// Every command that reads a profile, on BAD (GOOD: a valid profile to
/// merge or compare it with), writing into `out`.
fn every_command(bad: &Path, good: &Path, out: &Path) -> Vec<Vec<OsString>> {
    let o = |name: &str| out.join(name).into_os_string();
    // The command's words, BAD, then the rest.
    let cmd = |words: &[&str], rest: &[OsString]| -> Vec<OsString> {
        words.iter().map(Into::into).chain([bad.into()]).chain(rest.iter().cloned()).collect()
    };
    let mut commands = vec![
        cmd(&["report"], &[]),
        cmd(&["report", "--tree", "--threads", "--lines"], &[]),
        cmd(&["report", "--format", "json"], &[]),
        cmd(&["gcov"], &["-o".into(), o("gcov")]),
        cmd(&["flamegraph"], &["-o".into(), o("out.svg")]),
        cmd(&["flamegraph", "--from", "calls"], &["-o".into(), o("calls.svg")]),
        cmd(&["merge"], &[good.into(), "-o".into(), o("merged.profile")]),
        vec!["diff".into(), good.into(), bad.into()],
    ];
    for format in ["pprof", "folded", "lcov", "gcov-json", "json", "chrome-trace", "speedscope", "firefox"] {
        commands.push(cmd(&["export", "--format", format], &["-o".into(), o(&format!("out.{format}"))]));
    }
    commands
}

/// Command arguments of strings and paths.
macro_rules! argv {
    ($($arg:expr),* $(,)?) => { [$(OsString::from($arg)),*] };
}

/// Asserts that every command refuses BAD in one sentence naming each of
/// `expect`, and writes nothing.
fn every_command_refuses(dir: &Path, bad: &Path, good: &Path, expect: &[&str]) {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    for args in every_command(bad, good, &out) {
        let ended = run_bounded(dir, &args, &[]);
        assert_one_sentence(&ended, &args, expect);
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "proftap {args:?} wrote something");
    }
}

/// A gzip stream of `mib` MiB of JSON whitespace after `{`, compressed a
/// thousandfold.
fn gzip_bomb(mib: usize) -> Vec<u8> {
    use std::io::Write;
    let mut out = b"proftap-profile 1\n".to_vec();
    let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::best());
    gz.write_all(b"{").unwrap();
    let spaces = vec![b' '; 1 << 20];
    for _ in 0..mib {
        gz.write_all(&spaces).unwrap();
    }
    gz.write_all(b"}").unwrap();
    gz.finish().unwrap();
    out
}

#[test]
fn crafted_profiles_are_refused_in_one_sentence_by_every_command() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.profile");
    let base = small_profile(dir.path().join("prog.c").to_str().unwrap());
    write_profile(&good, &base);
    // Its name, how to craft it from a valid profile, what the error says.
    type Case = (&'static str, fn(&mut Value), &'static str);
    let cases: Vec<Case> = vec![
        ("parent", |p| p["threads"][0]["tree"]["nodes"][2]["parent"] = json!(999), "node 2 has parent 999, which is not an earlier node"),
        (
            "cycle",
            |p| {
                p["threads"][0]["tree"]["nodes"][1]["parent"] = json!(2);
                p["threads"][0]["tree"]["nodes"][2]["parent"] = json!(1);
            },
            "node 1 has parent 2",
        ),
        (
            "function",
            |p| p["threads"][0]["tree"]["nodes"][2]["function"] = json!(77),
            "node 2 names function 77, but the profile has 2 functions",
        ),
        ("frame", |p| p["samples"]["stacks"][0]["frames"] = json!([0, 999]), "sampled stack 0 names frame 999"),
        (
            "metrics",
            |p| p["threads"][0]["functions"][0]["inclusive"] = json!([]),
            "has 0 values per metric where the profile measures 1 metrics",
        ),
        // One level past the limit: the reader stops there, however deep the rest.
        ("deep", |p| p["threads"][0]["tree"]["nodes"] = chain(0, 300_001), "deeper than 300000 levels"),
        ("line", |p| p["lines"][0]["line"] = json!(4_294_967_295u64), "at line 4294967295, beyond the largest line number"),
    ];
    for (name, craft, expect) in cases {
        let mut profile = base.clone();
        craft(&mut profile);
        let bad = dir.path().join(format!("{name}.profile"));
        write_profile(&bad, &profile);
        every_command_refuses(dir.path(), &bad, &good, &[&format!("{name}.profile is damaged or truncated"), expect]);
    }
    // 80 MiB of JSON in 80 KiB: refused once it expands past 64 MiB.
    let bomb = dir.path().join("bomb.profile");
    std::fs::write(&bomb, gzip_bomb(80)).unwrap();
    every_command_refuses(dir.path(), &bomb, &good, &["bomb.profile is damaged", "its data expands more than 100-fold when decompressed"]);
}

/// Runs proftap within bounds and asserts it succeeded.
fn run_bounded_ok(dir: &Path, args: &[OsString], env: &[(&str, &str)]) -> Ended {
    let ended = run_bounded(dir, args, env);
    assert_eq!(ended.code, Some(0), "proftap {args:?}: {}", ended.stderr);
    ended
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn counts_at_u64_max_saturate_through_merge_reports_and_exports() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("prog.c");
    std::fs::write(&source, "int main() {}\n\nint f() {}\n").unwrap();
    let mut p = small_profile(source.to_str().unwrap());
    let max = u64::MAX;
    p["threads"][0]["functions"][1]["calls"] = json!(max - 1);
    p["threads"][0]["functions"][1]["inclusive"][0]["total"] = json!(max);
    // More calls untimed than made: a lie no renderer may divide by.
    p["threads"][0]["functions"][1]["untimed"] = json!(max);
    // As many calls carried on by children and nested in others as can be.
    p["threads"][0]["functions"][0]["carried"] = json!(max);
    p["threads"][0]["functions"][0]["inclusive"][0]["nested"] = json!(max);
    p["threads"][0]["tree"]["nodes"][2]["calls"] = json!(max);
    p["threads"][0]["tree"]["nodes"][2]["exclusive"] = json!([max]);
    p["lines"][1]["count"] = json!(max);
    p["samples"]["stacks"][0]["count"] = json!(max);
    p["samples"]["total"] = json!(max);
    p["lost"]["events"] = json!(max);
    p["runs"] = json!(u32::MAX);
    let one = dir.path().join("one.profile");
    write_profile(&one, &p);
    let sum = dir.path().join("sum.profile");
    run_bounded_ok(dir.path(), &argv!["merge", &one, &one, "-o", &sum], &[]);
    let report = report_json(&sum);
    assert_eq!(calls_by_name(&report)["f"], max);
    let f = function(&report["functions"], "f");
    assert_eq!((f["untimed"].as_u64(), f["inclusive"]["wall_ns"]["avg"].as_u64()), (Some(max), Some(0)), "{f}");
    let main = function(&report["functions"], "main");
    assert_eq!((main["carried"].as_u64(), main["inclusive"]["wall_ns"]["avg"].as_u64()), (Some(max), Some(1)), "{main}");
    assert_eq!((report["lines"][1]["count"].as_u64(), report["lost"]["events"].as_u64()), (Some(max), Some(max)));
    assert_eq!(report["runs"], u32::MAX);
    assert_eq!(report["tree"]["children"][0]["children"][0]["calls"], max);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for command in every_command(&sum, &one, &out) {
        let ended = run_bounded(dir.path(), &command, &[]);
        let timeline = command.iter().any(|w| ["chrome-trace", "speedscope", "firefox"].contains(&w.to_str().unwrap_or_default()));
        if timeline {
            // A merged profile has no trace: runs do not share a clock.
            assert!(ended.code == Some(2) && ended.stderr.contains("has no trace"), "proftap {command:?}: {}", ended.stderr);
            continue;
        }
        // diff says 1 when something regressed.
        assert!(matches!(ended.code, Some(0 | 1)), "proftap {command:?}: {}", ended.stderr);
    }
}

#[test]
fn a_tree_at_the_depth_limit_is_shown_or_refused_in_one_sentence() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let mut p = small_profile("prog.c");
    p["threads"][0]["tree"]["nodes"] = chain(1, 100_000);
    // Stacks from the tree, not from samples.
    p["samples"] = Value::Null;
    let deep = dir.path().join("deep.profile");
    write_profile(&deep, &p);
    let text = run_bounded_ok(dir.path(), &argv!["report", &deep, "--tree"], &[]).stdout;
    let text = String::from_utf8(text).unwrap();
    // One function calling itself: its levels fold into one line.
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("f 1x  1 ns / 1 ns") && l.contains("[recursion: +99,999 levels, 99,999 calls")),
        "{}",
        &text[..2000]
    );
    assert!(text.lines().all(|l| l.len() < 300));
    run_bounded_ok(dir.path(), &argv!["report", &deep, "--format", "json"], &[]);
    for (format, expect) in [("pprof", "frames in all, more than the 67108864 a pprof export may"), ("folded", "more than the 512 MiB")] {
        let out = dir.path().join(format!("out.{format}"));
        let command = argv!["export", &deep, "--format", format, "-o", &out];
        assert_one_sentence(&run_bounded(dir.path(), &command, &[]), &command, &["cannot export", expect]);
        assert!(!out.exists());
    }
    let svg = dir.path().join("out.svg");
    let command = argv!["flamegraph", &deep, "-o", &svg];
    assert_one_sentence(&run_bounded(dir.path(), &command, &[]), &command, &["cannot draw", "more than the 512 MiB"]);
}

#[test]
fn a_line_far_past_its_source_lists_only_the_lines_there_are() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("prog.c");
    std::fs::write(&source, "int main() {}\n\nint f() {}\n").unwrap();
    let mut p = small_profile(source.to_str().unwrap());
    p["lines"][1]["line"] = json!(10_000_000);
    let far = dir.path().join("far.profile");
    write_profile(&far, &p);
    let out = dir.path().join("gcov");
    run_bounded_ok(dir.path(), &argv!["gcov", &far, "-o", &out], &[]);
    let gcov = std::fs::read_to_string(out.join("prog.c.gcov")).unwrap();
    // Four header lines, the three of the source, the counted one past it.
    assert_eq!(gcov.lines().count(), 8, "{gcov}");
    assert!(gcov.ends_with("        2:10000000:\n"), "{gcov}");
    let listing = run_bounded_ok(dir.path(), &argv!["report", &far, "--lines"], &[]).stdout;
    assert!(listing.len() < 10_000, "{}", String::from_utf8_lossy(&listing));
}

/// A small deterministic generator (xorshift64*): the same mutations on
/// every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// JSON pointers to every number and every non-empty array of `v`.
fn places(v: &Value, at: String, numbers: &mut Vec<String>, arrays: &mut Vec<String>) {
    match v {
        Value::Number(_) => numbers.push(at),
        Value::Array(items) => {
            if !items.is_empty() {
                arrays.push(at.clone());
            }
            for (i, item) in items.iter().enumerate() {
                places(item, format!("{at}/{i}"), numbers, arrays);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                places(item, format!("{at}/{key}"), numbers, arrays);
            }
        }
        _ => {}
    }
}

/// One mutation of a valid profile file: bytes of its JSON flipped, a
/// number replaced by an extreme, an array element deleted, or the
/// compressed file damaged.
fn mutate(profile: &Value, rng: &mut Rng) -> Vec<u8> {
    let (mut numbers, mut arrays) = (Vec::new(), Vec::new());
    places(profile, String::new(), &mut numbers, &mut arrays);
    let mut v = profile.clone();
    match rng.below(6) {
        0 => {
            let mut text = serde_json::to_vec(&v).unwrap();
            for _ in 0..=rng.below(4) {
                let at = rng.below(text.len());
                text[at] ^= 1 << rng.below(8);
            }
            return profile_file(&text);
        }
        1 | 2 => {
            let extremes = [json!(0), json!(1), json!(u32::MAX - 1), json!(u32::MAX), json!(u64::MAX), json!(-1), json!(u64::MAX - 1)];
            let value = extremes[rng.below(extremes.len())].clone();
            *v.pointer_mut(&numbers[rng.below(numbers.len())]).unwrap() = value;
        }
        3 | 4 => {
            let array = v.pointer_mut(&arrays[rng.below(arrays.len())]).unwrap().as_array_mut().unwrap();
            let at = rng.below(array.len());
            array.remove(at);
        }
        _ => {
            let mut file = profile_file(&serde_json::to_vec(&v).unwrap());
            if rng.below(2) == 0 {
                file.truncate(rng.below(file.len()));
            } else {
                let at = 18 + rng.below(file.len() - 18);
                file[at] ^= 1 << rng.below(8);
            }
            return file;
        }
    }
    profile_file(&serde_json::to_vec(&v).unwrap())
}

#[test]
fn mutated_profiles_never_crash_or_hang_a_command() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let binary = Build::c("coverage.c", "-O0").build();
    let good = dir.path().join("good.profile");
    // Lines, samples, a region, two metrics.
    run_ok(
        proftap()
            .args(["run", "--lines", "--sample", "2000", "--region", "r=coverage.c:30-40", "-o"])
            .arg(&good)
            .arg("--")
            .arg(&binary)
            .arg("20"),
    );
    let bytes = std::fs::read(&good).unwrap();
    let header = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let profile: Value = serde_json::from_reader(flate2::read::GzDecoder::new(&bytes[header..])).unwrap();
    let out = dir.path().join("out");
    let mut rng = Rng(0x5eed_f11e);
    let mut outcomes = [0usize; 3];
    for i in 0..210 {
        let file = dir.path().join("mutated.profile");
        std::fs::write(&file, mutate(&profile, &mut rng)).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        // A third of the commands each time: each sees seventy files.
        for command in every_command(&file, &good, &out).iter().skip(i % 3).step_by(3) {
            let ended = run_bounded(dir.path(), command, &[]);
            match ended.code {
                Some(0) => outcomes[0] += 1,
                Some(1) if command[0] == "diff" => outcomes[1] += 1,
                _ => {
                    let last = ended.stderr.trim_end().lines().last().unwrap_or_default();
                    assert!(last.starts_with("proftap: "), "proftap {command:?} ({:?}): {}", ended.code, ended.stderr);
                    assert!(ended.stderr.lines().all(|l| l.starts_with("proftap: ")), "proftap {command:?}: {}", ended.stderr);
                    outcomes[2] += 1;
                }
            }
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
    // Most mutations break the file, some leave a profile that renders.
    eprintln!("succeeded, regressed, refused: {outcomes:?}");
    assert!(outcomes[0] > 100 && outcomes[2] > 100, "succeeded, regressed, refused: {outcomes:?}");
}

#[test]
fn gcov_writes_only_in_its_directory_and_reads_sources_as_the_invoking_user() {
    require_probes();
    let _alone = alone();
    use std::os::unix::fs::{PermissionsExt, symlink};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (visible, secret, fifo) = (dir.path().join("visible.c"), dir.path().join("secret.c"), dir.path().join("fifo.c"));
    std::fs::write(&visible, "int visible;\n").unwrap();
    std::fs::write(&secret, "int secret;\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut p = small_profile("prog.c");
    let sources = ["/", "/etc/..", "/etc/shadow", visible.to_str().unwrap(), secret.to_str().unwrap(), fifo.to_str().unwrap()];
    p["lines"] = sources.iter().map(|file| json!({ "file": file, "line": 1, "count": 1, "cost": [1] })).collect();
    let profile = dir.path().join("p.profile");
    write_profile(&profile, &p);
    let out = dir.path().join("new/gcov");
    let started = std::time::SystemTime::now();
    let gcov = argv!["gcov", &profile, "-o", &out];
    let as_nobody = [("SUDO_UID", "65534"), ("SUDO_GID", "65534")];
    let ended = run_bounded_ok(dir.path(), &gcov, &as_nobody);

    // Created, and only it written, whatever the profile names.
    assert_eq!(entries(&out), vec!["etc#^.gcov", "fifo.c.gcov", "secret.c.gcov", "shadow.gcov", "visible.c.gcov"]);
    let printed = String::from_utf8(ended.stdout).unwrap();
    assert!(printed.lines().all(|l| Path::new(l).parent() == Some(out.as_path())), "{printed}");
    for outside in ["/.gcov", "/etc/...gcov", "/etc/shadow.gcov"] {
        let modified = std::fs::metadata(outside).and_then(|m| m.modified());
        assert!(modified.map_or(true, |m| m < started), "{outside} was written");
    }
    // Sources read as user nobody: what nobody cannot read is not copied.
    let text = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    assert!(text("visible.c.gcov").contains("1:    1:int visible;"), "{}", text("visible.c.gcov"));
    assert!(!text("secret.c.gcov").contains("int secret"));
    assert!(!text("shadow.gcov").contains("root:"));
    for warning in [
        "cannot read \"/etc/shadow\" (Permission denied",
        "secret.c\" (Permission denied",
        "fifo.c\" (it is not a regular file)",
        "1 source file has no .gcov file, the name being empty, too long or taken by another: \"/\"",
    ] {
        assert!(ended.stderr.contains(warning), "expected '{warning}' in {}", ended.stderr);
    }
    let modes: Vec<u32> = entries(&out).iter().map(|n| std::fs::metadata(out.join(n)).unwrap().permissions().mode() & 0o777).collect();
    assert!(modes.iter().all(|&m| m == modes[0] && m & 0o644 == 0o644 & m && m & 0o600 == 0o600), "{modes:?}");

    // A link planted in the directory is replaced, not written through;
    // root itself reads what root may.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::fs::remove_file(out.join("secret.c.gcov")).unwrap();
    symlink(&victim, out.join("secret.c.gcov")).unwrap();
    run_bounded_ok(dir.path(), &gcov, &[]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!std::fs::symlink_metadata(out.join("secret.c.gcov")).unwrap().file_type().is_symlink());
    assert!(text("secret.c.gcov").contains("int secret;"));
    // The source listing reads sources the same way and never waits on the FIFO.
    let listing = run_bounded_ok(dir.path(), &argv!["report", &profile, "--lines"], &as_nobody);
    let listing = String::from_utf8(listing.stdout).unwrap();
    assert!(listing.contains("int visible;") && !listing.contains("int secret;"), "{listing}");
}

/// `annotate` of a function only samples name opens the module the
/// profile says holds it, to read its declaration: as the user who ran
/// proftap, and only a regular file, whatever the profile names.
#[test]
fn annotate_reads_a_modules_debug_info_as_the_invoking_user() {
    require_probes();
    let _alone = alone();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (source, secret, fifo) = (dir.path().join("mix.c"), dir.path().join("secret"), dir.path().join("fifo"));
    std::fs::write(&source, "static inline __attribute__((always_inline)) int mix(int x) { return x * 7 + 1; }\nint main(int c, char **v) { return mix(c) == 0 && v; }\n").unwrap();
    run_ok(Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&secret).arg(&source));
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let annotated = |module: &Path, env: &[(&str, &str)]| {
        let mut p = small_profile("prog.c");
        p["samples"]["frames"] =
            json!([{ "name": "main", "module": module, "inlined": false }, { "name": "mix", "module": module, "inlined": true }]);
        let profile = dir.path().join("p.profile");
        write_profile(&profile, &p);
        let ended = run_bounded(dir.path(), &argv!["annotate", "mix", &profile, "--no-pager"], env);
        assert_ne!(ended.code, Some(0), "{}", ended.stderr);
        ended.stderr
    };
    let as_nobody = [("SUDO_UID", "65534"), ("SUDO_GID", "65534")];
    let said = annotated(&secret, &as_nobody);
    assert!(
        said.contains(&format!("mix is named by the samples only, and cannot read {}", secret.display()))
            && said.contains("Permission denied"),
        "{said}"
    );
    // Root reads it, finds mix declared in mix.c, and has no sample on its lines.
    let said = annotated(&secret, &[]);
    assert!(said.contains(&format!("no line of mix ({}, lines 1 to 1)", source.display())), "{said}");
    // A FIFO is not opened (nor waited on), nor a directory.
    assert!(annotated(&fifo, &[]).contains("is not a regular file"));
    assert!(annotated(Path::new("/etc"), &[]).contains("/etc is not a regular file"));
}

#[test]
fn outputs_go_to_standard_output_devices_fifos_and_through_links() {
    let _alone = alone();
    use std::os::unix::fs::{FileTypeExt, symlink};
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.profile");
    write_profile(&good, &small_profile("prog.c"));
    let folded = |out: &Path| argv!["export", &good, "--format", "folded", "-o", &out];
    let svg = |out: &Path| argv!["flamegraph", &good, "-o", &out];

    // `-` and /dev/stdout (a pipe here) are standard output; /dev/null stays a device.
    let ended = run_bounded_ok(dir.path(), &folded(Path::new("-")), &[]);
    assert_eq!(String::from_utf8(ended.stdout).unwrap(), "main 1\nmain;f 2\n");
    let piped = run_ok(proftap().args(folded(Path::new("/dev/stdout"))));
    assert_eq!(piped, "main 1\nmain;f 2\n");
    run_bounded_ok(dir.path(), &svg(Path::new("/dev/null")), &[]);
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    let merged = run(proftap().arg("merge").arg(&good).arg(&good).args(["-o", "-"]));
    assert!(merged.status.success() && merged.stdout.starts_with(b"proftap-profile 2\n"));
    assert_eq!(entries(dir.path()), vec!["good.profile", "stderr", "stdout"]);

    // A FIFO is written into, not replaced.
    let fifo = dir.path().join("fifo.svg");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    run_bounded_ok(dir.path(), &svg(&fifo), &[]);
    assert!(reader.join().unwrap().starts_with("<?xml"));
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());

    // A link is written through to its file and stays a link.
    let (links, files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let real = files.path().join("real.svg");
    std::fs::write(&real, "old").unwrap();
    symlink(&real, links.path().join("out.svg")).unwrap();
    run_bounded_ok(dir.path(), &svg(&links.path().join("out.svg")), &[]);
    assert!(std::fs::symlink_metadata(links.path().join("out.svg")).unwrap().file_type().is_symlink());
    assert!(std::fs::read_to_string(&real).unwrap().starts_with("<?xml"));
    assert_eq!((entries(links.path()), entries(files.path())), (vec!["out.svg".to_string()], vec!["real.svg".to_string()]));

    // Links planted at the temporary names a writer might pick are never
    // written through: the old `.NAME.PID.tmp` for the next few hundred
    // process ids, and the obvious others.
    let planted = tempfile::tempdir().unwrap();
    let victim = planted.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let pid = std::process::id();
    let mut names: Vec<String> = (pid..pid + 500).map(|p| format!(".out.svg.{p}.tmp")).collect();
    names.extend([".out.svg.tmp", "out.svg.tmp", ".out.svg", "out.svg~"].map(String::from));
    for name in &names {
        symlink(&victim, planted.path().join(name)).unwrap();
    }
    run_bounded_ok(dir.path(), &svg(&planted.path().join("out.svg")), &[]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(entries(planted.path()).len(), names.len() + 2);
    assert!(std::fs::read_to_string(planted.path().join("out.svg")).unwrap().starts_with("<?xml"));

    // Failures leave nothing behind.
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir(empty.path().join("sub")).unwrap();
    let command = svg(&empty.path().join("sub"));
    assert_one_sentence(&run_bounded(dir.path(), &command, &[]), &command, &["sub: it is a directory"]);
    let command = svg(Path::new("/dev/full"));
    assert_one_sentence(&run_bounded(dir.path(), &command, &[]), &command, &["cannot write /dev/full"]);
    assert_eq!(entries(empty.path()), vec!["sub"]);
}

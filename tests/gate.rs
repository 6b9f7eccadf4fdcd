//! The regression gate: `proftap diff` on builds of examples/regress.c
//! that differ by a constant, `run --repeat`, and `proftap check` budgets
//! read back by a JUnit XML parser.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// The tests of this file, one at a time: they compare timings.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// examples/regress.c built with `flags` as DIR/SIDE/regress: both builds
/// of a comparison carry the program's name.
fn build(dir: &Path, side: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(side).join("regress");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut build = Build::c("regress.c", "-O2");
    for flag in flags {
        build = build.flag(flag);
    }
    build.compile_to(&out);
    out
}

/// Records `program MODE` into DIR/NAME with proftap's defaults.
fn record(program: &Path, mode: &str, dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(name);
    run_ok(proftap().arg("run").arg("-o").arg(&file).arg(program).arg(mode));
    file
}

/// `proftap diff ARGS --format json`: its exit status and verdicts by name.
fn diff(args: &[&Path], options: &[&str]) -> (Option<i32>, Value) {
    let out = run(proftap().arg("diff").args(args).args(options).args(["--format", "json"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some_and(|c| c < 2), "diff failed: {stderr}");
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap())
}

fn change<'a>(diff: &'a Value, name: &str) -> &'a Value {
    diff["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("{name} in {diff}"))
}

#[test]
fn functions_called_a_few_times_are_judged_call_by_call() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let before = record(&build(dir.path(), "before", &[]), "few", dir.path(), "before.profile");
    // Four times the work per call: this VM runs whole processes up to 1.7
    // times slower now and then (CPU time too), which can hide a doubling.
    let after = record(&build(dir.path(), "after", &["-DBURN_UNITS=80"]), "few", dir.path(), "after.profile");
    // CPU time: a busy machine preempts a run and lengthens its calls'
    // wall time, not the time they spend on a CPU.
    let (status, json) = diff(&[&before, &after], &["--threshold", "25", "--metric", "cpu"]);
    assert_eq!(status, Some(1), "{json}");
    for name in ["burn", "middle", "outer", "main"] {
        let c = change(&json, name);
        assert_eq!((c["verdict"].as_str(), c["reason"].as_str()), (Some("regressed"), Some("every_call")), "{c}");
    }
    assert_eq!(change(&json, "burn")["calls"], serde_json::json!([3, 3]));
    assert!(json["builds"].is_array(), "the two builds are named: {json}");
    // Both ways: the faster build improved.
    let (status, json) = diff(&[&after, &before], &["--threshold", "25", "--metric", "cpu"]);
    assert_eq!((status, change(&json, "burn")["verdict"].as_str()), (Some(0), Some("improved")));
}

#[test]
fn unchanged_runs_with_few_calls_pass_on_a_loaded_machine() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "same", &[]);
    // Another program's work on one of the two cores while both are recorded.
    let stop = AtomicBool::new(false);
    let (first, second) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        });
        let first = record(&program, "few", dir.path(), "first.profile");
        let second = record(&program, "few", dir.path(), "second.profile");
        stop.store(true, Ordering::Relaxed);
        (first, second)
    });
    // The threshold this host's swings of whole runs call for: up to 2.01
    // times, when the program shares one core with the other.
    let (status, json) = diff(&[&first, &second], &["--threshold", "150"]);
    assert_eq!(status, Some(0), "{json}");
    assert!(json["builds"].is_null(), "{json}");
}

#[test]
fn a_tiny_function_is_judged_against_its_own_engines_cost() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let before = record(&build(dir.path(), "before", &[]), "tiny", dir.path(), "before.profile");
    let after = record(&build(dir.path(), "after", &["-DTINY_SPIN=2400"]), "tiny", dir.path(), "after.profile");
    let (status, json) = diff(&[&before, &after], &[]);
    assert_eq!(status, Some(1), "{json}");
    let tiny = change(&json, "tiny");
    assert_eq!(tiny["verdict"], "regressed", "{tiny}");
    // The floor is the in-process engine's cost of a call, not a uprobe's.
    let injected = report_json(&after)["overhead"]["call_ns_injected"].as_u64().unwrap();
    assert_eq!(tiny["floor"].as_u64(), Some(injected.max(1)), "{tiny}");
    assert!(injected < 1_000, "{injected}");
    // A metric the profiles lack is an error (2), not a verdict.
    let out = run(proftap().arg("diff").arg(&before).arg(&after).args(["--metric", "page-faults"]));
    assert_clean_failure(&out, "has no metric 'page_faults'");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn profiles_of_different_programs_are_refused_unless_forced() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let regress = record(&build(dir.path(), "one", &[]), "few", dir.path(), "regress.profile");
    let calls = dir.path().join("calls.profile");
    run_ok(proftap().arg("run").arg("-o").arg(&calls).arg(Build::c("calls.c", "-O2").build()));
    let out = run(proftap().arg("diff").arg(&regress).arg(&calls));
    assert_clean_failure(&out, "different programs");
    assert_eq!(out.status.code(), Some(2));
    let out = run(proftap().arg("diff").arg(&regress).arg(&calls).arg("--force"));
    assert!(out.status.code().is_some_and(|c| c < 2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Records `program runs` 5 times into DIR (with --repeat), counting page
/// faults: each call of steady() faults 20 pages in, slowed() 20 or 22.
fn repeated(program: &Path, dir: &Path) {
    let out = run(proftap()
        .args(["run", "--repeat", "5", "-f", "slowed", "-f", "steady", "-e", "wall,page-faults", "-o"])
        .arg(dir)
        .arg(program)
        .arg("runs"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("5 runs recorded"));
}

#[test]
fn repeated_runs_are_judged_on_an_interval() {
    require_probes();
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let (base, new) = (dir.path().join("base.runs"), dir.path().join("new.runs"));
    repeated(&build(dir.path(), "before", &[]), &base);
    repeated(&build(dir.path(), "after", &["-DSLOWED_PCT=110"]), &new);
    assert_eq!(std::fs::read_dir(&base).unwrap().count(), 5);
    let (status, json) = diff(&[&base, &new], &["--metric", "page-faults", "--threshold", "5"]);
    assert_eq!(json["runs"], serde_json::json!([5, 5]));
    assert_eq!(status, Some(1), "{json}");
    let slowed = change(&json, "slowed");
    assert_eq!((slowed["verdict"].as_str(), slowed["reason"].as_str()), (Some("regressed"), Some("runs_differ")), "{slowed}");
    let ratio = &slowed["ratio"];
    assert!(ratio["low"].as_f64().unwrap() > 1.0 && (ratio["estimate"].as_f64().unwrap() - 1.1).abs() < 0.03, "{ratio}");
    assert_eq!(change(&json, "steady")["verdict"], "unchanged");

    // The same runs named one by one, the new ones after `--`.
    let files = |dir: &Path| {
        let mut f: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        f.sort();
        f
    };
    let mut args: Vec<PathBuf> = files(&base);
    args.push("--".into());
    args.extend(files(&new));
    // Options come before the profiles: after `--`, every word is a profile.
    let out = run(proftap().arg("diff").args(["--metric", "page-faults", "--threshold", "5"]).args(&args));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("REGRESSED: slowed"), "{}", String::from_utf8_lossy(&out.stdout));

    // A directory of runs is not written over.
    let again = run(proftap().args(["run", "--repeat", "2", "-o"]).arg(&base).arg(build(dir.path(), "before", &[])).arg("runs"));
    assert_clean_failure(&again, "already holds profiles");
}

#[test]
fn budgets_are_checked_and_reported_as_junit() {
    require_probes();
    require("python3", "to read JUnit XML back with junitparser");
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let profile = record(&build(dir.path(), "b", &[]), "few", dir.path(), "few.profile");
    let budgets = dir.path().join("budgets.toml");
    std::fs::write(
        &budgets,
        "[function.burn]\ncalls = 3\nwall.average = \"10s\"\n\n[function.main]\nwall.max = \"1ns\"\n\n[function.absent]\ncalls = 1\n",
    )
    .unwrap();
    let junit = dir.path().join("budgets.xml");
    let out = run(proftap().arg("check").arg(&profile).arg("--budget").arg(&budgets).arg("--junit").arg(&junit));
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("4 budgets: 2 held, 2 broken"), "{text}");
    // A real JUnit reader sees a case per budget and which failed.
    let script = "import sys, junitparser\n\
                  xml = junitparser.JUnitXml.fromfile(sys.argv[1])\n\
                  for suite in xml:\n\
                  \x20   for case in suite:\n\
                  \x20       print(case.name, 'passed' if case.is_passed else 'failed')\n";
    let read = run_ok(Command::new("python3").args(["-c", script]).arg(&junit));
    assert_eq!(
        read.lines().collect::<Vec<_>>(),
        [
            "function burn: calls passed",
            "function burn: wall time average passed",
            "function main: wall time max failed",
            "function absent: calls failed"
        ],
        "{read}"
    );
    // Within every budget: exit 0.
    std::fs::write(&budgets, "[function.burn]\ncalls = 3\nwall.share = \"100%\"\n").unwrap();
    let out = run(proftap().arg("check").arg(&profile).arg("-b").arg(&budgets).args(["--format", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    // A malformed file is an error (2) that names the mistake.
    std::fs::write(&budgets, "[function.burn]\nwall.mean = \"1ms\"\n").unwrap();
    let out = run(proftap().arg("check").arg(&profile).arg("-b").arg(&budgets));
    assert_clean_failure(&out, "'mean' is not average, max, total or share");
}

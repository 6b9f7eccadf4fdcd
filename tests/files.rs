//! Profile files across commands: merging runs, comparing them with
//! `proftap diff`, and what a damaged file says.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::path::{Path, PathBuf};

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
fn diff_names_a_function_that_doubled_and_passes_identical_runs() {
    if !can_probe() {
        return;
    }
    let _alone = alone();
    let binary = Build::c("workload.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let base = record(&binary, "1", dir.path(), "base.profile");
    let again = record(&binary, "1", dir.path(), "again.profile");
    let slower = record(&binary, "2", dir.path(), "slower.profile");

    // The same workload twice: no alarm (at a threshold above this VM's
    // run-to-run noise on 50 us calls, up to a fifth).
    let out = run(proftap().arg("diff").arg(&base).arg(&again).args(["--threshold", "30"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no regression"));

    // scaled() does twice the work per call: named, exit status 1. (steady()
    // does the same work, but what runs around it changed, so its caches
    // may have too: the test does not judge it.)
    let out = run(proftap().arg("diff").arg(&base).arg(&slower));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let verdict = text.lines().find(|l| l.contains("REGRESSED: ")).unwrap_or_default();
    assert!(verdict.split(": ").nth(1).is_some_and(|names| names.split(", ").any(|n| n == "scaled")), "{text}");

    // The other way round scaled() improved.
    let out = run(proftap().arg("diff").arg(&slower).arg(&base).args(["--format", "json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let scaled = json["functions"].as_array().unwrap().iter().find(|f| f["name"] == "scaled").unwrap();
    assert_eq!(scaled["verdict"], "improved", "{scaled}");
    assert_eq!(scaled["calls"], serde_json::json!([100, 100]));

    // A metric the profiles lack is an error (2), not a verdict.
    let out = run(proftap().arg("diff").arg(&base).arg(&slower).args(["--metric", "page-faults"]));
    assert_clean_failure(&out, "has no metric 'page_faults'");
}

#[test]
fn merged_runs_add_up() {
    if !can_probe() {
        return;
    }
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
    if !can_probe() {
        return;
    }
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
    if !can_probe() || !have("go", "to read the pprof export") {
        return;
    }
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

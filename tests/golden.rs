//! Golden tests of every aggregation rule: saved event streams of real
//! recordings (both engines; threads, exceptions, longjmp, recursion, line
//! counts, stack samples) replayed through the aggregator and the assembly,
//! and their text and JSON reports compared with the committed ones
//! (`tests/golden/NAME/`). A change to a rule shows as a difference here.
//! `PROFTAP_BLESS=1` writes the reports anew; `scripts/save-golden.sh`
//! records the streams again (root).
#![allow(clippy::unwrap_used)]

use proftap_cli::report::text::{TextOptions, render};
use proftap_cli::report::{SortKey, json};
use proftap_record::saved::SavedRecording;
use std::path::{Path, PathBuf};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// The reports of the profile a saved stream replays into.
fn reports(events: &Path) -> (String, String) {
    let file = std::fs::File::open(events).unwrap_or_else(|e| panic!("cannot open {}: {e}", events.display()));
    let saved = SavedRecording::load(std::io::BufReader::new(file)).unwrap_or_else(|e| panic!("{}: {e}", events.display()));
    let mut profile = saved.replay();
    // Replaying is a function of the stream.
    assert_eq!(json::report(&saved.replay()), json::report(&profile), "{}: two replays differ", events.display());
    // The streams name the sources where they were recorded; the listing
    // reads them from this checkout's examples/ (tests run in tests/).
    for line in &mut profile.lines {
        if let Some(name) = line.file.rsplit_once("/examples/").map(|(_, name)| name.to_string()) {
            line.file = format!("../examples/{name}");
        }
    }
    let options = TextOptions {
        sort: SortKey::Incl,
        top: None,
        tree: true,
        threads: true,
        metrics: Vec::new(),
        lines: !profile.lines.is_empty(),
        depth: None,
        min_share: 0.0,
        width: None,
    };
    let mut json = serde_json::to_string_pretty(&json::report(&profile)).unwrap();
    json.push('\n');
    (render(&profile, &options), json)
}

/// Compares `actual` with the file `expected`, or writes it there when blessing.
fn compare(expected: &Path, actual: &str) -> Result<(), String> {
    if std::env::var_os("PROFTAP_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(expected, actual).unwrap();
        return Ok(());
    }
    let wanted = std::fs::read_to_string(expected).map_err(|e| format!("{}: {e} (PROFTAP_BLESS=1 writes it)", expected.display()))?;
    if wanted == actual {
        return Ok(());
    }
    let (wanted, actual): (Vec<&str>, Vec<&str>) = (wanted.lines().collect(), actual.lines().collect());
    let first = wanted.iter().zip(&actual).position(|(a, b)| a != b).unwrap_or(wanted.len().min(actual.len()));
    Err(format!(
        "{} differs from the replay at line {}:\n  expected: {}\n  replayed: {}\n(PROFTAP_BLESS=1 accepts the replay)",
        expected.display(),
        first + 1,
        wanted.get(first).unwrap_or(&"<end>"),
        actual.get(first).unwrap_or(&"<end>")
    ))
}

#[test]
fn saved_recordings_replay_into_the_committed_reports() {
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(golden()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    scenarios.sort();
    assert!(scenarios.len() >= 8, "the golden streams are missing: {scenarios:?} (scripts/save-golden.sh records them)");
    let mut failures = Vec::new();
    for dir in &scenarios {
        let (text, json) = reports(&dir.join("events.jsonl"));
        failures.extend(compare(&dir.join("report.txt"), &text).err());
        failures.extend(compare(&dir.join("report.json"), &json).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_engine_and_rule_has_a_stream() {
    let names: Vec<String> = std::fs::read_dir(golden()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for wanted in [
        "calls-uprobe",
        "calls-inject",
        "threads-uprobe",
        "threads-inject",
        "throws-uprobe",
        "throws-inject",
        "lines-uprobe",
        "samples-uprobe",
    ] {
        assert!(names.iter().any(|n| n == wanted), "no golden stream {wanted} in {names:?}");
    }
}

/// A recording's profile is what its saved events replay into: the saved
/// stream holds everything the aggregator and the assembly took.
fn check_a_recording_replays_into_its_profile(engine: &str) {
    check_replay(&["--engine", engine, "--overhead-budget", "0"], ("calls.c", "-O0"), &["300", "10"]);
}

fn check_replay(proftap_args: &[&str], (example, flags): (&'static str, &'static str), args: &[&str]) {
    use proftap_tests::*;
    require_probes();
    let binary = Build::c(example, flags).build();
    let dir = tempfile::tempdir().unwrap();
    let (file, events) = (dir.path().join("p.profile"), dir.path().join("events.jsonl"));
    run_ok(
        proftap()
            .arg("run")
            .args(proftap_args)
            .args(["--sample", "1000", "-o"])
            .arg(&file)
            .arg("--save-events")
            .arg(&events)
            .arg("--")
            .arg(&binary)
            .args(args),
    );
    let recorded = proftap_profile::read_profile(&file).unwrap();
    let saved = SavedRecording::load(std::io::BufReader::new(std::fs::File::open(&events).unwrap())).unwrap();
    assert_eq!(json::report(&saved.replay()), json::report(&recorded), "{proftap_args:?}");
}

#[test]
fn a_uprobe_recording_replays_into_its_profile() {
    check_a_recording_replays_into_its_profile("uprobe");
}

#[test]
fn an_in_process_recording_replays_into_its_profile() {
    check_a_recording_replays_into_its_profile("inject");
}

/// With calls throttled to counting, and samples in the counting stubs
/// (which a replay, naming saved stacks, cannot tell), the same.
#[test]
fn a_throttled_in_process_recording_replays_into_its_profile() {
    let functions = ["-f", "sum_down", "-f", "sum_down_saved"];
    check_replay(&[&["--engine", "inject", "--overhead-budget", "0.5"][..], &functions].concat(), ("looped.c", "-O2"), &["3000000"]);
}

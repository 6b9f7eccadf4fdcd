//! The default mode without `-f`: every function instrumented and the whole
//! program sampled, with an overhead governor removing the probes of
//! functions that cost too much; and `attach --auto-instrument`.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;

/// The governor's tests record one at a time: a probe set is defined and
/// removed under one kernel lock for every tracer, and removing one waits
/// for grace periods, so another test's probes can hold a throttle back
/// until the program has ended (`throttle_unfinished`).
static RECORDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_recording_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    RECORDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_hot_tiny_function_is_throttled_and_the_program_runs_near_full_speed() {
    let _serial = one_recording_at_a_time();
    check_hot_function_throttled(&["--engine", "uprobe"]);
}

#[test]
fn a_hot_tiny_function_is_unpatched_before_its_records_fill_the_rings() {
    let _serial = one_recording_at_a_time();
    check_hot_function_throttled(&["--engine", "inject"]);
}

fn check_hot_function_throttled(engine: &[&str]) {
    require_probes();
    let binary = Build::c("hot.c", "-O2").build();
    // tiny is called 200 million times: instrumented throughout, the
    // program would run for minutes instead of a fraction of a second.
    let args = [binary.to_str().unwrap(), "200"];
    let bare = (0..2)
        .map(|_| {
            let start = Instant::now();
            run_ok(Command::new(&binary).arg("200"));
            start.elapsed()
        })
        .min()
        .unwrap();
    let report = profile_run(engine, &args);
    let functions = &report["functions"];

    let tiny = function(functions, "tiny");
    assert_eq!(tiny["mode"], "throttled", "{tiny}");
    let tiny_calls = tiny["calls"].as_u64().unwrap();
    assert!((1..2_000_000).contains(&tiny_calls), "tiny counted {tiny_calls} calls before its probes went");
    // Sampling covers it after: it is on the stack in a good share of the samples.
    let sampled = report["samples"]["functions"].as_array().unwrap().iter().find(|f| f["name"] == "tiny").unwrap();
    assert!(sampled["total"].as_u64().unwrap() > 0, "{sampled}");

    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    // The cheap function keeps exact counts, and so does main: nothing was lost.
    assert_eq!(report["lost_events"], 0);
    let rare = function(functions, "rare");
    assert_eq!((rare["mode"].as_str(), rare["calls"].as_u64()), (Some("instrumented"), Some(10)));
    let main = function(functions, "main");
    assert_eq!((main["mode"].as_str(), main["calls"].as_u64()), (Some("instrumented"), Some(1)));
    if report["recording"]["engine"] == "uprobe" {
        // main was running when the probes changed: its return probe went
        // with the old set, and it says so instead of passing for an exception.
        assert_eq!((main["unwound"].as_u64(), main["unfinished"].as_u64()), (Some(0), Some(1)));
        assert!(tiny["calls_after_throttle"].is_null(), "uprobes count nothing after: {tiny}");
    } else {
        // Its return comes through proftap's trampoline whatever was unpatched.
        assert_eq!((main["unwound"].as_u64(), main["unfinished"].as_u64()), (Some(0), Some(0)));
        assert_eq!(report["recording"]["engine"], "inject");
        // Counting its calls after the throttle would cost more than the
        // budget too (about as much as a call of it): counting stops, and
        // those counted until then are kept.
        assert!(tiny["calls_after_throttle"].is_null(), "not counted to the end: {tiny}");
        let until = tiny["calls_counted_until_stopped"].as_u64().unwrap_or_else(|| panic!("{tiny}"));
        assert!(tiny["calls"].as_u64().unwrap() + until < 200_000_000, "{tiny}");
        assert!(notes.iter().any(|n| n.contains("stopped counting the calls of tiny")), "{notes:?}");
        // The notes count the calls as each change left them, which the
        // profile's counts go on from (tiny is called all the while).
        let timed = tiny["calls"].as_u64().unwrap();
        assert!(notes.iter().any(|n| n.contains(&format!("removed the probes of tiny ({timed} calls)"))), "{timed}: {notes:?}");
        assert!(notes.iter().any(|n| n.contains(&format!("stopped counting the calls of tiny ({until} calls)"))), "{until}: {notes:?}");
    }
    assert!(notes.iter().any(|n| n.contains("removed the probes of tiny")), "{notes:?}");

    // After the throttle, tiny's time is what the samples say; main, which
    // timed it since, gives that time back from its exclusive time.
    let throttled = report["samples"]["throttled"].as_array().unwrap();
    let tiny_after = throttled.iter().find(|t| t["name"] == "tiny").unwrap_or_else(|| panic!("{throttled:?}"));
    assert!(tiny_after["self"].as_u64().unwrap() > 0, "{tiny_after}");
    let held = report["samples"]["held_by_callers"].as_array().unwrap();
    let main_held: u64 = held.iter().filter(|h| h["name"] == "main").map(|h| h["ns"].as_u64().unwrap()).sum();
    assert!(main_held > 0, "{held:?}");
    for metric in ["wall_ns", "cpu_ns"] {
        let (inclusive, exclusive) = (stat(main, "inclusive", metric, "total"), stat(main, "exclusive", metric, "total"));
        assert!(exclusive <= inclusive.saturating_sub(main_held), "{metric}: main {exclusive} of {inclusive}, held {main_held}");
    }
    assert!(notes.iter().any(|n| n.contains("exclude what their callees not instrumented took")), "{notes:?}");
    // The call tree holds that time too, as tiny's estimated node under
    // main: main's inclusive time is its own and its callees' again.
    let main_node = report["tree"]["children"].as_array().unwrap().iter().find(|c| c["name"] == "main").unwrap();
    let callees = main_node["children"].as_array().unwrap();
    let estimated = callees.iter().find(|c| c["name"] == "tiny" && c["estimated"] == true).unwrap_or_else(|| panic!("{callees:?}"));
    let wall = |node: &serde_json::Value, which: &str| node[which]["wall_ns"].as_u64().unwrap();
    assert_eq!((estimated["calls"].as_u64(), wall(estimated, "inclusive")), (Some(0), wall(estimated, "exclusive")));
    assert!(wall(estimated, "inclusive") > 0, "{estimated}");
    let below: u64 = callees.iter().map(|c| wall(c, "inclusive")).sum();
    assert_eq!(wall(main_node, "exclusive") + below, wall(main_node, "inclusive"), "{main_node}");
    // A small factor of the bare run (plus the probes of the first calls
    // and proftap's own start), where full instrumentation is hundreds.
    let recorded = Duration::from_nanos(report["recording"]["duration_ns"].as_u64().unwrap());
    assert!(recorded < bare * 3 + Duration::from_millis(300), "recorded {recorded:?}, bare run {bare:?}");
}

/// `clear` spends its time in libc's `memset`, which is not instrumented:
/// its exclusive time is its own code's, as perf's self samples count it,
/// and memset's share is in the tree under it, estimated, so the tree
/// still adds up.
#[test]
fn a_library_callees_time_is_taken_out_of_its_callers_exclusive_time() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("split.c", "-O2").build();
    let report = profile_run(&[], &[binary.to_str().unwrap(), "1", "300000"]);
    let clear = function(&report["functions"], "clear");
    assert_eq!(clear["mode"], "instrumented", "{clear}");
    let (inclusive, exclusive) = (stat(clear, "inclusive", "cpu_ns", "total"), stat(clear, "exclusive", "cpu_ns", "total"));
    assert!(exclusive * 4 < inclusive, "clear: exclusive {exclusive} of {inclusive} ns, its memset calls in it");
    let main_node = report["tree"]["children"].as_array().unwrap().iter().find(|c| c["name"] == "main").unwrap();
    let clear_node = main_node["children"].as_array().unwrap().iter().find(|c| c["name"] == "clear").unwrap();
    let callees = clear_node["children"].as_array().unwrap();
    let estimated = callees.iter().find(|c| c["name"].as_str().unwrap().contains("memset"));
    let estimated = estimated.unwrap_or_else(|| panic!("no memset under clear: {callees:?}"));
    assert_eq!((estimated["estimated"].as_bool(), estimated["calls"].as_u64()), (Some(true), Some(0)), "{estimated}");
    let sampled = report["samples"]["functions"].as_array().unwrap().iter().find(|f| f["name"] == estimated["name"]).unwrap();
    assert!(sampled["module"].as_str().unwrap().ends_with("libc.so.6"), "{sampled}");
    let held = report["samples"]["held_by_callers"].as_array().unwrap();
    assert!(held.iter().any(|h| h["name"] == "clear" && h["callee"] == estimated["name"]), "{held:?}");
    let cpu = |node: &serde_json::Value, which: &str| node[which]["cpu_ns"].as_u64().unwrap();
    assert!(cpu(estimated, "inclusive") * 2 > cpu(clear_node, "inclusive"), "{clear_node}");
    let below: u64 = callees.iter().map(|c| cpu(c, "inclusive")).sum();
    assert_eq!(cpu(clear_node, "exclusive") + below, cpu(clear_node, "inclusive"), "{clear_node}");
}

/// The default mode takes the probes' measured cost out of the times (a
/// caller's exclusive time would hold its callees' probes); naming
/// functions, or `--no-compensate`, keeps the times as measured.
#[test]
fn the_default_mode_compensates_and_named_functions_keep_measured_times() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("split.c", "-O2").build();
    let program = [binary.to_str().unwrap(), "1", "10"];
    let compensated = |args: &[&str]| profile_run(args, &program)["overhead"]["compensated"].as_bool().unwrap();
    assert!(compensated(&[]), "the default mode compensates");
    assert!(!compensated(&["--no-compensate"]));
    assert!(!compensated(&["-f", "work_a"]));
    assert!(!compensated(&["--overhead-budget", "10"]));
    assert!(compensated(&["-f", "work_a", "--compensate"]));
}

/// A forked child's calls count toward the budget, and a function the
/// governor throttles is unpatched in the children too: the child here
/// makes 20 million calls of `work`, its parent 10.
#[test]
fn a_function_hot_in_a_forked_child_is_throttled_there() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("forks.c", "-O2").build();
    let report = profile_run(&[], &[binary.to_str().unwrap(), "10", "20000000"]);
    assert_eq!(report["recording"]["engine"], "inject");
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work}");
    let calls = work["calls"].as_u64().unwrap();
    assert!((10..20_000_000).contains(&calls), "work counted {calls} calls before its probes went");
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert!(notes.iter().any(|n| n.contains("removed the probes of work")), "{notes:?}");
    // Both processes were recorded, the parent's 10 calls exact.
    let mut by_pid: std::collections::HashMap<i64, u64> = std::collections::HashMap::new();
    for thread in report["threads"].as_array().unwrap() {
        let calls: u64 =
            thread["functions"].as_array().unwrap().iter().filter(|f| f["name"] == "work").map(|f| f["calls"].as_u64().unwrap()).sum();
        *by_pid.entry(thread["pid"].as_i64().unwrap()).or_default() += calls;
    }
    assert_eq!(by_pid.len(), 2, "{by_pid:?}");
    assert_eq!(by_pid.get(&report["target"]["pid"].as_i64().unwrap()), Some(&10), "{by_pid:?}");
}

/// A throttled function where the program spends its time is the one the
/// report's first line names, with its time after the throttle from its
/// samples: its exact part alone (its first few thousand calls) would
/// leave it far down, as perf would not.
#[test]
fn the_hottest_function_counts_its_time_after_a_throttle() {
    let _serial = one_recording_at_a_time();
    require_probes();
    // A 20% budget, so that counting (2 ns of step's hundred, taken thrice
    // until the counting stubs' own samples are believed) fits in half of
    // it, as the governor aims while the run is over it, on a machine twice
    // as fast too; step's probes (about 45 ns a call) are still over it.
    let (report, text) = recorded(&["--overhead-budget", "20"], &Build::c("busy.c", "-O2").build(), &["3"]);
    let step = function(&report["functions"], "step");
    assert_eq!(step["mode"], "throttled", "{step}");
    // The JSON report carries the same estimate: with it, step's own time
    // passes main's, as the samples have it.
    let main = function(&report["functions"], "main");
    assert!(step["own_cpu_ns_after_throttle"].as_u64().unwrap() > 0 && own_cpu(step) > own_cpu(main), "step {step}, main {main}");
    let hottest = text.lines().nth(1).unwrap();
    assert!(hottest.starts_with("  hottest     step: about ") && hottest.contains("estimated from samples"), "{text}");
    // Its calls after the throttle are counted (a call of it takes a
    // hundred nanoseconds, counting it about 2), in the forked child too,
    // which shares the counters.
    let after = step["calls_after_throttle"].as_u64().unwrap_or_else(|| panic!("not counted after: {step}"));
    assert_eq!(step["calls"].as_u64().unwrap() + after, 3_000_000, "{step}");
    assert!(hottest.contains("3,000,000 calls ("), "{text}");
    let (report, _) = recorded(&["--overhead-budget", "20"], &Build::c("busy.c", "-O2").build(), &["2", "1"]);
    let step = function(&report["functions"], "step");
    let after = step["calls_after_throttle"].as_u64().unwrap_or_else(|| panic!("not counted after: {step}"));
    assert_eq!(step["calls"].as_u64().unwrap() + after, 4_000_000, "parent and child: {step}");
}

/// Without samples, a throttled function's counting is judged too, at
/// its prior cost: counting the calls of a function made 20 million times
/// costs more than the budget, and stops; nothing estimates its calls
/// after, and the profile says its count is a lower bound.
#[test]
fn without_samples_counting_past_the_budget_stops_and_says_the_count_is_a_lower_bound() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let (report, text) = recorded(&["--engine", "inject", "--no-sample"], &Build::c("hot.c", "-O2").build(), &["20"]);
    let tiny = function(&report["functions"], "tiny");
    assert_eq!(tiny["mode"], "throttled", "{tiny}");
    assert!(tiny["calls_after_throttle"].is_null(), "{tiny}");
    let until = tiny["calls_counted_until_stopped"].as_u64().unwrap_or_else(|| panic!("counting did not stop: {tiny}"));
    let counted = tiny["calls"].as_u64().unwrap() + until;
    assert!(counted < 20_000_000, "every call counted, so counting never stopped: {tiny}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("stopped counting the calls of tiny"), "{notes}");
    assert!(notes.contains("not counted (without samples nothing estimates them): their counts are lower bounds"), "{notes}");
    assert_eq!(tiny["calls_after_counting_unknown"], true, "{tiny}");
    let row = format!(
        "tiny  [throttled: timed until its probes were removed, {} more calls counted until its counting stopped; calls are a lower bound]",
        grouped(until)
    );
    assert!(text.lines().any(|l| l.ends_with(&row)), "{row} in\n{text}");
    // Line counts' function counts hold the calls counted until then too.
    let dir = tempfile::tempdir().unwrap();
    let (profile, info) = (dir.path().join("p.profile"), dir.path().join("p.info"));
    let binary = Build::c("hot.c", "-O2").build();
    run_ok(
        proftap()
            .args(["run", "--engine", "inject", "--no-sample", "--lines", "--overhead-budget", "5", "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&binary)
            .arg("20"),
    );
    let report = report_json(&profile);
    let tiny = function(&report["functions"], "tiny");
    let until = tiny["calls_counted_until_stopped"].as_u64().unwrap_or_else(|| panic!("counting did not stop: {tiny}"));
    run_ok(proftap().arg("export").arg(&profile).args(["--format", "lcov", "-o"]).arg(&info));
    let fnda = format!("FNDA:{},tiny", tiny["calls"].as_u64().unwrap() + until);
    let lcov = std::fs::read_to_string(&info).unwrap();
    assert!(lcov.lines().any(|l| l == fnda), "{fnda} in\n{lcov}");
}

/// Two threads calling one function on two CPUs count its calls after its
/// throttle each in its CPU's counter: neither waits for the other's
/// cache line, counting costs them a few nanoseconds of the call's couple
/// of hundred, and every call is counted. (In one shared counter, each
/// call waited 12 to 25 ns for the other CPU, and counting stopped.)
#[test]
fn threads_counting_one_function_on_two_cpus_count_every_call() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(cpus >= 2, "two CPUs are needed for two threads to count at once, this machine has {cpus}");
    assert!(processor_has_rdpid(), "the processor has no rdpid: its CPUs share one counter, and threads wait for each other");
    let (report, _) = recorded(&["--overhead-budget", "10"], &Build::c("contended.c", "-O2").build(), &["5", "200"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work}");
    assert!(!report["notes"].to_string().contains("stopped counting"), "{}", report["notes"]);
    let after = work["calls_after_throttle"].as_u64().unwrap_or_else(|| panic!("not counted after: {work}"));
    assert_eq!(work["calls"].as_u64().unwrap() + after, 10_000_000, "{work}");
    // The counting stubs' share of the samples: a few in a thousand,
    // where a shared counter held about 30% of them.
    let (in_stubs, total) = (report["samples"]["in_counting_stubs"].as_u64().unwrap(), report["samples"]["total"].as_u64().unwrap());
    assert!(in_stubs * 20 < total, "{in_stubs} of {total} samples in the counting stubs");
}

/// Counting a throttled function's calls costs what the samples in its
/// counting stub say, not what a `lock inc` costs in a loop, and past the
/// budget it stops: two threads calling a function of about 50 ns, each
/// call's count about 3 ns on each CPU, over a 4% budget.
#[test]
fn counting_that_costs_more_than_the_budget_stops() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(cpus >= 2, "two CPUs are needed for two threads to count at once, this machine has {cpus}");
    let (report, text) = recorded(&["--overhead-budget", "4"], &Build::c("contended.c", "-O2").build(), &["5", "50"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work}");
    assert!(work["calls_after_throttle"].is_null(), "not counted to the end: {work}");
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    let stopped = notes.iter().find(|n| n.contains("stopped counting the calls of work")).unwrap_or_else(|| panic!("{notes:?}"));
    // The calls counted until counting stopped are kept, not dropped for
    // an estimate over all the time since the throttle.
    let told: u64 = stopped.split("work (").nth(1).and_then(|s| s.split(' ').next()).unwrap().replace(',', "").parse().unwrap();
    let (timed, counted) = (work["calls"].as_u64().unwrap(), work["calls_counted_until_stopped"].as_u64().unwrap());
    assert!(counted >= told && timed + counted < 10_000_000, "{work} {stopped}");
    // The rest are estimated from the samples after counting stopped, at
    // the calls a sample stood for while counted: all together near the
    // 10,000,000 calls made.
    let samples = report["samples"]["throttled"].as_array().unwrap();
    let sampled = samples.iter().find(|t| t["name"] == "work").unwrap();
    assert!(sampled["total_uncounted"].as_u64().unwrap() > 0, "{sampled}");
    match throttled_calls(&text, "work") {
        // Too few samples while it counted to stand for its calls: the
        // counted part and an unknown rest.
        ThrottledCalls::AtLeast(shown) => {
            assert_eq!(shown, counted, "{text}");
            let while_counted = samples_while_counted(&report, "work");
            assert!(while_counted < 10, "{while_counted} samples while counted stand for its calls: {text}");
        }
        // The estimate is the counted calls times a ratio of two sample
        // counts: within four of that ratio's standard deviations (the
        // counts taken as Poisson's) of the calls made after counting stopped.
        ThrottledCalls::About(after) => {
            let while_counted = samples_while_counted(&report, "work") as f64;
            let uncounted = sampled["total_uncounted"].as_u64().unwrap() as f64;
            let made_after = 10_000_000u64.saturating_sub(timed + counted) as f64;
            let estimated = after.saturating_sub(counted) as f64;
            let spread = 4.0 * (1.0 / while_counted + 1.0 / uncounted).sqrt();
            let off = (estimated / made_after).ln().abs();
            assert!(off < spread, "{timed} timed, ~{after} after, {while_counted} samples while counted, {uncounted} after: {text}")
        }
    }
}

/// The samples taken while the calls of throttled function `name` were
/// counted, outside its counting stub: what stands for its calls.
fn samples_while_counted(report: &serde_json::Value, name: &str) -> u64 {
    let sampled = report["samples"]["throttled"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap();
    let count = |key: &str| sampled[key].as_u64().unwrap_or_else(|| panic!("{key} of {sampled}"));
    count("total") - count("total_uncounted") - count("in_counting_stub")
}

/// The calls the report's table of throttled functions gives `name`.
enum ThrottledCalls {
    /// `~N`: counted, then estimated.
    About(u64),
    /// `N+?`: counted until counting stopped, the rest unknown.
    AtLeast(u64),
}

fn throttled_calls(text: &str, name: &str) -> ThrottledCalls {
    let row = text
        .lines()
        .skip_while(|l| !l.starts_with("Throttled functions"))
        .find(|l| l.ends_with(&format!("  {name}")))
        .unwrap_or_else(|| panic!("no row of {name}: {text}"));
    let calls = row.split_whitespace().next().unwrap();
    let number = |digits: &str| digits.replace(',', "").parse::<u64>().unwrap_or_else(|_| panic!("{row}"));
    match (calls.strip_prefix('~'), calls.strip_suffix("+?")) {
        (Some(about), _) => ThrottledCalls::About(number(about)),
        (_, Some(at_least)) => ThrottledCalls::AtLeast(number(at_least)),
        _ => panic!("neither estimated nor a lower bound: {row}"),
    }
}

/// A forked child proftap cannot hold (its parent traces it) keeps the
/// probes it forked with while the parent's are taken out: its calls stay
/// timed, and only the parent's are counted, then estimated from the
/// samples. Timed, counted and estimated add up to the calls of both, none
/// counted twice: the child's samples, taken through its probes, are not
/// estimated again.
#[test]
fn the_calls_of_a_child_that_cannot_be_held_are_timed_and_the_rest_add_up() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(cpus >= 2, "two CPUs are needed for two threads to count at once, this machine has {cpus}");
    let args = ["5", "200", "traced-child"];
    let (report, text) = recorded(&["--overhead-budget", "10"], &Build::c("contended.c", "-O2").build(), &args);
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work}");
    let notes = report["notes"].to_string();
    // The child's 10,000,000 calls, and the parent's before its throttle.
    let timed = work["calls"].as_u64().unwrap();
    assert!((10_000_000..14_000_000).contains(&timed), "{work}");
    if !notes.contains("stopped counting the calls of work") {
        // Counting the parent's threads' calls stayed within the budget
        // (as it does with a counter per CPU): every call after the
        // throttle was counted, none estimated.
        let counted = work["calls_after_throttle"].as_u64().unwrap_or_else(|| panic!("{work} {notes}"));
        assert_eq!(timed + counted, 20_000_000, "{work}");
        return;
    }
    let counted = work["calls_counted_until_stopped"].as_u64().unwrap();
    // The row's calls are those counted until counting stopped and those
    // estimated after; or with too few samples while it counted, the
    // counted part and an unknown rest, none counted twice.
    let after = match throttled_calls(&text, "work") {
        ThrottledCalls::About(after) => after,
        ThrottledCalls::AtLeast(shown) => {
            assert_eq!(shown, counted, "{text}");
            let while_counted = samples_while_counted(&report, "work");
            assert!(while_counted < 10, "{while_counted} samples while counted stand for its calls: {text}");
            assert!(timed + counted < 20_000_000, "{timed} timed and {counted} counted, of 20,000,000");
            return;
        }
    };
    assert!(after >= counted, "~{after} after the throttle, fewer than the {counted} counted: {text}");
    // The estimate is the samples' (a busy machine moves it): within 30%,
    // where the child counted twice would make 30,000,000, and lost 10,000,000.
    let all = timed + after;
    assert!((14_000_000..26_000_000).contains(&all), "{timed} timed, {counted} counted, ~{after} after the throttle, of 20,000,000");
}

/// A forked child's first call makes its memory, and proftap takes it
/// over a socket: its other threads' calls meanwhile wait for it and are
/// counted there, none lost (the second of the child's two threads here
/// starts calling while the first makes the memory).
#[test]
fn every_call_of_a_forked_childs_threads_is_counted_while_it_makes_its_memory() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let args = ["1", "200", "traced-child"];
    let (report, _) = recorded(&["--overhead-budget", "0", "--no-sample", "-f", "work"], &Build::c("contended.c", "-O2").build(), &args);
    let work = function(&report["functions"], "work");
    assert_eq!(work["calls"], 4_000_000, "two processes of two threads, a million calls each: {work}");
    assert_eq!(report["processes"].as_array().map(Vec::len), Some(2), "{}", report["processes"]);
}

/// Two threads of a forked child that share one thread pointer (a raw
/// `clone` without a thread-local storage of its own) make their first
/// calls at once, in the memory the child made at the `clone`: one takes
/// their seat's block while the other waits for it, and every call of
/// both is counted (hundreds went uncounted, put down to no function,
/// when the other went on meanwhile).
#[test]
fn every_call_of_a_forked_childs_threads_sharing_a_thread_pointer_is_counted() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let (report, _) =
        recorded(&["--overhead-budget", "0", "--no-sample", "-f", "work"], &Build::c("rawclone.c", "-O2").build(), &["forked", "1000000"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["calls"], 2_000_000, "two threads, a million calls each: {work} {}", report["notes"]);
    assert_eq!(report["processes"].as_array().map(Vec::len), Some(2), "{}", report["processes"]);
}

/// A call in progress at a fork (`main`'s) goes on in the child too, and
/// is timed to its end there, whichever of the child's threads first
/// calls into the runtime: here not the forking thread, which only makes
/// threads and waits.
#[test]
fn a_call_in_progress_at_a_fork_is_timed_in_the_child_whichever_thread_calls_first() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let args = ["1", "200", "traced-child"];
    let flags = ["--overhead-budget", "0", "--no-sample", "-f", "main", "-f", "work"];
    let (report, _) = recorded(&flags, &Build::c("contended.c", "-O2").build(), &args);
    let notes = report["notes"].to_string();
    assert!(!notes.contains("found no frame"), "the child's main returned with no frame of its own: {notes}");
    // The parent's main and the child's each last as long as their two
    // threads' calls of work, which run side by side: half of work's
    // time, where the parent's alone would be a quarter.
    let wall = |name: &str| function(&report["functions"], name)["inclusive"]["wall_ns"]["total"].as_u64().unwrap();
    assert!(wall("main") * 10 > wall("work") * 4, "main {} ns, work {} ns", wall("main"), wall("work"));
}

/// `proftap run ARGS -- BINARY BINARY_ARGS`: its JSON report and its text report.
fn recorded(args: &[&str], binary: &std::path::Path, binary_args: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    run_ok(proftap().arg("run").args(args).arg("-o").arg(&file).arg("--").arg(binary).args(binary_args));
    (report_json(&file), run_ok(proftap().arg("report").arg(&file).arg("--no-pager")))
}

/// A function's exclusive CPU time, measured and estimated after a throttle.
fn own_cpu(f: &serde_json::Value) -> u64 {
    f["exclusive"]["cpu_ns"]["total"].as_u64().unwrap() + f["own_cpu_ns_after_throttle"].as_u64().unwrap()
}

/// A throttled function's call under way when its probes were removed is
/// timed to its end: what the calls below it took after the throttle is
/// in its measured exclusive time, and the samples give it back to where
/// it was spent (the calls of `walk` below the outermost one, and `leaf`).
/// Given back to `main` instead, it stayed `walk`'s.
#[test]
fn a_call_timed_past_its_functions_throttle_gives_back_its_callees_time() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let (report, text) = recorded(&[], &Build::c("nested.c", "-O2").build(), &[]);
    let (walk, leaf) = (function(&report["functions"], "walk"), function(&report["functions"], "leaf"));
    assert_eq!((walk["mode"].as_str(), leaf["mode"].as_str()), (Some("throttled"), Some("throttled")), "{walk} {leaf}");
    assert!(own_cpu(leaf) > 2 * own_cpu(walk), "leaf {leaf}, walk {walk}");
    assert!(text.lines().nth(1).unwrap().starts_with("  hottest     leaf: "), "{text}");
}

/// Sampling off, under the governor: a function the engine cannot patch
/// gets no kernel probe (microseconds a call, and a grace period per probe
/// to take it out at the end), and the report says it is not measured; the
/// first line says the hottest function's own time holds that of callees
/// whose probes were removed, since no sample tells them apart.
#[test]
fn without_samples_the_governor_gives_what_it_cannot_patch_no_kernel_probe() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("short.c", "-O2").build();
    let (report, text) = recorded(&["--no-sample"], &binary, &["3"]);
    let functions = report["functions"].as_array().unwrap();
    assert_eq!(function(&report["functions"], "step")["mode"], "throttled", "{}", report["functions"]);
    assert!(functions.iter().all(|f| f["name"] != "twice"), "twice was probed: {}", report["functions"]);
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("1 function could not be patched and is not measured: its time counts in its callers'") && notes.contains("twice"),
        "{notes}"
    );
    let hottest = text.lines().nth(1).unwrap();
    assert!(hottest.contains("with the time of callees whose probes were removed"), "{text}");
    // Named, under a budget asked for: it keeps the uprobe it was asked for.
    let (report, _) = recorded(&["-f", "twice", "-f", "step", "--overhead-budget", "5", "--no-sample"], &binary, &["0.01"]);
    assert!(function(&report["functions"], "twice")["calls"].as_u64().unwrap() > 0, "{}", report["functions"]);
    assert!(report["notes"].to_string().contains("1 function could not be patched and is probed by uprobes"), "{}", report["notes"]);
}

/// A function whose first instruction the kernel will not probe (a
/// segment prefix: it skips such a probe without a word when the probes go
/// in before the launch, and refuses it in a running program) is named and
/// left out, and the governor goes on with the rest. Before, the first
/// throttle's new probe set failed on it, the old set was gone with it, and
/// `work` stopped being counted, still marked as if exact.
#[test]
fn a_function_the_kernel_cannot_probe_is_named_and_the_others_governed() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("segprefix.c", "-O2").build();
    let args = ["--engine", "uprobe", "--no-sample", "-f", "odd", "-f", "work", "--overhead-budget", "5"];
    let (report, _) = recorded(&args, &binary, &["100000"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work} {}", report["notes"]);
    let notes = report["notes"].to_string();
    assert!(notes.contains("not measured: odd (the kernel refuses a uprobe on its first instruction"), "{notes}");
    assert!(!notes.contains("could not remove the probes"), "{notes}");
    // A line of main's is one lock-prefixed instruction: it is named and
    // shows no count (not 0), and the new probe sets leave it out. Before,
    // its probe failed the governor's new set. (The loop's line starts at
    // the same address when there are no threads, so it is named too.)
    let lines = ["--engine", "uprobe", "--no-sample", "--lines", "--line-times", "-f", "main", "-f", "work", "--overhead-budget", "5"];
    let (report, _) = recorded(&lines, &binary, &["100000"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["mode"], "throttled", "{work} {}", report["notes"]);
    let source = std::fs::read_to_string(examples().join("segprefix.c")).unwrap();
    let atomic = 1 + source.lines().position(|l| l.trim_start().starts_with("__atomic_fetch_add")).unwrap() as u64;
    let counted = |line: u64| report["lines"].as_array().unwrap().iter().find(|l| l["line"] == line).map(|l| l["count"].as_u64().unwrap());
    assert_eq!((counted(atomic), counted(atomic + 1)), (None, Some(1)), "{}", report["lines"]);
    let notes = report["notes"].to_string();
    assert!(notes.contains(&format!("segprefix.c:{atomic}")) && notes.contains("show no count: the kernel refuses a uprobe"), "{notes}");
}

/// Under a budget, the uprobes on a function's lines count as its cost:
/// `main`, called once, hits its loop's lines hundreds of thousands of
/// times, and loses its probes with them. Its lines' counts are then what
/// was seen until then, and say so; the overhead estimate counts each line
/// hit. Before, the governor judged calls alone: `main` kept every line
/// probe, the run took seconds, and the estimate said 36 ns a hit.
#[test]
fn a_functions_line_probes_count_against_the_budget_and_its_lines_say_what_they_lack() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("lineloop.c", "-O0").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let args = ["--engine", "uprobe", "--no-sample", "--lines", "--line-times", "--overhead-budget", "5"];
    run_ok(proftap().arg("run").args(args).arg("-o").arg(&file).arg("--").arg(&binary).arg("100000"));
    let report = report_json(&file);
    let main = function(&report["functions"], "main");
    assert_eq!(main["mode"], "throttled", "{main}");
    let source = std::fs::read_to_string(examples().join("lineloop.c")).unwrap();
    let xor = 1 + source.lines().position(|l| l.trim() == "total ^= i;").unwrap() as u64;
    let line = report["lines"].as_array().unwrap().iter().find(|l| l["line"] == xor).unwrap_or_else(|| panic!("{}", report["lines"]));
    assert_eq!(line["throttled"], true, "{line}");
    assert!(line["count"].as_u64().unwrap() < 100_000, "{line}");
    let overhead = &report["overhead"];
    let (per_hit, emulated) = (overhead["per_hit_ns"].as_u64().unwrap(), overhead["call_ns_emulated"].as_u64().unwrap());
    assert!(per_hit >= emulated / 2, "{overhead}: every hit is at least one emulated probe");
    let annotated = run_ok(proftap().args(["annotate", "main", "--no-pager"]).arg(&file));
    assert!(annotated.contains("a count with + is a lower bound"), "{annotated}");
    let row = annotated.lines().find(|l| l.contains(&format!(" {xor}:"))).unwrap();
    assert!(row.split_whitespace().next().unwrap().ends_with('+'), "{annotated}");
}

/// A new probe set that cannot be opened on every thread (here for want
/// of file descriptors: 100 threads wait while the main one calls) leaves
/// the old one in place, whole: before, it went with the failure, and
/// `work` stopped being counted at the first throttle, still marked exact.
#[test]
fn a_probe_set_that_cannot_be_opened_leaves_the_old_one_whole() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("segprefix.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut run = proftap();
    run.args(["run", "--engine", "uprobe", "--no-sample", "-f", "main", "-f", "work", "--overhead-budget", "5", "-o"])
        .arg(&file)
        .arg("--")
        .arg(&binary)
        .args(["100000", "100"]);
    // Enough for the start (about a dozen a CPU), not for the new set on
    // every thread (a few a CPU each).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let most = 64 + 16 * cpus;
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut run, move || {
            let limit = libc::rlimit { rlim_cur: most, rlim_max: most };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
    }
    let out = run.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Too many open files") && stderr.contains("raise `ulimit -n`"), "{stderr}");
    assert_every_probe_kept(&report_json(&file));
}

/// A program another tracer holds (here a process of its own, as a
/// debugger or strace would) cannot be held still to change its probes:
/// the probes stay, every call is counted, and the note says why. Before,
/// the new probes were opened on none of its threads: the functions still
/// probed lost theirs without a word (`main`'s return went unseen).
#[test]
fn a_program_another_tracer_holds_keeps_its_probes() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("traced.c", "-O2").build();
    let args = ["--engine", "uprobe", "--no-sample", "-f", "work", "-f", "main", "--overhead-budget", "5"];
    let (report, _) = recorded(&args, &binary, &["100000"]);
    assert_every_probe_kept(&report);
    let main = function(&report["functions"], "main");
    assert_eq!((main["calls"].as_u64(), main["unfinished"].as_u64()), (Some(1), Some(0)), "{main}");
    assert!(report["notes"].to_string().contains("traces it already"), "{}", report["notes"]);
}

/// `work`'s 100,000 calls all counted: the governor's change failed, said
/// so, and left every probe in place.
fn assert_every_probe_kept(report: &serde_json::Value) {
    let work = function(&report["functions"], "work");
    assert_eq!((work["mode"].as_str(), work["calls"].as_u64()), (Some("instrumented"), Some(100_000)), "{work}");
    assert!(report["notes"].to_string().contains("every probe was kept from then on"), "{}", report["notes"]);
}

/// The uprobe engine keeps its probes in parts and defines again only the
/// part of a function it throttles: the other functions' counts stay
/// exact, and a call under way in another part (`main`'s, which GCC
/// places before the others) keeps its return probe, so it is not cut
/// short as unfinished.
#[test]
fn a_throttle_defines_again_only_the_part_of_the_probes_it_changes() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("parts.c", "-O2").build();
    let (report, _) = recorded(&["--engine", "uprobe", "--no-sample", "--overhead-budget", "5"], &binary, &[]);
    let functions = &report["functions"];
    assert_eq!(function(functions, "hot")["mode"], "throttled", "{}", function(functions, "hot"));
    for name in (1..=16).flat_map(|tens| (0..8).map(move |units| format!("f{tens}{units}"))).chain(["each".to_string()]) {
        let f = function(functions, &name);
        assert_eq!((f["mode"].as_str(), f["calls"].as_u64()), (Some("instrumented"), Some(3)), "{f}");
    }
    let main = function(functions, "main");
    assert_eq!((main["calls"].as_u64(), main["unfinished"].as_u64()), (Some(1), Some(0)), "{main}");
}

#[test]
fn a_zero_budget_keeps_every_probe() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let binary = Build::c("hot.c", "-O2").build();
    // 100 000 calls: a second of probes, far over any budget.
    let report = profile_run(&["--overhead-budget", "0", "--no-sample"], &[binary.to_str().unwrap(), "0.1"]);
    let tiny = function(&report["functions"], "tiny");
    assert_eq!((tiny["mode"].as_str(), tiny["calls"].as_u64()), (Some("instrumented"), Some(100_000)));
    assert!(report["samples"].is_null(), "{}", report["samples"]);
}

#[test]
fn attach_auto_instrument_samples_then_counts_the_hottest_functions_exactly() {
    let _serial = one_recording_at_a_time();
    check_auto_instrument("uprobe");
}

#[test]
fn attach_auto_instrument_patches_the_hottest_functions_after_the_warm_up() {
    let _serial = one_recording_at_a_time();
    check_auto_instrument("inject");
}

fn check_auto_instrument(engine: &str) {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = proftap()
        .args(["attach", "--engine", engine, "--auto-instrument", "2", "--warmup", "300ms", "--overhead-budget", "0", "-o"])
        .arg(&file)
        .arg(waiter.pid.to_string())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(profiler.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("attached to process"), "unexpected: {line}");

    // Work to sample during the warm-up: nothing is counted yet.
    let mut total = waiter.tick(50_000_000);
    line.clear();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("instrumented the 2 hottest functions") && line.contains("tick"), "unexpected: {line}");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));

    // From now on every call is counted.
    total = waiter.tick(1000).max(total);
    total = waiter.tick(234).max(total);
    run_ok(Command::new("kill").args(["-INT", &profiler.id().to_string()]));
    assert!(profiler.wait().unwrap().success());
    assert_eq!(waiter.tick(1), total + 1);

    let report = report_json(&file);
    assert_eq!(report["recording"]["engine"], engine);
    // The others were only sampled.
    let instrumented = report["functions"].as_array().unwrap().iter().filter(|f| f["mode"] == "instrumented").count();
    assert!(instrumented <= 2, "{}", report["functions"]);
    let tick = function(&report["functions"], "tick");
    assert_eq!((tick["mode"].as_str(), tick["calls"].as_u64()), (Some("instrumented"), Some(1234)));
    let sampled = report["samples"]["functions"].as_array().unwrap().iter().find(|f| f["name"] == "tick").unwrap();
    assert!(sampled["self"].as_u64().unwrap() > 0, "{sampled}");
}

/// A real program's run makes dozens of changes of the probes (SQLite's,
/// forty), which the live output would print on the program's terminal:
/// the first few are told as they come, the rest in one line at the end,
/// and the text report folds them the same way; the profile keeps each.
#[test]
fn the_governors_changes_past_the_first_few_are_told_in_one_line() {
    let _serial = one_recording_at_a_time();
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    // 20 M calls a phase: each is throttled however late the governor looks.
    let out = run(proftap().arg("run").arg("-o").arg(&file).arg("--").arg(Build::c("phases.c", "-O2").build()).args(["8", "20"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let is_change = |line: &str| line.contains("removed the probes of phase") || line.contains("stopped counting the calls of phase");
    assert_eq!(stderr.lines().filter(|l| is_change(l)).count(), 3, "{stderr}");
    let report = report_json(&file);
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    for phase in 0..8 {
        let removed = |n: &&str| n.contains("removed the probes of") && n.contains(&format!("phase{phase} ("));
        assert!(notes.iter().any(removed), "phase{phase}: {notes:#?}");
    }
    let changes = notes.iter().filter(|n| is_change(n)).count();
    let more = stderr.lines().find(|l| l.contains("more changes of the probes")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(more.starts_with(&format!("proftap: {} more changes of the probes", changes - 3)), "{more}");
    let text = run_ok(proftap().arg("report").arg(&file).arg("--no-pager"));
    let folded = text.lines().filter(|l| l.starts_with("  note ")).collect::<Vec<_>>();
    assert_eq!(folded.iter().filter(|l| is_change(l)).count(), 3, "{text}");
    assert!(folded.iter().any(|l| l.ends_with(more.trim_start_matches("proftap: "))), "{text}");
}

/// Attached to a thread in a loop that began before the attach and never
/// returns (a server's event loop, an interpreter's), the loop's call is
/// one no probe timed: its time is its samples', told apart and named the
/// hottest, not left out of the profile as a function with no call.
#[test]
fn an_attach_estimates_a_call_begun_before_it_from_its_samples() {
    let _serial = one_recording_at_a_time();
    require_probes();
    // At -O0: its loop does not come back to its first instruction, which
    // would make a call of the first jump there after the attach.
    let binary = Build::c("spin.c", "-O0").flag("-pthread").build();
    let mut spinner = Command::new(&binary).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(spinner.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready "), "unexpected: {line}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let attached = run(proftap().args(["attach", "--engine", "inject", "--duration", "1s", "-o"]).arg(&file).arg(spinner.id().to_string()));
    run_ok(Command::new("kill").args(["-TERM", &spinner.id().to_string()]));
    assert!(spinner.wait().unwrap().success(), "the program's turns no longer add up");
    assert!(attached.status.success(), "{}", String::from_utf8_lossy(&attached.stderr));

    let report = report_json(&file);
    let untimed = report["samples"]["untimed_calls"].as_array().unwrap_or_else(|| panic!("{}", report["samples"]));
    let spin = untimed.iter().find(|t| t["name"] == "spin").unwrap_or_else(|| panic!("{untimed:?}"));
    // One thread turning for the whole second: most of it in spin itself.
    let duration = report["recording"]["duration_ns"].as_u64().unwrap();
    assert!(spin["self_ns"].as_u64().unwrap() * 2 > duration, "{spin} of {duration} ns");
    assert!(report["functions"].as_array().unwrap().iter().all(|f| f["name"] != "spin" || f["calls"] == 0), "{}", report["functions"]);
    let text = run_ok(proftap().arg("report").arg(&file));
    let hottest = text.lines().find(|l| l.trim_start().starts_with("hottest")).unwrap_or_default();
    assert!(hottest.contains("spin: about") && hottest.contains("no probe timed"), "{text}");
}

#[test]
fn samples_taken_while_an_exception_unwinds_leave_the_calls_it_passes_timed() {
    let _serial = one_recording_at_a_time();
    require_probes();
    // Every tenth round throws from validate() to main(): most of the run
    // is the unwinder's, which puts main's return address back meanwhile.
    let binary = Build::cxx("shapes.cpp", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let recorded = run(proftap().args(["run", "--engine", "inject", "-o"]).arg(&file).arg("--").arg(&binary).arg("300000"));
    assert!(recorded.status.success(), "{}", String::from_utf8_lossy(&recorded.stderr));

    let report = report_json(&file);
    let samples = &report["samples"];
    let sampled = |name: &str| samples["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).map(|f| f["total"].clone());
    let unwinding = sampled("_Unwind_RaiseException").and_then(|t| t.as_u64()).unwrap_or(0);
    assert!(unwinding > 0, "no sample in the unwinder: {samples}");
    // main's one call is timed from its start to its end: none of the
    // unwinder's samples are taken as main's untimed. (A sample between
    // the throw's landing in main and its catch still is: a few
    // instructions a throw, one sample a run at most.)
    let untimed = samples["untimed_calls"].as_array().unwrap();
    let main_untimed = untimed.iter().find(|t| t["name"] == "main").map_or(0, |t| t["total"].as_u64().unwrap());
    assert!(main_untimed * 4 <= unwinding, "main taken as untimed in {main_untimed} samples, {unwinding} in the unwinder: {untimed:?}");
    // The unwinder's samples are in the exclusive time of the innermost
    // call timed (main's, or check's while the governor left it probed).
    let held = samples["held_by_callers"].as_array().unwrap();
    assert!(held.iter().any(|h| h["callee"].as_str().is_some_and(|c| c.starts_with("_Unwind"))), "{held:?}");
}

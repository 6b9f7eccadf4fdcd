//! What every engine must do alike, written once and run for each: kernel
//! uprobes (`uprobe::`) and the in-process engine (`inject::`). Call counts
//! against callgrind, inclusive against exclusive, CPU against wall time,
//! threads, C++ exceptions, attach and detach, the measured probe cost.
//! tests/record.rs and tests/inject.rs have what only one engine does.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::process::Command;

/// An engine and what its runs take.
struct Engine {
    name: &'static str,
    /// Every named function instrumented for the whole run: no overhead governor.
    exact: &'static [&'static str],
    /// Instrumented calls the probe-cost scenario makes, enough for their
    /// cost to stand above the noise of two runs.
    cost_rounds: u32,
}

const UPROBE: Engine = Engine { name: "uprobe", exact: &["--engine", "uprobe", "--overhead-budget", "0"], cost_rounds: 20_000 };
const INJECT: Engine = Engine { name: "inject", exact: &["--engine", "inject", "--overhead-budget", "0"], cost_rounds: 35_000 };

/// Each scenario as a test per engine.
macro_rules! for_each_engine {
    ($($scenario:ident),* $(,)?) => {
        mod uprobe {
            $(#[test]
            fn $scenario() {
                super::$scenario(&super::UPROBE)
            })*
        }
        mod inject {
            $(#[test]
            fn $scenario() {
                super::$scenario(&super::INJECT)
            })*
        }
    };
}

for_each_engine!(
    call_counts_equal_callgrind,
    inclusive_and_exclusive_add_up_on_a_known_tree,
    cpu_time_and_wall_time_are_told_apart,
    threads_have_their_own_counts,
    a_cpp_function_left_by_a_throw_is_counted_and_stopped,
    attach_then_detach_restores_the_program,
    the_probe_cost_is_measured_reported_and_compensated,
    coroutines_that_switch_stacks_run_unharmed_and_are_counted,
    a_handler_that_jumps_out_ends_the_calls_it_left,
    a_timer_that_jumps_out_of_the_probes_leaves_the_program_whole,
    a_function_looping_back_to_its_entry_counts_its_calls_not_its_turns,
);

fn call_counts_equal_callgrind(engine: &Engine) {
    require_probes();
    require("valgrind", "as the call-count oracle");
    let check = |build: &Build, args: &[&str]| {
        let report = check_calls_against_callgrind(engine.exact, build, args);
        assert_eq!(report["recording"]["engine"], engine.name, "{}", build.label());
    };
    for opt in ["-O0", "-O2"] {
        check(&Build::c("calls.c", opt), &["300", "12"]);
        check(&Build::c("multifile/main.c", opt).sources(&["multifile/io.c", "multifile/compute.c"]), &["40", "5"]);
        check(&Build::c("threads.c", opt), &["3", "200"]);
        // C++ (templates, virtual calls, a throw through two frames) and Rust.
        check(&Build::cxx("shapes.cpp", opt), &["30"]);
        check(&Build::rust("calls.rs", opt), &["200"]);
    }
}

/// A function whose loop jumps back to its very first instruction
/// (examples/looped.c's `sum_from_entry`, as gcc makes of a loop tested at
/// the top of a function with no frame) enters its probed entry again at
/// each turn: each call is counted once and timed from its call to its
/// return, its turns are not calls, and nothing is left unpaired.
fn a_function_looping_back_to_its_entry_counts_its_calls_not_its_turns(engine: &Engine) {
    require_probes();
    for opt in ["-O0", "-O2"] {
        let binary = Build::c("looped.c", opt).build();
        let report = run_unharmed(&[engine.exact, &["--no-sample", "-f", "sum_from_entry", "-f", "main"]].concat(), &binary, &["3000"]);
        assert_eq!(report["recording"]["engine"], engine.name, "{opt}");
        let f = function(&report["functions"], "sum_from_entry");
        // 3,000 calls of one to three turns each.
        let counted = (f["calls"].as_u64(), f["untimed"].as_u64(), f["unfinished"].as_u64());
        assert_eq!(counted, (Some(3000), Some(0), Some(0)), "{opt}: {f}");
        assert_eq!(report["lost"]["unmatched_returns"], 0, "{opt}: {}", report["lost"]);
        // main's one call holds every one of them, under it in the tree.
        assert_eq!(function(&report["functions"], "main")["calls"], 1, "{opt}");
        assert!(stat(f, "inclusive", "wall_ns", "total") < stat(function(&report["functions"], "main"), "inclusive", "wall_ns", "total"));
    }
}

/// Calls that return on another stack than the one the thread made its
/// last call on (coroutines switching with `swapcontext`) go back where
/// they were called from: the program prints what it prints alone, and
/// every call is counted. (callgrind's counts are no oracle here: its own
/// shadow stack takes a switch for returns.)
fn coroutines_that_switch_stacks_run_unharmed_and_are_counted(engine: &Engine) {
    require_probes();
    for opt in ["-O0", "-O2"] {
        let binary = Build::c("coroutines.c", opt).build();
        let report = run_unharmed(&[engine.exact, &["--no-sample"]].concat(), &binary, &["300"]);
        assert_eq!(report["recording"]["engine"], engine.name, "{opt}");
        let calls = |name: &str| function(&report["functions"], name)["calls"].as_u64();
        // Each coroutine yields 300 times; every yield calls leaf before it
        // switches and after it comes back, but for B's last, never resumed.
        let counted = [calls("body_a"), calls("body_b"), calls("yield_to"), calls("leaf")];
        assert_eq!(counted, [Some(1), Some(1), Some(600), Some(1199)], "{opt}");
        if engine.name == "inject" {
            let notes = report["notes"].to_string();
            assert!(notes.contains("switched stacks"), "{opt}: {notes}");
        }
    }
}

/// A signal handler on an alternate stack that leaves by `siglongjmp`
/// (back into main, from the middle of a call): the calls it left end as
/// unwound, every call is counted, and the program prints what it prints
/// alone.
fn a_handler_that_jumps_out_ends_the_calls_it_left(engine: &Engine) {
    require_probes();
    let binary = Build::c("sigjump.c", "-O2").build();
    let report = run_unharmed(&[engine.exact, &["--no-sample"]].concat(), &binary, &["500"]);
    let seen = |name: &str| {
        let f = function(&report["functions"], name);
        (f["calls"].as_u64(), f["unwound"].as_u64())
    };
    assert_eq!(seen("fail"), (Some(500), Some(500)));
    assert_eq!(seen("handler"), (Some(500), Some(500)));
    assert_eq!(seen("leaf"), (Some(1500), Some(0)));
}

/// A timer's handler that jumps out of a loop of calls wherever its signal
/// lands, in the probes' code as often as not (as a time limit does), or
/// returns: the program runs as it does alone, the calls the jumps left
/// end as unwound, every call is counted, and the calls after a jump are
/// timed again. On the thread's own stack, on an alternate stack near the
/// loop's (a handler's calls there are not the calls after a jump), and
/// once a thread that shares the thread pointer was made. (A handler that
/// left the in-process engine's code by a jump once left the thread's
/// state held for ever: the next return waited for it.)
fn a_timer_that_jumps_out_of_the_probes_leaves_the_program_whole(engine: &Engine) {
    require_probes();
    let binary = Build::c("sigjump.c", "-O2").build();
    let rounds = 300;
    for how in ["", "altstack", "shared"] {
        let args = ["timer", &rounds.to_string(), how];
        let bare = run(Command::new(&binary).args(args));
        // The function a jump returns to timed (its return comes next), and
        // not (the calls in the next round come next).
        for functions in [&["-f", "spin*", "-f", "leaf"][..], &["-f", "spin", "-f", "leaf"]] {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("p.profile");
            // The kernel's probes see a call on an alternate stack above the
            // thread's frames as one made after they were left: they end,
            // marked unwound; with return probes the kernel drops theirs, and
            // their returns kill the program (SIGILL).
            let near_alternate_stack = how == "altstack" && engine.name == "uprobe";
            let exits: &[&str] = if near_alternate_stack { &["--exits", "ret"] } else { &[] };
            let mut command = proftap();
            command.arg("run").args(engine.exact).args(exits).arg("--no-sample").args(functions).arg("-o").arg(&file);
            command.arg("--").arg(&binary).args(args);
            let out = run_within(&mut command, std::time::Duration::from_secs(120));
            let stderr = String::from_utf8_lossy(&out.stderr);
            let case = format!("{how:?} {functions:?}");
            assert_eq!((out.status.code(), &out.stdout), (bare.status.code(), &bare.stdout), "{case}: {stderr}");
            let made = |what: &str| -> u64 {
                let words = stderr.lines().find_map(|l| l.strip_suffix(" handled")).unwrap_or_else(|| panic!("{case}: {stderr}"));
                let words: Vec<&str> = words.split(' ').collect();
                words[if what == "spins" { 0 } else { 2 }].parse().unwrap()
            };
            let report = report_json(&file);
            let seen = |name: &str| {
                let f = function(&report["functions"], name);
                (f["calls"].as_u64().unwrap(), f["untimed"].as_u64().unwrap(), f["unwound"].as_u64().unwrap())
            };
            if functions[1] == "spin*" && !near_alternate_stack {
                assert_eq!(seen("spin_until_the_timer"), (rounds, 0, 0), "{case}");
            } else if functions[1] == "spin*" {
                assert_eq!(seen("spin_until_the_timer").0, rounds, "{case}");
            }
            // One call in each handler, made while the probes' code may be
            // held, and ended by its own return.
            let (leaf_calls, _, leaf_unwound) = seen("leaf");
            assert_eq!((leaf_calls, leaf_unwound), (made("handled"), 0), "{case}");
            let notes = report["notes"].to_string();
            assert!(!notes.contains("found no frame"), "{case}: {notes}");
            // Each jump leaves one call of spin at most: counted at its entry
            // and left before its body counted it, or left in the probes'
            // code before it was timed (untimed), or after (unwound). Every
            // other call is timed.
            let (counted, untimed, unwound) = seen("spin");
            let spins = made("spins");
            assert!((spins..=spins + rounds).contains(&counted), "{case}: spin: {counted} calls counted, {spins} made");
            // (Under the kernel's probes, each handler's call on the alternate stack too.)
            let left = if near_alternate_stack { rounds + made("handled") } else { rounds };
            assert!(untimed + unwound <= left, "{case}: spin: {counted} calls, {untimed} untimed, {unwound} left by a jump");
        }
    }
}

fn inclusive_and_exclusive_add_up_on_a_known_tree(engine: &Engine) {
    require_probes();
    let binary = Build::c("calls.c", "-O0").build();
    let report = profile_run(engine.exact, &[binary.to_str().unwrap(), "2000", "12"]);
    let functions = &report["functions"];
    for metric in ["wall_ns", "cpu_ns"] {
        let incl = |n: &str| stat(function(functions, n), "inclusive", metric, "total");
        let excl = |n: &str| stat(function(functions, n), "exclusive", metric, "total");
        // A leaf calls nothing instrumented: exclusive is inclusive.
        assert_eq!(incl("leaf"), excl("leaf"), "{metric}");
        // run = its own time + left + right.
        assert_eq!(incl("run"), excl("run") + incl("left") + incl("right"), "{metric}");
        // left = its own time + leaf called from left (from the tree).
        let main = report["tree"]["children"].as_array().unwrap().iter().find(|c| c["name"] == "main").unwrap();
        let run = main["children"].as_array().unwrap().iter().find(|c| c["name"] == "run").unwrap();
        let left = run["children"].as_array().unwrap().iter().find(|c| c["name"] == "left").unwrap();
        let leaf_under_left = left["children"][0]["inclusive"][metric].as_u64().unwrap();
        assert_eq!(incl("left"), excl("left") + leaf_under_left, "{metric}");
        assert!(incl("main") >= incl("run") + incl("fib"), "{metric}: main {} run {} fib {}", incl("main"), incl("run"), incl("fib"));
        // Recursion: fib's inclusive total counts the outermost call only, so
        // its exclusive total equals it.
        assert_eq!(incl("fib"), excl("fib"), "{metric}");
        // Its average is over every call, each holding the calls below it:
        // fib(12)'s 465 calls hold 3,817 in all, 8.2 each.
        let fib = function(functions, "fib");
        let every_call = stat(fib, "inclusive", metric, "avg") * fib["calls"].as_u64().unwrap();
        assert!(every_call > 3 * incl("fib"), "{metric}: fib's calls take {every_call} in all, the outermost {}", incl("fib"));
    }
    for f in functions.as_array().unwrap() {
        for metric in ["wall_ns", "cpu_ns"] {
            let (min, avg, max) =
                (stat(f, "inclusive", metric, "min"), stat(f, "inclusive", metric, "avg"), stat(f, "inclusive", metric, "max"));
            assert!(min <= avg && avg <= max, "{}: {metric} min {min} avg {avg} max {max}", f["name"]);
        }
    }
}

fn cpu_time_and_wall_time_are_told_apart(engine: &Engine) {
    require_probes();
    check_cpu_and_wall(&["--engine", engine.name]);
}

fn threads_have_their_own_counts(engine: &Engine) {
    require_probes();
    let binary = Build::c("threads.c", "-O2").build();
    // At once, and one after the other: then each thread gets the stack and
    // thread control block of the one before, and still counts as itself.
    for serial in [&[][..], &["serial"]] {
        let args = [&[binary.to_str().unwrap(), "4", "500"][..], serial].concat();
        let report = profile_run(&["--engine", engine.name, "-f", "work"], &args);
        let threads = report["threads"].as_array().unwrap();
        // Thread t calls work (t + 1) * 500 times, the main thread 500 times.
        let mut counts: Vec<u64> = threads.iter().map(|t| function(&t["functions"], "work")["calls"].as_u64().unwrap()).collect();
        counts.sort();
        assert_eq!(counts, vec![500, 500, 1000, 1500, 2000], "{serial:?}");
        let mut tids: Vec<i64> = threads.iter().map(|t| t["tid"].as_i64().unwrap()).collect();
        tids.sort();
        tids.dedup();
        assert_eq!(tids.len(), 5, "{serial:?}: {tids:?}");
        let pid = report["target"]["pid"].as_i64().unwrap();
        assert!(threads.iter().all(|t| t["pid"].as_i64() == Some(pid)));
    }
}

fn a_cpp_function_left_by_a_throw_is_counted_and_stopped(engine: &Engine) {
    require_probes();
    for report in check_throws_are_counted_and_stopped(engine.exact) {
        assert_eq!(report["recording"]["engine"], engine.name);
        // Uprobes see returns at ret instructions: a uretprobe would hide
        // the return address from the unwinder.
        assert_eq!(report["recording"]["exits"], "return-sites");
    }
}

/// Starts `proftap attach -o FILE ARGS PID` and waits until it says the probes are live.
fn attach(pid: i32, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let pid = pid.to_string();
    attach_live(&[&["-o", file.to_str().unwrap()], args, &[&pid]].concat())
}

fn attach_then_detach_restores_the_program(engine: &Engine) {
    require_probes();
    for opt in ["-O0", "-O2"] {
        let mut waiter = Waiter::start(&Build::c("wait.c", opt).build());
        assert_eq!(waiter.tick(7), 7);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.profile");
        let profiler = attach(waiter.pid, &["--engine", engine.name, "-f", "tick"], &file);
        assert_eq!(waiter.tick(10_000), 10_007);
        run_ok(Command::new("kill").args(["-INT", &profiler.id().to_string()]));
        assert!(profiler.wait_with_output().unwrap().status.success());
        // Detached: the program runs on, unprobed and correct.
        assert_eq!(waiter.tick(3), 10_010);
        let (rest, status) = waiter.finish();
        assert_eq!(rest, "done 10010\n");
        assert!(status.success());
        let report = report_json(&file);
        assert_eq!(calls_by_name(&report)["tick"], 10_000, "{opt}");
        assert_eq!(report["recording"]["engine"], engine.name);
        assert_eq!(report["target"]["attached"], true);
    }
}

fn the_probe_cost_is_measured_reported_and_compensated(engine: &Engine) {
    check_probe_cost_is_measured_and_compensated(&["--engine", engine.name], engine.cost_rounds);
}

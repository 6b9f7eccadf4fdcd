//! The in-process engine (`--engine inject`): the engine tests again, with
//! calls seen through jumps patched over function entries.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const INJECT: &[&str] = &["--engine", "inject", "--overhead-budget", "0"];

fn check_calls_against_callgrind(build: &Build, args: &[&str]) {
    let report = proftap_tests::check_calls_against_callgrind(INJECT, build, args);
    assert_eq!(report["recording"]["engine"], "inject", "{}", build.label());
}

#[test]
fn call_counts_equal_callgrind() {
    if !can_probe() || !have("valgrind", "as the call-count oracle") {
        return;
    }
    for opt in ["-O0", "-O2"] {
        check_calls_against_callgrind(&Build::c("calls.c", opt), &["300", "12"]);
        check_calls_against_callgrind(&Build::c("multifile/main.c", opt).sources(&["multifile/io.c", "multifile/compute.c"]), &["40", "5"]);
        check_calls_against_callgrind(&Build::c("threads.c", opt), &["3", "200"]);
        // Calls a longjmp leaves, and calls made from the slot they used.
        check_calls_against_callgrind(&Build::c("jumps.c", opt), &["300", "3"]);
        // C++ (templates, virtual calls, a throw through two frames) and Rust.
        check_calls_against_callgrind(&Build::cxx("shapes.cpp", opt), &["30"]);
        check_calls_against_callgrind(&Build::rust("calls.rs", opt), &["200"]);
    }
}

#[test]
fn inclusive_and_exclusive_add_up_on_a_known_tree() {
    if !can_probe() {
        return;
    }
    let binary = Build::c("calls.c", "-O0").build();
    let report = profile_run(INJECT, &[binary.to_str().unwrap(), "2000", "12"]);
    let functions = &report["functions"];
    let stat = |n: &str, kind: &str, field: &str| function(functions, n)[kind]["wall_ns"][field].as_u64().unwrap();
    assert_eq!(stat("leaf", "inclusive", "total"), stat("leaf", "exclusive", "total"));
    assert_eq!(
        stat("run", "inclusive", "total"),
        stat("run", "exclusive", "total") + stat("left", "inclusive", "total") + stat("right", "inclusive", "total")
    );
    assert!(stat("main", "inclusive", "total") >= stat("run", "inclusive", "total") + stat("fib", "inclusive", "total"));
    for name in ["leaf", "left", "right", "fib", "run"] {
        let (min, max) = (stat(name, "inclusive", "min"), stat(name, "inclusive", "max"));
        let avg = function(functions, name)["inclusive"]["wall_ns"]["avg"].as_u64().unwrap();
        assert!(min <= avg && avg <= max, "{name}: {min} <= {avg} <= {max}");
    }
}

#[test]
fn cpu_time_and_wall_time_are_told_apart() {
    if !can_probe() {
        return;
    }
    check_cpu_and_wall(&["--engine", "inject"]);
}

#[test]
fn per_thread_counts() {
    if !can_probe() {
        return;
    }
    let binary = Build::c("threads.c", "-O2").build();
    // At once, and one after the other: then each thread gets the stack and
    // thread control block of the one before, and still counts as itself.
    for serial in [&[][..], &["serial"]] {
        let args = [&[binary.to_str().unwrap(), "4", "500"][..], serial].concat();
        let report = profile_run(&["--engine", "inject", "-f", "work"], &args);
        let threads = report["threads"].as_array().unwrap();
        let mut counts: Vec<u64> = threads.iter().map(|t| function(&t["functions"], "work")["calls"].as_u64().unwrap()).collect();
        counts.sort();
        assert_eq!(counts, vec![500, 500, 1000, 1500, 2000], "{serial:?}");
        let mut tids: Vec<i64> = threads.iter().map(|t| t["tid"].as_i64().unwrap()).collect();
        tids.sort();
        tids.dedup();
        assert_eq!(tids.len(), 5, "{serial:?}: {tids:?}");
    }
}

#[test]
fn the_program_keeps_its_output_and_status() {
    if !can_probe() {
        return;
    }
    let binary = Build::c("jumps.c", "-O2").build();
    let bare = run_ok(Command::new(&binary).args(["50", "4"]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let out = run(proftap().args(["run", "--engine", "inject", "-o"]).arg(&file).arg("--").arg(&binary).args(["50", "4"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), bare);
    let report = report_json(&file);
    // dive(4) down to dive(0), 50 times, all left by the longjmp.
    let dive = function(&report["functions"], "dive");
    assert_eq!((dive["calls"].as_u64(), dive["unwound"].as_u64()), (Some(250), Some(250)));
}

/// Starts `proftap attach ARGS PID` and waits until its probes are live.
fn attach(pid: i32, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let mut child = proftap().arg("attach").arg("-o").arg(file).args(args).arg(pid.to_string()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("attached to process"), "unexpected: {line}");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}

#[test]
fn attach_then_detach_restores_the_program() {
    if !can_probe() {
        return;
    }
    for opt in ["-O0", "-O2"] {
        let mut waiter = Waiter::start(&Build::c("wait.c", opt).build());
        assert_eq!(waiter.tick(7), 7);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.profile");
        let profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &file);
        assert_eq!(waiter.tick(100_000), 100_007);
        run_ok(Command::new("kill").args(["-INT", &profiler.id().to_string()]));
        assert!(profiler.wait_with_output().unwrap().status.success());
        assert_eq!(waiter.tick(3), 100_010);
        let (rest, status) = waiter.finish();
        assert_eq!(rest, "done 100010\n");
        assert!(status.success());
        let report = report_json(&file);
        assert_eq!(calls_by_name(&report)["tick"], 100_000, "{opt}");
        assert_eq!(report["recording"]["engine"], "inject");
    }
}

#[test]
fn a_killed_profiler_leaves_the_program_running() {
    if !can_probe() {
        return;
    }
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &file);
    assert_eq!(waiter.tick(1000), 1000);
    profiler.kill().unwrap();
    profiler.wait().unwrap();
    // Its jumps stay, and record into rings no one reads: they fill and drop.
    assert_eq!(waiter.tick(3_000_000), 3_001_000);
    let (rest, status) = waiter.finish();
    assert_eq!(rest, "done 3001000\n");
    assert!(status.success());
    assert!(!file.exists());
}

/// Runs `binary ARGS` bare and under `proftap run --engine inject EXTRA`:
/// the same output and status; the profile's report.
fn profile_like_bare(binary: &std::path::Path, extra: &[&str], args: &[&str]) -> serde_json::Value {
    let bare = run_ok(Command::new(binary).args(args));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let out = run(proftap().args(["run", "-o"]).arg(&file).args(INJECT).args(extra).arg("--").arg(binary).args(args));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), bare);
    let report = report_json(&file);
    assert_eq!(report["recording"]["engine"], "inject");
    report
}

#[test]
fn a_cpp_function_left_by_a_throw_is_counted_and_stopped() {
    if !can_probe() {
        return;
    }
    for report in check_throws_are_counted_and_stopped(INJECT) {
        assert_eq!(report["recording"]["engine"], "inject");
    }
}

#[test]
fn a_rust_panic_caught_by_catch_unwind() {
    if !can_probe() {
        return;
    }
    let binary = Build::rust("panics.rs", "-O").build();
    let report = profile_like_bare(&binary, &["-f", "panics::check", "-f", "panics::validate", "-f", "panics::run"], &["50"]);
    let unwound = |name: &str| {
        let f = function(&report["functions"], name);
        (f["calls"].as_u64().unwrap(), f["unwound"].as_u64().unwrap())
    };
    assert_eq!(unwound("panics::check"), (50, 5));
    assert_eq!(unwound("panics::validate"), (50, 5));
    // run catches: every call of it returns.
    assert_eq!(unwound("panics::run"), (50, 0));
}

#[test]
fn backtrace_sees_the_programs_own_stack() {
    if !can_probe() {
        return;
    }
    for opt in ["-O0", "-O2"] {
        let binary = Build::c("backtrace.c", opt).flag("-rdynamic").build();
        // The output names every frame: backtrace() met no trampoline.
        let report = profile_like_bare(&binary, &[], &["10"]);
        let calls = calls_by_name(&report);
        assert_eq!((calls["outer"], calls["middle"], calls["inner"]), (10, 30, 30), "{opt}");
        // And every call returned through the trampoline, timed to its end.
        for f in report["functions"].as_array().unwrap() {
            assert_eq!(f["unwound"], 0, "{opt}: {f}");
        }
    }
}

#[test]
fn other_metrics_are_refused_with_a_reason() {
    if !can_probe() {
        return;
    }
    let out = run(proftap()
        .args(["run", "--engine", "inject", "--metric", "wall,page-faults", "--"])
        .arg(Build::c("calls.c", "-O0").build())
        .arg("5"));
    assert_clean_failure(&out, "wall and CPU time only");
}

#[test]
fn shared_library_functions_are_patched_too() {
    if !can_probe() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libcounter.so");
    run_ok(Command::new("gcc").args(["-O2", "-g", "-shared", "-fPIC", "-o"]).arg(&lib).arg(examples().join("libcounter/counter.c")));
    let uselib = build_uselib(dir.path());
    let report = profile_like_bare(&uselib, &["-f", "libcounter.so:counter_*", "-f", "main"], &["1000"]);
    let add = function(&report["functions"], "counter_add");
    assert_eq!(add["calls"], 1000);
    assert!(add["module"].as_str().unwrap().ends_with("libcounter.so"), "{add}");
    // The library's constructor calls counter_reset before the program's
    // entry point: patched before any constructor runs, it is counted.
    assert_eq!(function(&report["functions"], "counter_reset")["calls"], 1);
    // Patched, not probed: no note sends it to uprobes.
    let notes = report["notes"].as_array().map(|n| n.iter().filter_map(|n| n.as_str()).collect::<Vec<_>>().join("\n")).unwrap_or_default();
    assert!(!notes.contains("counter_add"), "{notes}");
    assert_eq!(add["engine"], "inject");
    // Its calls nest under main, which the executable's copy of the runtime times.
    assert_eq!(function(&report["functions"], "main")["unwound"], 0);
}

#[test]
fn attach_to_a_program_whose_exceptions_cross_patched_frames() {
    if !can_probe() {
        return;
    }
    for opt in ["-O0", "-O2"] {
        let mut waiter = Waiter::start(&Build::cxx("waitthrow.cpp", opt).build());
        assert_eq!(waiter.tick(7), 7);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.profile");
        let profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick", "-f", "round_of"], &file);
        assert_eq!(waiter.tick(1000), 1007);
        run_ok(Command::new("kill").args(["-INT", &profiler.id().to_string()]));
        assert!(profiler.wait_with_output().unwrap().status.success());
        // After detaching, exceptions still find their handlers.
        assert_eq!(waiter.tick(30), 1037);
        let (rest, status) = waiter.finish();
        assert_eq!(rest, "done 1037 caught 103\n", "{opt}");
        assert!(status.success());
        let report = report_json(&file);
        let tick = function(&report["functions"], "tick(long)");
        assert_eq!((tick["calls"].as_u64(), tick["unwound"].as_u64()), (Some(1000), Some(100)), "{opt}");
        let round = function(&report["functions"], "round_of(long)");
        assert_eq!((round["calls"].as_u64(), round["unwound"].as_u64()), (Some(1), Some(0)), "{opt}");
    }
}

#[test]
fn the_call_cost_is_measured_reported_and_compensated() {
    check_probe_cost_is_measured_and_compensated(&["--engine", "inject"], 35_000);
}

#[test]
fn calls_deeper_than_the_shadow_stack_are_counted_as_lost() {
    if !can_probe() {
        return;
    }
    let binary = Build::c("deep.c", "-O2").build();
    // down() nests 9001 deep, twice: the shadow stack holds 8192 frames.
    let report = profile_run(&["--engine", "inject", "-f", "down"], &[binary.to_str().unwrap(), "9000", "2"]);
    let untimed = 2 * (9001 - 8192);
    assert_eq!(function(&report["functions"], "down")["calls"], 2 * 9001 - untimed);
    assert_eq!(report["lost_events"], 2 * untimed);
    let notes = report["notes"].to_string();
    assert!(notes.contains(&format!("{untimed} calls were not timed")), "{notes}");
    // The JSON tree stops nesting where JSON readers would; the rest is counted.
    let mut node = &report["tree"];
    let mut depth = 0;
    while let Some(child) = node["children"].as_array().and_then(|c| c.first()) {
        node = child;
        depth += 1;
    }
    assert_eq!(depth, 60);
    assert!(node["nodes_left_out"].as_u64().unwrap() > 8000, "{node}");
}

#[test]
fn the_default_engine_is_this_one_unless_the_recording_needs_uprobes() {
    if !can_probe() {
        return;
    }
    let calls = Build::c("calls.c", "-O2").build();
    let calls = calls.to_str().unwrap();
    let engine = |args: &[&str], command: &[&str]| {
        let report = profile_run(args, command);
        let note =
            report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).find(|n| n.starts_with("calls are seen by uprobes"));
        let chosen = report["recording"]["engine"].as_str().unwrap().to_string();
        // Each function that ran says what saw its calls.
        for f in report["functions"].as_array().unwrap().iter().filter(|f| f["calls"].as_u64() > Some(0)) {
            assert_eq!(f["engine"].as_str(), Some(chosen.as_str()), "{f}");
        }
        (chosen, note.unwrap_or_default().to_string())
    };
    assert_eq!(engine(&["-f", "leaf"], &[calls, "10", "3"]), ("inject".into(), String::new()));
    let (chosen, why) = engine(&["-f", "leaf", "--metric", "wall,page-faults"], &[calls, "10", "3"]);
    assert!(chosen == "uprobe" && why.contains("wall and CPU time only"), "{chosen}: {why}");
    let (chosen, why) = engine(&["--lines"], &[calls, "10", "3"]);
    assert!(chosen == "uprobe" && why.contains("line counts"), "{chosen}: {why}");
    // A cancelled thread is unwound by libgcc_s, which glibc loads only then.
    let cancel = Build::c("cancel.c", "-O2").build();
    let (chosen, why) = engine(&["-f", "wait_here"], &[cancel.to_str().unwrap()]);
    assert!(chosen == "uprobe" && why.contains("pthread_cancel"), "{chosen}: {why}");
}

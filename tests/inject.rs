//! What only the in-process engine (`--engine inject`) does: longjmp, Rust
//! panics and `backtrace()` through patched frames, shared libraries patched
//! before their constructors, exceptions on a process it attached to, its
//! shadow stack's depth, and when it is the default. tests/engines.rs has
//! what it does as the uprobe engine does.
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
fn calls_a_longjmp_leaves_equal_callgrinds() {
    require_probes();
    require("valgrind", "as the call-count oracle");
    for opt in ["-O0", "-O2"] {
        // Calls a longjmp leaves, and calls made from the slot they used.
        check_calls_against_callgrind(&Build::c("jumps.c", opt), &["300", "3"]);
    }
}

#[test]
fn the_program_keeps_its_output_and_status() {
    require_probes();
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

/// The calls a `longjmp` leaves end as it starts, not when the thread
/// next calls or returns: here after a sleep of 200 ms in the C library,
/// which they would otherwise take as theirs. glibc's `longjmp`, its
/// checked `__longjmp_chk` where the program is built fortified, and the
/// `longjmp` linked into a static program.
#[test]
fn the_calls_a_longjmp_leaves_end_at_the_jump() {
    require_probes();
    let builds =
        [Build::c("jumps.c", "-O2"), Build::c("jumps.c", "-O2").flag("-D_FORTIFY_SOURCE=2"), Build::c("jumps.c", "-O2").flag("-static")];
    for build in builds {
        let binary = build.build();
        let args = ["--engine", "inject", "--overhead-budget", "0", "-f", "dive", "-f", "surface"];
        let report = run_unharmed(&args, &binary, &["3", "4", "200"]);
        let dive = function(&report["functions"], "dive");
        assert_eq!((dive["calls"].as_u64(), dive["unwound"].as_u64()), (Some(15), Some(15)), "{}", build.label());
        let longest = stat(dive, "inclusive", "wall_ns", "max");
        assert!(longest < 50_000_000, "{}: a call dive left by the jump took {longest} ns", build.label());
    }
}

/// A function entered without a return address (the program's entry
/// point, whose word on the stack is the argument count) is given neither
/// a return trampoline nor a return probe: `calls` would see another
/// argument count and print another line.
#[test]
fn the_entry_point_is_not_taken_for_a_called_function() {
    require_probes();
    let binary = Build::c("calls.c", "-O2").build();
    for engine in ["inject", "uprobe"] {
        let report = run_unharmed(&["--engine", engine, "--no-sample", "-f", "_start", "-f", "run"], &binary, &["1000", "3"]);
        assert_eq!(function(&report["functions"], "run")["calls"].as_u64(), Some(1), "{engine}");
        assert_eq!(function(&report["functions"], "_start")["calls"].as_u64(), Some(1), "{engine}");
        if engine == "inject" {
            assert!(report["notes"].to_string().contains("its return address must stay as it is"), "{}", report["notes"]);
        }
    }
}

/// A function that returns twice (`setjmp`: once as called, once from a
/// `longjmp`) keeps its return address: the jump goes back to where it
/// saved it, and a trampoline there would find no call of its own to end.
/// Its calls are counted, not timed: no return is watched to end them.
#[test]
fn a_function_that_returns_twice_keeps_its_return_address() {
    require_probes();
    let binary = Build::c("jumps.c", "-O2").build();
    for engine in ["inject", "uprobe"] {
        let args = ["--engine", engine, "--no-sample", "-f", "libc.so.6:_setjmp", "-f", "surface"];
        let report = run_unharmed(&args, &binary, &["300", "3"]);
        // Once a round, and once where the C library starts main.
        let setjmp = function(&report["functions"], "_setjmp");
        assert_eq!((setjmp["calls"].as_u64(), setjmp["untimed"].as_u64()), (Some(301), Some(301)), "{engine}: {setjmp}");
        assert_eq!(setjmp["inclusive"]["wall_ns"]["total"].as_u64(), Some(0), "{engine}: {setjmp}");
        let surface = function(&report["functions"], "surface");
        assert_eq!((surface["calls"].as_u64(), surface["untimed"].as_u64()), (Some(300), Some(0)), "{engine}: {surface}");
    }
}

/// A function whose entry is its only exit (one tail jump, one `ret`)
/// with returns seen at return instructions by uprobes: each call is
/// counted once, none is timed from one call to the next, and no return
/// goes unmatched; the function it jumps to is timed as called.
#[test]
fn a_function_that_is_one_jump_is_counted_not_timed_between_calls() {
    require_probes();
    let binary = Build::c("tailjump.c", "-O2").build();
    let args = ["--engine", "uprobe", "--exits", "ret", "--no-sample", "-f", "wrapper", "-f", "nothing", "-f", "body", "-f", "main"];
    let report = run_unharmed(&args, &binary, &["2000"]);
    assert_eq!(report["lost"]["unmatched_returns"], 0, "{}", report["lost"]);
    for name in ["wrapper", "nothing"] {
        let f = function(&report["functions"], name);
        assert_eq!((f["calls"].as_u64(), f["untimed"].as_u64()), (Some(2000), Some(2000)), "{f}");
        assert_eq!(f["inclusive"]["wall_ns"]["total"].as_u64(), Some(0), "{f}");
    }
    let body = function(&report["functions"], "body");
    assert_eq!((body["calls"].as_u64(), body["untimed"].as_u64()), (Some(2000), Some(0)), "{body}");
}

/// Functions shorter than the 5-byte jump are patched in process all the
/// same when they end with their `ret`: within their 5 bytes (`none`:
/// xor, xor, ret), or over the padding after them (`nothing`: ret alone).
/// Each call is counted and timed, the program's output its own.
#[test]
fn short_functions_ending_with_their_ret_are_patched() {
    require_probes();
    let binary = Build::c("tailjump.c", "-O2").build();
    let report = run_unharmed(&["--engine", "inject", "--no-sample", "-f", "none", "-f", "nothing", "-f", "main"], &binary, &["2000"]);
    for name in ["none", "nothing"] {
        let f = function(&report["functions"], name);
        assert_eq!((f["calls"].as_u64(), f["untimed"].as_u64(), f["engine"].as_str()), (Some(2000), Some(0), Some("inject")), "{f}");
    }
    assert!(!report["notes"].to_string().contains("could not be patched"), "{}", report["notes"]);
}

/// A function whose first bytes end with a call through memory
/// (`through_table`: `sub rsp, 8; call [rip+table]`) is patched: the
/// trampoline pushes the original return address and jumps through the
/// same, relocated, operand. Each call is counted, its callee's too, the
/// program's output its own, and nothing is left to uprobes.
#[test]
fn a_function_starting_with_an_indirect_call_is_patched() {
    require_probes();
    let binary = Build::c("vcall.c", "-O2").build();
    let args = ["--engine", "inject", "--no-sample", "-f", "through_table", "-f", "twice", "-f", "halve"];
    let report = run_unharmed(&args, &binary, &["1000"]);
    for (name, calls) in [("through_table", 2000), ("twice", 1000), ("halve", 1000)] {
        let f = function(&report["functions"], name);
        assert_eq!((f["calls"].as_u64(), f["untimed"].as_u64(), f["engine"].as_str()), (Some(calls), Some(0), Some("inject")), "{f}");
    }
    // The callees return into through_table, which holds them.
    let via = function(&report["functions"], "through_table");
    let callee = function(&report["functions"], "twice");
    assert!(via["inclusive"]["wall_ns"]["total"].as_u64() >= callee["inclusive"]["wall_ns"]["total"].as_u64(), "{via} {callee}");
    assert!(!report["notes"].to_string().contains("could not be patched"), "{}", report["notes"]);
}

/// Functions whose own loop comes back into their first five bytes
/// (examples/looped.c) take a 2-byte jump to an island of padding: before
/// the function (`sum_down_saved`) or after its own return (`sum_down`).
/// Every call is counted by the in-process engine, none by uprobes. With a
/// budget small enough that the governor takes their probes out, then stops
/// counting them, the island's jump leads to the counting trampoline, then
/// the padding and the entry are put back: the program runs as it does alone.
#[test]
fn a_function_looping_back_into_its_first_bytes_is_patched_with_a_short_jump() {
    require_probes();
    let binary = Build::c("looped.c", "-O2").build();
    let functions = ["-f", "sum_down", "-f", "sum_down_saved"];
    let report = run_unharmed(&[&["--engine", "inject", "--no-sample"][..], &functions].concat(), &binary, &["100000"]);
    for name in ["sum_down", "sum_down_saved"] {
        let f = function(&report["functions"], name);
        assert_eq!((f["calls"].as_u64(), f["untimed"].as_u64(), f["engine"].as_str()), (Some(100_000), Some(0), Some("inject")), "{f}");
    }
    assert!(!report["notes"].to_string().contains("could not be patched"), "{}", report["notes"]);
    let throttled = run_unharmed(&[&["--engine", "inject", "--overhead-budget", "0.5"][..], &functions].concat(), &binary, &["3000000"]);
    for name in ["sum_down", "sum_down_saved"] {
        assert_eq!(function(&throttled["functions"], name)["engine"].as_str(), Some("inject"));
    }
}

/// A function whose first bytes other code jumps into (hand-written
/// assembly: glibc's `mempcpy` goes on at `memcpy`+3) is not patched: the
/// jump would land in the middle of proftap's. Its calls are counted by
/// uprobes, and the program runs as it does alone.
#[test]
fn a_function_entered_past_its_start_is_left_unpatched() {
    require_probes();
    let binary = Build::c("entered.c", "-O2").build();
    let report = run_unharmed(&["--engine", "inject", "--no-sample", "-f", "inner_target", "-f", "entry_skipper"], &binary, &["1000"]);
    let inner = function(&report["functions"], "inner_target");
    assert_eq!((inner["calls"].as_u64(), inner["engine"].as_str()), (Some(1000), Some("uprobe")), "{inner}");
    let skipper = function(&report["functions"], "entry_skipper");
    assert_eq!((skipper["calls"].as_u64(), skipper["engine"].as_str()), (Some(1000), Some("inject")), "{skipper}");
    assert!(report["notes"].to_string().contains("code elsewhere jumps to its byte 3"), "{}", report["notes"]);
}

/// A patched function the unwinder calls as it walks the stack (the C++
/// personality routine, at every frame a throw crosses) does not hijack
/// the return addresses the unwinder put back for its walk: the throws are
/// caught, and every call is counted as callgrind counts it.
#[test]
fn a_function_the_unwinder_calls_as_it_walks_leaves_the_stack_to_it() {
    require_probes();
    require("valgrind", "as the call-count oracle");
    let args = [INJECT, &["--no-sample", "-f", "libstdc++.so.6:__gxx_personality_v0", "-f", "checks::*", "-f", "main"]].concat();
    let report = proftap_tests::check_calls_against_callgrind(&args, &Build::cxx("shapes.cpp", "-O2"), &["300"]);
    assert!(function(&report["functions"], "__gxx_personality_v0")["calls"].as_u64() > Some(0));
}

/// A static program (no loader to say when its libraries are ready) is
/// patched where its C library calls `_init`, its thread-local storage set
/// up and no constructor run, with glibc and with musl; glibc's `_init`
/// itself, which the engine leaves to a uprobe, is stopped at all the same.
#[test]
fn a_static_program_is_patched_once_its_thread_local_storage_is_set_up() {
    require_probes();
    require("valgrind", "as the call-count oracle");
    require("musl-gcc", "to build a static program on musl");
    let args = [INJECT, &["-f", "calls.c:*"]].concat();
    let builds = [
        Build::c("calls.c", "-O2").flag("-static").no_pie(),
        Build::c("calls.c", "-O2").flag("-static-pie"),
        Build::musl("calls.c", "-O2").flag("-static").no_pie(),
    ];
    for build in builds {
        let report = proftap_tests::check_calls_against_callgrind(&args, &build, &["100", "3"]);
        assert_eq!(function(&report["functions"], "run")["engine"], "inject", "{}", build.label());
        // glibc's `_init`, a function (musl's is a bare label), whose
        // probe is where proftap stops the program too. callgrind does not
        // see its call: one, as the C library makes it.
        if build.lang == Lang::MuslC {
            continue;
        }
        let binary = build.build();
        let report = profile_run(&[INJECT, &["-f", "_init", "-f", "run"]].concat(), &[binary.to_str().unwrap(), "100", "3"]);
        assert_eq!(function(&report["functions"], "_init")["calls"].as_u64(), Some(1), "{}", build.label());
        assert_eq!(function(&report["functions"], "run")["calls"].as_u64(), Some(1), "{}", build.label());
    }
}

/// An attach whose memory cannot all be mapped (the program may address
/// 64 GiB: the 20 GiB reserved for the threads' return addresses fit, the
/// shared memory does not) fails with why and what to do, and takes out
/// what it mapped: the program runs on with the mappings and descriptors
/// it had.
#[test]
fn an_attach_that_cannot_map_its_memory_leaves_nothing_behind() {
    require_probes();
    let binary = Build::c("threads.c", "-O2").build();
    let mut command = Command::new(&binary);
    command.args(["2", "4000000000000", "together"]).stdout(Stdio::null());
    // SAFETY: setrlimit(2) in the child before it executes the program.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit { rlim_cur: 64 << 30, rlim_max: 64 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut program = KilledAtTheEnd(command.spawn().unwrap());
    let pid = program.0.id().to_string();
    while std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count() < 3 {
        std::thread::yield_now();
    }
    let descriptors = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let (mappings, fds) = (mappings_of(&pid), descriptors());
    let dir = tempfile::tempdir().unwrap();
    let out = run(proftap()
        .args(["attach", "--engine", "inject", "--no-sample", "-f", "work", "--duration", "100ms", "-o"])
        .arg(dir.path().join("p.profile"))
        .arg(&pid));
    assert_clean_failure(&out, "Cannot allocate memory");
    assert_clean_failure(&out, "`--engine uprobe` records it with kernel probes instead");
    assert!(program.0.try_wait().unwrap().is_none(), "the program runs on");
    assert_eq!((mappings_of(&pid), descriptors()), (mappings, fds));
}

/// Attaching to a busy program again and again: at each detach its threads
/// are as often as not inside proftap's code, and are stepped out of it, so
/// that everything mapped goes: ten attaches all succeed, and the program
/// runs on unharmed with no more mappings than before.
#[test]
fn attaching_to_busy_threads_again_and_again_leaves_nothing_behind() {
    require_probes();
    let binary = Build::c("threads.c", "-O2").build();
    // Busy for hours (17 s at 4 G calls a thread ran out in a slow first
    // attach), killed at the end.
    let mut program = KilledAtTheEnd(Command::new(&binary).args(["3", "4000000000000", "together"]).stdout(Stdio::null()).spawn().unwrap());
    let pid = program.0.id().to_string();
    // Its threads' stacks are mappings of its own: counted once all are made.
    while std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count() < 4 {
        std::thread::yield_now();
    }
    let mappings = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().lines().count();
    let descriptors = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let (before, descriptors_before) = (mappings(), descriptors());
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=10 {
        let file = dir.path().join(format!("{round}.profile"));
        let out = run(proftap().args(["attach", "--no-sample", "-f", "work", "--duration", "100ms", "-o"]).arg(&file).arg(&pid));
        assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(calls_by_name(&report_json(&file))["work"] > 0, "round {round}");
    }
    let (after, descriptors_after) = (mappings(), descriptors());
    assert!(program.0.try_wait().unwrap().is_none(), "the program runs on");
    assert!(after <= before + 1, "{before} mappings before, {after} after");
    assert_eq!(descriptors_after, descriptors_before, "the off-CPU array's descriptor is closed at each detach");
}

/// Detaching while a signal handler runs that interrupted proftap's code
/// (examples/alarm.c lingers in its handler most of the time, and its
/// loop is mostly proftap's code while patched): returning from the
/// handler goes there, so the code stays until the threads have left it.
/// Every attach succeeds, and the program runs on unharmed with no more
/// mappings than before.
#[test]
fn detaching_while_a_signal_handler_interrupted_proftaps_code_leaves_the_program_whole() {
    detach_again_and_again_from_alarm("linger", 8);
}

/// The same, with the handler in a function whose frame takes 256 KiB of
/// the stack: the signal's frame is found that far up too.
#[test]
fn detaching_while_a_deep_signal_handler_interrupted_proftaps_code_leaves_the_program_whole() {
    detach_again_and_again_from_alarm("linger-deep", 4);
}

/// The same, with that handler interrupted in turn by one running on an
/// alternate signal stack (examples/alarm.c nested): the outer handler's
/// frame is on the stack the inner one interrupted, not on the one the
/// thread is on.
#[test]
fn detaching_while_a_handler_on_an_alternate_stack_interrupted_one_that_interrupted_proftaps_code_leaves_the_program_whole() {
    detach_again_and_again_from_alarm("nested", 8);
}

/// Detaching from a thread whose signal handler interrupted proftap's code
/// and is entered again each time it returns (examples/alarm.c relay: the
/// handler stays and raises its signal again; the first is sent once the
/// function is patched, when the loop is mostly proftap's code): on its own the thread
/// never leaves that code. The detach lets it return with the signal
/// held back, steps it out and unmaps all it mapped.
#[test]
fn detaching_from_a_handler_entered_again_as_it_returns_unmaps_all_and_the_program_runs_on() {
    require_probes();
    let (mut program, pid) = alarm_started("relay");
    let mappings = || mappings_of(&pid);
    let before = mappings();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("relay.profile");
    let args = ["attach", "--engine", "inject", "--no-sample", "-f", "work", "--duration", "300ms", "-o"];
    let mut attach = proftap().args(args).arg(&file).arg(&pid).stderr(Stdio::piped()).spawn().unwrap();
    let mut said = String::new();
    let mut stderr = BufReader::new(attach.stderr.take().unwrap());
    while !said.contains("attached to process") {
        assert!(stderr.read_line(&mut said).unwrap() > 0, "proftap said: {said}");
    }
    run_ok(Command::new("kill").args(["-ALRM", &pid]));
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    assert!(attach.wait().unwrap().success(), "{said}");
    assert!(calls_by_name(&report_json(&file))["work"] > 2, "the handler ran again and again");
    assert!(program.0.try_wait().unwrap().is_none(), "the program ended: {:?}", program.0.try_wait());
    let after = mappings();
    assert!(after <= before + 1, "{before} mappings before, {after} after");
}

/// Attaching again and again to a program sent a real-time signal every
/// 20 µs (examples/queued.c): a signal that stops a thread while proftap
/// holds, steps or runs it is passed on, as real-time signals are queued,
/// never merged, and each one sent must arrive once, with its value, in
/// the order sent.
/// (nix's wait refuses their stops: the attach failed, or the signal was
/// lost.)
#[test]
fn attaching_to_a_program_sent_real_time_signals_loses_none_of_them() {
    require_probes();
    let (mut program, pid) = started_with_input(&mut Command::new(Build::c("queued.c", "-O2").flag("-pthread").build()));
    attach_again_and_again(&pid, 6);
    let said = said_at_the_end(&mut program);
    let counts: Vec<&str> = said.split_whitespace().collect();
    assert!(counts.len() == 8 && counts[0] == counts[2] && counts[5] == "equal," && said.ends_with(" in order\n"), "{said}");
    assert!(counts[0].parse::<u64>().unwrap() > 1000, "{said}");
}

/// Attaching again and again to a threaded program that changes its user
/// id all the time (examples/setxid.c): the C library's signal for it,
/// held while proftap holds a thread, is passed on as it came, from the
/// process itself, which is all the C library heeds; else setuid() never
/// returns.
#[test]
fn attaching_to_a_threaded_program_changing_its_user_id_lets_it_go_on() {
    require_probes();
    let binary = Build::c("setxid.c", "-O2").flag("-pthread").build();
    let (mut program, pid) = started_with_input(Command::new(binary).arg("1"));
    attach_again_and_again(&pid, 16);
    let said = said_at_the_end(&mut program);
    assert!(said.ends_with(" changes\n"), "{said}");
}

/// `command` run with its input and output piped, once it said "started";
/// and its pid.
fn started_with_input(command: &mut Command) -> (KilledAtTheEnd, String) {
    let mut program = KilledAtTheEnd(command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap());
    let pid = program.0.id().to_string();
    let mut said = String::new();
    BufReader::new(program.0.stdout.as_mut().unwrap()).read_line(&mut said).unwrap();
    assert_eq!(said, "started\n");
    (program, pid)
}

/// Attaches `rounds` times to process `pid` with the in-process engine,
/// 100 ms each, recording `work`: every attach succeeds and counts calls.
fn attach_again_and_again(pid: &str, rounds: u32) {
    attach_again_and_again_checking(pid, rounds, |_| {});
}

/// `attach_again_and_again`, with `check(round)` after each round.
fn attach_again_and_again_checking(pid: &str, rounds: u32, mut check: impl FnMut(u32)) {
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=rounds {
        let file = dir.path().join(format!("{round}.profile"));
        let args = ["attach", "--engine", "inject", "--no-sample", "-f", "work", "--duration", "100ms", "-o"];
        let out = run(proftap().args(args).arg(&file).arg(pid));
        assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(calls_by_name(&report_json(&file))["work"] > 0, "round {round}");
        check(round);
    }
}

/// What a program started by `started_with_input` says once its input
/// ends; it must end, successfully, within 30 s.
fn said_at_the_end(program: &mut KilledAtTheEnd) -> String {
    drop(program.0.stdin.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = program.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the program did not end after its input did");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
    let mut said = String::new();
    std::io::Read::read_to_string(program.0.stdout.as_mut().unwrap(), &mut said).unwrap();
    said
}

/// examples/alarm.c in `mode` (one that lingers in its handler), run until
/// killed, once its loop started; and its pid.
fn alarm_started(mode: &str) -> (KilledAtTheEnd, String) {
    let binary = Build::c("alarm.c", "-O2").build();
    let mut program = KilledAtTheEnd(Command::new(&binary).args(["4000000000000", mode]).stdout(Stdio::piped()).spawn().unwrap());
    let pid = program.0.id().to_string();
    let mut started = String::new();
    BufReader::new(program.0.stdout.take().unwrap()).read_line(&mut started).unwrap();
    assert_eq!(started, "started\n");
    (program, pid)
}

/// How many mappings process `pid` has.
fn mappings_of(pid: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().lines().count()
}

/// Attaches `rounds` times to examples/alarm.c in `mode`, 100 ms each:
/// every attach succeeds, the program runs on, with at most one mapping
/// more than before.
fn detach_again_and_again_from_alarm(mode: &str, rounds: u32) {
    require_probes();
    let (mut program, pid) = alarm_started(mode);
    let mappings = || mappings_of(&pid);
    let before = mappings();
    attach_again_and_again_checking(&pid, rounds, |round| {
        assert!(program.0.try_wait().unwrap().is_none(), "round {round}: the program ended: {:?}", program.0.try_wait());
    });
    let after = mappings();
    assert!(after <= before + 1, "{before} mappings before, {after} after");
}

/// Attaching again and again to a program whose functions take short
/// jumps to islands (examples/looped.c, one island before its function,
/// one after its own return): each detach puts the padding and the entry
/// back, and a thread about to take an island's jump goes on from the
/// entry; the program's answer is the sum its calls make.
#[test]
fn attaching_to_functions_patched_through_islands_again_and_again_leaves_them_whole() {
    require_probes();
    let binary = Build::c("looped.c", "-O2").build();
    let program = Command::new(&binary).arg("0").stdout(Stdio::piped()).spawn().unwrap();
    let pid = program.id().to_string();
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=5 {
        let file = dir.path().join(format!("{round}.profile"));
        let args = ["attach", "--engine", "inject", "--no-sample", "-f", "sum_down", "-f", "sum_down_saved", "--duration", "100ms", "-o"];
        let out = run(proftap().args(args).arg(&file).arg(&pid));
        assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        let report = report_json(&file);
        for name in ["sum_down", "sum_down_saved"] {
            let f = function(&report["functions"], name);
            assert!(f["calls"].as_u64() > Some(0) && f["engine"] == "inject", "round {round}: {f}");
        }
    }
    run_ok(Command::new("kill").args(["-USR1", &pid]));
    let out = program.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let (made, sum) = printed.trim().split_once(' ').unwrap_or_else(|| panic!("{:?}: {printed:?}", out.status));
    let triangle = |n: u64| n * (n + 1) / 2;
    let expected: u64 = (0..made.parse::<u64>().unwrap()).map(|i| triangle(i % 7 + 1) + triangle(i % 5 + 1) + triangle(i % 3 + 1)).sum();
    assert_eq!((out.status.code(), sum.parse::<u64>().unwrap()), (Some(0), expected), "after {made} calls of each");
}

/// Starts `proftap attach ARGS PID` and waits until its probes are live.
fn attach(pid: i32, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let (child, said) = attach_saying(pid, args, file);
    assert!(said.starts_with("proftap: attached to process"), "unexpected: {said}");
    child
}

/// The same, and what it said up to its probes being live.
fn attach_saying(pid: i32, args: &[&str], file: &std::path::Path) -> (std::process::Child, String) {
    let mut child = proftap().arg("attach").arg("-o").arg(file).args(args).arg(pid.to_string()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "ended before its probes were live: {said}");
        said.push_str(&line);
        if line.contains("attached to process") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, said)
}

/// A process that refuses itself executable memory (a seccomp filter on
/// `mmap`, as SELinux without `execmem` refuses it too): with the engine
/// left to proftap, its functions are those the in-process engine could
/// not patch, and said to be; the one named gets a kernel probe and every
/// call counted. Asked for by name, the engine's refusal is the answer.
#[test]
fn a_process_refusing_executable_memory_is_attached_to_with_kernel_probes() {
    require_probes();
    let binary = Build::c("wait.c", "-O2").build();
    let mut command = Command::new(&binary);
    command.arg("noexec");
    let mut waiter = Waiter::start_command(command);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = attach(waiter.pid, &["-f", "tick"], &file);
    assert_eq!(waiter.tick(1234), 1234);
    interrupt(&mut profiler);
    let report = report_json(&file);
    let tick = function(&report["functions"], "tick");
    assert_eq!((tick["calls"].as_u64(), tick["engine"].as_str()), (Some(1234), Some("uprobe")), "{tick}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("the process refuses proftap's code (mmap in process") && notes.contains("Operation not permitted"), "{notes}");
    let out = run(proftap()
        .args(["attach", "--engine", "inject", "-f", "tick", "--duration", "100ms", "-o"])
        .arg(&file)
        .arg(waiter.pid.to_string()));
    assert_clean_failure(&out, "`--engine uprobe` records it with kernel probes instead");
    assert_eq!(waiter.tick(1), 1235);
}

#[test]
fn a_killed_profiler_leaves_the_program_running() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &file);
    assert_eq!(waiter.tick(1000), 1000);
    profiler.kill().unwrap();
    profiler.wait().unwrap();
    // Its jumps stay, and record into rings no one reads: they fill and drop.
    assert_eq!(waiter.tick(3_000_000), 3_001_000);
    assert!(!file.exists());
    // Patching it again is refused, and why is said.
    let again = dir.path().join("again.profile");
    let out = run(proftap()
        .args(["attach", "--engine", "inject", "-f", "tick", "--duration", "100ms", "-o"])
        .arg(&again)
        .arg(waiter.pid.to_string()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        if again.exists() { report_json(&again)["notes"].to_string() } else { String::new() }
    );
    assert!(said.contains("an earlier proftap recording's memory: most likely a patch that recording left"), "{said}");
    // Kernel probes would run the file's first instruction of tick where
    // the process has the jump left: tick is left alone, and said to be.
    let second = dir.path().join("uprobes.profile");
    let (mut profiler, said) = attach_saying(waiter.pid, &["--engine", "uprobe", "-f", "tick", "-f", "main"], &second);
    assert!(said.contains("warning: not recorded: tick (their code in memory was not what the file holds)"), "{said}");
    // Of the two functions asked for, main alone is probed.
    assert!(said.contains(&format!("attached to process {}: 1 function probed", waiter.pid)), "{said}");
    assert_eq!(waiter.tick(1000), 3_002_000);
    interrupt(&mut profiler);
    let report = report_json(&second);
    let notes = report["notes"].to_string();
    assert!(notes.contains("not recorded: tick (their code in memory was not what the file holds)"), "{notes}");
    let (rest, status) = waiter.finish();
    assert_eq!(rest, "done 3002000\n");
    assert!(status.success());
}

/// A second proftap asked to patch a process one records is told so, and
/// leaves it alone; once the first has detached, the process can be
/// recorded again.
#[test]
fn a_process_is_patched_by_one_recording_at_a_time() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let (first, second, third) = (dir.path().join("1.profile"), dir.path().join("2.profile"), dir.path().join("3.profile"));
    let mut profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &first);
    assert_eq!(waiter.tick(1000), 1000);
    let out = run(proftap()
        .args(["attach", "--engine", "inject", "-f", "tick", "--duration", "1s", "-o"])
        .arg(&second)
        .arg(waiter.pid.to_string()));
    assert_clean_failure(&out, &format!("cannot patch process {}: another proftap is recording it already", waiter.pid));
    assert!(!second.exists());
    assert_eq!(waiter.tick(1000), 2000);
    interrupt(&mut profiler);
    assert_eq!(function(&report_json(&first)["functions"], "tick")["calls"].as_u64(), Some(2000));
    let mut again = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &third);
    assert_eq!(waiter.tick(500), 2500);
    interrupt(&mut again);
    assert_eq!(function(&report_json(&third)["functions"], "tick")["calls"].as_u64(), Some(500));
    let (rest, status) = waiter.finish();
    assert_eq!(rest, "done 2500\n");
    assert!(status.success());
}

/// A process that ends while proftap is attached to it: the recording
/// ends with it, and the profile says it ended (how is its parent's to
/// know); one that outlives the recording does not.
#[test]
fn an_attached_process_that_ends_is_said_to_have_ended() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let binary = Build::c("wait.c", "-O2").build();
    let (ends, lives) = (dir.path().join("ends.profile"), dir.path().join("lives.profile"));
    let mut waiter = Waiter::start(&binary);
    let mut profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &ends);
    assert_eq!(waiter.tick(100), 100);
    let (rest, status) = waiter.finish();
    assert_eq!((rest.as_str(), status.success()), ("done 100\n", true));
    assert!(profiler.wait().unwrap().success());
    let report = report_json(&ends);
    assert_eq!(report["target"]["ended"], true, "{}", report["target"]);
    let text = run_ok(proftap().arg("report").arg(&ends));
    assert!(text.lines().next().unwrap().ends_with("ended while recorded)"), "{text}");

    let mut waiter = Waiter::start(&binary);
    let mut profiler = attach(waiter.pid, &["--engine", "inject", "-f", "tick"], &lives);
    assert_eq!(waiter.tick(100), 100);
    interrupt(&mut profiler);
    assert_eq!(report_json(&lives)["target"]["ended"], false);
    assert!(waiter.finish().1.success());
}

/// Stops a `proftap attach` as Ctrl-C would, and waits for it to write its profile.
fn interrupt(profiler: &mut std::process::Child) {
    // SAFETY: kill(2) on a child this test started and has not waited for.
    assert_eq!(unsafe { libc::kill(profiler.id() as i32, libc::SIGINT) }, 0);
    assert!(profiler.wait().unwrap().success());
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

/// A thread that ends by `pthread_exit` from within patched calls: they
/// never return, and end as the thread does, not with the recording.
#[test]
fn calls_a_thread_exits_from_end_as_the_thread_does() {
    require_probes();
    let binary = Build::c("exits.c", "-O2").build();
    let report = profile_like_bare(&binary, &["-f", "leave_from", "-f", "exiting", "-f", "work"], &["300000000"]);
    let functions = &report["functions"];
    let leave_from = function(functions, "leave_from");
    assert_eq!((leave_from["calls"].as_u64(), leave_from["unfinished"].as_u64()), (Some(4), Some(4)), "{leave_from}");
    // The main thread's work after the thread had ended is far longer.
    let wall = |name: &str| function(functions, name)["inclusive"]["wall_ns"]["total"].as_u64().unwrap();
    assert!(wall("exiting") * 10 < wall("work"), "exiting {} ns, work {} ns", wall("exiting"), wall("work"));
}

#[test]
fn a_rust_panic_caught_by_catch_unwind() {
    require_probes();
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
    require_probes();
    for opt in ["-O0", "-O2"] {
        let binary = Build::c("backtrace.c", opt).flag("-rdynamic").build();
        // The output names every frame: backtrace() met no trampoline.
        let report = profile_like_bare(&binary, &[], &["10"]);
        let calls = calls_by_name(&report);
        assert_eq!((calls["outer"], calls["middle"], calls["inner"], calls["walk"]), (10, 30, 30, 30), "{opt}");
        // And every call returned through the trampoline, timed to its end,
        // walk's too, which at -O2 jumps to backtrace().
        for f in report["functions"].as_array().unwrap() {
            assert_eq!(f["unwound"], 0, "{opt}: {f}");
        }
    }
}

#[test]
fn a_stack_walk_in_a_handler_on_an_alternate_stack_above_sees_the_interrupted_calls() {
    require_probes();
    let binary = Build::c("altstack.c", "-O2").build();
    // The output says how deep the walks were: as deep as bare, through
    // the trampolines of the calls the signal interrupted.
    let report = profile_like_bare(&binary, &["-f", "outer", "-f", "inner", "-f", "walk", "-f", "main"], &["50"]);
    let calls = calls_by_name(&report);
    assert!(calls["inner"] > 50 && calls["walk"] == 50, "{calls:?}");
    for f in report["functions"].as_array().unwrap() {
        assert_eq!(f["unwound"], 0, "{f}");
    }
}

/// A timer's handler (10 kHz) that calls a patched function and walks the
/// stack, as a sampling profiler's does, often lands while an exception
/// unwinds: the unwinder goes on once it returns, and must still find the
/// return addresses it was given back. On the thread's stack, and on an
/// alternate signal stack apart or above the frames it interrupted.
#[test]
fn a_signal_handler_that_walks_the_stack_while_an_exception_unwinds_leaves_the_unwinder_whole() {
    require_probes();
    let binary = Build::cxx("walkthrow.cpp", "-O2").build();
    const ROUNDS: u64 = 300_000;
    // check() is called on i, i + 1, ... until it throws at a multiple of 3.
    let checks: u64 = (0..ROUNDS).map(|i| 3 - (i + 2) % 3).sum();
    for (stack, walk) in [("same", "walk"), ("heap", "walk"), ("frame", "walk"), ("heap", "call"), ("frame", "call")] {
        let rounds = ROUNDS.to_string();
        let extra = ["-f", "check", "-f", "validate", "-f", "tick", "-f", "main"];
        let report = profile_like_bare(&binary, &extra, &[&rounds, stack, walk]);
        let counts = |name: &str| {
            let f = function(&report["functions"], name);
            (f["calls"].as_u64().unwrap(), f["unwound"].as_u64().unwrap())
        };
        assert_eq!(counts("check(int)"), (checks, ROUNDS), "{stack} {walk}");
        assert_eq!(counts("validate(int)"), (ROUNDS, ROUNDS), "{stack} {walk}");
        assert_eq!(counts("main"), (1, 0), "{stack} {walk}");
        assert!(counts("tick(long)").0 > 0, "{stack} {walk}: the timer never fired");
    }
}

#[test]
fn other_metrics_are_refused_with_a_reason() {
    require_probes();
    let out = run(proftap()
        .args(["run", "--engine", "inject", "--metric", "wall,page-faults", "--"])
        .arg(Build::c("calls.c", "-O0").build())
        .arg("5"));
    assert_clean_failure(&out, "wall and CPU time only");
}

#[test]
fn shared_library_functions_are_patched_too() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    build_libcounter(dir.path());
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

/// An executable stripped of every symbol (most a distribution ships):
/// a library's functions named are recorded all the same, and the profile
/// names the program, not the library.
#[test]
fn a_librarys_functions_are_recorded_in_a_program_without_symbols() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    build_libcounter(dir.path());
    let uselib = build_uselib(dir.path());
    run_ok(Command::new("strip").arg("--strip-all").arg(&uselib));
    let report = profile_like_bare(&uselib, &["-f", "libcounter.so:counter_add"], &["1000"]);
    assert_eq!(function(&report["functions"], "counter_add")["calls"], 1000);
    assert_eq!(report["target"]["exe"].as_str(), uselib.to_str(), "{}", report["target"]);
}

#[test]
fn attach_to_a_program_whose_exceptions_cross_patched_frames() {
    require_probes();
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

/// A child forked 140,001 calls deep carries over the frames that have a
/// context (the node table holds 131,071 besides the thread's), returns
/// from all of them, and is read.
#[test]
fn a_child_forked_deeper_than_the_contexts_a_thread_keeps_is_read() {
    require_probes();
    let binary = Build::c("deep.c", "-O2").build();
    let report = profile_run(&["--engine", "inject", "--no-sample", "-f", "down"], &[binary.to_str().unwrap(), "140000", "1", "1"]);
    let notes = report["notes"].to_string();
    assert!(!notes.contains("child_not_read") && !notes.contains("could not be read"), "{notes}");
    let parent = report["target"]["pid"].as_i64().unwrap();
    let threads = report["threads"].as_array().unwrap();
    let child = threads.iter().find(|t| t["pid"].as_i64() != Some(parent)).unwrap_or_else(|| panic!("no child in {threads:?}"));
    let down = child["functions"].as_array().unwrap().iter().find(|f| f["name"] == "down").expect("the child's down");
    assert_eq!((down["calls"].as_u64(), down["carried"].as_u64()), (Some(0), Some(131_071)), "{down}");
}

#[test]
fn a_recursion_100_000_deep_is_counted_and_timed_call_by_call() {
    require_probes();
    let binary = Build::c("deep.c", "-O2").build();
    // down() nests 100,001 deep, twice.
    let report = profile_run(&["--engine", "inject", "-f", "down"], &[binary.to_str().unwrap(), "100000", "2"]);
    let down = function(&report["functions"], "down");
    assert_eq!(down["calls"], 2 * 100_001);
    assert_eq!(report["lost_events"], 0);
    let notes = report["notes"].to_string();
    assert!(!notes.contains("not timed"), "{notes}");
    // Inclusive counts the outermost frames only: each round's outermost
    // call takes more than the 100,000 below it in exclusive time.
    let incl = stat(down, "inclusive", "wall_ns", "total");
    let excl = stat(down, "exclusive", "wall_ns", "total");
    assert!(incl > 0 && excl == incl, "inclusive {incl}, exclusive {excl}");
    // The JSON tree stops nesting where JSON readers would; the rest is counted.
    let mut node = &report["tree"];
    let mut depth = 0;
    while let Some(child) = node["children"].as_array().and_then(|c| c.first()) {
        node = child;
        depth += 1;
    }
    assert_eq!(depth, 60);
    assert!(node["nodes_left_out"].as_u64().unwrap() > 90_000, "{node}");
}

#[test]
fn the_default_engine_is_this_one_unless_the_recording_needs_uprobes() {
    require_probes();
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
    // Line counts come from counters patched in; line times need probes.
    assert_eq!(engine(&["--lines"], &[calls, "10", "3"]), ("inject".into(), String::new()));
    let (chosen, why) = engine(&["--lines", "--line-times"], &[calls, "10", "3"]);
    assert!(chosen == "uprobe" && why.contains("line times"), "{chosen}: {why}");
    // A cancelled thread is unwound by libgcc_s, which glibc loads only
    // then: its link to it is hooked instead, where the C library has one
    // (glibc 2.34 and later), else uprobes see the program.
    let cancel = Build::c("cancel.c", "-O2").build();
    let (chosen, why) = engine(&["-f", "wait_here"], &[cancel.to_str().unwrap()]);
    match c_library_links_the_unwinder() {
        true => assert_eq!((chosen.as_str(), why.as_str()), ("inject", "")),
        false => assert!(chosen == "uprobe" && why.contains("pthread_cancel"), "{chosen}: {why}"),
    }
}

#[test]
fn a_thread_cancelled_in_a_callback_unwinds_past_the_patched_frames() {
    require_probes();
    // The thread waits in a filter scandir calls; glibc loads libgcc_s to
    // unwind it as it is cancelled, too late to be patched. Where the
    // unwinder met a patched frame's return trampoline it stopped, and
    // scandir's cleanup below left its directory open (closed=0).
    let cancel = Build::c("cancel.c", "-O2").build();
    assert_eq!(run_ok(&mut Command::new(&cancel)), "cancelled=1 closed=1\n");
    let report = run_unharmed(&[], &cancel, &[]);
    // Where the C library has no link to hook, uprobes see the program.
    let engine = if c_library_links_the_unwinder() { "inject" } else { "uprobe" };
    assert_eq!(report["recording"]["engine"], engine);
    let functions = &report["functions"];
    for name in ["keep", "wait_here", "cancel_it"] {
        assert_eq!(function(functions, name)["calls"], 1, "{name}");
    }
    // The thread that cancels goes on with its returns seen.
    for name in ["main", "cancel_it"] {
        let f = function(functions, name);
        assert!(f["unwound"] == 0 && f["unfinished"] == 0, "{f}");
    }
}

#[test]
fn threads_past_the_engines_blocks_are_all_timed() {
    require_probes();
    // 4,200 threads one after another, 4,096 blocks: those of threads that
    // ended are read and taken again. Then a child forked with every block
    // once taken makes 20 threads: its blocks are its own.
    let report = profile_like_bare(&Build::c("churn.c", "-O2").build(), &["-f", "leaf"], &["4200", "fork", "20"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["leaf"], 42_200);
    let threads = report["threads"].as_array().unwrap();
    let with_leaf = |pid: Option<i64>| {
        let with = |t: &&serde_json::Value| t["functions"].as_array().is_some_and(|f| !f.is_empty());
        threads.iter().filter(|t| pid.is_none_or(|pid| t["pid"].as_i64() == Some(pid))).filter(with).count()
    };
    assert_eq!(with_leaf(None), 4_220, "every thread's calls, timed, in a thread of its own");
    assert_eq!(with_leaf(report["target"]["pid"].as_i64()), 4_200, "the parent's threads");
    let notes = report["notes"].to_string();
    assert!(!notes.contains("not timed"), "{notes}");
}

#[test]
fn thousands_of_threads_alive_at_once_are_all_timed() {
    require_probes();
    // 2,000 threads, every one alive while any calls: a block each.
    let report = profile_like_bare(&Build::c("threads.c", "-O2").build(), &["-f", "work"], &["2000", "100", "together"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["work"], 2_000 * 100 + 100);
    let threads = report["threads"].as_array().unwrap();
    let with_work = threads.iter().filter(|t| t["functions"].as_array().is_some_and(|f| !f.is_empty())).count();
    assert_eq!(with_work, 2_001, "every thread's calls, timed, in a thread of its own");
    assert_eq!(report["lost_events"], 0);
    let notes = report["notes"].to_string();
    assert!(!notes.contains("not timed"), "{notes}");
}

#[test]
fn a_program_executing_itself_again_is_recorded_to_its_exec_and_said_to_have() {
    require_probes();
    let binary = Build::c("execs.c", "-O2").build();
    // 3,000 calls, then the same program again for 20,000,000, unpatched.
    let report = profile_like_bare(&binary, &["--no-sample", "-f", "main", "-f", "work"], &["3000", "20000000"]);
    let work = function(&report["functions"], "work");
    assert_eq!(work["calls"], 3000, "{work}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("executed execs"), "{notes}");
    // Its first main never returned: it ended at the exec, well before the
    // second image's calls end the recording.
    assert_ended_well_before_the_recording(&report, "main");
}

/// `name`'s one call took less than half of the recording `report`: it
/// ended at the exec, well before the second image's calls end the recording.
fn assert_ended_well_before_the_recording(report: &serde_json::Value, name: &str) {
    let f = function(&report["functions"], name);
    let (inclusive, recorded) =
        (f["inclusive"]["wall_ns"]["total"].as_u64().unwrap(), report["recording"]["duration_ns"].as_u64().unwrap());
    assert!(inclusive < recorded / 2, "{name} {inclusive} ns of a {recorded} ns recording");
}

/// The exec ends every other thread of the process (the kernel kills
/// them): a call in progress in one of them ends with the image, as the
/// executing thread's do, not when the recording ends.
#[test]
fn a_call_in_progress_in_a_thread_an_exec_ended_ends_with_the_image() {
    require_probes();
    let binary = Build::c("execs.c", "-O2").build();
    let report = profile_like_bare(&binary, &["--no-sample", "-f", "main", "-f", "work", "-f", "parked"], &["3000", "thread"]);
    assert_eq!(function(&report["functions"], "work")["calls"], 3000);
    let parked = function(&report["functions"], "parked");
    assert_eq!(parked["calls"], 1, "{parked}");
    assert_ended_well_before_the_recording(&report, "parked");
}

#[test]
fn detaching_from_a_process_that_executed_itself_again_writes_nothing_in_its_new_image() {
    require_probes();
    let binary = Build::c("execs.c", "-O2").build();
    let mut command = Command::new(&binary);
    command.args(["0", "0"]).stdout(Stdio::piped());
    // Without address randomization the new image lies where the old one
    // did: whatever proftap would write at the old addresses would land in it.
    // SAFETY: personality(2) in the child before it executes the program.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            Ok(())
        })
    };
    let mut program = KilledAtTheEnd(command.spawn().unwrap());
    let pid = program.0.id() as i32;
    let mut out = BufReader::new(program.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = attach(pid, &["--engine", "inject", "--no-sample", "-f", "work"], &file);
    let usr1 = || assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    usr1();
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n", "after {first}");
    interrupt(&mut profiler);
    let report = report_json(&file);
    let notes = report["notes"].to_string();
    assert!(notes.contains("executed execs") && !notes.contains("restore"), "{notes}");
    // Those of its calls made while attached, before the exec (none if the
    // signal came as the attach let it go).
    let made: u64 = first.split_whitespace().next().unwrap().parse().unwrap();
    let calls = calls_by_name(&report).get("work").copied().unwrap_or(0);
    assert!(calls <= made, "{calls} of {first}");
    // The new image runs on whole: its calls add up, and it ends well.
    usr1();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(program.0.wait().unwrap().success(), "{rest}");
    let (made, sum) = rest.trim().split_once(' ').unwrap_or_else(|| panic!("{rest:?}"));
    let expected: u64 = (0..made.parse::<u64>().unwrap()).map(|i| i % 7 + 1).sum();
    assert_eq!(sum.parse::<u64>().unwrap(), expected, "after {made} calls");
}

#[test]
fn a_forked_child_that_executed_another_program_is_left_to_it() {
    require_probes();
    let binary = Build::c("execs.c", "-O2").build();
    // The parent ends while its child, which made a call, runs `sleep`:
    // nothing of the parent's image is left in the child to restore.
    let report = profile_like_bare(&binary, &["-f", "work"], &["1000", "fork"]);
    let notes = report["notes"].to_string();
    assert!(notes.contains("executed sleep") && !notes.contains("could not restore"), "{notes}");
    assert_eq!(function(&report["functions"], "work")["calls"], 1001, "{notes}");
}

#[test]
fn a_forked_child_of_a_process_that_executed_itself_again_is_governed_and_restored() {
    require_probes();
    let binary = Build::c("execs.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    // The child calls work() in a loop on the patched image; its parent
    // executes itself again at once. The governor takes work() out of the
    // child after the exec, and the end restores the child.
    let mut profiler = KilledAtTheEnd(
        proftap()
            .args(["run", "--engine", "inject", "--no-sample", "-o"])
            .arg(&file)
            .arg("--")
            .arg(&binary)
            .args(["1000", "keep"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(profiler.0.stdout.take().unwrap());
    let (mut child, mut parent, mut started) = (0, 0, 0);
    while child == 0 || started < 2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the program ended early");
        if let Some(pids) = line.strip_prefix("child ") {
            let (c, p) = pids.trim().split_once(' ').unwrap();
            (child, parent) = (c.parse().unwrap(), p.parse().unwrap());
        }
        started += usize::from(line == "started\n");
    }
    let _killed_at_the_end = [ProcessKilledAtTheEnd(child), ProcessKilledAtTheEnd(parent)];
    let mut stderr = BufReader::new(profiler.0.stderr.take().unwrap());
    let (tell, throttled) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut told = String::new();
        while stderr.read_line(&mut told).is_ok_and(|read| read > 0) {
            if told.contains("removed the probes of work") {
                let _ = tell.send(());
            }
            told.clear();
        }
    });
    // A guard against a hang, not a wait for a race: work() is throttled
    // within milliseconds of its first calls.
    throttled.recv_timeout(std::time::Duration::from_secs(60)).expect("proftap did not throttle work() in the child");
    let usr1 = |pid: i32| assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    usr1(parent);
    assert!(profiler.0.wait().unwrap().success());
    let notes = report_json(&file)["notes"].to_string();
    assert!(notes.contains("executed execs") && !notes.contains("could not restore"), "{notes}");
    // Nothing of proftap's is left in the child, which runs on whole.
    let maps = std::fs::read_to_string(format!("/proc/{child}/maps")).unwrap();
    assert!(!maps.contains("proftap"), "{maps}");
    usr1(child);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let sums: Vec<(u64, u64)> =
        rest.lines().filter_map(|l| l.split_once(' ')).map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).collect();
    assert_eq!(sums.len(), 2, "{rest}");
    // The sum of i % 7 + 1 over 0..made: 28 a week, then the days left.
    let expected = |made: u64| made / 7 * 28 + (1..=made % 7).sum::<u64>();
    for (made, sum) in sums {
        assert_eq!(sum, expected(made), "after {made} calls");
    }
}

/// A process a test did not start, killed if the test ends before it did.
struct ProcessKilledAtTheEnd(i32);

impl Drop for ProcessKilledAtTheEnd {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid the test was told of; at worst it has ended.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// A program a test started, killed if the test ends before it did.
struct KilledAtTheEnd(std::process::Child);

impl Drop for KilledAtTheEnd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A patched process maps the pages of the off-CPU array its threads read
/// (and those of the next thread ids as it starts), not the whole array
/// (64 MiB where thread ids go up to 4 M, copied at each fork and torn
/// down at each exit); a forked child whose thread id is past those maps
/// its own thread's page (examples/offcpu.c), and the CPU time of every
/// call, the child's too, leaves out its sleep.
#[test]
fn a_process_maps_only_its_threads_pages_of_the_off_cpu_array_and_a_child_its_own() {
    require_probes();
    let binary = Build::c("offcpu.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let out = run_ok(proftap().args(["run", "-f", "nap", "--no-sample", "-o"]).arg(&file).arg("--").arg(&binary).arg("4"));
    let resident: Vec<(&str, u64, u64)> = out
        .lines()
        .map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            (words[0], words[1].parse().unwrap(), words[2].parse().unwrap())
        })
        .collect();
    let [("parent", parent_kb, parent_pages), ("child", child_kb, child_pages)] = resident[..] else { panic!("{out}") };
    // Its threads' pages, and the 32 ahead at most.
    assert!(parent_kb > 0 && parent_kb <= 4 * (parent_pages + 32), "{out}");
    assert!(child_pages > parent_pages, "the child's thread id is past its parent's page: {out}");
    assert_eq!(child_kb, parent_kb + 4, "the child maps its own page: {out}");
    let report = report_json(&file);
    let nap = function(&report["functions"], "nap");
    // Four threads' and the parent's 20 ms, the child's 100 ms.
    assert_eq!(nap["calls"], 6);
    let (wall, cpu) = (nap["inclusive"]["wall_ns"]["total"].as_u64().unwrap(), nap["inclusive"]["cpu_ns"]["total"].as_u64().unwrap());
    assert!(wall >= 195_000_000, "{nap}");
    assert!(cpu < 10_000_000, "{nap}");
}

/// A program that closes the descriptors it did not open closes the one
/// the off-CPU array is mapped from: its threads made soon after have
/// their pages mapped already, but its child, whose thread id is past
/// those, cannot map its own, and the profile says so: its call's CPU
/// time is its wall time. Every call is counted, and the program is
/// unharmed.
#[test]
fn threads_whose_off_cpu_page_cannot_be_mapped_are_counted_and_said() {
    require_probes();
    let binary = Build::c("offcpu.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    run_ok(proftap().args(["run", "-f", "nap", "--no-sample", "-o"]).arg(&file).arg("--").arg(&binary).args(["4", "close"]));
    let report = report_json(&file);
    let notes = report["notes"].to_string();
    assert!(notes.contains("the time off CPU of some threads could not be read"), "{notes}");
    let nap = function(&report["functions"], "nap");
    assert_eq!(nap["calls"], 6);
    // The child's 100 ms asleep, the others' CPU time alone.
    let cpu = nap["inclusive"]["cpu_ns"]["total"].as_u64().unwrap();
    assert!((95_000_000..170_000_000).contains(&cpu), "{nap}");
}

/// The few pages of the C library that the engine writes (its hooks) are
/// mappings of their own: the kernel copies, at each fork, the entries of
/// every resident page of a mapping of code one page of which was written,
/// the whole library's for a few hooks.
#[test]
fn the_pages_of_a_library_written_to_are_mappings_of_their_own() {
    require_probes();
    let binary = Build::c("libcmaps.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(proftap().args(["run", "-f", "work", "--no-sample", "-o"]).arg(dir.path().join("p.profile")).arg("--").arg(&binary));
    // Each mapping of the library's code: its size and what of it is written, kB.
    let mappings: Vec<(u64, u64)> =
        out.lines().map(|l| l.split_once(' ').map(|(size, written)| (size.parse().unwrap(), written.parse().unwrap())).unwrap()).collect();
    assert!(mappings.iter().any(|&(_, written)| written > 0), "no hook written: {mappings:?}");
    assert!(mappings.iter().all(|&(size, written)| written == 0 || size == written), "{mappings:?}");
}

/// A uprobe of another tool's on a file's code, enabled: the kernel puts
/// its breakpoint in every process that maps the file, and takes it out
/// again, with its definition, when dropped (on every path out of a test).
struct ForeignUprobe {
    tracefs: std::path::PathBuf,
    event: String,
}

impl ForeignUprobe {
    fn enable(file: &std::path::Path, offset: u64) -> ForeignUprobe {
        let tracefs = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .find(|root| root.join("uprobe_events").exists())
            .expect("tracefs is mounted (uprobe_events), as uprobes need");
        // Not proftap's own name: a recording's cleanup never takes it.
        let event = format!("foreign/notice_{}", std::process::id());
        let define = |line: String| {
            use std::io::Write;
            let mut events = std::fs::OpenOptions::new().append(true).open(tracefs.join("uprobe_events")).unwrap();
            events.write_all(line.as_bytes())
        };
        define(format!("p:{event} {}:{offset:#x}\n", file.display())).unwrap();
        let probe = ForeignUprobe { tracefs, event };
        std::fs::write(probe.tracefs.join("events").join(&probe.event).join("enable"), "1").unwrap();
        probe
    }
}

impl Drop for ForeignUprobe {
    fn drop(&mut self) {
        // Never a panic here: one while a failed test unwinds would abort the others.
        let _ = std::fs::write(self.tracefs.join("events").join(&self.event).join("enable"), "0");
        if let Ok(mut events) = std::fs::OpenOptions::new().append(true).open(self.tracefs.join("uprobe_events")) {
            let _ = std::io::Write::write_all(&mut events, format!("-:{}\n", self.event).as_bytes());
        }
    }
}

/// The hook of glibc's `longjmp` cannot go where another tool's uprobe
/// sits: a program that may unwind (C++) is recorded all the same, its
/// throws caught, its calls counted; a jump's calls end at the next call.
#[test]
fn a_program_whose_longjmp_cannot_be_hooked_is_recorded() {
    require_probes();
    let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let symbols = run_ok(proftap().arg("symbols").arg(&libc).args(["-f", "longjmp", "--format", "json"]));
    let symbols: serde_json::Value = serde_json::from_str(&symbols).unwrap();
    let offset = symbols["functions"][0]["file_offset"].as_u64().expect("the C library's longjmp");
    let _probe = ForeignUprobe::enable(&libc, offset);
    let binary = Build::cxx("shapes.cpp", "-O2").build();
    let report = run_unharmed(&["--engine", "inject", "--no-sample", "-f", "checks::*", "-f", "main"], &binary, &["300"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert!(function(&report["functions"], "main")["calls"].as_u64() == Some(1), "{}", report["functions"]);
}

/// A launched program is stopped where its loader has mapped its libraries
/// (`_dl_debug_state`) before it is patched; where another tool's uprobe
/// has its breakpoint there, that breakpoint is left as it is (a debug
/// register stops the program instead), and the program is recorded,
/// every call counted, the other tool's probe still in place.
#[test]
fn a_launch_where_another_tools_uprobe_sits_at_the_loaders_notice_is_recorded() {
    require_probes();
    let binary = Build::c("calls.c", "-O2").build();
    let loader = std::fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap();
    let symbols = run_ok(proftap().arg("symbols").arg(&loader).args(["-f", "_dl_debug_state", "--format", "json"]));
    let symbols: serde_json::Value = serde_json::from_str(&symbols).unwrap();
    let offset = symbols["functions"][0]["file_offset"].as_u64().expect("the loader's _dl_debug_state");
    let probe = ForeignUprobe::enable(&loader, offset);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let out = run_within(
        proftap().args(["run", "--engine", "inject", "-f", "leaf", "-o"]).arg(&file).arg("--").arg(&binary).args(["1000", "10"]),
        std::time::Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = report_json(&file);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(function(&report["functions"], "leaf")["calls"].as_u64(), Some(2000));
    // The other tool's probe is still there, and fired (in the program,
    // whose loader called the notice, and in proftap's own programs).
    let profile = std::fs::read_to_string(probe.tracefs.join("uprobe_profile")).unwrap();
    let name = probe.event.split('/').next_back().unwrap();
    let hits =
        profile.lines().find(|l| l.split_whitespace().nth(1) == Some(name)).and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok());
    assert!(hits.is_some_and(|hits| hits > 0), "{profile}");
}

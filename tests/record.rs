//! `proftap run` and `proftap attach` on real programs, what the uprobe
//! engine does or what does not depend on the engine: known counts and the
//! call tree, exit statuses, a killed profiler, durations, forked children,
//! lost events, bad input. tests/engines.rs has what every engine must do
//! alike, run with each.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use serde_json::Value;
use std::collections::HashMap;
use std::process::Command;

/// Calls seen by uprobes.
const UPROBE: &[&str] = &["--engine", "uprobe"];
/// Every function instrumented for the whole run: no overhead governor.
const EXACT: &[&str] = &["--engine", "uprobe", "--overhead-budget", "0"];

#[test]
fn known_counts_recursion_and_several_callers() {
    require_probes();
    let binary = Build::c("calls.c", "-O0").build();
    let report = profile_run(EXACT, &[binary.to_str().unwrap(), "1000", "10"]);
    let calls = calls_by_name(&report);
    // leaf: once per left(i) for 1000 i, twice per right(i) for 500 i.
    assert_eq!(calls["leaf"], 2000);
    assert_eq!(calls["left"], 1000);
    assert_eq!(calls["right"], 500);
    // fib(10) makes 2 * fib(11) - 1 = 177 calls.
    assert_eq!(calls["fib"], 177);
    // No governor: exact throughout.
    for f in report["functions"].as_array().unwrap() {
        assert_eq!(f["mode"], "instrumented", "{f}");
    }
    assert_eq!(calls["main"], 1);
    assert!(!calls.contains_key("never_called") || calls["never_called"] == 0);

    // The tree knows leaf's two callers apart.
    let tree = &report["tree"];
    let main = tree["children"].as_array().unwrap().iter().find(|c| c["name"] == "main").unwrap();
    let run = main["children"].as_array().unwrap().iter().find(|c| c["name"] == "run").unwrap();
    let under = |parent: &Value, name: &str| -> u64 {
        let node = parent["children"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
        node["children"].as_array().unwrap().iter().find(|c| c["name"] == "leaf").map_or(0, |l| l["calls"].as_u64().unwrap())
    };
    assert_eq!(under(run, "left"), 1000);
    assert_eq!(under(run, "right"), 1000);
}

#[test]
fn the_program_keeps_its_exit_status_and_output() {
    require_probes();
    let binary = Build::c("calls.c", "-O0").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    // calls exits with never_called(argc) = 3 * 4 = 12 when given a fourth argument.
    let out = run(proftap().arg("run").arg("-o").arg(&file).arg("--").arg(&binary).args(["10", "3", "x"]));
    assert_eq!(out.status.code(), Some(12));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "total=150 fib(3)=2\n");
    let report = report_json(&file);
    assert_eq!(report["target"]["exit_code"], 12);
    assert_eq!(calls_by_name(&report)["never_called"], 1);
}

/// A SIGINT sent to `proftap run` alone (not the terminal's Ctrl-C, which
/// the command gets too) stops the command as well, as `perf record` does:
/// the run ends with its profile instead of waiting for a command that was
/// never told.
#[test]
fn an_interrupt_sent_to_proftap_alone_stops_the_command() {
    require_probes();
    let binary = Build::c("wait.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut command = proftap();
    command.arg("run").arg("-o").arg(&file).args(["-f", "tick", "--"]).arg(&binary);
    let mut waiter = Waiter::start_command(command);
    assert_eq!(waiter.tick(10), 10);
    // SAFETY: kill(2) on a child this test started and has not waited for.
    assert_eq!(unsafe { libc::kill(waiter.child.id() as i32, libc::SIGINT) }, 0);
    // Without the command stopped, proftap would wait for it until its input ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = waiter.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "proftap still waits for a command it never stopped");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130), "the command's own death by SIGINT, as a shell says it");
    let report = report_json(&file);
    assert_eq!(calls_by_name(&report)["tick"], 10);
}

/// Starts `proftap attach -o FILE ARGS PID` (uprobes) and waits until it says the probes are live.
fn attach(pid: i32, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let pid = pid.to_string();
    attach_live(&[&["-o", file.to_str().unwrap()], UPROBE, args, &[&pid]].concat())
}

#[test]
fn a_killed_profiler_leaves_the_program_running() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O0").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = attach(waiter.pid, &[], &file);
    assert_eq!(waiter.tick(100), 100);
    profiler.kill().unwrap();
    profiler.wait().unwrap();
    assert_eq!(waiter.tick(1000), 1100);
    let (rest, status) = waiter.finish();
    assert_eq!(rest, "done 1100\n");
    assert!(status.success());
    assert!(!file.exists(), "a killed profiler must leave no file");
}

#[test]
fn attach_with_a_duration_stops_by_itself() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let profiler = attach(waiter.pid, &["-f", "tick", "--duration", "300ms"], &file);
    assert_eq!(waiter.tick(10), 10);
    assert!(profiler.wait_with_output().unwrap().status.success());
    assert_eq!(waiter.tick(10), 20);
    assert_eq!(calls_by_name(&report_json(&file))["tick"], 10);
}

fn nix_signal(pid: i32, sig: &str) {
    run_ok(Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()));
}

#[test]
fn bad_input_is_one_sentence_and_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let calls = Build::c("calls.c", "-O0").build();
    let stripped = dir.path().join("stripped");
    copy_executable(&calls, &stripped);
    run_ok(Command::new("strip").arg("--strip-all").arg(&stripped));
    let launcher = dir.path().join("sh");
    copy_executable(&stripped, &launcher);
    let stripped_lib = dir.path().join("libcounter.so");
    run_ok(Command::new("gcc").args(["-O2", "-shared", "-fPIC", "-o"]).arg(&stripped_lib).arg(examples().join("libcounter/counter.c")));
    run_ok(Command::new("strip").arg("--strip-all").arg(&stripped_lib));

    // A program using a stripped shared library, and a pattern on a name the library lacks.
    let uselib = build_uselib(dir.path());

    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["attach".into(), "999999999".into()], "no process with PID 999999999 exists"),
        (vec!["attach".into(), "2".into()], "process 2 has no executable (a kernel thread"),
        (vec!["run".into(), "-f".into(), "libcounter.so:clamp".into(), "--".into(), uselib.display().to_string()], "it is stripped"),
        (vec!["run".into(), "--".into(), "/no/such/program".into()], "command not found: /no/such/program"),
        (vec!["run".into(), "--".into(), "no-such-program-xyz".into()], "command not found: no-such-program-xyz"),
        (
            vec!["run".into(), "-f".into(), "nothing_*".into(), "--".into(), calls.display().to_string()],
            "pattern 'nothing_*' matches no function",
        ),
        // A list where one pattern goes: said to be one.
        (
            vec!["run".into(), "-f".into(), "main,nothing_else".into(), "--".into(), calls.display().to_string()],
            "it is one pattern, not a list",
        ),
        // Stripped of every symbol: sampled when nothing is named, refused when a function is.
        (vec!["run".into(), "-f".into(), "main".into(), "--".into(), stripped.display().to_string()], "has no symbols"),
        (vec!["run".into(), "--metric".into(), "bogus".into(), "--".into(), calls.display().to_string()], "unknown metric 'bogus'"),
        // A launcher without symbols (a stripped program named as a shell
        // is): the functions are in the program it runs.
        (
            vec!["run".into(), "-f".into(), "main".into(), "--".into(), launcher.display().to_string(), calls.display().to_string()],
            "has no symbols, and it is a launcher",
        ),
        (vec!["run".into(), "--metric".into(), "cycles,cpu".into(), "--".into(), calls.display().to_string()], "cycles"),
    ];
    for (args, expect) in cases {
        if expect == "cycles" && Command::new("perf").args(["stat", "-e", "cycles", "true"]).output().is_ok_and(|o| o.status.success()) {
            continue; // this machine has hardware counters
        }
        let out = run(proftap().args(&args[..1]).arg("-o").arg(&file).args(&args[1..]));
        assert_clean_failure(&out, expect);
        assert!(!file.exists(), "{args:?} left a file");
    }
    // A stripped library: a pattern on a name it lacks.
    let out = run(proftap().args(["symbols"]).arg(&stripped_lib).args(["-f", "clamp"]));
    assert_clean_failure(&out, "matches no function");
    // A launcher without symbols, nothing named and nothing sampled: no
    // word of functions named, which were not.
    let out = run(proftap().args(["run", "-o"]).arg(&file).args(["--no-sample", "--"]).arg(&launcher).arg(&calls));
    assert_clean_failure(&out, "it is a launcher: with no stack sampled there is nothing to record of it");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("-f"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_launcher_recorded_says_the_programs_it_runs_are_not_instrumented() {
    require_probes();
    // A program named as a launcher is, with symbols (bash exports
    // functions) or without (env): the programs it runs are a new image,
    // sampled only, and the warning says what to do. Named otherwise,
    // nothing is said.
    let dir = tempfile::tempdir().unwrap();
    let calls = Build::c("calls.c", "-O0").build();
    let stripped = dir.path().join("env");
    copy_executable(&calls, &stripped);
    run_ok(Command::new("strip").arg("--strip-all").arg(&stripped));
    let with_symbols = dir.path().join("bash");
    copy_executable(&calls, &with_symbols);
    let plain = dir.path().join("calls");
    copy_executable(&calls, &plain);
    let file = dir.path().join("p.profile");
    for (program, launcher) in [(&stripped, true), (&with_symbols, true), (&plain, false)] {
        let out = run(proftap().args(["run", "-o"]).arg(&file).arg("--").arg(program).args(["5", "2"]));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        let warned = said.contains("runs other programs, which are sampled only: their calls are not counted");
        assert_eq!(warned, launcher, "{}: {said}", program.display());
    }
}

#[test]
fn a_program_whose_recording_cannot_be_prepared_never_runs() {
    // The program's process is made before its symbols are read; a
    // preparation that fails after that ends it unrun.
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let program = ["--", "sh", "-c", "touch \"$0\""];
    let out =
        run(proftap().args(["run", "--no-sample", "-f", "nothing_here_*", "-o"]).arg(dir.path().join("p.profile")).args(program).arg(&ran));
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!ran.exists(), "the program ran though its recording failed: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_launched_program_starts_with_the_signals_it_has_bare() {
    require_probes();
    // proftap's runtime ignores SIGPIPE; a program that inherited that
    // would fail writes to a closed pipe rather than end on them. The
    // program reads its own state (a shell read by its child could be
    // caught in the engine's work at a fork, every signal blocked a moment).
    let program = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"];
    let dir = tempfile::tempdir().unwrap();
    let bare = run_ok(Command::new(program[0]).args(&program[1..]));
    let out = run(proftap().args(["run", "-o"]).arg(dir.path().join("p.profile")).arg("--").args(program));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The blocked and ignored signals, of the standard ones: the C
    // library's own (32 and 33) are set by each process's C library in
    // between (a handler it installs in proftap is the default after exec,
    // where the test's own child inherits the test's disposition).
    let masks = |text: &str| -> Vec<(String, u64)> {
        let mask = |line: &str| u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap() & 0x7fff_ffff;
        text.lines().filter(|l| l.starts_with("Sig")).map(|l| (l.split(':').next().unwrap().to_string(), mask(l))).collect()
    };
    let (bare, recorded) = (masks(&bare), masks(&String::from_utf8_lossy(&out.stdout)));
    assert_eq!(bare.len(), 2, "{bare:?}");
    assert_eq!(recorded, bare, "(SIGPIPE is 1 << 12)");
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_the_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let program = ["--", "sh", "-c", "touch \"$0\""];
    let missing = dir.path().join("missing").join("p.profile");
    for (output, expect) in [(missing.as_path(), "cannot make a file in"), (dir.path(), "it is a directory")] {
        let out = run(proftap().args(["run", "--no-sample", "-o"]).arg(output).args(program).arg(&ran));
        assert_clean_failure(&out, expect);
        assert!(!ran.exists(), "the program ran before {} was refused", output.display());
    }
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = run(proftap().args(["attach", &sleeper.id().to_string(), "--duration", "1s", "-o"]).arg(&missing));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_clean_failure(&out, "cannot make a file in");
}

#[test]
fn report_renders_text_with_tree_and_threads() {
    require_probes();
    let binary = Build::c("threads.c", "-O0").build();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    run_ok(proftap().arg("run").arg("-o").arg(&file).arg("--").arg(&binary).args(["2", "100"]));
    let text = run_ok(proftap().arg("report").arg(&file).args(["--tree", "--threads", "--sort", "calls", "--top", "5"]));
    for expected in ["Flat profile, wall time", "Flat profile, CPU time", "Call tree", "of thread", "work", "main", "lost        0 events"]
    {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let out = run(proftap().arg("report").arg(&file).args(["--metric", "page-faults"]));
    assert_clean_failure(&out, "has no metric 'page-faults'");
    let _: HashMap<String, u64> = calls_by_name(&report_json(&file));
}

#[test]
fn forked_children_are_followed_unless_asked_not_to() {
    require_probes();
    let binary = Build::c("forks.c", "-O2").build();
    let b = binary.to_str().unwrap();
    // The in-process engine follows a forked child: it records in memory of its own.
    let report = profile_run(&["-f", "work"], &[b, "300", "70", "/bin/true"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["work"], 370);
    let by_pid: HashMap<i64, u64> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["pid"].as_i64().unwrap(), t["functions"].as_array().unwrap().iter().map(|f| f["calls"].as_u64().unwrap()).sum()))
        .collect();
    let mut calls: Vec<u64> = by_pid.values().copied().collect();
    calls.sort();
    assert_eq!(calls, [70, 300], "the child's calls are its own: {by_pid:?}");
    let pids: Vec<i64> = report["threads"].as_array().unwrap().iter().map(|t| t["pid"].as_i64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let processes = report["processes"].as_array().unwrap();
    assert!(processes.len() >= 3, "parent, worker child, exec child: {processes:?}");
    assert!(processes.iter().any(|p| p["execs"].as_array().unwrap().iter().any(|e| e == "true")), "{processes:?}");
    assert!(report["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("executed true")), "{}", report["notes"]);

    // Not following them, the child runs unrecorded.
    let report = profile_run(&["-f", "work", "--no-follow-fork"], &[b, "300", "70"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["work"], 300);
    assert_eq!(report["threads"].as_array().unwrap().len(), 1);

    // Kernel probes follow them too.
    let report = profile_run(&["-f", "work", "--engine", "uprobe"], &[b, "300", "70"]);
    assert_eq!(calls_by_name(&report)["work"], 370);
}

/// A forked child that moves to a network namespace of its own before its
/// first call cannot reach proftap's abstract socket (its name is in the
/// target's namespace): it hands its memory over on the socket's path
/// instead. One that cannot reach that either (its temporary directory is
/// another) is said not recorded, with how many, in place of counting it
/// silently short. Kernel probes follow both.
#[test]
fn a_forked_child_in_a_network_namespace_of_its_own_is_recorded_or_said_not_to_be() {
    require_probes();
    let binary = Build::c("netns.c", "-O2").build();
    let b = binary.to_str().unwrap();
    let unrecorded = |report: &Value| -> Vec<String> {
        let notes = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str());
        notes.filter(|n| n.contains("not recorded")).map(str::to_string).collect()
    };
    let report = profile_run(&["-f", "work"], &[b, "300", "70"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["work"], 440, "every process's calls, the moved child's among them");
    assert_eq!(unrecorded(&report), Vec::<String>::new());

    let report = profile_run(&["-f", "work"], &[b, "300", "70", "hidden"]);
    assert_eq!(calls_by_name(&report)["work"], 370, "the parent's and the other child's calls");
    let notes = unrecorded(&report);
    assert!(
        notes.iter().any(|n| n.contains("1 forked process was not recorded") && n.contains("namespaces of its own")),
        "no note of the child that could not reach proftap: {notes:?}"
    );

    let report = profile_run(&["-f", "work", "--engine", "uprobe"], &[b, "300", "70", "hidden"]);
    assert_eq!(calls_by_name(&report)["work"], 440);
}

/// A program that forks more children, one after another, than proftap
/// holds the memory of at once (4,096), with its stacks sampled: each
/// child's memory is read, a few at a time (each takes as much address
/// space as the parent's: a thousand at once do not fit), and those of
/// children that ended are read and let go to take more.
#[test]
fn more_forked_children_than_proftap_holds_at_once_are_each_counted() {
    require_probes();
    let binary = Build::c("children.c", "-O2").build();
    let report = profile_run(&["-f", "work", "--sample"], &[binary.to_str().unwrap(), "5000"]);
    assert_eq!(report["recording"]["engine"], "inject");
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    let missed: Vec<&&str> =
        notes.iter().filter(|n| n.contains("not counted") || n.contains("not followed") || n.contains("no calls")).collect();
    assert!(missed.is_empty(), "children missed: {missed:?}");
    assert_eq!(calls_by_name(&report)["work"], 10000);
    let pids: std::collections::HashSet<i64> = report["threads"].as_array().unwrap().iter().map(|t| t["pid"].as_i64().unwrap()).collect();
    assert_eq!(pids.len(), 5001);
}

/// A child forked in a call its parent leaves before the child calls
/// anything patched: the child's calls in progress are those the fork left
/// it (main, forker), not those its parent went on to (main, other).
#[test]
fn a_forked_childs_calls_in_progress_are_the_forks_not_the_parents_later_ones() {
    require_probes();
    let binary = Build::c("forkleft.c", "-O2").build();
    let functions = ["-f", "main", "-f", "forker", "-f", "other", "-f", "again", "-f", "work"];
    let report = profile_run(&functions, &[binary.to_str().unwrap(), "twice"]);
    assert_eq!(report["recording"]["engine"], "inject");
    fn paths(node: &serde_json::Value, above: &str, into: &mut Vec<String>) {
        let path = format!("{above}/{}", node["name"].as_str().unwrap());
        for child in node["children"].as_array().unwrap() {
            paths(child, &path, into);
        }
        into.push(path);
    }
    let mut by_process: Vec<Vec<String>> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut found = Vec::new();
            paths(&t["tree"], "", &mut found);
            found
        })
        .collect();
    assert_eq!(by_process.len(), 3, "{by_process:?}");
    by_process.retain(|found| !found.iter().any(|p| p == "/<root>/main/other"));
    let [child, grandchild] = <[_; 2]>::try_from(by_process).unwrap_or_else(|p| panic!("the parent alone has other: {p:?}"));
    let (child, grandchild) = if child.iter().any(|p| p.ends_with("/again/work")) { (grandchild, child) } else { (child, grandchild) };
    assert!(child.iter().any(|p| p == "/<root>/main/forker/work"), "{child:?}");
    // The child's own contexts, made in its memory, carried on as the
    // grandchild's calls in progress.
    assert!(grandchild.iter().any(|p| p == "/<root>/main/forker/again/work"), "{grandchild:?}");
    assert!(!grandchild.iter().any(|p| p.contains("other")), "{grandchild:?}");
}

/// A forked child's calls in progress when it ends (main, which it
/// inherited, never returns in it) end when it ended, not when the
/// recording does: here the parent lives on 300 ms after its child.
/// Their CPU time is the child's, not its absence.
#[test]
fn a_forked_childs_calls_in_progress_end_when_it_ends() {
    require_probes();
    let binary = Build::c("forks.c", "-O2").build();
    let report = profile_run(&["-f", "work", "-f", "main"], &[binary.to_str().unwrap(), "300", "70", "sleep", "0.3"]);
    assert_eq!(report["recording"]["engine"], "inject");
    let parent = report["target"]["pid"].as_i64().unwrap();
    let threads = report["threads"].as_array().unwrap();
    let child = threads.iter().find(|t| t["pid"].as_i64() != Some(parent)).unwrap_or_else(|| panic!("no child in {threads:?}"));
    let main = child["functions"].as_array().unwrap().iter().find(|f| f["name"] == "main").expect("the child's main");
    // Counted in the parent, timed in the child too: carried on.
    assert_eq!((main["calls"].as_u64(), main["unfinished"].as_u64(), main["carried"].as_u64()), (Some(0), Some(1), Some(1)), "{main}");
    // Over the processes, an average of the times there are, parent's and children's.
    for f in report["functions"].as_array().unwrap() {
        let (min, avg, max) =
            (stat(f, "inclusive", "wall_ns", "min"), stat(f, "inclusive", "wall_ns", "avg"), stat(f, "inclusive", "wall_ns", "max"));
        assert!(min <= avg && avg <= max, "{}: min {min} avg {avg} max {max}", f["name"]);
    }
    let (wall, cpu) = (main["inclusive"]["wall_ns"]["total"].as_u64().unwrap(), main["inclusive"]["cpu_ns"]["total"].as_u64().unwrap());
    assert!(wall < 150_000_000, "the child's main lasted {wall} ns: it ended with the recording, 300 ms after the child");
    assert!(cpu <= wall, "cpu {cpu} ns, wall {wall} ns");
    let recorded = report["recording"]["duration_ns"].as_u64().unwrap();
    assert!(recorded >= 300_000_000, "{recorded}");
}

#[test]
fn lost_events_are_counted_and_shown() {
    require_probes();
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let profiler = attach(waiter.pid, &["-f", "tick", "--buffer-size", "1"], &file);
    // A stopped reader cannot keep up: the 1 MiB buffers overflow.
    nix_signal(profiler.id() as i32, "STOP");
    assert_eq!(waiter.tick(100_000), 100_000);
    nix_signal(profiler.id() as i32, "CONT");
    // The kernel reports a loss when it next writes to the buffer.
    assert_eq!(waiter.tick(10), 100_010);
    nix_signal(profiler.id() as i32, "INT");
    assert!(profiler.wait_with_output().unwrap().status.success());
    let report = report_json(&file);
    let lost = report["lost_events"].as_u64().unwrap();
    let calls = calls_by_name(&report)["tick"];
    assert!(lost > 0, "nothing lost");
    // Every tick is either counted or among the lost records (entries and returns).
    assert!(calls < 100_010 && calls + lost >= 100_010, "calls {calls}, lost {lost}");
    // Which thread lost is known when the kernel wrote a loss record (it does
    // at its next write to the full buffer); then it is the target's.
    for entry in report["lost"]["by_thread"].as_array().unwrap() {
        assert_eq!(entry["tid"].as_i64(), Some(waiter.pid as i64));
    }
    let text = run_ok(proftap().arg("report").arg(&file));
    assert!(text.contains(&format!("lost        {}", grouped(lost))), "{text}");
}

#[test]
fn perf_and_uftrace_habits_work() {
    require_probes();
    let binary = Build::c("calls.c", "-O2").build();
    let dir = tempfile::tempdir().unwrap();
    // The command directly, as `perf record` and `uftrace record` take it.
    let out =
        run(proftap().current_dir(dir.path()).args(["run", "-f", "leaf", "-f", "left", "-f", "right"]).arg(&binary).args(["1000", "1"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // `report` reads proftap.profile by default, as `perf report` reads perf.data;
    // `-s self` sorts by exclusive time, `--top` cuts, in JSON too.
    let json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&run_ok(proftap().current_dir(dir.path()).args(["report", "--format", "json"]).args(args))).unwrap()
    };
    let names = |report: &serde_json::Value| -> Vec<String> {
        report["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_string()).collect()
    };
    let all = json(&[]);
    assert_eq!(calls_by_name(&all)["leaf"], 2000);
    assert_eq!(names(&json(&["-s", "name"])), ["leaf", "left", "right"]);
    assert_eq!(names(&json(&["-s", "calls", "--top", "1"])), ["leaf"]);
    // Callers and callees of one function, from the calling contexts.
    let table = |args: &[&str]| -> Vec<(u64, String)> {
        let text = run_ok(proftap().current_dir(dir.path()).arg("report").args(args));
        text.lines()
            .skip(2)
            .map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                (words[0].replace(',', "").parse().unwrap(), words.last().unwrap().to_string())
            })
            .collect()
    };
    let mut callers = table(&["--callers", "leaf"]);
    callers.sort();
    assert_eq!(callers, [(1000, "left".to_string()), (1000, "right".to_string())]);
    assert_eq!(table(&["--callees", "right"]), [(1000, "leaf".to_string())]);
    assert_clean_failure(&run(proftap().current_dir(dir.path()).args(["report", "--callers", "nope"])), "no function named 'nope'");
    let by_self = json(&["-s", "self"]);
    let exclusive: Vec<u64> = by_self["functions"].as_array().unwrap().iter().map(|f| stat(f, "exclusive", "wall_ns", "total")).collect();
    assert!(exclusive.windows(2).all(|w| w[0] >= w[1]), "{exclusive:?}");

    // `attach -p PID` and `attach --pid PID`, as perf takes them.
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let mut ticks = 0;
    for flag in ["-p", "--pid"] {
        let file = dir.path().join(format!("attach{flag}.profile"));
        let mut profiler = attach_live(&["-f", "tick", "-o", file.to_str().unwrap(), flag, &waiter.pid.to_string()]);
        ticks += 100;
        assert_eq!(waiter.tick(100), ticks);
        nix_signal(profiler.id() as i32, "INT");
        assert!(profiler.wait().unwrap().success(), "{flag}");
        assert_eq!(calls_by_name(&report_json(&file))["tick"], 100, "{flag}");
    }

    // `--lines` takes its files after `=`: the command follows it directly.
    let lines = dir.path().join("lines.profile");
    let out = run(proftap().args(["run", "-f", "leaf", "--lines", "-o"]).arg(&lines).arg(&binary).args(["10", "1"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!report_json(&lines)["lines"].as_array().unwrap().is_empty());
}

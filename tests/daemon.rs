//! `proftapd` and `proftap session`: sessions on running programs and
//! launched commands, access control between users, and a daemon stopped
//! with SIGTERM.
#![allow(clippy::unwrap_used)]

use proftap_tests::daemon::*;
use proftap_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn a_session_on_a_running_program_is_listed_stopped_and_fetched() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path());
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let id = started(&daemon.session(&["start", "--pid", &waiter.pid.to_string(), "-f", "tick"]));
    assert_eq!(waiter.tick(120), 120);

    let list = ok(&daemon.session(&["list"]));
    let row = list.lines().find(|l| l.split_whitespace().next() == Some(id.as_str())).unwrap_or_else(|| panic!("{list}"));
    assert!(row.contains("running") && row.contains(&format!("pid {} (wait_c", waiter.pid)), "{row}");
    let status = ok(&daemon.session(&["status", &id]));
    assert!(status.contains("state       running") && status.contains("functions   1"), "{status}");

    let stopped = ok(&daemon.session(&["stop", &id]));
    assert!(stopped.contains("state       finished"), "{stopped}");
    // Detached: the program runs on.
    assert_eq!(waiter.tick(5), 125);
    let file = dir.path().join("fetched.profile");
    ok(&daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]));
    let report = report_json(&file);
    assert_eq!(calls_by_name(&report)["tick"], 120);
    assert_eq!(report["target"]["attached"], true);

    ok(&daemon.session(&["delete", &id]));
    let out = daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]);
    assert_clean_failure(&out, &format!("there is no session {id} of yours"));
}

#[test]
fn a_session_launches_a_command_and_keeps_its_profile() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path());
    let calls = Build::c("calls.c", "-O0").build();
    let id = started(&daemon.session(&["start", "-f", "fib", "--", calls.to_str().unwrap(), "10", "6"]));
    // The command ends by itself.
    ok(&daemon.session(&["wait", &id]));
    let file = dir.path().join("calls.profile");
    ok(&daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]));
    // fib(6) makes 2 * fib(7) - 1 = 25 calls.
    assert_eq!(calls_by_name(&report_json(&file))["fib"], 25);
    // Bad options are one sentence from the daemon or the client.
    assert_clean_failure(&daemon.session(&["start", "--pid", "999999999"]), "there is no process 999999999");
    assert_clean_failure(&daemon.session(&["start", "-o", "x", "--pid", "1"]), "use `proftap session fetch ID -o FILE`");
    assert_clean_failure(&daemon.session(&["wait", "999999"]), "there is no session 999999 of yours");
}

#[test]
fn a_sessions_program_holds_no_channel_to_proftapd() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path());
    let fds = Build::c("fds.c", "-O2").build();
    // Past the standard streams: what it is given bare (by this test,
    // whose own inherited descriptors the daemon inherits too) and in a session.
    let beyond_streams = |listing: &std::path::Path| -> Vec<String> {
        let text = std::fs::read_to_string(listing).unwrap();
        let mut fds: Vec<String> =
            text.lines().filter(|l| l.split(' ').next().unwrap().parse::<u32>().unwrap() > 2).map(str::to_string).collect();
        fds.sort();
        fds
    };
    let (bare, session) = (dir.path().join("bare"), dir.path().join("session"));
    run_ok(Command::new(&fds).arg(&bare));
    let id = started(&daemon.session(&["start", "--", fds.to_str().unwrap(), session.to_str().unwrap()]));
    ok(&daemon.session(&["wait", &id]));
    let numbers = |fds: &[String]| fds.iter().map(|l| l.split(' ').next().unwrap().to_string()).collect::<Vec<_>>();
    let (bare, session) = (beyond_streams(&bare), beyond_streams(&session));
    // Besides, the array of times off CPU its calls' CPU times are read
    // from (a page at a time, as its threads need them), numbered out of
    // the way; the kernel's, not proftapd's, and frozen: it can read it
    // (what /proc says of every thread) and not write it.
    let (off_cpu, session): (Vec<String>, Vec<String>) = session.into_iter().partition(|l| l.contains("anon_inode:bpf-map"));
    assert_eq!(numbers(&session), numbers(&bare), "in a session: {session:?}; bare: {bare:?}");
    let [array] = &off_cpu[..] else { panic!("the off-CPU array once: {off_cpu:?}") };
    assert!(array.ends_with(" read-only"), "{array}");
    assert!(array.split(' ').next().unwrap().parse::<u32>().unwrap() >= 256, "{array}");
}

#[test]
fn a_user_profiles_their_own_process_and_not_roots() {
    require_probes();
    let (uid, gid) = test_user();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = Daemon::start(dir.path());
    let (_shared, copies) = shared_copies(&[&binary("proftap"), &Build::c("wait.c", "-O2").build()]);
    let (proftap_copy, wait_copy) = (&copies[0], &copies[1]);

    // Root's process: refused, with the reason.
    let mut roots = Waiter::start(wait_copy);
    let out = daemon.session_as(proftap_copy, uid, gid, &["start", "--pid", &roots.pid.to_string(), "-f", "tick"]);
    assert_clean_failure(&out, "you may profile only your own processes");
    assert_eq!(roots.tick(3), 3);

    // Their own: recorded, and only they (and root) see it.
    let mut theirs = Waiter::start_as(wait_copy, uid, gid);
    let id = started(&daemon.session_as(proftap_copy, uid, gid, &["start", "--pid", &theirs.pid.to_string(), "-f", "tick"]));
    assert_eq!(theirs.tick(40), 40);
    ok(&daemon.session_as(proftap_copy, uid, gid, &["stop", &id]));
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    run_ok(Command::new("chown").arg(format!("{uid}:{gid}")).arg(&home));
    let file = home.join("theirs.profile");
    ok(&daemon.session_as(proftap_copy, uid, gid, &["fetch", &id, "-o", file.to_str().unwrap()]));
    assert_eq!(calls_by_name(&report_json(&file))["tick"], 40);
    // Root sees every session; another user does not see theirs.
    assert!(ok(&daemon.session(&["list"])).lines().any(|l| l.split_whitespace().next() == Some(id.as_str())));
    let out = daemon.session_as(proftap_copy, 65_534, 65_534, &["status", &id]);
    assert_clean_failure(&out, &format!("there is no session {id} of yours"));
}

#[test]
fn a_users_command_runs_as_that_user_in_their_directory() {
    require_probes();
    let (uid, gid) = test_user();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = Daemon::start(dir.path());
    // A program that writes who runs it into its working directory.
    let source = dir.path().join("whoami.c");
    std::fs::write(&source, "#include <stdio.h>\n#include <unistd.h>\n__attribute__((noinline)) int who(void) { return (int)getuid(); }\nint main(void) { FILE *f = fopen(\"who\", \"w\"); if (!f) return 1; fprintf(f, \"%d\\n\", who()); return fclose(f); }\n").unwrap();
    let program = dir.path().join("whoami");
    run_ok(Command::new("gcc").args(["-O0", "-g", "-o"]).arg(&program).arg(&source));
    let (_shared, copies) = shared_copies(&[&binary("proftap"), &program]);
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    run_ok(Command::new("chown").arg(format!("{uid}:{gid}")).arg(&work));

    use std::os::unix::process::CommandExt;
    let out = run(Command::new(&copies[0])
        .uid(uid)
        .gid(gid)
        .current_dir(&work)
        .args(["session", "--socket"])
        .arg(&daemon.socket)
        .args(["start", "-f", "who", "--"])
        .arg(&copies[1]));
    let id = started(&out);
    ok(&daemon.session(&["wait", &id]));
    assert_eq!(std::fs::read_to_string(work.join("who")).unwrap().trim(), uid.to_string());
    let file = dir.path().join("who.profile");
    ok(&daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]));
    assert_eq!(calls_by_name(&report_json(&file))["who"], 1);
}

#[test]
fn sigterm_leaves_the_program_running_and_the_profile_kept() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path());
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let id = started(&daemon.session(&["start", "--pid", &waiter.pid.to_string(), "-f", "tick"]));
    assert_eq!(waiter.tick(77), 77);
    let state = daemon.state.clone();
    assert!(daemon.terminate().success());
    // The program runs on, unprobed.
    assert_eq!(waiter.tick(3), 80);
    // A new daemon on the same state directory has the profile.
    let daemon = Daemon::start(dir.path());
    assert_eq!(daemon.state, state);
    let list = ok(&daemon.session(&["list"]));
    assert!(list.lines().any(|l| l.split_whitespace().next() == Some(id.as_str()) && l.contains("finished")), "{list}");
    let file = dir.path().join("kept.profile");
    ok(&daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]));
    assert_eq!(calls_by_name(&report_json(&file))["tick"], 77);
}

/// Launches `program` (built from an example) with `program_args` through
/// a session a user starts with `start_args`, in a directory of theirs;
/// waits for it to end and returns its profile's JSON report, fetched by
/// root.
fn users_launched_session(program: Build, start_args: &[&str], program_args: &[&str]) -> serde_json::Value {
    let (uid, gid) = test_user();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = Daemon::start(dir.path());
    let (_shared, copies) = shared_copies(&[&binary("proftap"), &program.build()]);
    use std::os::unix::process::CommandExt;
    let out = run(Command::new(&copies[0])
        .uid(uid)
        .gid(gid)
        .current_dir(dir.path())
        .args(["session", "--socket"])
        .arg(&daemon.socket)
        .arg("start")
        .args(start_args)
        .arg("--")
        .arg(&copies[1])
        .args(program_args));
    let id = started(&out);
    ok(&daemon.session(&["wait", &id]));
    let file = dir.path().join("session.profile");
    ok(&daemon.session(&["fetch", &id, "-o", file.to_str().unwrap()]));
    report_json(&file)
}

#[test]
fn a_users_forked_children_are_recorded_by_the_in_process_engine() {
    require_probes();
    let report = users_launched_session(Build::c("forks.c", "-O2"), &["-f", "work"], &["300", "70"]);
    assert_eq!(report["recording"]["engine"], "inject");
    assert_eq!(calls_by_name(&report)["work"], 370, "the parent's 300 calls and the child's 70");
    let pids: std::collections::HashSet<i64> = report["threads"].as_array().unwrap().iter().map(|t| t["pid"].as_i64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
}

/// A user's worker samples the kernel's time for them (its `CAP_PERFMON`),
/// but names the kernel's functions only as far as the user may see them:
/// `/proc/kallsyms` read with their ids. Where it hides the addresses from
/// them, every kernel frame is `[kernel]`, and no kernel address is in the
/// profile.
#[test]
fn a_users_samples_name_the_kernel_only_as_far_as_they_may_see_it() {
    require_probes();
    let report = users_launched_session(Build::c("faults.c", "-O2"), &["--sample", "1000", "-f", "fault_in"], &["64", "20"]);
    let functions = report["samples"]["functions"].as_array().unwrap();
    let kernel: Vec<&str> = functions.iter().filter(|f| f["module"] == "[kernel.kallsyms]").map(|f| f["name"].as_str().unwrap()).collect();
    assert!(!kernel.is_empty(), "no sample in the kernel: {functions:?}");
    let (uid, gid) = test_user();
    use std::os::unix::process::CommandExt;
    let first = run_ok(Command::new("head").args(["-1", "/proc/kallsyms"]).uid(uid).gid(gid));
    let hidden = first.starts_with("0000000000000000");
    if hidden {
        assert!(kernel.iter().all(|&name| name == "[kernel]"), "named though hidden from the user: {kernel:?}");
    } else {
        assert!(kernel.iter().any(|name| name.ends_with("_[k]")), "{kernel:?}");
    }
    let text = report.to_string();
    assert!(!text.contains("ffffffff8") && !text.contains("0xffff"), "a kernel address in the profile");
}

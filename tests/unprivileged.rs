//! proftap as an ordinary user: the in-process engine and sampling on the
//! user's own processes, where the kernel allows them (as perf and uftrace
//! work), and a refusal that names the real cause and what lifts it where
//! it does not.
#![allow(clippy::unwrap_used)]

use proftap_tests::daemon::{shared_copies, test_user};
use proftap_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// proftap and a program copied where the test user may run them, and a
/// working directory (and home, for the calibration cache) of theirs.
struct AsUser {
    uid: u32,
    gid: u32,
    _copies: tempfile::TempDir,
    proftap: PathBuf,
    program: PathBuf,
    work: tempfile::TempDir,
}

impl AsUser {
    fn new(program: &Path) -> AsUser {
        require_probes();
        let (uid, gid) = test_user();
        let (copies, paths) = shared_copies(&[&binary("proftap"), program]);
        let work = tempfile::tempdir().unwrap();
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        AsUser { uid, gid, _copies: copies, proftap: paths[0].clone(), program: paths[1].clone(), work }
    }

    /// `proftap ARGS` as the user.
    fn proftap(&self, args: &[&str]) -> Output {
        run(Command::new(&self.proftap)
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(self.work.path())
            .env("HOME", self.work.path())
            .env_remove("XDG_CACHE_HOME")
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .args(args))
    }

    /// `proftap run OPTIONS -o NAME -- PROGRAM ARGS` as the user; the profile's JSON report.
    fn record(&self, options: &[&str], name: &str, program_args: &[&str]) -> serde_json::Value {
        let program = self.program.to_str().unwrap();
        let mut args = vec!["run"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["-o", name, "--", program]);
        args.extend_from_slice(program_args);
        let out = self.proftap(&args);
        assert!(out.status.success(), "{args:?} as an ordinary user: {}", String::from_utf8_lossy(&out.stderr));
        report_json(&self.work.path().join(name))
    }
}

fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap().trim().parse().unwrap()
}

#[test]
fn an_ordinary_user_records_their_own_programs_in_process_and_by_sampling() {
    let user = AsUser::new(&Build::c("regress.c", "-O2").build());
    if paranoid() > 2 {
        // Sampling is the kernel's to refuse; the engine still works without it.
        let out = user.proftap(&["run", "--no-instrument", "-o", "s.profile", "--", user.program.to_str().unwrap(), "few"]);
        assert_clean_failure(&out, "sudo sysctl kernel.perf_event_paranoid=2");
        return;
    }
    // The default: every function patched in the process, and sampled.
    let report = user.record(&[], "default.profile", &["few"]);
    assert_eq!(report["recording"]["engine"], "inject", "{}", report["recording"]);
    assert_eq!(calls_by_name(&report)["burn"], 3);
    assert!(report["samples"]["total"].as_u64().unwrap() > 0, "no samples: {}", report["samples"]);
    // Named functions, exact.
    let report = user.record(&["--engine", "inject", "-f", "burn", "-f", "middle"], "named.profile", &["few"]);
    let calls = calls_by_name(&report);
    assert_eq!((calls["burn"], calls["middle"]), (3, 1));
    assert!(report["overhead"]["call_ns_injected"].as_u64().unwrap() > 0, "the in-process engine's cost is measured");
    // Sampling alone, as perf record.
    let report = user.record(&["--no-instrument"], "sampled.profile", &["few"]);
    assert!(report["samples"]["total"].as_u64().unwrap() > 0);
    // Line counts, from counters patched in the process.
    let report = user.record(&["--lines"], "lines.profile", &["few"]);
    assert_eq!(report["recording"]["engine"], "inject", "{}", report["recording"]);
    let lines = report["lines"].as_array().unwrap();
    assert!(lines.len() >= 5 && lines.iter().any(|l| l["count"].as_u64() > Some(0)), "{lines:?}");
}

/// A profile another user's file stands in the way of, in a directory
/// like /tmp whose sticky bit keeps it theirs, is refused before the
/// program runs, not lost after it.
#[test]
fn a_profile_that_could_not_replace_another_users_file_is_refused_first() {
    let user = AsUser::new(&Build::c("regress.c", "-O2").build());
    std::fs::set_permissions(user.work.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = user.work.path().join("theirs.profile");
    std::fs::write(&theirs, "root's").unwrap();
    let ran = user.work.path().join("ran");
    let out = user.proftap(&["run", "-o", "theirs.profile", "--", "sh", "-c", "touch \"$0\"", ran.to_str().unwrap()]);
    assert_clean_failure(&out, "cannot write theirs.profile: it belongs to another user, in a directory whose sticky bit");
    assert!(!ran.exists(), "the program ran before the output was refused");
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "root's");
}

#[test]
fn what_needs_root_is_refused_with_its_cause_and_its_remedy() {
    let user = AsUser::new(&Build::c("regress.c", "-O2").build());
    let program = user.program.to_str().unwrap().to_string();
    for options in [&["--engine", "uprobe"][..], &["--lines", "--line-times"], &["-e", "wall,page-faults"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["-o", "x.profile", "--", &program, "few"]);
        let out = user.proftap(&args);
        assert_clean_failure(&out, "kernel uprobes need root: tracefs (/sys/kernel/tracing) is root's; run with sudo");
    }
    // A function the engine cannot patch would need a uprobe.
    let out = user.proftap(&["run", "-f", "burn", "-f", "bare", "-o", "z.profile", "--", &program, "few"]);
    assert_clean_failure(&out, "1 of the functions cannot be patched by the in-process engine (bare: ");
    assert_clean_failure(&out, "need root: run with sudo, or leave them out (-f '!NAME')");
    // Another user's process.
    let mut root_process = Waiter::start(&Build::c("wait.c", "-O2").build());
    let out = user.proftap(&["attach", "-p", &root_process.pid.to_string(), "--duration", "1s", "-o", "y.profile"]);
    assert_clean_failure(&out, "profiling another user's process needs root or CAP_SYS_PTRACE");
    root_process.tick(1);
}

#[test]
fn an_ordinary_user_attaches_to_their_own_process() {
    let user = AsUser::new(&Build::c("wait.c", "-O2").build());
    let mut waiter = Waiter::start_as(&user.program, user.uid, user.gid);
    let proftap = user.proftap.clone();
    let work = user.work.path().to_path_buf();
    let pid = waiter.pid.to_string();
    let mut child = Command::new(&proftap)
        .uid(user.uid)
        .gid(user.gid)
        .current_dir(&work)
        .env("HOME", &work)
        .args(["attach", "-p", &pid, "-f", "tick", "-o", "own.profile"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(line.contains("attached to process"), "{line}");
    waiter.tick(250);
    // SAFETY: kill(2) on the proftap this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    assert!(child.wait().unwrap().success());
    assert_eq!(calls_by_name(&report_json(&work.join("own.profile")))["tick"], 250);
    waiter.tick(1);
    let (_, status) = waiter.finish();
    assert!(status.success());
}

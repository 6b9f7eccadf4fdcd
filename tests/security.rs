//! Attacks on proftapd and proftap by local users and hostile programs,
//! each reproduced as an attacker would and each shown to fail; after each
//! attack on the daemon, it still records another user's session.
#![allow(clippy::unwrap_used)]

use proftap_tests::daemon::*;
use proftap_tests::*;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A directory every user may enter and read, with the test user's copies
/// of proftap and of the calls example.
struct Shared {
    dir: tempfile::TempDir,
    proftap: PathBuf,
    calls: PathBuf,
    uid: u32,
    gid: u32,
}

impl Shared {
    fn new() -> Shared {
        let (uid, gid) = test_user();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = |from: &Path| {
            let to = dir.path().join(from.file_name().unwrap());
            copy_executable(from, &to);
            to
        };
        let (proftap, calls) = (copy(&binary("proftap")), copy(&Build::c("calls.c", "-O0").build()));
        Shared { dir, proftap, calls, uid, gid }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Compiles `source` (C) into the shared directory as `name`.
    fn compile(&self, name: &str, source: &str, flags: &[&str]) -> PathBuf {
        let c = self.path(&format!("{name}.c"));
        std::fs::write(&c, source).unwrap();
        let out = self.path(name);
        run_ok(Command::new("gcc").args(["-O0", "-g"]).args(flags).arg("-o").arg(&out).arg(&c));
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
        out
    }

    /// A directory the test user owns.
    fn home(&self) -> PathBuf {
        let home = self.path("home");
        if !home.exists() {
            std::fs::create_dir(&home).unwrap();
            run_ok(Command::new("chown").arg(format!("{}:{}", self.uid, self.gid)).arg(&home));
        }
        home
    }

    /// `proftap session ARGS` as the test user.
    fn session(&self, daemon: &Daemon, args: &[&str]) -> std::process::Output {
        daemon.session_as(&self.proftap, self.uid, self.gid, args)
    }

    /// The test user's session on the calls example records exactly: the
    /// daemon still serves after an attack.
    fn still_served(&self, daemon: &Daemon) {
        let calls = self.calls.to_str().unwrap();
        let id = started(&self.session(daemon, &["start", "-f", "fib", "--", calls, "10", "6"]));
        ok(&self.session(daemon, &["wait", &id]));
        let file = self.home().join(format!("served-{id}.profile"));
        ok(&self.session(daemon, &["fetch", &id, "-o", file.to_str().unwrap()]));
        // fib(6) makes 25 calls.
        assert_eq!(calls_by_name(&report_json(&file))["fib"], 25);
    }
}

/// A directory for a daemon's socket and state, which every user may enter.
fn daemon_dir(shared: &Shared) -> PathBuf {
    let dir = shared.path("daemon");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn daemon_in(shared: &Shared) -> Daemon {
    Daemon::start(&daemon_dir(shared))
}

#[test]
fn a_program_whose_interpreter_is_a_script_never_has_it_run() {
    require_probes();
    let shared = Shared::new();
    let marker = shared.path("ran");
    let script = shared.path("x.sh");
    std::fs::write(&script, format!("#!/bin/sh\nid -u >> {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let linker = format!("-Wl,--dynamic-linker={}", script.display());
    let evil = shared.compile("evil", "int main(void) { return 0; }\n", &[&linker]);

    // proftap run as root reads the program's libraries without running its interpreter.
    let out = run(proftap().args(["run", "-f", "main", "--"]).arg(&evil));
    assert!(!out.status.success(), "the kernel cannot run a script as an ELF interpreter");
    assert!(!marker.exists(), "the interpreter ran: {}", std::fs::read_to_string(&marker).unwrap_or_default());

    // Through proftapd, as an ordinary user.
    let daemon = daemon_in(&shared);
    let out = shared.session(&daemon, &["start", "-f", "main", "--", evil.to_str().unwrap()]);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        let _ = shared.session(&daemon, &["stop", &id]);
    }
    assert!(!marker.exists(), "the interpreter ran, as uid {}", std::fs::read_to_string(&marker).unwrap_or_default());
    shared.still_served(&daemon);
}

#[test]
fn calibration_writes_through_no_planted_link() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    // Links where the helper's timings went: a directory named after each
    // of the next pids, as an attacker would plant them in /tmp.
    let planted = dir.path().join("tmp");
    std::fs::create_dir(&planted).unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    for pid in last + 1..last + 400 {
        let trap = planted.join(format!("proftap-calibrate-{pid}"));
        std::fs::create_dir(&trap).unwrap();
        std::os::unix::fs::symlink(&victim, trap.join("timings")).unwrap();
    }
    let calls = Build::c("calls.c", "-O0").build();
    let file = dir.path().join("p.profile");
    let out = run(proftap()
        .env("TMPDIR", &planted)
        .args(["run", "--recalibrate", "--engine", "uprobe", "-f", "fib", "-o"])
        .arg(&file)
        .arg("--")
        .arg(&calls)
        .args(["10", "6"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

/// The capabilities a session worker keeps: CAP_IPC_LOCK (14) and CAP_PERFMON (38).
const WORKER_CAPS: u64 = (1 << 14) | (1 << 38);

#[test]
fn a_users_session_is_recorded_by_a_process_with_their_ids_and_two_capabilities() {
    require_probes();
    let shared = Shared::new();
    let daemon = daemon_in(&shared);
    let wait = shared.path("wait");
    copy_executable(&Build::c("wait.c", "-O2").build(), &wait);
    for engine in ["inject", "uprobe"] {
        let mut waiter = Waiter::start_as(&wait, shared.uid, shared.gid);
        let id = started(&shared.session(&daemon, &["start", "--engine", engine, "--pid", &waiter.pid.to_string(), "-f", "tick"]));
        let worker = worker_of(daemon.child.id());
        let status = std::fs::read_to_string(format!("/proc/{worker}/status")).unwrap();
        let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).unwrap().trim().to_string();
        for ids in [field("Uid:"), field("Gid:")] {
            let expected = if ids == field("Uid:") { shared.uid } else { shared.gid };
            assert!(ids.split_whitespace().all(|i| i == expected.to_string()), "{ids}");
        }
        for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
            assert_eq!(u64::from_str_radix(&field(set), 16).unwrap(), WORKER_CAPS, "{set}");
        }
        assert_eq!(field("CapInh:"), "0000000000000000");
        assert_eq!(field("CapAmb:"), "0000000000000000");
        assert_eq!(field("NoNewPrivs:"), "1");
        assert_eq!(waiter.tick(30), 30);
        ok(&shared.session(&daemon, &["stop", &id]));
        let file = shared.home().join(format!("{engine}.profile"));
        ok(&shared.session(&daemon, &["fetch", &id, "-o", file.to_str().unwrap()]));
        assert_eq!(calls_by_name(&report_json(&file))["tick"], 30, "{engine}");
    }
}

/// The one session worker of daemon `daemon`.
fn worker_of(daemon: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{daemon}/task/{daemon}/children")).unwrap_or_default();
    let mut workers: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
            cmdline.starts_with(b"/proc/self/exe\0__session-worker") && parent == Some(daemon)
        })
        .collect();
    assert_eq!(workers.len(), 1, "workers of proftapd {daemon}: {workers:?} (children {children})");
    workers.remove(0)
}

const SETUID_TARGET: &str = r#"
#include <stdio.h>
#include <time.h>
#include <unistd.h>
volatile long sink;
__attribute__((noinline)) void secret(long i) { sink += i; }
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "w");
    if (f) { fprintf(f, "%d\n", (int)geteuid()); fclose(f); }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (long i = 0; i < 100000; i++) secret(i);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < 300);
    return 0;
}
"#;

const EXECS_LATER: &str = r#"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile long sink;
__attribute__((noinline)) void tick(long i) { sink += i; }
int main(int argc, char **argv) {
    long delay_ms = atol(argv[1]);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (long i = 0; i < 1000; i++) tick(i);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < delay_ms);
    execl(argv[2], argv[2], argv[3], (char *)0);
    return 1;
}
"#;

#[test]
fn a_process_that_becomes_root_by_exec_is_not_profiled_for_its_user() {
    require_probes();
    let shared = Shared::new();
    let daemon = daemon_in(&shared);
    let setuid = shared.compile("setuid_secret", SETUID_TARGET, &[]);
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let execs = shared.compile("execs_later", EXECS_LATER, &[]);
    let home = shared.home();

    // Already running as root (the user started a set-uid program): refused.
    let euid = home.join("euid-direct");
    let mut direct = Command::new(&setuid).arg(&euid).uid(shared.uid).gid(shared.gid).spawn().unwrap();
    let out = shared.session(&daemon, &["start", "--pid", &direct.id().to_string(), "-f", "secret"]);
    assert_clean_failure(&out, "only root may profile it");
    direct.wait().unwrap();

    // The exec lands at any moment around the attach: whatever the
    // moment, nothing of the program running as root reaches the user.
    for (round, delay_ms) in [0, 1, 2, 5, 10, 20, 40, 80].into_iter().enumerate() {
        let euid = home.join(format!("euid-{round}"));
        let mut child = Command::new(&execs)
            .arg(delay_ms.to_string())
            .arg(&setuid)
            .arg(&euid)
            .uid(shared.uid)
            .gid(shared.gid)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let out = shared.session(&daemon, &["start", "--pid", &child.id().to_string(), "--sample", "2000"]);
        child.wait().unwrap();
        if !out.status.success() {
            continue;
        }
        let id = started(&out);
        ok(&shared.session(&daemon, &["stop", &id]));
        let file = home.join(format!("race-{round}.profile"));
        if !shared.session(&daemon, &["fetch", &id, "-o", file.to_str().unwrap()]).status.success() {
            continue;
        }
        let ran_as_root = std::fs::read_to_string(&euid).is_ok_and(|t| t.trim() == "0");
        let report = report_json(&file);
        // Functions instrumented or sampled in the program that ran as root.
        let samples = report["samples"]["functions"].as_array().cloned().unwrap_or_default();
        let seen: Vec<String> = report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .chain(&samples)
            .filter(|f| f["module"].as_str().is_some_and(|m| m.ends_with("setuid_secret")))
            .map(|f| f["name"].to_string())
            .collect();
        eprintln!("round {round} ({delay_ms} ms): ran as root: {ran_as_root}, its functions in the profile: {seen:?}");
        if ran_as_root {
            assert!(seen.is_empty(), "round {round}: the profile shows the program that ran as root: {seen:?}");
        }
    }
    shared.still_served(&daemon);
}

#[test]
fn a_target_that_scribbles_on_shared_memory_ends_its_recording_and_nothing_else() {
    require_probes();
    let shared = Shared::new();
    let scribble = shared.path("scribble");
    copy_executable(&Build::c("scribble.c", "-O2").build(), &scribble);
    let modes = ["header", "nodes", "parents", "counts", "noise"];
    for mode in modes {
        let started_at = Instant::now();
        let out = run(proftap()
            .args(["run", "--engine", "inject", "-f", "work", "-o"])
            .arg(shared.path("p.profile"))
            .arg("--")
            .arg(&scribble)
            .arg(mode));
        assert_clean_failure(&out, "the target corrupted proftap's buffers");
        assert!(!shared.path("p.profile").exists(), "{mode}: a profile was written");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done", "{mode}: the program runs on unharmed");
        assert!(started_at.elapsed() < Duration::from_secs(30), "{mode}: took {:?}", started_at.elapsed());
    }
    // Through proftapd, as an ordinary user: their session fails, the daemon goes on.
    let daemon = daemon_in(&shared);
    for mode in modes {
        let out = shared.session(&daemon, &["start", "--engine", "inject", "-f", "work", "--", scribble.to_str().unwrap(), mode]);
        let Ok(id) = String::from_utf8_lossy(&out.stdout).trim().parse::<u64>() else {
            assert_clean_failure(&out, "the target corrupted proftap's buffers");
            continue;
        };
        let status = shared.session(&daemon, &["stop", &id.to_string()]);
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(text.contains("failed") && text.contains("the target corrupted proftap's buffers"), "{mode}: {text}");
    }
    shared.still_served(&daemon);
}

#[test]
fn endless_requests_and_too_many_connections_are_cut_off() {
    require_probes();
    let shared = Shared::new();
    let daemon = daemon_in(&shared);
    // Eight clients each send 100 MB without a newline.
    let floods: Vec<_> = (0..8)
        .map(|_| {
            let socket = daemon.socket.clone();
            std::thread::spawn(move || {
                let mut stream = UnixStream::connect(socket).unwrap();
                let chunk = vec![b'x'; 1 << 20];
                (0..100).take_while(|_| stream.write_all(&chunk).is_ok()).count()
            })
        })
        .collect();
    for flood in floods {
        let written = flood.join().unwrap();
        assert!(written < 100, "a client wrote {written} MB before proftapd hung up");
    }
    let peak_kb = status_kb(daemon.child.id(), "VmHWM:");
    assert!(peak_kb < 200 * 1024, "proftapd's memory reached {peak_kb} kB");

    // One user holds at most 16 connections; the next is told why.
    let held: Vec<UnixStream> = (0..16).map(|_| UnixStream::connect(&daemon.socket).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let out = daemon.session(&["list"]);
    assert_clean_failure(&out, "connections to proftapd open");
    drop(held);
    shared.still_served(&daemon);
}

fn status_kb(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

/// CPU time a process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn out_of_descriptors_the_daemon_waits_instead_of_spinning() {
    require_probes();
    let shared = Shared::new();
    let daemon = Daemon::start_with(&daemon_dir(&shared), &["--max-connections", "1000"], |command| {
        // SAFETY: setrlimit between fork and exec.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 64, rlim_max: 64 };
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                Ok(())
            });
        }
    });
    let held: Vec<UnixStream> = (0..120).filter_map(|_| UnixStream::connect(&daemon.socket).ok()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(daemon.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(daemon.child.id()) - before;
    // 100 ticks a second: a spinning accept loop would use about 200.
    assert!(used < 40, "proftapd used {used} ticks of CPU in 2 s with no descriptors left");
    let told = daemon.log().matches("cannot accept connections").count();
    assert!(told <= 2, "proftapd logged {told} refusals in 2 s");
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    shared.still_served(&daemon);
}

#[test]
fn state_is_root_only_and_a_users_program_writes_to_their_files_not_the_log() {
    require_probes();
    let shared = Shared::new();
    let daemon = Daemon::start_with(&daemon_dir(&shared), &[], |command| {
        // SAFETY: umask between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::umask(0o022);
                Ok(())
            });
        }
    });
    let loud = shared.compile(
        "loud",
        "#include <stdio.h>\n__attribute__((noinline)) void say(void) { puts(\"MARKER out\"); fputs(\"MARKER err\\n\", stderr); }\nint main(void) { say(); return 0; }\n",
        &[],
    );
    let home = shared.home();
    let (out_file, err_file) = (home.join("out.txt"), home.join("err.txt"));
    let id = started(&shared.session(
        &daemon,
        &[
            "start",
            "--stdout",
            out_file.to_str().unwrap(),
            "--stderr",
            err_file.to_str().unwrap(),
            "-f",
            "say",
            "--",
            loud.to_str().unwrap(),
        ],
    ));
    ok(&shared.session(&daemon, &["wait", &id]));
    // The user's program wrote to the user's files, not into root's log.
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), "MARKER out\n");
    assert_eq!(std::fs::read_to_string(&err_file).unwrap(), "MARKER err\n");
    assert!(!daemon.log().contains("MARKER"), "{}", daemon.log());
    // Without files: nowhere (not the log either).
    let id = started(&shared.session(&daemon, &["start", "-f", "say", "--", loud.to_str().unwrap()]));
    ok(&shared.session(&daemon, &["wait", &id]));
    assert!(!daemon.log().contains("MARKER"), "{}", daemon.log());

    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&daemon.state), 0o700);
    for entry in std::fs::read_dir(&daemon.state).unwrap().flatten() {
        assert_eq!(mode(&entry.path()), 0o600, "{}", entry.path().display());
    }
}

#[test]
fn a_fifo_named_as_the_program_is_refused_at_once() {
    require_probes();
    let shared = Shared::new();
    let fifo = shared.path("program");
    run_ok(Command::new("mkfifo").arg("-m").arg("0666").arg(&fifo));
    let fifo_text = fifo.to_str().unwrap();
    // Locally: symbols and run say what is wrong instead of waiting for a writer.
    for args in [&["symbols", fifo_text][..], &["run", "-f", "main", "--", fifo_text]] {
        let started_at = Instant::now();
        let out = run(proftap().args(args));
        assert!(!out.status.success() && out.status.code() != Some(101), "{args:?}: {out:?}");
        assert!(started_at.elapsed() < Duration::from_secs(20), "{args:?} took {:?}", started_at.elapsed());
    }
    let out = run(proftap().args(["symbols", fifo_text]));
    assert_clean_failure(&out, "is a named pipe (FIFO), not an executable");
    // Through proftapd: the user's session fails; the daemon serves on and stops when asked.
    let daemon = daemon_in(&shared);
    let started_at = Instant::now();
    let out = shared.session(&daemon, &["start", "-f", "main", "--", fifo_text]);
    assert!(!out.status.success(), "{out:?}");
    assert!(started_at.elapsed() < Duration::from_secs(20));
    shared.still_served(&daemon);
    assert!(daemon.terminate().success());
}

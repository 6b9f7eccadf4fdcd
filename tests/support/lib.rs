//! Helpers for the end-to-end tests: the built binaries, example programs
//! compiled in the variants that break tools, and the peer tools we compare with.
#![allow(missing_docs, clippy::unwrap_used)]

pub mod daemon;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The examples folder.
pub fn examples() -> PathBuf {
    repo().join("examples")
}

/// Copies the executable `from` to `to`, mode 0755, with `cp`: a copy this
/// process wrote could be inherited, still open for writing, by a child
/// another test thread forks at that moment, and running the copy would
/// then fail with ETXTBSY until that child executes.
pub fn copy_executable(from: &Path, to: &Path) {
    let status = Command::new("cp").arg(from).arg(to).status();
    assert!(status.is_ok_and(|s| s.success()), "cannot copy {} to {}", from.display(), to.display());
    let status = Command::new("chmod").arg("0755").arg(to).status();
    assert!(status.is_ok_and(|s| s.success()), "cannot make {} executable", to.display());
}

/// Path of a workspace binary, built once per test process so that a plain
/// `cargo test` never runs a stale one.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut build = Command::new(env!("CARGO"));
        // What cargo told this test about its own package: build scripts
        // that watch these (ring's) would run again here, and again in the
        // next `cargo test`, each time.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_MANIFEST_")
                || name == "CARGO_CRATE_NAME"
                || name == "CARGO_PRIMARY_PACKAGE"
            {
                build.env_remove(&*name);
            }
        }
        build.args(["build", "--quiet", "--bins", "--workspace"]);
        // The profile these tests were built with, whose binaries they run.
        if profile_dir().ends_with("release") {
            build.arg("--release");
        }
        let status = build.current_dir(repo()).status().expect("run cargo build");
        assert!(status.success(), "cargo build of the proftap binaries failed");
    });
    profile_dir().join(name)
}

/// target/<profile>, from this test's own target/<profile>/deps/<test-binary>.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// A `proftap` command.
pub fn proftap() -> Command {
    Command::new(binary("proftap"))
}

/// Runs a command, asserts it succeeded, returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command and returns its output whatever the status.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command and returns its output whatever the status, unless it
/// runs longer than `limit`: then it is stopped (SIGTERM, which `proftap
/// run` passes on to its program) and the test fails, rather than hang.
pub fn run_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = ended.recv_timeout(limit).is_err();
        if late {
            // SAFETY: a signal to the child this test spawned and has not reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        late
    });
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("cannot wait for {cmd:?}: {e}"));
    let _ = done.send(());
    let late = watchdog.join().unwrap_or(false);
    assert!(!late, "{cmd:?} ran longer than {limit:?} and was stopped:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Fails the test, saying what to install, unless `tool` is on PATH: a
/// test never passes by skipping what it checks.
pub fn require(tool: &str, why: &str) {
    let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is missing (needed {why}); scripts/setup.sh installs it");
}

/// Source language of an example.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lang {
    C,
    /// C against musl, with `musl-gcc`.
    MuslC,
    Cxx,
    Rust,
}

/// How to compile an example.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Build {
    /// Sources relative to `examples/`.
    pub sources: Vec<&'static str>,
    pub lang: Lang,
    /// `-O0`, `-O2`.
    pub opt: &'static str,
    pub pie: bool,
    /// Extra compiler flags.
    pub flags: Vec<String>,
}

impl Build {
    pub fn c(source: &'static str, opt: &'static str) -> Self {
        Build { sources: vec![source], lang: Lang::C, opt, pie: true, flags: Vec::new() }
    }
    pub fn cxx(source: &'static str, opt: &'static str) -> Self {
        Build { lang: Lang::Cxx, ..Build::c(source, opt) }
    }
    pub fn rust(source: &'static str, opt: &'static str) -> Self {
        Build { lang: Lang::Rust, ..Build::c(source, opt) }
    }
    pub fn musl(source: &'static str, opt: &'static str) -> Self {
        Build { lang: Lang::MuslC, ..Build::c(source, opt) }
    }
    pub fn no_pie(mut self) -> Self {
        self.pie = false;
        self
    }
    pub fn flag(mut self, flag: &str) -> Self {
        self.flags.push(flag.to_string());
        self
    }
    pub fn sources(mut self, more: &[&'static str]) -> Self {
        self.sources.extend_from_slice(more);
        self
    }

    /// A short name for the variant, for messages and file names.
    pub fn label(&self) -> String {
        let stem = Path::new(self.sources[0]).file_name().unwrap().to_string_lossy().replace('.', "_");
        let mut label = format!("{stem}{}{}", self.opt, if self.pie { "" } else { "-nopie" });
        if self.lang == Lang::MuslC {
            label.push_str("-musl");
        }
        for f in &self.flags {
            label.push_str(&f.replace(['=', '/', ' '], "_"));
        }
        label
    }

    /// Compiles the program (once per test process) and returns its path.
    pub fn build(&self) -> PathBuf {
        static CACHE: OnceLock<Mutex<(tempfile::TempDir, HashMap<Build, PathBuf>)>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new((tempfile::tempdir().unwrap(), HashMap::new())));
        let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = guard.1.get(self) {
            return path.clone();
        }
        let out = guard.0.path().join(self.label());
        self.compile_to(&out);
        guard.1.insert(self.clone(), out.clone());
        out
    }

    /// Compiles the program to `out`.
    pub fn compile_to(&self, out: &Path) {
        let sources: Vec<PathBuf> = self.sources.iter().map(|s| examples().join(s)).collect();
        let mut cmd = match self.lang {
            Lang::C | Lang::MuslC | Lang::Cxx => {
                let compiler = match self.lang {
                    Lang::MuslC => "musl-gcc",
                    Lang::Cxx => "g++",
                    _ => "gcc",
                };
                let mut cmd = Command::new(compiler);
                cmd.arg(self.opt).arg("-g").args(&self.flags);
                cmd.arg(if self.pie { "-pie" } else { "-no-pie" });
                if self.pie {
                    cmd.arg("-fPIE");
                } else {
                    cmd.arg("-fno-pie");
                }
                for dir in sources.iter().filter_map(|s| s.parent()) {
                    cmd.arg("-I").arg(dir);
                }
                cmd.args(&sources).arg("-o").arg(out).arg("-lpthread");
                cmd
            }
            Lang::Rust => {
                let mut cmd = Command::new("rustc");
                cmd.args(["--edition", "2021", "-g"]).args(&self.flags);
                cmd.arg(if self.opt == "-O0" { "-Copt-level=0" } else { "-Copt-level=2" });
                if !self.pie {
                    cmd.arg("-Crelocation-model=static");
                }
                cmd.arg(&sources[0]).arg("-o").arg(out);
                cmd
            }
        };
        run_ok(&mut cmd);
    }
}

/// Runs `proftap symbols ARGS --format json` and parses the output.
pub fn symbols_json(args: &[&str]) -> serde_json::Value {
    let out = run_ok(proftap().arg("symbols").args(args).args(["--format", "json"]));
    serde_json::from_str(&out).unwrap()
}

/// Asserts that a failed run printed one clear sentence and exited non-zero.
pub fn assert_clean_failure(out: &Output, expect: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic instead of an error: {stderr}");
    assert!(stderr.starts_with("proftap: "), "error should start with 'proftap: ': {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "expected one line: {stderr}");
    assert!(stderr.contains(expect), "expected '{expect}' in: {stderr}");
}

/// Calls per function, as callgrind counts them (the oracle for call counts).
pub fn callgrind_calls(binary: &Path, args: &[&str]) -> HashMap<String, u64> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("callgrind.out");
    run_ok(
        Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg("-q")
            .arg(binary)
            .args(args),
    );
    parse_callgrind(&std::fs::read_to_string(&out).unwrap())
}

/// Sums `calls=` lines by callee (`cfn=`), resolving name compression.
pub fn parse_callgrind(text: &str) -> HashMap<String, u64> {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut resolve = |spec: &str| -> String {
        // "(12) name" defines id 12; "(12)" refers to it; "name" is plain.
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix('(') {
            let (id, name) = rest.split_once(')').unwrap_or((rest, ""));
            let name = name.trim();
            if !name.is_empty() {
                names.insert(id.to_string(), name.to_string());
            }
            names.get(id).cloned().unwrap_or_default()
        } else {
            spec.to_string()
        }
    };
    let mut calls: HashMap<String, u64> = HashMap::new();
    let mut callee = String::new();
    for line in text.lines() {
        if let Some(spec) = line.strip_prefix("cfn=") {
            // Recursion levels are separate names (`fib'2`): one function.
            let name = resolve(spec);
            callee = match name.rsplit_once('\'') {
                Some((base, level)) if level.bytes().all(|b| b.is_ascii_digit()) => base.to_string(),
                _ => name,
            };
            // Legacy Rust names keep their hash in valgrind's demangling.
            if let Some((base, hash)) = callee.rsplit_once("::h")
                && hash.len() == 16
                && hash.bytes().all(|b| b.is_ascii_hexdigit())
            {
                callee = base.to_string();
            }
        } else if let Some(spec) = line.strip_prefix("fn=") {
            resolve(spec);
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let count: u64 = rest.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
            *calls.entry(callee.clone()).or_default() += count;
        }
    }
    calls
}

/// Profiles `build`'s program with `proftap run ARGS -- PROGRAM RUN_ARGS`
/// and checks that the call count of every function recorded equals
/// callgrind's (0 for functions callgrind never saw called), with no event
/// lost. Returns the report.
pub fn check_calls_against_callgrind(args: &[&str], build: &Build, run_args: &[&str]) -> serde_json::Value {
    let binary = build.build();
    let report = profile_run(args, &[binary.to_str().unwrap()].iter().chain(run_args).copied().collect::<Vec<_>>());
    let ours = calls_by_name(&report);
    let theirs = callgrind_calls(&binary, run_args);
    assert!(!ours.is_empty(), "{}: nothing recorded", build.label());
    for (name, calls) in &ours {
        let expected = theirs.get(name).copied().unwrap_or(0);
        assert_eq!(*calls, expected, "{}: calls of {name}: proftap {calls}, callgrind {expected}", build.label());
    }
    assert_eq!(report["lost_events"], 0, "{}", build.label());
    report
}

/// CPU time the hypervisor has taken from this machine's CPUs since boot
/// (`steal` in /proc/stat, in clock ticks of 10 ms), in nanoseconds.
fn stolen_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = stat.lines().next().unwrap_or_default();
    cpu.split_whitespace().nth(8).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0) * 10_000_000
}

/// Profiles `shapes.cpp` (every tenth round throws through check() and
/// validate(), main catches) at -O0 and -O2 with `proftap run ARGS`:
/// the program's output is its own, check's calls are all counted, those
/// a throw left are marked unwound and stopped at the catch (no call of
/// check lasts anywhere near the whole run, in CPU time, which a preemption
/// on a loaded machine does not inflate), and main returns normally.
/// Returns the reports.
pub fn check_throws_are_counted_and_stopped(args: &[&str]) -> Vec<serde_json::Value> {
    // Enough rounds that the first throw (which loads the unwind tables) is a small part.
    let rounds = 2000;
    let mut reports = Vec::new();
    for opt in ["-O0", "-O2"] {
        let binary = Build::cxx("shapes.cpp", opt).build();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.profile");
        // The functions the throws cross and a few others: records few enough
        // that no ring fills on a loaded machine.
        let functions = ["-f", "checks::*", "-f", "shapes::*", "-f", "main"];
        let steal_before = stolen_ns();
        let out = run(proftap()
            .arg("run")
            .args(args)
            .args(functions)
            .args(["--metric", "wall,cpu", "-o"])
            .arg(&file)
            .arg("--")
            .arg(&binary)
            .arg(rounds.to_string()));
        assert!(out.status.success(), "{opt}: {}", String::from_utf8_lossy(&out.stderr));
        let expected = format!("rejected={}", rounds / 10);
        assert!(String::from_utf8_lossy(&out.stdout).contains(&expected), "{opt}: {}", String::from_utf8_lossy(&out.stdout));
        let report = report_json(&file);
        assert_eq!(report["lost_events"], 0, "{opt}");
        let check = function(&report["functions"], "checks::check(int)");
        assert_eq!((check["calls"].as_u64(), check["unwound"].as_u64()), (Some(rounds), Some(rounds / 10)), "{opt}");
        assert_eq!(function(&report["functions"], "checks::validate(int)")["unwound"], rounds / 10, "{opt}");
        let main = function(&report["functions"], "main");
        let cpu = |f: &serde_json::Value, field: &str| f["inclusive"]["cpu_ns"][field].as_u64().unwrap();
        // Time the hypervisor took the machine's CPUs away is left out of
        // CPU time as the kernel accounts it, at its next tick: up to a
        // tick of it can stay inside a call (a stretch of 20 ms inside one
        // call was seen on a loaded host).
        let stolen = stolen_ns().saturating_sub(steal_before);
        let (max, total) = (cpu(check, "max"), cpu(main, "total"));
        assert!(max < total / 5 + stolen, "{opt}: check max {max} vs main {total}, {stolen} ns stolen by the hypervisor meanwhile");
        assert_eq!((main["unwound"].as_u64(), main["unfinished"].as_u64()), (Some(0), Some(0)), "{opt}");
        reports.push(report);
    }
    reports
}

/// `examples/libcounter/counter.c` built at -O2 -g as `DIR/libcounter.so`.
pub fn build_libcounter(dir: &Path) -> PathBuf {
    let library = dir.join("libcounter.so");
    run_ok(Command::new("gcc").args(["-O2", "-g", "-shared", "-fPIC", "-o"]).arg(&library).arg(examples().join("libcounter/counter.c")));
    library
}

/// Builds `uselib` (`examples/libcounter/main.c`) in `dir`, linked against
/// the `libcounter.so` already there; returns its path.
pub fn build_uselib(dir: &Path) -> PathBuf {
    let uselib = dir.join("uselib");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&uselib)
            .arg(examples().join("libcounter/main.c"))
            .arg("-I")
            .arg(examples().join("libcounter"))
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lcounter"),
    );
    uselib
}

/// A running example program that proftap attaches to: `wait.c`, which
/// prints `ready PID ADDRESS` and then ticks once per number read from stdin.
pub struct Waiter {
    pub child: std::process::Child,
    pub pid: i32,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Waiter {
    pub fn start(binary: &Path) -> Self {
        Waiter::start_command(Command::new(binary))
    }

    /// Started as another user.
    pub fn start_as(binary: &Path, uid: u32, gid: u32) -> Self {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(binary);
        command.uid(uid).gid(gid);
        Waiter::start_command(command)
    }

    /// Started as `command` says.
    pub fn start_command(mut command: Command) -> Self {
        use std::io::BufRead;
        let mut child = command.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid = line.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("bad handshake: {line}"));
        Waiter { child, pid, stdout }
    }

    /// Asks for `n` ticks and waits until they are done; returns the running total.
    pub fn tick(&mut self, n: u64) -> u64 {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{n}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.strip_prefix("ticked ").and_then(|t| t.trim().parse().ok()).unwrap_or_else(|| panic!("unexpected: {line:?}"))
    }

    /// Closes stdin and returns the rest of the output and the exit status.
    pub fn finish(mut self) -> (String, std::process::ExitStatus) {
        use std::io::Read;
        drop(self.child.stdin.take());
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        (rest, self.child.wait().unwrap())
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `proftap attach ARGS` and waits until it says the probes are
/// live; its standard error is drained from then on, so that it never blocks.
pub fn attach_live(args: &[&str]) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let mut child = proftap().arg("attach").args(args).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("attached to process"), "proftap attach {args:?}: {line}");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}

/// Whether the C library links libgcc_s's unwinder through a function
/// the in-process engine hooks (glibc 2.34 and later): a program that
/// cancels threads then keeps that engine.
pub fn c_library_links_the_unwinder() -> bool {
    // SAFETY: a lookup of a NUL-terminated name among the loaded libraries.
    unsafe { !libc::dlsym(libc::RTLD_DEFAULT, c"__libc_unwind_link_get".as_ptr()).is_null() }
}

/// Whether the kernel says the processor has `rdpid`, with which the
/// in-process engine counts calls in a counter of the running CPU's.
pub fn processor_has_rdpid() -> bool {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo.lines().find(|l| l.starts_with("flags")).is_some_and(|l| l.split_whitespace().any(|f| f == "rdpid"))
}

/// Fails the test unless this machine can place uprobes and patch
/// processes (root): a test never passes by skipping what it checks.
pub fn require_probes() {
    assert!(
        nix_is_root(),
        "this test places uprobes and traces processes, which needs root: run the tests as root, as scripts/test.sh does"
    );
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Runs `binary ARGS` alone, then under `proftap run PROFTAP_ARGS`: the
/// program ends with the same status and prints the same output either
/// way. Returns the profile's JSON report.
pub fn run_unharmed(proftap_args: &[&str], binary: &Path, args: &[&str]) -> serde_json::Value {
    let bare = run(Command::new(binary).args(args));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    // A program the engine harmed may hang rather than fail.
    let mut command = proftap();
    command.arg("run").args(proftap_args).arg("-o").arg(&file).arg("--").arg(binary).args(args);
    let out = run_within(&mut command, std::time::Duration::from_secs(300));
    let seen = |o: &Output| (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned());
    assert_eq!(seen(&out), seen(&bare), "proftap run {proftap_args:?}: {}", String::from_utf8_lossy(&out.stderr));
    report_json(&file)
}

/// Runs `proftap run -o FILE ARGS -- CMD...`, asserts success, returns the JSON report.
pub fn profile_run(proftap_args: &[&str], command: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let out = run(proftap().arg("run").arg("-o").arg(&file).args(proftap_args).arg("--").args(command));
    assert!(
        out.status.success(),
        "proftap run {proftap_args:?} -- {command:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    report_json(&file)
}

/// `n` with its digits grouped by threes (`1234567` -> `1,234,567`), as
/// the text report writes counts.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `proftap report FILE --format json`.
pub fn report_json(file: &Path) -> serde_json::Value {
    let out = run_ok(proftap().arg("report").arg(file).args(["--format", "json"]));
    serde_json::from_str(&out).unwrap()
}

/// Calls per function name in a JSON report.
pub fn calls_by_name(report: &serde_json::Value) -> HashMap<String, u64> {
    report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["calls"].as_u64().unwrap()))
        .collect()
}

/// The function named `name` in a JSON report (or in a thread's list).
pub fn function<'a>(functions: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    functions.as_array().unwrap().iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("{name} not in {functions}"))
}

/// A function burning CPU and one sleeping, recorded with `engine`'s options.
pub fn check_cpu_and_wall(engine: &[&str]) {
    let stat = |f: &serde_json::Value, kind: &str, metric: &str, field: &str| -> u64 {
        f[kind][metric][field].as_u64().unwrap_or_else(|| panic!("no {kind}.{metric}.{field} in {f}"))
    };
    let binary = Build::c("cpuwall.c", "-O2").build();
    let args: Vec<&str> = engine.iter().copied().chain(["-f", "burn", "-f", "nap"]).collect();
    let report = profile_run(&args, &[binary.to_str().unwrap(), "30", "3"]);
    let functions = &report["functions"];
    let burn = function(functions, "burn");
    let nap = function(functions, "nap");
    let ms = 1_000_000;
    // burn: 90 ms of CPU, and wall at least that.
    let burn_cpu = stat(burn, "inclusive", "cpu_ns", "total");
    let burn_wall = stat(burn, "inclusive", "wall_ns", "total");
    assert!((88 * ms..130 * ms).contains(&burn_cpu), "burn cpu {burn_cpu}");
    assert!(burn_wall >= burn_cpu, "burn wall {burn_wall} < cpu {burn_cpu}");
    // nap: 90 ms asleep, almost no CPU.
    let nap_cpu = stat(nap, "inclusive", "cpu_ns", "total");
    let nap_wall = stat(nap, "inclusive", "wall_ns", "total");
    assert!(nap_wall >= 90 * ms, "nap wall {nap_wall}");
    assert!(nap_cpu < 5 * ms, "nap cpu {nap_cpu}");
    assert_eq!(burn["calls"], 3);
    let min = stat(burn, "inclusive", "cpu_ns", "min");
    assert!(min >= 29 * ms, "burn cpu min {min}, wall {burn_wall}, cpu {burn_cpu}");
}

/// The cost of an instrumented call is measured, reported, and subtracted
/// with `--compensate`, with `engine`'s options, on `calls.c` making
/// `3 * rounds` instrumented calls (enough for the instrumentation's cost
/// to stand well above the noise of two runs).
pub fn check_probe_cost_is_measured_and_compensated(engine: &[&str], rounds: u32) {
    require_probes();
    let binary = Build::c("calls.c", "-O2").build();
    let b = binary.to_str().unwrap();
    let functions = ["-f", "run", "-f", "left", "-f", "right", "-f", "leaf"];
    // CPU time: what the load of other tests does not stretch.
    let run_ns = |report: &serde_json::Value| function(&report["functions"], "run")["inclusive"]["cpu_ns"]["total"].as_u64().unwrap();
    let rounds = rounds.to_string();
    let raw = profile_run(&[engine, &functions].concat(), &[b, &rounds, "1"]);
    let overhead = &raw["overhead"];
    assert!(overhead["per_hit_ns"].as_u64().unwrap() > 0, "{overhead}");
    assert!(overhead["estimated_ns"].as_u64().unwrap() > 0, "{overhead}");
    assert_eq!(overhead["compensated"], false);
    if raw["recording"]["engine"] == "inject" {
        assert!(overhead["call_ns_injected"].as_u64().unwrap() > 0, "{overhead}");
    }
    let raw_run = run_ns(&raw);
    // The estimate accounts for most of run's time: its own work is tiny.
    assert!(overhead["estimated_ns"].as_u64().unwrap() > raw_run / 3, "estimate {overhead} vs run {raw_run}");

    // Measured again now, under the same load as this run (tests run in parallel).
    let compensated = profile_run(&[engine, &["--compensate", "--recalibrate"], &functions].concat(), &[b, &rounds, "1"]);
    assert_eq!(compensated["overhead"]["compensated"], true);
    assert_eq!(compensated["recording"]["engine"], raw["recording"]["engine"]);
    // The cost is subtracted: the compensated run is below the raw one by a
    // good part of the estimate (two runs' CPU times differ by up to a
    // third in this VM).
    let compensated_run = run_ns(&compensated);
    let estimate = compensated["overhead"]["estimated_ns"].as_u64().unwrap();
    assert!(compensated_run + estimate / 4 < raw_run, "compensated run {compensated_run}, estimate {estimate}, raw {raw_run}");
    // Calls are never compensated away.
    assert_eq!(function(&compensated["functions"], "leaf")["calls"], 2 * rounds.parse::<u64>().unwrap());
}

pub fn stat(f: &serde_json::Value, kind: &str, metric: &str, field: &str) -> u64 {
    f[kind][metric][field].as_u64().unwrap_or_else(|| panic!("no {kind}.{metric}.{field} in {f}"))
}

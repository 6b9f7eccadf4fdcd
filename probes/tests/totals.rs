//! The runtime adding calls up inside a running program: totals per
//! thread and calling context, read back while it runs and once detached.
#![allow(clippy::unwrap_used, missing_docs)]

use proftap_probes::exits::ExitMode;
use proftap_probes::inject::patched::{Patched, Recording};
use proftap_probes::plan::{ProbedFunction, plan};
use proftap_probes::select::Selection;
use proftap_probes::symbols::{LoadOptions, SymbolIndex};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// examples/wait.c: prints "ready PID ADDRESS", then calls tick() N times for each line N.
struct Waiter {
    child: Child,
    /// Where tick() is in it.
    tick_address: u64,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Waiter {
    fn start(binary: &Path) -> Waiter {
        Waiter::start_with(binary, &[])
    }

    /// Started with `args` (a refusal to ask of itself, see wait.c).
    fn start_with(binary: &Path, args: &[&str]) -> Waiter {
        let mut child = Command::new(binary).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready "), "{line}");
        assert!(args.is_empty() || line.trim_end().ends_with(" refused"), "{args:?} not in place (PR_SET_MDWE needs Linux 6.3): {line}");
        let address = line.split_whitespace().nth(2).and_then(|a| a.strip_prefix("0x")).unwrap();
        let tick_address = u64::from_str_radix(address, 16).unwrap();
        Waiter { child, tick_address, input: Some(input), output }
    }

    fn tick(&mut self, n: u64) -> u64 {
        writeln!(self.input.as_mut().unwrap(), "{n}").unwrap();
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        line.trim().strip_prefix("ticked ").unwrap().parse().unwrap()
    }
}

impl Waiter {
    /// Ends its input, so that main returns; its exit status.
    fn finish(&mut self) -> std::process::ExitStatus {
        self.input = None;
        self.child.wait().unwrap()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn build(source: &str, opt: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{source}{opt}"));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(source);
    let status = Command::new("gcc").arg(opt).arg("-g").arg("-o").arg(&out).arg(source).status().unwrap();
    assert!(status.success());
    out
}

fn functions(binary: &Path) -> Vec<ProbedFunction> {
    let index = SymbolIndex::load(binary, &LoadOptions::default()).unwrap();
    let selected = Selection::parse::<&str>(&[]).unwrap().select(&[&index]).unwrap();
    let mut warnings = Vec::new();
    let image = proftap_probes::symbols::ElfImage::open(binary).unwrap();
    plan(&[&index], &[Some(&image)], &[binary.to_path_buf()], &selected, ExitMode::Uretprobe, &mut warnings)
}

/// wait.c at -O2 built in `dir` and started: its functions and tick's index.
fn ticking(dir: &Path) -> (Vec<ProbedFunction>, usize, Waiter) {
    ticking_with(dir, &[])
}

/// The same, started with `args` (a refusal to ask of itself, see wait.c).
fn ticking_with(dir: &Path, args: &[&str]) -> (Vec<ProbedFunction>, usize, Waiter) {
    let binary = build("wait.c", "-O2", dir);
    let functions = functions(&binary);
    let tick = functions.iter().position(|f| f.info.name == "tick").unwrap();
    (functions, tick, Waiter::start_with(&binary, args))
}

/// Patching another process needs root: without it the test fails and
/// says so, as the workspace's other tests of probes do.
fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test patches another process, which needs root: run the tests as root, as scripts/test.sh does"
    );
}

#[test]
fn calls_are_added_up_in_the_running_program_and_read_back() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O2"] {
        let binary = build("wait.c", opt, dir.path());
        let functions = functions(&binary);
        let tick = functions.iter().position(|f| f.info.name == "tick").unwrap();
        let mut waiter = Waiter::start(&binary);
        assert_eq!(waiter.tick(7), 7);
        let pid = waiter.child.id() as i32;
        let mut patched = Patched::attach(pid, &functions, Recording::default()).unwrap();
        assert!(patched.refused().iter().all(|(i, _)| *i != tick), "{:?}", patched.refused());
        // One thread, and `clone` hooked: no thread can come to share its block unseen.
        assert!(!patched.view().unwrap().blocks_taken_atomically());
        assert_eq!(waiter.tick(1000), 1007);
        assert_eq!(waiter.tick(234), 1241);
        let mut calls = vec![0; functions.len()];
        patched.view().unwrap().calls(&mut calls);
        assert_eq!(calls[tick], 1234, "{opt}");
        let totals = patched.view().unwrap().totals().unwrap();
        assert_eq!(totals.threads.len(), 1);
        let thread = &totals.threads[0];
        assert_eq!(thread.tid as i32, pid);
        let node = thread.nodes.iter().skip(1).find(|n| n.function as usize == tick).unwrap();
        assert_eq!(node.calls, 1234);
        assert!(node.incl_wall.min > 0 && node.incl_wall.min <= node.incl_wall.max && node.incl_wall.total >= 1234 * node.incl_wall.min);
        patched.detach().unwrap();
        // Detached: the program runs on, nothing more is added up.
        assert_eq!(waiter.tick(5), 1246);
        let mut after = vec![0; functions.len()];
        patched.view().unwrap().calls(&mut after);
        assert_eq!(after[tick], 1234);
    }
}

impl Waiter {
    /// Sends `line`, returns the answer's word after `prefix`.
    fn ask(&mut self, line: &str, prefix: &str) -> i64 {
        writeln!(self.input.as_mut().unwrap(), "{line}").unwrap();
        let mut answer = String::new();
        self.output.read_line(&mut answer).unwrap();
        answer.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("{answer}")).trim().parse().unwrap()
    }
}

/// `len` bytes at `address` of process `pid`.
fn memory_of(pid: i64, address: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0; len];
    std::fs::File::open(format!("/proc/{pid}/mem")).unwrap().read_exact_at(&mut bytes, address).unwrap();
    bytes
}

/// A process killed when the test ends, however it ends: a forked child
/// left behind would keep the test's output open.
struct KilledAtTheEnd(i32);

impl Drop for KilledAtTheEnd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Another tracer of process `pid` (a thread of this process's own, as
/// good as another program's): proftap cannot hold it until it lets go.
struct ForeignTracer {
    let_go: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl ForeignTracer {
    fn hold(pid: i32) -> ForeignTracer {
        let (let_go, wait) = std::sync::mpsc::channel::<()>();
        let (seized, is_seized) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            seized.send(nix::sys::ptrace::seize(nix::unistd::Pid::from_raw(pid), nix::sys::ptrace::Options::empty())).unwrap();
            // A tracer lets go as it ends.
            let _ = wait.recv();
        });
        is_seized.recv().unwrap().unwrap();
        ForeignTracer { let_go, thread }
    }

    fn let_go(self) {
        self.let_go.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// A forked child held as a function's probes come out, then traced by
/// another, so that it cannot be held as the function's counting stops:
/// its calls go on being counted (in the counters it shares with its
/// parent), and proftap says so, so that they are not estimated again
/// from its samples. The parent's are no longer counted.
#[test]
fn a_child_that_cannot_be_held_as_counting_stops_is_told_to_count_still() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, tick, mut waiter) = ticking(dir.path());
    let pid = waiter.child.id() as i32;
    let mut patched = Patched::attach(pid, &functions, Recording { follow_forks: true, ..Recording::default() }).unwrap();
    let child = waiter.ask("fork 40", "forked") as i32;
    assert!(child > 0);
    let _killed = KilledAtTheEnd(child);
    patched.unpatch(&[tick]).unwrap();
    assert_eq!(waiter.tick(5), 5);
    let tracer = ForeignTracer::hold(child);
    patched.stop_counting(&[tick]).unwrap();
    assert_eq!(patched.counting_goes_on(), &[(child, tick)]);
    assert_eq!(waiter.tick(7), 12);
    tracer.let_go();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGUSR1).unwrap();
    assert_eq!(waiter.ask("reap", "reaped"), 0);
    // The parent's 5 calls counted before counting stopped, the child's
    // 40 after (and none of the parent's 7 after).
    assert_eq!(patched.calls_only_counted(functions.len())[tick], Some(45));
}

/// A function's probes and its counting taken out in one step (the
/// process held once): the parent's calls after are neither timed nor
/// counted; a forked child that cannot be held keeps its probes, and
/// proftap says its calls are counted still.
#[test]
fn probes_and_counting_taken_out_in_one_step_leave_the_calls_after_uncounted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, tick, mut waiter) = ticking(dir.path());
    let pid = waiter.child.id() as i32;
    let mut patched = Patched::attach(pid, &functions, Recording { follow_forks: true, ..Recording::default() }).unwrap();
    assert_eq!(waiter.tick(3), 3);
    let child = waiter.ask("fork 40", "forked") as i32;
    assert!(child > 0);
    let _killed = KilledAtTheEnd(child);
    let tracer = ForeignTracer::hold(child);
    patched.step_down(&[tick], &[tick]).unwrap();
    assert_eq!(patched.counting_goes_on(), &[(child, tick)]);
    assert_eq!(waiter.tick(7), 10);
    tracer.let_go();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGUSR1).unwrap();
    assert_eq!(waiter.ask("reap", "reaped"), 0);
    let mut calls = vec![0; functions.len()];
    patched.view().unwrap().calls(&mut calls);
    assert_eq!(calls[tick], 3, "the parent's 3 timed calls before, none of the 7 after");
    assert_eq!(patched.calls_only_counted(functions.len())[tick], Some(0));
    assert!(patched.counting_stopped(functions.len())[tick]);
}

#[test]
fn a_child_forked_while_patched_records_its_own_calls_and_is_restored_at_detach() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, tick, mut waiter) = ticking(dir.path());
    let pid = waiter.child.id() as i64;
    let address = waiter.tick_address;
    let original = memory_of(pid, address, 16);
    let mut patched = Patched::attach(pid as i32, &functions, Recording { follow_forks: true, ..Recording::default() }).unwrap();
    assert_ne!(memory_of(pid, address, 16), original, "patched");
    assert_eq!(waiter.tick(3), 3);
    let child = waiter.ask("fork 40", "forked");
    assert!(child > 0);
    assert_eq!(waiter.tick(2), 5);

    patched.detach().unwrap();
    assert!(patched.children_not_restored().is_empty(), "{:?}", patched.children_not_restored());
    assert_eq!(memory_of(child, address, 16), original, "the child's code is restored");
    let maps = std::fs::read_to_string(format!("/proc/{child}/maps")).unwrap();
    assert!(!maps.contains("memfd:proftap"), "the child's memory is unmapped:\n{maps}");
    let (children, refused) = patched.children();
    assert_eq!(refused, 0);
    let [seen] = <[_; 1]>::try_from(children).ok().expect("one child");
    assert_eq!(i64::from(seen.pid), child);
    assert_eq!(seen.ended_ns, None, "the child runs on");
    let totals = seen.totals().unwrap();
    assert_eq!(totals.threads.iter().map(|t| t.calls[tick]).sum::<u64>(), 40, "the child's calls, in its memory");
    let mut parent = vec![0; functions.len()];
    patched.view().unwrap().calls(&mut parent);
    assert_eq!(parent[tick], 5, "the parent's calls, in its own");

    // Restored, the child runs on: it ticks again and exits 0.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), nix::sys::signal::Signal::SIGUSR1).unwrap();
    assert_eq!(waiter.ask("reap", "reaped"), 0);
}

#[test]
fn cpu_time_per_call_leaves_out_time_off_cpu() {
    require_root();
    let off_cpu = proftap_probes::offcpu::OffCpu::load().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("cpuwall.c", "-O2", dir.path());
    let functions = functions(&binary);
    let index = |name: &str| functions.iter().position(|f| f.info.name == name).unwrap() as u32;
    let (burn, nap) = (index("burn"), index("nap"));
    // Patched at its start, so that every call is seen.
    let mut held =
        proftap_probes::target::spawn_held(&binary, &[binary.clone().into(), "20".into(), "3".into()], &Default::default()).unwrap();
    let pid = held.pid();
    held.ready().unwrap();
    nix::sys::ptrace::seize(nix::unistd::Pid::from_raw(pid), nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC).unwrap();
    held.release().unwrap();
    let mut patched =
        Patched::attach_at_start(pid, &functions, &[], Recording { off_cpu: Some(&off_cpu), ..Recording::default() }).unwrap();
    drop(patched.take_hold());
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert!(matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)), "{status:?}");
    let totals = patched.view().unwrap().totals().unwrap();
    let node = |f: u32| totals.threads[0].nodes.iter().skip(1).find(|n| n.function == f).copied().unwrap();
    let (burn, nap) = (node(burn), node(nap));
    assert_eq!((burn.calls, nap.calls), (3, 3));
    // burn spins for 20 ms of its thread's CPU time each call, however
    // busy the machine; nap sleeps 20 ms and uses almost none.
    let clock = proftap_probes::inject::clock::TscClock::new().unwrap();
    let ms = |cycles: u64| clock.duration_ns(cycles) as f64 / 1e6;
    assert!((50.0..75.0).contains(&ms(burn.incl_cpu.total)), "burn: {} ms of CPU in 3 calls", ms(burn.incl_cpu.total));
    assert!(
        ms(nap.incl_wall.total) >= 59.0 && ms(nap.incl_cpu.total) < 6.0,
        "nap: {} ms wall, {} ms CPU",
        ms(nap.incl_wall.total),
        ms(nap.incl_cpu.total)
    );
}

/// What [`run_patched`] found: the program's output, its totals, its
/// functions, and whether the runtime took blocks atomically at the end.
type Run = (String, proftap_probes::inject::reading::Totals, Vec<ProbedFunction>, bool);

/// Runs `binary ARGS` patched from its start.
fn run_patched(binary: &Path, args: &[&str]) -> Run {
    let functions = functions(binary);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (patched, pid) = launched_patched(binary, args, &functions, &out);
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert!(matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)), "{} {args:?}: {status:?}", binary.display());
    let view = patched.view().unwrap();
    (std::fs::read_to_string(out).unwrap(), view.totals().unwrap(), functions, view.blocks_taken_atomically())
}

/// `binary ARGS` launched, its standard output to `out`, and patched
/// from its start: running, not held.
fn launched_patched(binary: &Path, args: &[&str], functions: &[ProbedFunction], out: &Path) -> (Patched, i32) {
    let mut argv: Vec<std::ffi::OsString> = vec![binary.into()];
    argv.extend(args.iter().map(Into::into));
    let launch = proftap_probes::target::Launch { cwd: None, env: None, stdout: Some(out.to_path_buf()) };
    let mut held = proftap_probes::target::spawn_held(binary, &argv, &launch).unwrap();
    let pid = held.pid();
    held.ready().unwrap();
    nix::sys::ptrace::seize(nix::unistd::Pid::from_raw(pid), nix::sys::ptrace::Options::PTRACE_O_TRACEEXEC).unwrap();
    held.release().unwrap();
    let mut patched = Patched::attach_at_start(pid, functions, &[], Recording::default()).unwrap();
    drop(patched.take_hold());
    (patched, pid)
}

fn calls_of(totals: &proftap_probes::inject::reading::Totals, functions: &[ProbedFunction], name: &str) -> u64 {
    let f = functions.iter().position(|f| f.info.name == name).unwrap();
    totals.threads.iter().map(|t| t.calls[f]).sum()
}

#[test]
fn a_signal_handler_calling_patched_code_at_10_khz_is_not_harmed_and_every_call_counts() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("alarm.c", "-O2", dir.path());
    for mode in [&["3000000"][..], &["3000000", "altstack"]] {
        let (output, totals, functions, _) = run_patched(&binary, mode);
        let counts: Vec<u64> = output.split_whitespace().map(|n| n.parse().unwrap()).collect();
        assert!(counts[1] > 0, "{mode:?}: the handler ran");
        assert_eq!(calls_of(&totals, &functions, "work"), counts[0] + counts[1], "{mode:?}");
    }
}

#[test]
fn threads_sharing_their_creators_thread_pointer_are_not_harmed_and_counted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("rawclone.c", "-O2", dir.path());
    let (output, totals, functions, atomically) = run_patched(&binary, &["1000000"]);
    assert_eq!(calls_of(&totals, &functions, "work"), output.trim().parse::<u64>().unwrap());
    assert!(atomically, "the clone hook did not tell the runtime");
}

/// Two threads already on one thread pointer as proftap attaches: no
/// `clone` hook tells the runtime, the attach itself must.
#[test]
fn attaching_to_threads_that_share_a_thread_pointer_harms_neither() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let binary = build("rawclone.c", "-O2", dir.path());
    let functions = functions(&binary);
    let work = functions.iter().position(|f| f.info.name == "work").unwrap();
    let mut child = Command::new(&binary).arg("until-signal").stdout(Stdio::piped()).spawn().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "running");
    let pid = child.id() as i32;
    let mut patched = Patched::attach(pid, &functions, Recording::default()).unwrap();
    let counted = |patched: &Patched| {
        let mut calls = vec![0; functions.len()];
        patched.view().unwrap().calls(&mut calls);
        calls[work]
    };
    // Both threads go through the runtime many times over before the detach.
    assert!(patched.view().unwrap().blocks_taken_atomically());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while counted(&patched) < 2_000_000 {
        assert!(std::time::Instant::now() < deadline, "the threads stopped calling work(): {} calls", counted(&patched));
        std::thread::yield_now();
    }
    let counted = counted(&patched);
    patched.detach().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGUSR1).unwrap();
    let status = child.wait().unwrap();
    line.clear();
    output.read_line(&mut line).unwrap();
    assert!(status.success(), "{status:?}");
    assert!(line.trim().parse::<u64>().unwrap() >= counted, "{line} made, {counted} counted");
}

/// A process that refused itself memory that becomes executable
/// (`PR_SET_MDWE`, as systemd's `MemoryDenyWriteExecute=` may) before
/// proftap attached: proftap's code is mapped executable from the first
/// and written from outside, and its calls are counted.
#[test]
fn a_process_refusing_itself_executable_memory_is_attached_to_and_counted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, tick, mut waiter) = ticking_with(dir.path(), &["mdwe"]);
    let mut patched = Patched::attach(waiter.child.id() as i32, &functions, Recording::default()).unwrap();
    assert_eq!(waiter.tick(25), 25);
    let mut calls = vec![0; functions.len()];
    patched.view().unwrap().calls(&mut calls);
    assert_eq!(calls[tick], 25);
    patched.detach().unwrap();
    assert_eq!(waiter.tick(5), 30);
    assert!(waiter.finish().success());
}

/// A process that refuses itself any executable memory (a seccomp filter
/// on `mmap`): proftap says so, not that the process has no room for its
/// code, and leaves the process running as before.
#[test]
fn a_process_refusing_itself_any_executable_memory_is_told_to_refuse_it() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, _, mut waiter) = ticking_with(dir.path(), &["noexec"]);
    let Err(refused) = Patched::attach(waiter.child.id() as i32, &functions, Recording::default()) else {
        panic!("patched a process that refuses executable memory")
    };
    let said = refused.to_string();
    assert!(said.contains("mmap") && said.contains("Operation not permitted"), "{said}");
    assert_eq!(waiter.tick(5), 5);
    assert!(waiter.finish().success());
}

#[test]
fn attaching_again_and_again_works_and_leaves_nothing_mapped() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (functions, tick, mut waiter) = ticking(dir.path());
    let pid = waiter.child.id() as i32;
    let mappings = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().lines().count();
    let before = mappings();
    let mut total = 0;
    for round in 1..=10u64 {
        let mut patched = Patched::attach(pid, &functions, Recording::default()).unwrap();
        total += round;
        assert_eq!(waiter.tick(round), total);
        let mut calls = vec![0; functions.len()];
        patched.view().unwrap().calls(&mut calls);
        assert_eq!(calls[tick], round, "round {round}");
        patched.detach().unwrap();
    }
    assert_eq!(waiter.tick(1), total + 1);
    assert!(mappings() <= before + 1, "{} mappings before, {} after", before, mappings());
    // main's own return, hijacked at the first attach, goes home.
    assert!(waiter.finish().success());
}

/// examples/mdwe.c at -O2 launched, patched, and waiting at the FIFO it is
/// given, its `work` only counted (without `lock`: it has one thread).
struct CountingAlone {
    dir: tempfile::TempDir,
    pid: i32,
    work: usize,
    functions: usize,
    /// Readable once the process exited (a pidfd): told apart from the
    /// stops of the watch's holds, which a wait would see too.
    exited: std::os::fd::OwnedFd,
}

impl CountingAlone {
    fn start() -> (CountingAlone, Patched) {
        use std::os::fd::FromRawFd;
        let dir = tempfile::tempdir().unwrap();
        let binary = build("mdwe.c", "-O2", dir.path());
        let functions = functions(&binary);
        let work = functions.iter().position(|f| f.info.name == "work").unwrap();
        let fifo = dir.path().join("go");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        let (mut patched, pid) = launched_patched(&binary, &[fifo.to_str().unwrap(), "2"], &functions, &dir.path().join("out"));
        // It waits at the FIFO, alone: work's probes go, its calls counted without `lock`.
        patched.step_down(&[work], &[]).unwrap().unpatched.unwrap();
        assert!(patched.view().unwrap().counts_alone(), "the process has one thread: its counts go without lock");
        // SAFETY: pidfd_open of a child of this process, not yet reaped.
        let exited = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        assert!(exited >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor just opened, owned here alone.
        let exited = unsafe { std::os::fd::OwnedFd::from_raw_fd(exited) };
        (CountingAlone { dir, pid, work, functions: functions.len(), exited }, patched)
    }

    /// Lets it go on past the FIFO, into its threads.
    fn go(&self) {
        std::fs::write(self.dir.path().join("go"), b"g").unwrap();
    }

    /// Waits for it to exit; what it printed.
    fn exited(&self) -> String {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd { fd: self.exited.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, waited on for a minute at most.
        assert_eq!(unsafe { libc::poll(&mut poll, 1, 60_000) }, 1, "the program has not exited in a minute");
        std::fs::read_to_string(self.dir.path().join("out")).unwrap()
    }

    /// Reaps it; it exited 0.
    fn reap(&self) {
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None).unwrap();
        assert!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
            "{status:?} (exit 4: the kernel refused PR_SET_MDWE, which needs Linux 6.3)"
        );
    }
}

/// A launched program counts a throttled function's calls without `lock`
/// while it has one thread; as its first thread starts, the runtime makes
/// the counts atomic by writing its code, which the program has just
/// refused itself (`PR_SET_MDWE`): proftap, asked, writes the bytes while
/// the thread waits, and the two threads' calls are all counted.
#[test]
fn counts_the_program_refuses_to_lock_are_locked_by_proftap_and_every_call_counts() {
    require_root();
    let (run, patched) = CountingAlone::start();
    let view = patched.view().unwrap();
    let watch = proftap_probes::inject::watch::Watch::spawn(patched, None, None);
    run.go();
    let output = run.exited();
    let watched = watch.finish();
    run.reap();
    assert!(output.starts_with("refused "), "the program could still make its memory writable and executable: {output}");
    assert!(watched.patched.counts_locked_by_proftap(), "proftap was not asked to lock the counts");
    assert!(!view.counts_left_unlocked());
    // Every call counted: 1,000 alone, 2,000,000 in each thread.
    assert_eq!(watched.patched.calls_only_counted(run.functions)[run.work], Some(4_001_000));
}

/// The same where proftap cannot hold the process (another tracer has
/// it) to write the bytes: the counts may be short, and proftap knows.
#[test]
fn counts_proftap_cannot_lock_for_the_program_are_said_to_be_unlocked() {
    require_root();
    let (run, patched) = CountingAlone::start();
    let view = patched.view().unwrap();
    let tracer = ForeignTracer::hold(run.pid);
    let watch = proftap_probes::inject::watch::Watch::spawn(patched, None, None);
    run.go();
    let output = run.exited();
    let watched = watch.finish();
    tracer.let_go();
    run.reap();
    assert!(output.starts_with("refused "), "{output}");
    assert!(!watched.patched.counts_locked_by_proftap());
    assert_eq!(view.lock_request(), proftap_probes::inject::totals::LOCK_GIVEN_UP, "the runtime's request was not answered");
    assert!(view.counts_left_unlocked(), "the counts went without lock in two threads, unsaid");
}

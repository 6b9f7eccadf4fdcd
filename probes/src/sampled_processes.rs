//! Which processes a recording samples when it samples every CPU rather
//! than each of its threads: a BPF program on each CPU's sampling event
//! keeps a sample only when the thread it interrupted belongs to one of
//! them, so that no other process's registers and stack are ever copied
//! out of the kernel.
//!
//! Why every CPU: a sampling event opened on a thread is stopped and
//! started again each time the thread leaves and comes back to a CPU, and
//! each stop and start reprograms the CPU's timer, which in a virtual
//! machine is an exit to the hypervisor. A database server answering
//! tens of thousands of queries a second switches as often, and lost half
//! its throughput to a sampler on its threads here (`perf record -p` as
//! much), against a tenth to one on each CPU (BENCHMARKS.md).
//!
//! The processes are kept in a hash map by process id, and the kernel
//! keeps it as they come and go: a process forked by one of them is added
//! before it first runs (`sched_process_fork`), and each is removed as its
//! last thread exits (`sched_process_exit` with no thread of its process
//! left alive), before its id can be given to another process. A process
//! added before it executes the program (`proftap run`) is sampled from
//! its `exec` on (`sched_process_exec`), as a per-thread event enabled on
//! exec would be. Processes forked past the map's room are not sampled,
//! and counted ([`SampledProcesses::not_sampled`]).
//!
//! Loading it needs `CAP_BPF` and `CAP_PERFMON` (root), and proftap in the
//! machine's own pid namespace, whose ids the kernel's programs see.
//! proftapd's workers, which keep `CAP_PERFMON` only, sample each thread
//! instead: an event on a thread is what the kernel stops at an `exec`
//! that gains privileges, which a program deciding by process id alone
//! does not do (a root recording goes on sampling a setuid program its
//! target executes, as root may).

use crate::bpf::{
    BPF_MAP_CREATE, BPF_MAP_DELETE_ELEM, BPF_MAP_LOOKUP_ELEM, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_UPDATE_ELEM,
    BPF_PROG_TYPE_PERF_EVENT, BPF_PROG_TYPE_RAW_TRACEPOINT, Code, attach_raw, bpf, bpf_call, context, insn, load_program, map_and_key, op,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// Processes of one recording alive at once that the map holds.
pub const MOST_PROCESSES: u64 = 1 << 15;

/// A process's state in the map: sampled, or waiting for its `exec`.
const SAMPLED: u32 = 1;
const BEFORE_EXEC: u32 = 0;

const PROGRAM: &str = "the sampled processes' program";

/// The inode of the machine's own pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Where the kernel keeps what the programs read (from its BTF).
struct Fields {
    /// `task_struct.tgid`: a task's process id.
    tgid: i32,
    /// `task_struct.signal`, then `signal_struct.live`: the threads of
    /// its process not yet exiting.
    signal: i32,
    live: i32,
}

/// The processes a recording samples, and the programs that keep them.
pub struct SampledProcesses {
    map: OwnedFd,
    /// One counter: processes forked past the map's room.
    not_sampled: OwnedFd,
    filter: OwnedFd,
    /// The fork, exec and exit programs' links: they run while these are open.
    links: Vec<OwnedFd>,
}

impl Drop for SampledProcesses {
    fn drop(&mut self) {
        crate::perf::close_in_parallel(self.links.drain(..).map(|l| Box::new(l) as Box<dyn Send>).collect());
    }
}

impl SampledProcesses {
    /// Creates the map, empty, and loads the programs; an error where BPF
    /// is not allowed, proftap is in a pid namespace of its own, or the
    /// kernel's BTF does not say where a task keeps what they read.
    pub fn load() -> io::Result<SampledProcesses> {
        if std::fs::metadata("/proc/self/ns/pid")?.ino() != INIT_PID_NAMESPACE {
            return Err(io::Error::other("proftap runs in a pid namespace of its own"));
        }
        let fields = crate::btf::read_kernel(|btf| {
            let offset = |structure, member| crate::btf::member_offset(btf, structure, member).and_then(|o| i32::try_from(o).ok());
            Some(Fields {
                tgid: offset("task_struct", "tgid")?,
                signal: offset("task_struct", "signal")?,
                live: offset("signal_struct", "live")?,
            })
        })
        .ok_or_else(|| io::Error::other("the kernel's BTF does not say where a task keeps its process"))?;
        let map = create_map(BPF_MAP_TYPE_HASH, MOST_PROCESSES, "the map of sampled processes")?;
        let not_sampled = create_map(BPF_MAP_TYPE_ARRAY, 1, "the count of processes not sampled")?;
        let (fd, count) = (map.as_raw_fd(), not_sampled.as_raw_fd());
        let filter = load_program(BPF_PROG_TYPE_PERF_EVENT, &filter_program(fd), PROGRAM)?;
        let mut links = Vec::new();
        for (tracepoint, code) in [
            (c"sched_process_fork", fork_program(fd, count, &fields)),
            (c"sched_process_exec", exec_program(fd)),
            (c"sched_process_exit", exit_program(fd, &fields)),
        ] {
            let program = load_program(BPF_PROG_TYPE_RAW_TRACEPOINT, &code, PROGRAM)?;
            // The link holds the program.
            links.push(attach_raw(tracepoint, &program, PROGRAM)?);
        }
        Ok(SampledProcesses { map, not_sampled, filter, links })
    }

    /// Samples process `pid` (and the processes it forks from now on):
    /// now, or from its next `exec` on when `after_exec`. A process that
    /// ended meanwhile is taken out again, its id left to no other.
    pub fn add(&self, pid: u32, after_exec: bool) -> io::Result<()> {
        let value = if after_exec { BEFORE_EXEC } else { SAMPLED };
        let mut attr = [0u64; 16];
        attr[0] = self.map.as_raw_fd() as u64;
        attr[1] = &pid as *const u32 as u64;
        attr[2] = &value as *const u32 as u64;
        bpf_call(BPF_MAP_UPDATE_ELEM, &mut attr).map_err(|e| context(&format!("cannot sample process {pid}"), e))?;
        // Ended, or ending, before it was added: the exit program may not
        // take it out.
        if !runs_on(pid) {
            // The key alone: the kernel refuses a value with it.
            attr[2] = 0;
            bpf_call(BPF_MAP_DELETE_ELEM, &mut attr).map_err(|e| context(&format!("cannot take ended process {pid} out"), e))?;
        }
        Ok(())
    }

    /// The program a sampling event runs on each sample: it keeps those of
    /// the processes sampled.
    pub fn filter(&self) -> BorrowedFd<'_> {
        self.filter.as_fd()
    }

    /// Processes forked by sampled ones that the map had no room for: they
    /// were not sampled.
    pub fn not_sampled(&self) -> u64 {
        let (key, mut count) = (0u32, 0u64);
        let mut attr = [0u64; 16];
        attr[0] = self.not_sampled.as_raw_fd() as u64;
        attr[1] = &key as *const u32 as u64;
        attr[2] = &mut count as *mut u64 as u64;
        bpf_call(BPF_MAP_LOOKUP_ELEM, &mut attr).map_or(0, |()| count)
    }
}

/// `PF_EXITING`, in a task's flags from its exit's start.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` has a thread that has not begun to exit: one
/// that will pass the exit program yet.
fn runs_on(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After the name: the state (field 3), then five more, then the flags.
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let flags = fields.get(6).and_then(|f| f.parse::<u64>().ok()).unwrap_or(PF_EXITING);
        !matches!(fields.first(), None | Some(&"Z") | Some(&"X") | Some(&"x")) && flags & PF_EXITING == 0
    })
}

/// A map of `entries` entries: a hash of 4-byte keys and values, or an
/// array of 8-byte counters.
fn create_map(kind: u32, entries: u64, what: &str) -> io::Result<OwnedFd> {
    let value_bytes = if kind == BPF_MAP_TYPE_ARRAY { 8 } else { 4 };
    let mut attr = [0u64; 16];
    attr[0] = u64::from(kind) | (4 << 32);
    attr[1] = value_bytes | (entries << 32);
    bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| context(&format!("cannot create {what}"), e))
}

/// fp-4 = the current process's id; r0 = its state's address in the map;
/// to the end when it has none.
fn current_process(code: &mut Code, map: i32) {
    code.push([insn(op::CALL, 0, 0, 0, op::GET_CURRENT_PID_TGID), insn(op::RSH_K, 0, 0, 0, 32), insn(op::STX_W, 10, 0, -4, 0)]);
    code.look_up(map, -4);
}

/// On each sample: 1 (kept) when the interrupted thread's process is
/// sampled, else 0 (dropped before anything is copied).
fn filter_program(map: i32) -> Vec<u64> {
    let mut code = Code::new();
    current_process(&mut code, map);
    code.push([insn(op::LDX_W, 1, 0, 0, 0)]);
    code.end_if(op::JNE_K, 1, SAMPLED as i32);
    code.finish(&[insn(op::MOV_K, 0, 0, 0, 1), insn(op::EXIT, 0, 0, 0, 0)])
}

/// `sched_process_fork(parent, child)`, in the parent: a new process (not
/// a thread: its process id is not its parent's) of a sampled process
/// takes its parent's state; one the map has no room for is counted.
fn fork_program(map: i32, not_sampled: i32, fields: &Fields) -> Vec<u64> {
    let mut code = Code::new();
    code.push([insn(op::MOV_X, 6, 1, 0, 0)]);
    current_process(&mut code, map);
    code.push([insn(op::LDX_W, 7, 0, 0, 0), insn(op::STX_W, 10, 7, -12, 0)]);
    // fp-8 = child->tgid
    code.read_field(8, fields.tgid, 4, -8);
    code.push([insn(op::LDX_W, 1, 10, -8, 0), insn(op::LDX_W, 2, 10, -4, 0)]);
    code.end_if(op::JEQ_X, 1, 2);
    code.push(map_and_key(map, -8));
    code.push([
        insn(op::MOV_X, 3, 10, 0, 0),
        insn(op::ADD_K, 3, 0, 0, -12),
        insn(op::MOV_K, 4, 0, 0, 0),
        insn(op::CALL, 0, 0, 0, op::MAP_UPDATE_ELEM),
    ]);
    code.end_if(op::JEQ_K, 0, 0);
    code.push([insn(op::MOV_K, 1, 0, 0, 0), insn(op::STX_W, 10, 1, -16, 0)]);
    code.look_up(not_sampled, -16);
    code.push([insn(op::MOV_K, 1, 0, 0, 1), insn(op::ATOMIC_DW, 0, 1, 0, op::ATOMIC_ADD)]);
    code.finish(&[])
}

/// `sched_process_exec`, in the process: one waiting for its `exec` is
/// sampled from now on.
fn exec_program(map: i32) -> Vec<u64> {
    let mut code = Code::new();
    current_process(&mut code, map);
    code.push([insn(op::MOV_K, 1, 0, 0, SAMPLED as i32), insn(op::STX_W, 0, 1, 0, 0)]);
    code.finish(&[])
}

/// `sched_process_exit(task, ...)`, in the thread exiting: the last thread
/// of a process (none left alive: the kernel counts it out before the
/// tracepoint) takes the process out. Not its first thread alone, which a
/// program may end while others go on, or which an `exec` from another
/// thread ends.
fn exit_program(map: i32, fields: &Fields) -> Vec<u64> {
    let mut code = Code::new();
    code.push([insn(op::MOV_X, 6, 1, 0, 0)]);
    // fp-16 = task->signal, then fp-8 = signal->live
    code.read_field(0, fields.signal, 8, -16);
    code.push([insn(op::LDX_DW, 3, 10, -16, 0), insn(op::ADD_K, 3, 0, 0, fields.live)]);
    code.read_at(4, -8);
    code.push([insn(op::LDX_W, 1, 10, -8, 0)]);
    code.end_if(op::JNE_K, 1, 0);
    code.push([insn(op::CALL, 0, 0, 0, op::GET_CURRENT_PID_TGID), insn(op::RSH_K, 0, 0, 0, 32), insn(op::STX_W, 10, 0, -4, 0)]);
    code.push(map_and_key(map, -4));
    code.push([insn(op::CALL, 0, 0, 0, op::MAP_DELETE_ELEM)]);
    code.finish(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// The programs loaded here; `None`, said, where BPF is not allowed.
    fn loaded() -> Option<SampledProcesses> {
        let sampled = SampledProcesses::load();
        if let Err(e) = &sampled {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none() || !nix::unistd::geteuid().is_root(), "BPF works as root here: {e}");
            eprintln!("skipped: {e}");
        }
        sampled.ok()
    }

    /// Process `pid`'s state in the map, if it is there.
    fn state(sampled: &SampledProcesses, pid: u32) -> Option<u32> {
        let mut value = 0u32;
        let mut attr = [0u64; 16];
        attr[0] = sampled.map.as_raw_fd() as u64;
        attr[1] = &pid as *const u32 as u64;
        attr[2] = &mut value as *mut u32 as u64;
        bpf_call(BPF_MAP_LOOKUP_ELEM, &mut attr).ok().map(|()| value)
    }

    /// Waits until `done` holds, for ten seconds at most.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "still waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Whether process `pid`'s first thread is in state `state`.
    fn in_state(pid: u32, state: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).unwrap_or_default().contains(&format!(") {state} "))
    }

    /// A process added is kept, a process it forks is added with its state
    /// (waiting for its exec, then sampled from it), a thread it starts is
    /// not a process, and each leaves as it ends.
    #[test]
    fn processes_are_kept_from_fork_or_exec_to_their_end() {
        let Some(sampled) = loaded() else { return };
        use std::io::Write;
        // A shell that forks a child (the subshell) which waits on stdin.
        let mut shell =
            Command::new("sh").args(["-c", "read line; (read line; echo $$ >/dev/null); read line"]).stdin(Stdio::piped()).spawn().unwrap();
        let shell_pid = shell.id();
        // Waiting for its first line: past its exec, which a spawn may
        // return before the end of.
        wait_until("the shell's first read", || in_state(shell_pid, "S"));
        sampled.add(shell_pid, true).unwrap();
        assert_eq!(state(&sampled, shell_pid), Some(BEFORE_EXEC));
        let stdin = shell.stdin.as_mut().unwrap();
        stdin.write_all(b"1\n").unwrap();
        stdin.flush().unwrap();
        let children = || std::fs::read_to_string(format!("/proc/{shell_pid}/task/{shell_pid}/children")).unwrap_or_default();
        wait_until("the subshell", || !children().trim().is_empty());
        let child: u32 = children().split_whitespace().next().unwrap().parse().unwrap();
        // Listed as the parent's child a moment before the tracepoint.
        wait_until("the subshell's entry", || state(&sampled, child).is_some());
        assert_eq!(state(&sampled, child), Some(BEFORE_EXEC), "forked before any exec: its parent's state");
        // A thread of a process sampled is no process of the map's.
        let own = nix::unistd::getpid().as_raw() as u32;
        sampled.add(own, false).unwrap();
        let thread = std::thread::spawn(|| nix::unistd::gettid().as_raw() as u32).join().unwrap();
        assert_eq!((state(&sampled, own), state(&sampled, thread)), (Some(SAMPLED), None));
        stdin.write_all(b"2\n3\n").unwrap();
        drop(shell.stdin.take());
        assert!(shell.wait().unwrap().success());
        assert_eq!(state(&sampled, child), None, "ended");
        assert_eq!(state(&sampled, shell_pid), None, "ended");

        // Added to wait for its exec, a process is sampled from it on.
        let mut sleeper = Command::new("sh").args(["-c", "read line; exec sleep 30"]).stdin(Stdio::piped()).spawn().unwrap();
        let pid = sleeper.id();
        wait_until("the sleeper's first read", || in_state(pid, "S"));
        sampled.add(pid, true).unwrap();
        assert_eq!(state(&sampled, pid), Some(BEFORE_EXEC));
        sleeper.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        drop(sleeper.stdin.take());
        wait_until("sleep's exec", || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() == "sleep");
        wait_until("the exec's tracepoint", || state(&sampled, pid) == Some(SAMPLED));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert_eq!(state(&sampled, pid), None, "killed");
    }

    /// A process forked while the map is full is counted, not sampled.
    #[test]
    fn processes_past_the_maps_room_are_counted() {
        let Some(sampled) = loaded() else { return };
        sampled.add(nix::unistd::getpid().as_raw() as u32, false).unwrap();
        // Ids past any pid_max fill the rest (less what children other
        // tests of this process fork meanwhile take: full either way).
        for filler in 0..MOST_PROCESSES as u32 - 1 {
            let (key, value) = (0x4000_0000 + filler, SAMPLED);
            let mut attr = [0u64; 16];
            attr[0] = sampled.map.as_raw_fd() as u64;
            attr[1] = &key as *const u32 as u64;
            attr[2] = &value as *const u32 as u64;
            match bpf_call(BPF_MAP_UPDATE_ELEM, &mut attr) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::E2BIG) => break,
                Err(e) => panic!("filling the map: {e}"),
            }
        }
        assert_eq!(sampled.not_sampled(), 0);
        let child = Command::new("true").spawn().unwrap().wait().unwrap();
        assert!(child.success());
        // Other tests of this process may fork meanwhile too.
        assert!(sampled.not_sampled() >= 1);
    }

    /// A process whose first thread ends while another goes on stays
    /// sampled until its last thread ends.
    #[test]
    fn a_process_stays_while_any_thread_of_it_lives() {
        let Some(sampled) = loaded() else { return };
        // Its first thread ends through pthread_exit (ctypes lets go of
        // the interpreter's lock around it); the other reads stdin.
        let script = "import ctypes, os, threading\n\
                      threading.Thread(target=lambda: os.read(0, 1)).start()\n\
                      ctypes.CDLL(None).pthread_exit(None)\n";
        let mut python = Command::new("python3").args(["-c", script]).stdin(Stdio::piped()).spawn().unwrap();
        let pid = python.id();
        sampled.add(pid, false).unwrap();
        wait_until("the first thread's end", || in_state(pid, "Z"));
        assert_eq!(std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count(), 2, "a thread of it still runs");
        assert_eq!(state(&sampled, pid), Some(SAMPLED), "a thread of it still runs");
        drop(python.stdin.take());
        assert!(python.wait().unwrap().success());
        assert_eq!(state(&sampled, pid), None, "ended");
    }

    /// Added as it ends (a thread past its exit's start, or none left), a
    /// process is taken out at once.
    #[test]
    fn a_process_ended_before_it_was_added_is_taken_out() {
        let Some(sampled) = loaded() else { return };
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        wait_until("its end", || in_state(pid, "Z"));
        sampled.add(pid, false).unwrap();
        assert_eq!(state(&sampled, pid), None);
        child.wait().unwrap();
    }
}

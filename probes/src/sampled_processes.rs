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
//! main thread exits (`sched_process_exit`), before its id can be given to
//! another process. A process added before it executes the program
//! (`proftap run`) is sampled from its `exec` on (`sched_process_exec`), as
//! a per-thread event enabled on exec would be.
//!
//! Loading it needs `CAP_BPF` and `CAP_PERFMON` (root). proftapd's
//! workers, which keep `CAP_PERFMON` only, sample each thread instead:
//! an event on a thread is what the kernel stops at an `exec` that gains
//! privileges, which a program deciding by process id alone would not do.

use crate::bpf::{
    BPF_MAP_CREATE, BPF_MAP_TYPE_HASH, BPF_MAP_UPDATE_ELEM, BPF_PROG_TYPE_PERF_EVENT, BPF_PROG_TYPE_RAW_TRACEPOINT, attach_raw, bpf,
    bpf_call, context, insn, load_program, op,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Processes of one recording alive at once that the map holds; a process
/// forked past them is not sampled.
const MOST_PROCESSES: u64 = 1 << 15;

/// A process's state in the map: sampled, or waiting for its `exec`.
const SAMPLED: u32 = 1;
const BEFORE_EXEC: u32 = 0;

const PROGRAM: &str = "the sampled processes' program";

/// The processes a recording samples, and the programs that keep them.
pub struct SampledProcesses {
    map: OwnedFd,
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
    /// is not allowed or the kernel's BTF does not say where a task keeps
    /// its process id.
    pub fn load() -> io::Result<SampledProcesses> {
        let tgid = crate::btf::read_kernel(|btf| crate::btf::member_offset(btf, "task_struct", "tgid"))
            .and_then(|o| i32::try_from(o).ok())
            .ok_or_else(|| io::Error::other("the kernel's BTF does not say where a task keeps its process id"))?;
        let mut attr = [0u64; 16];
        attr[0] = u64::from(BPF_MAP_TYPE_HASH) | (4 << 32);
        attr[1] = 4 | (MOST_PROCESSES << 32);
        let map = bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| context("cannot create the map of sampled processes", e))?;
        let fd = map.as_raw_fd();
        let filter = load_program(BPF_PROG_TYPE_PERF_EVENT, &filter_program(fd), PROGRAM)?;
        let mut links = Vec::new();
        for (tracepoint, code) in [
            (c"sched_process_fork", fork_program(fd, tgid)),
            (c"sched_process_exec", exec_program(fd)),
            (c"sched_process_exit", exit_program(fd)),
        ] {
            let program = load_program(BPF_PROG_TYPE_RAW_TRACEPOINT, &code, PROGRAM)?;
            // The link holds the program.
            links.push(attach_raw(tracepoint, &program, PROGRAM)?);
        }
        Ok(SampledProcesses { map, filter, links })
    }

    /// Samples process `pid` (and the processes it forks from now on):
    /// now, or from its next `exec` on when `after_exec`.
    pub fn add(&self, pid: u32, after_exec: bool) -> io::Result<()> {
        let (key, value) = (pid, if after_exec { BEFORE_EXEC } else { SAMPLED });
        let mut attr = [0u64; 16];
        attr[0] = self.map.as_raw_fd() as u64;
        attr[1] = &key as *const u32 as u64;
        attr[2] = &value as *const u32 as u64;
        bpf_call(BPF_MAP_UPDATE_ELEM, &mut attr).map_err(|e| context(&format!("cannot sample process {pid}"), e))
    }

    /// The program a sampling event runs on each sample: it keeps those of
    /// the processes sampled.
    pub fn filter(&self) -> BorrowedFd<'_> {
        self.filter.as_fd()
    }
}

/// Code with forward jumps to its end placed when it is finished.
struct Code {
    code: Vec<u64>,
    to_end: Vec<usize>,
}

impl Code {
    fn new() -> Code {
        Code { code: Vec::new(), to_end: Vec::new() }
    }

    fn push(&mut self, code: impl IntoIterator<Item = u64>) {
        self.code.extend(code);
    }

    /// Jumps to the end (`r0 = 0; exit`) when `register` compares to
    /// `value` (a register for a `_X` jump) by `jump`.
    fn end_if(&mut self, jump: u8, register: u8, value: i32) {
        self.to_end.push(self.code.len());
        let x = jump & 0x08 != 0;
        self.code.push(if x { insn(jump, register, value as u8, 0, 0) } else { insn(jump, register, 0, 0, value) });
    }

    /// fp-4 = the current process's id; r0 = its state's address in the
    /// map; to the end when it has none.
    fn current_process(&mut self, map: i32) {
        self.push([insn(op::CALL, 0, 0, 0, op::GET_CURRENT_PID_TGID), insn(op::RSH_K, 0, 0, 0, 32), insn(op::STX_W, 10, 0, -4, 0)]);
        self.push(map_and_key(map, -4));
        self.push([insn(op::CALL, 0, 0, 0, op::MAP_LOOKUP_ELEM)]);
        self.end_if(op::JEQ_K, 0, 0);
    }

    /// The code, ending with `r0 = 0; exit`, after `ending` (which leaves r0).
    fn finish(mut self, ending: &[u64]) -> Vec<u64> {
        self.push(ending.iter().copied());
        let end = self.code.len();
        for at in self.to_end {
            let offset = (end - at - 1) as i16;
            self.code[at] = (self.code[at] & !(0xffff << 16)) | (u64::from(offset as u16) << 16);
        }
        self.code.extend([insn(op::MOV_K, 0, 0, 0, 0), insn(op::EXIT, 0, 0, 0, 0)]);
        self.code
    }
}

/// r1 = the map, r2 = the key on the stack at `key`.
fn map_and_key(map: i32, key: i16) -> [u64; 4] {
    [insn(op::LD_DW_IMM, 1, op::PSEUDO_MAP_FD, 0, map), 0, insn(op::MOV_X, 2, 10, 0, 0), insn(op::ADD_K, 2, 0, 0, i32::from(key))]
}

/// On each sample: 1 (kept) when the interrupted thread's process is
/// sampled, else 0 (dropped before anything is copied).
fn filter_program(map: i32) -> Vec<u64> {
    let mut code = Code::new();
    code.current_process(map);
    code.push([insn(op::LDX_W, 1, 0, 0, 0)]);
    code.end_if(op::JNE_K, 1, SAMPLED as i32);
    code.finish(&[insn(op::MOV_K, 0, 0, 0, 1), insn(op::EXIT, 0, 0, 0, 0)])
}

/// `sched_process_fork(parent, child)`, in the parent: a new process (not
/// a thread: its process id is not its parent's) of a sampled process
/// takes its parent's state.
fn fork_program(map: i32, tgid: i32) -> Vec<u64> {
    let mut code = Code::new();
    code.push([insn(op::MOV_X, 6, 1, 0, 0)]);
    code.current_process(map);
    code.push([
        insn(op::LDX_W, 7, 0, 0, 0),
        insn(op::STX_W, 10, 7, -12, 0),
        // fp-8 = child->tgid
        insn(op::LDX_DW, 3, 6, 8, 0),
        insn(op::ADD_K, 3, 0, 0, tgid),
        insn(op::MOV_X, 1, 10, 0, 0),
        insn(op::ADD_K, 1, 0, 0, -8),
        insn(op::MOV_K, 2, 0, 0, 4),
        insn(op::CALL, 0, 0, 0, op::PROBE_READ_KERNEL),
    ]);
    code.end_if(op::JNE_K, 0, 0);
    code.push([insn(op::LDX_W, 1, 10, -8, 0), insn(op::LDX_W, 2, 10, -4, 0)]);
    code.end_if(op::JEQ_X, 1, 2);
    code.push(map_and_key(map, -8));
    code.push([
        insn(op::MOV_X, 3, 10, 0, 0),
        insn(op::ADD_K, 3, 0, 0, -12),
        insn(op::MOV_K, 4, 0, 0, 0),
        insn(op::CALL, 0, 0, 0, op::MAP_UPDATE_ELEM),
    ]);
    code.finish(&[])
}

/// `sched_process_exec`, in the process: one waiting for its `exec` is
/// sampled from now on.
fn exec_program(map: i32) -> Vec<u64> {
    let mut code = Code::new();
    code.current_process(map);
    code.push([insn(op::MOV_K, 1, 0, 0, SAMPLED as i32), insn(op::STX_W, 0, 1, 0, 0)]);
    code.finish(&[])
}

/// `sched_process_exit`, in the thread exiting: a process's main thread
/// takes the process out (its id is not given again before that).
fn exit_program(map: i32) -> Vec<u64> {
    let mut code = Code::new();
    code.push([
        insn(op::CALL, 0, 0, 0, op::GET_CURRENT_PID_TGID),
        insn(op::MOV_X, 1, 0, 0, 0),
        insn(op::RSH_K, 1, 0, 0, 32),
        insn(op::LSH_K, 0, 0, 0, 32),
        insn(op::RSH_K, 0, 0, 0, 32),
    ]);
    code.end_if(op::JNE_X, 0, 1);
    code.push([insn(op::STX_W, 10, 1, -4, 0)]);
    code.push(map_and_key(map, -4));
    code.push([insn(op::CALL, 0, 0, 0, op::MAP_DELETE_ELEM)]);
    code.finish(&[])
}

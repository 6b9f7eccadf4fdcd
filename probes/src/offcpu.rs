//! Time each thread has spent off every CPU, kept by the kernel in memory a
//! patched process can read: BPF programs on the scheduler's tracepoints
//! keep it in an array indexed by thread id, which the process maps
//! read-only. The runtime reads its thread's entry at a call's entry and
//! return: a call's CPU time is its wall time less what it spent off CPU,
//! exact per call, with no record and no system call (but once after a
//! return to a CPU the kernel did not report, see below).
//!
//! As a thread comes back on a CPU (`sched_switch`), and as the kernel
//! adds to a running thread's CPU time (`sched_stat_runtime`: at every
//! tick and switch), its time off CPU becomes the clock less the CPU time
//! the kernel has given it (read from its `task_struct`, where the
//! kernel's BTF says): time the hypervisor took from its CPU (steal),
//! which the kernel leaves out of a task's CPU time, counts as time off
//! CPU, and a call's CPU time is the kernel's (`task-clock`) but for what
//! ran since the last accounting. Without BTF the programs read the
//! tracepoints' records, and add up how long a thread was away and what a
//! stretch on a CPU lasted beyond what the kernel counts for it.
//!
//! The clock (`CLOCK_MONOTONIC`, which NTP slews by up to 500 ppm) and the
//! scheduler's, which gives the CPU time, may drift apart by as much: at
//! worst 0.05% of a call's CPU time counted off CPU, or not.
//!
//! Some kernels raise no `sched_switch` for a switch away from some tasks
//! (a virtual machine's agent hidden from tracing): a thread coming back
//! from one keeps an entry that has it gone while it runs. The program on
//! `sched_stat_runtime` mends it at the thread's next accounting, and the
//! patched process's runtime, finding its own entry so, reads its CPU
//! clock first, which makes the kernel account it.
//!
//! Loading it needs `CAP_BPF` and `CAP_PERFMON` (root here); proftapd loads
//! it once and lends the array to its sessions.

use crate::bpf::{
    BPF_F_MMAPABLE, BPF_MAP_CREATE, BPF_MAP_FREEZE, BPF_MAP_TYPE_ARRAY, BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_PROG_TYPE_TRACEPOINT, Code,
    attach_raw, bpf, bpf_call, context, insn, load_program, op,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// What the programs are called in an error.
const PROGRAM: &str = "the off-CPU time program";

/// Each entry: the thread's time off CPU up to its last switch or
/// accounting (nanoseconds; with BTF, the clock less the CPU time it was
/// given then, which differs from its time off CPU by when it began: only
/// differences mean anything), then when the thread last left (bit 63
/// clear), or when it came onto a CPU or was last accounted there (bit 63
/// set), or 0 when not seen yet.
pub const ENTRY_BYTES: u64 = 16;

/// The kernel's per-thread off-CPU time, mappable read-only.
pub struct OffCpu {
    map: OwnedFd,
    entries: u64,
    /// proftap's own read-only view, mapped on first use.
    view: std::sync::OnceLock<Option<View>>,
    /// The programs and what attaches them, when loaded here: kept for
    /// its drop, which stops them.
    #[cfg_attr(not(test), allow(dead_code))]
    loaded: Option<Loaded>,
}

/// Programs and their attachments (raw tracepoint links, or a tracepoint's
/// perf events, one per CPU): a program runs while they are open.
#[derive(Default)]
struct Loaded {
    programs: Vec<OwnedFd>,
    links: Vec<OwnedFd>,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Each tracepoint event waits for a grace period as it closes: in
        // parallel, then the programs.
        crate::perf::close_in_parallel(self.links.drain(..).map(|e| Box::new(e) as Box<dyn Send>).collect());
        self.programs.clear();
    }
}

/// A program of this module's: r6 = the context, r7 = now (ns).
fn program() -> Code {
    let mut p = Code::new();
    p.push([insn(op::MOV_X, 6, 1, 0, 0), insn(op::CALL, 0, 0, 0, op::KTIME_GET_NS), insn(op::MOV_X, 7, 0, 0, 0)]);
    p
}

/// fp-4 = the pid at `offset` of a tracepoint record.
fn pid_from_record(p: &mut Code, offset: i16) {
    p.push([insn(op::LDX_W, 1, 6, offset, 0), insn(op::STX_W, 10, 1, -4, 0)]);
}

/// fp-4 = the pid of the task whose pointer is the raw tracepoint's
/// argument at `argument` (bytes); r8 = the CPU time the kernel has
/// given it. Both read with `bpf_probe_read_kernel`.
fn task(p: &mut Code, argument: i16, fields: TaskFields) {
    p.read_field(argument, fields.pid, 4, -4);
    p.read_field(argument, fields.cpu_time, 8, -16);
    p.push([insn(op::LDX_DW, 8, 10, -16, 0)]);
}

/// Ends the program by setting the entry of the task at raw tracepoint
/// argument `argument` from its own CPU time: on a CPU now, and off
/// CPU for the clock now less the CPU time the kernel gave it.
fn set_from_task(mut p: Code, map: i32, argument: i16, fields: TaskFields) -> Vec<u64> {
    task(&mut p, argument, fields);
    p.look_up(map, -4);
    now_on_cpu(&mut p, 2);
    p.push([insn(op::STX_DW, 0, 2, 8, 0), insn(op::MOV_X, 2, 7, 0, 0), insn(op::SUB_X, 2, 8, 0, 0), insn(op::STX_DW, 0, 2, 0, 0)]);
    p.finish(&[])
}

/// `register` = now, marked as a time on a CPU.
fn now_on_cpu(p: &mut Code, register: u8) {
    p.push([insn(op::MOV_K, register, 0, 0, 1), insn(op::LSH_K, register, 0, 0, 63), insn(op::OR_X, register, 7, 0, 0)]);
}

/// Marks an entry's second word as the time its thread came onto a CPU (or
/// was last accounted there), where unmarked it is when the thread left.
const ON_CPU: u32 = 63;

/// Less than this between what a thread ran and the wall time of that
/// stretch is the two clocks' disagreement, not time taken from it.
const STEAL_NOISE_NS: i32 = 20_000;

/// Where a `task_struct` keeps what the programs read (from the kernel's BTF).
#[derive(Clone, Copy, Debug)]
struct TaskFields {
    /// Its pid (a thread id).
    pid: i32,
    /// The CPU time the kernel has given it (`se.sum_exec_runtime`, ns).
    cpu_time: i32,
    /// Whether the kernel adds a stretch to every task's CPU time before
    /// it raises `sched_stat_runtime` for it: Linux 6.8 on. Before, it
    /// added a real-time or deadline task's after, and the program on
    /// that tracepoint adds up the stretches it reports instead.
    cpu_time_added_first: bool,
}

/// Where the switch program finds the threads of a switch.
#[derive(Clone, Copy, Debug)]
enum Switch {
    /// In a `sched_switch` tracepoint record: both pids at these offsets.
    Record { prev_pid: i16, next_pid: i16 },
    /// In the raw tracepoint's arguments (`preempt, prev, next`): the
    /// thread leaving is the current one; the one arriving is read from
    /// its `task_struct`.
    Raw(TaskFields),
}

/// Where the runtime program finds the thread and the CPU time of an update.
#[derive(Clone, Copy, Debug)]
enum Update {
    /// In a `sched_stat_runtime` tracepoint record, at these offsets.
    Record { pid: i16, runtime: i16 },
    /// In the raw tracepoint's arguments (`task, runtime`): the task is
    /// read from its `task_struct` (its CPU time too, where the kernel
    /// adds to it first: [`TaskFields::cpu_time_added_first`]).
    Raw(TaskFields),
}

/// The program on `sched_switch`: the thread leaving notes when; the
/// thread arriving notes when it came, and its time off CPU: from its
/// `task_struct`, the clock less the CPU time the kernel gave it; from the
/// tracepoint's record, what it had plus how long it was away.
fn switch_program(map: i32, switch: Switch) -> Vec<u64> {
    let mut p = program();
    match switch {
        Switch::Record { prev_pid, .. } => pid_from_record(&mut p, prev_pid),
        Switch::Raw { .. } => p.push([insn(op::CALL, 0, 0, 0, op::GET_CURRENT_PID_TGID), insn(op::STX_W, 10, 0, -4, 0)]),
    }
    p.push([
        insn(op::LD_DW_IMM, 1, op::PSEUDO_MAP_FD, 0, map),
        0,
        insn(op::MOV_X, 2, 10, 0, 0),
        insn(op::ADD_K, 2, 0, 0, -4),
        insn(op::CALL, 0, 0, 0, op::MAP_LOOKUP_ELEM),
        insn(op::JEQ_K, 0, 0, 1, 0),
        insn(op::STX_DW, 0, 7, 8, 0),
    ]);
    let next_pid = match switch {
        Switch::Record { next_pid, .. } => next_pid,
        Switch::Raw(task) => return set_from_task(p, map, 16, task),
    };
    pid_from_record(&mut p, next_pid);
    p.look_up(map, -4);
    p.push([insn(op::LDX_DW, 1, 0, 8, 0)]);
    now_on_cpu(&mut p, 2);
    p.push([insn(op::STX_DW, 0, 2, 8, 0)]);
    p.end_if(op::JEQ_K, 1, 0);
    p.push([insn(op::MOV_X, 2, 1, 0, 0), insn(op::RSH_K, 2, 0, 0, ON_CPU as i32)]);
    p.end_if(op::JNE_K, 2, 0);
    p.push([insn(op::MOV_X, 2, 7, 0, 0), insn(op::SUB_X, 2, 1, 0, 0), insn(op::ATOMIC_DW, 0, 2, 0, op::ATOMIC_ADD)]);
    p.finish(&[])
}

/// The program on `sched_stat_runtime`, which the scheduler raises as it
/// adds to a running task's CPU time (at every tick and switch, and as
/// the thread reads its CPU clock): time the hypervisor took from the
/// thread's CPU (steal), which the kernel leaves out of the task's CPU
/// time, counts as time off CPU, and so does time away that no
/// `sched_switch` reported (the module's note). From the task's
/// `task_struct` (Linux 6.8 on), its time off CPU is the clock less the
/// CPU time the kernel has given it, anew at each accounting. From the
/// tracepoint's record, which has only the CPU time of the stretch since
/// the last accounting, the rest of that stretch is added to it: the two
/// clocks disagree by microseconds now and then, which only a threshold
/// tells from steal.
fn runtime_program(map: i32, update: Update) -> Vec<u64> {
    let mut p = program();
    match update {
        Update::Record { pid, runtime } => {
            pid_from_record(&mut p, pid);
            p.push([insn(op::LDX_DW, 8, 6, runtime, 0)]);
        }
        Update::Raw(task) if !task.cpu_time_added_first => {
            p.read_field(0, task.pid, 4, -4);
            p.push([insn(op::LDX_DW, 8, 6, 8, 0)]);
        }
        Update::Raw(task) => return set_from_task(p, map, 0, task),
    }
    p.look_up(map, -4);
    // r4: 1 when the entry has the thread on a CPU, 0 when it has it gone.
    p.push([insn(op::LDX_DW, 1, 0, 8, 0), insn(op::MOV_X, 4, 1, 0, 0), insn(op::RSH_K, 4, 0, 0, ON_CPU as i32)]);
    p.end_if(op::JEQ_K, 1, 0);
    p.push([
        insn(op::LSH_K, 1, 0, 0, 1),
        insn(op::RSH_K, 1, 0, 0, 1),
        insn(op::MOV_X, 2, 7, 0, 0),
        insn(op::SUB_X, 2, 1, 0, 0),
        insn(op::SUB_X, 2, 8, 0, 0),
    ]);
    now_on_cpu(&mut p, 3);
    p.push([insn(op::STX_DW, 0, 3, 8, 0)]);
    // On a CPU: a stretch past the clocks' disagreement is steal. Gone:
    // the thread came back `runtime` ago, unseen, and was off CPU from
    // when it left until then.
    p.push([insn(op::JEQ_K, 4, 0, 1, 0)]);
    p.end_if(op::JSLE_K, 2, STEAL_NOISE_NS);
    p.end_if(op::JSLE_K, 2, 0);
    p.push([insn(op::ATOMIC_DW, 0, 2, 0, op::ATOMIC_ADD)]);
    p.finish(&[])
}

/// A tracepoint's id and its record's format.
fn tracepoint(name: &str) -> io::Result<(u64, String)> {
    let tracefs = crate::tracefs::Tracefs::open().map_err(io::Error::other)?;
    let dir = tracefs.root().join("events/sched").join(name);
    let id = std::fs::read_to_string(dir.join("id"))?.trim().parse().map_err(io::Error::other)?;
    Ok((id, std::fs::read_to_string(dir.join("format"))?))
}

fn field(tracepoint: &str, format: &str, name: &str) -> io::Result<i16> {
    crate::tracefs::field_offset(format, name)
        .and_then(|o| i16::try_from(o).ok())
        .ok_or_else(|| io::Error::other(format!("{tracepoint} has no {name} field")))
}

/// Whether the running kernel is Linux `major.minor` or later.
fn linux_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (major, minor)
}

/// Where a task keeps its pid and CPU time, from the kernel's BTF.
fn task_fields() -> Option<TaskFields> {
    crate::btf::read_kernel(|btf| {
        let offset = |structure, member| crate::btf::member_offset(btf, structure, member).and_then(|o| i32::try_from(o).ok());
        let cpu_time = offset("task_struct", "se")?.checked_add(offset("sched_entity", "sum_exec_runtime")?)?;
        Some(TaskFields { pid: offset("task_struct", "pid")?, cpu_time, cpu_time_added_first: linux_at_least(6, 8) })
    })
}

impl OffCpu {
    /// Loads the programs on `sched_switch` and `sched_stat_runtime`: as
    /// raw tracepoints where the kernel's BTF says where a task keeps its
    /// pid and CPU time (one link each, closed at once), else through the tracepoints' perf
    /// events on every CPU (each closes only after an RCU grace period).
    /// Where the kernel has no `sched_stat_runtime` the array is kept
    /// without it: time the hypervisor takes counts as CPU time.
    /// The array is frozen: only the programs write it. A patched process
    /// holds its descriptor (see [`OffCpu::map`]); frozen, it cannot map
    /// it writable, nor update it, and so cannot change the times off CPU
    /// of any thread of any recording that shares the array.
    pub fn load() -> io::Result<OffCpu> {
        let off = OffCpu::load_by(task_fields())?;
        let mut attr = [0u64; 16];
        attr[0] = off.map.as_raw_fd() as u64;
        bpf_call(BPF_MAP_FREEZE, &mut attr).map_err(|e| context("cannot freeze the off-CPU time array", e))?;
        Ok(off)
    }

    /// As raw tracepoints when where a task keeps its fields is known.
    fn load_by(task: Option<TaskFields>) -> io::Result<OffCpu> {
        let pid_max = crate::procfs::sysctl_number("kernel/pid_max").unwrap_or(1 << 22);
        let entries = pid_max.clamp(1024, 1 << 22);
        let mut attr = [0u64; 16];
        attr[0] = u64::from(BPF_MAP_TYPE_ARRAY) | (4 << 32);
        attr[1] = ENTRY_BYTES | (entries << 32);
        // Not BPF_F_RDONLY, which the kernel refuses to map at all: a read-only
        // mapping of it cannot be made writable (VM_MAYWRITE is dropped), and
        // the array is frozen once loaded (see OffCpu::load), so that a
        // patched process holding its descriptor cannot write it either.
        attr[2] = u64::from(BPF_F_MMAPABLE);
        let map = bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| context("cannot create the off-CPU time array", e))?;
        let loaded = match task.and_then(|task| load_raw(map.as_raw_fd(), task).ok()) {
            Some(loaded) => loaded,
            None => load_on_records(map.as_raw_fd())?,
        };
        Ok(OffCpu { map, entries, view: std::sync::OnceLock::new(), loaded: Some(loaded) })
    }

    /// The array another process loaded (and keeps running), covering `entries` thread ids.
    pub fn lent(map: OwnedFd, entries: u64) -> OffCpu {
        OffCpu { map, entries: entries.min(1 << 22), view: std::sync::OnceLock::new(), loaded: None }
    }

    /// The array, to map read-only (`MAP_SHARED`, [`OffCpu::bytes`] long,
    /// or a page at a time).
    pub fn map(&self) -> BorrowedFd<'_> {
        self.map.as_fd()
    }

    /// What `fstat` says of the array's descriptor: its device and inode
    /// (those of every BPF map's, and of other anonymous files, but not a
    /// file's, a pipe's or a socket's).
    pub fn identity(&self) -> io::Result<(u64, u64)> {
        let status = nix::sys::stat::fstat(self.map.as_fd()).map_err(io::Error::from)?;
        Ok((status.st_dev, status.st_ino))
    }

    /// The array's id among the kernel's BPF maps, if `/proc` says.
    pub fn map_id(&self) -> Option<u64> {
        map_id_of("self", self.map.as_raw_fd() as u64)
    }

    /// Thread ids it covers.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes to map.
    pub fn bytes(&self) -> u64 {
        (self.entries * ENTRY_BYTES).next_multiple_of(4096)
    }

    /// Thread `tid`'s time off CPU up to its last switch or accounting,
    /// nanoseconds, not counting the stretch it may be off CPU in now (see
    /// [`ENTRY_BYTES`]: only differences mean anything).
    pub fn off_cpu_ns(&self, tid: u32) -> Option<u64> {
        self.word(tid, 0)
    }

    /// Thread `tid`'s time off CPU up to `at_ns` (CLOCK_MONOTONIC): what
    /// [`OffCpu::off_cpu_ns`] says, and, if it has been off CPU since
    /// before then (asleep, or ended), that stretch up to `at_ns`.
    pub fn off_cpu_ns_at(&self, tid: u32, at_ns: u64) -> Option<u64> {
        self.entry(tid).map(|entry| entry.off_cpu_ns_at(at_ns))
    }

    /// When thread `tid` last left a CPU (CLOCK_MONOTONIC), if it is off
    /// every CPU now; for a thread that ended, when it ended.
    pub fn left_at_ns(&self, tid: u32) -> Option<u64> {
        self.entry(tid)?.left_at_ns()
    }

    /// Thread `tid`'s entry, both words of one moment: the programs write
    /// the second before they change the first, so a second word read the
    /// same before and after the first holds with it.
    pub fn entry(&self, tid: u32) -> Option<Entry> {
        for _ in 0..8 {
            let when = self.word(tid, 1)?;
            let off_ns = self.word(tid, 0)?;
            if self.word(tid, 1)? == when {
                return Some(Entry { off_ns, when });
            }
        }
        None
    }

    /// The entries of `tids` as they stand now, kept: what a thread does
    /// after (woken or stopped by a detach) does not change them.
    pub fn snapshot(&self, tids: impl IntoIterator<Item = u32>) -> OffCpuSnapshot<'_> {
        let taken = tids.into_iter().filter_map(|tid| Some((tid, self.entry(tid)?))).collect();
        OffCpuSnapshot { live: self, taken }
    }

    fn word(&self, tid: u32, word: usize) -> Option<u64> {
        let view = self.view.get_or_init(|| View::map(self.map.as_fd(), self.bytes() as usize)).as_ref()?;
        let at = 2 * tid as usize + word;
        (at < view.len / 8).then(|| {
            // SAFETY: within the mapping; the kernel writes it while we read.
            unsafe { std::ptr::read_volatile(view.base.cast::<u64>().add(at)) }
        })
    }
}

/// A thread's entry in the array at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Nanoseconds off CPU up to its last switch or accounting, not
    /// counting a stretch it is off CPU in now (only differences mean
    /// anything).
    pub off_ns: u64,
    /// When it left a CPU (bit 63 clear), or came onto one (set); 0 unseen.
    when: u64,
}

impl Entry {
    /// When it last left a CPU, if it is off every CPU.
    pub fn left_at_ns(&self) -> Option<u64> {
        Some(self.when).filter(|&left| left != 0 && left >> ON_CPU == 0)
    }

    /// Its time off CPU up to `at_ns`, the stretch it is off CPU in included.
    pub fn off_cpu_ns_at(&self, at_ns: u64) -> u64 {
        let away = self.left_at_ns().filter(|&left| left <= at_ns).map_or(0, |left| at_ns - left);
        self.off_ns.saturating_add(away)
    }
}

/// Some threads' entries kept from one moment; the others' read live.
pub struct OffCpuSnapshot<'a> {
    live: &'a OffCpu,
    taken: std::collections::HashMap<u32, Entry>,
}

impl OffCpuSnapshot<'_> {
    /// Thread `tid`'s entry: as kept, else as it is now.
    pub fn entry(&self, tid: u32) -> Option<Entry> {
        self.taken.get(&tid).copied().or_else(|| self.live.entry(tid))
    }
}

/// A read-only mapping of the array in this process.
struct View {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value, read with volatile loads.
unsafe impl Send for View {}
// SAFETY: as above; nothing writes through it.
unsafe impl Sync for View {}

impl View {
    fn map(fd: BorrowedFd<'_>, len: usize) -> Option<View> {
        // SAFETY: a read-only shared mapping of a BPF_F_MMAPABLE array.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        (base != libc::MAP_FAILED).then_some(View { base, len })
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: unmapping what map() mapped.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The id of the BPF map descriptor `fd` of process `pid` (a number, or
/// "self") holds, if it holds one and `/proc` says.
pub fn map_id_of(pid: impl std::fmt::Display, fd: u64) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|line| line.strip_prefix("map_id:")?.trim().parse().ok())
}

/// Where a process without the right to load the program gets the array.
type Source = Box<dyn Fn() -> Option<OffCpu> + Send + Sync>;

static SOURCE: std::sync::OnceLock<Source> = std::sync::OnceLock::new();

/// Makes `source` provide the array from now on. Whether this process may
/// load BPF is a property of the process (a proftapd session worker may
/// not, and asks proftapd), so it is set once; a second call is refused.
pub fn set_source(source: Source) -> Result<(), Source> {
    SOURCE.set(source)
}

/// The array for a recording: loaded here, or lent by whoever
/// [`set_source`] named; `None` when neither can (no CAP_BPF).
pub fn obtain() -> Option<OffCpu> {
    match SOURCE.get() {
        Some(source) => source(),
        None => OffCpu::load().ok(),
    }
}

/// Both programs as raw tracepoints.
fn load_raw(map: i32, task: TaskFields) -> io::Result<Loaded> {
    let mut loaded = Loaded::default();
    let switch = load_program(BPF_PROG_TYPE_RAW_TRACEPOINT, &switch_program(map, Switch::Raw(task)), PROGRAM)?;
    loaded.links.push(attach_raw(c"sched_switch", &switch, PROGRAM)?);
    loaded.programs.push(switch);
    let update = load_program(BPF_PROG_TYPE_RAW_TRACEPOINT, &runtime_program(map, Update::Raw(task)), PROGRAM)
        .and_then(|update| Ok((attach_raw(c"sched_stat_runtime", &update, PROGRAM)?, update)));
    if let Ok((link, update)) = update {
        loaded.links.push(link);
        loaded.programs.push(update);
    }
    Ok(loaded)
}

/// Both programs on the tracepoints' records, through their perf events.
fn load_on_records(map: i32) -> io::Result<Loaded> {
    let mut loaded = Loaded::default();
    let (id, format) = tracepoint("sched_switch")?;
    let switch =
        Switch::Record { prev_pid: field("sched_switch", &format, "prev_pid")?, next_pid: field("sched_switch", &format, "next_pid")? };
    let program = load_program(BPF_PROG_TYPE_TRACEPOINT, &switch_program(map, switch), PROGRAM)?;
    loaded.links.extend(attach(id, &program)?);
    loaded.programs.push(program);
    let update = || -> io::Result<(Vec<OwnedFd>, OwnedFd)> {
        let (id, format) = tracepoint("sched_stat_runtime")?;
        let update =
            Update::Record { pid: field("sched_stat_runtime", &format, "pid")?, runtime: field("sched_stat_runtime", &format, "runtime")? };
        let program = load_program(BPF_PROG_TYPE_TRACEPOINT, &runtime_program(map, update), PROGRAM)?;
        Ok((attach(id, &program)?, program))
    };
    if let Ok((events, program)) = update() {
        loaded.links.extend(events);
        loaded.programs.push(program);
    }
    Ok(loaded)
}

/// Opens the tracepoint on every online CPU with the program attached (once:
/// a tracepoint runs its programs on every CPU where it has an event).
fn attach(tracepoint: u64, program: &OwnedFd) -> io::Result<Vec<OwnedFd>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut events = Vec::new();
    for cpu in 0..cpus {
        // SAFETY: a zeroed perf_event_attr with the fields set below.
        let mut attr: perf_event_open_sys::bindings::perf_event_attr = unsafe { std::mem::zeroed() };
        attr.type_ = perf_event_open_sys::bindings::PERF_TYPE_TRACEPOINT;
        attr.size = size_of::<perf_event_open_sys::bindings::perf_event_attr>() as u32;
        attr.config = tracepoint;
        attr.__bindgen_anon_1.sample_period = 1;
        // SAFETY: perf_event_open with a valid attribute, any process, one CPU.
        let fd = unsafe {
            perf_event_open_sys::perf_event_open(&mut attr, -1, cpu as i32, -1, perf_event_open_sys::bindings::PERF_FLAG_FD_CLOEXEC as u64)
        };
        if fd < 0 {
            return Err(context(&format!("cannot open tracepoint {tracepoint} on CPU {cpu}"), io::Error::last_os_error()));
        }
        // SAFETY: perf_event_open returned a new descriptor.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ioctls on that descriptor, with a program descriptor and no argument.
        unsafe {
            if cpu == 0 && perf_event_open_sys::ioctls::SET_BPF(event.as_raw_fd(), program.as_raw_fd() as u32) < 0 {
                return Err(context("cannot attach the off-CPU time program", io::Error::last_os_error()));
            }
            perf_event_open_sys::ioctls::ENABLE(event.as_raw_fd(), 0);
        }
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The programs loaded here; `None`, said, where BPF is not allowed.
    fn loaded() -> Option<OffCpu> {
        loaded_by(task_fields())
    }

    fn loaded_by(task: Option<TaskFields>) -> Option<OffCpu> {
        let off = OffCpu::load_by(task);
        if off.is_err() {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none() || !nix::unistd::geteuid().is_root(), "BPF works as root here");
            eprintln!("skipped: BPF needs CAP_BPF and CAP_PERFMON");
        }
        off.ok()
    }

    #[test]
    fn a_sleep_shows_as_time_off_cpu() {
        let Some(off) = loaded() else { return };
        // SAFETY: mapping the array read-only, as the kernel allows for BPF_F_MMAPABLE maps.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), off.bytes() as usize, libc::PROT_READ, libc::MAP_SHARED, off.map().as_raw_fd(), 0) };
        assert_ne!(base, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let tid = nix::unistd::gettid().as_raw() as usize;
        // SAFETY: within the mapping.
        let read = |field: usize| unsafe { std::ptr::read_volatile(base.cast::<u64>().add(2 * tid + field)) };
        // Seen once on a CPU first: the programs know a thread from its first switch.
        std::thread::sleep(std::time::Duration::from_millis(1));
        // What the kernel says the sleep left off CPU: the wall time less
        // the CPU time it gave the thread. On this VM it once gave a
        // sleeping thread more CPU time than the wall time around it (its
        // scheduler's clock is not the monotonic one): the programs follow
        // the kernel, and are judged against it, not against the 50 ms.
        let now = |id| nix::time::clock_gettime(id).map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec()).unwrap();
        // The thread's CPU clock read first, which makes the kernel account
        // it (and the programs set its entry), then the entry, then the
        // wall clock. The three read with no switch between them (one
        // would count in one and not the other): a try with one is made again.
        let pair = || {
            let cpu = now(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
            let entry = read(0);
            (entry, now(nix::time::ClockId::CLOCK_MONOTONIC) - cpu)
        };
        let switches = || {
            let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
            usage.voluntary_context_switches() + usage.involuntary_context_switches()
        };
        let both = || {
            (0..100)
                .find_map(|_| {
                    let at = switches();
                    let taken = pair();
                    (switches() == at).then_some(taken)
                })
                .expect("a moment without a switch")
        };
        let (before, kernel_before) = both();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (after, kernel_after) = both();
        // Signed: a step back is reported with both values.
        let slept = after.wrapping_sub(before) as i64;
        let kernel_slept = kernel_after - kernel_before;
        let links = off.loaded.as_ref().map_or(0, |loaded| loaded.links.len());
        if kernel_slept < 45_000_000 {
            eprintln!(
                "the kernel counted {kernel_slept} ns of a 50 ms sleep off CPU (the rest as the thread's CPU time): judged against that"
            );
        }
        assert!(
            slept.abs_diff(kernel_slept) < 2_000_000,
            "{slept} ns off CPU over a 50 ms sleep ({before} then {after}), where the kernel says {kernel_slept} ns; thread {tid}, last left at {} ns, {links} links, raw tracepoint possible: {}",
            read(1),
            task_fields().is_some()
        );
        // SAFETY: unmapping it.
        unsafe { libc::munmap(base, off.bytes() as usize) };
    }

    /// Wall time less time off CPU is the kernel's CPU time of the thread
    /// (what `task-clock` counts), over stretches running and asleep: to
    /// within a tick and a switch's worth of the two clocks' disagreement
    /// per stretch, whatever the hypervisor took meanwhile.
    #[test]
    fn wall_time_less_time_off_cpu_is_the_kernels_cpu_time() {
        let Some(off) = loaded() else { return };
        wall_less_off_is_cpu(&off);
    }

    /// Where the kernel adds a real-time task's CPU time after it raises
    /// `sched_stat_runtime` (before 6.8), the program on it adds up the
    /// stretches it reports: the same agreement.
    #[test]
    fn where_the_cpu_time_is_added_after_the_tracepoint_the_stretches_are_added_up() {
        let Some(task) = task_fields() else { return };
        let Some(off) = loaded_by(Some(TaskFields { cpu_time_added_first: false, ..task })) else { return };
        wall_less_off_is_cpu(&off);
        back_unseen_is_counted(&off);
    }

    /// Without the kernel's BTF, the programs read the tracepoints' records.
    #[test]
    fn on_the_tracepoints_records_the_programs_count_the_same() {
        let Some(off) = loaded_by(None) else { return };
        let loaded = off.loaded.as_ref().expect("loaded here");
        assert_eq!(loaded.programs.len(), 2, "a program on sched_switch and one on sched_stat_runtime");
        wall_less_off_is_cpu(&off);
    }

    fn wall_less_off_is_cpu(off: &OffCpu) {
        let tid = nix::unistd::gettid().as_raw() as u32;
        let clock = |id| nix::time::clock_gettime(id).map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64).unwrap();
        let spin = |ms: u64| {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        let read = || {
            let cpu = clock(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
            (clock(nix::time::ClockId::CLOCK_MONOTONIC), off.off_cpu_ns(tid).expect("a thread id within the array"), cpu)
        };
        // Seen once on a CPU first: the programs know a thread from its first switch.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let (wall0, off0, cpu0) = read();
        for _ in 0..4 {
            spin(60);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        spin(60);
        let (wall1, off1, cpu1) = read();
        // Signed: the kernel may give a thread more CPU time than the wall
        // time around it (see the sleep test), and the programs follow it.
        let (wall, away, cpu) = (wall1 as i64 - wall0 as i64, off1.wrapping_sub(off0) as i64, cpu1 as i64 - cpu0 as i64);
        let by_difference = wall - away;
        let tolerance = 5_000_000 + cpu.unsigned_abs() / 50;
        // Four sleeps of 20 ms that the programs did not count off CPU
        // would be 80 ms too much here.
        assert!(
            by_difference.abs_diff(cpu) < tolerance,
            "wall {wall} ns less {away} ns off CPU = {by_difference} ns, where the kernel counts {cpu} ns of CPU time"
        );
    }

    /// A thread whose entry has it gone while it runs (its coming back on a
    /// CPU raised no `sched_switch`, as happens for a switch away from some
    /// tasks): reading its CPU clock makes the kernel account it, and its
    /// time away is counted then. (With BTF every accounting sets the entry
    /// from the kernel's CPU time, gone or not; the programs that add up
    /// stretches mend a gone entry apart: see the test after.)
    #[test]
    fn a_return_to_a_cpu_not_seen_is_counted_at_the_next_accounting() {
        for off in [loaded(), loaded_by(None)].into_iter().flatten() {
            back_unseen_is_counted(&off);
        }
    }

    fn back_unseen_is_counted(off: &OffCpu) {
        const AWAY_NS: u64 = 20_000_000;
        let tid = nix::unistd::gettid().as_raw() as u32;
        let switches = || {
            let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
            usage.voluntary_context_switches() + usage.involuntary_context_switches()
        };
        // Seen once on a CPU first: the programs know a thread from its first switch.
        std::thread::sleep(std::time::Duration::from_millis(1));
        // A switch between the entry written and read back would write it
        // over: such a try is made again.
        for _ in 0..100 {
            // Accounted now: what the kernel counts next is the few
            // nanoseconds since, not a tick's worth.
            clock(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
            let (before, left) = (off.entry(tid).unwrap(), clock(nix::time::ClockId::CLOCK_MONOTONIC));
            std::thread::sleep(std::time::Duration::from_nanos(AWAY_NS));
            let back = switches();
            // The entry as the thread left, as if its coming back had not been seen.
            update_entry(off, tid, [before.off_ns, left]);
            clock(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
            let after = off.entry(tid).unwrap();
            let since_left = clock(nix::time::ClockId::CLOCK_MONOTONIC) - left;
            if switches() != back {
                continue;
            }
            assert_eq!(after.left_at_ns(), None, "accounted while it runs: on a CPU again");
            let away = after.off_ns - before.off_ns;
            assert!(
                (AWAY_NS..=since_left + 100_000).contains(&away),
                "{away} ns off CPU counted for a sleep of {AWAY_NS} ns, {since_left} ns after it began"
            );
            return;
        }
        panic!("every try was interrupted by a switch of the thread");
    }

    fn clock(id: nix::time::ClockId) -> u64 {
        nix::time::clock_gettime(id).map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64).unwrap()
    }

    /// With the kernel's BTF, each stretch's wall time less its time off
    /// CPU is the CPU time the kernel gave the thread, read as it ends
    /// (which accounts it), to within microseconds: no stretch gets
    /// another's steal, nor the clocks' disagreement.
    #[test]
    fn each_stretch_s_time_off_cpu_leaves_the_kernel_s_cpu_time() {
        let Some(off) = loaded() else { return };
        if task_fields().is_none() {
            return;
        }
        let tid = nix::unistd::gettid().as_raw() as u32;
        // Three clocks read at one moment: a try the hypervisor stopped
        // in between (5 us or more from first to last) is made again.
        let read = || loop {
            let wall = clock(nix::time::ClockId::CLOCK_MONOTONIC);
            let cpu = clock(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
            let off = off.off_cpu_ns(tid).unwrap();
            if clock(nix::time::ClockId::CLOCK_MONOTONIC) - wall < 5_000 {
                return (wall, off, cpu);
            }
        };
        std::thread::sleep(std::time::Duration::from_millis(1));
        let mut worst = (0, 0, 0i64, 0);
        for _ in 0..200 {
            let (wall0, off0, cpu0) = read();
            // A millisecond of CPU time, its clock read as it goes (each
            // read an accounting), then a sleep.
            while clock(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID) < cpu0 + 1_000_000 {
                std::hint::black_box((0..100).sum::<u64>());
            }
            let (wall1, off1, cpu1) = read();
            // The clock and the scheduler's disagree now and then (by
            // 100 us in a millisecond, seen under load): the time off CPU
            // goes back as much, and the wall time less it is still the
            // kernel's CPU time.
            let away = off1.wrapping_sub(off0) as i64;
            let error = ((wall1 - wall0) as i64 - away).abs_diff((cpu1 - cpu0) as i64);
            if error > worst.0 {
                worst = (error, wall1 - wall0, away, cpu1 - cpu0);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (error, wall, away, cpu) = worst;
        assert!(error < 20_000, "a stretch's wall {wall} ns less {away} ns off CPU is {error} ns from the kernel's {cpu} ns of CPU time");
    }

    /// Writes thread `tid`'s entry, as the programs would have.
    fn update_entry(off: &OffCpu, tid: u32, entry: [u64; 2]) {
        const BPF_MAP_UPDATE_ELEM: i32 = 2;
        let mut attr = [0u64; 16];
        attr[0] = off.map().as_raw_fd() as u64;
        attr[1] = &tid as *const u32 as u64;
        attr[2] = entry.as_ptr() as u64;
        // SAFETY: bpf(2) updating one element of an array map, key and value pointing at live values of its sizes.
        let done = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, attr.as_mut_ptr(), size_of::<[u64; 16]>()) };
        assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
    }

    /// A thread asleep now has been off CPU since it left: counted up to
    /// any moment asked, where the array adds it only when it comes back.
    #[test]
    fn a_thread_asleep_now_counts_its_sleep_up_to_the_moment_asked() {
        let Some(off) = loaded() else { return };
        let (tid_sender, tid) = std::sync::mpsc::channel();
        let (wake, woken) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tid_sender.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            woken.recv().unwrap();
        });
        let tid = tid.recv().unwrap();
        // Asleep once the kernel says so (state S in its stat line).
        let state =
            || std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap().rsplit(')').next().unwrap().trim().starts_with('S');
        while !state() {
            std::thread::yield_now();
        }
        let now = || {
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
                .unwrap()
        };
        let (first, so_far) = (now(), off.off_cpu_ns(tid).unwrap());
        let left = off.left_at_ns(tid).expect("asleep: off CPU since it left");
        assert!(left <= first, "left at {left}, now {first}");
        let later = first + 50_000_000;
        assert_eq!(off.off_cpu_ns_at(tid, later), Some(so_far + (later - left)));
        // Before it left, nothing more.
        assert_eq!(off.off_cpu_ns_at(tid, left - 1), Some(so_far));
        wake.send(()).unwrap();
        sleeper.join().unwrap();
    }

    /// Where the kernel publishes its BTF, the programs run as raw
    /// tracepoints: one link each for every CPU (whose closing waits for no
    /// grace period), not one perf event per CPU.
    #[test]
    fn with_btf_the_program_is_one_raw_tracepoint() {
        let Some(off) = loaded() else { return };
        if task_fields().is_none() {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "this kernel publishes no BTF");
            eprintln!("skipped: this kernel publishes no BTF");
            return;
        }
        let loaded = off.loaded.as_ref().expect("loaded here");
        assert_eq!((loaded.programs.len(), loaded.links.len()), (2, 2), "a program and a link on sched_switch and sched_stat_runtime");
    }
}

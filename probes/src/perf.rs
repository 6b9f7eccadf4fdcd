//! The perf_event side of recording: probe events with their counter groups,
//! sideband events for thread and exec records, per-CPU ring buffers, and the
//! parser for the records proftap asks the kernel for.

use crate::metrics::Metric;
use perf_event::events::{Software, Tracepoint};
use perf_event::{Builder, Clock, Counter, ReadFormat, SampleFlag, Sampler};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// x86-64 user register index of the stack pointer (`PERF_REG_X86_SP`).
#[cfg(target_arch = "x86_64")]
const REG_SP: u64 = 7;
/// AArch64 `PERF_REG_ARM64_SP`.
#[cfg(target_arch = "aarch64")]
const REG_SP: u64 = 31;

const SAMPLE_FLAGS: SampleFlag = SampleFlag::IDENTIFIER
    .union(SampleFlag::TID)
    .union(SampleFlag::TIME)
    .union(SampleFlag::READ)
    .union(SampleFlag::RAW)
    .union(SampleFlag::REGS_USER);

/// Whether this process may observe the kernel with perf events: root,
/// `CAP_PERFMON` or `CAP_SYS_ADMIN`, or `kernel.perf_event_paranoid` at 1 or
/// below. Otherwise every event must exclude the kernel, and ring buffers
/// fit the user's share of locked memory (`kernel.perf_event_mlock_kb`).
pub fn kernel_observable() -> bool {
    static OBSERVABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OBSERVABLE.get_or_init(|| capable(1 << CAP_SYS_ADMIN | 1 << CAP_PERFMON) || paranoid() <= 1)
}

const CAP_SYS_ADMIN: u64 = 21;
const CAP_PERFMON: u64 = 38;

/// Whether this process has one of the capabilities `mask` (bits by number).
fn capable(mask: u64) -> bool {
    let effective = std::fs::read_to_string("/proc/self/status").ok().and_then(|status| {
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim().to_string();
        u64::from_str_radix(&hex, 16).ok()
    });
    effective.is_some_and(|caps| caps & mask != 0)
}

/// Whether this process may define kernel uprobes: tracefs's
/// `uprobe_events` is root's (`CAP_SYS_ADMIN`).
pub fn may_define_uprobes() -> bool {
    capable(1 << CAP_SYS_ADMIN)
}

/// `kernel.perf_event_paranoid` (2, its usual default, when unreadable).
pub fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(2)
}

/// The ring buffer per CPU an unprivileged user can map: a power of two
/// within `kernel.perf_event_mlock_kb` (516 KiB by default, counted per
/// CPU), leaving room for the header pages and a clock page. `None` when
/// the process is not limited.
pub fn unprivileged_ring_bytes() -> Option<usize> {
    if kernel_observable() {
        return None;
    }
    let kib = crate::procfs::sysctl_number("kernel/perf_event_mlock_kb").map_or(516, |kib| kib as usize);
    let room = (kib.saturating_sub(16) << 10).max(8 << 10);
    Some(1 << (usize::BITS - 1 - room.leading_zeros()))
}

/// Where events are opened: a task and a CPU.
#[derive(Clone, Copy, Debug)]
pub struct EventTarget {
    /// Thread (or process) id.
    pub pid: i32,
    /// CPU number.
    pub cpu: usize,
    /// Start counting when the task calls exec (for `run`), instead of now.
    pub enable_on_exec: bool,
}

fn base(builder: &mut Builder<'_>, target: EventTarget) {
    builder
        .observe_pid(target.pid)
        .one_cpu(target.cpu)
        .inherit(true)
        .clockid(Clock::MONOTONIC)
        .sample_id_all(true)
        .sample(SAMPLE_FLAGS)
        .sample_regs_user(1 << REG_SP)
        .enable_on_exec(target.enable_on_exec)
        .enabled(!target.enable_on_exec);
}

/// An event (a probe's tracepoint, a context-switch counter) leading a group of counters, one per metric
/// after wall time (which comes from the sample timestamp).
pub struct CounterGroup {
    /// The tracepoint event; its samples carry the group's values.
    pub leader: Counter,
    _members: Vec<Counter>,
}

/// Opens the event of tracepoint `id` with the counters of `metrics`.
pub fn open_probe(id: u64, target: EventTarget, metrics: &[Metric]) -> io::Result<CounterGroup> {
    open_group(Builder::new(Tracepoint::with_id(id)), target, metrics)
}

/// Opens the event of tracepoint `id` on a kernel thread, where its uprobes
/// never fire, to keep them registered. The kernel removes a uprobe's
/// breakpoints from a process as soon as the last event on that process
/// closes, but unregisters the uprobe, which waits for grace periods that a
/// thread hitting it can hold up for long and that stall the exit of a
/// process, only when the last event anywhere closes. With a keeper open, a
/// target's events close at once; the keeper closes when the targets are gone.
pub fn open_keeper(id: u64) -> io::Result<Counter> {
    // kthreadd, pid 2, unless this is a pid namespace where pid 2 is a process.
    const KTHREADD: i32 = 2;
    let comm = std::fs::read_to_string(format!("/proc/{KTHREADD}/comm")).unwrap_or_default();
    if comm.trim() != "kthreadd" || std::fs::read_link(format!("/proc/{KTHREADD}/exe")).is_ok() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no kernel thread to hold uprobes on"));
    }
    let mut builder = Builder::new(Tracepoint::with_id(id));
    builder.observe_pid(KTHREADD).any_cpu().enabled(false);
    builder.build()
}

/// Opens a context-switch event with the counters of `metrics`: each time a
/// thread leaves the CPU, a sample carries its counts on that CPU. Counters
/// inherited per CPU only count while the thread runs there; these samples
/// let the aggregator add up a thread's counts over all CPUs.
pub fn open_switches(target: EventTarget, metrics: &[Metric]) -> io::Result<CounterGroup> {
    open_group(Builder::new(Software::CONTEXT_SWITCHES), target, metrics)
}

fn open_group(mut builder: Builder<'_>, target: EventTarget, metrics: &[Metric]) -> io::Result<CounterGroup> {
    base(&mut builder, target);
    // A context switch happens in the kernel: excluding the kernel would drop it.
    builder.sample_period(1).exclude_kernel(false);
    // Exactly GROUP and LOST (each value with the samples lost on its event,
    // read at the end: a loss the kernel never got to report as a record).
    // The builder's read_format() would add ID.
    builder.attrs_mut().read_format = (ReadFormat::GROUP | ReadFormat::LOST).bits();
    let mut leader = builder.build()?;
    let mut members = Vec::new();
    for metric in metrics {
        let mut member = match metric {
            Metric::Wall => continue,
            Metric::Cpu => Builder::new(Software::TASK_CLOCK),
            Metric::Software(s) => Builder::new(*s),
            Metric::Hardware(h) => Builder::new(*h),
        };
        member
            .observe_pid(target.pid)
            .one_cpu(target.cpu)
            .inherit(true)
            .clockid(Clock::MONOTONIC)
            // CPU time is user and system time, as getrusage counts it.
            .exclude_kernel(false)
            // Members count whenever the leader does.
            .enabled(true);
        members.push(member.build_with_group(&mut leader)?);
    }
    Ok(CounterGroup { leader, _members: members })
}

/// Has the kernel switch its perf scheduling hooks on, on a thread of its
/// own. The first per-task event on a machine switches them on and waits
/// for an RCU grace period before its `perf_event_open` returns (13 to 20
/// ms, see BENCHMARKS.md); they stay on for a second after the last one
/// closes. Called as a recording starts, the wait overlaps with reading
/// symbols instead of holding up the first event the recording needs.
pub fn switch_on_scheduling_hooks() {
    std::thread::spawn(|| {
        let mut builder = Builder::new(Software::DUMMY);
        builder.observe_self().any_cpu();
        // Closed at once: switching the hooks on is all it is for.
        drop(builder.build());
    });
}

/// Opens a sideband event: no samples, only the fork, exit, comm (thread
/// name, exec) and executable mmap records of the task and its descendants.
/// The first one on a CPU owns that CPU's ring buffer, of `buffer_bytes`:
/// readers are woken when a quarter of it is full, not for every record.
/// With `switches`, also a record each time a thread comes onto a CPU or leaves it.
pub fn open_sideband(target: EventTarget, buffer_bytes: usize, switches: bool) -> io::Result<Counter> {
    let mut builder = Builder::new(Software::DUMMY);
    base(&mut builder, target);
    builder
        .comm(true)
        .comm_exec(true)
        .task(true)
        .mmap(true)
        .mmap2(true)
        .context_switch(switches)
        .sample_period(1)
        .wakeup_watermark(buffer_bytes / 4);
    builder.build()
}

/// x86-64 `PERF_REG_X86_BP`, `_SP`, `_IP`: what a stack unwinder starts from.
#[cfg(target_arch = "x86_64")]
const UNWIND_REGS: u64 = (1 << 6) | (1 << 7) | (1 << 8);
#[cfg(not(target_arch = "x86_64"))]
const UNWIND_REGS: u64 = 1 << REG_SP;

/// The sample layout of [`open_stack_sampler`].
const STACK_SAMPLE_FLAGS: SampleFlag = SampleFlag::IDENTIFIER
    .union(SampleFlag::IP)
    .union(SampleFlag::TID)
    .union(SampleFlag::TIME)
    .union(SampleFlag::REGS_USER)
    .union(SampleFlag::STACK_USER);

/// Opens a sampling event: `frequency` samples per second of the task's
/// CPU time (hardware cycles where the machine counts them, else the
/// cpu-clock), each with the user registers and a copy of the top
/// `stack_bytes` of the user stack, for unwinding with DWARF CFI.
pub fn open_stack_sampler(target: EventTarget, frequency: u64, stack_bytes: u32) -> io::Result<Counter> {
    let mut builder = sampling_event();
    base(&mut builder, target);
    sample_stacks(&mut builder, frequency, stack_bytes);
    builder.build()
}

/// Opens a sampling event as [`open_stack_sampler`] does, but on CPU `cpu`
/// whatever runs there, with `filter` (see
/// [`crate::sampled_processes`]) keeping the samples of the processes a
/// recording samples. Disabled: enable it once its output is set.
pub fn open_cpu_stack_sampler(cpu: usize, frequency: u64, stack_bytes: u32, filter: BorrowedFd<'_>) -> io::Result<Counter> {
    let (mut builder, hardware) = (sampling_event(), has_cycles());
    // Not `exclude_idle`, which some processors' counters refuse: the
    // filter drops the idle task's samples (no process of a recording's).
    builder.any_pid().one_cpu(cpu).clockid(Clock::MONOTONIC).sample_id_all(true).enabled(false);
    // The CPU-clock pinned: where a task that comes onto the CPU holds a
    // pinned event (a debugger's breakpoint, which stays until its exec
    // once set), the kernel takes the CPU's unpinned events off and puts
    // them back at each switch, and each time restarts the CPU-clock's
    // timer. In this VM that cost a program 8 µs each time its main thread
    // came back (a pipe's round trip between two threads on one CPU took
    // 16 µs against 8). A
    // software clock always fits; hardware cycles stay unpinned, to share
    // the counters with other users rather than stop.
    builder.pinned(!hardware);
    sample_stacks(&mut builder, frequency, stack_bytes);
    let event = builder.build()?;
    // SAFETY: an open sampling event and a loaded program's descriptor.
    if unsafe { perf_event_open_sys::ioctls::SET_BPF(event.as_raw_fd(), filter.as_raw_fd() as u32) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(event)
}

/// Hardware cycles where the machine counts them, else the cpu-clock.
fn sampling_event() -> Builder<'static> {
    if has_cycles() { Builder::new(perf_event::events::Hardware::CPU_CYCLES) } else { Builder::new(Software::CPU_CLOCK) }
}

/// Whether the machine counts hardware cycles (asked once: each ask opens an event).
fn has_cycles() -> bool {
    static CYCLES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CYCLES.get_or_init(|| crate::metrics::Metric::Hardware(perf_event::events::Hardware::CPU_CYCLES).check_available().is_ok())
}

/// A stack sampler's layout, rate and copies, for any target (after what
/// [`base`] sets).
fn sample_stacks(builder: &mut Builder<'_>, frequency: u64, stack_bytes: u32) {
    // Exactly this layout (the builder's sample() adds to what base() set).
    builder.attrs_mut().sample_type = STACK_SAMPLE_FLAGS.bits();
    builder
        .sample_regs_user(UNWIND_REGS)
        .sample_stack_user(stack_bytes)
        // No wakeup of its own: the ring's owner wakes the reader when a
        // quarter of it is full, and the reader looks at least every 50 ms.
        // A wakeup per sample cost the sampled thread 40 µs a sample here.
        .sample_frequency(frequency)
        // Time in the kernel counts too (the user stack says for whom, the
        // sample's address in which kernel function), where the kernel may
        // be observed.
        .exclude_kernel(!kernel_observable());
    read_kernel_symbols_ahead();
}

/// Starts reading the kernel's function names on a thread of their own, if
/// samples may be taken in the kernel: read ahead of the first sample
/// taken there, which waits for them (a short program's samples are
/// named only after it ended, waiting for what was not read before).
pub fn read_kernel_symbols_ahead() {
    if kernel_observable() {
        static READ_AHEAD: std::sync::Once = std::sync::Once::new();
        // Without a thread, the first sample in the kernel reads them.
        READ_AHEAD.call_once(|| drop(std::thread::Builder::new().spawn(crate::symbols::KernelSymbols::running)));
    }
}

/// A stack sample as the kernel wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStackSample<'a> {
    /// Event id.
    pub id: u64,
    /// Where the CPU was: in the kernel's code when the sample was taken there.
    pub ip: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    /// Instruction pointer, stack pointer, frame pointer (0 when the kernel had no user registers).
    pub regs: [u64; 3],
    /// The copied top of the user stack, starting at the stack pointer.
    pub stack: &'a [u8],
}

/// A record header's `misc` bits saying where the CPU was (`PERF_RECORD_MISC_CPUMODE_MASK`).
pub const MISC_CPUMODE_MASK: u16 = 7;
/// ... in the kernel (`PERF_RECORD_MISC_KERNEL`).
pub const MISC_KERNEL: u16 = 1;

/// Parses a sample of [`open_stack_sampler`]'s layout.
pub fn parse_stack_sample(body: &[u8]) -> Option<RawStackSample<'_>> {
    let id = read_u64(body, 0)?;
    let ip = read_u64(body, 8)?;
    let pid = read_u32(body, 16)?;
    let tid = read_u32(body, 20)?;
    let time = read_u64(body, 24)?;
    let abi = read_u64(body, 32)?;
    let mut at = 40;
    let mut regs = [0u64; 3];
    if abi != 0 {
        let count = UNWIND_REGS.count_ones() as usize;
        // Registers come in bit order: bp, sp, ip.
        let values: Vec<u64> = (0..count).map(|i| read_u64(body, at + 8 * i)).collect::<Option<_>>()?;
        at += 8 * count;
        if let [bp, sp, ip] = values[..] {
            regs = [ip, sp, bp];
        } else if let [sp] = values[..] {
            regs = [0, sp, 0];
        }
    }
    let size = usize::try_from(read_u64(body, at)?).ok()?;
    let stack = if size > 0 {
        let data = body.get(at + 8..at + 8 + size)?;
        let dynamic = usize::try_from(read_u64(body, at + 8 + size)?).ok()?;
        &data[..dynamic.min(size)]
    } else {
        &[]
    };
    Some(RawStackSample { id, ip, pid, tid, time, regs, stack })
}

/// `PERF_RECORD_MMAP2`: pid, start, length, file offset, path.
pub fn parse_mmap2(body: &[u8]) -> Option<(u32, u64, u64, u64, String)> {
    let pid = read_u32(body, 0)?;
    let start = read_u64(body, 8)?;
    let len = read_u64(body, 16)?;
    let pgoff = read_u64(body, 24)?;
    let rest = body.get(64..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some((pid, start, len, pgoff, String::from_utf8_lossy(&rest[..end]).into_owned()))
}

/// Sends the records of `event` to the ring buffer of `buffer` (same CPU).
pub fn set_output(event: &Counter, buffer: &Counter) -> io::Result<()> {
    // SAFETY: both are open perf event fds; the ioctl takes an fd argument.
    let rc = unsafe { perf_event_open_sys::ioctls::SET_OUTPUT(event.as_raw_fd(), buffer.as_raw_fd()) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Enables an event now.
pub fn enable(event: &Counter) -> io::Result<()> {
    // SAFETY: an open perf event fd; ENABLE takes no argument.
    let rc = unsafe { perf_event_open_sys::ioctls::ENABLE(event.as_raw_fd(), 0) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Disables an event now.
pub fn disable(event: &Counter) -> io::Result<()> {
    // SAFETY: an open perf event fd; DISABLE takes no argument.
    let rc = unsafe { perf_event_open_sys::ioctls::DISABLE(event.as_raw_fd(), 0) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Closes what `items` hold (perf events, their rings) each on a thread of
/// its own, and returns once all are closed. The kernel waits for an RCU
/// grace period as an event closes (20 to 90 ms here); closed in parallel,
/// they take about one. Where no thread can be made, an item closes here.
pub fn close_in_parallel(items: Vec<Box<dyn Send>>) {
    std::thread::scope(|scope| {
        for item in items {
            let closer = std::thread::Builder::new().name("proftap-close".into());
            // A thread that cannot be made drops its closure, and the item, here.
            let _ = closer.spawn_scoped(scope, move || drop(item));
        }
    });
}

/// The per-CPU ring buffer every event of that CPU writes into.
pub struct RingBuffer {
    sampler: Sampler,
}

impl RingBuffer {
    /// Maps a ring buffer of `bytes` (rounded up to a power of two) on `owner`.
    pub fn new(owner: Counter, bytes: usize) -> io::Result<Self> {
        Ok(RingBuffer { sampler: owner.sampled(bytes)? })
    }

    /// The event that owns the buffer.
    pub fn owner(&self) -> &Counter {
        self.sampler.as_counter()
    }

    /// Calls `f` with every record in the buffer, oldest first, and frees them.
    pub fn drain(&mut self, mut f: impl FnMut(u32, u16, &[u8])) {
        while let Some(record) = self.sampler.next_record() {
            let (kind, misc) = (record.ty(), record.misc());
            let bytes = record.to_contiguous();
            f(kind, misc, &bytes);
        }
    }
}

/// Record types (`PERF_RECORD_*`) proftap reads.
pub mod record_type {
    /// Lost records.
    pub const LOST: u32 = 2;
    /// Thread name or exec.
    pub const COMM: u32 = 3;
    /// Task exit.
    pub const EXIT: u32 = 4;
    /// Task creation.
    pub const FORK: u32 = 7;
    /// A probe hit.
    pub const SAMPLE: u32 = 9;
    /// Samples dropped for reasons other than a full buffer.
    pub const LOST_SAMPLES: u32 = 13;
    /// An executable mapping, with its file.
    pub const MMAP2: u32 = 10;
    /// A thread came onto a CPU or left it.
    pub const SWITCH: u32 = 14;
}

/// `misc` flag of a SWITCH record for a thread leaving its CPU.
pub const MISC_SWITCH_OUT: u16 = 1 << 13;

/// `misc` flag of a COMM record caused by exec.
pub const MISC_COMM_EXEC: u16 = 1 << 13;

/// A probe hit as the kernel wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSample<'a> {
    /// The id of the event (of its parent, for inherited events).
    pub id: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    /// Group values after the leader's own count, one per counter metric.
    pub counters: &'a [u8],
    /// The tracepoint's record (which probe fired, among the event's probes).
    pub raw: &'a [u8],
    /// The user stack pointer, when the kernel could read user registers.
    pub sp: Option<u64>,
}

impl RawSample<'_> {
    /// Value of counter `i` of the group.
    pub fn counter(&self, i: usize) -> u64 {
        // Each entry is {value, lost}.
        read_u64(self.counters, i * 16).unwrap_or(0)
    }
}

/// Samples the kernel dropped for a probe event (and its inherited copies)
/// because the ring buffer was full, read from the event itself.
pub fn lost_samples(event: &Counter) -> u64 {
    let mut buf = [0u8; 8 + 16 * crate::metrics::MAX_METRICS];
    // SAFETY: reading into a local buffer from an open perf event fd.
    let n = unsafe { libc::read(event.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    // {nr, {value, lost}...}: the leader's lost count is the event's.
    if n >= 24 { read_u64(&buf, 16).unwrap_or(0) } else { 0 }
}

/// Identity fields that `sample_id_all` appends to non-sample records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampleId {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    /// Event id.
    pub id: u64,
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..at + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()))
}

/// Parses the body (after the 8-byte header) of a sample of the layout
/// proftap requests: identifier, pid/tid, time, group read, raw record, user SP.
pub fn parse_sample(body: &[u8]) -> Option<RawSample<'_>> {
    let id = read_u64(body, 0)?;
    let pid = read_u32(body, 8)?;
    let tid = read_u32(body, 12)?;
    let time = read_u64(body, 16)?;
    let nr = usize::try_from(read_u64(body, 24)?).ok()?;
    let values_end = 32usize.checked_add(nr.checked_mul(16)?)?;
    // Entry 0 is the tracepoint's own count; counters follow.
    let counters = body.get(48.min(values_end)..values_end)?;
    let raw_size = read_u32(body, values_end)? as usize;
    let raw = body.get(values_end + 4..values_end + 4 + raw_size)?;
    let regs = values_end + 4 + raw_size;
    let abi = read_u64(body, regs)?;
    let sp = if abi != 0 { read_u64(body, regs + 8) } else { None };
    Some(RawSample { id, pid, tid, time, counters, raw, sp })
}

/// A `u32` field of a raw tracepoint record.
pub fn raw_u32(raw: &[u8], offset: usize) -> Option<u32> {
    read_u32(raw, offset)
}

/// Parses the `sample_id_all` trailer at the end of a non-sample record:
/// pid/tid, time, identifier (24 bytes).
pub fn parse_sample_id(body: &[u8]) -> SampleId {
    let Some(at) = body.len().checked_sub(24) else { return SampleId::default() };
    SampleId {
        pid: read_u32(body, at).unwrap_or(0),
        tid: read_u32(body, at + 4).unwrap_or(0),
        time: read_u64(body, at + 8).unwrap_or(0),
        id: read_u64(body, at + 16).unwrap_or(0),
    }
}

/// `PERF_RECORD_LOST`: (id of the event that noticed, number lost).
pub fn parse_lost(body: &[u8]) -> Option<(u64, u64)> {
    Some((read_u64(body, 0)?, read_u64(body, 8)?))
}

/// `PERF_RECORD_FORK` / `EXIT`: pid, ppid, tid, ptid, time.
pub fn parse_task(body: &[u8]) -> Option<(u32, u32, u32, u32, u64)> {
    Some((read_u32(body, 0)?, read_u32(body, 4)?, read_u32(body, 8)?, read_u32(body, 12)?, read_u64(body, 16)?))
}

/// `PERF_RECORD_COMM`: pid, tid, name.
pub fn parse_comm(body: &[u8]) -> Option<(u32, u32, String)> {
    let pid = read_u32(body, 0)?;
    let tid = read_u32(body, 4)?;
    let rest = body.get(8..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    Some((pid, tid, String::from_utf8_lossy(&rest[..end]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(v: &mut Vec<u8>, x: u64) {
        v.extend_from_slice(&x.to_ne_bytes());
    }

    #[test]
    fn samples_parse_with_group_values_and_sp() {
        let mut body = Vec::new();
        push(&mut body, 77); // identifier
        body.extend_from_slice(&10u32.to_ne_bytes());
        body.extend_from_slice(&11u32.to_ne_bytes());
        push(&mut body, 123_456); // time
        push(&mut body, 3); // nr
        for (value, lost) in [(1, 0), (5000, 0), (2, 0)] {
            // tracepoint count, task-clock, page faults
            push(&mut body, value);
            push(&mut body, lost);
        }
        body.extend_from_slice(&20u32.to_ne_bytes()); // raw size: 20 bytes, padded
        body.extend_from_slice(&[0; 16]);
        body.extend_from_slice(&42u32.to_ne_bytes()); // id at 16
        push(&mut body, 2); // abi
        push(&mut body, 0x7ffd_0000); // sp
        let s = parse_sample(&body).expect("parses");
        assert_eq!((s.id, s.pid, s.tid, s.time), (77, 10, 11, 123_456));
        assert_eq!((s.counter(0), s.counter(1)), (5000, 2));
        assert_eq!(s.sp, Some(0x7ffd_0000));
        assert_eq!(raw_u32(s.raw, 16), Some(42));
        // Truncated: no panic, no sample.
        assert!(parse_sample(&body[..30]).is_none());
    }

    #[test]
    fn a_stack_sample_says_where_the_cpu_was() {
        let mut body = Vec::new();
        push(&mut body, 9); // identifier
        push(&mut body, 0xffff_ffff_8100_1234); // ip: in the kernel
        body.extend_from_slice(&10u32.to_ne_bytes());
        body.extend_from_slice(&11u32.to_ne_bytes());
        push(&mut body, 5_000); // time
        push(&mut body, 2); // abi
        for register in [0x7ffd_0100, 0x7ffd_0000, 0x40_1000] {
            push(&mut body, register); // bp, sp, ip: the user's
        }
        push(&mut body, 16); // stack bytes copied
        body.extend_from_slice(&[7; 16]);
        push(&mut body, 8); // of which valid
        let s = parse_stack_sample(&body).expect("parses");
        assert_eq!((s.id, s.ip, s.pid, s.tid, s.time), (9, 0xffff_ffff_8100_1234, 10, 11, 5_000));
        assert_eq!(s.regs, [0x40_1000, 0x7ffd_0000, 0x7ffd_0100]);
        assert_eq!(s.stack, &[7; 8]);
        for cut in 0..body.len() {
            assert!(parse_stack_sample(&body[..cut]).is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn sample_id_trailer_is_read_from_the_end() {
        let mut body = b"name\0\0\0\0".to_vec();
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&6u32.to_ne_bytes());
        push(&mut body, 99);
        push(&mut body, 1);
        assert_eq!(parse_sample_id(&body), SampleId { pid: 5, tid: 6, time: 99, id: 1 });
        assert_eq!(parse_sample_id(&[0; 4]), SampleId::default());
    }
}

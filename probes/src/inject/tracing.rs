//! Timing calls from patched entries: the runtime (see [`super::runtime`])
//! records each entry and return of the patched functions into per-thread
//! rings shared with proftap, which drains them.

use super::checks::Checks;
use super::hooks::{self, Hook, HookSite};
use super::patch::Site;
use super::patcher::{self, Applied, Refused, Target};
use super::remote::{AWAY_FROM_CODE, Remote, RemoteError, Shared};
use super::runtime::{self, Layout, Runtime, control};
use crate::plan::ProbedFunction;
use crate::procfs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// One entry or return, as the runtime recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The thread.
    pub tid: u32,
    /// Its TSC.
    pub tsc: u64,
    /// The function's index.
    pub function: u32,
    /// What happened.
    pub kind: CallKind,
    /// Where the return address is (at an entry) or was (at a return).
    pub slot: u64,
    /// The return address.
    pub ret: u64,
}

/// What a record tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// A patched function was entered.
    Entry,
    /// It returned.
    Exit,
    /// A handler caught an exception (`function` is the catch id; `slot`
    /// where the handler's call keeps its return address).
    Catch,
}

/// Records of one thread, as the runtime wrote them.
pub struct Batch {
    /// The thread.
    pub tid: u32,
    /// Its records.
    pub bytes: Vec<u8>,
}

/// The calls of a batch.
pub fn parse(batch: &Batch, into: &mut Vec<Call>) {
    let word = |r: &[u8], i: usize| u64::from_ne_bytes(r[8 * i..8 * i + 8].try_into().unwrap_or_default());
    for record in batch.bytes.chunks_exact(runtime::RECORD as usize) {
        let payload = word(record, 1);
        let tid = (payload >> runtime::TID_SHIFT) as u32;
        into.push(Call {
            tid: if tid != 0 { tid } else { batch.tid },
            tsc: word(record, 0),
            function: payload as u32,
            kind: match (payload >> runtime::KIND_SHIFT) as u8 as u32 {
                runtime::ENTRY => CallKind::Entry,
                runtime::EXIT => CallKind::Exit,
                _ => CallKind::Catch,
            },
            slot: word(record, 2),
            ret: word(record, 3),
        });
    }
}

/// Timing calls in a running process.
pub struct Tracing {
    pid: i32,
    shared: Option<Shared>,
    layout: Option<Layout>,
    applied: Vec<Applied>,
    refused: Refused,
    /// Unwinder entries that could not be hooked, and why.
    unhooked: Vec<String>,
    /// Records read so far, per slot.
    tails: Vec<u64>,
    /// proftap's code in the process: the runtime and the trampolines, per module.
    code: Vec<std::ops::Range<u64>>,
    /// The process, held still since it was patched, until the drainer runs
    /// (see [`Tracing::release`]).
    held: Option<Remote>,
    /// What is checked of what the process writes to the shared memory.
    checks: Checks,
    /// Why the shared memory cannot be believed, once it cannot: set once,
    /// read by whoever records (see [`Tracing::corrupted`]).
    corrupted: Arc<OnceLock<String>>,
}

/// Where the C library keeps a thread's id in its thread control block:
/// the offset from the thread pointer that holds each held thread's id
/// (glibc's `struct pthread` puts it at 0x2d0 on x86-64; found, not assumed).
pub fn tcb_tid_offset(remote: &Remote) -> Option<i32> {
    const SEARCHED: usize = 0x800;
    let mut candidates: Option<Vec<usize>> = None;
    for tid in remote.threads() {
        let fs_base = remote.regs(tid).ok()?.fs_base;
        let block = remote.read(fs_base, SEARCHED).ok()?;
        let here: Vec<usize> = (8..SEARCHED).step_by(4).filter(|&o| block[o..o + 4] == (tid as u32).to_ne_bytes()).collect();
        candidates = Some(match candidates {
            None => here,
            Some(before) => before.into_iter().filter(|o| here.contains(o)).collect(),
        });
    }
    let candidates = candidates?;
    let preferred = if candidates.contains(&0x2d0) { Some(0x2d0) } else { candidates.first().copied() };
    preferred.map(|o| o as i32)
}

/// Buffers kept for reuse by the drainer, at most, and the largest kept.
const SPARES: usize = 16;
const SPARE_BYTES: usize = 4 << 20;

/// Records copied out of a ring before its tail moves on.
const DRAIN_PIECE: u64 = 8192;

/// `madvise` advice: zero the page in a forked child.
const MADV_WIPEONFORK: u64 = 18;

impl Tracing {
    /// The functions that cannot be patched, and why, judged from their
    /// files alone (before the program runs).
    pub fn refusals(functions: &[ProbedFunction]) -> Refused {
        let mut modules: Vec<procfs::LoadedModule> = Vec::new();
        for f in functions {
            if !modules.iter().any(|m| m.path.as_os_str() == f.info.module.as_str()) {
                modules.push(procfs::LoadedModule {
                    path: f.info.module.clone().into(),
                    open_path: f.open_path.clone(),
                    bias: crate::addr::LoadBias(0),
                    text: Vec::new(),
                    is_main: modules.is_empty(),
                });
            }
        }
        let targets: Vec<Target> = functions.iter().map(Target::of).collect();
        patcher::plans(&modules, &targets).1
    }

    /// Patches the entries of `functions` in process `pid`, and the entries
    /// of its unwinders (see [`super::hooks`]); those that cannot be patched
    /// are listed by [`Tracing::refused`] and [`Tracing::unhooked`]. A
    /// handler's catch is recorded with function id `catch_id`.
    pub fn attach(pid: i32, functions: &[ProbedFunction], catch_id: u32) -> Result<Tracing, RemoteError> {
        let mut tracing = Tracing::patch(pid, functions, None, catch_id, None)?;
        drop(tracing.take_hold());
        Ok(tracing)
    }

    /// The same for the functions `wanted` picks (by index; all with
    /// `None`), leaving the process held still until the hold is taken
    /// ([`Tracing::take_hold`]) and dropped, once a drainer runs.
    pub fn attach_held(pid: i32, functions: &[ProbedFunction], wanted: Option<&[bool]>, catch_id: u32) -> Result<Tracing, RemoteError> {
        Tracing::patch(pid, functions, wanted, catch_id, None)
    }

    /// The same for a process proftap launched and traces, from its exec
    /// to the moment its libraries are loaded and none of their
    /// constructors has run (see [`Remote::at_start`]); held as well.
    pub fn attach_at_start(pid: i32, functions: &[ProbedFunction], catch_id: u32) -> Result<Tracing, RemoteError> {
        let remote = Remote::at_start(pid)?;
        Tracing::patch(pid, functions, None, catch_id, Some(remote))
    }

    /// Patches with `remote` holding a launched process at its start, or
    /// (`None`) holding the running process once there is something to patch.
    fn patch(
        pid: i32,
        functions: &[ProbedFunction],
        wanted: Option<&[bool]>,
        catch_id: u32,
        at_start: Option<Remote>,
    ) -> Result<Tracing, RemoteError> {
        let modules = procfs::loaded_modules(pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status.lines().any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk")) {
            return Err(RemoteError::Unsupported(format!(
                "process {pid} runs with CET shadow stacks, which forbid returning anywhere but to the caller"
            )));
        }
        // Walkers' returns come after the hooks' entries; they are optional:
        // without them the thread's next call hijacks the frames again.
        let mut hook_sites = hooks::find(&modules);
        let walkers: Vec<HookSite> = hook_sites
            .iter()
            .filter(|h| h.hook == Hook::Walk)
            .map(|h| HookSite { target: Target { site: Site::Return, ..h.target.clone() }, ..h.clone() })
            .collect();
        hook_sites.extend(walkers);
        let mut targets: Vec<Target> = functions.iter().map(Target::of).collect();
        targets.extend(hook_sites.iter().map(|h| h.target.clone()));
        let (mut groups, mut refused) = patcher::plans(&modules, &targets);
        if let Some(wanted) = wanted {
            let keep = |i: usize| i >= functions.len() || wanted.get(i).copied().unwrap_or(false);
            groups.iter_mut().for_each(|g| g.plans.retain(|(i, _)| keep(*i)));
            groups.retain(|g| !g.plans.is_empty());
            refused.retain(|(i, _)| keep(*i));
        }
        let mut tracing = Tracing {
            pid,
            shared: None,
            layout: None,
            applied: Vec::new(),
            refused: Vec::new(),
            unhooked: Vec::new(),
            tails: vec![0; runtime::SLOTS as usize],
            code: Vec::new(),
            held: None,
            checks: Checks::new(pid, functions.len(), catch_id),
            corrupted: Arc::default(),
        };
        if groups.iter().all(|g| g.plans.iter().all(|(i, _)| *i >= functions.len())) {
            tracing.split_refusals(refused, functions.len(), &hook_sites);
            return Ok(tracing);
        }
        let remote = match at_start {
            Some(remote) => remote,
            None => Remote::attach(pid)?,
        };
        for tid in remote.threads() {
            if remote.regs(tid)?.fs_base == 0 {
                return Err(RemoteError::Unsupported(format!(
                    "thread {tid} of process {pid} has no thread-local storage to tell threads apart"
                )));
            }
        }
        let anonymous = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let read_write = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let private =
            remote.syscall("mmap", libc::SYS_mmap, [AWAY_FROM_CODE, runtime::PRIVATE_BYTES, read_write, anonymous, u64::MAX, 0])?;
        let live = remote.syscall("mmap", libc::SYS_mmap, [0, 4096, read_write, anonymous, u64::MAX, 0])?;
        remote.syscall("madvise", libc::SYS_madvise, [live, 4096, MADV_WIPEONFORK, 0, 0, 0])?;
        let shared = remote.share(runtime::SHARED_BYTES as usize, None)?;
        let layout = Layout { private, live, shared: shared.remote, tcb_tid: tcb_tid_offset(&remote) };
        // A copy of the runtime near each module's code (trampolines reach
        // it with rel32 calls); every copy hijacks returns to the first
        // copy's return trampoline, the one address unwinders are kept from.
        let mut return_trampoline = None;
        for group in groups {
            let assembled = std::cell::Cell::new(None::<Runtime>);
            let (applied, code) = patcher::apply(
                &remote,
                group.plans,
                runtime::CODE_ROOM,
                |address| {
                    let rt = runtime::assemble(address, &layout, return_trampoline)?;
                    let code = rt.code.clone();
                    assembled.set(Some(rt));
                    Ok(code)
                },
                |i, site, address| {
                    let rt = assembled.take().ok_or("the runtime is not in place")?;
                    let own = match (hook_sites.get(i.wrapping_sub(functions.len())).map(|h| h.hook), site) {
                        (None, _) => runtime::call_routine(address, rt.entry, i as u32),
                        (Some(Hook::Unhook | Hook::Walk), Site::Entry) => runtime::call_routine(address, rt.unhook, 0),
                        (Some(Hook::Walk), Site::Return) => runtime::call_routine_and_return(address, rt.resume),
                        (Some(Hook::Rehook), _) => runtime::call_routine(address, rt.rehook, catch_id),
                        (Some(Hook::Unhook), Site::Return) => Err("no code for this site".to_string()),
                    };
                    assembled.set(Some(rt));
                    own
                },
                &mut refused,
            )?;
            if let Some(rt) = assembled.take() {
                return_trampoline.get_or_insert(rt.return_trampoline);
            }
            tracing.applied.extend(applied);
            tracing.code.push(code);
        }
        // Recording starts with the threads still held.
        remote.write(live, &1u64.to_ne_bytes())?;
        tracing.shared = Some(shared);
        tracing.layout = Some(layout);
        tracing.split_refusals(refused, functions.len(), &hook_sites);
        tracing.held = Some(remote);
        Ok(tracing)
    }

    /// The hold on the patched process, to let go of (by dropping it, on
    /// the thread that patched) once its records are being drained: a
    /// thread calling a tiny function fills its ring in milliseconds.
    pub fn take_hold(&mut self) -> Option<Remote> {
        self.held.take()
    }

    /// The threads of the process, when it is still held as patched.
    pub fn held_threads(&self) -> Option<Vec<i32>> {
        self.held.as_ref().map(Remote::threads)
    }

    /// The process held still: as patched, or now.
    fn hold(&mut self) -> Result<Remote, RemoteError> {
        match self.held.take() {
            Some(remote) => Ok(remote),
            None => Remote::attach(self.pid),
        }
    }

    /// Refusals of functions stay refusals; those of hook sites say which
    /// unwinder entry could not be hooked.
    fn split_refusals(&mut self, refused: Refused, functions: usize, hook_sites: &[HookSite]) {
        for (i, why) in refused {
            match i.checked_sub(functions).and_then(|h| hook_sites.get(h)) {
                Some(site) if site.target.site == Site::Return => {}
                Some(site) => self.unhooked.push(format!("{} in {} ({why})", site.name, site.target.module.display())),
                None => self.refused.push((i, why)),
            }
        }
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Functions not patched, and why.
    pub fn refused(&self) -> &[(usize, String)] {
        &self.refused
    }

    /// Unwinder entries that could not be hooked, and why: an exception or
    /// `backtrace()` through a patched function's frame is not safe then.
    pub fn unhooked(&self) -> &[String] {
        &self.unhooked
    }

    /// Where proftap's code is in the process (time spent there is the
    /// engine's own).
    pub fn code(&self) -> Vec<std::ops::Range<u64>> {
        self.code.clone()
    }

    /// Whether any function is patched.
    pub fn is_active(&self) -> bool {
        !self.applied.is_empty()
    }

    /// Every record written since the last drain, as raw bytes (see
    /// [`parse`]), thread by thread in the order each thread wrote them.
    /// A record or position that fails [`Checks`] stops all draining.
    pub fn drain_raw(&mut self, into: &mut Vec<Batch>, spare: &mut Vec<Vec<u8>>) {
        let Some(shared) = &self.shared else { return };
        if self.corrupted.get().is_some() {
            return;
        }
        for slot in 0..runtime::SLOTS {
            let at = Layout::control_offset(slot);
            let head = shared.load(at + control::HEAD);
            let tail = self.tails[slot as usize];
            if head == tail {
                continue;
            }
            if let Err(why) = Checks::positions(slot, head, tail) {
                self.corrupt(why);
                return;
            }
            let tid = shared.load(at + control::TID) as u32;
            // A buffer used before: its pages are in place (a fresh one
            // faults on each, which costs as much as the copy).
            let mut bytes = spare.pop().unwrap_or_default();
            bytes.clear();
            bytes.reserve(((head - tail) * runtime::RECORD) as usize);
            // A piece at a time, each handed back to the writer as soon as it
            // is copied: a big copy must not leave the ring full meanwhile.
            let mut n = tail;
            while n < head {
                let run = (head - n).min(runtime::RING - (n & (runtime::RING - 1))).min(DRAIN_PIECE);
                shared.copy_to(Layout::record_offset(slot, n), (run * runtime::RECORD) as usize, &mut bytes);
                n += run;
                shared.store(at + control::TAIL, n);
            }
            self.tails[slot as usize] = head;
            if let Err(why) = self.checks.records(&bytes, tid) {
                self.corrupt(why);
                return;
            }
            into.push(Batch { tid, bytes });
        }
    }

    fn corrupt(&self, why: String) {
        let _ = self.corrupted.set(format!("the target corrupted proftap's buffers ({why}); what it wrote cannot be believed"));
    }

    /// Why the process's records cannot be believed, if it wrote something
    /// no runtime of proftap's writes: the recording must end.
    pub fn corrupted(&self) -> Option<String> {
        self.corrupted.get().cloned()
    }

    /// A counter the process keeps; zero, and the recording corrupted, if it lies.
    fn count(&self, what: &str, value: u64) -> u64 {
        Checks::count(what, value).unwrap_or_else(|why| {
            self.corrupt(why);
            0
        })
    }

    /// Every record written since the last drain, parsed.
    pub fn drain(&mut self, into: &mut Vec<Call>) {
        let mut batches = Vec::new();
        self.drain_raw(&mut batches, &mut Vec::new());
        for batch in &batches {
            parse(batch, into);
        }
    }

    /// Records dropped because a ring was full, by thread (the threads that
    /// dropped some).
    pub fn lost(&self) -> Vec<(u32, u64)> {
        let Some(shared) = &self.shared else { return Vec::new() };
        (0..runtime::SLOTS)
            .map(Layout::control_offset)
            .map(|at| (shared.load(at + control::TID) as u32, self.count("lost records", shared.load(at + control::LOST))))
            .filter(|&(_, lost)| lost > 0)
            .collect()
    }

    /// Puts the original bytes of `functions` back while the process runs
    /// on: their calls in progress still return through the trampoline and
    /// are recorded; new calls are not.
    pub fn unpatch(&mut self, functions: &[usize]) -> Result<(), RemoteError> {
        if !self.applied.iter().any(|a| functions.contains(&a.function)) {
            return Ok(());
        }
        let remote = self.hold()?;
        patcher::restore(&remote, &mut self.applied, |f| functions.contains(&f))
    }

    /// Calls that were not timed: by thread, those deeper than the shadow
    /// stack holds; and those of threads that found no free slot.
    pub fn untimed(&self) -> (Vec<(u32, u64)>, u64) {
        let Some(shared) = &self.shared else { return (Vec::new(), 0) };
        let too_deep = (0..runtime::SLOTS)
            .map(Layout::control_offset)
            .map(|at| (shared.load(at + control::TID) as u32, self.count("calls not timed", shared.load(at + control::UNTIMED))))
            .filter(|&(_, untimed)| untimed > 0)
            .collect();
        (too_deep, self.count("calls of threads without a slot", shared.load(runtime::header::UNSLOTTED)))
    }

    /// Stops recording and puts the original bytes back. The runtime and
    /// trampolines stay mapped: calls in progress still return through them.
    pub fn detach(&mut self) -> Result<(), RemoteError> {
        // A process that is gone has nothing to restore.
        if self.applied.is_empty() || !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            self.applied.clear();
            return Ok(());
        }
        let remote = self.hold()?;
        patcher::restore(&remote, &mut self.applied, |_| true)?;
        if let Some(layout) = &self.layout {
            remote.write(layout.live, &0u64.to_ne_bytes())?;
        }
        Ok(())
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

/// Records drained and waiting for the recording loop, at most (32 bytes
/// each: 64 MiB, and about 150 bytes each once parsed into events at the
/// end). A burst of calls faster than proftap aggregates them (tens of
/// millions a second) waits here instead of overflowing the rings.
const BACKLOG_RECORDS: u64 = 2 << 20;

/// Decides, from the entries counted so far by function, which functions
/// to unpatch now (the overhead governor).
pub type Judge = Box<dyn FnMut(&[u64]) -> Vec<usize> + Send>;

/// Functions unpatched by the judge while the process ran.
#[derive(Debug)]
pub struct Unpatched {
    /// When (CLOCK_MONOTONIC).
    pub time: u64,
    /// The functions, with the calls counted until then.
    pub functions: Vec<(usize, u64)>,
    /// Why their code could not be restored, if it could not.
    pub error: Option<String>,
}

/// Drains a [`Tracing`] on a thread of its own, often enough that the rings
/// do not fill (a thread calling a tiny function writes tens of millions of
/// records a second), whatever the recording loop is busy with. Judging
/// there, as records arrive, takes a hot function's patch out within about
/// a millisecond: before its records fill the rings.
pub struct Drainer {
    stop: Arc<AtomicBool>,
    /// Records drained and not yet taken.
    queued: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Tracing>,
    batches: std::sync::mpsc::Receiver<Vec<Batch>>,
    unpatched: std::sync::mpsc::Receiver<Unpatched>,
    /// Buffers read, back to the drainer for reuse.
    recycle: std::sync::mpsc::Sender<Vec<u8>>,
    corrupted: Arc<OnceLock<String>>,
}

/// Records in `batches`.
fn records(batches: &[Batch]) -> u64 {
    batches.iter().map(|b| b.bytes.len() as u64 / runtime::RECORD).sum()
}

/// Adds the entries among `bytes`' records to `entries`, by function.
fn count_entries(bytes: &[u8], entries: &mut [u64]) {
    for record in bytes.chunks_exact(runtime::RECORD as usize) {
        let payload = u64::from_ne_bytes(record[8..16].try_into().unwrap_or_default());
        // Checked records name patched functions only.
        if (payload >> runtime::KIND_SHIFT) as u8 as u32 == runtime::ENTRY
            && let Some(count) = entries.get_mut(payload as u32 as usize)
        {
            *count += 1;
        }
    }
}

impl Drainer {
    /// Starts draining `tracing`; `judge`, if any, sees the entries counted
    /// after each drain and names the functions to unpatch.
    pub fn spawn(mut tracing: Tracing, mut judge: Option<Judge>) -> Drainer {
        let stop = Arc::new(AtomicBool::new(false));
        // Bounded by BACKLOG_RECORDS: when the recording cannot keep up for
        // longer, records wait in the rings, which drop and count what does
        // not fit, rather than in proftap's memory without end.
        let (send, batches) = std::sync::mpsc::channel::<Vec<Batch>>();
        let (tell, unpatched) = std::sync::mpsc::channel();
        let (recycle, recycled) = std::sync::mpsc::channel::<Vec<u8>>();
        let flag = stop.clone();
        let corrupted = tracing.corrupted.clone();
        let queued = Arc::new(AtomicU64::new(0));
        let waiting = queued.clone();
        let thread = std::thread::spawn(move || {
            // Woken promptly even when the program and the recording loop
            // keep every CPU busy: a ring fills in milliseconds. Only allowed
            // with CAP_SYS_NICE; without, it runs at the default priority.
            // SAFETY: plain system calls on this thread.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10) };
            let mut entries = vec![0u64; tracing.checks.functions()];
            let mut spare = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let mut batch = Vec::new();
                // With the backlog full, the records wait in the rings.
                if waiting.load(Ordering::Relaxed) < BACKLOG_RECORDS {
                    // A few buffers of a moderate size are kept; a burst's
                    // large ones go back to the allocator.
                    spare.extend(recycled.try_iter().filter(|b| b.capacity() <= SPARE_BYTES));
                    spare.truncate(SPARES);
                    tracing.drain_raw(&mut batch, &mut spare);
                    if judge.is_some() {
                        batch.iter().for_each(|b| count_entries(&b.bytes, &mut entries));
                    }
                }
                if let Some(judge) = judge.as_mut() {
                    let over = judge(&entries);
                    if !over.is_empty() {
                        let error = tracing.unpatch(&over).err().map(|e| e.to_string());
                        let functions = over.iter().map(|&f| (f, entries.get(f).copied().unwrap_or(0))).collect();
                        let _ = tell.send(Unpatched { time: super::clock::monotonic_ns(), functions, error });
                    }
                }
                // A ring an eighth full or more is drained again at once.
                let busy = batch.iter().any(|b| b.bytes.len() as u64 >= runtime::RING / 8 * runtime::RECORD);
                if !batch.is_empty() {
                    waiting.fetch_add(records(&batch), Ordering::Relaxed);
                    if send.send(batch).is_err() {
                        break;
                    }
                }
                if !busy {
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
            }
            tracing
        });
        Drainer { stop, queued, thread, batches, unpatched, recycle, corrupted }
    }

    /// See [`Tracing::corrupted`].
    pub fn corrupted(&self) -> Option<String> {
        self.corrupted.get().cloned()
    }

    /// Records drained so far, until `into` holds `max_records` or more: the
    /// rest wait (and, when they fill the backlog, in the rings).
    pub fn take(&self, into: &mut Vec<Call>, max_records: usize) {
        while into.len() < max_records {
            let Ok(batches) = self.batches.try_recv() else { break };
            self.queued.fetch_sub(records(&batches), Ordering::Relaxed);
            for batch in batches {
                parse(&batch, into);
                let _ = self.recycle.send(batch.bytes);
            }
        }
    }

    /// Functions the judge had unpatched since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.unpatched.try_iter().collect()
    }

    /// Stops draining; gives the engine back with what it had not handed on.
    pub fn finish(self, into: &mut Vec<Call>) -> Tracing {
        self.stop.store(true, Ordering::Relaxed);
        let tracing = match self.thread.join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // In the order they were drained: the channel's first.
        for batches in self.batches.try_iter() {
            for batch in &batches {
                parse(batch, into);
            }
        }
        tracing
    }
}

//! Doing things inside a stopped process: system calls made by one of its
//! threads, memory read and written through `/proc/PID/mem`, memory mapped
//! near its code, and memory shared with proftap.

use crate::procfs::{self, Mapping};
use crate::target::{Frozen, TargetError};
use crate::target::{Resume, SignalsBlocked, Traced, resume, wait_traced};
use nix::sys::ptrace;
use nix::unistd::Pid;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

/// Why something could not be done in the target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Stopping or listing the process failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A system call of proftap's failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: io::Error,
    },
    /// A system call made in the target failed.
    #[error("{call} in process {pid} failed: {source}")]
    Call {
        /// The call.
        call: &'static str,
        /// The process.
        pid: i32,
        /// Its errno.
        source: io::Error,
    },
    /// Something the target does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// The process executed another program since it was patched: what
    /// proftap put in it went with the image it replaced.
    #[error("process {pid} executed another program: what proftap patched in it went with the program it ran before")]
    ImageGone {
        /// The process.
        pid: i32,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> RemoteError {
    let what = what.into();
    move |source| RemoteError::Io { what, source }
}

fn errno(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> RemoteError {
    let what = what.into();
    move |e| RemoteError::Io { what, source: e.into() }
}

/// A process with every thread stopped, in which proftap makes system calls
/// and reads and writes memory. The threads run on when it is dropped.
pub struct Remote {
    pid: i32,
    frozen: Frozen,
    /// The thread that makes the system calls.
    caller: Pid,
    /// A `syscall` instruction in the vDSO: system calls are made there, so
    /// no code of the target is touched. Found at the first system call.
    syscall_site: std::sync::OnceLock<u64>,
    mem: File,
    /// Its mappings, read the first time they are asked (held, as all
    /// this is). Most holds (the governor's) ask only what one address
    /// maps, which the kernel answers alone where it can: reading them
    /// all takes as long as the rest of such a hold.
    maps: std::sync::OnceLock<Vec<Mapping>>,
    /// Held at its start, before its own code ran (launched by proftap).
    at_start: bool,
}

/// Instructions a thread returned from a signal handler is stepped at
/// most (see [`Remote::run_to_signal_return`]).
const STEPS_AFTER_SIGNAL_RETURN: usize = 20_000;

/// Arguments of `mmap`.
const PROT_READ: u64 = libc::PROT_READ as u64;
const PROT_WRITE: u64 = libc::PROT_WRITE as u64;
const PROT_EXEC: u64 = libc::PROT_EXEC as u64;

impl Remote {
    /// Stops every thread of `pid` (refusing a process another tracer holds).
    pub fn attach(pid: i32) -> Result<Remote, RemoteError> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(io_error(format!("cannot read /proc/{pid}/status")))?;
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).map_or(0, |v| v.trim().parse::<i32>().unwrap_or(0));
        // One of proftap's own threads holding it: the hold below waits for its turn.
        let ours = std::path::Path::new(&format!("/proc/self/task/{tracer}")).exists();
        if tracer != 0 && !ours {
            return Err(RemoteError::Unsupported(format!(
                "process {pid} is traced by {}, and a process has one tracer at a time: detach that tracer (or stop that proftap) first",
                crate::target::tracer_named(tracer)
            )));
        }
        let frozen = Frozen::freeze(pid)?;
        // The memory opened first, the mappings read after it when asked:
        // an exec that a thread not yet stopped finishes in between shows
        // in the mappings, and one after it leaves the memory written the
        // image replaced.
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(io_error(format!("cannot open the memory of process {pid}")))?;
        let caller = frozen
            .threads()
            .first()
            .copied()
            .map(Pid::from_raw)
            .ok_or_else(|| RemoteError::Unsupported(format!("process {pid} has no thread left")))?;
        Ok(Remote { pid, frozen, caller, syscall_site: Default::default(), mem, maps: Default::default(), at_start: false })
    }

    /// A process proftap launched and traces (`PTRACE_O_TRACEEXEC`), held
    /// before any constructor runs: where the dynamic loader tells debuggers
    /// that the libraries are loaded and relocated (`_dl_debug_state` with
    /// `r_debug.r_state == RT_CONSISTENT`; thread-local storage is set up by
    /// then), or for a program without a loader, where its C library calls
    /// `_init` (see [`static_init`]), else at its entry point. The
    /// process runs on, untraced, when the value is dropped.
    pub fn at_start(pid: i32) -> Result<Remote, RemoteError> {
        let tid = Pid::from_raw(pid);
        loop {
            match wait_traced(tid) {
                Ok(Traced::Event(libc::PTRACE_EVENT_EXEC)) => break,
                // A signal before the exec: delivered, and wait on.
                Ok(Traced::Signal(signal)) => resume(tid, Resume::Continue, signal).map_err(errno("cannot let the program go on"))?,
                Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) => {
                    return Err(RemoteError::Unsupported(format!("process {pid} ended before it executed its program")));
                }
                Ok(_) => continue,
                Err(e) => return Err(errno("cannot wait for the program to start")(e)),
            }
        }
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(io_error(format!("cannot open the memory of process {pid}")))?;
        match loader_notice(pid)? {
            Some(notice) => loop {
                let regs = run_to(pid, &mem, notice.function)?;
                let mut state = [0u8; 4];
                mem.read_exact_at(&mut state, notice.r_debug + R_STATE)
                    .map_err(io_error(format!("cannot read the loader's state in process {pid}")))?;
                if u32::from_ne_bytes(state) == RT_CONSISTENT && regs.fs_base != 0 {
                    break;
                }
                // Not yet (libraries being added): past this call, and on.
                ptrace::step(tid, None).map_err(errno("cannot step the loader"))?;
                match wait_traced(tid) {
                    Ok(Traced::Signal(libc::SIGTRAP)) => {}
                    other => return Err(RemoteError::Unsupported(format!("process {pid} did not step in its loader: {other:?}"))),
                }
            },
            None => {
                let entry = auxv_entry(pid, libc::AT_ENTRY)?
                    .ok_or_else(|| RemoteError::Unsupported(format!("process {pid} has no entry point in its auxiliary vector")))?;
                run_to(pid, &mem, static_init(pid, entry).unwrap_or(entry))?;
            }
        }
        let threads = crate::target::threads(pid).map_err(io_error(format!("cannot list the threads of process {pid}")))?;
        let remote_threads = threads.len();
        let remote = Remote {
            pid,
            frozen: Frozen::adopt(pid, vec![pid]),
            caller: tid,
            syscall_site: Default::default(),
            mem,
            maps: Default::default(),
            at_start: true,
        };
        if remote_threads > 1 {
            return Err(RemoteError::Unsupported(format!("process {pid} started threads before its libraries were initialized")));
        }
        Ok(remote)
    }

    /// Whether it was held at its start, before its own code ran.
    pub fn held_at_start(&self) -> bool {
        self.at_start
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its stopped threads.
    pub fn threads(&self) -> Vec<i32> {
        self.frozen.threads()
    }

    /// The registers of stopped thread `tid`.
    pub fn regs(&self, tid: i32) -> Result<libc::user_regs_struct, RemoteError> {
        ptrace::getregs(Pid::from_raw(tid)).map_err(errno(format!("cannot read the registers of thread {tid}")))
    }

    /// Sets the registers of stopped thread `tid`.
    pub fn set_regs(&self, tid: i32, regs: libc::user_regs_struct) -> Result<(), RemoteError> {
        ptrace::setregs(Pid::from_raw(tid), regs).map_err(errno(format!("cannot set the registers of thread {tid}")))
    }

    /// Lets stopped thread `tid` run on alone, the other threads held,
    /// until it returns from a signal handler (`rt_sigreturn`), at most
    /// `most`; then steps it while `keep` holds for where it returned, as
    /// `step_while` does: a signal pending as the handler returns waits for
    /// the release, so it does not interrupt the same place again. Signals
    /// that arrive before are delivered as they come. Returns where the
    /// thread returned to and was stepped to, or `None` when it did not
    /// return in time (it is held again).
    pub fn run_to_signal_return(
        &self,
        tid: i32,
        keep: impl Fn(u64) -> bool,
        most: std::time::Duration,
    ) -> Result<Option<u64>, RemoteError> {
        let thread = Pid::from_raw(tid);
        let cannot = |what: &str| errno(format!("cannot {what} thread {tid}"));
        let traced = ptrace::Options::PTRACE_O_TRACECLONE;
        ptrace::setoptions(thread, traced | ptrace::Options::PTRACE_O_TRACESYSGOOD).map_err(cannot("trace the system calls of"))?;
        let started = std::time::Instant::now();
        // The kernel restores the interrupted context's registers, its
        // system call number too: the stop after rt_sigreturn is known as
        // the one after the stop before it.
        let mut returning = false;
        let mut signal = 0;
        let returned = loop {
            // Over the limit, the thread is held at its last stop, a signal
            // it stopped for kept for the release.
            if started.elapsed() >= most {
                if signal != 0 {
                    self.frozen.defer(thread, signal);
                }
                break None;
            }
            resume(thread, Resume::ToSystemCall, std::mem::take(&mut signal)).map_err(cannot("run"))?;
            match self.wait_until(thread, started + most)? {
                Traced::SystemCall => {
                    let regs = self.regs(tid)?;
                    if returning {
                        break Some(regs.rip);
                    }
                    let entering = regs.rax == -(libc::ENOSYS as i64) as u64;
                    returning = entering && regs.orig_rax == libc::SYS_rt_sigreturn as u64;
                }
                Traced::Signal(arrived) => signal = arrived,
                // A thread the handler made runs free: it starts elsewhere.
                Traced::Event(libc::PTRACE_EVENT_CLONE) => {
                    if let Ok(new) = ptrace::getevent(thread) {
                        let new = Pid::from_raw(new as i32);
                        let _ = wait_traced(new);
                        let _ = ptrace::detach(new, None);
                    }
                }
                Traced::Exited(_) | Traced::Killed(_) => {
                    return Err(RemoteError::Unsupported(format!("thread {tid} ended while it ran alone")));
                }
                _ => {}
            }
        };
        ptrace::setoptions(thread, traced).map_err(cannot("stop tracing the system calls of"))?;
        match returned {
            Some(rip) if keep(rip) => self.step_while(tid, keep, STEPS_AFTER_SIGNAL_RETURN).map(Some),
            other => Ok(other),
        }
    }

    /// Waits for the next stop of traced `thread`, running; past `deadline`
    /// it is stopped.
    fn wait_until(&self, thread: Pid, deadline: std::time::Instant) -> Result<Traced, RemoteError> {
        let cannot = |what: &str| errno(format!("cannot {what} thread {thread}"));
        let mut interrupted = false;
        loop {
            match crate::target::poll_traced(thread).map_err(cannot("wait for"))? {
                Traced::Running if !interrupted && std::time::Instant::now() >= deadline => {
                    ptrace::interrupt(thread).map_err(cannot("stop"))?;
                    interrupted = true;
                }
                Traced::Running => std::thread::sleep(std::time::Duration::from_micros(50)),
                status => return Ok(status),
            }
        }
    }

    /// Runs stopped thread `tid` an instruction at a time while `keep`
    /// holds for its next instruction's address, at most `most` times;
    /// returns where it stops. A system call instruction is not stepped
    /// over (it could block); signals that arrive meanwhile are delivered
    /// when the threads are released.
    pub fn step_while(&self, tid: i32, keep: impl Fn(u64) -> bool, most: usize) -> Result<u64, RemoteError> {
        let thread = Pid::from_raw(tid);
        let _blocked = SignalsBlocked::new(thread);
        for _ in 0..most {
            let rip = self.regs(tid)?.rip;
            let system_call = |b: &[u8]| b == [0x0f, 0x05] || b == [0x0f, 0x34] || b == [0xcd, 0x80];
            if !keep(rip) || self.read(rip, 2).is_ok_and(|b| system_call(&b)) {
                return Ok(rip);
            }
            ptrace::step(thread, None).map_err(errno(format!("cannot step thread {tid}")))?;
            loop {
                match wait_traced(thread) {
                    Ok(Traced::Signal(libc::SIGTRAP)) => break,
                    Ok(Traced::Signal(signal)) => {
                        self.frozen.defer(thread, signal);
                        if is_fault(signal) {
                            return Err(RemoteError::Unsupported(format!("thread {tid} faulted (signal {signal}) while it was stepped")));
                        }
                        ptrace::step(thread, None).map_err(errno(format!("cannot step thread {tid}")))?;
                    }
                    Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) => {
                        return Err(RemoteError::Unsupported(format!("thread {tid} ended while it was stepped")));
                    }
                    // A stop of ptrace's own (the hold's interrupt, still
                    // pending when a signal stopped the thread first): the
                    // thread waits to be resumed, and the step goes on.
                    Ok(Traced::Event(_)) => {
                        ptrace::step(thread, None).map_err(errno(format!("cannot step thread {tid}")))?;
                    }
                    Ok(_) => continue,
                    Err(e) => return Err(errno(format!("cannot wait for thread {tid}"))(e)),
                }
            }
        }
        Ok(self.regs(tid)?.rip)
    }

    fn syscall_site(&self) -> Result<u64, RemoteError> {
        if let Some(&site) = self.syscall_site.get() {
            return Ok(site);
        }
        let site = self.find_syscall_site()?;
        Ok(*self.syscall_site.get_or_init(|| site))
    }

    fn find_syscall_site(&self) -> Result<u64, RemoteError> {
        let vdso = self
            .maps()?
            .iter()
            .find(|m| m.path.as_deref() == Some("[vdso]"))
            .ok_or_else(|| RemoteError::Unsupported(format!("process {} has no vDSO", self.pid)))?;
        let bytes = self.read(vdso.start.0, (vdso.end.0 - vdso.start.0) as usize)?;
        // Jumped to directly, the bytes 0f 05 are a syscall wherever they sit.
        let offset = bytes
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .ok_or_else(|| RemoteError::Unsupported(format!("the vDSO of process {} has no syscall instruction", self.pid)))?;
        Ok(vdso.start.0 + offset as u64)
    }

    /// The file mapped at `address` when the process was held (device
    /// and inode 0: anonymous memory), if anything was.
    pub fn file_mapped_at(&self, address: u64) -> Result<Option<FileId>, RemoteError> {
        Ok(self.mapping_at(address)?.map(|m| FileId { device: m.device, inode: m.inode }))
    }

    /// The mapping `address` is in, if any (without its path where the
    /// kernel answers for one address alone): asked of the kernel until
    /// the whole list is read, then from that.
    pub fn mapping_at(&self, address: u64) -> Result<Option<Mapping>, RemoteError> {
        if self.maps.get().is_none()
            && let Ok(found) = procfs::mapping_at(self.pid, address)
        {
            return Ok(found);
        }
        Ok(self.mapping_containing(address)?.cloned())
    }

    /// The mapping `address` is in, if any.
    fn mapping_containing(&self, address: u64) -> Result<Option<&Mapping>, RemoteError> {
        Ok(self.maps()?.iter().find(|m| (m.start.0..m.end.0).contains(&address)))
    }

    /// Its mappings (see [`Remote::maps`]'s field).
    fn maps(&self) -> Result<&[Mapping], RemoteError> {
        if let Some(maps) = self.maps.get() {
            return Ok(maps);
        }
        let maps = procfs::read_maps(self.pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        Ok(self.maps.get_or_init(|| maps))
    }

    /// Up to `most` bytes from `address` to the end of the mapping it is
    /// in (as the process was held); empty where there is none.
    pub fn read_within_mapping(&self, address: u64, most: usize) -> Result<Vec<u8>, RemoteError> {
        let Some(mapping) = self.mapping_containing(address)? else { return Ok(Vec::new()) };
        let len = (mapping.end.0 - address).min(most as u64) as usize;
        self.read(address, len)
    }

    /// Reads `len` bytes at `address`.
    pub fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, RemoteError> {
        let mut bytes = vec![0u8; len];
        self.mem
            .read_exact_at(&mut bytes, address)
            .map_err(io_error(format!("cannot read {len} bytes at {address:#x} in process {}", self.pid)))?;
        Ok(bytes)
    }

    /// Writes `bytes` at `address`, code included (the kernel writes through
    /// read-only pages for a tracer).
    pub fn write(&self, address: u64, bytes: &[u8]) -> Result<(), RemoteError> {
        self.mem.write_all_at(bytes, address).map_err(io_error(format!(
            "cannot write {} bytes at {address:#x} in process {}",
            bytes.len(),
            self.pid
        )))
    }

    /// Reads many small pieces (`(address, len)`), a run of nearby pieces
    /// with one system call: what each piece holds, or why it could not be
    /// read (then read alone).
    pub fn read_pieces(&self, pieces: &[(u64, usize)]) -> Vec<Result<Vec<u8>, RemoteError>> {
        let mut read: Vec<Option<Result<Vec<u8>, RemoteError>>> = (0..pieces.len()).map(|_| None).collect();
        for run in nearby_runs(pieces) {
            let (start, end) = run_span(pieces, &run);
            if let Ok(bytes) = self.read(start, (end - start) as usize) {
                for &i in &run {
                    let (at, len) = pieces[i];
                    let from = (at - start) as usize;
                    read[i] = Some(Ok(bytes[from..from + len].to_vec()));
                }
            }
        }
        read.into_iter().zip(pieces).map(|(r, &(at, len))| r.unwrap_or_else(|| self.read(at, len))).collect()
    }

    /// Writes many small pieces of code (`(address, bytes)`), each alone:
    /// never the bytes between them, which the kernel may change even in a
    /// held process (a uprobe of another tool's, placed or removed, writes
    /// its breakpoint into every process mapping the file).
    /// A large program's pieces (tens of thousands of edge counters' jumps,
    /// a system call each) are written by two threads, half each; both stop
    /// at the first piece that cannot be written.
    pub fn write_pieces(&self, pieces: &[(u64, &[u8])]) -> Result<(), RemoteError> {
        const MANY: usize = 2048;
        let failed = std::sync::atomic::AtomicBool::new(false);
        let write = |pieces: &[(u64, &[u8])]| -> Result<(), RemoteError> {
            for (at, bytes) in pieces {
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                self.write(*at, bytes).inspect_err(|_| failed.store(true, std::sync::atomic::Ordering::Relaxed))?;
            }
            Ok(())
        };
        if pieces.len() < MANY {
            return write(pieces);
        }
        let (first, second) = pieces.split_at(pieces.len() / 2);
        let (first, second) = super::patcher::both(|| write(first), || write(second));
        first.and(second)
    }

    /// Makes system call `nr` with `args` in the target; returns its result
    /// or the error it gave. The calling thread's registers are restored
    /// after, so a system call it was blocked in restarts as it would have.
    pub fn syscall(&self, call: &'static str, nr: i64, args: [u64; 6]) -> Result<u64, RemoteError> {
        let saved = ptrace::getregs(self.caller).map_err(errno("cannot read the registers of the target"))?;
        let mut regs = saved;
        regs.rip = self.syscall_site()?;
        regs.rax = nr as u64;
        // Not a restart of whatever system call the thread was in.
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        ptrace::setregs(self.caller, regs).map_err(errno("cannot set the registers of the target"))?;
        let result = self.step_over_syscall();
        let after = ptrace::getregs(self.caller);
        ptrace::setregs(self.caller, saved).map_err(errno("cannot restore the registers of the target"))?;
        result?;
        let value = after.map_err(errno("cannot read the result of a system call in the target"))?.rax;
        if (value as i64) < 0 && (value as i64) > -4096 {
            return Err(RemoteError::Call { call, pid: self.pid, source: io::Error::from_raw_os_error(-(value as i64) as i32) });
        }
        Ok(value)
    }

    fn step_over_syscall(&self) -> Result<(), RemoteError> {
        let _blocked = SignalsBlocked::new(self.caller);
        ptrace::step(self.caller, None).map_err(errno("cannot run a system call in the target"))?;
        loop {
            match wait_traced(self.caller) {
                Ok(Traced::Signal(libc::SIGTRAP)) => return Ok(()),
                // Another signal arrived first: delivered when the threads are released; the step goes on.
                Ok(Traced::Signal(signal)) => {
                    self.frozen.defer(self.caller, signal);
                    if is_fault(signal) {
                        return Err(RemoteError::Unsupported(format!("process {} faulted (signal {signal}) in a system call", self.pid)));
                    }
                    ptrace::step(self.caller, None).map_err(errno("cannot run a system call in the target"))?;
                }
                Ok(Traced::Event(_)) => {
                    ptrace::step(self.caller, None).map_err(errno("cannot run a system call in the target"))?;
                }
                Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) => {
                    return Err(RemoteError::Unsupported(format!("process {} ended during a system call", self.pid)));
                }
                Ok(_) => continue,
                Err(e) => return Err(errno("cannot wait for the target")(e)),
            }
        }
    }

    /// Maps `len` bytes of fresh memory for code within ±2 GiB of all of
    /// `near` (so a 5-byte jump reaches it from there): readable and
    /// executable, never writable in the process, which may refuse itself
    /// memory that becomes executable (`PR_SET_MDWE`, a seccomp filter);
    /// proftap writes it through the process's memory file, as it writes
    /// the program's own code.
    pub fn map_code_near(&self, near: std::ops::Range<u64>, len: usize) -> Result<u64, RemoteError> {
        let len = len.next_multiple_of(4096) as u64;
        for hint in self.candidates(near.clone(), len)? {
            let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
            match self.syscall("mmap", libc::SYS_mmap, [hint, len, PROT_READ | PROT_EXEC, flags, u64::MAX, 0]) {
                Ok(address) if address == hint => return Ok(address),
                Ok(address) => {
                    let _ = self.syscall("munmap", libc::SYS_munmap, [address, len, 0, 0, 0, 0]);
                }
                // Taken meanwhile, or too little room there: the next place.
                Err(RemoteError::Call { source, .. }) if matches!(source.raw_os_error(), Some(libc::EEXIST | libc::ENOMEM)) => continue,
                // Refused wherever it goes (executable memory refused, by
                // SELinux without `execmem` or a seccomp filter): said as such.
                Err(e) => return Err(e),
            }
        }
        Err(RemoteError::Unsupported(format!("process {} has no free {len} bytes within 2 GiB of {:#x}", self.pid, near.start)))
    }

    /// Free places for `len` bytes within ±2 GiB of all of `near`.
    fn candidates(&self, near: std::ops::Range<u64>, len: u64) -> Result<Vec<u64>, RemoteError> {
        let maps = procfs::read_maps(self.pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        let min_addr = crate::procfs::sysctl_number("vm/mmap_min_addr").unwrap_or(65536);
        let (lowest, highest) = within_reach(&near, min_addr);
        Ok(gaps(&maps, lowest, highest, len))
    }

    /// Memory shared by the target and proftap: `len` bytes of a memfd the
    /// target creates and maps, which proftap maps too; in the target within
    /// ±2 GiB of `near` when given.
    pub fn share(&self, len: usize, near: Option<std::ops::Range<u64>>) -> Result<Shared, RemoteError> {
        let len = len.next_multiple_of(4096);
        let name = b"proftap\0";
        // The name goes on the caller's stack, below the red zone.
        let regs = ptrace::getregs(self.caller).map_err(errno("cannot read the registers of the target"))?;
        let scratch = (regs.rsp - 256 - 64) & !15;
        let saved = self.read(scratch, name.len())?;
        self.write(scratch, name)?;
        // Never executable, said so: Linux 6.3 to 6.5 under
        // vm.memfd_noexec=2 refuse a memfd that does not say (before 6.3
        // the flag is unknown; a filter may refuse it).
        let memfd_create = |flags: u32| self.syscall("memfd_create", libc::SYS_memfd_create, [scratch, flags as u64, 0, 0, 0, 0]);
        let fd = memfd_create(libc::MFD_CLOEXEC | libc::MFD_NOEXEC_SEAL).or_else(|_| memfd_create(libc::MFD_CLOEXEC));
        self.write(scratch, &saved)?;
        let fd = fd?;
        let close = || {
            let _ = self.syscall("close", libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
        };
        let mapped = self.syscall("ftruncate", libc::SYS_ftruncate, [fd, len as u64, 0, 0, 0, 0]).and_then(|_| match &near {
            // Past the runtime's private memory, which goes at AWAY_FROM_CODE.
            None => self.syscall(
                "mmap",
                libc::SYS_mmap,
                [AWAY_FROM_CODE + (1 << 40), len as u64, PROT_READ | PROT_WRITE, libc::MAP_SHARED as u64, fd, 0],
            ),
            Some(near) => {
                let flags = (libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE) as u64;
                self.candidates(near.clone(), len as u64)?
                    .into_iter()
                    .find_map(|hint| {
                        self.syscall("mmap", libc::SYS_mmap, [hint, len as u64, PROT_READ | PROT_WRITE, flags, fd, 0])
                            .ok()
                            .filter(|&a| a == hint)
                    })
                    .ok_or_else(|| {
                        RemoteError::Unsupported(format!("process {} has no free {len} bytes within 2 GiB of {:#x}", self.pid, near.start))
                    })
            }
        });
        let remote_address = match mapped {
            Ok(address) => address,
            Err(e) => {
                close();
                return Err(e);
            }
        };
        // proftap's own descriptor of the same memfd.
        let local = crate::target::pidfd(self.pid).and_then(|pidfd| {
            // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that process and flags.
            let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as i32, 0) };
            if got < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the kernel just gave us this descriptor.
            Ok(unsafe { OwnedFd::from_raw_fd(got as i32) })
        });
        close();
        let shared = local
            .map_err(io_error(format!("cannot share memory with process {}", self.pid)))
            .and_then(|local| Shared::map(local, len, remote_address).map_err(io_error("cannot map the memory shared with the target")));
        if shared.is_err() {
            let _ = self.syscall("munmap", libc::SYS_munmap, [remote_address, len as u64, 0, 0, 0, 0]);
        }
        shared
    }
}

impl Remote {
    /// Scratch memory on the calling thread's stack, below its red zone:
    /// `len` bytes, handed to `use_it` and restored after.
    fn with_scratch<T>(&self, len: usize, use_it: impl FnOnce(u64) -> Result<T, RemoteError>) -> Result<T, RemoteError> {
        let regs = ptrace::getregs(self.caller).map_err(errno("cannot read the registers of the target"))?;
        let scratch = (regs.rsp - 256 - len as u64) & !15;
        let saved = self.read(scratch, len)?;
        let result = use_it(scratch);
        self.write(scratch, &saved)?;
        result
    }

    /// Gives the process a copy of `fd`, one of proftap's descriptors,
    /// closed at an exec: its number there, `at_least` or above where the
    /// process's limit allows, out of the way of the numbers programs
    /// choose themselves (a shell's 10 and up, bash's 255). The descriptor
    /// goes over a socket pair made in the process.
    pub fn lend_descriptor(&self, fd: std::os::fd::BorrowedFd<'_>, at_least: u64) -> Result<u64, RemoteError> {
        let close = |fd: u64| {
            let _ = self.syscall("close", libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
        };
        let pair = self.with_scratch(8, |scratch| {
            let flags = (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64;
            self.syscall("socketpair", libc::SYS_socketpair, [libc::AF_UNIX as u64, flags, 0, scratch, 0, 0])?;
            let fds = self.read(scratch, 8)?;
            Ok([u32::from_ne_bytes(fds[..4].try_into().unwrap_or_default()), u32::from_ne_bytes(fds[4..].try_into().unwrap_or_default())])
        })?;
        let received = self.send_descriptor(fd, pair);
        close(u64::from(pair[0]));
        close(u64::from(pair[1]));
        let received = received?;
        let moved = self.syscall("fcntl", libc::SYS_fcntl, [received, libc::F_DUPFD_CLOEXEC as u64, at_least, 0, 0, 0]);
        match moved {
            Ok(moved) => {
                close(received);
                Ok(moved)
            }
            // The process may have fewer descriptors than that.
            Err(_) => Ok(received),
        }
    }

    /// Sends `fd` into the process's end `pair[1]` of a socket pair and
    /// receives it from `pair[0]` there: its number in the process.
    fn send_descriptor(&self, fd: std::os::fd::BorrowedFd<'_>, pair: [u32; 2]) -> Result<u64, RemoteError> {
        let pidfd = crate::target::pidfd(self.pid).map_err(io_error("cannot open a pidfd of the target"))?;
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that process and flags.
        let local = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), pair[1] as i32, 0) };
        if local < 0 {
            return Err(io_error("cannot take a socket of the target")(io::Error::last_os_error()));
        }
        // SAFETY: the kernel just gave us this descriptor.
        let local = unsafe { OwnedFd::from_raw_fd(local as i32) };
        let raw = [fd.as_raw_fd()];
        let rights = [nix::sys::socket::ControlMessage::ScmRights(&raw)];
        nix::sys::socket::sendmsg::<()>(local.as_raw_fd(), &[io::IoSlice::new(b"p")], &rights, nix::sys::socket::MsgFlags::empty(), None)
            .map_err(errno("cannot send a descriptor to the target"))?;
        // struct msghdr, then its iovec, one byte of data, and room for one descriptor.
        self.with_scratch(128, |scratch| {
            let (iov, data, control) = (scratch + 64, scratch + 80, scratch + 96);
            let words = |w: &[u64]| w.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>();
            self.write(scratch, &words(&[0, 0, iov, 1, control, 24, 0]))?;
            self.write(iov, &words(&[data, 1]))?;
            self.write(control, &[0; 24])?;
            let flags = libc::MSG_CMSG_CLOEXEC as u64;
            self.syscall("recvmsg", libc::SYS_recvmsg, [u64::from(pair[0]), scratch, flags, 0, 0, 0])?;
            let cmsg = self.read(control, 24)?;
            let level = i32::from_ne_bytes(cmsg[8..12].try_into().unwrap_or_default());
            let kind = i32::from_ne_bytes(cmsg[12..16].try_into().unwrap_or_default());
            if level != libc::SOL_SOCKET || kind != libc::SCM_RIGHTS {
                return Err(RemoteError::Unsupported(format!("process {} did not receive the descriptor", self.pid)));
            }
            Ok(u64::from(u32::from_ne_bytes(cmsg[16..20].try_into().unwrap_or_default())))
        })
    }
}

/// Where proftap's large mappings in a target go, if that is free: far
/// from code (executables sit near 0x5555_0000_0000, libraries below
/// 0x7fff_0000_0000), so the room within 2 GiB of code stays for trampolines.
pub const AWAY_FROM_CODE: u64 = 0x2000_0000_0000;

/// The value of `key` in the auxiliary vector of process `pid`.
fn auxv_entry(pid: i32, key: u64) -> Result<Option<u64>, RemoteError> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).map_err(io_error(format!("cannot read /proc/{pid}/auxv")))?;
    Ok(auxv
        .chunks_exact(16)
        .map(|pair| {
            (u64::from_ne_bytes(pair[..8].try_into().unwrap_or_default()), u64::from_ne_bytes(pair[8..].try_into().unwrap_or_default()))
        })
        .find(|&(k, _)| k == key)
        .map(|(_, value)| value))
}

/// Offset of `r_state` in glibc's `struct r_debug` (after `r_version`, `r_map`, `r_brk`).
const R_STATE: u64 = 24;
/// `r_state` once the loaded objects are consistent (`RT_CONSISTENT`).
const RT_CONSISTENT: u32 = 0;

/// Where the dynamic loader tells debuggers about loaded objects.
struct LoaderNotice {
    /// `_dl_debug_state`, called at each change.
    function: u64,
    /// `_r_debug`, which says the state.
    r_debug: u64,
}

/// The loader's notice function and state in process `pid`, which has just
/// executed its program; `None` for a program without a loader (static).
fn loader_notice(pid: i32) -> Result<Option<LoaderNotice>, RemoteError> {
    let Some(base) = auxv_entry(pid, libc::AT_BASE)?.filter(|&b| b != 0) else { return Ok(None) };
    let maps = procfs::read_maps(pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
    let Some(path) = maps.iter().find(|m| m.start.0 == base).and_then(|m| m.path.clone()) else { return Ok(None) };
    let Ok(image) = crate::symbols::ElfImage::open(std::path::Path::new(&path)) else { return Ok(None) };
    let Ok(elf) = image.parse() else { return Ok(None) };
    use object::{Object, ObjectSymbol};
    let lowest = elf.segments().map(|s| object::ObjectSegment::address(&s)).min().unwrap_or(0) & !0xfff;
    let find = |name: &str| elf.dynamic_symbols().find(|s| s.name() == Ok(name)).map(|s| base + s.address() - lowest);
    Ok(match (find("_dl_debug_state"), find("_r_debug")) {
        (Some(function), Some(r_debug)) => Some(LoaderNotice { function, r_debug }),
        _ => None,
    })
}

/// Where process `pid`, a program without a loader whose entry point is at
/// `entry`, has set up its thread-local storage and none of its
/// constructors has run: `_init`, which its C library (glibc's or musl's)
/// calls then. `None` when its file names no `_init`.
fn static_init(pid: i32, entry: u64) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let image = crate::symbols::ElfImage::open(std::path::Path::new(&format!("/proc/{pid}/exe"))).ok()?;
    let elf = image.parse().ok()?;
    let init = elf.symbols().find(|s| s.name() == Ok("_init") && s.is_definition())?;
    // A static position-independent program runs where the kernel put it.
    Some(entry.wrapping_sub(elf.entry()).wrapping_add(init.address()))
}

/// Offset of the debug registers `u_debugreg[8]` in the kernel's `struct
/// user` on x86-64.
const DEBUG_REGISTERS: u64 = 848;

/// Lets traced process `pid` run to `address` and returns its registers
/// there, its instruction pointer on `address`. Its own signals on the way
/// are delivered. A breakpoint is written there and taken out again,
/// unless one is there already: a kernel uprobe on that instruction (a
/// function proftap probes that way) would take ours for its own. Then a
/// debug register stops it, which leaves the code as it is; but the
/// kernel keeps the debug register's event in the program until its next
/// exec, a pinned one, and at each switch onto a CPU of a task holding a
/// pinned event it takes the CPU's unpinned events (a sampler) off and
/// puts them back. Where debug registers cannot be set, the breakpoint is
/// written all the same (under a uprobe, its trap is the uprobe's). The
/// page written is the process's own copy from then on: its mapping's
/// page entries (ld.so's code, 40-odd pages) are copied at each fork.
fn run_to(pid: i32, mem: &File, address: u64) -> Result<libc::user_regs_struct, RemoteError> {
    let mut there = [0u8; 1];
    mem.read_exact_at(&mut there, address).map_err(io_error(format!("cannot read the code of process {pid} at {address:#x}")))?;
    if there[0] != 0xcc {
        return run_to_breakpoint(pid, mem, address);
    }
    let tid = Pid::from_raw(pid);
    let debug_register = |n: u64| (DEBUG_REGISTERS + 8 * n) as ptrace::AddressType;
    // DR0 = address; DR7: local enable of DR0, on execution of one byte.
    if ptrace::write_user(tid, debug_register(0), address as libc::c_long).is_err()
        || ptrace::write_user(tid, debug_register(7), 1).is_err()
    {
        return run_to_breakpoint(pid, mem, address);
    }
    let mut signal = 0;
    let regs = loop {
        resume(tid, Resume::Continue, signal).map_err(errno("cannot let the program start"))?;
        signal = match wait_traced(tid) {
            Ok(Traced::Signal(libc::SIGTRAP)) => {
                let regs = ptrace::getregs(tid).map_err(errno("cannot read the registers of the program"))?;
                if regs.rip == address {
                    break regs;
                }
                // The program's own.
                libc::SIGTRAP
            }
            Ok(Traced::Signal(other)) => other,
            Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) => {
                return Err(RemoteError::Unsupported(format!("process {pid} ended before its program started")));
            }
            Ok(_) => 0,
            Err(e) => return Err(errno("cannot wait for the program to start")(e)),
        };
    };
    ptrace::write_user(tid, debug_register(7), 0).map_err(errno("cannot clear the program's debug registers"))?;
    Ok(regs)
}

/// [`run_to`] with a breakpoint instruction written at `address`.
fn run_to_breakpoint(pid: i32, mem: &File, address: u64) -> Result<libc::user_regs_struct, RemoteError> {
    let tid = Pid::from_raw(pid);
    let mut original = [0u8; 1];
    mem.read_exact_at(&mut original, address).map_err(io_error(format!("cannot read the code of process {pid} at {address:#x}")))?;
    mem.write_all_at(&[0xcc], address).map_err(io_error(format!("cannot write the code of process {pid} at {address:#x}")))?;
    let mut signal = 0;
    loop {
        resume(tid, Resume::Continue, signal).map_err(errno("cannot let the program start"))?;
        match wait_traced(tid) {
            Ok(Traced::Signal(libc::SIGTRAP)) => {
                // Ours past the breakpoint; else the program's own, given back.
                match ptrace::getregs(tid) {
                    Ok(regs) if regs.rip == address + 1 => break,
                    _ => signal = libc::SIGTRAP,
                }
            }
            Ok(Traced::Signal(other)) => signal = other,
            Ok(Traced::Exited(_)) | Ok(Traced::Killed(_)) => {
                return Err(RemoteError::Unsupported(format!("process {pid} ended before its program started")));
            }
            Ok(_) => signal = 0,
            Err(e) => return Err(errno("cannot wait for the program to start")(e)),
        }
    }
    mem.write_all_at(&original, address).map_err(io_error(format!("cannot restore the code of process {pid} at {address:#x}")))?;
    let mut regs = ptrace::getregs(tid).map_err(errno("cannot read the registers of the program"))?;
    if regs.rip != address + 1 {
        return Err(RemoteError::Unsupported(format!("process {pid} stopped at {:#x}, not at {address:#x}", regs.rip)));
    }
    regs.rip = address;
    ptrace::setregs(tid, regs).map_err(errno("cannot set the registers of the program"))?;
    Ok(regs)
}

/// The pages from which a 32-bit displacement reaches all of `near` and
/// back: [lowest, highest), both page-aligned (`near` is code, its ends
/// anywhere), at or above `min_addr`.
fn within_reach(near: &std::ops::Range<u64>, min_addr: u64) -> (u64, u64) {
    let reach = 0x7fff_0000u64;
    let lowest = near.end.saturating_sub(reach).max(min_addr).next_multiple_of(4096);
    let highest = near.start.saturating_add(reach).min(0x7fff_ffff_f000) & !4095;
    (lowest, highest)
}

/// Free ranges of `len` bytes between `lowest` and `highest`, nearest the
/// middle first, as start addresses.
fn gaps(maps: &[Mapping], lowest: u64, highest: u64, len: u64) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut previous_end = lowest;
    let mut ranges: Vec<(u64, u64)> = maps.iter().map(|m| (m.start.0, m.end.0)).collect();
    ranges.sort_unstable();
    ranges.push((highest, highest));
    for (start, end) in ranges {
        let from = previous_end.max(lowest);
        let to = start.min(highest);
        if to > from && to - from >= len {
            // The end of the gap: close to the code above it, away from the heap's growth.
            starts.push(to - len);
        }
        previous_end = previous_end.max(end);
    }
    let middle = lowest / 2 + highest / 2;
    starts.sort_by_key(|s| s.abs_diff(middle));
    starts
}

/// Memory mapped in the target and in proftap.
pub struct Shared {
    local: *mut u8,
    len: usize,
    /// Its address in the target.
    pub remote: u64,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for Shared {}
// SAFETY: every access is an atomic load or store of a word, or a copy of
// bytes another process may be writing at the same time, which readers
// check; none hands out a reference into the mapping.
unsafe impl Sync for Shared {}

impl Shared {
    /// `len` bytes of a memfd mapped in this process alone, zeroed; its
    /// remote address is the local one. For the tests and the fuzz target
    /// of the reader (`fuzz/src/bin/totals.rs`), which write into it what a
    /// target could.
    #[doc(hidden)]
    pub fn anonymous(len: usize) -> io::Result<Shared> {
        let len = len.next_multiple_of(4096);
        // SAFETY: memfd_create takes a name and flags.
        let fd = unsafe { libc::memfd_create(c"proftap".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        File::from(fd.try_clone()?).set_len(len as u64)?;
        let mut shared = Shared::map(fd, len, 0)?;
        shared.remote = shared.local as u64;
        Ok(shared)
    }

    /// `len` bytes of memfd `fd` (which must not shrink while mapped: the
    /// caller made sure), mapped here; at `remote` in the target.
    pub fn map(fd: OwnedFd, len: usize, remote: u64) -> io::Result<Shared> {
        // SAFETY: a shared mapping of a memfd the value made below holds
        // open; the target writes to it concurrently, which readers of
        // `Shared` account for.
        let pointer =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if pointer == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shared { local: pointer.cast(), len, remote, fd })
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `u64` at byte `offset`, read atomically: the target writes it.
    pub fn load(&self, offset: usize) -> u64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.len, "offset {offset} outside the shared memory");
        // SAFETY: in bounds and aligned, checked above; an atomic view of shared memory.
        unsafe { (*self.local.add(offset).cast::<std::sync::atomic::AtomicU64>()).load(std::sync::atomic::Ordering::Acquire) }
    }

    /// The `count` `u64`s from byte `offset` on, each read atomically (the
    /// target writes them); bounds checked once, for reading thousands of
    /// counters every few milliseconds.
    pub fn loads(&self, offset: usize, count: usize) -> impl Iterator<Item = u64> + '_ {
        let end = count.checked_mul(8).and_then(|bytes| bytes.checked_add(offset));
        assert!(offset % 8 == 0 && end.is_some_and(|end| end <= self.len), "{count} counters at {offset} outside the shared memory");
        // SAFETY: in bounds and aligned, checked above; an atomic view of
        // shared memory, which lives as long as `self`.
        let counters = unsafe { std::slice::from_raw_parts(self.local.add(offset).cast::<std::sync::atomic::AtomicU64>(), count) };
        counters.iter().map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Appends `len` bytes from `offset` to `into`: records the target has
    /// published (after an acquiring [`Shared::load`] of their counter), so
    /// it no longer writes them.
    pub fn copy_to(&self, offset: usize, len: usize, into: &mut Vec<u8>) {
        assert!(offset + len <= self.len, "{len} bytes at {offset} outside the shared memory");
        // SAFETY: in bounds, checked above; the bytes are not written while published.
        into.extend_from_slice(unsafe { std::slice::from_raw_parts(self.local.add(offset), len) });
    }

    /// Zeroes `len` bytes from `offset`, giving whole pages back to the
    /// system: memory no thread of the target uses any more.
    pub fn zero(&self, offset: usize, len: usize) {
        assert!(offset + len <= self.len, "{len} bytes at {offset} outside the shared memory");
        let punched = i64::try_from(offset).ok().zip(i64::try_from(len).ok()).is_some_and(|(at, len)| {
            // SAFETY: fallocate on the memfd this value holds; the range is inside it.
            unsafe { libc::fallocate(self.fd.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, at, len) == 0 }
        });
        if !punched {
            // SAFETY: in bounds, checked above; no thread writes these bytes any more.
            unsafe { std::ptr::write_bytes(self.local.add(offset), 0, len) };
        }
    }

    /// The `u32` at byte `offset`, read atomically.
    pub fn load_u32(&self, offset: usize) -> u32 {
        // SAFETY: in bounds and aligned (checked); an atomic view of shared memory.
        unsafe { (*self.u32_at(offset)).load(std::sync::atomic::Ordering::Acquire) }
    }

    /// The file of the memory, which the target maps as long as it runs
    /// the image it was shared with.
    pub fn file(&self) -> io::Result<FileId> {
        file_of(&self.fd)
    }

    /// Adds one to the `u32` at byte `offset` and wakes every thread of any
    /// process waiting on it (`futex(2)` on shared memory).
    pub fn bump_and_wake(&self, offset: usize) {
        let word = self.u32_at(offset);
        // SAFETY: in bounds and aligned (checked); futex on a shared word.
        unsafe {
            (*word).fetch_add(1, std::sync::atomic::Ordering::Release);
            libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX, 0, 0, 0);
        }
    }

    /// Wakes every thread waiting on the `u32` at byte `offset`, leaving it
    /// as it is.
    pub fn wake(&self, offset: usize) {
        let word = self.u32_at(offset);
        // SAFETY: in bounds and aligned (checked); futex on a shared word.
        unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX, 0, 0, 0) };
    }

    /// Waits at most `timeout` for the `u32` at byte `offset` to be woken,
    /// unless it no longer holds `seen`.
    pub fn wait_while(&self, offset: usize, seen: u32, timeout: std::time::Duration) {
        let word = self.u32_at(offset);
        let timeout = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos().into() };
        // SAFETY: futex on a shared word in bounds (checked), with a timeout.
        unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen, &timeout as *const libc::timespec, 0, 0) };
    }

    fn u32_at(&self, offset: usize) -> *const std::sync::atomic::AtomicU32 {
        assert!(offset % 4 == 0 && offset + 4 <= self.len, "offset {offset} outside the shared memory");
        // SAFETY: in bounds, checked above.
        unsafe { self.local.add(offset).cast::<std::sync::atomic::AtomicU32>() }
    }

    /// Stores `new` at byte `offset` if it holds `current`, atomically;
    /// whether it did.
    pub fn compare_exchange(&self, offset: usize, current: u64, new: u64) -> bool {
        assert!(offset % 8 == 0 && offset + 8 <= self.len, "offset {offset} outside the shared memory");
        // SAFETY: in bounds and aligned, checked above; an atomic view of shared memory.
        let word = unsafe { &*self.local.add(offset).cast::<std::sync::atomic::AtomicU64>() };
        word.compare_exchange(current, new, std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire).is_ok()
    }

    /// Stores `value` at byte `offset`, atomically.
    pub fn store(&self, offset: usize, value: u64) {
        assert!(offset % 8 == 0 && offset + 8 <= self.len, "offset {offset} outside the shared memory");
        // SAFETY: in bounds and aligned, checked above; an atomic view of shared memory.
        unsafe { (*self.local.add(offset).cast::<std::sync::atomic::AtomicU64>()).store(value, std::sync::atomic::Ordering::Release) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping what `share` mapped; no reference outlives self.
        unsafe { libc::munmap(self.local.cast(), self.len) };
    }
}

/// A file, by its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    /// As `st_dev` encodes it.
    pub device: u64,
    /// Its inode on that device.
    pub inode: u64,
}

/// The file behind `fd` (a memfd shared with a target).
pub fn file_of(fd: &OwnedFd) -> io::Result<FileId> {
    let stat = nix::sys::stat::fstat(fd)?;
    Ok(FileId { device: stat.st_dev, inode: stat.st_ino })
}

/// Pieces farther apart than this are read apart.
const NEARBY_BYTES: u64 = 4096;
/// The most bytes one read of a run of pieces spans.
const RUN_BYTES: u64 = 64 * 1024;

/// The pieces (`(address, len)`) in runs of nearby ones, by index, each run
/// in address order and at most [`RUN_BYTES`] wide.
fn nearby_runs(pieces: &[(u64, usize)]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by_key(|&i| pieces[i].0);
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut span = (0u64, 0u64);
    for i in order {
        let (at, len) = pieces[i];
        let end = at.saturating_add(len as u64);
        match runs.last_mut() {
            Some(run) if at >= span.1 && at - span.1 <= NEARBY_BYTES && end - span.0 <= RUN_BYTES => {
                run.push(i);
                span.1 = end;
            }
            _ => {
                runs.push(vec![i]);
                span = (at, end);
            }
        }
    }
    runs
}

/// The addresses a run of pieces spans.
fn run_span(pieces: &[(u64, usize)], run: &[usize]) -> (u64, u64) {
    let start = run.iter().map(|&i| pieces[i].0).min().unwrap_or(0);
    let end = run.iter().map(|&i| pieces[i].0 + pieces[i].1 as u64).max().unwrap_or(start);
    (start, end)
}

/// Whether `signal` is one a thread's own instruction raises (or a kill
/// of that number): stepped again, the instruction raises it again.
fn is_fault(signal: i32) -> bool {
    matches!(signal, libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_pieces_are_read_in_runs() {
        // Out of order; two near each other, one a page and more away, one
        // past a run's width from the first.
        let pieces = [(0x1010, 5), (0x1000, 5), (0x3000, 5), (0x1000 + RUN_BYTES, 5)];
        assert_eq!(nearby_runs(&pieces), vec![vec![1, 0], vec![2], vec![3]]);
        assert_eq!(run_span(&pieces, &[1, 0]), (0x1000, 0x1015));
        // Pieces a page apart join; a run never grows past its width.
        let chain: Vec<(u64, usize)> = (0..40).map(|i| (0x10_0000 + i * 4096, 5)).collect();
        let runs = nearby_runs(&chain);
        assert!(
            runs.len() > 1
                && runs.iter().all(|r| {
                    let (a, b) = run_span(&chain, r);
                    b - a <= RUN_BYTES
                }),
            "{runs:?}"
        );
        assert_eq!(runs.iter().map(Vec::len).sum::<usize>(), 40);
    }
    use crate::addr::{FileOffset, RuntimeAddr};

    fn map(start: u64, end: u64) -> Mapping {
        Mapping {
            start: RuntimeAddr(start),
            end: RuntimeAddr(end),
            readable: true,
            writable: false,
            executable: false,
            offset: FileOffset(0),
            device: 0,
            inode: 0,
            path: None,
        }
    }

    #[test]
    fn a_gap_up_to_the_reachs_end_from_code_anywhere_starts_on_a_page() {
        // Code at an address of no alignment, nothing mapped above it.
        let near = 0x7ff0_ad92_a2e0..0x7ff0_ad92_a300;
        let (lowest, highest) = within_reach(&near, 65536);
        let maps = [map(near.start & !4095, (near.end + 4095) & !4095)];
        let found = gaps(&maps, lowest, highest, 0x44000);
        assert!(!found.is_empty());
        for start in found {
            assert_eq!(start % 4096, 0, "{start:#x}");
            assert!(start >= lowest && start + 0x44000 <= highest && highest - near.start <= 0x7fff_0000, "{start:#x}");
        }
    }

    #[test]
    fn gaps_are_free_and_in_reach() {
        let maps = [map(0x10000, 0x20000), map(0x30000, 0x40000), map(0x41000, 0x50000)];
        let found = gaps(&maps, 0x10000, 0x60000, 0x2000);
        // Gaps: 0x20000..0x30000 and 0x50000..0x60000; 0x40000..0x41000 is too small.
        assert_eq!(found.len(), 2);
        for start in found {
            assert!(maps.iter().all(|m| start + 0x2000 <= m.start.0 || start >= m.end.0), "{start:#x} overlaps");
        }
    }
}

//! Timing calls from patched entries: the runtime (see [`super::runtime`])
//! records each entry and return of the patched functions into per-thread
//! rings shared with proftap, which drains them.

use super::patcher::{self, Applied, Refused};
use super::remote::{Remote, RemoteError, Shared};
use super::runtime::{self, Layout, control};
use crate::plan::ProbedFunction;
use crate::procfs;

/// One entry or return, as the runtime recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The thread.
    pub tid: u32,
    /// Its TSC.
    pub tsc: u64,
    /// The function's index.
    pub function: u32,
    /// A return (else an entry).
    pub exit: bool,
    /// Where the return address is (at an entry) or was (at a return).
    pub slot: u64,
    /// The return address.
    pub ret: u64,
}

/// Timing calls in a running process.
pub struct Tracing {
    pid: i32,
    shared: Option<Shared>,
    layout: Option<Layout>,
    applied: Vec<Applied>,
    refused: Refused,
    /// Records read so far, per slot.
    tails: Vec<u64>,
}

/// `madvise` advice: zero the page in a forked child.
const MADV_WIPEONFORK: u64 = 18;

impl Tracing {
    /// Patches the entries of `functions` (of the main executable) in process
    /// `pid`; those that cannot be patched are listed by [`Tracing::refused`].
    pub fn attach(pid: i32, functions: &[ProbedFunction]) -> Result<Tracing, RemoteError> {
        let modules = procfs::loaded_modules(pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        let Some(main) = modules.iter().find(|m| m.is_main) else {
            return Err(RemoteError::Unsupported(format!("process {pid} has no executable mapped")));
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status.lines().any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk")) {
            return Err(RemoteError::Unsupported(format!(
                "process {pid} runs with CET shadow stacks, which forbid returning anywhere but to the caller"
            )));
        }
        let (plans, mut refused) = patcher::plans(main, functions)?;
        let mut tracing =
            Tracing { pid, shared: None, layout: None, applied: Vec::new(), refused: Vec::new(), tails: vec![0; runtime::SLOTS as usize] };
        if plans.is_empty() {
            tracing.refused = refused;
            return Ok(tracing);
        }
        let remote = Remote::attach(pid)?;
        for tid in remote.threads() {
            if remote.regs(tid)?.fs_base == 0 {
                return Err(RemoteError::Unsupported(format!(
                    "thread {tid} of process {pid} has no thread-local storage to tell threads apart"
                )));
            }
        }
        let anonymous = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let read_write = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let private = remote.syscall("mmap", libc::SYS_mmap, [0, runtime::PRIVATE_BYTES, read_write, anonymous, u64::MAX, 0])?;
        let live = remote.syscall("mmap", libc::SYS_mmap, [0, 4096, read_write, anonymous, u64::MAX, 0])?;
        remote.syscall("madvise", libc::SYS_madvise, [live, 4096, MADV_WIPEONFORK, 0, 0, 0])?;
        let shared = remote.share(runtime::SHARED_BYTES as usize, None)?;
        let layout = Layout { private, live, shared: shared.remote };
        let assembled = std::cell::Cell::new(0u64);
        tracing.applied = patcher::apply(
            &remote,
            plans,
            1024,
            |address| {
                let rt = runtime::assemble(address, &layout)?;
                assembled.set(rt.entry);
                Ok(rt.code)
            },
            |i, address| runtime::call_entry(address, assembled.get(), i as u32),
            &mut refused,
        )?;
        // Recording starts with the threads still held.
        remote.write(live, &1u64.to_ne_bytes())?;
        tracing.shared = Some(shared);
        tracing.layout = Some(layout);
        tracing.refused = refused;
        Ok(tracing)
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Functions not patched, and why.
    pub fn refused(&self) -> &[(usize, String)] {
        &self.refused
    }

    /// Whether any function is patched.
    pub fn is_active(&self) -> bool {
        !self.applied.is_empty()
    }

    /// Every record written since the last drain, thread by thread in the
    /// order each thread wrote them.
    pub fn drain(&mut self, into: &mut Vec<Call>) {
        let Some(shared) = &self.shared else { return };
        for slot in 0..runtime::SLOTS {
            let at = Layout::control_offset(slot);
            let head = shared.load(at + control::HEAD);
            let tail = self.tails[slot as usize];
            if head == tail {
                continue;
            }
            let tid = shared.load(at + control::TID) as u32;
            for n in tail..head {
                let record = Layout::record_offset(slot, n);
                let payload = shared.load(record + 8);
                into.push(Call {
                    tid,
                    tsc: shared.load(record),
                    function: payload as u32,
                    exit: (payload >> 32) as u32 == runtime::EXIT,
                    slot: shared.load(record + 16),
                    ret: shared.load(record + 24),
                });
            }
            self.tails[slot as usize] = head;
            shared.store(at + control::TAIL, head);
        }
    }

    /// Records dropped because a ring was full.
    pub fn lost(&self) -> u64 {
        self.shared.as_ref().map_or(0, |s| (0..runtime::SLOTS).map(|slot| s.load(Layout::control_offset(slot) + control::LOST)).sum())
    }

    /// Stops recording and puts the original bytes back. The runtime and
    /// trampolines stay mapped: calls in progress still return through them.
    pub fn detach(&mut self) -> Result<(), RemoteError> {
        if self.applied.is_empty() {
            return Ok(());
        }
        let remote = Remote::attach(self.pid)?;
        patcher::restore(&remote, &mut self.applied)?;
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

//! Exact call counts from patched entries: each patched function jumps to a
//! trampoline that adds one to its counter in memory shared with proftap,
//! runs the instructions the jump replaced and jumps back. A few
//! nanoseconds a call, and proftap reads the counts whenever it likes.

use super::patch;
use super::patcher::{self, Applied, Target};
use super::remote::{Remote, RemoteError, Shared};
use crate::plan::ProbedFunction;
use crate::procfs;

/// Counting calls in a running process.
pub struct Counting {
    pid: i32,
    counters: Option<Shared>,
    /// Function index -> its counter's slot, for the patched ones.
    slots: Vec<Option<usize>>,
    applied: Vec<Applied>,
    refused: Vec<(usize, String)>,
}

impl Counting {
    /// Patches the entries of `functions` (of the main executable) in process
    /// `pid`; those that cannot be patched are listed by [`Counting::refused`].
    pub fn attach(pid: i32, functions: &[ProbedFunction]) -> Result<Counting, RemoteError> {
        let modules = procfs::loaded_modules(pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        let targets: Vec<Target> = functions.iter().map(Target::of).collect();
        let (groups, mut refused) = patcher::plans(&modules, &targets);
        // The counters are reached from the trampolines by rip-relative
        // addressing: one module's functions only, the executable's.
        let mut plans = Vec::new();
        for group in groups {
            if modules.iter().any(|m| m.is_main && m.path == group.module) {
                plans = group.plans;
            } else {
                refused.extend(group.plans.into_iter().map(|(i, _)| (i, "counting covers the executable only".to_string())));
            }
        }
        let mut counting = Counting { pid, counters: None, slots: vec![None; functions.len()], applied: Vec::new(), refused: Vec::new() };
        if !plans.is_empty() {
            let remote = Remote::attach(pid)?;
            let counters = remote.share((functions.len() * 8).max(8), Some(patcher::span(&plans)))?;
            let base = counters.remote;
            (counting.applied, _) = patcher::apply(
                &remote,
                plans,
                0,
                |_| Ok(Vec::new()),
                |i, _, address| Ok(patch::count_call(address, base + 8 * i as u64)),
                &mut refused,
            )?;
            for a in &counting.applied {
                counting.slots[a.function] = Some(a.function);
            }
            counting.counters = Some(counters);
        }
        counting.refused = refused;
        Ok(counting)
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Calls so far, by function index (0 for functions not patched).
    pub fn counts(&self) -> Vec<u64> {
        self.slots.iter().map(|s| s.zip(self.counters.as_ref()).map_or(0, |(slot, c)| c.load(8 * slot))).collect()
    }

    /// Functions not patched, and why.
    pub fn refused(&self) -> &[(usize, String)] {
        &self.refused
    }

    /// Puts the original bytes back. The trampolines stay mapped: a thread
    /// may still be in one. The counts stay readable.
    pub fn detach(&mut self) -> Result<(), RemoteError> {
        if self.applied.is_empty() {
            return Ok(());
        }
        let remote = Remote::attach(self.pid)?;
        patcher::restore(&remote, &mut self.applied, |_| true)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

//! Exact call counts from patched entries: each patched function jumps to a
//! trampoline that adds one to its counter in memory shared with proftap,
//! runs the instructions the jump replaced and jumps back. A few
//! nanoseconds a call, and proftap reads the counts whenever it likes.

use super::patch::{self, PatchPlan, Trampoline};
use super::remote::{Remote, RemoteError, Shared};
use crate::plan::ProbedFunction;
use crate::procfs;
use crate::symbols::ElfImage;
use std::collections::HashMap;
use std::path::Path;

/// Room for one trampoline: the counter increment, the relocated
/// instructions (at most 15 bytes each, a few more once re-encoded) and the
/// jump back.
const TRAMPOLINE_ROOM: usize = 96;

/// A patched entry, to undo at detach.
struct Applied {
    at: u64,
    original: Vec<u8>,
    jump: Vec<u8>,
}

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
        let mut counting = Counting { pid, counters: None, slots: vec![None; functions.len()], applied: Vec::new(), refused: Vec::new() };
        let Some(main) = modules.iter().find(|m| m.is_main) else {
            return Err(RemoteError::Unsupported(format!("process {pid} has no executable mapped")));
        };
        let image = ElfImage::open(&main.open_path).map_err(|e| RemoteError::Unsupported(e.to_string()))?;

        // Plans from the file: the code as built, whatever is in memory.
        let mut plans: Vec<(usize, PatchPlan)> = Vec::new();
        for (i, f) in functions.iter().enumerate() {
            let in_main = Path::new(&f.info.module) == main.path;
            let code = image.data().get(f.offset.0 as usize..(f.offset.0 + f.size) as usize);
            let planned = match (in_main, code) {
                (false, _) => Err("it is in a shared library (not patched yet)".to_string()),
                (true, _) if f.size == 0 => Err("its size is unknown".to_string()),
                (true, None) => Err("its code is not in the file".to_string()),
                (true, Some(code)) => patch::plan(main.bias.to_runtime(crate::addr::VirtAddr(f.info.address)).0, code),
            };
            match planned {
                Ok(p) => plans.push((i, p)),
                Err(why) => counting.refused.push((i, why)),
            }
        }
        if plans.is_empty() {
            return Ok(counting);
        }
        let lowest = plans.iter().map(|(_, p)| p.at).min().unwrap_or(0);
        let highest = plans.iter().map(|(_, p)| p.at + p.len() as u64).max().unwrap_or(0);

        let remote = Remote::attach(pid)?;
        // Code in memory must be the file's: no breakpoint or other patch there.
        plans.retain(|(i, p)| match remote.read(p.at, p.len()) {
            Ok(bytes) if bytes == p.original => true,
            Ok(_) => {
                counting.refused.push((*i, "its code in memory differs from the file (a breakpoint or another tool's patch)".into()));
                false
            }
            Err(e) => {
                counting.refused.push((*i, e.to_string()));
                false
            }
        });
        let counters = remote.share((plans.len() * 8).max(8), Some(lowest..highest))?;
        let room = plans.len() * TRAMPOLINE_ROOM;
        let region = remote.map_near(lowest..highest, room)?;

        let mut code = Vec::with_capacity(room);
        let mut built: Vec<(usize, PatchPlan, Trampoline, u64)> = Vec::new();
        for (slot, (i, p)) in plans.into_iter().enumerate() {
            let address = region + code.len() as u64;
            let counter = counters.remote + 8 * slot as u64;
            match patch::trampoline(&p, address, |a| patch::count_call(a, counter)) {
                Ok(t) if t.code.len() <= TRAMPOLINE_ROOM => {
                    code.extend_from_slice(&t.code);
                    code.resize(code.len().next_multiple_of(16), 0xcc);
                    counting.slots[i] = Some(slot);
                    built.push((i, p, t, address));
                }
                Ok(_) => counting.refused.push((i, "its first instructions grow too much when moved".into())),
                Err(why) => counting.refused.push((i, why)),
            }
        }
        remote.write(region, &code)?;
        remote.seal_code(region, room)?;

        // Threads stopped inside bytes about to be replaced go on from their
        // copies in the trampoline.
        let mut moves: HashMap<u64, u64> = HashMap::new();
        for (_, p, t, _) in &built {
            for &(from, to) in &t.moved {
                if from != p.at {
                    moves.insert(from, to);
                }
            }
        }
        for tid in remote.threads() {
            let mut regs = remote.regs(tid)?;
            if let Some(&to) = moves.get(&regs.rip) {
                regs.rip = to;
                remote.set_regs(tid, regs)?;
            }
        }
        for (_, p, _, address) in &built {
            let jump = p.jump_to(*address);
            remote.write(p.at, &jump)?;
            counting.applied.push(Applied { at: p.at, original: p.original.clone(), jump });
        }
        counting.counters = Some(counters);
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
        for applied in self.applied.drain(..) {
            // Only our own jump is undone.
            if remote.read(applied.at, applied.jump.len())? == applied.jump {
                remote.write(applied.at, &applied.original)?;
            }
        }
        Ok(())
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

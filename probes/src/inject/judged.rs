//! What the patch planner judged of a file's functions from the file
//! alone (refused and why, or to be planned again whole in the process),
//! kept for the rest of the boot as the DWARF is (see `symbols::kept`):
//! judging every function of a program decodes all its code, the largest
//! part of what a recording does before a program of a few thousand
//! functions starts, and the same build is usually recorded again and
//! again.
//!
//! Kept per file, under the version of the file (device, inode, size,
//! modification and change times, build-id) and of the planner's code;
//! each function under everything the planner is told of it. Read back
//! only from a file this user owns that no one else may write, in a
//! directory only this user may write; a file that does not decode is
//! judged afresh and replaced.

use super::patch::Site;
use super::patcher::{self, Target};
use crate::boot_cache;
use crate::plan::ProbedFunction;
use crate::symbols::{ElfImage, FileVersion};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Changes whenever what is kept changes meaning.
const FORMAT: u32 = 1;

/// Changes with the code that judges (the planner, the reading of the
/// file's code, the decoder's version in the lock file): what another
/// build of it judged is not read back, whatever version it called itself.
const PLANNER: u64 = boot_cache::combined(&[
    boot_cache::fnv1a(include_bytes!("patch.rs")),
    boot_cache::fnv1a(include_bytes!("patcher.rs")),
    boot_cache::fnv1a(include_bytes!("judged.rs")),
    boot_cache::fnv1a(include_bytes!("../symbols/elf.rs")),
    boot_cache::fnv1a(include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))),
]);

/// The largest file kept for one binary (about 15 bytes a function, 120
/// once read).
const MOST_FILE_BYTES: u64 = 4 << 20;

/// All files kept together: the least recently used go past this.
const MOST_KEPT_BYTES: u64 = 64 << 20;

/// What the planner says of each of `functions` from its file alone:
/// read from `kept` where the same function of the same file was judged
/// before, judged now (on every CPU) and kept there otherwise.
pub fn judge(functions: &[ProbedFunction], kept: Option<&Path>) -> Vec<Verdict> {
    judge_settled(functions, kept, boot_cache::SETTLED_NS)
}

/// [`judge`], keeping only what was judged of a file changed more than
/// `settled_ns` ago.
fn judge_settled(functions: &[ProbedFunction], kept: Option<&Path>, settled_ns: i128) -> Vec<Verdict> {
    let modules = patcher::as_in_files(functions);
    let targets: Vec<Target> = functions.iter().map(Target::of).collect();
    let mut files: HashMap<&Path, Judged> = HashMap::new();
    for t in &targets {
        files.entry(&t.open_path).or_insert_with(|| Judged::settled_after(kept, &t.open_path, settled_ns));
    }
    let mut verdicts: Vec<Option<Verdict>> = targets.iter().map(|t| files[t.open_path.as_path()].verdict(t).cloned()).collect();
    let unjudged: Vec<usize> = (0..targets.len()).filter(|&i| verdicts[i].is_none()).collect();
    // Each function is judged alone.
    let judged = patcher::on_every_cpu(&unjudged, |share| {
        let chosen: Vec<Target> = share.iter().map(|&i| targets[i].clone()).collect();
        let (groups, refused) = patcher::plans(&modules, &chosen, &[]);
        let mut judged: Vec<(usize, Verdict)> = share.iter().map(|&i| (i, Verdict::Planned)).collect();
        for (k, why) in refused {
            judged[k].1 = Verdict::Refused(why);
        }
        for (k, _) in groups.into_iter().flat_map(|g| g.plans).filter(|(_, p)| p.island.is_some()) {
            judged[k].1 = Verdict::PlannedWhole;
        }
        judged
    });
    for (i, verdict) in judged {
        if let Some(file) = files.get_mut(targets[i].open_path.as_path()) {
            file.add(&targets[i], verdict.clone());
        }
        verdicts[i] = Some(verdict);
    }
    files.into_values().for_each(Judged::keep);
    // Every function was judged; were one not, it would be planned whole in the process.
    verdicts.into_iter().map(|v| v.unwrap_or(Verdict::PlannedWhole)).collect()
}

/// What the planner said of a function from its file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    /// Patched from a plan of its first instructions.
    Planned,
    /// Patched from a plan of its whole code, made again in the process.
    PlannedWhole,
    /// Not patched, and why.
    Refused(String),
}

/// Everything the planner is told of a function but its file.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct FunctionKey {
    address: u64,
    offset: u64,
    size: u64,
    entry: bool,
    cold: Vec<(u64, u64)>,
    return_replaceable: bool,
    entered_inside: Vec<u32>,
    padding: u64,
    padding_before: u64,
    compiled: bool,
}

impl FunctionKey {
    fn of(target: &Target) -> FunctionKey {
        FunctionKey {
            address: target.address,
            offset: target.offset,
            size: target.size,
            entry: target.site == Site::Entry,
            cold: target.cold.clone(),
            return_replaceable: target.return_replaceable,
            entered_inside: target.entered_inside.clone(),
            padding: target.padding,
            padding_before: target.padding_before,
            compiled: target.compiled,
        }
    }
}

/// What a kept file was judged from.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct FileKey {
    format: u32,
    proftap: String,
    planner: u64,
    file: FileVersion,
    build_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Kept {
    key: FileKey,
    judged: Vec<(FunctionKey, Verdict)>,
}

/// The judgements of one file's functions: those kept, and those made
/// since, to keep.
struct Judged {
    /// The file judged, where its judgements are kept, and under which
    /// key (none: not kept).
    kept: Option<(PathBuf, PathBuf, FileKey)>,
    judged: HashMap<FunctionKey, Verdict>,
    /// What was judged now: nothing yet (`None`), every function refused
    /// for one reason (`Some(Some(why))`), or otherwise.
    added: Option<Option<String>>,
}

impl Judged {
    /// The judgements kept in `dir` of the file `open_path` as it is now
    /// (none when it cannot be opened, or nothing was kept of it); what is
    /// judged of it is kept only if it changed more than `settled_ns` ago.
    fn settled_after(dir: Option<&Path>, open_path: &Path, settled_ns: i128) -> Judged {
        let mut judged = Judged { kept: None, judged: HashMap::new(), added: None };
        let Some(dir) = dir.filter(|dir| boot_cache::private_dir(dir)) else { return judged };
        let Ok(image) = ElfImage::open(open_path) else { return judged };
        let version = image.version();
        // Judged within the clock's tick of a change, the file may change again unseen.
        if !boot_cache::settled(version.changed_ns(), settled_ns) {
            return judged;
        }
        let key = FileKey {
            format: FORMAT,
            proftap: env!("CARGO_PKG_VERSION").into(),
            planner: PLANNER,
            file: version,
            build_id: image.build_id().ok().flatten(),
        };
        let path = dir.join(boot_cache::file_name(&version));
        if let Some(kept) = boot_cache::read_private(&path, MOST_FILE_BYTES).and_then(|bytes| decode(&bytes)).filter(|k| k.key == key) {
            judged.judged = kept.judged.into_iter().collect();
        }
        judged.kept = Some((open_path.to_path_buf(), path, key));
        judged
    }

    /// What was judged of `target`, if it was.
    fn verdict(&self, target: &Target) -> Option<&Verdict> {
        self.judged.get(&FunctionKey::of(target))
    }

    /// `verdict` of `target`, judged now.
    fn add(&mut self, target: &Target, verdict: Verdict) {
        let refused = match &verdict {
            Verdict::Refused(why) => Some(why.clone()),
            Verdict::Planned | Verdict::PlannedWhole => None,
        };
        self.added = Some(match self.added.take() {
            None => refused,
            Some(all) => all.filter(|why| Some(why) == refused.as_ref()),
        });
        self.judged.insert(FunctionKey::of(target), verdict);
    }

    /// Keeps what was judged, when something was added and the file is
    /// still the version it was judged from. Not when every function
    /// judged now was refused for one reason: most likely the file could
    /// not be read then, which may pass.
    fn keep(self) {
        let Some((open_path, path, key)) = self.kept.filter(|_| matches!(self.added, Some(None))) else { return };
        if !ElfImage::open(&open_path).is_ok_and(|image| image.version() == key.file) {
            return;
        }
        let kept = Kept { key, judged: self.judged.into_iter().collect() };
        if let Ok(bytes) = postcard::to_stdvec(&kept)
            && bytes.len() as u64 <= MOST_FILE_BYTES
        {
            boot_cache::keep(&path, &bytes, MOST_KEPT_BYTES, boot_cache::is_file_name);
        }
    }
}

/// A kept file's bytes decoded, if they are one.
fn decode(bytes: &[u8]) -> Option<Kept> {
    postcard::from_bytes(bytes).ok()
}

/// What a recording does with a kept file's `bytes`, its key aside:
/// decoded into judgements; whether they would be used.
pub fn kept_file_is_used(bytes: &[u8]) -> bool {
    decode(bytes).is_some_and(|kept| !kept.judged.is_empty())
}

#[cfg(test)]
mod tests;

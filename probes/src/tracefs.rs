//! Uprobes defined through tracefs (`uprobe_events`), which the kernel turns
//! into tracepoints that perf can open with `inherit` (the uprobe PMU cannot:
//! it re-reads its path pointer in the target on every `pthread_create`).
//!
//! Definitions are global objects: each recording uses its own group
//! `proftap_<pid>_<n>` and removes it on every exit path; groups left by a
//! killed proftap are removed by the next one.

use crate::addr::FileOffset;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Errors from tracefs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TracefsError {
    /// tracefs is not mounted and could not be.
    #[error(
        "tracefs is not mounted at /sys/kernel/tracing and mounting it failed ({0}); run as root or mount it: mount -t tracefs nodev /sys/kernel/tracing"
    )]
    NotMounted(std::io::Error),
    /// The kernel has no uprobe events.
    #[error("this kernel has no uprobe events ({} is missing); it needs CONFIG_UPROBE_EVENTS=y", .0.display())]
    NoUprobes(PathBuf),
    /// Writing a definition failed.
    #[error("cannot define uprobe '{definition}': {source}{hint}")]
    Define {
        /// The line written.
        definition: String,
        /// Why.
        source: std::io::Error,
        /// What to do, starting with "; ".
        hint: String,
    },
    /// Reading back the tracepoint id failed.
    #[error("cannot read the id of uprobe {name}: {source}")]
    Id {
        /// GROUP/NAME.
        name: String,
        /// Why.
        source: std::io::Error,
    },
    /// The path of a probed file cannot be written in a uprobe definition.
    #[error("cannot probe {}: uprobe definitions cannot name a path with spaces; copy or link the file to a path without them", .0.display())]
    BadPath(PathBuf),
}

/// A mounted tracefs.
#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    /// Finds tracefs, mounting it at `/sys/kernel/tracing` if needed.
    pub fn open() -> Result<Self, TracefsError> {
        let root = match mounted_tracefs() {
            Some(root) => root,
            None => {
                let root = PathBuf::from("/sys/kernel/tracing");
                nix::mount::mount(Some("nodev"), &root, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>)
                    .map_err(|e| TracefsError::NotMounted(e.into()))?;
                root
            }
        };
        let events = root.join("uprobe_events");
        if !events.exists() {
            return Err(TracefsError::NoUprobes(events));
        }
        let tracefs = Tracefs { root };
        tracefs.remove_stale_groups();
        Ok(tracefs)
    }

    fn uprobe_events(&self) -> PathBuf {
        self.root.join("uprobe_events")
    }

    fn write_events(&self, text: &str) -> std::io::Result<()> {
        let mut file = OpenOptions::new().append(true).open(self.uprobe_events())?;
        file.write_all(text.as_bytes())
    }

    /// Removes groups whose proftap process no longer exists.
    fn remove_stale_groups(&self) {
        let Ok(text) = std::fs::read_to_string(self.uprobe_events()) else { return };
        let mut removal = String::new();
        for line in text.lines() {
            // p:proftap_123_0/f5 /path:0x1139
            let Some(name) = line.split_whitespace().next().and_then(|d| d.split_once(':')).map(|(_, n)| n) else { continue };
            let Some(pid) = name.strip_prefix("proftap_").and_then(|rest| rest.split('_').next()).and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            if !process_alive(pid) {
                removal.push_str(&format!("-:{name}\n"));
            }
        }
        if !removal.is_empty() {
            let _ = self.write_events(&removal);
        }
    }
}

fn mounted_tracefs() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut found = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, dir, "tracefs", ..] => return Some(PathBuf::from(dir)),
            [_, dir, "debugfs", ..] if Path::new(dir).join("tracing/uprobe_events").exists() => {
                found = Some(Path::new(dir).join("tracing"));
            }
            _ => {}
        }
    }
    found
}

fn process_alive(pid: i32) -> bool {
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).map_or_else(|e| e == nix::errno::Errno::EPERM, |()| true)
}

/// Whether a probe fires on entry or on return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// At the probed address.
    Entry,
    /// When the function entered at the probed address returns.
    Return,
}

/// One uprobe to define.
#[derive(Clone, Debug)]
pub struct UprobeSpec {
    /// The file the code is in.
    pub path: PathBuf,
    /// Where in the file.
    pub offset: FileOffset,
    /// Entry or return.
    pub kind: ProbeKind,
}

/// A group of uprobes defined in tracefs; removed when dropped. Drop every
/// perf event opened on them first: the kernel refuses to remove a uprobe
/// in use.
pub struct UprobeGroup {
    tracefs: Tracefs,
    group: String,
    names: Vec<String>,
}

impl UprobeGroup {
    /// Defines `specs` in a fresh group; returns the group and the tracepoint
    /// id of each spec, in order.
    pub fn define(tracefs: &Tracefs, specs: &[UprobeSpec]) -> Result<(Self, Vec<u64>), TracefsError> {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        let group = format!("proftap_{}_{}", std::process::id(), SEQUENCE.fetch_add(1, Ordering::Relaxed));
        let mut this = UprobeGroup { tracefs: tracefs.clone(), group, names: Vec::with_capacity(specs.len()) };
        // Definitions are written in batches: one write per definition is slow
        // with thousands of probes.
        let mut batch = String::new();
        let mut pending = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let path =
                spec.path.to_str().filter(|p| !p.contains(char::is_whitespace)).ok_or_else(|| TracefsError::BadPath(spec.path.clone()))?;
            let (letter, prefix) = match spec.kind {
                ProbeKind::Entry => ('p', 'e'),
                ProbeKind::Return => ('r', 'r'),
            };
            let name = format!("{prefix}{i}");
            batch.push_str(&format!("{letter}:{}/{name} {path}:{:#x}\n", this.group, spec.offset.0));
            pending.push(name);
            if batch.len() > 3000 || i + 1 == specs.len() {
                if let Err(source) = this.tracefs.write_events(&batch) {
                    // The batch may be partly in: define them one by one to find the culprit.
                    this.names.extend(pending.drain(..).filter(|n| this.tracefs.root.join("events").join(&this.group).join(n).exists()));
                    return Err(this.explain(&batch, source));
                }
                this.names.append(&mut pending);
                batch.clear();
            }
        }
        let ids = this
            .names
            .iter()
            .map(|name| {
                let path = this.tracefs.root.join("events").join(&this.group).join(name).join("id");
                std::fs::read_to_string(&path)
                    .and_then(|s| s.trim().parse::<u64>().map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e)))
                    .map_err(|source| TracefsError::Id { name: format!("{}/{name}", this.group), source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((this, ids))
    }

    fn explain(&self, batch: &str, source: std::io::Error) -> TracefsError {
        let first = batch.lines().next().unwrap_or_default().to_string();
        let hint = match source.kind() {
            ErrorKind::PermissionDenied => "; defining uprobes needs root (or CAP_SYS_ADMIN and write access to tracefs)".into(),
            _ if source.raw_os_error() == Some(libc::EINVAL) => {
                "; the kernel refused the offset (not an instruction boundary, or not in an executable segment)".into()
            }
            _ => String::new(),
        };
        TracefsError::Define { definition: first, source, hint }
    }

    /// The group name.
    pub fn name(&self) -> &str {
        &self.group
    }
}

impl Drop for UprobeGroup {
    fn drop(&mut self) {
        let removal: String = self.names.iter().map(|n| format!("-:{}/{n}\n", self.group)).collect();
        if !removal.is_empty() && self.tracefs.write_events(&removal).is_err() {
            // One failure (a probe still in use) must not keep the rest defined.
            for name in &self.names {
                let _ = self.tracefs.write_events(&format!("-:{}/{name}\n", self.group));
            }
        }
    }
}

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
    /// tracefs is root's: this user may not define uprobes.
    #[error(
        "kernel uprobes need root: tracefs ({}) is root's; run with sudo, or as yourself use the in-process engine (--engine inject) or sampling alone (--no-instrument)",
        .0.display()
    )]
    NotPermitted(PathBuf),
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
    /// The process that defines uprobes for this one refused or failed.
    #[error("{0}")]
    Host(String),
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
        match std::fs::metadata(&events) {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(TracefsError::NotPermitted(root)),
            Err(_) => return Err(TracefsError::NoUprobes(events)),
            Ok(_) if !crate::perf::may_define_uprobes() => return Err(TracefsError::NotPermitted(root)),
            Ok(_) => {}
        }
        let tracefs = Tracefs { root };
        tracefs.remove_stale_groups();
        Ok(tracefs)
    }

    /// Where it is mounted.
    pub fn root(&self) -> &Path {
        &self.root
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

/// Whether a probe fires at its address or when the function entered there returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ProbeKind {
    /// When the instruction at the probed address runs.
    At,
    /// When the function entered at the probed address returns (uretprobe).
    Return,
}

/// One uprobe to define.
#[derive(Clone, Debug)]
pub struct UprobeSpec {
    /// The file the code is in.
    pub path: PathBuf,
    /// Where in the file.
    pub offset: FileOffset,
    /// At the address or at return.
    pub kind: ProbeKind,
}

/// A tracepoint event of a group, as perf opens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeEvent {
    /// Which probes it carries.
    pub kind: ProbeKind,
    /// The tracepoint id to open.
    pub tracepoint: u64,
    /// Where the probe's id (its index in the specs) sits in the raw record.
    pub id_offset: usize,
    /// Where the word on top of the stack at the probe sits (`at` probes):
    /// at a function's entry, its return address, read before a return
    /// probe replaces it with the kernel's trampoline.
    pub top_offset: Option<usize>,
}

/// The uprobes of one recording, defined in tracefs as (at most) two
/// events: `at` for probes at addresses and `ret` for return probes. Each
/// probe carries its index as an immediate argument `id`, so one event
/// serves thousands of probes: few file descriptors, and one kernel grace
/// period (tens of milliseconds) per event when they are removed, not one
/// per probe. Removed when dropped; drop every perf event opened on the
/// group first, as the kernel refuses to remove a uprobe in use.
pub struct UprobeGroup {
    tracefs: Tracefs,
    group: String,
    events: Vec<&'static str>,
    tracepoints: Vec<u64>,
    /// Open once [`DefinedGroup::keep`] is called; closed before the group goes.
    keepers: Vec<perf_event::Counter>,
}

/// A group of uprobes defined for this process, wherever that was done.
/// Dropping it removes the definitions.
pub trait DefinedGroup: Send {
    /// Keeps the uprobes registered in the kernel after the targets' own
    /// events close (see [`crate::perf::open_keeper`]), so that closing
    /// them is quick; they are unregistered when the group is dropped.
    fn keep(&mut self);
}

/// Where uprobes are defined. Defining them takes write access to tracefs,
/// which is root's; a process without it (a proftapd session worker, which
/// runs as the user it records for) asks a process that has it.
pub trait UprobeHost: Send + Sync {
    /// Defines `specs` in a fresh group; the probe of `specs[i]` reports id `i`.
    fn define(&self, specs: &[UprobeSpec]) -> Result<(Box<dyn DefinedGroup>, Vec<ProbeEvent>), TracefsError>;
}

/// Defines uprobes in this process's tracefs.
pub struct LocalHost;

impl UprobeHost for LocalHost {
    fn define(&self, specs: &[UprobeSpec]) -> Result<(Box<dyn DefinedGroup>, Vec<ProbeEvent>), TracefsError> {
        let (group, events) = UprobeGroup::define(&Tracefs::open()?, specs)?;
        Ok((Box::new(group), events))
    }
}

static HOST: std::sync::OnceLock<Box<dyn UprobeHost>> = std::sync::OnceLock::new();

/// Makes `host` define every uprobe this process uses from now on. Where
/// uprobes are defined is a property of the process (its privileges), not of
/// one recording, so it is set once, before the first recording; a second
/// call is refused.
pub fn set_host(host: Box<dyn UprobeHost>) -> Result<(), Box<dyn UprobeHost>> {
    HOST.set(host)
}

/// Where this process defines uprobes: tracefs unless [`set_host`] said otherwise.
pub fn host() -> &'static dyn UprobeHost {
    HOST.get_or_init(|| Box::new(LocalHost)).as_ref()
}

impl UprobeGroup {
    /// Defines `specs` in a fresh group; the probe of `specs[i]` reports id `i`.
    pub fn define(tracefs: &Tracefs, specs: &[UprobeSpec]) -> Result<(Self, Vec<ProbeEvent>), TracefsError> {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        let group = format!("proftap_{}_{}", std::process::id(), SEQUENCE.fetch_add(1, Ordering::Relaxed));
        let mut this = UprobeGroup { tracefs: tracefs.clone(), group, events: Vec::new(), tracepoints: Vec::new(), keepers: Vec::new() };
        // Batched writes: one write per definition is slow with thousands of probes.
        let mut batch = String::new();
        for (i, spec) in specs.iter().enumerate() {
            let path =
                spec.path.to_str().filter(|p| !p.contains(char::is_whitespace)).ok_or_else(|| TracefsError::BadPath(spec.path.clone()))?;
            let (letter, event) = match spec.kind {
                ProbeKind::At => ('p', "at"),
                ProbeKind::Return => ('r', "ret"),
            };
            if !this.events.contains(&event) {
                this.events.push(event);
            }
            let top = if spec.kind == ProbeKind::At { " top=+0(%sp):x64" } else { "" };
            batch.push_str(&format!("{letter}:{}/{event} {path}:{:#x} id=\\{i}:u32{top}\n", this.group, spec.offset.0));
            if batch.len() > 3000 || i + 1 == specs.len() {
                if let Err(source) = this.tracefs.write_events(&batch) {
                    return Err(this.explain(&batch, source));
                }
                batch.clear();
            }
        }
        let events = this
            .events
            .iter()
            .map(|&event| {
                let dir = this.tracefs.root.join("events").join(&this.group).join(event);
                let name = format!("{}/{event}", this.group);
                let read =
                    |file: &str| std::fs::read_to_string(dir.join(file)).map_err(|source| TracefsError::Id { name: name.clone(), source });
                let tracepoint = read("id")?
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| TracefsError::Id { name: name.clone(), source: std::io::Error::new(ErrorKind::InvalidData, e) })?;
                let format = read("format")?;
                let id_offset = field_offset(&format, "id").ok_or_else(|| TracefsError::Id {
                    name: name.clone(),
                    source: std::io::Error::new(ErrorKind::InvalidData, "no id field in the event format"),
                })?;
                let kind = if event == "ret" { ProbeKind::Return } else { ProbeKind::At };
                Ok(ProbeEvent { kind, tracepoint, id_offset, top_offset: field_offset(&format, "top") })
            })
            .collect::<Result<Vec<_>, TracefsError>>()?;
        this.tracepoints = events.iter().map(|e| e.tracepoint).collect();
        Ok((this, events))
    }

    fn explain(&self, batch: &str, source: std::io::Error) -> TracefsError {
        // The kernel stops at the first bad line of a batch; name the batch's first.
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

/// The offset of field `name` in a tracepoint's `format` description
/// (`field:u32 id;\toffset:16;\tsize:4;...`).
pub(crate) fn field_offset(format: &str, name: &str) -> Option<usize> {
    format.lines().find_map(|line| {
        let declaration = line.trim().strip_prefix("field:")?.split(';').next()?;
        if declaration.split_whitespace().last()? != name {
            return None;
        }
        line.split(';').find_map(|part| part.trim().strip_prefix("offset:")).and_then(|o| o.trim().parse().ok())
    })
}

impl DefinedGroup for UprobeGroup {
    fn keep(&mut self) {
        if self.keepers.is_empty() {
            self.keepers = self.tracepoints.iter().filter_map(|&t| crate::perf::open_keeper(t).ok()).collect();
        }
    }
}

impl Drop for UprobeGroup {
    fn drop(&mut self) {
        // The kernel refuses to remove a uprobe an event still uses; each
        // unregisters its uprobe as it closes, after a grace period.
        crate::perf::close_in_parallel(std::mem::take(&mut self.keepers).into_iter().map(|k| Box::new(k) as Box<dyn Send>).collect());
        // Removing an event removes every probe defined under it.
        for event in &self.events {
            let _ = self.tracefs.write_events(&format!("-:{}/{event}\n", self.group));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_field_is_found_in_an_event_format() {
        let format = "name: at\nID: 2326\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u32 id;\toffset:16;\tsize:4;\tsigned:0;\n";
        assert_eq!(field_offset(format, "id"), Some(16));
        assert_eq!(field_offset(format, "common_pid"), Some(4));
        assert_eq!(field_offset(format, "missing"), None);
    }
}

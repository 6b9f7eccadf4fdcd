//! Names of code a program made while it ran (a JIT's), from the map it
//! writes for perf: `/tmp/perf-PID.map`, one line `START SIZE NAME` (hex)
//! per piece of code, as V8 (`node --perf-basic-prof`), CPython 3.12
//! (`-X perf`), LuaJIT, .NET and the JVM's perf-map-agent write it. The
//! file is the program's to write (and in `/tmp`, anyone's to plant
//! before it): it is read with the reader's own rights, only if the
//! program's owner or root owns it, as a regular file reached without a
//! link, within bounds, every line checked; only names come out of it.

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

/// The most bytes of a map read: a long-running JVM's is tens of MB.
const MOST_BYTES: u64 = 256 << 20;
/// The most pieces of code named.
const MOST_ENTRIES: usize = 4 << 20;
/// Longer names are cut here (at a character's boundary).
const MOST_NAME_BYTES: usize = 1024;
/// How far back from the nearest start a lookup looks for a piece that
/// contains the address: pieces may overlap (code moved, or freed and
/// its memory reused), and the one written last is the one there now.
const OVERLAPS_LOOKED_AT: usize = 64;

/// One piece of code: where it is, its name in [`JitNames::names`], and
/// its place in the file (later lines describe what is there now).
#[derive(Clone, Debug)]
struct Piece {
    start: u64,
    end: u64,
    name: std::ops::Range<u32>,
    line: u32,
}

/// The pieces of code a map names, and their names.
#[derive(Debug, Default)]
pub struct JitNames {
    /// Sorted by start once lines are added.
    pieces: Vec<Piece>,
    /// Every name, one after another.
    names: String,
    lines: u32,
}

impl JitNames {
    /// Adds the complete lines at the start of `text` (up to its last
    /// newline) and returns how many bytes they took: a line the program
    /// is still writing is read the next time. A line that does not parse
    /// is skipped.
    pub fn add_lines(&mut self, text: &[u8]) -> usize {
        let Some(end) = text.iter().rposition(|&b| b == b'\n').map(|i| i + 1) else { return 0 };
        for line in text[..end].split(|&b| b == b'\n') {
            if self.pieces.len() >= MOST_ENTRIES {
                break;
            }
            self.lines = self.lines.saturating_add(1);
            if let Some((start, size, name)) = piece(line) {
                let mut name = cut(&String::from_utf8_lossy(name), MOST_NAME_BYTES).to_string();
                // Names in brackets are proftap's own (`[probe overhead]`, `[unknown: ...]`).
                if name.starts_with('[') {
                    name.insert_str(0, "jit ");
                }
                let (Ok(from), Ok(to)) = (u32::try_from(self.names.len()), u32::try_from(self.names.len() + name.len())) else { break };
                self.names.push_str(&name);
                self.pieces.push(Piece { start, end: start + size, name: from..to, line: self.lines });
            }
        }
        self.pieces.sort_by_key(|p| (p.start, p.line));
        end
    }

    /// The name of the piece of code at `address`: of those that contain
    /// it, the one written last.
    pub fn name_at(&self, address: u64) -> Option<&str> {
        let after = self.pieces.partition_point(|p| p.start <= address);
        let piece = self.pieces[..after].iter().rev().take(OVERLAPS_LOOKED_AT).filter(|p| address < p.end).max_by_key(|p| p.line)?;
        self.names.get(piece.name.start as usize..piece.name.end as usize)
    }

    /// How many pieces it names.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// `START SIZE NAME`: hex numbers (with or without `0x`), then the rest
/// of the line (names hold spaces); a piece of no size, or past the end
/// of the address space, is none.
fn piece(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut rest = line;
    let mut number = || -> Option<u64> {
        let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
        let len = rest[start..].iter().position(|b| b.is_ascii_whitespace()).unwrap_or(rest.len() - start);
        let digits = std::str::from_utf8(&rest[start..start + len]).ok()?;
        rest = &rest[start + len..];
        let digits = digits.strip_prefix("0x").unwrap_or(digits);
        u64::from_str_radix(digits, 16).ok()
    };
    let (start, size) = (number()?, number()?);
    let name = rest.trim_ascii();
    (size > 0 && start.checked_add(size).is_some() && !name.is_empty()).then_some((start, size, name))
}

/// `text` cut to at most `bytes`, at a character's boundary.
fn cut(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The most bytes of a map read at one time (the rest the next time).
const MOST_BYTES_AT_ONCE: u64 = 4 << 20;
/// A line longer than this is no perf map's: skipped, not waited for.
const MOST_LINE_BYTES: usize = 64 << 10;
/// The most bytes of all maps read in one recording (a forking program's
/// children each have their own).
const MOST_BYTES_IN_ALL: u64 = 1 << 30;
/// Bytes of the start of a map kept to tell a map written again from its
/// start (by the program after an exec) from one that grew.
const HEAD_BYTES: usize = 64;

static BYTES_READ_IN_ALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A process's perf map, read as it grows.
#[derive(Debug)]
pub struct PerfMap {
    file: File,
    read: u64,
    head: Vec<u8>,
    names: JitNames,
    /// In a line too long to be one: bytes up to the next line's start are skipped.
    skipping: bool,
}

/// Where a process's perf map is, as the process sees it: its root
/// directory, its owner, its own pid and its start, as they were when
/// taken. Its map can be opened through it after the process ended: a
/// short program's samples in its JIT's code may be named only then.
#[derive(Debug)]
pub struct PerfMapPlace {
    pid: u32,
    /// Reached, not opened (`O_PATH`): a file system's own code does not
    /// run for it.
    root: File,
    owner: u32,
    own_pid: u32,
    started: Option<std::time::SystemTime>,
}

impl PerfMapPlace {
    /// Process `pid`'s, as it is now.
    pub fn of(pid: u32) -> io::Result<PerfMapPlace> {
        let own_pid = namespace_pid(pid).unwrap_or(pid);
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(format!("/proc/{pid}/root"))?;
        let owner = std::fs::metadata(format!("/proc/{pid}"))?.uid();
        let started = started_at(pid).map(|start| start - std::time::Duration::from_secs(1));
        Ok(PerfMapPlace { pid, root, owner, own_pid, started })
    }

    /// Opens the map there (`/tmp/perf-PID.map` within the process's root,
    /// under its own pid where it has a namespace of pids); one last changed
    /// before `not_before` (left by an earlier process of the pid, or by the
    /// image the process executed since) or before the process started is
    /// not its own. While the process still runs, its root and owner are
    /// taken afresh (it may have changed either since).
    pub fn open(&self, not_before: Option<std::time::SystemTime>) -> io::Result<PerfMap> {
        let now = PerfMapPlace::of(self.pid).ok().filter(|now| now.started.is_some() && now.started == self.started);
        let place = now.as_ref().unwrap_or(self);
        let not_before = not_before.into_iter().chain(place.started).max();
        PerfMap::open_in(&place.root, &format!("tmp/perf-{}.map", place.own_pid), place.owner, not_before)
    }
}

impl PerfMap {
    /// Opens the map process `pid` writes (see [`PerfMapPlace::open`]).
    pub fn open(pid: u32, not_before: Option<std::time::SystemTime>) -> io::Result<PerfMap> {
        PerfMapPlace::of(pid)?.open(not_before)
    }

    /// Opens `path` within the directory `root` as its root, if `owner` or
    /// root owns it and it was written at or after `not_before`.
    fn open_in(root: &File, path: &str, owner: u32, not_before: Option<std::time::SystemTime>) -> io::Result<PerfMap> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        // Found without opening what is there (a device opened has effects),
        // and opened for reading only once it is known to be a regular file.
        let found = match openat2(root, path, how) {
            Ok(found) => File::from(found),
            // Before Linux 5.6, or a filter on system calls that does not
            // know it: the path is followed from the root as it is.
            Err(nix::errno::Errno::ENOSYS | nix::errno::Errno::EPERM) => std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(format!("/proc/self/fd/{}/{path}", root.as_raw_fd()))?,
            Err(e) => return Err(e.into()),
        };
        checked(&found, owner)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", found.as_raw_fd()))?;
        checked(&file, owner)?;
        if not_before.is_some_and(|not_before| file.metadata().and_then(|m| m.modified()).is_ok_and(|written| written < not_before)) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the perf map there is older than the program"));
        }
        Ok(PerfMap { file, read: 0, head: Vec::new(), names: JitNames::default(), skipping: false })
    }

    /// Reads what was added since the last read (at most
    /// [`MOST_BYTES_AT_ONCE`]); a map written again from its start is read
    /// again from there.
    pub fn read_more(&mut self) -> io::Result<()> {
        let size = self.file.metadata()?.len().min(MOST_BYTES);
        if size < self.read || !self.same_head()? {
            self.read = 0;
            self.head.clear();
            self.names = JitNames::default();
            self.skipping = false;
        }
        let budget = MOST_BYTES_IN_ALL.saturating_sub(BYTES_READ_IN_ALL.load(std::sync::atomic::Ordering::Relaxed));
        let want = size.saturating_sub(self.read).min(MOST_BYTES_AT_ONCE).min(budget);
        if want == 0 {
            return Ok(());
        }
        let mut bytes = vec![0u8; want as usize];
        let got = self.file.read_at(&mut bytes, self.read)?;
        bytes.truncate(got);
        if self.read == 0 {
            self.head = bytes[..got.min(HEAD_BYTES)].to_vec();
        }
        let skipped = match (self.skipping, bytes.iter().position(|&b| b == b'\n')) {
            (false, _) => 0,
            (true, Some(end)) => {
                self.skipping = false;
                end + 1
            }
            (true, None) => got,
        };
        let taken = match self.names.add_lines(&bytes[skipped..]) {
            // No line's end in a line's most: not a line, skipped to its end.
            0 if got - skipped >= MOST_LINE_BYTES => {
                self.skipping = true;
                got - skipped
            }
            taken => taken,
        };
        // Only what was taken counts: a line still being written is read again.
        BYTES_READ_IN_ALL.fetch_add((skipped + taken) as u64, std::sync::atomic::Ordering::Relaxed);
        self.read += (skipped + taken) as u64;
        Ok(())
    }

    /// Whether the map still starts as it did when it was first read.
    fn same_head(&self) -> io::Result<bool> {
        let mut now = vec![0u8; self.head.len()];
        let got = self.file.read_at(&mut now, 0)?;
        Ok(got == now.len() && now == self.head)
    }

    /// The names read so far.
    pub fn names(&self) -> &JitNames {
        &self.names
    }
}

/// A map is read only as a regular file of one link that the program's
/// owner (the owner of its `/proc` directory, `owner`) or root owns.
fn checked(file: &File, owner: u32) -> io::Result<()> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the perf map is not a regular file of one link"));
    }
    if meta.uid() != owner && meta.uid() != 0 {
        let why = format!("the perf map is owned by uid {}, not by the program's owner (uid {owner}) or root", meta.uid());
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    }
    Ok(())
}

/// When process `pid` started, to the clock's tick: its start in ticks
/// since the boot (`/proc/PID/stat`) after the boot's time (`/proc/stat`).
fn started_at(pid: u32) -> Option<std::time::SystemTime> {
    let ticks = crate::procfs::start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_seconds: u64 = boot.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&hz| hz > 0)?;
    let since_boot = std::time::Duration::from_millis(ticks.saturating_mul(1000) / hz);
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(boot_seconds))?.checked_add(since_boot)
}

/// Process `pid`'s id in its own namespace of pids (the last of `NSpid`).
fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_ascii_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests;

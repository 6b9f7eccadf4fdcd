//! A file's DWARF, read once for each version of the file and kept for the
//! rest of the boot (a recording keeps it in `boot_cache::dir()`). Reading a large program's debug info (tens of
//! megabytes for a Rust program) is most of what a recording does before
//! the program starts, and the same build is usually recorded again and
//! again.
//!
//! What is kept is only what [`dwarf::read`] returns, under the version of
//! the file it was read from (device, inode, size, modification and change
//! times: a rebuilt, touched or replaced file is read afresh). It is kept
//! where only this user can write, and read back only
//! from a file this user owns that no one else may write, no larger than
//! what is kept; a file that does not decode, or whose ids point outside
//! its own tables, is read afresh and replaced.

use super::dwarf::{self, CompileUnit, DwarfInfo, FileTable, LineRow, Subprogram};
use super::elf::{ElfImage, FileVersion};
use crate::addr::VirtAddr;
use crate::error::Result;
use object::Object;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Changes whenever what is kept changes meaning.
const FORMAT: u32 = 1;

/// The largest file kept for one binary.
const MOST_FILE_BYTES: u64 = 64 << 20;

/// All files kept together: the oldest go past this.
const MOST_KEPT_BYTES: u64 = 128 << 20;

/// What a kept file was read from.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Key {
    format: u32,
    proftap: String,
    file: FileVersion,
    lines: bool,
}

#[derive(Serialize, Deserialize)]
struct Kept {
    key: Key,
    files: Vec<String>,
    subprograms: Vec<KeptSubprogram>,
    units: Vec<KeptUnit>,
    rows: Vec<KeptRow>,
    warnings: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct KeptSubprogram {
    ranges: Vec<(u64, u64)>,
    name: Option<String>,
    linkage_name: Option<String>,
    decl_file: Option<u32>,
    decl_line: u32,
}

#[derive(Serialize, Deserialize)]
struct KeptUnit {
    name: String,
    dwarf_version: u16,
    rows: (u64, u64),
}

#[derive(Serialize, Deserialize)]
struct KeptRow {
    address: u64,
    file: u32,
    line: u32,
    is_stmt: bool,
    end_sequence: bool,
}

/// [`dwarf::read`], from what was kept in `dir` of the same version of
/// `image` when there is, keeping what it reads there otherwise (no `dir`:
/// nothing kept).
pub(crate) fn read(
    dir: Option<&Path>,
    image: &ElfImage,
    files: &mut FileTable,
    want_lines: bool,
    warnings: &mut Vec<String>,
) -> Result<DwarfInfo> {
    let Some(path) = dir.and_then(|dir| kept_path(dir, image, want_lines)) else {
        return dwarf::read(image, files, want_lines, warnings);
    };
    let key = Key { format: FORMAT, proftap: env!("CARGO_PKG_VERSION").into(), file: image.version(), lines: want_lines };
    if let Some(info) = load(&path).filter(|kept| kept.key == key).and_then(|kept| kept.into_info(files, warnings)) {
        return Ok(info);
    }
    let mut read_warnings = Vec::new();
    let info = dwarf::read(image, files, want_lines, &mut read_warnings)?;
    keep(&path, Kept::of(key, &info, files, &read_warnings));
    warnings.extend(read_warnings);
    Ok(info)
}

/// Where `image`'s DWARF is kept, if it may be: not when it names a
/// supplementary file (`dwz`), whose version the key would not cover.
fn kept_path(dir: &Path, image: &ElfImage, lines: bool) -> Option<PathBuf> {
    let elf = image.parse().ok()?;
    if elf.gnu_debugaltlink().ok().flatten().is_some() {
        return None;
    }
    let version = image.version();
    let name = format!("{:x}-{:x}{}", version.device(), version.inode(), if lines { "-lines" } else { "" });
    Some(dir.join(name))
}

/// A kept file, if this user owns it, no one else may write it, and it decodes.
fn load(path: &Path) -> Option<Kept> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 || meta.len() > MOST_FILE_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MOST_FILE_BYTES).read_to_end(&mut bytes).ok()?;
    decode(&bytes)
}

/// A kept file's bytes decoded, if they are one.
fn decode(bytes: &[u8]) -> Option<Kept> {
    postcard::from_bytes(bytes).ok()
}

/// Writes `kept` at `path` (whole or not at all), then takes out the
/// oldest kept files past [`MOST_KEPT_BYTES`]. Failing to keep only costs
/// the next recording a read.
fn keep(path: &Path, kept: Kept) {
    let Ok(bytes) = postcard::to_stdvec(&kept) else { return };
    let Some(dir) = path.parent() else { return };
    if bytes.len() as u64 > MOST_FILE_BYTES || std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() {
        return;
    }
    if proftap_profile::write_private(path, |out| out.write_all(&bytes)).is_ok() {
        trim(dir, path, MOST_KEPT_BYTES);
    }
}

/// Removes the oldest files of `dir` (never `newest`) while they hold
/// more than `most_bytes` together.
fn trim(dir: &Path, newest: &Path, most_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut kept: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            meta.is_file().then(|| (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum();
    kept.sort();
    for (_, len, path) in kept {
        if total <= most_bytes {
            break;
        }
        if path != newest && std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

impl Kept {
    fn of(key: Key, info: &DwarfInfo, files: &FileTable, warnings: &[String]) -> Self {
        Kept {
            key,
            files: files.paths().to_vec(),
            subprograms: info
                .subprograms
                .iter()
                .map(|s| KeptSubprogram {
                    ranges: s.ranges.iter().map(|r| (r.start, r.end)).collect(),
                    name: s.name.clone(),
                    linkage_name: s.linkage_name.clone(),
                    decl_file: s.decl_file,
                    decl_line: s.decl_line,
                })
                .collect(),
            units: info
                .units
                .iter()
                .map(|u| KeptUnit { name: u.name.clone(), dwarf_version: u.dwarf_version, rows: (u.rows.start as u64, u.rows.end as u64) })
                .collect(),
            rows: info
                .rows
                .iter()
                .map(|r| KeptRow { address: r.address.0, file: r.file, line: r.line, is_stmt: r.is_stmt, end_sequence: r.end_sequence })
                .collect(),
            warnings: warnings.to_vec(),
        }
    }

    /// Whether every id and every unit's rows point inside what was kept.
    fn is_whole(&self) -> bool {
        let file = |id: u32| (id as usize) < self.files.len();
        self.subprograms.iter().all(|s| s.decl_file.is_none_or(file) && s.ranges.iter().all(|(start, end)| start <= end))
            && self.rows.iter().all(|r| file(r.file))
            && self.units.iter().all(|u| u.rows.0 <= u.rows.1 && u.rows.1 <= self.rows.len() as u64)
    }

    /// What was kept, its file ids interned in `files`; `None` (and
    /// nothing interned) unless it [`is_whole`](Self::is_whole).
    fn into_info(self, files: &mut FileTable, warnings: &mut Vec<String>) -> Option<DwarfInfo> {
        if !self.is_whole() {
            return None;
        }
        let ids: Vec<u32> = self.files.into_iter().map(|path| files.intern(path)).collect();
        let id = |kept: u32| ids.get(kept as usize).copied().unwrap_or_default();
        let subprograms = self
            .subprograms
            .into_iter()
            .map(|s| Subprogram {
                ranges: s.ranges.into_iter().map(|(start, end)| start..end).collect(),
                name: s.name,
                linkage_name: s.linkage_name,
                decl_file: s.decl_file.map(id),
                decl_line: s.decl_line,
            })
            .collect();
        let rows = self
            .rows
            .into_iter()
            .map(|r| LineRow {
                address: VirtAddr(r.address),
                file: id(r.file),
                line: r.line,
                is_stmt: r.is_stmt,
                end_sequence: r.end_sequence,
            })
            .collect();
        let units = self
            .units
            .into_iter()
            .map(|u| CompileUnit { name: u.name, dwarf_version: u.dwarf_version, rows: u.rows.0 as usize..u.rows.1 as usize })
            .collect();
        warnings.extend(self.warnings);
        Some(DwarfInfo { subprograms, units, rows })
    }
}

#[cfg(test)]
mod tests;

//! A file's DWARF and its symbol table's functions, read once for each
//! version of the file and kept for the rest of the boot (a recording
//! keeps them in `boot_cache::dir()`). Reading a large program's debug
//! info (tens of megabytes for a Rust program), and demangling a large C++
//! program's symbols (node's 150,000), is most of what a recording does
//! before the program starts, and the same build is usually recorded again
//! and again.
//!
//! What is kept is only what [`dwarf::read`] returns, or the functions one
//! of the file's symbol tables names (demangled: its own, or where it has
//! none its dynamic one; a debug file's own is kept as that file's), under the version of
//! the file it was read from (device, inode, size, modification and change
//! times, and its build-id: a rebuilt, touched or replaced file is read
//! afresh). It is kept where only this user can write, and read back only
//! from a file this user owns that no one else may write, no larger than
//! what is kept; a file that does not decode, or whose ids point outside
//! its own tables, is read afresh and replaced.

use super::dwarf::{self, CompileUnit, DwarfInfo, FileTable, LineRow, Subprogram};
use super::elf::{ElfImage, FileVersion};
use crate::addr::VirtAddr;
use crate::boot_cache;
use crate::error::Result;
use object::Object;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Changes whenever what is kept changes meaning.
const FORMAT: u32 = 3;

/// Changes with the code that reads the DWARF: what a build reading it
/// otherwise kept is not read back, whatever version it called itself.
const READER: u64 = boot_cache::fnv1a(include_bytes!("dwarf.rs"));

/// The same for the code that reads a symbol table and demangles its names
/// (the ELF reader's and the demanglers' versions in the lock file).
const SYMBOLS_READER: u64 = boot_cache::combined(&[
    boot_cache::fnv1a(include_bytes!("mod.rs")),
    boot_cache::fnv1a(include_bytes!("demangle.rs")),
    boot_cache::fnv1a(include_bytes!("elf.rs")),
    boot_cache::fnv1a(include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))),
]);

/// The largest file kept for one binary.
const MOST_FILE_BYTES: u64 = 64 << 20;

/// All files kept together: the least recently used go past this.
const MOST_KEPT_BYTES: u64 = 128 << 20;

/// What a kept file was read from.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Key {
    format: u32,
    proftap: String,
    reader: u64,
    file: FileVersion,
    build_id: Option<String>,
    lines: bool,
}

impl Key {
    fn of(image: &ElfImage, lines: bool) -> Key {
        Key::read_by(READER, image, lines)
    }

    fn read_by(reader: u64, image: &ElfImage, lines: bool) -> Key {
        Key {
            format: FORMAT,
            proftap: env!("CARGO_PKG_VERSION").into(),
            reader,
            file: image.version(),
            build_id: image.build_id().ok().flatten(),
            lines,
        }
    }
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
    die: Option<u64>,
    name: Option<String>,
    linkage_name: Option<String>,
    decl_file: Option<u32>,
    decl_line: u32,
}

/// A file's symbol table's functions, kept.
#[derive(Serialize, Deserialize)]
struct KeptSymbols {
    key: Key,
    functions: Vec<KeptFunction>,
}

/// A function a symbol table names, as kept (where its file maps it is
/// worked out again from the file's segments).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeptFunction {
    pub address: u64,
    pub size: u64,
    pub raw_name: String,
    pub name: String,
    pub base_name: Option<String>,
    pub aliases: Vec<String>,
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
/// nothing kept). `dir` is made if missing; it is used only if it is this
/// user's alone, in a directory no one else may write.
pub(crate) fn read(
    dir: Option<&Path>,
    image: &ElfImage,
    files: &mut FileTable,
    want_lines: bool,
    warnings: &mut Vec<String>,
) -> Result<DwarfInfo> {
    read_settled(dir, image, files, want_lines, warnings, boot_cache::SETTLED_NS)
}

/// [`read`], keeping only what was read of a file changed more than
/// `settled_ns` ago.
fn read_settled(
    dir: Option<&Path>,
    image: &ElfImage,
    files: &mut FileTable,
    want_lines: bool,
    warnings: &mut Vec<String>,
    settled_ns: i128,
) -> Result<DwarfInfo> {
    let Some(path) = dir.filter(|dir| boot_cache::private_dir(dir)).and_then(|dir| kept_path(dir, image, want_lines)) else {
        return dwarf::read(image, files, want_lines, warnings);
    };
    let key = Key::of(image, want_lines);
    if let Some(info) = load::<Kept>(&path).filter(|kept| kept.key == key).and_then(|kept| kept.into_info(files, warnings)) {
        return Ok(info);
    }
    let mut read_warnings = Vec::new();
    let info = dwarf::read(image, files, want_lines, &mut read_warnings)?;
    if boot_cache::settled(image.version().changed_ns(), settled_ns) {
        keep(&path, &Kept::of(key, &info, files, &read_warnings));
    }
    warnings.extend(read_warnings);
    Ok(info)
}

/// Which of an image's symbol tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymbolTable {
    /// Its own (`.symtab`).
    Own,
    /// The one its dynamic linking reads (`.dynsym`): all a stripped
    /// library (the C library as distributions ship it) has.
    Dynamic,
}

impl SymbolTable {
    /// What the name of a file keeping this table ends with.
    fn suffix(self) -> &'static str {
        match self {
            SymbolTable::Own => SYMBOLS_SUFFIX,
            SymbolTable::Dynamic => DYNAMIC_SYMBOLS_SUFFIX,
        }
    }
}

/// The functions `table` of `image` names: from what was kept in `dir`
/// of the same version of it when there is, else `read()` (which gives
/// none for a file without that table), kept there for the next read. As
/// [`read`], nothing is kept without `dir`.
pub(crate) fn symbol_table(
    dir: Option<&Path>,
    image: &ElfImage,
    table: SymbolTable,
    read: impl FnOnce() -> Vec<KeptFunction>,
) -> Vec<KeptFunction> {
    symbol_table_settled(dir, image, table, read, boot_cache::SETTLED_NS)
}

/// [`symbol_table`], keeping only what was read of a file changed more
/// than `settled_ns` ago.
fn symbol_table_settled(
    dir: Option<&Path>,
    image: &ElfImage,
    table: SymbolTable,
    read: impl FnOnce() -> Vec<KeptFunction>,
    settled_ns: i128,
) -> Vec<KeptFunction> {
    let Some(dir) = dir.filter(|dir| boot_cache::private_dir(dir)) else { return read() };
    let path = dir.join(format!("{}{}", boot_cache::file_name(&image.version()), table.suffix()));
    let key = Key::read_by(SYMBOLS_READER, image, false);
    if let Some(kept) = load::<KeptSymbols>(&path).filter(|kept| kept.key == key) {
        return kept.functions;
    }
    let functions = read();
    if functions.is_empty() || !boot_cache::settled(image.version().changed_ns(), settled_ns) {
        return functions;
    }
    let kept = KeptSymbols { key, functions };
    keep(&path, &kept);
    kept.functions
}

/// What the name of a file of a kept symbol table ends with.
const SYMBOLS_SUFFIX: &str = "-symbols";
/// What the name of a file of a kept dynamic symbol table ends with.
const DYNAMIC_SYMBOLS_SUFFIX: &str = "-dynsym";

/// Where `image`'s DWARF is kept, if it may be: not when it names a
/// supplementary file (`dwz`), whose version the key would not cover.
fn kept_path(dir: &Path, image: &ElfImage, lines: bool) -> Option<PathBuf> {
    let elf = image.parse().ok()?;
    if elf.gnu_debugaltlink().ok().flatten().is_some() {
        return None;
    }
    let version = image.version();
    let name = format!("{}{}", boot_cache::file_name(&version), if lines { "-lines" } else { "" });
    Some(dir.join(name))
}

/// Whether `name` is one [`kept_path`] or [`symbol_table`] gives.
fn is_kept_name(name: &str) -> bool {
    let suffixes = ["-lines", SYMBOLS_SUFFIX, DYNAMIC_SYMBOLS_SUFFIX];
    let file = suffixes.iter().find_map(|suffix| name.strip_suffix(suffix)).unwrap_or(name);
    boot_cache::is_file_name(file)
}

/// A kept file, if this user owns it, no one else may write it, and it decodes.
fn load<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    postcard::from_bytes(&boot_cache::read_private(path, MOST_FILE_BYTES)?).ok()
}

/// A kept file's bytes decoded, if they are one.
fn decode(bytes: &[u8]) -> Option<Kept> {
    postcard::from_bytes(bytes).ok()
}

/// What a recording does with a kept file's `bytes`, its key aside:
/// decoded (as DWARF, and as a symbol table) and checked; whether they
/// would be used.
pub fn kept_file_is_used(bytes: &[u8]) -> bool {
    let symbols = postcard::from_bytes::<KeptSymbols>(bytes).ok().is_some_and(|kept| {
        let functions = kept.functions.into_iter().map(|f| super::Function::named_in_symbols(f, super::SymbolOrigin::Symtab, &[]));
        functions.count() > 0
    });
    decode(bytes).and_then(|kept| kept.into_info(&mut FileTable::default(), &mut Vec::new())).is_some() || symbols
}

/// Writes `kept` at `path`, within the bounds of one file and of all.
fn keep<T: Serialize>(path: &Path, kept: &T) {
    let Ok(bytes) = postcard::to_stdvec(kept) else { return };
    if bytes.len() as u64 <= MOST_FILE_BYTES {
        boot_cache::keep(path, &bytes, MOST_KEPT_BYTES, is_kept_name);
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
                    die: s.die,
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
                die: s.die,
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

//! Finding the DWARF of a binary where users keep it: in the file itself, in a
//! separate file named by build-id, or one named by `.gnu_debuglink`; failing
//! those, from debuginfod servers (`debuginfod.rs`).

use super::elf::ElfImage;
use object::{Object, ObjectSection};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Where a binary's debug info came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DebugSource {
    /// `.debug_info` is in the binary itself.
    Embedded {
        /// Whether the sections are compressed (`SHF_COMPRESSED` or `.zdebug`).
        compressed: bool,
    },
    /// A separate file found through the build-id.
    BuildId {
        /// The debug file.
        path: PathBuf,
    },
    /// A separate file found through `.gnu_debuglink`.
    DebugLink {
        /// The debug file.
        path: PathBuf,
    },
    /// A file by build-id from the debuginfod cache, downloaded by this
    /// reading or an earlier one (proftap's, gdb's, perf's).
    Debuginfod {
        /// The debug file, in the cache.
        path: PathBuf,
        /// The server it came from now; `None` when the cache had it.
        #[serde(skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    /// No debug info was found.
    Missing,
}

impl DebugSource {
    /// The file that holds the debug info, for a binary opened at `binary`.
    pub fn file(&self, binary: &Path) -> Option<PathBuf> {
        match self {
            DebugSource::Embedded { .. } => Some(binary.to_path_buf()),
            DebugSource::BuildId { path } | DebugSource::DebugLink { path } | DebugSource::Debuginfod { path, .. } => Some(path.clone()),
            DebugSource::Missing => None,
        }
    }
}

/// Directories searched for separate debug info, as gdb's `debug-file-directory`.
#[derive(Clone, Debug)]
pub struct DebugDirs(pub Vec<PathBuf>);

impl Default for DebugDirs {
    fn default() -> Self {
        DebugDirs(vec![PathBuf::from("/usr/lib/debug")])
    }
}

impl DebugDirs {
    /// The directories `asked` for, or the default where none were.
    pub fn asked_or_default(asked: &[PathBuf]) -> Self {
        if asked.is_empty() { DebugDirs::default() } else { DebugDirs(asked.to_vec()) }
    }
}

/// Whether `image` carries DWARF itself, and whether it is compressed.
pub(crate) fn embedded_dwarf(image: &ElfImage) -> Option<bool> {
    let elf = image.parse().ok()?;
    let section = elf.section_by_name(".debug_info").or_else(|| elf.section_by_name(".zdebug_info"))?;
    // A file made by `objcopy --only-keep-debug` keeps the code sections as
    // NOBITS; the binary left behind may keep a NOBITS .debug_info: no data.
    section.file_range().filter(|&(_, size)| size > 0)?;
    let compressed = section.compressed_file_range().is_ok_and(|c| c.format != object::CompressionFormat::None);
    Some(compressed)
}

/// Looks for the debug file of `image`; returns it, where it came from, and
/// warnings about candidates that were found but rejected.
pub(crate) fn find_separate(image: &ElfImage, dirs: &DebugDirs, warnings: &mut Vec<String>) -> Option<(ElfImage, DebugSource)> {
    let build_id = image.build_id().ok().flatten();
    if let Some(id) = &build_id.as_ref().filter(|id| id.len() > 2) {
        for dir in &dirs.0 {
            let candidate = dir.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
            if let Some(debug) = open_build_id_file(&candidate, id, image.path(), warnings) {
                return Some((debug, DebugSource::BuildId { path: candidate }));
            }
        }
    }
    let (name, crc) = image.debuglink().ok().flatten()?;
    let binary_dir = image.path().parent().unwrap_or(Path::new("/"));
    let canonical_dir = binary_dir.canonicalize().unwrap_or_else(|_| binary_dir.to_path_buf());
    let mut candidates = vec![binary_dir.join(&name), binary_dir.join(".debug").join(&name)];
    for dir in &dirs.0 {
        candidates.push(dir.join(canonical_dir.strip_prefix("/").unwrap_or(&canonical_dir)).join(&name));
    }
    for candidate in candidates {
        if same_file(&candidate, image.path()) {
            continue;
        }
        let Some(debug) = open_debug_file(&candidate, warnings) else { continue };
        if crc32fast::hash(debug.data()) != crc {
            warnings.push(format!(
                "ignored {}: its CRC does not match the .gnu_debuglink of {} (a debug file of another build?)",
                candidate.display(),
                image.path().display()
            ));
            continue;
        }
        return Some((debug, DebugSource::DebugLink { path: candidate }));
    }
    None
}

/// The debug file at `path` if it has DWARF and the build-id `id` of `binary`.
pub(crate) fn open_build_id_file(path: &Path, id: &str, binary: &Path, warnings: &mut Vec<String>) -> Option<ElfImage> {
    let debug = open_debug_file(path, warnings)?;
    match debug.build_id().ok().flatten() {
        Some(found) if found == id => Some(debug),
        Some(found) => {
            warnings.push(format!("ignored {}: its build-id {found} does not match {}'s {id}", path.display(), binary.display()));
            None
        }
        None => {
            warnings.push(format!("ignored {}: it has no build-id, and {} has {id}", path.display(), binary.display()));
            None
        }
    }
}

fn open_debug_file(path: &Path, warnings: &mut Vec<String>) -> Option<ElfImage> {
    if !path.is_file() {
        return None;
    }
    match ElfImage::open(path) {
        Ok(image) if embedded_dwarf(&image).is_some() => Some(image),
        Ok(_) => {
            warnings.push(format!("ignored {}: it holds no .debug_info", path.display()));
            None
        }
        Err(e) => {
            warnings.push(format!("ignored debug file: {e}"));
            None
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

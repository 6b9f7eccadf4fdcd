//! One ELF file mapped into memory, and the facts about it that need the
//! program headers: loadable segments, file offsets, PIE, build-id.

use crate::addr::{FileOffset, VirtAddr};
use crate::error::{Error, Result};
use memmap2::Mmap;
use object::elf;
use object::read::elf::{Dyn as _, ElfFile64, FileHeader as _, ProgramHeader as _};
use object::{Endianness, Object, ObjectSegment, ObjectSymbol};
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What kind of ELF object a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ElfKind {
    /// A fixed-address executable (`ET_EXEC`).
    Executable,
    /// A position-independent executable (`ET_DYN` with `DF_1_PIE` or an interpreter).
    PieExecutable,
    /// A shared library (`ET_DYN`).
    SharedLibrary,
    /// A relocatable object or anything else that is not loaded as is.
    Other,
}

impl std::fmt::Display for ElfKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ElfKind::Executable => "executable",
            ElfKind::PieExecutable => "PIE executable",
            ElfKind::SharedLibrary => "shared library",
            ElfKind::Other => "ELF object",
        })
    }
}

/// A loadable segment (`PT_LOAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where the segment starts in the ELF's virtual address space.
    pub vaddr: VirtAddr,
    /// Its size in memory.
    pub mem_size: u64,
    /// Where its bytes start in the file.
    pub offset: FileOffset,
    /// How many of its bytes are in the file.
    pub file_size: u64,
    /// Whether it is mapped executable.
    pub executable: bool,
}

/// A mapped ELF file. Parsing is cheap, so views are made on demand.
pub struct ElfImage {
    path: PathBuf,
    map: Mmap,
    version: FileVersion,
}

/// Which file, and which version of it, an image was mapped from: its
/// device and inode, size, and times of change. Any write, rename over or
/// `touch` changes one of them (the change time cannot be set back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileVersion {
    device: u64,
    inode: u64,
    size: u64,
    modified_ns: i128,
    changed_ns: i128,
}

impl FileVersion {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, ns: i64| i128::from(s) * 1_000_000_000 + i128::from(ns);
        FileVersion {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            modified_ns: ns(meta.mtime(), meta.mtime_nsec()),
            changed_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The device the file is on.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// The file's inode on its device.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// When the file last changed (its inode), nanoseconds since 1970.
    pub fn changed_ns(&self) -> i128 {
        self.changed_ns
    }
}

/// A section's bytes: in the mapped file, or decompressed. Clones share
/// them, and they stay where they are while a clone lives: the file stays
/// mapped (one overwritten in place, not replaced, while mapped faults
/// here, as it does in the program), and what was decompressed is kept
/// once. A large program's code or debug info is not copied for each
/// reader.
#[derive(Clone)]
pub enum SectionBytes {
    /// A range of the mapped file.
    InFile(Arc<ElfImage>, std::ops::Range<usize>),
    /// A compressed section, decompressed.
    Decompressed(Arc<[u8]>),
}

impl SectionBytes {
    /// The bytes of `section` of `image`: decompressed where compressed,
    /// as far as compression can expand them (a hostile header cannot make
    /// proftap allocate gigabytes); none where the file holds none.
    pub fn of_section(
        image: &Arc<ElfImage>,
        section: &object::read::elf::ElfSection64<'_, '_, Endianness>,
    ) -> std::result::Result<Self, String> {
        use object::ObjectSection;
        let compressed = section.compressed_file_range().map_err(|e| e.to_string())?;
        if compressed.format != object::CompressionFormat::None {
            let bytes = super::dwarf::section_data(section.name().unwrap_or("?"), section)?;
            return Ok(SectionBytes::Decompressed(bytes.into_owned().into()));
        }
        let Some((offset, size)) = section.file_range() else { return Ok(SectionBytes::default()) };
        let start = usize::try_from(offset).map_err(|e| e.to_string())?;
        let end = usize::try_from(size).ok().and_then(|size| start.checked_add(size)).filter(|&end| end <= image.data().len());
        let end = end.ok_or_else(|| format!("section {} reaches past the end of the file", section.name().unwrap_or("?")))?;
        Ok(SectionBytes::InFile(image.clone(), start..end))
    }
}

/// No bytes (what a reader of a section a file lacks reads).
impl Default for SectionBytes {
    fn default() -> Self {
        SectionBytes::Decompressed(Arc::from([]))
    }
}

impl std::ops::Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SectionBytes::InFile(image, range) => image.data().get(range.clone()).unwrap_or_default(),
            SectionBytes::Decompressed(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for SectionBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SectionBytes({} bytes)", self.len())
    }
}

// SAFETY: the bytes a `SectionBytes` derefs to are in a mapping or an
// allocation that its `Arc` keeps, at the same address for as long as
// any clone lives; moving or cloning the value never moves them.
unsafe impl stable_deref_trait::StableDeref for SectionBytes {}
// SAFETY: as above: a clone derefs to the very same bytes.
unsafe impl stable_deref_trait::CloneStableDeref for SectionBytes {}

impl ElfImage {
    /// Maps `path` and checks that it is a 64-bit ELF file proftap can read.
    pub fn open(path: &Path) -> Result<Self> {
        let (file, meta) = open_regular(path)?;
        let not_elf = |reason: &str| Error::NotElf { path: path.into(), reason: reason.into() };
        if meta.len() == 0 {
            return Err(not_elf("the file is empty"));
        }
        // SAFETY: the mapping is read-only; a file truncated underneath us is
        // the same hazard every symbolizer (nm, gdb, perf) accepts.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        if !map.starts_with(b"\x7fELF") {
            return Err(not_elf("it does not start with the ELF magic number"));
        }
        let image = ElfImage { path: path.into(), map, version: FileVersion::of(&meta) };
        let parsed = image.parse()?;
        match parsed.architecture() {
            object::Architecture::X86_64 | object::Architecture::Aarch64 => {}
            other => {
                return Err(Error::Unsupported { path: path.into(), what: format!("{other:?}") });
            }
        }
        if !parsed.is_little_endian() {
            return Err(Error::Unsupported { path: path.into(), what: "big-endian".into() });
        }
        Ok(image)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version of the file mapped.
    pub fn version(&self) -> FileVersion {
        self.version
    }

    /// The raw bytes of the file.
    pub fn data(&self) -> &[u8] {
        &self.map
    }

    /// The parsed object.
    pub fn parse(&self) -> Result<ElfFile64<'_, Endianness>> {
        ElfFile64::parse(&*self.map).map_err(|e| {
            let reason = if self.map.get(4) == Some(&1) {
                "it is a 32-bit ELF file".to_string()
            } else {
                format!("{e}, the file may be truncated or damaged")
            };
            Error::NotElf { path: self.path.clone(), reason }
        })
    }

    /// The functions it imports from shared libraries (undefined dynamic symbols).
    pub fn imports(&self) -> Result<Vec<String>> {
        Ok(self
            .parse()?
            .dynamic_symbols()
            .filter(|s| s.is_undefined())
            .filter_map(|s| s.name().ok().filter(|n| !n.is_empty()).map(str::to_string))
            .collect())
    }

    /// Loadable segments in file order.
    pub fn segments(&self) -> Result<Vec<Segment>> {
        let elf = self.parse()?;
        Ok(elf
            .segments()
            .filter_map(|seg| {
                let header = seg.elf_program_header();
                let endian = elf.endian();
                if header.p_type(endian) != elf::PT_LOAD {
                    return None;
                }
                let (offset, file_size) = seg.file_range();
                Some(Segment {
                    vaddr: VirtAddr(seg.address()),
                    mem_size: seg.size(),
                    offset: FileOffset(offset),
                    file_size,
                    executable: header.p_flags(endian).contains(elf::PF_X),
                })
            })
            .collect())
    }

    /// What kind of object this is.
    pub fn kind(&self) -> Result<ElfKind> {
        let elf = self.parse()?;
        let endian = elf.endian();
        let header = elf.elf_header();
        Ok(match header.e_type(endian) {
            elf::ET_EXEC => ElfKind::Executable,
            elf::ET_DYN => {
                let data = self.data();
                let mut has_interp = false;
                let mut pie_flag = false;
                for ph in elf.elf_program_headers() {
                    match ph.p_type(endian) {
                        elf::PT_INTERP => has_interp = true,
                        elf::PT_DYNAMIC => {
                            if let Ok(Some(dyns)) = ph.dynamic(endian, data) {
                                pie_flag |=
                                    dyns.iter().any(|d| d.d_tag(endian) == elf::DT_FLAGS_1 && d.d_val(endian) & elf::DF_1_PIE.0 != 0);
                            }
                        }
                        _ => {}
                    }
                }
                if pie_flag || has_interp { ElfKind::PieExecutable } else { ElfKind::SharedLibrary }
            }
            _ => ElfKind::Other,
        })
    }

    /// The GNU build-id as lower-case hex.
    pub fn build_id(&self) -> Result<Option<String>> {
        let elf = self.parse()?;
        Ok(elf.build_id().ok().flatten().map(hex))
    }

    /// The `.gnu_debuglink` file name and CRC.
    pub fn debuglink(&self) -> Result<Option<(String, u32)>> {
        let elf = self.parse()?;
        Ok(elf.gnu_debuglink().ok().flatten().map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc)))
    }
}

/// Opens `path` for reading only if it is a regular file. The file named by a
/// program, a debug link or a dwz link may be a FIFO or a device: opening
/// without blocking and checking the type before any read keeps a hostile
/// name from stalling or feeding the reader.
fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok((file, meta));
    } else if kind.is_dir() {
        return Err(Error::IsDirectory { path: path.into() });
    } else if kind.is_fifo() {
        "named pipe (FIFO)"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "device"
    } else {
        "special file"
    };
    Err(Error::NotRegular { path: path.into(), what })
}

/// The file offset of `addr` through the segments that hold file bytes, or
/// `None` when no segment maps it from the file (e.g. `.bss`).
/// Checked arithmetic: a damaged program header can put a segment at the top
/// of the address space.
pub fn file_offset(segments: &[Segment], addr: VirtAddr) -> Option<FileOffset> {
    segments.iter().find_map(|s| {
        let into = addr.0.checked_sub(s.vaddr.0).filter(|&into| into < s.file_size)?;
        s.offset.0.checked_add(into).map(FileOffset)
    })
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_offset_goes_through_the_segment_that_holds_the_address() {
        let segs = [
            Segment { vaddr: VirtAddr(0), mem_size: 0x600, offset: FileOffset(0), file_size: 0x600, executable: false },
            Segment { vaddr: VirtAddr(0x1000), mem_size: 0x200, offset: FileOffset(0x1000), file_size: 0x200, executable: true },
            Segment { vaddr: VirtAddr(0x3df0), mem_size: 0x300, offset: FileOffset(0x2df0), file_size: 0x100, executable: false },
        ];
        assert_eq!(file_offset(&segs, VirtAddr(0x1139)), Some(FileOffset(0x1139)));
        assert_eq!(file_offset(&segs, VirtAddr(0x3e00)), Some(FileOffset(0x2e00)));
        // In memory but not in the file (.bss): no offset.
        assert_eq!(file_offset(&segs, VirtAddr(0x3f00)), None);
        assert_eq!(file_offset(&segs, VirtAddr(0x900)), None);
    }

    #[test]
    fn file_offset_of_segments_at_the_end_of_the_address_space_does_not_overflow() {
        let top = Segment {
            vaddr: VirtAddr(u64::MAX - 0x10),
            mem_size: 0x100,
            offset: FileOffset(u64::MAX - 1),
            file_size: 0x100,
            executable: true,
        };
        assert_eq!(file_offset(&[top], VirtAddr(u64::MAX - 0x10)), Some(FileOffset(u64::MAX - 1)));
        assert_eq!(file_offset(&[top], VirtAddr(u64::MAX)), None);
        assert_eq!(file_offset(&[top], VirtAddr(0)), None);
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("program");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        // A blocking open would wait here forever: no one writes to the FIFO.
        let Err(err) = ElfImage::open(&fifo) else { panic!("a FIFO opened as an ELF file") };
        assert!(matches!(err, Error::NotRegular { what: "named pipe (FIFO)", .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("{} is a named pipe (FIFO), not an executable or shared library; give a regular file", fifo.display())
        );
    }

    #[test]
    fn devices_and_directories_are_refused() {
        assert!(matches!(ElfImage::open(Path::new("/dev/zero")), Err(Error::NotRegular { what: "device", .. })));
        assert!(matches!(ElfImage::open(Path::new("/")), Err(Error::IsDirectory { .. })));
    }

    #[test]
    fn hex_is_lower_case_and_zero_padded() {
        assert_eq!(hex(&[0x0a, 0xff, 0x00]), "0aff00");
    }
}

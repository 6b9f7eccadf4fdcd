//! Turning stack samples into named stacks: each process's executable
//! mappings (from mmap records), DWARF CFI unwinding of the copied user
//! stack with framehop, and symbols with inlined frames and lines. Counting
//! the stacks is the recorder's.

use crate::inject::patcher::CountingStub;
use crate::inject::totals::{RoutineCall, words_pushed};
use crate::symbols::{
    ElfImage, FrameReader, KERNEL_IMAGE, KernelSymbols, PerfMap, PerfMapPlace, SectionBytes, Segment, SymbolCache, SymbolIndex,
    demangle_name,
};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection};
use proftap_profile::SampledFrame;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A stack sample.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StackSample {
    /// When.
    pub time: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Instruction pointer, stack pointer, frame pointer.
    pub regs: [u64; 3],
    /// The top of the user stack, from the stack pointer up.
    pub stack: Vec<u8>,
    /// Taken while the thread was in the kernel (a system call, a fault, or
    /// a probe being handled); the registers are the user's at that moment.
    pub in_kernel: bool,
    /// Where in the kernel it was taken (0: in user code, or unknown).
    /// Only the function's name goes on into the profile, named here
    /// from the kernel's symbols as this process may see them.
    #[serde(default)]
    pub kernel_ip: u64,
    /// The in-process engine's return addresses of the thread by stack
    /// slot, read as the sample was: those its site trampolines stand for,
    /// and those of its frames that began before it was taken.
    #[serde(default)]
    pub returns: Vec<(u64, u64)>,
}

/// The deepest stack followed.
const MAX_DEPTH: usize = 512;
/// The frame a sample taken in the probes' own code ends with (the kernel's
/// uprobe area, or the in-process engine's code).
pub const PROBE_OVERHEAD_FRAME: &str = "[probe overhead]";
/// The module of that frame in the in-process engine's code (in the
/// kernel's probe area, it has none).
pub const ENGINE_MODULE: &str = "[proftap]";
/// The frame a sample taken where the in-process engine's runtime makes a
/// forked child's memory ends with (in [`ENGINE_MODULE`]): time each
/// child takes once, not the probes' cost per call.
pub const FORK_FRAME: &str = "[following a fork]";
/// The frame of a sample taken in the kernel when its functions cannot be named.
pub const KERNEL_FRAME: &str = "[kernel]";
/// What ends the name of a kernel function's frame.
pub const KERNEL_SUFFIX: &str = "_[k]";
/// Bytes of a page: mappings start on one.
const PAGE_BYTES: u64 = 4096;
/// Bytes of stack the runtime's frames take at most, from a sample's stack
/// pointer to the return address of its routine.
const RUNTIME_FRAME_BYTES: usize = 1024;

/// An executable mapping of a process.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    pgoff: u64,
    module: usize,
}

/// What proftap knows of one module (an executable or a library).
struct ModuleInfo {
    path: String,
    symbols: Option<Arc<SymbolIndex>>,
    /// Where its file is opened.
    open: PathBuf,
    /// Whether its inlined frames and lines are read.
    with_lines: bool,
    /// Its debug info, for inlined frames and lines: read at the first
    /// sample in the module.
    frames: std::cell::OnceCell<Option<(FrameReader, Arc<SymbolIndex>)>>,
    /// Its symbol index and debug info being read ahead, waited for rather
    /// than read twice.
    ahead: std::cell::Cell<Option<FramesAhead>>,
    unwind: Option<Arc<UnwindSections>>,
    /// Why its frames cannot be named, when they cannot.
    unknown: Option<String>,
}

/// `mappings` with `start..end` mapped anew over them: what each had
/// there goes, what it had on either side stays. The kernel tells of a
/// change of protection of part of a mapping (`mprotect`, as a JIT or a
/// patcher does on a page of code) as a new mapping of that part alone.
fn covered_in_part(mappings: Vec<Mapping>, start: u64, end: u64) -> Vec<Mapping> {
    let mut kept = Vec::with_capacity(mappings.len() + 1);
    for m in mappings {
        if m.end <= start || m.start >= end {
            kept.push(m);
            continue;
        }
        if m.start < start {
            kept.push(Mapping { end: start, ..m.clone() });
        }
        if m.end > end {
            kept.push(Mapping { start: end, pgoff: m.pgoff.saturating_add(end - m.start), ..m });
        }
    }
    kept
}

/// Whether process `pid` runs a 64-bit executable (its vDSO is then the
/// kernel's 64-bit one, proftap's own).
fn runs_64_bit_code(pid: u32) -> bool {
    use std::io::Read;
    let mut ident = [0u8; 5];
    std::fs::File::open(format!("/proc/{pid}/exe")).and_then(|mut exe| exe.read_exact(&mut ident)).is_ok()
        && ident == [0x7f, b'E', b'L', b'F', 2]
}

/// The device and inode of the file at `path`: one file, under any name.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The sections framehop unwinds with.
struct UnwindSections {
    text: Option<(std::ops::Range<u64>, SectionBytes)>,
    eh_frame: Option<(std::ops::Range<u64>, SectionBytes)>,
    eh_frame_hdr: Option<(std::ops::Range<u64>, SectionBytes)>,
    got: Option<std::ops::Range<u64>>,
    debug_frame: Option<SectionBytes>,
    segments: Vec<crate::symbols::Segment>,
}

/// Where each function of a launched program is described in its DWARF
/// (read into the symbol cache), and its debug info opened for its frames,
/// on a thread of its own: its samples need them from the first, and
/// sampling alone reads only its symbol table before it runs (for a large
/// program, milliseconds the sampler would take beside the program).
pub struct FramesAhead {
    file: (u64, u64),
    reader: std::thread::JoinHandle<Option<(FrameReader, Arc<SymbolIndex>)>>,
}

impl FramesAhead {
    /// Starts reading the full symbol index of the program at `path`, and
    /// opening its debug info for its frames.
    pub fn start(symbols: &Arc<SymbolCache>, path: &Path) -> Option<FramesAhead> {
        let file = file_identity(path)?;
        let (symbols, path) = (symbols.clone(), path.to_path_buf());
        let read = move || {
            let index = symbols.index(&path, &path, false).ok()?;
            let reader = FrameReader::open(&index.debug.file(&path)?)?;
            reader.read_ahead();
            Some((reader, index))
        };
        let reader = std::thread::Builder::new().name("proftap-frames".into()).spawn(read).ok()?;
        Some(FramesAhead { file, reader })
    }
}

impl ModuleInfo {
    /// What proftap knows of module `path`, opened at `open`; its debug info
    /// read for inlined frames and lines when `with_lines`.
    fn load(path: &str, open: &Path, cache: &SymbolCache, with_lines: bool, ahead: &mut Vec<FramesAhead>) -> ModuleInfo {
        let symbols = cache.names(Path::new(path), open).ok();
        let unknown = match &symbols {
            None => Some(format!("no symbols in {path}")),
            Some(_) => None,
        };
        let unwind = cache.image(Path::new(path), open).ok().and_then(|image| unwind_sections(&image)).map(Arc::new);
        let file = file_identity(open);
        let ahead = ahead.iter().position(|a| Some(a.file) == file).map(|i| ahead.swap_remove(i));
        let (open, frames, ahead) = (open.to_path_buf(), std::cell::OnceCell::new(), std::cell::Cell::new(ahead));
        ModuleInfo { path: path.to_string(), symbols, open, with_lines, frames, ahead, unwind, unknown }
    }

    /// Its debug info's reader and the symbol index that says where each of
    /// its functions is described, read the first time it is asked for
    /// (the index is usually the one the recording read already).
    fn frames(&self, cache: &SymbolCache) -> Option<&(FrameReader, Arc<SymbolIndex>)> {
        self.frames
            .get_or_init(|| {
                if !self.with_lines {
                    return None;
                }
                let ahead = self.ahead.take().and_then(|ahead| ahead.reader.join().ok().flatten());
                if ahead.is_some() {
                    return ahead;
                }
                let index = cache.index(Path::new(&self.path), &self.open, false).ok()?;
                let reader = FrameReader::open(&index.debug.file(&self.open)?)?;
                Some((reader, index))
            })
            .as_ref()
    }

    /// Whether `vaddr` is in a signal restorer (where a signal handler
    /// returns to the code it interrupted), past its end (a sample taken in
    /// its system call), or the byte before it (a return address looked
    /// up one byte back).
    fn returns_from_a_signal(&self, vaddr: u64) -> bool {
        let Some((range, bytes)) = self.unwind.as_ref().and_then(|u| u.text.as_ref()) else { return false };
        let code_at = |at: u64| {
            let start = at.checked_sub(range.start).and_then(|o| usize::try_from(o).ok());
            start.and_then(|s| bytes.get(s..s.checked_add(SIGNAL_RETURN.len())?)) == Some(&SIGNAL_RETURN[..])
        };
        // The restorer starts from the byte after `vaddr` to its length back.
        (0..=SIGNAL_RETURN.len() as u64 + 1).any(|back| vaddr.wrapping_add(1).checked_sub(back).is_some_and(code_at))
    }

    /// The ELF virtual address of file offset `offset`.
    fn vaddr(&self, offset: u64) -> Option<u64> {
        file_vaddr(&self.unwind.as_ref()?.segments, offset)
    }

    /// The ELF virtual address where a mapping of the file's code from
    /// page offset `pgoff` starts (see [`code_mapping_vaddr`]).
    fn mapping_vaddr(&self, pgoff: u64) -> Option<u64> {
        code_mapping_vaddr(&self.unwind.as_ref()?.segments, pgoff)
    }
}

/// The ELF virtual address where a mapping of a file's code from page
/// offset `pgoff` starts: that of the segment the kernel mapped there. A
/// segment may start mid-page, its first page shared with the end of the
/// one before (lld lays out Rust programs so): the mapping of its first
/// page is its own, not the earlier segment's that also holds that file
/// offset. A mapping that starts inside the code's segment (a page split
/// off by a change of its rights) is that segment's, even on the page
/// where the next one starts.
fn code_mapping_vaddr(segments: &[Segment], pgoff: u64) -> Option<u64> {
    let first_page = |s: &&Segment| s.offset.0 & !(PAGE_BYTES - 1) == pgoff;
    let code_holding = |s: &&Segment| s.executable && s.offset.0 & !(PAGE_BYTES - 1) <= pgoff && pgoff < s.offset.0 + s.file_size;
    let starting = segments.iter().find(code_holding).or_else(|| segments.iter().filter(first_page).max_by_key(|s| s.executable));
    match starting {
        Some(s) => Some(pgoff.wrapping_sub(s.offset.0).wrapping_add(s.vaddr.0)),
        None => file_vaddr(segments, pgoff),
    }
}

/// The ELF virtual address of file offset `offset`, in `segments`.
fn file_vaddr(segments: &[Segment], offset: u64) -> Option<u64> {
    let s = segments.iter().find(|s| offset >= s.offset.0 && offset < s.offset.0 + s.file_size)?;
    Some(offset - s.offset.0 + s.vaddr.0)
}

fn unwind_sections(image: &Arc<ElfImage>) -> Option<UnwindSections> {
    let elf = image.parse().ok()?;
    let section = |name: &str| -> Option<(std::ops::Range<u64>, SectionBytes)> {
        let s = elf.section_by_name(name)?;
        let data = SectionBytes::of_section(image, &s).ok()?;
        Some((s.address()..s.address() + s.size(), data))
    };
    Some(UnwindSections {
        text: section(".text"),
        eh_frame: section(".eh_frame"),
        eh_frame_hdr: section(".eh_frame_hdr"),
        got: elf.section_by_name(".got").map(|s| s.address()..s.address() + s.size()),
        debug_frame: section(".debug_frame").map(|(_, d)| d),
        segments: image.segments().ok()?,
    })
}

/// `mov $15, %rax; syscall` (`rt_sigreturn`): the C libraries' signal
/// restorers, which a handler returns to. glibc's (`__restore_rt`) has no
/// dynamic symbol; gdb names its frame as this does.
const SIGNAL_RETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
const SIGNAL_RETURN_FRAME: &str = "[signal handler called]";

/// The registers of the code a signal interrupted, from the signal's frame
/// at `sp` (where its handler returned to the restorer: the `ucontext_t`,
/// whose `uc_mcontext` holds r8 to r15, rdi, rsi, rbp, rbx, rdx, rax,
/// rcx, rsp, rip from byte 40).
fn interrupted(sp: u64, read_stack: &mut impl FnMut(u64) -> Result<u64, ()>) -> Option<UnwindRegsX86_64> {
    const GREGS: u64 = 40;
    let register = |read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>, index: u64| read_stack(sp.checked_add(GREGS + 8 * index)?).ok();
    let (bp, sp, ip) = (register(read_stack, 10)?, register(read_stack, 15)?, register(read_stack, 16)?);
    Some(UnwindRegsX86_64::new(ip, sp, bp))
}

/// The module mapped at `address` in `mappings` (sorted), and the address's
/// ELF virtual address in it.
fn module_at<'m>(mappings: &[Mapping], modules: &'m [ModuleInfo], address: u64) -> Option<(&'m ModuleInfo, u64)> {
    let m = &mappings[mappings.partition_point(|m| m.start <= address).checked_sub(1)?];
    let info = modules.get(m.module).filter(|_| address < m.end)?;
    Some((info, info.vaddr(address - m.start + m.pgoff)?))
}

/// A process's address space and its unwinder.
#[derive(Default)]
struct Process {
    mappings: Vec<Mapping>,
    /// Where the kernel's return-probe trampoline is (`[uprobes]`).
    trampoline: Option<(u64, u64)>,
    /// Where the in-process engine's code is.
    engine_code: Vec<std::ops::Range<u64>>,
    /// Where in it the runtime makes a forked child's memory.
    fork_code: Vec<std::ops::Range<u64>>,
    /// From each address of its counting stubs on, the original address it
    /// stands for (0: none), by address.
    origins: Vec<(u64, u64)>,
    /// The entries' counting trampolines: where each one's count starts,
    /// where the function's moved instructions follow it, and the function
    /// it counts the calls of, by address.
    counting_stubs: Vec<CountingStub>,
    /// Where the in-process engine's routines return to in its code, by
    /// address (see [`StackResolver::probe_returns`]).
    probe_returns: Vec<u64>,
    /// Those of them in a shared return trampoline.
    return_trampolines: Vec<u64>,
    unwinder: UnwinderX86_64<SectionBytes>,
    cache: Option<Box<CacheX86_64>>,
    /// Mappings already given to the unwinder.
    added: usize,
    /// The names of the code it made while it ran, from its perf map.
    jit: JitMap,
}

/// The module of frames named from a process's perf map.
pub const JIT_MODULE: &str = "[jit]";

/// How long after a perf map could not be opened it is looked for again,
/// and after one was read it is read again for an address it lacks.
const JIT_MAP_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// A process's perf map (see [`PerfMap`]), opened at the first sample in
/// code of no file, and read again as it grows; where it is was taken as
/// the process mapped memory of no file, while it ran.
#[derive(Debug, Default)]
struct JitMap {
    map: Option<PerfMap>,
    place: Option<PerfMapPlace>,
    looked: Option<std::time::Instant>,
}

/// The most processes whose perf map's place is held at once (each holds
/// its root directory): past them, the place taken first is let go.
const MOST_JIT_PLACES: usize = 256;

impl JitMap {
    /// The name the map of process `pid` gives the code at `address`; a
    /// map last written before `not_before` (the process's exec) is not
    /// its image's.
    fn name_at(&mut self, pid: u32, address: u64, not_before: Option<std::time::SystemTime>) -> Option<&str> {
        let due = self.looked.is_none_or(|at| at.elapsed() >= JIT_MAP_RETRY);
        let missing = self.map.as_ref().is_none_or(|map| map.names().name_at(address).is_none());
        if missing && due {
            self.looked = Some(std::time::Instant::now());
            if self.map.is_none() {
                self.map = match &self.place {
                    Some(place) => place.open(not_before),
                    None => PerfMap::open(pid, not_before),
                }
                .ok();
            }
            if let Some(map) = &mut self.map {
                let _ = map.read_more();
            }
        }
        self.map.as_ref()?.names().name_at(address)
    }
}

/// Whether a mapping of `path` is memory of no file (where a JIT puts
/// the code it makes).
fn is_anonymous(path: &str) -> bool {
    // As perf has it (`is_anon_memory`, `is_no_dso_memory`), with .NET's
    // code mapped twice through a memory file.
    path == ANONYMOUS || path.starts_with("/dev/zero") || path.starts_with("/anon_hugepage") || path.starts_with("/memfd:doublemapper")
}

/// What perf's records name memory of no file, and what proftap names it
/// where `/proc/PID/maps` gives it no name.
pub const ANONYMOUS: &str = "//anon";

/// Where the kernel puts a process's `[uprobes]` page unless taken: the top
/// page of the 47-bit user address space. Its mmap record may never come
/// (the page appears at the first probe hit).
pub const DEFAULT_PROBE_AREA: std::ops::Range<u64> = 0x7fff_ffff_e000..0x7fff_ffff_f000;

/// The original address that `address`, in a counting stub, stands for.
fn origin_of(origins: &[(u64, u64)], address: u64) -> Option<u64> {
    let i = origins.partition_point(|o| o.0 <= address).checked_sub(1)?;
    Some(origins[i].1).filter(|&o| o != 0)
}

/// Where the patched call's return-address slot is, from the stack
/// pointer, for a thread at `ip` among a trampoline's register saves,
/// its call into the runtime or its restores, before or after the nearest
/// of `process`'s returns from the runtime.
fn slot_among_saves(process: &Process, ip: u64) -> Option<usize> {
    let next = process.probe_returns.partition_point(|&r| r <= ip);
    let nearest = [next.checked_sub(1), Some(next)].into_iter().flatten().filter_map(|i| process.probe_returns.get(i));
    nearest.into_iter().find_map(|&back| {
        let words = words_pushed(routine_call(process, back), ip.wrapping_sub(back) as i64)?;
        Some(words as usize * 8)
    })
}

/// Which code calls the runtime routine that returns to `back`.
fn routine_call(process: &Process, back: u64) -> RoutineCall {
    if process.return_trampolines.contains(&back) { RoutineCall::Return } else { RoutineCall::Trampoline }
}

impl Process {
    /// The `[uprobes]` page: return-probe trampolines and the slots where
    /// probed instructions are single-stepped.
    fn probe_area(&self) -> std::ops::Range<u64> {
        self.trampoline.map_or(DEFAULT_PROBE_AREA, |(lo, hi)| lo..hi)
    }

    fn in_probe_area(&self, ip: u64) -> bool {
        self.engine_code.iter().any(|c| c.contains(&ip))
            || (self.probe_area().contains(&ip) && !self.mappings.iter().any(|m| (m.start..m.end).contains(&ip)))
    }
}

/// A sample's stack, named: frames outermost first (inlined frames
/// included), and the source line of the innermost.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedStack {
    /// Frames, outermost first.
    pub frames: Vec<SampledFrame>,
    /// The innermost frame's source file and line, when known.
    pub line: Option<(String, u32)>,
    /// The frames (indices into `frames`) of calls the in-process engine
    /// was timing: its trampoline held their return address. A throttled
    /// function's call that was under way when its probes were removed is
    /// timed to its end, and is here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timed_calls: Vec<u32>,
}

/// Frames (innermost first) and the line of one address.
type Named = (Vec<SampledFrame>, Option<(String, u32)>);

/// Frames of one address, and its line once asked for (`None`: not yet).
type NamedOnce = (Vec<SampledFrame>, Option<Option<(String, u32)>>);

/// Names the stacks of samples.
pub struct StackResolver {
    /// Where modules' symbols and images come from (read once per recording).
    symbols: Arc<SymbolCache>,
    processes: FxHashMap<u32, Process>,
    modules: Vec<ModuleInfo>,
    module_ids: HashMap<String, usize>,
    /// (module, virtual address) -> what it is named, and its line once a
    /// sample was taken there (a return address needs none).
    symbolized: FxHashMap<(usize, u64), NamedOnce>,
    /// Kernel probes may be hit: a sample in the kernel may be mid-probe.
    kernel_probes: bool,
    /// A copy of proftap's own vDSO, made at the first `[vdso]` mapping.
    vdso: Option<Option<OwnVdso>>,
    /// The modules whose debug info is read for inlined frames and lines
    /// (files identified by device and inode); `None`: every module's.
    lines_of: Option<Vec<(u64, u64)>>,
    /// Symbol indexes read ahead, for the modules not mapped yet.
    ahead: Vec<FramesAhead>,
    /// When each process that executed a program did, by the wall clock
    /// perf maps are written by.
    executed: FxHashMap<u32, std::time::SystemTime>,
    /// The processes holding their perf map's place, first taken first.
    jit_places: std::collections::VecDeque<u32>,
}

/// The vDSO the kernel maps into every process (`[vdso]`, the code of
/// `clock_gettime` and the like), copied from proftap's own memory into a
/// memory file: the kernel maps the same image into every process, and
/// the file can be read as any module's.
struct OwnVdso {
    /// Keeps the copy open, so that `path` names it.
    _file: std::fs::File,
    path: PathBuf,
    len: u64,
}

impl OwnVdso {
    /// Module name of the vDSO, as the kernel names its mapping.
    const NAME: &str = "[vdso]";

    fn copy() -> Option<OwnVdso> {
        use std::io::{Read, Seek, Write};
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let line = maps.lines().find(|l| l.split_whitespace().nth(5) == Some(OwnVdso::NAME))?;
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        let len = end.checked_sub(start).filter(|&l| l > 0 && l <= 1 << 20)?;
        let mut image = vec![0u8; len as usize];
        let mut memory = std::fs::File::open("/proc/self/mem").ok()?;
        memory.seek(std::io::SeekFrom::Start(start)).ok()?;
        memory.read_exact(&mut image).ok()?;
        let mut file = std::fs::File::from(crate::memfd::never_executable(c"proftap-vdso").ok()?);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        file.write_all(&image).ok()?;
        Some(OwnVdso { path: PathBuf::from(format!("/proc/self/fd/{fd}")), _file: file, len })
    }
}

impl StackResolver {
    /// A resolver that knows no process yet, reading modules through `symbols`.
    pub fn new(symbols: Arc<SymbolCache>) -> Self {
        StackResolver {
            symbols,
            processes: FxHashMap::default(),
            modules: Vec::new(),
            module_ids: HashMap::new(),
            symbolized: FxHashMap::default(),
            kernel_probes: true,
            vdso: None,
            lines_of: None,
            ahead: Vec::new(),
            executed: FxHashMap::default(),
            jit_places: std::collections::VecDeque::new(),
        }
    }

    /// The symbol index `ahead` reads serves the module of its file, when
    /// that module is mapped.
    pub fn frames_read_ahead(mut self, ahead: Option<FramesAhead>) -> Self {
        self.ahead.extend(ahead);
        self
    }

    /// No kernel probe is placed in the recording: a sample in the kernel
    /// is a system call or a fault, never a probe being handled.
    pub fn without_kernel_probes(mut self) -> Self {
        self.kernel_probes = false;
        self
    }

    /// Inlined frames and lines come only from `modules` (the files whose
    /// functions the recording measures); the frames of others are named
    /// from their symbol tables, as `perf report` names them (its
    /// `--inline` is off by default): a C library's debug info alone takes
    /// 50 to 80 ms of CPU time to read, while the program runs.
    pub fn lines_only_of<'p>(mut self, modules: impl IntoIterator<Item = &'p Path>) -> Self {
        self.lines_of = Some(modules.into_iter().filter_map(file_identity).collect());
        self
    }

    /// A process mapped executable code (or had it mapped when the recording began).
    pub fn mapped(&mut self, pid: u32, start: u64, len: u64, pgoff: u64, path: &str) {
        // One module for memory of no file, whatever it is named: no file is read.
        let path = if is_anonymous(path) { ANONYMOUS } else { path };
        if path == ANONYMOUS {
            self.hold_jit_place(pid);
        }
        if path == "[uprobes]" {
            self.processes.entry(pid).or_default().trampoline = Some((start, start.saturating_add(len)));
            return;
        }
        // Another vDSO than proftap's (a 32-bit process's) stays unnamed.
        let own_vdso = (path == OwnVdso::NAME).then(|| {
            let own = self.vdso.get_or_insert_with(OwnVdso::copy).as_ref();
            // Mapped above 4 GiB, it is a 64-bit process's: told without
            // asking the process, which may have ended before its mappings
            // are read (they are read in batches).
            own.filter(|own| own.len == len && (start > u64::from(u32::MAX) || runs_64_bit_code(pid)))
        });
        if own_vdso.as_ref().is_some_and(Option::is_none) {
            return;
        }
        let own_vdso = own_vdso.flatten().map(|own| own.path.clone());
        let module = match self.module_ids.get(path) {
            Some(&id) => id,
            None => {
                let open = if let Some(own) = own_vdso {
                    own
                } else if path.starts_with('/') {
                    let open = PathBuf::from(path);
                    if open.exists() { open } else { PathBuf::from(format!("/proc/{pid}/root{path}")) }
                } else {
                    return;
                };
                let with_lines = match (&self.lines_of, file_identity(&open)) {
                    (None, _) => true,
                    (Some(modules), Some(file)) => modules.contains(&file),
                    (Some(_), None) => false,
                };
                self.modules.push(ModuleInfo::load(path, &open, &self.symbols, with_lines, &mut self.ahead));
                self.module_ids.insert(path.to_string(), self.modules.len() - 1);
                self.modules.len() - 1
            }
        };
        let process = self.processes.entry(pid).or_default();
        process.mappings = covered_in_part(std::mem::take(&mut process.mappings), start, start.saturating_add(len));
        process.mappings.push(Mapping { start, end: start.saturating_add(len), pgoff, module });
        process.mappings.sort_by_key(|m| m.start);
        // The unwinder is rebuilt with every mapping at the next sample.
        process.added = usize::MAX;
    }

    /// Takes where process `pid`'s perf map is while the process runs, if
    /// not taken yet; past [`MOST_JIT_PLACES`], the place taken first is
    /// let go (that of a process long ended, most often).
    fn hold_jit_place(&mut self, pid: u32) {
        if self.processes.get(&pid).is_some_and(|p| p.jit.place.is_some()) {
            return;
        }
        let Ok(place) = PerfMapPlace::of(pid) else { return };
        self.jit_places.retain(|held| self.processes.get(held).is_some_and(|p| p.jit.place.is_some()));
        if self.jit_places.len() >= MOST_JIT_PLACES
            && let Some(oldest) = self.jit_places.pop_front()
            && let Some(process) = self.processes.get_mut(&oldest)
        {
            process.jit.place = None;
        }
        self.processes.entry(pid).or_default().jit.place = Some(place);
        self.jit_places.push_back(pid);
    }

    /// The in-process engine's code is at `range` in process `pid`: time
    /// spent there is the engine's.
    pub fn engine_code(&mut self, pid: u32, range: std::ops::Range<u64>) {
        self.processes.entry(pid).or_default().engine_code.push(range);
    }

    /// Where in the in-process engine's code in process `pid` its runtime
    /// makes a forked child's memory: a sample there is named
    /// [`FORK_FRAME`], not the probes' overhead.
    pub fn fork_code(&mut self, pid: u32, ranges: Vec<std::ops::Range<u64>>) {
        self.processes.entry(pid).or_default().fork_code.extend(ranges);
    }

    /// Where the in-process engine's routines return to in its code in
    /// process `pid` (`Patched::probe_returns`), those of its shared return
    /// trampoline among them apart: a sample taken inside the runtime finds
    /// the call it was timing from such a return address on its stack, and
    /// unwinds from that call's own return address; one taken among a
    /// trampoline's register saves and restores, from where it is in them.
    pub fn probe_returns(&mut self, pid: u32, returns: Vec<u64>, return_trampolines: Vec<u64>) {
        let process = self.processes.entry(pid).or_default();
        process.probe_returns.extend(returns);
        process.probe_returns.sort_unstable();
        process.return_trampolines.extend(return_trampolines);
    }

    /// The in-process engine's counting stubs and islands in process
    /// `pid`: from each of their addresses on, the original address it
    /// stands for (0: none). A sample in a stub or an island, or a call
    /// that returns into a stub, unwinds as from the original code.
    pub fn origins(&mut self, pid: u32, origins: Vec<(u64, u64)>) {
        let process = self.processes.entry(pid).or_default();
        process.origins.extend(origins);
        process.origins.sort_unstable();
    }

    /// The entries' counting trampolines in process `pid`: where each
    /// one's count starts, where the function's moved instructions follow
    /// it, and the function whose calls it counts.
    pub fn counting_stubs(&mut self, pid: u32, stubs: Vec<CountingStub>) {
        let process = self.processes.entry(pid).or_default();
        process.counting_stubs.extend(stubs);
        process.counting_stubs.sort_unstable();
    }

    /// Process `child` was forked from `parent`: until it maps or executes
    /// anything else it has its parent's mappings, proftap's code among them.
    pub fn forked(&mut self, parent: u32, child: u32) {
        let Some(from) = self.processes.get(&parent) else { return };
        let copy = Process {
            mappings: from.mappings.clone(),
            trampoline: from.trampoline,
            engine_code: from.engine_code.clone(),
            fork_code: from.fork_code.clone(),
            origins: from.origins.clone(),
            counting_stubs: from.counting_stubs.clone(),
            probe_returns: from.probe_returns.clone(),
            return_trampolines: from.return_trampolines.clone(),
            // Its unwinder is built at its first sample.
            added: usize::MAX,
            ..Process::default()
        };
        let jit = from.jit.place.is_some();
        self.processes.insert(child, copy);
        if jit {
            self.hold_jit_place(child);
        }
    }

    /// A process executed a new program at `at`: its old mappings are
    /// gone, and its old image's perf map with them.
    pub fn exec(&mut self, pid: u32, at: std::time::SystemTime) {
        self.processes.remove(&pid);
        // A file's times come from a clock a tick coarse: a map the new
        // image wrote at once may seem a few milliseconds older.
        self.executed.insert(pid, at.checked_sub(std::time::Duration::from_millis(50)).unwrap_or(at));
    }

    /// The function whose entry's count `sample` was taken in, if it was
    /// in one (see [`StackResolver::counting_stubs`]): the time of its
    /// `lock inc` shows on the instruction after it, which is the first
    /// moved one where the count is that instruction alone.
    pub fn counting_stub_of(&self, sample: &StackSample) -> Option<u32> {
        let ip = sample.regs[0];
        let stubs = &self.processes.get(&sample.pid).filter(|_| !sample.in_kernel)?.counting_stubs;
        let stub = stubs.get(stubs.partition_point(|s| s.count <= ip).checked_sub(1)?)?;
        (ip <= stub.moved).then_some(stub.function)
    }

    /// Names one sample's stack. `returns` are the thread's return
    /// addresses by stack slot, for the slots where a return probe left its
    /// trampoline.
    pub fn resolve(&mut self, sample: &StackSample, returns: &[(u64, u64)]) -> ResolvedStack {
        let [ip, sp, bp] = sample.regs;
        let mut addresses = self.unwind(sample.pid, ip, sp, bp, &sample.stack, returns);
        // Past a stack's outermost frame the unwinder reads whatever the
        // thread's creator left there: an address in no mapping ends it.
        while addresses.len() > 1 && addresses.last().is_some_and(|&(a, _)| !self.is_mapped(sample.pid, a)) {
            addresses.pop();
        }
        // In the kernel with a stack that does not unwind: the thread was
        // taken while a probe was handled, its registers half updated.
        let mid_probe = self.kernel_probes && sample.in_kernel && addresses.iter().skip(1).any(|&(a, _)| !self.is_mapped(sample.pid, a));
        if mid_probe {
            addresses.clear();
        }
        // Inside the engine's runtime, which has no unwind tables: its time
        // is the probes' of a call whose own frame is found from the
        // routine's return address on the stack, and the stack goes on
        // from there.
        let in_runtime = addresses.is_empty() && !mid_probe;
        let callers = if in_runtime { self.unwind_from_probe(sample, returns) } else { Vec::new() };
        let probe_leaf = !callers.is_empty();
        if probe_leaf {
            addresses = callers;
        }
        let mut frames: Vec<SampledFrame> = Vec::with_capacity(addresses.len() * 2);
        // Innermost first, as `frames` is built: whether each is a timed call.
        let mut timed: Vec<bool> = Vec::with_capacity(addresses.len() * 2);
        let mut line = None;
        for (depth, &(address, _)) in addresses.iter().enumerate() {
            // A return address points after the call: look up the call.
            let lookup = if depth == 0 { address } else { address.saturating_sub(1) };
            let (named, at) = self.symbolize(sample.pid, lookup, depth == 0);
            if depth == 0 {
                line = at;
            }
            // The function itself comes after its inlined frames; its call
            // is timed when a trampoline stood for the address it returns to.
            let returns_through_probe = addresses.get(depth + 1).is_some_and(|&(_, taken)| taken);
            timed.extend((0..named.len()).map(|i| returns_through_probe && i + 1 == named.len()));
            frames.extend(named);
        }
        if frames.is_empty() {
            timed.push(false);
            let in_probe = mid_probe || self.processes.get(&sample.pid).is_some_and(|p| p.in_probe_area(ip));
            let reason = match (ip, in_probe) {
                (0, _) => "[unknown: no user stack]",
                // The kernel's probe area: time the probes themselves took.
                (_, true) => PROBE_OVERHEAD_FRAME,
                _ => "[unknown: unmapped]",
            };
            frames.push(frame(reason, "", false));
        }
        if probe_leaf {
            let following_a_fork = self.processes.get(&sample.pid).is_some_and(|p| p.fork_code.iter().any(|c| c.contains(&ip)));
            frames.insert(0, frame(if following_a_fork { FORK_FRAME } else { PROBE_OVERHEAD_FRAME }, ENGINE_MODULE, false));
            timed.insert(0, false);
            line = None;
        } else if sample.in_kernel && !self.kernel_probes && frames.first().is_none_or(|leaf| leaf.name != PROBE_OVERHEAD_FRAME) {
            // The kernel's work for the user frame below (a system call, a
            // page fault) is the kernel's own, as perf shows it. Not where
            // kernel probes are defined: there, the kernel's time at a
            // probed instruction is the probe's, which the probes' cost
            // per call takes out already.
            frames.insert(0, kernel_frame(KernelSymbols::running().function_at(sample.kernel_ip)));
            timed.insert(0, false);
        }
        frames.reverse();
        timed.reverse();
        let timed_calls = timed.iter().enumerate().filter(|&(_, &t)| t).map(|(i, _)| i as u32).collect();
        ResolvedStack { frames, line, timed_calls }
    }

    /// The return addresses of the stack of a sample taken inside the
    /// engine's runtime, from the patched call it was timing on: the first
    /// word on the stack that is a routine's return address into the
    /// engine's code has, what its trampoline pushed above it, the slot of that
    /// call's return address (its original, or a trampoline that
    /// `returns` or the site table names). Empty when there is none.
    fn unwind_from_probe(&mut self, sample: &StackSample, returns: &[(u64, u64)]) -> Vec<(u64, bool)> {
        let [ip, sp, bp] = sample.regs;
        let Some(process) = self.processes.get(&sample.pid) else { return Vec::new() };
        let in_engine = |address: u64| process.engine_code.iter().any(|c| c.contains(&address));
        if process.probe_returns.is_empty() || !in_engine(ip) {
            return Vec::new();
        }
        let skip = (sp.wrapping_neg() & 7) as usize;
        let word = |offset: usize| sample.stack.get(offset..offset + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
        // The runtime's own frames are small: a word farther up could be a
        // stale copy in a frame of the program's.
        let window = sample.stack.len().min(RUNTIME_FRAME_BYTES);
        let found =
            (skip..window).step_by(8).find_map(|o| word(o).filter(|w| process.probe_returns.binary_search(w).is_ok()).map(|w| (o, w)));
        // Above the routine's return address: what its trampoline pushed.
        let above_return = |back: u64| words_pushed(routine_call(process, back), 0).map(|words| 8 + words as usize * 8);
        let ret_above = match found.and_then(|(at, back)| Some(at + above_return(back)?)).or_else(|| slot_among_saves(process, ip)) {
            Some(slot) => {
                let Some(value) = word(slot) else { return Vec::new() };
                let slot_address = sp.wrapping_add(slot as u64);
                let ret = returns.iter().find(|r| r.0 == slot_address).filter(|_| in_engine(value)).map_or(value, |r| r.1);
                (ret, slot + 8)
            }
            // Past a function trampoline's restores: the slot at the stack
            // pointer, holding the trampoline (where it decides whether the
            // call is timed); then stepped over, to call the function
            // through the `call` before its return trampoline (or popped by
            // a return into it), the word below the stack pointer, which
            // the sample has not. The thread's frames say what each stands for.
            None => {
                let at_slot = word(0).filter(|&value| in_engine(value)).and_then(|_| returns.iter().find(|r| r.0 == sp));
                let stepped_over = || returns.iter().find(|r| r.0 == sp.wrapping_sub(8)).map(|&(_, ret)| (ret, 0));
                match at_slot.map(|&(_, ret)| (ret, 8)).or_else(stepped_over) {
                    Some(found) => found,
                    None => return Vec::new(),
                }
            }
        };
        let (ret, above) = ret_above;
        if !self.is_mapped(sample.pid, ret) {
            return Vec::new();
        }
        // The caller, from just after its call: its stack as it was then.
        let Some(above_stack) = sample.stack.get(above..) else { return Vec::new() };
        // Unwound as from inside its call instruction, whose unwind row is the caller's.
        let mut addresses = self.unwind(sample.pid, ret - 1, sp.wrapping_add(above as u64), bp, above_stack, returns);
        while addresses.len() > 1 && addresses.last().is_some_and(|&(a, _)| !self.is_mapped(sample.pid, a)) {
            addresses.pop();
        }
        addresses
    }

    /// The addresses of a stack, innermost first, each with whether a
    /// trampoline stood for it (the call it returns from is timed).
    fn unwind(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8], returns: &[(u64, u64)]) -> Vec<(u64, bool)> {
        if ip == 0 {
            return Vec::new();
        }
        let Some(process) = self.processes.get_mut(&pid) else { return vec![(ip, false)] };
        let ip = origin_of(&process.origins, ip).unwrap_or(ip);
        if process.in_probe_area(ip) {
            return Vec::new();
        }
        if process.added == usize::MAX {
            process.unwinder = UnwinderX86_64::new();
            for m in &process.mappings {
                let info = &self.modules[m.module];
                let (Some(unwind), Some(vaddr)) = (&info.unwind, info.mapping_vaddr(m.pgoff)) else { continue };
                let bias = m.start.wrapping_sub(vaddr);
                let section_info = ExplicitModuleSectionInfo {
                    base_svma: 0,
                    text_svma: unwind.text.as_ref().map(|t| t.0.clone()),
                    text: unwind.text.as_ref().map(|t| t.1.clone()),
                    got_svma: unwind.got.clone(),
                    eh_frame_svma: unwind.eh_frame.as_ref().map(|t| t.0.clone()),
                    eh_frame: unwind.eh_frame.as_ref().map(|t| t.1.clone()),
                    eh_frame_hdr_svma: unwind.eh_frame_hdr.as_ref().map(|t| t.0.clone()),
                    eh_frame_hdr: unwind.eh_frame_hdr.as_ref().map(|t| t.1.clone()),
                    debug_frame: unwind.debug_frame.clone(),
                    ..Default::default()
                };
                process.unwinder.add_module(Module::new(info.path.clone(), m.start..m.end, bias, section_info));
            }
            process.added = process.mappings.len();
            process.cache = Some(Box::new(CacheX86_64::new()));
        }
        let trampoline = process.probe_area();
        let (origins, engine_code) = (&process.origins, &process.engine_code);
        // Only an address of proftap's (a trampoline, a stub) stands for
        // another: a slot that held one earlier may hold a real one now.
        let taken = |value: u64| trampoline.contains(&value) || engine_code.iter().any(|c| c.contains(&value));
        let cache = process.cache.get_or_insert_with(|| Box::new(CacheX86_64::new()));
        // The address the in-process engine's trampoline stood for, in the
        // unwinding step under way (only a return-address slot holds one):
        // a call it is timing. Not a return probe's: the kernel's
        // trampoline stays in the slot of a call the governor stopped
        // timing.
        let stood_for = std::cell::Cell::new(None);
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let offset = address.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(offset..offset + 8).ok_or(())?;
            let value = u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?);
            // A return probe's trampoline (or the in-process engine's) stands
            // for the return address proftap saw at the entry; a counting
            // stub that a call returns into, for the code after the call.
            let value = match returns.iter().find(|r| r.0 == address) {
                Some(r) if r.1 != value && taken(value) => {
                    let original = origin_of(origins, r.1).unwrap_or(r.1);
                    if !trampoline.contains(&value) {
                        stood_for.set(Some(original));
                    }
                    return Ok(original);
                }
                _ if trampoline.contains(&value) => return Err(()),
                _ => value,
            };
            // An island's address on the stack is a return address into
            // the padding after a call that does not return: its own.
            Ok(if taken(value) { origin_of(origins, value).unwrap_or(value) } else { value })
        };
        let modules = &self.modules;
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut frame = FrameAddress::from_instruction_pointer(ip);
        let mut addresses = Vec::new();
        loop {
            let address = match frame {
                // Frames past the first are looked up one byte back, as a
                // return address is past its call: an instruction a signal
                // interrupted is put one byte on (at a function's first
                // byte, one back is another's).
                FrameAddress::InstructionPointer(a) if !addresses.is_empty() => (a.wrapping_add(1), false),
                FrameAddress::InstructionPointer(a) => (a, false),
                FrameAddress::ReturnAddress(a) => (a.get(), stood_for.take() == Some(a.get())),
            };
            stood_for.set(None);
            addresses.push(address);
            if addresses.len() >= MAX_DEPTH {
                break;
            }
            // A signal handler returns into the C library's restorer, whose
            // unwind rules read the signal's frame with expressions the
            // unwinder does not evaluate: the interrupted code's registers
            // are read from that frame here. (So too for a sample taken in
            // the restorer itself, the handler returned.)
            let restorer = (matches!(frame, FrameAddress::ReturnAddress(_)) || addresses.len() == 1)
                && module_at(&process.mappings, modules, address.0).is_some_and(|(info, vaddr)| info.returns_from_a_signal(vaddr));
            if restorer {
                match interrupted(regs.sp(), &mut read_stack) {
                    Some(at) if !taken(at.ip()) => {
                        frame = FrameAddress::from_instruction_pointer(at.ip());
                        regs = at;
                        continue;
                    }
                    _ => break,
                }
            }
            match process.unwinder.unwind_frame(frame, &mut regs, cache, &mut read_stack) {
                Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
                    Some(caller) => frame = caller,
                    None => break,
                },
                _ => break,
            }
        }
        addresses
    }

    fn is_mapped(&self, pid: u32, address: u64) -> bool {
        self.processes.get(&pid).is_some_and(|p| p.mappings.iter().any(|m| (m.start..m.end).contains(&address)))
    }

    /// Frames (innermost first, inlined frames included) of an address,
    /// and `with_line` its line.
    fn symbolize(&mut self, pid: u32, address: u64, with_line: bool) -> Named {
        let mapping = self.processes.get(&pid).and_then(|p| {
            let i = p.mappings.partition_point(|m| m.start <= address).checked_sub(1)?;
            let m = &p.mappings[i];
            (address < m.end).then(|| m.clone())
        });
        let Some(mapping) = mapping else {
            return (vec![frame("[unknown: unmapped]", "", false)], None);
        };
        let info = &self.modules[mapping.module];
        let executed = self.executed.get(&pid).copied();
        if is_anonymous(&info.path)
            && let Some(name) = self.processes.get_mut(&pid).and_then(|p| p.jit.name_at(pid, address, executed))
        {
            return (vec![frame(name, JIT_MODULE, false)], None);
        }
        let Some(vaddr) = info.vaddr(address - mapping.start + mapping.pgoff) else {
            let module = info.path.clone();
            return (vec![frame(&format!("[unknown: {module}]"), &module, false)], None);
        };
        let key = (mapping.module, vaddr);
        let info = &self.modules[mapping.module];
        let frames_at = |with_line: bool| {
            let (reader, index) = info.frames(&self.symbols)?;
            let die = index.function_at(crate::addr::VirtAddr(vaddr)).and_then(|f| f.die);
            Some(if with_line {
                reader.at(vaddr, die)
            } else {
                crate::symbols::FramesAt { inlined: reader.inlined_at(vaddr, die), line: None }
            })
        };
        if let Some((frames, line)) = self.symbolized.get(&key) {
            if !with_line || line.is_some() {
                return (frames.clone(), line.clone().flatten());
            }
            let line = frames_at(true).and_then(|found| found.line);
            let frames = frames.clone();
            self.symbolized.insert(key, (frames.clone(), Some(line.clone())));
            return (frames, line);
        }
        let module = info.path.clone();
        let function = info.symbols.as_ref().and_then(|s| s.name_at(crate::addr::VirtAddr(vaddr))).map(str::to_string);
        let mut names: Vec<(String, bool)> = Vec::new();
        let mut line = None;
        if let Some(found) = frames_at(with_line) {
            // Paths as the function table writes them (no `a/../`), or a file would be two.
            line = found.line;
            names.extend(found.inlined.iter().map(|raw| (demangle_name(raw), true)));
        }
        // Named alike whether the C library's symbols are at hand or not.
        let function = if info.returns_from_a_signal(vaddr) { Some(SIGNAL_RETURN_FRAME.to_string()) } else { function };
        match function {
            Some(name) => names.push((name, false)),
            None => {
                let why = info.unknown.clone().unwrap_or_else(|| format!("no symbol in {module}"));
                names.push((format!("[unknown: {why}]"), false));
            }
        }
        let frames: Vec<SampledFrame> = names.iter().map(|(n, inlined)| frame(n, &module, *inlined)).collect();
        self.symbolized.insert(key, (frames.clone(), with_line.then(|| line.clone())));
        (frames, line)
    }
}

fn frame(name: &str, module: &str, inlined: bool) -> SampledFrame {
    SampledFrame { name: name.into(), module: module.into(), inlined }
}

/// The frame of a sample taken in the kernel: its function, marked `_[k]`
/// as perf's folded stacks mark the kernel's (so that no function of the
/// program's is taken for the kernel's `memcpy`, whatever looks frames up
/// by name), or the kernel unnamed where its symbols are hidden.
fn kernel_frame(function: Option<&str>) -> SampledFrame {
    match function {
        Some(name) => frame(&format!("{name}{KERNEL_SUFFIX}"), KERNEL_IMAGE, false),
        None => frame(KERNEL_FRAME, KERNEL_IMAGE, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signal's frame is read from the sampled stack alone: one cut
    /// short (or an address at the end of the address space, which a
    /// target can put on its stack) gives no registers rather than bytes
    /// from elsewhere.
    #[test]
    fn a_signal_frame_is_read_only_from_the_bytes_sampled() {
        let sampled = |len: u64| move |at: u64| if (0x1000..0x1000 + len).contains(&at) { Ok(at * 2) } else { Err(()) };
        let whole = interrupted(0x1000, &mut sampled(512)).expect("the frame is in the bytes");
        assert_eq!((whole.bp(), whole.sp(), whole.ip()), (2 * (0x1000 + 40 + 80), 2 * (0x1000 + 40 + 120), 2 * (0x1000 + 40 + 128)));
        assert!(interrupted(0x1000, &mut sampled(160)).is_none(), "the rip past the bytes");
        assert!(interrupted(u64::MAX - 100, &mut |_| Ok(1)).is_none(), "no wrapping past the end");
    }

    #[test]
    fn a_signal_restorer_is_known_from_the_byte_before_it_to_the_end_of_its_system_call() {
        let mut text = vec![0x90u8; 32];
        text[16..25].copy_from_slice(&SIGNAL_RETURN);
        let unwind = UnwindSections {
            text: Some((0x1000..0x1020, SectionBytes::Decompressed(text.into()))),
            eh_frame: None,
            eh_frame_hdr: None,
            got: None,
            debug_frame: None,
            segments: Vec::new(),
        };
        let module = ModuleInfo {
            path: "libc.so.6".into(),
            symbols: None,
            open: PathBuf::from("libc.so.6"),
            with_lines: false,
            frames: std::cell::OnceCell::new(),
            ahead: std::cell::Cell::new(None),
            unwind: Some(Arc::new(unwind)),
            unknown: None,
        };
        let known: Vec<u64> = (0x1000..0x1020).filter(|&a| module.returns_from_a_signal(a)).collect();
        assert_eq!(known, (0x100f..=0x1019).collect::<Vec<u64>>());
    }

    #[test]
    fn a_64_bit_process_is_told_from_one_that_cannot_be_read() {
        assert!(runs_64_bit_code(std::process::id()));
        // No such process (above the kernel's largest pid).
        assert!(!runs_64_bit_code(u32::MAX));
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    /// Stands for the caller of a function whose call the engine times.
    #[inline(never)]
    fn caller() -> u64 {
        std::hint::black_box(1)
    }

    /// A resolver that knows this process's own executable code, and
    /// engine code at a made-up address with a routine's return in it.
    fn resolver_of_this_process() -> (StackResolver, u32, u64) {
        let pid = std::process::id();
        let mut resolver = StackResolver::new(Arc::new(SymbolCache::new(crate::symbols::DebugDirs(Vec::new()))));
        let exe = std::fs::read_link("/proc/self/exe").expect("this process's executable");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("this process's mappings");
        for line in maps.lines().filter(|l| l.ends_with(exe.to_str().unwrap_or("?"))) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (start, end) = fields[0].split_once('-').expect("a range");
            let (start, end) = (u64::from_str_radix(start, 16).unwrap_or(0), u64::from_str_radix(end, 16).unwrap_or(0));
            resolver.mapped(pid, start, end - start, u64::from_str_radix(fields[2], 16).unwrap_or(0), &exe.to_string_lossy());
        }
        let engine = 0x1000_0000;
        resolver.engine_code(pid, engine..engine + 0x1000);
        resolver.probe_returns(pid, vec![engine + 0x800], Vec::new());
        (resolver, pid, engine)
    }

    /// The named frames of a sample at `ip` in the engine's code, with the
    /// stack pointer at `sp` over `stack`, and the thread's frames `returns`.
    fn named(resolver: &mut StackResolver, pid: u32, ip: u64, sp: u64, stack: Vec<u8>, returns: &[(u64, u64)]) -> Vec<String> {
        let sample = StackSample { time: 0, pid, tid: pid, regs: [ip, sp, 0], stack, in_kernel: false, kernel_ip: 0, returns: Vec::new() };
        resolver.resolve(&sample, returns).frames.into_iter().map(|f| f.name).collect()
    }

    /// A sample in the count of an entry's counting trampoline, or at the
    /// first moved instruction after it (where a `lock inc` alone shows
    /// its time), is that function's counting; one further into the moved
    /// instructions, in the kernel or in another process is not; a forked
    /// child has its parent's.
    #[test]
    fn a_sample_in_a_counting_stub_names_its_function() {
        let mut resolver = StackResolver::new(Arc::new(SymbolCache::new(crate::symbols::DebugDirs(Vec::new()))));
        let (pid, child) = (41, 42);
        resolver.counting_stubs(pid, vec![(0x3000, 0x3008, 7).into(), (0x1000, 0x1020, 3).into()]);
        let sample = |pid: u32, ip: u64, in_kernel: bool| StackSample {
            time: 0,
            pid,
            tid: pid,
            regs: [ip, 0, 0],
            stack: Vec::new(),
            in_kernel,
            kernel_ip: 0,
            returns: Vec::new(),
        };
        let at = |resolver: &StackResolver, pid: u32, ip: u64| resolver.counting_stub_of(&sample(pid, ip, false));
        assert_eq!([0x1000, 0x101f, 0x1020, 0x3008].map(|ip| at(&resolver, pid, ip)), [Some(3), Some(3), Some(3), Some(7)]);
        assert_eq!([0xfff, 0x1021, 0x3009].map(|ip| at(&resolver, pid, ip)), [None; 3]);
        assert_eq!(resolver.counting_stub_of(&sample(pid, 0x1010, true)), None);
        assert_eq!(at(&resolver, child, 0x1010), None);
        resolver.forked(pid, child);
        assert_eq!(at(&resolver, child, 0x3000), Some(7));
    }

    /// Past a function trampoline's restores, no word on the stack is a
    /// routine's return: the call's slot is at the stack pointer (holding
    /// a trampoline) or, stepped over, just below it. The thread's frames
    /// say what the slot stands for: the sample sits under the caller.
    #[test]
    fn a_sample_where_a_trampoline_decides_or_stepped_over_the_slot_sits_under_the_caller() {
        let (mut resolver, pid, engine) = resolver_of_this_process();
        let ret = caller as *const () as u64 + 1;
        let sp = 0x7000_0000;
        let mut at_slot = (engine + 0x900).to_ne_bytes().to_vec();
        at_slot.resize(64, 0);
        let deciding = named(&mut resolver, pid, engine + 0x10, sp, at_slot, &[(sp, ret)]);
        let stepped_over = named(&mut resolver, pid, engine + 0x10, sp, vec![0; 64], &[(sp - 8, ret)]);
        for frames in [&deciding, &stepped_over] {
            assert_eq!(frames.last().map(String::as_str), Some(PROBE_OVERHEAD_FRAME), "{frames:?}");
            assert!(frames.first().is_some_and(|f| f.ends_with("probe_tests::caller")), "{frames:?}");
        }
        // A slot the thread's frames do not name: no caller is made up.
        let unknown = named(&mut resolver, pid, engine + 0x10, sp, vec![0; 64], &[(sp - 16, ret)]);
        assert_eq!(unknown, vec![PROBE_OVERHEAD_FRAME.to_string()]);
    }

    /// Where the runtime makes a forked child's memory, a sample is named
    /// apart from the probes' cost per call, under the call it came in by;
    /// elsewhere in the runtime it is the probes'.
    #[test]
    fn a_sample_where_a_forked_child_makes_its_memory_is_not_the_probes_overhead() {
        let (mut resolver, pid, engine) = resolver_of_this_process();
        resolver.fork_code(pid, std::iter::once(engine..engine + 0x20).collect());
        let ret = caller as *const () as u64 + 1;
        let sp = 0x7000_0000;
        let mut at_slot = (engine + 0x900).to_ne_bytes().to_vec();
        at_slot.resize(64, 0);
        let following = named(&mut resolver, pid, engine + 0x10, sp, at_slot.clone(), &[(sp, ret)]);
        assert_eq!(following.last().map(String::as_str), Some(FORK_FRAME), "{following:?}");
        assert!(following.first().is_some_and(|f| f.ends_with("probe_tests::caller")), "{following:?}");
        let probing = named(&mut resolver, pid, engine + 0x40, sp, at_slot, &[(sp, ret)]);
        assert_eq!(probing.last().map(String::as_str), Some(PROBE_OVERHEAD_FRAME), "{probing:?}");
    }

    /// A line is read for the innermost frame only (a caller's needs none,
    /// and a unit's line table is the costliest part to read); an address
    /// named first as a caller's gets its line when a sample is taken there.
    #[test]
    fn an_address_named_first_as_a_callers_has_its_line_when_sampled_there() {
        let address = an_address_with_a_line as *const () as usize as u64;
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid as i32).expect("own maps");
        let code = maps.iter().find(|m| m.executable && m.start.0 <= address && address < m.end.0).expect("own code mapped");
        let path = code.path.clone().expect("own file");
        let resolver = || {
            let mut resolver = StackResolver::new(Arc::new(SymbolCache::new(crate::symbols::DebugDirs(Vec::new()))));
            resolver.mapped(pid, code.start.0, code.end.0 - code.start.0, code.offset.0, &path);
            resolver
        };
        let (frames, line) = resolver().symbolize(pid, address, true);
        assert!(line.as_ref().is_some_and(|(file, _)| file.ends_with("sampling.rs")), "{line:?}");
        let mut named_as_caller = resolver();
        assert_eq!(named_as_caller.symbolize(pid, address, false), (frames.clone(), None));
        assert_eq!(named_as_caller.symbolize(pid, address, true), (frames, line));
    }

    #[inline(never)]
    fn an_address_with_a_line(x: u64) -> u64 {
        x * 7 + 3
    }

    /// lld's layout: read-only data, then code from mid-page (its first
    /// page shared), then data from mid-page of the code's last page, each
    /// a page further up in memory. A mapping of code from the shared first
    /// page, from within, and from the last page (a page split off) has the
    /// code's addresses.
    #[test]
    fn a_mapping_of_code_has_the_code_segments_addresses_wherever_it_starts() {
        let segment = |offset: u64, vaddr: u64, file_size: u64, executable: bool| Segment {
            vaddr: crate::addr::VirtAddr(vaddr),
            mem_size: file_size,
            offset: crate::addr::FileOffset(offset),
            file_size,
            executable,
        };
        let segments = [segment(0, 0, 0x1234, false), segment(0x1234, 0x2234, 0x3000, true), segment(0x4234, 0x6234, 0x500, false)];
        // The code's first page, shared with the read-only data.
        assert_eq!(code_mapping_vaddr(&segments, 0x1000), Some(0x2000));
        assert_eq!(code_mapping_vaddr(&segments, 0x3000), Some(0x4000));
        // Its last page, where the data starts: still the code's.
        assert_eq!(code_mapping_vaddr(&segments, 0x4000), Some(0x5000));
    }

    /// A page of a library's code given another protection (the kernel
    /// tells of it as a mapping of that page alone) leaves the rest of the
    /// library mapped, at the same offsets.
    #[test]
    fn a_mapping_over_part_of_another_leaves_the_rest_of_it() {
        let library = Mapping { start: 0x10000, end: 0x20000, pgoff: 0x1000, module: 3 };
        let other = Mapping { start: 0x30000, end: 0x31000, pgoff: 0, module: 4 };
        let kept = covered_in_part(vec![library, other], 0x14000, 0x15000);
        let spans: Vec<(u64, u64, u64, usize)> = kept.iter().map(|m| (m.start, m.end, m.pgoff, m.module)).collect();
        assert_eq!(spans, [(0x10000, 0x14000, 0x1000, 3), (0x15000, 0x20000, 0x6000, 3), (0x30000, 0x31000, 0, 4)]);
        // Over the whole of one and the start of the next: the rest of the next.
        let kept = covered_in_part(kept, 0x15000, 0x30800);
        let spans: Vec<(u64, u64, u64)> = kept.iter().map(|m| (m.start, m.end, m.pgoff)).collect();
        assert_eq!(spans, [(0x10000, 0x14000, 0x1000), (0x30800, 0x31000, 0x800)]);
    }
}

#[cfg(test)]
mod jit_tests {
    use super::*;

    /// A process that maps memory of no file and writes a perf map for it,
    /// then ends before a sample in that memory is named (a short-lived
    /// JIT, its samples read in a batch after it ended): the map is found
    /// where the process had it.
    #[test]
    fn a_jits_code_is_named_after_the_jit_ended() {
        /// The process and its map, gone whatever happens.
        struct Jit(std::process::Child, std::path::PathBuf);
        impl Drop for Jit {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
                let _ = std::fs::remove_file(&self.1);
            }
        }
        let child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let pid = child.id();
        let mut jit = Jit(child, std::path::PathBuf::from(format!("/tmp/perf-{pid}.map")));
        std::fs::write(&jit.1, b"10000 100 JS:short\n").expect("write the map");
        let mut resolver = StackResolver::new(Arc::new(SymbolCache::new(crate::symbols::DebugDirs(Vec::new()))));
        resolver.mapped(pid, 0x10000, 0x1000, 0, ANONYMOUS);
        jit.0.kill().expect("kill");
        jit.0.wait().expect("reaped");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the process is gone");
        let (frames, _) = resolver.symbolize(pid, 0x10010, true);
        assert_eq!(frames.first().map(|f| f.name.as_str()), Some("JS:short"), "{frames:?}");
    }
}

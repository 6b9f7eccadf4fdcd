//! Turning stack samples into symbolized stacks: each process's executable
//! mappings (from mmap records), DWARF CFI unwinding of the copied user
//! stack with framehop, and symbols with inlined frames and lines.

use crate::symbols::{DebugSource, LoadOptions, SymbolIndex, demangle_name};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection};
use proftap_profile::{SampleProfile, SampledFrame, SampledLine, SampledStack};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A stack sample.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// The deepest stack followed.
const MAX_DEPTH: usize = 512;

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
    symbols: Option<SymbolIndex>,
    lines: Option<addr2line::Loader>,
    unwind: Option<Arc<UnwindSections>>,
    /// Why its frames cannot be named, when they cannot.
    unknown: Option<String>,
}

/// The sections framehop unwinds with.
struct UnwindSections {
    text: Option<(std::ops::Range<u64>, Vec<u8>)>,
    eh_frame: Option<(std::ops::Range<u64>, Vec<u8>)>,
    eh_frame_hdr: Option<(std::ops::Range<u64>, Vec<u8>)>,
    got: Option<std::ops::Range<u64>>,
    debug_frame: Option<Vec<u8>>,
    segments: Vec<crate::symbols::Segment>,
}

impl ModuleInfo {
    fn load(path: &str, open: &Path) -> ModuleInfo {
        let symbols = SymbolIndex::load(open, &LoadOptions::default()).ok();
        let unknown = match &symbols {
            None => Some(format!("no symbols in {path}")),
            Some(_) => None,
        };
        let lines = symbols.as_ref().and_then(|index| {
            let debug = match &index.debug {
                DebugSource::Embedded { .. } => open.to_path_buf(),
                DebugSource::BuildId { path } | DebugSource::DebugLink { path } => path.clone(),
                DebugSource::Missing => return None,
            };
            addr2line::Loader::new(&debug).ok()
        });
        ModuleInfo { path: path.to_string(), symbols, lines, unwind: unwind_sections(open).map(Arc::new), unknown }
    }

    /// The ELF virtual address of file offset `offset`.
    fn vaddr(&self, offset: u64) -> Option<u64> {
        let segments = &self.unwind.as_ref()?.segments;
        let s = segments.iter().find(|s| offset >= s.offset.0 && offset < s.offset.0 + s.file_size)?;
        Some(offset - s.offset.0 + s.vaddr.0)
    }
}

fn unwind_sections(path: &Path) -> Option<UnwindSections> {
    let image = crate::symbols::ElfImage::open(path).ok()?;
    let elf = image.parse().ok()?;
    let section = |name: &str| -> Option<(std::ops::Range<u64>, Vec<u8>)> {
        let s = elf.section_by_name(name)?;
        let data = s.uncompressed_data().ok()?.into_owned();
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

/// A process's address space and its unwinder.
#[derive(Default)]
struct Process {
    mappings: Vec<Mapping>,
    /// Where the kernel's return-probe trampoline is (`[uprobes]`).
    trampoline: Option<(u64, u64)>,
    /// Where the in-process engine's code is.
    engine_code: Vec<std::ops::Range<u64>>,
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: Option<Box<CacheX86_64>>,
    /// Mappings already given to the unwinder.
    added: usize,
}

enum Input {
    Mapped { pid: u32, start: u64, len: u64, pgoff: u64, path: String },
    Exec(u32),
    EngineCode(u32, std::ops::Range<u64>),
    Sample(Box<StackSample>, Vec<(u64, u64)>),
    Hottest(std::sync::mpsc::Sender<Vec<(String, String, u64)>>),
}

/// A [`Sampler`] on its own thread: loading a module's symbols and
/// unwinding stacks take time the recording loop, which decides when probes
/// change, cannot wait for. Inputs are taken in the order given.
pub struct BackgroundSampler {
    input: std::sync::mpsc::Sender<Input>,
    worker: std::thread::JoinHandle<Sampler>,
}

impl BackgroundSampler {
    /// Runs `sampler` on a thread of its own.
    pub fn spawn(mut sampler: Sampler) -> Self {
        let (input, inputs) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            for input in inputs {
                match input {
                    Input::Mapped { pid, start, len, pgoff, path } => sampler.mapped(pid, start, len, pgoff, &path),
                    Input::Exec(pid) => sampler.exec(pid),
                    Input::EngineCode(pid, range) => sampler.engine_code(pid, range),
                    Input::Sample(sample, returns) => sampler.sample(&sample, &returns),
                    Input::Hottest(reply) => {
                        let _ = reply.send(sampler.hottest());
                    }
                }
            }
            sampler
        });
        BackgroundSampler { input, worker }
    }

    /// See [`Sampler::mapped`].
    pub fn mapped(&self, pid: u32, start: u64, len: u64, pgoff: u64, path: &str) {
        let _ = self.input.send(Input::Mapped { pid, start, len, pgoff, path: path.to_string() });
    }

    /// See [`Sampler::exec`].
    pub fn exec(&self, pid: u32) {
        let _ = self.input.send(Input::Exec(pid));
    }

    /// See [`Sampler::engine_code`].
    pub fn engine_code(&self, pid: u32, range: std::ops::Range<u64>) {
        let _ = self.input.send(Input::EngineCode(pid, range));
    }

    /// See [`Sampler::sample`].
    pub fn sample(&self, sample: Box<StackSample>, returns: Vec<(u64, u64)>) {
        let _ = self.input.send(Input::Sample(sample, returns));
    }

    /// See [`Sampler::hottest`]: waits for the samples given so far.
    pub fn hottest(&self) -> Vec<(String, String, u64)> {
        let (reply, answer) = std::sync::mpsc::channel();
        let _ = self.input.send(Input::Hottest(reply));
        answer.recv().unwrap_or_default()
    }

    /// Every sample given, as a profile.
    pub fn finish(self) -> SampleProfile {
        drop(self.input);
        match self.worker.join() {
            Ok(sampler) => sampler.finish(),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Where the kernel puts a process's `[uprobes]` page unless taken: the top
/// page of the 47-bit user address space. Its mmap record may never come
/// (the page appears at the first probe hit).
pub const DEFAULT_PROBE_AREA: std::ops::Range<u64> = 0x7fff_ffff_e000..0x7fff_ffff_f000;

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

/// Collects stack samples into a [`SampleProfile`].
pub struct Sampler {
    event: String,
    frequency_hz: u64,
    processes: FxHashMap<u32, Process>,
    modules: Vec<ModuleInfo>,
    module_ids: HashMap<String, usize>,
    /// (module, virtual address, innermost?) -> frames innermost first, and the line.
    symbolized: FxHashMap<(usize, u64), (Vec<u32>, Option<u32>)>,
    frames: Vec<SampledFrame>,
    frame_ids: HashMap<SampledFrame, u32>,
    lines: Vec<(String, u32)>,
    line_ids: HashMap<(String, u32), u32>,
    line_counts: FxHashMap<u32, u64>,
    stacks: FxHashMap<Vec<u32>, u64>,
    total: u64,
}

impl Sampler {
    /// A sampler of `event` at `frequency_hz`.
    pub fn new(event: &str, frequency_hz: u64) -> Self {
        Sampler {
            event: event.into(),
            frequency_hz,
            processes: FxHashMap::default(),
            modules: Vec::new(),
            module_ids: HashMap::new(),
            symbolized: FxHashMap::default(),
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            lines: Vec::new(),
            line_ids: HashMap::new(),
            line_counts: FxHashMap::default(),
            stacks: FxHashMap::default(),
            total: 0,
        }
    }

    /// Samples so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Hot functions by samples anywhere on the stack so far: (frame name, module, samples).
    pub fn hottest(&self) -> Vec<(String, String, u64)> {
        let profile = self.snapshot();
        profile.functions().into_iter().map(|f| (f.frame.name, f.frame.module, f.total_samples)).collect()
    }

    /// A process mapped executable code (or had it mapped when the recording began).
    pub fn mapped(&mut self, pid: u32, start: u64, len: u64, pgoff: u64, path: &str) {
        if path == "[uprobes]" {
            self.processes.entry(pid).or_default().trampoline = Some((start, start + len));
            return;
        }
        if !path.starts_with('/') {
            return;
        }
        let module = match self.module_ids.get(path) {
            Some(&id) => id,
            None => {
                let open = PathBuf::from(path);
                let open = if open.exists() { open } else { PathBuf::from(format!("/proc/{pid}/root{path}")) };
                self.modules.push(ModuleInfo::load(path, &open));
                self.module_ids.insert(path.to_string(), self.modules.len() - 1);
                self.modules.len() - 1
            }
        };
        let process = self.processes.entry(pid).or_default();
        process.mappings.retain(|m| m.end <= start || m.start >= start + len);
        process.mappings.push(Mapping { start, end: start + len, pgoff, module });
        process.mappings.sort_by_key(|m| m.start);
        // The unwinder is rebuilt with every mapping at the next sample.
        process.added = usize::MAX;
    }

    /// The in-process engine's code is at `range` in process `pid`: time
    /// spent there is the engine's.
    pub fn engine_code(&mut self, pid: u32, range: std::ops::Range<u64>) {
        self.processes.entry(pid).or_default().engine_code.push(range);
    }

    /// A process executed a new program: its old mappings are gone.
    pub fn exec(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// Takes in one sample. `returns` are the thread's return addresses by
    /// stack slot, for the slots where a return probe left its trampoline.
    pub fn sample(&mut self, sample: &StackSample, returns: &[(u64, u64)]) {
        self.total += 1;
        let [ip, sp, bp] = sample.regs;
        let mut addresses = self.unwind(sample.pid, ip, sp, bp, &sample.stack, returns);
        // In the kernel with a stack that does not unwind: the thread was
        // taken while a probe was handled, its registers half updated.
        let mid_probe = sample.in_kernel && addresses.iter().skip(1).any(|&a| !self.is_mapped(sample.pid, a));
        if mid_probe {
            addresses.clear();
        }
        let mut stack: Vec<u32> = Vec::with_capacity(addresses.len() * 2);
        let mut innermost_line = None;
        for (depth, address) in addresses.iter().enumerate() {
            // A return address points after the call: look up the call.
            let lookup = if depth == 0 { *address } else { address.saturating_sub(1) };
            let (frames, line) = self.symbolize(sample.pid, lookup);
            if depth == 0 {
                innermost_line = line;
            }
            stack.extend(frames);
        }
        if stack.is_empty() {
            let in_probe = mid_probe || self.processes.get(&sample.pid).is_some_and(|p| p.in_probe_area(ip));
            let reason = match (ip, in_probe) {
                (0, _) => "[unknown: no user stack]",
                // The kernel's probe area: time the probes themselves took.
                (_, true) => "[probe overhead]",
                _ => "[unknown: unmapped]",
            };
            stack.push(self.frame(reason, "", false));
        }
        if let Some(line) = innermost_line {
            *self.line_counts.entry(line).or_default() += 1;
        }
        stack.reverse();
        *self.stacks.entry(stack).or_default() += 1;
    }

    fn unwind(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8], returns: &[(u64, u64)]) -> Vec<u64> {
        if ip == 0 {
            return Vec::new();
        }
        let Some(process) = self.processes.get_mut(&pid) else { return vec![ip] };
        if process.in_probe_area(ip) {
            return Vec::new();
        }
        if process.added == usize::MAX {
            process.unwinder = UnwinderX86_64::new();
            for m in &process.mappings {
                let info = &self.modules[m.module];
                let (Some(unwind), Some(vaddr)) = (&info.unwind, info.vaddr(m.pgoff)) else { continue };
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
        let cache = process.cache.get_or_insert_with(|| Box::new(CacheX86_64::new()));
        let mut read_stack = |address: u64| -> Result<u64, ()> {
            let offset = address.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(offset..offset + 8).ok_or(())?;
            let value = u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?);
            // A return probe's trampoline (or the in-process engine's) stands
            // for the return address proftap saw at the entry.
            match returns.iter().find(|r| r.0 == address) {
                Some(r) if r.1 != value => Ok(r.1),
                _ if trampoline.contains(&value) => Err(()),
                _ => Ok(value),
            }
        };
        let mut frames = process.unwinder.iter_frames(ip, UnwindRegsX86_64::new(ip, sp, bp), cache, &mut read_stack);
        let mut addresses = Vec::new();
        while let Ok(Some(frame)) = frames.next() {
            let address = match frame {
                FrameAddress::InstructionPointer(a) => a,
                FrameAddress::ReturnAddress(a) => a.get(),
            };
            addresses.push(address);
            if addresses.len() >= MAX_DEPTH {
                break;
            }
        }
        addresses
    }

    fn is_mapped(&self, pid: u32, address: u64) -> bool {
        self.processes.get(&pid).is_some_and(|p| p.mappings.iter().any(|m| (m.start..m.end).contains(&address)))
    }

    /// Frames (innermost first, inlined frames included) and the line of an address.
    fn symbolize(&mut self, pid: u32, address: u64) -> (Vec<u32>, Option<u32>) {
        let mapping = self.processes.get(&pid).and_then(|p| {
            let i = p.mappings.partition_point(|m| m.start <= address).checked_sub(1)?;
            let m = &p.mappings[i];
            (address < m.end).then(|| m.clone())
        });
        let Some(mapping) = mapping else {
            return (vec![self.frame("[unknown: unmapped]", "", false)], None);
        };
        let info = &self.modules[mapping.module];
        let Some(vaddr) = info.vaddr(address - mapping.start + mapping.pgoff) else {
            let module = info.path.clone();
            return (vec![self.frame(&format!("[unknown: {module}]"), &module, false)], None);
        };
        if let Some(cached) = self.symbolized.get(&(mapping.module, vaddr)) {
            return cached.clone();
        }
        let info = &self.modules[mapping.module];
        let module = info.path.clone();
        let function = info.symbols.as_ref().and_then(|s| s.function_at(crate::addr::VirtAddr(vaddr))).map(|f| f.name.clone());
        let mut names: Vec<(String, bool)> = Vec::new();
        let mut line = None;
        if let Some(loader) = &info.lines
            && let Ok(mut frames) = loader.find_frames(vaddr)
        {
            let mut found = Vec::new();
            while let Ok(Some(frame)) = frames.next() {
                let name = frame.function.as_ref().and_then(|f| f.raw_name().ok()).map(|raw| demangle_name(&raw));
                let location = frame.location.as_ref().and_then(|l| Some((l.file?.to_string(), l.line?)));
                found.push((name, location));
            }
            if let Some((_, Some((file, l)))) = found.first() {
                line = Some((file.clone(), *l));
            }
            // Inlined frames are all but the outermost, which is the function itself.
            for (name, _) in found.iter().take(found.len().saturating_sub(1)) {
                if let Some(name) = name {
                    names.push((name.clone(), true));
                }
            }
        }
        match function {
            Some(name) => names.push((name, false)),
            None => {
                let why = info.unknown.clone().unwrap_or_else(|| format!("no symbol in {module}"));
                names.push((format!("[unknown: {why}]"), false));
            }
        }
        let frames: Vec<u32> = names.iter().map(|(n, inlined)| self.frame(n, &module, *inlined)).collect();
        let line = line.map(|key| match self.line_ids.get(&key) {
            Some(&id) => id,
            None => {
                self.lines.push(key.clone());
                self.line_ids.insert(key, (self.lines.len() - 1) as u32);
                (self.lines.len() - 1) as u32
            }
        });
        self.symbolized.insert((mapping.module, vaddr), (frames.clone(), line));
        (frames, line)
    }

    fn frame(&mut self, name: &str, module: &str, inlined: bool) -> u32 {
        let frame = SampledFrame { name: name.into(), module: module.into(), inlined };
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        self.frames.push(frame.clone());
        let id = (self.frames.len() - 1) as u32;
        self.frame_ids.insert(frame, id);
        id
    }

    fn snapshot(&self) -> SampleProfile {
        let mut stacks: Vec<SampledStack> =
            self.stacks.iter().map(|(frames, &count)| SampledStack { frames: frames.clone(), count }).collect();
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        let mut lines: Vec<SampledLine> = self
            .line_counts
            .iter()
            .map(|(&id, &count)| SampledLine { file: self.lines[id as usize].0.clone(), line: self.lines[id as usize].1, count })
            .collect();
        lines.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        SampleProfile {
            event: self.event.clone(),
            frequency_hz: self.frequency_hz,
            total: self.total,
            frames: self.frames.clone(),
            stacks,
            lines,
        }
    }

    /// The samples as a profile.
    pub fn finish(self) -> SampleProfile {
        self.snapshot()
    }
}

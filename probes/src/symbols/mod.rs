//! The symbolizer: functions, their file offsets and declarations, and line
//! tables of one ELF file, with its debug info found wherever it is kept.

mod cache;
mod debuginfo;
mod debuginfod;
mod demangle;
mod dwarf;
mod elf;
mod inlined;
mod kept;
mod kernel;
mod perf_map;
mod units;

pub use cache::SymbolCache;
pub use debuginfo::{DebugDirs, DebugSource};
pub use debuginfod::{Debuginfod, FetchProgress, MAX_DOWNLOAD, Unheard};
pub(crate) use dwarf::LinesByAddress;
pub use dwarf::{CompileUnit, FileTable, LineRow, normalize_path};
pub use elf::{ElfImage, ElfKind, FileVersion, SectionBytes, Segment, file_offset, hex};
pub use inlined::{Declaration, FrameReader, FramesAt};
pub use kept::kept_file_is_used;
pub use kernel::{KERNEL_IMAGE, KernelSymbols};
pub use perf_map::{JitNames, PerfMap, PerfMapPlace};

/// The demangled form of a symbol name (C++, Rust), or the name itself.
pub fn demangle_name(raw: &str) -> String {
    demangle::demangle(raw).full
}

/// Where the function named `name` (demangled) is declared, by the debug
/// info of the module at `path` (its own, or its separate debug file in
/// `dirs`): also a function the compiler inlined everywhere, which samples
/// name and no symbol does (see [`FrameReader::declaration`]). The error
/// says which of the module, its debug info or the function was not found.
/// Only a regular file is opened: `path` may come from anyone's profile.
pub fn declaration(path: &Path, name: &str, dirs: &DebugDirs) -> std::result::Result<Declaration, String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("its module is named by a relative path, {shown}, which no recording writes"));
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(format!("{shown} is not a regular file")),
        Err(e) => return Err(format!("cannot read {shown}: {e}")),
    }
    let image = ElfImage::open(path).map_err(|e| e.to_string())?;
    let debug = match debuginfo::embedded_dwarf(&image) {
        Some(_) => Some(path.to_path_buf()),
        None => debuginfo::find_separate(&image, dirs, &mut Vec::new()).and_then(|(_, source)| source.file(path)),
    };
    let Some(debug) = debug else {
        let dirs: Vec<String> = dirs.0.iter().map(|d| d.display().to_string()).collect();
        return Err(format!("{shown} has no debug info, nor a separate debug file in {}", dirs.join(" or ")));
    };
    let reader = FrameReader::open(&debug).ok_or_else(|| format!("cannot read the debug info in {}", debug.display()))?;
    reader.declaration(name).ok_or_else(|| format!("the debug info of {shown} declares no function named '{name}'"))
}

use crate::addr::{FileOffset, VirtAddr};
use crate::error::{Error, Result};
use crate::parallel::on_all_cpus;
use kept::KeptFunction;
use object::{Object, ObjectSymbol, SymbolKind};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What to load besides functions.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Also read every line-table row.
    pub lines: bool,
    /// Where separate debug files are looked for.
    pub debug_dirs: DebugDirs,
    /// The debuginfod servers and cache asked when no debug file is on
    /// disk (`None`: no network use).
    pub debuginfod: Option<Debuginfod>,
    /// Name functions from the symbol tables alone when they have any,
    /// leaving the DWARF's unread: what naming sampled frames of a library
    /// needs (its inlined frames are read lazily, where samples fell),
    /// without decompressing and walking all of a large library's DWARF.
    pub symbol_tables_enough: bool,
    /// Where what is read of the file (its DWARF, its symbol table's
    /// functions, demangled) is kept for the next load of the same version
    /// of it, and looked for first (none: read afresh, nothing kept).
    pub kept_reads: Option<PathBuf>,
}

/// Which table a function was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SymbolOrigin {
    /// The full symbol table.
    Symtab,
    /// The dynamic symbol table only (a stripped file).
    Dynsym,
    /// DWARF only: no symbol names the address.
    Dwarf,
}

/// A function of a binary.
#[derive(Clone, Debug)]
pub struct Function {
    /// Demangled name (`ns::f(int)`, `crate::module::f`).
    pub name: String,
    /// The demangled name without its parameter list, where it has one (`ns::f`).
    pub base_name: Option<String>,
    /// The symbol as the binary spells it.
    pub raw_name: String,
    /// Demangled names of other symbols at the same address.
    pub aliases: Vec<String>,
    /// Entry address.
    pub address: VirtAddr,
    /// Size in bytes (0 when neither symbol nor DWARF says).
    pub size: u64,
    /// Where a uprobe on the entry goes; `None` if the address is not backed by the file.
    pub file_offset: Option<FileOffset>,
    /// Declaration file id in [`SymbolIndex::files`].
    pub decl_file: Option<u32>,
    /// Declaration line (0 when unknown).
    pub decl_line: u32,
    /// Whether DWARF describes this function.
    pub has_dwarf: bool,
    /// Where DWARF describes it: the offset of its entry in `.debug_info`
    /// of the file [`SymbolIndex::debug`] names.
    pub die: Option<u64>,
    /// Where the function was found.
    pub origin: SymbolOrigin,
}

/// Gives functions of one name at different addresses names of their own
/// (`name #2`, `name #3`, in address order after the first): a Rust
/// generic's instances, C `static` functions of one name in several files.
/// A profile keys functions by name, so namesakes would share their
/// numbers, and time sampled in one would be taken out of another's. The
/// plain name stays one of its names (an alias), which patterns match.
/// Versions of one symbol of a library without debug info (`memcpy`'s
/// `GLIBC_2.2.5` and `GLIBC_2.14`: one raw name) keep their name.
fn distinguish_namesakes(functions: &mut [Function]) {
    // By name: how many so far, and the first one's raw name.
    let mut seen: HashMap<String, (u32, String)> = HashMap::new();
    for f in functions.iter_mut() {
        let (copies, first_raw) = seen.entry(f.name.clone()).or_insert_with(|| (0, f.raw_name.clone()));
        *copies += 1;
        if *copies > 1 && (f.raw_name != *first_raw || f.has_dwarf) {
            let plain = std::mem::take(&mut f.name);
            f.name = format!("{plain} #{copies}");
            f.aliases.insert(0, plain);
        }
    }
}

/// Names of C runtime scaffolding that no user wants in a profile.
const SCAFFOLDING: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "frame_dummy",
    "register_tm_clones",
    "deregister_tm_clones",
    "__do_global_dtors_aux",
    "__libc_csu_init",
    "__libc_csu_fini",
    "_dl_relocate_static_pie",
];

impl Function {
    /// Whether this is C runtime start-up or tear-down code.
    pub fn is_scaffolding(&self) -> bool {
        SCAFFOLDING.contains(&self.raw_name.as_str()) || self.raw_name.starts_with("__x86.get_pc_thunk")
    }

    /// Whether this is the cold part of a function split by the compiler
    /// (`f.cold`): it is jumped to, never called, so it has no calls to count.
    pub fn is_cold_part(&self) -> bool {
        self.raw_name.contains(".cold")
    }

    /// Every name a pattern may match: demangled, without parameters, raw, aliases.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str())
            .chain(self.base_name.as_deref())
            .chain(std::iter::once(self.raw_name.as_str()))
            .chain(self.aliases.iter().map(String::as_str))
    }
}

/// Functions, and optionally line rows, of one ELF file.
pub struct SymbolIndex {
    /// The file as given.
    pub path: PathBuf,
    /// GNU build-id, lower-case hex.
    pub build_id: Option<String>,
    /// Executable, PIE or shared library.
    pub kind: ElfKind,
    /// Where the DWARF came from.
    pub debug: DebugSource,
    /// Functions sorted by address, one per address.
    pub functions: Vec<Function>,
    /// Source file paths referred to by functions and rows.
    pub files: FileTable,
    /// Compilation units with their slices of `line_rows` (only when lines were asked for).
    pub units: Vec<CompileUnit>,
    /// Every line-table row, by unit (only when lines were asked for).
    pub line_rows: Vec<LineRow>,
    /// Loadable segments of the binary.
    pub segments: Vec<Segment>,
    /// Functions the binary imports from shared libraries (undefined dynamic symbols).
    pub imports: Vec<String>,
    /// Labels of code that no function symbol covers (symbols of no type in
    /// executable segments, as hand-written assembly leaves: the dynamic
    /// loader's `_start`), by address: names for samples, never probed.
    pub labels: Vec<(VirtAddr, String)>,
    /// Things the user should know: stripped file, rejected debug files, damaged units.
    pub warnings: Vec<String>,
}

impl SymbolIndex {
    /// Reads the functions (and with `options.lines`, line rows) of `path`.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        SymbolIndex::of_image(&ElfImage::open(path)?, options)
    }

    /// The same for a file already opened.
    pub fn of_image(image: &ElfImage, options: &LoadOptions) -> Result<Self> {
        SymbolIndex::of_image_observed(image, options, &Unheard)
    }

    /// The same, telling `progress` about debug info being downloaded.
    pub fn of_image_observed(image: &ElfImage, options: &LoadOptions, progress: &dyn FetchProgress) -> Result<Self> {
        let path = image.path();
        let segments = image.segments()?;
        let kind = image.kind()?;
        let build_id = image.build_id()?;
        let mut warnings = Vec::new();

        let separate;
        let (debug_image, debug) = match debuginfo::embedded_dwarf(image) {
            Some(compressed) => (Some(image), DebugSource::Embedded { compressed }),
            None => match debuginfo::find_separate(image, &options.debug_dirs, &mut warnings).or_else(|| {
                let settings = options.debuginfod.as_ref()?;
                debuginfod::find(image, settings, progress, &mut warnings)
            }) {
                Some((found, source)) => {
                    separate = found;
                    (Some(&separate), source)
                }
                None => (None, DebugSource::Missing),
            },
        };

        let mut labels = BTreeMap::new();
        let mut origin = SymbolOrigin::Symtab;
        let elf = image.parse()?;
        let imports = image.imports()?;
        collect_labels(elf.symbols(), &segments, &mut labels);
        let kept_reads = options.kept_reads.as_deref();
        let by_address = |functions: Vec<KeptFunction>, origin| -> BTreeMap<u64, Function> {
            functions.into_iter().map(|f| (f.address, Function::named_in_symbols(f, origin, &segments))).collect()
        };
        let mut functions =
            by_address(kept::symbol_table(kept_reads, image, kept::SymbolTable::Own, || functions_named_in(elf.symbols())), origin);
        if functions.is_empty()
            && let Some(debug_image) = debug_image.filter(|d| !std::ptr::eq(*d, image))
        {
            // `objcopy --only-keep-debug` leaves the full symbol table in the debug file.
            let debug_elf = debug_image.parse()?;
            let own = || functions_named_in(debug_elf.symbols());
            functions = by_address(kept::symbol_table(kept_reads, debug_image, kept::SymbolTable::Own, own), origin);
            collect_labels(debug_elf.symbols(), &segments, &mut labels);
        }
        if functions.is_empty() {
            origin = SymbolOrigin::Dynsym;
            let dynamic = || functions_named_in(elf.dynamic_symbols());
            functions = by_address(kept::symbol_table(kept_reads, image, kept::SymbolTable::Dynamic, dynamic), origin);
        }

        let mut files = FileTable::default();
        let info = match debug_image {
            Some(d) if !options.symbol_tables_enough || functions.is_empty() => {
                kept::read(kept_reads, d, &mut files, options.lines, &mut warnings)?
            }
            _ => dwarf::DwarfInfo::default(),
        };

        if functions.is_empty() && info.subprograms.is_empty() {
            let detail = warnings.iter().map(|w| format!("; {w}")).collect();
            return Err(Error::NoSymbols { path: path.into(), detail });
        }
        if origin == SymbolOrigin::Dynsym {
            warnings.push(format!(
                "{} has no symbol table (stripped): only its {} exported functions are known; install its debug info to see the rest",
                path.display(),
                functions.len()
            ));
        }
        if matches!(debug, DebugSource::Missing) {
            // With servers set, their warning said why they could not help.
            let servers = if options.debuginfod.is_none() { ", set DEBUGINFOD_URLS to a debuginfod server that has it," } else { "" };
            warnings.push(format!(
                "{} has no debug info: no source files or lines; install its debug package{servers} or build with -g",
                path.display()
            ));
        }

        for sub in info.subprograms {
            for (i, range) in sub.ranges.iter().enumerate() {
                match functions.get_mut(&range.start) {
                    Some(f) => {
                        f.has_dwarf = true;
                        f.die = f.die.or(sub.die);
                        f.decl_file = f.decl_file.or(sub.decl_file);
                        if f.decl_line == 0 {
                            f.decl_line = sub.decl_line;
                        }
                        if f.size == 0 {
                            f.size = range.end - range.start;
                        }
                    }
                    // A function DWARF knows and no symbol names: its entry is the first range.
                    None if i == 0 => {
                        let Some(raw) = sub.linkage_name.clone().or_else(|| sub.name.clone()) else { continue };
                        let names = demangle::demangle(&raw);
                        let address = VirtAddr(range.start);
                        functions.insert(
                            range.start,
                            Function {
                                name: names.full,
                                base_name: names.base,
                                raw_name: raw,
                                aliases: Vec::new(),
                                address,
                                size: range.end - range.start,
                                file_offset: file_offset(&segments, address),
                                decl_file: sub.decl_file,
                                decl_line: sub.decl_line,
                                has_dwarf: true,
                                die: sub.die,
                                origin: SymbolOrigin::Dwarf,
                            },
                        );
                    }
                    None => {}
                }
            }
        }

        let mut functions: Vec<Function> = functions.into_values().collect();
        distinguish_namesakes(&mut functions);
        Ok(SymbolIndex {
            path: path.into(),
            build_id,
            kind,
            debug,
            functions,
            files,
            units: info.units,
            line_rows: info.rows,
            segments,
            imports,
            labels: labels.into_iter().map(|(address, name)| (VirtAddr(address), name)).collect(),
            warnings,
        })
    }

    /// The declaration `file:line` of a function, if DWARF gave one.
    pub fn decl_path(&self, function: &Function) -> Option<&str> {
        function.decl_file.map(|id| self.files.path(id))
    }

    /// The function whose code contains `addr`.
    pub fn function_at(&self, addr: VirtAddr) -> Option<&Function> {
        let i = self.functions.partition_point(|f| f.address <= addr).checked_sub(1)?;
        let f = &self.functions[i];
        // A symbol of no size (crtstuff's `__do_global_dtors_aux`, hand-written
        // assembly) reaches the next one, as perf names such frames. Sizes
        // come from the file: one may reach past the end of the address space.
        let end = match f.size {
            0 => self.functions.get(i + 1).map_or(f.address.0.saturating_add(1), |next| next.address.0),
            size => f.address.0.saturating_add(size),
        };
        (addr.0 < end).then_some(f)
    }

    /// The name of the code at `addr`: its function's, else the label
    /// before it when no function starts between them (a function of no
    /// size reaches only as far as the next label).
    pub fn name_at(&self, addr: VirtAddr) -> Option<&str> {
        let function = self.function_at(addr);
        let label = self.labels.partition_point(|(at, _)| *at <= addr).checked_sub(1).map(|i| &self.labels[i]).filter(|(at, _)| {
            let next_function = self.functions.partition_point(|f| f.address <= *at);
            self.functions.get(next_function).is_none_or(|f| f.address > addr)
        });
        match (function, label) {
            (Some(f), Some((at, name))) if f.size == 0 && *at > f.address => Some(name),
            (Some(f), _) => Some(&f.name),
            (None, label) => label.map(|(_, name)| name.as_str()),
        }
    }

    /// Whether this is a position-independent executable.
    pub fn is_pie(&self) -> bool {
        self.kind == ElfKind::PieExecutable
    }
}

/// Below this many symbols, they are demangled on the calling thread.
const SYMBOLS_WORTH_THREADS: usize = 20_000;

/// Symbols that share an address.
#[derive(Default)]
struct SymbolGroup {
    /// (rank, raw name): lower rank is the better name to show.
    names: Vec<((u8, bool, usize), String)>,
    size: u64,
}

impl SymbolGroup {
    fn into_function(mut self, address: u64) -> KeptFunction {
        self.names.sort();
        self.names.dedup_by(|a, b| a.1 == b.1);
        let mut names = self.names.into_iter().map(|(_, n)| n);
        let raw_name = names.next().unwrap_or_default();
        let primary = demangle::demangle(&raw_name);
        let mut aliases: Vec<String> = names.map(|n| demangle::demangle(&n).full).filter(|n| *n != primary.full).collect();
        aliases.dedup();
        KeptFunction { address, size: self.size, raw_name, name: primary.full, base_name: primary.base, aliases }
    }
}

impl Function {
    /// A function a symbol table of `origin` names, where `segments` map it.
    fn named_in_symbols(f: KeptFunction, origin: SymbolOrigin, segments: &[Segment]) -> Function {
        let address = VirtAddr(f.address);
        Function {
            name: f.name,
            base_name: f.base_name,
            raw_name: f.raw_name,
            aliases: f.aliases,
            address,
            size: f.size,
            file_offset: file_offset(segments, address),
            decl_file: None,
            decl_line: 0,
            has_dwarf: false,
            die: None,
            origin,
        }
    }
}

/// The functions a symbol table names, one per address, demangled, by address.
fn functions_named_in<'d: 'f, 'f>(table: impl Iterator<Item = object::read::elf::ElfSymbol64<'d, 'f>>) -> Vec<KeptFunction> {
    let mut symbols = BTreeMap::new();
    collect_symbols(table, &mut symbols);
    // Demangling a large C++ program's symbols (`node`'s 150 000) took
    // 200 ms on one CPU.
    on_all_cpus(symbols.into_iter().collect(), SYMBOLS_WORTH_THREADS, |(address, group)| group.into_function(address))
}

fn collect_symbols<'d: 'f, 'f>(table: impl Iterator<Item = object::read::elf::ElfSymbol64<'d, 'f>>, out: &mut BTreeMap<u64, SymbolGroup>) {
    for symbol in table {
        if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        if name.is_empty() {
            continue;
        }
        // Prefer a global name to a weak one to a local one, then a name
        // without a leading underscore (`malloc` over `__libc_malloc`), then the shorter.
        let binding = if symbol.is_weak() {
            1
        } else if symbol.is_global() {
            0
        } else {
            2
        };
        let group = out.entry(symbol.address()).or_default();
        group.size = group.size.max(symbol.size());
        group.names.push(((binding, name.starts_with('_'), name.len()), name.to_string()));
    }
}

/// Symbols of no type defined in executable segments (labels in
/// hand-written assembly), by address, the first name kept.
fn collect_labels<'d: 'f, 'f>(
    table: impl Iterator<Item = object::read::elf::ElfSymbol64<'d, 'f>>,
    segments: &[Segment],
    out: &mut BTreeMap<u64, String>,
) {
    for symbol in table {
        let address = symbol.address();
        let in_code = segments.iter().any(|s| s.executable && (s.vaddr.0..s.vaddr.0.saturating_add(s.mem_size)).contains(&address));
        let no_type = object::read::elf::Sym::st_type(symbol.elf_symbol()) == object::elf::STT_NOTYPE;
        if !no_type || !symbol.is_definition() || address == 0 || !in_code {
            continue;
        }
        if let Ok(name) = symbol.name()
            && !name.is_empty()
        {
            out.entry(address).or_insert_with(|| name.to_string());
        }
    }
}

#[cfg(test)]
mod tests;

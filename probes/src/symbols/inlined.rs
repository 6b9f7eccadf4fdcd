//! The calls inlined at an address and its source line, read from the
//! DWARF of the one function that holds it.
//!
//! addr2line answers the same question by first reading the ranges of
//! every compilation unit, then every function of the address's unit. A
//! Rust program's units are whole crates: naming the few hundred
//! addresses a short run samples cost tens of milliseconds of CPU, taken
//! from the program on a busy machine or added after it ended
//! (BENCHMARKS.md). The symbol index already knows where each function's
//! entry is in `.debug_info`; this reads that entry's children, and the
//! line table of its unit once.

use super::dwarf::{FileTable, HeaderBudget, LinesByAddress, code_ranges, code_ranges_within, read_rows_of, unit_files};
use super::elf::{ElfImage, SectionBytes};
use super::units::{MOST_UNITS, with_tables_apart};
use gimli::{AttributeValue, Reader as _, RunTimeEndian, UnitOffset};
use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

type Reader = gimli::EndianReader<RunTimeEndian, SectionBytes>;

/// Inlined calls deeper than this are not followed (hostile DWARF can nest
/// them without end; real code rarely passes 30).
const MOST_INLINED: usize = 128;

/// How many `DW_AT_abstract_origin` and `DW_AT_specification` links a name
/// is followed through, as addr2line does.
const MOST_NAME_LINKS: usize = 16;

/// Inlined calls read of one function (the largest real ones have some
/// tens of thousands), and kept of all functions read: past that, those
/// kept are read again as they are needed.
const MOST_CALLS_OF_A_FUNCTION: usize = 1 << 17;
const MOST_CALLS_KEPT: usize = 1 << 21;

/// Units kept read: past that, those kept are read again as they are
/// needed (each charged to the bound on line-table headers again).
const MOST_UNITS_KEPT: usize = 4096;

/// Ranges read from the units' own entries, all units together, where no
/// `.debug_aranges` say which unit holds which code (a unit lists a range
/// for each of its functions).
const MOST_UNIT_RANGES: usize = 1 << 22;

/// Rows of line tables kept: past that, those kept are read again as they
/// are needed.
const MOST_ROWS_KEPT: usize = 1 << 23;

/// The sections read: a compressed one is decompressed whole, so those
/// that only describe types and variables are not.
const SECTIONS_READ: [gimli::SectionId; 10] = [
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugAranges,
];

/// What DWARF says of one address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FramesAt {
    /// The names of the calls inlined there, innermost first, as the
    /// binary spells them (mangled where it mangles).
    pub inlined: Vec<String>,
    /// Its source file and line.
    pub line: Option<(String, u32)>,
}

/// A debug file's DWARF, read one function and one unit at a time.
pub struct FrameReader {
    dwarf: gimli::Dwarf<Reader>,
    /// Every unit's header, in the order of their offsets.
    headers: Vec<gimli::UnitHeader<Reader>>,
    /// The units read so far, by their index in `headers` (`None`: damaged).
    units: RefCell<HashMap<usize, Option<Arc<gimli::Unit<Reader>>>>>,
    /// The line tables read so far, by their offset in `.debug_line` and
    /// the directory their relative paths start from: units may share one
    /// (hostile ones, thousands of them).
    lines: RefCell<HashMap<TableKey, Arc<Option<LineTable>>>>,
    rows_kept: std::cell::Cell<usize>,
    /// Line-table headers parsed with the units, against a bound.
    budget: RefCell<HeaderBudget>,
    /// The inlined calls of the functions read so far, by their entry, and
    /// how many they are.
    calls: RefCell<HashMap<u64, Arc<Vec<InlinedCall>>>>,
    calls_kept: std::cell::Cell<usize>,
    /// Which unit holds which code, for code no function entry names.
    aranges: OnceCell<Vec<(u64, u64, usize)>>,
}

/// An inlined call of a function, in the order of the function's entries:
/// the calls within it follow it, up to the one at `end`.
struct InlinedCall {
    ranges: Vec<std::ops::Range<u64>>,
    /// Its entry, whose name is read when an address is found in it.
    offset: UnitOffset<usize>,
    end: usize,
}

/// A unit's line table: the file (an id in `files`) and line of each
/// address where a row starts (line 0: none).
struct LineTable {
    lines: LinesByAddress,
    files: FileTable,
}

/// A line table's offset in `.debug_line`, and the directory its relative
/// paths start from.
type TableKey = (usize, Option<String>);

impl FrameReader {
    /// Reads the unit headers of the DWARF in the file at `path`.
    pub fn open(path: &Path) -> Option<FrameReader> {
        let image = Arc::new(ElfImage::open(path).ok()?);
        let elf = image.parse().ok()?;
        let sections = gimli::DwarfSections::load(|id| -> Result<SectionBytes, String> {
            match object::Object::section_by_name(&elf, id.name()).filter(|_| SECTIONS_READ.contains(&id)) {
                Some(section) => SectionBytes::of_section(&image, &section),
                None => Ok(SectionBytes::default()),
            }
        })
        .ok()?;
        let mut dwarf = sections.borrow(|bytes| gimli::EndianReader::new(bytes.clone(), RunTimeEndian::Little));
        let mut headers = Vec::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            if headers.len() == MOST_UNITS {
                break;
            }
            headers.push(header);
        }
        let (headers, _) = with_tables_apart(&mut dwarf, headers);
        let budget = RefCell::new(HeaderBudget::new(gimli::Reader::len(gimli::Section::reader(&dwarf.debug_line))));
        let (units, lines, calls, aranges) = (RefCell::default(), RefCell::default(), RefCell::default(), OnceCell::new());
        let (rows_kept, calls_kept) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        Some(FrameReader { dwarf, headers, units, lines, rows_kept, budget, calls, calls_kept, aranges })
    }

    /// The inlined calls and the line at `address`, in the function whose
    /// entry is at `die` in `.debug_info` (its line alone where no entry is known).
    pub fn at(&self, address: u64, die: Option<u64>) -> FramesAt {
        self.read_at(address, die, true)
    }

    /// The inlined calls at `address`, as [`FrameReader::at`] finds them,
    /// without the line: a caller's frame needs none, and a unit's line
    /// table is the costliest part to read.
    pub fn inlined_at(&self, address: u64, die: Option<u64>) -> Vec<String> {
        self.read_at(address, die, false).inlined
    }

    fn read_at(&self, address: u64, die: Option<u64>, with_line: bool) -> FramesAt {
        let place = die.and_then(|die| self.unit_holding(die));
        let unit = match &place {
            Some((index, _)) => self.unit(*index),
            None => self.unit_with_code(address).and_then(|index| self.unit(index)),
        };
        let Some(unit) = unit else { return FramesAt::default() };
        let mut inlined = Vec::new();
        if let (Some((_, offset)), Some(die)) = (place, die) {
            self.inlined_calls(&unit, die, offset, address, &mut inlined);
            inlined.reverse();
        }
        FramesAt { inlined, line: if with_line { self.line_at(&unit, address) } else { None } }
    }

    /// The index of the unit holding the entry at `die`, and its offset in that unit.
    fn unit_holding(&self, die: u64) -> Option<(usize, UnitOffset<usize>)> {
        let die = gimli::DebugInfoOffset(usize::try_from(die).ok()?);
        let index = self.headers.partition_point(|h| h.debug_info_offset().is_some_and(|o| o <= die)).checked_sub(1)?;
        Some((index, die.to_unit_offset(&self.headers[index])?))
    }

    /// The unit `index`, read once (none once the line-table headers parsed
    /// with units pass their bound).
    fn unit(&self, index: usize) -> Option<Arc<gimli::Unit<Reader>>> {
        if let Some(unit) = self.units.borrow().get(&index) {
            return unit.clone();
        }
        let unit = self.read_unit(index).map(Arc::new);
        let mut kept = self.units.borrow_mut();
        if kept.len() >= MOST_UNITS_KEPT {
            kept.clear();
        }
        kept.insert(index, unit.clone());
        unit
    }

    /// The unit `index`, read again, within the bound on line-table headers.
    fn read_unit(&self, index: usize) -> Option<gimli::Unit<Reader>> {
        let mut budget = self.budget.borrow_mut();
        if budget.spent() {
            return None;
        }
        let unit = self.dwarf.unit(self.headers.get(index)?.clone()).ok()?;
        budget.charge(&unit);
        Some(unit)
    }

    /// The unit that holds the code at `address`: as `.debug_aranges`
    /// says, else as the unit's own entry says (clang writes no aranges).
    fn unit_with_code(&self, address: u64) -> Option<usize> {
        let aranges = self.aranges();
        let i = aranges.partition_point(|(start, _, _)| *start <= address).checked_sub(1)?;
        let (_, end, unit) = aranges[i];
        (address < end).then_some(unit)
    }

    /// Reads now which unit holds which code, for addresses no function's
    /// entry names (code the symbol table knows nothing of, or whose entry
    /// is not found). On a thread of its own, before a program runs, that
    /// is time the sampler need not take beside the program.
    pub fn read_ahead(&self) {
        self.aranges();
    }

    /// Which unit holds which code: the ranges `.debug_aranges` gives, and
    /// those of the units it does not describe (clang writes none), sorted.
    fn aranges(&self) -> &[(u64, u64, usize)] {
        self.aranges.get_or_init(|| {
            let mut ranges = Vec::new();
            let mut headers = self.dwarf.debug_aranges.headers();
            while let Ok(Some(header)) = headers.next() {
                let offset = Some(header.debug_info_offset());
                let unit = self.headers.partition_point(|h| h.debug_info_offset() < offset);
                if self.headers.get(unit).map(gimli::UnitHeader::debug_info_offset) != Some(offset) {
                    continue;
                }
                let mut entries = header.entries();
                while let Ok(Some(entry)) = entries.next() {
                    let range = entry.range();
                    if range.begin != 0 && range.end > range.begin {
                        ranges.push((range.begin, range.end, unit));
                    }
                }
            }
            let described: std::collections::HashSet<usize> = ranges.iter().map(|&(_, _, unit)| unit).collect();
            let mut left = MOST_UNIT_RANGES;
            for index in (0..self.headers.len()).filter(|i| !described.contains(i)) {
                // Read for their root alone, not kept.
                let Some(unit) = self.read_unit(index) else { continue };
                let mut entries = unit.entries();
                let Ok(Some(root)) = entries.next_dfs() else { continue };
                let code = code_ranges_within(&self.dwarf, &unit, root.attrs(), left).unwrap_or_default();
                left = left.saturating_sub(code.len());
                ranges.extend(code.into_iter().map(|range| (range.start, range.end, index)));
            }
            ranges.sort_unstable();
            ranges
        })
    }

    /// Pushes the names of the calls inlined into the function whose entry
    /// is at `offset` (`die` in `.debug_info`) that hold `address`,
    /// outermost first: each within the one before.
    fn inlined_calls(&self, unit: &gimli::Unit<Reader>, die: u64, offset: UnitOffset<usize>, address: u64, names: &mut Vec<String>) {
        let calls = self.calls_of(unit, die, offset);
        let (mut i, mut end) = (0, calls.len());
        while i < end && names.len() < MOST_INLINED {
            let call = &calls[i];
            if call.ranges.iter().any(|range| range.contains(&address)) {
                names.extend(unit.entry(call.offset).ok().and_then(|entry| self.name(unit, &entry, MOST_NAME_LINKS)));
                end = end.min(call.end);
                i += 1;
            } else {
                i = call.end.max(i + 1);
            }
        }
    }

    /// The inlined calls of the function whose entry is at `offset`, read once.
    fn calls_of(&self, unit: &gimli::Unit<Reader>, die: u64, offset: UnitOffset<usize>) -> Arc<Vec<InlinedCall>> {
        if let Some(calls) = self.calls.borrow().get(&die) {
            return calls.clone();
        }
        let calls = Arc::new(self.read_calls(unit, offset));
        let mut kept = self.calls.borrow_mut();
        if self.calls_kept.get() + calls.len() > MOST_CALLS_KEPT {
            kept.clear();
            self.calls_kept.set(0);
        }
        self.calls_kept.set(self.calls_kept.get() + calls.len());
        kept.insert(die, calls.clone());
        calls
    }

    /// The inlined calls of the function whose entry is at `offset`, in
    /// the order of their entries, directly in it or in a lexical block (or
    /// any other entry that is not a function of its own); as many as could
    /// be read.
    fn read_calls(&self, unit: &gimli::Unit<Reader>, offset: UnitOffset<usize>) -> Vec<InlinedCall> {
        let mut calls: Vec<InlinedCall> = Vec::new();
        let Ok(mut entries) = unit.entries_at_offset(offset) else { return calls };
        let root = match entries.next_dfs() {
            Ok(Some(function)) if function.tag() == gimli::DW_TAG_subprogram => function.depth(),
            _ => return calls,
        };
        // The calls whose entries are still open, by depth; and the depth of
        // a nested function, whose entries are stepped over.
        let mut open: Vec<(isize, usize)> = Vec::new();
        let mut nested: Option<isize> = None;
        while let Ok(Some(entry)) = entries.next_dfs() {
            let depth = entry.depth();
            if depth <= root || calls.len() >= MOST_CALLS_OF_A_FUNCTION {
                break;
            }
            if nested.is_some_and(|nested| depth > nested) {
                continue;
            }
            nested = None;
            while let Some(&(open_depth, i)) = open.last() {
                if open_depth < depth {
                    break;
                }
                open.pop();
                calls[i].end = calls.len();
            }
            match entry.tag() {
                gimli::DW_TAG_subprogram => nested = Some(depth),
                gimli::DW_TAG_inlined_subroutine => {
                    let ranges = code_ranges(&self.dwarf, unit, entry.attrs()).unwrap_or_default();
                    open.push((depth, calls.len()));
                    calls.push(InlinedCall { ranges, offset: entry.offset(), end: 0 });
                }
                _ => {}
            }
        }
        for (_, i) in open {
            calls[i].end = calls.len();
        }
        calls
    }

    /// Where the function named `name` (demangled, as its frames are
    /// named) is declared, by the first entry of it that says: a function
    /// the compiler inlined everywhere has only the entries of its inlined
    /// copies and its abstract one, which the symbol table knows nothing of.
    pub fn declaration(&self, name: &str) -> Option<Declaration> {
        (0..self.headers.len()).find_map(|index| self.declaration_in(index, name))
    }

    fn declaration_in(&self, index: usize, name: &str) -> Option<Declaration> {
        let unit = self.read_unit(index)?;
        // Only mangled names that hold the name's last identifier are
        // demangled: a C++ program's millions of entries are not, nor a
        // hostile name whose demangled form doubles at each level.
        let identifier = last_identifier(name);
        let named = |entry: &gimli::DebuggingInformationEntry<Reader>| {
            self.name(&unit, entry, MOST_NAME_LINKS).is_some_and(|raw| {
                raw == name
                    || (raw.starts_with("_Z") || raw.starts_with("_R")) && raw.contains(identifier) && super::demangle_name(&raw) == name
            })
        };
        // A prototype (a header's, which a calling unit holds too, or a
        // method's in its class) is no definition: skipped.
        let (file, line) = subprograms(&unit)
            .filter(|entry| !is_declaration(entry) && named(entry))
            .find_map(|entry| declared(&unit, &entry, MOST_NAME_LINKS))?;
        let next = subprograms(&unit)
            .filter_map(|entry| declared(&unit, &entry, MOST_NAME_LINKS))
            .filter(|&(other, after)| other == file && after > line)
            .map(|(_, after)| after)
            .min();
        let comp_dir = unit.comp_dir.as_ref().and_then(|d| Some(d.to_string_lossy().ok()?.into_owned()));
        let mut table = FileTable::default();
        let ids = unit_files(&self.dwarf, &unit, comp_dir.as_deref(), &mut table);
        let file = table.path(ids.get(file as usize).copied().flatten()?).to_string();
        Some(Declaration { file, line, next })
    }

    /// The file and line of `address` in the line table of `unit`.
    fn line_at(&self, unit: &gimli::Unit<Reader>, address: u64) -> Option<(String, u32)> {
        let offset = unit.line_program.as_ref()?.header().offset().0;
        let comp_dir = unit.comp_dir.as_ref().and_then(|d| Some(d.to_string_lossy().ok()?.into_owned()));
        let key = (offset, comp_dir);
        let kept = self.lines.borrow().get(&key).cloned();
        let table = kept.unwrap_or_else(|| {
            let table = Arc::new(LineTable::read(&self.dwarf, unit));
            let rows = table.as_ref().as_ref().map_or(0, LineTable::rows);
            let mut lines = self.lines.borrow_mut();
            if self.rows_kept.get() + rows > MOST_ROWS_KEPT {
                lines.clear();
                self.rows_kept.set(0);
            }
            self.rows_kept.set(self.rows_kept.get() + rows);
            lines.insert(key, table.clone());
            table
        });
        table.as_ref().as_ref()?.line_at(address)
    }

    /// The name of the function the entry stands for, as addr2line finds it:
    /// its linkage name, else its name, else its origin's or specification's.
    fn name(&self, unit: &gimli::Unit<Reader>, entry: &gimli::DebuggingInformationEntry<Reader>, links: usize) -> Option<String> {
        let text = |value| self.dwarf.attr_string(unit, value).ok().and_then(|s| Some(s.to_string_lossy().ok()?.into_owned()));
        let mut name = None;
        let mut next = None;
        for attr in entry.attrs() {
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Some(linkage) = text(attr.value()) {
                        return Some(linkage);
                    }
                }
                gimli::DW_AT_name => name = name.or_else(|| text(attr.value())),
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => next = Some(attr.value()),
                _ => {}
            }
        }
        if name.is_some() || links == 0 {
            return name;
        }
        match next? {
            AttributeValue::UnitRef(offset) => self.name(unit, &unit.entry(offset).ok()?, links - 1),
            AttributeValue::DebugInfoRef(offset) => {
                let (index, offset) = self.unit_holding(offset.0 as u64)?;
                let other = self.unit(index)?;
                self.name(&other, &other.entry(offset).ok()?, links - 1)
            }
            _ => None,
        }
    }
}

/// Where a function is declared (see [`FrameReader::declaration`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declaration {
    /// The source file.
    pub file: String,
    /// The line.
    pub line: u32,
    /// The line of the next function its unit declares after it in the same file.
    pub next: Option<u32>,
}

/// The entries of `unit` that describe functions, as far as they can be read.
fn subprograms(unit: &gimli::Unit<Reader>) -> impl Iterator<Item = gimli::DebuggingInformationEntry<Reader>> + '_ {
    let mut entries = unit.entries();
    std::iter::from_fn(move || {
        loop {
            match entries.next_dfs() {
                Ok(Some(entry)) if entry.tag() == gimli::DW_TAG_subprogram => return Some(entry.clone()),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    })
}

/// The last identifier of a demangled name (`f` of `ns::f<int>(int)`),
/// which its mangled form spells as it is.
fn last_identifier(name: &str) -> &str {
    let mut head = name.split('(').next().unwrap_or(name).trim_end();
    // Template arguments at the end (`f<int>`) follow the identifier.
    if head.ends_with('>') {
        let mut depth = 0usize;
        for (at, c) in head.char_indices().rev() {
            match c {
                '>' => depth += 1,
                '<' if depth == 1 => {
                    head = &head[..at];
                    break;
                }
                '<' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    head.rsplit("::").next().unwrap_or(head).trim()
}

/// Whether an entry only declares its function (`DW_AT_declaration`).
fn is_declaration(entry: &gimli::DebuggingInformationEntry<Reader>) -> bool {
    matches!(entry.attr_value(gimli::DW_AT_declaration), Some(AttributeValue::Flag(true)))
}

/// The file (its index in the unit's line table) and line an entry of a
/// function says it is declared at, each where the entry has it, else
/// where its origin or specification says (within `links` of them in the
/// same unit: one in another unit numbers its files by that unit's table).
fn declared(unit: &gimli::Unit<Reader>, entry: &gimli::DebuggingInformationEntry<Reader>, links: usize) -> Option<(u64, u32)> {
    let (mut file, mut line, mut next) = (None, None, None);
    for attr in entry.attrs() {
        match (attr.name(), attr.value()) {
            // gimli gives the file of any constant form as an index.
            (gimli::DW_AT_decl_file, AttributeValue::FileIndex(i)) => file = Some(i),
            (gimli::DW_AT_decl_line, value) => line = value.udata_value().and_then(|l| u32::try_from(l).ok()).filter(|&l| l > 0),
            (gimli::DW_AT_abstract_origin | gimli::DW_AT_specification, AttributeValue::UnitRef(offset)) => next = Some(offset),
            _ => {}
        }
    }
    if let (Some(file), Some(line)) = (file, line) {
        return Some((file, line));
    }
    let origin = unit.entry(next.filter(|_| links > 0)?).ok()?;
    let (origin_file, origin_line) = declared(unit, &origin, links - 1)?;
    Some((file.unwrap_or(origin_file), line.unwrap_or(origin_line)))
}

impl LineTable {
    fn rows(&self) -> usize {
        self.lines.len()
    }

    /// The file and line of `address`.
    fn line_at(&self, address: u64) -> Option<(String, u32)> {
        let (_, &(file, line)) = self.lines.range(..=address).next_back()?;
        (line != 0 && file != u32::MAX).then(|| (self.files.path(file).to_string(), line))
    }

    /// The table of `unit`, as far as it could be read.
    fn read(dwarf: &gimli::Dwarf<Reader>, unit: &gimli::Unit<Reader>) -> Option<LineTable> {
        let program = unit.line_program.clone()?;
        let comp_dir = unit.comp_dir.as_ref().and_then(|d| Some(d.to_string_lossy().ok()?.into_owned()));
        let mut files = FileTable::default();
        let ids = unit_files(dwarf, unit, comp_dir.as_deref(), &mut files);
        let mut rows = Vec::new();
        let _ = read_rows_of(program, &ids, &mut rows);
        Some(LineTable { lines: LinesByAddress::of(&rows), files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{DebugDirs, LoadOptions, SymbolIndex, normalize_path};

    /// What addr2line says of `address`, as [`FramesAt`].
    fn addr2line_at(loader: &addr2line::Loader, address: u64) -> FramesAt {
        let mut found = Vec::new();
        let mut frames = loader.find_frames(address).expect("frames");
        while let Some(frame) = frames.next().expect("a frame") {
            let name = frame.function.as_ref().and_then(|f| f.raw_name().ok()).map(|raw| raw.into_owned());
            let location = frame.location.as_ref().and_then(|l| Some((normalize_path(Path::new(l.file?)), l.line?)));
            found.push((name, location));
        }
        let line = found.first().and_then(|(_, location)| location.clone());
        // The outermost frame is the function itself, which the symbol index names.
        let inlined = found.iter().take(found.len().saturating_sub(1)).filter_map(|(name, _)| name.clone()).collect();
        FramesAt { inlined, line }
    }

    /// Over every `stride`th function of the file at `path` (with a few
    /// addresses in each), the frames read from its entry alone against
    /// addr2line's from its whole unit; how many addresses had inlined calls.
    fn compare_with_addr2line(path: &Path, stride: usize, least: usize) -> usize {
        let options = LoadOptions {
            lines: false,
            debug_dirs: DebugDirs(Vec::new()),
            debuginfod: None,
            symbol_tables_enough: false,
            kept_reads: None,
        };
        let index = SymbolIndex::load(path, &options).expect("symbols");
        let reader = FrameReader::open(path).expect("debug info");
        let loader = addr2line::Loader::new(path).expect("addr2line");
        let (mut checked, mut inlined) = (0, 0);
        for function in index.functions.iter().filter(|f| f.die.is_some() && f.size > 0).step_by(stride) {
            let step = (function.size / 8).max(1);
            for address in (function.address.0..function.address.0 + function.size).step_by(step as usize) {
                let ours = reader.at(address, function.die);
                assert_eq!(ours, addr2line_at(&loader, address), "{address:#x} in {} of {}", function.name, path.display());
                checked += 1;
                inlined += usize::from(!ours.inlined.is_empty());
            }
        }
        assert!(checked >= least, "only {checked} addresses in {}", path.display());
        inlined
    }

    #[test]
    fn inlined_calls_and_lines_are_those_addr2line_reads_from_the_whole_unit() {
        // This test's own executable: Rust, optimized, hundreds of units.
        let inlined = compare_with_addr2line(&std::env::current_exe().expect("own path"), 7, 1000);
        assert!(inlined > 100, "only {inlined} addresses had inlined calls");
        // C at -O2, DWARF 4.
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/symbols/testdata/calls-O2-dwarf4");
        compare_with_addr2line(&c, 1, 50);
    }

    /// A function's declaration is found by its name whether it has code
    /// of its own (`leaf`) or was inlined everywhere (`atol`, from
    /// `stdlib.h`: an abstract entry and inlined copies only), not by a
    /// prototype, as `readelf --debug-dump=info` shows the test file's entries.
    #[test]
    fn a_declaration_is_found_by_name_inlined_everywhere_or_not() {
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/symbols/testdata/calls-O2-dwarf4");
        let reader = FrameReader::open(&c).expect("debug info");
        let atol = reader.declaration("atol").expect("atol's declaration");
        assert!(atol.file.ends_with("/stdlib.h") && atol.line == 367, "{atol:?}");
        let leaf = reader.declaration("leaf").expect("leaf's declaration");
        assert!(leaf.file.ends_with(".c") && leaf.line == 15, "{leaf:?}");
        // The next function declared in its file: `left`, at line 21.
        assert_eq!(leaf.next, Some(21));
        assert_eq!(reader.declaration("not_a_function"), None);
        // printf has only a prototype here (`DW_AT_declaration`): no definition.
        assert_eq!(reader.declaration("printf"), None);
        assert_eq!(last_identifier("ns::Walker<int>::step(int)"), "step");
        assert_eq!(last_identifier("mix"), "mix");
        assert_eq!(last_identifier("ns::f<a::b<int>>"), "f");
    }

    #[test]
    fn units_past_a_bound_or_whose_abbreviation_tables_run_into_one_another_are_left_unread() {
        use crate::symbols::{tests, units::MOST_UNITS};
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("program");
        std::fs::write(&path, tests::tables_inside_one_another(2000)).expect("write the program");
        let reader = FrameReader::open(&path).expect("its DWARF");
        assert_eq!(reader.headers.len(), 1, "only the last unit's table is apart from the others");
        std::fs::write(&path, tests::empty_units(MOST_UNITS + 1, 0, vec![0])).expect("write the program");
        let reader = FrameReader::open(&path).expect("its DWARF");
        assert_eq!(reader.headers.len(), MOST_UNITS);
    }

    #[test]
    fn code_whose_entry_is_not_known_has_its_line_from_the_unit_that_holds_it() {
        assert_eq!(code_with_a_line(), 7);
        let exe = std::env::current_exe().expect("own path");
        let options =
            LoadOptions { lines: false, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: true, kept_reads: None };
        let index = SymbolIndex::load(&exe, &options).expect("symbols");
        let function = index.functions.iter().find(|f| f.name.ends_with("code_with_a_line")).expect("the function");
        let loader = addr2line::Loader::new(&exe).expect("addr2line");
        let reader = FrameReader::open(&exe).expect("debug info");
        // Found through `.debug_aranges`.
        let line = reader.at(function.address.0, None).line;
        assert!(line.is_some());
        assert_eq!(line, addr2line_at(&loader, function.address.0).line);
    }

    #[test]
    fn code_whose_entry_is_not_known_has_its_line_where_no_aranges_say_which_unit_holds_it() {
        assert_eq!(code_with_a_line(), 7);
        let exe = std::env::current_exe().expect("own path");
        let dir = tempfile::tempdir().expect("temp dir");
        let stripped = dir.path().join("no-aranges");
        let objcopy = std::process::Command::new("objcopy").arg("--remove-section=.debug_aranges").arg(&exe).arg(&stripped).status();
        assert!(objcopy.as_ref().is_ok_and(|s| s.success()), "objcopy (binutils) is needed: {objcopy:?}");
        let options =
            LoadOptions { lines: false, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: true, kept_reads: None };
        let index = SymbolIndex::load(&stripped, &options).expect("symbols");
        let function = index.functions.iter().find(|f| f.name.ends_with("code_with_a_line")).expect("the function");
        let reader = FrameReader::open(&stripped).expect("debug info");
        assert!(reader.dwarf.debug_aranges.headers().next().is_ok_and(|h| h.is_none()), "aranges left");
        // Found through the units' own ranges.
        let line = reader.at(function.address.0, None).line;
        assert!(line.is_some());
        assert_eq!(line, addr2line_at(&addr2line::Loader::new(&exe).expect("addr2line"), function.address.0).line);
    }

    #[inline(never)]
    fn code_with_a_line() -> u64 {
        std::hint::black_box(7)
    }
}

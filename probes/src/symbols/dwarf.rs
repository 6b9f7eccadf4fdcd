//! Reading DWARF with gimli: concrete functions (`DW_TAG_subprogram` with
//! code) and the line table of every compilation unit, DWARF 2 to 5.

use super::elf::ElfImage;
use super::units::{MOST_UNITS, with_tables_apart};
use crate::addr::VirtAddr;
use crate::error::{Error, Result};
use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};
use object::{Object, ObjectSection};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// Interned source file paths; rows and functions refer to them by index.
#[derive(Debug, Default)]
pub struct FileTable {
    paths: Vec<String>,
    index: HashMap<String, u32>,
}

impl FileTable {
    /// The id of `path`, adding it if new.
    pub fn intern(&mut self, path: String) -> u32 {
        if let Some(&id) = self.index.get(&path) {
            return id;
        }
        let id = u32::try_from(self.paths.len()).unwrap_or(u32::MAX);
        self.index.insert(path.clone(), id);
        self.paths.push(path);
        id
    }

    /// The path of file `id`.
    pub fn path(&self, id: u32) -> &str {
        self.paths.get(id as usize).map_or("??", String::as_str)
    }

    /// Every interned path, by id.
    pub fn paths(&self) -> &[String] {
        &self.paths
    }
}

/// One row of a DWARF line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LineRow {
    /// Address of the first instruction of the row.
    pub address: VirtAddr,
    /// Source file id in the index's [`FileTable`].
    pub file: u32,
    /// Line number; 0 when the compiler attributes the code to no line.
    pub line: u32,
    /// Whether this row is a recommended breakpoint location.
    pub is_stmt: bool,
    /// Whether this row ends a sequence (its address is one past the code).
    pub end_sequence: bool,
}

/// A compilation unit and the slice of line rows it contributes.
#[derive(Clone, Debug, Serialize)]
pub struct CompileUnit {
    /// `DW_AT_name`, usually the primary source file.
    pub name: String,
    /// The DWARF version of the unit.
    pub dwarf_version: u16,
    /// Its rows in [`super::SymbolIndex::line_rows`].
    #[serde(skip)]
    pub rows: Range<usize>,
}

/// A function with code as DWARF describes it.
#[derive(Debug)]
pub(crate) struct Subprogram {
    pub ranges: Vec<Range<u64>>,
    /// Where its entry is in `.debug_info`: its inlined calls are read
    /// from there (`inlined`), not from the whole unit.
    pub die: Option<u64>,
    pub name: Option<String>,
    pub linkage_name: Option<String>,
    pub decl_file: Option<u32>,
    pub decl_line: u32,
}

/// Everything read from one file's DWARF.
#[derive(Default)]
pub(crate) struct DwarfInfo {
    pub subprograms: Vec<Subprogram>,
    pub units: Vec<CompileUnit>,
    pub rows: Vec<LineRow>,
}

/// Reads the DWARF of `image` (the binary or its separate debug file).
pub(crate) fn read(image: &ElfImage, files: &mut FileTable, want_lines: bool, warnings: &mut Vec<String>) -> Result<DwarfInfo> {
    read_in_parts(image, files, want_lines, warnings, |total| if total < SMALL_INFO { 1 } else { WORKERS })
}

/// [`read`], its units split into as many parts as `parts` says for their
/// total size, each read on a thread of its own.
fn read_in_parts(
    image: &ElfImage,
    files: &mut FileTable,
    want_lines: bool,
    warnings: &mut Vec<String>,
    parts: impl Fn(usize) -> usize,
) -> Result<DwarfInfo> {
    let bad = |e: &dyn std::fmt::Display| Error::BadDwarf { path: image.path().into(), reason: e.to_string() };
    let elf = image.parse()?;
    let sections = load_sections(&elf).map_err(|e| bad(&e))?;
    let sup = supplementary_file(image, &elf, warnings);
    let sup_sections = match &sup {
        Some(sup_image) => match sup_image.parse().map(|e| load_sections(&e)) {
            Ok(Ok(s)) => Some(s),
            _ => None,
        },
        None => None,
    };
    let endian = RunTimeEndian::Little;
    let mut dwarf = sections.borrow_with_sup(sup_sections.as_ref(), |s| EndianSlice::new(s, endian));
    let mut headers = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(|e| bad(&e))? {
        if headers.len() == MOST_UNITS {
            warnings.push(format!("read only the first {MOST_UNITS} compilation units of {}", image.path().display()));
            break;
        }
        headers.push(header);
    }
    let (headers, left_out) = with_tables_apart(&mut dwarf, headers);
    if left_out > 0 {
        warnings.push(format!(
            "skipped {left_out} compilation units of {}: their abbreviation tables run on into other units' tables, or are shared and do not parse (a damaged or hostile file)",
            image.path().display()
        ));
    }
    let line_section = gimli::Reader::len(gimli::Section::reader(&dwarf.debug_line));
    let read_part = |part: &[UnitHeader<'_>]| {
        let mut read = PartRead::default();
        read_units(&dwarf, part, want_lines, line_section, image.path(), &mut read);
        read
    };
    // Units are independent: a large file's are read on several threads
    // (the target is held meanwhile, its CPUs idle), each with its own
    // files, then joined in order.
    let parts = split_units(&headers, parts(headers.iter().map(UnitHeader::length_including_self).sum()));
    let read: Vec<PartRead> = if parts.len() > 1 {
        std::thread::scope(|scope| {
            let reading: Vec<_> = parts.iter().map(|part| scope.spawn(|| read_part(part))).collect();
            reading.into_iter().map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        })
    } else {
        parts.iter().map(|part| read_part(part)).collect()
    };
    let mut info = DwarfInfo::default();
    let mut tables_read = std::collections::HashSet::new();
    for part in read {
        part.join_into(&mut info, files, &mut tables_read, warnings);
    }
    Ok(info)
}

type UnitHeader<'a> = gimli::UnitHeader<Reader<'a>>;

/// Threads that read a large file's units.
const WORKERS: usize = 2;

/// Debug info below this is read on one thread: a thread costs more.
const SMALL_INFO: usize = 4 << 20;

/// `headers` in at most `parts` runs of units of about equal size, in order.
fn split_units<'h, 'a>(headers: &'h [UnitHeader<'a>], parts: usize) -> Vec<&'h [UnitHeader<'a>]> {
    let total: usize = headers.iter().map(UnitHeader::length_including_self).sum();
    if parts < 2 {
        return vec![headers];
    }
    let mut split = Vec::with_capacity(parts);
    let (mut start, mut size) = (0, 0);
    for (i, header) in headers.iter().enumerate() {
        size += header.length_including_self();
        if size * parts >= total * (split.len() + 1) && split.len() + 1 < parts {
            split.push(&headers[start..=i]);
            start = i + 1;
        }
    }
    split.push(&headers[start..]);
    split
}

/// What one thread read from its run of units, with file ids of its own.
#[derive(Default)]
struct PartRead {
    info: DwarfInfo,
    files: FileTable,
    /// Per unit with rows (as `info.units`), the offset of its line table.
    tables: Vec<usize>,
    warnings: Vec<String>,
}

impl PartRead {
    /// Adds this part after what `info` holds: its file ids interned in
    /// `files`, its units' rows left out where an earlier part read the
    /// same line table.
    fn join_into(
        self,
        info: &mut DwarfInfo,
        files: &mut FileTable,
        tables_read: &mut std::collections::HashSet<usize>,
        warnings: &mut Vec<String>,
    ) {
        let ids: Vec<u32> = self.files.paths.into_iter().map(|p| files.intern(p)).collect();
        let global = |id: u32| ids.get(id as usize).copied().unwrap_or(id);
        info.subprograms.extend(self.info.subprograms.into_iter().map(|mut sub| {
            sub.decl_file = sub.decl_file.map(global);
            sub
        }));
        let mut add_rows = |rows: &[LineRow]| {
            let start = info.rows.len();
            info.rows.extend(rows.iter().map(|row| LineRow { file: global(row.file), ..*row }));
            start..info.rows.len()
        };
        // Rows outside every unit (a table that failed part way) are kept too.
        let mut copied = 0;
        for (unit, table) in self.info.units.into_iter().zip(self.tables) {
            add_rows(&self.info.rows[copied..unit.rows.start]);
            copied = unit.rows.end;
            if tables_read.insert(table) {
                let rows = add_rows(&self.info.rows[unit.rows.clone()]);
                info.units.push(CompileUnit { rows, ..unit });
            }
        }
        add_rows(&self.info.rows[copied..]);
        warnings.extend(self.warnings);
    }
}

/// Reads the units of `headers` into `read`.
fn read_units(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    headers: &[UnitHeader<'_>],
    want_lines: bool,
    line_section: usize,
    path: &Path,
    read: &mut PartRead,
) {
    let mut tables = HashMap::new();
    let mut budget = HeaderBudget::new(line_section);
    // Told once with the first reason: a damaged file can hold thousands.
    let (mut damaged, mut in_part) = (Damaged::default(), Damaged::default());
    for header in headers {
        if budget.spent() {
            read.warnings.push(format!(
                "stopped reading the debug info of {} part way: its compilation units parse the same line tables over and over (a damaged or hostile file)",
                path.display()
            ));
            break;
        }
        let unit = match dwarf.unit(*header) {
            Ok(unit) => unit,
            Err(e) => {
                damaged.add(e);
                continue;
            }
        };
        budget.charge(&unit);
        let units_before = read.info.units.len();
        let mut reading = Reading { files: &mut read.files, want_lines, info: &mut read.info, tables: &mut tables };
        if let Err(e) = read_unit(dwarf, &unit, &mut reading) {
            in_part.add(e);
        }
        if read.info.units.len() > units_before {
            read.tables.push(unit.line_program.as_ref().map_or(usize::MAX, |p| p.header().offset().0));
        }
    }
    read.warnings.extend(damaged.told("damaged compilation unit", "damaged compilation units", path));
    read.warnings.extend(in_part.told("part of a compilation unit", "parts of compilation units", path));
}

/// Units skipped for the same kind of damage: how many, and the first one's error.
#[derive(Default)]
struct Damaged {
    units: usize,
    first: Option<gimli::Error>,
}

impl Damaged {
    fn add(&mut self, error: gimli::Error) {
        self.units += 1;
        self.first.get_or_insert(error);
    }

    fn told(&self, one: &str, many: &str, path: &Path) -> Option<String> {
        let first = self.first.as_ref()?;
        Some(match self.units {
            1 => format!("skipped a {one} in {}: {first}", path.display()),
            n => format!("skipped {n} {many} in {}, the first: {first}", path.display()),
        })
    }
}

/// Bytes of line-table headers parsed, against a bound. gimli parses the
/// header of a unit's line table with the unit, again for every unit that
/// names the same table: many tiny units naming one large table make that
/// quadratic. The bound is far above what real files need (dwz makes
/// thousands of partial units share a table).
pub(super) struct HeaderBudget {
    spent: u64,
    limit: u64,
}

impl HeaderBudget {
    pub(super) fn new(line_section: usize) -> Self {
        HeaderBudget { spent: 0, limit: (line_section as u64).saturating_mul(64).max(256 << 20) }
    }

    pub(super) fn charge<R: gimli::Reader>(&mut self, unit: &gimli::Unit<R>) {
        let header = unit.line_program.as_ref().map_or(0, |p| gimli::ReaderOffset::into_u64(p.header().header_length()));
        self.spent = self.spent.saturating_add(header);
    }

    pub(super) fn spent(&self) -> bool {
        self.spent > self.limit
    }
}

/// What reading units collects, and the line tables already read: units
/// that name the same table share its files and rows instead of reading it
/// again (which hostile DWARF makes quadratic in time and memory).
struct Reading<'a> {
    files: &'a mut FileTable,
    want_lines: bool,
    info: &'a mut DwarfInfo,
    tables: &'a mut HashMap<usize, LineTable>,
}

/// One line table as read: its files' ids, and whether its rows were read.
#[derive(Clone)]
struct LineTable {
    file_ids: Rc<[Option<u32>]>,
    rows_read: bool,
}

fn load_sections<'d>(elf: &object::read::elf::ElfFile64<'d>) -> Result<gimli::DwarfSections<Cow<'d, [u8]>>, String> {
    gimli::DwarfSections::load(|id| -> Result<Cow<'d, [u8]>, String> {
        match elf.section_by_name(id.name()) {
            Some(section) => section_data(id.name(), &section),
            None => Ok(Cow::Borrowed(&[])),
        }
    })
}

/// How many times its size a compressed section may claim to expand to.
/// DWARF compresses 3 to 10 times; zlib cannot pass 1032. The decompressor
/// allocates and zeroes the claimed size before it reads a byte, so an
/// unchecked claim lets a small file make the reader allocate gigabytes.
const MAX_EXPANSION: u64 = 256;

/// Below this, any claim is allowed: tiny sections compress badly.
const ALWAYS_ALLOWED: u64 = 1 << 20;

pub(super) fn section_data<'d>(name: &str, section: &object::read::elf::ElfSection64<'d, '_>) -> Result<Cow<'d, [u8]>, String> {
    let compressed = section.compressed_data().map_err(|e| format!("section {name}: {e}"))?;
    let limit = (compressed.data.len() as u64).saturating_mul(MAX_EXPANSION).max(ALWAYS_ALLOWED);
    if compressed.format != object::CompressionFormat::None && compressed.uncompressed_size > limit {
        return Err(format!(
            "section {name} claims to expand from {} to {} bytes when decompressed, more than compressed DWARF ever does",
            compressed.data.len(),
            compressed.uncompressed_size
        ));
    }
    compressed.decompress().map_err(|e| format!("section {name}: {e}"))
}

/// The dwz supplementary file named by `.gnu_debugaltlink`, as Debian's
/// debug packages use: absolute, or relative to the debug file.
fn supplementary_file(image: &ElfImage, elf: &object::read::elf::ElfFile64<'_>, warnings: &mut Vec<String>) -> Option<ElfImage> {
    let (name, _build_id) = elf.gnu_debugaltlink().ok().flatten()?;
    let name = Path::new(std::str::from_utf8(name).ok()?);
    let path = match image.path().parent() {
        Some(dir) if name.is_relative() => dir.join(name),
        _ => name.to_path_buf(),
    };
    match ElfImage::open(&path) {
        Ok(sup) => Some(sup),
        Err(e) => {
            warnings.push(format!("names shared through dwz are missing: {e}"));
            None
        }
    }
}

fn read_unit(dwarf: &gimli::Dwarf<Reader<'_>>, unit: &gimli::Unit<Reader<'_>>, reading: &mut Reading<'_>) -> gimli::Result<()> {
    let offset = unit.line_program.as_ref().map(|p| p.header().offset().0);
    let table = match offset.and_then(|o| reading.tables.get(&o)) {
        Some(table) => table.clone(),
        None => {
            let comp_dir = unit.comp_dir.map(|d| d.to_string_lossy().into_owned());
            LineTable { file_ids: unit_files(dwarf, unit, comp_dir.as_deref(), reading.files).into(), rows_read: false }
        }
    };

    // Most entries are types, variables and inlined calls: their
    // attributes are stepped over, not parsed (most of a large program's
    // reading time went to parsing them).
    let mut entries = unit.entries_raw(None)?;
    let mut attrs = Vec::new();
    let mut unit_name = String::new();
    while !entries.is_empty() {
        let depth = entries.next_depth();
        let offset = entries.next_offset();
        let Some(abbreviation) = entries.read_abbreviation()? else { continue };
        let tag = abbreviation.tag();
        let wanted =
            tag == gimli::DW_TAG_subprogram || (depth == 0 && matches!(tag, gimli::DW_TAG_compile_unit | gimli::DW_TAG_partial_unit));
        if !wanted {
            entries.skip_attributes(abbreviation.attributes())?;
            continue;
        }
        entries.read_attributes(abbreviation.attributes(), &mut attrs)?;
        if tag != gimli::DW_TAG_subprogram {
            if let Some(name) = attrs.iter().find(|a| a.name() == gimli::DW_AT_name) {
                unit_name = dwarf.attr_string(unit, name.value()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            }
            continue;
        }
        let ranges = code_ranges(dwarf, unit, &attrs)?;
        if ranges.is_empty() {
            continue;
        }
        let die = offset.to_debug_info_offset(&unit.header).map(|o| o.0 as u64);
        let mut sub = Subprogram { ranges, die, name: None, linkage_name: None, decl_file: None, decl_line: 0 };
        describe(dwarf, unit, &attrs, &table.file_ids, &mut sub, 0);
        reading.info.subprograms.push(sub);
    }

    let read_rows = reading.want_lines && !table.rows_read;
    if let (Some(offset), Some(program), true) = (offset, unit.line_program.clone(), read_rows) {
        let start = reading.info.rows.len();
        // Marked read first: a table whose rows fail part way is not read again.
        reading.tables.insert(offset, LineTable { rows_read: true, ..table.clone() });
        read_rows_of(program, &table.file_ids, &mut reading.info.rows)?;
        let rows = start..reading.info.rows.len();
        reading.info.units.push(CompileUnit { name: unit_name, dwarf_version: unit.header.version(), rows });
    } else if let Some(offset) = offset {
        reading.tables.entry(offset).or_insert(table);
    }
    Ok(())
}

pub(super) fn read_rows_of<R: gimli::Reader>(
    program: gimli::IncompleteLineProgram<R>,
    file_ids: &[Option<u32>],
    out: &mut Vec<LineRow>,
) -> gimli::Result<()> {
    let mut sequence_start = out.len();
    let mut rows = program.rows();
    while let Some((_, row)) = rows.next_row()? {
        let file = file_ids.get(row.file_index() as usize).copied().flatten().unwrap_or(u32::MAX);
        out.push(LineRow {
            address: VirtAddr(row.address()),
            file,
            line: row.line().map_or(0, |l| u32::try_from(l.get()).unwrap_or(u32::MAX)),
            is_stmt: row.is_stmt(),
            end_sequence: row.end_sequence(),
        });
        if row.end_sequence() {
            // A sequence at address 0 is code the linker discarded.
            if out[sequence_start].address.0 == 0 {
                out.truncate(sequence_start);
            }
            sequence_start = out.len();
        }
    }
    Ok(())
}

/// The file and line of each address where a row starts, as addr2line
/// reads a line table: of rows at one address the last; past a sequence's
/// end line 0 (no line), unless another sequence starts there. Sorted
/// once, searched by halves: a unit's table has tens of thousands of rows,
/// a large program's hundreds of thousands, and a tree of them took as long
/// to make as the rows took to read.
#[derive(Debug, Default)]
pub(crate) struct LinesByAddress(Vec<(u64, (u32, u32))>);

impl LinesByAddress {
    pub(crate) fn of(rows: &[LineRow]) -> LinesByAddress {
        let mut sorted: Vec<&LineRow> = rows.iter().collect();
        // Stable: rows at one address stay in the table's order.
        sorted.sort_by_key(|row| row.address.0);
        let located = sorted.chunk_by(|a, b| a.address == b.address).map(|at| {
            let value = match at.iter().rev().find(|row| !row.end_sequence) {
                Some(row) => (row.file, row.line),
                None => (at[0].file, 0),
            };
            (at[0].address.0, value)
        });
        LinesByAddress(located.collect())
    }

    /// The rows starting in `range`, by address.
    pub(crate) fn range(&self, range: impl std::ops::RangeBounds<u64>) -> impl DoubleEndedIterator<Item = (&u64, &(u32, u32))> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let before = |bound: std::ops::Bound<&u64>, past_equal: bool| match bound {
            Included(&at) if past_equal => self.0.partition_point(|(a, _)| *a <= at),
            Included(&at) => self.0.partition_point(|(a, _)| *a < at),
            Excluded(&at) if past_equal => self.0.partition_point(|(a, _)| *a < at),
            Excluded(&at) => self.0.partition_point(|(a, _)| *a <= at),
            Unbounded if past_equal => self.0.len(),
            Unbounded => 0,
        };
        let start = before(range.start_bound(), false);
        let end = before(range.end_bound(), true).max(start);
        self.0[start..end].iter().map(|(at, row)| (at, row))
    }

    /// How many addresses start a row.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// The code of a DIE: `DW_AT_ranges`, or `DW_AT_low_pc` with `DW_AT_high_pc`
/// as an address or a size. gimli's `die_ranges` adds the size unchecked,
/// which overflows on a hostile size; here the sum is checked.
pub(super) fn code_ranges<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    attrs: &[gimli::Attribute<R>],
) -> gimli::Result<Vec<Range<u64>>> {
    code_ranges_within(dwarf, unit, attrs, MAX_RANGE_ENTRIES)
}

/// [`code_ranges`], reading at most `most` entries of a range list (a
/// unit's lists a range for each of its functions).
pub(super) fn code_ranges_within<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    attrs: &[gimli::Attribute<R>],
    most: usize,
) -> gimli::Result<Vec<Range<u64>>> {
    let (mut low, mut high, mut size) = (None, None, None);
    for attr in attrs {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_low_pc, value) => low = dwarf.attr_address(unit, value)?,
            (gimli::DW_AT_high_pc, AttributeValue::Udata(n)) => size = Some(n),
            (gimli::DW_AT_high_pc, value) => high = dwarf.attr_address(unit, value)?,
            (gimli::DW_AT_ranges, value) => {
                let Some(mut list) = dwarf.attr_ranges(unit, value)? else { continue };
                let mut ranges = Vec::new();
                // Entry by entry, counting the empty ones gimli skips: every
                // function of a hostile file can name one list of millions.
                for _ in 0..most {
                    let Some(raw) = list.next_raw()? else { break };
                    if let Some(range) = list.convert_raw(raw)? {
                        ranges.extend(code_range(range.begin, Some(range.end)));
                    }
                }
                return Ok(ranges);
            }
            _ => {}
        }
    }
    let Some(low) = low else { return Ok(Vec::new()) };
    let end = match size {
        Some(size) => low.checked_add(size),
        None => high,
    };
    Ok(code_range(low, end).into_iter().collect())
}

/// Range-list entries read for one function. A function split by the
/// compiler has a few ranges (hot and cold parts), by basic-block sections
/// some tens; past this the rest are not read.
const MAX_RANGE_ENTRIES: usize = 64;

/// `begin..end` if it holds code: address 0 is the linker's tombstone for
/// discarded code, and an empty or reversed range holds none.
fn code_range(begin: u64, end: Option<u64>) -> Option<Range<u64>> {
    end.filter(|&end| begin != 0 && end > begin).map(|end| begin..end)
}

/// Fills the name and declaration of a subprogram from its attributes,
/// following `DW_AT_specification` and `DW_AT_abstract_origin` (out-of-line
/// member functions and concrete copies of inline functions keep them there).
fn describe(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    attrs: &[gimli::Attribute<Reader<'_>>],
    file_ids: &[Option<u32>],
    sub: &mut Subprogram,
    depth: u8,
) {
    let mut origin: Option<UnitOffset> = None;
    for attr in attrs {
        match (attr.name(), attr.value()) {
            (gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name, value) if sub.linkage_name.is_none() => {
                sub.linkage_name = dwarf.attr_string(unit, value).ok().map(|s| s.to_string_lossy().into_owned());
            }
            (gimli::DW_AT_name, value) if sub.name.is_none() => {
                sub.name = dwarf.attr_string(unit, value).ok().map(|s| s.to_string_lossy().into_owned());
            }
            (gimli::DW_AT_decl_file, value) if sub.decl_file.is_none() => {
                let index = match value {
                    AttributeValue::FileIndex(i) | AttributeValue::Udata(i) => Some(i),
                    AttributeValue::Data1(i) => Some(u64::from(i)),
                    AttributeValue::Data2(i) => Some(u64::from(i)),
                    AttributeValue::Data4(i) => Some(u64::from(i)),
                    _ => None,
                };
                sub.decl_file = index.and_then(|i| file_ids.get(i as usize).copied().flatten());
            }
            (gimli::DW_AT_decl_line, value) if sub.decl_line == 0 => {
                sub.decl_line = value.udata_value().and_then(|l| u32::try_from(l).ok()).unwrap_or(0);
            }
            (gimli::DW_AT_specification | gimli::DW_AT_abstract_origin, AttributeValue::UnitRef(offset)) => {
                origin = Some(offset);
            }
            _ => {}
        }
    }
    let complete = sub.linkage_name.is_some() && sub.decl_file.is_some() && sub.decl_line != 0;
    if let (Some(offset), false, true) = (origin, complete, depth < 4) {
        if let Ok(target) = unit.entry(offset) {
            describe(dwarf, unit, target.attrs(), file_ids, sub, depth + 1);
        }
    }
}

/// Interned ids of the unit's line-table files, indexed by DWARF file index.
pub(super) fn unit_files<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    comp_dir: Option<&str>,
    files: &mut FileTable,
) -> Vec<Option<u32>> {
    let Some(program) = &unit.line_program else { return Vec::new() };
    let header = program.header();
    let count = header.file_names().len() as u64;
    // DWARF 5 numbers files from 0, earlier versions from 1.
    let (first, last) = if header.version() >= 5 { (0, count) } else { (1, count + 1) };
    let mut ids = vec![None; last as usize];
    for index in first..last {
        let Some(file) = header.file(index) else { continue };
        let text = |value| dwarf.attr_string(unit, value).and_then(|s| Ok(s.to_string_lossy()?.into_owned()));
        let Ok(name) = text(file.path_name()) else { continue };
        let mut path = PathBuf::new();
        if let Some(comp_dir) = comp_dir {
            path.push(comp_dir);
        }
        if let Some(dir) = file.directory(header).and_then(|d| text(d).ok()) {
            path.push(dir);
        }
        path.push(name);
        ids[index as usize] = Some(files.intern(normalize_path(&path)));
    }
    ids
}

/// `a/b/../c` -> `a/c` and no `./`: compilers write both, users expect neither.
pub fn normalize_path(path: &Path) -> String {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each address where rows start, as the table is read row by row:
    /// the last row there, unless all that are there end sequences.
    fn read_row_by_row(rows: &[LineRow]) -> std::collections::BTreeMap<u64, (u32, u32)> {
        let mut located_at = std::collections::BTreeMap::new();
        for row in rows {
            if row.end_sequence {
                located_at.entry(row.address.0).or_insert((row.file, 0));
            } else {
                located_at.insert(row.address.0, (row.file, row.line));
            }
        }
        located_at
    }

    #[test]
    fn rows_by_address_are_the_tables_rows_read_in_order() {
        let row = |address, file, line, end_sequence| LineRow { address: VirtAddr(address), file, line, is_stmt: true, end_sequence };
        // Two sequences, the second starting where the first ends and
        // written before it; several rows at one address; a sequence
        // ending where nothing else starts.
        let rows = [
            row(0x40, 2, 7, false),
            row(0x48, 2, 8, false),
            row(0x48, 2, 9, false),
            row(0x50, 2, 0, true),
            row(0x10, 1, 1, false),
            row(0x18, 1, 2, false),
            row(0x18, 1, 3, false),
            row(0x30, 1, 0, true),
            row(0x30, 3, 4, false),
            row(0x40, 3, 5, false),
            row(0x44, 3, 0, true),
        ];
        let (sorted, reference) = (LinesByAddress::of(&rows), read_row_by_row(&rows));
        assert_eq!(sorted.len(), reference.len());
        let same = |a: Vec<(&u64, &(u32, u32))>, b: Vec<(&u64, &(u32, u32))>| assert_eq!(a, b);
        same(sorted.range(..).collect(), reference.range(..).collect());
        for at in [0, 0x10, 0x17, 0x18, 0x30, 0x44, 0x48, 0x50, 0x51] {
            same(sorted.range(..=at).collect(), reference.range(..=at).collect());
            same(sorted.range(at..).collect(), reference.range(at..).collect());
            same(sorted.range(..at).rev().collect(), reference.range(..at).rev().collect());
            same(sorted.range(at..at + 0x20).collect(), reference.range(at..at + 0x20).collect());
            let after = (std::ops::Bound::Excluded(at), std::ops::Bound::Included(at + 8));
            same(sorted.range(after).collect(), reference.range(after).collect());
        }
        assert_eq!(sorted.range(0x31..0x31).count(), 0);
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(normalize_path(Path::new("/src/a/./b/../c.c")), "/src/a/c.c");
        assert_eq!(normalize_path(Path::new("../x.c")), "../x.c");
    }

    /// Every function and row, with file paths for ids.
    fn described(info: &DwarfInfo, files: &FileTable) -> (Vec<String>, Vec<String>) {
        let path = |id: Option<u32>| id.map(|i| files.path(i).to_string());
        let subprograms =
            info.subprograms.iter().map(|s| format!("{:?} {:?} {:?} {}", s.ranges, s.name, path(s.decl_file), s.decl_line)).collect();
        let rows = info.rows.iter().map(|r| format!("{:?} {:?} {}", r.address, path(Some(r.file)), r.line)).collect();
        (subprograms, rows)
    }

    #[test]
    fn units_read_in_parts_read_as_in_one() {
        // This test's own executable: hundreds of units, shared file names.
        let image = ElfImage::open(&std::env::current_exe().unwrap()).unwrap();
        let read = |parts: usize| {
            let (mut files, mut warnings) = (FileTable::default(), Vec::new());
            let info = read_in_parts(&image, &mut files, true, &mut warnings, |_| parts).unwrap();
            (described(&info, &files), info.units.iter().map(|u| (u.name.clone(), u.rows.len())).collect::<Vec<_>>(), warnings)
        };
        let whole = read(1);
        assert!(whole.0.0.len() > 1000 && whole.0.1.len() > 10_000, "{} functions, {} rows", whole.0.0.len(), whole.0.1.len());
        for parts in [2, 3, 7] {
            assert!(read(parts) == whole, "read in {parts} parts");
        }
    }

    #[test]
    fn files_are_interned_once() {
        let mut t = FileTable::default();
        let a = t.intern("/a.c".into());
        let b = t.intern("/b.c".into());
        assert_ne!(a, b);
        assert_eq!(t.intern("/a.c".into()), a);
        assert_eq!(t.path(b), "/b.c");
    }
}

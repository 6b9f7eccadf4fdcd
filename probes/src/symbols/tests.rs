//! Inputs the fuzzer found that broke the symbolizer (`fuzz/`, target
//! `symbolizer`), each loaded as the fuzz target loads it.

use super::*;

fn load(bytes: &[u8]) -> Result<SymbolIndex> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("program");
    std::fs::write(&path, bytes).expect("write the input");
    SymbolIndex::load(
        &path,
        &LoadOptions { lines: true, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: false, kept_reads: None },
    )
}

#[test]
fn a_subprogram_whose_size_overflows_the_address_space_has_no_range() {
    // A DW_AT_high_pc size that, added to DW_AT_low_pc, passes 2^64.
    let index = load(include_bytes!("testdata/subprogram-size-overflows")).expect("the symbol table is intact");
    assert!(index.functions.iter().all(|f| f.address.0.checked_add(f.size).is_some()));
}

#[test]
fn a_function_that_reaches_the_end_of_the_address_space_is_found_without_overflow() {
    // A symbol whose address plus size passes 2^64.
    let index = load(include_bytes!("testdata/function-size-overflows")).expect("the symbol table is intact");
    let last = index.functions.last().expect("functions");
    assert!(last.address.0.checked_add(last.size).is_none(), "the input no longer has a function this large");
    assert_eq!(index.function_at(VirtAddr(u64::MAX - 1)).map(|f| f.address), Some(last.address));
}

#[test]
fn a_compressed_section_that_claims_gigabytes_is_refused_before_allocating_them() {
    let started = std::time::Instant::now();
    let err = load(include_bytes!("testdata/compressed-section-claims-gigabytes")).err().expect("a damaged section");
    assert!(err.to_string().contains("claims to expand"), "{err}");
    // Zeroing the claimed gigabytes took seconds.
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "took {:?}", started.elapsed());
}

/// `base` with the contents of some of its sections replaced: the new bytes
/// go at the end of the file and the section headers point there.
pub(super) fn with_sections(base: &[u8], replaced: &[(&str, Vec<u8>)]) -> Vec<u8> {
    use object::{Object, ObjectSection};
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(base).expect("an ELF file");
    let shoff = u64::from_le_bytes(base[0x28..0x30].try_into().expect("8 bytes")) as usize;
    let indexes: Vec<usize> =
        replaced.iter().map(|(name, _)| elf.section_by_name(name).unwrap_or_else(|| panic!("no section {name}")).index().0).collect();
    let mut out = base.to_vec();
    for (index, (_, data)) in indexes.into_iter().zip(replaced) {
        out.resize(out.len().next_multiple_of(8), 0);
        let (header, offset) = (shoff + index * 64, out.len() as u64);
        out[header + 24..header + 32].copy_from_slice(&offset.to_le_bytes());
        out[header + 32..header + 40].copy_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// DWARF 4 with `units` compilation units that all name the same line
/// table of `files` files and `rows` rows, and the same abbreviations.
fn shared_line_table(units: usize, files: usize, rows: usize) -> Vec<u8> {
    // Abbreviation 1: a compile unit without children, with DW_AT_stmt_list.
    let abbrev = vec![1, 0x11, 0, 0x10, 0x17, 0, 0, 0];
    let mut info = Vec::new();
    for _ in 0..units {
        info.extend_from_slice(&12u32.to_le_bytes()); // unit length
        info.extend_from_slice(&4u16.to_le_bytes()); // version
        info.extend_from_slice(&0u32.to_le_bytes()); // abbreviations offset
        info.push(8); // address size
        info.push(1); // abbreviation code
        info.extend_from_slice(&0u32.to_le_bytes()); // DW_AT_stmt_list
    }
    let mut header = vec![1, 1, 1, (-5i8) as u8, 14, 13, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0];
    for _ in 0..files {
        header.extend_from_slice(b"a.c\0\0\0\0");
    }
    header.push(0);
    let mut program = vec![0, 9, 2]; // DW_LNE_set_address
    program.extend_from_slice(&0x1000u64.to_le_bytes());
    program.extend(std::iter::repeat_n(0x20, rows)); // a special opcode: one row each
    program.extend_from_slice(&[0, 1, 1]); // DW_LNE_end_sequence
    let mut line = Vec::new();
    line.extend_from_slice(&((2 + 4 + header.len() + program.len()) as u32).to_le_bytes());
    line.extend_from_slice(&4u16.to_le_bytes());
    line.extend_from_slice(&(header.len() as u32).to_le_bytes());
    line.extend(header);
    line.extend(program);
    with_sections(include_bytes!("testdata/calls-O2-dwarf4"), &[(".debug_info", info), (".debug_abbrev", abbrev), (".debug_line", line)])
}

#[test]
fn units_that_share_a_line_table_read_it_once() {
    // 2000 units naming one table of 2000 files and 2000 rows: 4 million rows
    // and 4 million file paths when each unit read it again.
    let index = load(&shared_line_table(2000, 2000, 2000)).expect("the symbol table is intact");
    assert_eq!(index.line_rows.len(), 2001, "the rows and the end of the sequence, once");
    assert_eq!(index.units.len(), 1);
    assert!(index.warnings.is_empty(), "{:?}", index.warnings);
}

#[test]
fn units_that_make_the_line_table_header_parse_quadratic_are_cut_short() {
    let started = std::time::Instant::now();
    let index = load(&shared_line_table(20_000, 20_000, 1)).expect("the symbol table is intact");
    eprintln!("{:?} {:?}", started.elapsed(), index.warnings);
    assert!(index.warnings.iter().any(|w| w.contains("parse the same line tables over and over")), "{:?}", index.warnings);
}

/// `units` empty DWARF 4 units (a null entry each): unit `i` names the
/// abbreviation table at `i * step` of `abbrev`.
pub(super) fn empty_units(units: usize, step: usize, abbrev: Vec<u8>) -> Vec<u8> {
    let mut info = Vec::new();
    for i in 0..units {
        info.extend_from_slice(&8u32.to_le_bytes()); // unit length
        info.extend_from_slice(&4u16.to_le_bytes()); // version
        info.extend_from_slice(&((i * step) as u32).to_le_bytes()); // abbreviations offset
        info.extend_from_slice(&[8, 0]); // address size, a null entry
    }
    with_sections(include_bytes!("testdata/calls-O2-dwarf4"), &[(".debug_info", info), (".debug_abbrev", abbrev)])
}

/// One abbreviation table of `entries` entries (`DW_TAG_subprogram`, no
/// attributes, 7 bytes each), each unit naming it from one entry on: read
/// as gimli reads them, the table's rest is parsed again for each unit.
pub(super) fn tables_inside_one_another(entries: usize) -> Vec<u8> {
    let mut abbrev: Vec<u8> =
        (1..=entries as u32).flat_map(|code| [code as u8 | 0x80, (code >> 7) as u8 | 0x80, (code >> 14) as u8, 0x2e, 0, 0, 0]).collect();
    abbrev.push(0);
    empty_units(entries, 7, abbrev)
}

#[test]
fn units_whose_abbreviation_tables_run_into_one_another_are_left_unread() {
    let index = load(&tables_inside_one_another(2000)).expect("the symbol table is intact");
    let skipped = "skipped 1999 compilation units of";
    assert!(index.warnings.iter().any(|w| w.contains(skipped) && w.contains("abbreviation tables run on")), "{:?}", index.warnings);
    // The last one, apart, is read (and found empty).
    assert!(index.warnings.iter().any(|w| w.contains("skipped a damaged compilation unit")), "{:?}", index.warnings);
}

#[test]
fn units_past_a_bound_are_left_unread_and_said_to_be() {
    let index = load(&empty_units(units::MOST_UNITS + 1, 0, vec![0])).expect("the symbol table is intact");
    let damaged = format!("skipped {} damaged compilation units", units::MOST_UNITS);
    assert!(index.warnings.iter().any(|w| w.contains(&damaged)), "{:?}", index.warnings);
    assert!(index.warnings.iter().any(|w| w.contains("read only the first 262144 compilation units")), "{:?}", index.warnings);
}

/// A function symbol of no size (crtstuff's, in every C and Rust program)
/// names the addresses up to the next one, as perf names them: a sample
/// taken in `__do_global_dtors_aux` at a program's exit had no name.
#[test]
fn a_function_of_no_size_reaches_the_next_one() {
    let exe = std::env::current_exe().expect("this test's program");
    let options =
        LoadOptions { lines: false, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: true, kept_reads: None };
    let index = SymbolIndex::load(&exe, &options).expect("its symbols");
    let f = index.functions.iter().find(|f| f.raw_name == "__do_global_dtors_aux").expect("crtstuff's __do_global_dtors_aux");
    assert_eq!(f.size, 0, "the symbol table gives it no size");
    let next = index.functions.iter().find(|n| n.address > f.address).expect("a function after it");
    assert_eq!(index.function_at(VirtAddr(f.address.0 + 4)).map(|g| &g.raw_name), Some(&f.raw_name));
    assert_eq!(index.function_at(VirtAddr(next.address.0 - 1)).map(|g| &g.raw_name), Some(&f.raw_name));
    assert_eq!(index.function_at(next.address).map(|g| g.address), Some(next.address));
}

#[test]
fn namesakes_get_names_of_their_own_and_keep_the_plain_one_for_patterns() {
    // A Rust program: a generic's instances demangle to one name.
    let exe = std::env::current_exe().expect("this test's program");
    let options =
        LoadOptions { lines: false, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: true, kept_reads: None };
    let index = SymbolIndex::load(&exe, &options).expect("its symbols");
    // Two symbols of one raw name (versions of one symbol, read from the
    // symbol table alone) may keep it; symbols of two raw names may not.
    let mut names: Vec<(&str, &str)> = index.functions.iter().map(|f| (f.name.as_str(), f.raw_name.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    let shared = names.windows(2).find(|w| w[0].0 == w[1].0);
    assert!(shared.is_none(), "two functions share a name: {shared:?}");
    let second = index.functions.iter().find(|f| f.name.ends_with(" #2")).expect("a generic with two instances");
    let plain = second.name.trim_end_matches(" #2");
    let first = index.functions.iter().find(|f| f.name == plain).expect("the first instance keeps the plain name");
    assert!(first.address < second.address);
    assert!(second.names().any(|n| n == plain), "a pattern on the plain name matches every instance");
}

//! Inputs the fuzzer found that broke the symbolizer (`fuzz/`, target
//! `symbolizer`), each loaded as the fuzz target loads it.

use super::*;

fn load(bytes: &[u8]) -> Result<SymbolIndex> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("program");
    std::fs::write(&path, bytes).expect("write the input");
    SymbolIndex::load(&path, &LoadOptions { lines: true, debug_dirs: DebugDirs(Vec::new()) })
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

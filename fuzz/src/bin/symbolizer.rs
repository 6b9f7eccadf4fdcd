//! The ELF/DWARF symbolizer on any bytes as a program: functions, symbol
//! tables, DWARF units, line tables, debug links, as proftapd reads every
//! binary a target maps; the branches into functions' first bytes that
//! planning decodes from its code; the kernel's symbol table, as read
//! from `/proc/kallsyms` or kept for the boot; and a binary's DWARF, its
//! symbol table's functions, and what the patch planner judged of its
//! functions, as kept for the boot;
//! the inlined calls and line of sampled addresses, read from one
//! function's DWARF entry; and a JIT's perf map (`/tmp/perf-PID.map`),
//! which the program writes.

use proftap_probes::addr::VirtAddr;
use proftap_probes::symbols::{DebugDirs, FrameReader, KernelSymbols, LoadOptions, SymbolIndex};

proftap_fuzz::target!(run);

/// Loads the input with line tables, then asks what reports ask of an index.
fn run(data: &[u8]) {
    kernel_symbols(data);
    jit_names(data);
    // The same bytes as a binary's DWARF or symbol table kept by an earlier recording.
    proftap_probes::symbols::kept_file_is_used(data);
    proftap_probes::inject::judged::kept_file_is_used(data);
    // No debug directories: a build-id must not reach this machine's real
    // debug files, or runs would depend on what is installed.
    let options =
        LoadOptions { lines: true, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: false, kept_reads: None };
    let read =
        proftap_fuzz::with_file("program", data, |path| SymbolIndex::load(path, &options).map(|index| (index, FrameReader::open(path))));
    let Ok((index, frames)) = read else { return };
    // What annotating a function only samples name reads: every unit's entries.
    if let (Some(frames), Some(function)) = (&frames, index.functions.first()) {
        let _ = frames.declaration(&function.name);
    }
    for function in &index.functions {
        // What naming a sample in the function reads: its entry, its unit's lines.
        if let Some(frames) = &frames {
            let _ = frames.at(function.address.0, function.die);
            let _ = frames.at(function.address.0.wrapping_add(function.size / 2), None);
        }
        let _ = index.function_at(function.address);
        let _ = index.function_at(VirtAddr(function.address.0.wrapping_add(function.size)));
        let _ = index.decl_path(function);
    }
    for row in &index.line_rows {
        let _ = index.files.path(row.file);
    }
    for unit in &index.units {
        assert!(unit.rows.end <= index.line_rows.len(), "unit {} has rows past the end", unit.name);
    }
    // What planning decodes of the program's own code: the branches that
    // land inside other functions' first bytes.
    for offsets in proftap_probes::plan::entered_inside(&index, data).values() {
        assert!(offsets.iter().all(|&o| o < 24), "an offset past the entry bytes: {offsets:?}");
    }
}

/// The kernel's table, read as the file and as kept (for no boot and no
/// modules: an empty key), and every address it lists looked up.
fn kernel_symbols(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let read = KernelSymbols::parse(text.as_ref());
    let kept = KernelSymbols::read_kept(data, "", "");
    for address in text.lines().filter_map(|line| u64::from_str_radix(line.split_ascii_whitespace().next()?, 16).ok()) {
        let _ = read.function_at(address);
        if let Some(kept) = &kept {
            let _ = kept.function_at(address);
        }
    }
}

/// The bytes as a JIT's perf map, read in two parts as a growing file is;
/// every address it lists, and every 8 bytes as an address, looked up.
fn jit_names(data: &[u8]) {
    let mut names = proftap_probes::symbols::JitNames::default();
    let half = data.len() / 2;
    let taken = names.add_lines(&data[..half]);
    assert!(taken <= half, "took {taken} of {half} bytes");
    let taken = taken + names.add_lines(&data[taken..]);
    assert!(taken <= data.len());
    let listed = String::from_utf8_lossy(data)
        .lines()
        .filter_map(|line| u64::from_str_radix(line.split_ascii_whitespace().next()?.trim_start_matches("0x"), 16).ok())
        .collect::<Vec<_>>();
    let words = data.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()));
    for address in listed.into_iter().chain(words) {
        let _ = names.name_at(address);
    }
}

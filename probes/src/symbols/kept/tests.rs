use super::*;
use crate::boot_cache::testing::only_file;
use std::os::unix::fs::PermissionsExt;

/// A program with DWARF 4 functions and line tables, in a directory of its
/// own, and an empty directory to keep its DWARF in.
fn program() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("calls");
    std::fs::write(&path, include_bytes!("../testdata/calls-O2-dwarf4")).expect("write the program");
    let kept = dir.path().join("kept");
    (dir, path, kept)
}

/// Everything a read gives, printed: equal prints, equal reads.
fn read_in(kept: Option<&Path>, program: &Path, lines: bool) -> String {
    let image = ElfImage::open(program).expect("the program opens");
    let (mut files, mut warnings) = (FileTable::default(), Vec::new());
    // Kept however recently the program was written.
    let info = read_settled(kept, &image, &mut files, lines, &mut warnings, -boot_cache::SETTLED_NS).expect("the DWARF reads");
    format!("{:?}\n{:?}\n{:?}\n{:?}\n{warnings:?}", info.subprograms, info.units, info.rows, files.paths())
}

/// `file` kept again with every function renamed, so that a read shows
/// whether it came from the kept file.
fn rename_kept_functions(file: &Path) {
    let mut kept = decode(&std::fs::read(file).expect("read kept")).expect("it decodes");
    assert!(!kept.subprograms.is_empty());
    for s in &mut kept.subprograms {
        s.name = Some("renamed".into());
    }
    boot_cache::testing::rewrite(file, &postcard::to_stdvec(&kept).expect("encode"));
}

#[test]
fn what_is_kept_reads_back_as_it_was_read() {
    for lines in [false, true] {
        let (_dir, program, kept) = program();
        let fresh = read_in(None, &program, lines);
        assert_eq!(read_in(Some(&kept), &program, lines), fresh, "the read that keeps");
        let file = only_file(&kept);
        assert_eq!(std::fs::metadata(&file).expect("kept").permissions().mode() & 0o077, 0, "readable by its owner only");
        assert_eq!(read_in(Some(&kept), &program, lines), fresh, "read back");
        if lines {
            assert!(fresh.contains("LineRow"), "the program has line rows");
        }
        // The second read came from the file.
        rename_kept_functions(&file);
        assert!(read_in(Some(&kept), &program, lines).contains("\"renamed\""));
    }
}

#[test]
fn a_changed_program_is_read_afresh() {
    let (_dir, program, kept) = program();
    let fresh = read_in(Some(&kept), &program, false);
    rename_kept_functions(&only_file(&kept));
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options().write(true).open(&program).expect("open").set_modified(later).expect("touch");
    assert_eq!(read_in(Some(&kept), &program, false), fresh);
    // Kept anew: lines or not are kept apart.
    assert!(!read_in(Some(&kept), &program, false).contains("\"renamed\""));
    read_in(Some(&kept), &program, true);
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 2);
}

#[test]
fn a_kept_file_others_may_write_is_not_read() {
    let (_dir, program, kept) = program();
    let fresh = read_in(Some(&kept), &program, false);
    let file = only_file(&kept);
    rename_kept_functions(&file);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(read_in(Some(&kept), &program, false), fresh);
}

#[test]
fn damaged_kept_files_are_refused_without_a_panic() {
    let (_dir, program, kept) = program();
    read_in(Some(&kept), &program, true);
    let bytes = std::fs::read(only_file(&kept)).expect("kept");
    assert!(decode(&bytes).is_some(), "{} bytes", bytes.len());
    let mut decoded = 0;
    let mut try_bytes = |bytes: &[u8]| {
        if let Some(kept) = decode(bytes) {
            decoded += 1;
            let mut files = FileTable::default();
            let _ = kept.into_info(&mut files, &mut Vec::new());
        }
    };
    for end in 0..bytes.len() {
        try_bytes(&bytes[..end]);
    }
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 1;
        try_bytes(&damaged);
    }
    assert!(decoded > 0, "some damage still decodes, and is then checked");

    // Ids past the kept tables: refused, and nothing interned.
    let mut kept_bad = decode(&bytes).expect("decodes");
    kept_bad.rows.first_mut().expect("rows").file = u32::MAX;
    let mut files = FileTable::default();
    assert!(kept_bad.into_info(&mut files, &mut Vec::new()).is_none());
    assert!(files.paths().is_empty());
    let mut kept_bad = decode(&bytes).expect("decodes");
    kept_bad.units.first_mut().expect("units").rows.1 = u64::MAX;
    assert!(kept_bad.into_info(&mut FileTable::default(), &mut Vec::new()).is_none());
}

#[test]
fn a_program_changed_a_moment_ago_is_not_kept() {
    let (_dir, program, kept) = program();
    let image = ElfImage::open(&program).expect("the program opens");
    let (mut files, mut warnings) = (FileTable::default(), Vec::new());
    read(Some(&kept), &image, &mut files, false, &mut warnings).expect("the DWARF reads");
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 0, "changed within the clock's tick, it may change again unseen");
}

#[test]
fn nothing_is_kept_where_others_may_write_or_through_a_link() {
    use std::os::unix::fs::symlink;
    let (dir, program, kept) = program();
    std::fs::create_dir(&kept).expect("mkdir");
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    read_in(Some(&kept), &program, false);
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 0, "a directory others may write");
    // A link to a directory of this user's: not followed.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    let link = dir.path().join("link");
    symlink(&elsewhere, &link).expect("symlink");
    read_in(Some(&link), &program, false);
    assert_eq!(std::fs::read_dir(&elsewhere).expect("elsewhere").count(), 0, "kept through a link");
    // In a directory others may write.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    read_in(Some(&shared.join("kept")), &program, false);
    assert!(!shared.join("kept").exists(), "made in a directory others may write");
}

#[test]
fn the_oldest_kept_files_go_past_the_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = [0u8; 100];
    let names = ["1-a", "1-b-lines", "1-c", "1-d", "other"];
    for (i, name) in names.iter().enumerate() {
        let path = dir.path().join(name);
        std::fs::write(&path, file).expect("write");
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000 * (i as u64 + 1));
        std::fs::File::options().write(true).open(&path).expect("open").set_modified(at).expect("touch");
    }
    // The newest is never taken out, even when it is the oldest; a file
    // not named as kept files are is left alone.
    boot_cache::trim(dir.path(), &dir.path().join("1-a"), 300, is_kept_name);
    let mut left: Vec<String> =
        std::fs::read_dir(dir.path()).expect("dir").flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
    left.sort();
    assert_eq!(left, ["1-a", "1-c", "1-d", "other"]);
}

/// `image`'s symbol table's functions through `kept`, kept however
/// recently the program was written; `read` stands for reading the table.
fn symbols_in(kept: Option<&Path>, program: &Path, read: impl FnOnce() -> Vec<KeptFunction>) -> Vec<KeptFunction> {
    let image = ElfImage::open(program).expect("the program opens");
    symbol_table_settled(kept, &image, SymbolTable::Own, read, -boot_cache::SETTLED_NS)
}

/// One function named `name`.
fn named(name: &str) -> Vec<KeptFunction> {
    let name = name.to_string();
    vec![KeptFunction { address: 0x1130, size: 16, raw_name: name.clone(), name, base_name: None, aliases: vec!["alias".into()] }]
}

#[test]
fn a_symbol_table_read_is_kept_and_read_back_for_the_same_program() {
    let (_dir, program, kept) = program();
    assert_eq!(symbols_in(Some(&kept), &program, || named("first")), named("first"));
    let file = only_file(&kept);
    assert!(file.to_string_lossy().ends_with("-symbols"), "{}", file.display());
    assert_eq!(std::fs::metadata(&file).expect("kept").permissions().mode() & 0o077, 0, "readable by its owner only");
    // Read back: what reading gives now is not asked for.
    assert_eq!(symbols_in(Some(&kept), &program, || named("second")), named("first"));
    // Beside the DWARF of the same program, neither taken for the other.
    read_in(Some(&kept), &program, false);
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 2);
    assert_eq!(symbols_in(Some(&kept), &program, || named("second")), named("first"));
    // Others may write it: read afresh.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(symbols_in(Some(&kept), &program, || named("second")), named("second"));
}

/// A stripped library's dynamic symbol table is kept too, in a file of
/// its own: neither table is taken for the other.
#[test]
fn a_dynamic_symbol_table_is_kept_apart_from_the_own_one() {
    let (_dir, program, kept) = program();
    let image = ElfImage::open(&program).expect("the program opens");
    let dynamic =
        |read: fn() -> Vec<KeptFunction>| symbol_table_settled(Some(&kept), &image, SymbolTable::Dynamic, read, -boot_cache::SETTLED_NS);
    assert_eq!(dynamic(|| named("exported")), named("exported"));
    let file = only_file(&kept);
    assert!(file.to_string_lossy().ends_with("-dynsym"), "{}", file.display());
    assert!(is_kept_name(&file.file_name().unwrap().to_string_lossy()), "trimmed as the other kept files are");
    assert_eq!(dynamic(|| named("again")), named("exported"), "read back");
    assert_eq!(symbols_in(Some(&kept), &program, || named("own")), named("own"));
    assert_eq!(dynamic(|| named("again")), named("exported"));
    assert_eq!(symbols_in(Some(&kept), &program, || named("again")), named("own"));
}

#[test]
fn a_changed_programs_symbol_table_is_read_afresh_and_none_is_not_kept() {
    let (_dir, program, kept) = program();
    assert!(symbols_in(Some(&kept), &program, Vec::new).is_empty());
    assert!(std::fs::read_dir(&kept).map_or(0, |d| d.count()) == 0, "an empty table is not kept");
    symbols_in(Some(&kept), &program, || named("first"));
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options().write(true).open(&program).expect("open").set_modified(later).expect("touch");
    assert_eq!(symbols_in(Some(&kept), &program, || named("second")), named("second"));
    // Changed a moment ago (as the touch made it): not kept.
    let image = ElfImage::open(&program).expect("the program opens");
    let _ = std::fs::remove_file(only_file(&kept));
    symbol_table(Some(&kept), &image, SymbolTable::Own, || named("third"));
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 0);
}

#[test]
fn a_damaged_kept_symbol_table_is_read_afresh_without_a_panic() {
    let (_dir, program, kept) = program();
    symbols_in(Some(&kept), &program, || named("first"));
    let file = only_file(&kept);
    let bytes = std::fs::read(&file).expect("kept");
    for end in 0..bytes.len() {
        boot_cache::testing::rewrite(&file, &bytes[..end]);
        assert_eq!(symbols_in(Some(&kept), &program, || named("again")), named("again"), "cut at {end}");
    }
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x80;
        boot_cache::testing::rewrite(&file, &damaged);
        // Either the key no longer matches, or a name changed: never a panic.
        let _ = symbols_in(Some(&kept), &program, || named("again"));
    }
}

#[test]
fn a_real_programs_demangled_symbol_table_reads_back_as_it_was_read() {
    // This test's own program: a Rust program of thousands of symbols.
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("program");
    std::fs::copy(std::env::current_exe().expect("this test's program"), &program).expect("copy");
    let kept = dir.path().join("kept");
    let image = ElfImage::open(&program).expect("the program opens");
    let elf = image.parse().expect("it parses");
    let fresh = symbols_in(Some(&kept), &program, || super::super::functions_named_in(elf.symbols()));
    assert!(fresh.len() > 1000 && fresh.iter().any(|f| f.name != f.raw_name), "{} functions, some demangled", fresh.len());
    let again = symbols_in(Some(&kept), &program, || panic!("read again, not from what was kept"));
    assert!(again == fresh, "what was kept reads back as it was read");
}

/// Runs a binutils tool in `dir`.
fn binutils(dir: &Path, args: &[&std::ffi::OsStr]) {
    let status = std::process::Command::new(args[0]).args(&args[1..]).current_dir(dir).status();
    assert!(status.is_ok_and(|s| s.success()), "{args:?} (binutils) is needed");
}

/// The functions the symbol index of `program` names, and where from,
/// read with what is kept in `kept`.
fn functions_through(kept: &Path, program: &Path) -> Vec<(String, crate::symbols::SymbolOrigin)> {
    let options = crate::symbols::LoadOptions {
        lines: false,
        debug_dirs: crate::symbols::DebugDirs(Vec::new()),
        debuginfod: None,
        symbol_tables_enough: true,
        kept_reads: Some(kept.to_path_buf()),
    };
    let index = crate::symbols::SymbolIndex::load(program, &options).expect("its symbols");
    index.functions.iter().map(|f| (f.name.clone(), f.origin)).collect()
}

/// A stripped program's dynamic symbol table is read through what was
/// kept of it: the table kept for its version names its functions.
#[test]
fn a_stripped_programs_functions_come_from_its_kept_dynamic_symbol_table() {
    let (dir, program, kept) = program();
    binutils(dir.path(), &["strip".as_ref(), "--strip-all".as_ref(), program.as_os_str()]);
    let image = ElfImage::open(&program).expect("the program opens");
    // Kept as a read of it would keep it, however recently it was written.
    symbol_table_settled(Some(&kept), &image, SymbolTable::Dynamic, || named("planted"), -boot_cache::SETTLED_NS);
    assert_eq!(functions_through(&kept, &program), [("planted".to_string(), crate::symbols::SymbolOrigin::Dynsym)]);
}

/// A stripped program's debug file's symbol table is read through what was
/// kept of that file.
#[test]
fn a_debug_files_functions_come_from_its_kept_symbol_table() {
    let (dir, program, kept) = program();
    let debug = dir.path().join("calls.debug");
    binutils(dir.path(), &["objcopy".as_ref(), "--only-keep-debug".as_ref(), program.as_os_str(), debug.as_os_str()]);
    binutils(dir.path(), &["strip".as_ref(), "--strip-all".as_ref(), program.as_os_str()]);
    binutils(dir.path(), &["objcopy".as_ref(), "--add-gnu-debuglink=calls.debug".as_ref(), program.as_os_str()]);
    let debug_image = ElfImage::open(&debug).expect("the debug file opens");
    symbol_table_settled(Some(&kept), &debug_image, SymbolTable::Own, || named("planted"), -boot_cache::SETTLED_NS);
    assert_eq!(functions_through(&kept, &program), [("planted".to_string(), crate::symbols::SymbolOrigin::Symtab)]);
}

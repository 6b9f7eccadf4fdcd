//! `proftap symbols` against binutils (nm, readelf, objdump) on real programs
//! in the variants that break symbolizers.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Text symbols per nm: address -> demangled names.
fn nm_functions(binary: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    let out = run_ok(Command::new("nm").args(["--defined-only", "-C"]).arg(binary));
    let mut map: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for line in out.lines() {
        let mut parts = line.splitn(3, ' ');
        let (Some(addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if !matches!(kind, "T" | "t" | "W" | "w" | "i") {
            continue;
        }
        let addr = u64::from_str_radix(addr, 16).unwrap();
        if addr != 0 {
            map.entry(addr).or_default().insert(name.to_string());
        }
    }
    map
}

/// Section headers per readelf: (address, offset, size) of sections with file data.
fn readelf_sections(binary: &Path) -> Vec<(u64, u64, u64)> {
    readelf_sections_where(binary, |_| true)
}

/// Executable sections per readelf.
fn readelf_code_sections(binary: &Path) -> Vec<(u64, u64, u64)> {
    readelf_sections_where(binary, |flags| flags.contains('X'))
}

fn readelf_sections_where(binary: &Path, keep: impl Fn(&str) -> bool) -> Vec<(u64, u64, u64)> {
    let out = run_ok(Command::new("readelf").args(["-SW"]).arg(binary));
    out.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line.strip_prefix('[')?.split_once(']')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // Name Type Address Off Size ...
            if fields.len() < 5 || fields[1] == "NOBITS" {
                return None;
            }
            // Name Type Address Off Size ES [Flg] Lk Inf Al: Flg may be empty.
            let flags = fields.get(6).filter(|f| f.chars().all(|c| c.is_ascii_uppercase())).copied().unwrap_or("");
            if !keep(flags) {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            Some((hex(fields[2])?, hex(fields[3])?, hex(fields[4])?))
        })
        .filter(|&(addr, _, size)| addr != 0 && size != 0)
        .collect()
}

fn readelf_build_id(binary: &Path) -> Option<String> {
    let out = run_ok(Command::new("readelf").args(["-n"]).arg(binary));
    out.lines().find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
}

fn functions(json: &Value) -> &Vec<Value> {
    json["functions"].as_array().unwrap()
}

fn names_of(f: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::from([f["name"].as_str().unwrap().to_string()]);
    if let Some(aliases) = f["aliases"].as_array() {
        names.extend(aliases.iter().map(|a| a.as_str().unwrap().to_string()));
    }
    names
}

/// Every text symbol nm knows is a function of ours with that name at that
/// address; every function of ours is a symbol nm knows; file offsets agree
/// with the section headers; build-id and kind agree with readelf.
fn check_against_binutils(build: &Build) {
    let binary = build.build();
    let json = symbols_json(&[binary.to_str().unwrap(), "-f", "*"]);
    let ours: BTreeMap<u64, &Value> = functions(&json).iter().map(|f| (f["address"].as_u64().unwrap(), f)).collect();
    let code = readelf_code_sections(&binary);
    let mut nm = nm_functions(&binary);
    nm.retain(|addr, _| code.iter().any(|&(a, _, size)| *addr >= a && *addr < a + size));
    let label = build.label();

    for (addr, nm_names) in &nm {
        let Some(f) = ours.get(addr) else {
            // `.cold` parts are not functions one can enter; the rest must be there.
            assert!(nm_names.iter().all(|n| n.contains(".cold")), "{label}: nm has {nm_names:?} at {addr:#x}, proftap has nothing");
            continue;
        };
        let names = names_of(f);
        for n in nm_names {
            // nm -C keeps the hash of legacy Rust symbols on some binutils; we never show it.
            let n = strip_rust_hash(n);
            assert!(names.contains(&n), "{label}: at {addr:#x} nm says {n}, proftap says {names:?}");
        }
    }
    for (addr, f) in &ours {
        if f["origin"] == "dwarf" {
            continue;
        }
        assert!(nm.contains_key(addr), "{label}: proftap lists {} at {addr:#x}, nm does not", f["name"]);
    }

    let sections = readelf_sections(&binary);
    for (addr, f) in &ours {
        let (sec_addr, sec_off, _) = sections
            .iter()
            .find(|&&(a, _, size)| *addr >= a && *addr < a + size)
            .unwrap_or_else(|| panic!("{label}: no section holds {addr:#x}"));
        assert_eq!(f["file_offset"].as_u64(), Some(addr - sec_addr + sec_off), "{label}: file offset of {}", f["name"]);
    }

    let module = &json["modules"][0];
    assert_eq!(module["build_id"].as_str().map(str::to_string), readelf_build_id(&binary), "{label}: build-id");
    let header = run_ok(Command::new("readelf").arg("-h").arg(&binary));
    let expected_kind = if header.contains("EXEC (Executable file)") { "executable" } else { "pie-executable" };
    assert_eq!(module["kind"], expected_kind, "{label}: kind");
}

fn strip_rust_hash(name: &str) -> String {
    match name.rsplit_once("::h") {
        Some((base, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => base.to_string(),
        _ => name.to_string(),
    }
}

/// The declaration line of each example function is the line that defines it.
fn check_declarations(build: &Build, expected: &[&str]) {
    let json = symbols_json(&[build.build().to_str().unwrap()]);
    for name in expected {
        let f = functions(&json)
            .iter()
            .find(|f| f["name"].as_str().unwrap() == *name || f["name"].as_str().unwrap().starts_with(&format!("{name}(")))
            .unwrap_or_else(|| panic!("{}: {name} not in the default selection", build.label()));
        let file = f["file"].as_str().unwrap();
        let line = f["line"].as_u64().unwrap() as usize;
        let source = std::fs::read_to_string(file).unwrap();
        let text = source.lines().nth(line - 1).unwrap();
        let short = name.rsplit("::").next().unwrap();
        assert!(text.contains(short), "{}: {name} declared at {file}:{line}, which reads {text:?}", build.label());
    }
}

#[test]
fn c_functions_match_binutils_at_every_optimisation_and_pie_setting() {
    for opt in ["-O0", "-O2"] {
        check_against_binutils(&Build::c("calls.c", opt));
        check_against_binutils(&Build::c("calls.c", opt).no_pie());
        check_against_binutils(&Build::c("threads.c", opt));
        check_against_binutils(&Build::c("multifile/main.c", opt).sources(&["multifile/io.c", "multifile/compute.c"]));
    }
}

#[test]
fn cpp_functions_are_demangled_like_nm() {
    for opt in ["-O0", "-O2"] {
        check_against_binutils(&Build::cxx("shapes.cpp", opt));
    }
    let json = symbols_json(&[Build::cxx("shapes.cpp", "-O0").build().to_str().unwrap()]);
    let names: BTreeSet<&str> = functions(&json).iter().map(|f| f["name"].as_str().unwrap()).collect();
    for expected in
        ["shapes::Circle::area() const", "checks::validate(int)", "int shapes::sum<int>(std::vector<int, std::allocator<int> > const&)"]
    {
        assert!(names.contains(expected), "{expected} missing from {names:?}");
    }
}

#[test]
fn rust_functions_are_demangled_without_hashes() {
    for opt in ["-O0", "-O2"] {
        let build = Build::rust("calls.rs", opt);
        check_against_binutils(&build);
        // The default selection is the program's own code, not the standard library.
        let json = symbols_json(&[build.build().to_str().unwrap()]);
        let names: BTreeSet<&str> = functions(&json).iter().map(|f| f["name"].as_str().unwrap()).collect();
        for expected in ["calls::leaf", "calls::left", "calls::right", "calls::depth", "calls::shapes::Circle::area", "calls::main"] {
            assert!(names.contains(expected), "{opt}: {expected} missing from {names:?}");
        }
        assert!(names.iter().all(|n| !n.starts_with("std::") && !n.starts_with("core::")), "{opt}: runtime in default: {names:?}");
    }
}

#[test]
fn declarations_point_at_the_defining_lines() {
    for opt in ["-O0", "-O2"] {
        check_declarations(&Build::c("calls.c", opt), &["leaf", "left", "right", "fib", "run", "main"]);
        check_declarations(&Build::cxx("shapes.cpp", opt), &["shapes::Circle::area", "checks::check", "checks::validate"]);
        check_declarations(&Build::rust("calls.rs", opt), &["calls::leaf", "calls::depth", "calls::shapes::Circle::area"]);
    }
}

/// (file name, line, address, is_stmt) of every row but sequence ends, as
/// objdump decodes them, without the sequences of code the linker discarded
/// (objdump prints them at addresses near 0, outside any code section).
fn objdump_rows(binary: &Path) -> Vec<(String, u64, u64, bool)> {
    objdump_rows_laid_out_as(binary, binary)
}

/// [`objdump_rows`] of a debug file, whose code sections are in `layout`.
fn objdump_rows_laid_out_as(binary: &Path, layout: &Path) -> Vec<(String, u64, u64, bool)> {
    let code = readelf_code_sections(layout);
    let lowest_code = code.iter().map(|&(a, _, _)| a).min().unwrap();
    let out = run_ok(Command::new("objdump").args(["--dwarf=decodedline", "--wide"]).arg(binary));
    let mut rows = Vec::new();
    for line in out.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() < 3 || !tokens[2].starts_with("0x") {
            continue;
        }
        let Ok(line_no) = tokens[1].parse::<u64>() else { continue };
        let addr = u64::from_str_radix(&tokens[2][2..], 16).unwrap();
        if addr < lowest_code {
            continue;
        }
        let file = tokens[0].rsplit('/').next().unwrap().to_string();
        rows.push((file, line_no, addr, tokens.last() == Some(&"x")));
    }
    rows.sort();
    rows
}

fn our_rows(binary: &Path, extra: &[&str]) -> Vec<(String, u64, u64, bool)> {
    let mut args = vec![binary.to_str().unwrap(), "--lines"];
    args.extend_from_slice(extra);
    let json = symbols_json(&args);
    let mut rows: Vec<_> = json["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["end_sequence"] == false)
        .map(|r| {
            let file = Path::new(r["file"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned();
            (file, r["line"].as_u64().unwrap(), r["address"].as_u64().unwrap(), r["is_stmt"].as_bool().unwrap())
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn line_tables_match_objdump_for_dwarf_4_and_5() {
    require("objdump", "to compare line tables");
    let builds = [
        Build::c("calls.c", "-O0"),
        Build::c("calls.c", "-O2").flag("-gdwarf-4"),
        Build::c("calls.c", "-O2").flag("-gdwarf-5"),
        Build::cxx("shapes.cpp", "-O2"),
        Build::cxx("shapes.cpp", "-O0").flag("-gdwarf-4"),
        Build::c("multifile/main.c", "-O2").sources(&["multifile/io.c", "multifile/compute.c"]),
        Build::rust("calls.rs", "-O2"),
    ];
    for build in &builds {
        let binary = build.build();
        let theirs = objdump_rows(&binary);
        let ours = our_rows(&binary, &[]);
        assert!(!ours.is_empty(), "{}: no rows", build.label());
        assert_eq!(ours.len(), theirs.len(), "{}: row count", build.label());
        assert_eq!(ours, theirs, "{}: rows differ", build.label());
    }
    // The units say which DWARF version they are.
    for (flag, version) in [("-gdwarf-4", 4), ("-gdwarf-5", 5)] {
        let binary = Build::c("calls.c", "-O2").flag(flag).build();
        let json = symbols_json(&[binary.to_str().unwrap(), "--lines"]);
        let units = json["modules"][0]["compile_units"].as_array().unwrap();
        assert!(
            units.iter().any(|u| u["name"].as_str().unwrap().ends_with("calls.c") && u["dwarf_version"] == version),
            "{flag}: {units:?}"
        );
    }
}

#[test]
fn lines_of_selected_functions_only() {
    let binary = Build::c("calls.c", "-O0").build();
    let json = symbols_json(&[binary.to_str().unwrap(), "--lines", "-f", "fib"]);
    let fib = &functions(&json)[0];
    let (lo, hi) = (fib["address"].as_u64().unwrap(), fib["address"].as_u64().unwrap() + fib["size"].as_u64().unwrap());
    let rows = json["lines"].as_array().unwrap();
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| (lo..hi).contains(&r["address"].as_u64().unwrap())));
    let lines: BTreeSet<u64> = rows.iter().map(|r| r["line"].as_u64().unwrap()).collect();
    // fib's code starts at its declaration or its opening brace on the next line.
    let decl = fib["line"].as_u64().unwrap();
    assert!(lines.first() == Some(&decl) || lines.first() == Some(&(decl + 1)), "{lines:?} from {decl}");
}

/// Runs objcopy/strip steps on a copy of a binary in a temp dir.
fn tool(args: &[&str]) {
    let (cmd, rest) = args.split_first().unwrap();
    run_ok(Command::new(cmd).args(rest));
}

#[test]
fn separate_debug_info_is_found_by_debuglink() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("calls");
    Build::c("calls.c", "-O2").compile_to(&binary);
    let debug = dir.path().join("calls.debug");
    let (b, d) = (binary.to_str().unwrap(), debug.to_str().unwrap());
    tool(&["objcopy", "--only-keep-debug", b, d]);
    tool(&["strip", "--strip-all", b]);
    tool(&["objcopy", &format!("--add-gnu-debuglink={d}"), b]);

    let json = symbols_json(&[b]);
    assert_eq!(json["modules"][0]["debug_info"]["kind"], "debug-link");
    assert_eq!(json["modules"][0]["debug_info"]["path"], d);
    let names: BTreeSet<&str> = functions(&json).iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert!(names.is_superset(&BTreeSet::from(["leaf", "left", "right", "fib", "run", "main"])), "{names:?}");
    assert!(functions(&json).iter().all(|f| f["line"].as_u64().is_some()));
    // Lines come from the debug file, offsets from the stripped binary.
    assert_eq!(our_rows(&binary, &[]), objdump_rows_laid_out_as(&debug, &binary));
    let sections = readelf_sections(&binary);
    for f in functions(&json) {
        let addr = f["address"].as_u64().unwrap();
        let (a, o, _) = sections.iter().find(|&&(a, _, s)| addr >= a && addr < a + s).unwrap();
        assert_eq!(f["file_offset"].as_u64(), Some(addr - a + o));
    }

    // A debug file of another build is refused, with a warning.
    Build::c("calls.c", "-O0").compile_to(&debug);
    let out = run(proftap().args(["symbols", b, "-f", "*"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CRC does not match"), "{stderr}");
}

#[test]
fn separate_debug_info_is_found_by_build_id() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("shapes");
    Build::cxx("shapes.cpp", "-O2").compile_to(&binary);
    let id = readelf_build_id(&binary).unwrap();
    let debug_root = dir.path().join("debug");
    let debug = debug_root.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    tool(&["objcopy", "--only-keep-debug", binary.to_str().unwrap(), debug.to_str().unwrap()]);
    tool(&["strip", "--strip-debug", binary.to_str().unwrap()]);

    let plain = symbols_json(&[binary.to_str().unwrap()]);
    assert_eq!(plain["modules"][0]["debug_info"]["kind"], "missing");
    let json = symbols_json(&[binary.to_str().unwrap(), "--debug-dir", debug_root.to_str().unwrap()]);
    assert_eq!(json["modules"][0]["debug_info"]["kind"], "build-id");
    let area = functions(&json).iter().find(|f| f["name"] == "shapes::Circle::area() const").unwrap();
    assert!(area["file"].as_str().unwrap().ends_with("shapes.cpp"));
}

#[test]
fn compressed_debug_sections_read_like_plain_ones() {
    let plain = Build::c("calls.c", "-O2").build();
    let expected = our_rows(&plain, &[]);
    let dir = tempfile::tempdir().unwrap();
    for (i, how) in
        ["--compress-debug-sections=zlib", "--compress-debug-sections=zlib-gnu", "--compress-debug-sections=zstd"].iter().enumerate()
    {
        let copy = dir.path().join(format!("calls{i}"));
        let out = run(Command::new("objcopy").arg(how).arg(&plain).arg(&copy));
        if !out.status.success() {
            // Older binutils lack zstd; zlib must work everywhere.
            assert!(how.contains("zstd"), "objcopy {how} failed: {}", String::from_utf8_lossy(&out.stderr));
            eprintln!("SKIPPED {how}: this objcopy cannot write it");
            continue;
        }
        let json = symbols_json(&[copy.to_str().unwrap()]);
        assert_eq!(json["modules"][0]["debug_info"]["kind"], "embedded", "{how}");
        if !how.ends_with("gnu") {
            assert_eq!(json["modules"][0]["debug_info"]["compressed"], true, "{how}");
        }
        assert!(functions(&json).iter().any(|f| f["name"] == "fib" && f["line"].as_u64().is_some()), "{how}");
        assert_eq!(our_rows(&copy, &[]), expected, "{how}");
    }
}

#[test]
fn stripped_binaries_fall_back_to_dynsym_or_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_libcounter(dir.path());
    let full = symbols_json(&[lib.to_str().unwrap(), "-f", "*"]);
    assert!(functions(&full).iter().any(|f| f["name"] == "clamp" || f["name"] == "counter_add"));
    tool(&["strip", "--strip-all", lib.to_str().unwrap()]);

    let out = run(proftap().args(["symbols", "--format", "json", lib.to_str().unwrap(), "-f", "counter_*"]));
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stripped"), "a warning should say the file is stripped: {stderr}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeSet<&str> = functions(&json).iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["counter_add", "counter_reset", "counter_total"]));
    assert!(functions(&json).iter().all(|f| f["origin"] == "dynsym"));

    // A static function is gone with .symtab: asking for it names the pattern and says why.
    let out = run(proftap().args(["symbols", lib.to_str().unwrap(), "-f", "clamp"]));
    assert_clean_failure(&out, "'clamp' matches no function");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stripped"));

    // An executable stripped of everything has nothing to show.
    let exe = dir.path().join("calls");
    Build::c("calls.c", "-O2").compile_to(&exe);
    tool(&["strip", "--strip-all", exe.to_str().unwrap()]);
    let out = run(proftap().args(["symbols", exe.to_str().unwrap()]));
    assert_clean_failure(&out, "has no symbols");
}

#[test]
fn patterns_select_by_name_file_module_and_exclusion() {
    let binary = Build::c("multifile/main.c", "-O0").sources(&["multifile/io.c", "multifile/compute.c"]).build();
    let b = binary.to_str().unwrap();
    let names = |args: &[&str]| -> BTreeSet<String> {
        let mut all = vec![b];
        all.extend_from_slice(args);
        functions(&symbols_json(&all)).iter().map(|f| f["name"].as_str().unwrap().to_string()).collect()
    };
    let set = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(names(&[]), set(&["main", "checksum", "process", "parse_int", "format_record", "parse_record"]));
    assert_eq!(names(&["-f", "parse_*"]), set(&["parse_int", "parse_record"]));
    assert_eq!(names(&["-f", "multifile/io.c:*"]), set(&["parse_int", "format_record", "parse_record"]));
    assert_eq!(names(&["-f", "io.c:parse_*", "-f", "main"]), set(&["parse_int", "parse_record", "main"]));
    assert_eq!(names(&["-f", "!parse_*"]), set(&["main", "checksum", "process", "format_record"]));
    assert_eq!(names(&["-f", "*.c:*", "-f", "!main"]), set(&["checksum", "process", "parse_int", "format_record", "parse_record"]));
    let cpp = Build::cxx("shapes.cpp", "-O0").build();
    let json = symbols_json(&[cpp.to_str().unwrap(), "-f", "shapes::*", "-f", "!*~*"]);
    let cpp_names: BTreeSet<&str> = functions(&json).iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert!(cpp_names.contains("shapes::Circle::area() const"));
    assert!(cpp_names.iter().all(|n| n.contains("shapes::") && !n.contains('~')), "{cpp_names:?}");
    let json = symbols_json(&[cpp.to_str().unwrap(), "-f", "checks::check"]);
    assert_eq!(functions(&json)[0]["name"], "checks::check(int)");

    let out = run(proftap().args(["symbols", b, "-f", "no_such_*"]));
    assert_clean_failure(&out, "pattern 'no_such_*' matches no function in");
    assert!(String::from_utf8_lossy(&out.stderr).contains(b));
    let out = run(proftap().args(["symbols", b, "-f", "libfoo.so:x"]));
    assert_clean_failure(&out, "no module named 'libfoo.so'");
    let out = run(proftap().args(["symbols", b, "-f", "f["]));
    assert_clean_failure(&out, "invalid function pattern 'f['");
}

#[test]
fn bad_input_gives_one_sentence_and_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a program\n").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let full = std::fs::read(Build::c("calls.c", "-O0").build()).unwrap();
    let header_only = dir.path().join("header-only");
    std::fs::write(&header_only, &full[..100]).unwrap();
    let half = dir.path().join("half");
    std::fs::write(&half, &full[..full.len() / 2]).unwrap();
    let elf32 = dir.path().join("elf32");
    let mut bytes = full.clone();
    bytes[4] = 1;
    std::fs::write(&elf32, &bytes).unwrap();
    // Nothing ever writes to it: reading it as a program would wait forever.
    let fifo = dir.path().join("fifo");
    run_ok(Command::new("mkfifo").arg(&fifo));

    let cases: [(&Path, &str); 7] = [
        (Path::new("/no/such/file"), "cannot read /no/such/file"),
        (dir.path(), "is a directory"),
        (&text, "is not a valid ELF file"),
        (&empty, "the file is empty"),
        (&header_only, "is not a valid ELF file"),
        (&elf32, "32-bit"),
        (&fifo, "is a named pipe (FIFO), not an executable or shared library"),
    ];
    for (path, expect) in cases {
        let out = run(proftap().arg("symbols").arg(path));
        assert_clean_failure(&out, expect);
        assert_eq!(out.status.code(), Some(2));
    }
    // Half a file: the headers are there, the sections are not. Whatever is
    // missing must be an error or a warning, never a panic.
    let out = run(proftap().arg("symbols").arg(&half).arg("--lines"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if !out.status.success() {
        assert_clean_failure(&out, "half");
    }
    let out = run(proftap().args(["symbols", "--pid", "999999999"]));
    assert_clean_failure(&out, "no process with PID 999999999 exists");
}

#[test]
fn a_running_process_shows_modules_and_runtime_addresses() {
    use std::io::{BufRead, BufReader, Write};
    let binary = Build::c("wait.c", "-O2").build();
    let mut child = Command::new(&binary).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    // "ready PID ADDRESS"
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[0], "ready", "{line}");
    let address = u64::from_str_radix(fields[2].trim_start_matches("0x"), 16).unwrap();

    let json = symbols_json(&["--pid", fields[1], "-f", "tick", "-f", "libc.so.6:malloc"]);
    let tick = functions(&json).iter().find(|f| f["name"] == "tick").unwrap();
    assert_eq!(tick["runtime_address"].as_u64(), Some(address));
    let modules = json["modules"].as_array().unwrap();
    assert_eq!(modules[0]["path"].as_str(), Some(std::fs::canonicalize(&binary).unwrap().to_str().unwrap()));
    let libc = modules.iter().position(|m| m["path"].as_str().unwrap().ends_with("/libc.so.6")).expect("libc is loaded");
    let malloc = functions(&json).iter().find(|f| f["name"] == "malloc").expect("malloc in libc");
    assert_eq!(malloc["module"].as_u64(), Some(libc as u64));
    // libc's malloc, where the process has it mapped executable.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", fields[1])).unwrap();
    let rt = malloc["runtime_address"].as_u64().unwrap();
    assert!(
        maps.lines().any(|l| {
            let (range, rest) = l.split_once(' ').unwrap();
            let (s, e) = range.split_once('-').unwrap();
            rest.starts_with("r-x")
                && rest.ends_with("libc.so.6")
                && (u64::from_str_radix(s, 16).unwrap()..u64::from_str_radix(e, 16).unwrap()).contains(&rt)
        }),
        "malloc at {rt:#x} is not in libc's code"
    );

    child.stdin.take().unwrap().write_all(b"3\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(rest.contains("done 3"), "{rest}");
}

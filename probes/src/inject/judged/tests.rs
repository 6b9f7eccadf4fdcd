use super::*;
use crate::boot_cache::testing::only_file;
use crate::exits::ExitMode;
use crate::select::Selected;
use crate::symbols::{DebugDirs, LoadOptions, SymbolIndex};
use std::os::unix::fs::PermissionsExt;

/// Every function of a program with DWARF, copied into a directory of its
/// own, and an empty directory to keep what is judged of it in.
fn program() -> (tempfile::TempDir, PathBuf, Vec<ProbedFunction>, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("calls");
    std::fs::write(&path, include_bytes!("../../symbols/testdata/calls-O2-dwarf4")).expect("write the program");
    let functions = functions_of(&path);
    let kept = dir.path().join("kept");
    (dir, path, functions, kept)
}

fn functions_of(path: &Path) -> Vec<ProbedFunction> {
    let options =
        LoadOptions { lines: false, debug_dirs: DebugDirs(Vec::new()), debuginfod: None, symbol_tables_enough: false, kept_reads: None };
    let index = SymbolIndex::load(path, &options).expect("the program's symbols");
    let image = ElfImage::open(path).expect("the program opens");
    let selected: Vec<Selected> = (0..index.functions.len()).map(|function| Selected { module: 0, function }).collect();
    let functions = crate::plan::plan(&[&index], &[Some(&image)], &[path.to_path_buf()], &selected, ExitMode::ReturnSites, &mut Vec::new());
    assert!(functions.len() > 5, "{} functions", functions.len());
    functions
}

/// What is judged of `functions`, kept in `kept` however recently the program was written.
fn judged_in(kept: Option<&Path>, functions: &[ProbedFunction]) -> Vec<Verdict> {
    judge_settled(functions, kept, -boot_cache::SETTLED_NS)
}

/// `file` kept again with every function refused, so that a judgement
/// shows whether it came from the kept file.
fn plant_refusals(file: &Path) {
    let mut kept = decode(&std::fs::read(file).expect("read kept")).expect("it decodes");
    assert!(!kept.judged.is_empty());
    for (_, verdict) in &mut kept.judged {
        *verdict = Verdict::Refused("planted".into());
    }
    boot_cache::testing::rewrite(file, &postcard::to_stdvec(&kept).expect("encode"));
}

fn planted(verdicts: &[Verdict]) -> usize {
    verdicts.iter().filter(|v| **v == Verdict::Refused("planted".into())).count()
}

#[test]
fn what_is_judged_is_kept_and_read_back() {
    let (_dir, _program, functions, kept) = program();
    let fresh = judged_in(None, &functions);
    assert!(fresh.contains(&Verdict::Planned), "{fresh:?}");
    assert_eq!(judged_in(Some(&kept), &functions), fresh, "the judgement that keeps");
    let file = only_file(&kept);
    assert_eq!(std::fs::metadata(&file).expect("kept").permissions().mode() & 0o077, 0, "readable by its owner only");
    assert_eq!(judged_in(Some(&kept), &functions), fresh, "read back");
    plant_refusals(&file);
    assert_eq!(planted(&judged_in(Some(&kept), &functions)), functions.len(), "the second judgement came from the file");
}

#[test]
fn a_function_told_otherwise_is_judged_afresh() {
    let (_dir, _program, mut functions, kept) = program();
    let fresh = judged_in(Some(&kept), &functions);
    plant_refusals(&only_file(&kept));
    functions[0].padding = functions[0].padding.wrapping_add(1);
    let verdicts = judged_in(Some(&kept), &functions);
    assert_ne!(verdicts[0], Verdict::Refused("planted".into()));
    assert_eq!(verdicts[0], judged_in(None, &functions)[0]);
    assert_eq!(planted(&verdicts), functions.len() - 1, "{fresh:?}");
}

#[test]
fn a_changed_program_is_judged_afresh() {
    let (_dir, program, functions, kept) = program();
    let fresh = judged_in(Some(&kept), &functions);
    plant_refusals(&only_file(&kept));
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options().write(true).open(&program).expect("open").set_modified(later).expect("touch");
    assert_eq!(judged_in(Some(&kept), &functions), fresh);
    // Kept anew, over what was kept of the old version.
    assert_eq!(planted(&judged_in(Some(&kept), &functions)), 0);
    only_file(&kept);
}

#[test]
fn a_kept_file_others_may_write_is_not_read() {
    let (_dir, _program, functions, kept) = program();
    let fresh = judged_in(Some(&kept), &functions);
    let file = only_file(&kept);
    plant_refusals(&file);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(judged_in(Some(&kept), &functions), fresh);
}

#[test]
fn a_program_changed_a_moment_ago_is_not_kept() {
    let (_dir, _program, functions, kept) = program();
    judge(&functions, Some(&kept));
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 0, "changed within the clock's tick, it may change again unseen");
}

#[test]
fn damaged_kept_files_are_judged_afresh_without_a_panic() {
    let (_dir, _program, functions, kept) = program();
    let fresh = judged_in(Some(&kept), &functions);
    let file = only_file(&kept);
    let bytes = std::fs::read(&file).expect("kept");
    assert!(decode(&bytes).is_some(), "{} bytes", bytes.len());
    for end in 0..bytes.len() {
        kept_file_is_used(&bytes[..end]);
    }
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x55;
        kept_file_is_used(&damaged);
    }
    // Cut short, the file is judged afresh and kept whole again.
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("cut");
    assert_eq!(judged_in(Some(&kept), &functions), fresh);
    assert!(decode(&std::fs::read(&file).expect("kept")).is_some(), "kept anew");
}

#[test]
fn a_file_whose_every_function_was_refused_for_one_reason_is_not_kept() {
    // Such as a file that could not be read for a moment.
    let (_dir, _program, mut functions, kept) = program();
    functions.iter_mut().for_each(|f| f.size = 0);
    let verdicts = judged_in(Some(&kept), &functions);
    assert!(verdicts.iter().all(|v| *v == Verdict::Refused("its size is unknown".into())), "{verdicts:?}");
    assert_eq!(std::fs::read_dir(&kept).expect("kept").count(), 0);
}

/// Planned on every CPU, a program's functions get the plans and the
/// refusals planning them one after another gives, in the same order.
#[test]
fn planning_on_every_cpu_gives_what_planning_in_turn_does() {
    let (_dir, _program, functions, _kept) = program();
    let modules = patcher::as_in_files(&functions);
    let targets: Vec<Target> = functions.iter().map(Target::of).collect();
    let shown = |(groups, refused): (Vec<patcher::ModulePlans>, patcher::Refused)| {
        let groups: Vec<String> = groups.iter().map(|g| format!("{:?} {:?}", g.module, g.plans)).collect();
        (groups, refused)
    };
    let in_turn = shown(patcher::plans(&modules, &targets, &[]));
    assert!(!in_turn.0.is_empty() && !in_turn.1.is_empty(), "both plans and refusals: {in_turn:?}");
    assert_eq!(shown(patcher::plans_on_every_cpu(&modules, &targets, &[])), in_turn);
}

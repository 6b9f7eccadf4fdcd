//! Line counts against gcov on the same source, gcov's file formats, lcov
//! and gcov JSON read by genhtml and gcovr, merging runs, regions and line times.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Line -> count (None for `-`, 0 for `#####`) of a .gcov file.
fn parse_gcov(text: &str) -> BTreeMap<u32, Option<u64>> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let count = parts.next()?.trim().trim_end_matches('*');
            let line: u32 = parts.next()?.trim().parse().ok()?;
            if line == 0 {
                return None;
            }
            let count = match count {
                "-" => None,
                "#####" | "=====" => Some(0),
                c => Some(c.parse().ok()?),
            };
            Some((line, count))
        })
        .collect()
}

/// gcov's counts for `source` built with `opt` and run with `args`.
fn gcov_counts(source: &str, opt: &str, args: &[&str]) -> BTreeMap<u32, Option<u64>> {
    parse_gcov(&gcov_file(source, opt, args, &[]))
}

/// The `.gcov` file gcov (with `flags`) writes for `source` built with
/// `opt` and run with `args`.
fn gcov_file(source: &str, opt: &str, args: &[&str], flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("cov");
    run_ok(Command::new("gcc").arg(opt).args(["-g", "--coverage", "-o"]).arg(&binary).arg(examples().join(source)).current_dir(dir.path()));
    run_ok(Command::new(&binary).args(args).current_dir(dir.path()));
    let gcda = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "gcda"))
        .unwrap();
    run_ok(Command::new("gcov").args(flags).arg(&gcda).current_dir(dir.path()));
    let name = Path::new(source).file_name().unwrap().to_str().unwrap();
    std::fs::read_to_string(dir.path().join(format!("{name}.gcov"))).unwrap()
}

/// Line -> the counts of its `branch N taken COUNT` lines (`gcov -b -c`),
/// sorted; a branch never executed counts 0.
fn parse_gcov_branches(text: &str) -> BTreeMap<u32, Vec<u64>> {
    let mut branches: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut line = 0;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("branch") {
            let count = rest.split_whitespace().nth(2).and_then(|c| c.parse().ok()).unwrap_or(0);
            branches.entry(line).or_default().push(count);
        } else if let Some(number) = l.split(':').nth(1).and_then(|n| n.trim().parse().ok()) {
            line = number;
        }
    }
    for counts in branches.values_mut() {
        counts.sort_unstable();
    }
    branches
}

/// proftap's counts: `run --lines`, then `proftap gcov`. Returns the counts, the .gcov text and the profile.
fn proftap_counts(build: &Build, args: &[&str], dir: &Path) -> (BTreeMap<u32, Option<u64>>, String, PathBuf) {
    let binary = build.build();
    let profile = dir.join(format!("{}.profile", build.label()));
    let out = run(proftap().arg("run").arg("--lines").arg("-o").arg(&profile).arg("--").arg(&binary).args(args));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let gcov_dir = dir.join(build.label());
    std::fs::create_dir_all(&gcov_dir).unwrap();
    run_ok(proftap().arg("gcov").arg(&profile).arg("-o").arg(&gcov_dir));
    let name = Path::new(build.sources[0]).file_name().unwrap().to_str().unwrap();
    let text = std::fs::read_to_string(gcov_dir.join(format!("{name}.gcov"))).unwrap();
    (parse_gcov(&text), text, profile)
}

/// (lines both count and agree, lines both count, lines only proftap counts).
fn agreement(theirs: &BTreeMap<u32, Option<u64>>, ours: &BTreeMap<u32, Option<u64>>) -> (usize, usize, Vec<u32>) {
    let mut agree = 0;
    let mut both = 0;
    let mut only_ours = Vec::new();
    for (line, count) in ours {
        match (theirs.get(line).copied().flatten(), count) {
            (Some(t), Some(o)) => {
                both += 1;
                if t == *o {
                    agree += 1;
                }
            }
            (None, Some(_)) => only_ours.push(*line),
            _ => {}
        }
    }
    (agree, both, only_ours)
}

#[test]
fn line_counts_equal_gcov_at_o0() {
    require_probes();
    require("gcov", "as the line-count oracle");
    let dir = tempfile::tempdir().unwrap();
    for args in [vec!["12"], vec!["3"]] {
        let theirs = gcov_counts("coverage.c", "-O0", &args);
        let (ours, text, _) = proftap_counts(&Build::c("coverage.c", "-O0"), &args, dir.path());
        for (line, count) in &ours {
            let gcov = theirs.get(line).copied().flatten();
            match (gcov, count) {
                (None, Some(c)) => panic!("line {line}: proftap counts {c}, gcov shows no count\n{text}"),
                (Some(g), Some(c)) => assert_eq!(g, *c, "line {line} (args {args:?})\n{text}"),
                _ => {}
            }
        }
        let (agree, both, _) = agreement(&theirs, &ours);
        assert!(both >= 35, "only {both} lines counted by both\n{text}");
        assert_eq!(agree, both);
        // The function never called shows #####, as gcov does.
        let never =
            std::fs::read_to_string(examples().join("coverage.c")).unwrap().lines().position(|l| l.contains("static int never")).unwrap()
                as u32
                + 1;
        assert_eq!(ours[&never], Some(0));
        assert!(text.contains("#####:"), "{text}");
    }
}

/// A loop written on one line counts once per entry and once per turn, as
/// gcov counts it: for, while, nested fors, a string walk.
#[test]
fn loops_on_one_line_count_their_turns_as_gcov_does() {
    require_probes();
    require("gcov", "as the line-count oracle");
    let dir = tempfile::tempdir().unwrap();
    let theirs = gcov_counts("loops.c", "-O0", &["30"]);
    let (ours, text, _) = proftap_counts(&Build::c("loops.c", "-O0"), &["30"], dir.path());
    let (agree, both, only_ours) = agreement(&theirs, &ours);
    assert!(only_ours.is_empty(), "{only_ours:?}\n{text}");
    assert_eq!(agree, both, "{text}");
    // The loops' lines count their turns: 30 entries and 30 x 32 turns.
    let reset = line_of("loops.c", "nums[i] = 0;");
    assert_eq!(ours[&reset], Some(30 * 33), "{text}");
}

#[test]
fn gcov_files_have_gcov_s_preamble_and_layout() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let (_, text, _) = proftap_counts(&Build::c("coverage.c", "-O0"), &["4"], dir.path());
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("        -:    0:Source:") && lines[0].ends_with("coverage.c"), "{}", lines[0]);
    assert!(lines.iter().take(4).any(|l| *l == "        -:    0:Runs:1"), "{text}");
    let source = std::fs::read_to_string(examples().join("coverage.c")).unwrap();
    // Every source line, in order, with its text.
    let body: Vec<&str> = lines.iter().skip_while(|l| l.contains(":    0:")).copied().collect();
    assert_eq!(body.len(), source.lines().count());
    for (i, (ours, src)) in body.iter().zip(source.lines()).enumerate() {
        let expected_suffix = format!("{:>5}:{src}", i + 1);
        assert!(ours.ends_with(&expected_suffix) && ours.len() == 9 + 1 + expected_suffix.len(), "{ours:?}");
    }
}

/// Line counts from a JSON report: (file, line) -> count.
fn report_lines(report: &Value) -> BTreeMap<(String, u64), u64> {
    report["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| ((l["file"].as_str().unwrap().to_string(), l["line"].as_u64().unwrap()), l["count"].as_u64().unwrap()))
        .collect()
}

/// The in-process engine's edge counters give the counts the line probes
/// give, line for line, on programs with loops, a jump table, computed
/// gotos, setjmp and longjmp, threads and a forked child, at -O0 and -O2; where they differ,
/// gcov agrees with the counters (a frame that setjmp returns to a second
/// time is on setjmp's line for gcov, on the line it left for the probes).
#[test]
fn counted_lines_equal_probed_lines() {
    require_probes();
    let cases: [(&str, &[&str]); 8] = [
        ("coverage.c", &["12"]),
        ("loops.c", &["30"]),
        ("interp.c", &["300"]),
        ("lineloop.c", &["300"]),
        ("branches.c", &["200"]),
        ("jumps.c", &["20", "4"]),
        ("threads.c", &["3", "200"]),
        ("forks.c", &["30", "20"]),
    ];
    for opt in ["-O0", "-O2"] {
        for (source, args) in cases {
            let binary = Build::c(source, opt).build();
            let mut command = vec![binary.to_str().unwrap()];
            command.extend_from_slice(args);
            // A function named: the lines the engine cannot count are
            // followed by uprobes, every one of their probes kept.
            let counted = profile_run(&["--lines", "-f", "main"], &command);
            let probed = profile_run(&["--lines", "--line-times"], &command);
            let what = format!("{source} {opt}");
            assert!(counted["recording"]["engine"] == "inject", "{what}: {}", counted["recording"]);
            assert!(probed["recording"]["engine"] == "uprobe", "{what}: {}", probed["recording"]);
            // Functions whose control flow cannot be read have their lines
            // followed by uprobes; nothing goes uncounted.
            let notes = counted["notes"].to_string();
            assert!(!notes.contains("are not counted"), "{what}: {notes}");
            // An interpreter's dispatch, copied into every handler at -O2,
            // is counted in process (through a hub), not followed by uprobes.
            assert!(source != "interp.c" || !notes.contains("followed by uprobes"), "{what}: {notes}");
            let (ours, theirs) = (report_lines(&counted), report_lines(&probed));
            assert!(ours.len() >= 10, "{what}: {ours:?}");
            assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "{what}");
            let differ: Vec<u32> = ours.iter().filter(|(k, n)| theirs[*k] != **n).map(|((_, line), _)| *line as u32).collect();
            if differ.is_empty() {
                continue;
            }
            require("gcov", "as the line-count oracle");
            let gcov = gcov_counts(source, opt, args);
            for line in &differ {
                let file = ours.keys().next().unwrap().0.clone();
                assert_eq!(
                    gcov.get(line).copied().flatten(),
                    Some(ours[&(file, u64::from(*line))]),
                    "{what} line {line}: {ours:?} {theirs:?}"
                );
            }
            assert_eq!((source, differ.len()), ("jumps.c", 1), "{what}");
        }
    }
}

/// A build with indirect branch tracking (`-fcf-protection`, the default
/// of Ubuntu's and Fedora's compilers) starts every function with
/// `endbr64`: the function's patch goes after it, and the line counters
/// leave it those bytes. Every line is counted in process, as uprobes on
/// every line count it.
#[test]
fn lines_of_a_build_with_endbr64_are_counted_beside_the_patched_entries() {
    require_probes();
    let build = Build { flags: vec!["-fcf-protection=full".into()], ..Build::c("coverage.c", "-O2") };
    let binary = build.build();
    let dump = run_ok(Command::new("objdump").args(["-d", "--no-show-raw-insn"]).arg(&binary));
    assert!(dump.contains("endbr64"), "the compiler put no endbr64");
    let counted = profile_run(&["--lines"], &[binary.to_str().unwrap(), "12"]);
    assert_eq!(counted["recording"]["engine"], "inject", "{}", counted["recording"]);
    let notes = counted["notes"].to_string();
    assert!(!notes.contains("not counted") && !notes.contains("differs"), "{notes}");
    let probed = profile_run(&["--lines", "--line-times"], &[binary.to_str().unwrap(), "12"]);
    assert_eq!(probed["recording"]["engine"], "uprobe", "{}", probed["recording"]);
    let ours = report_lines(&counted);
    assert!(ours.len() >= 10, "{ours:?}");
    assert_eq!(ours, report_lines(&probed));
}

/// A function whose edges cannot all be counted (-O2 `dispatch`: a jump
/// table's cases too short for a counter) has its lines followed by
/// uprobes only when every probe is kept: under the default overhead
/// budget a uprobe per line entry could make the run thousands of times
/// slower, so its lines are left out and named, the others counted.
/// Functions recorded only for their lines beside a named one are under
/// the overhead governor; the named one never is; line counts are exact
/// either way. lineloop 3000000: `step` called 1,000,000 times, its
/// `return` line entered as often.
#[test]
fn functions_recorded_for_their_lines_are_governed_and_named_ones_kept() {
    require_probes();
    let binary = Build::c("lineloop.c", "-O0").build();
    let command = [binary.to_str().unwrap(), "3000000"];
    let step_line = line_of("lineloop.c", "return x * 3 + 1;");
    let step_count = |report: &Value| report_lines(report).iter().find(|((_, l), _)| *l == u64::from(step_line)).map(|(_, &c)| c);
    let main_named = profile_run(&["--lines", "-f", "main"], &command);
    let step = function(&main_named["functions"], "step");
    assert_eq!(step["mode"], "throttled", "{step}");
    assert!(step["calls"].as_u64().unwrap() < 1_000_000, "{step}");
    let main = function(&main_named["functions"], "main");
    assert_eq!((main["mode"].as_str(), main["calls"].as_u64()), (Some("instrumented"), Some(1)));
    let notes = main_named["notes"].to_string();
    assert!(notes.contains("removed the probes of step") && notes.contains("not timed from then on"), "{notes}");
    assert_eq!(step_count(&main_named), Some(1_000_000));
    let step_named = profile_run(&["--lines", "-f", "step"], &command);
    let step = function(&step_named["functions"], "step");
    assert_eq!((step["mode"].as_str(), step["calls"].as_u64()), (Some("instrumented"), Some(1_000_000)));
    assert_eq!(step_count(&step_named), Some(1_000_000));
}

/// A launched program counts without `lock` while it has one thread; the
/// increments become atomic as its first thread starts. threads.c with
/// two threads together: `work` runs 3 x 2,000,000 times, on two CPUs at
/// once, and its line counts every one (a plain increment raced by two
/// threads loses some: 8.2 M of 9 M counted when `pthread_create` was not
/// hooked).
#[test]
fn counters_become_atomic_when_a_thread_starts() {
    require_probes();
    let binary = Build::c("threads.c", "-O0").flag("-pthread").build();
    let body = u64::from(line_of("threads.c", "sink += i;"));
    let report = profile_run(&["--lines", "-f", "work"], &[binary.to_str().unwrap(), "2", "2000000", "together"]);
    assert_eq!(report["recording"]["engine"], "inject", "{}", report["recording"]);
    let counted = report_lines(&report).iter().find(|((_, l), _)| *l == body).map(|(_, &c)| c);
    assert_eq!(counted, Some(6_000_000));
    assert_eq!(function(&report["functions"], "work")["calls"].as_u64(), Some(6_000_000));
}

#[test]
fn lines_the_engine_cannot_count_are_probed_only_when_every_probe_is_kept() {
    require_probes();
    let binary = Build::c("branches.c", "-O2").build();
    let command = [binary.to_str().unwrap(), "300"];
    let dispatch = line_of("branches.c", "return x * 3;");
    let has_line = |report: &Value, line: u32| report["lines"].as_array().unwrap().iter().any(|l| l["line"] == line);

    let budgeted = profile_run(&["--lines"], &command);
    let notes = budgeted["notes"].to_string();
    assert!(notes.contains("the lines of") && notes.contains("dispatch: ") && notes.contains("5% overhead budget"), "{notes}");
    assert!(!has_line(&budgeted, dispatch), "{}", budgeted["lines"]);
    assert!(has_line(&budgeted, line_of("branches.c", "total += dispatch(i % 9, i);")));

    let exact = profile_run(&["--lines", "--overhead-budget", "0"], &command);
    let notes = exact["notes"].to_string();
    assert!(notes.contains("followed by uprobes") && notes.contains("dispatch: "), "{notes}");
    assert!(has_line(&exact, dispatch), "{}", exact["lines"]);
}

/// The code -O2 moves into a function's `.cold` part is the function's:
/// its jumps there and back are edges of its graph, and its lines count
/// in its frames, as gcov counts them.
#[test]
fn lines_of_a_cold_part_count_as_the_functions() {
    require_probes();
    require("gcov", "as the line-count oracle");
    let dir = tempfile::tempdir().unwrap();
    let theirs = gcov_counts("branches.c", "-O2", &["300"]);
    let (ours, text, _) = proftap_counts(&Build::c("branches.c", "-O2"), &["300"], dir.path());
    let complain = line_of("branches.c", "complain(x);");
    // 96, 193 and 290 of 0..300 take the unlikely path.
    assert_eq!(theirs.get(&complain).copied().flatten(), Some(3));
    assert_eq!(ours.get(&complain).copied().flatten(), Some(3), "{text}");
}

/// Sampled stacks through counting stubs unwind as through the original
/// code: spin()'s caller burst() calls it last, so its call returns into
/// the stub that counts burst()'s return.
#[test]
fn stacks_sampled_while_lines_are_counted_unwind_through_the_stubs() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let binary = Build::c("lineloop.c", "-O0").build();
    let file = dir.path().join("p.profile");
    run_ok(proftap().arg("run").arg("--lines").args(["-F", "2000", "-o"]).arg(&file).arg("--").arg(&binary).arg("30000000"));
    let folded = dir.path().join("stacks.folded");
    run_ok(proftap().args(["export", "--format", "folded"]).arg(&file).arg("-o").arg(&folded));
    let (mut in_spin, mut through_burst, mut unknown, mut all) = (0u64, 0u64, 0u64, 0u64);
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        all += count;
        if stack.contains("[unknown") {
            unknown += count;
        }
        if stack.ends_with(";spin") {
            in_spin += count;
            if stack.ends_with("main;burst;spin") {
                through_burst += count;
            }
        }
    }
    assert!(in_spin >= 20, "{in_spin} samples in spin of {all}");
    // Without unwinding through the stubs, nearly every sample in spin
    // stops at burst's stub. A few samples of a loaded machine lose their
    // outermost frames anyway (the engine's return addresses read late).
    assert!(through_burst * 100 >= in_spin * 90, "{through_burst} of {in_spin} samples in spin under main;burst");
    assert!(unknown * 100 <= all * 5, "{unknown} of {all} samples unnamed");
}

#[test]
fn agreement_with_gcov_at_o2_is_measured() {
    require_probes();
    require("gcov", "as the line-count oracle");
    let dir = tempfile::tempdir().unwrap();
    let theirs = gcov_counts("coverage.c", "-O2", &["12"]);
    let (ours, text, _) = proftap_counts(&Build::c("coverage.c", "-O2"), &["12"], dir.path());
    let (agree, both, only_ours) = agreement(&theirs, &ours);
    eprintln!(
        "-O2: {agree} of {both} lines counted by both agree with gcov; {} lines counted only by proftap: {only_ours:?}",
        only_ours.len()
    );
    assert!(both >= 10, "{text}");
    // Optimised code interleaves and inlines lines; most counts still agree
    // (37 of 41 with GCC 12 when this was written).
    assert!(agree * 4 >= both * 3, "{agree} of {both}\n{text}");
}

#[test]
fn runs_merge_and_other_builds_are_refused() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let build = Build::c("coverage.c", "-O0");
    let binary = build.build();
    let record = |name: &str, args: &[&str]| {
        let file = dir.path().join(name);
        run_ok(proftap().arg("run").arg("--lines").arg("-o").arg(&file).arg("--").arg(&binary).args(args));
        file
    };
    let a = record("a.profile", &["12"]);
    let b = record("b.profile", &["5"]);
    let merged = dir.path().join("merged.profile");
    run_ok(proftap().arg("merge").arg(&a).arg(&b).arg("-o").arg(&merged));
    let counts = |file: &Path| -> BTreeMap<(String, u64), u64> {
        report_json(file)["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| ((l["file"].as_str().unwrap().to_string(), l["line"].as_u64().unwrap()), l["count"].as_u64().unwrap()))
            .collect()
    };
    let (ca, cb, cm) = (counts(&a), counts(&b), counts(&merged));
    assert_eq!(ca.len(), cm.len());
    for (key, m) in &cm {
        assert_eq!(*m, ca[key] + cb[key], "{key:?}");
    }
    // A directory that does not exist yet is made, as gcov's -o does.
    let out_dir = dir.path().join("gcov").join("merged");
    run_ok(proftap().arg("gcov").arg(&merged).arg("-o").arg(&out_dir));
    let text = std::fs::read_to_string(out_dir.join("coverage.c.gcov")).unwrap();
    assert!(text.contains("        -:    0:Runs:2"), "{text}");

    // A profile of another build of the program does not add up.
    let other = Build::c("coverage.c", "-O2").build();
    let c = dir.path().join("c.profile");
    run_ok(proftap().arg("run").arg("--lines").arg("-o").arg(&c).arg("--").arg(&other).arg("3"));
    let out = run(proftap().arg("merge").arg(&a).arg(&c).arg("-o").arg(dir.path().join("bad.profile")));
    assert_clean_failure(&out, "different builds");
    assert!(!dir.path().join("bad.profile").exists());
    run_ok(proftap().arg("merge").arg("--force").arg(&a).arg(&c).arg("-o").arg(dir.path().join("forced.profile")));
}

#[test]
fn lcov_and_gcov_json_are_read_by_genhtml_and_gcovr() {
    require_probes();
    require("genhtml", "to read lcov tracefiles");
    require("gcovr", "to read gcov JSON");
    let dir = tempfile::tempdir().unwrap();
    let (ours, _, profile) = proftap_counts(&Build::c("coverage.c", "-O0"), &["12"], dir.path());

    let info = dir.path().join("coverage.info");
    run_ok(proftap().arg("export").arg(&profile).args(["--format", "lcov", "-o"]).arg(&info));
    let lcov = std::fs::read_to_string(&info).unwrap();
    let da: BTreeMap<u32, u64> = lcov
        .lines()
        .filter_map(|l| l.strip_prefix("DA:"))
        .map(|d| {
            let (line, count) = d.split_once(',').unwrap();
            (line.parse().unwrap(), count.parse().unwrap())
        })
        .collect();
    for (line, count) in &ours {
        assert_eq!(da.get(line).copied(), *count, "DA of line {line}");
    }
    assert!(lcov.contains("FNDA:12,classify") && lcov.contains("FNDA:0,never") && lcov.trim_end().ends_with("end_of_record"), "{lcov}");
    let lf = lcov.lines().find_map(|l| l.strip_prefix("LF:")).unwrap().parse::<usize>().unwrap();
    assert_eq!(lf, da.len());
    run_ok(Command::new("genhtml").arg("-q").arg("-o").arg(dir.path().join("html")).arg(&info));
    assert!(dir.path().join("html/index.html").exists());

    let file = gcovr_file(&profile, dir.path(), "coverage.c");
    for line in file["lines"].as_array().unwrap() {
        let n = line["line_number"].as_u64().unwrap() as u32;
        assert_eq!(Some(line["count"].as_u64().unwrap()), ours[&n], "gcovr line {n}");
    }
}

/// What gcovr reads of `source` in the gcov JSON export of `profile`
/// (written under `dir`).
fn gcovr_file(profile: &Path, dir: &Path, source: &str) -> Value {
    let json_dir = dir.join("json");
    std::fs::create_dir(&json_dir).unwrap();
    run_ok(proftap().arg("export").arg(profile).args(["--format", "gcov-json", "-o"]).arg(json_dir.join(format!("{source}.gcov.json.gz"))));
    let mut gcovr = Command::new("gcovr");
    gcovr.arg("--gcov-use-existing-files").arg("-r").arg(examples()).arg(&json_dir).arg("--json").current_dir(&json_dir);
    let json: Value = serde_json::from_str(&run_ok(&mut gcovr)).unwrap();
    let files = json["files"].as_array().unwrap();
    let file = files.iter().find(|f| f["file"].as_str().is_some_and(|f| f.ends_with(source)));
    file.unwrap_or_else(|| panic!("gcovr read no {source}: {json}")).clone()
}

/// Per source line of `binary`, its conditional jumps that jumped, in
/// address order: (jumped, fell through), as callgrind saw every jump
/// (`--collect-jumps=yes`; a `jcnd=JUMPED/EXECUTED` line is followed by the
/// jump's position, `address line`).
fn callgrind_branches(binary: &Path, args: &[&str], dir: &Path) -> BTreeMap<u32, Vec<(u64, u64)>> {
    require("valgrind", "for callgrind, which sees every jump");
    let out = dir.join("callgrind.out");
    run_ok(
        Command::new("valgrind")
            .args(["--tool=callgrind", "--collect-jumps=yes", "--dump-instr=yes", "--dump-line=yes"])
            .args(["--compress-pos=no", "--compress-strings=no"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(binary)
            .args(args),
    );
    let mut ours = false;
    let mut pending: Option<(u64, u64)> = None;
    let mut by_address: BTreeMap<u64, (u32, u64, u64)> = BTreeMap::new();
    for line in std::fs::read_to_string(out).unwrap().lines() {
        if let Some(object) = line.strip_prefix("ob=") {
            ours = Path::new(object) == binary;
        } else if let Some(rest) = line.strip_prefix("jcnd=") {
            let (jumped, executed) = rest.split_whitespace().next().unwrap().split_once('/').unwrap();
            pending = Some((jumped.parse().unwrap(), executed.parse().unwrap()));
        } else if line.starts_with("0x") {
            let Some((jumped, executed)) = pending.take() else { continue };
            let mut fields = line.split_whitespace();
            let address = u64::from_str_radix(fields.next().unwrap().trim_start_matches("0x"), 16).unwrap();
            let number: u32 = fields.next().unwrap().parse().unwrap();
            if ours {
                let seen = by_address.entry(address).or_insert((number, 0, 0));
                seen.1 += jumped;
                seen.2 += executed;
            }
        } else if !line.starts_with("jump=") {
            pending = None;
        }
    }
    let mut by_line: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    // Line 0: code without a line (the C runtime's).
    for (number, jumped, executed) in by_address.into_values().filter(|(number, _, _)| *number != 0) {
        by_line.entry(number).or_default().push((jumped, executed - jumped));
    }
    by_line
}

/// Branch counts on the machine code equal callgrind's count of every
/// conditional jump, line by line; genhtml draws them from the lcov
/// export, gcovr reads them from the gcov JSON export.
#[test]
fn branch_counts_equal_callgrinds_jumps() {
    require_probes();
    require("genhtml", "to read lcov tracefiles");
    require("gcovr", "to read gcov JSON");
    for (source, opt, args) in [("branches.c", "-O0", &["300"][..]), ("branches.c", "-O2", &["300"]), ("coverage.c", "-O0", &["12"])] {
        let dir = tempfile::tempdir().unwrap();
        let build = Build::c(source, opt);
        let binary = build.build();
        let profile = dir.path().join("p.profile");
        run_ok(proftap().arg("run").arg("--lines").arg("-o").arg(&profile).arg("--").arg(&binary).args(args));
        let report = report_json(&profile);
        let all: BTreeMap<u32, Vec<(u64, u64)>> = report["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["file"].as_str().unwrap().ends_with(source))
            .map(|l| {
                let jumps =
                    l["branches"].as_array().unwrap().iter().map(|b| (b["taken"].as_u64().unwrap(), b["not_taken"].as_u64().unwrap()));
                (l["line"].as_u64().unwrap() as u32, jumps.collect::<Vec<_>>())
            })
            .collect();
        // callgrind records a jump that jumped; one that only fell through is not seen.
        let ours: BTreeMap<u32, Vec<(u64, u64)>> = all
            .iter()
            .map(|(&line, jumps)| (line, jumps.iter().copied().filter(|&(taken, _)| taken > 0).collect::<Vec<_>>()))
            .filter(|(_, jumped)| !jumped.is_empty())
            .collect();
        let theirs = callgrind_branches(&binary, args, dir.path());
        assert!(theirs.len() >= 5, "{source} {opt}: callgrind saw jumps on {} lines only", theirs.len());
        if opt == "-O0" {
            assert_eq!(ours, theirs, "{source} {opt}: (taken, not taken) per line, proftap against callgrind");
        } else {
            // Optimised: callgrind takes a jump into a `.cold` part for a
            // call, and functions whose lines probes follow have no branch
            // counts; every line both count agrees.
            let both: Vec<u32> = ours.keys().filter(|l| theirs.contains_key(l)).copied().collect();
            assert!(both.len() >= 2, "{source} {opt}: only lines {both:?} have jumps both count: {ours:?} against {theirs:?}");
            for line in both {
                assert_eq!(ours[&line], theirs[&line], "{source} {opt} line {line}: (taken, not taken), proftap against callgrind");
            }
        }

        let info = dir.path().join("p.info");
        run_ok(proftap().arg("export").arg(&profile).args(["--format", "lcov", "-o"]).arg(&info));
        let lcov = std::fs::read_to_string(&info).unwrap();
        let arcs: usize = all.values().map(|jumps| 2 * jumps.len()).sum();
        let found: usize = lcov.lines().filter_map(|l| l.strip_prefix("BRF:")).map(|n| n.parse::<usize>().unwrap()).sum();
        assert_eq!(found, arcs, "{source} {opt}: lcov's BRF against the profile's jumps, two arcs each");
        let html = dir.path().join("html");
        run_ok(Command::new("genhtml").args(["-q", "--branch-coverage", "-o"]).arg(&html).arg(&info));
        let page = std::fs::read_dir(&html).unwrap().flatten().map(|e| e.path()).find(|p| {
            p.is_dir() && std::fs::read_dir(p).unwrap().flatten().any(|f| f.file_name().to_string_lossy().ends_with(".gcov.html"))
        });
        let page = page.unwrap_or_else(|| panic!("genhtml wrote no source page in {}", html.display()));
        let listing =
            std::fs::read_dir(&page).unwrap().flatten().find(|f| f.file_name().to_string_lossy() == format!("{source}.gcov.html"));
        let listing = std::fs::read_to_string(listing.unwrap().path()).unwrap();
        assert!(listing.contains("Branch"), "genhtml's page of {source} shows no branch");

        let file = gcovr_file(&profile, dir.path(), source);
        for line in file["lines"].as_array().unwrap() {
            let n = line["line_number"].as_u64().unwrap() as u32;
            let counts: Vec<u64> = line["branches"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).collect();
            let expected: Vec<u64> = all.get(&n).map(|jumps| jumps.iter().flat_map(|&(t, n)| [n, t]).collect()).unwrap_or_default();
            assert_eq!(counts, expected, "{source} {opt}: gcovr's branches of line {n} (fall-through, then jump)");
        }
    }
}

/// `proftap gcov -b -c` lists the arcs of each line's conditional jumps;
/// at -O0 those are the source's conditions and loops, and their counts
/// equal real `gcov -b -c`'s on every line but a `switch` (gcc counts each
/// case, the machine jumps through a table).
#[test]
fn gcov_branch_listing_equals_gcovs_on_conditions_and_loops() {
    require_probes();
    require("gcov", "to compare branch counts");
    for (source, args) in [("coverage.c", &["12"][..]), ("branches.c", &["300"])] {
        let dir = tempfile::tempdir().unwrap();
        let (_, text, profile) = proftap_counts(&Build::c(source, "-O0"), args, dir.path());
        assert!(!text.contains("\nbranch"), "branches listed without -b");
        let listed = dir.path().join("b");
        run_ok(proftap().arg("gcov").args(["-b", "-c"]).arg(&profile).arg("-o").arg(&listed));
        let ours = parse_gcov_branches(&std::fs::read_to_string(listed.join(format!("{source}.gcov"))).unwrap());
        let theirs = parse_gcov_branches(&gcov_file(source, "-O0", args, &["-b", "-c"]));
        let text = std::fs::read_to_string(examples().join(source)).unwrap();
        let switch = |line: u32| text.lines().nth(line as usize - 1).is_some_and(|l| l.contains("switch"));
        let compared: Vec<u32> = theirs.keys().copied().filter(|&l| !switch(l)).collect();
        assert!(compared.len() >= 6, "{source}: gcov lists branches on {} lines only", compared.len());
        for line in compared {
            assert_eq!(ours.get(&line), theirs.get(&line), "{source} line {line}: branch counts, proftap gcov -b -c against gcov -b -c");
        }
        let extra: Vec<&u32> = ours.keys().filter(|l| !theirs.contains_key(l)).collect();
        assert!(extra.is_empty(), "{source}: proftap lists branches on lines {extra:?} where gcov lists none");
    }
}

/// Attached three times in a row to a program whose three threads are busy
/// in its own loop (each is in the counted code when counting starts and
/// ends): each time the loop's lines count one window of turns, consistent
/// with each other to the turn each thread had in progress, and the
/// program runs on and ends correctly.
#[test]
fn lines_of_busy_threads_count_from_attach_to_detach() {
    require_probes();
    const THREADS: u64 = 3;
    let binary = Build::c("spin.c", "-O0").flag("-pthread").build();
    let mut command = Command::new(&binary);
    command.arg(THREADS.to_string());
    let spinner = Waiter::start_command(command);
    let line = |text: &str| line_of("spin.c", text);
    let mut counted = 0;
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.profile");
        run_ok(proftap().args(["attach", "--lines", "--duration", "200ms", "-o"]).arg(&file).arg(spinner.pid.to_string()));
        let report = report_json(&file);
        let count = |n: u32| {
            let found = report["lines"].as_array().unwrap().iter().find(|l| l["line"] == n).and_then(|l| l["count"].as_u64());
            found.unwrap_or_else(|| panic!("no count of line {n}: {}", report["lines"]))
        };
        let test = count(line("while (!stop)"));
        let turn = count(line("t->turns++;"));
        let parity = count(line("if (t->turns & 1)"));
        let (odd, even) = (count(line("t->odd++;")), count(line("t->even++;")));
        let near = |a: u64, b: u64| a.abs_diff(b) <= THREADS;
        assert!(turn > 1000, "round {round}: {turn} turns counted");
        let consistent = near(test, turn) && near(parity, turn) && near(odd + even, parity) && near(odd, even);
        assert!(consistent, "round {round}: while {test}, turns++ {turn}, if {parity}, odd {odd}, even {even}");
        counted += turn;
    }
    run_ok(Command::new("kill").arg("-TERM").arg(spinner.pid.to_string()));
    let (out, status) = spinner.finish();
    assert!(status.success(), "the program's own check failed after detaching: {out}");
    let turns: u64 = out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unexpected: {out}"));
    assert!(counted < turns, "{counted} turns counted while attached, {turns} in all");
}

/// A statement that runs code inlined from a header counts as often
/// whether the header's lines are counted too or not: the frame leaves its
/// line for the header's either way, so that the turns of a loop inlined
/// into a call are never the call's line's.
#[test]
fn a_lines_count_does_not_depend_on_which_other_files_are_chosen() {
    require_probes();
    let binary = Build::c("inlined.c", "-O2").build();
    let counts = |lines: &str| -> BTreeMap<u64, u64> {
        let report = profile_run(&["--no-sample", lines], &[binary.to_str().unwrap(), "20000"]);
        assert_eq!(report["recording"]["engine"], "inject", "{}", report["notes"]);
        report_lines(&report).into_iter().filter(|((file, _), _)| file.ends_with("/inlined.c")).map(|((_, line), n)| (line, n)).collect()
    };
    let (every_file, this_file) = (counts("--lines"), counts("--lines=inlined.c"));
    let (turns, call) = (line_of("inlined.c", "for (unsigned i = 1;"), line_of("inlined.c", "total += count_equal("));
    assert_eq!(this_file, every_file);
    let (turns, call) = (every_file[&u64::from(turns)], every_file[&u64::from(call)]);
    assert!(call < 2 * turns, "{call} entries of the call's line in {turns} turns: the inlined loop's turns counted as its own");
}

/// The number (1-based) of the first line of `examples/FILE` containing `text`.
fn line_of(file: &str, text: &str) -> u32 {
    std::fs::read_to_string(examples().join(file))
        .unwrap()
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("{text} not in {file}")) as u32
        + 1
}

#[test]
fn regions_and_line_times() {
    require_probes();
    // A region around the body of main's second loop: entered once per iteration.
    let first = line_of("coverage.c", "total += classify(i);");
    let last = line_of("coverage.c", "early(i);");
    let binary = Build::c("coverage.c", "-O0").build();
    let region = format!("body=coverage.c:{first}-{last}");
    let report = profile_run(&["--region", &region], &[binary.to_str().unwrap(), "12"]);
    assert_eq!(report["recording"]["engine"], "inject", "regions are timed in process: {}", report["notes"]);
    let r = &report["regions"][0];
    assert_eq!(r["name"], "body");
    assert_eq!(r["entries"], 12);
    let wall = &r["inclusive"]["wall_ns"];
    assert!(wall["min"].as_u64() <= wall["avg"].as_u64() && wall["avg"].as_u64() <= wall["max"].as_u64(), "{wall}");
    // Calls made from inside count inside.
    let classify = function(&report["functions"], "classify");
    assert!(wall["total"].as_u64().unwrap() > classify["inclusive"]["wall_ns"]["total"].as_u64().unwrap());

    // Line times: burning shows as CPU and wall time, sleeping as wall time only.
    let binary = Build::c("cpuwall.c", "-O2").build();
    let report = profile_run(&["--lines=cpuwall.c", "--line-times"], &[binary.to_str().unwrap(), "20", "2"]);
    let line = |text: &str| {
        let n = line_of("cpuwall.c", text);
        report["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["line"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no line {n} ({text}) in {}", report["lines"]))
    };
    let ms = 1_000_000;
    let burn = line("burn(ms);");
    let nap = line("nap(ms);");
    assert_eq!(burn["count"], 2);
    assert!(burn["cpu_ns"].as_u64().unwrap() >= 38 * ms, "{burn}");
    assert!(nap["wall_ns"].as_u64().unwrap() >= 38 * ms, "{nap}");
    assert!(nap["cpu_ns"].as_u64().unwrap() < 5 * ms, "{nap}");
}

/// Regions timed by the in-process engine's hooks are entered as often as
/// the line probes see frames enter them: regions on loops, on one line, on
/// a call's return, on a whole function (left before its return), nested
/// and overlapping, recursion, threads, at -O0 and -O2.
#[test]
fn regions_in_process_are_entered_as_the_probes_see_them() {
    require_probes();
    // Source, optimisation, arguments, regions from the line holding the
    // first text to the next line holding the second.
    type Case<'a> = (&'a str, &'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 5] = [
        ("coverage.c", "-O0", &["30"], &[("total += classify(i);", "early(i);"), ("bump(i % 3);", "bump(i % 3);"), ("{", "}")]),
        ("loops.c", "-O0", &["40"], &[("for (i = 0; i < 32; i++)", "}"), ("reset();", "sink += nested(k % 20);"), ("{", "return 0;")]),
        ("loops.c", "-O2", &["40"], &[("while (*q) q++;", "return q - p;"), ("reset();", "sink += length(")]),
        ("deep.c", "-O0", &["40", "3"], &[("if (n == 0)", "}"), ("long below = down(n - 1);", "return below + 1;")]),
        // Code inlined from a header (not a region's file) inside a region.
        (
            "inlined.c",
            "-O2",
            &["2000"],
            &[("unsigned c = cached;", "h[(c >> 8) & 0xff]++;"), ("total += count_equal(", "total += count_equal(")],
        ),
    ];
    for (file, opt, args, spans) in cases {
        let binary = Build::c(file, opt).build();
        let mut flags = Vec::new();
        for (i, (first, last)) in spans.iter().enumerate() {
            let (first, last) = (line_of(file, first), line_of_from(file, last, line_of(file, first)));
            flags.extend(["--region".to_string(), format!("r{i}={file}:{first}-{last}")]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut command = vec![binary.to_str().unwrap()];
        command.extend(args);
        let hooked = profile_run(&flags, &command);
        assert_eq!(hooked["recording"]["engine"], "inject", "{file} {opt}: {}", hooked["notes"]);
        let probed = profile_run(&[&flags[..], &["--engine", "uprobe"]].concat(), &command);
        let entries = |report: &serde_json::Value| -> Vec<u64> {
            report["regions"].as_array().unwrap().iter().map(|r| r["entries"].as_u64().unwrap()).collect()
        };
        assert_eq!(entries(&hooked), entries(&probed), "{file} {opt}: entries by region, hooked and probed");
        assert!(entries(&hooked).iter().all(|&n| n > 0), "{file} {opt}: {:?}", entries(&hooked));
        for region in hooked["regions"].as_array().unwrap() {
            let wall = &region["inclusive"]["wall_ns"];
            assert!(wall["min"].as_u64() <= wall["max"].as_u64() && wall["total"].as_u64() > Some(0), "{file} {opt}: {region}");
        }
    }
}

/// The number (1-based) of the first line of `examples/FILE` at or after
/// line `from` containing `text`.
fn line_of_from(file: &str, text: &str, from: u32) -> u32 {
    let source = std::fs::read_to_string(examples().join(file)).unwrap();
    let at = source.lines().skip(from as usize - 1).position(|l| l.contains(text)).unwrap_or_else(|| panic!("{text} not in {file}"));
    from + at as u32
}

#[test]
fn lines_of_a_running_process() {
    require_probes();
    use std::io::{BufRead, BufReader};
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O0").build());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut profiler = proftap()
        .arg("attach")
        .arg("--lines")
        .arg("-o")
        .arg(&file)
        .arg(waiter.pid.to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(profiler.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("attached"), "{line}");
    assert_eq!(waiter.tick(7), 7);
    run_ok(Command::new("kill").arg("-INT").arg(profiler.id().to_string()));
    assert!(profiler.wait().unwrap().success());
    let report = report_json(&file);
    let count = |text: &str| {
        let n = line_of("wait.c", text);
        report["lines"].as_array().unwrap().iter().find(|l| l["line"] == n).map(|l| l["count"].as_u64().unwrap())
    };
    // tick's body ran 7 times; main's loop over them was entered mid-way.
    assert_eq!(count("sink += i;"), Some(7));
    assert_eq!(count("tick(i);"), Some(7));
}

/// Where scripts/setup.sh puts real programs' published sources.
fn realprogs() -> PathBuf {
    std::env::var_os("PROFTAP_REALPROGS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/proftap-realprogs"))
}

/// Lua 5.4.4 built from its published sources at -O0 in `dir`, with
/// `--coverage` or not; returns its `src` directory. Its string hash seed
/// (from the time and addresses) and its string cache (by address) are
/// fixed, so that both builds run the same way.
fn build_lua(dir: &Path, coverage: bool) -> PathBuf {
    let sources = realprogs().join("lua-5.4.4-src");
    assert!(sources.join("src/lvm.c").is_file(), "Lua's sources are missing from {}: scripts/setup.sh fetches them", sources.display());
    run_ok(Command::new("cp").arg("-r").arg(&sources).arg(dir));
    let mut flags = "-O0 -g -std=gnu99 -DLUA_COMPAT_5_3 -DLUA_USE_LINUX '-Dluai_makeseed(L)=0' -DSTRCACHE_N=1 -DSTRCACHE_M=2".to_string();
    if coverage {
        flags.push_str(" --coverage");
    }
    let src = dir.join("src");
    run_ok(
        Command::new("make")
            .args(["-s", "-j2", "-C"])
            .arg(&src)
            .args(["linux", &format!("CFLAGS={flags}")])
            .arg(format!("MYLDFLAGS={}", if coverage { "--coverage" } else { "" })),
    );
    src
}

/// Line -> count of every `.gcov` file in `dir`, by file name.
fn gcov_files(dir: &Path) -> BTreeMap<String, BTreeMap<u32, Option<u64>>> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".gcov")?.to_string();
            Some((name, parse_gcov(&std::fs::read_to_string(e.path()).ok()?)))
        })
        .collect()
}

/// A real program: Lua's interpreter built at -O0 from its published
/// sources, running a script of calls, tables, strings, closures and
/// garbage. proftap's counts of the plain build against gcov's of a
/// `--coverage` build, on every source file both count.
#[test]
fn lua_line_counts_equal_gcovs() {
    require_probes();
    require("gcov", "as the line-count oracle");
    require("make", "to build Lua");
    let dir = tempfile::tempdir().unwrap();
    let (plain, covered) = (dir.path().join("plain"), dir.path().join("cover"));
    let (plain_src, covered_src) = (build_lua(&plain, false), build_lua(&covered, true));
    // Both run under names of one length: Lua keeps its own name in memory.
    for (name, src) in [("a", &plain_src), ("b", &covered_src)] {
        std::fs::create_dir(dir.path().join(name)).unwrap();
        std::os::unix::fs::symlink(src.join("lua"), dir.path().join(name).join("lua")).unwrap();
    }
    let script = repo().join("benches/realprogs/bench.lua");
    run_ok(Command::new(dir.path().join("b/lua")).arg(&script).arg("1"));
    let sources: Vec<String> = std::fs::read_dir(&covered_src)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".gcda"))
        .map(|n| n.replace(".gcda", ".c"))
        .collect();
    run_ok(Command::new("gcov").args(["-o", "."]).args(&sources).current_dir(&covered_src));
    let profile = dir.path().join("lua.profile");
    run_ok(proftap().args(["run", "--lines", "-o"]).arg(&profile).arg("--").arg(dir.path().join("a/lua")).arg(&script).arg("1"));
    let out = dir.path().join("out");
    run_ok(proftap().arg("gcov").arg(&profile).arg("-o").arg(&out));

    let (theirs, ours) = (gcov_files(&covered_src), gcov_files(&out));
    let (mut agree, mut both, mut differ, mut unlabelled_gcov_only) = (0, 0, Vec::new(), Vec::new());
    for (file, gcov) in &theirs {
        let text = std::fs::read_to_string(plain_src.join(file)).unwrap();
        let Some(mine) = ours.get(file) else { panic!("proftap wrote no {file}.gcov") };
        let (a, b, only_ours) = agreement(gcov, mine);
        assert!(only_ours.is_empty(), "{file}: lines {only_ours:?} counted by proftap, `-` in gcov");
        (agree, both) = (agree + a, both + b);
        for (line, count) in gcov {
            match (count, mine.get(line).copied().flatten()) {
                (Some(g), Some(m)) if *g != m => differ.push(format!("{file}:{line} gcov {g}, proftap {m}")),
                (Some(_), None) => {
                    // gcov counts `case` and `goto` labels, which have no
                    // line-table row of their own.
                    let source = text.lines().nth(*line as usize - 1).unwrap_or("").trim();
                    let labelled = ["case ", "vmcase(", "default:"].iter().any(|l| source.starts_with(l)) || source.ends_with(':');
                    if !labelled {
                        unlabelled_gcov_only.push(format!("{file}:{line}"));
                    }
                }
                _ => {}
            }
        }
    }
    eprintln!("Lua -O0: {agree} of {both} lines counted by both agree; differ: {differ:?}; counted by gcov only: {unlabelled_gcov_only:?}");
    assert!(both >= 8_000, "only {both} lines counted by both");
    // What differs: lines a `--coverage` build attributes its own way (a
    // condition spread over lines, a computed goto's label), and the few
    // that the two builds run differently (garbage collection steps).
    assert!(agree * 1000 >= both * 995, "{agree} of {both} agree: {differ:?}");
    assert!(unlabelled_gcov_only.len() * 100 <= both, "{unlabelled_gcov_only:?}");
}

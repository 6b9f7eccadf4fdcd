//! Line coverage outputs: gcov's text files, lcov tracefiles and gcov's JSON
//! format, all from a profile's line counts.

use super::text::group_digits;
use proftap_profile::{LineRecord, Profile};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Line counts of one source file, and the functions declared in it.
pub struct FileCoverage<'a> {
    /// The source file.
    pub path: &'a str,
    /// Its lines with code, by line number.
    pub lines: BTreeMap<u32, &'a LineRecord>,
    /// (declaration line, name, calls) of its functions: a throttled
    /// function's calls after its throttle included, where they were counted.
    pub functions: Vec<(u32, &'a str, u64)>,
}

/// The profile's line counts by source file.
pub fn by_file(profile: &Profile) -> Vec<FileCoverage<'_>> {
    let merged = profile.merged_functions();
    let calls: BTreeMap<u32, u64> = merged.iter().map(|f| (f.function, f.calls)).collect();
    let mut files: BTreeMap<&str, FileCoverage<'_>> = BTreeMap::new();
    for record in &profile.lines {
        files
            .entry(&record.file)
            .or_insert_with(|| FileCoverage { path: &record.file, lines: BTreeMap::new(), functions: Vec::new() })
            .lines
            .insert(record.line, record);
    }
    for (id, f) in profile.functions.iter().enumerate() {
        if let Some(file) = f.file.as_deref()
            && let Some(cov) = files.get_mut(file)
            && cov.lines.contains_key(&f.line)
        {
            let calls = calls.get(&(id as u32)).copied().unwrap_or(0);
            // Counted to the end, or until counting stopped (then a lower
            // bound, as gcov's counts of a function are of its entries seen).
            let counted = f.calls_after_throttle.or(f.calls_counted_until_stopped).unwrap_or(0);
            cov.functions.push((f.line, &f.name, calls.saturating_add(counted)));
        }
    }
    for cov in files.values_mut() {
        cov.functions.sort();
    }
    files.into_values().collect()
}

/// The longest name a `.gcov` file may take before its suffix: file names
/// have at most 255 bytes.
const MAX_GCOV_NAME: usize = 250;

/// The `.gcov` file name of each source file, without the suffix, or none
/// when its path cannot name one. Like gcov: the file name alone, or the
/// whole path mangled as `gcov -p` does when two sources share a name
/// (`/` becomes `#`, `..` becomes `^`, `.` and the root are left out). A
/// name is one plain file name, never empty, `.`, `..`, nor holding `/` or
/// NUL, at most 250 bytes, and given to one source only: a path that would
/// take another's name, or none, has no `.gcov` file.
pub fn gcov_file_names(files: &[FileCoverage<'_>]) -> Vec<Option<String>> {
    let base = |path: &str| match std::path::Path::new(path).components().next_back() {
        Some(std::path::Component::Normal(name)) => name.to_str().map(str::to_string),
        _ => None,
    };
    let mut sharing: BTreeMap<String, usize> = BTreeMap::new();
    for f in files {
        *sharing.entry(base(f.path).unwrap_or_default()).or_default() += 1;
    }
    let mut taken = std::collections::HashSet::new();
    files
        .iter()
        .map(|f| {
            let name = base(f.path).filter(|b| sharing[b] == 1).unwrap_or_else(|| mangled(f.path));
            let usable = !name.is_empty() && name.len() <= MAX_GCOV_NAME && !name.contains(['/', '\0']) && name != "." && name != "..";
            (usable && taken.insert(name.clone())).then_some(name)
        })
        .collect()
}

/// A whole path as `gcov -p` mangles it into one file name.
fn mangled(path: &str) -> String {
    let parts: Vec<String> = std::path::Path::new(path)
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            std::path::Component::ParentDir => Some("^".to_string()),
            _ => None,
        })
        .collect();
    parts.join("#")
}

/// Whether a `.gcov` file lists each line's branches, as `gcov -b` (with
/// `-c`: counts instead of percentages) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchOutput {
    /// Lines only.
    Hidden,
    /// `branch N taken P%`.
    Percent,
    /// `branch N taken COUNT`.
    Counts,
}

/// A line's count as proftap's listings show it: gcov's (`#####`: never
/// run), with a `+` when it is a lower bound (see [`LOWER_BOUND_LEGEND`]).
pub fn count_text(record: &LineRecord) -> String {
    match (record.count, record.throttled) {
        (0, false) => "#####".to_string(),
        (n, false) => group_digits(n),
        (n, true) => format!("{}+", group_digits(n)),
    }
}

/// The width of a column of counts as [`count_text`] writes them: gcov's
/// nine characters, or the widest count's.
pub fn count_width<'a>(records: impl IntoIterator<Item = &'a LineRecord>) -> usize {
    records.into_iter().map(|r| count_text(r).len()).fold(COUNT_WIDTH, usize::max)
}

/// gcov's width of its count column.
pub const COUNT_WIDTH: usize = 9;

/// The warning an export of counts in a format with no room for a lower
/// bound gives, when some are: which lines, and how to keep them whole.
pub fn lower_bounds_warning(profile: &Profile) -> Option<String> {
    let lines: Vec<&LineRecord> = profile.lines.iter().filter(|l| l.throttled).collect();
    let first = lines.first()?;
    Some(format!(
        "proftap: warning: the {} of {} {} ({}:{}{}) {} lower {}: the overhead governor took out the probes of {} during the run; --overhead-budget 0 keeps every probe",
        if lines.len() == 1 { "count" } else { "counts" },
        lines.len(),
        if lines.len() == 1 { "line" } else { "lines" },
        first.file,
        first.line,
        if lines.len() > 1 { ", ..." } else { "" },
        if lines.len() == 1 { "is a" } else { "are" },
        if lines.len() == 1 { "bound" } else { "bounds" },
        if lines.len() == 1 { "its function" } else { "their functions" },
    ))
}

/// What a `+` after a line's count says.
pub const LOWER_BOUND_LEGEND: &str = "a count with + is a lower bound: the probes of its function were taken out during the run";

/// The arcs of a line's conditional jumps as gcov lists them: per jump, its
/// fall-through arc, then its jump, with the jump's executions.
fn branch_arcs(record: &LineRecord) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
    record.branches.iter().flat_map(|b| [(b.not_taken, b.executed(), true), (b.taken, b.executed(), false)])
}

/// `top` of `bottom` as gcov prints a percentage: no decimals, and a
/// nonzero share below half a percent shown as 1%.
fn gcov_percent(top: u64, bottom: u64) -> String {
    let ratio = if bottom == 0 { 0.0 } else { 100.0 * top as f32 / bottom as f32 };
    let ratio = if ratio > 0.0 && ratio < 0.5 { 1.0 } else { ratio };
    format!("{ratio:.0}%")
}

/// A `.gcov` file in gcov's text format: `count:line:source`, `-` for lines
/// without code, `#####` for lines with code that never ran; with
/// `branches`, each line's branch arcs after it as `gcov -b` shows them.
pub fn gcov_text(profile: &Profile, file: &FileCoverage<'_>, source: Option<&str>, data_name: &str, branches: BranchOutput) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:>9}:{:>5}:Source:{}", "-", 0, file.path);
    let _ = writeln!(out, "{:>9}:{:>5}:Graph:{}", "-", 0, profile.target.exe);
    let _ = writeln!(out, "{:>9}:{:>5}:Data:{}", "-", 0, data_name);
    let _ = writeln!(out, "{:>9}:{:>5}:Runs:{}", "-", 0, profile.runs);
    let source_lines: Vec<&str> = source.map(|s| s.lines().collect()).unwrap_or_default();
    for number in shown_lines(file, source_lines.len()) {
        let count = match file.lines.get(&number) {
            None => "-".to_string(),
            Some(r) if r.count == 0 => "#####".to_string(),
            Some(r) => r.count.to_string(),
        };
        let text = source_lines.get(number as usize - 1).copied().unwrap_or(if source.is_none() { "/*EOF*/" } else { "" });
        let _ = writeln!(out, "{count:>9}:{number:>5}:{text}");
        if let (Some(record), false) = (file.lines.get(&number), branches == BranchOutput::Hidden) {
            for (i, (arc, executed, fallthrough)) in branch_arcs(record).enumerate() {
                let suffix = if fallthrough { " (fallthrough)" } else { "" };
                let _ = match (executed, branches) {
                    (0, _) => writeln!(out, "branch {i:>2} never executed{suffix}"),
                    (_, BranchOutput::Counts) => writeln!(out, "branch {i:>2} taken {arc}{suffix}"),
                    _ => writeln!(out, "branch {i:>2} taken {}{suffix}", gcov_percent(arc, executed)),
                };
            }
        }
    }
    out
}

/// The line numbers a listing of `file` shows: every line of its source
/// (`source_lines` long), then the counted lines past its end. Lines past
/// the source without counts are left out, so that a count on line ten
/// million does not list ten million lines.
pub fn shown_lines<'a>(file: &'a FileCoverage<'_>, source_lines: usize) -> impl Iterator<Item = u32> + 'a {
    let in_source = u32::try_from(source_lines).unwrap_or(u32::MAX);
    (1..=in_source).chain(file.lines.range(in_source.saturating_add(1)..).map(|(&n, _)| n))
}

/// An lcov tracefile (`TN`, `SF`, `FN`/`FNDA`, `FNF`/`FNH`, `BRDA`,
/// `BRF`/`BRH`, `DA`, `LF`/`LH`). A line's conditional jumps are its
/// blocks, numbered from 0; branch 0 of each is its fall-through, 1 its
/// jump; `-` for a jump that never ran.
pub fn lcov(profile: &Profile) -> String {
    let mut out = String::new();
    for file in by_file(profile) {
        let _ = writeln!(out, "TN:");
        let _ = writeln!(out, "SF:{}", file.path);
        for (line, name, _) in &file.functions {
            let _ = writeln!(out, "FN:{line},{name}");
        }
        for (_, name, calls) in &file.functions {
            let _ = writeln!(out, "FNDA:{calls},{name}");
        }
        let _ = writeln!(out, "FNF:{}", file.functions.len());
        let _ = writeln!(out, "FNH:{}", file.functions.iter().filter(|f| f.2 > 0).count());
        let (mut found, mut hit) = (0usize, 0usize);
        for (line, record) in &file.lines {
            for (i, (arc, executed, fallthrough)) in branch_arcs(record).enumerate() {
                let taken = if executed == 0 { "-".to_string() } else { arc.to_string() };
                let _ = writeln!(out, "BRDA:{line},{},{},{taken}", i / 2, u8::from(!fallthrough));
                found += 1;
                hit += usize::from(arc > 0);
            }
        }
        if found > 0 {
            let _ = writeln!(out, "BRF:{found}");
            let _ = writeln!(out, "BRH:{hit}");
        }
        for (line, record) in &file.lines {
            let _ = writeln!(out, "DA:{line},{}", record.count);
        }
        let _ = writeln!(out, "LF:{}", file.lines.len());
        let _ = writeln!(out, "LH:{}", file.lines.values().filter(|r| r.count > 0).count());
        let _ = writeln!(out, "end_of_record");
    }
    out
}

/// The document `gcov --json-format` writes (format version 2), before gzip.
pub fn gcov_json(profile: &Profile, data_name: &str) -> serde_json::Value {
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
    let files: Vec<serde_json::Value> = by_file(profile)
        .iter()
        .map(|file| {
            // Each line's function: the nearest function declared at or above
            // it (the functions are sorted by line).
            let function_of = |line: u32| {
                let above = file.functions.partition_point(|f| f.0 <= line);
                above.checked_sub(1).map_or("", |i| file.functions[i].1)
            };
            let functions: Vec<serde_json::Value> = file
                .functions
                .iter()
                .enumerate()
                .map(|(i, (start, name, calls))| {
                    // Up to the next function's line; two functions declared
                    // on one line share it.
                    let end = file
                        .functions
                        .get(i + 1)
                        .map_or_else(|| file.lines.keys().next_back().copied().unwrap_or(*start), |next| next.0.saturating_sub(1))
                        .max(*start);
                    let body: Vec<&&LineRecord> = file.lines.range(*start..=end).map(|(_, r)| r).collect();
                    json!({
                        "name": name,
                        "demangled_name": name,
                        "start_line": start,
                        "start_column": 1,
                        "end_line": end,
                        "end_column": 1,
                        "blocks": body.len(),
                        "blocks_executed": body.iter().filter(|r| r.count > 0).count(),
                        "execution_count": calls,
                    })
                })
                .collect();
            let lines: Vec<serde_json::Value> = file
                .lines
                .iter()
                .map(|(line, record)| {
                    json!({
                        "line_number": line,
                        "count": record.count,
                        "unexecuted_block": record.count == 0,
                        "function_name": function_of(*line),
                        "block_ids": [],
                        "branches": json_branches(record),
                        "calls": [],
                    })
                })
                .collect();
            json!({ "file": file.path, "functions": functions, "lines": lines })
        })
        .collect();
    json!({
        "format_version": "2",
        "gcc_version": "proftap",
        "current_working_directory": cwd,
        "data_file": data_name,
        "files": files,
    })
}

/// A line's branch arcs in gcov's JSON: each conditional jump is a block
/// (numbered on the line), its fall-through and jump two destinations.
fn json_branches(record: &LineRecord) -> Vec<serde_json::Value> {
    branch_arcs(record)
        .enumerate()
        .map(|(i, (arc, _, fallthrough))| {
            json!({
                "count": arc,
                "throw": false,
                "fallthrough": fallthrough,
                "source_block_id": i / 2,
                "destination_block_id": i,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::FunctionInfo;

    fn profile(lines: &[u32], functions: &[(&str, u32)]) -> Profile {
        Profile {
            lines: lines
                .iter()
                .map(|&line| LineRecord { file: "a.c".into(), line, count: 1, cost: Vec::new(), branches: Vec::new(), throttled: false })
                .collect(),
            functions: functions
                .iter()
                .map(|&(name, line)| FunctionInfo { name: name.into(), file: Some("a.c".into()), line, ..FunctionInfo::default() })
                .collect(),
            ..Profile::default()
        }
    }

    #[test]
    fn a_column_of_counts_is_as_wide_as_its_widest_count() {
        let mut p = profile(&[1, 2], &[]);
        assert_eq!(count_width(&p.lines), COUNT_WIDTH);
        p.lines[1].count = 123_456_789;
        p.lines[1].throttled = true;
        assert_eq!(count_text(&p.lines[1]), "123,456,789+");
        assert_eq!(count_width(&p.lines), "123,456,789+".len());
    }

    #[test]
    fn gcov_lists_the_source_then_counted_lines_past_it() {
        let p = profile(&[2, 10_000_000], &[]);
        let files = by_file(&p);
        let text = gcov_text(&p, &files[0], Some("one\ntwo\nthree\n"), "d", BranchOutput::Hidden);
        let numbered: Vec<&str> = text.lines().skip(4).map(|l| l.split(':').nth(1).unwrap_or("").trim()).collect();
        assert_eq!(numbered, vec!["1", "2", "3", "10000000"]);
        let text = gcov_text(&p, &files[0], None, "d", BranchOutput::Hidden);
        assert_eq!(text.lines().count(), 4 + 2, "{text}");
        assert!(text.ends_with("        1:10000000:/*EOF*/\n"), "{text}");
    }

    #[test]
    fn gcov_names_stay_one_file_name() {
        let paths =
            ["src/a.c", "lib/b.c", "other/b.c", "/", "/etc/..", "/etc/shadow", "", "x/\0.c", "a#b.c", "a/b.c", "long/../x.c", "../../up.c"];
        let long = format!("/{}.c", "n".repeat(300));
        let files: Vec<FileCoverage<'_>> = paths
            .iter()
            .copied()
            .chain([long.as_str()])
            .map(|path| FileCoverage { path, lines: BTreeMap::new(), functions: Vec::new() })
            .collect();
        let names = gcov_file_names(&files);
        let expect = [
            Some("a.c"),
            Some("lib#b.c"),
            Some("other#b.c"),
            None,
            Some("etc#^"),
            Some("shadow"),
            None,
            None,
            Some("a#b.c"),
            // Mangles to the name a#b.c already took.
            None,
            Some("x.c"),
            Some("up.c"),
            None,
        ];
        assert_eq!(names, expect.map(|n| n.map(str::to_string)).to_vec());
    }

    /// A throttled function's count, in every coverage format, is its
    /// calls before the throttle and those counted after, as gcov counts.
    #[test]
    fn a_throttled_functions_count_includes_its_calls_counted_after() {
        use proftap_profile::{CallTree, FunctionStats, Mode, ThreadProfile};
        let mut p = profile(&[3], &[("f", 3)]);
        p.functions[0].mode = Mode::Throttled;
        p.functions[0].calls_after_throttle = Some(970_054);
        let mut stats = FunctionStats::new(0, 0);
        stats.calls = 29_946;
        p.threads = vec![ThreadProfile { pid: 1, tid: 1, name: String::new(), functions: vec![stats], tree: CallTree::new(0) }];
        assert_eq!(by_file(&p)[0].functions, vec![(3, "f", 1_000_000)]);
        assert!(lcov(&p).contains("FNDA:1000000,f"), "{}", lcov(&p));
    }

    #[test]
    fn functions_declared_on_one_line_share_it() {
        let p = profile(&[3, 4, 9], &[("f", 3), ("g", 3), ("h", 9)]);
        let json = gcov_json(&p, "d");
        let functions = json["files"][0]["functions"].as_array().expect("functions");
        let span = |i: usize| (functions[i]["start_line"].clone(), functions[i]["end_line"].clone());
        assert_eq!(span(0), (3.into(), 3.into()));
        assert_eq!(span(1), (3.into(), 8.into()));
        assert_eq!(span(2), (9.into(), 9.into()));
        let lines = json["files"][0]["lines"].as_array().expect("lines");
        assert_eq!(lines[1]["function_name"], "g");
    }
}

//! Line coverage outputs: gcov's text files, lcov tracefiles and gcov's JSON
//! format, all from a profile's line counts.

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
    /// (declaration line, name, calls) of its functions.
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
            cov.functions.push((f.line, &f.name, calls.get(&(id as u32)).copied().unwrap_or(0)));
        }
    }
    for cov in files.values_mut() {
        cov.functions.sort();
    }
    files.into_values().collect()
}

/// A `.gcov` file in gcov's text format: `count:line:source`, `-` for lines
/// without code, `#####` for lines with code that never ran.
pub fn gcov_text(profile: &Profile, file: &FileCoverage<'_>, source: Option<&str>, data_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:>9}:{:>5}:Source:{}", "-", 0, file.path);
    let _ = writeln!(out, "{:>9}:{:>5}:Graph:{}", "-", 0, profile.target.exe);
    let _ = writeln!(out, "{:>9}:{:>5}:Data:{}", "-", 0, data_name);
    let _ = writeln!(out, "{:>9}:{:>5}:Runs:{}", "-", 0, profile.runs);
    let source_lines: Vec<&str> = source.map(|s| s.lines().collect()).unwrap_or_default();
    let last = file.lines.keys().next_back().copied().unwrap_or(0).max(source_lines.len() as u32);
    for number in 1..=last {
        let count = match file.lines.get(&number) {
            None => "-".to_string(),
            Some(r) if r.count == 0 => "#####".to_string(),
            Some(r) => r.count.to_string(),
        };
        let text = source_lines.get(number as usize - 1).copied().unwrap_or(if source.is_none() { "/*EOF*/" } else { "" });
        let _ = writeln!(out, "{count:>9}:{number:>5}:{text}");
    }
    out
}

/// An lcov tracefile (`TN`, `SF`, `FN`/`FNDA`, `FNF`/`FNH`, `DA`, `LF`/`LH`).
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
            // Each line's function: the nearest function declared at or above it.
            let function_of = |line: u32| file.functions.iter().rev().find(|f| f.0 <= line).map(|f| f.1).unwrap_or("");
            let functions: Vec<serde_json::Value> = file
                .functions
                .iter()
                .enumerate()
                .map(|(i, (start, name, calls))| {
                    let end = file
                        .functions
                        .get(i + 1)
                        .map_or_else(|| file.lines.keys().next_back().copied().unwrap_or(*start), |next| next.0 - 1);
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
                        "branches": [],
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

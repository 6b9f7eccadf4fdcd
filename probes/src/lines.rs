//! Line probes: which line-table rows to probe for gcov-style line counts,
//! and which lines count as having code.
//!
//! A line's count is the number of times execution enters it from a
//! different line of the same frame, plus the turns of loops that stay on
//! it (gcov's meaning). proftap probes the statement rows of each
//! function's line table, follows each frame's current line (a row reached
//! again, or one before it, without leaving the line is a turn), and counts
//! a function's entry on its declaration line. Two lines
//! gcov leaves without a count are left out the same way: the opening brace
//! (the prologue row at the function's entry), and the closing brace when
//! the function has a `return` statement (GCC then gives the closing brace
//! no block of its own; without one, the implicit return sits there).

use crate::addr::FileOffset;
use crate::arcs::lines::{ELSEWHERE, FunctionLines, NO_LINE};
use crate::entry::{EntryKind, classify_entry, uprobe_refuses};
use crate::plan::ProbedFunction;
use crate::symbols::{Function, SymbolIndex, file_offset};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;

/// Which source files to count lines of: path suffixes or globs, or (empty)
/// every source file of the executable outside the system and the runtimes.
#[derive(Clone, Debug, Default)]
pub struct LineFiles(pub Vec<String>);

impl LineFiles {
    /// Whether `path` is chosen.
    pub fn contains(&self, path: &str) -> bool {
        if self.0.is_empty() {
            return !is_system_source(path);
        }
        self.0.iter().any(|want| path == want || path.ends_with(&format!("/{}", want.trim_start_matches("./"))))
    }
}

/// Headers and sources of the system, the compiler and the Rust runtime.
pub fn is_system_source(path: &str) -> bool {
    const SYSTEM: &[&str] = &["/usr/include/", "/usr/lib/", "/usr/local/include/", "/rustc/", "/rust/deps/", "/build/glibc", "<built-in>"];
    SYSTEM.iter().any(|p| path.starts_with(p)) || path.contains("/.cargo/registry/")
}

/// A line probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineProbe {
    /// The file to probe.
    pub open_path: PathBuf,
    /// Where.
    pub offset: FileOffset,
    /// Where its uprobe goes: at `offset`, or, when the kernel refuses a
    /// uprobe on the instruction there, on the first later one of the same
    /// row that every run through it reaches; none when there is no such
    /// instruction (its lines are then not counted by uprobes).
    pub uprobe_at: Option<FileOffset>,
    /// How the kernel runs the instruction its uprobe is on: what a hit costs.
    pub kind: EntryKind,
    /// Its link-time address.
    pub address: u64,
    /// The function it is in (index into the probed functions).
    pub function: u32,
    /// The lines it enters, in order (indexes into [`LinePlan::lines`]):
    /// optimised code often starts several statements at one address.
    pub lines: Vec<u32>,
}

/// What to probe for line counts.
#[derive(Clone, Debug, Default)]
pub struct LinePlan {
    /// Every line with code in the chosen files: (file, line), by file then line.
    pub lines: Vec<(String, u32)>,
    /// Probes on the statement rows.
    pub probes: Vec<LineProbe>,
    /// Per probed function: the line its entry is on (the prologue, not
    /// counted; a frame starts there), as an index into `lines` or none.
    pub entry_lines: Vec<Option<u32>>,
    /// Per probed function: lines its entry address also starts, entered
    /// (and counted) on each call after the prologue line.
    pub entry_also: Vec<Vec<u32>>,
    /// Per probed function: its declaration line, counted once per call.
    pub decl_lines: Vec<Option<u32>>,
    /// Per probed function: the line each row of the line table starts
    /// (statement or not, in address order; `NO_LINE` for line 0 or a
    /// file not chosen), where its conditional jumps are placed.
    pub located: Vec<Vec<(u64, u32)>>,
    /// The statement rows that start a line of a file not chosen (code
    /// inlined from a header), as counting from edges follows them:
    /// (function, address, the lines it enters in order, [`ELSEWHERE`] for
    /// those of files not chosen). A frame there has left the chosen lines,
    /// so that a line's count is the same whichever other files are
    /// chosen. Probes do not follow a frame there.
    pub elsewhere: Vec<(u32, u64, Vec<u32>)>,
}

impl FunctionLines {
    /// The ids of the chosen lines it enters.
    pub fn ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .rows
            .iter()
            .flat_map(|(_, l)| l.iter().copied())
            .chain(self.entry_also.iter().copied())
            .chain(self.decl_line)
            .filter(|&l| l != ELSEWHERE)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

impl LinePlan {
    /// What the frames of each probed function do with lines, by function
    /// index: rows at link-time addresses.
    pub fn by_function(&self) -> Vec<FunctionLines> {
        let mut all: Vec<FunctionLines> = (0..self.entry_lines.len())
            .map(|i| FunctionLines {
                entry_line: self.entry_lines[i].unwrap_or(NO_LINE),
                entry_also: self.entry_also.get(i).cloned().unwrap_or_default(),
                decl_line: self.decl_lines.get(i).copied().flatten(),
                rows: Vec::new(),
                located: self.located.get(i).cloned().unwrap_or_default(),
            })
            .collect();
        for probe in &self.probes {
            if let Some(f) = all.get_mut(probe.function as usize) {
                f.rows.push((probe.address, probe.lines.clone()));
            }
        }
        all.iter_mut().for_each(|f| f.rows.sort_by_key(|&(address, _)| address));
        for (function, address, lines) in &self.elsewhere {
            if let Some(f) = all.get_mut(*function as usize) {
                match f.rows.binary_search_by_key(address, |&(at, _)| at) {
                    Ok(at) => f.rows[at].1.clone_from(lines),
                    Err(at) => f.rows.insert(at, (*address, lines.clone())),
                }
            }
        }
        all
    }

    /// Per probed function: whether it has a line of its own or a row.
    pub fn with_lines(&self) -> Vec<bool> {
        let mut with: Vec<bool> = (0..self.entry_lines.len())
            .map(|i| self.decl_lines.get(i).is_some_and(Option::is_some) || self.entry_also.get(i).is_some_and(|a| !a.is_empty()))
            .collect();
        for probe in &self.probes {
            if let Some(w) = with.get_mut(probe.function as usize) {
                *w = true;
            }
        }
        with
    }

    /// The same lines, probed in the functions `keep` picks only (by index).
    pub fn for_functions(&self, keep: impl Fn(u32) -> bool) -> LinePlan {
        let kept = |i: usize| keep(i as u32);
        LinePlan {
            lines: self.lines.clone(),
            probes: self.probes.iter().filter(|p| keep(p.function)).cloned().collect(),
            entry_lines: self.entry_lines.iter().enumerate().map(|(i, l)| l.filter(|_| kept(i))).collect(),
            entry_also: self.entry_also.iter().enumerate().map(|(i, a)| if kept(i) { a.clone() } else { Vec::new() }).collect(),
            decl_lines: self.decl_lines.iter().enumerate().map(|(i, l)| l.filter(|_| kept(i))).collect(),
            located: self.located.iter().enumerate().map(|(i, l)| if kept(i) { l.clone() } else { Vec::new() }).collect(),
            elsewhere: self.elsewhere.iter().filter(|(f, _, _)| keep(*f)).cloned().collect(),
        }
    }

    /// The lines (ids) a uprobe cannot follow: a probe of theirs has
    /// nowhere the kernel accepts a uprobe.
    pub fn unprobed_lines(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.probes.iter().filter(|p| p.uprobe_at.is_none()).flat_map(|p| p.lines.iter().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The id of a (file, line), if it has code.
    pub fn line_id(&self, file: &str, line: u32) -> Option<u32> {
        self.lines.binary_search_by(|(f, l)| (f.as_str(), *l).cmp(&(file, line))).ok().map(|i| i as u32)
    }
}

/// The functions of `index` with rows in the chosen files (they need entry
/// and return probes for their frames' lines to be followed).
pub fn functions_with_lines(index: &SymbolIndex, files: &LineFiles) -> Vec<usize> {
    let mut chosen = std::collections::BTreeSet::new();
    for row in &index.line_rows {
        if row.end_sequence || row.line == 0 || !files.contains(index.files.path(row.file)) {
            continue;
        }
        let i = index.functions.partition_point(|f| f.address <= row.address);
        if let Some(f) = i.checked_sub(1).map(|i| (i, &index.functions[i]))
            && row.address.0 < f.1.address.0 + f.1.size.max(1)
            && !f.1.is_cold_part()
        {
            chosen.insert(f.0);
        }
    }
    chosen.into_iter().collect()
}

/// Plans the line probes of `functions` (already planned for entry and
/// return) in `index` (loaded with lines, the file `image` holds), for the
/// chosen files.
pub fn plan_lines(
    index: &SymbolIndex,
    image: &[u8],
    open_path: &std::path::Path,
    functions: &[ProbedFunction],
    files: &LineFiles,
) -> LinePlan {
    let by_address = statement_starts(index);
    let located_at = crate::symbols::LinesByAddress::of(&index.line_rows);
    let collected = collect_lines(index, functions, files, &by_address, &located_at);
    line_plan(index, image, open_path, functions, files, &located_at, collected)
}

/// The statements each address starts, in order: optimised code often
/// starts several at one address (views); -O0 code one.
fn statement_starts(index: &SymbolIndex) -> BTreeMap<u64, Vec<(u32, u32)>> {
    let mut by_address: BTreeMap<u64, Vec<(u32, u32)>> = BTreeMap::new();
    for row in index.line_rows.iter().filter(|r| !r.end_sequence && r.is_stmt && r.line != 0) {
        let starts = by_address.entry(row.address.0).or_default();
        if starts.last() != Some(&(row.file, row.line)) {
            starts.push((row.file, row.line));
        }
    }
    by_address
}

/// A line probe's place: (function, address, the (file, line) statements it starts).
type Planned = (u32, u64, Vec<(u32, u32)>);
/// (function, address, the (file, line) statements it starts, None for one
/// of a file not chosen).
type Followed = (u32, u64, Vec<Option<(u32, u32)>>);

/// What [`collect_lines`] finds, in file and line numbers.
struct Collected {
    probes: Vec<Planned>,
    /// Where statements of files not chosen run between chosen ones.
    elsewhere: Vec<Followed>,
    /// Each function's statements at its entry, the prologue's first.
    entry_rows: Vec<Vec<(u32, u32)>>,
    /// Each function's declaration.
    decls: Vec<Option<(u32, u32)>>,
    /// Each function's rows by address.
    located: Vec<Vec<(u64, (u32, u32))>>,
}

/// Function by function, the statements of the chosen `files` where a
/// line probe goes, and where each function's rows are.
fn collect_lines(
    index: &SymbolIndex,
    functions: &[ProbedFunction],
    files: &LineFiles,
    by_address: &BTreeMap<u64, Vec<(u32, u32)>>,
    located_at: &crate::symbols::LinesByAddress,
) -> Collected {
    // Each file read once, and shared by its functions rather than copied for each.
    let mut sources: HashMap<u32, Option<Rc<[String]>>> = HashMap::new();
    let mut source = |file: u32| -> Option<Rc<[String]>> {
        sources
            .entry(file)
            .or_insert_with(|| std::fs::read_to_string(index.files.path(file)).ok().map(|t| t.lines().map(str::to_string).collect()))
            .clone()
    };

    let mut probes = Vec::new();
    let mut elsewhere = Vec::new();
    let mut entry_rows: Vec<Vec<(u32, u32)>> = vec![Vec::new(); functions.len()];
    let mut decls: Vec<Option<(u32, u32)>> = vec![None; functions.len()];
    let mut located: Vec<Vec<(u64, (u32, u32))>> = vec![Vec::new(); functions.len()];
    let by_entry: HashMap<u64, &Function> = index.functions.iter().rev().map(|f| (f.address.0, f)).collect();
    for (fi, probed) in functions.iter().enumerate() {
        let Some(&f) = by_entry.get(&probed.info.address) else { continue };
        let (Some(decl_file), true) = (f.decl_file, f.decl_line != 0) else { continue };
        if !files.contains(index.files.path(decl_file)) {
            continue;
        }
        decls[fi] = Some((decl_file, f.decl_line));
        let range = f.address.0..f.address.0 + f.size.max(1);
        located[fi] = located_at.range(range.clone()).map(|(&a, &row)| (a, row)).collect();
        let body: Vec<(u64, &Vec<(u32, u32)>)> = by_address.range(range).map(|(&a, starts)| (a, starts)).collect();
        let closing = closing_line(f, &body, decl_file, &mut source);
        let keep = |&(file, line): &(u32, u32)| files.contains(index.files.path(file)) && (file, line) != (decl_file, closing.unwrap_or(0));
        let not_chosen = |&(file, line): &(u32, u32)| line != 0 && !files.contains(index.files.path(file));
        let mut place = |address: u64, starts: &[(u32, u32)]| {
            let lines: Vec<(u32, u32)> = starts.iter().filter(|s| keep(s)).copied().collect();
            if !lines.is_empty() {
                probes.push((fi as u32, address, lines));
            }
            if starts.iter().any(not_chosen) {
                let mut followed: Vec<Option<(u32, u32)>> = Vec::new();
                for start in starts.iter().filter(|s| keep(s) || not_chosen(s)) {
                    let line = (!not_chosen(start)).then_some(*start);
                    if followed.last() != Some(&line) {
                        followed.push(line);
                    }
                }
                elsewhere.push((fi as u32, address, followed));
            }
        };
        for &(address, starts) in &body {
            if address == f.address.0 {
                // The first statement at the entry is the prologue's line (the
                // opening brace, or the declaration of a one-line function).
                entry_rows[fi] = starts.clone();
                continue;
            }
            place(address, starts);
        }
        // Rows of its cold parts are its own: they run in its frames.
        for &(lo, hi) in &probed.cold {
            located[fi].extend(located_at.range(lo..hi).map(|(&a, &row)| (a, row)));
            for (&address, starts) in by_address.range(lo..hi) {
                place(address, starts);
            }
        }
        located[fi].sort_unstable_by_key(|&(address, _)| address);
        if let Some((first, rest)) = entry_rows[fi].split_first() {
            let rest: Vec<(u32, u32)> = rest.iter().filter(|s| keep(s)).copied().collect();
            entry_rows[fi] = std::iter::once(*first).chain(rest).collect();
        }
    }
    Collected { probes, elsewhere, entry_rows, decls, located }
}

/// The line plan of what [`collect_lines`] found: line ids for its
/// files and lines, and where the uprobe of each line probe goes.
fn line_plan(
    index: &SymbolIndex,
    image: &[u8],
    open_path: &std::path::Path,
    functions: &[ProbedFunction],
    files: &LineFiles,
    located_at: &crate::symbols::LinesByAddress,
    collected: Collected,
) -> LinePlan {
    let Collected { probes, elsewhere, entry_rows, decls, located } = collected;
    let mut lines: Vec<(String, u32)> = probes
        .iter()
        .flat_map(|p| p.2.iter())
        .chain(entry_rows.iter().flat_map(|e| e.iter().skip(1)))
        .chain(decls.iter().flatten())
        .map(|&(file, line)| (index.files.path(file).to_string(), line))
        .collect();
    lines.sort();
    lines.dedup();
    let mut plan = LinePlan { lines, ..LinePlan::default() };
    // A function's code, its cold parts included: where its jumps are.
    let body_of = |f: &ProbedFunction| -> Vec<(u64, FileOffset, u64)> {
        let cold = f.cold.iter().filter_map(|&(lo, hi)| Some((lo, file_offset(&index.segments, crate::addr::VirtAddr(lo))?, hi - lo)));
        std::iter::once((f.info.address, f.offset, f.size)).chain(cold).collect()
    };
    let ids = |plan: &LinePlan, starts: &[(u32, u32)]| -> Vec<u32> {
        starts.iter().filter_map(|&(file, line)| plan.line_id(index.files.path(file), line)).collect()
    };
    plan.elsewhere = elsewhere
        .iter()
        .map(|(function, address, followed)| {
            let id = |line: &Option<(u32, u32)>| match line {
                None => Some(ELSEWHERE),
                Some((file, line)) => plan.line_id(index.files.path(*file), *line),
            };
            (*function, *address, followed.iter().filter_map(id).collect())
        })
        .collect();
    plan.probes = probes
        .iter()
        .filter_map(|(function, address, starts)| {
            let offset = file_offset(&index.segments, crate::addr::VirtAddr(*address))?;
            let row_end = located_at.range(address.saturating_add(1)..).next().map_or(*address, |(&end, _)| end);
            let uprobe_at = uprobe_place(image, *address..row_end, offset, &body_of(&functions[*function as usize]));
            let code = uprobe_at.and_then(|at| image.get(usize::try_from(at.0).ok()?..)).unwrap_or_default();
            Some(LineProbe {
                open_path: open_path.to_path_buf(),
                offset,
                uprobe_at,
                kind: classify_entry(code),
                address: *address,
                function: *function,
                lines: ids(&plan, starts),
            })
        })
        .collect();
    plan.decl_lines = decls.iter().map(|d| d.and_then(|(file, line)| plan.line_id(index.files.path(file), line))).collect();
    // The prologue line is where a frame starts; it has an id only if it also has code.
    plan.entry_lines = entry_rows.iter().map(|e| e.first().and_then(|&(file, line)| plan.line_id(index.files.path(file), line))).collect();
    plan.entry_also = entry_rows.iter().map(|e| ids(&plan, e.get(1..).unwrap_or(&[]))).collect();
    plan.located = located
        .iter()
        .map(|rows| {
            let id = |&(file, line): &(u32, u32)| {
                (line != 0 && files.contains(index.files.path(file)))
                    .then(|| plan.line_id(index.files.path(file), line))
                    .flatten()
                    .unwrap_or(NO_LINE)
            };
            rows.iter().map(|(address, row)| (*address, id(row))).collect()
        })
        .collect();
    plan
}

/// Where a uprobe for the row at addresses `row` (its start at `offset` in
/// `image`) can go: at its start, or, when the kernel refuses a uprobe on
/// the instruction there, on the row's first instruction it accepts, if
/// every instruction before it in the row goes on to the next and no jump
/// of the function's `body` (address, file offset, size of each range)
/// lands past the row's start up to it: then exactly the runs through the
/// row reach it. A lock-prefixed first instruction (an atomic statement)
/// is common; the kernel skips such a probe without a word at a launch and
/// refuses it in a running program. (Without the row's code at hand, the
/// probe stays at its start.)
fn uprobe_place(image: &[u8], row: std::ops::Range<u64>, offset: FileOffset, body: &[(u64, FileOffset, u64)]) -> Option<FileOffset> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let code_at = |offset: FileOffset, len: u64| -> Option<&[u8]> {
        let start = usize::try_from(offset.0).ok()?;
        image.get(start..start.checked_add(usize::try_from(len).ok()?)?)
    };
    let Some(code) = code_at(offset, row.end.saturating_sub(row.start)).filter(|c| !c.is_empty()) else { return Some(offset) };
    if !uprobe_refuses(code) {
        return Some(offset);
    }
    let mut placed = None;
    for instruction in Decoder::with_ip(64, code, row.start, DecoderOptions::NONE) {
        if instruction.is_invalid() || instruction.next_ip() > row.end {
            return None;
        }
        let at = instruction.ip().wrapping_sub(row.start) as usize;
        if !uprobe_refuses(code.get(at..)?) {
            placed = Some(instruction.ip());
            break;
        }
        if instruction.flow_control() != FlowControl::Next {
            return None;
        }
    }
    let placed = placed?;
    let lands_inside = |target: u64| row.start < target && target <= placed;
    let jumped_into = body.iter().any(|&(address, offset, size)| {
        code_at(offset, size).is_some_and(|code| {
            Decoder::with_ip(64, code, address, DecoderOptions::NONE).into_iter().any(|i| {
                matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch)
                    && lands_inside(i.near_branch_target())
            })
        })
    });
    (!jumped_into).then(|| FileOffset(offset.0 + (placed - row.start)))
}

/// The line of a function's closing brace when gcov gives it no count: the
/// line of its last row, if the function has a `return` statement.
fn closing_line(
    f: &Function,
    body: &[(u64, &Vec<(u32, u32)>)],
    decl_file: u32,
    source: &mut impl FnMut(u32) -> Option<Rc<[String]>>,
) -> Option<u32> {
    let &(file, last) = body.last()?.1.last()?;
    if file != decl_file || last <= f.decl_line {
        return None;
    }
    let text = source(file);
    let has_return = match &text {
        Some(lines) => {
            lines.get(f.decl_line as usize - 1..last as usize).is_some_and(|body| body.iter().any(|l| contains_word(l, "return")))
        }
        // Without the source, assume the usual: a function that returns a value.
        None => true,
    };
    has_return.then_some(last)
}

fn contains_word(text: &str, word: &str) -> bool {
    let code = text.split("//").next().unwrap_or("");
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_line_probe_the_kernel_refuses_moves_to_the_rows_next_instruction_or_nowhere() {
        // lock addq $1,0x10(%rip); mov $5,%eax; ud2; nop
        let code = [0xf0, 0x48, 0x83, 0x05, 0x10, 0, 0, 0, 0x01, 0xb8, 5, 0, 0, 0, 0x0f, 0x0b, 0x90];
        let mut image = vec![0xcc; 0x100];
        image.extend_from_slice(&code);
        // jmp 0x1009 (to the mov), at 0x2000
        image.extend_from_slice(&[0xe9, 0x04, 0xf0, 0xff, 0xff]);
        let jump = [(0x2000, FileOffset(0x111), 5)];
        let row = |start: u64, end: u64| 0x1000 + start..0x1000 + end;
        let at =
            |start: u64, end: u64, body: &[(u64, FileOffset, u64)]| uprobe_place(&image, row(start, end), FileOffset(0x100 + start), body);
        assert_eq!(at(0, 14, &[]), Some(FileOffset(0x109)), "after the lock, the mov");
        assert_eq!(at(9, 14, &[]), Some(FileOffset(0x109)), "the mov itself");
        assert_eq!(at(0, 9, &[]), None, "a row of the lock alone");
        assert_eq!(at(0, 12, &[]), None, "the mov would end past the row");
        assert_eq!(at(14, 17, &[]), None, "nothing goes on from ud2");
        assert_eq!(uprobe_place(&image, 0x1ff9..0x2002, FileOffset(0x10a), &[]), Some(FileOffset(0x10a)), "a row the kernel accepts");
        assert_eq!(at(0, 14, &jump), None, "a jump lands on the mov: it would count runs that skip the lock");
        assert_eq!(uprobe_place(&[], 0x1000..0x1009, FileOffset(0x100), &[]), Some(FileOffset(0x100)), "no code at hand: where it was");
    }

    #[test]
    fn files_are_chosen_by_suffix_or_by_default_outside_the_system() {
        let all = LineFiles::default();
        assert!(all.contains("/src/app/main.c"));
        assert!(!all.contains("/usr/include/stdio.h"));
        assert!(!all.contains("/rustc/abc/library/core/src/fmt/mod.rs"));
        let some = LineFiles(vec!["io.c".into(), "src/main.c".into()]);
        assert!(some.contains("/x/io.c"));
        assert!(some.contains("/x/src/main.c"));
        assert!(!some.contains("/x/radio.c"));
    }

    #[test]
    fn return_is_found_as_a_word() {
        assert!(contains_word("    return x;", "return"));
        assert!(contains_word("if (x) return;", "return"));
        assert!(!contains_word("int returned = 0;", "return"));
        assert!(!contains_word("x++; // return later", "return"));
    }
}

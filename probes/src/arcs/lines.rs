//! Line counts from a function's block and edge counts, with the meaning
//! gcov gives them and [`crate::lines`] follows with probes: a line counts
//! each time its frame enters it from a different line, and each turn of a
//! loop that stays on it ([`super::turns`]).
//!
//! Inside a block the line a frame is on changes only at the rows of the
//! line table, in order, so every row but the block's first enters its
//! lines as often as the block runs. The first row's first line depends on
//! where the frame came from: on each incoming edge, the line the
//! predecessor left it on. A predecessor without rows passes on the line
//! it was entered with; when such a chain makes one edge arrive sometimes on
//! the line and sometimes not, edge counts cannot tell how often, and the
//! function's lines are refused (they need a probe).

use super::Error;
use super::cfg::{Cfg, Node};
use super::solve::{BranchCount, Counts};
use super::turns::{BlockLine, loop_turns};
use std::collections::{BTreeMap, BTreeSet};

/// A frame on no line yet.
pub const NO_LINE: u32 = u32::MAX;

/// A frame on a line of a file not chosen (code inlined from a header):
/// a line like any other, whose counts are not kept, so that a frame
/// coming back from it to a chosen line enters that line again, whichever
/// files were chosen.
pub const ELSEWHERE: u32 = u32::MAX - 1;

/// What a function's frames do with lines, by line id.
#[derive(Clone, Debug, Default)]
pub struct FunctionLines {
    /// The line a frame starts on at the entry (not counted), or [`NO_LINE`].
    pub entry_line: u32,
    /// Lines the entry also enters, in order (counted at each call).
    pub entry_also: Vec<u32>,
    /// The declaration line, counted once per call.
    pub decl_line: Option<u32>,
    /// The statement rows after the entry: an address and the lines it
    /// enters, in order.
    pub rows: Vec<(u64, Vec<u32>)>,
    /// Every row of the line table, in address order: where the code of a
    /// line (or of none, [`NO_LINE`]) starts. Places the conditional jumps.
    pub located: Vec<(u64, u32)>,
}

impl FunctionLines {
    /// The same lines with the frame staying on its line through code of
    /// files not chosen ([`ELSEWHERE`] taken out).
    pub fn without_elsewhere(&self) -> FunctionLines {
        let mut kept = self.clone();
        kept.rows.iter_mut().for_each(|(_, lines)| lines.retain(|&l| l != ELSEWHERE));
        kept.rows.retain(|(_, lines)| !lines.is_empty());
        kept
    }

    /// The same lines with every address `bias` further on: at runtime
    /// addresses, for a graph read from a module loaded `bias` past its
    /// link-time addresses.
    pub fn moved_by(&self, bias: u64) -> FunctionLines {
        let mut moved = self.clone();
        moved.rows.iter_mut().for_each(|row| row.0 = row.0.wrapping_add(bias));
        moved.located.iter_mut().for_each(|row| row.0 = row.0.wrapping_add(bias));
        moved
    }
}

/// Each conditional jump of `counts` with the line its instruction is on
/// (in `lines.located`), in address order; jumps on no chosen line are left
/// out.
pub fn line_branches(cfg: &Cfg, counts: &Counts, lines: &FunctionLines) -> Vec<(u32, BranchCount)> {
    counts
        .branches(cfg)
        .into_iter()
        .filter_map(|branch| {
            let after = lines.located.partition_point(|(address, _)| *address <= branch.jcc);
            let line = lines.located.get(after.checked_sub(1)?)?.1;
            (line != NO_LINE).then_some((line, branch))
        })
        .collect()
}

/// The lines of a function as its counts tell them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineEntries {
    /// `(line id, times entered)`, a line once, in line order; lines that
    /// never ran are left out.
    pub entered: Vec<(u32, u64)>,
    /// Lines whose entries depend on the path taken to them, which edge
    /// counts do not tell (see [`line_entries`]): `(line id, the row's
    /// address)`, left out of `entered`.
    pub undetermined: Vec<(u32, u64)>,
}

/// The times each line of `lines` was entered, given the function's
/// `counts` over `cfg`. Rows on code the graph does not reach never ran.
/// A line entered along an edge from a block without rows that some paths
/// leave on that line and others on another is undetermined: how often
/// the frame arrived on it, no edge count says. Fails when a row is inside
/// an instruction.
pub fn line_entries(cfg: &Cfg, counts: &Counts, lines: &FunctionLines) -> Result<LineEntries, Error> {
    let mut entered: BTreeMap<u32, u64> = BTreeMap::new();
    let mut undetermined: Vec<(u32, u64)> = Vec::new();
    let mut add = |line: u32, n: u64| {
        if n > 0 {
            let total = entered.entry(line).or_default();
            *total = total.saturating_add(n);
        }
    };
    let calls = counts.calls();
    if let Some(decl) = lines.decl_line {
        add(decl, calls);
    }
    let mut at_entry = lines.entry_line;
    for &also in &lines.entry_also {
        if also != at_entry {
            add(also, calls);
            at_entry = also;
        }
    }

    let rows = rows_by_block(cfg, &lines.rows)?;
    let arriving = arriving_lines(cfg, &rows, at_entry);
    for (block, block_rows) in rows.iter().enumerate() {
        let Some((first, _)) = block_rows.first() else { continue };
        let runs = counts.block(block);
        // The first line: counted on each edge that arrives from another line.
        let first_line = first[0];
        for (id, edge) in cfg.edges().iter().enumerate().filter(|(_, e)| e.to == Node::Block(block)) {
            let n = u64::try_from(counts.edge(id)).unwrap_or(0);
            let from = match edge.from {
                Node::Block(b) => &arriving.leaving[b],
                _ => &arriving.entry,
            };
            match (from.contains(&first_line), from.len()) {
                (false, _) => add(first_line, n),
                (true, 1) => {}
                (true, _) if n == 0 => {}
                (true, _) => undetermined.push((first_line, block_rows[0].1)),
            }
        }
        let mut on = first_line;
        for line in block_rows.iter().flat_map(|(ls, _)| ls.iter()).skip(1) {
            if *line != on {
                add(*line, runs);
                on = *line;
            }
        }
    }
    match loop_turns(cfg, counts, &lines_of_blocks(&rows), &arriving.single()) {
        Ok(turns) => turns.into_iter().for_each(|(line, n)| add(line, n)),
        Err(too_many) => undetermined.extend(too_many),
    }
    for placed in &counts.frames {
        let sign: i128 = if placed.frame.at_start { 1 } else { -1 };
        let (changes, unknown) = entered_after(cfg, &rows, &arriving, placed.block, placed.frame.pc);
        undetermined.extend(unknown);
        for (line, address) in changes {
            let total = entered.entry(line).or_default();
            *total = u64::try_from(i128::from(*total) + sign).map_err(|_| Error::LineBelowZero { address })?;
        }
    }
    undetermined.sort_unstable();
    undetermined.dedup_by_key(|(line, _)| *line);
    undetermined.retain(|(line, _)| *line != ELSEWHERE);
    entered.retain(|line, n| *line != ELSEWHERE && *n > 0 && undetermined.binary_search_by_key(line, |(l, _)| *l).is_err());
    Ok(LineEntries { entered: entered.into_iter().collect(), undetermined })
}

/// Where a frame's line cannot be told from the counts: from the start of
/// a block that several lines lead into, up to and including its first
/// row, when that row enters one of them. A thread there when counting
/// starts or ends is moved on (see [`super::flight`]) until it is past.
pub fn unsettled(cfg: &Cfg, lines: &FunctionLines) -> Result<Vec<std::ops::Range<u64>>, Error> {
    let rows = rows_by_block(cfg, &lines.rows)?;
    let arriving = arriving_lines(cfg, &rows, entry_line(lines));
    let mut ranges = Vec::new();
    for (block, block_rows) in rows.iter().enumerate() {
        let Some((first, address)) = block_rows.first() else { continue };
        let arrived = arrived_lines(cfg, &arriving, block);
        if arrived.len() > 1 && arrived.contains(&first[0]) {
            ranges.push(cfg.blocks()[block].start..address + 1);
        }
    }
    Ok(ranges)
}

/// The line a frame is on once its function's entry has entered every
/// line it enters.
pub(super) fn entry_line(lines: &FunctionLines) -> u32 {
    lines.entry_also.last().copied().unwrap_or(lines.entry_line)
}

/// The lines a frame may be on as it enters `block`.
pub(super) fn arrived_lines(cfg: &Cfg, arriving: &Arriving, block: usize) -> BTreeSet<u32> {
    let mut arrived = BTreeSet::new();
    for edge in cfg.edges().iter().filter(|e| e.to == Node::Block(block)) {
        arrived.extend(match edge.from {
            Node::Block(b) => &arriving.leaving[b],
            _ => &arriving.entry,
        });
    }
    arrived
}

/// The lines a frame at `pc` in `block` enters as it runs the rest of the
/// block (with the row that enters each): every line of the rows at `pc`
/// and after that differs from the one before. The first is undetermined
/// (returned apart) when the frame may have arrived on it or on another.
fn entered_after(cfg: &Cfg, rows: &BlockRows<'_>, arriving: &Arriving, block: usize, pc: u64) -> (Vec<LineAt>, Option<LineAt>) {
    let block_rows = &rows[block];
    let ahead = block_rows.partition_point(|(_, address)| *address < pc);
    let Some((first_ahead, address)) = block_rows.get(ahead) else { return (Vec::new(), None) };
    let mut unknown = None;
    let on = match ahead.checked_sub(1) {
        Some(before) => block_rows[before].0.last().copied(),
        None => {
            // On the line the frame arrived with: unknown when it may have arrived on several.
            let arrived = arrived_lines(cfg, arriving, block);
            match (arrived.len(), arrived.contains(&first_ahead[0])) {
                (1, _) => arrived.first().copied(),
                (_, false) => None,
                (_, true) => {
                    unknown = Some((first_ahead[0], *address));
                    None
                }
            }
        }
    };
    let mut on = on.unwrap_or(NO_LINE);
    let mut changes = Vec::new();
    for (lines, address) in &block_rows[ahead..] {
        for &line in lines.iter() {
            if line != on {
                changes.push((line, *address));
                on = line;
            }
        }
    }
    (changes, unknown)
}

/// A line id and the address of the row that enters it.
type LineAt = (u32, u64);

/// Per block, its rows in address order: the lines each enters, and its address.
pub(super) type BlockRows<'a> = Vec<Vec<(&'a [u32], u64)>>;

pub(super) fn rows_by_block<'a>(cfg: &Cfg, rows: &'a [(u64, Vec<u32>)]) -> Result<BlockRows<'a>, Error> {
    let mut by_block: BlockRows<'a> = vec![Vec::new(); cfg.blocks().len()];
    for (address, lines) in rows.iter().filter(|(_, l)| !l.is_empty()) {
        let after = cfg.blocks().partition_point(|b| b.start <= *address);
        let Some(block) = after.checked_sub(1).filter(|&b| *address < cfg.blocks()[b].end()) else {
            // Code the graph does not reach.
            continue;
        };
        if cfg.block_holding(*address) != Some(block) {
            return Err(Error::RowInsideInstruction { address: *address });
        }
        by_block[block].push((lines.as_slice(), *address));
    }
    for block in &mut by_block {
        block.sort_by_key(|(_, address)| *address);
    }
    Ok(by_block)
}

/// The lines a frame may be on as it leaves each block, and as it leaves
/// the entry.
pub(super) struct Arriving {
    pub(super) leaving: Vec<BTreeSet<u32>>,
    entry: BTreeSet<u32>,
}

impl Arriving {
    /// Per block, the one line a frame may leave it on, if one.
    fn single(&self) -> Vec<Option<u32>> {
        self.leaving
            .iter()
            .map(|lines| if lines.len() == 1 { lines.first().copied().filter(|&l| l != NO_LINE && l != ELSEWHERE) } else { None })
            .collect()
    }
}

/// What each block does with lines, for loops on one line.
fn lines_of_blocks(rows: &BlockRows<'_>) -> Vec<BlockLine> {
    rows.iter()
        .map(|block_rows| {
            let mut lines = block_rows.iter().flat_map(|(lines, _)| lines.iter());
            match lines.next() {
                None => BlockLine::Passes,
                // Loops in code of files not chosen are not followed: their turns count for no line.
                Some(&first) if first != NO_LINE && first != ELSEWHERE && lines.all(|&l| l == first) => BlockLine::On(first),
                Some(_) => BlockLine::Other,
            }
        })
        .collect()
}

/// Blocks with rows leave on their last row's last line; those without
/// pass on what arrives, found by iterating to a fixed point (sets only
/// grow, bounded by the function's lines).
pub(super) fn arriving_lines(cfg: &Cfg, rows: &BlockRows<'_>, at_entry: u32) -> Arriving {
    let entry = BTreeSet::from([at_entry]);
    let mut leaving: Vec<BTreeSet<u32>> =
        rows.iter().map(|r| r.last().and_then(|(lines, _)| lines.last()).map(|&l| BTreeSet::from([l])).unwrap_or_default()).collect();
    let transparent: Vec<bool> = rows.iter().map(Vec::is_empty).collect();
    let mut changed = true;
    while changed {
        changed = false;
        for edge in cfg.edges() {
            let Node::Block(to) = edge.to else { continue };
            if !transparent[to] {
                continue;
            }
            let from = match edge.from {
                Node::Block(b) => leaving[b].clone(),
                _ => entry.clone(),
            };
            let before = leaving[to].len();
            leaving[to].extend(from);
            changed |= leaving[to].len() != before;
        }
    }
    Arriving { leaving, entry }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arcs::{CodeRange, EdgeKind, default_costs, place, solve};

    /// `test edi,edi; jne +5; mov eax,1; ret` at 0x1000: blocks at 0x1000,
    /// 0x1004 (the mov) and 0x1009 (the ret).
    fn if_without_else() -> Cfg {
        let code = [0x85, 0xff, 0x75, 0x05, 0xb8, 0x01, 0, 0, 0, 0xc3];
        Cfg::build(&[CodeRange { address: 0x1000, bytes: &code }]).unwrap()
    }

    /// 10 calls, 3 of them skipping the mov.
    fn counts(cfg: &Cfg) -> Counts {
        let placement = place(cfg, &default_costs(cfg));
        solve(cfg, &placement, &[7, 10]).unwrap()
    }

    #[test]
    fn lines_count_entries_from_other_lines() {
        let cfg = if_without_else();
        // Line 1: the test; line 2: the mov; line 3: the ret.
        let lines = FunctionLines {
            entry_line: 0,
            entry_also: vec![],
            decl_line: Some(9),
            rows: vec![(0x1002, vec![1]), (0x1004, vec![2]), (0x1009, vec![3])],
            located: Vec::new(),
        };
        let got = line_entries(&cfg, &counts(&cfg), &lines).unwrap().entered;
        assert_eq!(got, [(1, 10), (2, 7), (3, 10), (9, 10)]);
    }

    #[test]
    fn a_jump_is_on_the_line_its_instruction_is_on() {
        let cfg = if_without_else();
        let jne = BranchCount { jcc: 0x1002, taken: 3, not_taken: 7 };
        // The jne in a row of line 1 that starts at the test.
        let lines = FunctionLines { located: vec![(0x1000, 1), (0x1004, 2)], ..FunctionLines::default() };
        assert_eq!(line_branches(&cfg, &counts(&cfg), &lines), [(1, jne)]);
        // Its own row, of a line not chosen: left out; before any row: too.
        let lines = FunctionLines { located: vec![(0x1000, 1), (0x1002, NO_LINE)], ..FunctionLines::default() };
        assert_eq!(line_branches(&cfg, &counts(&cfg), &lines), []);
        let lines = FunctionLines { located: vec![(0x1004, 2)], ..FunctionLines::default() };
        assert_eq!(line_branches(&cfg, &counts(&cfg), &lines), []);
    }

    #[test]
    fn a_block_without_rows_passes_its_line_on() {
        let cfg = if_without_else();
        // The mov has no row: the ret is reached on line 1 either way, and
        // entered from it each time.
        let lines = FunctionLines { entry_line: 1, rows: vec![(0x1009, vec![3])], ..FunctionLines::default() };
        assert_eq!(line_entries(&cfg, &counts(&cfg), &lines).unwrap().entered, [(3, 10)]);
        // The same line as the entry's: never entered from another.
        let lines = FunctionLines { entry_line: 3, rows: vec![(0x1009, vec![3])], ..FunctionLines::default() };
        assert_eq!(line_entries(&cfg, &counts(&cfg), &lines).unwrap().entered, []);
    }

    #[test]
    fn a_line_reached_both_from_itself_and_from_another_is_refused() {
        let cfg = if_without_else();
        // The ret on line 2 comes from line 2 after the mov (7 times) and
        // from line 1 when it jumps (3): the edge into the ret says 10.
        let lines = FunctionLines { entry_line: 1, rows: vec![(0x1004, vec![2]), (0x1009, vec![2])], ..FunctionLines::default() };
        // Both edges are known apart: 3 entries from line 1, none from 2.
        assert_eq!(line_entries(&cfg, &counts(&cfg), &lines).unwrap().entered, [(2, 10)]);
        // A row mid-instruction is refused.
        let lines = FunctionLines { entry_line: 1, rows: vec![(0x1005, vec![2])], ..FunctionLines::default() };
        assert_eq!(line_entries(&cfg, &counts(&cfg), &lines).map(|e| e.entered), Err(Error::RowInsideInstruction { address: 0x1005 }));
    }

    /// Two ifs in a row: the second's block has no row, so the `ret` after
    /// it arrives on line 1 (the first jne taken) or on line 2 (the mov).
    #[test]
    fn a_line_whose_entries_depend_on_the_path_is_refused() {
        #[rustfmt::skip]
        let code = [
            0x85, 0xff, 0x75, 0x05, 0xb8, 0x01, 0, 0, 0, // test edi,edi; jne 0x1009; mov eax,1
            0x85, 0xf6, 0x74, 0x00, 0xc3,                // test esi,esi; je 0x100d; ret
        ];
        let cfg = Cfg::build(&[CodeRange { address: 0x1000, bytes: &code }]).unwrap();
        let placement = place(&cfg, &default_costs(&cfg));
        // 10 calls; the first jne taken 3 times, the je 4 times.
        let truth = |e: &crate::arcs::Edge| match e.kind {
            EdgeKind::Taken { jcc: 0x1002 } => 3,
            EdgeKind::NotTaken { jcc: 0x1002 } | EdgeKind::FallThrough => 7,
            EdgeKind::Taken { .. } => 4,
            EdgeKind::NotTaken { .. } => 6,
            _ => 10,
        };
        let counted: Vec<u64> = placement.counted().iter().map(|&e| truth(&cfg.edges()[e])).collect();
        let counts = solve(&cfg, &placement, &counted).unwrap();
        let lines = FunctionLines {
            entry_line: 0,
            rows: vec![(0x1002, vec![1]), (0x1004, vec![2]), (0x100d, vec![2])],
            ..FunctionLines::default()
        };
        // Line 2 is left out, the others counted.
        let entries = line_entries(&cfg, &counts, &lines).unwrap();
        assert_eq!((entries.entered, entries.undetermined), (vec![(1, 10)], vec![(2, 0x100d)]));
        // On a third line, every arrival enters it.
        let lines = FunctionLines {
            entry_line: 0,
            rows: vec![(0x1002, vec![1]), (0x1004, vec![2]), (0x100d, vec![3])],
            ..FunctionLines::default()
        };
        let entries = line_entries(&cfg, &counts, &lines).unwrap();
        assert_eq!((entries.entered, entries.undetermined), (vec![(1, 10), (2, 7), (3, 10)], vec![]));
    }

    /// `xor eax,eax; inc eax; cmp eax,edi; jl (the inc); ret` at 0x1000,
    /// called 10 times, its loop turning 50 times (the jl taken 40 times).
    fn one_loop() -> (Cfg, Counts) {
        let code = [0x31, 0xc0, 0xff, 0xc0, 0x39, 0xf8, 0x7c, 0xfa, 0xc3];
        let cfg = Cfg::build(&[CodeRange { address: 0x1000, bytes: &code }]).unwrap();
        let placement = place(&cfg, &default_costs(&cfg));
        let truth = |e: &crate::arcs::Edge| match e.kind {
            EdgeKind::Taken { .. } => 40,
            _ => 10,
        };
        let counted: Vec<u64> = placement.counted().iter().map(|&e| truth(&cfg.edges()[e])).collect();
        let counts = solve(&cfg, &placement, &counted).unwrap();
        (cfg, counts)
    }

    #[test]
    fn a_loop_on_one_line_counts_its_turns() {
        let (cfg, counts) = one_loop();
        // The whole loop on line 2: entered 10 times, turned 40 more.
        let lines = FunctionLines { entry_line: 1, rows: vec![(0x1002, vec![2]), (0x1008, vec![3])], ..FunctionLines::default() };
        assert_eq!(line_entries(&cfg, &counts, &lines).unwrap().entered, [(2, 50), (3, 10)]);
        // The compare on a line of its own: each turn leaves line 2 and
        // enters it again, and no loop stays on one line.
        let lines = FunctionLines {
            entry_line: 1,
            rows: vec![(0x1002, vec![2]), (0x1004, vec![4]), (0x1008, vec![3])],
            ..FunctionLines::default()
        };
        assert_eq!(line_entries(&cfg, &counts, &lines).unwrap().entered, [(2, 50), (3, 10), (4, 50)]);
        // The loop without a row of its own stays on the line it came from.
        let lines = FunctionLines { entry_line: 1, rows: vec![(0x1000, vec![2]), (0x1008, vec![3])], ..FunctionLines::default() };
        assert_eq!(line_entries(&cfg, &counts, &lines).unwrap().entered, [(2, 50), (3, 10)]);
    }

    #[test]
    fn entry_lines_count_per_call() {
        let cfg = if_without_else();
        let lines = FunctionLines { entry_line: 4, entry_also: vec![5, 6], rows: vec![(0x1009, vec![6])], ..FunctionLines::default() };
        // 5 and 6 at each call; the ret is on 6 already when it arrives
        // from the jne (3), and from 6 through the mov (no row) as well.
        assert_eq!(line_entries(&cfg, &counts(&cfg), &lines).unwrap().entered, [(5, 10), (6, 10)]);
    }
}

//! Turns of loops that never leave one line, which gcov adds to the line's
//! count: `for (i = 0; i < n; i++) a[i] = 0;` written on one line counts
//! once per entry and once per turn, 11 for one entry and 10 turns.
//!
//! gcov counts them as the circuits of the line's blocks: from each block
//! in order, every elementary circuit through blocks after it, each taking
//! its smallest arc count off all its arcs and adding it to the line (see
//! `get_cycles_count` in GCC's gcov). The same is done here on the machine
//! blocks that stay on one line from start to end.

use super::cfg::{Cfg, Node};
use super::solve::Counts;
use std::collections::BTreeMap;

/// How far the search for circuits may go in one function before its
/// lines with loops are given up (a graph built to make it explode).
const MOST_STEPS: u32 = 200_000;

/// What a block does with lines, for loops on one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BlockLine {
    /// Every row of the block is on this line alone.
    On(u32),
    /// The block has no row: it stays on the line the frame arrived with.
    Passes,
    /// It changes lines, or several, or stays on one it may not arrive on.
    Other,
}

/// The turns of loops within each line, by line id, given what each block
/// does with lines (`passes` for blocks without rows: the only line a frame
/// may leave them on, if one). `Err` names the lines whose circuits were
/// too many to follow, each with the address of a block of its loop.
pub(super) fn loop_turns(
    cfg: &Cfg,
    counts: &Counts,
    blocks: &[BlockLine],
    passes: &[Option<u32>],
) -> Result<BTreeMap<u32, u64>, Vec<(u32, u64)>> {
    let line_of = |b: usize| match blocks[b] {
        BlockLine::On(line) => Some(line),
        BlockLine::Passes => passes[b],
        BlockLine::Other => None,
    };
    // Arcs between two blocks on the same line, with their counts.
    let mut successors: Vec<Vec<(usize, usize)>> = vec![Vec::new(); blocks.len()];
    let mut remaining: Vec<u64> = vec![0; cfg.edges().len()];
    for (id, edge) in cfg.edges().iter().enumerate() {
        let (Node::Block(from), Node::Block(to)) = (edge.from, edge.to) else { continue };
        let n = u64::try_from(counts.edge(id)).unwrap_or(0);
        if n > 0 && line_of(from).is_some() && line_of(from) == line_of(to) {
            successors[from].push((id, to));
            remaining[id] = n;
        }
    }
    let mut turns: BTreeMap<u32, u64> = BTreeMap::new();
    let mut too_many = Vec::new();
    let mut steps = MOST_STEPS;
    for start in 0..blocks.len() {
        let Some(line) = line_of(start).filter(|_| !successors[start].is_empty()) else { continue };
        let mut search =
            Search { successors: &successors, remaining: &mut remaining, start, path: Vec::new(), found: 0, steps: &mut steps };
        let mut on_path = vec![false; blocks.len()];
        on_path[start] = true;
        if search.circuits(start, &mut on_path).is_err() {
            too_many.push((line, cfg.blocks()[start].start));
            continue;
        }
        if search.found > 0 {
            let total = turns.entry(line).or_default();
            *total = total.saturating_add(search.found);
        }
    }
    if too_many.is_empty() { Ok(turns) } else { Err(too_many) }
}

/// A depth-first search for the elementary circuits through `start` and
/// blocks after it, in the order gcov finds them.
struct Search<'a> {
    successors: &'a [Vec<(usize, usize)>],
    remaining: &'a mut [u64],
    start: usize,
    /// The arcs from `start` to the block being searched.
    path: Vec<usize>,
    found: u64,
    steps: &'a mut u32,
}

impl Search<'_> {
    fn circuits(&mut self, block: usize, on_path: &mut [bool]) -> Result<(), ()> {
        for &(arc, to) in &self.successors[block] {
            if to < self.start || self.remaining[arc] == 0 {
                continue;
            }
            *self.steps = self.steps.checked_sub(1).ok_or(())?;
            self.path.push(arc);
            if to == self.start {
                let least = self.path.iter().map(|&a| self.remaining[a]).min().unwrap_or(0);
                for &a in &self.path {
                    self.remaining[a] -= least;
                }
                self.found = self.found.saturating_add(least);
            } else if !on_path[to] && self.path.iter().all(|&a| self.remaining[a] > 0) {
                on_path[to] = true;
                let searched = self.circuits(to, on_path);
                on_path[to] = false;
                searched?;
            }
            self.path.pop();
        }
        Ok(())
    }
}

//! Every edge and block count from the counted edges' counts, by flow
//! conservation: what flows into a node flows out of it (EXIT→ENTRY closes
//! the circuit). A node with one edge of unknown count left gives that
//! count; on a spanning tree there always is one (a leaf) until none is
//! unknown.
//!
//! The counts come from a target process's memory, so they are hostile
//! input: every sum is in 128 bits over values checked to fit 63, the work
//! is linear in the graph's size, and what does not add up is an error.

use super::Error;
use super::cfg::{Cfg, EdgeKind, Node};
use super::flight::Placed;
use super::graph::Graph;
use super::placement::Placement;

/// The count of every edge and block of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    edges: Vec<i64>,
    blocks: Vec<u64>,
    entry_edge: usize,
    /// Threads in the function's code when counting started or ended (see
    /// [`super::flight`]): its lines' counts take them into account.
    pub(crate) frames: Vec<Placed>,
}

/// How often a conditional jump was taken and not taken (what `gcov -b`
/// shows per branch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchCount {
    /// The jump's address.
    pub jcc: u64,
    /// Times it jumped.
    pub taken: u64,
    /// Times it went on to the next instruction.
    pub not_taken: u64,
}

impl Counts {
    /// Edge `edge`'s count. Only a fake edge's can be negative: it is the
    /// times its call did not return less the times it returned twice
    /// (`setjmp`, `vfork`).
    pub fn edge(&self, edge: usize) -> i64 {
        self.edges[edge]
    }

    /// Every edge's count, by id.
    pub fn edges(&self) -> &[i64] {
        &self.edges
    }

    /// Block `block`'s count: how often its first instruction ran.
    pub fn block(&self, block: usize) -> u64 {
        self.blocks[block]
    }

    /// Every block's count, by index.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }

    /// How often the function was entered.
    pub fn calls(&self) -> u64 {
        self.edges[self.entry_edge].unsigned_abs()
    }

    /// Every conditional jump's taken and not-taken counts, by address.
    pub fn branches(&self, cfg: &Cfg) -> Vec<BranchCount> {
        cfg.branches()
            .into_iter()
            .map(|b| BranchCount {
                jcc: b.jcc,
                taken: self.edges[b.taken].unsigned_abs(),
                not_taken: self.edges[b.not_taken].unsigned_abs(),
            })
            .collect()
    }
}

/// Derives every count of `cfg` from `counted`, the counts of
/// `placement.counted()` in that order. Fails if the counts are not one
/// execution's: a derived count of an executed edge below zero, beyond
/// 2^63, flow not conserved, or counted edges that do not determine the
/// rest.
pub fn solve(cfg: &Cfg, placement: &Placement, counted: &[u64]) -> Result<Counts, Error> {
    let values = Graph::edges(cfg).solve(placement.counted(), counted)?;
    Counts::new(cfg, &values)
}

impl Counts {
    /// The counts of `cfg` from every arc's count of a solved graph whose
    /// first arcs are `cfg`'s edges: each block's count is its inflow.
    pub(crate) fn new(cfg: &Cfg, arcs: &[i128]) -> Result<Counts, Error> {
        let edges = cfg.edges();
        let value = |id: usize| arcs.get(id).copied().unwrap_or(0);
        let mut blocks = vec![0i128; cfg.blocks().len()];
        for (id, edge) in edges.iter().enumerate() {
            if let Node::Block(b) = edge.to {
                blocks[b] += value(id);
            }
        }
        let blocks = blocks
            .into_iter()
            .enumerate()
            .map(|(block, count)| u64::try_from(count).map_err(|_| Error::BlockOverflow { block }))
            .collect::<Result<Vec<u64>, Error>>()?;
        // Every count was checked to fit 63 bits when it became known.
        let edges_out = (0..edges.len()).map(|id| value(id) as i64).collect();
        let entry_edge = edges.iter().position(|e| e.kind == EdgeKind::Entry).unwrap_or(0);
        Ok(Counts { edges: edges_out, blocks, entry_edge, frames: Vec::new() })
    }
}

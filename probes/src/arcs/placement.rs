//! Which edges get a counter: those off a spanning tree of the graph taken
//! as undirected (EXIT→ENTRY included). Any edge count is then the counted
//! ones added and subtracted along the tree, so |E| - |V| + 1 counters give
//! every count; the tree is chosen to hold the edges that are costly or
//! impossible to count.

use super::cfg::{Cfg, Node};
use super::graph::Graph;

/// The edges that hold counters, and the tree whose edges do not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    on_tree: Vec<bool>,
    counted: Vec<usize>,
}

impl Placement {
    /// The edges to count, by id, in increasing order.
    pub fn counted(&self) -> &[usize] {
        &self.counted
    }

    /// Whether edge `edge` is on the spanning tree (its count is derived).
    pub fn on_tree(&self, edge: usize) -> bool {
        self.on_tree.get(edge).copied().unwrap_or(false)
    }
}

/// Chooses the counted edges of `cfg`. `costs[id]` says how costly
/// counting edge `id` is (missing: 0): the costliest go on the tree first
/// (after the fake and virtual edges, which always do, as gcc places them),
/// so they are the last to need a counter. Ties keep the graph's order.
pub fn place(cfg: &Cfg, costs: &[u32]) -> Placement {
    let edges = cfg.edges();
    let cost = |id: usize| costs.get(id).copied().unwrap_or(0);
    let mut order: Vec<(bool, u32, usize)> =
        edges.iter().enumerate().map(|(id, edge)| (!edge.kind.is_artificial(), u32::MAX - cost(id), id)).collect();
    order.sort_unstable();
    let on_tree = Graph::edges(cfg).spanning_tree(order.into_iter().map(|(_, _, id)| id));
    let counted = (0..edges.len()).filter(|&id| !on_tree[id]).collect();
    Placement { on_tree, counted }
}

/// Bytes of the jump that will carry a counter into a block.
const PATCH_LEN: u64 = 5;

/// Default costs for [`place`], from the graph alone: a critical edge
/// (from a block with several successors to one with several predecessors)
/// has no block of its own to hold a counter and needs its branch
/// retargeted; an edge into a block shorter than a 5-byte jump cannot be
/// counted at that block's head; a backward edge (a loop's) is likely hot,
/// and on the tree it needs no counter at all.
pub fn default_costs(cfg: &Cfg) -> Vec<u32> {
    let edges = cfg.edges();
    let mut real_out = vec![0u32; cfg.node_count()];
    let mut into = vec![0u32; cfg.node_count()];
    for edge in edges.iter().filter(|e| !e.kind.is_artificial()) {
        real_out[cfg.node_index(edge.from)] += 1;
        into[cfg.node_index(edge.to)] += 1;
    }
    let block = |node| match node {
        Node::Block(b) => Some(&cfg.blocks()[b]),
        Node::Entry | Node::Exit => None,
    };
    edges
        .iter()
        .map(|edge| {
            if edge.kind.is_artificial() {
                return u32::MAX;
            }
            let mut cost = 1;
            if real_out[cfg.node_index(edge.from)] > 1 && into[cfg.node_index(edge.to)] > 1 {
                cost += 4;
            }
            if block(edge.to).is_some_and(|b| b.len < PATCH_LEN) {
                cost += 2;
            }
            if block(edge.from).zip(block(edge.to)).is_some_and(|(from, to)| to.start <= from.start) {
                cost += 1;
            }
            cost
        })
        .collect()
}

//! How often each part of a function is likely to run, from its loops
//! alone. The counters go on the edges off a spanning tree; Knuth's rule
//! (as gcc's `-fprofile-arcs` applies it with its estimated frequencies)
//! is to build the tree from the edges that run most, so that the counted
//! ones run least. Without a profile, code inside `k` nested loops is taken
//! to run [`TRIPS`]`^k` times as often as code outside them: a loop's body
//! then counts once per turn only where the loop cannot be counted from
//! outside it.
//!
//! The loops are the natural loops of the graph: an edge into a block that
//! dominates its source closes one, whose body is what reaches the source
//! without passing the header. Cycles with no such header (irreducible
//! code) count as no loop: the counts stay exact, the counters may cost
//! more.

use super::cfg::{Cfg, Node};
use super::counters::Quantity;
use petgraph::algo::dominators;
use petgraph::graph::{DiGraph, NodeIndex};

/// Turns a loop is taken to make for each time it is entered.
pub const TRIPS: u32 = 8;

/// Loops nested deeper than this are weighed as this deep: weights stay
/// well within a `u32` times any counter's cost.
const DEEPEST: u32 = 6;

/// The loops each block of a graph lies in.
#[derive(Clone, Debug)]
pub struct Loops {
    /// Per block, the headers of the loops holding it, in increasing order.
    of_block: Vec<Vec<usize>>,
}

impl Loops {
    /// The natural loops of `cfg`.
    pub fn of(cfg: &Cfg) -> Loops {
        let blocks = cfg.blocks().len();
        let mut graph: DiGraph<(), ()> = DiGraph::with_capacity(blocks + 1, cfg.edges().len());
        for _ in 0..=blocks {
            graph.add_node(());
        }
        let entry = NodeIndex::new(blocks);
        let mut predecessors = vec![Vec::new(); blocks];
        for edge in cfg.edges().iter().filter(|e| !e.kind.is_artificial()) {
            match (edge.from, edge.to) {
                (Node::Entry, Node::Block(to)) => {
                    graph.add_edge(entry, NodeIndex::new(to), ());
                }
                (Node::Block(from), Node::Block(to)) => {
                    graph.add_edge(NodeIndex::new(from), NodeIndex::new(to), ());
                    predecessors[to].push(from);
                }
                _ => {}
            }
        }
        let dominance = dominators::simple_fast(&graph, entry);
        let mut of_block: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        for edge in cfg.edges() {
            let (Node::Block(source), Node::Block(header)) = (edge.from, edge.to) else { continue };
            let closes = dominance.dominators(NodeIndex::new(source)).is_some_and(|mut d| d.any(|n| n.index() == header));
            if closes {
                for block in body(header, source, &predecessors) {
                    if let Err(at) = of_block[block].binary_search(&header) {
                        of_block[block].insert(at, header);
                    }
                }
            }
        }
        Loops { of_block }
    }

    /// How many loops hold block `block`.
    pub fn depth(&self, block: usize) -> u32 {
        self.of_block.get(block).map_or(0, |l| l.len() as u32)
    }

    /// How many loops hold both ends of an edge from `from` to `to`: the
    /// loops it runs in (ENTRY and EXIT are in none).
    pub fn edge_depth(&self, from: Node, to: Node) -> u32 {
        let (Node::Block(from), Node::Block(to)) = (from, to) else { return 0 };
        let (Some(a), Some(b)) = (self.of_block.get(from), self.of_block.get(to)) else { return 0 };
        a.iter().filter(|h| b.binary_search(h).is_ok()).count() as u32
    }

    /// How often quantity `quantity` of `cfg` is taken to run, relative to
    /// the function's calls.
    pub fn weight(&self, cfg: &Cfg, quantity: Quantity) -> u32 {
        let depth = match quantity {
            Quantity::Block(b) => self.depth(b),
            Quantity::Edge(e) => cfg.edges().get(e).map_or(0, |edge| self.edge_depth(edge.from, edge.to)),
        };
        TRIPS.pow(depth.min(DEEPEST))
    }
}

/// The blocks of the natural loop that the edge `source → header` closes.
fn body(header: usize, source: usize, predecessors: &[Vec<usize>]) -> Vec<usize> {
    let mut seen = vec![false; predecessors.len()];
    seen[header] = true;
    let mut body = vec![header];
    let mut to_visit = vec![source];
    while let Some(block) = to_visit.pop() {
        if std::mem::replace(&mut seen[block], true) {
            continue;
        }
        body.push(block);
        to_visit.extend(predecessors[block].iter().copied().filter(|&p| !seen[p]));
    }
    body
}

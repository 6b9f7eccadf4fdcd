//! How often each part of a function is likely to run, from its shape
//! alone. The counters go on the edges off a spanning tree; Knuth's rule
//! (as gcc's `-fprofile-arcs` applies it with its estimated frequencies)
//! is to build the tree from the edges that run most, so that the counted
//! ones run least. Without a profile, a loop is taken to turn [`TRIPS`]
//! times each time it is entered, a branch to split its flow evenly between
//! its sides, and a branch that leaves a loop to leave it once in
//! [`TRIPS`] (the estimates of Wu and Larus, "Static branch frequency and
//! program profile analysis", 1994, reduced to these two): a loop's body
//! then counts once per turn only where the loop cannot be counted from
//! outside it, and a branch inside it on both its sides rather than on one
//! side and the loop's test.
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
use petgraph::visit::DfsPostOrder;

/// Turns a loop is taken to make for each time it is entered.
pub const TRIPS: u32 = 8;

/// Loops nested deeper than this are weighed as this deep: weights stay
/// well within a `u32` times any counter's cost.
const DEEPEST: u32 = 6;

/// A weight's units per run of the function's entry: fine enough that the
/// sides of a few nested branches still weigh apart.
const SCALE: f64 = 64.0;

/// The loops each block of a graph lies in.
#[derive(Clone, Debug)]
pub struct Loops {
    /// Per block, the headers of the loops holding it, in increasing order.
    of_block: Vec<Vec<usize>>,
    /// Per block, how often it is taken to run per run of the entry.
    frequency: Vec<f64>,
    /// Per edge, the share of its source's runs that take it.
    share: Vec<f64>,
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
        let mut closing = vec![false; cfg.edges().len()];
        for (id, edge) in cfg.edges().iter().enumerate() {
            let (Node::Block(source), Node::Block(header)) = (edge.from, edge.to) else { continue };
            let closes = dominance.dominators(NodeIndex::new(source)).is_some_and(|mut d| d.any(|n| n.index() == header));
            if closes && !edge.kind.is_artificial() {
                closing[id] = true;
                for block in body(header, source, &predecessors) {
                    if let Err(at) = of_block[block].binary_search(&header) {
                        of_block[block].insert(at, header);
                    }
                }
            }
        }
        let mut loops = Loops { of_block, frequency: vec![0.0; blocks], share: vec![0.0; cfg.edges().len()] };
        loops.share = loops.shares(cfg);
        loops.frequency = loops.frequencies(cfg, &graph, entry, &closing);
        loops
    }

    /// Each edge's share of its source's runs: even between the sides of a
    /// branch, except that the sides leaving a loop take one run in
    /// [`TRIPS`] between them.
    fn shares(&self, cfg: &Cfg) -> Vec<f64> {
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); self.of_block.len()];
        for (id, edge) in cfg.edges().iter().enumerate() {
            if let (Node::Block(from), false) = (edge.from, edge.kind.is_artificial()) {
                out[from].push(id);
            }
        }
        let mut share = vec![0.0; cfg.edges().len()];
        for (from, edges) in out.iter().enumerate() {
            let leaves = |id: &usize| match cfg.edges()[*id].to {
                Node::Block(to) => self.of_block[from].iter().any(|h| self.of_block[to].binary_search(h).is_err()),
                Node::Entry | Node::Exit => self.depth(from) > 0,
            };
            let leaving = edges.iter().filter(|id| leaves(id)).count();
            let staying = edges.len() - leaving;
            for &id in edges {
                share[id] = match (leaving, staying) {
                    (0, n) | (n, 0) => 1.0 / n as f64,
                    (l, _) if leaves(&id) => 1.0 / (TRIPS as f64 * l as f64),
                    (_, s) => (1.0 - 1.0 / TRIPS as f64) / s as f64,
                };
            }
        }
        share
    }

    /// Each block's runs per run of the entry: what flows into it along
    /// edges that close no loop, in reverse postorder (a block's sources
    /// come first, but for the edges closing loops and those of cycles with
    /// no header, which add nothing), times [`TRIPS`] at a loop's header,
    /// and at most [`TRIPS`] to the power of its loops' depth.
    fn frequencies(&self, cfg: &Cfg, graph: &DiGraph<(), ()>, entry: NodeIndex, closing: &[bool]) -> Vec<f64> {
        let blocks = self.of_block.len();
        let mut into: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        let mut headers = vec![false; blocks];
        for (id, edge) in cfg.edges().iter().enumerate() {
            if let (Node::Block(to), false) = (edge.to, edge.kind.is_artificial()) {
                into[to].push(id);
                headers[to] |= closing[id];
            }
        }
        let mut frequency = vec![0.0; blocks];
        let mut done = vec![false; blocks];
        let mut order = Vec::with_capacity(blocks);
        let mut dfs = DfsPostOrder::new(graph, entry);
        while let Some(node) = dfs.next(graph) {
            order.push(node.index());
        }
        for &block in order.iter().rev().filter(|&&b| b < blocks) {
            let inflow: f64 = into[block]
                .iter()
                .filter(|&&id| !closing[id])
                .map(|&id| match cfg.edges()[id].from {
                    Node::Entry => 1.0,
                    Node::Block(from) if done[from] => frequency[from] * self.share[id],
                    _ => 0.0,
                })
                .sum();
            // A loop left from its body as well as its test sends out more
            // than came in (the estimate does not conserve flow): a block is
            // taken to run no more than its loops' turns, so that the excess
            // does not compound from one loop to the next.
            let most = (TRIPS as f64).powi(self.depth(block).min(DEEPEST) as i32);
            frequency[block] = (if headers[block] { inflow * TRIPS as f64 } else { inflow }).min(most);
            done[block] = true;
        }
        frequency
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
    /// the function's calls, in units of 1/[`SCALE`] of a call (at least 1).
    pub fn weight(&self, cfg: &Cfg, quantity: Quantity) -> u32 {
        let runs = match quantity {
            Quantity::Block(b) => self.frequency.get(b).copied().unwrap_or(0.0),
            Quantity::Edge(e) => match cfg.edges().get(e).map(|edge| edge.from) {
                Some(Node::Block(from)) => self.frequency[from] * self.share[e],
                Some(Node::Entry) => 1.0,
                Some(Node::Exit) | None => 0.0,
            },
        };
        (runs * SCALE).round().max(1.0) as u32
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

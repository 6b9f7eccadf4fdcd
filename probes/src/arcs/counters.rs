//! Counters on blocks as well as on edges. A counter patched in at (almost)
//! any place inside a basic block counts the block's executions; an edge
//! can be counted directly only where its jump is moved or retargeted. So
//! the placement works on the *split* graph, where each block is an arc of
//! its own (see [`Quantity`]): a block's count is then a quantity like any
//! edge's, the tree may leave either kind off it, and the number of
//! counters is the same as on the edges alone (|E| - |V| + 1 of the
//! function's graph).
//!
//! Each quantity has a [`Cost`]: where no cheap counter fits (a block too
//! short for a 5-byte jump, an edge whose jump cannot be moved) it is
//! [`Cost::NoCounter`], and such quantities go on the tree before any
//! other. If they hold a cycle, no tree holds them all: the placement names
//! the ones left off ([`CounterPlacement::needs_probe`]), which something
//! dearer (a uprobe) must count, instead of pretending to count them.

use super::Error;
use super::cfg::Cfg;
use super::graph::Graph;
use super::solve::Counts;

/// A quantity whose count a counter may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Quantity {
    /// Edge `id` of the graph (see [`Cfg::edges`]).
    Edge(usize),
    /// Block `index` of the graph (see [`Cfg::blocks`]): how often its
    /// first instruction runs.
    Block(usize),
}

/// What counting a quantity costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// A counter can be patched in, at this cost (relative: what matters is
    /// the order; the cheapest are counted first).
    Counter(u32),
    /// No counter can be patched in for it: it should be derived.
    NoCounter,
}

/// Every quantity of `cfg`, in the order [`place_counters`] takes costs
/// in: each edge by id, then each block by index.
pub fn quantities(cfg: &Cfg) -> Vec<Quantity> {
    (0..cfg.edges().len()).map(Quantity::Edge).chain((0..cfg.blocks().len()).map(Quantity::Block)).collect()
}

/// The quantities that hold counters, and which of them have no cheap one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterPlacement {
    counted: Vec<Quantity>,
    needs_probe: Vec<Quantity>,
    on_tree: Vec<bool>,
}

impl CounterPlacement {
    /// The quantities to count, edges first by id, then blocks: their
    /// counts, in this order, are what [`solve_counters`] takes.
    pub fn counted(&self) -> &[Quantity] {
        &self.counted
    }

    /// The counted quantities that had [`Cost::NoCounter`]: the ones that
    /// form a cycle with other quantities without a counter, so that one
    /// of them must be counted some dearer way. Empty when cheap counters
    /// suffice.
    pub fn needs_probe(&self) -> &[Quantity] {
        &self.needs_probe
    }

    /// Whether `quantity` is derived (on the spanning tree).
    pub fn on_tree(&self, cfg: &Cfg, quantity: Quantity) -> bool {
        arc_of(cfg, quantity).and_then(|arc| self.on_tree.get(arc).copied()).unwrap_or(false)
    }
}

/// The quantity's arc in the split graph.
pub(crate) fn arc_of(cfg: &Cfg, quantity: Quantity) -> Option<usize> {
    match quantity {
        Quantity::Edge(e) => (e < cfg.edges().len()).then_some(e),
        Quantity::Block(b) => (b < cfg.blocks().len()).then_some(cfg.edges().len() + b),
    }
}

/// Chooses the counted quantities of `cfg`. `costs` is indexed as
/// [`quantities`] lists them (missing: [`Cost::NoCounter`]). The tree takes
/// the fake and virtual edges first, then the quantities without a
/// counter, then the costliest: what is left off it is as cheap as a
/// spanning tree allows, and the fewest quantities without a counter are
/// counted (a greedy choice is optimal on the graph's cycles).
pub fn place_counters(cfg: &Cfg, costs: &[Cost]) -> CounterPlacement {
    let graph = Graph::split(cfg);
    let cost = |id: usize| costs.get(id).copied().unwrap_or(Cost::NoCounter);
    let mut order: Vec<(u8, u32, usize)> = graph
        .arcs
        .iter()
        .enumerate()
        .map(|(id, arc)| match (arc.artificial, cost(id)) {
            (true, _) => (0, 0, id),
            (false, Cost::NoCounter) => (1, 0, id),
            (false, Cost::Counter(c)) => (2, u32::MAX - c, id),
        })
        .collect();
    order.sort_unstable();
    let on_tree = graph.spanning_tree(order.into_iter().map(|(_, _, id)| id));
    let all = quantities(cfg);
    let counted: Vec<Quantity> = (0..all.len()).filter(|&id| !on_tree[id]).map(|id| all[id]).collect();
    let needs_probe = counted.iter().copied().filter(|&q| arc_of(cfg, q).is_some_and(|id| cost(id) == Cost::NoCounter)).collect();
    CounterPlacement { counted, needs_probe, on_tree }
}

/// Derives every edge and block count of `cfg` from `counted`, the counts
/// of `placement.counted()` in that order, with the checks of
/// [`super::solve`]. In its errors an edge `id` past the edges' is block
/// `id - cfg.edges().len()`, and a node `n` is block `n`'s entry when
/// below the number of blocks, block `n - blocks`'s exit below twice it,
/// then ENTRY and EXIT.
pub fn solve_counters(cfg: &Cfg, placement: &CounterPlacement, counted: &[u64]) -> Result<Counts, Error> {
    let arcs: Vec<usize> = placement.counted.iter().map(|&q| arc_of(cfg, q).unwrap_or(usize::MAX)).collect();
    let values = Graph::split(cfg).solve(&arcs, counted)?;
    Counts::new(cfg, &values)
}

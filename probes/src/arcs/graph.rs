//! The plain graph that the placement and the solver work on: nodes by
//! index, arcs with their ends. Two graphs are made from a [`Cfg`]: its
//! edges as they are ([`Graph::edges`]), and the *split* graph
//! ([`Graph::split`]) where each block is an arc of its own, from the node
//! its edges come into to the node its edges leave from, so that a block's
//! count is a quantity like any edge's.

use super::Error;
use super::cfg::{Cfg, Node};

/// A directed arc between two nodes of a [`Graph`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arc {
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// No code runs along it (fake and virtual edges): never counted, and
    /// its count may be negative.
    pub(crate) artificial: bool,
}

/// Nodes `0..nodes` and arcs between them.
#[derive(Clone, Debug)]
pub(crate) struct Graph {
    pub(crate) nodes: usize,
    pub(crate) arcs: Vec<Arc>,
}

impl Graph {
    /// The graph of `cfg` itself: arc `e` is edge `e`, nodes are numbered
    /// as [`Cfg::node_index`] does.
    pub(crate) fn edges(cfg: &Cfg) -> Graph {
        let arcs = cfg
            .edges()
            .iter()
            .map(|e| Arc { from: cfg.node_index(e.from), to: cfg.node_index(e.to), artificial: e.kind.is_artificial() })
            .collect();
        Graph { nodes: cfg.node_count(), arcs }
    }

    /// The split graph of `cfg`: block `b` is node `b` (where its edges
    /// come in) and node `blocks + b` (where they leave), joined by arc
    /// `edges + b`; ENTRY is node `2 * blocks`, EXIT `2 * blocks + 1`;
    /// arc `e < edges` is edge `e`. It has as many independent cycles as
    /// the graph of `cfg`: the same number of counters.
    pub(crate) fn split(cfg: &Cfg) -> Graph {
        let blocks = cfg.blocks().len();
        let index = |node: Node, leaving: bool| match node {
            Node::Block(b) if leaving => blocks + b,
            Node::Block(b) => b,
            Node::Entry => 2 * blocks,
            Node::Exit => 2 * blocks + 1,
        };
        let mut arcs: Vec<Arc> = cfg
            .edges()
            .iter()
            .map(|e| Arc { from: index(e.from, true), to: index(e.to, false), artificial: e.kind.is_artificial() })
            .collect();
        arcs.extend((0..blocks).map(|b| Arc { from: b, to: blocks + b, artificial: false }));
        Graph { nodes: 2 * blocks + 2, arcs }
    }

    /// Kruskal's algorithm: takes the arcs in `order` and keeps each that
    /// joins two components. Returns, per arc, whether it is on the tree.
    pub(crate) fn spanning_tree(&self, order: impl IntoIterator<Item = usize>) -> Vec<bool> {
        let mut sets = UnionFind::new(self.nodes);
        let mut on_tree = vec![false; self.arcs.len()];
        for id in order {
            let arc = self.arcs[id];
            on_tree[id] = sets.join(arc.from, arc.to);
        }
        on_tree
    }

    /// Every arc's count from those of `counted` (`values` in the same
    /// order), by flow conservation, checked as [`super::solve`] says.
    pub(crate) fn solve(&self, counted: &[usize], values: &[u64]) -> Result<Vec<i128>, Error> {
        self.solve_with(counted, values, &[])
    }

    /// The same, with `extra` flows besides the arcs' (from node, to node,
    /// count): frames that appeared or vanished inside the graph.
    pub(crate) fn solve_with(&self, counted: &[usize], values: &[u64], extra: &[(usize, usize, i128)]) -> Result<Vec<i128>, Error> {
        if counted.len() != values.len() {
            return Err(Error::CountNumber { expected: counted.len(), given: values.len() });
        }
        let mut known: Vec<Option<i128>> = vec![None; self.arcs.len()];
        for (&arc, &count) in counted.iter().zip(values) {
            if arc >= self.arcs.len() {
                return Err(Error::Unresolvable { unknown: self.arcs.len() });
            }
            if count > i64::MAX as u64 {
                return Err(Error::Overflow { edge: arc });
            }
            known[arc] = Some(i128::from(count));
        }
        let mut flow = Flow::new(self, &known);
        for &(from, to, count) in extra.iter().filter(|(from, to, _)| *from < self.nodes && *to < self.nodes) {
            flow.balance[to] += count;
            flow.balance[from] -= count;
        }
        self.propagate(&mut known, &mut flow)?;
        let left = known.iter().filter(|k| k.is_none()).count();
        if left > 0 {
            return Err(Error::Unresolvable { unknown: left });
        }
        let values: Vec<i128> = known.into_iter().map(|k| k.unwrap_or(0)).collect();
        self.check_balance(&values, &flow)?;
        Ok(values)
    }

    /// Resolves, while a node has exactly one arc of unknown count, that arc.
    fn propagate(&self, known: &mut [Option<i128>], flow: &mut Flow) -> Result<(), Error> {
        let mut ready: Vec<usize> = (0..self.nodes).filter(|&n| flow.unknown[n] == 1).collect();
        while let Some(node) = ready.pop() {
            if flow.unknown[node] != 1 {
                continue;
            }
            let Some(&id) = flow.incident[node].iter().find(|&&e| known[e].is_none()) else { continue };
            let arc = self.arcs[id];
            // Inflow equals outflow at `node`, the unknown arc included.
            let count = if arc.to == node { -flow.balance[node] } else { flow.balance[node] };
            if count < 0 && !arc.artificial {
                return Err(Error::Negative { edge: id, count });
            }
            if count.unsigned_abs() > i64::MAX as u128 {
                return Err(Error::Overflow { edge: id });
            }
            known[id] = Some(count);
            flow.balance[arc.to] += count;
            flow.balance[arc.from] -= count;
            for end in [arc.from, arc.to] {
                flow.unknown[end] -= 1;
                if flow.unknown[end] == 1 {
                    ready.push(end);
                }
            }
        }
        Ok(())
    }

    /// Checks that flow is conserved at every node.
    fn check_balance(&self, values: &[i128], flow: &Flow) -> Result<(), Error> {
        for (node, ids) in flow.incident.iter().enumerate() {
            if flow.balance[node] != 0 {
                let inflow = ids.iter().filter(|&&e| self.arcs[e].to == node).map(|&e| values[e]).sum();
                let outflow = ids.iter().filter(|&&e| self.arcs[e].from == node).map(|&e| values[e]).sum();
                return Err(Error::Unbalanced { node, inflow, outflow });
            }
        }
        Ok(())
    }
}

/// What the solver knows of each node while it works.
struct Flow {
    /// Known inflow less known outflow.
    balance: Vec<i128>,
    /// Incident arcs (self-loops left out) of unknown count.
    unknown: Vec<usize>,
    /// Incident arcs (self-loops left out), by node.
    incident: Vec<Vec<usize>>,
}

impl Flow {
    fn new(graph: &Graph, known: &[Option<i128>]) -> Flow {
        let n = graph.nodes;
        let mut flow = Flow { balance: vec![0; n], unknown: vec![0; n], incident: vec![Vec::new(); n] };
        for (id, arc) in graph.arcs.iter().enumerate() {
            let (from, to) = (arc.from, arc.to);
            match known[id] {
                Some(count) => {
                    flow.balance[to] += count;
                    flow.balance[from] -= count;
                }
                None if from != to => {
                    flow.unknown[from] += 1;
                    flow.unknown[to] += 1;
                }
                None => {}
            }
            if from != to {
                flow.incident[from].push(id);
                flow.incident[to].push(id);
            }
        }
        flow
    }
}

/// Disjoint sets of nodes, for Kruskal's algorithm.
struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn new(size: usize) -> Self {
        UnionFind { parent: (0..size).collect() }
    }

    fn root(&mut self, mut node: usize) -> usize {
        while self.parent[node] != node {
            // Path halving keeps later look-ups short.
            self.parent[node] = self.parent[self.parent[node]];
            node = self.parent[node];
        }
        node
    }

    /// Joins the sets of `a` and `b`; false when they were one already.
    fn join(&mut self, a: usize, b: usize) -> bool {
        let (a, b) = (self.root(a), self.root(b));
        self.parent[a] = b;
        a != b
    }
}

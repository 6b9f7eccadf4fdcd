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
use super::placement::Placement;

/// The count of every edge and block of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    edges: Vec<i64>,
    blocks: Vec<u64>,
    entry_edge: usize,
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

/// What the solver knows of each node while it works.
struct Flow {
    /// Known inflow less known outflow.
    balance: Vec<i128>,
    /// Incident edges (self-loops left out) of unknown count.
    unknown: Vec<usize>,
    /// Incident edges (self-loops left out), by node.
    incident: Vec<Vec<usize>>,
}

/// Derives every count of `cfg` from `counted`, the counts of
/// `placement.counted()` in that order. Fails if the counts are not one
/// execution's: a derived count of an executed edge below zero, beyond
/// 2^63, flow not conserved, or counted edges that do not determine the
/// rest.
pub fn solve(cfg: &Cfg, placement: &Placement, counted: &[u64]) -> Result<Counts, Error> {
    let edges = cfg.edges();
    if counted.len() != placement.counted().len() {
        return Err(Error::CountNumber { expected: placement.counted().len(), given: counted.len() });
    }
    let mut known: Vec<Option<i128>> = vec![None; edges.len()];
    for (&edge, &count) in placement.counted().iter().zip(counted) {
        if edge >= edges.len() {
            return Err(Error::Unresolvable { unknown: edges.len() });
        }
        if count > i64::MAX as u64 {
            return Err(Error::Overflow { edge });
        }
        known[edge] = Some(i128::from(count));
    }
    let mut flow =
        Flow { balance: vec![0; cfg.node_count()], unknown: vec![0; cfg.node_count()], incident: vec![Vec::new(); cfg.node_count()] };
    for (id, edge) in edges.iter().enumerate() {
        let (from, to) = (cfg.node_index(edge.from), cfg.node_index(edge.to));
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
    propagate(cfg, &mut known, &mut flow)?;
    let left = known.iter().filter(|k| k.is_none()).count();
    if left > 0 {
        return Err(Error::Unresolvable { unknown: left });
    }
    counts(cfg, &known, &flow)
}

/// Resolves, while a node has exactly one edge of unknown count, that edge.
fn propagate(cfg: &Cfg, known: &mut [Option<i128>], flow: &mut Flow) -> Result<(), Error> {
    let edges = cfg.edges();
    let mut ready: Vec<usize> = (0..cfg.node_count()).filter(|&n| flow.unknown[n] == 1).collect();
    while let Some(node) = ready.pop() {
        if flow.unknown[node] != 1 {
            continue;
        }
        let Some(&id) = flow.incident[node].iter().find(|&&e| known[e].is_none()) else { continue };
        let edge = &edges[id];
        let (from, to) = (cfg.node_index(edge.from), cfg.node_index(edge.to));
        // Inflow equals outflow at `node`, the unknown edge included.
        let count = if to == node { -flow.balance[node] } else { flow.balance[node] };
        if count < 0 && !edge.kind.is_artificial() {
            return Err(Error::Negative { edge: id, count });
        }
        if count.unsigned_abs() > i64::MAX as u128 {
            return Err(Error::Overflow { edge: id });
        }
        known[id] = Some(count);
        flow.balance[to] += count;
        flow.balance[from] -= count;
        for end in [from, to] {
            flow.unknown[end] -= 1;
            if flow.unknown[end] == 1 {
                ready.push(end);
            }
        }
    }
    Ok(())
}

/// Checks conservation everywhere and sums each block's inflow.
fn counts(cfg: &Cfg, known: &[Option<i128>], flow: &Flow) -> Result<Counts, Error> {
    let edges = cfg.edges();
    let value = |id: usize| known[id].unwrap_or(0);
    for (node, ids) in flow.incident.iter().enumerate() {
        if flow.balance[node] != 0 {
            let inflow = ids.iter().filter(|&&e| cfg.node_index(edges[e].to) == node).map(|&e| value(e)).sum();
            let outflow = ids.iter().filter(|&&e| cfg.node_index(edges[e].from) == node).map(|&e| value(e)).sum();
            return Err(Error::Unbalanced { node, inflow, outflow });
        }
    }
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
    let edges_out = known.iter().map(|k| k.unwrap_or(0) as i64).collect();
    let entry_edge = edges.iter().position(|e| e.kind == EdgeKind::Entry).unwrap_or(0);
    Ok(Counts { edges: edges_out, blocks, entry_edge })
}

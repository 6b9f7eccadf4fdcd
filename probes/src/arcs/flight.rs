//! Frames in flight: counting that starts or ends while a thread is in the
//! middle of a function (attaching to a running program, detaching from
//! it). Counts then do not come from whole executions of the graph; two
//! kinds of frames make up the difference.
//!
//! A frame waiting in a call returns after the counting starts without
//! having run its call's block, or has run it and not returned when the
//! counting ends: the call's fake edge to EXIT takes the difference (its
//! count may be negative), so nothing is needed for it.
//!
//! A frame executing the function's own code, at `pc` in block `b`, is
//! modelled as appearing at the end of `b` when counting starts (it leaves
//! `b` by an edge, without having entered it) and as vanishing at the end
//! of `b` when counting ends (it entered `b`, and has not left). The
//! counters of `b`'s block and in-edge that its partial run passes or
//! misses, and of its out-edge, are corrected to fit that model, and the
//! lines of `b` from `pc` on are entered (at the start) or not (at the end)
//! one time more than the block's count says.

use super::Error;
use super::cfg::{Cfg, Node};
use super::counters::{CounterPlacement, Quantity, arc_of};
use super::graph::Graph;
use super::sites::{Place, Site};
use super::solve::Counts;

/// Where a thread was, in a function's code, when counting started or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The next instruction it would run (in original code).
    pub pc: u64,
    /// True: when counting started; false: when it ended.
    pub at_start: bool,
}

/// A frame of this function: its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) frame: Frame,
    pub(crate) block: usize,
}

/// Every edge and block count of `cfg` from `counted` (as
/// [`super::solve_counters`] takes them), counters patched at `sites`,
/// with `frames` of threads that were in the function's code when
/// counting started or ended. Frames elsewhere are left out; one at an
/// address inside an instruction of the function is an error.
pub fn solve_with_frames(
    cfg: &Cfg,
    placement: &CounterPlacement,
    sites: &[Site],
    counted: &[u64],
    frames: &[Frame],
) -> Result<Counts, Error> {
    let placed = place(cfg, frames)?;
    let mut values: Vec<i128> = counted.iter().map(|&c| i128::from(c)).collect();
    let blocks = cfg.blocks().len();
    let (entry, exit) = (2 * blocks, 2 * blocks + 1);
    let mut extra = Vec::with_capacity(placed.len());
    for p in &placed {
        for (site, counter) in sites.iter().filter(|s| s.block == p.block).flat_map(|s| s.counters.iter().map(move |c| (s, c))) {
            if counter.place != Place::Start {
                // The jump a frame in the block has yet to take counts as the frame goes.
                continue;
            }
            let entering = match counter.quantity {
                Quantity::Block(b) => b == p.block,
                Quantity::Edge(e) => cfg.edges().get(e).is_some_and(|e| e.to == Node::Block(p.block)),
            };
            let ahead = site.at >= p.frame.pc;
            let correction = match (p.frame.at_start, ahead, entering) {
                // It will pass the counter of a block it is not counted as entering.
                (true, true, true) => -1,
                // It will leave by the edge whose counter it is past.
                (true, false, false) => 1,
                // It entered the block, short of its counter.
                (false, true, true) => 1,
                // It passed the counter of an edge it has not taken.
                (false, false, false) => -1,
                _ => 0,
            };
            if let Some(value) = values.get_mut(counter.index) {
                *value += correction;
            }
        }
        let out = blocks + p.block;
        extra.push(if p.frame.at_start { (entry, out, 1) } else { (out, exit, 1) });
    }
    let corrected = values
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let edge = placement.counted().get(k).and_then(|&q| arc_of(cfg, q)).unwrap_or(k);
            u64::try_from(v).map_err(|_| Error::Negative { edge, count: v })
        })
        .collect::<Result<Vec<u64>, Error>>()?;
    let arcs: Vec<usize> = placement.counted().iter().map(|&q| arc_of(cfg, q).unwrap_or(usize::MAX)).collect();
    let solved = Graph::split(cfg).solve_with(&arcs, &corrected, &extra)?;
    let mut counts = Counts::new(cfg, &solved)?;
    counts.frames = placed;
    Ok(counts)
}

/// The frames in `cfg`'s code, with their blocks.
fn place(cfg: &Cfg, frames: &[Frame]) -> Result<Vec<Placed>, Error> {
    let mut placed = Vec::new();
    for &frame in frames {
        let after = cfg.blocks().partition_point(|b| b.start <= frame.pc);
        let Some(block) = after.checked_sub(1).filter(|&b| frame.pc < cfg.blocks()[b].end()) else { continue };
        if cfg.block_holding(frame.pc) != Some(block) {
            return Err(Error::FrameInsideInstruction { pc: frame.pc });
        }
        placed.push(Placed { frame, block });
    }
    Ok(placed)
}

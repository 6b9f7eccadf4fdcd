//! Where a region's hooks go in a function's code: a region is a set of
//! lines, timed like a function, entered when a frame moves onto one of
//! its lines from outside it and left when the frame moves off them or
//! returns (the meaning [`crate::lines`] gives it with probes). The frame's
//! line changes at the rows of the line table, so the hooks go at rows:
//! an entry where a row of the region follows one outside it, a leave where
//! a row outside it follows one of it, a leave before a return or a tail
//! call made from inside it, and an entry at the function's entry when the
//! frame starts on one of its lines.
//!
//! The line a frame starts a block on is the one it left its predecessor
//! on. When some paths arrive inside the region and others outside (a block
//! without rows between them passes either on), no hook at the block tells
//! whether the frame enters: such a function cannot be hooked.

use super::Error;
use super::cfg::{Cfg, Edge, EdgeKind, Node};
use super::sites::{FunctionCode, Place};
use iced_x86::FlowControl;

/// When a hook runs among those before the same instruction.
const ON_WAY_IN: u8 = 0;
const AT_ROW: u8 = 1;
const ON_WAY_OUT: u8 = 2;

/// How many blocks too short for a window a hook is passed back through.
const MOST_HOISTS: usize = 4;
use super::lines::{FunctionLines, NO_LINE, arrived_lines, arriving_lines, entry_line, rows_by_block};
use std::collections::BTreeSet;

/// One hook: where it runs, before which instruction, and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHook {
    /// The block.
    pub block: usize,
    /// The instruction of the block it runs before.
    pub index: usize,
    /// The region (an index into the caller's list).
    pub region: u32,
    /// A leave, else an entry.
    pub leave: bool,
    /// Where in its window's stub it runs: [`Place::Start`], before the
    /// instruction; [`Place::Taken`] or [`Place::NotTaken`], on that edge
    /// of the block's final `jcc` (`index`).
    pub place: Place,
}

/// The hooks of the regions `regions_of` gives for each line id of
/// `lines` (the regions holding it), in block and instruction order (hooks
/// before one instruction in the order they run). Fails where a frame may
/// arrive at a row both inside and outside a region, or where a leave
/// before a return would also run on another way out of its block.
pub fn region_hooks(cfg: &Cfg, code: &FunctionCode, lines: &FunctionLines, regions_of: &[Vec<u32>]) -> Result<Vec<RegionHook>, Error> {
    // Code inlined from another file runs inside the region whose line it
    // interrupts, as the line probes see it.
    let lines = &lines.without_elsewhere();
    let in_region = |line: u32, region: u32| line != NO_LINE && regions_of.get(line as usize).is_some_and(|r| r.contains(&region));
    let at_entry = entry_line(lines);
    let rows = rows_by_block(cfg, &lines.rows)?;
    let arriving = arriving_lines(cfg, &rows, at_entry);
    let mut touched: BTreeSet<u32> = BTreeSet::new();
    for line in rows.iter().flatten().flat_map(|(ls, _)| ls.iter()).chain([&at_entry]) {
        touched.extend(regions_of.get(*line as usize).into_iter().flatten());
    }
    let index_of = |block: usize, address: u64| cfg.blocks()[block].instructions.iter().position(|&a| a == address);
    // Each hook with when it runs among those before the same instruction:
    // those on the way in first (the entry's, an edge's at its target's
    // start), then a row's, then those on the way out of the block.
    let when_on = |edge: &Edge, hook: &RegionHook| if edge.to == Node::Block(hook.block) { ON_WAY_IN } else { ON_WAY_OUT };
    let mut hooks: Vec<(u8, RegionHook)> = Vec::new();
    for region in touched {
        let inside = |line: u32| in_region(line, region);
        let left_inside = |node| left_inside(&arriving, at_entry, &inside, node);
        // The hooks on the ways into `block` that arrive on the other side
        // of the region than its row at `address` (`now`: inside).
        let crossing = |block: usize, now: bool, address: u64| -> Result<Vec<(u8, RegionHook)>, Error> {
            let mut hooks = Vec::new();
            for edge in cfg.edges().iter().filter(|e| e.to == Node::Block(block) && e.kind != EdgeKind::Fake) {
                if left_inside(edge.from).ok_or(Error::RegionUndetermined { address })? != now {
                    let on = on_edge(cfg, code, edge, region, !now, &left_inside, 0).ok_or(Error::NoHookSite { address })?;
                    hooks.extend(on.into_iter().map(|h| (when_on(edge, &h), h)));
                }
            }
            Ok(hooks)
        };
        if inside(at_entry) {
            let block = cfg.entry_block();
            let also_entered =
                cfg.edges().iter().any(|e| e.to == Node::Block(block) && !matches!(e.kind, EdgeKind::Entry | EdgeKind::Fake));
            if also_entered {
                return Err(Error::RegionUndetermined { address: cfg.blocks()[block].start });
            }
            hooks.push((ON_WAY_IN, RegionHook { block, index: 0, region, leave: false, place: Place::Start }));
        }
        for (block, block_rows) in rows.iter().enumerate() {
            let arrived: BTreeSet<bool> = arrived_lines(cfg, &arriving, block).into_iter().map(inside).collect();
            if block_rows.is_empty() || arrived.is_empty() {
                // No row: no change of line. Not reached: never runs.
                continue;
            }
            let mut on = if arrived.len() == 1 { arrived.first().copied() } else { None };
            let mut first = true;
            for (row_lines, address) in block_rows {
                for &line in row_lines.iter() {
                    let now = inside(line);
                    match on {
                        Some(was) if was == now => {}
                        Some(_) => {
                            let index = index_of(block, *address).ok_or(Error::RowInsideInstruction { address: *address })?;
                            let no_window = code.window_from(block, index).is_none() && code.last_window(block).is_none();
                            if first && no_window {
                                // Too short for a window: on every way in (all
                                // arrive on the other side), a few instructions early.
                                hooks.extend(crossing(block, now, *address)?);
                            } else {
                                hooks.push((AT_ROW, RegionHook { block, index, region, leave: !now, place: Place::Start }));
                            }
                        }
                        // Arriving from both sides: on the edges that cross.
                        None => hooks.extend(crossing(block, now, *address)?),
                    }
                    on = Some(now);
                    first = false;
                }
            }
        }
        hooks.extend(exit_leaves(cfg, code, &rows, &arriving, region, at_entry, &inside)?.into_iter().map(|h| (ON_WAY_OUT, h)));
    }
    hooks.sort_by_key(|(order, h)| (h.block, h.index, *order));
    Ok(hooks.into_iter().map(|(_, h)| h).collect())
}

/// Whether frames leave `node` inside the region; `None`: on either side.
fn left_inside(arriving: &super::lines::Arriving, at_entry: u32, inside: &dyn Fn(u32) -> bool, node: Node) -> Option<bool> {
    let sides: BTreeSet<bool> = match node {
        Node::Block(b) => arriving.leaving.get(b)?.iter().map(|&l| inside(l)).collect(),
        Node::Entry => BTreeSet::from([inside(at_entry)]),
        Node::Exit => return None,
    };
    if sides.len() == 1 { sides.first().copied() } else { None }
}

/// The hooks on `edge` (a leave, else an entry), which only the frames that
/// take it run: at the start of its target if nothing else leads there, on
/// the taken or not-taken exit of its source's `jcc`, or at the end of its
/// source if that is its only way on (but not after a call: the frame is
/// still on the call's line while the callee runs). A source too short for
/// a window, wholly on the side the hook leaves, passes the hook on to the
/// ways into it (a few instructions early). `left_inside` tells on which
/// side of the region frames leave a node; `None`: both.
fn on_edge(
    cfg: &Cfg,
    code: &FunctionCode,
    edge: &Edge,
    region: u32,
    leave: bool,
    left_inside: &dyn Fn(Node) -> Option<bool>,
    depth: usize,
) -> Option<Vec<RegionHook>> {
    let real = |e: &&Edge| e.kind != EdgeKind::Fake;
    let Node::Block(to) = edge.to else { return None };
    let only_way_in = cfg.edges().iter().filter(real).filter(|e| e.to == edge.to).count() == 1;
    if only_way_in && code.first_window(to).is_some() {
        return Some(vec![RegionHook { block: to, index: 0, region, leave, place: Place::Start }]);
    }
    let Node::Block(from) = edge.from else { return None };
    let last = cfg.blocks()[from].instructions.len().checked_sub(1)?;
    let hook = |place| Some(vec![RegionHook { block: from, index: last, region, leave, place }]);
    let only_way_on = cfg.edges().iter().filter(real).filter(|e| e.from == edge.from).count() == 1;
    let after_call =
        code.instructions(from).last().is_some_and(|i| matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall));
    match edge.kind {
        EdgeKind::Taken { .. } => hook(Place::Taken),
        EdgeKind::NotTaken { .. } => hook(Place::NotTaken),
        EdgeKind::Jump { .. } | EdgeKind::FallThrough if only_way_on && !after_call => {
            if code.first_window(from).is_some() || depth >= MOST_HOISTS {
                return hook(Place::Start);
            }
            // Frames in `from` are on the side the hook leaves, if every
            // way in leaves them there: the hook goes on those ways.
            let mut hooks = Vec::new();
            for into in cfg.edges().iter().filter(real).filter(|e| e.to == edge.from) {
                if left_inside(into.from)? != leave {
                    return hook(Place::Start);
                }
                hooks.extend(on_edge(cfg, code, into, region, leave, left_inside, depth + 1)?);
            }
            Some(hooks)
        }
        _ if only_way_in => Some(vec![RegionHook { block: to, index: 0, region, leave, place: Place::Start }]),
        _ => None,
    }
}

/// The leaves before the returns and tail calls of blocks that end inside
/// `region`. A block too short for a window (`pop rbp; ret`), wholly in
/// the region, is left on each way into it from inside instead: a few
/// instructions early.
fn exit_leaves(
    cfg: &Cfg,
    code: &FunctionCode,
    rows: &super::lines::BlockRows<'_>,
    arriving: &super::lines::Arriving,
    region: u32,
    at_entry: u32,
    inside: &dyn Fn(u32) -> bool,
) -> Result<Vec<RegionHook>, Error> {
    let mut leaves = Vec::new();
    let exits: BTreeSet<usize> = cfg
        .edges()
        .iter()
        .filter(|e| e.to == Node::Exit && e.kind != EdgeKind::Fake)
        .filter_map(|e| if let Node::Block(b) = e.from { Some(b) } else { None })
        .collect();
    for block in exits {
        let Some(&last) = cfg.blocks()[block].instructions.last() else { continue };
        let ends_inside: BTreeSet<bool> = match rows[block].last().and_then(|(lines, _)| lines.last()) {
            Some(&line) => BTreeSet::from([inside(line)]),
            None => arrived_lines(cfg, arriving, block).into_iter().map(inside).collect(),
        };
        if !ends_inside.contains(&true) {
            continue;
        }
        let other_ways_out = cfg.edges().iter().any(|e| e.from == Node::Block(block) && e.to != Node::Exit && e.kind != EdgeKind::Fake);
        if other_ways_out {
            return Err(Error::RegionUndetermined { address: last });
        }
        let has_window = code.last_window(block).is_some();
        if ends_inside.len() == 1 && has_window {
            let index = cfg.blocks()[block].instructions.len() - 1;
            leaves.push(RegionHook { block, index, region, leave: true, place: Place::Start });
            continue;
        }
        // Left on the ways in from inside: the block is wholly inside, or
        // has no row and passes on the side each way in leaves it on.
        let rowless = rows[block].is_empty();
        if !rows[block].iter().flat_map(|(lines, _)| lines.iter()).all(|&l| inside(l)) {
            return Err(Error::NoHookSite { address: last });
        }
        let left_inside = |node| left_inside(arriving, at_entry, inside, node);
        for edge in cfg.edges().iter().filter(|e| e.to == Node::Block(block) && e.kind != EdgeKind::Fake) {
            match left_inside(edge.from) {
                Some(true) => {
                    leaves.extend(on_edge(cfg, code, edge, region, true, &left_inside, 0).ok_or(Error::NoHookSite { address: last })?)
                }
                Some(false) if rowless => {}
                Some(false) => return Err(Error::NoHookSite { address: last }),
                None => return Err(Error::RegionUndetermined { address: last }),
            }
        }
    }
    Ok(leaves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arcs::{CodeRange, add_region_hooks, stub_with_hooks};

    /// `test edi,edi; jne +5` (line 1), `mov eax,1` (line 2), `ret` (line 3).
    const IF_WITHOUT_ELSE: [u8; 10] = [0x85, 0xff, 0x75, 0x05, 0xb8, 0x01, 0, 0, 0, 0xc3];

    fn lines() -> FunctionLines {
        FunctionLines { entry_line: 1, rows: vec![(0x1000, vec![1]), (0x1004, vec![2]), (0x1009, vec![3])], ..FunctionLines::default() }
    }

    fn hooks_of(region_lines: &[u32]) -> (Cfg, FunctionCode, Result<Vec<RegionHook>, Error>) {
        let parts = [CodeRange { address: 0x1000, bytes: &IF_WITHOUT_ELSE }];
        let cfg = Cfg::build(&parts).unwrap();
        let code = FunctionCode::new(&cfg, &parts).unwrap();
        let regions_of: Vec<Vec<u32>> = (0..4).map(|l| if region_lines.contains(&l) { vec![0] } else { vec![] }).collect();
        let hooks = region_hooks(&cfg, &code, &lines(), &regions_of);
        (cfg, code, hooks)
    }

    #[test]
    fn a_region_in_one_arm_is_entered_at_its_row_and_left_on_the_edge_out_of_it() {
        let (cfg, code, hooks) = hooks_of(&[2]);
        let hooks = hooks.unwrap();
        let mov = cfg.block_holding(0x1004).unwrap();
        // The ret's block is reached from inside (the mov) and from outside
        // (the jne taken): the leave goes on the mov's way out.
        let enter = RegionHook { block: mov, index: 0, region: 0, leave: false, place: Place::Start };
        assert_eq!(hooks, [enter, RegionHook { leave: true, ..enter }]);
        let mut sites = Vec::new();
        add_region_hooks(&cfg, &code, &mut sites, &hooks).unwrap();
        assert_eq!(sites.len(), 1);
        assert_eq!((sites[0].at, &sites[0].hooks[..]), (0x1004, &[(0, false, Place::Start), (0, true, Place::Start)][..]));
        let stub = stub_with_hooks(&sites[0], 0x10_0000, &[], Some(0x10_0800)).unwrap();
        assert!(stub.code.len() > 40, "two hooks and the mov");
        assert!(stub_with_hooks(&sites[0], 0x10_0000, &[], None).is_err(), "no runtime to call");
    }

    #[test]
    fn a_region_the_entry_starts_in_is_entered_at_the_entry() {
        let (cfg, _, hooks) = hooks_of(&[1, 2]);
        let hooks = hooks.unwrap();
        let (test, mov) = (cfg.block_holding(0x1000).unwrap(), cfg.block_holding(0x1004).unwrap());
        assert_eq!(cfg.entry_block(), test);
        let places: Vec<(usize, usize, bool, Place)> = hooks.iter().map(|h| (h.block, h.index, h.leave, h.place)).collect();
        // Every way into the ret's block comes from inside, and the ret is
        // too short for a window: left on the ways into it.
        assert_eq!(places, [(test, 0, false, Place::Start), (test, 1, true, Place::Taken), (mov, 0, true, Place::Start)]);
    }

    #[test]
    fn a_return_too_short_for_a_window_is_left_on_the_ways_into_it() {
        // The ret's block is one byte: no jump fits, and it is entered from
        // outside the region, so the leave cannot go on the ways into it.
        let (_, _, hooks) = hooks_of(&[3]);
        assert_eq!(hooks, Err(Error::NoHookSite { address: 0x1009 }));
        // With the mov in the region too, the leave goes where the mov leads
        // to the ret, and where the jne does.
        let (cfg, code, hooks) = hooks_of(&[1, 2, 3]);
        let hooks = hooks.unwrap();
        let (test, mov) = (cfg.block_holding(0x1000).unwrap(), cfg.block_holding(0x1004).unwrap());
        let places: Vec<(usize, bool, Place)> = hooks.iter().map(|h| (h.block, h.leave, h.place)).collect();
        assert_eq!(places, [(test, false, Place::Start), (test, true, Place::Taken), (mov, true, Place::Start)]);
        let mut sites = Vec::new();
        // The entry's block (test, jne) is 4 bytes: nothing fits there.
        assert_eq!(add_region_hooks(&cfg, &code, &mut sites, &hooks), Err(Error::NoHookSite { address: 0x1000 }));
    }
}

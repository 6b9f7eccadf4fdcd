//! Where each counter goes in the code: a *window* of whole instructions
//! inside one block, 5 bytes or more, that a `jmp rel32` to a counting
//! stub replaces (see [`super::stub`]). Nothing jumps into a window but to
//! its start, as a block has no leader but its first instruction, and the
//! window's instructions run, moved, in the stub.
//!
//! - A counter at a window's start counts its block: every execution of the
//!   block runs each of its instructions once. The window is the block's
//!   first that fits, the block's start preferred.
//! - A call may end a window: the stub calls from the original return
//!   address, so a direct call's block (the `call rel32` alone is 5 bytes)
//!   always has a window.
//! - A window that ends with the block's `jcc` moves the jump into the
//!   stub, where each of its two exits can count before it goes on: such a
//!   window makes both edges of the `jcc` countable. (Retargeting a
//!   `jcc rel32` in place counts its taken edge as well; the window holding
//!   that 6-byte jump always fits, so it adds no countable edge.)
//!
//! Whether the CPU flags are live where a counter runs decides whether the
//! stub saves them: `lock inc` writes every status flag but CF.
//! [`FunctionCode`] computes the flags' liveness over the graph.

use super::Error;
use super::cfg::{Cfg, CodeRange, EdgeKind, Node, decode_at};
use super::counters::{Cost, CounterPlacement, Quantity, quantities};
use super::loops::Loops;
use crate::inject::patch::{JUMP_LEN, in_reach, is_emulated_call};
use iced_x86::{Code, FlowControl, Instruction, Mnemonic, OpKind, Register, RflagsBits};
use std::collections::BTreeMap;
use std::ops::Range;

/// The flags liveness follows: the status flags.
const STATUS: u32 = RflagsBits::OF | RflagsBits::SF | RflagsBits::ZF | RflagsBits::AF | RflagsBits::CF | RflagsBits::PF;

/// The flags `lock inc` writes: every status flag but CF.
pub const INC_WRITES: u32 = STATUS & !RflagsBits::CF;

/// Relative costs of counters, for [`counter_costs`]: a jump to a stub and
/// an increment; a jump more for an edge's counter after the moved
/// `jcc`; `pushfq` and `popfq` (slow: `popfq` serializes flags) where the
/// flags are live.
const BLOCK_COST: u32 = 2;
const EDGE_COST: u32 = 3;
const FLAGS_COST: u32 = 4;

/// A function's instructions per block, decoded once, its bytes, and the
/// flags live before each instruction.
#[derive(Clone, Debug)]
pub struct FunctionCode {
    instructions: Vec<Vec<Instruction>>,
    /// Per block and instruction, the status flags live before it; one
    /// more per block: those live at its end.
    live: Vec<Vec<u32>>,
    bytes: Vec<Vec<u8>>,
    /// Bytes no window may cover (another patch's).
    reserved: Vec<Range<u64>>,
    /// A call may return into a stub, which counts its return.
    calls_return_to_stubs: bool,
}

impl FunctionCode {
    /// Decodes the blocks of `cfg`, built from `parts`, and computes the
    /// flags' liveness. Fails only if `parts` are not the code `cfg` was
    /// built from.
    pub fn new(cfg: &Cfg, parts: &[CodeRange<'_>]) -> Result<FunctionCode, Error> {
        let mut instructions = Vec::with_capacity(cfg.blocks().len());
        let mut bytes = Vec::with_capacity(cfg.blocks().len());
        for block in cfg.blocks() {
            let decoded = block.instructions.iter().map(|&a| decode_at(parts, a)).collect::<Result<Vec<Instruction>, Error>>()?;
            let mut raw = Vec::with_capacity(block.len as usize);
            for instruction in &decoded {
                raw.extend_from_slice(
                    bytes_at(parts, instruction.ip(), instruction.len()).ok_or(Error::RunsOff { address: instruction.ip() })?,
                );
            }
            instructions.push(decoded);
            bytes.push(raw);
        }
        let mut code = FunctionCode { instructions, live: Vec::new(), bytes, reserved: Vec::new(), calls_return_to_stubs: false };
        code.live = code.liveness(cfg);
        Ok(code)
    }

    /// Keeps windows off the bytes `range` (where something else is
    /// patched in): an instruction with a byte there is not moved.
    pub fn reserve(&mut self, range: Range<u64>) {
        self.reserved.push(range);
    }

    /// Lets a call return into a stub, so that the edge after it can be
    /// counted there: only for programs that never unwind their stack
    /// through it (C++ exceptions, `backtrace()`), since a stub has no
    /// unwind information; proftap's own sampler maps it back.
    pub fn let_calls_return_to_stubs(&mut self) {
        self.calls_return_to_stubs = true;
    }

    /// Whether the edge `edge` is the return of a call that ends its block,
    /// countable in a stub.
    fn is_counted_return(&self, edge: &super::Edge) -> bool {
        let Node::Block(b) = edge.from else { return false };
        self.calls_return_to_stubs && edge.kind == EdgeKind::FallThrough && self.instructions(b).last().is_some_and(is_emulated_call)
    }

    /// Whether `instruction` may be moved into a stub.
    fn may_move(&self, instruction: &Instruction) -> bool {
        let bytes = instruction.ip()..instruction.next_ip();
        movable(instruction) && !self.reserved.iter().any(|r| r.start < bytes.end && bytes.start < r.end)
    }

    /// Block `block`'s instructions.
    pub fn instructions(&self, block: usize) -> &[Instruction] {
        self.instructions.get(block).map_or(&[][..], Vec::as_slice)
    }

    /// The status flags ([`RflagsBits`]) live before instruction `index`
    /// of block `block` (`index` = its instruction count: at its end).
    pub fn live_flags(&self, block: usize, index: usize) -> u32 {
        self.live.get(block).and_then(|l| l.get(index)).copied().unwrap_or(STATUS)
    }

    /// The status flags live where `node` starts (none at EXIT: no flag
    /// is returned or passed to a tail-called function).
    pub fn live_at(&self, node: Node) -> u32 {
        match node {
            Node::Block(b) => self.live_flags(b, 0),
            Node::Exit => 0,
            Node::Entry => STATUS,
        }
    }

    /// The first window of block `block` that holds a 5-byte jump: whole
    /// instructions, all movable, by index.
    pub fn first_window(&self, block: usize) -> Option<Range<usize>> {
        self.window_from(block, 0)
    }

    /// The first window of block `block` that starts at instruction `from`
    /// or after it.
    pub fn window_from(&self, block: usize, from: usize) -> Option<Range<usize>> {
        let instructions = self.instructions(block);
        (from..instructions.len()).find_map(|start| {
            let mut len = 0;
            for (i, instruction) in instructions.iter().enumerate().skip(start) {
                if !self.may_move(instruction) {
                    return None;
                }
                len += instruction.len();
                if len >= JUMP_LEN {
                    return Some(start..i + 1);
                }
            }
            None
        })
    }

    /// The shortest window that ends with block `block`'s last instruction.
    pub fn last_window(&self, block: usize) -> Option<Range<usize>> {
        let instructions = self.instructions(block);
        let mut len = 0;
        for (i, instruction) in instructions.iter().enumerate().rev() {
            if !self.may_move(instruction) {
                return None;
            }
            len += instruction.len();
            if len >= JUMP_LEN {
                return Some(i..instructions.len());
            }
        }
        None
    }

    /// Backward liveness of the status flags, to a fixed point: each pass
    /// is linear in the code, and another one runs only when a flag became
    /// live somewhere (which it does once at most per instruction).
    fn liveness(&self, cfg: &Cfg) -> Vec<Vec<u32>> {
        let mut live: Vec<Vec<u32>> = self.instructions.iter().map(|i| vec![0; i.len() + 1]).collect();
        let successors = successors(cfg);
        let mut changed = true;
        while changed {
            changed = false;
            for b in (0..live.len()).rev() {
                let out = successors[b].iter().fold(0, |flags, &s| flags | live[s][0]);
                let mut now = out;
                let mut block = vec![0; live[b].len()];
                block[self.instructions[b].len()] = out;
                for (i, instruction) in self.instructions[b].iter().enumerate().rev() {
                    now = transfer(instruction, now);
                    block[i] = now;
                }
                if block != live[b] {
                    live[b] = block;
                    changed = true;
                }
            }
        }
        live
    }
}

/// The bytes of the instruction at `address`, `len` long, inside one part.
fn bytes_at<'a>(parts: &[CodeRange<'a>], address: u64, len: usize) -> Option<&'a [u8]> {
    let part = parts.iter().find(|p| address >= p.address && address - p.address < p.bytes.len() as u64)?;
    let offset = (address - part.address) as usize;
    part.bytes.get(offset..offset + len)
}

/// Each block's successor blocks, for liveness: the flags live at a
/// block's end are those its successors need. A return or a tail call
/// needs none (the ABI keeps no status flag across them); a fake edge is
/// no path.
fn successors(cfg: &Cfg) -> Vec<Vec<usize>> {
    let mut successors = vec![Vec::new(); cfg.blocks().len()];
    for edge in cfg.edges().iter().filter(|e| e.kind != EdgeKind::Fake) {
        if let (Node::Block(from), Node::Block(to)) = (edge.from, edge.to) {
            successors[from].push(to);
        }
    }
    successors
}

/// The flags live before `instruction` given those live after it.
fn transfer(instruction: &Instruction, after: u32) -> u32 {
    match instruction.flow_control() {
        FlowControl::Return => 0,
        // A call's callee may change every status flag and reads none.
        FlowControl::Call | FlowControl::IndirectCall if instruction.mnemonic() == Mnemonic::Call => 0,
        // A system call, a trap, anything else: whatever runs there might
        // look at them.
        FlowControl::Call | FlowControl::IndirectCall | FlowControl::Interrupt | FlowControl::Exception => STATUS,
        FlowControl::XbeginXabortXend => STATUS,
        _ => {
            let kill = if keeps_flags_maybe(instruction) { 0 } else { instruction.rflags_modified() };
            ((after & !kill) | instruction.rflags_read()) & STATUS
        }
    }
}

/// A shift or rotate whose count may be 0 (by `cl`, or an immediate 0):
/// it then leaves the flags as they were, so it does not kill them.
fn keeps_flags_maybe(instruction: &Instruction) -> bool {
    use Mnemonic::*;
    if !matches!(instruction.mnemonic(), Shl | Sal | Shr | Sar | Rol | Ror | Rcl | Rcr | Shld | Shrd) {
        return false;
    }
    let count = instruction.op_count().saturating_sub(1);
    match instruction.op_kind(count) {
        OpKind::Immediate8 => instruction.immediate8() & 0x3f == 0,
        OpKind::Register => instruction.op_register(count) == Register::CL,
        _ => false,
    }
}

/// Whether an instruction of a block can be moved into a stub: anything
/// the block encoder relocates that does not trap, and a call (direct, or
/// through a register or memory not read through rsp), which the stub
/// makes with the original return address (see
/// [`super::stub`]). A branch, call or `ret` is a block's last.
fn movable(instruction: &Instruction) -> bool {
    match instruction.flow_control() {
        // An indirect branch must still find `endbr64` where it lands.
        FlowControl::Next => !matches!(instruction.code(), Code::Hlt | Code::Endbr64 | Code::Endbr32),
        FlowControl::Call | FlowControl::IndirectCall => is_emulated_call(instruction),
        FlowControl::ConditionalBranch => instruction.is_jcc_short_or_near(),
        FlowControl::UnconditionalBranch => instruction.is_jmp_short_or_near(),
        FlowControl::Return => instruction.code() == Code::Retnq,
        // `jmp [rip+x]`, a tail call through the GOT: the only indirect
        // jump a graph has.
        FlowControl::IndirectBranch => instruction.is_ip_rel_memory_operand(),
        _ => false,
    }
}

/// Whether an indirect call's target is read through rsp, which the
/// return address pushed before the jump would move.
/// What counting quantity `quantity` costs in `code` (see [`Cost`]): a
/// block, where a window fits in it; a `jcc`'s edge, where a window ends
/// with the `jcc`; nothing else (an edge that is its block's only way out
/// has its block's count, which is counted instead).
pub fn cost(cfg: &Cfg, code: &FunctionCode, quantity: Quantity) -> Cost {
    let flags = |live: u32| if live & INC_WRITES != 0 { FLAGS_COST } else { 0 };
    match quantity {
        Quantity::Block(b) => match code.first_window(b) {
            Some(window) => Cost::Counter(BLOCK_COST + flags(code.live_flags(b, window.start))),
            None => Cost::NoCounter,
        },
        Quantity::Edge(e) => {
            let Some(edge) = cfg.edges().get(e) else { return Cost::NoCounter };
            let jcc = matches!(edge.kind, EdgeKind::Taken { .. } | EdgeKind::NotTaken { .. });
            let after_call = code.is_counted_return(edge);
            match edge.from {
                Node::Block(b) if (jcc || after_call) && code.last_window(b).is_some() => {
                    Cost::Counter(EDGE_COST + flags(code.live_at(edge.to)))
                }
                _ => Cost::NoCounter,
            }
        }
    }
}

/// The cost of every quantity of `cfg`, indexed as [`quantities`] lists
/// them, for [`super::place_counters`]: what a counter costs each time it
/// runs, times how often it is likely to run (see [`super::loops`]).
pub fn counter_costs(cfg: &Cfg, code: &FunctionCode) -> Vec<Cost> {
    let loops = Loops::of(cfg);
    quantities(cfg)
        .into_iter()
        .map(|q| match cost(cfg, code, q) {
            // A counter's cost is paid each time it runs.
            Cost::Counter(each) => Cost::Counter(each.saturating_mul(loops.weight(cfg, q))),
            Cost::NoCounter => Cost::NoCounter,
        })
        .collect()
}

/// Where in its window's stub a counter runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Before the moved instructions: it counts the block.
    Start,
    /// Where the moved `jcc` jumps: it counts the taken edge.
    Taken,
    /// After the moved `jcc`, when it does not jump.
    NotTaken,
    /// After the moved call, when it returns (the callee returns into the
    /// stub: see [`FunctionCode::let_calls_return_to_stubs`]).
    AfterCall,
}

/// One counter of a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteCounter {
    /// What it counts.
    pub quantity: Quantity,
    /// Its position in [`CounterPlacement::counted`]: which counter.
    pub index: usize,
    /// Where it runs.
    pub place: Place,
    /// Whether flags that `lock inc` writes are live there: the stub then
    /// saves them around the increment.
    pub flags_live: bool,
    /// Whether the increment is atomic (`lock`): other threads, or other
    /// processes sharing the counters, may count at the same time. Planned
    /// so; without it, a `nop` goes before the increment, where the prefix
    /// is written if a second thread may start (as in a `--coverage` build
    /// without `-pthread`, one thread loses no increment: a signal handler
    /// interrupts it only between instructions).
    pub atomic: bool,
}

/// A patch site: a window of whole instructions inside one block, and the
/// counters its stub runs.
#[derive(Clone, Debug)]
pub struct Site {
    /// The block.
    pub block: usize,
    /// The window's first byte, where the jump goes.
    pub at: u64,
    /// The instructions the jump replaces, at their original addresses.
    pub replaced: Vec<Instruction>,
    /// Their bytes (to restore them).
    pub original: Vec<u8>,
    /// Its counters.
    pub counters: Vec<SiteCounter>,
    /// Its region hooks, `(region, leave, where)`: each runs after the
    /// counters of its place, in order.
    pub hooks: Vec<(u32, bool, Place)>,
}

impl Site {
    /// The window's size in bytes (5 or more).
    pub fn len(&self) -> usize {
        self.original.len()
    }

    /// Whether it covers nothing (never, for a site that was planned).
    pub fn is_empty(&self) -> bool {
        self.original.is_empty()
    }

    /// The address just past the window.
    pub fn end(&self) -> u64 {
        self.at + self.len() as u64
    }

    /// The bytes written over the window: `jmp stub`, then `int3` up to
    /// its end. Fails when `stub` is out of a rel32's reach.
    pub fn jump_to(&self, stub: u64) -> Result<Vec<u8>, Error> {
        let next = self.at + JUMP_LEN as u64;
        if self.len() < JUMP_LEN || !in_reach(next, stub) {
            return Err(Error::Stub { at: self.at, reason: format!("the stub at {stub:#x} is out of reach of a 5-byte jump") });
        }
        let mut bytes = vec![0xe9];
        bytes.extend_from_slice(&(stub.wrapping_sub(next) as i64 as i32).to_le_bytes());
        bytes.resize(self.len(), 0xcc);
        Ok(bytes)
    }
}

/// The block that counts `quantity`, and where in its window.
fn counted_at(cfg: &Cfg, code: &FunctionCode, quantity: Quantity) -> Result<(usize, Place), Error> {
    let none = Error::NoSite { quantity };
    match quantity {
        Quantity::Block(b) if b < cfg.blocks().len() => Ok((b, Place::Start)),
        Quantity::Block(_) => Err(none),
        Quantity::Edge(e) => {
            let Some(edge) = cfg.edges().get(e) else { return Err(none) };
            let Node::Block(b) = edge.from else { return Err(none) };
            match edge.kind {
                EdgeKind::Taken { .. } => Ok((b, Place::Taken)),
                EdgeKind::NotTaken { .. } => Ok((b, Place::NotTaken)),
                _ if code.is_counted_return(edge) => Ok((b, Place::AfterCall)),
                // The block's only way out runs as often as the block.
                _ if cfg.edges().iter().filter(|o| o.from == edge.from).count() == 1 => Ok((b, Place::Start)),
                _ => Err(none),
            }
        }
    }
}

/// The patch sites of `placement`'s counters in `code`, by block: every
/// counted quantity but those of [`CounterPlacement::needs_probe`]. Fails,
/// naming the quantity, when one has no window.
pub fn plan_sites(cfg: &Cfg, code: &FunctionCode, placement: &CounterPlacement) -> Result<Vec<Site>, Error> {
    let mut by_block: BTreeMap<usize, Vec<(Quantity, usize, Place)>> = BTreeMap::new();
    for (index, &quantity) in placement.counted().iter().enumerate() {
        if placement.needs_probe().contains(&quantity) {
            continue;
        }
        let (block, place) = counted_at(cfg, code, quantity)?;
        by_block.entry(block).or_default().push((quantity, index, place));
    }
    by_block.into_iter().map(|(block, counters)| site(cfg, code, block, &counters)).collect()
}

/// The site of block `block` for `counters` (at least one).
fn site(cfg: &Cfg, code: &FunctionCode, block: usize, counters: &[(Quantity, usize, Place)]) -> Result<Site, Error> {
    let first = counters.first().map_or(Quantity::Block(block), |c| c.0);
    let at_jcc = counters.iter().any(|c| c.2 != Place::Start);
    let window = if at_jcc { code.last_window(block) } else { code.first_window(block) };
    let window = window.ok_or(Error::NoSite { quantity: first })?;
    let mut site = window_site(cfg, code, block, window.clone()).ok_or(Error::NoSite { quantity: first })?;
    let live = |&(quantity, _, place): &(Quantity, usize, Place)| match (place, quantity) {
        (Place::Start, _) => code.live_flags(block, window.start),
        (_, Quantity::Edge(e)) => cfg.edges().get(e).map_or(STATUS, |edge| code.live_at(edge.to)),
        (_, Quantity::Block(_)) => STATUS,
    };
    site.counters = counters
        .iter()
        .map(|c| SiteCounter { quantity: c.0, index: c.1, place: c.2, flags_live: live(c) & INC_WRITES != 0, atomic: true })
        .collect();
    Ok(site)
}

/// A site over instructions `window` of block `block`, with nothing in it
/// yet; `None` if `code` was not made from `cfg`.
fn window_site(cfg: &Cfg, code: &FunctionCode, block: usize, window: Range<usize>) -> Option<Site> {
    let instructions = code.instructions(block).get(window)?;
    let start = instructions.first()?.ip();
    let offset = start.checked_sub(cfg.blocks().get(block)?.start)? as usize;
    let len: usize = instructions.iter().map(Instruction::len).sum();
    Some(Site {
        block,
        at: start,
        replaced: instructions.to_vec(),
        original: code.bytes.get(block)?.get(offset..offset + len)?.to_vec(),
        counters: Vec::new(),
        hooks: Vec::new(),
    })
}

/// Adds region `hooks` (in block and instruction order) to `sites`. One
/// before an instruction runs at the start of a window: the one holding
/// the instruction, else the first after it in its block, else the one
/// ending its block, else the block's last before it; in a block too short
/// for any, entered only from a call, as the callee returns into the
/// call's stub. One on a `jcc`'s edge runs on that exit of the window
/// ending with the `jcc` (a site of the block's counters there moves to
/// it). A hook may run a few straight-line instructions early or late,
/// never out of order with the other hooks of its block, and never on
/// another path. Fails, naming the place, where no window can take a hook.
pub fn add_region_hooks(cfg: &Cfg, code: &FunctionCode, sites: &mut Vec<Site>, hooks: &[super::RegionHook]) -> Result<(), Error> {
    let mut last_start: Option<(usize, u64)> = None;
    for hook in hooks {
        let instructions = code.instructions(hook.block);
        let address = instructions.get(hook.index).map(Instruction::ip).ok_or(Error::NoHookSite { address: 0 })?;
        let no_site = Error::NoHookSite { address };
        let mut place = hook.place;
        let mut block = hook.block;
        let chosen = if place == Place::Start {
            hook_window(cfg, code, sites, block, hook.index).or_else(|| {
                // A block too short for a window, entered only from a call's
                // return: the hook runs as the callee returns into a stub.
                let caller = (hook.index == 0).then(|| returned_into(cfg, code, block)).flatten()?;
                (place, block) = (Place::AfterCall, caller);
                last_window_site(cfg, code, sites, caller)
            })
        } else {
            last_window_site(cfg, code, sites, block)
        };
        let chosen = chosen.ok_or(no_site.clone())?;
        let at = match chosen {
            Chosen::Existing(i) => sites[i].at,
            Chosen::New(ref site) | Chosen::Replace(_, ref site) => site.at,
        };
        if place == Place::Start {
            if last_start.is_some_and(|(b, start)| b == block && start > at) {
                return Err(no_site);
            }
            last_start = Some((block, at));
        }
        let i = match chosen {
            Chosen::Existing(i) => i,
            Chosen::New(site) => {
                sites.push(site);
                sites.len() - 1
            }
            Chosen::Replace(i, site) => {
                sites[i] = site;
                i
            }
        };
        sites[i].hooks.push((hook.region, hook.leave, place));
    }
    sites.sort_by_key(|s| s.at);
    Ok(())
}

/// The block whose call returns into `block`, its only way in, when calls
/// may return into stubs.
fn returned_into(cfg: &Cfg, code: &FunctionCode, block: usize) -> Option<usize> {
    let mut into = cfg.edges().iter().filter(|e| e.to == Node::Block(block) && e.kind != EdgeKind::Fake);
    let (Some(edge), None) = (into.next(), into.next()) else { return None };
    code.is_counted_return(edge).then_some(()).and(match edge.from {
        Node::Block(caller) => Some(caller),
        _ => None,
    })
}

/// The window that ends block `block` (its `jcc`, or its call), for a hook
/// on one of its edges: the site there already, or a new one where no
/// other is.
fn last_window_site(cfg: &Cfg, code: &FunctionCode, sites: &[Site], block: usize) -> Option<Chosen> {
    let last = code.last_window(block)?;
    let instructions = code.instructions(block);
    let bytes = instructions[last.start].ip()..instructions[last.end - 1].next_ip();
    if let Some(i) = sites.iter().position(|s| s.block == block && s.at == bytes.start && s.end() == bytes.end) {
        return Some(Chosen::Existing(i));
    }
    let mut overlapping = sites.iter().enumerate().filter(|(_, s)| s.block == block && s.at < bytes.end && bytes.start < s.end());
    match (overlapping.next(), overlapping.next()) {
        (None, _) => window_site(cfg, code, block, last).map(Chosen::New),
        // Counters of the block run anywhere in it: their site moves to
        // the last window, which then takes the hook too.
        (Some((i, site)), None) if site.hooks.is_empty() && site.counters.iter().all(|c| c.place == Place::Start) => {
            let mut moved = window_site(cfg, code, block, last.clone())?;
            let flags_live = code.live_flags(block, last.start) & INC_WRITES != 0;
            moved.counters = site.counters.iter().map(|c| SiteCounter { flags_live, ..*c }).collect();
            Some(Chosen::Replace(i, moved))
        }
        _ => None,
    }
}

/// A window for a hook: a site's already, a new one, or a new one in
/// place of a site.
enum Chosen {
    Existing(usize),
    New(Site),
    Replace(usize, Site),
}

/// The window that takes a hook before instruction `index` of `block`.
fn hook_window(cfg: &Cfg, code: &FunctionCode, sites: &[Site], block: usize, index: usize) -> Option<Chosen> {
    let instructions = code.instructions(block);
    let address = instructions.get(index)?.ip();
    let range_of = |site: &Site| site.at..site.end();
    let holding = sites.iter().position(|s| s.block == block && range_of(s).contains(&address));
    if let Some(i) = holding {
        return Some(Chosen::Existing(i));
    }
    let overlaps = |window: &Range<usize>| {
        let bytes = instructions[window.start].ip()..instructions[window.end - 1].next_ip();
        sites.iter().any(|s| s.block == block && s.at < bytes.end && bytes.start < s.end())
    };
    // The first site of the block after the hook's place.
    let next_site = sites.iter().enumerate().filter(|(_, s)| s.block == block && s.at > address).min_by_key(|(_, s)| s.at);
    if let Some(window) = code.window_from(block, index) {
        let start = instructions[window.start].ip();
        match next_site {
            Some((i, s)) if s.at <= start => return Some(Chosen::Existing(i)),
            _ if !overlaps(&window) => return window_site(cfg, code, block, window).map(Chosen::New),
            _ => {}
        }
    }
    if let Some((i, _)) = next_site {
        return Some(Chosen::Existing(i));
    }
    if let Some(last) = code.last_window(block).filter(|last| !overlaps(last)) {
        return window_site(cfg, code, block, last).map(Chosen::New);
    }
    // The block's last site before the place: a few straight-line
    // instructions early.
    let previous = sites.iter().enumerate().filter(|(_, s)| s.block == block && s.at < address).max_by_key(|(_, s)| s.at);
    previous.map(|(i, _)| Chosen::Existing(i))
}

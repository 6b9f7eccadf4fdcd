//! A function's control-flow graph, read from its machine code.
//!
//! Instructions are decoded from the entry along every path the code itself
//! names (fall-throughs and direct branches), so padding after the last
//! `ret` and bytes no path reaches never become blocks. A block ends at a
//! branch, a `ret`, a trap, and after every call: a call may not return
//! (`exit`, `longjmp`, an exception), so the block after it may run fewer
//! times than the call. Each such block gets a *fake* edge to EXIT that no
//! counter is ever put on; its derived count is how often the call did not
//! return (minus how often it returned twice, as `setjmp` does).

use super::Error;
use super::tables::{self, Data};
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};
use std::collections::{BTreeMap, BTreeSet};

/// One contiguous piece of a function's code: the whole function, or one of
/// the parts a compiler split it into (`f` and `f.cold`).
#[derive(Clone, Copy, Debug)]
pub struct CodeRange<'a> {
    /// The address of its first byte.
    pub address: u64,
    /// Its bytes (the symbol's size of them).
    pub bytes: &'a [u8],
}

impl CodeRange<'_> {
    fn contains(&self, address: u64) -> bool {
        address >= self.address && address - self.address < self.bytes.len() as u64
    }
}

/// A node of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// Where calls of the function come from.
    Entry,
    /// Where it goes when it returns, tail-jumps out, or stops in a call
    /// that does not return.
    Exit,
    /// A basic block, by its index in [`Cfg::blocks`].
    Block(usize),
}

/// What an edge stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeKind {
    /// From ENTRY to the entry block: the function's calls.
    Entry,
    /// Into the next block without a branch (after a call, or into a
    /// block that starts where a branch lands).
    FallThrough,
    /// The conditional jump at `jcc` taken.
    Taken {
        /// The jump's address.
        jcc: u64,
    },
    /// The conditional jump at `jcc` not taken.
    NotTaken {
        /// The jump's address.
        jcc: u64,
    },
    /// An unconditional jump inside the function, at `at`.
    Jump {
        /// The jump's address.
        at: u64,
    },
    /// A jump out of the function (a tail call), at `at`, to EXIT.
    TailJump {
        /// The jump's address.
        at: u64,
    },
    /// The `ret` at `at`, to EXIT.
    Return {
        /// The return's address.
        at: u64,
    },
    /// From a dispatch hub to one of the targets its jumps share (see
    /// [`Cfg::build_reading`]).
    Dispatch,
    /// From a block ending in a call or a trap to EXIT: the times it did
    /// not go on. Never counted: it has no code to put a counter on.
    Fake,
    /// From EXIT back to ENTRY, closing the flow so that the entry count
    /// is derived like any other. Never counted.
    Virtual,
}

impl EdgeKind {
    /// Whether the edge is no path of the code (fake or virtual): it always
    /// goes on the spanning tree and never holds a counter.
    pub fn is_artificial(self) -> bool {
        matches!(self, EdgeKind::Fake | EdgeKind::Virtual)
    }
}

/// A directed edge of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Where it starts.
    pub from: Node,
    /// Where it ends.
    pub to: Node,
    /// What it stands for.
    pub kind: EdgeKind,
}

/// A basic block: instructions that run one after the other, entered only
/// at the first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The address of its first instruction.
    pub start: u64,
    /// Its size in bytes.
    pub len: u64,
    /// The addresses of its instructions, in order.
    pub instructions: Vec<u64>,
}

impl Block {
    /// The address just past its last instruction.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// A conditional jump and its two edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Branch {
    /// The jump's address.
    pub jcc: u64,
    /// The edge taken when it jumps.
    pub taken: usize,
    /// The edge taken when it does not.
    pub not_taken: usize,
}

/// A function's control-flow graph: its reachable blocks, ENTRY and EXIT,
/// and the edges between them (parallel edges kept: a `jcc` to the next
/// instruction has two).
#[derive(Clone, Debug)]
pub struct Cfg {
    blocks: Vec<Block>,
    edges: Vec<Edge>,
    /// The block at the function's entry (not the first by address when a
    /// `.cold` part lies below it).
    entry: usize,
}

/// How an instruction passes control on, as far as the graph cares.
enum Flow {
    /// To the next instruction only.
    Next,
    /// To the next instruction or to a target (`jcc`).
    Conditional(u64),
    /// To a target only (`jmp rel`).
    Jump(u64),
    /// Out of the function through memory it cannot change (`jmp [rip+x]`:
    /// a tail call through the GOT).
    IndirectTail,
    /// Out by `ret`.
    Return,
    /// Into a call, then maybe to the next instruction.
    Call,
    /// Nowhere: the process stops or traps (`ud2`, `int3`, `hlt`).
    Trap,
}

/// Names an instruction for a message: its opcode form and, when it uses
/// memory, its base and index (`Jmp_rm64 [RAX+RDI*8]`).
fn disassemble(instruction: &Instruction) -> String {
    let mut text = format!("{:?}", instruction.code());
    if instruction.op0_kind() == OpKind::Memory {
        text += &format!(" [{:?}", instruction.memory_base());
        if instruction.memory_index() != Register::None {
            text += &format!("+{:?}*{}", instruction.memory_index(), instruction.memory_index_scale());
        }
        text += "]";
    } else if instruction.op0_kind() == OpKind::Register {
        text += &format!(" {:?}", instruction.op0_register());
    }
    text
}

fn flow(instruction: &Instruction) -> Result<Flow, Error> {
    Ok(match instruction.flow_control() {
        FlowControl::Next if instruction.code() == Code::Hlt => Flow::Trap,
        FlowControl::Next => Flow::Next,
        FlowControl::ConditionalBranch => Flow::Conditional(instruction.near_branch_target()),
        FlowControl::UnconditionalBranch if instruction.is_jmp_short_or_near() => Flow::Jump(instruction.near_branch_target()),
        FlowControl::IndirectBranch if is_memory_constant(instruction) => Flow::IndirectTail,
        FlowControl::Return => Flow::Return,
        FlowControl::Call | FlowControl::IndirectCall => Flow::Call,
        FlowControl::Interrupt if instruction.code() != Code::Int3 => Flow::Call,
        FlowControl::Interrupt | FlowControl::Exception => Flow::Trap,
        // A far jump, `jmp reg`, `jmp [table + reg*8]`: a jump table or a
        // computed target (possibly a tail call through a pointer, which the
        // code alone does not tell from a table).
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
            return Err(Error::IndirectJump { address: instruction.ip(), instruction: disassemble(instruction) });
        }
        FlowControl::XbeginXabortXend => {
            return Err(Error::Unsupported { address: instruction.ip(), instruction: disassemble(instruction) });
        }
    })
}

/// Whether an indirect jump reads its target from a fixed place
/// (`jmp [rip+disp]`, as a tail call through the GOT does), not from a
/// table indexed by a register.
fn is_memory_constant(instruction: &Instruction) -> bool {
    instruction.op0_kind() == OpKind::Memory
        && instruction.memory_base() == Register::RIP
        && instruction.memory_index() == Register::None
        && !instruction.has_segment_prefix()
}

/// The instructions reached from the entry, by address, the leaders
/// (addresses that start a block), and where each indirect jump through a
/// jump table goes.
struct Reached {
    instructions: BTreeMap<u64, Instruction>,
    leaders: BTreeSet<u64>,
    tables: BTreeMap<u64, BTreeSet<u64>>,
}

pub(super) fn decode_at(parts: &[CodeRange<'_>], address: u64) -> Result<Instruction, Error> {
    let part = parts.iter().find(|p| p.contains(address)).ok_or(Error::RunsOff { address })?;
    let offset = (address - part.address) as usize;
    let mut decoder = Decoder::with_ip(64, &part.bytes[offset..], address, DecoderOptions::NONE);
    let instruction = decoder.decode();
    if instruction.is_invalid() {
        return Err(Error::Undecodable { address });
    }
    Ok(instruction)
}

/// Decodes every instruction a path from the entry reaches. Each address
/// is decoded once, so the work is bounded by the code's size. With
/// `data`, indirect jumps go where their jump tables say (see
/// [`tables`]): read once the direct paths are all decoded, and again
/// while the targets lead to more code.
fn reach(parts: &[CodeRange<'_>], data: Option<&Data<'_>>) -> Result<Reached, Error> {
    let inside = |address: u64| parts.iter().any(|p| p.contains(address));
    let entry = parts.first().ok_or(Error::NoCode)?.address;
    let mut reached = Reached { instructions: BTreeMap::new(), leaders: BTreeSet::from([entry]), tables: BTreeMap::new() };
    let mut pending = vec![entry];
    let mut indirect: BTreeMap<u64, Error> = BTreeMap::new();
    loop {
        decode_paths(parts, &mut reached, &mut pending, &mut indirect)?;
        let (Some(data), Some((_, first))) = (data, indirect.first_key_value()) else { break };
        let found = tables::targets(&reached.instructions, &indirect.keys().copied().collect(), data, &inside);
        if let Some((_, _)) = found.iter().find(|(_, targets)| targets.is_empty()) {
            return Err(first.clone());
        }
        for target in found.values().flatten() {
            reached.leaders.insert(*target);
            if !reached.instructions.contains_key(target) {
                pending.push(*target);
            }
        }
        reached.tables = found;
        if pending.is_empty() {
            break;
        }
    }
    if let (None, Some((_, e))) = (data, indirect.first_key_value()) {
        return Err(e.clone());
    }
    check_boundaries(&reached)?;
    Ok(reached)
}

/// Decodes along the direct paths from `pending`; indirect jumps that are
/// not tail calls go to `indirect`, with the error they are without a table.
fn decode_paths(
    parts: &[CodeRange<'_>],
    reached: &mut Reached,
    pending: &mut Vec<u64>,
    indirect: &mut BTreeMap<u64, Error>,
) -> Result<(), Error> {
    let inside = |address: u64| parts.iter().any(|p| p.contains(address));
    while let Some(address) = pending.pop() {
        if reached.instructions.contains_key(&address) {
            continue;
        }
        let instruction = decode_at(parts, address)?;
        let next = instruction.next_ip();
        let runs_off = Error::RunsOff { address };
        let flow = match flow(&instruction) {
            Err(e @ Error::IndirectJump { .. }) => {
                indirect.insert(address, e);
                reached.instructions.insert(address, instruction);
                continue;
            }
            other => other?,
        };
        match flow {
            Flow::Next if inside(next) => pending.push(next),
            Flow::Next => return Err(runs_off),
            Flow::Conditional(target) => {
                if !inside(next) {
                    return Err(runs_off);
                }
                for successor in [next, target].into_iter().filter(|&a| inside(a)) {
                    reached.leaders.insert(successor);
                    pending.push(successor);
                }
            }
            Flow::Jump(target) if inside(target) => {
                reached.leaders.insert(target);
                pending.push(target);
            }
            // A call at the very end of the function does not return (the
            // compiler knew it): its fake edge is all that leaves the block.
            Flow::Call if inside(next) => {
                reached.leaders.insert(next);
                pending.push(next);
            }
            Flow::Jump(_) | Flow::IndirectTail | Flow::Return | Flow::Call | Flow::Trap => {}
        }
        reached.instructions.insert(address, instruction);
    }
    Ok(())
}

/// Refuses code where a path lands inside an instruction another path
/// decoded (overlapping instructions): the blocks would share bytes.
fn check_boundaries(reached: &Reached) -> Result<(), Error> {
    let mut previous: Option<&Instruction> = None;
    for instruction in reached.instructions.values() {
        if let Some(previous) = previous.filter(|p| p.next_ip() > instruction.ip()) {
            return Err(Error::IntoInstruction { from: previous.ip(), target: instruction.ip() });
        }
        previous = Some(instruction);
    }
    Ok(())
}

impl Cfg {
    /// Builds the graph of the function whose code is `parts`, the first
    /// starting at its entry (further parts: its `.cold` pieces; a jump
    /// between parts stays inside the function). Fails, naming the
    /// instruction, on what cannot be read: an indirect jump that is not a
    /// tail call through the GOT, code that does not decode or runs past the
    /// end, branches into the middle of an instruction, `xbegin`.
    pub fn build(parts: &[CodeRange<'_>]) -> Result<Cfg, Error> {
        Cfg::build_reading(parts, None)
    }

    /// The same, following indirect jumps through the jump tables `data`
    /// holds (see [`super::tables`]).
    ///
    /// Indirect jumps that share their targets (an interpreter's dispatch,
    /// copied at the end of every handler) go through a *hub*: a block
    /// without code after the function's blocks, one edge from each jump
    /// into it and one out to each target. Each jump's edge then runs as
    /// often as its block, each target's as its block is entered that way,
    /// where a jump to each target would be an edge no counter can hold.
    pub fn build_reading(parts: &[CodeRange<'_>], data: Option<&Data<'_>>) -> Result<Cfg, Error> {
        // Hubs are numbered past any code: code up there (a made-up binary's
        // addresses) would be taken for one.
        if let Some(part) = parts.iter().find(|p| p.address.saturating_add(p.bytes.len() as u64) > HUB_ADDRESSES) {
            return Err(Error::RunsOff { address: part.address });
        }
        let reached = reach(parts, data)?;
        let mut blocks = split(&reached);
        let hubs = hubs(&reached.tables);
        for (i, _) in hubs.iter().enumerate() {
            blocks.push(Block { start: HUB_ADDRESSES + i as u64, len: 0, instructions: Vec::new() });
        }
        let mut cfg = Cfg { blocks, edges: Vec::new(), entry: 0 };
        cfg.entry = cfg.block_at(parts[0].address).ok_or(Error::NoCode)?;
        cfg.connect(&reached, &hubs)?;
        Ok(cfg)
    }

    /// Whether `block` is a hub (no code; see [`Cfg::build_reading`]).
    pub fn is_hub(&self, block: usize) -> bool {
        self.blocks.get(block).is_some_and(|b| b.start >= HUB_ADDRESSES)
    }

    /// Its basic blocks, by address.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The block at the function's entry.
    pub fn entry_block(&self) -> usize {
        self.entry
    }

    /// Its edges. An edge's index is its id everywhere in this module.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// The block that starts at `address`.
    pub fn block_at(&self, address: u64) -> Option<usize> {
        self.blocks.binary_search_by_key(&address, |b| b.start).ok()
    }

    /// The block that holds the instruction at `address`.
    pub fn block_holding(&self, address: u64) -> Option<usize> {
        let after = self.blocks.partition_point(|b| b.start <= address);
        let block = after.checked_sub(1)?;
        self.blocks[block].instructions.binary_search(&address).is_ok().then_some(block)
    }

    /// Blocks, ENTRY and EXIT.
    pub fn node_count(&self) -> usize {
        self.blocks.len() + 2
    }

    /// A node's index in `0..node_count()`: blocks first, then ENTRY, then EXIT.
    pub fn node_index(&self, node: Node) -> usize {
        match node {
            Node::Block(b) => b,
            Node::Entry => self.blocks.len(),
            Node::Exit => self.blocks.len() + 1,
        }
    }

    /// Every conditional jump with its taken and not-taken edges, by address.
    pub fn branches(&self) -> Vec<Branch> {
        let mut branches: BTreeMap<u64, (Option<usize>, Option<usize>)> = BTreeMap::new();
        for (id, edge) in self.edges.iter().enumerate() {
            match edge.kind {
                EdgeKind::Taken { jcc } => branches.entry(jcc).or_default().0 = Some(id),
                EdgeKind::NotTaken { jcc } => branches.entry(jcc).or_default().1 = Some(id),
                _ => {}
            }
        }
        branches.into_iter().filter_map(|(jcc, (taken, not_taken))| Some(Branch { jcc, taken: taken?, not_taken: not_taken? })).collect()
    }

    fn push(&mut self, from: Node, to: Node, kind: EdgeKind) {
        self.edges.push(Edge { from, to, kind });
    }

    /// The node a branch to `target` reaches: its block, or EXIT when it
    /// leaves the function.
    fn target(&self, target: u64) -> Node {
        self.block_at(target).map_or(Node::Exit, Node::Block)
    }

    /// Adds the edges out of every block, then ENTRY's and the virtual one.
    fn connect(&mut self, reached: &Reached, hubs: &[Hub]) -> Result<(), Error> {
        self.push(Node::Entry, Node::Block(self.entry), EdgeKind::Entry);
        let code_blocks = self.blocks.len() - hubs.len();
        let mut hub_of: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, hub) in hubs.iter().enumerate() {
            hub_of.extend(hub.jumps.iter().map(|&jump| (jump, code_blocks + i)));
            for &target in &hub.targets {
                self.push(Node::Block(code_blocks + i), self.target(target), EdgeKind::Dispatch);
            }
        }
        for b in 0..code_blocks {
            let from = Node::Block(b);
            let last = self.blocks[b].instructions.last().copied().unwrap_or(self.blocks[b].start);
            let instruction = &reached.instructions[&last];
            let next = instruction.next_ip();
            let after = self.block_at(next).map(Node::Block);
            if let Some(&hub) = hub_of.get(&last) {
                self.push(from, Node::Block(hub), EdgeKind::Jump { at: last });
                continue;
            }
            if let Some(targets) = reached.tables.get(&last) {
                for &target in targets {
                    self.push(from, self.target(target), EdgeKind::Jump { at: last });
                }
                continue;
            }
            match flow(instruction)? {
                Flow::Next => self.push(from, after.ok_or(Error::RunsOff { address: last })?, EdgeKind::FallThrough),
                Flow::Conditional(target) => {
                    self.push(from, self.target(target), EdgeKind::Taken { jcc: last });
                    self.push(from, after.ok_or(Error::RunsOff { address: last })?, EdgeKind::NotTaken { jcc: last });
                }
                Flow::Jump(target) => match self.target(target) {
                    Node::Exit => self.push(from, Node::Exit, EdgeKind::TailJump { at: last }),
                    to => self.push(from, to, EdgeKind::Jump { at: last }),
                },
                Flow::IndirectTail => self.push(from, Node::Exit, EdgeKind::TailJump { at: last }),
                Flow::Return => self.push(from, Node::Exit, EdgeKind::Return { at: last }),
                Flow::Call => {
                    if let Some(after) = after {
                        self.push(from, after, EdgeKind::FallThrough);
                    }
                    self.push(from, Node::Exit, EdgeKind::Fake);
                }
                Flow::Trap => self.push(from, Node::Exit, EdgeKind::Fake),
            }
        }
        self.push(Node::Exit, Node::Entry, EdgeKind::Virtual);
        Ok(())
    }
}

/// Where hubs are numbered from: past any code.
const HUB_ADDRESSES: u64 = u64::MAX - (1 << 32);

/// Indirect jumps that share their targets.
struct Hub {
    jumps: BTreeSet<u64>,
    targets: BTreeSet<u64>,
}

/// The jumps of `tables` grouped by the targets they go to, where several
/// go to the same ones, in the order of their targets.
fn hubs(tables: &BTreeMap<u64, BTreeSet<u64>>) -> Vec<Hub> {
    let mut by_targets: BTreeMap<&BTreeSet<u64>, BTreeSet<u64>> = BTreeMap::new();
    for (jump, targets) in tables.iter().filter(|(_, t)| t.len() > 1) {
        by_targets.entry(targets).or_default().insert(*jump);
    }
    by_targets.into_iter().filter(|(_, jumps)| jumps.len() > 1).map(|(targets, jumps)| Hub { jumps, targets: targets.clone() }).collect()
}

/// Cuts the reached instructions into blocks: a block starts at a leader
/// and ends after any instruction that is not a plain `Next`.
fn split(reached: &Reached) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut open = false;
    for (&address, instruction) in &reached.instructions {
        if !open || reached.leaders.contains(&address) {
            blocks.push(Block { start: address, len: 0, instructions: Vec::new() });
        }
        let Some(block) = blocks.last_mut() else { continue };
        block.instructions.push(address);
        block.len = instruction.next_ip() - block.start;
        open = instruction.flow_control() == FlowControl::Next && instruction.code() != Code::Hlt;
    }
    blocks
}

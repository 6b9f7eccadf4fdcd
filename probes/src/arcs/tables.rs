//! Jump tables: where an indirect jump inside a function can go, read from
//! the tables its code indexes, the way compilers lay them out on x86-64:
//!
//! - a `switch` in position-independent code: `lea r, [rip+T]`, a 4-byte
//!   load from `T + index*4`, the entry added to `T` (entries relative to
//!   the table), bounded by a `cmp index, N; ja default` before it;
//! - a computed `goto *table[i]` (or a `switch` in fixed-address code):
//!   `lea r, [rip+T]` and an 8-byte load, or `jmp [T + index*8]`; entries
//!   are addresses (the file holds their link-time values);
//! - an interpreter's dispatch at -O2: `lea r, [rip+T]` once, into a
//!   register calls preserve and nothing else in the function writes, and
//!   a load through it before each of the many jumps that dispatch.
//!
//! The load follows the `lea` within a few instructions (the bound check may
//! sit between them) before anything else writes the register.
//! A table without a bound is read while its entries land inside the
//! function. What a table holds comes from the binary, so it is hostile
//! input: at most [`MOST_ENTRIES`] entries are read, and a target that is
//! not an instruction of the function makes the graph fail to build; a
//! target missed makes the counts fail to add up. Neither gives a wrong
//! count.

use iced_x86::{Code, ConditionCode, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};
use std::collections::{BTreeMap, BTreeSet};

/// The most entries read from one table.
pub const MOST_ENTRIES: u64 = 4096;

/// Instructions looked at around a `lea` of a table for its load, and
/// before it for its bound.
const NEAR: usize = 8;

/// Reads the program's data for jump tables.
pub struct Data<'a> {
    /// `len` bytes at a runtime address, if the binary has them.
    pub read: &'a dyn Fn(u64, usize) -> Option<Vec<u8>>,
    /// Runtime address less link-time address, added to addresses read.
    pub bias: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entries {
    /// 4-byte offsets from the table's address.
    Relative,
    /// 8-byte addresses.
    Absolute,
}

#[derive(Clone, Copy, Debug)]
struct Table {
    /// Where the code reads an entry of it.
    used_at: u64,
    at: u64,
    entries: Entries,
    /// How many entries, when a bound check says.
    count: Option<u64>,
}

/// The targets of each indirect jump among `instructions` (by address,
/// all decoded so far), from the tables the code refers to: a jump takes
/// the tables used within a few instructions before it, or else those no
/// other jump takes. `inside` says whether an address is in the function.
pub(super) fn targets(
    instructions: &BTreeMap<u64, Instruction>,
    jumps: &BTreeSet<u64>,
    data: &Data<'_>,
    inside: &dyn Fn(u64) -> bool,
) -> BTreeMap<u64, BTreeSet<u64>> {
    let tables = find(instructions);
    let order: Vec<u64> = instructions.keys().copied().collect();
    let near_before = |jump: u64, used: u64| {
        let j = order.partition_point(|&a| a < jump);
        let u = order.partition_point(|&a| a < used);
        u <= j && j - u <= NEAR
    };
    let own = |jump: u64| -> Vec<usize> { (0..tables.len()).filter(|&t| near_before(jump, tables[t].used_at)).collect() };
    let claimed: BTreeSet<usize> = jumps.iter().flat_map(|&j| own(j)).collect();
    let mut by_jump = BTreeMap::new();
    for &jump in jumps {
        let own = own(jump);
        let chosen: Vec<usize> = if own.is_empty() { (0..tables.len()).filter(|t| !claimed.contains(t)).collect() } else { own };
        let reached: BTreeSet<u64> = chosen.iter().flat_map(|&t| read(&tables[t], data, inside)).collect();
        by_jump.insert(jump, reached);
    }
    by_jump
}

/// The tables the code refers to.
fn find(instructions: &BTreeMap<u64, Instruction>) -> Vec<Table> {
    let list: Vec<&Instruction> = instructions.values().collect();
    let mut factory = InstructionInfoFactory::new();
    let writers = writers(&list, &mut factory);
    let mut tables = Vec::new();
    for (i, instruction) in list.iter().enumerate() {
        if let Some(at) = fixed_table(instruction) {
            tables.push(Table { used_at: instruction.ip(), at, entries: Entries::Absolute, count: bound(&list[..i]) });
            continue;
        }
        if instruction.code() != Code::Lea_r64_m || instruction.memory_base() != Register::RIP {
            continue;
        }
        let register = instruction.op0_register();
        let at = instruction.memory_displacement64();
        if kept_for_the_function(register, &writers) {
            // An interpreter's dispatch table, its address loaded once into a
            // register the function keeps: each load through it uses the table.
            for (j, load) in list.iter().enumerate().filter(|(_, l)| loads_through(l, register)) {
                if let Some(entries) = entries_of(load) {
                    tables.push(Table { used_at: load.ip(), at, entries, count: bound(&list[..j]) });
                }
            }
        } else if let Some(load) = load_after(&list, i, &mut factory)
            && let Some(entries) = entries_of(list[load])
        {
            // The bound is checked before the load, or before the `lea`.
            let count = bound(&list[..load]).or_else(|| bound(&list[..i]));
            tables.push(Table { used_at: list[load].ip(), at, entries, count });
        }
    }
    tables
}

/// Instructions looked at after a `lea` of a table for its load: compilers
/// put the bound check between them.
const LOAD_WITHIN: usize = 16;

/// The load of an entry through the register `list[lea]` sets, shortly
/// after it and before anything else writes that register.
fn load_after(list: &[&Instruction], lea: usize, factory: &mut InstructionInfoFactory) -> Option<usize> {
    let register = list[lea].op0_register();
    for (i, instruction) in list.iter().enumerate().skip(lea + 1).take(LOAD_WITHIN) {
        if loads_through(instruction, register) {
            return Some(i);
        }
        if writes(factory, instruction, register) {
            return None;
        }
    }
    None
}

/// Whether `instruction` writes `register` (or part of it).
fn writes(factory: &mut InstructionInfoFactory, instruction: &Instruction, register: Register) -> bool {
    factory.info(instruction).used_registers().iter().any(|used| used.register().full_register() == register && is_write(used.access()))
}

/// Whether an access may change the register.
fn is_write(access: OpAccess) -> bool {
    matches!(access, OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
}

/// Whether `load` reads an indexed entry of the table `register` points
/// to: into a register, or as the target of a jump (`jmp [r + i*8]`).
fn loads_through(load: &Instruction, register: Register) -> bool {
    let reads =
        (load.op_count() == 2 && load.op1_kind() == OpKind::Memory) || (load.code() == Code::Jmp_rm64 && load.op0_kind() == OpKind::Memory);
    reads && load.memory_index() != Register::None && (load.memory_base() == register || load.memory_index() == register)
}

/// What a load of a table's entry reads: 4-byte offsets or 8-byte
/// addresses (a jump through the table reads an address).
fn entries_of(load: &Instruction) -> Option<Entries> {
    match load.memory_size().size() {
        4 if load.code() != Code::Jmp_rm64 => Some(Entries::Relative),
        8 => Some(Entries::Absolute),
        _ => None,
    }
}

/// The registers calls preserve.
const PRESERVED: [Register; 6] = [Register::RBX, Register::RBP, Register::R12, Register::R13, Register::R14, Register::R15];

/// How many instructions of `list` write each register calls preserve,
/// leaving out the `pop`s that restore them before a return.
fn writers(list: &[&Instruction], factory: &mut InstructionInfoFactory) -> [usize; PRESERVED.len()] {
    let mut writers = [0; PRESERVED.len()];
    for instruction in list.iter().filter(|i| i.mnemonic() != Mnemonic::Pop) {
        for used in factory.info(instruction).used_registers().iter().filter(|used| is_write(used.access())) {
            if let Some(k) = PRESERVED.iter().position(|&r| r == used.register().full_register()) {
                writers[k] += 1;
            }
        }
    }
    writers
}

/// Whether `register`, which a `lea` of a table writes, is one calls
/// preserve and that nothing else in the function writes (`writers`): it
/// holds the table's address wherever it is used.
fn kept_for_the_function(register: Register, writers: &[usize; PRESERVED.len()]) -> bool {
    PRESERVED.iter().position(|&r| r == register).is_some_and(|k| writers[k] == 1)
}

/// `jmp [T + index*8]`: a table at a fixed address.
fn fixed_table(instruction: &Instruction) -> Option<u64> {
    let fixed = instruction.code() == Code::Jmp_rm64
        && instruction.op0_kind() == OpKind::Memory
        && instruction.memory_base() == Register::None
        && instruction.memory_index() != Register::None
        && instruction.memory_index_scale() == 8;
    fixed.then(|| instruction.memory_displacement64())
}

/// The number of entries a `cmp index, N` and `ja`/`jae` shortly before
/// say, if they are there.
fn bound(before: &[&Instruction]) -> Option<u64> {
    let recent = &before[before.len().saturating_sub(NEAR)..];
    recent.windows(2).rev().find_map(|pair| {
        let (cmp, jump) = (pair[0], pair[1]);
        let compares = cmp.mnemonic() == iced_x86::Mnemonic::Cmp && cmp.op1_kind() != OpKind::Register && cmp.op1_kind() != OpKind::Memory;
        if !compares {
            return None;
        }
        let limit = cmp.immediate(1);
        match jump.condition_code() {
            ConditionCode::a => Some(limit.saturating_add(1)),
            ConditionCode::ae => Some(limit),
            _ => None,
        }
    })
}

/// The targets in `table` that land inside the function: all of its
/// entries when bounded, else those up to the first that does not.
fn read(table: &Table, data: &Data<'_>, inside: &dyn Fn(u64) -> bool) -> Vec<u64> {
    let size = match table.entries {
        Entries::Relative => 4,
        Entries::Absolute => 8,
    };
    let most = table.count.unwrap_or(MOST_ENTRIES).min(MOST_ENTRIES);
    let mut targets = Vec::new();
    for k in 0..most {
        let Some(bytes) = (data.read)(table.at + k * size, size as usize) else { break };
        let target = match table.entries {
            Entries::Relative => table.at.wrapping_add(i32::from_le_bytes(bytes[..4].try_into().unwrap_or_default()) as i64 as u64),
            Entries::Absolute => u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default()).wrapping_add(data.bias),
        };
        if !inside(target) {
            if table.count.is_some() {
                // A bounded table that leads out is not a table of this function.
                return Vec::new();
            }
            break;
        }
        targets.push(target);
    }
    targets
}

#[cfg(test)]
mod tests {
    use crate::arcs::{Cfg, CodeRange, Data, EdgeKind, Error, Node};
    use std::collections::BTreeMap;

    /// `switch (x) { case 0: return 10; case 1: return 20; case 2: return 30; } return 0;`
    /// as gcc -O0 -fPIE lays it out at 0x1000, its table at 0x2000.
    #[rustfmt::skip]
    const SWITCH: [u8; 0x3c] = [
        0x83, 0xff, 0x02,                               // cmp edi,2
        0x77, 0x34,                                     // ja 0x1039
        0x89, 0xf8,                                     // mov eax,edi
        0x48, 0x8d, 0x14, 0x85, 0, 0, 0, 0,             // lea rdx,[rax*4]
        0x48, 0x8d, 0x05, 0xea, 0x0f, 0, 0,             // lea rax,[rip+0xfea] (0x2000)
        0x8b, 0x04, 0x02,                               // mov eax,[rdx+rax]
        0x48, 0x98,                                     // cdqe
        0x48, 0x8d, 0x15, 0xde, 0x0f, 0, 0,             // lea rdx,[rip+0xfde] (0x2000)
        0x48, 0x01, 0xd0,                               // add rax,rdx
        0xff, 0xe0,                                     // jmp rax (0x1025)
        0xb8, 10, 0, 0, 0, 0xc3,                        // 0x1027
        0xb8, 20, 0, 0, 0, 0xc3,                        // 0x102d
        0xb8, 30, 0, 0, 0, 0xc3,                        // 0x1033
        0x31, 0xc0, 0xc3,                               // 0x1039
    ];

    fn reader(memory: BTreeMap<u64, Vec<u8>>) -> impl Fn(u64, usize) -> Option<Vec<u8>> {
        move |address, len| {
            let (start, bytes) = memory.range(..=address).next_back()?;
            let offset = (address - start) as usize;
            bytes.get(offset..offset + len).map(<[u8]>::to_vec)
        }
    }

    fn relative(targets: &[i64]) -> Vec<u8> {
        targets.iter().flat_map(|t| ((t - 0x2000) as i32).to_le_bytes()).collect()
    }

    /// Where the jump at `jump` goes, through its hub if it has one.
    fn targets_of(cfg: &Cfg, jump: u64) -> Vec<u64> {
        let from = Node::Block(cfg.block_holding(jump).unwrap());
        let start = |node: Node| match node {
            Node::Block(b) => cfg.blocks()[b].start,
            _ => 0,
        };
        let mut targets = Vec::new();
        for edge in cfg.edges().iter().filter(|e| e.from == from && e.kind == EdgeKind::Jump { at: jump }) {
            match edge.to {
                Node::Block(hub) if cfg.is_hub(hub) => {
                    targets.extend(cfg.edges().iter().filter(|e| e.from == edge.to).map(|e| start(e.to)));
                }
                to => targets.push(start(to)),
            }
        }
        targets
    }

    #[test]
    fn a_bounded_relative_table_gives_its_entries_and_no_more() {
        // A fourth entry past the bound, inside an instruction: not read.
        let read = reader(BTreeMap::from([(0x2000, relative(&[0x1027, 0x102d, 0x1033, 0x1028]))]));
        let data = Data { read: &read, bias: 0 };
        let parts = [CodeRange { address: 0x1000, bytes: &SWITCH }];
        let cfg = Cfg::build_reading(&parts, Some(&data)).unwrap();
        assert_eq!(targets_of(&cfg, 0x1025), [0x1027, 0x102d, 0x1033]);
        // Without the data, the jump is refused.
        assert!(matches!(Cfg::build(&parts), Err(Error::IndirectJump { address: 0x1025, .. })));
    }

    #[test]
    fn a_table_that_leads_out_of_the_function_is_refused() {
        let read = reader(BTreeMap::from([(0x2000, relative(&[0x1027, 0x9000, 0x1033]))]));
        let data = Data { read: &read, bias: 0 };
        let parts = [CodeRange { address: 0x1000, bytes: &SWITCH }];
        assert!(matches!(Cfg::build_reading(&parts, Some(&data)), Err(Error::IndirectJump { address: 0x1025, .. })));
        // Nor is a table the file does not hold.
        let nothing = |_: u64, _: usize| None;
        let data = Data { read: &nothing, bias: 0 };
        assert!(matches!(Cfg::build_reading(&parts, Some(&data)), Err(Error::IndirectJump { .. })));
    }

    /// An interpreter's dispatch: the table's address loaded once into r14
    /// (which calls preserve), every handler ending in a load through it and
    /// a jump: each jump takes the table, however far from the `lea`.
    #[rustfmt::skip]
    const DISPATCH: [u8; 0x2a] = [
        0x41, 0x56,                                 // push r14
        0x4c, 0x8d, 0x35, 0xf7, 0x0f, 0, 0,         // lea r14,[rip+0xff7] (0x2000)
        0x89, 0xf8,                                 // mov eax,edi
        0x49, 0x8b, 0x04, 0xc6,                     // mov rax,[r14+rax*8]
        0xff, 0xe0,                                 // jmp rax (0x100f)
        0x83, 0xc7, 0x01,                           // 0x1011: add edi,1
        0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, // nop x 8
        0x89, 0xf8,                                 // mov eax,edi
        0x83, 0xe0, 0x01,                           // and eax,1
        0x49, 0x8b, 0x04, 0xc6,                     // mov rax,[r14+rax*8]
        0xff, 0xe0,                                 // jmp rax (0x1025)
        0x41, 0x5e,                                 // 0x1027: pop r14
        0xc3,                                       // ret
    ];

    #[test]
    fn a_table_a_kept_register_points_to_serves_every_jump_through_it() {
        let table: Vec<u8> = [0x1011u64, 0x1027, 0x5_0000].iter().flat_map(|a| a.to_le_bytes()).collect();
        let read = reader(BTreeMap::from([(0x2000, table)]));
        let data = Data { read: &read, bias: 0 };
        let cfg = Cfg::build_reading(&[CodeRange { address: 0x1000, bytes: &DISPATCH }], Some(&data)).unwrap();
        assert_eq!(targets_of(&cfg, 0x100f), [0x1011, 0x1027]);
        assert_eq!(targets_of(&cfg, 0x1025), [0x1011, 0x1027]);
        // r14 written again in a handler (xor r14d,r14d for the add): what
        // the second jump reads is not known, and the graph is refused.
        let mut rewritten = DISPATCH;
        rewritten[0x11..0x14].copy_from_slice(&[0x45, 0x31, 0xf6]);
        let built = Cfg::build_reading(&[CodeRange { address: 0x1000, bytes: &rewritten }], Some(&data));
        assert!(matches!(built, Err(Error::IndirectJump { .. })), "{built:?}");
    }

    /// Jumps that share their targets meet in a hub: every edge is then
    /// countable from block counters, and the counts come out whole.
    #[test]
    fn jumps_that_share_their_targets_go_through_a_hub() {
        use crate::arcs::{FunctionCode, counter_costs, place_counters, solve_counters};
        let table: Vec<u8> = [0x1011u64, 0x1027, 0x5_0000].iter().flat_map(|a| a.to_le_bytes()).collect();
        let read = reader(BTreeMap::from([(0x2000, table)]));
        let data = Data { read: &read, bias: 0 };
        let parts = [CodeRange { address: 0x1000, bytes: &DISPATCH }];
        let cfg = Cfg::build_reading(&parts, Some(&data)).unwrap();
        // Three blocks of code and the hub after them.
        assert_eq!(cfg.blocks().len(), 4);
        assert!(cfg.is_hub(3) && !cfg.is_hub(2));
        let into_hub: Vec<_> = cfg.edges().iter().filter(|e| e.to == Node::Block(3)).map(|e| e.kind).collect();
        assert_eq!(into_hub, [EdgeKind::Jump { at: 0x100f }, EdgeKind::Jump { at: 0x1025 }]);
        let out: Vec<_> = cfg.edges().iter().filter(|e| e.from == Node::Block(3)).map(|e| (e.to, e.kind)).collect();
        assert_eq!(out, [(Node::Block(1), EdgeKind::Dispatch), (Node::Block(2), EdgeKind::Dispatch)]);
        // Every quantity has a counter or is derived.
        let code = FunctionCode::new(&cfg, &parts).unwrap();
        let placement = place_counters(&cfg, &counter_costs(&cfg, &code));
        assert!(placement.needs_probe().is_empty(), "{:?}", placement.needs_probe());
        // 4 calls; the handler at 0x1011 runs 10 times in all: 10 blocks
        // 1, 14 jumps into the hub, 4 returns.
        let truth = |q: &crate::arcs::Quantity| match q {
            crate::arcs::Quantity::Block(0) | crate::arcs::Quantity::Block(2) => 4,
            crate::arcs::Quantity::Block(1) => 10,
            crate::arcs::Quantity::Block(_) => 14,
            crate::arcs::Quantity::Edge(_) => unreachable!("only blocks have counters here"),
        };
        let values: Vec<u64> = placement.counted().iter().map(truth).collect();
        let counts = solve_counters(&cfg, &placement, &values).unwrap();
        assert_eq!(counts.blocks(), [4, 10, 4, 14]);
        assert_eq!(counts.calls(), 4);
        // Code where hubs are numbered is refused, not mistaken for one.
        let high = [CodeRange { address: u64::MAX - 0x1000, bytes: &DISPATCH }];
        assert!(matches!(Cfg::build_reading(&high, Some(&data)), Err(Error::RunsOff { .. })));
    }

    #[test]
    fn an_unbounded_table_of_addresses_is_read_while_it_lands_inside() {
        #[rustfmt::skip]
        let code = [
            0x89, 0xf8,                                 // mov eax,edi
            0x48, 0x8d, 0x14, 0xc5, 0, 0, 0, 0,         // lea rdx,[rax*8]
            0x48, 0x8d, 0x05, 0xef, 0x0f, 0, 0,         // lea rax,[rip+0xfef] (0x2000)
            0x48, 0x8b, 0x04, 0x02,                     // mov rax,[rdx+rax]
            0xff, 0xe0,                                 // jmp rax (0x1015)
            0xb8, 1, 0, 0, 0, 0xc3,                     // 0x1017
            0xb8, 2, 0, 0, 0, 0xc3,                     // 0x101d
        ];
        // Link-time addresses in the file, 0x100 below where the code runs;
        // the third entry is some other data.
        let table: Vec<u8> = [0xf17u64, 0xf1d, 0xf17, 0x5_0000].iter().flat_map(|a| a.to_le_bytes()).collect();
        let read = reader(BTreeMap::from([(0x2000, table)]));
        let data = Data { read: &read, bias: 0x100 };
        let cfg = Cfg::build_reading(&[CodeRange { address: 0x1000, bytes: &code }], Some(&data)).unwrap();
        assert_eq!(targets_of(&cfg, 0x1015), [0x1017, 0x101d]);
    }
}

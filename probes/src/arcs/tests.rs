//! Graphs of hand-assembled functions, and counts of executions simulated on
//! them recomputed from the counted edges alone.

use super::*;
use iced_x86::code_asm::*;
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, Register};
use std::collections::BTreeMap;

const BASE: u64 = 0x1000;
/// Outside every function assembled here: a callee, a tail-call target.
const ELSEWHERE: u64 = 0x5000;

fn assemble(body: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> Vec<u8> {
    let mut a = CodeAssembler::new(64).unwrap();
    body(&mut a).unwrap();
    a.assemble(BASE).unwrap()
}

/// A loop over bytes that leaves at a zero byte or after `edi` turns.
fn loop_with_a_break() -> Vec<u8> {
    assemble(|a| {
        let (mut top, mut done) = (a.create_label(), a.create_label());
        a.set_label(&mut top)?;
        a.cmp(byte_ptr(rsi), 0)?;
        a.je(done)?;
        a.inc(rsi)?;
        a.dec(edi)?;
        a.jne(top)?;
        a.mov(eax, -1)?;
        a.ret()?;
        a.set_label(&mut done)?;
        a.xor(eax, eax)?;
        a.ret()
    })
}

/// A loop calling another function `edi` times.
fn call_in_a_loop() -> Vec<u8> {
    assemble(|a| {
        let mut top = a.create_label();
        a.push(rbx)?;
        a.mov(ebx, edi)?;
        a.set_label(&mut top)?;
        a.call(ELSEWHERE)?;
        a.dec(ebx)?;
        a.jne(top)?;
        a.pop(rbx)?;
        a.ret()
    })
}

fn graph(code: &[u8]) -> Cfg {
    Cfg::build(&[CodeRange { address: BASE, bytes: code }]).unwrap()
}

fn starts(cfg: &Cfg) -> Vec<u64> {
    cfg.blocks().iter().map(|b| b.start).collect()
}

/// The edges as (from, to, kind), blocks named by their start address
/// (ENTRY as 0, EXIT as u64::MAX), for comparing with what the code says.
fn arcs(cfg: &Cfg) -> Vec<(u64, u64, EdgeKind)> {
    let name = |n: Node| match n {
        Node::Entry => 0,
        Node::Exit => u64::MAX,
        Node::Block(b) => cfg.blocks()[b].start,
    };
    cfg.edges().iter().map(|e| (name(e.from), name(e.to), e.kind)).collect()
}

/// A small deterministic generator (xorshift), so failures replay.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Runs `calls` random walks from ENTRY to EXIT, as executions of the
/// function would go: at a block, one of its real edges, or now and then
/// its fake edge (a call that does not return). Returns each edge's count.
fn execute(cfg: &Cfg, calls: usize, seed: u64) -> Vec<i64> {
    let mut random = Random(seed | 1);
    let mut counts = vec![0i64; cfg.edges().len()];
    let out = |node: Node| -> Vec<usize> { (0..cfg.edges().len()).filter(|&e| cfg.edges()[e].from == node).collect() };
    let entry = cfg.edges().iter().position(|e| e.kind == EdgeKind::Entry).unwrap();
    let virtual_edge = cfg.edges().iter().position(|e| e.kind == EdgeKind::Virtual).unwrap();
    for _ in 0..calls {
        counts[entry] += 1;
        counts[virtual_edge] += 1;
        let mut node = cfg.edges()[entry].to;
        for _ in 0..100_000 {
            if node == Node::Exit {
                break;
            }
            let edges = out(node);
            let real: Vec<usize> = edges.iter().copied().filter(|&e| cfg.edges()[e].kind != EdgeKind::Fake).collect();
            let fake = edges.iter().copied().find(|&e| cfg.edges()[e].kind == EdgeKind::Fake);
            let edge = match fake {
                Some(fake) if real.is_empty() || random.below(6) == 0 => fake,
                _ => real[random.below(real.len())],
            };
            counts[edge] += 1;
            node = cfg.edges()[edge].to;
        }
        assert_eq!(node, Node::Exit, "a walk did not end");
    }
    counts
}

/// Block counts of an execution: what flowed into each block.
fn block_counts(cfg: &Cfg, edges: &[i64]) -> Vec<u64> {
    let mut blocks = vec![0u64; cfg.blocks().len()];
    for (e, edge) in cfg.edges().iter().enumerate() {
        if let Node::Block(b) = edge.to {
            blocks[b] += edges[e] as u64;
        }
    }
    blocks
}

/// What every graph must satisfy: |E| - |V| + 1 counters, none on a fake
/// or virtual edge, and simulated executions recomputed from them exactly.
fn check_counting(cfg: &Cfg) {
    let placement = place(cfg, &default_costs(cfg));
    assert_eq!(placement.counted().len(), cfg.edges().len() + 1 - cfg.node_count(), "{:?}", arcs(cfg));
    for &e in placement.counted() {
        assert!(!cfg.edges()[e].kind.is_artificial(), "counter on {:?}", cfg.edges()[e]);
        assert!(!placement.on_tree(e));
    }
    for seed in [1, 7, 1234, 99_999] {
        let truth = execute(cfg, 50, seed);
        let given: Vec<u64> = placement.counted().iter().map(|&e| truth[e] as u64).collect();
        let counts = solve(cfg, &placement, &given).unwrap();
        assert_eq!(counts.edges(), &truth[..]);
        assert_eq!(counts.blocks(), &block_counts(cfg, &truth)[..]);
        assert_eq!(counts.calls(), 50);
    }
}

fn if_else() -> Vec<u8> {
    assemble(|a| {
        let (mut other, mut join) = (a.create_label(), a.create_label());
        a.test(edi, edi)?;
        a.je(other)?;
        a.mov(eax, 1)?;
        a.jmp(join)?;
        a.set_label(&mut other)?;
        a.mov(eax, 2)?;
        a.set_label(&mut join)?;
        a.ret()
    })
}

#[test]
fn arcs_if_else_has_four_blocks_and_both_branches() {
    let code = if_else();
    let cfg = graph(&code);
    // test+je (4), mov+jmp (7), mov (5), ret.
    assert_eq!(starts(&cfg), [BASE, BASE + 4, BASE + 11, BASE + 16]);
    let exit = u64::MAX;
    assert_eq!(
        arcs(&cfg),
        [
            (0, BASE, EdgeKind::Entry),
            (BASE, BASE + 11, EdgeKind::Taken { jcc: BASE + 2 }),
            (BASE, BASE + 4, EdgeKind::NotTaken { jcc: BASE + 2 }),
            (BASE + 4, BASE + 16, EdgeKind::Jump { at: BASE + 9 }),
            (BASE + 11, BASE + 16, EdgeKind::FallThrough),
            (BASE + 16, exit, EdgeKind::Return { at: BASE + 16 }),
            (exit, 0, EdgeKind::Virtual),
        ]
    );
    assert_eq!(cfg.blocks()[0].instructions, [BASE, BASE + 2]);
    assert_eq!(cfg.blocks()[0].len, 4);
    check_counting(&cfg);
}

#[test]
fn arcs_counts_of_an_if_else_called_ten_times_taken_three() {
    let code = if_else();
    let cfg = graph(&code);
    let placement = place(&cfg, &default_costs(&cfg));
    // Entry 10, taken 3, not taken 7, jump 7, fall-through 3, ret 10.
    let truth = [10, 3, 7, 7, 3, 10, 10];
    let given: Vec<u64> = placement.counted().iter().map(|&e| truth[e] as u64).collect();
    let counts = solve(&cfg, &placement, &given).unwrap();
    assert_eq!(counts.blocks(), [10, 7, 3, 10]);
    assert_eq!(counts.branches(&cfg), [BranchCount { jcc: BASE + 2, taken: 3, not_taken: 7 }]);
}

#[test]
fn arcs_loop_counts_its_back_edge() {
    let code = assemble(|a| {
        let mut top = a.create_label();
        a.xor(eax, eax)?;
        a.set_label(&mut top)?;
        a.add(eax, edi)?;
        a.dec(edi)?;
        a.jne(top)?;
        a.ret()
    });
    let cfg = graph(&code);
    assert_eq!(starts(&cfg), [BASE, BASE + 2, BASE + 8]);
    let back = cfg.edges().iter().position(|e| e.kind == EdgeKind::Taken { jcc: BASE + 6 }).unwrap();
    assert_eq!(cfg.edges()[back].from, cfg.edges()[back].to);
    // A self-loop closes a cycle alone: it can only be counted.
    assert!(place(&cfg, &default_costs(&cfg)).counted().contains(&back));
    check_counting(&cfg);
}

#[test]
fn arcs_loop_with_a_break_has_two_exits() {
    let code = loop_with_a_break();
    let cfg = graph(&code);
    assert_eq!(cfg.blocks().len(), 4);
    assert_eq!(cfg.edges().iter().filter(|e| matches!(e.kind, EdgeKind::Return { .. })).count(), 2);
    assert_eq!(cfg.branches().len(), 2);
    check_counting(&cfg);
}

#[test]
fn arcs_call_in_a_loop_ends_its_block_with_a_fake_edge() {
    let code = call_in_a_loop();
    let cfg = graph(&code);
    // push+mov (3), call (5), dec+jne, pop+ret.
    assert_eq!(starts(&cfg), [BASE, BASE + 3, BASE + 8, BASE + 12]);
    let call = cfg.block_at(BASE + 3).unwrap();
    let out: Vec<EdgeKind> = cfg.edges().iter().filter(|e| e.from == Node::Block(call)).map(|e| e.kind).collect();
    assert_eq!(out, [EdgeKind::FallThrough, EdgeKind::Fake]);
    assert_eq!(cfg.edges().iter().filter(|e| e.kind == EdgeKind::Fake).count(), 1);
    check_counting(&cfg);
}

#[test]
fn arcs_tail_jumps_go_to_exit() {
    let code = assemble(|a| {
        let mut other = a.create_label();
        a.test(edi, edi)?;
        a.je(ELSEWHERE)?; // a conditional tail call
        a.cmp(edi, 5)?;
        a.jl(other)?;
        a.jmp(ELSEWHERE + 0x100)?;
        a.set_label(&mut other)?;
        a.db(&[0xff, 0x25, 0x10, 0x20, 0x00, 0x00]) // jmp [rip+0x2010]: through the GOT
    });
    let cfg = graph(&code);
    let kinds: Vec<EdgeKind> = cfg.edges().iter().filter(|e| e.to == Node::Exit).map(|e| e.kind).collect();
    assert!(matches!(kinds[..], [EdgeKind::Taken { .. }, EdgeKind::TailJump { .. }, EdgeKind::TailJump { .. }]), "{kinds:?}");
    check_counting(&cfg);
}

#[test]
fn arcs_jump_table_is_refused_naming_its_address() {
    let code = assemble(|a| {
        let mut default = a.create_label();
        a.cmp(edi, 3)?;
        a.ja(default)?;
        a.lea(rax, qword_ptr(0x3000u64))?;
        a.jmp(qword_ptr(rax + rdi * 8))?;
        a.set_label(&mut default)?;
        a.ret()
    });
    // The jump's 3 bytes (ff 24 f8) and the ret's 1 end the code.
    assert_eq!(code[code.len() - 4..], [0xff, 0x24, 0xf8, 0xc3]);
    match Cfg::build(&[CodeRange { address: BASE, bytes: &code }]) {
        Err(Error::IndirectJump { address, instruction }) => {
            assert_eq!(address, BASE + code.len() as u64 - 4);
            assert_eq!(instruction, "Jmp_rm64 [RAX+RDI*8]");
        }
        other => panic!("{other:?}"),
    }
    let code = assemble(|a| {
        a.mov(rax, rdi)?;
        a.jmp(rax)
    });
    let error = Cfg::build(&[CodeRange { address: BASE, bytes: &code }]).unwrap_err();
    assert_eq!(error, Error::IndirectJump { address: BASE + 3, instruction: "Jmp_rm64 RAX".into() });
    assert!(error.to_string().contains("0x1003"), "{error}");
}

#[test]
fn arcs_noreturn_call_at_the_end_has_only_its_fake_edge() {
    let code = assemble(|a| {
        let mut ok = a.create_label();
        a.test(edi, edi)?;
        a.jne(ok)?;
        a.ret()?;
        a.set_label(&mut ok)?;
        a.sub(rsp, 8)?;
        a.call(ELSEWHERE) // abort(): the function's last bytes
    });
    // What follows in memory (another function) is not the function's.
    let mut memory = code.clone();
    memory.extend([0x55, 0x48, 0x89, 0xe5]);
    let cfg = Cfg::build(&[CodeRange { address: BASE, bytes: &code }]).unwrap();
    let last = cfg.block_holding(BASE + code.len() as u64 - 5).unwrap();
    let out: Vec<EdgeKind> = cfg.edges().iter().filter(|e| e.from == Node::Block(last)).map(|e| e.kind).collect();
    assert_eq!(out, [EdgeKind::Fake]);
    check_counting(&cfg);
    // Followed by int3 within its size: a block of its own, which traps.
    let mut trapping = code.clone();
    trapping.push(0xcc);
    let cfg = graph(&trapping);
    let trap = cfg.block_at(BASE + code.len() as u64).unwrap();
    let out: Vec<EdgeKind> = cfg.edges().iter().filter(|e| e.from == Node::Block(trap)).map(|e| e.kind).collect();
    assert_eq!(out, [EdgeKind::Fake]);
    check_counting(&cfg);
}

#[test]
fn arcs_padding_after_the_last_ret_is_no_block() {
    let mut code = if_else();
    let size = code.len() as u64;
    code.extend([0x90, 0x66, 0x90, 0xcc, 0x0f, 0x0b, 0xff, 0xff]); // nop, xchg ax,ax, int3, ud2, garbage
    let cfg = graph(&code);
    assert_eq!(cfg.blocks().last().unwrap().end(), BASE + size);
    assert_eq!(cfg.blocks().len(), 4);
}

#[test]
fn arcs_cold_part_is_part_of_the_graph() {
    // Hot part at BASE: jne to the cold part, which jumps back.
    let cold_at = 0x800u64;
    let mut hot = CodeAssembler::new(64).unwrap();
    hot.test(edi, edi).unwrap();
    hot.jne(cold_at).unwrap(); // a rel32 jne: 6 bytes
    hot.mov(eax, 1).unwrap();
    hot.ret().unwrap();
    let hot = hot.assemble(BASE).unwrap();
    let mut cold = CodeAssembler::new(64).unwrap();
    cold.mov(edi, 0).unwrap();
    cold.jmp(BASE + 8).unwrap();
    let cold = cold.assemble(cold_at).unwrap();
    let cfg = Cfg::build(&[CodeRange { address: BASE, bytes: &hot }, CodeRange { address: cold_at, bytes: &cold }]).unwrap();
    assert_eq!(starts(&cfg), [cold_at, BASE, BASE + 8]);
    assert_eq!(cfg.entry_block(), 1);
    assert!(cfg.edges().iter().all(|e| !matches!(e.kind, EdgeKind::TailJump { .. })));
    check_counting(&cfg);
}

#[test]
fn arcs_bad_code_is_an_error() {
    // Falls off the end.
    let code = assemble(|a| a.mov(eax, 1));
    assert_eq!(Cfg::build(&[CodeRange { address: BASE, bytes: &code }]).unwrap_err(), Error::RunsOff { address: BASE });
    // Jumps into the middle of its own `mov eax, imm32` (at BASE + 1).
    let code = [0xb8, 0xeb, 0xfe, 0x00, 0x00, 0x75, 0xfa, 0xc3];
    assert!(matches!(Cfg::build(&[CodeRange { address: BASE, bytes: &code }]), Err(Error::IntoInstruction { .. })));
    // Does not decode.
    assert_eq!(Cfg::build(&[CodeRange { address: BASE, bytes: &[0x06] }]).unwrap_err(), Error::Undecodable { address: BASE });
    assert_eq!(Cfg::build(&[]).unwrap_err(), Error::NoCode);
}

/// A call that returns twice (`setjmp`): the block after it runs more
/// often than the call; its fake edge's count comes out negative, and every
/// other count right.
#[test]
fn arcs_call_returning_twice_gives_a_negative_fake_edge() {
    let code = assemble(|a| {
        a.call(ELSEWHERE)?;
        a.test(eax, eax)?;
        a.ret()
    });
    let cfg = graph(&code);
    let placement = place(&cfg, &default_costs(&cfg));
    let [entry, after, fake, ret, _] = [0, 1, 2, 3, 4];
    assert_eq!(cfg.edges()[fake].kind, EdgeKind::Fake);
    // Called 3 times; setjmp returned 6 times.
    let truth = [3i64, 6, -3, 6, 3];
    let given: Vec<u64> = placement.counted().iter().map(|&e| truth[e] as u64).collect();
    let counts = solve(&cfg, &placement, &given).unwrap();
    assert_eq!(counts.edges(), truth);
    assert_eq!(counts.blocks(), [3, 6]);
    assert_eq!((counts.edge(entry), counts.edge(after), counts.edge(ret)), (3, 6, 6));
}

#[test]
fn arcs_inconsistent_counts_are_errors() {
    let code = if_else();
    let cfg = graph(&code);
    let placement = place(&cfg, &default_costs(&cfg));
    let n = placement.counted().len();
    assert_eq!(solve(&cfg, &placement, &[1]), Err(Error::CountNumber { expected: n, given: 1 }));
    assert!(matches!(solve(&cfg, &placement, &vec![u64::MAX; n]), Err(Error::Overflow { .. })));
    // The default costs leave the not-taken edge and the ret counted: the
    // entry block and the join are too short for a counter at their head.
    assert_eq!(placement.counted(), [2, 5]);
    // Not taken 20 times in 10 calls: taken would be -10.
    assert_eq!(solve(&cfg, &placement, &[20, 10]), Err(Error::Negative { edge: 1, count: -10 }));
    assert!(solve(&cfg, &placement, &[7, 10]).is_ok());
}

/// Any counts at all: an answer that conserves flow, or an error; never a panic.
#[test]
fn arcs_hostile_counts_never_panic() {
    let code = if_else();
    let cfg = graph(&code);
    let placement = place(&cfg, &default_costs(&cfg));
    let mut random = Random(42);
    let values = [0, 1, 2, 1 << 40, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX];
    for _ in 0..2000 {
        let given: Vec<u64> = placement.counted().iter().map(|_| values[random.below(values.len())]).collect();
        if let Ok(counts) = solve(&cfg, &placement, &given) {
            for (e, edge) in cfg.edges().iter().enumerate() {
                assert!(edge.kind.is_artificial() || counts.edge(e) >= 0);
            }
        }
    }
}

/// The costliest edges go on the tree: they are the last to need a counter.
#[test]
fn arcs_costly_edges_are_not_counted() {
    let code = if_else();
    let cfg = graph(&code);
    for costly in 0..cfg.edges().len() {
        let mut costs = vec![1; cfg.edges().len()];
        costs[costly] = 100;
        let placement = place(&cfg, &costs);
        // Only a self-loop could not go on the tree, and there is none.
        assert!(placement.on_tree(costly), "{:?}", cfg.edges()[costly]);
        assert_eq!(placement.counted().len(), 2);
    }
}

/// Every test function's code, for the counter placement's tests.
fn test_functions() -> Vec<Vec<u8>> {
    let looping = assemble(|a| {
        let mut top = a.create_label();
        a.xor(eax, eax)?;
        a.set_label(&mut top)?;
        a.add(eax, edi)?;
        a.dec(edi)?;
        a.jne(top)?;
        a.ret()
    });
    let breaking = loop_with_a_break();
    let calling = call_in_a_loop();
    vec![if_else(), looping, breaking, calling, parallel_edges()]
}

/// `cmp edi,1; jne +0` makes two edges between the same blocks: a cycle
/// that no block's count breaks, so one of them is counted at its `jcc`.
fn parallel_edges() -> Vec<u8> {
    assemble(|a| {
        let mut next = a.create_label();
        a.cmp(edi, 1)?;
        a.jne(next)?;
        a.set_label(&mut next)?;
        a.xor(eax, eax)?;
        a.ret()
    })
}

/// A quantity's count in an execution given by its edges' counts.
fn value(cfg: &Cfg, truth: &[i64], quantity: Quantity) -> u64 {
    match quantity {
        Quantity::Edge(e) => truth[e] as u64,
        Quantity::Block(b) => block_counts(cfg, truth)[b],
    }
}

/// The fewest quantities without a counter that any spanning tree leaves
/// counted: the independent cycles among them and the artificial edges.
fn fewest_probes(cfg: &Cfg, costs: &[Cost]) -> usize {
    let blocks = cfg.blocks().len();
    let node = |n: Node, leaving: bool| match n {
        Node::Block(b) => b + if leaving { blocks } else { 0 },
        Node::Entry => 2 * blocks,
        Node::Exit => 2 * blocks + 1,
    };
    let mut parent: Vec<usize> = (0..2 * blocks + 2).collect();
    fn root(parent: &mut [usize], mut n: usize) -> usize {
        while parent[n] != n {
            n = parent[n];
        }
        n
    }
    let mut cycles = 0;
    let arcs = cfg.edges().iter().map(|e| (node(e.from, true), node(e.to, false), e.kind.is_artificial()));
    let arcs: Vec<(usize, usize, bool)> = arcs.chain((0..blocks).map(|b| (b, b + blocks, false))).collect();
    for (id, &(from, to, artificial)) in arcs.iter().enumerate() {
        if artificial || costs.get(id).is_none_or(|&c| c == Cost::NoCounter) {
            let (a, b) = (root(&mut parent, from), root(&mut parent, to));
            if a == b {
                cycles += 1;
            } else {
                parent[a] = b;
            }
        }
    }
    cycles
}

/// What every counter placement must satisfy: as many counters as edges
/// alone would need, none on a fake or virtual edge, the fewest without a
/// cheap counter, and simulated executions recomputed from them exactly.
fn check_counters(cfg: &Cfg, costs: &[Cost]) -> CounterPlacement {
    let placement = place_counters(cfg, costs);
    assert_eq!(placement.counted().len(), cfg.edges().len() + 1 - cfg.node_count(), "{:?}", arcs(cfg));
    for &q in placement.counted() {
        assert!(!matches!(q, Quantity::Edge(e) if cfg.edges()[e].kind.is_artificial()), "counter on {q:?}");
        assert!(!placement.on_tree(cfg, q));
    }
    assert_eq!(placement.needs_probe().len(), fewest_probes(cfg, costs));
    for seed in [1, 7, 1234, 99_999] {
        let truth = execute(cfg, 50, seed);
        let given: Vec<u64> = placement.counted().iter().map(|&q| value(cfg, &truth, q)).collect();
        let counts = solve_counters(cfg, &placement, &given).unwrap();
        assert_eq!(counts.edges(), &truth[..]);
        assert_eq!(counts.blocks(), &block_counts(cfg, &truth)[..]);
        assert_eq!(counts.calls(), 50);
    }
    placement
}

#[test]
fn arcs_counters_on_blocks_alone_recover_every_count() {
    for code in test_functions() {
        let cfg = graph(&code);
        let costs: Vec<Cost> = quantities(&cfg)
            .iter()
            .map(|q| match q {
                Quantity::Block(b) => Cost::Counter(1 + *b as u32),
                Quantity::Edge(_) => Cost::NoCounter,
            })
            .collect();
        let placement = check_counters(&cfg, &costs);
        let counted_edges = placement.counted().iter().filter(|q| matches!(q, Quantity::Edge(_))).count();
        // Only the parallel edges need an edge counted: with none cheap, a probe.
        assert_eq!(counted_edges, placement.needs_probe().len());
        assert_eq!(counted_edges, usize::from(code == parallel_edges()), "{:?}", arcs(&cfg));
    }
}

#[test]
fn arcs_counters_with_costs_from_the_code_use_blocks_and_jccs() {
    let mut blocks_counted = 0;
    for (f, code) in test_functions().into_iter().enumerate() {
        let cfg = graph(&code);
        let function = FunctionCode::new(&cfg, &[CodeRange { address: BASE, bytes: &code }]).unwrap();
        let costs = counter_costs(&cfg, &function);
        let placement = check_counters(&cfg, &costs);
        // The call in a loop: only the call's block (`call rel32`) holds a
        // jump; push+mov (3 bytes), dec+jne (4) and pop+ret (2) do not, and
        // with the fake edge they form two cycles of their own.
        let probes = if f == 3 { 2 } else { 0 };
        assert_eq!(placement.needs_probe().len(), probes, "{:?}", arcs(&cfg));
        blocks_counted += placement.counted().iter().filter(|q| matches!(q, Quantity::Block(_))).count();
        let sites = plan_sites(&cfg, &function, &placement).unwrap();
        let mut indexes: Vec<usize> = sites.iter().flat_map(|s| s.counters.iter().map(|c| c.index)).collect();
        indexes.sort_unstable();
        let cheap = (0..placement.counted().len()).filter(|&i| !placement.needs_probe().contains(&placement.counted()[i]));
        assert_eq!(indexes, cheap.collect::<Vec<_>>());
        for site in &sites {
            let block = &cfg.blocks()[site.block];
            assert!(site.len() >= 5 && site.at >= block.start && site.end() <= block.end());
            assert_eq!(site.original, code[(site.at - BASE) as usize..(site.end() - BASE) as usize]);
        }
        if code == parallel_edges() {
            // The jcc's window: cmp + jne, its not-taken or taken edge counted there.
            assert_eq!((sites.len(), sites[0].at, sites[0].len()), (1, BASE, 5));
            assert!(matches!(sites[0].counters[0].place, Place::Taken | Place::NotTaken));
        }
    }
    assert!(blocks_counted >= 4, "{blocks_counted}");
}

/// `dec edi; jne top`, 4 bytes: the loop's block holds no jump and its
/// back edge no counter, and the two form a cycle: one of them is named as
/// needing a probe, and with its count given every count comes out.
#[test]
fn arcs_counters_a_tight_loop_needs_a_probe() {
    let code = assemble(|a| {
        let mut top = a.create_label();
        a.xor(eax, eax)?;
        a.add(eax, 1000)?;
        a.set_label(&mut top)?;
        a.dec(edi)?;
        a.jne(top)?;
        a.ret()
    });
    let cfg = graph(&code);
    let function = FunctionCode::new(&cfg, &[CodeRange { address: BASE, bytes: &code }]).unwrap();
    let costs = counter_costs(&cfg, &function);
    let top = cfg.block_at(BASE + 7).unwrap();
    assert_eq!(costs[cfg.edges().len() + top], Cost::NoCounter);
    let placement = check_counters(&cfg, &costs);
    assert_eq!(placement.needs_probe().len(), 1);
    let probe = placement.needs_probe()[0];
    assert!(
        probe == Quantity::Block(top) || matches!(probe, Quantity::Edge(e) if cfg.edges()[e].kind == EdgeKind::Taken { jcc: BASE + 9 })
    );
    // The sites leave it out.
    let sites = plan_sites(&cfg, &function, &placement).unwrap();
    assert!(sites.iter().all(|s| s.counters.iter().all(|c| c.quantity != probe)));
}

/// The flags: a block that starts with a `jcc` reading the flags of the
/// block before needs them saved; a block that sets them first does not.
#[test]
fn arcs_flags_are_live_where_a_jcc_reads_them_from_the_block_before() {
    let code = assemble(|a| {
        let (mut less, mut equal) = (a.create_label(), a.create_label());
        a.cmp(edi, 10)?;
        a.je(equal)?;
        a.jl(less)?; // a block of its own, reading cmp's flags
        a.mov(eax, 3)?;
        a.ret()?;
        a.set_label(&mut less)?;
        a.mov(eax, 1)?;
        a.ret()?;
        a.set_label(&mut equal)?;
        a.mov(eax, 2)?;
        a.ret()
    });
    let cfg = graph(&code);
    let function = FunctionCode::new(&cfg, &[CodeRange { address: BASE, bytes: &code }]).unwrap();
    let jl = cfg.block_at(BASE + 5).unwrap();
    assert_eq!(function.live_flags(jl, 0) & sites::INC_WRITES, iced_x86::RflagsBits::SF | iced_x86::RflagsBits::OF);
    // Before the cmp, and at every mov-then-ret block, nothing is live.
    assert_eq!(function.live_flags(cfg.entry_block(), 0), 0);
    assert_eq!(function.live_at(Node::Block(cfg.block_at(BASE + 7).unwrap())), 0);
    assert_eq!(function.first_window(jl), None, "jl rel8 is 2 bytes");
}

/// Counts that are no execution's are errors, never panics, on the split
/// graph as on the edges.
#[test]
fn arcs_counters_hostile_counts_never_panic() {
    let code = if_else();
    let cfg = graph(&code);
    let costs: Vec<Cost> = quantities(&cfg).iter().map(|_| Cost::Counter(1)).collect();
    let placement = place_counters(&cfg, &costs);
    let mut random = Random(42);
    let values = [0, 1, 2, 1 << 40, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX];
    for _ in 0..2000 {
        let given: Vec<u64> = placement.counted().iter().map(|_| values[random.below(values.len())]).collect();
        if let Ok(counts) = solve_counters(&cfg, &placement, &given) {
            for (e, edge) in cfg.edges().iter().enumerate() {
                assert!(edge.kind.is_artificial() || counts.edge(e) >= 0);
            }
        }
    }
    assert!(matches!(solve_counters(&cfg, &placement, &[1]), Err(Error::CountNumber { .. })));
}

/// Code mangled at random (bytes of the test functions changed): whatever
/// builds a graph goes through costs, placement, sites and stubs with
/// answers or errors, never a panic, and every site stays in its block.
#[test]
fn arcs_counters_on_mangled_code_never_panic() {
    let mut random = Random(2024);
    let mut planned = 0;
    for _ in 0..3000 {
        let functions = test_functions();
        let mut code = functions[random.below(functions.len())].clone();
        for _ in 0..1 + random.below(3) {
            let at = random.below(code.len());
            code[at] = random.below(256) as u8;
        }
        let parts = [CodeRange { address: BASE, bytes: &code }];
        let Ok(cfg) = Cfg::build(&parts) else { continue };
        let function = FunctionCode::new(&cfg, &parts).unwrap();
        let placement = place_counters(&cfg, &counter_costs(&cfg, &function));
        // Costs from the code never place a counter where no site fits.
        let sites = plan_sites(&cfg, &function, &placement).unwrap();
        let counters: Vec<u64> = (0..placement.counted().len() as u64).map(|i| 0x9000 + 8 * i).collect();
        for site in &sites {
            let block = &cfg.blocks()[site.block];
            assert!(site.at >= block.start && site.end() <= block.end());
            let _ = stub(site, 0x8000, &counters);
        }
        planned += 1;
    }
    assert!(planned > 500, "{planned}");
}

/// A function's leading `endbr64` stays where it is (an indirect call must
/// land on it): the entry block's window starts after it. A stub's first
/// moved instruction maps to the stub's start, before its counter.
#[test]
fn arcs_windows_leave_endbr64_in_place_and_stubs_say_where_threads_go() {
    let code = assemble(|a| {
        let mut skip = a.create_label();
        a.endbr64()?;
        a.push(rbx)?;
        a.mov(ebx, edi)?;
        a.test(ebx, ebx)?;
        a.je(skip)?;
        a.mov(eax, 7)?;
        a.set_label(&mut skip)?;
        a.pop(rbx)?;
        a.ret()
    });
    let parts = [CodeRange { address: BASE, bytes: &code }];
    let cfg = graph(&code);
    let function = FunctionCode::new(&cfg, &parts).unwrap();
    assert_eq!(function.first_window(cfg.entry_block()), Some(1..4));
    let costs: Vec<Cost> = quantities(&cfg)
        .iter()
        .map(|&q| if q == Quantity::Block(0) { Cost::Counter(0) } else { sites::cost(&cfg, &function, q) })
        .collect();
    let placement = place_counters(&cfg, &costs);
    assert!(placement.counted().contains(&Quantity::Block(0)));
    let sites = plan_sites(&cfg, &function, &placement).unwrap();
    let entry = sites.iter().find(|s| s.block == 0).unwrap();
    assert_eq!((entry.at, entry.len()), (BASE + 4, 5));
    let counters: Vec<u64> = (0..placement.counted().len() as u64).map(|i| 0x20_0000 + 8 * i).collect();
    let made = stub(entry, 0x10_0000, &counters).unwrap();
    let moved: Vec<u64> = made.moved.iter().map(|m| m.0).collect();
    assert_eq!(moved, [BASE + 4, BASE + 5, BASE + 7]);
    assert_eq!(made.moved[0].1, 0x10_0000);
    assert!(made.moved[1..].iter().all(|m| m.1 > 0x10_0000 && m.1 < 0x10_0000 + made.code.len() as u64));
    // Out of reach: a stub 4 GiB away from the code, counters 4 GiB away
    // from the stub (and above the 2 GiB an absolute address reaches).
    assert!(matches!(entry.jump_to(BASE + (4 << 30)), Err(Error::Stub { .. })));
    assert!(matches!(stub(entry, 0x10_0000, &[0x7f00_0000_0000; 4]), Err(Error::Stub { .. })));
}

/// A counter's increment is `lock inc` unless only one thread counts, and
/// leaves the stack alone unless the flags must be saved. Without `lock`,
/// a `nop` before it is where the prefix goes when a thread starts: the
/// increment then is `lock inc` of the same counter.
#[test]
fn arcs_stubs_lock_only_where_threads_may_count_at_once() {
    let code = assemble(|a| {
        a.push(rbx)?;
        a.mov(ebx, edi)?;
        a.pop(rbx)?;
        a.ret()
    });
    let parts = [CodeRange { address: BASE, bytes: &code }];
    let cfg = graph(&code);
    let increments = |one_thread: bool| -> Vec<(bool, usize)> {
        let function = FunctionCode::new(&cfg, &parts).unwrap();
        let placement = place_counters(&cfg, &counter_costs(&cfg, &function));
        let mut sites = plan_sites(&cfg, &function, &placement).unwrap();
        sites.iter_mut().flat_map(|s| &mut s.counters).for_each(|c| c.atomic = !one_thread);
        let counters: Vec<u64> = (0..placement.counted().len() as u64).map(|i| 0x20_0000 + 8 * i).collect();
        sites
            .iter()
            .map(|site| {
                let made = stub(site, 0x10_0000, &counters).unwrap();
                let decode =
                    |code: &[u8]| -> Vec<Instruction> { Decoder::with_ip(64, code, 0x10_0000, DecoderOptions::NONE).into_iter().collect() };
                let decoded = decode(&made.code);
                let inc = decoded.iter().find(|i| i.mnemonic() == Mnemonic::Inc).unwrap();
                let stack = decoded.iter().filter(|i| i.op0_register() == Register::RSP || i.mnemonic() == Mnemonic::Pushfq).count();
                assert_eq!(made.lockable.len(), usize::from(!inc.has_lock_prefix()), "{decoded:?}");
                let mut locked = made.code.clone();
                for &at in &made.lockable {
                    assert_eq!(locked[(at - 0x10_0000) as usize], 0x90);
                    locked[(at - 0x10_0000) as usize] = crate::arcs::stub::LOCK_PREFIX;
                }
                let relocked = decode(&locked);
                let locked_inc = relocked.iter().find(|i| i.mnemonic() == Mnemonic::Inc).unwrap();
                assert!(locked_inc.has_lock_prefix() && locked_inc.memory_displacement64() == inc.memory_displacement64());
                assert_eq!(relocked.len() + made.lockable.len(), decoded.len());
                (inc.has_lock_prefix(), stack)
            })
            .collect()
    };
    assert_eq!(increments(false), [(true, 0)]);
    assert_eq!(increments(true), [(false, 0)]);
}

/// One run of a block in a simulated execution: the block, the edge it
/// left by, and whether a call starts with it.
struct Run {
    block: usize,
    out: usize,
    call_starts: bool,
}

/// `calls` random walks, run by run (as [`execute`], with fewer calls
/// that do not return).
fn walk(cfg: &Cfg, calls: usize, random: &mut Random) -> Vec<Run> {
    let mut runs = Vec::new();
    for _ in 0..calls {
        let mut block = cfg.entry_block();
        let mut call_starts = true;
        loop {
            let out: Vec<usize> = (0..cfg.edges().len()).filter(|&e| cfg.edges()[e].from == Node::Block(block)).collect();
            let real: Vec<usize> = out.iter().copied().filter(|&e| cfg.edges()[e].kind != EdgeKind::Fake).collect();
            let fake = out.iter().copied().find(|&e| cfg.edges()[e].kind == EdgeKind::Fake);
            let edge = match fake {
                Some(fake) if real.is_empty() || random.below(20) == 0 => fake,
                _ => real[random.below(real.len())],
            };
            runs.push(Run { block, out: edge, call_starts });
            call_starts = false;
            match cfg.edges()[edge].to {
                Node::Block(next) if runs.len() < 10_000 => block = next,
                _ => break,
            }
        }
    }
    runs
}

/// Counting that starts and ends in the middle of blocks, with a thread
/// there or in a call, gives every real edge's count and every line's
/// entries between the two moments exactly: counters are simulated at
/// their sites' addresses, and lines from a row on every instruction.
#[test]
fn arcs_counting_between_two_moments_counts_what_ran_between_them() {
    let mut random = Random(0x5eed);
    let (mut checked, mut unsettled_seen, mut leaving_counters) = (0, 0, 0);
    // Counters where they cost least, and counters on a block's only way
    // out where one fits (its window's counter then counts the edge).
    for (code, edges_first) in test_functions().into_iter().flat_map(|c| [(c.clone(), false), (c, true)]) {
        let cfg = graph(&code);
        let function = FunctionCode::new(&cfg, &[CodeRange { address: BASE, bytes: &code }]).unwrap();
        let mut costs = counter_costs(&cfg, &function);
        if edges_first {
            for (q, cost) in quantities(&cfg).into_iter().zip(&mut costs) {
                match q {
                    Quantity::Block(_) if *cost != Cost::NoCounter => *cost = Cost::Counter(100),
                    Quantity::Edge(e) => {
                        let Node::Block(b) = cfg.edges()[e].from else { continue };
                        let only_way_out = cfg.edges().iter().filter(|o| o.from == Node::Block(b)).count() == 1;
                        if only_way_out && function.first_window(b).is_some() {
                            *cost = Cost::Counter(1);
                        }
                    }
                    _ => {}
                }
            }
        }
        let placement = place_counters(&cfg, &costs);
        if !placement.needs_probe().is_empty() {
            continue;
        }
        let sites = plan_sites(&cfg, &function, &placement).unwrap();
        leaving_counters +=
            sites.iter().flat_map(|s| &s.counters).filter(|c| c.place == Place::Start && matches!(c.quantity, Quantity::Edge(_))).count();
        let line_of = |address: u64| (address.wrapping_mul(2_654_435_761) >> 7) as u32 % 4 + 1;
        let rows: Vec<(u64, Vec<u32>)> =
            cfg.blocks().iter().flat_map(|b| b.instructions.iter()).filter(|&&a| a != BASE).map(|&a| (a, vec![line_of(a)])).collect();
        let lines = FunctionLines { entry_line: 0, rows: rows.clone(), ..FunctionLines::default() };
        let row_line = |address: u64| rows.iter().find(|r| r.0 == address).map(|r| r.1[0]);
        for _ in 0..200 {
            let runs = walk(&cfg, 6, &mut random);
            let len = |r: usize| cfg.blocks()[runs[r].block].instructions.len() as i64;
            let after_call = |r: usize| cfg.edges().iter().any(|e| e.from == Node::Block(runs[r].block) && e.kind == EdgeKind::Fake);
            // A moment: before instruction `i` of run `r`; past the last
            // one only in a call's block (the thread is in the callee).
            let moment = |random: &mut Random| {
                let r = random.below(runs.len());
                let i = random.below(len(r) as usize + usize::from(after_call(r))) as i64;
                (r, i)
            };
            // A thread where its line cannot be told is moved on (stepped) past that.
            let ranges = unsettled(&cfg, &lines).unwrap();
            unsettled_seen += usize::from(!ranges.is_empty());
            let settle = |(mut r, mut i): (usize, i64)| {
                let address = |r: usize, i: i64| cfg.blocks()[runs[r].block].instructions.get(i as usize).copied();
                while address(r, i).is_some_and(|pc| ranges.iter().any(|u| u.contains(&pc))) {
                    (r, i) =
                        if i + 1 < len(r) || (i + 1 == len(r) && after_call(r)) || r + 1 == runs.len() { (r, i + 1) } else { (r + 1, 0) };
                }
                (r, i)
            };
            let (a, b) = (settle(moment(&mut random)), settle(moment(&mut random)));
            let (start, end) = (a.min(b), a.max(b));
            let inside = |position: (usize, i64)| position >= start && position < end;
            let mut truth = vec![0i64; cfg.edges().len()];
            let mut counters = vec![0u64; placement.counted().len()];
            let mut entered: BTreeMap<u32, u64> = BTreeMap::new();
            let mut on = 0;
            for (r, run) in runs.iter().enumerate() {
                let block = &cfg.blocks()[run.block];
                let last = len(r) - 1;
                if run.call_starts {
                    on = 0;
                    if inside((r, -1)) {
                        truth[cfg.edges().iter().position(|e| e.kind == EdgeKind::Entry).unwrap()] += 1;
                    }
                }
                for (i, &address) in block.instructions.iter().enumerate() {
                    if let Some(line) = row_line(address) {
                        if line != on && inside((r, i as i64)) {
                            *entered.entry(line).or_default() += 1;
                        }
                        on = line;
                    }
                }
                let edge = &cfg.edges()[run.out];
                let left_at = if edge.kind == EdgeKind::FallThrough && after_call(r) { last + 1 } else { last };
                if edge.kind != EdgeKind::Fake && inside((r, left_at)) {
                    truth[run.out] += 1;
                }
                for site in sites.iter().filter(|s| s.block == run.block) {
                    let at = block.instructions.iter().position(|&a| a == site.at).unwrap() as i64;
                    for c in &site.counters {
                        let fires = match c.place {
                            Place::Start => inside((r, at)),
                            _ => c.quantity == Quantity::Edge(run.out) && inside((r, last)),
                        };
                        counters[c.index] += u64::from(fires);
                    }
                }
            }
            let frame = |(r, i): (usize, i64), at_start: bool| {
                let instructions = &cfg.blocks()[runs[r].block].instructions;
                instructions.get(i as usize).map(|&pc| Frame { pc, at_start })
            };
            let frames: Vec<Frame> = [frame(start, true), frame(end, false)].into_iter().flatten().collect();
            let counts = solve_with_frames(&cfg, &placement, &sites, &counters, &frames)
                .unwrap_or_else(|e| panic!("{e} from {start:?} to {end:?}, frames {frames:?}, {:?}", arcs(&cfg)));
            for (e, edge) in cfg.edges().iter().enumerate().filter(|(_, e)| !e.kind.is_artificial()) {
                assert_eq!(counts.edge(e), truth[e], "edge {e} {edge:?} from {start:?} to {end:?}: {:?}", arcs(&cfg));
            }
            let got = line_entries(&cfg, &counts, &lines).unwrap();
            assert_eq!(got.undetermined, [], "from {start:?} to {end:?}");
            let got: BTreeMap<u32, u64> = got.entered.into_iter().collect();
            assert_eq!(got, entered, "lines from {start:?} to {end:?}, frames {frames:?}: {:?}", arcs(&cfg));
            checked += 1;
        }
    }
    assert!(
        checked >= 1600 && unsettled_seen > 0 && leaving_counters > 0,
        "{checked} checked, {unsettled_seen} with unsettled places, {leaving_counters} counters on a way out"
    );
}

/// A loop laid out as `gcc -O0` lays out a `for` (entered at its test, at
/// the bottom), a branch in it whose sides take several instructions each
/// (so that each can hold a counter), a nested loop on one side; a branch
/// after the loop.
fn branches_around_loops() -> Vec<u8> {
    assemble(|a| {
        let (mut body, mut even, mut next, mut inner, mut test, mut skip) =
            (a.create_label(), a.create_label(), a.create_label(), a.create_label(), a.create_label(), a.create_label());
        a.push(rbx)?;
        a.mov(ebx, edi)?;
        a.jmp(test)?;
        a.set_label(&mut body)?;
        a.test(ebx, 1)?;
        a.je(even)?;
        a.add(eax, 0x1234_5678)?;
        a.add(eax, ebx)?;
        a.jmp(next)?;
        a.set_label(&mut even)?;
        a.mov(edx, 0x1234_5678)?;
        a.set_label(&mut inner)?;
        a.sub(eax, 0x1234_5678)?;
        a.dec(edx)?;
        a.jne(inner)?;
        a.set_label(&mut next)?;
        a.mov(ecx, 0x1234_5678)?;
        a.dec(ebx)?;
        a.set_label(&mut test)?;
        a.cmp(ebx, 0)?;
        a.jg(body)?;
        a.test(esi, esi)?;
        a.je(skip)?;
        a.mov(eax, 0x1234_5678)?;
        a.add(eax, esi)?;
        a.set_label(&mut skip)?;
        a.pop(rbx)?;
        a.ret()
    })
}

/// Natural loops: the outer loop holds its branch's sides and the inner
/// loop, the inner loop only itself; code before and after is in none.
#[test]
fn arcs_loops_are_found_nested() {
    let code = branches_around_loops();
    let cfg = graph(&code);
    let loops = loops::Loops::of(&cfg);
    let depth_at = |address: u64| loops.depth(cfg.block_holding(address).unwrap());
    assert_eq!(depth_at(block_after(&code, Mnemonic::Sub)), 2);
    assert_eq!(depth_at(block_after(&code, Mnemonic::Cmp)), 1);
    assert_eq!(depth_at(BASE), 0);
    assert_eq!(depth_at(block_after(&code, Mnemonic::Pop)), 0);
    let depths: Vec<u32> = (0..cfg.blocks().len()).map(|b| loops.depth(b)).collect();
    assert_eq!(depths.iter().filter(|&&d| d == 2).count(), 1, "{depths:?}");
    assert_eq!(depths.iter().filter(|&&d| d == 1).count(), 5, "{depths:?}");
}

/// The first instruction with mnemonic `mnemonic` in `code`, by address.
fn block_after(code: &[u8], mnemonic: Mnemonic) -> u64 {
    let mut decoder = Decoder::with_ip(64, code, BASE, DecoderOptions::NONE);
    decoder.iter().find(|i| i.mnemonic() == mnemonic).unwrap().ip()
}

/// Counters go where they run least: a loop holds only as many as its
/// cycles need (one per independent cycle inside it), the inner loop one,
/// and the counts still come out right.
#[test]
fn arcs_counters_stay_out_of_loops_where_they_can() {
    let code = branches_around_loops();
    let cfg = graph(&code);
    let parts = [CodeRange { address: BASE, bytes: &code }];
    let function = FunctionCode::new(&cfg, &parts).unwrap();
    let placement = check_counters(&cfg, &counter_costs(&cfg, &function));
    let loops = loops::Loops::of(&cfg);
    let depth = |q: &Quantity| match *q {
        Quantity::Block(b) => loops.depth(b),
        Quantity::Edge(e) => loops.edge_depth(cfg.edges()[e].from, cfg.edges()[e].to),
    };
    let depths: Vec<u32> = placement.counted().iter().map(depth).collect();
    assert_eq!(depths.iter().filter(|&&d| d == 2).count(), 1, "{depths:?}");
    assert_eq!(depths.iter().filter(|&&d| d == 1).count(), 2, "{depths:?}");
}

/// A loop whose body branches to one of two sides, as `gcc -O0` lays out
/// `for (...) { if (...) a; else b; }`: one counter a turn, on each side,
/// rather than one on a side and one on the loop's test.
#[test]
fn arcs_a_branch_in_a_loop_is_counted_on_its_sides() {
    let code = assemble(|a| {
        let (mut body, mut other, mut join, mut test) = (a.create_label(), a.create_label(), a.create_label(), a.create_label());
        a.xor(eax, eax)?;
        a.jmp(test)?;
        a.set_label(&mut body)?;
        a.test(edi, 3)?;
        a.je(other)?;
        a.add(eax, 0x1234_5678)?;
        a.jmp(join)?;
        a.set_label(&mut other)?;
        a.sub(eax, 0x1234_5678)?;
        a.set_label(&mut join)?;
        a.dec(edi)?;
        a.set_label(&mut test)?;
        a.cmp(edi, 0)?;
        a.jg(body)?;
        a.ret()
    });
    let cfg = graph(&code);
    let parts = [CodeRange { address: BASE, bytes: &code }];
    let function = FunctionCode::new(&cfg, &parts).unwrap();
    let placement = check_counters(&cfg, &counter_costs(&cfg, &function));
    let loops = loops::Loops::of(&cfg);
    let in_loop: Vec<Quantity> = placement
        .counted()
        .iter()
        .copied()
        .filter(|q| match *q {
            Quantity::Block(b) => loops.depth(b) > 0,
            Quantity::Edge(e) => loops.edge_depth(cfg.edges()[e].from, cfg.edges()[e].to) > 0,
        })
        .collect();
    let side = |mnemonic| Quantity::Block(cfg.block_holding(block_after(&code, mnemonic)).unwrap());
    assert_eq!(in_loop.len(), 2, "{in_loop:?}");
    assert!(in_loop.contains(&side(Mnemonic::Add)) && in_loop.contains(&side(Mnemonic::Sub)), "{in_loop:?}");
}

/// Loops one after another, each left from its body as well as its test:
/// what follows them is weighed as running once a call, not more with each
/// loop passed.
#[test]
fn arcs_loop_weights_do_not_compound_from_loop_to_loop() {
    let code = assemble(|a| {
        for _ in 0..10 {
            let (mut top, mut out) = (a.create_label(), a.create_label());
            a.mov(ecx, edi)?;
            a.set_label(&mut top)?;
            a.cmp(byte_ptr(rsi), 0)?;
            a.je(out)?;
            a.inc(rsi)?;
            a.dec(ecx)?;
            a.jne(top)?;
            a.set_label(&mut out)?;
        }
        a.mov(eax, 0x1234_5678)?;
        a.ret()
    });
    let cfg = graph(&code);
    let loops = loops::Loops::of(&cfg);
    let last = cfg.block_holding(block_after(&code, Mnemonic::Ret)).unwrap();
    let first = cfg.block_holding(BASE).unwrap();
    assert_eq!(loops.weight(&cfg, Quantity::Block(last)), loops.weight(&cfg, Quantity::Block(first)));
}

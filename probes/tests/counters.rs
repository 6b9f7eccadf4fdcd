//! Counters patched into real code and run: functions assembled into
//! pages of this process, their counters placed, sites planned, stubs
//! written beside them and 5-byte jumps patched in; then the functions are
//! called from Rust with known inputs, and every block, edge and branch
//! count derived from the counters is compared with what the inputs make
//! the code do (and every result with the function's model: the moved
//! instructions still compute the same).
#![allow(clippy::unwrap_used, missing_docs)]

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Decoder, DecoderOptions, Mnemonic};
use proftap_probes::arcs::{
    BranchCount, Cfg, CodeRange, Cost, CounterPlacement, Counts, EdgeKind, FunctionCode, Node, Place, Quantity, Site, counter_costs,
    place_counters, plan_sites, quantities, solve_counters, stub,
};

const PAGE: usize = 4096;
/// Functions in the first pages, stubs after them, then the counters.
const CODE_PAGES: usize = 8;
const STUB_PAGES: usize = 8;
const COUNTER_PAGES: usize = 2;

/// RWX-by-turns memory of this process: written, then sealed read+exec
/// (code and stubs), the counters staying read+write.
struct Memory {
    base: *mut u8,
    len: usize,
    next_function: u64,
    next_stub: u64,
    next_counter: u64,
}

impl Memory {
    fn new() -> Memory {
        let len = (CODE_PAGES + STUB_PAGES + COUNTER_PAGES) * PAGE;
        // SAFETY: a fresh anonymous mapping, checked.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(base, libc::MAP_FAILED);
        let at = base as u64;
        Memory {
            base: base.cast(),
            len,
            next_function: at,
            next_stub: at + (CODE_PAGES * PAGE) as u64,
            next_counter: at + ((CODE_PAGES + STUB_PAGES) * PAGE) as u64,
        }
    }

    fn write(&self, at: u64, bytes: &[u8]) {
        let offset = (at - self.base as u64) as usize;
        assert!(offset + bytes.len() <= (CODE_PAGES + STUB_PAGES) * PAGE);
        // SAFETY: inside the mapping, which is still writable.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(offset), bytes.len()) };
    }

    /// Makes code and stubs executable and no longer writable.
    fn seal(&self) {
        // SAFETY: the mapping's own pages.
        let status = unsafe { libc::mprotect(self.base.cast(), (CODE_PAGES + STUB_PAGES) * PAGE, libc::PROT_READ | libc::PROT_EXEC) };
        assert_eq!(status, 0);
    }

    fn read(&self, counter: u64) -> u64 {
        // SAFETY: a counter of the mapping, read after the threads that
        // incremented it were joined.
        unsafe { std::ptr::read_volatile(counter as *const u64) }
    }

    /// Assembles a function at the next free address; `body` returns the
    /// labels whose addresses the test needs.
    fn function(&mut self, body: impl FnOnce(&mut CodeAssembler) -> Result<Vec<CodeLabel>, IcedError>) -> Function {
        let mut a = CodeAssembler::new(64).unwrap();
        let labels = body(&mut a).unwrap();
        let at = self.next_function;
        // Branches as the body chose them: short, or near where it asked.
        let options = BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS | BlockEncoderOptions::DONT_FIX_BRANCHES;
        let result = a.assemble_options(at, options).unwrap();
        let code = result.inner.code_buffer.clone();
        let labels = labels.iter().map(|l| result.label_ip(l).unwrap()).collect();
        self.write(at, &code);
        self.next_function = (at + code.len() as u64).next_multiple_of(64);
        Function { address: at, code, labels }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

struct Function {
    address: u64,
    code: Vec<u8>,
    labels: Vec<u64>,
}

/// A function with its counters patched in.
struct Instrumented {
    cfg: Cfg,
    placement: CounterPlacement,
    counters: Vec<u64>,
    sites: Vec<Site>,
    stubs: Vec<Vec<u8>>,
}

/// Costs that count the block at `address` (cheapest of all): a test of
/// what its counter's stub does, wherever the loops would put counters.
fn counting_block_at(address: u64) -> impl FnOnce(&Cfg, &mut [Cost]) {
    move |cfg, costs| costs[cfg.edges().len() + cfg.block_at(address).expect("a block starts there")] = Cost::Counter(0)
}

impl Instrumented {
    /// Places the counters of `f` with the costs from its code, changed by
    /// `costs`, plans the sites (changed by `edit`), writes the stubs and
    /// patches the jumps in.
    fn new(memory: &mut Memory, f: &Function, costs: impl FnOnce(&Cfg, &mut [Cost]), edit: impl FnOnce(&mut [Site])) -> Instrumented {
        Instrumented::build(memory, f, false, costs, edit)
    }

    /// The same, calls returning into their stubs where what follows them
    /// is counted.
    fn returning(memory: &mut Memory, f: &Function) -> Instrumented {
        Instrumented::build(memory, f, true, |_, _| {}, |_| {})
    }

    fn build(
        memory: &mut Memory,
        f: &Function,
        returning: bool,
        costs: impl FnOnce(&Cfg, &mut [Cost]),
        edit: impl FnOnce(&mut [Site]),
    ) -> Instrumented {
        let parts = [CodeRange { address: f.address, bytes: &f.code }];
        let cfg = Cfg::build(&parts).unwrap();
        let mut code = FunctionCode::new(&cfg, &parts).unwrap();
        if returning {
            code.let_calls_return_to_stubs();
        }
        let mut cost = counter_costs(&cfg, &code);
        costs(&cfg, &mut cost);
        let placement = place_counters(&cfg, &cost);
        assert!(placement.needs_probe().is_empty(), "{:?}", placement);
        let mut sites = plan_sites(&cfg, &code, &placement).unwrap();
        edit(&mut sites);
        let counters: Vec<u64> = (0..placement.counted().len()).map(|i| memory.next_counter + 8 * i as u64).collect();
        memory.next_counter += 8 * counters.len() as u64;
        let mut stubs = Vec::new();
        for site in &sites {
            let at = memory.next_stub;
            let made = stub(site, at, &counters).unwrap();
            memory.write(at, &made.code);
            memory.write(site.at, &site.jump_to(at).unwrap());
            memory.next_stub = (at + made.code.len() as u64).next_multiple_of(16);
            stubs.push(made.code);
        }
        Instrumented { cfg, placement, counters, sites, stubs }
    }

    fn counts(&self, memory: &Memory) -> Counts {
        let values: Vec<u64> = self.counters.iter().map(|&c| memory.read(c)).collect();
        solve_counters(&self.cfg, &self.placement, &values).unwrap()
    }

    fn block(&self, counts: &Counts, start: u64) -> u64 {
        counts.block(self.cfg.block_at(start).unwrap())
    }

    /// The taken and not-taken counts of the `jcc` that ends the block at `start`.
    fn branch(&self, counts: &Counts, start: u64) -> (u64, u64) {
        let jcc = *self.cfg.blocks()[self.cfg.block_at(start).unwrap()].instructions.last().unwrap();
        let b: BranchCount = counts.branches(&self.cfg).into_iter().find(|b| b.jcc == jcc).unwrap();
        (b.taken, b.not_taken)
    }

    fn places(&self) -> Vec<Place> {
        self.sites.iter().flat_map(|s| s.counters.iter().map(|c| c.place)).collect()
    }

    fn pushes_flags(&self) -> bool {
        self.stubs.iter().any(|code| Decoder::new(64, code, DecoderOptions::NONE).into_iter().any(|i| i.mnemonic() == Mnemonic::Pushfq))
    }
}

fn call2(address: u64) -> extern "C" fn(u64, u64) -> u64 {
    // SAFETY: the address of a function assembled with the C convention.
    unsafe { std::mem::transmute::<usize, extern "C" fn(u64, u64) -> u64>(address as usize) }
}

/// `s = 0; for i in 0..n { if i & mask == 0 { s += i } else { s -= 1 } }`.
fn sum_loop(memory: &mut Memory) -> Function {
    memory.function(|a| {
        let [mut lp, mut odd, mut even, mut next, mut done] = [(); 5].map(|_| a.create_label());
        a.xor(eax, eax)?;
        a.xor(ecx, ecx)?;
        a.test(rdi, rdi)?;
        a.je(done)?;
        a.set_label(&mut lp)?;
        a.test(rcx, rsi)?;
        a.jne(odd)?;
        a.set_label(&mut even)?;
        a.add(rax, rcx)?;
        a.jmp(next)?;
        a.set_label(&mut odd)?;
        a.sub(rax, 1)?;
        a.set_label(&mut next)?;
        a.inc(rcx)?;
        a.cmp(rcx, rdi)?;
        a.jb(lp)?;
        a.set_label(&mut done)?;
        a.ret()?;
        Ok(vec![lp, even, odd, next, done])
    })
}

fn sum_model(n: u64, mask: u64) -> u64 {
    (0..n).fold(0u64, |s, i| if i & mask == 0 { s.wrapping_add(i) } else { s.wrapping_sub(1) })
}

fn sum_inputs() -> Vec<(u64, u64)> {
    (0..200u64).map(|k| (k % 37, [1, 2, 3, 6][k as usize % 4])).collect()
}

#[test]
fn arcs_patched_loop_counts_every_block_and_branch_exactly() {
    let mut memory = Memory::new();
    let f = sum_loop(&mut memory);
    let counted = Instrumented::new(&mut memory, &f, |_, _| {}, |_| {});
    memory.seal();
    let sum = call2(f.address);
    let inputs = sum_inputs();
    for &(n, mask) in &inputs {
        assert_eq!(sum(n, mask), sum_model(n, mask), "sum({n}, {mask})");
    }
    let counts = counted.counts(&memory);
    let [lp, even, odd, next, done] = f.labels[..] else { panic!() };
    let iterations: u64 = inputs.iter().map(|&(n, _)| n).sum();
    let evens: u64 = inputs.iter().map(|&(n, m)| (0..n).filter(|i| i & m == 0).count() as u64).sum();
    let called = inputs.len() as u64;
    let looped = inputs.iter().filter(|&&(n, _)| n > 0).count() as u64;
    assert_eq!(counts.calls(), called);
    assert_eq!(counted.block(&counts, f.address), called);
    assert_eq!(counted.block(&counts, lp), iterations);
    assert_eq!(counted.block(&counts, even), evens);
    assert_eq!(counted.block(&counts, odd), iterations - evens);
    assert_eq!(counted.block(&counts, next), iterations);
    assert_eq!(counted.block(&counts, done), called);
    assert_eq!(counted.branch(&counts, f.address), (called - looped, looped));
    assert_eq!(counted.branch(&counts, lp), (iterations - evens, evens));
    assert_eq!(counted.branch(&counts, next), (iterations - looped, looped));
    // 4 counters for 6 blocks and 9 edges; blocks among them; no flags to save.
    assert_eq!(counted.placement.counted().len(), 4);
    assert!(counted.placement.counted().iter().any(|q| matches!(q, Quantity::Block(_))));
    assert!(!counted.pushes_flags());
}

/// Four threads run the patched loop at once: `lock inc` loses nothing,
/// every count is exactly 1000 times one pass's.
#[test]
fn arcs_patched_counts_are_exact_with_four_threads() {
    let mut memory = Memory::new();
    let (once, shared) = (sum_loop(&mut memory), sum_loop(&mut memory));
    let counted_once = Instrumented::new(&mut memory, &once, |_, _| {}, |_| {});
    let counted_shared = Instrumented::new(&mut memory, &shared, |_, _| {}, |_| {});
    memory.seal();
    let inputs = sum_inputs();
    for &(n, mask) in &inputs {
        call2(once.address)(n, mask);
    }
    let address = shared.address;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let inputs = inputs.clone();
            std::thread::spawn(move || {
                for _ in 0..250 {
                    for &(n, mask) in &inputs {
                        assert_eq!(call2(address)(n, mask), sum_model(n, mask));
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let (one, all) = (counted_once.counts(&memory), counted_shared.counts(&memory));
    let scaled: Vec<i64> = one.edges().iter().map(|c| c * 1000).collect();
    assert_eq!(all.edges(), scaled);
    assert_eq!(all.blocks(), one.blocks().iter().map(|c| c * 1000).collect::<Vec<u64>>());
    assert_eq!(all.calls(), 200_000);
}

/// `h(x) = x odd ? 3x + 1 : x / 2`, its `x / 2` block's start labelled.
fn collatz_step(memory: &mut Memory) -> Function {
    memory.function(|a| {
        let mut half = a.create_label();
        a.mov(rax, rdi)?;
        a.test(dil, 1)?;
        a.je(half)?;
        a.lea(rax, qword_ptr(rdi + rdi * 2 + 1))?;
        a.ret()?;
        a.set_label(&mut half)?;
        a.shr(rax, 1)?;
        a.ret()?;
        Ok(vec![half])
    })
}

/// `h(x) = x odd ? 3x + 1 : x / 2`, and `g(n) = h(0) + ... + h(n - 1)`,
/// which calls it: the call moved into a stub returns into `g`'s code.
#[test]
fn arcs_patched_caller_and_callee_count_exactly() {
    let mut memory = Memory::new();
    let h = collatz_step(&mut memory);
    let h_at = h.address;
    let g = memory.function(|a| {
        let [mut lp, mut after, mut done] = [(); 3].map(|_| a.create_label());
        a.push(rbx)?;
        a.push(r12)?;
        a.push(r13)?;
        a.xor(r12d, r12d)?;
        a.mov(r13, rdi)?;
        a.xor(ebx, ebx)?;
        a.test(r13, r13)?;
        a.je(done)?;
        a.set_label(&mut lp)?;
        a.mov(rdi, rbx)?;
        a.call(h_at)?;
        a.set_label(&mut after)?;
        a.add(r12, rax)?;
        a.inc(rbx)?;
        a.cmp(rbx, r13)?;
        a.jb(lp)?;
        a.set_label(&mut done)?;
        a.mov(rax, r12)?;
        a.pop(r13)?;
        a.pop(r12)?;
        a.pop(rbx)?;
        a.ret()?;
        Ok(vec![lp, after, done])
    });
    let counted_h = Instrumented::new(&mut memory, &h, |_, _| {}, |_| {});
    let counted_g = Instrumented::new(&mut memory, &g, counting_block_at(g.labels[0]), |_| {});
    memory.seal();
    let model_h = |x: u64| if x & 1 == 1 { 3 * x + 1 } else { x / 2 };
    for n in 0..40 {
        assert_eq!(call2(g.address)(n, 0), (0..n).map(model_h).sum::<u64>());
    }
    let (gc, hc) = (counted_g.counts(&memory), counted_h.counts(&memory));
    let [lp, after, done] = g.labels[..] else { panic!() };
    let inner: u64 = (0..40).sum();
    assert_eq!((gc.calls(), counted_g.block(&gc, lp), counted_g.block(&gc, after), counted_g.block(&gc, done)), (40, inner, inner, 40));
    // Every call returned: the call block's fake edge is 0.
    let fake = counted_g.cfg.edges().iter().position(|e| e.kind == EdgeKind::Fake).unwrap();
    assert_eq!(gc.edge(fake), 0);
    let odd: u64 = (0..40u64).map(|n| n / 2).sum();
    assert_eq!(hc.calls(), inner);
    assert_eq!(counted_h.branch(&hc, h.address), (inner - odd, odd));
    assert_eq!(counted_h.block(&hc, h.labels[0]), inner - odd);
    // The call's block is where g's loop is counted.
    let call_block = counted_g.cfg.block_at(lp).unwrap();
    assert!(counted_g.sites.iter().any(|s| s.block == call_block), "{:?}", counted_g.placement);
}

/// `w(x, y) = y ? h(x) : x`, as `push rbx; ...; call h; pop rbx; ret`:
/// the 2 bytes after the call hold no window, so the return is counted in
/// the call's stub, which the callee returns into.
#[test]
fn arcs_patched_calls_return_into_their_stub_to_count_what_follows() {
    let mut memory = Memory::new();
    let h = collatz_step(&mut memory);
    let h_at = h.address;
    let w = memory.function(|a| {
        let [mut skip, mut after] = [(); 2].map(|_| a.create_label());
        a.push(rbx)?;
        a.mov(rax, rdi)?;
        a.test(rsi, rsi)?;
        a.je(skip)?;
        a.call(h_at)?;
        a.set_label(&mut after)?;
        a.pop(rbx)?;
        a.ret()?;
        a.set_label(&mut skip)?;
        a.pop(rbx)?;
        a.ret()?;
        Ok(vec![after, skip])
    });
    // Without returns into stubs, the block after the call needs a probe.
    let parts = [CodeRange { address: w.address, bytes: &w.code }];
    let cfg = Cfg::build(&parts).unwrap();
    let plain = FunctionCode::new(&cfg, &parts).unwrap();
    assert!(!place_counters(&cfg, &counter_costs(&cfg, &plain)).needs_probe().is_empty());
    let counted = Instrumented::returning(&mut memory, &w);
    assert!(counted.placement.needs_probe().is_empty(), "{:?}", counted.placement);
    assert!(counted.places().contains(&Place::AfterCall), "{:?}", counted.places());
    memory.seal();
    let model_h = |x: u64| if x & 1 == 1 { 3 * x + 1 } else { x / 2 };
    for x in 0..30u64 {
        assert_eq!(call2(w.address)(x, x % 3), if x % 3 != 0 { model_h(x) } else { x });
    }
    let counts = counted.counts(&memory);
    let [after, skip] = w.labels[..] else { panic!() };
    assert_eq!((counts.calls(), counted.block(&counts, after), counted.block(&counts, skip)), (30, 20, 10));
    let fake = counted.cfg.edges().iter().position(|e| e.kind == EdgeKind::Fake).unwrap();
    assert_eq!(counts.edge(fake), 0);
}

/// `x < 10 → 1; x < 100 → 2; odd → 3; else 4`, with near `jcc`s: windows
/// that end in a `jcc`. Counted on blocks, then on the `jcc`s' edges only:
/// the taken edges' counters run where the moved `jcc` jumps, the
/// not-taken edge's after it.
#[test]
fn arcs_patched_jccs_count_their_edges_in_the_stub() {
    let mut memory = Memory::new();
    let classify = |memory: &mut Memory| {
        memory.function(|a| {
            let [mut second, mut third, mut even, mut small, mut medium, mut odd] = [(); 6].map(|_| a.create_label());
            a.set_prefer_short_branch(false);
            a.cmp(rdi, 10)?;
            a.jl(small)?;
            a.set_label(&mut second)?;
            a.cmp(rdi, 100)?;
            a.jl(medium)?;
            a.set_label(&mut third)?;
            a.test(dil, 1)?;
            a.jne(odd)?;
            a.set_label(&mut even)?;
            a.mov(eax, 4)?;
            a.ret()?;
            a.set_label(&mut small)?;
            a.mov(eax, 1)?;
            a.ret()?;
            a.set_label(&mut medium)?;
            a.mov(eax, 2)?;
            a.ret()?;
            a.set_label(&mut odd)?;
            a.mov(eax, 3)?;
            a.ret()?;
            Ok(vec![second, third, even, small, medium, odd])
        })
    };
    let (on_blocks, on_edges) = (classify(&mut memory), classify(&mut memory));
    let counted_blocks = Instrumented::new(&mut memory, &on_blocks, |_, _| {}, |_| {});
    // Only the jccs' edges with counters, not-taken ones dearer than taken ones.
    let edges_only = |cfg: &Cfg, costs: &mut [Cost]| {
        for (cost, quantity) in costs.iter_mut().zip(quantities(cfg)) {
            *cost = match quantity {
                Quantity::Block(_) => Cost::NoCounter,
                Quantity::Edge(e) => match cfg.edges()[e].kind {
                    EdgeKind::NotTaken { .. } => Cost::Counter(5),
                    EdgeKind::Taken { .. } => Cost::Counter(1),
                    _ => Cost::NoCounter,
                },
            }
        }
    };
    let counted_edges = Instrumented::new(&mut memory, &on_edges, edges_only, |_| {});
    memory.seal();
    let model = |x: i64| -> u64 {
        if x < 10 {
            1
        } else if x < 100 {
            2
        } else if x & 1 == 1 {
            3
        } else {
            4
        }
    };
    let inputs: Vec<i64> = (-50..250).chain([i64::MIN, i64::MAX]).collect();
    for f in [&on_blocks, &on_edges] {
        for &x in &inputs {
            assert_eq!(call2(f.address)(x as u64, 0), model(x), "classify({x})");
        }
    }
    let count = |p: &dyn Fn(i64) -> bool| inputs.iter().filter(|&&x| p(x)).count() as u64;
    let small = count(&|x| x < 10);
    let medium = count(&|x| (10..100).contains(&x));
    let odd = count(&|x| x >= 100 && x & 1 == 1);
    let even = count(&|x| x >= 100 && x & 1 == 0);
    let n = inputs.len() as u64;
    for (counted, f) in [(&counted_blocks, &on_blocks), (&counted_edges, &on_edges)] {
        let counts = counted.counts(&memory);
        let [second, third, even_at, small_at, medium_at, odd_at] = f.labels[..] else { panic!() };
        assert_eq!(counts.calls(), n);
        assert_eq!(counted.branch(&counts, f.address), (small, n - small));
        assert_eq!(counted.branch(&counts, second), (medium, odd + even));
        assert_eq!(counted.branch(&counts, third), (odd, even));
        let blocks = [second, third, even_at, small_at, medium_at, odd_at].map(|b| counted.block(&counts, b));
        assert_eq!(blocks, [n - small, odd + even, even, small, medium, odd]);
    }
    let places = counted_edges.places();
    assert_eq!(places.len(), 4);
    assert!(places.contains(&Place::Taken) && places.contains(&Place::NotTaken), "{places:?}");
    assert!(counted_edges.placement.counted().iter().all(|q| matches!(q, Quantity::Edge(_))));
}

/// `cmp rdi,10; je equal` then a block that is only `jl less` (near), whose
/// flags come from the `cmp`: a counter there saves the flags, and the
/// results stay right. Without saving them (the plan edited), `lock inc`
/// leaves SF = OF and `jl` no longer jumps: the check would see it.
#[test]
fn arcs_patched_counter_saves_live_flags() {
    let mut memory = Memory::new();
    let flags = |memory: &mut Memory| {
        memory.function(|a| {
            let [mut jl_block, mut less, mut equal] = [(); 3].map(|_| a.create_label());
            a.cmp(rdi, 10)?;
            a.je(equal)?;
            a.set_label(&mut jl_block)?;
            a.set_prefer_short_branch(false);
            a.jl(less)?;
            a.mov(eax, 3)?;
            a.ret()?;
            a.set_label(&mut less)?;
            a.mov(eax, 1)?;
            a.ret()?;
            a.set_label(&mut equal)?;
            a.mov(eax, 2)?;
            a.ret()?;
            Ok(vec![jl_block])
        })
    };
    let copies = [flags(&mut memory), flags(&mut memory), flags(&mut memory)];
    let jl_block = |f: &Function| f.labels[0];
    // The jl block counted at its start.
    let at_jl = |start: u64| {
        move |cfg: &Cfg, costs: &mut [Cost]| {
            costs[cfg.edges().len() + cfg.block_at(start).unwrap()] = Cost::Counter(0);
        }
    };
    let counted_block = Instrumented::new(&mut memory, &copies[0], at_jl(jl_block(&copies[0])), |_| {});
    // The je's not-taken edge, into the jl block, counted after the moved je.
    let into_jl = |start: u64| {
        move |cfg: &Cfg, costs: &mut [Cost]| {
            let b = cfg.block_at(start).unwrap();
            costs[cfg.edges().len() + b] = Cost::NoCounter;
            let e = cfg.edges().iter().position(|e| e.to == Node::Block(b)).unwrap();
            costs[e] = Cost::Counter(0);
        }
    };
    let counted_edge = Instrumented::new(&mut memory, &copies[1], into_jl(jl_block(&copies[1])), |_| {});
    let unsaved = |sites: &mut [Site]| sites.iter_mut().flat_map(|s| s.counters.iter_mut()).for_each(|c| c.flags_live = false);
    let broken = Instrumented::new(&mut memory, &copies[2], at_jl(jl_block(&copies[2])), unsaved);
    memory.seal();
    let model = |x: i64| -> u64 {
        if x == 10 {
            2
        } else if x < 10 {
            1
        } else {
            3
        }
    };
    let inputs: Vec<i64> = (-20..40).collect();
    for f in &copies[..2] {
        for &x in &inputs {
            assert_eq!(call2(f.address)(x as u64, 0), model(x), "flags({x})");
        }
    }
    for (counted, f) in [(&counted_block, &copies[0]), (&counted_edge, &copies[1])] {
        let b = counted.cfg.block_at(jl_block(f)).unwrap();
        let into = counted.cfg.edges().iter().position(|e| e.to == Node::Block(b)).unwrap();
        let mut counters = counted.sites.iter().flat_map(|s| &s.counters);
        let at_jl = counters.find(|c| c.quantity == Quantity::Block(b) || c.quantity == Quantity::Edge(into));
        assert!(at_jl.is_some_and(|c| c.flags_live), "{:?}", counted.sites);
        assert!(counted.pushes_flags());
        let counts = counted.counts(&memory);
        let less = inputs.iter().filter(|&&x| x < 10).count() as u64;
        assert_eq!(counted.block(&counts, jl_block(f)), inputs.len() as u64 - 1);
        assert_eq!(counted.branch(&counts, jl_block(f)), (less, inputs.len() as u64 - 1 - less));
    }
    assert!(counted_edge.places().contains(&Place::NotTaken));
    // The flags clobbered: x < 10 no longer takes the jl.
    assert!(!broken.pushes_flags());
    assert_eq!(call2(copies[2].address)(5, 0), 3);
}

/// `mov rax,rdi; L: dec rdi; jne L; ret`: a loop of one 5-byte block, the
/// window its whole block, the moved `jne` jumping back to the window's
/// start. It must go through the original jump (and count the block
/// again), not to its moved copy in the stub. Counted once as the costs
/// say, once with the back edge's counter forced.
#[test]
fn arcs_patched_loop_of_one_block_counts_each_turn() {
    let mut memory = Memory::new();
    let tight = |memory: &mut Memory| {
        memory.function(|a| {
            let mut top = a.create_label();
            a.mov(rax, rdi)?;
            a.set_label(&mut top)?;
            a.dec(rdi)?;
            a.jne(top)?;
            a.ret()?;
            Ok(vec![top])
        })
    };
    let (plain, forced) = (tight(&mut memory), tight(&mut memory));
    let counted_plain = Instrumented::new(&mut memory, &plain, |_, _| {}, |_| {});
    let back_edge = |cfg: &Cfg, costs: &mut [Cost]| {
        let e = cfg.edges().iter().position(|e| matches!(e.kind, EdgeKind::Taken { .. })).unwrap();
        costs[e] = Cost::Counter(0);
    };
    let counted_forced = Instrumented::new(&mut memory, &forced, back_edge, |_| {});
    memory.seal();
    let inputs: Vec<u64> = (1..=60).collect();
    let turns: u64 = inputs.iter().sum();
    for (counted, f) in [(&counted_plain, &plain), (&counted_forced, &forced)] {
        for &n in &inputs {
            assert_eq!(call2(f.address)(n, 0), n);
        }
        let top = f.labels[0];
        let site = counted.sites.iter().find(|s| s.at == top);
        assert!(site.is_some_and(|s| s.len() == 5), "{:?}", counted.sites);
        let counts = counted.counts(&memory);
        assert_eq!(counted.block(&counts, top), turns);
        assert_eq!(counted.branch(&counts, top), (turns - 60, 60));
    }
    assert!(counted_plain.placement.counted().contains(&Quantity::Block(counted_plain.cfg.block_at(plain.labels[0]).unwrap())));
    assert!(counted_forced.places().contains(&Place::Taken));
}

/// `h` as above; callers that sum `h(0) + ... + h(n - 1)` calling it
/// through a register and through memory (`call r14`, `call [rip+slot]`):
/// the calls moved into stubs jump through the same operand with the
/// original return address pushed.
#[test]
fn arcs_patched_indirect_calls_return_into_the_caller() {
    let mut memory = Memory::new();
    let h = collatz_step(&mut memory);
    let h_at = h.address;
    let caller = |memory: &mut Memory, through_memory: bool| {
        memory.function(|a| {
            let [mut lp, mut done, mut slot] = [(); 3].map(|_| a.create_label());
            a.push(rbx)?;
            a.push(r12)?;
            a.push(r13)?;
            a.push(r14)?;
            a.sub(rsp, 8)?;
            a.mov(r14, h_at)?;
            a.xor(r12d, r12d)?;
            a.mov(r13, rdi)?;
            a.xor(ebx, ebx)?;
            a.test(r13, r13)?;
            a.je(done)?;
            a.set_label(&mut lp)?;
            a.mov(rdi, rbx)?;
            if through_memory {
                a.call(qword_ptr(slot))?;
            } else {
                a.call(r14)?;
            }
            a.add(r12, rax)?;
            a.inc(rbx)?;
            a.cmp(rbx, r13)?;
            a.jb(lp)?;
            a.set_label(&mut done)?;
            a.mov(rax, r12)?;
            a.add(rsp, 8)?;
            a.pop(r14)?;
            a.pop(r13)?;
            a.pop(r12)?;
            a.pop(rbx)?;
            a.ret()?;
            a.set_label(&mut slot)?;
            a.db(&h_at.to_le_bytes())?;
            Ok(vec![lp])
        })
    };
    let (by_register, by_memory) = (caller(&mut memory, false), caller(&mut memory, true));
    let counted_h = Instrumented::new(&mut memory, &h, |_, _| {}, |_| {});
    let counted_register = Instrumented::new(&mut memory, &by_register, counting_block_at(by_register.labels[0]), |_| {});
    let counted_memory = Instrumented::new(&mut memory, &by_memory, counting_block_at(by_memory.labels[0]), |_| {});
    memory.seal();
    let model_h = |x: u64| if x & 1 == 1 { 3 * x + 1 } else { x / 2 };
    for f in [&by_register, &by_memory] {
        for n in 0..40 {
            assert_eq!(call2(f.address)(n, 0), (0..n).map(model_h).sum::<u64>());
        }
    }
    let inner: u64 = (0..40).sum();
    for (counted, f) in [(&counted_register, &by_register), (&counted_memory, &by_memory)] {
        let counts = counted.counts(&memory);
        let lp = f.labels[0];
        assert_eq!((counts.calls(), counted.block(&counts, lp)), (40, inner));
        // The call's block holds a counter and its call moved into the stub.
        let call_block = counted.cfg.block_at(lp).unwrap();
        let site = counted.sites.iter().find(|s| s.block == call_block).unwrap();
        assert_eq!(site.replaced.last().unwrap().mnemonic(), Mnemonic::Call);
    }
    assert_eq!(counted_h.counts(&memory).calls(), 2 * inner);
}

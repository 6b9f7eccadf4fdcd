//! Edge counting checked against an oracle that sees every instruction and
//! jump: real C programs, at -O0 and -O2, run under
//! `valgrind --tool=callgrind --collect-jumps=yes --dump-instr=yes`. From
//! its counts, each edge's true count; only the counted edges' go to
//! `solve`, which must give back every other edge, block and branch count.
//!
//! The fraction of edges that needed a counter is printed (run with
//! `--nocapture`): on these programs, 225 counters for 457 real edges (the
//! fake and virtual ones left out) in 322 blocks of 52 functions, jump
//! tables read from the binary. A call ends its block, which adds a block
//! and two edges (the fall-through and the fake edge): one counter more per
//! call, as with gcc.
//!
//! The same functions with counters on blocks and on jccs' edges, costs
//! from their code ([`counter_costs`]): the same 225 counters, 224 of them
//! on blocks, in 206 sites, none needing the flags saved; 17 functions
//! need a probe where no window fits: the `hlt` after `__libc_start_main`
//! in each `_start`, a 4-byte function (`never_called`), `leave; ret` or
//! `add; ret` after a call, and 2- to 4-byte blocks of `test; jne`,
//! `jmp rel8`. When calls may return into their stubs (the return after a
//! call counted there), 3 functions still do.
#![allow(clippy::unwrap_used, missing_docs)]

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use proftap_probes::arcs::{
    Cfg, CodeRange, Data, EdgeKind, FunctionCode, Node, Quantity, counter_costs, default_costs, place, place_counters, plan_sites, solve,
    solve_counters, stub,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

fn build(source: &str, opt: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{}{opt}", source.trim_end_matches(".c")));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(source);
    let status = Command::new("gcc").arg(opt).arg("-g").arg("-o").arg(&out).arg(source).status().unwrap();
    assert!(status.success(), "gcc failed");
    out
}

/// What callgrind saw in one object: executions per instruction, and per
/// jump source its targets with how often it jumped there.
#[derive(Default)]
struct Oracle {
    executed: HashMap<u64, u64>,
    jumps: HashMap<u64, BTreeMap<u64, u64>>,
    /// Per source, what callgrind took for calls: real calls, and jumps
    /// into another function's symbol (`f` to `f.cold`, a tail call).
    calls: HashMap<u64, BTreeMap<u64, u64>>,
}

impl Oracle {
    /// How often the branch at `at` jumped, to a target inside its
    /// function or out of it.
    fn jumped(&self, at: u64) -> u64 {
        [&self.jumps, &self.calls].iter().map(|m| m.get(&at).map_or(0, |t| t.values().sum::<u64>())).sum()
    }
}

fn address(field: &str) -> u64 {
    u64::from_str_radix(field.trim_start_matches("0x"), 16).unwrap()
}

/// Reads callgrind's output (positions `instr line`, names and positions
/// uncompressed) for the object `binary`. A cost line right after `calls=`
/// is the call's inclusive cost, not an execution (but it names the call's
/// source: a jump into another symbol is a call too); `jump=N target` and
/// `jcnd=JUMPED/EXECUTED target` are followed by their source's position.
fn parse_callgrind(text: &str, binary: &Path) -> Oracle {
    let mut oracle = Oracle::default();
    let mut ours = false;
    let mut call: Option<(u64, u64)> = None;
    let mut jump: Option<(u64, u64)> = None;
    for line in text.lines() {
        if let Some(object) = line.strip_prefix("ob=") {
            ours = Path::new(object) == binary;
            continue;
        }
        if let Some(rest) = line.strip_prefix("calls=") {
            let mut fields = rest.split_whitespace();
            call = Some((fields.next().unwrap().parse().unwrap(), address(fields.next().unwrap())));
            continue;
        }
        if let Some(rest) = line.strip_prefix("jump=").or_else(|| line.strip_prefix("jcnd=")) {
            let mut fields = rest.split_whitespace();
            let count = fields.next().unwrap().split('/').next().unwrap().parse().unwrap();
            jump = Some((count, address(fields.next().unwrap())));
            continue;
        }
        if !line.starts_with("0x") {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = address(fields[0]);
        if let Some((count, target)) = jump.take() {
            if ours {
                *oracle.jumps.entry(at).or_default().entry(target).or_default() += count;
            }
        } else if let Some((count, target)) = call.take() {
            if ours {
                *oracle.calls.entry(at).or_default().entry(target).or_default() += count;
            }
        } else if ours {
            *oracle.executed.entry(at).or_default() += fields[2].parse::<u64>().unwrap();
        }
    }
    oracle
}

fn callgrind(binary: &Path, args: &[&str], dir: &Path) -> Oracle {
    if which::which("valgrind").is_err() {
        panic!("valgrind is needed for the edge-count oracle: install it (apt-get install valgrind)");
    }
    let out = dir.join("callgrind.out");
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--collect-jumps=yes", "--dump-instr=yes", "--compress-pos=no", "--compress-strings=no"])
        // PLT stubs kept apart: otherwise their instructions add to the call's.
        .arg("--skip-plt=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(binary)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "valgrind failed on {}", binary.display());
    parse_callgrind(&std::fs::read_to_string(out).unwrap(), binary)
}

/// A function's code: its symbol's bytes, and those of its `.cold` part.
struct Function {
    name: String,
    parts: Vec<(u64, Vec<u8>)>,
}

fn functions(binary: &Path) -> Vec<Function> {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut by_name: BTreeMap<String, Function> = BTreeMap::new();
    let mut cold = Vec::new();
    for symbol in file.symbols().filter(|s| s.kind() == SymbolKind::Text && s.size() > 0) {
        let Some(section) = symbol.section_index().and_then(|i| file.section_by_index(i).ok()) else { continue };
        let bytes = section.data_range(symbol.address(), symbol.size()).unwrap().unwrap().to_vec();
        let name = symbol.name().unwrap().to_string();
        match name.strip_suffix(".cold") {
            Some(main) => cold.push((main.to_string(), (symbol.address(), bytes))),
            None => {
                by_name.insert(name.clone(), Function { name, parts: vec![(symbol.address(), bytes)] });
            }
        }
    }
    for (main, part) in cold {
        by_name.get_mut(&main).unwrap().parts.push(part);
    }
    by_name.into_values().collect()
}

/// Each edge's true count from callgrind's: a block runs as often as its
/// first instruction, a `jcc` jumps as callgrind counted, a fall-through
/// after a call carries what its block ran beyond its other inflows, and
/// a fake edge what its call block ran beyond its fall-through.
fn true_counts(cfg: &Cfg, oracle: &Oracle) -> Vec<i64> {
    let runs = |b: usize| oracle.executed.get(&cfg.blocks()[b].start).copied().unwrap_or(0) as i64;
    let jumped = |at: u64| oracle.jumped(at) as i64;
    let edges = cfg.edges();
    let mut truth: Vec<Option<i64>> = edges
        .iter()
        .map(|e| {
            let Node::Block(from) = e.from else { return None };
            let ends_in_call = edges.iter().any(|f| f.from == e.from && f.kind == EdgeKind::Fake);
            match e.kind {
                EdgeKind::Taken { jcc } => Some(jumped(jcc)),
                // A jump through a table: how often it went to this target.
                EdgeKind::Jump { at } if edges.iter().filter(|f| f.from == e.from).count() > 1 => {
                    let Node::Block(to) = e.to else { return Some(0) };
                    let target = cfg.blocks()[to].start;
                    Some(oracle.jumps.get(&at).and_then(|t| t.get(&target)).copied().unwrap_or(0) as i64)
                }
                EdgeKind::NotTaken { jcc } => Some(runs(from) - jumped(jcc)),
                EdgeKind::FallThrough if ends_in_call => None,
                EdgeKind::Fake if edges.iter().all(|f| f.from != e.from || f.kind == EdgeKind::Fake) => Some(runs(from)),
                EdgeKind::Fake => None,
                _ => Some(runs(from)),
            }
        })
        .collect();
    // Edges into a block whose other inflows are known.
    for (id, edge) in edges.iter().enumerate() {
        if truth[id].is_none() {
            if let Node::Block(to) = edge.to {
                let others: i64 =
                    edges.iter().enumerate().filter(|&(o, f)| o != id && f.to == edge.to).map(|(o, _)| truth[o].unwrap()).sum();
                truth[id] = Some(runs(to) - others);
            }
        }
    }
    for (id, edge) in edges.iter().enumerate() {
        if edge.kind == EdgeKind::Fake && truth[id].is_none() {
            let Node::Block(from) = edge.from else { unreachable!() };
            let after: i64 =
                edges.iter().enumerate().filter(|&(o, f)| o != id && f.from == edge.from).map(|(o, _)| truth[o].unwrap()).sum();
            truth[id] = Some(runs(from) - after);
        }
    }
    let entry = edges.iter().position(|e| e.kind == EdgeKind::Entry).unwrap();
    let virtual_edge = edges.iter().position(|e| e.kind == EdgeKind::Virtual).unwrap();
    truth[virtual_edge] = truth[entry];
    truth.into_iter().map(Option::unwrap).collect()
}

/// What the oracle says that the graph must agree with: every executed
/// instruction of the function is in a block and runs as often as the
/// block's first; every jump callgrind saw leaves a block's last
/// instruction for one of its edges' targets.
fn check_graph_against_oracle(name: &str, cfg: &Cfg, function: &Function, oracle: &Oracle) {
    for (start, bytes) in &function.parts {
        for (&at, &count) in oracle.executed.range_in(*start, *start + bytes.len() as u64) {
            let block = cfg.block_holding(at).unwrap_or_else(|| panic!("{name}: {at:#x} ran {count} times but is in no block"));
            let first = oracle.executed.get(&cfg.blocks()[block].start).copied().unwrap_or(0);
            assert_eq!(count, first, "{name}: {at:#x} ran {count} times, its block's first instruction {first}");
        }
    }
    for (&source, targets) in oracle.jumps.iter().filter(|(s, _)| function.parts.iter().any(|(a, b)| (*a..*a + b.len() as u64).contains(s)))
    {
        let block = cfg.block_holding(source).unwrap_or_else(|| panic!("{name}: a jump from {source:#x}, in no block"));
        assert_eq!(cfg.blocks()[block].instructions.last(), Some(&source), "{name}: a jump from {source:#x} inside a block");
        for &target in targets.keys() {
            let to = cfg.block_at(target).map_or(Node::Exit, Node::Block);
            let found = cfg.edges().iter().any(|e| e.from == Node::Block(block) && e.to == to && !e.kind.is_artificial());
            assert!(found, "{name}: no edge for the jump {source:#x} -> {target:#x}");
        }
    }
}

trait RangeIn {
    fn range_in(&self, start: u64, end: u64) -> Vec<(&u64, &u64)>;
}

impl RangeIn for HashMap<u64, u64> {
    fn range_in(&self, start: u64, end: u64) -> Vec<(&u64, &u64)> {
        self.iter().filter(|(a, _)| (start..end).contains(*a)).collect()
    }
}

/// Counted and real edges over the functions checked.
#[derive(Default, Debug)]
struct Tally {
    functions: usize,
    counted: usize,
    real_edges: usize,
    blocks: usize,
    /// Functions with a jump table.
    tables: Vec<String>,
    cold_parts: Vec<String>,
    returned_twice: Vec<String>,
    /// Counters placed on blocks and jccs' edges (with costs from the code).
    counters: Counters,
}

/// What the counter placement made of the functions.
#[derive(Default, Debug)]
struct Counters {
    counted: usize,
    blocks: usize,
    probes: usize,
    functions_with_probes: usize,
    /// The same, when calls may return into stubs.
    functions_with_probes_returning: usize,
    sites: usize,
    saving_flags: usize,
}

/// Addresses of `n` counters just below the stubs at `stubs`.
fn counters_for(n: usize, stubs: u64) -> Vec<u64> {
    (0..n as u64).map(|i| stubs - 4096 + 8 * i).collect()
}

/// The counters on blocks and jccs' edges, costs from the code: the
/// counted quantities' true counts (those needing a probe too) give every
/// count back; every other counted quantity has a site inside its block,
/// whose stub can be built 256 MiB away and reached by a 5-byte jump.
fn check_counters(name: &str, cfg: &Cfg, parts: &[CodeRange<'_>], truth: &[i64], oracle: &Oracle, tally: &mut Counters) {
    let code = FunctionCode::new(cfg, parts).unwrap();
    let placement = place_counters(cfg, &counter_costs(cfg, &code));
    let ran = |b: usize| oracle.executed.get(&cfg.blocks()[b].start).copied().unwrap_or(0);
    let given: Vec<u64> = placement
        .counted()
        .iter()
        .map(|&q| match q {
            Quantity::Edge(e) => truth[e] as u64,
            Quantity::Block(b) => ran(b),
        })
        .collect();
    let counts = solve_counters(cfg, &placement, &given).unwrap_or_else(|e| panic!("{name}: counters: {e}"));
    assert_eq!(counts.edges(), truth, "{name}: counters");
    let sites = plan_sites(cfg, &code, &placement).unwrap_or_else(|e| panic!("{name}: {e}"));
    let stubs = parts[0].address + (256 << 20);
    let counters = counters_for(given.len(), stubs);
    for site in &sites {
        let block = &cfg.blocks()[site.block];
        assert!(site.at >= block.start && site.end() <= block.end() && site.len() >= 5, "{name}: {site:?}");
        stub(site, stubs, &counters).unwrap_or_else(|e| panic!("{name}: {e}"));
        site.jump_to(stubs).unwrap();
    }
    tally.counted += placement.counted().len();
    tally.blocks += placement.counted().iter().filter(|q| matches!(q, Quantity::Block(_))).count();
    tally.probes += placement.needs_probe().len();
    tally.functions_with_probes += usize::from(!placement.needs_probe().is_empty());
    // With calls returning into stubs, the return after a call can be counted.
    let mut returning = code.clone();
    returning.let_calls_return_to_stubs();
    let placement = place_counters(cfg, &counter_costs(cfg, &returning));
    let counts = placement
        .counted()
        .iter()
        .map(|&q| match q {
            Quantity::Edge(e) => truth[e] as u64,
            Quantity::Block(b) => ran(b),
        })
        .collect::<Vec<u64>>();
    let solved = solve_counters(cfg, &placement, &counts).unwrap_or_else(|e| panic!("{name}: counters returning into stubs: {e}"));
    assert_eq!(solved.edges(), truth, "{name}: counters returning into stubs");
    for site in plan_sites(cfg, &returning, &placement).unwrap_or_else(|e| panic!("{name}: {e}")) {
        stub(&site, stubs, &counters_for(placement.counted().len(), stubs)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    tally.functions_with_probes_returning += usize::from(!placement.needs_probe().is_empty());
    tally.sites += sites.len();
    tally.saving_flags += sites.iter().flat_map(|s| &s.counters).filter(|c| c.flags_live).count();
}

/// `len` bytes of the binary's file at link-time address `address`.
fn read_data(binary: &[u8], address: u64, len: usize) -> Option<Vec<u8>> {
    let file = object::File::parse(binary).ok()?;
    let section = file.sections().find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
    let data = section.data().ok()?;
    let offset = (address - section.address()) as usize;
    data.get(offset..offset + len).map(<[u8]>::to_vec)
}

fn check_program(source: &str, opt: &str, args: &[&str], tally: &mut Tally) {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(source, opt, dir.path());
    let oracle = callgrind(&binary, args, dir.path());
    let image = std::fs::read(&binary).unwrap();
    let read = |address: u64, len: usize| read_data(&image, address, len);
    let data = Data { read: &read, bias: 0 };
    let mut ran_main = false;
    for function in functions(&binary) {
        let parts: Vec<CodeRange<'_>> = function.parts.iter().map(|(a, b)| CodeRange { address: *a, bytes: b }).collect();
        let cfg = Cfg::build_reading(&parts, Some(&data)).unwrap_or_else(|error| panic!("{source} {opt} {}: {error}", function.name));
        let table_jumps = (0..cfg.blocks().len())
            .filter(|&b| cfg.edges().iter().filter(|e| e.from == Node::Block(b) && matches!(e.kind, EdgeKind::Jump { .. })).count() > 1);
        if table_jumps.count() > 0 {
            tally.tables.push(format!("{source} {opt} {}", function.name));
        }
        let name = format!("{source} {opt} {}", function.name);
        check_graph_against_oracle(&name, &cfg, &function, &oracle);
        let truth = true_counts(&cfg, &oracle);
        for (id, edge) in cfg.edges().iter().enumerate() {
            assert!(edge.kind.is_artificial() || truth[id] >= 0, "{name}: the oracle gives {:?} {}", edge, truth[id]);
        }
        let placement = place(&cfg, &default_costs(&cfg));
        assert_eq!(placement.counted().len(), cfg.edges().len() + 1 - cfg.node_count(), "{name}");
        assert!(placement.counted().iter().all(|&e| !cfg.edges()[e].kind.is_artificial()), "{name}");
        let given: Vec<u64> = placement.counted().iter().map(|&e| truth[e] as u64).collect();
        let counts = solve(&cfg, &placement, &given).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(counts.edges(), &truth[..], "{name}: edges {:?}", cfg.edges());
        for (b, block) in cfg.blocks().iter().enumerate() {
            let ran = oracle.executed.get(&block.start).copied().unwrap_or(0);
            assert_eq!(counts.block(b), ran, "{name}: block at {:#x}", block.start);
        }
        for branch in counts.branches(&cfg) {
            let ran = oracle.executed.get(&branch.jcc).copied().unwrap_or(0);
            let jumped = oracle.jumped(branch.jcc);
            assert_eq!((branch.taken, branch.not_taken), (jumped, ran - jumped), "{name}: branch at {:#x}", branch.jcc);
        }
        check_counters(&name, &cfg, &parts, &truth, &oracle, &mut tally.counters);
        ran_main |= function.name == "main" && counts.calls() == 1;
        // setjmp returns more often than it is called: its fake edge is negative.
        if cfg.edges().iter().enumerate().any(|(e, edge)| edge.kind == EdgeKind::Fake && counts.edge(e) < 0) {
            tally.returned_twice.push(name.clone());
        }
        if function.parts.len() > 1 {
            let cold = function.parts[1].0;
            let ran = oracle.executed.get(&cold).copied().unwrap_or(0);
            tally.cold_parts.push(format!("{name}: cold part at {cold:#x} ran {ran} times"));
        }
        tally.functions += 1;
        tally.counted += placement.counted().len();
        tally.real_edges += cfg.edges().iter().filter(|e| !e.kind.is_artificial()).count();
        tally.blocks += cfg.blocks().len();
    }
    assert!(ran_main, "{source} {opt}: main was not checked");
}

#[test]
fn arcs_counts_derived_from_counted_edges_equal_callgrinds() {
    let mut tally = Tally::default();
    for opt in ["-O0", "-O2"] {
        check_program("coverage.c", opt, &["40"], &mut tally);
        check_program("calls.c", opt, &["300", "12"], &mut tally);
        check_program("jumps.c", opt, &["20", "4"], &mut tally);
        check_program("branches.c", opt, &["200"], &mut tally);
    }
    println!(
        "{} functions, {} blocks: {} counters for {} edges ({:.0}%)",
        tally.functions,
        tally.blocks,
        tally.counted,
        tally.real_edges,
        100.0 * tally.counted as f64 / tally.real_edges as f64
    );
    let c = &tally.counters;
    println!(
        "counters on blocks and jccs: {} ({} on blocks) in {} sites, {} saving the flags; {} in {} functions need a probe ({} when calls return into stubs)",
        c.counted, c.blocks, c.sites, c.saving_flags, c.probes, c.functions_with_probes, c.functions_with_probes_returning
    );
    assert_eq!(c.counted, tally.counted);
    // Most counters are on blocks; most functions need no probe.
    assert!(2 * c.blocks > c.counted && 2 * c.functions_with_probes < tally.functions, "{c:?}");
    // Counting returns in stubs leaves only what no window fits in at all.
    assert!(c.functions_with_probes_returning < c.functions_with_probes, "{c:?}");
    for line in &tally.cold_parts {
        println!("{line}");
    }
    assert!(tally.counted < tally.real_edges);
    // The jump table of dispatch() is read at both levels (its edges'
    // counts checked with callgrind's above).
    assert_eq!(tally.tables, ["branches.c -O0 dispatch", "branches.c -O2 dispatch"]);
    // jumps.c's main calls setjmp, which longjmp makes return twice.
    assert_eq!(tally.returned_twice, ["jumps.c -O0 main", "jumps.c -O2 main"]);
    // checked()'s unlikely path is a .cold part at -O2, and it ran.
    let cold = tally.cold_parts.iter().find(|c| c.contains("branches.c -O2 checked"));
    assert!(cold.is_some_and(|c| !c.ends_with(" ran 0 times")), "{:?}", tally.cold_parts);
}

//! Edge counters patched into a held process, the way a `--coverage` build
//! counts (see [`crate::arcs`]): each counted function's graph is read from
//! its file, its counters placed off a spanning tree, a 5-byte jump patched
//! over each counter's window to a stub that increments the counter and
//! runs the moved instructions. Counters live in memory shared with
//! proftap, so they are read after the process is gone.

use super::lock_table;
use super::patcher::{CodeSource, Refused, Target};
use super::remote::{Remote, RemoteError, Shared};
use crate::arcs::{self, Cfg, CodeRange, CounterPlacement, Counts, Frame, FunctionCode, FunctionLines, Node, Site};
use crate::plan::ProbedFunction;
use crate::procfs::LoadedModule;
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;

/// The most a stub takes: counters, saved flags, the moved instructions
/// (a few bytes more each once re-encoded) and the jump back.
const STUB_ROOM: usize = 192;

/// What a region hook adds to a stub: `lea`, `push`, `call [rip+slot]`, `lea`.
const HOOK_ROOM: usize = 32;

/// Bytes before the stubs: the region trampoline's address.
const SLOT_ROOM: usize = 16;

/// Bytes at each function's entry left to the function engine's jump,
/// after an `endbr64` (which stays: indirect calls must find it).
const ENTRY_RESERVED: u64 = 5;

/// `endbr64`, which starts every function of a build with indirect branch
/// tracking (`-fcf-protection`, the default of Ubuntu's and Fedora's compilers).
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The most instructions a thread is stepped to leave a stub or a place
/// where its line cannot be told, when counting starts or ends.
const MOST_STEPS: usize = 256;

/// A function whose counters are planned.
struct Planned {
    function: usize,
    /// Runtime address less link-time address.
    bias: u64,
    cfg: Cfg,
    placement: CounterPlacement,
    sites: Vec<Site>,
    /// Where a thread's line cannot be told (see [`arcs::unsettled`]).
    unsettled: Vec<Range<u64>>,
}

/// What edge counting may do to the code.
#[derive(Clone, Copy, Debug, Default)]
pub struct Choices {
    /// Calls may return into stubs (see
    /// [`FunctionCode::let_calls_return_to_stubs`]): the program never
    /// unwinds its stack through them.
    pub returns_into_stubs: bool,
    /// A counter may take a function's entry, where the function engine's
    /// jump would go, when nothing else counts its first block.
    pub may_take_entries: bool,
}

/// The counters to patch into a process, and the functions that cannot be
/// counted.
pub struct Plan {
    modules: Vec<Vec<Planned>>,
    /// Functions that cannot be counted, and why.
    pub refused: Refused,
    /// Functions counted at their entry: the function engine must leave them.
    pub entries_taken: Vec<usize>,
}

/// Regions to hook with the counters (see [`arcs::regions`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Regions<'a> {
    /// Per line id, the regions that hold it.
    pub of_lines: &'a [Vec<u32>],
}

/// The counter plans of the `targets` that `wanted` picks (by index) in
/// the process whose modules are `modules`, grouped by module; `lines`
/// (by target, at link-time addresses; empty: unknown) tells where a
/// thread's line could not be told when counting starts or ends, and
/// where the hooks of `regions` go.
pub fn plan(
    modules: &[LoadedModule],
    targets: &[Target],
    wanted: &[bool],
    choices: Choices,
    lines: &[FunctionLines],
    regions: Regions<'_>,
) -> Plan {
    let chosen: Vec<usize> = (0..targets.len()).filter(|&i| wanted.get(i).copied().unwrap_or(false)).collect();
    // Each function is planned alone.
    let planned = super::patcher::on_every_cpu(&chosen, |share| plan_functions(modules, targets, share, choices, lines, regions));
    let mut by_module: Vec<(PathBuf, Vec<Planned>)> = Vec::new();
    let mut plan = Plan { modules: Vec::new(), refused: Vec::new(), entries_taken: Vec::new() };
    for (_, outcome) in planned {
        match outcome {
            Ok((module, p, entry_taken)) => {
                if entry_taken {
                    plan.entries_taken.push(p.function);
                }
                match by_module.iter_mut().find(|(m, _)| *m == module) {
                    Some((_, group)) => group.push(p),
                    None => by_module.push((module, vec![p])),
                }
            }
            Err(refused) => plan.refused.push(refused),
        }
    }
    plan.modules = by_module.into_iter().map(|(_, g)| g).collect();
    plan
}

/// A function's counter plan, with its module and whether a counter takes
/// its entry; or why it has none.
type Outcome = Result<(PathBuf, Planned, bool), (usize, String)>;

/// The counter plans of the targets `chosen` names, by index.
fn plan_functions(
    modules: &[LoadedModule],
    targets: &[Target],
    chosen: &[usize],
    choices: Choices,
    lines: &[FunctionLines],
    regions: Regions<'_>,
) -> Vec<(usize, Outcome)> {
    let mut source = CodeSource::new(modules);
    let mut planned = Vec::with_capacity(chosen.len());
    for &i in chosen {
        let Some(target) = targets.get(i) else { continue };
        let outcome = source.code(target).and_then(|code| {
            let read = |address: u64, len: usize| code.read(address, len);
            let data = arcs::Data { read: &read, bias: code.bias };
            // The function's cold parts are its code too: its jumps go there.
            let parts: Vec<CodeRange<'_>> = std::iter::once(CodeRange { address: code.at, bytes: code.bytes })
                .chain(code.cold.iter().map(|&(address, bytes)| CodeRange { address, bytes }))
                .collect();
            let cfg = Cfg::build_reading(&parts, Some(&data)).map_err(|e| e.to_string())?;
            let own_lines = lines.get(i).map(|l| l.moved_by(code.bias));
            let hooked = own_lines.as_ref().filter(|_| !regions.of_lines.is_empty()).map(|l| (l, regions.of_lines));
            let mut entry_taken = false;
            let planned = plan_function(cfg.clone(), &parts, choices, true, hooked).or_else(|why| {
                if !choices.may_take_entries {
                    return Err(why);
                }
                entry_taken = true;
                plan_function(cfg, &parts, choices, false, hooked)
            });
            planned.map(|(cfg, placement, sites)| {
                let unsettled = lines.get(i).map(|own| unsettled(&cfg, own, code.bias)).unwrap_or_default();
                (code.module.clone(), Planned { function: i, bias: code.bias, cfg, placement, sites, unsettled }, entry_taken)
            })
        });
        planned.push((i, outcome.map_err(|why| (i, why))));
    }
    planned
}

/// Where in `cfg` (at runtime addresses, `bias` past the link-time ones
/// of `lines`) a thread's line cannot be told; none when the lines do not
/// fit the graph (they are refused when counted).
fn unsettled(cfg: &Cfg, lines: &FunctionLines, bias: u64) -> Vec<Range<u64>> {
    arcs::unsettled(cfg, &lines.moved_by(bias)).unwrap_or_default()
}

impl Plan {
    /// Where a thread's line cannot be told, in every planned function:
    /// threads there are moved on before counting starts.
    pub fn unsettled(&self) -> Vec<Range<u64>> {
        self.modules.iter().flatten().flat_map(|p| p.unsettled.iter().cloned()).collect()
    }

    /// Each planned function (its index among the targets), its graph at
    /// runtime addresses, and its runtime address less its link-time one.
    pub fn graphs(&self) -> impl Iterator<Item = (usize, &Cfg, u64)> {
        self.modules.iter().flatten().map(|p| (p.function, &p.cfg, p.bias))
    }
}

/// The plan of the functions `wanted` picks, judged from their files alone
/// (before the program runs): which cannot be counted (or hooked, with
/// `regions`), and which are counted at their entry.
pub fn plan_in_files(
    functions: &[ProbedFunction],
    wanted: &[bool],
    choices: Choices,
    lines: &[FunctionLines],
    regions: Regions<'_>,
) -> Plan {
    let targets: Vec<Target> = functions.iter().map(Target::of).collect();
    plan(&super::patcher::as_in_files(functions), &targets, wanted, choices, lines, regions)
}

/// What quantity `q` of `cfg` counts, in a user's words: where its code is.
fn counted(cfg: &Cfg, q: arcs::Quantity) -> String {
    let block = |b: usize| cfg.blocks().get(b);
    let end = |node: Node| match node {
        Node::Block(b) => block(b).map_or_else(|| "a block".to_string(), |b| format!("{:#x}", b.start)),
        Node::Entry => "its entry".to_string(),
        Node::Exit => "its return".to_string(),
    };
    match q {
        arcs::Quantity::Block(b) => {
            block(b).map_or_else(|| "a block".to_string(), |b| format!("the code at {:#x}, {} bytes", b.start, b.len))
        }
        arcs::Quantity::Edge(e) => match cfg.edges().get(e) {
            Some(edge) => format!("the way from the code at {} to {}", end(edge.from), end(edge.to)),
            None => "an edge".to_string(),
        },
    }
}

/// The counters and sites of a function whose graph is `cfg`, built from
/// `parts`, its entry's first bytes left to the function engine if
/// `spare_entry`; with the hooks of the regions `hooked` gives for its lines
/// (at the graph's addresses).
fn plan_function(
    cfg: Cfg,
    parts: &[CodeRange<'_>],
    choices: Choices,
    spare_entry: bool,
    hooked: Option<(&FunctionLines, &[Vec<u32>])>,
) -> Result<(Cfg, CounterPlacement, Vec<Site>), String> {
    let mut decoded = FunctionCode::new(&cfg, parts).map_err(|e| e.to_string())?;
    if spare_entry {
        let at = parts[0].address;
        let endbr = if parts[0].bytes.starts_with(&ENDBR64) { ENDBR64.len() as u64 } else { 0 };
        decoded.reserve(at..at + endbr + ENTRY_RESERVED);
    }
    if choices.returns_into_stubs {
        decoded.let_calls_return_to_stubs();
    }
    let placement = arcs::place_counters(&cfg, &arcs::counter_costs(&cfg, &decoded));
    if let Some(&q) = placement.needs_probe().first() {
        let n = placement.needs_probe().len();
        return Err(format!(
            "{n} of its counts {} no place for a counter (the first: {})",
            if n == 1 { "has" } else { "have" },
            counted(&cfg, q)
        ));
    }
    let mut sites = arcs::plan_sites(&cfg, &decoded, &placement).map_err(|e| e.to_string())?;
    if let Some((lines, regions_of)) = hooked {
        let hooks = arcs::region_hooks(&cfg, &decoded, lines, regions_of).map_err(|e| e.to_string())?;
        arcs::add_region_hooks(&cfg, &decoded, &mut sites, &hooks).map_err(|e| e.to_string())?;
    }
    Ok((cfg, placement, sites))
}

/// A counted function: its graph and its counters' place in the shared memory.
pub struct Counted {
    /// Its index among the targets.
    pub function: usize,
    /// Runtime address less link-time address: the graph is at runtime addresses.
    pub bias: u64,
    cfg: Cfg,
    placement: CounterPlacement,
    sites: Vec<Site>,
    /// Its first counter's offset in its module's shared memory.
    offset: usize,
    memory: usize,
}

impl Counted {
    /// Its graph, at runtime addresses.
    pub fn cfg(&self) -> &Cfg {
        &self.cfg
    }
}

/// A window patched with a jump to its stub.
struct Applied {
    at: u64,
    original: Vec<u8>,
    jump: Vec<u8>,
}

/// Counters patched into a process.
pub struct Counting {
    functions: Vec<Counted>,
    /// From each stub address on, the original address it stands for.
    origins: Vec<(u64, u64)>,
    memory: Vec<Shared>,
    applied: Vec<Applied>,
    code: Vec<Range<u64>>,
    /// Where threads were in the code when counting started and ended.
    frames: Vec<Frame>,
    unsettled: Vec<Range<u64>>,
    /// The first of the tables of counts still without `lock` (see
    /// [`lock_table`]): the edge counters', then the entries' tables it
    /// was given; 0 if none.
    lock_table: u64,
    /// The bytes its own tables hold (see [`lock_table`]): where, what to write.
    lockable: Vec<(u64, u8)>,
}

/// Moves every thread of the held process past the places of `plan` where
/// its line could not be told, before anything is patched; returns where
/// each thread is then, for [`apply`].
pub fn settle_threads(remote: &Remote, plan: &Plan) -> Result<Vec<u64>, RemoteError> {
    let unsettled = plan.unsettled();
    let mut at = Vec::new();
    for tid in remote.threads() {
        at.push(remote.step_while(tid, |pc| unsettled.iter().any(|u| u.contains(&pc)), MOST_STEPS)?);
    }
    Ok(at)
}

/// Patches the planned counters into the held process: per module, stubs
/// near its code and counters within their reach, then threads inside a
/// window move to their stub, then the jumps. `threads_at` is where the
/// threads were before anything was patched (see [`settle_threads`]).
/// Returns them, and the functions not counted: the plan's refusals, and
/// those whose code in memory is not the file's or whose stubs cannot be
/// built.
/// Region hooks call the region trampoline at `region_trampoline` (none:
/// the runtime is not in the process, and functions with hooks are not
/// counted).
///
/// With `atomic`, every increment is `lock`ed from the start; else those
/// planned without `lock` stay so until the runtime is told a second
/// thread or process may count ([`Counting::lock_table`], whose tables
/// come before those at `lock_table`).
pub fn apply(
    remote: &Remote,
    plan: Plan,
    threads_at: &[u64],
    region_trampoline: Option<u64>,
    atomic: bool,
    lock_table: u64,
) -> Result<(Counting, Refused), RemoteError> {
    let unsettled = plan.unsettled();
    let Plan { modules, mut refused, .. } = plan;
    let refused = &mut refused;
    let mut counting = Counting {
        functions: Vec::new(),
        origins: Vec::new(),
        memory: Vec::new(),
        applied: Vec::new(),
        code: Vec::new(),
        frames: threads_at.iter().map(|&pc| Frame { pc, at_start: true }).collect(),
        unsettled,
        lock_table,
        lockable: Vec::new(),
    };
    let mut moves: HashMap<u64, u64> = HashMap::new();
    let mut jumps: Vec<Applied> = Vec::new();
    for mut module in modules {
        module.iter_mut().flat_map(|p| &mut p.sites).flat_map(|s| &mut s.counters).for_each(|c| c.atomic = atomic);
        let functions = unchanged_in_memory(remote, module, refused);
        if functions.iter().all(|p| p.sites.is_empty()) {
            continue;
        }
        let applying = Applying { counting: &mut counting, moves: &mut moves, jumps: &mut jumps, refused };
        if let Err(e) = apply_module(remote, functions, region_trampoline, applying) {
            // Nothing leads into the stubs yet: what was mapped goes again.
            counting.unmap(remote);
            return Err(e);
        }
    }
    for tid in remote.threads() {
        let mut regs = remote.regs(tid)?;
        if let Some(&to) = moves.get(&regs.rip) {
            regs.rip = to;
            remote.set_regs(tid, regs)?;
        }
    }
    remote.write_pieces(&jumps.iter().map(|j| (j.at, j.jump.as_slice())).collect::<Vec<_>>())?;
    counting.applied.extend(jumps);
    counting.origins.sort_unstable();
    Ok((counting, std::mem::take(refused)))
}

/// The functions of `module` whose code in memory is the file's (no
/// breakpoint or other patch where their jumps go); the others refused.
fn unchanged_in_memory(remote: &Remote, module: Vec<Planned>, refused: &mut Refused) -> Vec<Planned> {
    let sites: Vec<(u64, usize)> = module.iter().flat_map(|p| p.sites.iter().map(|s| (s.at, s.len()))).collect();
    let mut now = remote.read_pieces(&sites).into_iter();
    let mut functions = Vec::with_capacity(module.len());
    for p in module {
        let same: Vec<Result<bool, RemoteError>> =
            p.sites.iter().zip(now.by_ref()).map(|(s, bytes)| bytes.map(|b| b == s.original)).collect();
        match same.into_iter().find(|same| !matches!(same, Ok(true))) {
            Some(Err(e)) => refused.push((p.function, e.to_string())),
            Some(Ok(_)) => refused.push((p.function, super::patcher::CODE_DIFFERS.into())),
            None => functions.push(p),
        }
    }
    functions
}

/// What applying the modules' counters adds to, module after module.
struct Applying<'a> {
    counting: &'a mut Counting,
    /// Where a thread stopped in replaced code goes on in a stub.
    moves: &'a mut HashMap<u64, u64>,
    /// The jumps to the stubs, written last.
    jumps: &'a mut Vec<Applied>,
    refused: &'a mut Refused,
}

/// One module's `functions` counted: their stubs near their code, their
/// counters within the stubs' reach, the table of increments to lock after
/// the stubs; the jumps to write are added to `to.jumps`.
fn apply_module(remote: &Remote, functions: Vec<Planned>, region_trampoline: Option<u64>, to: Applying<'_>) -> Result<(), RemoteError> {
    let sites: usize = functions.iter().map(|p| p.sites.len()).sum();
    let lowest = functions.iter().flat_map(|p| p.sites.iter().map(|s| s.at)).min().unwrap_or(0);
    let highest = functions.iter().flat_map(|p| p.sites.iter().map(Site::end)).max().unwrap_or(0);
    let hooks: usize = functions.iter().flat_map(|p| &p.sites).map(|s| s.hooks.len()).sum();
    let increments: usize = functions.iter().flat_map(|p| &p.sites).map(|s| s.counters.len()).sum();
    let table_at = SLOT_ROOM + sites * STUB_ROOM + hooks * HOOK_ROOM;
    let room = table_at + lock_table::bytes(increments);
    let region = remote.map_code_near(lowest..highest, room)?;
    let code_range = region..region + room as u64;
    // Kept from the first, for the caller to take out again if anything after fails.
    to.counting.code.push(code_range.clone());
    // Each function's counters, one after the other in the shared memory.
    let offsets = starts(functions.iter().map(|p| 8 * p.placement.counted().len()));
    let counters: usize = functions.iter().map(|p| p.placement.counted().len()).sum();
    let shared = remote.share((counters * 8).max(8), Some(code_range.clone()))?;
    let (memory, shared_remote) = (to.counting.memory.len(), shared.remote);
    to.counting.memory.push(shared);
    let slot = region_trampoline.map(|_| region);
    let (mut code, built) = lay_out_halves(&functions, |from, to, start| {
        let counters =
            |i: usize| (0..functions[i].placement.counted().len()).map(|k| shared_remote + (offsets[i] + 8 * k) as u64).collect();
        lay_out(&functions[from..to], (from..to).map(counters), region, start, slot)
    });
    // The region trampoline's address, which hooks call through.
    code[..8].copy_from_slice(&region_trampoline.unwrap_or(0).to_ne_bytes());
    let mut lockable = Vec::new();
    for ((p, offset), built) in functions.into_iter().zip(offsets).zip(built) {
        let stubs = match built {
            Ok(stubs) => stubs,
            Err(why) => {
                to.refused.push((p.function, why));
                continue;
            }
        };
        for (site, (at, stub)) in p.sites.iter().zip(stubs) {
            to.moves.extend(stub.moved.into_iter().filter(|&(from, _)| from != site.at));
            lockable.extend(stub.lockable.into_iter().map(|at| (at, arcs::stub::LOCK_PREFIX)));
            to.counting.origins.extend(stub.origins);
            // Past the stub, nothing stands for original code.
            to.counting.origins.push((at + stub.code.len() as u64, 0));
            let jump = site.jump_to(at).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
            to.jumps.push(Applied { at: site.at, original: site.original.clone(), jump });
        }
        to.counting.functions.push(Counted {
            function: p.function,
            bias: p.bias,
            offset,
            memory,
            cfg: p.cfg,
            placement: p.placement,
            sites: p.sites,
        });
    }
    if !lockable.is_empty() {
        code.resize(table_at, 0xcc);
        code.extend(lock_table::write(to.counting.lock_table, &code_range, &lockable));
        to.counting.lock_table = region + table_at as u64;
        to.counting.lockable.extend(lockable);
    }
    remote.write(region, &code)
}

/// Where each of things of `sizes`, one after the other, starts.
fn starts(sizes: impl Iterator<Item = usize>) -> Vec<usize> {
    sizes
        .scan(0, |next, size| {
            let at = *next;
            *next += size;
            Some(at)
        })
        .collect()
}

/// The stubs of a function's `sites`, the first at `region + start`, each
/// rounded up to 16 bytes; their hooks call through `hook_slot`.
fn stubs(sites: &[Site], region: u64, start: usize, counters: &[u64], hook_slot: Option<u64>) -> Result<Vec<arcs::Stub>, String> {
    let mut at = start;
    let mut built = Vec::with_capacity(sites.len());
    for site in sites {
        let stub = arcs::stub_with_hooks(site, region + at as u64, counters, hook_slot).map_err(|e| e.to_string())?;
        if stub.code.len() > site_room(site) {
            return Err(format!("the counter at {:#x} needs a stub of {} bytes", site.at, stub.code.len()));
        }
        at = (at + stub.code.len()).next_multiple_of(16);
        built.push(stub);
    }
    Ok(built)
}

/// The most a site's stub takes, rounded up to 16 bytes as laid out.
fn site_room(site: &Site) -> usize {
    STUB_ROOM + site.hooks.len() * HOOK_ROOM
}

/// A function's stubs, each at its address, or why it has none.
type Built = Result<Vec<(u64, arcs::Stub)>, String>;

/// The stubs of `functions` (`counters`: each one's counters' addresses),
/// one after the other from `start` bytes into `region`: the region's
/// bytes up to their end, and each function's stubs.
fn lay_out(
    functions: &[Planned],
    counters: impl Iterator<Item = Vec<u64>>,
    region: u64,
    start: usize,
    hook_slot: Option<u64>,
) -> (Vec<u8>, Vec<Built>) {
    let mut code = vec![0xcc; start];
    let built = functions
        .iter()
        .zip(counters)
        .map(|(p, counters)| {
            let stubs = stubs(&p.sites, region, code.len(), &counters, hook_slot)?;
            Ok(stubs
                .into_iter()
                .map(|stub| {
                    let at = region + code.len() as u64;
                    code.extend_from_slice(&stub.code);
                    code.resize(code.len().next_multiple_of(16), 0xcc);
                    (at, stub)
                })
                .collect())
        })
        .collect();
    (code, built)
}

/// The region's stubs built in two halves, on two CPUs where they are
/// many (a large program's take tens of milliseconds to encode): the
/// second half from where the first would end if every stub took its
/// whole room, so that neither waits for the other. `lay_out(from, to,
/// start)` lays out `functions[from..to]` from `start`.
fn lay_out_halves(functions: &[Planned], lay_out: impl Fn(usize, usize, usize) -> (Vec<u8>, Vec<Built>) + Sync) -> (Vec<u8>, Vec<Built>) {
    const FEW_SITES: usize = 512;
    let rooms: Vec<usize> = functions.iter().map(|p| p.sites.iter().map(site_room).sum()).collect();
    let total: usize = rooms.iter().sum();
    // The first function that ends past half the room starts the second half.
    let split = starts(rooms.iter().copied()).iter().zip(&rooms).take_while(|&(start, room)| start + room < total / 2).count();
    let sites: usize = functions.iter().map(|p| p.sites.len()).sum();
    if sites < FEW_SITES || split == 0 {
        return lay_out(0, functions.len(), SLOT_ROOM);
    }
    let second_start = SLOT_ROOM + rooms[..split].iter().sum::<usize>();
    let ((mut code, mut built), (second, second_built)) =
        super::patcher::both(|| lay_out(0, split, SLOT_ROOM), || lay_out(split, functions.len(), second_start));
    code.resize(second_start, 0xcc);
    code.extend_from_slice(&second[second_start..]);
    built.extend(second_built);
    (code, built)
}

impl Counting {
    /// Takes its stubs and counters out of the process, where nothing
    /// leads into them.
    fn unmap(&self, remote: &Remote) {
        let mapped = self.code.iter().map(|code| (code.start, code.end - code.start));
        for (at, len) in mapped.chain(self.memory.iter().map(|shared| (shared.remote, shared.len() as u64))) {
            let _ = remote.syscall("munmap", libc::SYS_munmap, [at, len, 0, 0, 0, 0]);
        }
    }

    /// The counted functions.
    pub fn functions(&self) -> &[Counted] {
        &self.functions
    }

    /// The first of the tables of increments the runtime makes atomic
    /// when a thread or a process starts, 0 if every increment is atomic.
    pub fn lock_table(&self) -> u64 {
        self.lock_table
    }

    /// The bytes of its tables of counts to lock (see [`lock_table`]).
    pub fn lockable(&self) -> &[(u64, u8)] {
        &self.lockable
    }

    /// proftap's code in the process: the stubs.
    pub fn code(&self) -> &[Range<u64>] {
        &self.code
    }

    /// From each address of the stubs on, by address, the address of the
    /// original code it stands for (see [`arcs::Stub::origins`]); 0 past
    /// each stub's end.
    pub fn origins(&self) -> &[(u64, u64)] {
        &self.origins
    }

    /// Every edge and block count of `counted`, from its counters now.
    /// The counters are the target's to write: counts that do not add up
    /// are an error, not numbers.
    pub fn counts(&self, counted: &Counted) -> Result<Counts, arcs::Error> {
        let memory = &self.memory[counted.memory];
        let values: Vec<u64> = (0..counted.placement.counted().len()).map(|k| memory.load(counted.offset + 8 * k)).collect();
        arcs::solve_with_frames(&counted.cfg, &counted.placement, &counted.sites, &values, &self.frames)
    }

    /// Puts the original bytes back where the jumps still are. Threads in
    /// a stub, or where their line could not be told, are stepped on first,
    /// and where they are is kept for the counts.
    pub fn restore(&mut self, remote: &Remote) -> Result<(), RemoteError> {
        if self.applied.is_empty() {
            return Ok(());
        }
        let inside = |pc: u64| self.code.iter().chain(&self.unsettled).any(|r| r.contains(&pc));
        for tid in remote.threads() {
            let pc = remote.step_while(tid, inside, MOST_STEPS)?;
            self.frames.push(Frame { pc, at_start: false });
        }
        let (unread, result) = super::patcher::put_back(remote, std::mem::take(&mut self.applied), |a| (a.at, &a.jump, &a.original));
        self.applied = unread;
        result
    }
}

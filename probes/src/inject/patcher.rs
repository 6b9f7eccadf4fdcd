//! Putting trampolines in a held process and jumps to them over function
//! entries, and taking the jumps out again.

use super::lock_table;
use super::patch::{self, PatchPlan, Site};
use super::remote::{Remote, RemoteError, Shared};
use crate::addr::VirtAddr;
use crate::plan::ProbedFunction;
use crate::procfs::LoadedModule;
use crate::symbols::{ElfImage, Segment, file_offset};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Room for one trampoline: the prologue, the relocated instructions (at
/// most 15 bytes each, a few more once re-encoded) and the jump back.
pub const TRAMPOLINE_ROOM: usize = 208;

/// A patched entry, to undo at detach.
#[derive(Clone)]
pub struct Applied {
    /// The function's index.
    pub function: usize,
    /// Where the jump to the trampoline is: the entry, or its island.
    at: u64,
    /// What goes back at `at`: the entry's bytes, or the island's once
    /// taken out (see [`patch::Island::restored`]).
    original: Vec<u8>,
    jump: Vec<u8>,
    /// The jump to the entry's counting trampoline, which only counts
    /// calls (see [`EntryCounters`]), if it has one.
    counting: Option<Vec<u8>>,
    /// The short jump over the entry to the island at `at`, if the jump is in one.
    short: Option<ShortJump>,
}

/// A short jump written over an entry, leading to an island.
#[derive(Clone)]
struct ShortJump {
    at: u64,
    original: Vec<u8>,
    jump: Vec<u8>,
}

/// The counters of the patched entries' counting trampolines, in memory
/// shared with proftap: a function whose probes are taken out while the
/// process runs jumps there instead, and its calls are still counted
/// (`lock inc`: threads and forked children, which share the memory, lose
/// no increment), in a block of counters per CPU where the processor
/// tells a thread its CPU (see [`patch::CpuBlocks`]).
pub struct EntryCounters {
    shared: Shared,
    /// The function each counter counts, in order.
    functions: Vec<usize>,
    blocks: CounterBlocks,
}

impl EntryCounters {
    /// Adds each counter's calls so far, on every CPU, to `into` (by function).
    pub fn add_calls(&self, into: &mut [u64]) {
        for block in 0..self.blocks.count {
            for (&f, counted) in self.functions.iter().zip(self.shared.loads(block * self.blocks.stride, self.functions.len())) {
                if let Some(total) = into.get_mut(f) {
                    *total = total.saturating_add(counted);
                }
            }
        }
    }

    /// The functions counted.
    pub fn functions(&self) -> &[usize] {
        &self.functions
    }

    /// Where the counters are in the process, and their bytes there.
    pub fn mapping(&self) -> (u64, u64) {
        (self.shared.remote, self.shared.len() as u64)
    }
}

/// How a process's entry counters are laid out: `count` blocks,
/// `stride` bytes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CounterBlocks {
    count: usize,
    stride: usize,
    /// How a counting trampoline finds its CPU's block, when there are blocks per CPU.
    on_cpu: Option<patch::CpuBlocks>,
}

impl CounterBlocks {
    /// The blocks of `counters` counters: one per possible CPU (to a power
    /// of two, each a power of two of pages) where the processor has
    /// `rdpid`, else one block.
    fn for_this_machine(counters: usize) -> CounterBlocks {
        let cpus = if has_rdpid() { possible_cpus() } else { 1 };
        Self::for_cpus(counters, cpus)
    }

    /// One block, for where the blocks per CPU find no room.
    fn one(counters: usize) -> CounterBlocks {
        Self::for_cpus(counters, 1)
    }

    fn for_cpus(counters: usize, cpus: usize) -> CounterBlocks {
        let bytes = (8 * counters).max(8);
        // At most MOST_CPU_BLOCKS: CPUs past them share blocks (the
        // increments stay locked, and contend less), and proftap's reads,
        // which sum every block at each look and make its pages resident,
        // stay bounded.
        let count = cpus.clamp(1, MOST_CPU_BLOCKS).next_power_of_two();
        if count == 1 {
            return CounterBlocks { count, stride: bytes, on_cpu: None };
        }
        let stride = bytes.next_power_of_two().max(4096);
        let on_cpu = patch::CpuBlocks { mask: count as u32 - 1, shift: stride.trailing_zeros() as u8 };
        CounterBlocks { count, stride, on_cpu: Some(on_cpu) }
    }

    fn bytes(&self) -> usize {
        self.count * self.stride
    }
}

/// The most blocks of entry counters a process gets (a power of two, at
/// most 4096: Linux keeps the CPU's number in the low 12 bits of what
/// `rdpid` reads, and the blocks are masked to fewer).
const MOST_CPU_BLOCKS: usize = 16;

/// Whether the processor has `rdpid` (CPUID leaf 7, ECX bit 22), which
/// reads the running CPU's number in a few cycles, and the kernel says so
/// too (it shows the flag where it found the instruction usable; a
/// hypervisor may show CPUID bits it does not enable). Read once:
/// patches are applied while the target is held.
pub fn has_rdpid() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let leaves = std::arch::x86_64::__cpuid(0).eax;
        let processor = leaves >= 7 && std::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 22) != 0;
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let kernel = cpuinfo.lines().find(|l| l.starts_with("flags")).is_some_and(|l| l.split_whitespace().any(|f| f == "rdpid"));
        processor && kernel
    })
}

/// How many CPUs the kernel may ever number, hot-plugged ones included
/// (the highest of `/sys/devices/system/cpu/possible`, plus one).
fn possible_cpus() -> usize {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let highest = listed.trim().split([',', '-']).filter_map(|n| n.parse::<usize>().ok()).max();
    // SAFETY: sysconf reads a value.
    highest.map_or_else(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(1), |h| h + 1)
}

/// Functions by index, with their patch plans.
pub type Plans = Vec<(usize, PatchPlan)>;
/// Functions by index, with why they are not patched.
pub type Refused = Vec<(usize, String)>;

/// Code to patch: a function's entry in a module's file.
#[derive(Clone, Debug)]
pub struct Target {
    /// The module, as the process names it.
    pub module: PathBuf,
    /// The file to read its code from.
    pub open_path: PathBuf,
    /// Its link-time address.
    pub address: u64,
    /// Where its code is in the file.
    pub offset: u64,
    /// Bytes of code (0 when unknown).
    pub size: u64,
    /// Its entry, or all its returns.
    pub site: Site,
    /// Its cold parts' link-time address ranges (see [`ProbedFunction::cold`]).
    pub cold: Vec<(u64, u64)>,
    /// Whether its return address may be replaced (not so for
    /// [`crate::entry::return_address_untouchable`]).
    pub return_replaceable: bool,
    /// Offsets within its first bytes that other code branches to (see
    /// [`ProbedFunction::entered_inside`]).
    pub entered_inside: Vec<u32>,
    /// Padding after its code a jump may take (see [`ProbedFunction::padding`]).
    pub padding: u64,
    /// Padding before it an island may take (see [`ProbedFunction::padding_before`]).
    pub padding_before: u64,
    /// Whether a compiler made it (DWARF declares it in a file): its
    /// padding is never run, and may hold an island (see [`patch::IslandRoom`]).
    pub compiled: bool,
}

impl Target {
    /// The entry of a probed function.
    pub fn of(f: &ProbedFunction) -> Target {
        Target {
            module: PathBuf::from(&f.info.module),
            open_path: f.open_path.clone(),
            address: f.info.address,
            offset: f.offset.0,
            size: f.size,
            site: Site::Entry,
            cold: f.cold.clone(),
            return_replaceable: !crate::entry::return_address_untouchable(&f.info.name),
            entered_inside: f.entered_inside.clone(),
            padding: u64::from(f.padding),
            padding_before: u64::from(f.padding_before),
            compiled: f.info.file.is_some(),
        }
    }
}

/// The plans for the functions of one module: their trampolines go near it.
pub struct ModulePlans {
    /// The module, as the process names it.
    pub module: PathBuf,
    /// Its functions' plans.
    pub plans: Plans,
}

/// Whether `module` is the loaded module `loaded` (also through symbolic
/// links: `/lib` may be `/usr/lib`).
fn same_module(module: &Path, open_path: &Path, loaded: &LoadedModule) -> bool {
    module == loaded.path || {
        let canonical = |p: &Path| std::fs::canonicalize(p).ok();
        canonical(open_path).is_some_and(|c| Some(c) == canonical(&loaded.open_path))
    }
}

/// The modules of `functions` as if loaded at their link-time addresses:
/// to plan from the files alone, before the program runs.
pub fn as_in_files(functions: &[ProbedFunction]) -> Vec<LoadedModule> {
    let mut modules: Vec<LoadedModule> = Vec::new();
    for f in functions {
        if !modules.iter().any(|m| m.path.as_os_str() == f.info.module.as_str()) {
            modules.push(LoadedModule {
                path: f.info.module.clone().into(),
                open_path: f.open_path.clone(),
                bias: crate::addr::LoadBias(0),
                text: Vec::new(),
                is_main: modules.is_empty(),
            });
        }
    }
    modules
}

/// The code of targets in a running process's modules, each module's
/// file read once.
pub struct CodeSource<'a> {
    modules: &'a [LoadedModule],
    images: HashMap<PathBuf, Result<(ElfImage, Vec<Segment>), String>>,
    module_of: HashMap<PathBuf, Option<&'a LoadedModule>>,
}

/// A target's code, as its file holds it.
pub struct Code<'s> {
    /// The module, as the process names it.
    pub module: PathBuf,
    /// Its runtime address.
    pub at: u64,
    /// Its bytes.
    pub bytes: &'s [u8],
    /// Its bytes and the padding after them a jump may take.
    pub padded: &'s [u8],
    /// The padding before it an island may take.
    pub before: &'s [u8],
    /// Runtime address less link-time address.
    pub bias: u64,
    /// Its cold parts: runtime address and bytes.
    pub cold: Vec<(u64, &'s [u8])>,
    image: &'s ElfImage,
    segments: &'s [Segment],
}

impl Code<'_> {
    /// `len` bytes of the module's file at runtime address `address`, if
    /// the file holds them (its data, for jump tables).
    pub fn read(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        let offset = file_offset(self.segments, VirtAddr(address.wrapping_sub(self.bias)))?.0 as usize;
        self.image.data().get(offset..offset.checked_add(len)?).map(<[u8]>::to_vec)
    }
}

impl<'a> CodeSource<'a> {
    /// The code of the process whose modules are `modules`.
    pub fn new(modules: &'a [LoadedModule]) -> CodeSource<'a> {
        CodeSource { modules, images: HashMap::new(), module_of: HashMap::new() }
    }

    /// The module `target` is in, its runtime address and its code as in
    /// the file; or why not.
    pub fn code(&mut self, target: &Target) -> Result<Code<'_>, String> {
        let modules = self.modules;
        let found = *self
            .module_of
            .entry(target.module.clone())
            .or_insert_with(|| modules.iter().find(|m| same_module(&target.module, &target.open_path, m)));
        let Some(loaded) = found else { return Err(format!("{} is not loaded", target.module.display())) };
        let image = self.images.entry(loaded.path.clone()).or_insert_with(|| {
            let image = ElfImage::open(&loaded.open_path).map_err(|e| e.to_string())?;
            let segments = image.segments().map_err(|e| e.to_string())?;
            Ok((image, segments))
        });
        let (image, segments) = match image {
            Ok((image, segments)) => (&*image, segments.as_slice()),
            Err(e) => return Err(e.clone()),
        };
        if target.size == 0 {
            return Err("its size is unknown".to_string());
        }
        let bytes =
            image.data().get(target.offset as usize..(target.offset + target.size) as usize).ok_or("its code is not in the file")?;
        let padded = image
            .data()
            .get(target.offset as usize..(target.offset + target.size + target.padding) as usize)
            .ok_or("its code is not in the file")?;
        let before = target
            .offset
            .checked_sub(target.padding_before)
            .and_then(|from| image.data().get(from as usize..target.offset as usize))
            .unwrap_or_default();
        let at = loaded.bias.to_runtime(VirtAddr(target.address)).0;
        let bias = at.wrapping_sub(target.address);
        let cold = target
            .cold
            .iter()
            .filter_map(|&(lo, hi)| {
                let offset = file_offset(segments, VirtAddr(lo))?.0 as usize;
                Some((lo.wrapping_add(bias), image.data().get(offset..offset.checked_add(hi.checked_sub(lo)? as usize)?)?))
            })
            .collect();
        Ok(Code { module: loaded.path.clone(), at, bytes, padded, before, bias, cold, image, segments })
    }
}

/// `first` here and `second` on a thread of its own, at the same time.
pub fn both<A, B: Send>(first: impl FnOnce() -> A, second: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|scope| {
        let second = scope.spawn(second);
        let first = first();
        (first, second.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

/// `work` over every one of `indices`, on every CPU, each thread taking
/// every so many (a program's few large functions fall to different
/// ones); `work` returns what it made of its share, by index, and all of
/// it comes back in index order.
pub fn on_every_cpu<R: Send>(indices: &[usize], work: impl Fn(&[usize]) -> Vec<(usize, R)> + Sync) -> Vec<(usize, R)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let work = &work;
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let shares: Vec<_> = (0..threads)
            .map(|first| {
                let share: Vec<usize> = indices.iter().skip(first).step_by(threads).copied().collect();
                scope.spawn(move || work(&share))
            })
            .collect();
        shares.into_iter().flat_map(|s| s.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done
}

/// Why a function whose return address must stay is not patched.
pub const RETURN_UNTOUCHABLE: &str = "its return address must stay as it is (a program's entry point, a signal's return, the dynamic linker's lazy binding, a function that returns twice or reads its own return address)";

/// The patch plans of `targets` (by index) in the process whose modules are
/// `modules`, grouped by module, and the targets that cannot be patched
/// with the reason. `checked[i]`: target `i`'s code was found patchable in
/// its file already, only its first instructions are planned again.
pub fn plans(modules: &[LoadedModule], targets: &[Target], checked: &[bool]) -> (Vec<ModulePlans>, Refused) {
    let mut groups: Vec<ModulePlans> = Vec::new();
    let mut source = CodeSource::new(modules);
    let mut refused = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let planned = source.code(target).and_then(|code| {
            let plans = match target.site {
                // Replaced, its return address would write over the program's
                // arguments or a signal frame, or be returned to twice.
                Site::Entry if !target.return_replaceable => Err(RETURN_UNTOUCHABLE.to_string()),
                Site::Entry if checked.get(i).copied().unwrap_or(false) => {
                    patch::plan_checked(code.at, code.padded, code.padded.len() - code.bytes.len()).map(|p| vec![p])
                }
                Site::Entry => {
                    let room = patch::IslandRoom { before: code.before, compiled: target.compiled };
                    patch::plan(code.at, code.padded, code.padded.len() - code.bytes.len(), room)
                        .and_then(|p| patch::not_entered_inside(&p, code.at, &target.entered_inside).map(|()| vec![p]))
                }
                Site::Return => patch::plan_returns(code.at, code.bytes),
            };
            plans.map(|p| (code.module, p))
        });
        match planned {
            Ok((module, planned)) => {
                let group = match groups.iter().position(|g| g.module == module) {
                    Some(g) => g,
                    None => {
                        groups.push(ModulePlans { module, plans: Vec::new() });
                        groups.len() - 1
                    }
                };
                groups[group].plans.extend(planned.into_iter().map(|p| (i, p)));
            }
            Err(why) => refused.push((i, why)),
        }
    }
    (groups, refused)
}

/// [`plans`], the targets shared out over the CPUs: each target is
/// planned alone, from its own code, and a large program's thousands of
/// them take milliseconds of a launched program's held start.
pub fn plans_on_every_cpu(modules: &[LoadedModule], targets: &[Target], checked: &[bool]) -> (Vec<ModulePlans>, Refused) {
    let indices: Vec<usize> = (0..targets.len()).collect();
    let planned = on_every_cpu(&indices, |share| {
        let chosen: Vec<Target> = share.iter().map(|&i| targets[i].clone()).collect();
        let checks: Vec<bool> = share.iter().map(|&i| checked.get(i).copied().unwrap_or(false)).collect();
        let (groups, refused) = plans(modules, &chosen, &checks);
        let planned = groups.into_iter().flat_map(|g| g.plans.into_iter().map(move |(k, p)| (share[k], Ok((g.module.clone(), p)))));
        planned.chain(refused.into_iter().map(|(k, why)| (share[k], Err(why)))).collect::<Vec<_>>()
    });
    let (mut groups, mut refused): (Vec<ModulePlans>, Refused) = (Vec::new(), Vec::new());
    for (i, planned) in planned {
        match planned {
            Ok((module, plan)) => match groups.iter_mut().find(|g| g.module == module) {
                Some(group) => group.plans.push((i, plan)),
                None => groups.push(ModulePlans { module, plans: vec![(i, plan)] }),
            },
            Err(why) => refused.push((i, why)),
        }
    }
    (groups, refused)
}

/// Why a function whose code in memory is not its file's is refused.
pub const CODE_DIFFERS: &str = "its code in memory differs from the file (a breakpoint or another tool's patch)";

/// Why, when an earlier recording left its patches behind.
pub const LEFT_BEHIND: &str = "its code in memory differs from the file, and the process still maps an earlier proftap recording's memory: most likely a patch that recording left (stopped before it could restore it), which stays until the process ends";

/// The code range the plans cover, their islands too.
pub fn span(plans: &Plans) -> std::ops::Range<u64> {
    let sites = plans.iter().flat_map(|(_, p)| p.writes());
    let lowest = sites.clone().map(|(at, _)| at).min().unwrap_or(0);
    let highest = sites.map(|(at, len)| at + len as u64).max().unwrap_or(0);
    lowest..highest
}

/// What [`apply`] put in a process.
pub struct Patches {
    /// The jumps written.
    pub applied: Vec<Applied>,
    /// The code they lead to.
    pub code: std::ops::Range<u64>,
    /// The counters of the entries' counting trampolines, if any entry has one.
    pub counters: Option<EntryCounters>,
    /// From each address of the counting trampolines on, the original
    /// address it stands for (see [`crate::sampling::StackResolver::origins`]).
    pub origins: Vec<(u64, u64)>,
    /// The count of each counting trampoline (see
    /// [`crate::sampling::StackResolver::counting_stubs`]).
    pub counting_stubs: Vec<CountingStub>,
    /// Where the counting trampolines count without `lock`, the bytes to
    /// write that make their counts atomic (see [`lock_table`]).
    pub switches: Vec<(u64, u8)>,
    /// The table that lists them for the runtime, before the one at
    /// `next_table`; `next_table` itself where none was written.
    pub lock_table: u64,
}

/// Where a counting trampoline's count is, and whose calls it counts: a
/// sample there is counting's cost, not its function's. Kept as a triple
/// `(count, moved, function)` in saved event streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(from = "(u64, u64, u32)", into = "(u64, u64, u32)")]
pub struct CountingStub {
    /// Where the count starts.
    pub count: u64,
    /// Where the function's first instructions, moved, follow it.
    pub moved: u64,
    /// The function whose calls it counts, by index.
    pub function: u32,
}

impl From<(u64, u64, u32)> for CountingStub {
    fn from((count, moved, function): (u64, u64, u32)) -> Self {
        CountingStub { count, moved, function }
    }
}

impl From<CountingStub> for (u64, u64, u32) {
    fn from(stub: CountingStub) -> Self {
        (stub.count, stub.moved, stub.function)
    }
}

/// The entries' counting trampolines [`build_trampolines`] made.
#[derive(Default)]
struct CountingTrampolines {
    /// The functions counted, in the order of their counters.
    functions: Vec<usize>,
    /// See [`Patches::origins`].
    origins: Vec<(u64, u64)>,
    /// See [`Patches::counting_stubs`].
    stubs: Vec<CountingStub>,
    /// See [`Patches::switches`].
    switches: Vec<(u64, u8)>,
}

/// How the entries' counting trampolines count.
#[derive(Clone, Copy)]
struct CountingCode {
    /// The first counter.
    counters: u64,
    /// The blocks per CPU, if any.
    on_cpu: Option<patch::CpuBlocks>,
    /// Without `lock` until a second thread or process may count (see
    /// [`patch::count_call_alone`]): the process has one thread.
    alone: bool,
}

/// Patches the planned entries in the held process: code near them holds
/// `runtime` (given its address; `runtime_room` bytes at most) and a
/// trampoline per plan with proftap's code `prologue(target, site, address)`;
/// then threads inside bytes about to be replaced move to their copies and
/// the jumps are written. Functions that fail join `refused`.
///
/// With `alone` (the process has one thread), the counting trampolines
/// count without `lock`, listed in a table the runtime finds before
/// `next_table` (see [`Patches::switches`]).
#[allow(clippy::too_many_arguments)]
pub fn apply(
    remote: &Remote,
    mut plans: Plans,
    runtime_room: usize,
    runtime: impl FnOnce(u64) -> Result<Vec<u8>, String>,
    prologue: impl Fn(usize, Site, u64) -> Result<Vec<u8>, String>,
    refused: &mut Refused,
    alone: bool,
    next_table: u64,
) -> Result<Patches, RemoteError> {
    keep_unchanged(remote, &mut plans, refused);
    refuse_overlapping_islands(&mut plans, refused);
    if plans.is_empty() {
        return Ok(Patches {
            applied: Vec::new(),
            code: 0..0,
            counters: None,
            origins: Vec::new(),
            counting_stubs: Vec::new(),
            switches: Vec::new(),
            lock_table: next_table,
        });
    }
    let runtime_room = runtime_room.next_multiple_of(64);
    let entries = plans.iter().filter(|(_, p)| p.site == Site::Entry).count();
    let table_room = if alone { lock_table::bytes(entries) } else { 0 };
    let room = runtime_room + (plans.len() + entries) * TRAMPOLINE_ROOM + table_room;
    let region = remote.map_code_near(span(&plans), room)?;
    let unmap_region = || {
        let _ = remote.syscall("munmap", libc::SYS_munmap, [region, room as u64, 0, 0, 0, 0]);
    };
    let mut blocks = CounterBlocks::for_this_machine(entries);
    let counters = match entries {
        0 => None,
        _ => {
            let near = Some(region..region + room as u64);
            let shared = remote.share(blocks.bytes(), near.clone()).or_else(|e| match blocks.on_cpu {
                Some(_) => {
                    blocks = CounterBlocks::one(entries);
                    remote.share(blocks.bytes(), near)
                }
                None => Err(e),
            });
            Some(shared.inspect_err(|_| unmap_region())?)
        }
    };
    let written = (|| {
        let mut code = runtime(region).map_err(RemoteError::Unsupported)?;
        if code.len() > runtime_room {
            return Err(RemoteError::Unsupported(format!(
                "the runtime takes {} bytes, more than the {runtime_room} set aside",
                code.len()
            )));
        }
        code.resize(runtime_room, 0xcc);
        let counting = counters.as_ref().map(|c| CountingCode { counters: c.remote, on_cpu: blocks.on_cpu, alone });
        let (built, counting) = build_trampolines(plans, region, &mut code, counting, &prologue, refused);
        let mut table = next_table;
        if !counting.switches.is_empty() {
            code.resize(code.len().next_multiple_of(8), 0xcc);
            table = region + code.len() as u64;
            code.extend(lock_table::write(next_table, &(region..region + room as u64), &counting.switches));
        }
        remote.write(region, &code)?;
        Ok((built, counting, table))
    })();
    // Nothing leads into the region yet: a failure takes it out again.
    let (built, CountingTrampolines { functions: counted, mut origins, stubs: counting_stubs, switches }, lock_table) = written
        .inspect_err(|_| {
            unmap_region();
            if let Some(counters) = &counters {
                let _ = remote.syscall("munmap", libc::SYS_munmap, [counters.remote, counters.len() as u64, 0, 0, 0, 0]);
            }
        })?;

    move_threads_out(remote, &built)?;
    for (_, p, _, _, _) in &built {
        if let Some(island) = &p.island {
            origins.extend([(island.at, p.at), (island.at + patch::JUMP_LEN as u64, 0)]);
        }
    }
    let applied: Vec<Applied> = built
        .into_iter()
        .map(|(function, p, _, address, counting)| {
            let (at, original) = p.jump_site();
            Applied {
                function,
                at,
                jump: p.jump_to(address),
                original: p.island.as_ref().map_or(original, |island| &island.restored).to_vec(),
                counting,
                short: p.short_jump().map(|jump| ShortJump { at: p.at, original: p.original.clone(), jump }),
            }
        })
        .collect();
    let jumps: Vec<(u64, &[u8])> = applied.iter().map(|a| (a.at, a.jump.as_slice())).collect();
    let shorts: Vec<(u64, &[u8])> = applied.iter().filter_map(|a| a.short.as_ref().map(|s| (s.at, s.jump.as_slice()))).collect();
    pages_apart(remote, jumps.iter().chain(&shorts));
    // The islands first: a short jump leads to a jump already there.
    let written = remote.write_pieces(&jumps).and_then(|()| remote.write_pieces(&shorts));
    if let Err(e) = written {
        // Some jumps may be in place, and no one would know to take them
        // out: the original bytes go back over all of them. (The region
        // stays: threads may have moved into it.)
        let _ = put_originals_back(remote, &applied);
        return Err(e);
    }
    let counters = counters.map(|shared| EntryCounters { shared, functions: counted, blocks });
    Ok(Patches { applied, code: region..region + room as u64, counters, origins, counting_stubs, switches, lock_table })
}

/// Pages of a module's code written to, at most, to be made mappings of
/// their own (see [`pages_apart`]): a library's hooks.
const MOST_PAGES_APART: usize = 16;

/// Makes the pages that `pieces` go to mappings of their own, where they
/// are few. Once a page of a mapping of a file's code is written (the
/// process given a copy of it), the kernel copies the entries of every
/// resident page of that mapping at each fork, and tears them down at each
/// exit: a whole C library's for a few hooks. A page given write rights
/// and back is a mapping apart (the commit the kernel charged for it keeps
/// it from merging back). Only pages of a file, readable and executable
/// and not writable, change; on a failure a page stays as it was. Only in
/// a program proftap launched: a running one attached to is left with
/// its mappings as they were.
fn pages_apart<'a>(remote: &Remote, pieces: impl Iterator<Item = &'a (u64, &'a [u8])>) {
    if !remote.held_at_start() {
        return;
    }
    const PAGE: u64 = 4096;
    let mut pages: Vec<u64> = pieces
        .filter(|(_, bytes)| !bytes.is_empty())
        .flat_map(|&(at, bytes)| [at & !(PAGE - 1), at.saturating_add(bytes.len() as u64 - 1) & !(PAGE - 1)])
        .collect();
    pages.sort_unstable();
    pages.dedup();
    if pages.len() > MOST_PAGES_APART {
        return;
    }
    let (read_execute, write) = ((libc::PROT_READ | libc::PROT_EXEC) as u64, libc::PROT_WRITE as u64);
    for page in pages {
        let code = remote
            .mapping_at(page)
            .ok()
            .flatten()
            .filter(|m| m.inode != 0 && m.readable && m.executable && !m.writable && m.end.0 - m.start.0 > PAGE);
        if code.is_some() && remote.syscall("mprotect", libc::SYS_mprotect, [page, PAGE, read_execute | write, 0, 0, 0]).is_ok() {
            // Its rights back, whatever it takes: code left writable is not the program's.
            let back = || remote.syscall("mprotect", libc::SYS_mprotect, [page, PAGE, read_execute, 0, 0, 0]);
            let _ = back().or_else(|_| back());
        }
    }
}

/// A plan whose trampoline was built: its function, the plan, the
/// trampoline, its address, and the jump to its counting trampoline.
type Built = (usize, PatchPlan, patch::Trampoline, u64, Option<Vec<u8>>);

/// Leaves out of `plans` (into `refused`) the functions whose code in
/// memory is not the file's: a breakpoint or another patch there, or in
/// the padding an island takes.
fn keep_unchanged(remote: &Remote, plans: &mut Plans, refused: &mut Refused) {
    let pieces: Vec<(u64, usize)> = plans.iter().flat_map(|(_, p)| p.writes()).collect();
    let mut now = remote.read_pieces(&pieces).into_iter();
    plans.retain(|(i, p)| {
        let entry = now.next();
        let island = p.island.as_ref().map(|island| (island, now.next()));
        // An island an earlier recording took out holds its jump back.
        let found = [Some((&p.original, &p.original, entry)), island.map(|(island, now)| (&island.original, &island.restored, now))];
        match found.into_iter().flatten().find_map(|(original, restored, now)| match now {
            Some(Ok(bytes)) if &bytes == original || &bytes == restored => None,
            Some(Ok(_)) | None => Some(CODE_DIFFERS.to_string()),
            Some(Err(e)) => Some(e.to_string()),
        }) {
            Some(why) => {
                refused.push((*i, why));
                false
            }
            None => true,
        }
    });
}

/// A trampoline per plan (and, for an entry, a counting one when there
/// are `counters`: where they are, and their blocks per CPU if any),
/// appended to `code`, which goes at `region`; plans
/// whose trampoline cannot be built go to `refused`. Returns each built
/// plan with its trampoline, where it is and the jump to its counting
/// trampoline; the functions counted, in their counters' order; and where
/// the counting trampolines' addresses stand for the functions'.
///
/// The counting trampolines come after all the others, packed together:
/// the hot functions of a program counted after their throttle then share
/// cache lines and pages, where each beside its function's trampoline
/// took a line and most of a page's translation of its own (PostgreSQL's
/// counted calls cost 10 ns each that way, half of it on a stub's first
/// two instructions).
fn build_trampolines(
    plans: Plans,
    region: u64,
    code: &mut Vec<u8>,
    counting_code: Option<CountingCode>,
    prologue: &impl Fn(usize, Site, u64) -> Result<Vec<u8>, String>,
    refused: &mut Refused,
) -> (Vec<Built>, CountingTrampolines) {
    let mut built = Vec::new();
    for (i, p) in plans {
        let address = region + code.len() as u64;
        match patch::trampoline(&p, address, |own_address| prologue(i, p.site, own_address)) {
            Ok(t) if t.code.len() <= TRAMPOLINE_ROOM => {
                append_aligned(code, &t.code);
                built.push((i, p, t, address, None));
            }
            Ok(_) => refused.push((i, "its first instructions grow too much when moved".into())),
            Err(why) => refused.push((i, why)),
        }
    }
    let mut counting = CountingTrampolines::default();
    let Some(how) = counting_code else { return (built, counting) };
    for (i, p, _, _, jump) in built.iter_mut().filter(|(_, p, ..)| p.site == Site::Entry) {
        let counter = how.counters + 8 * counting.functions.len() as u64;
        let address = region + code.len() as u64;
        let Some((t, switched)) = counting_trampoline(p, address, counter, how) else { continue };
        counting.origins.extend(counting_origins(p, &t, address));
        // The count alone: the function's first instructions moved after
        // it, and their time, are the function's own.
        let moved = t.moved.first().map_or(address + t.code.len() as u64, |&(_, to)| to);
        counting.stubs.push(CountingStub { count: address, moved, function: *i as u32 });
        let mut stub = t.code;
        if let Some(Switched { displacement, code: tail }) = switched {
            // The count switched to stands for the entry too; its jump back counts.
            let at = address + stub.len() as u64;
            let end = at + tail.len() as u64;
            counting.origins.pop();
            counting.origins.extend([(at, p.at), (end, 0)]);
            counting.stubs.push(CountingStub { count: at, moved: end - patch::JUMP_LEN as u64, function: *i as u32 });
            counting.switches.push((address + patch::SWITCH_BYTE, displacement));
            stub.extend(tail);
        }
        append_aligned(code, &stub);
        counting.functions.push(*i);
        *jump = Some(p.jump_to(address));
    }
    (built, counting)
}

/// Where a counting trampoline counts without `lock`, the count it is
/// switched to (placed right after it), and the displacement that does so.
struct Switched {
    displacement: u8,
    code: Vec<u8>,
}

/// The counting trampoline of `p` at `address`, counting in `counter` as
/// `how` says; and what it is switched to where it counts without `lock`.
fn counting_trampoline(p: &PatchPlan, address: u64, counter: u64, how: CountingCode) -> Option<(patch::Trampoline, Option<Switched>)> {
    if how.alone
        && let Ok(t) = patch::trampoline(p, address, |own| Ok(patch::count_call_alone(own, counter)))
    {
        let at = address + t.code.len() as u64;
        let tail = patch::count_call_then_return(at, counter, how.on_cpu, address + patch::COUNT_ALONE_LEN as u64);
        if let Some(displacement) = patch::switch_displacement(address, at).filter(|_| t.code.len() + tail.len() <= TRAMPOLINE_ROOM) {
            return Some((t, Some(Switched { displacement, code: tail })));
        }
    }
    let count = |own| match how.on_cpu {
        Some(blocks) => patch::count_call_on_cpu(own, counter, blocks),
        None => patch::count_call(own, counter),
    };
    let t = patch::trampoline(p, address, |own| Ok(count(own))).ok().filter(|t| t.code.len() <= TRAMPOLINE_ROOM)?;
    Some((t, None))
}

/// Appends a trampoline's `bytes` to `code`, then traps up to the next 16 bytes.
fn append_aligned(code: &mut Vec<u8>, bytes: &[u8]) {
    code.extend_from_slice(bytes);
    code.resize(code.len().next_multiple_of(16), 0xcc);
}

/// Threads stopped inside bytes about to be replaced go on from their
/// copies in the trampolines.
fn move_threads_out(remote: &Remote, built: &[Built]) -> Result<(), RemoteError> {
    let mut moves: HashMap<u64, u64> = HashMap::new();
    for (_, p, t, _, _) in built {
        for &(from, to) in &t.moved {
            if from != p.at {
                moves.insert(from, to);
            }
        }
    }
    for tid in remote.threads() {
        let mut regs = remote.regs(tid)?;
        if let Some(&to) = moves.get(&regs.rip) {
            regs.rip = to;
            remote.set_regs(tid, regs)?;
        }
    }
    Ok(())
}

/// From each address of counting trampoline `t` (at `address`, for
/// `patch`) on, the original address a thread there stands for: the
/// count stands for the entry, each moved instruction for itself, the
/// jump back for where it goes; a sample there unwinds as in the function.
fn counting_origins(patch: &PatchPlan, t: &patch::Trampoline, address: u64) -> Vec<(u64, u64)> {
    let mut origins = vec![(address, patch.at)];
    origins.extend(t.moved.iter().map(|&(from, to)| (to, from)));
    let end = address + t.code.len() as u64;
    if !patch.replaced.last().is_some_and(patch::is_emulated_call) {
        origins.push((end - patch::JUMP_LEN as u64, patch.at + patch.len() as u64));
    }
    origins.push((end, 0));
    origins
}

/// Puts the original bytes back where our jumps (to the trampolines or
/// the counting trampolines) of the functions `which` picks still are;
/// those patches leave `applied`. A thread in a trampoline goes on into
/// the original code after the bytes the jump replaced, which is an
/// instruction boundary either way.
pub fn restore(remote: &Remote, applied: &mut Vec<Applied>, which: impl Fn(usize) -> bool) -> Result<(), RemoteError> {
    let (chosen, kept): (Vec<Applied>, Vec<Applied>) = applied.drain(..).partition(|a| which(a.function));
    *applied = kept;
    let (found, unread, error) = ours(remote, chosen);
    applied.extend(unread);
    put_originals_back(remote, &found).and(error.map_or(Ok(()), Err))
}

/// Writes the original bytes of `patches` back, all short jumps before
/// any island (an island taken out under a short jump would be run as
/// padding); a thread about to take an island's jump goes on from the
/// entry it stands for.
fn put_originals_back(remote: &Remote, patches: &[Applied]) -> Result<(), RemoteError> {
    let shorts: Vec<(u64, &[u8])> = patches.iter().filter_map(|a| a.short.as_ref().map(|s| (s.at, s.original.as_slice()))).collect();
    remote.write_pieces(&shorts)?;
    remote.write_pieces(&patches.iter().map(|a| (a.at, a.original.as_slice())).collect::<Vec<_>>())?;
    let islands: HashMap<u64, u64> = patches.iter().filter_map(|a| Some((a.at, a.short.as_ref()?.at))).collect();
    if islands.is_empty() {
        return Ok(());
    }
    // A thread whose registers cannot be read goes on through the
    // island's jump back (see [`patch::Island::restored`]).
    for tid in remote.threads() {
        let Ok(mut regs) = remote.regs(tid) else { continue };
        if let Some(&entry) = islands.get(&regs.rip) {
            regs.rip = entry;
            remote.set_regs(tid, regs)?;
        }
    }
    Ok(())
}

/// Refuses the plans whose island overlaps bytes another plan of the
/// same batch writes (a function before it that takes the padding after
/// itself, another island): one patch only over any byte. Islands are
/// few, so each is checked against every plan.
fn refuse_overlapping_islands(plans: &mut Plans, refused: &mut Refused) {
    let mut taken: Vec<(u64, u64)> = plans.iter().map(|(_, p)| (p.at, p.at + p.len() as u64)).collect();
    plans.retain(|(i, p)| {
        let Some(island) = &p.island else { return true };
        if p.short_jump().is_none() {
            refused.push((*i, "its island is out of a short jump's reach".into()));
            return false;
        }
        let (start, end) = (island.at, island.at + island.original.len() as u64);
        if taken.iter().any(|&(s, e)| s < end && start < e) {
            refused.push((*i, "the padding its short jump would lead to is taken by another function's patch".into()));
            return false;
        }
        taken.push((start, end));
        true
    });
}

/// Makes the functions `which` picks only count their calls: where our
/// jump to an entry's trampoline still is, a jump to its counting
/// trampoline (see [`EntryCounters`]) instead, which stays in `applied`
/// for [`restore`]; a patch without one (a return site, an entry whose
/// counting trampoline could not be built) gets its original bytes back.
pub fn count_only(remote: &Remote, applied: &mut Vec<Applied>, which: impl Fn(usize) -> bool) -> Result<(), RemoteError> {
    let (chosen, kept): (Vec<Applied>, Vec<Applied>) = applied.drain(..).partition(|a| which(a.function));
    *applied = kept;
    let (found, unread, error) = ours(remote, chosen);
    applied.extend(unread);
    let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut uncounted = Vec::new();
    for a in found {
        match &a.counting {
            Some(counting) => {
                pieces.push((a.at, counting.clone()));
                applied.push(a);
            }
            None => uncounted.push(a),
        }
    }
    let written = remote.write_pieces(&pieces.iter().map(|(at, bytes)| (*at, bytes.as_slice())).collect::<Vec<_>>());
    written.and(put_originals_back(remote, &uncounted)).and(error.map_or(Ok(()), Err))
}

/// Of `patches`, those whose jump (either) is still in the process; those
/// whose bytes could not be read, still patched as far as anyone knows;
/// and the first error met. The rest are no longer ours to undo.
fn ours(remote: &Remote, patches: Vec<Applied>) -> (Vec<Applied>, Vec<Applied>, Option<RemoteError>) {
    let now = remote.read_pieces(&patches.iter().map(|a| (a.at, a.jump.len())).collect::<Vec<_>>());
    let (mut found, mut unread, mut error) = (Vec::new(), Vec::new(), None);
    for (a, now) in patches.into_iter().zip(now) {
        match now {
            Ok(bytes) if bytes == a.jump || a.counting.as_ref() == Some(&bytes) => found.push(a),
            Ok(_) => {}
            Err(e) => {
                unread.push(a);
                error = error.or(Some(e));
            }
        }
    }
    (found, unread, error)
}

/// Puts each patch's original bytes back where its jump still is (`piece`:
/// where, the jump, the original), the process held. Returns the patches
/// whose bytes could not be read, still patched as far as anyone knows, to
/// restore later, and the first error met.
pub fn put_back<T>(remote: &Remote, patches: Vec<T>, piece: impl Fn(&T) -> (u64, &[u8], &[u8])) -> (Vec<T>, Result<(), RemoteError>) {
    let now = remote.read_pieces(&patches.iter().map(|p| (piece(p).0, piece(p).1.len())).collect::<Vec<_>>());
    let (mut written, mut unread, mut error) = (Vec::new(), Vec::new(), None);
    for (p, now) in patches.into_iter().zip(now) {
        match now {
            Ok(bytes) if bytes == piece(&p).1 => written.push(p),
            Ok(_) => {}
            Err(e) => {
                unread.push(p);
                error = error.or(Some(e));
            }
        }
    }
    let result = remote.write_pieces(&written.iter().map(|p| (piece(p).0, piece(p).2)).collect::<Vec<_>>());
    (unread, result.and(error.map_or(Ok(()), Err)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block per possible CPU, rounded up to a power of two (the CPU's
    /// number is masked), each a power of two of pages apart (it is
    /// shifted); one block, no bigger than its counters, where there is one CPU.
    #[test]
    fn entry_counters_take_a_block_per_cpu() {
        assert_eq!(CounterBlocks::for_cpus(3, 1), CounterBlocks { count: 1, stride: 24, on_cpu: None });
        let six = CounterBlocks::for_cpus(1000, 6);
        assert_eq!((six.count, six.stride, six.on_cpu), (8, 8192, Some(patch::CpuBlocks { mask: 7, shift: 13 })));
        assert_eq!(six.bytes(), 8 * 8192);
        let many = CounterBlocks::for_cpus(10, 10_000);
        assert_eq!((many.count, many.stride, many.on_cpu), (16, 4096, Some(patch::CpuBlocks { mask: 15, shift: 12 })));
        assert_eq!(CounterBlocks::one(1000), CounterBlocks { count: 1, stride: 8000, on_cpu: None });
        assert!(possible_cpus() >= std::thread::available_parallelism().map_or(1, usize::from));
    }
    use crate::inject::patch::IslandRoom;

    /// A sample in a counting trampoline stands for the function: the
    /// count for its entry, each moved instruction for itself, the jump
    /// back for where it goes, nothing past the end.
    #[test]
    fn a_counting_trampoline_stands_for_the_function_it_counts() {
        // push rbp; mov rbp, rsp; sub rsp, 16; ...
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x90, 0xc3];
        let plan = patch::plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        let at = 0x40_5000;
        let t = patch::trampoline(&plan, at, |a| Ok(patch::count_call(a, 0x40_6000))).expect("movable");
        let origins = counting_origins(&plan, &t, at);
        let end = at + t.code.len() as u64;
        // The count (8 bytes), push rbp, mov rbp, rsp, sub rsp, 16 (the
        // jump's five bytes end inside it), the jump back after it.
        let moved = [(at + 8, 0x1000), (at + 9, 0x1001), (at + 12, 0x1004)];
        assert_eq!(origins, [&[(at, 0x1000)][..], &moved, &[(end - 5, 0x1008), (end, 0)]].concat());
        assert_eq!(t.code.len(), 8 + 8 + 5);
    }

    /// The counting trampolines follow every timing one, each right after
    /// the one before (16-byte aligned), and each function's jump to
    /// counting leads to its own.
    #[test]
    fn counting_trampolines_are_packed_after_the_timing_ones() {
        // push rbp; mov rbp, rsp; sub rsp, 16; nop; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x90, 0xc3];
        let entries = [0x1000u64, 0x2000, 0x3000];
        let plans: Plans =
            entries.iter().enumerate().map(|(i, &at)| (i, patch::plan(at, &code, 0, IslandRoom::default()).expect("patchable"))).collect();
        let region = 0x40_0000;
        let mut bytes = Vec::new();
        // A timing trampoline's own code, as long as a real prologue's.
        let prologue = |_: usize, _: Site, _: u64| Ok(vec![0x90; 150]);
        let mut refused = Vec::new();
        let counting = CountingCode { counters: 0x50_0000, on_cpu: None, alone: false };
        let (built, CountingTrampolines { functions: counted, origins, stubs, switches }) =
            build_trampolines(plans, region, &mut bytes, Some(counting), &prologue, &mut refused);
        assert!(switches.is_empty(), "atomic from the start: {switches:x?}");
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(counted, [0, 1, 2]);
        let last_timing_end = built.iter().map(|(_, _, t, at, _)| at + t.code.len() as u64).max().expect("built");
        // Where each counting trampoline starts: the first origin of each, the function's entry.
        let starts: Vec<u64> =
            entries.iter().filter_map(|e| origins.iter().find(|(_, original)| original == e)).map(|&(at, _)| at).collect();
        assert_eq!(starts.len(), 3, "{origins:x?}");
        assert!(starts[0] >= last_timing_end && starts[0] < last_timing_end + 16, "{starts:x?} after {last_timing_end:#x}");
        let stub_len =
            (origins.iter().find(|&&(at, original)| at > starts[0] && original == 0).expect("an end").0 - starts[0]).next_multiple_of(16);
        assert_eq!(starts, [starts[0], starts[0] + stub_len, starts[0] + 2 * stub_len]);
        assert_eq!(bytes.len() as u64, starts[2] + stub_len - region);
        for ((_, p, _, _, counting), &start) in built.iter().zip(&starts) {
            assert_eq!(counting.as_deref(), Some(p.jump_to(start).as_slice()));
        }
        // Each count as a sampler tells them apart: its start, where the
        // function's first instruction, moved, begins, its function.
        let firsts: Vec<u64> = entries
            .iter()
            .zip(&starts)
            .map(|(&e, &start)| origins.iter().find(|&&(at, o)| at > start && o == e).expect("moved").0)
            .collect();
        let expected: Vec<CountingStub> = (0..3).map(|i| CountingStub { count: starts[i], moved: firsts[i], function: i as u32 }).collect();
        assert_eq!(stubs, expected);
    }

    /// In a process of one thread, a counting trampoline counts without
    /// `lock` and carries the count it is switched to after it: the
    /// switch's byte makes its first jump lead there, that count jumps back
    /// to the moved instructions, and a sample in either is counting's.
    #[test]
    fn counting_trampolines_of_a_process_alone_carry_the_count_they_switch_to() {
        // push rbp; mov rbp, rsp; sub rsp, 16; nop; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x90, 0xc3];
        let plans: Plans = vec![(0, patch::plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable"))];
        let (region, counters) = (0x40_0000u64, 0x50_0000u64);
        let mut bytes = Vec::new();
        let prologue = |_: usize, _: Site, _: u64| Ok(vec![0x90; 16]);
        let on_cpu = Some(patch::CpuBlocks { mask: 1, shift: 12 });
        let counting = CountingCode { counters, on_cpu, alone: true };
        let (_, CountingTrampolines { stubs, switches, origins, .. }) =
            build_trampolines(plans, region, &mut bytes, Some(counting), &prologue, &mut Vec::new());
        let [plain, switched] = stubs[..] else { panic!("a count and the one it switches to: {stubs:x?}") };
        let at = |address: u64| (address - region) as usize;
        assert_eq!(bytes[at(plain.count)..at(plain.count) + 5], [0xeb, 0x00, 0x48, 0xff, 0x05], "jmp +0, inc without lock");
        assert_eq!(plain.moved, plain.count + patch::COUNT_ALONE_LEN as u64, "the moved instructions follow the count");
        assert_eq!(switches, [(plain.count + 1, (switched.count - plain.count - 2) as u8)]);
        // The switched count: rdpid and a locked increment, then a jump to
        // the moved instructions.
        let tail = &bytes[at(switched.count)..at(switched.moved) + 5];
        assert!(tail.windows(4).any(|w| w == [0xf3, 0x41, 0x0f, 0xc7]) && tail.contains(&0xf0), "{tail:x?}");
        let back = i32::from_le_bytes(tail[tail.len() - 4..].try_into().unwrap());
        assert_eq!((switched.moved + 5).wrapping_add_signed(i64::from(back)), plain.moved);
        // Both stand for the function's entry; past the second, nothing.
        let origin = |address: u64| origins.iter().rev().find(|&&(from, _)| from <= address).map(|&(_, o)| o);
        assert_eq!((origin(plain.count), origin(switched.count), origin(switched.moved)), (Some(0x1000), Some(0x1000), Some(0x1000)));
        assert_eq!(origin(switched.moved + 5), Some(0));
    }

    #[test]
    fn work_on_every_cpu_comes_back_whole_and_in_order() {
        let indices: Vec<usize> = (0..1000).map(|i| i * 3).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let done = on_every_cpu(&indices, |share| {
            seen.lock().expect("not poisoned").push(share.len());
            // Some of each share made nothing, as refused functions are not all.
            share.iter().filter(|&&i| i % 2 == 0).map(|&i| (i, i * 10)).collect()
        });
        let expected: Vec<(usize, usize)> = indices.iter().filter(|&&i| i % 2 == 0).map(|&i| (i, i * 10)).collect();
        assert_eq!(done, expected);
        assert_eq!(seen.into_inner().expect("not poisoned").iter().sum::<usize>(), indices.len());
        assert!(on_every_cpu(&[], |share: &[usize]| share.iter().map(|&i| (i, ())).collect()).is_empty());
    }
}

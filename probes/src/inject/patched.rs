//! A process patched to time its calls: its functions' entries jump to
//! trampolines that call the runtime (see [`super::totals`]), which adds
//! every call up in memory shared with proftap (read through
//! [`super::reading`]). Here: patching, and taking the patches out again.

use super::children::{ChildMemories, ChildView, Children};
use super::claim::RecordingClaim;
use super::counting::{self, Counting};
use super::hooks::{self, Hook, HookSite};
use super::judged::{self, Verdict};
use super::lock_table;
use super::patch::Site;
use super::patcher::{self, Applied, CODE_DIFFERS, CountingStub, EntryCounters, LEFT_BEHIND, Refused, Target};
use super::reading::TotalsView;
use super::remote::{AWAY_FROM_CODE, FileId, Remote, RemoteError, Shared};
use super::totals::{self, Config, Geometry, call_entry, call_routine, call_routine_and_return};
use crate::offcpu::OffCpu;
use crate::plan::ProbedFunction;
use crate::procfs;
use std::path::Path;

/// `madvise` advice: zero the page in a forked child.
const MADV_WIPEONFORK: u64 = 18;

/// Where the runtime's memory is in the process.
#[derive(Clone, Copy, Debug)]
struct Memory {
    /// The shared memory.
    shared: u64,
    /// Seats and return addresses.
    private: u64,
    /// The live word (see [`totals::LIVE_RECORDING`]).
    live: u64,
    /// The room for the off-CPU times, which the runtime maps a page at a
    /// time from the BPF map, and its bytes (0: none).
    off_cpu: u64,
    off_cpu_bytes: u64,
    /// The map's descriptor in the process, and the map's id (to tell it
    /// is still that map's before it is closed).
    off_cpu_fd: u64,
    off_cpu_map: Option<u64>,
    /// The file of the shared memory (see [`runs_image_of`]), if known.
    shared_file: Option<FileId>,
}

/// What a patched process records besides its calls' wall time.
#[derive(Clone, Copy, Default)]
pub struct Recording<'a> {
    /// Where the runtime reads CPU time (else CPU time is wall time).
    pub off_cpu: Option<&'a OffCpu>,
    /// Forked children record their calls too (else they run unrecorded).
    pub follow_forks: bool,
    /// Finished calls each thread's trace ring holds until proftap reads
    /// them (a power of two), 0: calls are only added up.
    pub trace_slots: u64,
    /// Per function: count its edges (see [`counting`]); empty: none.
    pub count_edges: &'a [bool],
    /// What edge counting may do to the code.
    pub counting: counting::Choices,
    /// Per function, its lines (link-time addresses; empty: unknown): where
    /// a thread's line cannot be told, it is stepped on when counting
    /// starts or ends.
    pub lines: &'a [crate::arcs::FunctionLines],
    /// Regions timed: their hooks go with the edge counters.
    pub regions: u64,
    /// Per line id of `lines`, the regions that hold it.
    pub regions_of: &'a [Vec<u32>],
}

/// Why a function whose entry holds an edge counter is not patched.
pub const ENTRY_COUNTED: &str = "its entry counts its first block (lines are counted)";

/// How often the forked children's calls are read for the governor: every
/// this many of its looks.
const CHILDREN_READ_EVERY: u32 = 4;

/// A process whose functions' entries jump to proftap's runtime.
pub struct Patched {
    pid: i32,
    /// Held until the patches are gone: no other proftap patches the process meanwhile.
    _claim: RecordingClaim,
    view: Option<TotalsView>,
    memory: Option<Memory>,
    geometry: Geometry,
    applied: Vec<Applied>,
    refused: Refused,
    /// Unwinder entries that could not be hooked, and why.
    unhooked: Vec<String>,
    /// proftap's code in the process: the runtime and the trampolines, per module.
    code: Vec<std::ops::Range<u64>>,
    /// Where in it each copy of the runtime makes a forked child's memory.
    fork_code: Vec<std::ops::Range<u64>>,
    /// Where hijacked returns go.
    trampolines: Option<totals::Trampolines>,
    /// Where the runtime's routines return to in proftap's code (see
    /// [`Patched::probe_returns`]).
    probe_returns: Vec<u64>,
    /// The process, held still since it was patched, until taken.
    held: Option<Remote>,
    /// Forked children's memory, when they are followed.
    children: Option<Children>,
    /// Every patch applied, for the forked children's code.
    ever_applied: Vec<Applied>,
    /// Forked children whose code could not be restored, and why.
    children_not_restored: Vec<(i32, String)>,
    /// Each forked child so far, in the order they came, and whether its
    /// calls are read for good (it ended before a reading that mapped its
    /// memory).
    children_read: Vec<(ChildView, bool)>,
    /// The calls by function of the children read for good.
    ended_children_calls: Vec<u64>,
    /// All children's calls by function at the last reading, and readings
    /// asked for since it: reading every block of every child is done
    /// every few asks.
    children_calls: Vec<u64>,
    children_asks: u32,
    /// Functions unpatched while the process ran, in it and its children.
    unpatched: Vec<usize>,
    /// The counters of the entries' counting trampolines, per module.
    entry_counters: Vec<EntryCounters>,
    /// From each address of the entries' counting trampolines on, the
    /// original address it stands for.
    counting_origins: Vec<(u64, u64)>,
    /// Where each entry's counting trampoline's count is, and its function
    /// (see [`patcher::Patches::counting_stubs`]).
    counting_stubs: Vec<CountingStub>,
    /// Functions whose calls are no longer counted: their original code is
    /// back (see [`Patched::stop_counting`]), their probes out before or in
    /// the same step.
    calls_uncounted: Vec<usize>,
    /// Forked children that could not be held as the counting of these
    /// functions stopped: counted there still (see [`Patched::counting_goes_on`]).
    counting_goes_on: Vec<(i32, usize)>,
    /// Edge counters, when asked for.
    counting: Option<Counting>,
    /// Functions whose edges cannot be counted, and why.
    uncounted: Refused,
    /// When proftap's code went in (CLOCK_MONOTONIC): a moment the process
    /// was held, after its exec, before anything it did since (a fork).
    code_since_ns: u64,
    /// The process executed another program since: nothing of proftap's
    /// is left in it, and nothing is to be written there.
    image_gone: bool,
    /// The bytes that make the counts atomic that go without `lock` while
    /// the launched process has one thread (see [`lock_table`]); whether
    /// proftap wrote them itself, once it tried for the last time, and how
    /// often it tried (see [`Patched::lock_counts`]).
    lock_switches: Vec<(u64, u8)>,
    counts_locked_by_proftap: Option<bool>,
    lock_tries: u32,
}

/// Holds in which proftap tries to make counts atomic for a process that
/// asks it to (see [`Patched::lock_counts`]): the process waits meanwhile,
/// and holding it can fail for a moment (another holder letting go).
const LOCK_TRIES: u32 = 5;

impl Patched {
    /// The functions that cannot be patched, and why, judged from their
    /// files alone (before the program runs); and those whose patch needs
    /// their whole code to be planned again (a short jump to an island,
    /// which only a branch back into their first bytes calls for), where
    /// the others are planned from their first instructions alone. What
    /// was judged of the same files before is read from `kept`, and what
    /// is judged now kept there (see [`judged`]).
    pub fn refusals(functions: &[ProbedFunction], kept: Option<&Path>) -> (Refused, Vec<usize>) {
        let (mut refused, mut whole) = (Vec::new(), Vec::new());
        for (i, verdict) in judged::judge(functions, kept).into_iter().enumerate() {
            match verdict {
                Verdict::Refused(why) => refused.push((i, why)),
                Verdict::PlannedWhole => whole.push(i),
                Verdict::Planned => {}
            }
        }
        (refused, whole)
    }

    /// Patches the entries of `functions` in process `pid`, and the entries
    /// of its unwinders (see [`super::hooks`]); those that cannot be patched
    /// are listed by [`Patched::refused`] and [`Patched::unhooked`].
    pub fn attach(pid: i32, functions: &[ProbedFunction], how: Recording<'_>) -> Result<Patched, RemoteError> {
        let mut patched = Patched::patch(pid, functions, None, None, &[], how)?;
        drop(patched.take_hold());
        Ok(patched)
    }

    /// The same for the functions `wanted` picks (by index; all with
    /// `None`), leaving the process held still until the hold is taken.
    pub fn attach_held(
        pid: i32,
        functions: &[ProbedFunction],
        wanted: Option<&[bool]>,
        how: Recording<'_>,
    ) -> Result<Patched, RemoteError> {
        Patched::patch(pid, functions, wanted, None, &[], how)
    }

    /// The same for a process proftap launched and traces, from its exec
    /// to the moment its libraries are loaded and none of their
    /// constructors has run (see [`Remote::at_start`]); held as well.
    /// `checked[i]`: function `i` was found patchable in its file already
    /// ([`Patched::refusals`]), only its first instructions are planned
    /// again: the process is held for less.
    pub fn attach_at_start(pid: i32, functions: &[ProbedFunction], checked: &[bool], how: Recording<'_>) -> Result<Patched, RemoteError> {
        let remote = Remote::at_start(pid)?;
        Patched::patch(pid, functions, None, Some(remote), checked, how)
    }

    /// The recording of process `pid` before anything is patched.
    fn nothing_yet(pid: i32, claim: RecordingClaim, geometry: Geometry) -> Patched {
        Patched {
            pid,
            _claim: claim,
            view: None,
            memory: None,
            geometry,
            applied: Vec::new(),
            refused: Vec::new(),
            unhooked: Vec::new(),
            code: Vec::new(),
            fork_code: Vec::new(),
            trampolines: None,
            probe_returns: Vec::new(),
            held: None,
            children: None,
            ever_applied: Vec::new(),
            children_not_restored: Vec::new(),
            children_read: Vec::new(),
            ended_children_calls: Vec::new(),
            children_calls: Vec::new(),
            children_asks: 0,
            unpatched: Vec::new(),
            entry_counters: Vec::new(),
            calls_uncounted: Vec::new(),
            counting_goes_on: Vec::new(),
            counting_origins: Vec::new(),
            counting_stubs: Vec::new(),
            counting: None,
            uncounted: Vec::new(),
            code_since_ns: super::clock::monotonic_ns(),
            image_gone: false,
            lock_switches: Vec::new(),
            counts_locked_by_proftap: None,
            lock_tries: 0,
        }
    }

    /// Patches each group's functions (`functions` of them; sites past
    /// them are the hooks of `hook_sites`), with the runtime configured by
    /// `config` put in the first group's code room; refusals go to
    /// `refused`. Returns where the region trampoline is, when placed.
    #[allow(clippy::too_many_arguments)]
    fn apply_groups(
        &mut self,
        remote: &Remote,
        groups: Vec<patcher::ModulePlans>,
        config: &Config,
        hook_sites: &[HookSite],
        functions: usize,
        refused: &mut Refused,
        alone: bool,
    ) -> Result<(Option<u64>, CountsAlone), RemoteError> {
        let mut region_trampoline = None;
        let mut alone_counts = CountsAlone::default();
        let routine_returns = std::cell::RefCell::new(Vec::new());
        for group in groups {
            let runtime = std::cell::Cell::new(None::<totals::Runtime>);
            let shared_trampolines = self.trampolines;
            let patches = patcher::apply(
                remote,
                group.plans,
                totals::code_room(config, shared_trampolines),
                |address| {
                    let rt = totals::assemble(address, config, shared_trampolines)?;
                    let code = rt.code.clone();
                    runtime.set(Some(rt));
                    Ok(code)
                },
                |i, site, address| {
                    let rt = runtime.take().ok_or("the runtime is not in place")?;
                    let own = prologue(&rt, hook_sites.get(i.wrapping_sub(functions)).map(|h| h.hook), i, site, address);
                    runtime.set(Some(rt));
                    if own.is_ok() {
                        routine_returns.borrow_mut().push(address + totals::call_routine_return_offset());
                    }
                    own
                },
                refused,
                alone,
                alone_counts.lock_table,
            )?;
            alone_counts.lock_table = patches.lock_table;
            alone_counts.switches.extend(patches.switches);
            if let Some(rt) = runtime.take() {
                self.fork_code.push(rt.fork_code.clone());
                self.trampolines.get_or_insert(rt.trampolines);
                region_trampoline.get_or_insert(rt.region_trampoline);
            }
            self.ever_applied.extend(patches.applied.iter().cloned());
            self.applied.extend(patches.applied);
            self.code.push(patches.code);
            self.entry_counters.extend(patches.counters);
            self.counting_origins.extend(patches.origins);
            self.counting_stubs.extend(patches.counting_stubs);
        }
        self.probe_returns = routine_returns.into_inner();
        self.probe_returns.extend(self.return_trampoline_returns());
        self.probe_returns.sort_unstable();
        Ok((region_trampoline, alone_counts))
    }

    /// Patches with `remote` holding a launched process at its start, or
    /// (`None`) holding the running process once there is something to
    /// patch; recording what `how` says.
    fn patch(
        pid: i32,
        functions: &[ProbedFunction],
        wanted: Option<&[bool]>,
        at_start: Option<Remote>,
        checked: &[bool],
        how: Recording<'_>,
    ) -> Result<Patched, RemoteError> {
        let modules = procfs::loaded_modules(pid).map_err(|e| RemoteError::Unsupported(e.to_string()))?;
        refuse_shadow_stacks(pid)?;
        let claim = RecordingClaim::take(pid)?;
        // Counts may go without `lock` in a launched process (its entries'
        // after a throttle) and where edges are counted.
        let counts_alone = at_start.is_some() || how.count_edges.contains(&true);
        let hooks::Hooks { sites: hook_sites, canceller } = hook_sites(&modules, counts_alone);
        let mut targets: Vec<Target> = functions.iter().map(Target::of).collect();
        targets.extend(hook_sites.iter().map(|h| h.target.clone()));
        let (mut groups, mut refused) = patcher::plans_on_every_cpu(&modules, &targets, checked);
        let counting_plan = how.count_edges.contains(&true).then(|| {
            let regions = counting::Regions { of_lines: how.regions_of };
            counting::plan(&modules, &targets, how.count_edges, how.counting, how.lines, regions)
        });
        // Functions whose entry a counter takes are not patched.
        for &taken in counting_plan.iter().flat_map(|p| &p.entries_taken) {
            groups.iter_mut().for_each(|g| g.plans.retain(|(i, _)| *i != taken));
            refused.push((taken, ENTRY_COUNTED.into()));
        }
        groups.retain(|g| !g.plans.is_empty());
        if let Some(wanted) = wanted {
            let keep = |i: usize| i >= functions.len() || wanted.get(i).copied().unwrap_or(false);
            groups.iter_mut().for_each(|g| g.plans.retain(|(i, _)| keep(*i)));
            groups.retain(|g| !g.plans.is_empty());
            refused.retain(|(i, _)| keep(*i));
        }
        let geometry =
            Geometry { functions: functions.len() as u64, blocks: totals::BLOCKS, trace_slots: how.trace_slots, regions: how.regions };
        let mut patched = Patched::nothing_yet(pid, claim, geometry);
        if groups.iter().all(|g| g.plans.iter().all(|(i, _)| *i >= functions.len())) && counting_plan.is_none() {
            patched.split_refusals(refused, functions.len(), &hook_sites);
            return Ok(patched);
        }
        let launched = at_start.is_some();
        let remote = match at_start {
            Some(remote) => remote,
            None => Remote::attach(pid)?,
        };
        // Held: any exec since was before the code went in.
        patched.code_since_ns = super::clock::monotonic_ns();
        // Where the threads are before anything moves them: frames counting starts in.
        let threads_at = match &counting_plan {
            Some(plan) => counting::settle_threads(&remote, plan)?,
            None => Vec::new(),
        };
        // Memory of proftap's mapped before this recording maps its own: a
        // recording stopped before it could restore the code (killed) left it,
        // and the functions it patched then differ from their files.
        let left_behind = !launched
            && procfs::read_maps(pid)
                .is_ok_and(|maps| maps.iter().any(|m| m.path.as_deref().is_some_and(|p| p.starts_with("/memfd:proftap"))));
        // The programs keep times off CPU by the kernel's thread ids, which
        // a process in a pid namespace of its own does not see: its CPU
        // time is its wall time rather than another thread's.
        let off_cpu = how.off_cpu.filter(|_| procfs::sees_kernel_thread_ids(pid));
        let (shared, memory, mut config) = set_up_memory(&remote, geometry, off_cpu)?;
        // From the library's symbol table, which a hostile target may make
        // wrap: the range is then empty, and the link unhooks everywhere.
        if let Some(code) = canceller {
            (config.canceller, config.canceller_bytes) = (code.start, code.end.saturating_sub(code.start));
        }
        // From here on a failure puts back what was patched and unmaps this.
        patched.memory = Some(memory);
        if how.follow_forks {
            let children = Children::listen(owner(pid)?, geometry, shared.remote)
                .map_err(|e| RemoteError::Unsupported(format!("cannot listen for forked children: {e}")))?;
            config.fork_socket = children.name();
            config.fork_path = children.path();
            patched.children = Some(children);
        }
        // Counts go without `lock` while the process has one thread: the
        // runtime makes them atomic as a thread or process starts.
        let alone = launched && remote.threads().len() == 1;
        let (region_trampoline, alone_counts) =
            patched.apply_groups(&remote, groups, &config, &hook_sites, functions.len(), &mut refused, alone)?;
        let hooked = |h: usize| !refused.iter().any(|(i, _)| *i == functions.len() + h);
        if clones_hooked(&hook_sites, hooked) && !threads_share_a_thread_pointer(&remote)? {
            shared.store(std::mem::offset_of!(totals::Header, shared_seats), 0);
        }
        // Where a start would go unseen, atomic from the start.
        let alone = alone && thread_starts_hooked(&hook_sites, hooked);
        let mut lock_table = alone_counts.lock_table;
        if !alone {
            lock_table::apply_now(&remote, &alone_counts.switches)?;
            lock_table = 0;
        }
        if let Some(plan) = counting_plan {
            let (counting, uncounted) = counting::apply(&remote, plan, &threads_at, region_trampoline, !alone, lock_table)?;
            lock_table = counting.lock_table();
            patched.code.extend(counting.code().iter().cloned());
            patched.counting = Some(counting);
            patched.uncounted = uncounted;
        }
        if lock_table != 0 {
            patched.lock_switches = alone_counts.switches;
            patched.lock_switches.extend(patched.counting.iter().flat_map(|c| c.lockable()));
        }
        shared.store(std::mem::offset_of!(totals::Header, lock_table), lock_table);
        // Recording starts with the threads still held.
        remote.write(memory.live, &totals::LIVE_RECORDING.to_ne_bytes())?;
        patched.view = Some(TotalsView::new(shared, geometry));
        if left_behind {
            for (_, why) in refused.iter_mut().filter(|(_, why)| why == CODE_DIFFERS) {
                *why = LEFT_BEHIND.into();
            }
        }
        patched.split_refusals(refused, functions.len(), &hook_sites);
        patched.held = Some(remote);
        Ok(patched)
    }

    /// The hold on the patched process, to let go of (by dropping it, on
    /// the thread that patched) when recording may start.
    pub fn take_hold(&mut self) -> Option<Remote> {
        self.held.take()
    }

    /// The threads of the process, when it is still held as patched.
    pub fn held_threads(&self) -> Option<Vec<i32>> {
        self.held.as_ref().map(Remote::threads)
    }

    /// The process held still: as patched, or now, if it still runs the
    /// image proftap patched (else [`RemoteError::ImageGone`], and
    /// nothing is ever written in it again).
    fn hold(&mut self) -> Result<Remote, RemoteError> {
        if let Some(remote) = self.held.take() {
            return Ok(remote);
        }
        if self.image_gone {
            return Err(RemoteError::ImageGone { pid: self.pid });
        }
        let remote = Remote::attach(self.pid)?;
        if let Some(m) = self.memory.filter(|m| m.shared_file.is_some())
            && !runs_image_of(&remote, m.shared, m.shared_file)?
        {
            self.image_replaced();
            return Err(RemoteError::ImageGone { pid: self.pid });
        }
        Ok(remote)
    }

    /// The process executed another program since it was patched (found
    /// in a hold, or told by the kernel's events): what was patched went
    /// with the image, and nothing is written in the process again. Its
    /// forked children are restored as before, its counters still read.
    pub fn image_replaced(&mut self) {
        self.image_gone = true;
        self.applied.clear();
    }

    /// Refusals of functions stay refusals; those of hook sites say which
    /// unwinder entry could not be hooked.
    fn split_refusals(&mut self, refused: Refused, functions: usize, hook_sites: &[HookSite]) {
        // glibc's link to the unwinder stands for libgcc_s's entries only
        // where those could not be hooked (not loaded yet).
        let refused_at = |h: usize| refused.iter().any(|(i, _)| *i == functions + h);
        let forced_unwind_hooked = hook_sites.iter().enumerate().any(|(h, s)| s.name == hooks::FORCED_UNWIND && !refused_at(h));
        for (i, why) in refused.iter().cloned() {
            match i.checked_sub(functions).and_then(|h| hook_sites.get(h)) {
                // Without its hook, a thread start finds the counters atomic
                // already, and blocks taken atomically; the calls a longjmp
                // leaves end at the thread's next call or return.
                Some(site) if site.target.site == Site::Return || site.hook.starts_thread() || site.hook == Hook::Jump => {}
                Some(site) if site.hook == Hook::UnwinderLink && forced_unwind_hooked => {}
                Some(site) => self.unhooked.push(format!("{} in {} ({why})", site.name, site.target.module.display())),
                None => self.refused.push((i, why)),
            }
        }
    }

    /// Functions it was asked to patch (their indexes in the runtime).
    pub fn functions(&self) -> usize {
        self.geometry.functions as usize
    }

    /// The edge counters, when asked for.
    pub fn counting(&self) -> Option<&Counting> {
        self.counting.as_ref()
    }

    /// From each address of the edge counters' stubs, the entries'
    /// counting trampolines and the islands short jumps lead to on, the
    /// address of the original code it stands for (0: none), for unwinders.
    pub fn origins(&self) -> Vec<(u64, u64)> {
        let mut origins = self.counting.as_ref().map(|c| c.origins().to_vec()).unwrap_or_default();
        origins.extend_from_slice(&self.counting_origins);
        origins.sort_unstable();
        origins
    }

    /// Where each entry's counting trampoline's count starts, where the
    /// function's moved instructions follow it, and the function whose
    /// calls it counts.
    pub fn counting_stubs(&self) -> Vec<CountingStub> {
        self.counting_stubs.clone()
    }

    /// The functions whose edges could not be counted, and why.
    pub fn uncounted(&self) -> &[(usize, String)] {
        &self.uncounted
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Functions that could not be patched (by index), and why.
    pub fn refused(&self) -> &[(usize, String)] {
        &self.refused
    }

    /// Unwinder entry points that could not be hooked, and why.
    pub fn unhooked(&self) -> &[String] {
        &self.unhooked
    }

    /// proftap's code in the process (runtime and trampolines).
    pub fn code(&self) -> Vec<std::ops::Range<u64>> {
        self.code.clone()
    }

    /// Where in [`Patched::code`] the runtime makes a forked child's
    /// memory: once per child, not a cost of the probes' calls.
    pub fn fork_code(&self) -> Vec<std::ops::Range<u64>> {
        self.fork_code.clone()
    }

    /// Where the runtime's routines return to in proftap's code: each
    /// trampoline's call into the runtime, the return trampoline's among
    /// them, by address. What the trampoline pushed (nine saved
    /// registers, and at a function's two words set aside) above such a
    /// return address is the slot of the patched call's own return
    /// address: a stack sampled inside the runtime unwinds from there.
    pub fn probe_returns(&self) -> Vec<u64> {
        self.probe_returns.clone()
    }

    /// Those of [`Patched::probe_returns`] in the shared return trampoline.
    pub fn return_trampoline_returns(&self) -> Vec<u64> {
        self.trampolines.iter().map(|t| t.shared + totals::return_trampoline_return_offset()).collect()
    }

    /// Where hijacked returns go, if anything was patched.
    pub fn trampolines(&self) -> Option<totals::Trampolines> {
        self.trampolines
    }

    /// Whether anything was patched.
    pub fn is_active(&self) -> bool {
        self.view.is_some()
    }

    /// What the runtime added up, to read from any thread while the
    /// process runs and after it is detached or gone.
    pub fn view(&self) -> Option<TotalsView> {
        self.view.clone()
    }

    /// When proftap's code went into the process (see [`Patched::code`]):
    /// a moment it was held, so that whatever it did after (a fork) came later.
    pub fn code_since_ns(&self) -> u64 {
        self.code_since_ns
    }

    /// Whether the runtime keeps its threads' times off CPU: not in a
    /// process in a pid namespace of its own, whose thread ids are not
    /// the kernel's.
    pub fn times_off_cpu(&self) -> bool {
        self.memory.as_ref().is_some_and(|m| m.off_cpu != 0)
    }

    /// The forked children's memory, by process id, as they hand it over.
    pub fn child_memories(&self) -> Option<ChildMemories> {
        let (Some(children), Some(view)) = (&self.children, &self.view) else { return None };
        Some(children.memories(self.geometry, view.remote_address()))
    }

    /// The forked children running now.
    pub fn running_children(&self) -> Vec<i32> {
        self.children.as_ref().map_or_else(Vec::new, |children| children.running().into_iter().map(|(pid, _)| pid).collect())
    }

    /// Stops taking forked children, and gives a view of each one's memory
    /// (by process id, or why it cannot be read, and when it ended) and how
    /// many were refused or past the limit.
    pub fn children(&mut self) -> (Vec<ChildView>, u64) {
        let (Some(children), Some(view)) = (&mut self.children, &self.view) else { return (Vec::new(), 0) };
        children.stop();
        children.views(0, self.geometry, view.remote_address())
    }

    /// Takes the probes of `functions` out while the process runs on, in
    /// it and in its forked children: their calls in progress still return
    /// through the trampoline and are added up; new calls are only counted
    /// (see [`Patched::calls_only_counted`]), where the entry has a
    /// counting trampoline, else run the original code.
    pub fn unpatch(&mut self, functions: &[usize]) -> Result<(), RemoteError> {
        self.step_down(functions, &[])?.unpatched
    }

    /// [`Patched::unpatch`] for `unpatch` and [`Patched::stop_counting`]
    /// for `uncount` together, each process held once for both: a hold
    /// stops every thread of the program for 30 to 500 µs.
    /// Each half's outcome comes back on its own (an error: the process
    /// could not be held, neither was done).
    pub fn step_down(&mut self, unpatch: &[usize], uncount: &[usize]) -> Result<SteppedDown, RemoteError> {
        let (mut unpatched, mut uncounted) = (Ok(()), Ok(()));
        if self.applied.iter().any(|a| unpatch.contains(&a.function) || uncount.contains(&a.function)) {
            match self.hold() {
                Err(RemoteError::ImageGone { .. }) => {}
                Err(e) => return Err(e),
                Ok(held) => {
                    if !unpatch.is_empty() {
                        unpatched = patcher::count_only(&held, &mut self.applied, |f| unpatch.contains(&f));
                    }
                    if !uncount.is_empty() {
                        uncounted = patcher::restore(&held, &mut self.applied, |f| uncount.contains(&f));
                    }
                }
            }
        }
        // Only what took effect in the process is noted, and done in its
        // children: a half that failed is not taken as done (the caller
        // asks for it again), its calls timed or counted as before.
        if unpatched.is_ok() {
            self.unpatched.extend_from_slice(unpatch);
            self.unpatched.sort_unstable();
            self.unpatched.dedup();
        }
        if uncounted.is_ok() {
            self.calls_uncounted.extend_from_slice(uncount);
            self.calls_uncounted.sort_unstable();
            self.calls_uncounted.dedup();
        }
        let unpatch = if unpatched.is_ok() { unpatch } else { &[] };
        let uncount = if uncounted.is_ok() { uncount } else { &[] };
        if let Some(children) = &self.children {
            let both: Vec<usize> = unpatch.iter().chain(uncount).copied().collect();
            for (pid, process) in children.running() {
                if !self.unpatch_child(pid, &process, &both) {
                    self.counting_went_on(pid, uncount);
                }
            }
        }
        Ok(SteppedDown { unpatched, uncounted })
    }

    /// Makes the counts atomic that went without `lock` while the process
    /// had one thread, where the process refused the runtime the rights
    /// to write its code and its one thread waits at a thread's or
    /// process's start for proftap to (see [`TotalsView::asks_for_locks`]).
    /// Whether it did (`None`: not yet, to be tried again while the process
    /// waits). Tried [`LOCK_TRIES`] times at most in a recording, whatever
    /// the process asks: the bytes once written stay written.
    pub fn lock_counts(&mut self) -> Option<bool> {
        if self.counts_locked_by_proftap.is_none() {
            self.lock_tries += 1;
            // Nothing to write: the process was attached to, or counted atomically from the start.
            let locked =
                !self.lock_switches.is_empty() && self.hold().and_then(|held| lock_table::apply_now(&held, &self.lock_switches)).is_ok();
            if locked || self.lock_switches.is_empty() || self.lock_tries >= LOCK_TRIES {
                self.counts_locked_by_proftap = Some(locked);
            }
        }
        self.counts_locked_by_proftap
    }

    /// Whether proftap made the counts atomic itself (see [`Patched::lock_counts`]).
    pub fn counts_locked_by_proftap(&self) -> bool {
        self.counts_locked_by_proftap == Some(true)
    }

    /// Takes the probes of `functions` out of forked child `pid`, which
    /// inherited the patches of its fork's moment, as [`Patched::unpatch`]
    /// and [`Patched::stop_counting`] did in the parent. A child that
    /// cannot be held keeps them: its calls stay exact, only dearer.
    /// Whether those no longer counted stopped being counted there (or
    /// the child is gone): false, they are counted still.
    fn unpatch_child(&self, pid: i32, process: &std::os::fd::OwnedFd, functions: &[usize]) -> bool {
        let mut applied: Vec<Applied> = self.ever_applied.iter().filter(|a| functions.contains(&a.function)).cloned().collect();
        if applied.is_empty() {
            return true;
        }
        let memory = self.children.as_ref().and_then(|c| c.memory_file(pid));
        let restored = Remote::attach(pid).and_then(|remote| {
            // Held, and still the child (its pid cannot have been reused),
            // running the image it forked with.
            if crate::target::has_exited(process) {
                return Ok(());
            }
            let runs_patched = match self.memory {
                Some(m) => runs_image_of(&remote, m.shared, memory)?,
                None => false,
            };
            if !runs_patched {
                return Ok(());
            }
            let restored = patcher::restore(&remote, &mut applied, |f| self.calls_uncounted.contains(&f));
            // Probes that could not come out stay: exact, only dearer.
            let _ = patcher::count_only(&remote, &mut applied, |_| true);
            restored
        });
        restored.is_ok() || crate::target::has_exited(process)
    }

    /// Notes that the calls of those of `functions` no longer counted go on
    /// being counted in child `pid`, which could not be held to stop it.
    fn counting_went_on(&mut self, pid: i32, functions: &[usize]) {
        for &f in functions.iter().filter(|f| self.calls_uncounted.binary_search(f).is_ok()) {
            if !self.counting_goes_on.contains(&(pid, f)) {
                self.counting_goes_on.push((pid, f));
            }
        }
    }

    /// Forked children, with functions whose counting stopped everywhere
    /// else, that could not be held to stop it: their calls there are
    /// still counted (in the counters they share with the process), and
    /// are not to be estimated again from their samples.
    pub fn counting_goes_on(&self) -> &[(i32, usize)] {
        &self.counting_goes_on
    }

    /// Puts the original code of `functions`, only counted since
    /// [`Patched::unpatch`], back, in the process and its forked children:
    /// their calls are no longer counted (counting them cost more than
    /// the budget allows).
    pub fn stop_counting(&mut self, functions: &[usize]) -> Result<(), RemoteError> {
        self.step_down(&[], functions)?.uncounted
    }

    /// Adds to `into` (by function) the calls only counted so far, those
    /// of functions no longer counted included (see [`Patched::calls_only_counted`]).
    pub fn add_counted_calls(&self, into: &mut [u64]) {
        self.entry_counters.iter().for_each(|counters| counters.add_calls(into));
    }

    /// The calls of each function (by index) made after its probes were
    /// taken out, in the process and its forked children, which only its
    /// counting trampoline counted (until it was taken out too, see
    /// [`Patched::counting_stopped`]); `None` for a function without one.
    pub fn calls_only_counted(&self, functions: usize) -> Vec<Option<u64>> {
        let mut totals = vec![0u64; functions];
        self.add_counted_calls(&mut totals);
        let mut calls = vec![None; functions];
        for &f in self.entry_counters.iter().flat_map(EntryCounters::functions) {
            if let Some(call) = calls.get_mut(f) {
                *call = totals.get(f).copied();
            }
        }
        calls
    }

    /// Whether each function (by index) had its counting trampoline taken
    /// out: its calls since were not counted.
    pub fn counting_stopped(&self, functions: usize) -> Vec<bool> {
        (0..functions).map(|f| self.calls_uncounted.binary_search(&f).is_ok()).collect()
    }

    /// Adds the calls of the forked children so far, running or ended, to
    /// `into` (by function): the governor judges every process's calls.
    /// They are read afresh every [`CHILDREN_READ_EVERY`] asks (a program
    /// with hundreds of children has hundreds of memories to read). A
    /// child seen for the first time has the functions unpatched so far
    /// unpatched in it too (it may have forked before they were).
    pub fn add_children_calls(&mut self, into: &mut [u64]) {
        self.children_asks = self.children_asks.wrapping_add(1);
        if self.children_asks % CHILDREN_READ_EVERY == 1 {
            self.read_children_calls(into.len());
        }
        for (total, calls) in into.iter_mut().zip(&self.children_calls) {
            *total = total.saturating_add(*calls);
        }
    }

    fn read_children_calls(&mut self, functions: usize) {
        let (Some(children), Some(view)) = (&self.children, &self.view) else { return };
        let (new, _) = children.views(self.children_read.len(), self.geometry, view.remote_address());
        let running = if new.is_empty() || self.unpatched.is_empty() { Vec::new() } else { children.running() };
        for child in new {
            if let Some((_, process)) = running.iter().find(|(p, _)| *p == child.pid)
                && !self.unpatch_child(child.pid, process, &self.unpatched)
            {
                self.counting_went_on(child.pid, &self.unpatched.clone());
            }
            self.children_read.push((child, false));
        }
        self.ended_children_calls.resize(functions, 0);
        let mut running_calls = vec![0; functions];
        let mut all_read = true;
        // One child's memory mapped at a time.
        for (child, for_good) in self.children_read.iter_mut().filter(|(_, for_good)| !*for_good) {
            // Ended before this reading: what its memory holds is all it will.
            let ended = child.ended();
            // A memory that could not be mapped now (the address space
            // full for a moment) is read again next time.
            let read = child.calls(if ended { &mut self.ended_children_calls } else { &mut running_calls });
            *for_good = ended && read;
            all_read &= read;
        }
        // Short of a child, the last reading's totals stand (they had its
        // calls): the governor's never go down, to come back in a burst.
        if all_read {
            self.children_calls = self.ended_children_calls.iter().zip(running_calls).map(|(a, b)| a.saturating_add(b)).collect();
        }
    }

    /// Puts the original bytes back and stops adding up; then, unless a
    /// thread is inside proftap's code at that moment, gives every call in
    /// progress its return address back and unmaps everything proftap
    /// mapped in the process (so that attaching again finds room) but the
    /// edge counters and their stubs, which calls in progress may return
    /// into. The totals read so far stay readable here.
    pub fn detach(&mut self) -> Result<(), RemoteError> {
        let failed = self.detach_children();
        self.children_not_restored.extend(failed.into_iter().map(|(pid, e)| (pid, e.to_string())));
        // A process that is gone has nothing to restore.
        if self.memory.is_none() || !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            self.applied.clear();
            self.memory = None;
            return Ok(());
        }
        let remote = match self.hold() {
            Err(RemoteError::ImageGone { .. }) => return Ok(()),
            held => held?,
        };
        patcher::restore(&remote, &mut self.applied, |_| true)?;
        if let Some(counting) = &mut self.counting {
            counting.restore(&remote)?;
        }
        let Some(memory) = self.memory.take() else { return Ok(()) };
        remote.write(memory.live, &totals::LIVE_STOPPED.to_ne_bytes())?;
        let mut remote = remote;
        let mut wait = RELEASE_AGAIN_AFTER;
        let (started, mut attempts, mut ran) = (std::time::Instant::now(), 0, threads_cpu_ns(self.pid));
        loop {
            if self.release(&remote, memory)? {
                self.code.clear();
                self.fork_code.clear();
                break;
            }
            let now_ran = threads_cpu_ns(self.pid);
            if now_ran != ran || now_ran.is_none() {
                attempts += 1;
                ran = now_ran;
            }
            if attempts >= RELEASE_ATTEMPTS || started.elapsed() >= RELEASE_AT_MOST {
                break;
            }
            // The threads run on out of proftap's code (a signal handler
            // that interrupted it returns there; the entries lead there no
            // more), and are held again: the same program, or nothing is
            // done (it exited, or executed another; its code is left
            // mapped, as it is when the threads never leave it).
            drop(remote);
            std::thread::sleep(wait);
            wait = (wait * 2).min(RELEASE_AGAIN_AT_MOST);
            remote = match Remote::attach(self.pid) {
                Ok(remote) => remote,
                Err(_) => return Ok(()),
            };
            if !runs_image_of(&remote, memory.shared, memory.shared_file)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Stops taking forked children and takes the patches out of those
    /// still running, as out of the parent: all that were ever applied,
    /// since the parent's unpatching after a fork does not reach the child.
    /// Returns each child that could not be restored, and why.
    fn detach_children(&mut self) -> Vec<(i32, RemoteError)> {
        let Some(children) = &mut self.children else { return Vec::new() };
        children.stop();
        let (Some(memory), running) = (self.memory, children.running()) else { return Vec::new() };
        let files: Vec<Option<FileId>> = running.iter().map(|(pid, _)| children.memory_file(*pid)).collect();
        let mut failed = Vec::new();
        for ((pid, process), file) in running.into_iter().zip(files) {
            let restored = Remote::attach(pid).and_then(|remote| {
                // Held, and still the child (its pid cannot have been
                // reused), running the image it forked with.
                if crate::target::has_exited(&process) || !runs_image_of(&remote, memory.shared, file)? {
                    return Ok(());
                }
                let mut applied = self.ever_applied.clone();
                patcher::restore(&remote, &mut applied, |_| true)?;
                remote.write(memory.live, &totals::LIVE_STOPPED.to_ne_bytes())?;
                self.release(&remote, memory).map(drop)
            });
            match restored {
                Err(_) if crate::target::has_exited(&process) => {}
                Err(e) => failed.push((pid, e)),
                Ok(()) => {}
            }
        }
        failed
    }

    /// The forked children that could not be restored at the last detach, and why.
    pub fn children_not_restored(&self) -> &[(i32, String)] {
        &self.children_not_restored
    }

    /// Returns every hijacked return address to its frame and unmaps the
    /// runtime's memory and code, with the process held. A thread inside
    /// that code (a busy program is, as often as not) is stepped out of it
    /// first; when one cannot be (a system call, or a wait for a thread
    /// held still), nothing is unmapped and calls in progress still return
    /// through it, as they would without this. Returns whether it unmapped.
    fn release(&self, remote: &Remote, memory: Memory) -> Result<bool, RemoteError> {
        let in_code = |rip: u64| self.code.iter().any(|c| c.contains(&rip));
        // Counting stubs and their counters stay: a call in progress may
        // return into a stub, which then counts.
        let counting = self.counting.as_ref().map_or(&[][..], Counting::code);
        let unmapped = |rip: u64| self.code.iter().filter(|c| !counting.contains(c)).any(|c| c.contains(&rip));
        for tid in remote.threads() {
            let stopped_at = match remote.regs(tid) {
                Ok(r) if in_code(r.rip) => remote.step_while(tid, in_code, STEPS_OUT_OF_CODE)?,
                Ok(r) => r.rip,
                Err(_) => return Ok(false),
            };
            if in_code(stopped_at) || !out_of_handlers_into(remote, tid, in_code, unmapped) {
                return Ok(false);
            }
        }
        if let Some(trampolines) = self.trampolines {
            give_back_return_addresses(remote, memory, self.geometry, trampolines)?;
        }
        let unmap = |address: u64, len: u64| remote.syscall("munmap", libc::SYS_munmap, [address, len, 0, 0, 0, 0]).map(drop);
        unmap(memory.shared, self.geometry.shared_bytes())?;
        unmap(memory.private, self.geometry.private_bytes())?;
        unmap(memory.live, 4096)?;
        if memory.off_cpu != 0 {
            unmap(memory.off_cpu, memory.off_cpu_bytes)?;
            // Unless the program closed it and the number is another file's now.
            // (Not closed, it only stays open: what is left to unmap goes on.)
            if memory.off_cpu_map.is_some() && crate::offcpu::map_id_of(remote.pid(), memory.off_cpu_fd) == memory.off_cpu_map {
                let _ = remote.syscall("close", libc::SYS_close, [memory.off_cpu_fd, 0, 0, 0, 0, 0]);
            }
        }
        for (address, len) in self.entry_counters.iter().map(EntryCounters::mapping) {
            unmap(address, len)?;
        }
        for code in self.code.iter().filter(|c| !counting.contains(c)) {
            unmap(code.start, code.end - code.start)?;
        }
        Ok(true)
    }
}

/// Puts back the return address of every frame of process `remote` whose
/// slot holds one of `trampolines`, as the runtime's shadow stacks in its
/// private memory say.
fn give_back_return_addresses(
    remote: &Remote,
    memory: Memory,
    geometry: Geometry,
    trampolines: totals::Trampolines,
) -> Result<(), RemoteError> {
    let seats = remote.read(memory.private, (totals::SEATS * 32) as usize)?;
    for seat in seats.chunks_exact(32) {
        let block = u64::from_ne_bytes(seat[8..16].try_into().unwrap_or_default());
        if block == 0 || block > geometry.blocks {
            continue;
        }
        let at = memory.private + Geometry::private_block(block - 1);
        let depth = u64::from_ne_bytes(remote.read(at, 8)?.try_into().unwrap_or_default()).min(totals::STACK_DEPTH);
        let frames = remote.read(at + Geometry::PRIVATE_RETURNS, (depth * 16) as usize)?;
        for frame in frames.chunks_exact(16) {
            let ret = u64::from_ne_bytes(frame[..8].try_into().unwrap_or_default());
            let slot = u64::from_ne_bytes(frame[8..].try_into().unwrap_or_default());
            let hijacked = remote.read(slot, 8).is_ok_and(|v| v.try_into().is_ok_and(|v| trampolines.contains(u64::from_ne_bytes(v))));
            if hijacked {
                remote.write(slot, &ret.to_ne_bytes())?;
            }
        }
    }
    Ok(())
}

/// The CPU time process `pid`'s threads have had, as the scheduler counts
/// it (nanoseconds): whether they ran between two looks.
fn threads_cpu_ns(pid: i32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let on_cpu = |task: std::fs::DirEntry| -> Option<u64> {
        std::fs::read_to_string(task.path().join("schedstat")).ok()?.split_whitespace().next()?.parse().ok()
    };
    Some(tasks.filter_map(Result::ok).filter_map(on_cpu).sum())
}

/// Instructions a thread is stepped through at most to leave proftap's
/// code at a detach: a call's bookkeeping is a few hundred.
const STEPS_OUT_OF_CODE: usize = 20_000;

/// Times a detach holds the process to unmap proftap's code before it
/// leaves it mapped, and how long the threads run on between two: twice
/// as long each time, at most the second (about a quarter of a second in
/// all). An attempt after which the threads did not run (a busy machine
/// did not give them a CPU) does not count, up to RELEASE_AT_MOST in all.
const RELEASE_ATTEMPTS: usize = 12;
const RELEASE_AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);
const RELEASE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(2);
const RELEASE_AGAIN_AT_MOST: std::time::Duration = std::time::Duration::from_millis(32);

/// Bytes of a thread's stack, from its stack pointer, searched for the
/// frame of a signal handler it is in: as far as the stack's mapping
/// goes (the stack in use, from its pointer up), at most the usual limit
/// of a stack's size. A handler's frame is above all the stack it and
/// its callees use: 64 KiB missed a handler with a large frame, and the
/// program died as it returned into code unmapped.
const SIGNAL_FRAMES_SEARCHED: usize = 8 << 20;

/// Where a signal frame (the kernel's `rt_sigframe`) keeps the address
/// the handler returns to: after its return address (8 bytes), the
/// context's flags, link and stack (40), and sixteen registers before it.
const SIGNAL_FRAME_RIP: usize = 8 + 40 + 16 * 8;

/// `rt_sigreturn`, as the C libraries' restorers make it (`mov rax, 15;
/// syscall`, or `mov eax, 15; syscall`): a signal frame's return address
/// points at one.
const RESTORERS: [&[u8]; 2] = [&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05], &[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05]];

/// Where a signal frame keeps, after its return address (8 bytes), the
/// context's flags and link: flags the kernel sets (`UC_FP_XSTATE`,
/// `UC_SIGCONTEXT_SS`, `UC_STRICT_RESTORE_SS`) and no link.
const SIGNAL_FRAME_FLAGS: usize = 8;
const SIGNAL_FRAME_LINK: usize = 16;
const SIGNAL_FRAME_KNOWN_FLAGS: u64 = 7;

/// Where a signal frame keeps the interrupted stack pointer: the
/// register before the address.
const SIGNAL_FRAME_SP: usize = SIGNAL_FRAME_RIP - 8;

/// Where a signal frame keeps the address of the floating-point state it
/// saved (after the 23 registers), and where the kernel puts that state:
/// 64-byte aligned over the 440-byte frame, which is placed under it
/// 16-byte aligned less 8, 456 bytes further up.
const SIGNAL_FRAME_FPSTATE: usize = 8 + 40 + 23 * 8;
const SIGNAL_FRAME_FPSTATE_AT: u64 = 456;

/// Whether thread `tid` of the held process is in no signal handler that
/// interrupted it in code that is to go (`unmapped`), once let run alone
/// out of those it is in, up to SIGNAL_RETURN_WAIT, and stepped out of
/// proftap's code (`in_code`) where each returns.
fn out_of_handlers_into(remote: &Remote, tid: i32, in_code: impl Fn(u64) -> bool, unmapped: impl Fn(u64) -> bool) -> bool {
    let started = std::time::Instant::now();
    while handler_returns_into(remote, tid, &unmapped) {
        let left = SIGNAL_RETURN_WAIT.saturating_sub(started.elapsed());
        match remote.run_to_signal_return(tid, &in_code, left) {
            Ok(Some(rip)) if !in_code(rip) => {}
            _ => return false,
        }
    }
    true
}

/// How long a detach lets a thread run alone to return from the signal
/// handlers that would return into proftap's code: a handler usually
/// returns in microseconds, and one interrupted again as it returns (a
/// signal pending meanwhile) makes no progress until let run this way.
const SIGNAL_RETURN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether thread `tid` of the held process is in a signal handler that
/// interrupted it where `in_code` says is proftap's: it would return
/// there, so that code must stay. A thread whose registers or stack
/// cannot be read may be.
fn handler_returns_into(remote: &Remote, tid: i32, in_code: impl Fn(u64) -> bool) -> bool {
    let Ok(regs) = remote.regs(tid) else { return true };
    let mut restorers: std::collections::HashMap<u64, bool> = std::collections::HashMap::new();
    let is_restorer = |ret: u64| {
        *restorers.entry(ret).or_insert_with(|| RESTORERS.iter().any(|code| remote.read(ret, code.len()).is_ok_and(|bytes| bytes == *code)))
    };
    let read = |from: u64| remote.read_within_mapping(from, SIGNAL_FRAMES_SEARCHED).ok();
    signal_frames_across_stacks(regs.rsp, read, is_restorer).is_none_or(|frames| frames.iter().any(|frame| in_code(frame.interrupted_ip)))
}

/// How many stacks a detach follows a thread's signal frames across: its
/// own, and those that handlers on an alternate stack interrupted.
const STACKS_FOLLOWED: usize = 8;

/// The signal frames a thread running with stack pointer `sp` would
/// return through: those on its stack, and where the outermost of them
/// interrupted code on another stack (a handler on an alternate signal
/// stack, nested in a handler on the thread's own), those on that stack
/// from where it was interrupted, and so on. `read(address)` reads the
/// stack `address` is in, from there up; `None` when a stack to search
/// could not be read.
pub fn signal_frames_across_stacks(
    sp: u64,
    mut read: impl FnMut(u64) -> Option<Vec<u8>>,
    mut is_restorer: impl FnMut(u64) -> bool,
) -> Option<Vec<SignalFrame>> {
    let mut frames = Vec::new();
    // From the word under the stack pointer: a thread in a restorer has
    // taken its frame's return address already.
    let mut from = (sp & !7).saturating_sub(8);
    for _ in 0..STACKS_FOLLOWED {
        let stack = read(from)?;
        let found = live_signal_frames(&stack, from, &mut is_restorer);
        let on_this_stack = from..from.saturating_add(stack.len() as u64);
        // The innermost frame that interrupted another stack: frames over
        // it on this mapping are not this thread's handlers' (another
        // thread's alternate stack, in one array with this one).
        let next = found.iter().rev().map(|frame| frame.interrupted_sp).find(|sp| !on_this_stack.contains(sp));
        frames.extend(found);
        let Some(sp) = next else { return Some(frames) };
        from = (sp & !7).saturating_sub(8);
    }
    // More stacks than searched: not known.
    None
}

/// A signal frame on a thread's stack: where it is, and where the thread
/// was when the signal came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalFrame {
    /// Its address (that of its return address).
    pub at: u64,
    /// Where the signal interrupted the thread.
    pub interrupted_ip: u64,
    /// The stack pointer it interrupted.
    pub interrupted_sp: u64,
}

/// The signal frames on `stack` (its bytes from address `base` up) that
/// a thread running at `base` would return through, outermost first.
///
/// A frame is known by its return address (a restorer, `is_restorer`)
/// and its context as the kernel writes it. The stack a handler has not
/// written yet, and the parts of a frame the kernel leaves alone (a
/// reserved field, the signal's information unless asked for), hold the
/// frames of earlier signals: those are told apart by what the live
/// frame wrote over them, and by where they end. A frame lies under the
/// stack it interrupted, so a lower one reaching into a live frame is
/// stale, while one nested in a handler interrupted that handler, under
/// the handler's frame.
/// `stack` is the target's, read as it is: any bytes, at any `base`.
pub fn live_signal_frames(stack: &[u8], base: u64, mut is_restorer: impl FnMut(u64) -> bool) -> Vec<SignalFrame> {
    let word = |at: usize| stack.get(at..at + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    let mut frames = Vec::new();
    let Some(end) = base.checked_add(stack.len() as u64) else { return frames };
    // The lowest live frame found, or the stack's end: a handler interrupted
    // at its last instruction, its frame's return address taken, is 8 over.
    let mut floor = end;
    let Some(last) = stack.len().checked_sub(SIGNAL_FRAME_FPSTATE + 8) else { return frames };
    for at in (0..=last & !7).rev().step_by(8) {
        let field = |offset: usize| word(at + offset).unwrap_or_default();
        let address = base + at as u64;
        let (sp, ip) = (field(SIGNAL_FRAME_SP), field(SIGNAL_FRAME_RIP));
        let shaped = field(SIGNAL_FRAME_FLAGS) <= SIGNAL_FRAME_KNOWN_FLAGS
            && field(SIGNAL_FRAME_LINK) == 0
            && Some(field(SIGNAL_FRAME_FPSTATE)) == address.checked_add(SIGNAL_FRAME_FPSTATE_AT)
            && ip != 0;
        // On this stack, the interrupted code was above the frame and under
        // every live frame found; on another (an alternate signal stack's
        // handler interrupted the thread's own), anywhere.
        let placed = !(base..end).contains(&sp) || (sp > address && sp <= floor.saturating_add(8));
        if shaped && placed && is_restorer(field(0)) {
            frames.push(SignalFrame { at: address, interrupted_ip: ip, interrupted_sp: sp });
            floor = address;
        }
    }
    frames
}

impl Drop for Patched {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

fn refuse_shadow_stacks(pid: i32) -> Result<(), RemoteError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if status.lines().any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk")) {
        return Err(RemoteError::Unsupported(format!(
            "process {pid} runs with CET shadow stacks, which forbid returning anywhere but to the caller"
        )));
    }
    Ok(())
}

/// The unwinder entries to hook, and their walkers' returns: optional,
/// without them a thread's next call hijacks its frames again. Where
/// counts may go without `lock` (`counts_alone`), where threads and
/// processes start too.
fn hook_sites(modules: &[procfs::LoadedModule], counts_alone: bool) -> hooks::Hooks {
    let mut hooks = hooks::find(modules);
    let sites = &mut hooks.sites;
    sites.retain(|h| counts_alone || h.hook != Hook::ThreadStart);
    let walkers: Vec<HookSite> = sites
        .iter()
        .filter(|h| h.hook == Hook::Walk)
        .map(|h| HookSite { target: Target { site: Site::Return, ..h.target.clone() }, ..h.clone() })
        .collect();
    sites.extend(walkers);
    hooks
}

/// Whether counts (the edge counters', the entries' after a throttle) may
/// go without `lock` until the runtime is told a thread or process
/// starts: every place one starts from was
/// found and hooked (`hooked(h)`: site `h` of `sites` is in place). A
/// process launched has run none of its code yet; one attached may be
/// inside `pthread_create`, past its entry, and counts with `lock`.
fn thread_starts_hooked(sites: &[HookSite], hooked: impl Fn(usize) -> bool) -> bool {
    let starts: Vec<usize> = (0..sites.len()).filter(|&h| sites[h].hook.starts_thread()).collect();
    !starts.is_empty() && starts.into_iter().all(hooked)
}

/// The entries' counts made without `lock` (see [`patcher::Patches::switches`]).
#[derive(Default)]
struct CountsAlone {
    lock_table: u64,
    switches: Vec<(u64, u8)>,
}

/// Whether every `clone` of the process's modules is hooked (`hooked(h)`:
/// site `h` of `sites` is in place), so that the runtime is told before a
/// thread that may share its creator's thread pointer starts. Not one
/// found: not known.
fn clones_hooked(sites: &[HookSite], hooked: impl Fn(usize) -> bool) -> bool {
    let clones: Vec<usize> = (0..sites.len()).filter(|&h| sites[h].hook == Hook::Clone).collect();
    !clones.is_empty() && clones.into_iter().all(hooked)
}

/// Whether two of the held process's threads have one thread pointer.
fn threads_share_a_thread_pointer(remote: &Remote) -> Result<bool, RemoteError> {
    let mut pointers = remote.threads().into_iter().map(|tid| Ok(remote.regs(tid)?.fs_base)).collect::<Result<Vec<u64>, RemoteError>>()?;
    pointers.sort_unstable();
    Ok(pointers.windows(2).any(|w| w[0] == w[1]))
}

/// The code a trampoline starts with: the runtime's routine for what is patched.
fn prologue(rt: &totals::Runtime, hook: Option<Hook>, function: usize, site: Site, address: u64) -> Result<Vec<u8>, String> {
    match (hook, site) {
        (None, Site::Entry) => call_entry(address, rt.entry, function as u32),
        (None, Site::Return) => Err("no code for this site".to_string()),
        (Some(Hook::Unhook | Hook::Walk), Site::Entry) => call_routine(address, rt.unhook, 0),
        (Some(Hook::Walk), Site::Return) => call_routine_and_return(address, rt.resume),
        (Some(Hook::UnwinderLink), Site::Entry) => call_routine(address, rt.unwinder_link, 0),
        (Some(Hook::Rehook), _) => call_routine(address, rt.rehook, 0),
        (Some(Hook::ThreadStart), Site::Entry) => call_routine(address, rt.lock_counters, 0),
        (Some(Hook::Clone), Site::Entry) => call_routine(address, rt.clone, 0),
        (Some(Hook::Jump), Site::Entry) => call_routine(address, rt.jump, 0),
        (Some(Hook::Unhook | Hook::UnwinderLink | Hook::ThreadStart | Hook::Clone | Hook::Jump), Site::Return) => {
            Err("no code for this site".to_string())
        }
    }
}

/// The number at or above which a patched process gets the off-CPU
/// array's descriptor (see [`Remote::lend_descriptor`]).
const OFF_CPU_DESCRIPTOR: u64 = 256;

/// Pages of the off-CPU array (256 thread ids each) mapped in a process
/// from the last thread id the kernel gave out on, for its threads to come.
const OFF_CPU_PAGES_AHEAD: u64 = 32;

/// The ids the kernel gives out again from, past `pid_max` (its
/// `RESERVED_PIDS`).
const RESERVED_THREAD_IDS: u64 = 300;

/// Maps in the off-CPU array's `room` in the held process, from its
/// descriptor `fd` there, the pages of the process's threads and of the
/// next thread ids the kernel gives out, and marks them mapped in its
/// `private` memory: the runtime maps the others as threads take blocks,
/// which it cannot once a program has closed the descriptors it did not
/// open (daemons do as they start). A page whose mapping fails is given
/// its zeros back and left to the runtime.
fn map_first_off_cpu_pages(remote: &Remote, room: u64, fd: u64, entries: u64, private: u64) -> Result<(), RemoteError> {
    const IDS: u64 = 4096 / 16;
    let pages = entries.div_ceil(IDS);
    let threads: Vec<u64> = remote.threads().iter().map(|&tid| tid as u64).collect();
    // The last id given out (else the process's newest thread's), then
    // on, from the first ids the kernel gives out again past the last.
    let last = procfs::sysctl_number("kernel/ns_last_pid");
    let last = last.or_else(|| threads.iter().copied().max()).unwrap_or(0);
    let again = pages.min(RESERVED_THREAD_IDS / IDS);
    let ahead = (0..OFF_CPU_PAGES_AHEAD).map(|n| last / IDS + n).map(|page| if page < pages { page } else { again + page - pages });
    let mut wanted: Vec<u64> = threads.iter().map(|tid| tid / IDS).chain(ahead).collect();
    wanted.retain(|&page| page < pages);
    wanted.sort_unstable();
    wanted.dedup();
    let mut bits = vec![0u64; totals::OFF_CPU_PAGE_WORDS as usize];
    let (shared_fixed, zeros) =
        ((libc::MAP_SHARED | libc::MAP_FIXED) as u64, (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64);
    for run in wanted.chunk_by(|a, b| a + 1 == *b) {
        let (at, len, offset) = (room + run[0] * 4096, run.len() as u64 * 4096, run[0] * 4096);
        if remote.syscall("mmap", libc::SYS_mmap, [at, len, libc::PROT_READ as u64, shared_fixed, fd, offset]).is_ok() {
            run.iter().for_each(|&page| bits[(page / 64) as usize] |= 1 << (page % 64));
        } else {
            remote.syscall("mmap", libc::SYS_mmap, [at, len, libc::PROT_READ as u64, zeros, u64::MAX, 0])?;
        }
    }
    let bytes: Vec<u8> = bits.iter().flat_map(|w| w.to_ne_bytes()).collect();
    remote.write(private + Geometry::OFF_CPU_PAGES, &bytes)
}

/// Maps the runtime's memory in the held process: private (seats and
/// return addresses; a forked child gets a copy), a live word wiped in a
/// forked child, and the shared memory with its header written.
fn set_up_memory(remote: &Remote, geometry: Geometry, off_cpu: Option<&OffCpu>) -> Result<(Shared, Memory, Config), RemoteError> {
    let mut made = Made::default();
    let set_up = map_memory(remote, geometry, off_cpu, &mut made);
    if set_up.is_err() {
        // Nothing leads there yet: a process attached to runs on as it was.
        for (address, len) in made.mappings {
            let _ = remote.syscall("munmap", libc::SYS_munmap, [address, len, 0, 0, 0, 0]);
        }
        if let Some(fd) = made.descriptor {
            let _ = remote.syscall("close", libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
        }
    }
    set_up
}

/// What [`map_memory`] made in the process so far.
#[derive(Default)]
struct Made {
    mappings: Vec<(u64, u64)>,
    descriptor: Option<u64>,
}

/// [`set_up_memory`], each mapping and descriptor made noted in `made`.
fn map_memory(
    remote: &Remote,
    geometry: Geometry,
    off_cpu: Option<&OffCpu>,
    made: &mut Made,
) -> Result<(Shared, Memory, Config), RemoteError> {
    for tid in remote.threads() {
        if remote.regs(tid)?.fs_base == 0 {
            return Err(RemoteError::Unsupported(format!(
                "thread {tid} of process {} has no thread-local storage to tell threads apart",
                remote.pid()
            )));
        }
    }
    let anonymous = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64;
    let read_write = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    // Writable as the runtime takes each thread's block (see PRIVATE_HEAD
    // in runtime.h): where the kernel counts every writable page a
    // process may use (vm.overcommit_memory 2), 20 GiB would not map.
    let no_access = libc::PROT_NONE as u64;
    let private = remote.syscall("mmap", libc::SYS_mmap, [AWAY_FROM_CODE, geometry.private_bytes(), no_access, anonymous, u64::MAX, 0])?;
    made.mappings.push((private, geometry.private_bytes()));
    remote.syscall("mprotect", libc::SYS_mprotect, [private, Geometry::PRIVATE_BLOCKS, read_write, 0, 0, 0])?;
    let live = remote.syscall("mmap", libc::SYS_mmap, [0, 4096, read_write, anonymous, u64::MAX, 0])?;
    made.mappings.push((live, 4096));
    remote.syscall("madvise", libc::SYS_madvise, [live, 4096, MADV_WIPEONFORK, 0, 0, 0])?;
    let shared = remote.share(geometry.shared_bytes() as usize, None)?;
    made.mappings.push((shared.remote, geometry.shared_bytes()));
    // Room for the whole array, readable and all zero: the runtime maps
    // into it the pages of the threads that take a block (see
    // map_off_cpu_entry in runtime.c).
    let (off_cpu_address, off_cpu_fd, (off_cpu_device, off_cpu_inode)) = match off_cpu {
        Some(off) => {
            let identity = off
                .identity()
                .map_err(|source| RemoteError::Io { what: "cannot read what the off-CPU array's descriptor is".into(), source })?;
            let room = remote.syscall("mmap", libc::SYS_mmap, [0, off.bytes(), libc::PROT_READ as u64, anonymous, u64::MAX, 0])?;
            made.mappings.push((room, off.bytes()));
            let fd = remote.lend_descriptor(off.map(), OFF_CPU_DESCRIPTOR)?;
            made.descriptor = Some(fd);
            map_first_off_cpu_pages(remote, room, fd, off.entries(), private)?;
            (room, fd, identity)
        }
        None => (0, 0, (0, 0)),
    };
    let (mult, shift) = ns_to_tsc();
    shared.store(0, totals::MAGIC);
    shared.store(8, mult);
    shared.store(16, shift);
    // Until proftap knows no two threads can share a block unseen.
    shared.store(std::mem::offset_of!(totals::Header, shared_seats), 1);
    let config = Config {
        shared: shared.remote,
        private_base: private,
        live,
        tcb_tid: tcb_tid_offset(remote).map_or(0, |o| o as u64),
        blocks: geometry.blocks,
        blocks_offset: geometry.blocks_offset(),
        block_bytes: geometry.block_bytes(),
        entries_offset: geometry.entries_offset(),
        functions: geometry.functions,
        shared_bytes: geometry.shared_bytes(),
        trace_slots: geometry.trace_slots,
        trace_offset: geometry.trace_offset(),
        regions: geometry.regions,
        regions_offset: geometry.regions_offset(),
        off_cpu: off_cpu_address,
        off_cpu_entries: off_cpu.map_or(0, OffCpu::entries),
        off_cpu_fd,
        off_cpu_device,
        off_cpu_inode,
        ..Config::default()
    };
    let shared_file = shared.file().ok();
    let memory = Memory {
        shared: shared.remote,
        private,
        live,
        off_cpu: off_cpu_address,
        off_cpu_bytes: off_cpu.map_or(0, OffCpu::bytes),
        off_cpu_fd,
        off_cpu_map: off_cpu.and_then(OffCpu::map_id),
        shared_file,
    };
    Ok((shared, memory, config))
}

/// What [`Patched::step_down`] did of each half.
#[derive(Debug)]
pub struct SteppedDown {
    /// Taking the probes out.
    pub unpatched: Result<(), RemoteError>,
    /// Stopping the counting.
    pub uncounted: Result<(), RemoteError>,
}

/// Whether the process `remote` holds maps, at `shared`, the memory
/// `file` (not known: no): the memory proftap shared with the image it
/// patched goes with that image at an exec, and no other can map it.
fn runs_image_of(remote: &Remote, shared: u64, file: Option<FileId>) -> Result<bool, RemoteError> {
    Ok(file.is_some() && remote.file_mapped_at(shared)? == file)
}

/// The user a process runs as.
fn owner(pid: i32) -> Result<u32, RemoteError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| m.uid())
        .map_err(|e| RemoteError::Unsupported(format!("cannot tell who runs process {pid}: {e}")))
}

/// TSC cycles per nanosecond as `mult >> shift`, measured.
fn ns_to_tsc() -> (u64, u64) {
    const SHIFT: u64 = 32;
    let rate = super::clock::TscClock::new().map_or(1.0, |c| c.cycles_per_ns());
    ((rate * (1u64 << SHIFT) as f64) as u64, SHIFT)
}

/// Where the C library keeps a thread's id in its thread control block:
/// the offset from the thread pointer that holds each held thread's id
/// (glibc's `struct pthread` puts it at 0x2d0 on x86-64; found, not assumed).
fn tcb_tid_offset(remote: &Remote) -> Option<i32> {
    const SEARCHED: usize = 0x800;
    let mut candidates: Option<Vec<usize>> = None;
    for tid in remote.threads() {
        let fs_base = remote.regs(tid).ok()?.fs_base;
        let block = remote.read(fs_base, SEARCHED).ok()?;
        let here: Vec<usize> = (8..SEARCHED).step_by(4).filter(|&o| block[o..o + 4] == (tid as u32).to_ne_bytes()).collect();
        candidates = Some(match candidates {
            None => here,
            Some(before) => before.into_iter().filter(|o| here.contains(o)).collect(),
        });
    }
    let candidates = candidates?;
    let preferred = if candidates.contains(&0x2d0) { Some(0x2d0) } else { candidates.first().copied() };
    preferred.map(|o| o as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The other tests' threads end meanwhile, and their time leaves the
    /// sum of the live threads': this thread spins until its own time
    /// outgrows theirs, for a few seconds at most.
    #[test]
    fn a_process_cpu_time_grows_as_its_threads_run() {
        let pid = std::process::id() as i32;
        let before = threads_cpu_ns(pid).expect("this process's threads are readable");
        let started = std::time::Instant::now();
        let (mut spun, mut now) = (0u64, before);
        while now <= before && started.elapsed() < std::time::Duration::from_secs(5) {
            for _ in 0..100_000 {
                spun = std::hint::black_box(spun.wrapping_add(1));
            }
            now = threads_cpu_ns(pid).expect("readable");
        }
        assert!(now > before, "{spun} spins in {:?}", started.elapsed());
        assert_eq!(threads_cpu_ns(-1), None);
    }
    const RESTORER: u64 = 0x40_1000;
    const BASE: u64 = 0x7ff0_0000;

    /// Writes a signal frame at `at` bytes into `stack` as the kernel
    /// does, returning to the restorer, interrupted at `ip` with stack
    /// pointer `sp`: its context's registers and the floating-point state
    /// over it, not the reserved field after them nor the signal's
    /// information.
    fn frame(stack: &mut [u8], at: usize, sp: u64, ip: u64) {
        frame_on(stack, BASE, at, sp, ip);
    }

    /// `frame`, on a stack at `base`.
    fn frame_on(stack: &mut [u8], base: u64, at: usize, sp: u64, ip: u64) {
        let fpstate = at + SIGNAL_FRAME_FPSTATE_AT as usize;
        stack[at + 48..at + SIGNAL_FRAME_FPSTATE].fill(0x5a);
        stack[fpstate..fpstate + 1024].fill(0xa5);
        let mut put = |offset: usize, value: u64| stack[at + offset..at + offset + 8].copy_from_slice(&value.to_ne_bytes());
        put(0, RESTORER);
        put(SIGNAL_FRAME_FLAGS, 7);
        put(SIGNAL_FRAME_LINK, 0);
        put(SIGNAL_FRAME_SP, sp);
        put(SIGNAL_FRAME_RIP, ip);
        put(SIGNAL_FRAME_FPSTATE, base + fpstate as u64);
    }

    fn interrupted(stack: &[u8]) -> Vec<u64> {
        live_signal_frames(stack, BASE, |ret| ret == RESTORER).iter().map(|f| f.interrupted_ip).collect()
    }

    #[test]
    fn a_signal_frame_left_where_a_handler_has_not_written_is_not_taken_for_a_live_one() {
        let mut stack = vec![0u8; 64 << 10];
        let live = 48 << 10;
        // A signal that came when the thread was 296 bytes deeper: its frame
        // ran into where the live one was written since, and its start is
        // in the handler's unwritten stack.
        frame(&mut stack, live - 296, BASE + live as u64 + 1200 - 296, 0xb);
        frame(&mut stack, live, BASE + live as u64 + 1200, 0xa);
        assert_eq!(interrupted(&stack), [0xa]);
        // One that came when the thread was 256 bytes higher: the live
        // frame's registers and floating-point state are over its own, not
        // its start, stack pointer and address.
        let mut over = vec![0u8; 64 << 10];
        frame(&mut over, live + 256, BASE + live as u64 + 1200 + 256, 0x1b);
        frame(&mut over, live, BASE + live as u64 + 1200, 0xa);
        assert_eq!(interrupted(&over), [0xa]);
        // A signal that interrupted the handler, under the live frame.
        let nested = 8 << 10;
        frame(&mut stack, nested, BASE + nested as u64 + 4000, 0xc);
        assert_eq!(interrupted(&stack), [0xa, 0xc]);
        // One that interrupted the handler as it returned, its frame's
        // return address taken, is just over.
        let mut returning = stack.clone();
        frame(&mut returning, nested, BASE + live as u64 + 8, 0xd);
        assert_eq!(interrupted(&returning), [0xa, 0xd]);
        // No frame interrupts code under itself on its own stack.
        let mut under = stack.clone();
        frame(&mut under, nested, BASE + nested as u64 - 64, 0xe);
        assert_eq!(interrupted(&under), [0xa]);
        // A handler on an alternate stack interrupted another stack, anywhere.
        let mut alternate = vec![0u8; 16 << 10];
        frame(&mut alternate, 4096, 0x1000, 0xf);
        assert_eq!(interrupted(&alternate), [0xf]);
        // A thread in a restorer: the frame starts at the first word read.
        let mut restoring = vec![0u8; 4096];
        frame(&mut restoring, 0, BASE + 2000, 0x10);
        assert_eq!(interrupted(&restoring), [0x10]);
        // Not a frame: a context with a link, or with its floating-point
        // state elsewhere, or not returning to a restorer.
        for field in [SIGNAL_FRAME_LINK, SIGNAL_FRAME_FPSTATE] {
            let mut other = restoring.clone();
            other[field] ^= 0x40;
            assert_eq!(interrupted(&other), [0u64; 0]);
        }
        assert!(live_signal_frames(&restoring, BASE, |_| false).is_empty());
    }

    /// A handler on an alternate signal stack, nested in a handler on the
    /// thread's own stack that interrupted proftap's code: the outer
    /// handler's frame is found on the stack the inner one interrupted.
    #[test]
    fn signal_frames_are_followed_from_an_alternate_stack_to_the_stack_it_interrupted() {
        const ALTERNATE: u64 = 0x1000_0000;
        let mut own = vec![0u8; 64 << 10];
        let live = 48 << 10;
        frame(&mut own, live, BASE + live as u64 + 1200, 0xa);
        let handler_sp = BASE + (40 << 10);
        let mut alternate = vec![0u8; 16 << 10];
        frame_on(&mut alternate, ALTERNATE, 4096, handler_sp, 0x20);
        let stacks = [(BASE, &own), (ALTERNATE, &alternate)];
        let read = |from: u64| {
            let (base, bytes) = stacks.iter().find(|(base, bytes)| (*base..*base + bytes.len() as u64).contains(&from))?;
            Some(bytes[(from - base) as usize..].to_vec())
        };
        let ips = |sp| {
            signal_frames_across_stacks(sp, read, |ret| ret == RESTORER).map(|f| f.iter().map(|f| f.interrupted_ip).collect::<Vec<_>>())
        };
        assert_eq!(ips(ALTERNATE + 2000), Some(vec![0x20, 0xa]));
        // On its own stack, the outer handler's frame only.
        assert_eq!(ips(handler_sp), Some(vec![0xa]));
        // Another thread's alternate stack over this one, in the same
        // mapping, its handler interrupting elsewhere: not followed.
        let mut array = alternate.clone();
        array.resize(32 << 10, 0);
        frame_on(&mut array, ALTERNATE, (16 << 10) + 4096, 0x5000_0000, 0x30);
        let stacks = [(BASE, &own), (ALTERNATE, &array)];
        let read = |from: u64| {
            let (base, bytes) = stacks.iter().find(|(base, bytes)| (*base..*base + bytes.len() as u64).contains(&from))?;
            Some(bytes[(from - base) as usize..].to_vec())
        };
        let found = signal_frames_across_stacks(ALTERNATE + 2000, read, |ret| ret == RESTORER);
        assert_eq!(found.map(|f| f.iter().map(|f| f.interrupted_ip).collect::<Vec<_>>()), Some(vec![0x30, 0x20, 0xa]));
        // Stacks that lead on and on: not known.
        let endless = |from: u64| {
            let mut stack = vec![0u8; 16 << 10];
            frame_on(&mut stack, from, 1024, from + (1 << 20), 0x40);
            Some(stack)
        };
        assert_eq!(signal_frames_across_stacks(ALTERNATE + 2000, endless, |ret| ret == RESTORER), None);
        // A stack that cannot be read: not known.
        assert_eq!(signal_frames_across_stacks(ALTERNATE + 2000, |from| read(from).filter(|_| from < BASE), |ret| ret == RESTORER), None);
    }
}

//! Per-thread shadow stacks: probe hits in, per-function statistics and
//! calling-context trees out. This is the hot path of recording: dense
//! arrays, no allocation per event once a thread and a call path are known.

// Per-metric loops index several parallel arrays; an index reads best.
#![allow(clippy::needless_range_loop)]

use crate::events::{Event, Hit, HitKind, Values};
use crate::trace::TraceKeeper;
use proftap_probes::metrics::MAX_METRICS;
use proftap_profile::{CallTree, FunctionStats, Lost, LostCount, ProcessInfo, ROOT, Stat, ThreadProfile, TreeNode};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// A stack pointer this far from a frame's is on another stack (a signal
/// stack, a fiber): it says nothing about whether the frame is still live.
const SAME_STACK_SPAN: u64 = 64 << 20;

/// How to aggregate: what the functions' probes are and what is known of
/// the target before its first event. Saved at the head of an event stream,
/// so that a replay aggregates the same way.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AggregatorConfig {
    /// Functions recorded: their ids are `0..functions`; a hit on a higher
    /// id is a catch marker.
    pub functions: usize,
    /// Metrics per event (the first is wall time).
    pub metrics: usize,
    /// Probe costs to subtract, when compensation is on.
    pub compensation: Option<Compensation>,
    /// Per function: returns are seen at its `ret` instructions (true) or
    /// by a return probe (false).
    pub exit_sites: Vec<bool>,
    /// Per function: its calls in progress still report their returns
    /// after its probes go (the in-process engine's trampolines stay).
    pub returns_outlive_probes: Vec<bool>,
    /// Per function: its returns are not watched (an entry probe only), so
    /// its calls are counted, not timed.
    #[serde(default)]
    pub returns_unwatched: Vec<bool>,
    /// Line and region following, when lines are recorded.
    pub lines: Option<LineSetup>,
    /// Where return trampolines are at the start (more may come, see
    /// [`Event::CodeAdded`]): a return address slot holding one at a call
    /// is a tail call's.
    pub trampolines: Vec<std::ops::Range<u64>>,
    /// The metric that is CPU time counted as wall time minus the time off
    /// every CPU, from context switches (the in-process engine reads no counter).
    pub cpu_from_switches: Option<usize>,
    /// Processes known at the start (the target).
    pub processes: Vec<i32>,
    /// Keep every finished call, up to this many bytes (a timeline).
    #[serde(default)]
    pub trace_bytes: Option<u64>,
}

impl AggregatorConfig {
    /// `functions` functions and `metrics` metrics, nothing else known.
    pub fn new(functions: usize, metrics: usize) -> Self {
        AggregatorConfig { functions, metrics, ..AggregatorConfig::default() }
    }
}

/// What the probes themselves add to each metric, subtracted from the
/// times when compensation is on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Compensation {
    /// Per function: cost one instrumented call of it adds to its callers.
    pub call: Vec<Values>,
    /// Per function: cost its own probes add to its own inclusive value.
    pub own: Vec<Values>,
}

/// What the aggregator needs to follow lines and regions.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LineSetup {
    /// Per line probe: its function and the lines it enters, in order.
    pub probes: Vec<(u32, Vec<u32>)>,
    /// Per line probe: its address (none in streams saved before turns of
    /// loops on one line were counted).
    #[serde(default)]
    pub probe_addresses: Vec<u64>,
    /// Per function: the line its frames start on (`NO_LINE`: none with code).
    pub entry_lines: Vec<u32>,
    /// Per function: lines its entry also enters, counted.
    pub entry_also: Vec<Vec<u32>>,
    /// Number of line ids.
    pub lines: usize,
    /// Per line id: the regions that contain it.
    pub regions_of: Vec<Vec<u32>>,
    /// Number of regions.
    pub regions: usize,
}

/// A frame on no counted line yet.
pub use proftap_probes::arcs::lines::NO_LINE;

#[derive(Clone, Copy, Default)]
struct LineAcc {
    count: u64,
    cost: Values,
}

#[derive(Clone, Copy)]
struct RegionAcc {
    entries: u64,
    inclusive: [Stat; MAX_METRICS],
}

/// How a frame ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    Returned,
    /// Left without a return (exception, longjmp, thread exit).
    Unwound,
    /// Still running when the recording ended.
    Unfinished,
}

struct Frame {
    function: u32,
    node: u32,
    sp: u64,
    entry: Values,
    /// Inclusive values of completed instrumented callees.
    children: Values,
    /// Probe cost of all instrumented calls below this frame.
    below: Values,
    /// A frame entered before the recording began, known from its lines only.
    pseudo: bool,
    /// Its return address (0 if unknown).
    ret: u64,
    /// Its return probe went with a replaced probe set: its return will not
    /// be seen, only its frame gone.
    orphaned: bool,
    /// The line the frame is on, and since when.
    line: u32,
    line_since: Values,
    /// The address of the last row it reached on that line.
    line_row: u64,
    /// Regions the frame is in, and since when.
    regions: Vec<(u32, Values)>,
    /// Times its function jumped back to its own entry under it, each
    /// leaving the kernel's trampoline one more return to report (fewer
    /// past the kernel's depth of pending returns).
    reentered: u64,
}

impl Frame {
    fn new(function: u32, node: u32, sp: u64, values: Values, pseudo: bool) -> Self {
        Frame {
            function,
            node,
            sp,
            entry: values,
            children: [0; MAX_METRICS],
            below: [0; MAX_METRICS],
            pseudo,
            ret: 0,
            orphaned: false,
            line: NO_LINE,
            line_since: values,
            line_row: 0,
            regions: Vec::new(),
            reentered: 0,
        }
    }
}

#[derive(Clone)]
struct FunctionAcc {
    function: u32,
    calls: u64,
    unwound: u64,
    unfinished: u64,
    untimed: u64,
    /// Frames of this function on the stack (recursion depth).
    active: u32,
    inclusive: [Stat; MAX_METRICS],
    exclusive: [Stat; MAX_METRICS],
}

struct NodeAcc {
    function: u32,
    parent: u32,
    calls: u64,
    inclusive: Values,
    exclusive: Values,
}

struct ThreadState {
    pid: u32,
    tid: u32,
    name: String,
    stack: Vec<Frame>,
    /// Function id -> index in `accs` (u32::MAX: not seen yet).
    slot: Vec<u32>,
    accs: Vec<FunctionAcc>,
    nodes: Vec<NodeAcc>,
    children: FxHashMap<(u32, u32), u32>,
    last: Values,
    /// The thread's counters on each CPU, as last seen.
    on_cpu: Vec<Values>,
    /// Their sums: the thread's counters over all CPUs.
    totals: Values,
    /// Per probe set replaced while this thread lived: its counters per CPU
    /// then, which the new set's counters (starting from zero) add to.
    bases: Vec<(u32, Vec<Values>)>,
    /// Per line id (when lines are recorded).
    lines: Vec<LineAcc>,
    /// Per region.
    regions: Vec<RegionAcc>,
    /// (stack slot, return address) of calls in progress when their
    /// function lost its probes: the kernel's trampoline still stands in
    /// their return address slots until they return.
    orphan_returns: Vec<(u64, u64)>,
    /// Time spent off every CPU, and since when it is off now (with CPU
    /// time counted from context switches).
    off_cpu: u64,
    off_since: Option<u64>,
    /// Returns the kernel may still report for a frame that ended, whose
    /// function had jumped back to its entry: (function, stack pointer
    /// after the return, how many). They come together, at once.
    chained_returns: Option<(u32, u64, u64)>,
}

impl ThreadState {
    fn new(pid: u32, tid: u32, name: String, functions: usize) -> Self {
        ThreadState {
            pid,
            tid,
            name,
            stack: Vec::new(),
            slot: vec![u32::MAX; functions],
            accs: Vec::new(),
            nodes: vec![NodeAcc { function: ROOT, parent: ROOT, calls: 0, inclusive: [0; MAX_METRICS], exclusive: [0; MAX_METRICS] }],
            children: FxHashMap::default(),
            last: [0; MAX_METRICS],
            on_cpu: Vec::new(),
            totals: [0; MAX_METRICS],
            bases: Vec::new(),
            lines: Vec::new(),
            regions: Vec::new(),
            orphan_returns: Vec::new(),
            off_cpu: 0,
            off_since: None,
            chained_returns: None,
        }
    }

    /// Takes in the thread's counters on one CPU (of probe set `generation`,
    /// or of the counter group when `None`) and returns the time and its
    /// counters over all CPUs.
    fn observe(&mut self, cpu: u16, values: &Values, metrics: usize, generation: Option<u32>) -> Values {
        let cpu = cpu as usize;
        if self.on_cpu.len() <= cpu {
            self.on_cpu.resize(cpu + 1, [0; MAX_METRICS]);
        }
        let mut values = *values;
        if let Some(base) = generation.and_then(|g| self.bases.iter().find(|b| b.0 == g)).and_then(|b| b.1.get(cpu)) {
            for m in 1..metrics {
                values[m] = values[m].wrapping_add(base[m]);
            }
        }
        let values = &values;
        let seen = &mut self.on_cpu[cpu];
        let mut out = *values;
        for m in 1..metrics {
            // A CPU's count only grows while the thread runs there.
            self.totals[m] = self.totals[m].wrapping_add(values[m].wrapping_sub(seen[m]));
            seen[m] = values[m];
            out[m] = self.totals[m];
        }
        out
    }

    fn acc(&mut self, function: u32) -> &mut FunctionAcc {
        let slot = &mut self.slot[function as usize];
        if *slot == u32::MAX {
            *slot = self.accs.len() as u32;
            self.accs.push(FunctionAcc {
                function,
                calls: 0,
                unwound: 0,
                unfinished: 0,
                untimed: 0,
                active: 0,
                inclusive: [Stat::default(); MAX_METRICS],
                exclusive: [Stat::default(); MAX_METRICS],
            });
        }
        &mut self.accs[*slot as usize]
    }

    fn child(&mut self, parent: u32, function: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let node = *self.children.entry((parent, function)).or_insert(next);
        if node == next {
            self.nodes.push(NodeAcc { function, parent, calls: 0, inclusive: [0; MAX_METRICS], exclusive: [0; MAX_METRICS] });
        }
        node
    }
}

/// Aggregates an event stream in time order into per-thread profiles.
pub struct Aggregator {
    functions: usize,
    metrics: usize,
    compensation: Option<Compensation>,
    threads: FxHashMap<u32, ThreadState>,
    /// Threads that have exited.
    finished: Vec<ThreadState>,
    /// Names of threads seen in sideband records before their first hit.
    names: FxHashMap<u32, String>,
    lost: Lost,
    lost_by_function: FxHashMap<u32, u64>,
    lost_by_thread: FxHashMap<u32, u64>,
    processes: Vec<ProcessInfo>,
    /// When each process executed a program (process, CLOCK_MONOTONIC ns).
    exec_times: Vec<(i32, u64)>,
    hits: u64,
    calls_by_function: Vec<u64>,
    unwound_frames: u64,
    orphaned_frames: u64,
    /// Per function: returns are seen at its `ret` instructions (true) or by
    /// a return probe (false).
    exit_sites: Vec<bool>,
    /// Per function: its calls in progress still report their returns after
    /// its probes go (the in-process engine's trampolines stay).
    returns_outlive_probes: Vec<bool>,
    /// Per function: its returns are not watched.
    returns_unwatched: Vec<bool>,
    /// Line and region following, when lines are recorded.
    lines: Option<LineSetup>,
    /// Per line probe: its hits (what it cost).
    line_probe_hits: Vec<u64>,
    /// Functions whose probes were removed during the recording.
    throttled: Vec<bool>,
    /// Where return trampolines are: a return address slot holding one at
    /// a call is a tail call's.
    trampolines: Vec<std::ops::Range<u64>>,
    /// The metric that is CPU time counted as wall time minus the time off
    /// every CPU, from context switches (the in-process engine reads no counter).
    cpu_from_switches: Option<usize>,
    /// Finished calls one by one, when they are traced.
    trace: Option<TraceKeeper>,
}

impl Aggregator {
    /// An aggregator as `config` says.
    pub fn new(config: AggregatorConfig) -> Self {
        let functions = config.functions;
        let fit = |flags: Vec<bool>| if flags.len() == functions { flags } else { vec![false; functions] };
        let mut aggregator = Aggregator {
            functions,
            metrics: config.metrics.min(MAX_METRICS),
            compensation: config.compensation,
            threads: FxHashMap::default(),
            finished: Vec::new(),
            names: FxHashMap::default(),
            lost: Lost::default(),
            lost_by_function: FxHashMap::default(),
            lost_by_thread: FxHashMap::default(),
            processes: Vec::new(),
            exec_times: Vec::new(),
            hits: 0,
            calls_by_function: vec![0; functions],
            unwound_frames: 0,
            orphaned_frames: 0,
            exit_sites: fit(config.exit_sites),
            returns_outlive_probes: fit(config.returns_outlive_probes),
            returns_unwatched: fit(config.returns_unwatched),
            line_probe_hits: vec![0; config.lines.as_ref().map_or(0, |l| l.probes.len())],
            lines: config.lines,
            throttled: vec![false; functions],
            trampolines: config.trampolines,
            cpu_from_switches: config.cpu_from_switches,
            trace: config.trace_bytes.map(TraceKeeper::new),
        };
        for pid in config.processes {
            aggregator.add_process(pid);
        }
        aggregator
    }

    /// The probes changed at `time`: threads existing then get the base of
    /// the new sets' counters, and the removed functions' open frames end
    /// there, unfinished. Frames of `redefined` functions whose returns a
    /// return probe was to see lose it with the old set: they end when seen
    /// gone, as unfinished.
    fn probes_replaced(&mut self, time: u64, generations: &[u32], removed: &[u32], redefined: Option<&[u32]>) {
        for &f in removed {
            if let Some(t) = self.throttled.get_mut(f as usize) {
                *t = true;
            }
        }
        let mut threads: Vec<u32> = self.threads.keys().copied().collect();
        threads.sort_unstable();
        for tid in threads {
            let Some(mut thread) = self.threads.remove(&tid) else { continue };
            for &generation in generations {
                if !thread.bases.iter().any(|b| b.0 == generation) {
                    thread.bases.push((generation, thread.on_cpu.clone()));
                }
            }
            let mut at = thread.last;
            at[0] = at[0].max(time);
            let outlive = std::mem::take(&mut self.returns_outlive_probes);
            let outlives = |function: u32| outlive.get(function as usize).copied().unwrap_or(false);
            while let Some(index) = thread.stack.iter().rposition(|f| removed.contains(&f.function) && !outlives(f.function)) {
                let frame = &thread.stack[index];
                if frame.ret != 0 && frame.sp != 0 && !self.exit_sites.get(frame.function as usize).copied().unwrap_or(false) {
                    thread.orphan_returns.push((frame.sp, frame.ret));
                }
                self.close_at(&mut thread, index, &at, Ending::Unfinished);
            }
            let lost_return =
                |f: &Frame| !f.pseudo && !f.orphaned && !outlives(f.function) && redefined.is_none_or(|r| r.contains(&f.function));
            for frame in thread.stack.iter_mut().filter(|f| lost_return(f)) {
                if !self.exit_sites.get(frame.function as usize).copied().unwrap_or(false) {
                    frame.orphaned = true;
                    self.orphaned_frames += 1;
                }
            }
            self.returns_outlive_probes = outlive;
            self.threads.insert(tid, thread);
        }
    }

    /// Probe hits lost so far, as the kernel reported them.
    pub fn lost_events(&self) -> u64 {
        self.lost.events
    }

    /// Processes seen so far.
    pub fn processes(&self) -> &[ProcessInfo] {
        &self.processes
    }

    /// Functions whose probes were removed during the recording.
    pub fn throttled(&self) -> &[bool] {
        &self.throttled
    }

    /// The return addresses of a thread's instrumented frames, by the stack
    /// slot they sit in: what an unwinder should read where a return probe
    /// left the kernel's trampoline.
    pub fn return_addresses(&self, tid: u32) -> Vec<(u64, u64)> {
        self.threads.get(&tid).map_or_else(Vec::new, |t| {
            t.stack.iter().filter(|f| f.ret != 0 && f.sp != 0).map(|f| (f.sp, f.ret)).chain(t.orphan_returns.iter().copied()).collect()
        })
    }

    /// Notes a process.
    fn add_process(&mut self, pid: i32) {
        if !self.processes.iter().any(|p| p.pid == pid) {
            self.processes.push(ProcessInfo { pid, parent: None, execs: Vec::new() });
        }
    }

    /// When process `pid` executed programs (CLOCK_MONOTONIC ns).
    pub fn exec_times(&self, pid: i32) -> Vec<u64> {
        self.exec_times.iter().filter(|&&(p, _)| p == pid).map(|&(_, time)| time).collect()
    }

    /// What thread `tid` was named, as far as the events said.
    pub fn thread_name(&self, tid: u32) -> String {
        let known = self.threads.get(&tid).or_else(|| self.finished.iter().find(|t| t.tid == tid)).map(|t| t.name.clone());
        known.or_else(|| self.names.get(&tid).cloned()).unwrap_or_default()
    }

    /// Probe hits so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Calls per function so far.
    pub fn calls_by_function(&self) -> &[u64] {
        &self.calls_by_function
    }

    /// Consumes one event. Events must come in time order per thread.
    pub fn push(&mut self, event: &Event) {
        match event {
            Event::Hit(hit) => self.hit(hit),
            Event::Lost { tid, probe, count, .. } => {
                self.lost.events += count;
                if let Some(probe) = probe {
                    *self.lost_by_function.entry(probe.function()).or_default() += count;
                }
                if *tid != 0 {
                    *self.lost_by_thread.entry(*tid).or_default() += count;
                }
            }
            Event::Comm { time, pid, tid, name, exec } => {
                if *exec && pid == tid {
                    self.exec_times.push((*pid as i32, *time));
                    self.add_process(*pid as i32);
                    if let Some(p) = self.processes.iter_mut().find(|p| p.pid == *pid as i32) {
                        p.execs.push(name.clone());
                    }
                }
                match self.threads.get_mut(tid) {
                    Some(t) => t.name.clone_from(name),
                    None => {
                        self.names.insert(*tid, name.clone());
                    }
                }
            }
            Event::Fork { pid, ppid, tid, ptid, .. } => {
                if pid != ppid && pid == tid && !self.processes.iter().any(|p| p.pid == *pid as i32) {
                    self.processes.push(ProcessInfo { pid: *pid as i32, parent: Some(*ppid as i32), execs: Vec::new() });
                }
                // The kernel gives a new thread its maker's name, and tells
                // of it only when the thread names itself.
                let inherited = self.thread_name(*ptid);
                if !inherited.is_empty() && !self.threads.contains_key(tid) {
                    self.names.entry(*tid).or_insert(inherited);
                }
            }
            Event::Switch { pid, tid, cpu, values } => {
                let (functions, metrics) = (self.functions, self.metrics);
                let names = &mut self.names;
                let thread = self
                    .threads
                    .entry(*tid)
                    .or_insert_with(|| ThreadState::new(*pid, *tid, names.remove(tid).unwrap_or_default(), functions));
                thread.observe(*cpu, values, metrics, None);
            }
            Event::ProbesReplaced { time, generations, removed, redefined, .. } => {
                self.probes_replaced(*time, generations, removed, redefined.as_deref())
            }
            // Samples and mappings are the sampler's.
            Event::Sample(_) | Event::Mmap { .. } | Event::CountingGoesOn { .. } => {}
            Event::CodeAdded { ranges, .. } => self.trampolines.extend(ranges.iter().cloned()),
            Event::Switched { time, tid, out } => {
                if self.cpu_from_switches.is_some()
                    && let Some(thread) = self.threads.get_mut(tid)
                {
                    match (*out, thread.off_since) {
                        (true, _) => thread.off_since = Some(*time),
                        (false, Some(since)) => {
                            thread.off_cpu += time.saturating_sub(since);
                            thread.off_since = None;
                        }
                        (false, None) => {}
                    }
                }
            }
            Event::Exit { time, tid, .. } => {
                if let Some(mut thread) = self.threads.remove(tid) {
                    let mut at = thread.last;
                    at[0] = at[0].max(*time);
                    while !thread.stack.is_empty() {
                        self.close_top(&mut thread, &at, Ending::Unwound);
                    }
                    // Its tid may be reused by a new thread: keep it apart.
                    self.finished.push(thread);
                }
            }
        }
    }

    fn hit(&mut self, hit: &Hit) {
        self.hits += 1;
        // A catch marker: every frame at or below the catching frame's
        // call depth is gone.
        let catch = hit.probe.kind() != HitKind::Line && hit.probe.function() as usize >= self.functions;
        let mut thread = match self.threads.remove(&hit.tid) {
            Some(thread) => thread,
            None if catch => return,
            None => ThreadState::new(hit.pid, hit.tid, self.names.remove(&hit.tid).unwrap_or_default(), self.functions),
        };
        let mut values = thread.observe(hit.cpu, &hit.values, self.metrics, Some(hit.generation));
        if let Some(m) = self.cpu_from_switches {
            // A hit stamped just before the switch back in (two clocks) counts from the switch out.
            let now = thread.off_since.map_or(values[0], |since| since.min(values[0]));
            values[m] = now.saturating_sub(thread.off_cpu);
        }
        thread.last = values;
        let hit = Hit { values, ..*hit };
        let chained = thread.chained_returns.take();
        match hit.probe.kind() {
            HitKind::Exit if self.chained_return(&mut thread, &hit, chained) => {}
            _ if catch => self.unwind_to(&mut thread, &hit, true),
            HitKind::Exit => self.leave(&mut thread, &hit),
            HitKind::Entry => self.enter(&mut thread, &hit),
            HitKind::Line => self.line(&mut thread, &hit),
        }
        self.threads.insert(hit.tid, thread);
    }

    fn enter(&mut self, thread: &mut ThreadState, hit: &Hit) {
        if self.jumped_back_to_entry(thread, hit) {
            return;
        }
        self.unwind_to(thread, hit, false);
        // A call whose return address sits at or above an orphan's slot (the
        // stack grows down): the orphan has returned.
        if hit.sp != 0 {
            thread.orphan_returns.retain(|&(slot, _)| slot > hit.sp);
        }
        let function = hit.probe.function();
        let parent = thread.stack.last().map_or(0, |f| f.node);
        let node = thread.child(parent, function);
        thread.nodes[node as usize].calls += 1;
        let acc = thread.acc(function);
        acc.calls += 1;
        self.calls_by_function[function as usize] += 1;
        if self.returns_unwatched[function as usize] {
            // No return will end a frame: its time stays its caller's.
            acc.untimed += 1;
            return;
        }
        acc.active += 1;
        let mut frame = Frame::new(function, node, hit.sp, hit.values, false);
        frame.ret = hit.ret;
        if let Some(setup) = &self.lines {
            let line = setup.entry_lines.get(function as usize).copied().unwrap_or(NO_LINE);
            move_to_line(thread, &mut frame, line, &hit.values, false, setup, self.metrics);
            for &also in setup.entry_also.get(function as usize).map_or(&[][..], Vec::as_slice) {
                if frame.line != also {
                    move_to_line(thread, &mut frame, also, &hit.values, true, setup, self.metrics);
                }
            }
        }
        thread.stack.push(frame);
    }

    /// Whether a hit of a function's entry is no call but the function
    /// jumping back to its own first instruction: a loop whose head is the
    /// entry (gcc's for a frameless loop tested at the top), or a tail call
    /// to itself made as a jump. The stack is then as at its call's entry:
    /// that call's frame on top in the same slot, whose return the kernel's
    /// trampoline holds (a call pushes a return address of its own). Each
    /// such jump leaves the kernel one more return to report. (With
    /// returns seen at `ret` instructions, a call whose return went unseen,
    /// through an indirect tail call, looks the same: each is a call.)
    fn jumped_back_to_entry(&self, thread: &mut ThreadState, hit: &Hit) -> bool {
        let function = hit.probe.function();
        let Some(top) = thread.stack.last_mut() else { return false };
        let same_call = hit.sp != 0 && top.sp == hit.sp && top.function == function && !top.pseudo && !top.orphaned;
        let exit_sites = self.exit_sites.get(function as usize).copied().unwrap_or(false);
        if same_call && !exit_sites && self.is_trampoline(hit.ret) {
            top.reentered += 1;
            return true;
        }
        false
    }

    /// Whether a return address is a return trampoline's: the call's return taken.
    fn is_trampoline(&self, ret: u64) -> bool {
        ret != 0 && self.trampolines.iter().any(|t| t.contains(&ret))
    }

    /// Whether an exit hit is one more return the kernel reports for a
    /// frame already ended whose function had jumped back to its entry
    /// (`chained`, the hit before it left): the first ends the frame, the
    /// others come right after it, as many or fewer.
    fn chained_return(&self, thread: &mut ThreadState, hit: &Hit, chained: Option<(u32, u64, u64)>) -> bool {
        let Some((function, sp, left)) = chained else { return false };
        if hit.probe.function() != function || hit.sp != sp || left == 0 {
            return false;
        }
        thread.chained_returns = (left > 1).then_some((function, sp, left - 1));
        true
    }

    /// A line row was reached: the frame of its function moves onto it.
    fn line(&mut self, thread: &mut ThreadState, hit: &Hit) {
        if let Some(hits) = self.line_probe_hits.get_mut(hit.probe.index() as usize) {
            *hits += 1;
        }
        let Some(function) = self.lines.as_ref().and_then(|s| s.probes.get(hit.probe.index() as usize)).map(|p| p.0) else { return };
        if thread.stack.last().is_none_or(|f| f.function != function) {
            match thread.stack.iter().rposition(|f| f.function == function) {
                // Frames above it were left without a return.
                Some(position) => {
                    while thread.stack.len() > position + 1 {
                        self.close_top(thread, &hit.values, Ending::Unwound);
                    }
                }
                // Entered before the recording began.
                None => {
                    let node = thread.stack.last().map_or(0, |f| f.node);
                    thread.stack.push(Frame::new(function, node, 0, hit.values, true));
                }
            }
        }
        let Some(setup) = self.lines.as_ref() else { return };
        let Some(mut frame) = thread.stack.pop() else { return };
        let probe = hit.probe.index() as usize;
        let lines = &setup.probes[probe].1;
        let address = setup.probe_addresses.get(probe).copied();
        if lines.first() == Some(&frame.line) && address.is_some_and(|a| a <= frame.line_row) {
            // Back at or before the last row reached on the line without
            // leaving it: a turn of a loop on one line, which gcov counts.
            count_turn(thread, frame.line);
        }
        for &line in lines {
            if frame.line != line {
                move_to_line(thread, &mut frame, line, &hit.values, true, setup, self.metrics);
            }
        }
        frame.line_row = address.unwrap_or(0);
        thread.stack.push(frame);
    }

    /// Ends the frames a hit shows to be gone: frames deeper on the stack
    /// than the hit (left by an exception or longjmp without a return).
    ///
    /// A frame at exactly the hit's depth is a tail call's caller: with a
    /// return probe it lives on (the kernel reports both returns together
    /// later); with returns seen at `ret` instructions it ended by jumping
    /// to this function, now. A catch marker ends it either way, and so does
    /// a frame whose return probe went with a replaced probe set.
    fn unwind_to(&mut self, thread: &mut ThreadState, hit: &Hit, catch: bool) {
        if hit.sp == 0 {
            return;
        }
        while let Some(top) = thread.stack.last() {
            if top.sp == 0 || hit.sp - top.sp.min(hit.sp) >= SAME_STACK_SPAN {
                break;
            }
            let ending = if top.sp < hit.sp || (catch && top.sp == hit.sp) {
                Ending::Unwound
            } else if top.sp == hit.sp && self.exit_sites[top.function as usize] {
                Ending::Returned
            } else if top.sp == hit.sp && top.orphaned {
                // No return probe will report it: it returned or tail-called.
                Ending::Unwound
            } else if top.sp == hit.sp && !catch && hit.ret != 0 && !self.is_trampoline(hit.ret) {
                // A call in the same slot that does not find the return
                // trampoline there: not a tail call; the frame is gone
                // (a longjmp or an exception left it).
                Ending::Unwound
            } else {
                break;
            };
            self.close_top(thread, &hit.values, ending);
        }
    }

    fn leave(&mut self, thread: &mut ThreadState, hit: &Hit) {
        let function = hit.probe.function();
        // The returning frame: the innermost frame of the function whose
        // return address slot is the one just popped (sp - 8), or, without a
        // stack pointer, the innermost frame of the function.
        let matches_sp = |f: &Frame| hit.sp == 0 || f.sp == 0 || f.sp.wrapping_add(8) == hit.sp;
        let found = thread
            .stack
            .iter()
            .rposition(|f| f.function == function && matches_sp(f))
            .or_else(|| thread.stack.iter().rposition(|f| f.function == function));
        let Some(position) = found else {
            self.lost.unmatched_returns += 1;
            return;
        };
        // The kernel reports a return for each jump back to the entry too,
        // right after this one: taken as they come.
        let reentered = thread.stack[position].reentered;
        if reentered > 0 {
            thread.chained_returns = Some((function, hit.sp, reentered));
        }
        while thread.stack.len() > position + 1 {
            self.close_top(thread, &hit.values, Ending::Unwound);
        }
        self.close_top(thread, &hit.values, Ending::Returned);
    }

    fn close_top(&mut self, thread: &mut ThreadState, at: &Values, ending: Ending) {
        if let Some(top) = thread.stack.len().checked_sub(1) {
            self.close_at(thread, top, at, ending);
        }
    }

    /// Ends the frame at `index` of the thread's stack (usually the top; a
    /// frame below the top only when its function lost its probes).
    fn close_at(&mut self, thread: &mut ThreadState, index: usize, at: &Values, ending: Ending) {
        let mut frame = thread.stack.remove(index);
        let metrics = self.metrics;
        if let Some(setup) = &self.lines {
            move_to_line(thread, &mut frame, NO_LINE, at, false, setup, metrics);
        }
        if frame.pseudo {
            return;
        }
        if let Some(trace) = self.trace.as_mut().filter(|_| ending != Ending::Unfinished) {
            trace.call(thread.pid as i32, thread.tid as i32, frame.function, frame.entry[0], at[0], index as u32);
        }
        let mut inclusive = [0u64; MAX_METRICS];
        let mut exclusive = [0u64; MAX_METRICS];
        let own = self.compensation.as_ref().map(|c| c.own[frame.function as usize]);
        for m in 0..metrics {
            let raw = at[m].saturating_sub(frame.entry[m]);
            let cost = own.map_or(0, |o| o[m]).saturating_add(frame.below[m]);
            // One measured cost stands for every call: where it is more than
            // this call's probes took, the call keeps what its callees kept
            // (its own time 0), so that a caller holds its callees.
            inclusive[m] = raw.saturating_sub(cost).max(frame.children[m].min(raw));
            exclusive[m] = inclusive[m].saturating_sub(frame.children[m]);
        }
        let acc = thread.acc(frame.function);
        acc.active = acc.active.saturating_sub(1);
        let outermost = acc.active == 0;
        for m in 0..metrics {
            if outermost {
                acc.inclusive[m].add(inclusive[m]);
            } else {
                acc.inclusive[m].add_nested(inclusive[m]);
            }
            acc.exclusive[m].add(exclusive[m]);
        }
        match ending {
            Ending::Returned => {}
            Ending::Unwound if frame.orphaned => acc.unfinished += 1,
            Ending::Unwound => {
                acc.unwound += 1;
                self.unwound_frames += 1;
            }
            Ending::Unfinished => acc.unfinished += 1,
        }
        let node = &mut thread.nodes[frame.node as usize];
        for m in 0..metrics {
            node.inclusive[m] = node.inclusive[m].saturating_add(inclusive[m]);
            node.exclusive[m] = node.exclusive[m].saturating_add(exclusive[m]);
        }
        let call_cost = self.compensation.as_ref().map(|c| c.call[frame.function as usize]);
        if let Some(parent) = index.checked_sub(1).and_then(|p| thread.stack.get_mut(p)) {
            for m in 0..metrics {
                parent.children[m] = parent.children[m].saturating_add(inclusive[m]);
                parent.below[m] = parent.below[m].saturating_add(frame.below[m]).saturating_add(call_cost.map_or(0, |c| c[m]));
            }
        } else {
            let root = &mut thread.nodes[0];
            for m in 0..metrics {
                root.inclusive[m] = root.inclusive[m].saturating_add(inclusive[m]);
            }
        }
    }

    /// Ends the aggregation: frames still open end at their thread's last
    /// event, marked unfinished.
    pub fn finish(mut self) -> Aggregate {
        let mut threads: Vec<ThreadState> = std::mem::take(&mut self.threads).into_values().collect();
        threads.append(&mut self.finished);
        for thread in &mut threads {
            let at = thread.last;
            while !thread.stack.is_empty() {
                self.close_top(thread, &at, Ending::Unfinished);
            }
        }
        // Threads seen only switching, never running instrumented code.
        threads.retain(|t| !t.accs.is_empty() || !t.lines.is_empty());
        threads.sort_by_key(|t| (t.pid, t.tid));
        let metrics = self.metrics;
        let (nlines, nregions) = self.lines.as_ref().map_or((0, 0), |s| (s.lines, s.regions));
        let mut lines = vec![(0u64, [0u64; MAX_METRICS]); nlines];
        let mut regions = vec![(0u64, [Stat::default(); MAX_METRICS]); nregions];
        for t in &threads {
            for (total, acc) in lines.iter_mut().zip(&t.lines) {
                total.0 += acc.count;
                for m in 0..metrics {
                    total.1[m] = total.1[m].saturating_add(acc.cost[m]);
                }
            }
            for (total, acc) in regions.iter_mut().zip(&t.regions) {
                total.0 += acc.entries;
                for m in 0..metrics {
                    total.1[m].merge(&acc.inclusive[m]);
                }
            }
        }
        let profiles = threads
            .into_iter()
            .map(|t| {
                let mut functions: Vec<FunctionStats> = t
                    .accs
                    .iter()
                    .map(|a| FunctionStats {
                        function: a.function,
                        calls: a.calls,
                        unwound: a.unwound,
                        unfinished: a.unfinished,
                        untimed: a.untimed,
                        // A forked child's returns of the calls its parent
                        // made go unpaired here: none is timed in the child.
                        carried: 0,
                        inclusive: a.inclusive[..metrics].to_vec(),
                        exclusive: a.exclusive[..metrics].to_vec(),
                    })
                    .collect();
                functions.sort_by_key(|f| f.function);
                let nodes = t
                    .nodes
                    .iter()
                    .map(|n| TreeNode {
                        function: n.function,
                        parent: n.parent,
                        calls: n.calls,
                        inclusive: n.inclusive[..metrics].to_vec(),
                        exclusive: n.exclusive[..metrics].to_vec(),
                        estimated: false,
                    })
                    .collect();
                ThreadProfile { pid: t.pid as i32, tid: t.tid as i32, name: t.name, functions, tree: CallTree { nodes } }
            })
            .collect();
        let mut lost = self.lost;
        lost.by_function = sorted_counts(self.lost_by_function);
        lost.by_thread = sorted_counts(self.lost_by_thread);
        Aggregate {
            threads: profiles,
            lost,
            throttled: self.throttled,
            processes: self.processes,
            hits: self.hits,
            line_probe_hits: self.line_probe_hits,
            unwound_frames: self.unwound_frames,
            orphaned_frames: self.orphaned_frames,
            lines,
            regions,
            trace: self.trace,
        }
    }
}

fn count_turn(thread: &mut ThreadState, line: u32) {
    if let Some(acc) = thread.lines.get_mut(line as usize) {
        acc.count += 1;
    }
}

/// Moves `frame` onto `line` at `at` (NO_LINE: off every line, as it
/// returns): the line it leaves gets the time spent on it, the regions it
/// leaves their entry's cost, the regions it enters an entry; `count` says
/// whether arriving counts as entering the line.
fn move_to_line(thread: &mut ThreadState, frame: &mut Frame, line: u32, at: &Values, count: bool, setup: &LineSetup, metrics: usize) {
    if thread.lines.len() < setup.lines {
        thread.lines.resize(setup.lines, LineAcc::default());
        thread.regions.resize(setup.regions, RegionAcc { entries: 0, inclusive: [Stat::default(); MAX_METRICS] });
    }
    if let Some(old) = thread.lines.get_mut(frame.line as usize) {
        for m in 0..metrics {
            old.cost[m] = old.cost[m].saturating_add(at[m].saturating_sub(frame.line_since[m]));
        }
    }
    if let Some(new) = thread.lines.get_mut(line as usize)
        && count
    {
        new.count += 1;
    }
    frame.line = line;
    frame.line_since = *at;
    if setup.regions == 0 {
        return;
    }
    let inside = setup.regions_of.get(line as usize).map_or(&[][..], Vec::as_slice);
    frame.regions.retain(|&(region, since)| {
        if inside.contains(&region) {
            return true;
        }
        let acc = &mut thread.regions[region as usize];
        for m in 0..metrics {
            acc.inclusive[m].add(at[m].saturating_sub(since[m]));
        }
        false
    });
    for &region in inside {
        if !frame.regions.iter().any(|&(r, _)| r == region) {
            thread.regions[region as usize].entries += 1;
            frame.regions.push((region, *at));
        }
    }
}

fn sorted_counts(map: FxHashMap<u32, u64>) -> Vec<LostCount> {
    let mut v: Vec<LostCount> = map.into_iter().map(|(id, count)| LostCount { id: i64::from(id), count }).collect();
    v.sort_by_key(|c| c.id);
    v
}

/// The aggregator's result.
pub struct Aggregate {
    /// Per-thread profiles, by pid and tid.
    pub threads: Vec<ThreadProfile>,
    /// What was lost.
    pub lost: Lost,
    /// Per function: its probes were removed during the recording.
    pub throttled: Vec<bool>,
    /// Processes seen.
    pub processes: Vec<ProcessInfo>,
    /// Probe hits.
    pub hits: u64,
    /// Per line probe: its hits.
    pub line_probe_hits: Vec<u64>,
    /// Frames that ended without their own return.
    pub unwound_frames: u64,
    /// Frames in progress when the probe set changed, whose return probes
    /// went with the old set.
    pub orphaned_frames: u64,
    /// Per line id: entries and cost per metric, over all threads.
    pub lines: Vec<(u64, Values)>,
    /// Per region: entries and cost per entry, over all threads.
    pub regions: Vec<(u64, [Stat; MAX_METRICS])>,
    /// Finished calls one by one, when they were traced.
    pub trace: Option<TraceKeeper>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::ProbeId;

    fn probe(function: u32, is_return: bool) -> ProbeId {
        ProbeId::of_call(function, is_return)
    }

    fn aggregator(functions: usize, metrics: usize) -> Aggregator {
        Aggregator::new(AggregatorConfig::new(functions, metrics))
    }

    /// A hit at `time` with cpu = time / 2, stack pointer `sp`.
    fn hit(tid: u32, f: u32, ret: bool, time: u64, sp: u64) -> Event {
        let mut values = [0; MAX_METRICS];
        values[0] = time;
        values[1] = time / 2;
        Event::Hit(Hit { pid: 1, tid, probe: probe(f, ret), sp, ret: 0, cpu: 0, generation: 0, values })
    }

    fn stats(agg: Aggregate, tid: i32, f: u32) -> FunctionStats {
        let thread = agg.threads.iter().find(|t| t.tid == tid).expect("thread");
        thread.functions.iter().find(|s| s.function == f).expect("function").clone()
    }

    #[test]
    fn inclusive_and_exclusive_on_a_known_tree() {
        // main(0) [0,100] calls a(1) [10,40] which calls b(2) [20,30]; then b [50,60].
        let mut agg = aggregator(3, 2);
        let stream = [
            hit(7, 0, false, 0, 1000),
            hit(7, 1, false, 10, 992),
            hit(7, 2, false, 20, 984),
            hit(7, 2, true, 30, 992),
            hit(7, 1, true, 40, 1000),
            hit(7, 2, false, 50, 992),
            hit(7, 2, true, 60, 1000),
            hit(7, 0, true, 100, 1008),
        ];
        for e in &stream {
            agg.push(e);
        }
        let result = agg.finish();
        let tree = &result.threads[0].tree;
        assert_eq!(tree.nodes.len(), 5); // root, main, main>a, main>a>b, main>b
        let main = stats(result, 7, 0);
        assert_eq!(main.calls, 1);
        assert_eq!(main.inclusive[0].total, 100);
        assert_eq!(main.exclusive[0].total, 100 - 30 - 10);
        assert_eq!(main.inclusive[1].total, 50);
    }

    #[test]
    fn per_call_extremes_and_recursion_counted_once() {
        // f(0) recursive: outer [0,100], inner [10,20].
        let mut agg = aggregator(1, 1);
        for e in [hit(1, 0, false, 0, 1000), hit(1, 0, false, 10, 900), hit(1, 0, true, 20, 908), hit(1, 0, true, 100, 1008)] {
            agg.push(&e);
        }
        let f = stats(agg.finish(), 1, 0);
        assert_eq!(f.calls, 2);
        // The inner call is in the outer one's total, and in the average.
        assert_eq!(f.inclusive[0], Stat { total: 100, min: 10, max: 100, nested: 10 });
        assert_eq!(f.inclusive[0].avg(f.calls), 55);
        // Exclusive: the outer call excludes the inner one.
        assert_eq!(f.exclusive[0].total, 90 + 10);
    }

    #[test]
    fn a_frame_left_by_an_exception_ends_at_the_catch_and_is_marked() {
        // main(0) calls validate(1) which calls check(2) which throws; main
        // catches (marker 4 at validate's depth) and calls area(3) at the
        // same depth: area is main's callee, validate and check are gone.
        let mut agg = aggregator(4, 1);
        for e in [
            hit(1, 0, false, 0, 1000),
            hit(1, 1, false, 10, 992),
            hit(1, 2, false, 20, 984),
            hit(1, 4, false, 40, 992),
            hit(1, 3, false, 50, 992),
            hit(1, 3, true, 60, 1000),
            hit(1, 0, true, 100, 1008),
        ] {
            agg.push(&e);
        }
        let result = agg.finish();
        let tree = result.threads[0].tree.clone();
        let check = stats(result, 1, 2);
        assert_eq!((check.calls, check.unwound), (1, 1));
        assert_eq!(check.inclusive[0].total, 20);
        // area hangs under main, not under the dead validate.
        let area = tree.nodes.iter().find(|n| n.function == 3).expect("area");
        assert_eq!(tree.nodes[area.parent as usize].function, 0);
    }

    #[test]
    fn a_deeper_frame_is_gone_when_a_shallower_call_starts() {
        // Without a marker (longjmp): main(0) -> a(1) -> b(2); longjmp back
        // to main, which calls c(3) from a shallower depth than b.
        let mut agg = aggregator(4, 1);
        for e in [hit(1, 0, false, 0, 1000), hit(1, 1, false, 10, 992), hit(1, 2, false, 20, 984), hit(1, 3, false, 50, 992)] {
            agg.push(&e);
        }
        let result = agg.finish();
        let b = stats(result, 1, 2);
        assert_eq!((b.unwound, b.inclusive[0].total), (1, 30));
    }

    #[test]
    fn with_exit_sites_a_tail_call_ends_its_caller() {
        // f(0) at sp 992 jumps to g(1), which is entered at the same sp
        // (an indirect tail call, no exit site seen for f).
        let mut agg = Aggregator::new(AggregatorConfig { exit_sites: vec![true, true], ..AggregatorConfig::new(2, 1) });
        for e in [hit(1, 0, false, 0, 992), hit(1, 1, false, 10, 992), hit(1, 1, true, 30, 1000)] {
            agg.push(&e);
        }
        let result = agg.finish();
        assert_eq!(result.unwound_frames, 0);
        let thread = &result.threads[0];
        let f = thread.functions.iter().find(|s| s.function == 0).expect("f");
        assert_eq!((f.inclusive[0].total, f.unwound), (10, 0));
        // g is f's caller's callee, not f's.
        let g = thread.tree.nodes.iter().find(|n| n.function == 1).expect("g");
        assert_eq!(g.parent, 0);
    }

    #[test]
    fn a_tail_call_keeps_its_caller() {
        // f(0) at sp 992 tail-calls g(1), entered at the same sp; both
        // returns arrive together (the kernel chains them).
        let mut agg = aggregator(2, 1);
        for e in [hit(1, 0, false, 0, 992), hit(1, 1, false, 10, 992), hit(1, 1, true, 30, 1000), hit(1, 0, true, 30, 1000)] {
            agg.push(&e);
        }
        let result = agg.finish();
        assert_eq!(result.unwound_frames, 0);
        assert_eq!(stats(result, 1, 0).inclusive[0].total, 30);
    }

    #[test]
    fn a_function_jumping_back_to_its_entry_makes_one_call_whose_chained_returns_end_nothing() {
        // main(0) calls f(1) at sp 992, which jumps back to its entry three
        // times, its slot holding the kernel's trampoline; the kernel
        // reports f's return and two more (its depth of pending returns
        // reached); main calls f again, which returns at once; main returns.
        let trampoline = 0x7fff_f000u64;
        let config =
            AggregatorConfig { trampolines: std::iter::once(trampoline..trampoline + 0x1000).collect(), ..AggregatorConfig::new(2, 1) };
        let mut agg = Aggregator::new(config);
        let from = |event: Event, ret: u64| match event {
            Event::Hit(h) => Event::Hit(Hit { ret, ..h }),
            other => other,
        };
        let call_site = 0x40_1234;
        let events = [
            from(hit(1, 0, false, 0, 1000), 0x40_0000),
            from(hit(1, 1, false, 10, 992), call_site),
            from(hit(1, 1, false, 20, 992), trampoline),
            from(hit(1, 1, false, 30, 992), trampoline),
            from(hit(1, 1, false, 40, 992), trampoline),
            hit(1, 1, true, 50, 1000),
            hit(1, 1, true, 50, 1000),
            hit(1, 1, true, 50, 1000),
            from(hit(1, 1, false, 60, 992), call_site),
            hit(1, 1, true, 70, 1000),
            hit(1, 0, true, 100, 1008),
        ];
        for e in &events {
            agg.push(e);
        }
        let result = agg.finish();
        assert_eq!((result.unwound_frames, result.lost.unmatched_returns), (0, 0));
        let thread = result.threads.iter().find(|t| t.tid == 1).expect("thread");
        let of = |function| thread.functions.iter().find(|s| s.function == function).expect("function");
        assert_eq!((of(1).calls, of(1).inclusive[0].total, of(1).inclusive[0].max), (2, 40 + 10, 40));
        assert_eq!(of(0).exclusive[0].total, 100 - 50);
    }

    #[test]
    fn a_function_whose_returns_are_unwatched_is_counted_and_its_time_left_to_its_caller() {
        // main(0) calls setjmp(1) twice (entry probes only), then f(2),
        // which comes back at the same depth: setjmp's calls end nothing.
        let config =
            AggregatorConfig { returns_unwatched: vec![false, true, false], exit_sites: vec![true; 3], ..AggregatorConfig::new(3, 1) };
        let mut agg = Aggregator::new(config);
        let events = [
            hit(1, 0, false, 0, 1000),
            hit(1, 1, false, 10, 992),
            hit(1, 1, false, 20, 992),
            hit(1, 2, false, 30, 992),
            hit(1, 2, true, 50, 1000),
            hit(1, 0, true, 100, 1008),
        ];
        for e in events {
            agg.push(&e);
        }
        let result = agg.finish();
        assert_eq!(result.unwound_frames, 0);
        let thread = result.threads.iter().find(|t| t.tid == 1).unwrap();
        let of = |f: u32| thread.functions.iter().find(|s| s.function == f).unwrap().clone();
        let setjmp = of(1);
        assert_eq!((setjmp.calls, setjmp.untimed, setjmp.timed_calls(), setjmp.inclusive[0].total), (2, 2, 0, 0));
        assert_eq!((of(2).inclusive[0].total, of(2).untimed), (20, 0));
        // main's exclusive time keeps setjmp's: 100 minus f's 20.
        assert_eq!((of(0).inclusive[0].total, of(0).exclusive[0].total), (100, 80));
    }

    #[test]
    fn without_stack_pointers_an_outer_return_unwinds_inner_frames() {
        let mut agg = aggregator(3, 1);
        for e in [hit(1, 0, false, 0, 0), hit(1, 1, false, 10, 0), hit(1, 2, false, 20, 0), hit(1, 0, true, 100, 0)] {
            agg.push(&e);
        }
        let result = agg.finish();
        assert_eq!(result.unwound_frames, 2);
        let thread = &result.threads[0];
        let main = thread.functions.iter().find(|s| s.function == 0).expect("main");
        assert_eq!(main.inclusive[0].total, 100);
        assert_eq!(main.unwound, 0);
    }

    #[test]
    fn threads_are_separate_and_unmatched_returns_counted() {
        let mut agg = aggregator(1, 1);
        for e in
            [hit(1, 0, false, 0, 100), hit(2, 0, true, 5, 108), hit(2, 0, false, 6, 100), hit(1, 0, true, 10, 108), hit(2, 0, true, 9, 108)]
        {
            agg.push(&e);
        }
        let result = agg.finish();
        assert_eq!(result.lost.unmatched_returns, 1);
        assert_eq!(result.threads.len(), 2);
        assert_eq!(stats(result, 2, 0).inclusive[0].total, 3);
    }

    /// a(0) calls b(1) twice, compensated with a cost of `call` to a
    /// caller per call and 1 to the call itself.
    fn a_calls_b_twice(call: u64) -> Aggregate {
        let comp = Compensation { call: vec![[call; MAX_METRICS]; 2], own: vec![[1; MAX_METRICS]; 2] };
        let mut agg = Aggregator::new(AggregatorConfig { compensation: Some(comp), ..AggregatorConfig::new(2, 1) });
        for e in [
            hit(1, 0, false, 0, 100),
            hit(1, 1, false, 10, 92),
            hit(1, 1, true, 20, 100),
            hit(1, 1, false, 30, 92),
            hit(1, 1, true, 40, 100),
            hit(1, 0, true, 50, 108),
        ] {
            agg.push(&e);
        }
        agg.finish()
    }

    #[test]
    fn compensation_subtracts_probe_costs_of_callees() {
        // Each call of b costs 5 to its caller and 1 to itself.
        let result = a_calls_b_twice(5);
        let thread = &result.threads[0];
        let a = thread.functions.iter().find(|s| s.function == 0).expect("a");
        let b = thread.functions.iter().find(|s| s.function == 1).expect("b");
        assert_eq!(b.inclusive[0].total, 2 * 9);
        assert_eq!(a.inclusive[0].total, 50 - 1 - 2 * 5);
        assert_eq!(a.exclusive[0].total, 39 - 18);
    }

    #[test]
    fn a_cost_larger_than_a_callers_time_leaves_it_its_callees() {
        // Each call of b said to cost a 20, where a's calls took 50 in all.
        let result = a_calls_b_twice(20);
        let thread = &result.threads[0];
        let a = thread.functions.iter().find(|s| s.function == 0).expect("a");
        let b = thread.functions.iter().find(|s| s.function == 1).expect("b");
        // 50 - 1 - 2 * 20 = 9 is less than b's 2 * 9: a keeps b's, and none of its own.
        assert_eq!((a.inclusive[0].total, a.exclusive[0].total, b.inclusive[0].total), (18, 0, 18));
    }

    #[test]
    fn counters_add_up_over_cpus() {
        // The thread runs on CPU 0 (cpu counter 0 -> 10), leaves it, runs on
        // CPU 1 (0 -> 5), and returns there: 15 in all, not 5 - 0.
        let mut agg = aggregator(1, 2);
        let at = |cpu: u16, time: u64, count: u64, ret: bool| {
            let mut values = [0; MAX_METRICS];
            values[0] = time;
            values[1] = count;
            if ret {
                Event::Hit(Hit { pid: 1, tid: 1, probe: probe(0, true), sp: 108, ret: 0, cpu, generation: 0, values })
            } else {
                Event::Hit(Hit { pid: 1, tid: 1, probe: probe(0, false), sp: 100, ret: 0, cpu, generation: 0, values })
            }
        };
        let mut switch_values = [0; MAX_METRICS];
        switch_values[0] = 50;
        switch_values[1] = 10;
        agg.push(&at(0, 0, 0, false));
        agg.push(&Event::Switch { pid: 1, tid: 1, cpu: 0, values: switch_values });
        agg.push(&at(1, 100, 5, true));
        let f = stats(agg.finish(), 1, 0);
        assert_eq!(f.inclusive[1].total, 15);
        assert_eq!(f.inclusive[0].total, 100);
    }

    #[test]
    fn replacing_probes_ends_removed_frames_and_rebases_counters() {
        // main(0) calls hot(1); hot loses its probes while running. The new
        // probe set's counters start from zero: main's return (cpu 5 in the
        // new set) is 30 + 5 in the thread's total.
        let mut agg = aggregator(2, 2);
        let at = |f: u32, ret: bool, time: u64, cpu_count: u64, generation: u32, sp: u64| {
            let mut values = [0; MAX_METRICS];
            values[0] = time;
            values[1] = cpu_count;
            Event::Hit(Hit { pid: 1, tid: 1, probe: probe(f, ret), sp, ret: 0, cpu: 0, generation, values })
        };
        agg.push(&at(0, false, 0, 0, 1, 1000));
        agg.push(&at(1, false, 10, 10, 1, 992));
        let mut switched = [0; MAX_METRICS];
        switched[0] = 40;
        switched[1] = 30;
        agg.push(&Event::Switch { pid: 1, tid: 1, cpu: 0, values: switched });
        agg.push(&Event::ProbesReplaced {
            time: 40,
            generations: vec![2],
            removed: vec![1],
            redefined: Some(vec![0, 1]),
            uncounted: Vec::new(),
        });
        agg.push(&at(0, true, 100, 5, 2, 1008));
        let result = agg.finish();
        let thread = &result.threads[0];
        let main = thread.functions.iter().find(|s| s.function == 0).expect("main");
        let hot = thread.functions.iter().find(|s| s.function == 1).expect("hot");
        assert_eq!(main.inclusive[1].total, 35);
        assert_eq!((hot.calls, hot.unfinished), (1, 1));
        assert_eq!(hot.inclusive[0].total, 30);
    }

    #[test]
    fn unpatched_functions_keep_their_calls_in_progress_until_they_return() {
        // main(0) calls hot(1), both patched in the process; hot is unpatched
        // while running, and its return still comes through the trampoline.
        let mut agg = Aggregator::new(AggregatorConfig { returns_outlive_probes: vec![true, true], ..AggregatorConfig::new(2, 1) });
        let at = |f: u32, ret: bool, time: u64, sp: u64| {
            let mut values = [0; MAX_METRICS];
            values[0] = time;
            Event::Hit(Hit { pid: 1, tid: 1, probe: probe(f, ret), sp, ret: 0, cpu: 0, generation: 1, values })
        };
        agg.push(&at(0, false, 0, 1000));
        agg.push(&at(1, false, 10, 992));
        agg.push(&Event::ProbesReplaced {
            time: 40,
            generations: Vec::new(),
            removed: vec![1],
            redefined: Some(Vec::new()),
            uncounted: Vec::new(),
        });
        agg.push(&at(1, true, 50, 1000));
        agg.push(&at(0, true, 100, 1008));
        assert_eq!(agg.throttled(), &[false, true]);
        let result = agg.finish();
        assert_eq!(result.orphaned_frames, 0);
        let thread = &result.threads[0];
        let stats = |f: u32| thread.functions.iter().find(|s| s.function == f).expect("function");
        assert_eq!((stats(1).calls, stats(1).unfinished, stats(1).unwound), (1, 0, 0));
        assert_eq!(stats(1).inclusive[0].total, 40);
        assert_eq!((stats(0).unfinished, stats(0).inclusive[0].total, stats(0).exclusive[0].total), (0, 100, 60));
    }

    #[test]
    fn frames_across_a_replacement_keep_their_return_addresses_until_gone() {
        // main(0) calls run(1) calls hot(2), all seen by return probes; hot
        // loses its probes while running, main and run keep theirs.
        let mut agg = aggregator(3, 1);
        let enter = |f: u32, time: u64, sp: u64, ret: u64| {
            let mut values = [0; MAX_METRICS];
            values[0] = time;
            Event::Hit(Hit { pid: 1, tid: 1, probe: probe(f, false), sp, ret, cpu: 0, generation: 1, values })
        };
        agg.push(&enter(0, 0, 1000, 0xa0));
        agg.push(&enter(1, 10, 992, 0xb0));
        agg.push(&enter(2, 20, 984, 0xc0));
        agg.push(&Event::ProbesReplaced {
            time: 30,
            generations: vec![2],
            removed: vec![2],
            redefined: Some(vec![0, 1, 2]),
            uncounted: Vec::new(),
        });
        // The kernel's trampoline still stands in hot's slot: the unwinder needs its address.
        let mut returns = agg.return_addresses(1);
        returns.sort_unstable();
        assert_eq!(returns, vec![(984, 0xc0), (992, 0xb0), (1000, 0xa0)]);
        // A call at run's depth: run and hot are gone; run's return probe
        // went with the old set, so it ends here, unfinished, not unwound.
        agg.push(&enter(1, 40, 992, 0xb8));
        assert_eq!(agg.return_addresses(1).len(), 2);
        let result = agg.finish();
        assert_eq!(result.orphaned_frames, 2);
        assert_eq!(result.unwound_frames, 0);
        let run = result.threads[0].functions.iter().find(|s| s.function == 1).expect("run");
        assert_eq!((run.calls, run.unfinished, run.unwound), (2, 2, 0));
        assert_eq!(run.inclusive[0].total, 30);
    }

    #[test]
    fn a_frame_whose_probes_were_not_defined_again_keeps_its_return_probe() {
        // main(0) calls run(1); run's probes are in a part defined again,
        // main's are not: main's return is still seen, run's is not.
        let mut agg = aggregator(2, 1);
        agg.push(&hit(1, 0, false, 0, 1000));
        agg.push(&hit(1, 1, false, 10, 992));
        agg.push(&Event::ProbesReplaced {
            time: 30,
            generations: vec![2],
            removed: Vec::new(),
            redefined: Some(vec![1]),
            uncounted: Vec::new(),
        });
        agg.push(&hit(1, 1, false, 40, 992));
        agg.push(&hit(1, 1, true, 50, 1000));
        agg.push(&hit(1, 0, true, 100, 1008));
        let result = agg.finish();
        assert_eq!(result.orphaned_frames, 1);
        let stats = |f: u32| result.threads[0].functions.iter().find(|s| s.function == f).expect("function");
        assert_eq!((stats(0).calls, stats(0).unfinished, stats(0).inclusive[0].total), (1, 0, 100));
        assert_eq!((stats(1).calls, stats(1).unfinished), (2, 1));
    }

    #[test]
    fn a_new_thread_has_its_makers_name_until_it_names_itself() {
        let mut agg = aggregator(1, 1);
        agg.push(&Event::Comm { time: 1, pid: 1, tid: 1, name: "server".into(), exec: true });
        agg.push(&hit(1, 0, false, 2, 100));
        agg.push(&Event::Fork { time: 3, pid: 1, ppid: 1, tid: 2, ptid: 1 });
        agg.push(&Event::Fork { time: 3, pid: 1, ppid: 1, tid: 3, ptid: 1 });
        agg.push(&Event::Comm { time: 4, pid: 1, tid: 3, name: "worker".into(), exec: false });
        for tid in [2, 3] {
            agg.push(&hit(tid, 0, false, 5, 100));
        }
        assert_eq!((agg.thread_name(2), agg.thread_name(3)), ("server".to_string(), "worker".to_string()));
        // Known only from the fork (the in-process engine's threads hit no probe).
        agg.push(&Event::Fork { time: 6, pid: 1, ppid: 1, tid: 4, ptid: 3 });
        assert_eq!(agg.thread_name(4), "worker");
    }

    #[test]
    fn exited_threads_are_all_kept() {
        let mut agg = aggregator(1, 1);
        for tid in 2..6 {
            agg.push(&hit(tid, 0, false, 1, 100));
        }
        for tid in 2..6 {
            agg.push(&hit(tid, 0, true, 2, 108));
            agg.push(&Event::Exit { time: 3, pid: 1, tid });
        }
        // A reused tid is a new thread.
        agg.push(&hit(3, 0, false, 4, 100));
        let result = agg.finish();
        assert_eq!(result.threads.len(), 5);
    }

    #[test]
    fn exit_closes_a_thread_and_lost_records_are_counted() {
        let mut agg = aggregator(1, 1);
        agg.push(&Event::Comm { time: 0, pid: 1, tid: 3, name: "worker".into(), exec: false });
        agg.push(&hit(3, 0, false, 10, 100));
        agg.push(&Event::Lost { time: 11, tid: 3, probe: Some(probe(0, true)), count: 4 });
        agg.push(&Event::Exit { time: 50, pid: 1, tid: 3 });
        let result = agg.finish();
        assert_eq!(result.lost.events, 4);
        assert_eq!(result.lost.by_function, vec![LostCount { id: 0, count: 4 }]);
        assert_eq!(result.lost.by_thread, vec![LostCount { id: 3, count: 4 }]);
        let t = &result.threads[0];
        assert_eq!(t.name, "worker");
        assert_eq!(t.functions[0].unwound, 1);
        assert_eq!(t.functions[0].inclusive[0].total, 40);
    }
}

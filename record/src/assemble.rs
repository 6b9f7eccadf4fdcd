//! From what a recording aggregated to a [`Profile`]: the setup known when
//! the target started, the aggregate, the samples, and what the recording
//! told as it ended. A pure function of those, so a saved event stream
//! replays into the same profile.

use crate::aggregate::{Aggregate, AggregatorConfig};
use crate::cost::{ProbeCost, overhead};
use crate::events::Values;
use crate::request::RegionSpec;
use crate::trace::TraceKeeper;
use proftap_probes::entry::EntryKind;
use proftap_profile::{
    BranchRecord, CallTree, Engine, ExitMode, Finding, FunctionInfo, HeldSamples, LineRecord, Mode, Note, Profile, Recording, RegionRecord,
    SampleProfile, SampledFrame, Stat, Target, ThreadProfile, Throttled, TreeNode,
};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// What is known of a recording once its target runs: how to aggregate it
/// and what its profile says of the target and the functions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Setup {
    /// How its events are aggregated.
    pub aggregation: AggregatorConfig,
    /// The program (its end is the [`Ending`]'s).
    pub target: Target,
    /// The functions recorded, by id.
    pub functions: Vec<FunctionInfo>,
    /// How the kernel handles each function's probed entry (its probe cost).
    pub entries: Vec<EntryKind>,
    /// Metric keys (`wall_ns`, ...).
    pub metrics: Vec<String>,
    /// The lines counted, when lines are.
    pub lines: Option<LineTable>,
    /// The regions timed.
    pub regions: Vec<RegionSpec>,
    /// What a probe costs, when measured.
    pub cost: Option<ProbeCost>,
    /// Whether the probe cost is subtracted from the times.
    pub compensate: bool,
    /// How uprobes see returns.
    pub exits: ExitMode,
    /// Whether forked children are recorded.
    pub follow_forks: bool,
    /// When the target started running, Unix time.
    pub started_unix_ns: u64,
    /// The same, CLOCK_MONOTONIC.
    pub started_monotonic_ns: u64,
    /// The sampling event and frequency, when stacks are sampled.
    pub sampling: Option<(String, u64)>,
    /// The recorder's version.
    pub proftap_version: String,
}

/// The lines a recording counts, by line id.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LineTable {
    /// (file, line), by id.
    pub lines: Vec<(String, u32)>,
    /// Per function: its declaration line, counted once per call.
    pub decl_lines: Vec<Option<u32>>,
    /// Lines followed by uprobes that no uprobe could be placed on: they
    /// show no count.
    #[serde(default)]
    pub unprobed: Vec<u32>,
    /// Per line probe: how the kernel runs the instruction it is on (what
    /// a hit costs).
    #[serde(default)]
    pub probe_kinds: Vec<EntryKind>,
}

/// What a recording told as it ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ending {
    /// The launched program's exit status, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether it ended while recorded (launched or attached to).
    #[serde(default)]
    pub ended: bool,
    /// When the recording ended, CLOCK_MONOTONIC.
    pub ended_monotonic_ns: u64,
    /// Peak events per second aggregated.
    pub peak_events_per_second: u64,
    /// What saw the calls: the in-process engine if it patched anything.
    pub engine: Engine,
    /// Per function: instrumented by uprobes at the end.
    pub probed: Vec<bool>,
    /// Per function: patched by the in-process engine.
    pub patched: Vec<bool>,
    /// Probe hits the probe events counted as lost.
    pub lost_samples: u64,
    /// Entries and returns the in-process engine lost.
    pub engine_lost: u64,
    /// Kernel records that could not be read.
    pub malformed: u64,
    /// The threads the in-process engine added up in the target.
    #[serde(default)]
    pub engine_threads: Vec<ThreadProfile>,
    /// Calls it counted, timed or not.
    #[serde(default)]
    pub engine_calls: u64,
    /// Per function, its calls after the governor took its probes out,
    /// which the in-process engine only counted (`None`: not counted).
    #[serde(default)]
    pub calls_only_counted: Vec<Option<u64>>,
    /// Per function, whether the in-process engine stopped counting its
    /// calls too: those counted are until then.
    #[serde(default)]
    pub counting_stopped: Vec<bool>,
    /// What the recording found until it ended, in order.
    pub notes: Vec<Note>,
    /// What the samples said of throttled functions (see [`SampleProfile::throttled`]).
    #[serde(default)]
    pub throttled: Throttled,
    /// Samples taken in the in-process engine's counting stubs (see
    /// [`proftap_profile::SampleProfile::in_counting_stubs`]): saved, as a
    /// replay names its stacks again without the engine's code.
    #[serde(default)]
    pub in_counting_stubs: u64,
    /// The calls the in-process engine traced one by one (not saved: a
    /// replay has the probes' calls only).
    #[serde(skip)]
    pub engine_trace: Option<TraceKeeper>,
    /// Per line id, its entries counted by the in-process engine's edge
    /// counters, besides what line probes counted (`None`: not counted, the
    /// line is left out).
    #[serde(default)]
    pub line_counts: Option<Vec<Option<u64>>>,
    /// Per line id, the conditional jumps the edge counters counted on it.
    #[serde(default)]
    pub line_branches: Vec<Vec<BranchRecord>>,
    /// Per region, its entries and cost per entry (per metric) as the
    /// in-process engine's hooks added them up, besides what line probes
    /// saw.
    #[serde(default)]
    pub engine_regions: Vec<(u64, Vec<Stat>)>,
    /// Stacks were sampled on every CPU (see
    /// [`proftap_profile::SampleProfile::on_every_cpu`]).
    #[serde(default)]
    pub sampled_on_every_cpu: bool,
}

/// The profile of a recording.
pub fn assemble(setup: &Setup, mut aggregate: Aggregate, mut samples: Option<SampleProfile>, mut ending: Ending) -> Profile {
    let metrics = setup.metrics.len();
    // The kernel reports a loss as a record only when it next writes to the
    // buffer; the events' own counts also include losses it never reported.
    let known = ending.lost_samples.saturating_add(ending.engine_lost);
    aggregate.lost.events = aggregate.lost.events.max(known);
    merge_threads(&mut aggregate.threads, std::mem::take(&mut ending.engine_threads));
    if let Some(samples) = samples.as_mut() {
        samples.on_every_cpu = ending.sampled_on_every_cpu;
    }
    let ending = &ending;
    let mut functions = functions(setup, &aggregate.throttled, ending, samples.is_some());
    let released = samples.as_mut().map_or(0, |samples| release_held_time(&setup.metrics, &mut functions, &mut aggregate.threads, samples));
    // An entry and a return each, as a probe would have reported them.
    aggregate.hits = aggregate.hits.saturating_add(ending.engine_calls.saturating_mul(2));
    let mut notes = notes(setup, &aggregate, ending);
    if released > 0 {
        notes.push(Finding::ThrottledTimeReleased { functions: released }.into());
    }
    let mut calls = vec![0u64; setup.functions.len()];
    for stats in aggregate.threads.iter().flat_map(|t| &t.functions) {
        if let Some(n) = calls.get_mut(stats.function as usize) {
            *n = n.saturating_add(stats.calls);
        }
    }
    settle_change_counts(&mut notes, &functions, &calls);
    let patched = fitted(&ending.patched, setup.functions.len());
    let line_probes = setup.lines.as_ref().map(|t| t.probe_kinds.as_slice()).unwrap_or_default();
    let line_hits: Vec<(EntryKind, u64)> = line_probes.iter().copied().zip(aggregate.line_probe_hits.iter().copied()).collect();
    let overhead = overhead(&setup.entries, &patched, &calls, &line_hits, aggregate.hits, setup.cost, setup.compensate);
    Profile {
        target: Target { exit_code: ending.exit_code, signal: ending.signal, ended: ending.ended, ..setup.target.clone() },
        recording: Recording {
            engine: ending.engine,
            exits: setup.exits,
            started_unix_ns: setup.started_unix_ns,
            started_monotonic_ns: setup.started_monotonic_ns,
            duration_ns: ending.ended_monotonic_ns.saturating_sub(setup.started_monotonic_ns),
            events: aggregate.hits,
            peak_events_per_second: ending.peak_events_per_second,
            follow_forks: setup.follow_forks,
            proftap_version: setup.proftap_version.clone(),
        },
        metrics: setup.metrics.clone(),
        functions,
        lines: line_records(setup.lines.as_ref(), &aggregate.lines, ending, &calls, metrics, &throttled_lines(setup, &aggregate.throttled)),
        regions: region_records(&setup.regions, &aggregate, &ending.engine_regions, metrics),
        threads: aggregate.threads,
        lost: aggregate.lost,
        overhead,
        processes: aggregate.processes,
        notes,
        runs: 1,
        samples,
        trace: aggregate.trace.map(|keeper| keeper.into_trace(setup.started_monotonic_ns)),
    }
}

/// Adds the threads the in-process engine added up to those the events
/// made. The functions of one thread are disjoint between them (a function
/// is patched or probed); where one thread has both, the engine's calling
/// contexts join the tree under its root.
fn merge_threads(threads: &mut Vec<ThreadProfile>, engine: Vec<ThreadProfile>) {
    // Moved, not copied: a shell's profile holds hundreds of processes.
    for theirs in engine {
        match threads.iter_mut().find(|t| t.pid == theirs.pid && t.tid == theirs.tid) {
            None => threads.push(theirs),
            Some(ours) => {
                ours.functions.extend(theirs.functions);
                ours.functions.sort_by_key(|f| f.function);
                let offset = ours.tree.nodes.len() as u32;
                let mut nodes = theirs.tree.nodes.into_iter();
                // Node 0 of each tree is the thread (every tree made has one).
                let (Some(root), Some(their_root)) = (ours.tree.nodes.first_mut(), nodes.next()) else { continue };
                for (sum, v) in root.inclusive.iter_mut().zip(&their_root.inclusive) {
                    *sum = sum.saturating_add(*v);
                }
                for node in nodes {
                    let parent = if node.parent == 0 { 0 } else { node.parent - 1 + offset };
                    ours.tree.nodes.push(TreeNode { parent, ..node });
                }
            }
        }
    }
    threads.sort_by_key(|t| (t.pid, t.tid));
}

/// Takes out of each still-instrumented function's exclusive time what
/// its throttled callees took after their probes were removed, and what
/// the functions it called that were never instrumented took (a library's),
/// as the samples estimate it (per thread; its calling contexts in
/// proportion to their exclusive time), so that exclusive times add up to
/// what the samples say; and puts that time in the call tree as an
/// estimated node of the callee under each calling context that gave it
/// (a function never instrumented is added to `functions`, sampled), so
/// that the tree adds up too. Returns how many functions gave time back.
fn release_held_time(
    metrics: &[String],
    functions: &mut Vec<FunctionInfo>,
    threads: &mut [ThreadProfile],
    samples: &mut SampleProfile,
) -> u64 {
    let times: Vec<usize> =
        metrics.iter().enumerate().filter(|(_, m)| m.as_str() == "wall_ns" || m.as_str() == "cpu_ns").map(|(i, _)| i).collect();
    let cpu = metrics.iter().position(|m| m == "cpu_ns");
    // By name: a kernel function's ends in `_[k]`, no program's does.
    let mut ids: HashMap<String, u32> = HashMap::new();
    for (i, f) in functions.iter().enumerate() {
        ids.entry(f.name.clone()).or_insert(i as u32);
    }
    let mut givers = HashSet::new();
    // Made for a thread when one of its functions first gives time back: a
    // large program's tree has tens of thousands of contexts (CPython's
    // running a benchmark, 28,000): searched whole for each context given
    // time, they took tens of milliseconds.
    let mut indexes: HashMap<usize, TreeIndex> = HashMap::new();
    let shares = held_shares(cpu, &ids, threads, samples);
    let mut held_samples = std::mem::take(&mut samples.throttled.held);
    for (held, share) in held_samples.iter_mut().zip(shares) {
        let Some(&function) = ids.get(&held.name) else { continue };
        let Some(at) = threads.iter().position(|t| t.tid == held.tid) else { continue };
        let thread = &mut threads[at];
        let ns = share.unwrap_or_else(|| samples.estimated_ns(held.samples));
        let Some(stats) = thread.functions.iter_mut().find(|s| s.function == function) else { continue };
        // The calls its statistics are of.
        let calls = stats.timed_calls();
        let index = indexes.entry(at).or_insert_with(|| TreeIndex::of(&thread.tree));
        let holders: &[usize] = index.holders.get(&function).map_or(&[], Vec::as_slice);
        let nodes = &mut thread.tree.nodes;
        // What each holding context gives back, per metric.
        let mut given = vec![vec![0u64; metrics.len()]; holders.len()];
        for &m in &times {
            let Some(exclusive) = stats.exclusive.get_mut(m) else { continue };
            let taken = take_out(exclusive, calls, ns);
            if cpu.is_none_or(|cpu| cpu == m) {
                held.taken_ns = Some(taken);
            }
            let all: u64 = holders.iter().map(|&i| nodes[i].exclusive.get(m).copied().unwrap_or(0)).sum();
            for (k, &i) in holders.iter().enumerate() {
                if let Some(v) = nodes[i].exclusive.get_mut(m) {
                    let share = (u128::from(taken) * u128::from(*v)).checked_div(u128::from(all)).unwrap_or(0) as u64;
                    *v = v.saturating_sub(share);
                    given[k][m] = share;
                }
            }
        }
        if let Some(callee) = callee_id(held, &mut ids, functions, samples) {
            let holders = holders.to_vec();
            for (&i, time) in holders.iter().zip(&given).filter(|(_, t)| t.iter().any(|&v| v > 0)) {
                index.add_estimated(&mut thread.tree, i as u32, callee, time);
            }
        }
        givers.insert(function);
    }
    samples.throttled.held = held_samples;
    givers.len() as u64
}

/// Per held sample count, the time to take out of its holder's exclusive
/// time, where the holder's own samples tell it better than the held
/// samples' estimate (none elsewhere). The time a holder keeps is what it
/// measured less what it gives: its callees' time estimated from their
/// samples leaves it a difference of two large numbers, which swings by
/// the noise of the larger count. Where its own samples are fewer, its
/// time is estimated from them instead and the rest of what it measured
/// is shared among its callees by their samples: the smaller count's
/// noise, as perf's self samples have it. The rest may also hold time of
/// the holder's that no sample sees (its kernel time where the kernel is
/// not sampled, its callees' probes where their cost is not taken out):
/// the callees get no more than their samples' estimate and twice its
/// spread.
fn held_shares(cpu: Option<usize>, ids: &HashMap<String, u32>, threads: &[ThreadProfile], samples: &SampleProfile) -> Vec<Option<u64>> {
    let held = &samples.throttled.held;
    let Some(cpu) = cpu else { return vec![None; held.len()] };
    let mut holding: HashMap<(i32, &str), u64> = HashMap::new();
    for h in held {
        *holding.entry((h.tid, h.name.as_str())).or_default() += h.samples;
    }
    let kept: HashMap<(i32, &str), u64> = samples.throttled.kept.iter().map(|k| ((k.tid, k.name.as_str()), k.samples)).collect();
    let measured = |tid: i32, name: &str| {
        let function = *ids.get(name)?;
        let thread = threads.iter().find(|t| t.tid == tid)?;
        let stats = thread.functions.iter().find(|s| s.function == function)?;
        Some(stats.exclusive.get(cpu)?.total)
    };
    held.iter()
        .map(|h| {
            let all = holding[&(h.tid, h.name.as_str())];
            let own = kept.get(&(h.tid, h.name.as_str())).copied().unwrap_or(0);
            if own >= all {
                return None;
            }
            let spread = 2.0 * (all as f64).sqrt() * samples.estimated_ns(1) as f64;
            let most = samples.estimated_ns(all).saturating_add(spread as u64);
            let beyond_own = measured(h.tid, &h.name)?.saturating_sub(samples.estimated_ns(own)).min(most);
            Some((u128::from(beyond_own) * u128::from(h.samples) / u128::from(all)) as u64)
        })
        .collect()
}

/// Where a thread's call tree holds each function's measured contexts,
/// and the estimated node of each callee under a context.
struct TreeIndex {
    holders: HashMap<u32, Vec<usize>>,
    estimated: HashMap<(u32, u32), usize>,
}

impl TreeIndex {
    fn of(tree: &CallTree) -> TreeIndex {
        let (mut holders, mut estimated) = (HashMap::<u32, Vec<usize>>::new(), HashMap::new());
        for (i, node) in tree.nodes.iter().enumerate().skip(1) {
            match node.estimated {
                false => holders.entry(node.function).or_default().push(i),
                true => {
                    estimated.entry((node.parent, node.function)).or_insert(i);
                }
            }
        }
        TreeIndex { holders, estimated }
    }

    /// Adds `time` to the estimated node of `callee` under node `parent`,
    /// made when there is none.
    fn add_estimated(&mut self, tree: &mut CallTree, parent: u32, callee: u32, time: &[u64]) {
        let at = *self.estimated.entry((parent, callee)).or_insert_with(|| {
            let zero = vec![0; time.len()];
            tree.nodes.push(TreeNode { function: callee, parent, calls: 0, inclusive: zero.clone(), exclusive: zero, estimated: true });
            tree.nodes.len() - 1
        });
        let node = &mut tree.nodes[at];
        for (values, &t) in [&mut node.inclusive, &mut node.exclusive].into_iter().flat_map(|v| v.iter_mut().zip(time)) {
            *values = values.saturating_add(t);
        }
    }
}

/// Takes up to `ns` out of the exclusive cost `stat` of `calls` calls;
/// returns what it took. The calls' least and largest values stay possible
/// for what is left: the least no more than their average, the largest no
/// more than what the others leave at the least each (with one call, both
/// are the total).
fn take_out(stat: &mut Stat, calls: u64, ns: u64) -> u64 {
    let taken = ns.min(stat.total);
    stat.total -= taken;
    if taken > 0 {
        stat.keep_extremes_within(calls);
    }
    taken
}

/// The function `name`'s id, a sampled function added to `functions`
/// (in the module its samples name) when it is not there yet.
fn callee_id(
    held: &HeldSamples,
    ids: &mut HashMap<String, u32>,
    functions: &mut Vec<FunctionInfo>,
    samples: &SampleProfile,
) -> Option<u32> {
    let name = &held.callee;
    if name.is_empty() {
        return None;
    }
    if let Some(&id) = ids.get(name) {
        return Some(id);
    }
    let of_callee = |f: &&SampledFrame| held.callee_module.is_empty() || f.module == held.callee_module;
    let frame = samples.frames.iter().filter(|f| !f.inlined && &f.name == name).find(of_callee)?;
    let id = functions.len() as u32;
    functions.push(FunctionInfo { name: name.clone(), module: frame.module.clone(), mode: Mode::Sampled, ..FunctionInfo::default() });
    ids.insert(name.clone(), id);
    Some(id)
}

/// `flags` as long as `n`, what it lacks false.
fn fitted(flags: &[bool], n: usize) -> Vec<bool> {
    (0..n).map(|i| flags.get(i).copied().unwrap_or(false)).collect()
}

/// Each function's mode and what saw its calls (of a recording `sampled`
/// or not: without samples, nothing estimates a function's calls after
/// its counting stopped).
fn functions(setup: &Setup, throttled: &[bool], ending: &Ending, sampled: bool) -> Vec<FunctionInfo> {
    let flag = |flags: &[bool], i: usize| flags.get(i).copied().unwrap_or(false);
    let mode = |i: usize| match (flag(throttled, i), flag(&ending.probed, i) || flag(&ending.patched, i)) {
        (true, _) => Mode::Throttled,
        (false, true) => Mode::Instrumented,
        (false, false) => Mode::Sampled,
    };
    let engine = |i: usize, mode: Mode| match mode {
        Mode::Sampled => None,
        _ if flag(&ending.patched, i) => Some(Engine::Inject),
        _ => Some(Engine::Uprobe),
    };
    setup
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mode = mode(i);
            let counted = match mode {
                Mode::Throttled => ending.calls_only_counted.get(i).copied().flatten(),
                _ => None,
            };
            let (calls_after_throttle, calls_counted_until_stopped) =
                if flag(&ending.counting_stopped, i) { (None, counted) } else { (counted, None) };
            let calls_after_counting_unknown = calls_counted_until_stopped.is_some() && !sampled;
            FunctionInfo {
                mode,
                engine: engine(i, mode),
                calls_after_throttle,
                calls_counted_until_stopped,
                calls_after_counting_unknown,
                ..f.clone()
            }
        })
        .collect()
}

/// The calls the governor's notes give each function it changed, as the
/// profile has them: those read when it judged, a moment before the change,
/// fell short by the calls made in that moment (its timed calls, by
/// function, are `calls`).
fn settle_change_counts(notes: &mut [Note], functions: &[FunctionInfo], calls: &[u64]) {
    // A name two modules share (a program's function and a library's) tells neither apart: its count is left as read.
    let mut index: HashMap<&str, Option<usize>> = HashMap::new();
    for (i, f) in functions.iter().enumerate() {
        index.entry(f.name.as_str()).and_modify(|shared| *shared = None).or_insert(Some(i));
    }
    for note in notes.iter_mut() {
        let (changed, timed) = match note {
            Note::Found(Finding::Throttled { functions, .. }) => (functions, true),
            Note::Found(Finding::CountingStopped { functions, .. }) => (functions, false),
            _ => continue,
        };
        for change in changed.iter_mut() {
            let Some(&Some(i)) = index.get(change.name.as_str()) else { continue };
            let settled = if timed { calls.get(i).copied() } else { functions[i].calls_counted_until_stopped };
            change.calls = settled.unwrap_or(change.calls);
        }
    }
}

/// The recording's notes, then what the aggregate shows.
fn notes(setup: &Setup, aggregate: &Aggregate, ending: &Ending) -> Vec<Note> {
    let mut notes = ending.notes.clone();
    let kernel_lost = aggregate.lost.events.saturating_sub(ending.engine_lost);
    let mut found = |finding: Finding| notes.push(finding.into());
    if kernel_lost > 0 {
        found(Finding::HitsLost { hits: kernel_lost });
    }
    if aggregate.unwound_frames > 0 {
        found(Finding::Unwound { calls: aggregate.unwound_frames });
    }
    if aggregate.orphaned_frames > 0 {
        found(Finding::Orphaned { calls: aggregate.orphaned_frames });
    }
    if ending.malformed > 0 {
        found(Finding::Malformed { records: ending.malformed });
    }
    let (pid, attached) = (setup.target.pid, setup.target.attached);
    // A launched program's own exec is its start, not news: named as the
    // program, or as the command (a script, run by its interpreter). The
    // program executing itself again is news to the in-process engine
    // only: its patches go with the image, uprobes stay on the file.
    let starts = [program_name(setup), comm_of(setup.target.command.first().map_or("", String::as_str))];
    let patches_go = ending.engine == Engine::Inject;
    let mut executed: Vec<(i32, &String)> = Vec::new();
    // Sampling alone, no probe is lost to an exec: nothing to say.
    let probed = ending.probed.iter().chain(&ending.patched).any(|&p| p);
    for process in aggregate.processes.iter().filter(|_| probed) {
        for (i, exec) in process.execs.iter().enumerate() {
            let start = process.pid == pid && !attached && i == 0 && starts.contains(exec);
            let again = process.pid == pid && !attached && *exec == starts[0];
            if !start && (!again || patches_go) {
                executed.push((process.pid, exec));
            }
        }
    }
    // A build runs hundreds of programs: one note says so.
    match executed[..] {
        [] => {}
        [(pid, program)] => found(Finding::Executed { pid, program: program.clone() }),
        _ => {
            let mut processes: Vec<i32> = executed.iter().map(|(pid, _)| *pid).collect();
            processes.dedup();
            let mut programs: Vec<String> = executed.iter().map(|(_, program)| (*program).clone()).collect();
            programs.sort();
            programs.dedup();
            found(Finding::ExecutedMany { processes: processes.len() as u64, programs });
        }
    }
    if ending.engine == Engine::Inject && setup.follow_forks {
        // A forked child records once it has handed its memory over, at its
        // first patched call; one that executed another program may have
        // made none.
        let recorded = |child: i32| aggregate.threads.iter().any(|t| t.pid == child);
        let forked: Vec<i32> =
            aggregate.processes.iter().filter(|p| p.pid != pid && p.execs.is_empty() && !recorded(p.pid)).map(|p| p.pid).collect();
        if !forked.is_empty() {
            found(Finding::ForksNotRecorded { pids: forked });
        }
    }
    notes
}

/// The executable's name as the kernel names a process (at most 15 bytes).
fn program_name(setup: &Setup) -> String {
    comm_of(&setup.target.exe)
}

/// The name the kernel gives a process executing `path` (its file name, 15 bytes at most).
fn comm_of(path: &str) -> String {
    let name = std::path::Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.chars().take(15).collect()
}

/// Line counts: entries of each line, plus a function's calls on its
/// declaration line.
fn line_records(
    table: Option<&LineTable>,
    probed: &[(u64, Values)],
    ending: &Ending,
    calls: &[u64],
    metrics: usize,
    throttled: &[bool],
) -> Vec<LineRecord> {
    let Some(table) = table else { return Vec::new() };
    let counted = ending.line_counts.as_deref();
    let mut records: Vec<Option<LineRecord>> = table
        .lines
        .iter()
        .enumerate()
        .map(|(i, (file, line))| {
            if table.unprobed.binary_search(&(i as u32)).is_ok() {
                return None;
            }
            let (probed, cost) = probed.get(i).copied().unwrap_or_default();
            let timed = cost.iter().copied().take(metrics).collect();
            let (count, cost) = match counted.map(|c| c.get(i).copied().flatten()) {
                Some(None) => return None,
                // Counted by edge counters: not timed, unless probes followed it too.
                Some(Some(n)) if probed == 0 => (n, Vec::new()),
                Some(Some(n)) => (n.saturating_add(probed), timed),
                None => (probed, timed),
            };
            let branches = ending.line_branches.get(i).cloned().unwrap_or_default();
            let throttled = throttled.get(i).copied().unwrap_or(false);
            Some(LineRecord { file: file.clone(), line: *line, count, cost, branches, throttled })
        })
        .collect();
    for (function, decl) in table.decl_lines.iter().enumerate() {
        if let (Some(Some(record)), Some(&n)) = (decl.and_then(|d| records.get_mut(d as usize)), calls.get(function)) {
            record.count = record.count.saturating_add(n);
        }
    }
    records.into_iter().flatten().collect()
}

/// By line id, whether probes of a function the governor took out counted
/// it: its entries, its lines and its declaration line (its calls).
fn throttled_lines(setup: &Setup, throttled: &[bool]) -> Vec<bool> {
    let (Some(table), Some(probed)) = (&setup.lines, &setup.aggregation.lines) else { return Vec::new() };
    let mut marked = vec![false; table.lines.len()];
    let gone = |f: u32| throttled.get(f as usize).copied().unwrap_or(false);
    let of_probes = probed.probes.iter().filter(|(f, _)| gone(*f)).flat_map(|(_, lines)| lines.iter().copied());
    let of_entries = (0..probed.entry_lines.len() as u32).filter(|&f| gone(f)).flat_map(|f| {
        let also = probed.entry_also.get(f as usize).into_iter().flatten().copied();
        probed.entry_lines.get(f as usize).copied().into_iter().chain(also)
    });
    let of_calls = table.decl_lines.iter().enumerate().filter(|&(f, _)| gone(f as u32)).filter_map(|(_, &line)| line);
    for line in of_probes.chain(of_entries).chain(of_calls) {
        if let Some(mark) = marked.get_mut(line as usize) {
            *mark = true;
        }
    }
    marked
}

/// Each region with what the line probes saw of it and what the in-process
/// engine's hooks did (each frame is seen by one or the other).
fn region_records(regions: &[RegionSpec], aggregate: &Aggregate, engine: &[(u64, Vec<Stat>)], metrics: usize) -> Vec<RegionRecord> {
    regions
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut entries = 0u64;
            let mut inclusive = vec![Stat::default(); metrics];
            if let Some((n, stats)) = aggregate.regions.get(i) {
                entries = entries.saturating_add(*n);
                inclusive.iter_mut().zip(stats).for_each(|(sum, s)| sum.merge(s));
            }
            if let Some((n, stats)) = engine.get(i) {
                entries = entries.saturating_add(*n);
                inclusive.iter_mut().zip(stats).for_each(|(sum, s)| sum.merge(s));
            }
            RegionRecord { name: spec.name.clone(), file: spec.file.clone(), start: spec.start, end: spec.end, entries, inclusive }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The governor's notes give each function's calls as the profile has
    /// them: the timed ones where its probes went, those counted until its
    /// counting stopped; a name the profile lacks, or has twice, keeps its count.
    #[test]
    fn the_governors_notes_count_calls_as_the_profile_does() {
        let calls = |name: &str, calls| proftap_profile::FunctionCalls { name: name.into(), calls };
        let mut notes: Vec<Note> = vec![
            Finding::Throttled {
                after_ms: 3,
                functions: vec![calls("tiny", 5), calls("gone", 2)],
                budget_percent: 5.0,
                sampled: true,
                counted: true,
            }
            .into(),
            Finding::CountingStopped { after_ms: 4, functions: vec![calls("tiny", 7)], budget_percent: 5.0, sampled: true }.into(),
            Finding::HitsLost { hits: 1 }.into(),
        ];
        let functions = vec![
            FunctionInfo { name: "main".into(), ..FunctionInfo::default() },
            FunctionInfo { name: "tiny".into(), calls_counted_until_stopped: Some(9), ..FunctionInfo::default() },
            FunctionInfo { name: "gone".into(), module: "/lib/a.so".into(), ..FunctionInfo::default() },
            FunctionInfo { name: "gone".into(), module: "/lib/b.so".into(), ..FunctionInfo::default() },
        ];
        settle_change_counts(&mut notes, &functions, &[1, 6, 3, 4]);
        let counts = |note: &Note| match note {
            Note::Found(Finding::Throttled { functions, .. } | Finding::CountingStopped { functions, .. }) => {
                functions.iter().map(|f| (f.name.clone(), f.calls)).collect()
            }
            _ => Vec::new(),
        };
        assert_eq!(counts(&notes[0]), vec![("tiny".to_string(), 6), ("gone".to_string(), 2)]);
        assert_eq!(counts(&notes[1]), vec![("tiny".to_string(), 9)]);
        assert_eq!(notes[2], Finding::HitsLost { hits: 1 }.into());
    }
    use crate::aggregate::Aggregator;
    use proftap_profile::{FunctionStats, KeptSamples, SampledFrame, Stat, Throttled};

    /// Estimated time goes to one node per context and callee, made once;
    /// an estimated node holds no measured context.
    #[test]
    fn estimated_time_goes_to_one_node_per_context_and_callee() {
        let node = |function: u32, parent: u32, estimated: bool| TreeNode {
            function,
            parent,
            calls: u64::from(!estimated),
            inclusive: vec![100],
            exclusive: vec![100],
            estimated,
        };
        // Root; f (1) under it; g (2) under f; f again under g (3); an
        // estimated h under that f (4).
        let mut tree = CallTree {
            nodes: vec![
                node(proftap_profile::ROOT, proftap_profile::ROOT, false),
                node(1, 0, false),
                node(2, 1, false),
                node(1, 2, false),
                node(3, 3, true),
            ],
        };
        let mut index = TreeIndex::of(&tree);
        assert_eq!(index.holders[&1], vec![1, 3]);
        assert!(!index.holders.contains_key(&3), "an estimated node measures no call");
        index.add_estimated(&mut tree, 3, 3, &[5]);
        index.add_estimated(&mut tree, 1, 3, &[7]);
        index.add_estimated(&mut tree, 1, 3, &[1]);
        assert_eq!(tree.nodes.len(), 6, "one node added, for h under the first f");
        assert_eq!((tree.nodes[4].inclusive[0], tree.nodes[4].exclusive[0]), (105, 105));
        assert_eq!(tree.nodes[5], TreeNode { inclusive: vec![8], exclusive: vec![8], ..node(3, 1, true) });
    }

    /// A thread both engines measured keeps one tree: the engine's
    /// contexts join under its root, their parents moved past the probes'
    /// nodes, and its functions are merged in order; a thread only the
    /// engine measured is taken whole.
    #[test]
    fn the_engines_threads_join_the_probes_threads() {
        let node = |function: u32, parent: u32, time: u64| TreeNode {
            function,
            parent,
            calls: 1,
            inclusive: vec![time],
            exclusive: vec![time],
            estimated: false,
        };
        let root = |time: u64| TreeNode { calls: 0, ..node(proftap_profile::ROOT, proftap_profile::ROOT, time) };
        let thread = |tid: i32, functions: &[u32], nodes: Vec<TreeNode>| ThreadProfile {
            pid: 1,
            tid,
            name: String::new(),
            functions: functions.iter().map(|&f| FunctionStats::new(f, 1)).collect(),
            tree: CallTree { nodes },
        };
        // Probes: f (0) in thread 1. Engine: g (1) calling h (2) in thread 1; k (3) in thread 2.
        let mut threads = vec![thread(1, &[0], vec![root(10), node(0, 0, 10)])];
        let engine = vec![thread(2, &[3], vec![root(7), node(3, 0, 7)]), thread(1, &[2, 1], vec![root(5), node(1, 0, 5), node(2, 1, 2)])];
        merge_threads(&mut threads, engine);
        assert_eq!(threads.iter().map(|t| t.tid).collect::<Vec<_>>(), vec![1, 2]);
        let joined = &threads[0];
        assert_eq!(joined.functions.iter().map(|f| f.function).collect::<Vec<_>>(), vec![0, 1, 2]);
        // The root's inclusive time adds up; its own stays the probes' thread's.
        assert_eq!(joined.tree.nodes, vec![TreeNode { inclusive: vec![15], ..root(10) }, node(0, 0, 10), node(1, 0, 5), node(2, 2, 2)]);
        assert_eq!(threads[1].tree.nodes, vec![root(7), node(3, 0, 7)]);
    }

    /// A caller holding 270 ms of callees it no longer times: with 250
    /// samples in them and 5 in its own code, its own time is what its 5
    /// samples say, not 270 ms less the estimate of 250 (which swings by
    /// the noise of 250); the rest is its callees', shared by their samples,
    /// and what each gave is said. With more samples of its own than
    /// held, the held samples' estimate is taken out as before.
    #[test]
    fn a_caller_keeps_what_the_smaller_count_of_samples_says() {
        let ms = 1_000_000;
        let stat = |total: u64| Stat::new(total, total, total);
        let thread = |exclusive: u64| {
            let node = |function: u32, parent: u32, total: u64| TreeNode {
                function,
                parent,
                calls: 1,
                inclusive: vec![total; 2],
                exclusive: vec![total; 2],
                estimated: false,
            };
            ThreadProfile {
                pid: 7,
                tid: 7,
                name: "prog".into(),
                functions: vec![FunctionStats {
                    function: 0,
                    calls: 1,
                    inclusive: vec![stat(exclusive); 2],
                    exclusive: vec![stat(exclusive); 2],
                    ..FunctionStats::default()
                }],
                tree: CallTree { nodes: vec![node(proftap_profile::ROOT, proftap_profile::ROOT, 0), node(0, 0, exclusive)] },
            }
        };
        let held = |callee: &str, samples: u64| HeldSamples {
            tid: 7,
            name: "main".into(),
            callee: callee.into(),
            callee_module: "/bin/prog".into(),
            samples,
            taken_ns: None,
        };
        let sampled = |own: u64, a: u64, b: u64| SampleProfile {
            frequency_hz: 1000,
            frames: ["f", "g"].map(|name| SampledFrame { name: name.into(), module: "/bin/prog".into(), inlined: false }).to_vec(),
            throttled: Throttled {
                held: vec![held("f", a), held("g", b)],
                kept: vec![KeptSamples { tid: 7, name: "main".into(), samples: own }],
                ..Throttled::default()
            },
            ..SampleProfile::default()
        };
        let function = |name: &str| FunctionInfo { name: name.into(), module: "/bin/prog".into(), ..FunctionInfo::default() };
        let metrics = ["wall_ns".to_string(), "cpu_ns".to_string()];
        let release = |samples: &mut SampleProfile, exclusive: u64| {
            let (mut functions, mut threads) = (vec![function("main"), function("f")], vec![thread(exclusive)]);
            assert_eq!(release_held_time(&metrics, &mut functions, &mut threads, samples), 1);
            let thread = threads.remove(0);
            let under_main: Vec<(String, u64)> =
                (thread.tree.nodes.iter().skip(2)).map(|n| (functions[n.function as usize].name.clone(), n.exclusive[1])).collect();
            (thread.functions[0].exclusive[1].total, thread.tree.nodes[1].exclusive[1], under_main)
        };

        let mut few_own = sampled(5, 200, 50);
        let (kept, node_kept, under_main) = release(&mut few_own, 270 * ms);
        assert_eq!((kept, node_kept), (5 * ms, 5 * ms));
        assert_eq!(under_main, vec![("f".to_string(), 212 * ms), ("g".to_string(), 53 * ms)]);
        let taken: Vec<Option<u64>> = few_own.throttled.held.iter().map(|h| h.taken_ns).collect();
        assert_eq!(taken, vec![Some(212 * ms), Some(53 * ms)]);

        // Time no sample saw (its kernel time, unsampled) stays its own
        // beyond the held samples' estimate (4 ms) and twice its spread (4 ms).
        let mut unseen = sampled(0, 2, 2);
        let (kept, _, under_main) = release(&mut unseen, 300 * ms);
        assert_eq!(kept, 292 * ms);
        assert_eq!(under_main, vec![("f".to_string(), 4 * ms), ("g".to_string(), 4 * ms)]);

        let mut most_own = sampled(60, 20, 30);
        let (kept, _, under_main) = release(&mut most_own, 110 * ms);
        assert_eq!(kept, 60 * ms, "110 ms less the 50 held");
        assert_eq!(under_main, vec![("f".to_string(), 20 * ms), ("g".to_string(), 30 * ms)]);
    }

    /// Time taken out of a function's exclusive cost leaves its least and
    /// largest call within what is left.
    #[test]
    fn time_taken_out_keeps_min_and_max_within_the_total() {
        // One call of 211 ms, 204 ms of it estimated in a throttled callee.
        let mut one = Stat::new(211, 211, 211);
        assert_eq!(take_out(&mut one, 1, 204), 204);
        assert_eq!(one, Stat::new(7, 7, 7));
        // Four calls, 10 to 40: 60 taken leaves 40, four calls of 10.
        let mut four = Stat::new(100, 10, 40);
        take_out(&mut four, 4, 60);
        assert_eq!(four, Stat::new(40, 10, 10));
        // 40 taken leaves 60: the least stays 10, the largest at most 60 - 3 x 10.
        let mut more = Stat::new(100, 10, 40);
        take_out(&mut more, 4, 40);
        assert_eq!(more, Stat::new(60, 10, 30));
        // More than there is: all of it, and the rest stays.
        let mut small = Stat::new(5, 2, 3);
        assert_eq!(take_out(&mut small, 2, 9), 5);
        assert_eq!(small, Stat::new(0, 0, 0));
        // Nothing taken: nothing changes.
        let mut kept = Stat::new(5, 2, 3);
        assert_eq!(take_out(&mut kept, 2, 0), 0);
        assert_eq!(kept, Stat::new(5, 2, 3));
    }

    fn setup() -> Setup {
        let function = |name: &str| FunctionInfo { name: name.into(), module: "/bin/prog".into(), ..FunctionInfo::default() };
        Setup {
            aggregation: AggregatorConfig::new(2, 1),
            target: Target { command: vec!["prog".into()], pid: 7, exe: "/bin/prog".into(), ..Target::default() },
            functions: vec![function("main"), function("f")],
            entries: vec![EntryKind::Emulated; 2],
            metrics: vec!["wall_ns".into()],
            lines: None,
            regions: Vec::new(),
            cost: None,
            compensate: false,
            exits: ExitMode::Uretprobe,
            follow_forks: true,
            started_unix_ns: 1,
            started_monotonic_ns: 100,
            sampling: None,
            proftap_version: "0.1.0".into(),
        }
    }

    #[test]
    fn the_lines_a_throttled_functions_probes_counted_are_marked() {
        let mut setup = setup();
        // Lines 0 to 5: main's entry on 0 (also entering 1), its probes on
        // 2 and 3, its declaration 4; f's probe on 3 and 5.
        setup.aggregation.lines = Some(crate::aggregate::LineSetup {
            probes: vec![(0, vec![2]), (0, vec![3]), (1, vec![3, 5])],
            entry_lines: vec![0, crate::aggregate::NO_LINE],
            entry_also: vec![vec![1], Vec::new()],
            lines: 6,
            ..crate::aggregate::LineSetup::default()
        });
        let lines = (0..6).map(|l| ("a.c".to_string(), l)).collect();
        setup.lines = Some(LineTable { lines, decl_lines: vec![Some(4), None], ..LineTable::default() });
        assert_eq!(throttled_lines(&setup, &[true, false]), vec![true, true, true, true, true, false]);
        assert_eq!(throttled_lines(&setup, &[false, true]), vec![false, false, false, true, false, true]);
        assert_eq!(throttled_lines(&setup, &[false, false]), vec![false; 6]);
        // Flags from a hostile saved stream name no line they do not have.
        assert_eq!(throttled_lines(&setup, &[true]), vec![true, true, true, true, true, false]);
    }

    #[test]
    fn modes_engines_and_losses_come_from_the_ending() {
        let setup = setup();
        let aggregate = Aggregator::new(setup.aggregation.clone()).finish();
        let ending = Ending {
            ended_monotonic_ns: 350,
            probed: vec![true, false],
            patched: vec![false, true],
            lost_samples: 4,
            engine: Engine::Inject,
            ..Ending::default()
        };
        let profile = assemble(&setup, aggregate, None, ending);
        assert_eq!(profile.recording.duration_ns, 250);
        assert_eq!((profile.functions[0].engine, profile.functions[1].engine), (Some(Engine::Uprobe), Some(Engine::Inject)));
        assert_eq!(profile.lost.events, 4);
        assert_eq!(profile.notes, vec![Note::from(Finding::HitsLost { hits: 4 })]);
    }
}

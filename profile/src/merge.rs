//! Adding profiles together: runs of the same build of a program.

use crate::model::{
    BranchRecord, FunctionId, FunctionInfo, HeldSamples, LostCount, Mode, Profile, ROOT, SampleProfile, SampledFrame, SampledStack,
    Throttled, ThrottledSamples,
};
use crate::notes::Note;
use std::collections::{HashMap, HashSet};

/// Why two profiles cannot be merged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// Different builds of the program.
    #[error(
        "the profiles are of different builds of {exe} (build-id {ours} and {theirs}); counts of different builds do not add up (--force merges them anyway)"
    )]
    DifferentBuild {
        /// The executable.
        exe: String,
        /// One build-id.
        ours: String,
        /// The other.
        theirs: String,
    },
    /// Different metrics.
    #[error("the profiles measure different metrics ({ours} and {theirs}); record them with the same --metric")]
    DifferentMetrics {
        /// One list.
        ours: String,
        /// The other.
        theirs: String,
    },
}

/// Branches of one line add up in order: runs of one binary list the same
/// jumps; a run whose line lists more adds its extra ones.
fn add_branches(mine: &mut Vec<BranchRecord>, theirs: &[BranchRecord]) {
    for (a, b) in mine.iter_mut().zip(theirs) {
        a.taken = a.taken.saturating_add(b.taken);
        a.not_taken = a.not_taken.saturating_add(b.not_taken);
    }
    if theirs.len() > mine.len() {
        mine.extend_from_slice(&theirs[mine.len()..]);
    }
}

impl Profile {
    /// Adds `other` to this profile: calls, costs, line counts and runs add
    /// up (saturating: a sum past `u64::MAX` stays there), minimums and
    /// maximums combine, threads and trees are kept; traces are dropped.
    pub fn merge(&mut self, other: &Profile, force: bool) -> Result<(), MergeError> {
        if let (Some(ours), Some(theirs)) = (&self.target.build_id, &other.target.build_id)
            && ours != theirs
            && !force
        {
            return Err(MergeError::DifferentBuild { exe: self.target.exe.clone(), ours: ours.clone(), theirs: theirs.clone() });
        }
        if self.metrics != other.metrics {
            return Err(MergeError::DifferentMetrics { ours: self.metrics.join(","), theirs: other.metrics.join(",") });
        }
        let remap = self.merge_functions(other);
        let map = |id: FunctionId| if id == ROOT { ROOT } else { remap.get(id as usize).copied().unwrap_or(id) };
        for thread in &other.threads {
            let mut thread = thread.clone();
            for f in &mut thread.functions {
                f.function = map(f.function);
            }
            for node in &mut thread.tree.nodes {
                node.function = map(node.function);
            }
            self.threads.push(thread);
        }
        self.merge_lines(other);
        self.merge_regions(other);
        match (&mut self.samples, &other.samples) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => self.samples = Some(theirs.clone()),
            _ => {}
        }
        // Runs do not share a clock: their timelines cannot be one.
        self.trace = None;
        add_counts(&mut self.lost.by_thread, &other.lost.by_thread, |id| id);
        add_counts(&mut self.lost.by_function, &other.lost.by_function, |id| i64::from(map(id as FunctionId)));
        self.merge_totals(other);
        Ok(())
    }

    /// Adds `other`'s functions not already here and returns where each of
    /// its ids went. The same function (module, name, address) keeps one
    /// id; it is exact only if exact in every run that instrumented it.
    fn merge_functions(&mut self, other: &Profile) -> Vec<FunctionId> {
        let known_before = self.functions.len();
        let mut ids: HashMap<(String, String, u64), FunctionId> =
            self.functions.iter().enumerate().map(|(i, f)| ((f.module.clone(), f.name.clone(), f.address), i as FunctionId)).collect();
        let remap: Vec<FunctionId> = other
            .functions
            .iter()
            .map(|f| {
                *ids.entry((f.module.clone(), f.name.clone(), f.address)).or_insert_with(|| {
                    self.functions.push(f.clone());
                    (self.functions.len() - 1) as FunctionId
                })
            })
            .collect();
        // Those just added are theirs as they are.
        for (theirs, &id) in other.functions.iter().zip(&remap).filter(|&(_, &id)| (id as usize) < known_before) {
            let mine = &mut self.functions[id as usize];
            let (after, until) = merged_counts(mine, theirs);
            mine.mode = match (mine.mode, theirs.mode) {
                (Mode::Sampled, m) | (m, Mode::Sampled) => m,
                (Mode::Throttled, _) | (_, Mode::Throttled) => Mode::Throttled,
                _ => Mode::Instrumented,
            };
            let throttled = mine.mode == Mode::Throttled;
            mine.calls_after_throttle = after.filter(|_| throttled);
            mine.calls_counted_until_stopped = until.filter(|_| throttled);
            // One run's calls after its counting stopped unknown: the sum's are too.
            mine.calls_after_counting_unknown =
                (mine.calls_after_counting_unknown || theirs.calls_after_counting_unknown) && until.is_some();
        }
        remap
    }

    /// Lines add up by file and line.
    fn merge_lines(&mut self, other: &Profile) {
        let mut lines: HashMap<(String, u32), usize> = self.lines.iter().enumerate().map(|(i, l)| ((l.file.clone(), l.line), i)).collect();
        for line in &other.lines {
            match lines.get(&(line.file.clone(), line.line)) {
                Some(&i) => {
                    let mine = &mut self.lines[i];
                    mine.count = mine.count.saturating_add(line.count);
                    // Timed in either run: the times add up (untimed adds none).
                    if mine.cost.is_empty() {
                        mine.cost = vec![0; line.cost.len()];
                    }
                    for (a, b) in mine.cost.iter_mut().zip(&line.cost) {
                        *a = a.saturating_add(*b);
                    }
                    add_branches(&mut mine.branches, &line.branches);
                    mine.throttled |= line.throttled;
                }
                None => {
                    lines.insert((line.file.clone(), line.line), self.lines.len());
                    self.lines.push(line.clone());
                }
            }
        }
        self.lines.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    }

    /// Regions add up by name and position.
    fn merge_regions(&mut self, other: &Profile) {
        let mut regions: HashMap<(String, String, u32, u32), usize> =
            self.regions.iter().enumerate().rev().map(|(i, r)| ((r.name.clone(), r.file.clone(), r.start, r.end), i)).collect();
        for region in &other.regions {
            let key = (region.name.clone(), region.file.clone(), region.start, region.end);
            match regions.get(&key) {
                Some(&i) => {
                    let mine = &mut self.regions[i];
                    mine.entries = mine.entries.saturating_add(region.entries);
                    for (a, b) in mine.inclusive.iter_mut().zip(&region.inclusive) {
                        a.merge(b);
                    }
                }
                None => {
                    regions.insert(key, self.regions.len());
                    self.regions.push(region.clone());
                }
            }
        }
    }

    /// Lost data, overhead, the recording's totals, processes, notes, runs.
    fn merge_totals(&mut self, other: &Profile) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.lost.events, other.lost.events);
        add(&mut self.lost.unmatched_returns, other.lost.unmatched_returns);
        add(&mut self.overhead.hits, other.overhead.hits);
        add(&mut self.overhead.estimated_ns, other.overhead.estimated_ns);
        self.overhead.per_hit_ns = self.overhead.estimated_ns.checked_div(self.overhead.hits).unwrap_or(0);
        add(&mut self.recording.events, other.recording.events);
        add(&mut self.recording.duration_ns, other.recording.duration_ns);
        self.recording.peak_events_per_second = self.recording.peak_events_per_second.max(other.recording.peak_events_per_second);
        self.processes.extend(other.processes.iter().cloned());
        // Notes are alike when their JSON is.
        let key = |note: &Note| serde_json::to_string(note).unwrap_or_default();
        let mut notes: HashSet<String> = self.notes.iter().map(key).collect();
        for note in &other.notes {
            if notes.insert(key(note)) {
                self.notes.push(note.clone());
            }
        }
        self.runs = self.runs.saturating_add(other.runs.max(1));
    }
}

impl SampleProfile {
    /// Adds `other`'s samples: stacks of the same frames add up.
    pub fn merge(&mut self, other: &SampleProfile) {
        self.throttled.merge(&other.throttled);
        let mut frames: HashMap<SampledFrame, u32> = self.frames.iter().cloned().enumerate().map(|(i, f)| (f, i as u32)).collect();
        let remap: Vec<u32> = other
            .frames
            .iter()
            .map(|f| {
                *frames.entry(f.clone()).or_insert_with(|| {
                    self.frames.push(f.clone());
                    (self.frames.len() - 1) as u32
                })
            })
            .collect();
        let mut stacks: HashMap<Vec<u32>, usize> = self.stacks.iter().enumerate().map(|(i, s)| (s.frames.clone(), i)).collect();
        for stack in &other.stacks {
            let key: Vec<u32> = stack.frames.iter().map(|&f| remap.get(f as usize).copied().unwrap_or(f)).collect();
            match stacks.get(&key) {
                Some(&i) => self.stacks[i].count = self.stacks[i].count.saturating_add(stack.count),
                None => {
                    stacks.insert(key.clone(), self.stacks.len());
                    self.stacks.push(SampledStack { frames: key, count: stack.count });
                }
            }
        }
        let mut lines: HashMap<(String, u32), usize> =
            self.lines.iter().enumerate().rev().map(|(i, l)| ((l.file.clone(), l.line), i)).collect();
        for line in &other.lines {
            let key = (line.file.clone(), line.line);
            match lines.get(&key) {
                Some(&i) => self.lines[i].count = self.lines[i].count.saturating_add(line.count),
                None => {
                    lines.insert(key, self.lines.len());
                    self.lines.push(line.clone());
                }
            }
        }
        self.total = self.total.saturating_add(other.total);
        self.in_counting_stubs = self.in_counting_stubs.saturating_add(other.in_counting_stubs);
        self.on_every_cpu &= other.on_every_cpu;
        if self.event.is_empty() {
            self.event.clone_from(&other.event);
        }
        self.frequency_hz = self.frequency_hz.max(other.frequency_hz);
    }
}

fn add_counts(ours: &mut Vec<LostCount>, theirs: &[LostCount], map: impl Fn(i64) -> i64) {
    let mut index: HashMap<i64, usize> = ours.iter().enumerate().rev().map(|(i, c)| (c.id, i)).collect();
    for count in theirs {
        let id = map(count.id);
        match index.get(&id) {
            Some(&i) => ours[i].count = ours[i].count.saturating_add(count.count),
            None => {
                index.insert(id, ours.len());
                ours.push(LostCount { id, count: count.count });
            }
        }
    }
}

/// The calls two runs counted after a function's throttle: counted to
/// the end in all only if every run that throttled it counted them to the
/// end; counted until counting stopped where one stopped and every other
/// counted (the samples since counting stopped, of the runs that stopped,
/// estimate the rest); neither where a run did not count them at all (all
/// its samples since the throttle estimate them).
fn merged_counts(mine: &FunctionInfo, theirs: &FunctionInfo) -> (Option<u64>, Option<u64>) {
    enum Counted {
        ToTheEnd(u64),
        UntilStopped(u64),
        Not,
    }
    let counted = |f: &FunctionInfo| match (f.mode, f.calls_after_throttle, f.calls_counted_until_stopped) {
        (Mode::Throttled, Some(calls), _) => Counted::ToTheEnd(calls),
        (Mode::Throttled, None, Some(calls)) => Counted::UntilStopped(calls),
        (Mode::Throttled, None, None) => Counted::Not,
        _ => Counted::ToTheEnd(0),
    };
    match (counted(mine), counted(theirs)) {
        (Counted::Not, _) | (_, Counted::Not) => (None, None),
        (Counted::ToTheEnd(a), Counted::ToTheEnd(b)) => (Some(a.saturating_add(b)), None),
        (Counted::ToTheEnd(a) | Counted::UntilStopped(a), Counted::ToTheEnd(b) | Counted::UntilStopped(b)) => {
            (None, Some(a.saturating_add(b)))
        }
    }
}

impl Throttled {
    /// Adds `other`'s: the same function's (the same caller's in the same thread) add up.
    fn merge(&mut self, other: &Throttled) {
        merge_by_function(&mut self.functions, &other.functions);
        merge_by_function(&mut self.untimed, &other.untimed);
        let key = |h: &HeldSamples| (h.tid, h.name.clone(), h.callee.clone(), h.callee_module.clone());
        let mut held: HashMap<(i32, String, String, String), usize> = self.held.iter().enumerate().map(|(i, h)| (key(h), i)).collect();
        for theirs in &other.held {
            let key = key(theirs);
            match held.get(&key) {
                Some(&i) => {
                    let ours = &mut self.held[i];
                    ours.samples = ours.samples.saturating_add(theirs.samples);
                    // Known in both, or estimated from the samples in both.
                    ours.taken_ns = ours.taken_ns.zip(theirs.taken_ns).map(|(a, b)| a.saturating_add(b));
                }
                None => {
                    held.insert(key, self.held.len());
                    self.held.push(theirs.clone());
                }
            }
        }
        let mut kept: HashMap<(i32, String), usize> = self.kept.iter().enumerate().map(|(i, k)| ((k.tid, k.name.clone()), i)).collect();
        for theirs in &other.kept {
            match kept.get(&(theirs.tid, theirs.name.clone())) {
                Some(&i) => self.kept[i].samples = self.kept[i].samples.saturating_add(theirs.samples),
                None => {
                    kept.insert((theirs.tid, theirs.name.clone()), self.kept.len());
                    self.kept.push(theirs.clone());
                }
            }
        }
    }
}

/// Adds `theirs` samples to `ours`, function by function.
fn merge_by_function(ours: &mut Vec<ThrottledSamples>, theirs: &[ThrottledSamples]) {
    let mut index: HashMap<String, usize> = ours.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    for t in theirs {
        match index.get(&t.name) {
            Some(&i) => {
                let o = &mut ours[i];
                o.self_samples = o.self_samples.saturating_add(t.self_samples);
                o.total_samples = o.total_samples.saturating_add(t.total_samples);
                o.total_samples_uncounted = o.total_samples_uncounted.saturating_add(t.total_samples_uncounted);
                o.counting_samples = o.counting_samples.saturating_add(t.counting_samples);
            }
            None => {
                index.insert(t.name.clone(), ours.len());
                ours.push(t.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallTree, FunctionInfo, FunctionStats, KeptSamples, LineRecord, Target, ThreadProfile};
    use crate::stats::Stat;

    fn profile(build: &str, function: &str, calls: u64, line_count: u64) -> Profile {
        let mut stats = FunctionStats::new(0, 1);
        stats.calls = calls;
        stats.inclusive[0] = Stat::new(calls.saturating_mul(10), 10, 10);
        Profile {
            target: Target { exe: "/bin/prog".into(), build_id: Some(build.into()), ..Target::default() },
            metrics: vec!["wall_ns".into()],
            functions: vec![FunctionInfo { name: function.into(), module: "/bin/prog".into(), ..FunctionInfo::default() }],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: "prog".into(), functions: vec![stats], tree: CallTree::new(1) }],
            lines: vec![LineRecord {
                file: "a.c".into(),
                line: 3,
                count: line_count,
                cost: vec![5],
                branches: Vec::new(),
                throttled: false,
            }],
            runs: 1,
            ..Profile::default()
        }
    }

    #[test]
    fn runs_of_one_build_add_up() {
        let mut a = profile("abc", "f", 2, 7);
        a.merge(&profile("abc", "f", 3, 1), false).expect("same build");
        a.merge(&profile("abc", "g", 1, 0), false).expect("same build");
        assert_eq!(a.runs, 3);
        assert_eq!(a.functions.len(), 2);
        let merged = a.merged_functions();
        assert_eq!(merged[0].calls, 5);
        assert_eq!(merged[0].inclusive[0], Stat::new(50, 10, 10));
        assert_eq!(merged[1].calls, 1);
        assert_eq!(
            a.lines,
            vec![LineRecord { file: "a.c".into(), line: 3, count: 8, cost: vec![15], branches: Vec::new(), throttled: false }]
        );
    }

    /// Calls counted after a throttle add up; where a run that throttled
    /// the function did not count them, the sum is not counted in all.
    #[test]
    fn calls_counted_after_a_throttle_add_up_only_if_every_throttling_run_counted() {
        let throttled = |after: Option<u64>| {
            let mut p = profile("abc", "f", 2, 0);
            p.functions[0].mode = Mode::Throttled;
            p.functions[0].calls_after_throttle = after;
            p
        };
        let mut a = throttled(Some(10));
        a.merge(&throttled(Some(5)), false).expect("same build");
        a.merge(&profile("abc", "f", 3, 0), false).expect("same build");
        assert_eq!((a.functions[0].mode, a.functions[0].calls_after_throttle), (Mode::Throttled, Some(15)));
        // A run that stopped counting adds what it counted, and the rest
        // of its calls are estimated from its samples.
        let mut stopped = throttled(None);
        stopped.functions[0].calls_counted_until_stopped = Some(4);
        let counts = |p: &Profile| (p.functions[0].calls_after_throttle, p.functions[0].calls_counted_until_stopped);
        a.merge(&stopped, false).expect("same build");
        assert_eq!(counts(&a), (None, Some(19)));
        a.merge(&throttled(Some(1)), false).expect("same build");
        assert_eq!(counts(&a), (None, Some(20)));
        assert!(!a.functions[0].calls_after_counting_unknown);
        // A run without samples that stopped counting: nothing estimates
        // its calls since, so neither are the merged run's all estimated.
        let mut unsampled = throttled(None);
        unsampled.functions[0].calls_counted_until_stopped = Some(2);
        unsampled.functions[0].calls_after_counting_unknown = true;
        let mut c = a.clone();
        c.merge(&unsampled, false).expect("same build");
        assert_eq!(counts(&c), (None, Some(22)));
        assert!(c.functions[0].calls_after_counting_unknown);
        a.merge(&profile("abc", "f", 3, 0), false).expect("same build");
        assert_eq!(counts(&a), (None, Some(20)), "a run that did not throttle it adds no calls after");
        a.merge(&throttled(None), false).expect("same build");
        assert_eq!(counts(&a), (None, None));
        // A function new to the merge keeps its own.
        let mut b = profile("abc", "g", 1, 0);
        b.merge(&throttled(Some(7)), false).expect("same build");
        assert_eq!(b.functions[1].calls_after_throttle, Some(7));
    }

    #[test]
    fn a_line_counted_short_in_either_run_stays_marked() {
        let mut a = profile("abc", "f", 1, 1);
        let mut b = profile("abc", "f", 1, 2);
        b.lines[0].throttled = true;
        a.merge(&b, false).expect("same build");
        assert!(a.lines[0].throttled && a.lines[0].count == 3, "{:?}", a.lines);
    }

    #[test]
    fn branches_of_a_line_add_up_in_order() {
        let jump = |taken, not_taken| BranchRecord { taken, not_taken };
        let mut a = profile("abc", "f", 1, 1);
        a.lines[0].branches = vec![jump(1, 2)];
        let mut b = profile("abc", "f", 1, 1);
        b.lines[0].branches = vec![jump(10, 20), jump(u64::MAX, 5)];
        a.merge(&b, false).expect("same build");
        assert_eq!(a.lines[0].branches, [jump(11, 22), jump(u64::MAX, 5)]);
        a.merge(&b, false).expect("same build");
        assert_eq!(a.lines[0].branches, [jump(21, 42), jump(u64::MAX, 10)]);
    }

    #[test]
    fn sums_past_u64_max_saturate() {
        let mut a = profile("abc", "f", u64::MAX - 1, u64::MAX);
        a.runs = u32::MAX;
        a.lost.events = u64::MAX;
        a.lost.by_function.push(LostCount { id: 0, count: u64::MAX });
        let mut b = a.clone();
        b.regions.push(crate::model::RegionRecord { name: "r".into(), entries: u64::MAX, ..Default::default() });
        a.regions = b.regions.clone();
        a.merge(&b, false).expect("same build");
        assert_eq!(a.merged_functions()[0].calls, u64::MAX);
        assert_eq!(a.total_calls(), u64::MAX);
        assert_eq!((a.lines[0].count, a.regions[0].entries, a.lost.events), (u64::MAX, u64::MAX, u64::MAX));
        assert_eq!((a.lost.by_function[0].count, a.runs), (u64::MAX, u32::MAX));
    }

    #[test]
    fn different_builds_and_metrics_are_refused() {
        let mut a = profile("abc", "f", 1, 1);
        let err = a.merge(&profile("def", "f", 1, 1), false).expect_err("different builds");
        assert!(err.to_string().contains("different builds of /bin/prog"), "{err}");
        a.merge(&profile("def", "f", 1, 1), true).expect("forced");
        let mut other = profile("abc", "f", 1, 1);
        other.metrics = vec!["cpu_ns".into()];
        assert!(matches!(a.merge(&other, false), Err(MergeError::DifferentMetrics { .. })));
    }

    #[test]
    fn samples_and_modes_combine() {
        let frame = |name: &str| SampledFrame { name: name.into(), module: "/bin/prog".into(), inlined: false };
        let samples = |frames: Vec<SampledFrame>, stacks: Vec<(Vec<u32>, u64)>| SampleProfile {
            event: "cpu-clock".into(),
            frequency_hz: 1000,
            total: stacks.iter().map(|s| s.1).sum(),
            frames,
            stacks: stacks.into_iter().map(|(frames, count)| SampledStack { frames, count }).collect(),
            lines: Vec::new(),
            throttled: Default::default(),
            in_counting_stubs: 1,
            on_every_cpu: true,
        };
        let mut a = profile("abc", "f", 1, 1);
        a.samples = Some(samples(vec![frame("main"), frame("f")], vec![(vec![0, 1], 3), (vec![0], 1)]));
        let untimed =
            |name: &str, own, total| ThrottledSamples { name: name.into(), self_samples: own, total_samples: total, ..Default::default() };
        a.samples.as_mut().unwrap().throttled.untimed = vec![untimed("main", 0, 3), untimed("f", 2, 2)];
        let mut b = profile("abc", "f", 1, 1);
        b.functions[0].mode = Mode::Throttled;
        // The same frames in another order, and a new one.
        b.samples = Some(samples(vec![frame("f"), frame("main"), frame("g")], vec![(vec![1, 0], 2), (vec![1, 2], 5)]));
        b.samples.as_mut().unwrap().throttled.untimed = vec![untimed("main", 1, 7)];
        // Sampled on each thread: the merge is not all on every CPU.
        b.samples.as_mut().unwrap().on_every_cpu = false;
        a.merge(&b, false).expect("same build");
        let merged = a.samples.as_ref().expect("samples");
        // Samples of calls no probe timed add up function by function.
        assert_eq!(merged.throttled.untimed, vec![untimed("main", 1, 10), untimed("f", 2, 2)]);
        assert_eq!(merged.total, 11);
        assert_eq!(merged.in_counting_stubs, 2);
        assert!(!merged.on_every_cpu);
        assert_eq!(merged.frames.len(), 3);
        let count = |names: &[&str]| {
            merged
                .stacks
                .iter()
                .find(|s| s.frames.iter().map(|&f| merged.frames[f as usize].name.as_str()).eq(names.iter().copied()))
                .map(|s| s.count)
        };
        assert_eq!(count(&["main", "f"]), Some(5));
        assert_eq!(count(&["main"]), Some(1));
        assert_eq!(count(&["main", "g"]), Some(5));
        // Throttled in one run: its calls are a lower bound in the sum too.
        assert_eq!(a.functions[0].mode, Mode::Throttled);
    }

    /// What callers held and kept adds up by thread and caller (and
    /// callee); the time given back is known in the sum only if it was in
    /// both runs.
    #[test]
    fn held_and_kept_samples_add_up() {
        let held = |callee: &str, samples, taken_ns| HeldSamples {
            tid: 7,
            name: "main".into(),
            callee: callee.into(),
            callee_module: "/bin/prog".into(),
            samples,
            taken_ns,
        };
        let kept = |tid, samples| KeptSamples { tid, name: "main".into(), samples };
        let mut a = Throttled { held: vec![held("f", 2, Some(5)), held("g", 1, None)], kept: vec![kept(7, 3)], ..Throttled::default() };
        let b = Throttled {
            held: vec![held("g", 4, Some(1)), held("f", 1, Some(2))],
            kept: vec![kept(8, 1), kept(7, 2)],
            ..Throttled::default()
        };
        a.merge(&b);
        assert_eq!(a.held, vec![held("f", 3, Some(7)), held("g", 5, None)]);
        assert_eq!(a.kept, vec![kept(7, 5), kept(8, 1)]);
    }
}

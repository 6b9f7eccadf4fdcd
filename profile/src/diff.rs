//! Comparing profiles of a program: which functions, regions and lines
//! cost more per call than before, and by how much.
//!
//! Every function and region in both is judged, whatever its number of
//! calls, by the evidence there is:
//!
//! - **Several runs a side**: each run gives one value, for times its
//!   fastest call (`fastest_too`; else, and for counters, its average per
//!   call); the change is the Hodges-Lehmann ratio of the two sets with its
//!   confidence interval (a Mann-Whitney test, [`crate::ranks`]). It counts
//!   when the interval excludes 1 and the estimate is past the threshold.
//!   The fastest call, because noise on a shared machine only ever adds
//!   time: a run whose machine was busy is slower on average by tens of
//!   percent, while its fastest call moves little (Chen and Revels,
//!   "Robust benchmarking in noisy environments", 2016).
//! - **One run a side, many calls** (at least `many_calls` on both): the
//!   average per call grew past the threshold, and so did the fastest call
//!   (`fastest_too`): on a shared machine, preemption and cold caches
//!   lengthen some calls and move the average, but not the fastest call.
//! - **One run a side, few calls**: the calls are compared one by one:
//!   every new call is slower than the slowest old call by more than the
//!   threshold (or faster than the fastest by as much).
//!
//! In every case the growth per call must be above the floor (for times,
//! what one probed call costs the engine that recorded the function: below
//! that the probes vary more than the function), and the growth over all
//! calls at least `min_share` of the new run's instrumented total (a
//! function that costs next to nothing cannot slow the program down).
//!
//! Functions are matched by name and module file name, so profiles of
//! different builds of a program compare; profiles of different programs
//! are refused unless forced.

use crate::model::{Engine, FunctionInfo, Mode, Profile};
use crate::ranks::{Ratio, ratio};
use std::collections::HashMap;

/// How to compare.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// Growth of the average per call, as a fraction (0.1: 10%), past which a
    /// function regressed.
    pub threshold: f64,
    /// Fewest calls in each of two single runs for their averages to be
    /// compared; below it, calls are compared one by one.
    pub many_calls: u64,
    /// Smallest growth per call that counts, in the metric's unit; `None`:
    /// for time metrics, what one probed call costs the function's engine;
    /// 1 for counters.
    pub floor_per_call: Option<u64>,
    /// Smallest growth over all calls, as a fraction of the new profile's
    /// instrumented total, that counts.
    pub min_share: f64,
    /// With many calls in single runs, the fastest call must have grown
    /// past the threshold as well.
    pub fastest_too: bool,
    /// Confidence of the interval over repeated runs (0.95: 95%).
    pub confidence: f64,
    /// Compare profiles of different programs.
    pub force: bool,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            threshold: 0.10,
            many_calls: 10,
            floor_per_call: None,
            min_share: 0.01,
            fastest_too: true,
            confidence: 0.95,
            force: false,
        }
    }
}

/// The verdict on one function (or region).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Costs more per call, past every noise guard.
    Regressed,
    /// Costs less per call, past the same guards.
    Improved,
    /// Within the threshold or the noise guards.
    Unchanged,
    /// Only in the new profile.
    New,
    /// Only in the base profile.
    Gone,
}

/// Why a function got its verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Not in the base profiles.
    OnlyNew,
    /// Not in the new profiles.
    OnlyBase,
    /// The change per call is within the threshold.
    WithinThreshold,
    /// The change per call is below the floor (the probes' own noise).
    BelowFloor,
    /// The change over all calls is below the share of the run that counts.
    SmallShare,
    /// Many calls: the average moved past the threshold, the fastest call did not.
    FastestSteady,
    /// Many calls: the average and the fastest call both moved past the threshold.
    AverageAndFastest,
    /// Many calls, judged on the average alone (`fastest_too` off).
    Average,
    /// Few calls: some calls of one side are within the threshold of the other's.
    CallsOverlap,
    /// Few calls: every call of one side is past every call of the other.
    EveryCall,
    /// Repeated runs: the interval of the ratio includes 1.
    RunsOverlap,
    /// Repeated runs: the interval of the ratio excludes 1.
    RunsDiffer,
    /// Repeated runs: it was called in too few runs for an interval at the confidence asked.
    TooFewRuns,
}

/// One function or region in both sides.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Change {
    /// Function name, or region name.
    pub name: String,
    /// Calls (entries for a region) in the base and the new profile (over
    /// repeated runs: the median run's).
    pub calls: (u64, u64),
    /// Average inclusive cost per call in each (over repeated runs: the
    /// median of the runs' averages).
    pub avg: (u64, u64),
    /// Inclusive cost of the fastest call in each (over all runs).
    pub fastest: (u64, u64),
    /// Inclusive cost of the slowest call in each (over all runs).
    pub slowest: (u64, u64),
    /// Total exclusive cost in each (0 for regions; over repeated runs, the median run's).
    pub exclusive: (u64, u64),
    /// Growth of the average per call, in percent (None without a base).
    pub change_pct: Option<f64>,
    /// Over repeated runs: the ratio of new to base per call, with its interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<Ratio>,
    /// The growth per call below which a change was noise, in the metric's unit.
    pub floor: u64,
    /// What it amounts to.
    pub verdict: Verdict,
    /// Why.
    pub reason: Reason,
}

/// A source line whose count differs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LineChange {
    /// Source file.
    pub file: String,
    /// Line.
    pub line: u32,
    /// Its count in each profile.
    pub count: (u64, u64),
}

/// The comparison.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Diff {
    /// The metric compared.
    pub metric: String,
    /// Profiles on each side.
    pub runs: (usize, usize),
    /// Confidence of the intervals (repeated runs).
    pub confidence: f64,
    /// The executables compared.
    pub programs: (String, String),
    /// Their build-ids, when they differ (another build of the program).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builds: Option<(String, String)>,
    /// The growth over all calls that counted as noise.
    pub floor_total: u64,
    /// Functions, the largest growth of total cost first.
    pub functions: Vec<Change>,
    /// Regions.
    pub regions: Vec<Change>,
    /// Lines whose counts differ (first profile of each side, when both have lines).
    pub lines: Vec<LineChange>,
}

impl Diff {
    /// Whether anything regressed.
    pub fn regressed(&self) -> bool {
        self.functions.iter().chain(&self.regions).any(|c| c.verdict == Verdict::Regressed)
    }
}

/// Why profiles cannot be compared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiffError {
    /// The metric is missing from one of them.
    #[error("the {which} profile has no metric '{metric}' (it has {has})")]
    MissingMetric {
        /// "base" or "new".
        which: &'static str,
        /// The metric.
        metric: String,
        /// What it has.
        has: String,
    },
    /// They profile different programs.
    #[error("the profiles are of different programs ({first} and {second}); compare them anyway with --force")]
    DifferentPrograms {
        /// One executable.
        first: String,
        /// Another.
        second: String,
    },
    /// A side has no profile.
    #[error("each side of a comparison needs at least one profile")]
    NoProfiles,
}

/// A function's name, with its module's file name when that is not the executable.
fn key(profile: &Profile, f: &FunctionInfo) -> String {
    if f.module == profile.target.exe { f.name.clone() } else { format!("{} ({})", f.name, file_name(&f.module)) }
}

fn file_name(path: &str) -> String {
    std::path::Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// What a function or region cost in one run.
#[derive(Clone, Copy, Default)]
struct Cost {
    calls: u64,
    /// Over every call, nested ones too (see [`crate::stats::Stat::nested`]).
    inclusive: u64,
    fastest: u64,
    slowest: u64,
    exclusive: u64,
    /// What one probed call costs the engine that saw it, in the metric.
    probe: u64,
}

impl Cost {
    /// `calls` calls of inclusive cost `inclusive`.
    fn new(calls: u64, inclusive: Option<&crate::stats::Stat>, exclusive: u64, probe: u64) -> Cost {
        let inclusive = inclusive.copied().unwrap_or_default();
        // Every call's, nested ones too, as the report averages them.
        Cost { calls, inclusive: inclusive.every_call(), fastest: inclusive.min_or_zero(), slowest: inclusive.max, exclusive, probe }
    }

    fn average(&self) -> u64 {
        self.inclusive.checked_div(self.calls).unwrap_or(0)
    }
}

/// The calibrated cost of one probed call on `engine`, for metric `key`.
fn probe_cost(profile: &Profile, engine: Engine, key: &str) -> u64 {
    let o = &profile.overhead;
    match (key, engine) {
        ("wall_ns" | "cpu_ns", Engine::Inject) => o.call_ns_injected,
        ("wall_ns", Engine::Uprobe) => o.call_ns_emulated.max(o.call_ns_stepped),
        ("cpu_ns", Engine::Uprobe) => o.call_cpu_ns,
        _ => 1,
    }
}

/// Per function (instrumented at some point): its cost in one profile.
fn function_costs(profile: &Profile, m: usize, metric: &str) -> HashMap<String, Cost> {
    profile
        .merged_functions()
        .iter()
        .filter_map(|s| {
            let info = profile.functions.get(s.function as usize)?;
            (info.mode != Mode::Sampled).then(|| {
                let probe = probe_cost(profile, info.engine.unwrap_or(profile.recording.engine), metric);
                let exclusive = s.exclusive.get(m).map_or(0, |x| x.total);
                (key(profile, info), Cost::new(s.timed_calls(), s.inclusive.get(m), exclusive, probe))
            })
        })
        .collect()
}

/// Per region: its cost in one profile (regions are timed by uprobes).
fn region_costs(profile: &Profile, m: usize, key: &str) -> HashMap<String, Cost> {
    profile
        .regions
        .iter()
        .map(|r| (r.name.clone(), Cost::new(r.entries, r.inclusive.get(m), 0, probe_cost(profile, Engine::Uprobe, key))))
        .collect()
}

/// Compares `new` with `base` on metric `metric_key`.
pub fn diff(base: &Profile, new: &Profile, metric_key: &str, options: &DiffOptions) -> Result<Diff, DiffError> {
    diff_runs(std::slice::from_ref(base), std::slice::from_ref(new), metric_key, options)
}

/// Compares runs of the new build with runs of the base build.
pub fn diff_runs(base: &[Profile], new: &[Profile], metric_key: &str, options: &DiffOptions) -> Result<Diff, DiffError> {
    let (Some(first), Some(last)) = (base.first(), new.first()) else {
        return Err(DiffError::NoProfiles);
    };
    if !options.force {
        let program = |p: &Profile| file_name(&p.target.exe);
        if let Some(other) = base.iter().chain(new).find(|p| program(p) != program(first)) {
            return Err(DiffError::DifferentPrograms { first: first.target.exe.clone(), second: other.target.exe.clone() });
        }
    }
    let index = |p: &Profile, which| {
        p.metrics.iter().position(|k| k == metric_key).ok_or_else(|| DiffError::MissingMetric {
            which,
            metric: metric_key.to_string(),
            has: p.metrics.join(", "),
        })
    };
    let side = |profiles: &[Profile], which| {
        let mut side = Side::default();
        for p in profiles {
            let m = index(p, which)?;
            side.add(function_costs(p, m, metric_key), region_costs(p, m, metric_key));
            side.instrumented
                .push(p.merged_functions().iter().map(|s| s.exclusive.get(m).map_or(0, |x| x.total)).fold(0, u64::saturating_add));
        }
        Ok::<_, DiffError>(side)
    };
    let sides = [side(base, "base")?, side(new, "new")?];
    let floor_total = (options.min_share * median(&sides[1].instrumented) as f64) as u64;
    let judge = Judge {
        options,
        floor_total,
        repeated: base.len() > 1 || new.len() > 1,
        fastest_of_runs: options.fastest_too && crate::model::Unit::of(metric_key) == crate::model::Unit::Nanoseconds,
    };

    let mut functions = judge.all(&sides[0].functions, &sides[1].functions);
    // The product of two u64 can pass i128's range.
    let growth = |c: &Change| {
        let total = |avg: u64, calls: u64| i128::from(avg).saturating_mul(i128::from(calls));
        total(c.avg.1, c.calls.1).saturating_sub(total(c.avg.0, c.calls.0))
    };
    functions.sort_by(|a, b| growth(b).cmp(&growth(a)).then_with(|| a.name.cmp(&b.name)));
    let regions = judge.all(&sides[0].regions, &sides[1].regions).into_iter().filter(|c| c.calls.0 > 0 && c.calls.1 > 0).collect();

    let builds = match (&first.target.build_id, &last.target.build_id) {
        (Some(a), Some(b)) if a != b => Some((a.clone(), b.clone())),
        _ => None,
    };
    Ok(Diff {
        metric: metric_key.to_string(),
        runs: (base.len(), new.len()),
        confidence: options.confidence,
        programs: (first.target.exe.clone(), last.target.exe.clone()),
        builds,
        floor_total,
        functions,
        regions,
        lines: line_changes(first, last),
    })
}

/// One side's costs: per function and region, one cost per run that saw it.
#[derive(Default)]
struct Side {
    functions: HashMap<String, Vec<Cost>>,
    regions: HashMap<String, Vec<Cost>>,
    /// Each run's instrumented exclusive total.
    instrumented: Vec<u64>,
}

impl Side {
    fn add(&mut self, functions: HashMap<String, Cost>, regions: HashMap<String, Cost>) {
        for (name, cost) in functions {
            self.functions.entry(name).or_default().push(cost);
        }
        for (name, cost) in regions {
            self.regions.entry(name).or_default().push(cost);
        }
    }
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

/// Lines whose counts differ between two profiles with lines.
fn line_changes(base: &Profile, new: &Profile) -> Vec<LineChange> {
    if base.lines.is_empty() || new.lines.is_empty() {
        return Vec::new();
    }
    let counts: HashMap<(&str, u32), u64> = base.lines.iter().map(|l| ((l.file.as_str(), l.line), l.count)).collect();
    new.lines
        .iter()
        .filter_map(|l| {
            let before = *counts.get(&(l.file.as_str(), l.line))?;
            (before != l.count).then(|| LineChange { file: l.file.clone(), line: l.line, count: (before, l.count) })
        })
        .collect()
}

/// The rules, with what every judgement shares.
struct Judge<'a> {
    options: &'a DiffOptions,
    floor_total: u64,
    repeated: bool,
    /// Over repeated runs, compare each run's fastest call rather than its average.
    fastest_of_runs: bool,
}

impl Judge<'_> {
    /// Judges every name of either side.
    fn all(&self, base: &HashMap<String, Vec<Cost>>, new: &HashMap<String, Vec<Cost>>) -> Vec<Change> {
        let mut names: Vec<&String> = base.keys().chain(new.keys()).collect();
        names.sort();
        names.dedup();
        let none = Vec::new();
        names.into_iter().map(|name| self.one(name, base.get(name).unwrap_or(&none), new.get(name).unwrap_or(&none))).collect()
    }

    /// Judges one function from its costs in each run of either side.
    fn one(&self, name: &str, base: &[Cost], new: &[Cost]) -> Change {
        let base: Vec<Cost> = base.iter().copied().filter(|c| c.calls > 0).collect();
        let new: Vec<Cost> = new.iter().copied().filter(|c| c.calls > 0).collect();
        let (b, a) = (typical(&base), typical(&new));
        let floor = self.options.floor_per_call.unwrap_or_else(|| b.probe.max(a.probe)).max(1);
        let extreme = |costs: &[Cost], pick: fn(&Cost) -> u64, most: bool| {
            let values = costs.iter().map(pick);
            if most { values.max() } else { values.min() }.unwrap_or(0)
        };
        let mut change = Change {
            name: name.to_string(),
            calls: (b.calls, a.calls),
            avg: (b.average(), a.average()),
            fastest: (extreme(&base, |c| c.fastest, false), extreme(&new, |c| c.fastest, false)),
            slowest: (extreme(&base, |c| c.slowest, true), extreme(&new, |c| c.slowest, true)),
            exclusive: (b.exclusive, a.exclusive),
            change_pct: None,
            ratio: None,
            floor,
            verdict: Verdict::Unchanged,
            reason: Reason::WithinThreshold,
        };
        if base.is_empty() || new.is_empty() {
            (change.verdict, change.reason) =
                if base.is_empty() { (Verdict::New, Reason::OnlyNew) } else { (Verdict::Gone, Reason::OnlyBase) };
            return change;
        }
        if change.avg.0 > 0 {
            change.change_pct = Some(100.0 * (change.avg.1 as f64 - change.avg.0 as f64) / change.avg.0 as f64);
        }
        let (direction, reason) = if self.repeated {
            let fastest = self.fastest_of_runs;
            let per_call = |costs: &[Cost]| {
                costs.iter().map(|c| if fastest { c.fastest as f64 } else { c.inclusive as f64 / c.calls as f64 }).collect::<Vec<_>>()
            };
            change.ratio = ratio(&per_call(&base), &per_call(&new), self.options.confidence);
            self.runs(change.ratio)
        } else if b.calls >= self.options.many_calls && a.calls >= self.options.many_calls {
            self.averages(&change)
        } else {
            self.calls(&change)
        };
        (change.verdict, change.reason) = match direction {
            Some(slower) => self
                .guards(&change, slower)
                .map_or((if slower { Verdict::Regressed } else { Verdict::Improved }, reason), |r| (Verdict::Unchanged, r)),
            None => (Verdict::Unchanged, reason),
        };
        change
    }

    /// Whether `after` is past `before` by more than the threshold.
    fn past(&self, before: u64, after: u64) -> bool {
        after.abs_diff(before) as f64 > self.options.threshold * before as f64
    }

    /// Many calls in single runs: the averages, and the fastest calls.
    fn averages(&self, c: &Change) -> (Option<bool>, Reason) {
        if !self.past(c.avg.0, c.avg.1) {
            return (None, Reason::WithinThreshold);
        }
        let slower = c.avg.1 > c.avg.0;
        if !self.options.fastest_too {
            return (Some(slower), Reason::Average);
        }
        if self.past(c.fastest.0, c.fastest.1) && (c.fastest.1 > c.fastest.0) == slower {
            (Some(slower), Reason::AverageAndFastest)
        } else {
            (None, Reason::FastestSteady)
        }
    }

    /// Few calls in single runs: every call of one side against the other's range.
    fn calls(&self, c: &Change) -> (Option<bool>, Reason) {
        if !self.past(c.avg.0, c.avg.1) {
            (None, Reason::WithinThreshold)
        } else if c.fastest.1 > c.slowest.0 && self.past(c.slowest.0, c.fastest.1) {
            (Some(true), Reason::EveryCall)
        } else if c.slowest.1 < c.fastest.0 && self.past(c.fastest.0, c.slowest.1) {
            (Some(false), Reason::EveryCall)
        } else {
            (None, Reason::CallsOverlap)
        }
    }

    /// Repeated runs: the interval of the ratio.
    fn runs(&self, ratio: Option<Ratio>) -> (Option<bool>, Reason) {
        let Some(r) = ratio else {
            return (None, Reason::TooFewRuns);
        };
        if (r.estimate - 1.0).abs() <= self.options.threshold {
            (None, Reason::WithinThreshold)
        } else if r.low > 1.0 {
            (Some(true), Reason::RunsDiffer)
        } else if r.high < 1.0 {
            (Some(false), Reason::RunsDiffer)
        } else {
            (None, Reason::RunsOverlap)
        }
    }

    /// The noise guards every verdict passes: the floor per call and the
    /// share of the run. `None` when it passes them.
    fn guards(&self, c: &Change, slower: bool) -> Option<Reason> {
        let (before, after) = match c.ratio {
            // Over runs, the growth per call is the estimate's.
            Some(r) => (c.avg.0 as f64, c.avg.0 as f64 * r.estimate),
            None => (c.avg.0 as f64, c.avg.1 as f64),
        };
        let grew = (after - before).abs();
        if grew <= c.floor as f64 {
            return Some(Reason::BelowFloor);
        }
        let calls = if slower { c.calls.1 } else { c.calls.0.max(c.calls.1) };
        (grew * (calls as f64) < self.floor_total as f64).then_some(Reason::SmallShare)
    }
}

/// A run's cost: the one run, or over repeated runs the run of median average.
fn typical(costs: &[Cost]) -> Cost {
    let mut sorted = costs.to_vec();
    sorted.sort_by_key(Cost::average);
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallTree, FunctionStats, Target, ThreadProfile};
    use crate::stats::Stat;

    /// A profile of `functions` as (name, calls, inclusive total).
    fn profile(functions: &[(&str, u64, u64)]) -> Profile {
        let stats = functions
            .iter()
            .enumerate()
            .map(|(i, &(_, calls, total))| {
                let mut s = FunctionStats::new(i as u32, 1);
                s.calls = calls;
                // Every call alike: the fastest is the average.
                let per_call = total / calls.max(1);
                s.inclusive[0] = Stat::new(total, per_call, per_call);
                s.exclusive[0] = Stat::new(total, per_call, per_call);
                s
            })
            .collect();
        Profile {
            target: Target { exe: "/bin/prog".into(), ..Target::default() },
            metrics: vec!["wall_ns".into()],
            functions: functions
                .iter()
                .map(|f| FunctionInfo { name: f.0.into(), module: "/bin/prog".into(), ..FunctionInfo::default() })
                .collect(),
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: "prog".into(), functions: stats, tree: CallTree::new(1) }],
            ..Profile::default()
        }
    }

    fn verdict(d: &Diff, name: &str) -> Verdict {
        d.functions.iter().find(|c| c.name == name).map(|c| c.verdict).expect("function")
    }

    #[test]
    fn a_doubled_function_regresses_and_noise_does_not() {
        let options = DiffOptions { floor_per_call: Some(100), ..DiffOptions::default() };
        let base = profile(&[("main", 1, 1_000_000), ("hot", 100, 500_000), ("jitter", 100, 400_000), ("tiny", 100, 1_000)]);
        // hot doubled; jitter moved 5%; tiny tripled but costs next to nothing.
        let new = profile(&[("main", 1, 1_600_000), ("hot", 100, 1_000_000), ("jitter", 100, 420_000), ("tiny", 100, 3_000)]);
        let d = diff(&base, &new, "wall_ns", &options).expect("same metric");
        assert_eq!(verdict(&d, "hot"), Verdict::Regressed);
        assert_eq!(verdict(&d, "jitter"), Verdict::Unchanged);
        assert_eq!(verdict(&d, "tiny"), Verdict::Unchanged);
        // One call each: that one call is past the threshold.
        assert_eq!(verdict(&d, "main"), Verdict::Regressed);
        assert!(d.regressed());
        // Largest growth first.
        assert_eq!(d.functions[0].name, "main");
        assert_eq!(d.functions[1].name, "hot");
        assert_eq!(d.functions[1].change_pct, Some(100.0));

        let same = diff(&base, &base, "wall_ns", &options).expect("same metric");
        assert!(!same.regressed());
        let better = diff(&new, &base, "wall_ns", &options).expect("same metric");
        assert_eq!(verdict(&better, "hot"), Verdict::Improved);
        assert!(!better.regressed());
    }

    #[test]
    fn slow_outliers_move_the_average_but_not_the_fastest_call() {
        let base = profile(&[("f", 100, 500_000)]);
        let mut new = profile(&[("f", 100, 700_000)]);
        // Same fastest call (5 us): a few calls were preempted.
        new.threads[0].functions[0].inclusive[0].min = 5_000;
        let options = DiffOptions { floor_per_call: Some(100), ..DiffOptions::default() };
        assert_eq!(verdict(&diff(&base, &new, "wall_ns", &options).expect("metric"), "f"), Verdict::Unchanged);
        let averages_only = DiffOptions { fastest_too: false, ..options };
        assert_eq!(verdict(&diff(&base, &new, "wall_ns", &averages_only).expect("metric"), "f"), Verdict::Regressed);
    }

    fn change<'a>(d: &'a Diff, name: &str) -> &'a Change {
        d.functions.iter().find(|c| c.name == name).expect("function")
    }

    /// `profile` with function `name`'s calls spread between `fastest` and `slowest`.
    fn spread(mut p: Profile, name: &str, fastest: u64, slowest: u64) -> Profile {
        let id = p.functions.iter().position(|f| f.name == name).expect("function");
        let s = &mut p.threads[0].functions[id].inclusive[0];
        (s.min, s.max) = (fastest, slowest);
        p
    }

    #[test]
    fn few_calls_are_compared_call_by_call() {
        let ms = 1_000_000;
        let options = DiffOptions { threshold: 0.25, ..DiffOptions::default() };
        let base = profile(&[("main", 1, 62 * ms), ("burn", 3, 60 * ms)]);
        let new = profile(&[("main", 1, 122 * ms), ("burn", 3, 120 * ms)]);
        let d = diff(&base, &new, "wall_ns", &options).expect("metric");
        assert_eq!((change(&d, "burn").verdict, change(&d, "burn").reason), (Verdict::Regressed, Reason::EveryCall));
        assert_eq!(verdict(&d, "main"), Verdict::Regressed);
        // Calls that overlap: one preempted call moved the average.
        let base = spread(profile(&[("burn", 3, 66 * ms)]), "burn", 20 * ms, 26 * ms);
        let new = spread(profile(&[("burn", 3, 90 * ms)]), "burn", 20 * ms, 50 * ms);
        let d = diff(&base, &new, "wall_ns", &options).expect("metric");
        assert_eq!((change(&d, "burn").verdict, change(&d, "burn").reason), (Verdict::Unchanged, Reason::CallsOverlap));
        let d = diff(&new, &base, "wall_ns", &options).expect("metric");
        assert_eq!(change(&d, "burn").verdict, Verdict::Unchanged);
        // Every call faster: improved.
        let faster = profile(&[("burn", 3, 30 * ms)]);
        assert_eq!(verdict(&diff(&base, &faster, "wall_ns", &options).expect("metric"), "burn"), Verdict::Improved);
    }

    #[test]
    fn the_floor_is_the_cost_of_the_engine_that_saw_the_calls() {
        let with_engine = |mut p: Profile, engine: Engine| {
            p.overhead.call_ns_injected = 56;
            (p.overhead.call_ns_emulated, p.overhead.call_ns_stepped) = (2_000, 8_210);
            for f in &mut p.functions {
                f.engine = Some(engine);
            }
            p
        };
        // tiny: 42 ns to 2.47 us a call, 5,000 calls; main ten times slower.
        let base = profile(&[("main", 1, 1_300_000), ("tiny", 5_000, 210_000)]);
        let new = profile(&[("main", 1, 13_000_000), ("tiny", 5_000, 12_350_000)]);
        let d =
            diff(&with_engine(base.clone(), Engine::Inject), &with_engine(new.clone(), Engine::Inject), "wall_ns", &DiffOptions::default())
                .expect("metric");
        assert_eq!((change(&d, "tiny").verdict, change(&d, "tiny").floor), (Verdict::Regressed, 56));
        let d = diff(&with_engine(base, Engine::Uprobe), &with_engine(new, Engine::Uprobe), "wall_ns", &DiffOptions::default())
            .expect("metric");
        assert_eq!((change(&d, "tiny").reason, change(&d, "tiny").floor), (Reason::BelowFloor, 8_210));
    }

    #[test]
    fn profiles_of_different_programs_are_refused_unless_forced() {
        let base = profile(&[("f", 10, 10)]);
        let mut other = profile(&[("f", 10, 10)]);
        other.target.exe = "/bin/other".into();
        let err = diff(&base, &other, "wall_ns", &DiffOptions::default()).expect_err("different programs");
        assert!(err.to_string().contains("different programs (/bin/prog and /bin/other)"), "{err}");
        let forced = DiffOptions { force: true, ..DiffOptions::default() };
        assert!(diff(&base, &other, "wall_ns", &forced).is_ok());
        // Another build of the same program compares, and says so.
        let (mut a, mut b) = (base.clone(), base);
        (a.target.build_id, b.target.build_id) = (Some("aa".into()), Some("bb".into()));
        assert_eq!(diff(&a, &b, "wall_ns", &DiffOptions::default()).expect("same program").builds, Some(("aa".into(), "bb".into())));
    }

    #[test]
    fn repeated_runs_are_judged_on_an_interval() {
        let runs = |slowed: u64| -> Vec<Profile> {
            [1_000, 1_013, 994, 1_021, 1_005]
                .iter()
                .map(|&us| profile(&[("slowed", 100, 100 * us * slowed / 100 * 1_000), ("steady", 100, 100 * us * 1_000)]))
                .collect()
        };
        let d = diff_runs(&runs(100), &runs(110), "wall_ns", &DiffOptions { threshold: 0.05, ..DiffOptions::default() }).expect("metric");
        assert_eq!(d.runs, (5, 5));
        let slowed = change(&d, "slowed");
        let r = slowed.ratio.expect("interval");
        assert!(r.low > 1.0 && (r.estimate - 1.1).abs() < 0.01, "{r:?}");
        assert_eq!((slowed.verdict, slowed.reason), (Verdict::Regressed, Reason::RunsDiffer));
        let steady = change(&d, "steady");
        assert!(steady.ratio.expect("interval").low < 1.0);
        assert_eq!(steady.verdict, Verdict::Unchanged);
        // Two runs a side cannot make a 95% interval.
        let d = diff_runs(&runs(100)[..2], &runs(110)[..2], "wall_ns", &DiffOptions::default()).expect("metric");
        assert_eq!(change(&d, "slowed").reason, Reason::TooFewRuns);
    }

    #[test]
    fn regions_are_judged_like_functions() {
        let with_region = |per_entry: u64| {
            let mut p = profile(&[("main", 1, 100 * per_entry)]);
            p.regions.push(crate::model::RegionRecord {
                name: "loop".into(),
                file: "prog.c".into(),
                start: 3,
                end: 9,
                entries: 5,
                inclusive: vec![Stat::new(5 * per_entry, per_entry, per_entry)],
            });
            p
        };
        let d = diff(&with_region(1_000_000), &with_region(2_000_000), "wall_ns", &DiffOptions::default()).expect("metric");
        assert_eq!(d.regions.len(), 1);
        assert_eq!(
            (d.regions[0].name.as_str(), d.regions[0].verdict, d.regions[0].reason),
            ("loop", Verdict::Regressed, Reason::EveryCall)
        );
        assert!(d.regressed());
    }

    #[test]
    fn counts_and_costs_at_u64_max_compare_without_overflow() {
        let base = profile(&[("f", u64::MAX, u64::MAX), ("g", 1, 1)]);
        let new = profile(&[("f", u64::MAX, u64::MAX), ("g", u64::MAX, u64::MAX)]);
        let d = diff(&base, &new, "wall_ns", &DiffOptions::default()).expect("metric");
        assert_eq!(d.functions.len(), 2);
        assert_eq!(d.floor_total, (0.01 * u64::MAX as f64) as u64);
    }

    #[test]
    fn new_and_gone_functions_and_a_missing_metric() {
        let d = diff(&profile(&[("a", 10, 10)]), &profile(&[("b", 10, 10)]), "wall_ns", &DiffOptions::default()).expect("metric");
        assert_eq!((verdict(&d, "a"), verdict(&d, "b")), (Verdict::Gone, Verdict::New));
        assert!(!d.regressed());
        let err = diff(&profile(&[]), &profile(&[]), "cpu_ns", &DiffOptions::default()).expect_err("no cpu");
        assert_eq!(err.to_string(), "the base profile has no metric 'cpu_ns' (it has wall_ns)");
    }
}

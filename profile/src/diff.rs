//! Comparing two profiles of a program: which functions, regions and lines
//! cost more per call than before, and by how much.
//!
//! A function regressed when its average inclusive cost per call grew past
//! the threshold, and the growth is more than noise:
//!
//! - both profiles saw at least `min_calls` calls of it (an average over a
//!   few calls moves with every preemption);
//! - the growth per call is above `floor_per_call` (for time metrics, the
//!   recording's own cost of a probed call: below that, proftap's probes
//!   vary more than the function);
//! - the growth over all its calls is at least `min_share` of the new
//!   profile's instrumented total (a function that costs next to nothing
//!   cannot slow the program down, whatever its ratio);
//! - its fastest call grew past the threshold too (`fastest_too`): on a
//!   shared machine, preemption and cold caches lengthen some calls and move
//!   the average, but not the fastest call; slower code shows in both. A
//!   slowdown of only some calls shows in the average alone: turn the guard
//!   off to catch it.
//!
//! Functions are matched by name and module file name, so profiles of
//! different builds (another build-id, another path) compare.

use crate::model::{FunctionInfo, Mode, Profile};
use std::collections::HashMap;

/// How to compare.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// The metric (index in both profiles' `metrics`).
    pub metric: usize,
    /// Growth of the average per call, as a fraction (0.1: 10%), past which a
    /// function regressed.
    pub threshold: f64,
    /// Fewest calls in each profile for a function to be judged.
    pub min_calls: u64,
    /// Smallest growth per call that counts, in the metric's unit; `None`:
    /// the profiles' measured cost of a probed call for time metrics, 1
    /// for counters.
    pub floor_per_call: Option<u64>,
    /// Smallest growth over all calls, as a fraction of the new profile's
    /// instrumented total, that counts.
    pub min_share: f64,
    /// The fastest call must have grown past the threshold as well.
    pub fastest_too: bool,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions { metric: 0, threshold: 0.10, min_calls: 10, floor_per_call: None, min_share: 0.01, fastest_too: true }
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
    /// Too few calls in one of the profiles to judge.
    TooFewCalls,
    /// Only in the new profile.
    New,
    /// Only in the base profile.
    Gone,
}

/// One function or region in both profiles.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Change {
    /// Function name, or region name.
    pub name: String,
    /// Calls (entries for a region) in the base and the new profile.
    pub calls: (u64, u64),
    /// Average inclusive cost per call in each.
    pub avg: (u64, u64),
    /// Inclusive cost of the fastest call in each.
    pub fastest: (u64, u64),
    /// Total exclusive cost in each (0 for regions).
    pub exclusive: (u64, u64),
    /// Growth of the average per call, in percent (None without a base).
    pub change_pct: Option<f64>,
    /// What it amounts to.
    pub verdict: Verdict,
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
    /// The growth per call that counted as noise, in the metric's unit.
    pub floor_per_call: u64,
    /// The growth over all calls that counted as noise.
    pub floor_total: u64,
    /// Functions, the largest growth of total cost first.
    pub functions: Vec<Change>,
    /// Regions.
    pub regions: Vec<Change>,
    /// Lines whose counts differ (when both profiles have lines).
    pub lines: Vec<LineChange>,
}

impl Diff {
    /// Whether anything regressed.
    pub fn regressed(&self) -> bool {
        self.functions.iter().chain(&self.regions).any(|c| c.verdict == Verdict::Regressed)
    }
}

/// Why two profiles cannot be compared.
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
}

fn key(profile: &Profile, f: &FunctionInfo) -> (String, String) {
    let module = if f.module == profile.target.exe {
        String::new()
    } else {
        std::path::Path::new(&f.module).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    };
    (module, f.name.clone())
}

/// What a function or region cost in one profile.
#[derive(Clone, Copy)]
struct Cost {
    calls: u64,
    inclusive: u64,
    fastest: u64,
    exclusive: u64,
}

/// Per function (instrumented at some point): its cost.
fn totals(profile: &Profile, m: usize) -> HashMap<(String, String), Cost> {
    profile
        .merged_functions()
        .iter()
        .filter_map(|s| {
            let info = profile.functions.get(s.function as usize)?;
            (info.mode != Mode::Sampled).then(|| {
                let inclusive = s.inclusive.get(m).copied().unwrap_or_default();
                let exclusive = s.exclusive.get(m).map_or(0, |x| x.total);
                (key(profile, info), Cost { calls: s.calls, inclusive: inclusive.total, fastest: inclusive.min_or_zero(), exclusive })
            })
        })
        .collect()
}

/// Compares `new` with `base` on metric `metric_key`.
pub fn diff(base: &Profile, new: &Profile, metric_key: &str, options: &DiffOptions) -> Result<Diff, DiffError> {
    let index = |p: &Profile, which| {
        p.metrics.iter().position(|k| k == metric_key).ok_or_else(|| DiffError::MissingMetric {
            which,
            metric: metric_key.to_string(),
            has: p.metrics.join(", "),
        })
    };
    let (mb, mn) = (index(base, "base")?, index(new, "new")?);
    let time = crate::model::Unit::of(metric_key) == crate::model::Unit::Nanoseconds;
    let floor_per_call = options.floor_per_call.unwrap_or_else(|| {
        if time {
            let probe =
                |p: &Profile| if mb == 0 { p.overhead.call_ns_emulated.max(p.overhead.call_ns_stepped) } else { p.overhead.call_cpu_ns };
            probe(base).max(probe(new)).max(1)
        } else {
            1
        }
    });
    let before = totals(base, mb);
    let after = totals(new, mn);
    let instrumented = after.values().fold(0u64, |sum, c| sum.saturating_add(c.exclusive));
    let floor_total = (options.min_share * instrumented as f64) as u64;

    let judge = |name: String, b: Option<Cost>, a: Option<Cost>| -> Change {
        let (b, a) = (
            b.unwrap_or(Cost { calls: 0, inclusive: 0, fastest: 0, exclusive: 0 }),
            a.unwrap_or(Cost { calls: 0, inclusive: 0, fastest: 0, exclusive: 0 }),
        );
        let avg = (b.inclusive.checked_div(b.calls).unwrap_or(0), a.inclusive.checked_div(a.calls).unwrap_or(0));
        let change_pct = (avg.0 > 0 && a.calls > 0).then(|| 100.0 * (avg.1 as f64 - avg.0 as f64) / avg.0 as f64);
        let past = |before: u64, after: u64| after.abs_diff(before) as f64 > options.threshold * before as f64;
        let verdict = if b.calls == 0 {
            Verdict::New
        } else if a.calls == 0 {
            Verdict::Gone
        } else if b.calls < options.min_calls || a.calls < options.min_calls {
            Verdict::TooFewCalls
        } else {
            let grew = avg.1.abs_diff(avg.0);
            let impact = grew.saturating_mul(a.calls.max(b.calls));
            let fastest_agrees = !options.fastest_too || (past(b.fastest, a.fastest) && (a.fastest > b.fastest) == (avg.1 > avg.0));
            if past(avg.0, avg.1) && grew > floor_per_call && impact >= floor_total && fastest_agrees {
                if avg.1 > avg.0 { Verdict::Regressed } else { Verdict::Improved }
            } else {
                Verdict::Unchanged
            }
        };
        Change {
            name,
            calls: (b.calls, a.calls),
            avg,
            fastest: (b.fastest, a.fastest),
            exclusive: (b.exclusive, a.exclusive),
            change_pct,
            verdict,
        }
    };

    let mut names: Vec<&(String, String)> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    let mut functions: Vec<Change> = names
        .into_iter()
        .map(|k| {
            let name = if k.0.is_empty() { k.1.clone() } else { format!("{} ({})", k.1, k.0) };
            judge(name, before.get(k).copied(), after.get(k).copied())
        })
        .collect();
    // The product of two u64 can pass i128's range.
    let growth = |c: &Change| {
        let total = |avg: u64, calls: u64| i128::from(avg).saturating_mul(i128::from(calls));
        total(c.avg.1, c.calls.1).saturating_sub(total(c.avg.0, c.calls.0))
    };
    functions.sort_by(|a, b| growth(b).cmp(&growth(a)).then_with(|| a.name.cmp(&b.name)));

    let new_regions: HashMap<&str, &crate::model::RegionRecord> = new.regions.iter().rev().map(|r| (r.name.as_str(), r)).collect();
    let regions = base
        .regions
        .iter()
        .filter_map(|r| {
            let other = new_regions.get(r.name.as_str())?;
            let cost = |entries: u64, stat: Option<&crate::stats::Stat>| {
                let stat = stat.copied().unwrap_or_default();
                Cost { calls: entries, inclusive: stat.total, fastest: stat.min_or_zero(), exclusive: 0 }
            };
            Some(judge(r.name.clone(), Some(cost(r.entries, r.inclusive.get(mb))), Some(cost(other.entries, other.inclusive.get(mn)))))
        })
        .collect();

    let mut lines = Vec::new();
    if !base.lines.is_empty() && !new.lines.is_empty() {
        let counts: HashMap<(&str, u32), u64> = base.lines.iter().map(|l| ((l.file.as_str(), l.line), l.count)).collect();
        for l in &new.lines {
            if let Some(&before) = counts.get(&(l.file.as_str(), l.line))
                && before != l.count
            {
                lines.push(LineChange { file: l.file.clone(), line: l.line, count: (before, l.count) });
            }
        }
    }
    Ok(Diff { metric: metric_key.to_string(), floor_per_call, floor_total, functions, regions, lines })
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
                s.inclusive[0] = Stat { total, min: per_call, max: per_call };
                s.exclusive[0] = Stat { total, min: per_call, max: per_call };
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
        assert_eq!(verdict(&d, "main"), Verdict::TooFewCalls);
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

//! Budgets: limits on what a function or region may cost, checked against
//! a profile (`proftap check`).

use crate::model::Profile;
use crate::stats::Stat;

/// What a budget limits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Subject {
    /// A function, by name (every function of that name, in any module).
    Function(String),
    /// A region (`--region NAME=...`), by name.
    Region(String),
}

/// Which number of the subject is limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Measure {
    /// Calls (entries for a region).
    Calls,
    /// Average inclusive cost per call.
    Average,
    /// Inclusive cost of the slowest call.
    Max,
    /// Inclusive cost over all calls.
    Total,
    /// Inclusive cost over all calls, as a fraction of the recording's
    /// duration (times) or of the program's total (counters).
    Share,
}

/// One limit: `measure` of `subject` in `metric` must not exceed `limit`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Budget {
    /// What.
    pub subject: Subject,
    /// The metric key (`wall_ns`, `cpu_ns`, ...); unused for calls.
    pub metric: String,
    /// Which number.
    pub measure: Measure,
    /// The most it may be (a fraction for shares, the metric's unit otherwise).
    pub limit: f64,
}

/// A budget checked.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    /// The budget.
    pub budget: Budget,
    /// What the profile says, or why it says nothing.
    pub value: Result<f64, Missing>,
}

impl Outcome {
    /// Whether the budget held: the value is known and within the limit.
    pub fn held(&self) -> bool {
        self.value.as_ref().is_ok_and(|v| *v <= self.budget.limit)
    }
}

/// Why a budget could not be checked (a failure: an unchecked budget does not hold).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// No function or region of that name was recorded.
    #[error("not in the profile")]
    NotRecorded,
    /// It was recorded, but without this metric.
    #[error("the profile has no metric '{0}'")]
    NoMetric(String),
    /// Its probes were removed during the recording (counts are a lower bound).
    #[error("its probes were removed during the recording (see --overhead-budget), so its counts are a lower bound")]
    Throttled,
}

/// Checks every budget against `profile`.
pub fn check(profile: &Profile, budgets: &[Budget]) -> Vec<Outcome> {
    budgets.iter().map(|b| Outcome { budget: b.clone(), value: measure(profile, b) }).collect()
}

/// The value `budget` limits, in `profile`.
fn measure(profile: &Profile, budget: &Budget) -> Result<f64, Missing> {
    let metric = profile.metrics.iter().position(|k| *k == budget.metric);
    // Calls, those timed, and the cost of those.
    let (calls, timed, cost) = match &budget.subject {
        Subject::Function(name) => function_cost(profile, name, metric)?,
        Subject::Region(name) => {
            let regions: Vec<_> = profile.regions.iter().filter(|r| r.name == *name).collect();
            if regions.is_empty() {
                return Err(Missing::NotRecorded);
            }
            let mut cost = Stat::default();
            for r in &regions {
                cost.merge(&metric.and_then(|m| r.inclusive.get(m)).copied().unwrap_or_default());
            }
            let entries = regions.iter().map(|r| r.entries).fold(0, u64::saturating_add);
            (entries, entries, cost)
        }
    };
    if budget.measure == Measure::Calls {
        return Ok(calls as f64);
    }
    let m = metric.ok_or_else(|| Missing::NoMetric(budget.metric.clone()))?;
    Ok(match budget.measure {
        Measure::Calls => calls as f64,
        Measure::Average => cost.every_call() as f64 / timed.max(1) as f64,
        Measure::Max => cost.max as f64,
        Measure::Total => cost.total as f64,
        Measure::Share => cost.total as f64 / whole_run(profile, m).max(1) as f64,
    })
}

/// Calls, calls timed and their inclusive cost over every instrumented function named `name`,
/// its namesakes (`name #2`, ...) included: which instance is which can
/// change from one build to the next.
fn function_cost(profile: &Profile, name: &str, metric: Option<usize>) -> Result<(u64, u64, Stat), Missing> {
    let named =
        |f: &str| f == name || f.strip_prefix(name).and_then(|rest| rest.strip_prefix(" #")).is_some_and(|n| n.parse::<u32>().is_ok());
    let ids: Vec<usize> = profile.functions.iter().enumerate().filter(|(_, f)| named(&f.name)).map(|(i, _)| i).collect();
    let instrumented: Vec<usize> = ids.iter().copied().filter(|&i| profile.functions[i].mode != crate::model::Mode::Sampled).collect();
    if instrumented.is_empty() {
        return Err(Missing::NotRecorded);
    }
    if instrumented.iter().any(|&i| profile.functions[i].mode == crate::model::Mode::Throttled) {
        return Err(Missing::Throttled);
    }
    let (mut calls, mut timed, mut cost) = (0u64, 0u64, Stat::default());
    for s in profile.merged_functions().iter().filter(|s| instrumented.contains(&(s.function as usize))) {
        calls = calls.saturating_add(s.calls);
        timed = timed.saturating_add(s.timed_calls());
        cost.merge(&metric.and_then(|m| s.inclusive.get(m)).copied().unwrap_or_default());
    }
    Ok((calls, timed, cost))
}

/// What a share is of: the recording's duration for times, the sum of the
/// threads' outermost calls for counters.
fn whole_run(profile: &Profile, metric: usize) -> u64 {
    if profile.unit(metric) == crate::model::Unit::Nanoseconds {
        return profile.recording.duration_ns;
    }
    profile.merged_functions().iter().map(|s| s.exclusive.get(metric).map_or(0, |x| x.total)).fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallTree, FunctionInfo, FunctionStats, Mode, Target, ThreadProfile};

    fn profile() -> Profile {
        let mut main = FunctionStats::new(0, 1);
        main.calls = 1;
        main.inclusive[0] = Stat::new(1_000_000, 1_000_000, 1_000_000);
        let mut parse = FunctionStats::new(1, 1);
        parse.calls = 4;
        parse.inclusive[0] = Stat::new(600_000, 100_000, 300_000);
        let mut p = Profile {
            target: Target { exe: "/bin/prog".into(), ..Target::default() },
            metrics: vec!["wall_ns".into()],
            functions: ["main", "parse", "hot"]
                .iter()
                .map(|n| FunctionInfo { name: (*n).into(), module: "/bin/prog".into(), ..FunctionInfo::default() })
                .collect(),
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: "prog".into(), functions: vec![main, parse], tree: CallTree::new(1) }],
            ..Profile::default()
        };
        p.functions[2].mode = Mode::Throttled;
        p.recording.duration_ns = 2_000_000;
        p
    }

    fn budget(name: &str, measure: Measure, limit: f64) -> Budget {
        Budget { subject: Subject::Function(name.into()), metric: "wall_ns".into(), measure, limit }
    }

    #[test]
    fn budgets_hold_or_break_on_the_profiles_numbers() {
        let outcomes = check(
            &profile(),
            &[
                budget("parse", Measure::Average, 150_000.0),
                budget("parse", Measure::Max, 250_000.0),
                budget("parse", Measure::Calls, 4.0),
                budget("main", Measure::Share, 0.5),
                budget("main", Measure::Total, 1_000_000.0),
            ],
        );
        let values: Vec<(f64, bool)> = outcomes.iter().map(|o| (*o.value.as_ref().expect("measured"), o.held())).collect();
        assert_eq!(values, [(150_000.0, true), (300_000.0, false), (4.0, true), (0.5, true), (1_000_000.0, true)]);
    }

    #[test]
    fn a_budget_on_a_name_covers_its_namesakes() {
        let mut p = profile();
        p.functions.push(FunctionInfo { name: "parse #2".into(), module: "/bin/prog".into(), ..FunctionInfo::default() });
        p.functions.push(FunctionInfo { name: "parse #2x".into(), module: "/bin/prog".into(), ..FunctionInfo::default() });
        let mut second = FunctionStats::new(3, 1);
        second.calls = 6;
        let mut other = FunctionStats::new(4, 1);
        other.calls = 100;
        p.threads[0].functions.extend([second, other]);
        let outcomes = check(&p, &[budget("parse", Measure::Calls, 10.0)]);
        assert_eq!(outcomes[0].value.as_ref().ok(), Some(&10.0));
    }

    #[test]
    fn what_cannot_be_checked_does_not_hold() {
        let missing = check(
            &profile(),
            &[
                budget("absent", Measure::Calls, 10.0),
                budget("hot", Measure::Calls, 10.0),
                Budget { metric: "cpu_ns".into(), ..budget("parse", Measure::Total, 1e12) },
                Budget { subject: Subject::Region("loop".into()), ..budget("x", Measure::Total, 1e12) },
            ],
        );
        let why: Vec<_> = missing.iter().map(|o| o.value.clone().expect_err("missing")).collect();
        assert_eq!(why, [Missing::NotRecorded, Missing::Throttled, Missing::NoMetric("cpu_ns".into()), Missing::NotRecorded]);
        assert!(missing.iter().all(|o| !o.held()));
    }
}

//! The costs proftap can measure per call: wall time from the sample
//! timestamp, CPU time from the thread's task-clock, and perf counters.

use perf_event::events::{Hardware, Software};
use std::fmt;

/// A metric per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Elapsed time (CLOCK_MONOTONIC), nanoseconds.
    Wall,
    /// The thread's CPU time (task-clock), nanoseconds.
    Cpu,
    /// A software counter.
    Software(Software),
    /// A hardware counter (absent in many virtual machines).
    Hardware(Hardware),
}

/// Every metric by its command-line name, its profile key, and what it is.
const CATALOGUE: &[(&str, &str, Metric)] = &[
    ("wall", "wall_ns", Metric::Wall),
    ("cpu", "cpu_ns", Metric::Cpu),
    ("page-faults", "page_faults", Metric::Software(Software::PAGE_FAULTS)),
    ("minor-faults", "minor_faults", Metric::Software(Software::PAGE_FAULTS_MIN)),
    ("major-faults", "major_faults", Metric::Software(Software::PAGE_FAULTS_MAJ)),
    ("context-switches", "context_switches", Metric::Software(Software::CONTEXT_SWITCHES)),
    ("cpu-migrations", "cpu_migrations", Metric::Software(Software::CPU_MIGRATIONS)),
    ("cycles", "cycles", Metric::Hardware(Hardware::CPU_CYCLES)),
    ("instructions", "instructions", Metric::Hardware(Hardware::INSTRUCTIONS)),
    ("cache-references", "cache_references", Metric::Hardware(Hardware::CACHE_REFERENCES)),
    ("cache-misses", "cache_misses", Metric::Hardware(Hardware::CACHE_MISSES)),
    ("branches", "branches", Metric::Hardware(Hardware::BRANCH_INSTRUCTIONS)),
    ("branch-misses", "branch_misses", Metric::Hardware(Hardware::BRANCH_MISSES)),
];

/// The most metrics one recording can carry (wall plus group members).
pub const MAX_METRICS: usize = 8;

/// Errors choosing metrics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricError {
    /// No such metric.
    #[error("unknown metric '{name}'; choose from: {}", names())]
    Unknown {
        /// As given.
        name: String,
    },
    /// The machine cannot count it.
    #[error("metric '{name}' is not available on this machine ({reason}); available here: {available}")]
    Unavailable {
        /// As given.
        name: String,
        /// What the kernel said.
        reason: String,
        /// Metrics that work here.
        available: String,
    },
    /// Too many metrics.
    #[error("at most {MAX_METRICS} metrics can be recorded at once")]
    TooMany,
}

fn names() -> String {
    CATALOGUE.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
}

impl Metric {
    /// Parses a command-line name (`wall`, `cpu`, `page-faults`, ...; `_` works for `-`).
    pub fn parse(name: &str) -> Result<Metric, MetricError> {
        let wanted = name.trim().replace('_', "-");
        CATALOGUE
            .iter()
            .find(|(n, key, _)| *n == wanted || key.replace('_', "-") == wanted)
            .map(|&(_, _, m)| m)
            .ok_or_else(|| MetricError::Unknown { name: name.into() })
    }

    /// The key in profiles and JSON (`wall_ns`, `cpu_ns`, `page_faults`).
    pub fn key(self) -> &'static str {
        CATALOGUE.iter().find(|(_, _, m)| *m == self).map_or("unknown", |(_, k, _)| k)
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        CATALOGUE.iter().find(|(_, _, m)| *m == self).map_or("unknown", |(n, _, _)| n)
    }

    /// Whether values are nanoseconds.
    pub fn is_time(self) -> bool {
        matches!(self, Metric::Wall | Metric::Cpu)
    }

    /// Checks that this machine can count the metric, by opening it on proftap itself.
    pub fn check_available(self) -> Result<(), String> {
        let result = match self {
            Metric::Wall => return Ok(()),
            Metric::Cpu => perf_event::Builder::new(Software::TASK_CLOCK).build(),
            Metric::Software(s) => perf_event::Builder::new(s).build(),
            Metric::Hardware(h) => perf_event::Builder::new(h).build(),
        };
        result.map(drop).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => "no hardware performance counters".to_string(),
            _ => e.to_string(),
        })
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a comma-separated list (`wall,cpu,page-faults`), checks that each
/// can be counted here, and puts wall time first (it costs nothing extra).
pub fn parse_metrics(list: &[String]) -> Result<Vec<Metric>, MetricError> {
    let mut metrics = Vec::new();
    for name in list.iter().flat_map(|l| l.split(',')).filter(|n| !n.trim().is_empty()) {
        let metric = Metric::parse(name)?;
        if let Err(reason) = metric.check_available() {
            let available =
                CATALOGUE.iter().filter(|(_, _, m)| m.check_available().is_ok()).map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ");
            return Err(MetricError::Unavailable { name: name.trim().into(), reason, available });
        }
        if !metrics.contains(&metric) {
            metrics.push(metric);
        }
    }
    if metrics.is_empty() {
        metrics = vec![Metric::Wall, Metric::Cpu];
    }
    if !metrics.contains(&Metric::Wall) {
        metrics.insert(0, Metric::Wall);
    }
    metrics.sort_by_key(|m| *m != Metric::Wall);
    if metrics.len() > MAX_METRICS {
        return Err(MetricError::TooMany);
    }
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys_parse() {
        assert_eq!(Metric::parse("wall").expect("wall"), Metric::Wall);
        assert_eq!(Metric::parse("cpu_ns").expect("key"), Metric::Cpu);
        assert_eq!(Metric::parse("page_faults").expect("underscore"), Metric::Software(Software::PAGE_FAULTS));
        let err = Metric::parse("bogus").expect_err("unknown");
        assert!(err.to_string().contains("choose from: wall, cpu"), "{err}");
    }

    #[test]
    fn wall_comes_first_and_defaults_apply() {
        assert_eq!(parse_metrics(&[]).expect("default"), vec![Metric::Wall, Metric::Cpu]);
        let m = parse_metrics(&["cpu,page-faults".into()]).expect("list");
        assert_eq!(m, vec![Metric::Wall, Metric::Cpu, Metric::Software(Software::PAGE_FAULTS)]);
    }
}

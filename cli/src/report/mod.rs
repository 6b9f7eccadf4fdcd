//! Renderers: every output is a function of a [`Profile`] alone.

pub mod callgraph;
pub mod coverage;
pub mod flame;
pub mod json;
pub mod pprof;
pub mod text;

use proftap_profile::{FunctionStats, Profile};

/// What to sort functions by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Number of calls.
    Calls,
    /// Inclusive total.
    #[value(alias = "total")]
    Incl,
    /// Exclusive total.
    #[value(alias = "self")]
    Excl,
    /// Inclusive average per call.
    Avg,
    /// Largest inclusive value of one call.
    Max,
    /// Function name, A to Z.
    Name,
}

impl SortKey {
    /// How the report names the order.
    pub fn describe(self) -> &'static str {
        match self {
            SortKey::Calls => "calls",
            SortKey::Incl => "inclusive total",
            SortKey::Excl => "exclusive total",
            SortKey::Avg => "inclusive average",
            SortKey::Max => "largest call",
            SortKey::Name => "name",
        }
    }
}

/// Sorts function statistics of `profile` by `key` of metric `metric`,
/// largest first (names A to Z).
pub fn sort_functions(profile: &Profile, functions: &mut [FunctionStats], key: SortKey, metric: usize) {
    let value = |f: &FunctionStats| -> u64 {
        let incl = f.inclusive.get(metric).copied().unwrap_or_default();
        match key {
            SortKey::Calls => f.calls,
            SortKey::Incl | SortKey::Name => incl.total,
            SortKey::Excl => f.exclusive.get(metric).map_or(0, |s| s.total),
            SortKey::Avg => incl.avg(f.calls),
            SortKey::Max => incl.max,
        }
    };
    if key == SortKey::Name {
        functions
            .sort_by(|a, b| function_name(profile, a.function).cmp(function_name(profile, b.function)).then(a.function.cmp(&b.function)));
    } else {
        functions.sort_by(|a, b| value(b).cmp(&value(a)).then(a.function.cmp(&b.function)));
    }
}

/// The display name of a function id.
pub fn function_name(profile: &Profile, id: u32) -> &str {
    profile.functions.get(id as usize).map_or("?", |f| f.name.as_str())
}

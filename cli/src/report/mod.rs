//! Renderers: every output is a function of a [`Profile`] alone.

pub mod callgraph;
pub mod chrome_trace;
pub mod coverage;
pub mod firefox;
pub mod flame;
pub mod json;
pub mod pprof;
pub mod slowest;
pub mod speedscope;
pub mod text;
pub mod timeline;

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
            SortKey::Avg => incl.avg(f.timed_calls()),
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

/// Sorts sampled functions by `key`, given each one's (self samples,
/// samples on the stack, name): self samples for `excl`, names for `name`,
/// else samples on the stack (samples count no calls: the other keys, which
/// need calls, sort as the inclusive total does). Largest first.
pub fn sort_sampled<T>(items: &mut [T], key: SortKey, parts: impl Fn(&T) -> (u64, u64, &str)) {
    items.sort_by(|a, b| {
        let ((a_self, a_total, a_name), (b_self, b_total, b_name)) = (parts(a), parts(b));
        match key {
            SortKey::Name => a_name.cmp(b_name),
            SortKey::Excl => b_self.cmp(&a_self).then(b_total.cmp(&a_total)).then(a_name.cmp(b_name)),
            _ => b_total.cmp(&a_total).then(b_self.cmp(&a_self)).then(a_name.cmp(b_name)),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_functions_sort_by_self_total_or_name() {
        let sorted = |key| {
            let mut items = vec![(5, 10, "b"), (8, 8, "a"), (1, 20, "c")];
            sort_sampled(&mut items, key, |&(own, total, name)| (own, total, name));
            items.iter().map(|i| i.2).collect::<String>()
        };
        assert_eq!(sorted(SortKey::Excl), "abc");
        assert_eq!(sorted(SortKey::Incl), "cba");
        assert_eq!(sorted(SortKey::Calls), "cba");
        assert_eq!(sorted(SortKey::Name), "abc");
    }
}

//! Per-call statistics of one metric.

use serde::{Deserialize, Serialize};

/// Total, minimum and maximum of a metric over calls. The call count lives
/// with the function, so the average is `total / count` there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Sum over calls (for inclusive cost: over outermost calls only, so
    /// recursion is not counted twice).
    pub total: u64,
    /// Smallest value of one call (`u64::MAX` while there is none).
    pub min: u64,
    /// Largest value of one call.
    pub max: u64,
}

impl Default for Stat {
    fn default() -> Self {
        Stat { total: 0, min: u64::MAX, max: 0 }
    }
}

impl Stat {
    /// Records one call of cost `value`, counted in the total.
    pub fn add(&mut self, value: u64) {
        self.total = self.total.saturating_add(value);
        self.observe(value);
    }

    /// Records one call of cost `value` for min and max only (an inner
    /// recursive call, whose cost its outermost frame already counts).
    pub fn observe(&mut self, value: u64) {
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Folds another statistic of the same metric into this one.
    pub fn merge(&mut self, other: &Stat) {
        self.total = self.total.saturating_add(other.total);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Keeps the least and largest values of `calls` calls possible for
    /// what the total says once something was taken out of it (probe
    /// costs, callees' estimated time) or the extremes and the total were
    /// converted apart (each rounded on its own): the least no more than
    /// the average, the largest no more than what the others leave at the
    /// least each, and no less than the average (with one call, both are
    /// the total).
    pub fn keep_extremes_within(&mut self, calls: u64) {
        if calls == 0 || self.min == u64::MAX {
            return;
        }
        self.min = self.min.min(self.total / calls);
        self.max = self.max.min(self.total.saturating_sub((calls - 1).saturating_mul(self.min)));
        self.max = self.max.max(self.total.div_ceil(calls));
        if calls == 1 {
            self.min = self.total;
        }
    }

    /// The smallest value, or 0 when no call was seen.
    pub fn min_or_zero(&self) -> u64 {
        if self.min == u64::MAX { 0 } else { self.min }
    }

    /// Average over `count` calls.
    pub fn avg(&self, count: u64) -> u64 {
        self.total.checked_div(count).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_counts_toward_extremes_not_total() {
        let mut s = Stat::default();
        s.add(10);
        s.observe(3);
        s.observe(50);
        assert_eq!(s, Stat { total: 10, min: 3, max: 50 });
        assert_eq!(s.avg(2), 5);
        assert_eq!(Stat::default().min_or_zero(), 0);
    }

    #[test]
    fn extremes_are_kept_around_the_average_both_ways() {
        // One call whose total came out 15 ns above its extremes (rounded apart).
        let mut one = Stat { total: 519_259, min: 519_244, max: 519_244 };
        one.keep_extremes_within(1);
        assert_eq!((one.min, one.max), (519_259, 519_259));
        // Three calls whose total fell below what the extremes allow.
        let mut three = Stat { total: 90, min: 40, max: 100 };
        three.keep_extremes_within(3);
        assert_eq!((three.min, three.max), (30, 30));
        let mut fine = Stat { total: 90, min: 10, max: 50 };
        fine.keep_extremes_within(3);
        assert_eq!((fine.min, fine.max), (10, 50));
    }

    #[test]
    fn merge_keeps_min_of_mins_and_max_of_maxes() {
        let mut a = Stat { total: 10, min: 2, max: 8 };
        a.merge(&Stat { total: 5, min: 1, max: 4 });
        assert_eq!(a, Stat { total: 15, min: 1, max: 8 });
        a.merge(&Stat::default());
        assert_eq!(a, Stat { total: 15, min: 1, max: 8 });
    }
}

//! Per-call statistics of one metric.

use serde::{Deserialize, Serialize};

/// Total, minimum and maximum of a metric over calls. The call count lives
/// with the function, so the average is over that count there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Sum over calls (for inclusive cost: over outermost calls only, so
    /// recursion is not counted twice).
    pub total: u64,
    /// Smallest value of one call (`u64::MAX` while there is none).
    pub min: u64,
    /// Largest value of one call.
    pub max: u64,
    /// For inclusive cost, the sum over the calls `total` leaves out: those
    /// made within an outer call of the same function (recursion). The
    /// average is over every call, so it counts them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nested: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Default for Stat {
    fn default() -> Self {
        Stat::new(0, u64::MAX, 0)
    }
}

impl Stat {
    /// A total over calls with its extremes, no call nested in another.
    pub const fn new(total: u64, min: u64, max: u64) -> Self {
        Stat { total, min, max, nested: 0 }
    }

    /// Records one call of cost `value`, counted in the total.
    pub fn add(&mut self, value: u64) {
        self.total = self.total.saturating_add(value);
        self.observe(value);
    }

    /// Records one call of cost `value` made within an outer call of the
    /// same function, whose cost that outer call's already counts.
    pub fn add_nested(&mut self, value: u64) {
        self.nested = self.nested.saturating_add(value);
        self.observe(value);
    }

    /// Records one call of cost `value` for min and max only.
    fn observe(&mut self, value: u64) {
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Folds another statistic of the same metric into this one.
    pub fn merge(&mut self, other: &Stat) {
        self.total = self.total.saturating_add(other.total);
        self.nested = self.nested.saturating_add(other.nested);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The sum over every call, nested ones too.
    pub fn every_call(&self) -> u64 {
        self.total.saturating_add(self.nested)
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
        let every_call = self.every_call();
        self.min = self.min.min(every_call / calls);
        self.max = self.max.min(every_call.saturating_sub((calls - 1).saturating_mul(self.min)));
        self.max = self.max.max(every_call.div_ceil(calls));
        if calls == 1 {
            self.min = every_call;
        }
    }

    /// The smallest value, or 0 when no call was seen.
    pub fn min_or_zero(&self) -> u64 {
        if self.min == u64::MAX { 0 } else { self.min }
    }

    /// Average over `count` calls, nested ones too.
    pub fn avg(&self, count: u64) -> u64 {
        self.every_call().checked_div(count).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_calls_count_toward_extremes_and_average_not_total() {
        // f's outer call took 10 and held calls of 3 and 5.
        let mut s = Stat::default();
        s.add(10);
        s.add_nested(3);
        s.add_nested(5);
        assert_eq!(s, Stat { total: 10, min: 3, max: 10, nested: 8 });
        assert_eq!(s.avg(3), 6);
        assert_eq!(Stat::default().min_or_zero(), 0);
        // What is nested stays so in a merge.
        let mut merged = Stat::new(4, 4, 4);
        merged.merge(&s);
        assert_eq!((merged.total, merged.nested, merged.avg(4)), (14, 8, 5));
    }

    #[test]
    fn extremes_of_nested_calls_are_kept_within_every_calls_sum() {
        // Three calls, two nested: a least value of 2 is possible for 30 in all.
        let mut s = Stat { total: 20, min: 2, max: 20, nested: 10 };
        s.keep_extremes_within(3);
        assert_eq!((s.min, s.max), (2, 20));
    }

    #[test]
    fn extremes_are_kept_around_the_average_both_ways() {
        // One call whose total came out 15 ns above its extremes (rounded apart).
        let mut one = Stat::new(519_259, 519_244, 519_244);
        one.keep_extremes_within(1);
        assert_eq!((one.min, one.max), (519_259, 519_259));
        // Three calls whose total fell below what the extremes allow.
        let mut three = Stat::new(90, 40, 100);
        three.keep_extremes_within(3);
        assert_eq!((three.min, three.max), (30, 30));
        let mut fine = Stat::new(90, 10, 50);
        fine.keep_extremes_within(3);
        assert_eq!((fine.min, fine.max), (10, 50));
    }

    #[test]
    fn merge_keeps_min_of_mins_and_max_of_maxes() {
        let mut a = Stat::new(10, 2, 8);
        a.merge(&Stat::new(5, 1, 4));
        assert_eq!(a, Stat::new(15, 1, 8));
        a.merge(&Stat::default());
        assert_eq!(a, Stat::new(15, 1, 8));
    }
}

//! What changes the probes while the program runs. The overhead governor:
//! a function whose probes cost the target more than a share of the
//! elapsed time loses its probes; its counts stay exact up to that moment,
//! sampling covers it after. Automatic instrumentation: after a warm-up of
//! sampling only, the hottest functions sampled get probes.

use proftap_probes::plan::ProbedFunction;

/// Calls a function must have made before its cost is judged: the first
/// milliseconds of a run say little.
const MIN_CALLS: u64 = 1000;

/// Decides which functions to stop instrumenting.
pub struct Governor {
    budget: f64,
    call_ns: Vec<u64>,
    throttled: Vec<bool>,
}

impl Governor {
    /// A governor allowing each function's probes `budget` (0.05 for 5%) of
    /// the elapsed time; `call_ns[f]` is what one instrumented call of `f` costs.
    pub fn new(budget: f64, call_ns: Vec<u64>) -> Self {
        let throttled = vec![false; call_ns.len()];
        Governor { budget, call_ns, throttled }
    }

    /// Functions not yet throttled whose `calls` so far cost more than the
    /// budget of `elapsed_ns`; they count as throttled from now on.
    pub fn over_budget(&mut self, calls: &[u64], elapsed_ns: u64) -> Vec<u32> {
        let allowed = self.budget * elapsed_ns as f64;
        let mut over = Vec::new();
        for (f, (&n, &cost)) in calls.iter().zip(&self.call_ns).enumerate() {
            if !self.throttled[f] && n >= MIN_CALLS && (n as f64) * (cost as f64) > allowed {
                self.throttled[f] = true;
                over.push(f as u32);
            }
        }
        over
    }

    /// Whether `f` was throttled.
    pub fn is_throttled(&self, f: usize) -> bool {
        self.throttled.get(f).copied().unwrap_or(false)
    }

    /// Which functions are still instrumented.
    pub fn enabled(&self) -> Vec<bool> {
        self.throttled.iter().map(|t| !t).collect()
    }
}

/// The first `count` of `functions` among `hot` (sampled functions, hottest
/// first: name, module, samples), by index.
pub fn hottest_functions(hot: &[(String, String, u64)], functions: &[ProbedFunction], count: usize) -> Vec<usize> {
    hot.iter().filter_map(|(name, _, _)| functions.iter().position(|f| &f.info.name == name)).take(count).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_cheap_function_is_throttled_once_and_others_are_kept() {
        // f0: 1 us per call; f1 the same; f2: 10 us.
        let mut g = Governor::new(0.05, vec![1_000, 1_000, 10_000]);
        // 100 ms elapsed: 5 ms of probes allowed per function.
        assert_eq!(g.over_budget(&[6_000, 4_000, 1_000], 100_000_000), vec![0, 2]);
        assert!(g.is_throttled(0) && !g.is_throttled(1) && g.is_throttled(2));
        // Already throttled functions are not reported again.
        assert_eq!(g.over_budget(&[60_000, 4_000, 6_000], 100_000_000), Vec::<u32>::new());
        assert_eq!(g.enabled(), vec![false, true, false]);
    }

    #[test]
    fn few_calls_are_never_judged() {
        let mut g = Governor::new(0.05, vec![1_000_000]);
        assert!(g.over_budget(&[999], 1_000_000).is_empty());
    }
}

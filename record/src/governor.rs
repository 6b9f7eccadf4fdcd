//! What changes the probes while the program runs. The overhead governor:
//! when the probes of all functions together cost the target more than a
//! share of the elapsed time, the costliest lose theirs; their counts stay
//! exact up to that moment, sampling covers them after. Automatic instrumentation: after a warm-up of
//! sampling only, the hottest functions sampled get probes.

use proftap_probes::plan::ProbedFunction;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// How long the program must have run before costs are judged: the first
/// milliseconds of a run say little.
const SETTLE_NS: u64 = 2_000_000;

/// A function whose probes have cost less than this many of its calls so
/// far is not throttled: a burst of a few calls (a setup routine, a
/// handful of callbacks) looks costly in a short window, but its probes
/// cost at most that much over the run, less than the new probe set that
/// would take them out.
const FEWEST_JUDGED_CALLS: u64 = 16;

/// The stretch of the run the budget holds over: the probes may cost more
/// in a burst of calls (a shell computing between waits for its children)
/// as long as the last second's total fits; a long quiet start (an attach
/// to an idle server) leaves no more credit than that.
const HORIZON_NS: u64 = 1_000_000_000;

/// How many times the budget the probes may cost in a recent window while
/// the last second's total is within it: a burst that costly (the program
/// at half speed or worse, and under uprobes records made faster than
/// they are read) is throttled at once.
const MOST_RECENT_TIMES_BUDGET: f64 = 10.0;

/// Samples in the probes' own code before they are believed over the
/// estimate: five milliseconds of the probes' time at 1 kHz.
const TRUSTED_PROBE_SAMPLES: u64 = 5;

/// Samples in the counting stubs before they are believed over the
/// estimate: more than the probes', since they may multiply it by more
/// (see [`MOST_COUNTING_SCALE`]), and a few early samples would stop the
/// counting of a whole run.
const TRUSTED_COUNTING_SAMPLES: u64 = 10;

/// What the estimated cost of a call is taken times until enough samples
/// in the probes' code say otherwise: a real program's calls miss the
/// caches the calibrating loop hits, and cost up to twice the calibration
/// (SQLite's probes held 5.5% of its samples, median of 7 runs, with the
/// estimate alone at the start).
const UNTRUSTED_PROBE_SCALE: f64 = 2.0;

/// The same for the counting stubs, which cost 3 to 7 times their estimate
/// in SQLite and Lua (see [`MOST_COUNTING_SCALE`]).
const UNTRUSTED_COUNTING_SCALE: f64 = 3.0;

/// The same while the counts go without `lock` (a launched process with
/// one thread): 0.3 to 0.6 ns a counted call by the stubs' samples in
/// SQLite with every function counted to the end, 37 M counted calls (the
/// `lock inc` of a counter per CPU: 2.2 to 2.7; BENCHMARKS.md). So cheap
/// a count takes a run's whole length to gather the samples believed.
const UNTRUSTED_ALONE_COUNTING_SCALE: f64 = 0.5;

/// The least the samples may multiply the estimated cost of counting a
/// call by: a count may cost less than the estimate (without `lock`, or a
/// locked one where the code before it has few stores pending), and
/// enough samples (see [`TRUSTED_COUNTING_SAMPLES`]) say so.
const LEAST_COUNTING_SCALE: f64 = 0.25;

/// The most the samples may multiply the estimated cost of a call by: a
/// few samples more or less (as many as the probes' whole estimate, early
/// in a run) throttle no more than that.
const MOST_SCALE: f64 = 3.0;

/// The most the samples may multiply the estimated cost of counting a call
/// by: a `lock inc` waits for the stores before it, which a loop calibrating
/// it has few of (in SQLite and Lua, counting cost 3 to 7 times the
/// estimate), and threads counting on several CPUs at once contend (12 to
/// 25 ns a call here) where the processor cannot tell a thread its CPU
/// for a counter of its own (no `rdpid`).
const MOST_COUNTING_SCALE: f64 = 25.0;

/// What a call costs once its function's probes were taken out and its
/// entry only counts it: a jump, an increment and a jump back; in a loop
/// of 100 M calls here (BENCHMARKS.md) 0.8 ns with a plain `inc` (while a
/// launched process has one thread), 1.4 ns with `rdpid` and a `lock inc`
/// of the running CPU's counter. Real code makes the locked one dearer
/// (2.2 to 2.7 ns in SQLite, 0.3 to 0.6 the plain one), and so do threads
/// on several CPUs counting the same function at once where they share
/// one counter (12 to 25 ns here): the samples in the counting stubs scale
/// it, up or down (see [`SampledOverhead`]).
pub const COUNTED_CALL_NS: u64 = 1;

/// Stack samples of the target taken in the in-process engine's code
/// (`[probe overhead]` there): what the patched functions' probes cost,
/// measured. A call's cost is calibrated on a loop whose every access hits
/// the caches; in a real program's calls the runtime misses them too, and
/// costs up to twice the calibration. (The calls of functions named with
/// `-f`, which are never throttled, are in the samples and not in the
/// estimate: the scale errs towards throttling.)
///
/// Samples in the counting stubs of functions whose probes were taken
/// out are kept apart: they measure what counting those calls costs; and
/// each function's apart again, so that the stubs of functions no longer
/// counted (the hottest, whose counting cost the most a call) stop
/// pricing those still counted.
#[derive(Default, Debug)]
pub struct SampledOverhead {
    in_probes: AtomicU64,
    in_counting: AtomicU64,
    /// Of `in_counting`, those in each function's stub (by index).
    by_function: Box<[AtomicU64]>,
}

impl SampledOverhead {
    /// Samples of the code of `functions` functions, the counting stubs of each told apart.
    pub fn of_functions(functions: usize) -> Self {
        SampledOverhead { by_function: (0..functions).map(|_| AtomicU64::new(0)).collect(), ..Self::default() }
    }

    /// One sample more taken in the engine's code.
    pub fn count(&self) {
        self.in_probes.fetch_add(1, Ordering::Relaxed);
    }

    /// One sample more taken in `function`'s counting stub (a hook's,
    /// numbered past the functions, counts in the total alone).
    pub fn count_counting(&self, function: u32) {
        self.in_counting.fetch_add(1, Ordering::Relaxed);
        if let Some(samples) = self.by_function.get(function as usize) {
            samples.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Samples taken in the engine's code so far.
    pub fn in_probes(&self) -> u64 {
        self.in_probes.load(Ordering::Relaxed)
    }

    /// Samples taken in the counting stubs so far.
    pub fn in_counting(&self) -> u64 {
        self.in_counting.load(Ordering::Relaxed)
    }

    /// Samples taken in `function`'s counting stub so far.
    pub fn in_counting_of(&self, function: usize) -> u64 {
        self.by_function.get(function).map_or(0, |samples| samples.load(Ordering::Relaxed))
    }
}

/// Decides which functions to stop instrumenting: the probes of all
/// functions together may cost the target `budget` of the elapsed time.
/// When they cost more over the last second of the run (or the run so
/// far, when shorter), the functions costing the most lately lose their
/// probes first, until the rest cost half the budget lately, to win back
/// what was spent; counting yields last (see [`Governor::over_budget_spent`]). A burst costlier than the budget is not judged alone:
/// a program computing between waits (a shell between its children)
/// keeps its probes while the second's total fits, unless the burst costs
/// many times the budget. Where stack samples say the probes cost more than
/// that estimate, each call's cost is scaled up to what they say.
pub struct Governor {
    budget: f64,
    call_ns: Vec<u64>,
    /// The samples, and the nanoseconds of CPU time each stands for.
    sampled: Option<(Arc<SampledOverhead>, u64)>,
    /// Without samples, whether the priors stand (see [`Governor::with_priors`]).
    priors: bool,
    /// Whether counted calls go without `lock` (see [`Governor::set_counting_alone`]).
    counting_alone: bool,
    /// What the counted calls had cost by the estimate at the last
    /// judgement while they went without `lock`: priced as such after.
    counted_alone: f64,
    throttled: Vec<bool>,
    /// Calls by function and the time at the last judgement.
    last: Vec<u64>,
    last_ns: u64,
    /// What each function cost so far, kept between judgements to reuse its memory.
    spent: Vec<u64>,
    /// Where the functions that stand for others' calls only counted start.
    counted_from: Option<usize>,
    /// At each judgement of the last second and the one before it: when,
    /// and what the probes and the counting had cost so far (estimated).
    history: std::collections::VecDeque<(u64, f64, f64)>,
}

impl Governor {
    /// A governor allowing the probes `budget` (0.05 for 5%) of the elapsed
    /// time; `call_ns[f]` is what one instrumented call of `f` costs (0: not
    /// this governor's to judge).
    pub fn new(budget: f64, call_ns: Vec<u64>) -> Self {
        let throttled = vec![false; call_ns.len()];
        let last = vec![0; call_ns.len()];
        let history = std::collections::VecDeque::new();
        Governor {
            budget,
            call_ns,
            sampled: None,
            priors: false,
            counting_alone: false,
            counted_alone: 0.0,
            throttled,
            last,
            last_ns: 0,
            spent: Vec::new(),
            counted_from: None,
            history,
        }
    }

    /// The same, its functions from `from` on standing for the calls of
    /// those below, only counted after their throttle (the in-process
    /// engine's `Judge`): their cost is not scaled by the probes' samples.
    pub fn with_counted_calls(mut self, from: usize) -> Self {
        self.counted_from = Some(from);
        self
    }

    /// The same, believing `sampled` where it says the probes cost more
    /// than estimated, each sample standing for `ns_per_sample` of CPU time.
    pub fn with_samples(mut self, sampled: Arc<SampledOverhead>, ns_per_sample: u64) -> Self {
        self.sampled = Some((sampled, ns_per_sample));
        self
    }

    /// The same, the in-process engine's, without samples: its priors
    /// stand for the whole run (see [`UNTRUSTED_PROBE_SCALE`] and
    /// [`UNTRUSTED_COUNTING_SCALE`]), nothing measuring what its calls
    /// cost beyond the calibrating loop's.
    pub fn with_priors(mut self) -> Self {
        self.priors = true;
        self
    }

    /// Whether the counted calls go without `lock` now (the engine tells
    /// at each look: they go with it from a process's second thread on).
    pub fn set_counting_alone(&mut self, alone: bool) {
        self.counting_alone = alone;
    }

    /// How much more the probes (`counting`: the counting stubs) cost than
    /// `estimated_ns` over the run, by the `samples` taken in their code
    /// (a prior until there are enough). Without samples, the priors where
    /// asked (see [`Governor::with_priors`]), else the estimate stands.
    fn scale(&self, estimated_ns: f64, samples: u64, counting: bool) -> f64 {
        self.scale_of(estimated_ns, samples, counting, self.counting_alone)
    }

    /// [`Governor::scale`], of counts made without `lock` or not (`alone`).
    fn scale_of(&self, estimated_ns: f64, samples: u64, counting: bool, alone: bool) -> f64 {
        let prior = match (counting, alone) {
            (false, _) => UNTRUSTED_PROBE_SCALE,
            (true, false) => UNTRUSTED_COUNTING_SCALE,
            (true, true) => UNTRUSTED_ALONE_COUNTING_SCALE,
        };
        let Some((_, ns_per_sample)) = &self.sampled else {
            return if self.priors { prior } else { 1.0 };
        };
        let (trusted, least, most) = match counting {
            true => (TRUSTED_COUNTING_SAMPLES, LEAST_COUNTING_SCALE, MOST_COUNTING_SCALE),
            false => (TRUSTED_PROBE_SAMPLES, 1.0, MOST_SCALE),
        };
        if samples < trusted || estimated_ns <= 0.0 {
            return prior;
        }
        (samples as f64 * *ns_per_sample as f64 / estimated_ns).clamp(least, most)
    }

    /// Functions to throttle now, given the `calls` so far by function after
    /// `elapsed_ns`; they count as throttled from now on.
    pub fn over_budget(&mut self, calls: &[u64], elapsed_ns: u64) -> Vec<u32> {
        let mut spent = std::mem::take(&mut self.spent);
        spent.clear();
        spent.extend(calls.iter().enumerate().map(|(f, &n)| n.saturating_mul(self.call_ns(f))));
        let over = self.over_budget_spent(&spent, elapsed_ns);
        self.spent = spent;
        over
    }

    /// The same, given what each function's probes cost so far by the
    /// estimate (ns): its calls' and, where probes follow its lines,
    /// theirs. Functions whose call costs nothing are not judged.
    ///
    /// The watch asks every millisecond or so, over thousands of functions
    /// most of which are never called: one pass, nothing allocated per
    /// function.
    pub fn over_budget_spent(&mut self, spent: &[u64], elapsed_ns: u64) -> Vec<u32> {
        if elapsed_ns < SETTLE_NS || elapsed_ns <= self.last_ns {
            return Vec::new();
        }
        let window = (elapsed_ns - self.last_ns) as f64;
        self.last.resize(self.call_ns.len(), 0);
        // What the probes and the counting cost so far, and what each
        // function still instrumented cost lately (ns of it in the window).
        let (mut probes, mut counted) = (0.0, 0.0);
        // What functions no longer counted had cost by the estimate, and
        // the samples in their stubs: neither says what counting the
        // others costs.
        let (mut counting_stopped, mut samples_of_stopped) = (0.0, 0);
        let mut recent: Vec<(u64, usize)> = Vec::new();
        for (f, (&ns, last)) in spent.iter().zip(self.last.iter_mut()).enumerate() {
            let call_ns = self.call_ns.get(f).copied().unwrap_or(0);
            if call_ns == 0 {
                continue;
            }
            let counted_only = self.counted_from.is_some_and(|from| f >= from);
            *if counted_only { &mut counted } else { &mut probes } += ns as f64;
            if counted_only && self.throttled.get(f).copied().unwrap_or(false) {
                counting_stopped += ns as f64;
                let of = f - self.counted_from.unwrap_or(0);
                samples_of_stopped += self.sampled.as_ref().map_or(0, |(sampled, _)| sampled.in_counting_of(of));
            }
            let lately = ns.saturating_sub(std::mem::replace(last, ns));
            let judged = ns >= FEWEST_JUDGED_CALLS.saturating_mul(call_ns) && !self.throttled.get(f).copied().unwrap_or(true);
            if judged && lately > 0 {
                recent.push((lately, f));
            }
        }
        self.last_ns = elapsed_ns;
        // The samples in the probes' code say what the probes cost, those
        // in the counting stubs what counting cost; those in the stubs of
        // the functions still counted what counting them costs.
        let (probe_samples, counting_samples) = self.sampled.as_ref().map_or((0, 0), |(s, _)| (s.in_probes(), s.in_counting()));
        let scale = self.scale(probes, probe_samples, false);
        let counting_cost_scale = self.scale(counted, counting_samples, true);
        let counting_scale = self.scale(counted - counting_stopped, counting_samples.saturating_sub(samples_of_stopped), true);
        let scale_of = |f: usize| if self.is_counted_only(f) { counting_scale } else { scale };
        let rates: Vec<(f64, usize)> = recent.into_iter().map(|(ns, f)| (ns as f64 * scale_of(f) / window, f)).collect();
        // The budget holds over the last second: probes costing more than
        // it in a burst are kept while the second's total stays within it,
        // up to a point.
        let mut rate: f64 = rates.iter().map(|(r, _)| r).sum();
        let (since_ns, probes_then, counted_then) = self.horizon(elapsed_ns, probes, counted);
        // Counts made without `lock` keep their price once a thread starts
        // (never alone again after: the runtime locks them for good).
        if self.counting_alone {
            self.counted_alone = counted;
        }
        let counted_since = (counted - counted_then).max(0.0);
        let counted_alone = (self.counted_alone - counted_then).max(0.0).min(counted_since);
        let alone_cost_scale = self.scale_of(counted, counting_samples, true, true);
        let spent_since =
            (probes - probes_then) * scale + (counted_since - counted_alone) * counting_cost_scale + counted_alone * alone_cost_scale;
        let overspent = spent_since > self.budget * (elapsed_ns - since_ns) as f64;
        if !overspent && rate <= MOST_RECENT_TIMES_BUDGET * self.budget {
            return Vec::new();
        }
        // Half the budget from now on, to win back what was spent. Counting
        // yields last: a function whose timing goes keeps exact calls, one
        // whose counting goes has its calls estimated or unknown; so
        // counting stops only where counting alone costs more than that
        // half, the costliest first, and timing gives way for the rest.
        let target = self.budget / 2.0;
        let (mut counting, mut timing): (Vec<_>, Vec<_>) = rates.into_iter().partition(|&(_, f)| self.is_counted_only(f));
        let mut counting_rate: f64 = counting.iter().map(|(r, _)| r).sum();
        counting.sort_by(|a, b| b.0.total_cmp(&a.0));
        timing.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut over = Vec::new();
        for (r, f) in counting {
            if counting_rate <= target {
                break;
            }
            counting_rate -= r;
            rate -= r;
            over.push(f);
        }
        for (r, f) in timing {
            if rate <= target {
                break;
            }
            rate -= r;
            over.push(f);
        }
        over.sort_unstable();
        over.iter().for_each(|&f| self.throttled[f] = true);
        over.into_iter().map(|f| f as u32).collect()
    }

    /// Notes what the probes and the counting cost by `elapsed_ns`, and
    /// returns when the horizon starts and what they had cost by then: the
    /// last judgement a second or more before, or the run's start.
    fn horizon(&mut self, elapsed_ns: u64, probes: f64, counted: f64) -> (u64, f64, f64) {
        self.history.push_back((elapsed_ns, probes, counted));
        while self.history.get(1).is_some_and(|&(at, ..)| at.saturating_add(HORIZON_NS) <= elapsed_ns) {
            self.history.pop_front();
        }
        match self.history.front() {
            Some(&oldest) if oldest.0.saturating_add(HORIZON_NS) <= elapsed_ns => oldest,
            _ => (0, 0.0, 0.0),
        }
    }

    fn call_ns(&self, f: usize) -> u64 {
        self.call_ns.get(f).copied().unwrap_or(0)
    }

    /// Whether `f` stands for the calls of another only counted after its
    /// throttle (see [`Governor::with_counted_calls`]).
    fn is_counted_only(&self, f: usize) -> bool {
        self.counted_from.is_some_and(|from| f >= from)
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
    fn many_cheap_functions_together_over_the_budget_lose_their_probes_costliest_first() {
        // Ten functions at 100 ns a call, each under 5% of the run, 30% together.
        let mut g = Governor::new(0.05, vec![100; 10]);
        let ms = 1_000_000;
        // 10 ms in: each made 3,000 calls (0.3 ms of probes, 3%); f9 twice as many.
        let mut calls = vec![3_000u64; 10];
        calls[9] = 6_000;
        let over = g.over_budget(&calls, 10 * ms);
        assert!(over.contains(&9), "the costliest goes first: {over:?}");
        // What is left fits in half the budget, since the run's total is over it.
        let left: u64 = (0..10).filter(|f| !over.contains(&(*f as u32))).map(|f| calls[f] * 100).sum();
        assert!(left as f64 <= 0.025 * (10 * ms) as f64, "{left} ns left of 10 ms");
        // Throttled functions are not reported again; calls no longer grow there.
        let later: Vec<u64> = (0..10).map(|f| if over.contains(&(f as u32)) { calls[f] } else { calls[f] * 2 }).collect();
        assert!(g.over_budget(&later, 20 * ms).iter().all(|f| !over.contains(f)));
    }

    #[test]
    fn a_run_within_the_budget_keeps_every_probe() {
        let mut g = Governor::new(0.05, vec![100; 3]);
        assert!(g.over_budget(&[1_000, 2_000, 3_000], 100_000_000).is_empty());
        assert!(g.over_budget(&[2_000, 4_000, 6_000], 200_000_000).is_empty());
        assert_eq!(g.enabled(), vec![true; 3]);
    }

    #[test]
    fn samples_in_the_probes_scale_the_estimate_up() {
        let ms = 1_000_000;
        // Three functions at 100 ns a call: 4% of 100 ms by the estimate.
        let calls = [10_000u64, 15_000, 15_000];
        let sampled = Arc::new(SampledOverhead::default());
        let mut trusting = Governor::new(0.05, vec![100; 3]).with_samples(sampled.clone(), ms);
        let mut estimating = Governor::new(0.05, vec![100; 3]);
        // 10 samples of 1 ms in the probes: 10 ms, 2.5 times the estimate.
        (0..10).for_each(|_| sampled.count());
        assert!(estimating.over_budget(&calls, 100 * ms).is_empty());
        let over = trusting.over_budget(&calls, 100 * ms);
        assert!(!over.is_empty(), "10% of the run by the samples");
        assert!(!over.contains(&0), "the costliest go first: {over:?}");
        // Samples saying less than the estimate (12 of 0.1 ms): the estimate holds.
        let few = Arc::new(SampledOverhead::default());
        (0..12).for_each(|_| few.count());
        assert!(Governor::new(0.05, vec![100; 3]).with_samples(few, ms / 10).over_budget(&calls, 100 * ms).is_empty());
    }

    #[test]
    fn a_few_samples_are_not_believed_and_many_scale_by_three_at_most() {
        let ms = 1_000_000;
        let sampled = |in_probes: u64| {
            let s = Arc::new(SampledOverhead::default());
            (0..in_probes).for_each(|_| s.count());
            s
        };
        // 2% by the estimate, 4% with the prior; four samples of 10 ms
        // would say 40%: too few to believe.
        let calls = [5_000u64, 7_500, 7_500];
        assert!(Governor::new(0.05, vec![100; 3]).with_samples(sampled(4), 10 * ms).over_budget(&calls, 100 * ms).is_empty());
        // 3% by the estimate: within the budget alone, over it with the
        // prior until the samples are believed.
        let calls = [7_500u64, 11_250, 11_250];
        assert!(Governor::new(0.05, vec![100; 3]).over_budget(&calls, 100 * ms).is_empty());
        assert!(!Governor::new(0.05, vec![100; 3]).with_samples(sampled(0), ms).over_budget(&calls, 100 * ms).is_empty());
        // 1% by the estimate, all of the run by the samples: three times the estimate, within the budget.
        let calls = [10_000u64];
        assert!(Governor::new(0.05, vec![100]).with_samples(sampled(100), ms).over_budget(&calls, 100 * ms).is_empty());
        // Twice that estimate, the samples the same: 6%, over it.
        let calls = [20_000u64];
        assert_eq!(Governor::new(0.05, vec![100]).with_samples(sampled(100), ms).over_budget(&calls, 100 * ms), vec![0]);
    }

    #[test]
    fn what_a_functions_line_probes_cost_counts_against_the_budget() {
        let ms = 1_000_000;
        let costs = crate::cost::UprobeCosts { call_ns: vec![3_000, 3_000], line_ns: vec![(0, 1_500), (0, 1_500), (1, 1_500)] };
        // main (0), called once, hits its two line probes 10,000 times each
        // in 100 ms: 30 ms of probes; f (1), ten calls, one line probe.
        let spent = costs.spent(&[1, 10], &[10_000, 10_000, 10]);
        assert_eq!(spent, vec![3_000 + 30_000_000, 30_000 + 15_000]);
        assert_eq!(Governor::new(0.05, costs.call_ns.clone()).over_budget_spent(&spent, 100 * ms), vec![0]);
        // By its calls alone, main costs nothing worth judging.
        assert!(Governor::new(0.05, costs.call_ns.clone()).over_budget(&[1, 10], 100 * ms).is_empty());
    }

    #[test]
    fn a_burst_of_a_few_calls_keeps_its_probes_past_a_throttle() {
        let ms = 1_000_000;
        // f0 ran hot and lost its probes; the run is over budget since.
        let mut g = Governor::new(0.05, vec![6_000; 129]);
        let mut calls = vec![0u64; 129];
        calls[0] = 10_000;
        assert_eq!(g.over_budget(&calls, 20 * ms), vec![0]);
        // Then 128 functions called three times each in 3 ms: 77% of that
        // window, but 18 us a function over the whole run.
        calls[1..].fill(3);
        assert!(g.over_budget(&calls, 23 * ms).is_empty());
        // Called on: judged.
        calls[1..].fill(30);
        assert_eq!(g.over_budget(&calls, 26 * ms).len(), 128);
    }

    #[test]
    fn a_burst_over_the_budget_keeps_its_probes_while_the_run_is_within_it() {
        let ms = 1_000_000;
        let mut g = Governor::new(0.05, vec![1_000; 2]);
        // 100 ms in: 1 ms of probes.
        assert!(g.over_budget(&[1_000, 0], 100 * ms).is_empty());
        // A burst of 2 ms, half of it in f1's probes: 2% of the run.
        assert!(g.over_budget(&[1_000, 1_000], 102 * ms).is_empty());
        // Bursts until the run's total is over 5%: the costliest lately goes.
        assert!(g.over_budget(&[1_000, 4_000], 108 * ms).is_empty());
        assert_eq!(g.over_budget(&[1_000, 5_000], 110 * ms), vec![1]);
        assert_eq!(g.enabled(), vec![true, false]);
    }

    #[test]
    fn a_quiet_start_leaves_a_seconds_credit_at_most() {
        let ms = 1_000_000;
        let mut g = Governor::new(0.05, vec![1_000; 2]);
        // Ten seconds in, nothing spent, judged every 100 ms.
        for at in (100..=10_000).step_by(100) {
            assert!(g.over_budget(&[0, 0], at * ms).is_empty());
        }
        // Then 30% of each 100 ms: over 5% of the last second after two.
        assert!(g.over_budget(&[30_000, 0], 10_100 * ms).is_empty());
        assert_eq!(g.over_budget(&[60_000, 0], 10_200 * ms), vec![0]);
    }

    #[test]
    fn a_burst_many_times_over_the_budget_is_throttled_whatever_the_credit() {
        let ms = 1_000_000;
        let mut g = Governor::new(0.05, vec![1_000; 2]);
        // A second in, nothing spent: 50 ms of credit.
        assert!(g.over_budget(&[0, 0], 1_000 * ms).is_empty());
        // 40% of a 10 ms window: 4 ms, within the credit, under ten times the budget.
        assert!(g.over_budget(&[4_000, 0], 1_010 * ms).is_empty());
        // 60% of the next: throttled.
        assert_eq!(g.over_budget(&[10_000, 0], 1_020 * ms), vec![0]);
    }

    /// A function's calls only counted after its throttle are judged as a
    /// function of their own (see `Judge`): cheap enough, they stay
    /// counted; not, counting stops too.
    #[test]
    fn calls_only_counted_are_judged_at_their_own_cost() {
        let ms = 1_000_000;
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1);
        // 10 ms in: 10,000 timed calls, 1 ms of probes, 10%.
        assert_eq!(g.over_budget(&[10_000, 0], 10 * ms), vec![0]);
        // Then 20,000 calls counted in 10 ms: 20 us, 0.2%.
        assert!(g.over_budget(&[10_000, 20_000], 20 * ms).is_empty());
        // Then 2.5 million in 10 ms: 2.5 ms, a quarter of the time: no longer counted.
        assert_eq!(g.over_budget(&[10_000, 2_520_000], 30 * ms), vec![1]);
        assert_eq!(g.enabled(), vec![false, false]);
        // The probes' samples say nothing of calls only counted: 100 samples
        // of 1 ms in the probes scale the probes' cost, not the counting's.
        let sampled = Arc::new(SampledOverhead::default());
        (0..100).for_each(|_| sampled.count());
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(sampled, ms);
        assert_eq!(g.over_budget(&[10_000, 0], 10 * ms), vec![0]);
        // 150,000 counted in 20 ms: 0.15 ms, 0.75%, thrice that until the
        // counting stubs' own samples are believed: under the half of the
        // budget aimed at.
        assert!(g.over_budget(&[10_000, 150_000], 30 * ms).is_empty());
    }

    /// Over the budget, timing gives way before counting: a function no
    /// longer timed keeps exact calls, one no longer counted does not.
    /// Counting stops only where it alone costs more than half the budget.
    #[test]
    fn timing_gives_way_before_counting() {
        let ms = 1_000_000;
        let mut g = Governor::new(0.05, vec![100, 100, COUNTED_CALL_NS, COUNTED_CALL_NS]).with_counted_calls(2);
        let (f1, f0_counted) = (1u32, 2u32);
        // 10 ms in: f0's 10,000 calls are 10% of the time; f1's 200, 0.2%.
        assert_eq!(g.over_budget(&[10_000, 200, 0, 0], 10 * ms), vec![0]);
        // The next 10 ms: f0's calls counted cost 2% (200,000 of 1 ns), f1's
        // timed 1% (1,000 of 100 ns): 3%, over the half of the budget aimed
        // at while the run is over it. f1's timing goes, f0's counting stays.
        assert_eq!(g.over_budget(&[10_000, 1_200, 200_000, 0], 20 * ms), vec![f1]);
        // Counting f0 alone at 3% of the next 10 ms: stopped.
        assert_eq!(g.over_budget(&[10_000, 1_200, 500_000, 0], 30 * ms), vec![f0_counted]);
        assert_eq!(g.enabled(), vec![false, false, false, true]);
    }

    /// Counts made without `lock` are priced at their own prior, and the
    /// samples in their stubs may say they cost less than the estimate,
    /// down to a quarter of it.
    #[test]
    fn counting_without_lock_is_judged_at_its_own_prior_and_samples() {
        let ms = 1_000_000;
        // 6,000 timed calls of 100 ns in 10 ms (6%: throttled), then
        // 500,000 calls counted in 20 ms: 1.25% at the prior of counts
        // without `lock`, within the half of the budget aimed at; 7.5% at
        // that of locked counts.
        let judged = |alone: bool| {
            let sampled = Arc::new(SampledOverhead::default());
            let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(sampled, ms);
            g.set_counting_alone(alone);
            (g.over_budget(&[6_000, 0], 10 * ms), g.over_budget(&[6_000, 500_000], 30 * ms))
        };
        assert_eq!(judged(false), (vec![0], vec![1]));
        assert_eq!(judged(true), (vec![0], vec![]));
        // Enough samples in the stubs say what counting costs, below the
        // estimate too: 900,000 calls counted in 20 ms (0.9 ms at 1 ns,
        // over half the budget) that ten samples of 30 us say cost 0.3 ms.
        let sampled = Arc::new(SampledOverhead::default());
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(sampled.clone(), 30_000);
        g.set_counting_alone(true);
        assert_eq!(g.over_budget(&[6_000, 0], 10 * ms), vec![0]);
        (0..10).for_each(|_| sampled.count_counting(1));
        assert!(g.over_budget(&[6_000, 900_000], 30 * ms).is_empty());
        // Never below a quarter of the estimate: 6 M more in 10 ms, 1.5 ms
        // at a quarter of a nanosecond (the samples alone would say 0.26).
        assert_eq!(g.over_budget(&[6_000, 6_900_000], 40 * ms), vec![1]);
    }

    /// When the first thread starts, counts made without `lock` before it
    /// keep their price: the run is not found over its budget for them.
    #[test]
    fn counts_made_alone_keep_their_price_once_a_thread_starts() {
        let ms = 1_000_000;
        let sampled = Arc::new(SampledOverhead::default());
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(sampled, ms);
        g.set_counting_alone(true);
        // 5,500 timed calls of 100 ns in 10 ms (1.1 ms at the prior:
        // throttled), then 600,000 counted in 20 ms: 0.3 ms alone.
        assert_eq!(g.over_budget(&[5_500, 0], 10 * ms), vec![0]);
        assert!(g.over_budget(&[5_500, 600_000], 30 * ms).is_empty());
        // A thread starts: 40,000 more counted in 1 ms, 12% at the locked
        // count's price, within ten times the budget; the run so far 1.1 +
        // 0.3 + 0.12 ms of 31 (4.9%) at the prices each was made at, 9.7%
        // were the earlier counts priced as locked.
        g.set_counting_alone(false);
        assert!(g.over_budget(&[5_500, 640_000], 31 * ms).is_empty());
    }

    /// What counting costs is measured by the samples in the counting
    /// stubs (a `lock inc` waiting for the stores before it, threads
    /// contending for one counter where there is no counter per CPU), not
    /// taken for the probes' cost.
    #[test]
    fn samples_in_the_counting_stubs_scale_the_countings_cost() {
        let ms = 1_000_000;
        let sampled = Arc::new(SampledOverhead::default());
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(sampled.clone(), ms / 5);
        assert_eq!(g.over_budget(&[10_000, 0], 10 * ms), vec![0]);
        // 400,000 calls counted in 20 ms: 0.4 ms by the estimate, within
        // the budget; twenty samples of 0.2 ms in the stubs say 4 ms.
        (0..20).for_each(|_| sampled.count_counting(1));
        assert_eq!(sampled.in_probes(), 0);
        assert_eq!(g.over_budget(&[10_000, 400_000], 30 * ms), vec![1]);
    }

    /// The samples in the stubs of functions no longer counted, and what
    /// their counting cost by the estimate, say nothing of the functions
    /// still counted: the hottest, counted first at many times the
    /// estimate a call, do not price the others at theirs. Those are still
    /// stopped once their own samples say they cost too much.
    #[test]
    fn the_stubs_of_functions_no_longer_counted_do_not_price_the_others() {
        let ms = 1_000_000;
        let sampled = Arc::new(SampledOverhead::of_functions(2));
        let mut g =
            Governor::new(0.05, vec![100, 100, COUNTED_CALL_NS, COUNTED_CALL_NS]).with_counted_calls(2).with_samples(sampled.clone(), ms);
        let (f0_counted, f1_counted) = (2u32, 3u32);
        assert_eq!(g.over_budget(&[10_000, 10_000, 0, 0], 10 * ms), vec![0, 1]);
        // f0's calls counted at 20 ns each (40 samples of 1 ms for 2 M
        // calls), f1's 100,000 with a sample: f0's counting stops.
        (0..40).for_each(|_| sampled.count_counting(0));
        sampled.count_counting(1);
        assert_eq!(g.over_budget(&[10_000, 10_000, 2_000_000, 100_000], 100 * ms), vec![f0_counted]);
        // 500,000 more of f1's with two samples: 0.5% of the time by the
        // estimate, 1.5% at the prior, within half the budget. Judged at
        // f0's 20 ns a call with it, 10%.
        (0..2).for_each(|_| sampled.count_counting(1));
        assert!(g.over_budget(&[10_000, 10_000, 2_000_000, 600_000], 200 * ms).is_empty());
        // 500,000 more with 12 samples of its own: 15 samples for 1.1 M
        // calls, 14 ns a call, 7% of the time: stopped (its samples against
        // f0's estimate too would have said 5 ns, 2.4%).
        (0..12).for_each(|_| sampled.count_counting(1));
        assert_eq!(g.over_budget(&[10_000, 10_000, 2_000_000, 1_100_000], 300 * ms), vec![f1_counted]);
        // Samples in the stub of no function told apart (a hook's) count for all.
        let unattributed = Arc::new(SampledOverhead::of_functions(1));
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_samples(unattributed.clone(), ms);
        assert_eq!(g.over_budget(&[10_000, 0], 10 * ms), vec![0]);
        (0..40).for_each(|_| unattributed.count_counting(5));
        assert_eq!(g.over_budget(&[10_000, 2_000_000], 100 * ms), vec![1]);
    }

    /// The in-process engine without samples judges its probes and its
    /// counting at their priors: twice a call's calibrated cost, three
    /// times [`COUNTED_CALL_NS`] a counted call.
    #[test]
    fn without_samples_the_priors_stand_where_asked() {
        let ms = 1_000_000;
        // 6,000 calls of 100 ns in 10 ms (6%: throttled either way), then
        // 600,000 calls counted in 20 ms: 3% at 1 ns a call, within the
        // budget; 9% at the prior's 3 ns, over it.
        let judged = |g: &mut Governor| (g.over_budget(&[6_000, 0], 10 * ms), g.over_budget(&[6_000, 600_000], 30 * ms));
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1);
        assert_eq!(judged(&mut g), (vec![0], vec![]));
        let mut g = Governor::new(0.05, vec![100, COUNTED_CALL_NS]).with_counted_calls(1).with_priors();
        assert_eq!(judged(&mut g), (vec![0], vec![1]));
        // 3,000 calls of 100 ns in 10 ms: 3% by the estimate, 6% at the prior.
        let mut g = Governor::new(0.05, vec![100]);
        assert!(g.over_budget(&[3_000], 10 * ms).is_empty());
        let mut g = Governor::new(0.05, vec![100]).with_priors();
        assert_eq!(g.over_budget(&[3_000], 10 * ms), vec![0]);
    }

    #[test]
    fn nothing_is_judged_in_the_first_milliseconds() {
        let mut g = Governor::new(0.05, vec![1_000_000]);
        assert!(g.over_budget(&[999], 1_000_000).is_empty());
    }
}

//! Calls one by one, for timelines: each source hands its finished calls
//! (with CLOCK_MONOTONIC times) to a [`TraceKeeper`], which keeps them up
//! to a limit and counts the rest; [`TraceKeeper::into_trace`] makes the
//! profile's [`Trace`], calls in the order they started.

use proftap_profile::{FunctionId, TRACED_CALL_BYTES, ThreadTrace, Trace, TracedCall, TracedSample};
use rustc_hash::FxHashMap;

/// Finished calls and samples of every thread, kept up to a size limit.
#[derive(Clone, Debug, Default)]
pub struct TraceKeeper {
    limit_bytes: u64,
    kept: u64,
    cut: u64,
    missed: u64,
    /// By (pid, tid): calls (start as CLOCK_MONOTONIC ns) and samples.
    threads: FxHashMap<(i32, i32), (Vec<TracedCall>, Vec<TracedSample>)>,
}

impl TraceKeeper {
    /// Keeps at most `limit_bytes` of calls and samples.
    pub fn new(limit_bytes: u64) -> Self {
        TraceKeeper { limit_bytes, ..TraceKeeper::default() }
    }

    /// Calls (or samples) it may still keep.
    pub fn room(&self) -> u64 {
        (self.limit_bytes / TRACED_CALL_BYTES).saturating_sub(self.kept)
    }

    /// Keeps a call of thread `tid` of `pid` that started at `start_ns`
    /// (CLOCK_MONOTONIC) and returned at `end_ns`, `depth` calls deep.
    pub fn call(&mut self, pid: i32, tid: i32, function: FunctionId, start_ns: u64, end_ns: u64, depth: u32) {
        if self.take_room() {
            let call = TracedCall { function, start_ns, duration_ns: end_ns.saturating_sub(start_ns), depth };
            self.threads.entry((pid, tid)).or_default().0.push(call);
        }
    }

    /// Keeps a sample of thread `tid` of `pid` taken at `time_ns`
    /// (CLOCK_MONOTONIC), whose stack is `stack` of the sampled stacks.
    pub fn sample(&mut self, pid: i32, tid: i32, time_ns: u64, stack: u32) {
        if self.take_room() {
            self.threads.entry((pid, tid)).or_default().1.push(TracedSample { time_ns, stack });
        }
    }

    /// Counts calls not kept because the trace was full.
    pub fn cut(&mut self, calls: u64) {
        self.cut = self.cut.saturating_add(calls);
    }

    /// Counts calls that could not be kept: their source missed them.
    pub fn missed(&mut self, calls: u64) {
        self.missed = self.missed.saturating_add(calls);
        self.cut = self.cut.saturating_add(calls);
    }

    fn take_room(&mut self) -> bool {
        if self.room() == 0 {
            self.cut = self.cut.saturating_add(1);
            return false;
        }
        self.kept += 1;
        true
    }

    /// Adds what `other` kept, within this one's limit.
    pub fn absorb(&mut self, other: TraceKeeper) {
        self.cut = self.cut.saturating_add(other.cut);
        self.missed = self.missed.saturating_add(other.missed);
        for ((pid, tid), (calls, samples)) in other.threads {
            for c in calls {
                self.call(pid, tid, c.function, c.start_ns, c.end_ns(), c.depth);
            }
            for s in samples {
                self.sample(pid, tid, s.time_ns, s.stack);
            }
        }
    }

    /// The trace, times from `started_ns` (CLOCK_MONOTONIC), each thread's
    /// calls by start (a caller before the calls it made) and samples by time.
    pub fn into_trace(self, started_ns: u64) -> Trace {
        let mut threads: Vec<ThreadTrace> = self
            .threads
            .into_iter()
            .map(|((pid, tid), (mut calls, mut samples))| {
                for c in &mut calls {
                    c.start_ns = c.start_ns.saturating_sub(started_ns);
                }
                for s in &mut samples {
                    s.time_ns = s.time_ns.saturating_sub(started_ns);
                }
                calls.sort_by_key(|c| (c.start_ns, c.depth));
                samples.sort_by_key(|s| s.time_ns);
                ThreadTrace { pid, tid, calls, samples }
            })
            .collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        Trace { limit_bytes: self.limit_bytes, cut: self.cut, missed: self.missed, threads }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_past_the_limit_are_counted_not_kept() {
        let mut keeper = TraceKeeper::new(3 * TRACED_CALL_BYTES);
        for i in 0..5 {
            keeper.call(1, 2, 0, 1000 + i, 1010 + i, 0);
        }
        keeper.missed(4);
        let trace = keeper.into_trace(1000);
        assert_eq!(trace.threads.len(), 1);
        assert_eq!(trace.threads[0].calls.iter().map(|c| c.start_ns).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!((trace.cut, trace.missed), (2 + 4, 4));
    }

    #[test]
    fn calls_are_ordered_by_start_a_caller_first() {
        let mut keeper = TraceKeeper::new(1 << 20);
        // As returns arrive: the callee ends first; it started with its caller.
        keeper.call(1, 2, 1, 100, 150, 1);
        keeper.call(1, 2, 0, 100, 200, 0);
        keeper.call(1, 3, 0, 50, 60, 0);
        let trace = keeper.into_trace(0);
        let first = &trace.threads[0];
        assert_eq!((first.tid, first.calls[0].function, first.calls[1].function), (2, 0, 1));
        assert_eq!(first.calls[0].duration_ns, 100);
        assert_eq!(trace.threads[1].tid, 3);
    }
}

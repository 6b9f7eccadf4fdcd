//! The recording loop: wait for events, drain every source into one
//! time-ordered queue, let the overhead governor and automatic
//! instrumentation change the probes while the target runs, hand the
//! ordered events to the aggregator and the sampler, and stop when the
//! target ends or the user asks.

use crate::aggregate::Aggregator;
use crate::assemble::Ending;
use crate::cost::UprobeCosts;
use crate::error::RecordError;
use crate::events::Event;
use crate::governor::{COUNTED_CALL_NS, Governor, SampledOverhead, hottest_functions};
use crate::observer::{Observer, RecordEvent};
use crate::options::RecordOptions;
use crate::queue::{EventQueue, ORDERING_MARGIN_NS};
use crate::saved::Saver;
use crate::sources::Closing;
use crate::sources::inject::{InjectEnd, InjectSource, check_unwinders};
use crate::sources::monotonic_ns;
use crate::sources::sampler::SamplerThread;
use crate::sources::uprobes::UprobeSource;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use proftap_probes::inject::children::ChildMemories;
use proftap_probes::inject::clock::TscClock;
use proftap_probes::inject::patched::Patched;
use proftap_probes::inject::patcher::CountingStub;
use proftap_probes::inject::reading::TotalsView;
use proftap_probes::inject::threads::Cost;
use proftap_probes::inject::totals::Trampolines;
use proftap_probes::inject::watch::{Judge, Unpatched};
use proftap_probes::offcpu::OffCpu;
use proftap_probes::plan::ProbedFunction;
use proftap_probes::sampling::StackSample;
use proftap_probes::target::{self, Ended, HeldChild};
use proftap_profile::{Engine, Finding, FunctionCalls, Note};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The most looks of the in-process engine's watch are apart, in their own
/// durations (a budget of 0.2% asks 1,000).
const MOST_LOOKS_APART: f64 = 1_000.0;

/// What does not change while a recording runs.
pub(crate) struct Run<'a> {
    /// Every function probed: the measured ones (their index is their id),
    /// then markers.
    pub all: &'a [ProbedFunction],
    /// How many are measured.
    pub measured: usize,
    /// How to record.
    pub options: &'a RecordOptions,
    /// Per function: the in-process engine may patch it.
    pub injected: Vec<bool>,
    /// The process recorded.
    pub pid: i32,
    /// When it started running, CLOCK_MONOTONIC.
    pub started_ns: u64,
    /// Whether it was running already.
    pub attached: bool,
    /// The stack samples' measure of the probes' cost, and the CPU time
    /// each sample stands for (without sampling, none).
    pub sampled: Option<(Arc<SampledOverhead>, u64)>,
}

impl Run<'_> {
    /// The measured functions.
    pub fn functions(&self) -> &[ProbedFunction] {
        &self.all[..self.measured]
    }

    fn observer(&self) -> &dyn Observer {
        self.options.observer.as_ref()
    }

    /// What a call of each function costs when `patched`, for the governor:
    /// patched functions are judged by the engine's drainer as their records
    /// arrive, the others by the recording loop (0: not its to judge, nor
    /// are functions whose lines probes follow).
    pub fn call_ns(&self, patched: bool) -> Vec<u64> {
        let cost = self.options.cost.unwrap_or(crate::cost::ProbeCost::ESTIMATE);
        let kept = |i: usize| self.options.line_probed.contains(&i) || self.options.kept.contains(&i);
        let call_ns = |(i, (f, &injected)): (usize, (&ProbedFunction, &bool))| {
            if injected == patched && !kept(i) { cost.of(f.entry, injected).call_ns.max(1) } else { 0 }
        };
        self.functions().iter().zip(&self.injected).enumerate().map(call_ns).collect()
    }

    /// What the uprobes of each function cost per hit, for the governor.
    pub fn uprobe_costs(&self) -> UprobeCosts {
        let cost = self.options.cost.unwrap_or(crate::cost::ProbeCost::ESTIMATE);
        let probes = self.options.probed_lines.iter().flat_map(|plan| &plan.probes);
        UprobeCosts { call_ns: self.call_ns(false), line_ns: probes.map(|p| (p.function, cost.line_hit_ns(p.kind))).collect() }
    }

    /// The governor of patched functions, run by the engine's watch. Made
    /// once the probes are in and the program runs: the budget is a share
    /// of the program's time from then on, not of a held start (a program
    /// held 20 ms while it was patched would otherwise spend its first
    /// milliseconds at five times the budget before a judgement).
    pub fn judge(&self) -> Option<Judge> {
        let started = monotonic_ns();
        self.options.overhead_budget.map(|budget| {
            // A function's calls only counted after its probes went are judged as a function of their own (see [`Judge`]).
            let call_ns = self.call_ns(true);
            // Counting is judged too, with samples or without: without, the
            // calls no longer counted are not estimated, and the counts of
            // those functions are lower bounds (the budget holds either way).
            let counted_ns = call_ns.iter().map(|&ns| if ns > 0 { COUNTED_CALL_NS } else { 0 });
            let mut governor = Governor::new(budget, call_ns.iter().copied().chain(counted_ns).collect()).with_counted_calls(call_ns.len());
            governor = match &self.sampled {
                Some((sampled, ns_per_sample)) => governor.with_samples(sampled.clone(), *ns_per_sample),
                None => governor.with_priors(),
            };
            let decide = Box::new(move |entries: &[u64], counting_alone: bool| {
                let elapsed_ns = monotonic_ns().saturating_sub(started);
                governor.set_counting_alone(counting_alone);
                governor.over_budget(entries, elapsed_ns).into_iter().map(|f| f as usize).collect()
            });
            // The watch's looks may take half the budget of one CPU.
            let looks_apart = if budget > 0.0 { (2.0 / budget).ceil().min(MOST_LOOKS_APART) as u32 } else { MOST_LOOKS_APART as u32 };
            Judge { decide, looks_apart }
        })
    }
}

/// Forked children's memories kept mapped at most, for the return
/// addresses in their samples: each takes as much address space as the
/// parent's, and a program may fork thousands.
const MOST_CHILD_VIEWS: usize = 16;

/// The in-process engine's memory in the target and in each forked child
/// that handed its own over: where the return addresses it took are.
#[derive(Default)]
pub(crate) struct EngineMemory {
    parent: Option<(i32, TotalsView)>,
    children: Option<ChildMemories>,
    child_views: HashMap<i32, TotalsView>,
    /// When each child process still running was forked (its latest fork,
    /// for a pid reused).
    forked_ns: HashMap<i32, u64>,
    trampolines: Option<Trampolines>,
    /// The engine's clock: when a sample was taken, in its frames' time;
    /// measured against CLOCK_MONOTONIC again every second (which NTP slews).
    clock: Option<(TscClock, Instant)>,
}

impl EngineMemory {
    /// The memory of the engine that patched process `pid`, timed by `clock`.
    pub fn of(pid: i32, engine: &Patched, clock: TscClock) -> EngineMemory {
        EngineMemory {
            parent: engine.view().map(|v| (pid, v)),
            children: engine.child_memories(),
            child_views: HashMap::new(),
            forked_ns: HashMap::new(),
            trampolines: engine.trampolines(),
            clock: Some((clock, Instant::now())),
        }
    }

    /// The return addresses a sample's stack holds as trampolines, by the
    /// stack slot each is in: first those its site trampolines stand for,
    /// then, if it holds the shared one, those the engine keeps for its
    /// thread's frames that began before the sample was taken.
    pub fn return_addresses(&mut self, sample: &StackSample) -> Vec<(u64, u64)> {
        if let Some((clock, measured)) = &mut self.clock
            && measured.elapsed() >= Duration::from_secs(1)
        {
            clock.refresh();
            *measured = Instant::now();
        }
        let (trampolines, clock) = (self.trampolines, self.clock.map(|(clock, _)| clock));
        let Some(view) = self.view(sample.pid as i32) else { return Vec::new() };
        let Some(trampolines) = trampolines else { return Vec::new() };
        let mut returns = view.site_returns(&trampolines, sample.regs[1], &sample.stack);
        // Return addresses are in 8-byte-aligned slots; each hijacked one
        // is a frame of the thread's, live at the sample.
        let skip = (sample.regs[1].wrapping_neg() & 7) as usize;
        let words = sample.stack.get(skip..).unwrap_or_default().chunks_exact(8);
        let hijacked = words.map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default())).filter(|&w| trampolines.contains(w));
        let (frames, shared) = hijacked.fold((0u64, false), |(n, shared), w| (n + 1, shared || w == trampolines.shared));
        if let Some(clock) = clock
            && shared
        {
            returns.extend(view.return_addresses(sample.tid, clock.tsc_at(sample.time), frames));
        }
        returns
    }

    /// The return addresses of every sample taken before `ns` were read:
    /// a child that ended before needs its memory no more.
    pub fn samples_named_until(&self, ns: u64) {
        if let Some(children) = &self.children {
            children.samples_named_until(ns);
        }
    }

    /// Process `pid` was forked at `time`: a memory kept under its pid was
    /// an earlier process's.
    pub fn forked(&mut self, pid: i32, time: u64) {
        if self.forked_ns.get(&pid).is_some_and(|&at| at >= time) {
            return;
        }
        self.child_views.remove(&pid);
        self.forked_ns.insert(pid, time);
    }

    /// Process `pid` ended at `time`: what was kept to read its memory
    /// goes, unless a process forked since has its pid.
    pub fn exited(&mut self, pid: i32, time: u64) {
        if self.forked_ns.get(&pid).is_some_and(|&forked| forked > time) {
            return;
        }
        self.forked_ns.remove(&pid);
        self.child_views.remove(&pid);
    }

    fn view(&mut self, pid: i32) -> Option<&TotalsView> {
        if let Some((parent, view)) = &self.parent
            && *parent == pid
        {
            return Some(view);
        }
        if !self.child_views.contains_key(&pid) {
            // A child not handed over yet is looked for again at its next sample.
            let forked_ns = self.forked_ns.get(&pid).copied().unwrap_or(0);
            let view = self.children.as_ref().and_then(|c| c.view(pid, forked_ns))?;
            if self.child_views.len() >= MOST_CHILD_VIEWS
                && let Some(&any) = self.child_views.keys().next()
            {
                self.child_views.remove(&any);
            }
            self.child_views.insert(pid, view);
        }
        self.child_views.get(&pid)
    }
}

/// The code the in-process engine put in a process, and when: a moment
/// the process was held after its exec, so that in time order it comes
/// after the exec (which the sampler sees as the end of earlier mappings)
/// and before anything the process did next (a fork, which copies it).
pub(crate) struct CodeAdded {
    ranges: Vec<std::ops::Range<u64>>,
    origins: Vec<(u64, u64)>,
    probe_returns: Vec<u64>,
    return_trampolines: Vec<u64>,
    fork_code: Vec<std::ops::Range<u64>>,
    counting_stubs: Vec<CountingStub>,
    time: u64,
}

impl CodeAdded {
    pub fn of(engine: &Patched) -> CodeAdded {
        CodeAdded {
            ranges: engine.code(),
            origins: engine.origins(),
            probe_returns: engine.probe_returns(),
            return_trampolines: engine.return_trampoline_returns(),
            fork_code: engine.fork_code(),
            counting_stubs: engine.counting_stubs(),
            time: engine.code_since_ns(),
        }
    }
}

/// Where ordered events go: the aggregator, the sampler, the saved stream.
pub(crate) struct Consumer {
    pub aggregator: Aggregator,
    /// What the in-process engine added up: the return addresses it holds.
    pub engine: EngineMemory,
    pub sampler: Option<SamplerThread>,
    pub saver: Option<Saver>,
    /// The target's pid and whether its forked children count.
    pub pid: i32,
    pub follow: bool,
    /// The time of the last event.
    pub last_event: u64,
}

impl Consumer {
    fn consume(&mut self, event: Event) {
        self.last_event = self.last_event.max(event.time());
        if let Event::Sample(sample) = event {
            if let Some(sampler) = &self.sampler
                && (self.follow || sample.pid as i32 == self.pid)
            {
                let mut returns = self.aggregator.return_addresses(sample.tid);
                // Read as the sample was drained (and saved with it), or now.
                if sample.returns.is_empty() {
                    returns.extend(self.engine.return_addresses(&sample));
                } else {
                    returns.extend_from_slice(&sample.returns);
                }
                sampler.sample(sample, returns);
            }
            return;
        }
        if let Some(sampler) = &self.sampler {
            match &event {
                Event::Mmap { pid, start, len, pgoff, path, .. } => sampler.mapped(*pid, *start, *len, *pgoff, path),
                Event::Comm { pid, tid, exec: true, time, .. } if pid == tid => {
                    // By the wall clock, as perf maps are written: `time` was that long ago.
                    let ago = Duration::from_nanos(monotonic_ns().saturating_sub(*time));
                    sampler.exec(*pid, std::time::SystemTime::now().checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH));
                }
                Event::Fork { pid, ppid, tid, .. } if pid == tid && pid != ppid => sampler.forked(*ppid, *pid),
                Event::CodeAdded { pid, ranges, origins, probe_returns, return_trampolines, fork_code, counting_stubs, .. } => {
                    ranges.iter().for_each(|r| sampler.engine_code(*pid, r.clone()));
                    sampler.fork_code(*pid, fork_code.clone());
                    sampler.origins(*pid, origins.clone());
                    sampler.counting_stubs(*pid, counting_stubs.clone());
                    sampler.probe_returns(*pid, probe_returns.clone(), return_trampolines.clone());
                }
                Event::ProbesReplaced { removed, uncounted, .. } => {
                    sampler.throttle(removed.clone());
                    sampler.uncounted(uncounted.clone());
                }
                Event::CountingGoesOn { pid, functions, .. } => sampler.counting_goes_on(*pid, functions.clone()),
                _ => {}
            }
        }
        if let Event::Hit(hit) = &event
            && !self.follow
            && hit.pid as i32 != self.pid
        {
            return;
        }
        if let Some(saver) = self.saver.as_mut() {
            saver.event(&event);
        }
        self.aggregator.push(&event);
    }
}

/// The peak rate of events aggregated, over one-second windows.
struct Rate {
    since: Instant,
    events: u64,
    peak: u64,
}

impl Rate {
    fn count(&mut self, events: usize) {
        self.events += events as u64;
        let elapsed = self.since.elapsed();
        if elapsed >= Duration::from_secs(1) {
            self.peak = self.peak.max((self.events as f64 / elapsed.as_secs_f64()) as u64);
            (self.since, self.events) = (Instant::now(), 0);
        }
    }
}

/// The sources and sinks of a recording, and what changes as it runs.
pub(crate) struct Driver<'a> {
    run: &'a Run<'a>,
    uprobes: UprobeSource,
    inject: Option<InjectSource>,
    clock: Option<TscClock>,
    off_cpu: Option<Arc<OffCpu>>,
    queue: EventQueue,
    consumer: Consumer,
    /// Per function: probed by uprobes now.
    enabled: Vec<bool>,
    /// The functions whose probes a new probe set, being defined, removes,
    /// and when they were found over the budget (ns from the start).
    throttling: Vec<u32>,
    throttling_since_ns: u64,
    /// Per function: patched by the in-process engine.
    patched: Vec<bool>,
    /// Whether the in-process engine patched the process at all.
    engine_attached: bool,
    governor: Option<Governor>,
    uprobe_costs: UprobeCosts,
    auto_pending: Option<(usize, Duration)>,
    notes: Vec<Note>,
    child: Option<HeldChild>,
    pidfd: Option<OwnedFd>,
    deadline: Option<Instant>,
    ended: Option<Ended>,
    /// The process proftap attached to ended (its status is its parent's).
    attached_gone: bool,
    terminated_sent: bool,
    rate: Rate,
    counters: (u64, u64),
    /// When the counters were last told.
    told: Instant,
    /// When the probes went live, and when the calls by function were last told.
    live_calls: (Instant, Instant),
}

/// The sources a recording starts with.
pub(crate) struct Sources {
    pub uprobes: UprobeSource,
    /// The in-process engine, when it patched the process at the start.
    pub inject: Option<InjectSource>,
    /// Its clock, when it may patch later.
    pub clock: Option<TscClock>,
    /// What it reads CPU time from, when the kernel lends it.
    pub off_cpu: Option<Arc<OffCpu>>,
    /// Per function: probed by uprobes.
    pub enabled: Vec<bool>,
    /// Per function: patched.
    pub patched: Vec<bool>,
}

/// What the loop leaves to assemble.
pub(crate) struct Finished {
    pub consumer: Consumer,
    pub ending: Ending,
    pub ended: Option<Ended>,
    /// The uprobes and kernel events of the recording, closing.
    pub closing: Closing,
}

impl<'a> Driver<'a> {
    /// A loop over `sources` into `consumer`; `child` is the launched
    /// program, `notes` what is known so far.
    pub fn new(run: &'a Run<'a>, sources: Sources, consumer: Consumer, child: Option<HeldChild>, notes: Vec<Note>) -> Self {
        let options = run.options;
        let pidfd = target::pidfd(run.pid);
        // A process attached to may end before the loop starts: then it has
        // no pidfd to say so, and is gone already.
        let gone_already = matches!(&pidfd, Err(e) if e.raw_os_error() == Some(libc::ESRCH));
        Driver {
            run,
            engine_attached: sources.inject.is_some(),
            uprobes: sources.uprobes,
            inject: sources.inject,
            clock: sources.clock,
            off_cpu: sources.off_cpu,
            queue: EventQueue::default(),
            consumer,
            enabled: sources.enabled,
            throttling: Vec::new(),
            throttling_since_ns: 0,
            patched: sources.patched,
            governor: options.overhead_budget.map(|budget| Governor::new(budget, run.call_ns(false))),
            uprobe_costs: run.uprobe_costs(),
            auto_pending: options.auto_instrument,
            notes,
            child,
            pidfd: pidfd.ok(),
            deadline: options.duration.map(|d| Instant::now() + d),
            ended: None,
            attached_gone: gone_already,
            terminated_sent: false,
            rate: Rate { since: Instant::now(), events: 0, peak: 0 },
            counters: (0, 0),
            told: Instant::now(),
            live_calls: (Instant::now(), Instant::now()),
        }
    }

    /// Puts events of proftap's own into the stream (threads known at the start).
    pub fn push(&mut self, events: impl IntoIterator<Item = Event>) {
        self.queue.pending().extend(events);
    }

    /// Records until the target ends or the user says stop.
    pub fn run(mut self) -> Result<Finished, RecordError> {
        // Probe-set changes are decided as hits are read, so the poll wakes often.
        let poll_ms: u16 = if self.governor.is_some() || self.auto_pending.is_some() { 10 } else { 50 };
        loop {
            self.wait(poll_ms);
            self.turn();
            if self.done()? {
                break;
            }
        }
        self.finish()
    }

    /// Waits until a ring has records, the process ends, or `ms` pass.
    fn wait(&self, ms: u16) {
        let mut fds: Vec<PollFd> = self.uprobes.readiness().into_iter().map(|fd| PollFd::new(fd, PollFlags::POLLIN)).collect();
        if let Some(fd) = &self.pidfd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }

    /// One turn: drain, change probes, aggregate what is old enough.
    fn turn(&mut self) {
        let watermark = monotonic_ns().saturating_sub(ORDERING_MARGIN_NS);
        let before = self.queue.pending().len();
        self.uprobes.drain(self.queue.pending());
        // The processes forked first (drained in this turn, not yet in time
        // order): a child's samples read its memory, not that of an earlier
        // child whose pid it has.
        for event in &self.queue.pending()[before..] {
            if let Event::Fork { pid, tid, time, .. } = event
                && pid == tid
            {
                self.consumer.engine.forked(*pid as i32, *time);
            }
        }
        for event in &mut self.queue.pending()[before..] {
            if let Event::Sample(sample) = event {
                sample.returns = self.consumer.engine.return_addresses(sample);
            }
        }
        // Then those that ended, whose fork times and memories go: a shell
        // forks without end.
        for event in &self.queue.pending()[before..] {
            if let Event::Exit { pid, tid, time } = event
                && pid == tid
            {
                self.consumer.engine.exited(*pid as i32, *time);
            }
        }
        for unpatched in self.inject.as_ref().map(InjectSource::unpatched).unwrap_or_default() {
            self.unpatched(unpatched);
        }
        // Probe-set changes (the governor's, the end of a warm-up) are decided
        // on the hits just read, before the slower ordering and aggregation.
        self.change_probes();
        let consumer = &mut self.consumer;
        let released = self.queue.release(Some(watermark), |e| consumer.consume(e));
        // Every sample taken before the watermark was drained (a sample is
        // in its ring within microseconds of being taken) and released: its
        // return addresses were read, a second time if its child's memory
        // was not at hand when it was drained.
        self.consumer.engine.samples_named_until(watermark);
        self.rate.count(released);
        self.tell_counters();
    }

    /// The counters, a few times a second: reading the engine's means
    /// reading every thread's calls by function.
    fn tell_counters(&mut self) {
        if self.told.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.told = Instant::now();
        let engine = self.inject.as_mut().map_or(0, InjectSource::calls);
        let hits = self.consumer.aggregator.hits().saturating_add(engine.saturating_mul(2));
        let counters = (hits, self.consumer.aggregator.lost_events());
        if counters != self.counters {
            self.run.observer().event(RecordEvent::Counters { hits: counters.0, lost: counters.1 });
            self.counters = counters;
        }
        if self.run.options.live_calls && self.live_calls.1.elapsed() >= Duration::from_secs(1) {
            self.live_calls.1 = Instant::now();
            self.tell_calls();
        }
    }

    /// Every function's calls so far: the engine's and the uprobes'.
    fn tell_calls(&mut self) {
        let engine = self.inject.as_ref().map(InjectSource::calls_by_function).unwrap_or_default();
        let probed = self.consumer.aggregator.calls_by_function();
        let functions = self
            .run
            .functions()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let calls = engine.get(i).copied().unwrap_or(0).saturating_add(probed.get(i).copied().unwrap_or(0));
                FunctionCalls { name: f.info.name.clone(), calls }
            })
            .collect();
        let elapsed_ns = u64::try_from(self.live_calls.0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.run.observer().event(RecordEvent::Calls { elapsed_ns, functions });
    }

    /// Tells the user of a probe-set change, and keeps it among the notes.
    fn tell(&mut self, note: Note) {
        self.run.observer().event(RecordEvent::ProbesChanged(note.clone()));
        self.notes.push(note);
    }

    /// Patched functions the watch found over budget and unpatched.
    fn unpatched(&mut self, unpatched: Unpatched) {
        let functions = self.run.functions();
        let named = |list: &[(usize, u64)]| -> Vec<FunctionCalls> {
            list.iter().map(|&(f, calls)| FunctionCalls { name: functions[f].info.name.clone(), calls }).collect()
        };
        let after_ns = unpatched.time.saturating_sub(self.run.started_ns);
        let mut children: Vec<i32> = unpatched.counting_goes_on.iter().map(|&(pid, _)| pid).collect();
        children.sort_unstable();
        children.dedup();
        for pid in children {
            let functions = unpatched.counting_goes_on.iter().filter(|&&(p, _)| p == pid).map(|&(_, f)| f as u32).collect();
            self.queue.push(Event::CountingGoesOn { time: unpatched.time, pid: pid as u32, functions });
        }
        if let Some(error) = unpatched.error {
            let names = named(&unpatched.functions).into_iter().chain(named(&unpatched.uncounted)).collect();
            self.tell(Finding::UnpatchFailed { functions: names, error }.into());
            return;
        }
        let (names, uncounted) = (named(&unpatched.functions), named(&unpatched.uncounted));
        if !names.is_empty() || !uncounted.is_empty() {
            let indices = |list: &[(usize, u64)]| list.iter().map(|&(f, _)| f as u32).collect();
            // The uprobes stay as they are.
            self.queue.push(Event::ProbesReplaced {
                time: unpatched.time,
                generations: Vec::new(),
                removed: indices(&unpatched.functions),
                redefined: Some(Vec::new()),
                uncounted: indices(&unpatched.uncounted),
            });
        }
        if !names.is_empty() {
            let note = self.over_budget(after_ns, names, true);
            self.tell(note);
        }
        if !uncounted.is_empty() {
            let budget_percent = self.run.options.overhead_budget.unwrap_or_default() * 100.0;
            let sampled = self.run.options.sample.is_some();
            self.tell(Finding::CountingStopped { after_ms: after_ns / 1_000_000, functions: uncounted, budget_percent, sampled }.into());
        }
    }

    /// What the governor did to `functions`, over budget after
    /// `elapsed_ns`, their calls still `counted` after (the in-process
    /// engine's).
    fn over_budget(&self, elapsed_ns: u64, functions: Vec<FunctionCalls>, counted: bool) -> Note {
        let budget_percent = self.run.options.overhead_budget.unwrap_or_default() * 100.0;
        let sampled = self.run.options.sample.is_some();
        Finding::Throttled { after_ms: elapsed_ns / 1_000_000, functions, budget_percent, sampled, counted }.into()
    }

    fn change_probes(&mut self) {
        let elapsed_ns = monotonic_ns().saturating_sub(self.run.started_ns);
        // Nothing more is decided until the last change is in.
        if self.uprobes.replacing() {
            if !self.uprobes.defined() {
                return;
            }
            let processes = self.live_processes();
            if let Some(result) = self.uprobes.install_replacement(&processes, false, self.queue.pending()) {
                self.throttled(result, elapsed_ns);
            }
            return;
        }
        let spent = || self.uprobe_costs.spent(self.uprobes.entries(), self.uprobes.line_hits());
        let over = match self.governor.as_mut() {
            Some(governor) => governor.over_budget_spent(&spent(), elapsed_ns),
            None => Vec::new(),
        };
        let warmed_up = self.auto_pending.filter(|(_, warmup)| elapsed_ns >= warmup.as_nanos() as u64);
        if !over.is_empty() {
            self.throttle(over, elapsed_ns);
        }
        if let Some((count, warmup)) = warmed_up.filter(|_| !self.uprobes.replacing()) {
            self.auto_pending = None;
            let processes = self.live_processes();
            self.auto_instrument(count, warmup, &processes);
        }
    }

    /// The recorded processes still running. Processes forked in the last
    /// ordering margin are not known yet: they keep the probes they inherited.
    fn live_processes(&self) -> Vec<i32> {
        self.consumer.aggregator.processes().iter().map(|p| p.pid).filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect()
    }

    /// Starts removing the uprobes of the functions `over` budget: the new
    /// probe set is defined while the rings are read.
    fn throttle(&mut self, over: Vec<u32>, elapsed_ns: u64) {
        for &f in &over {
            self.enabled[f as usize] = false;
        }
        let lines = self.run.options.probed_lines.as_ref();
        self.uprobes.begin_replacement(self.run.all, lines, &self.enabled, over.clone());
        self.throttling = over;
        self.throttling_since_ns = elapsed_ns;
    }

    /// The probe set without the functions over budget is in, or could
    /// not be put in.
    fn throttled(&mut self, result: Result<(), RecordError>, elapsed_ns: u64) {
        let over = std::mem::take(&mut self.throttling);
        match result {
            Ok(()) => {
                let (functions, entries) = (self.run.functions(), self.uprobes.entries());
                let calls = |f: u32| entries.get(f as usize).copied().unwrap_or(0);
                let names =
                    over.iter().map(|&f| FunctionCalls { name: functions[f as usize].info.name.clone(), calls: calls(f) }).collect();
                let note = self.over_budget(elapsed_ns, names, false);
                self.tell(note);
            }
            Err(e) => {
                // The probes stay as they were: every call is still seen, at
                // their cost, and the user hears of it now.
                self.keep_probes(&over);
                self.tell(Finding::ThrottleFailed { error: e.to_string() }.into());
                self.governor = None;
            }
        }
    }

    fn keep_probes(&mut self, functions: &[u32]) {
        for &f in functions {
            self.enabled[f as usize] = true;
        }
    }

    /// After the warm-up: instruments the hottest functions sampled, patched
    /// where the engine can, probed by uprobes where not.
    fn auto_instrument(&mut self, count: usize, warmup: Duration, processes: &[i32]) {
        let hot = self.consumer.sampler.as_ref().map(SamplerThread::hottest).unwrap_or_default();
        let chosen = hottest_functions(&hot, self.run.functions(), count);
        // A function whose entry the kernel will not probe would fail the new set.
        let chosen: Vec<usize> = chosen.into_iter().filter(|&f| self.run.injected[f] || !self.run.functions()[f].uprobe_refused).collect();
        let (to_patch, to_probe): (Vec<usize>, Vec<usize>) = chosen.iter().partition(|&&f| self.run.injected[f]);
        let was_enabled = self.enabled.clone();
        for &f in &to_probe {
            self.enabled[f] = true;
        }
        let changed = (!chosen.is_empty()).then(|| {
            self.patch(&to_patch)?;
            if to_probe.is_empty() {
                return Ok(());
            }
            let lines = self.run.options.probed_lines.as_ref();
            self.uprobes.replace(self.run.all, lines, processes, &self.enabled, self.queue.pending())
        });
        let warmup_ms = warmup.as_millis() as u64;
        let note = match changed {
            None => Finding::AutoInstrumented { warmup_ms, functions: Vec::new() },
            Some(Ok(())) => {
                let functions = chosen.iter().map(|&f| self.run.functions()[f].info.name.clone()).collect();
                Finding::AutoInstrumented { warmup_ms, functions }
            }
            Some(Err(e)) => {
                self.enabled = was_enabled;
                Finding::AutoInstrumentFailed { error: e.to_string() }
            }
        };
        self.tell(note.into());
    }

    /// proftap's code is now at `ranges` in process `pid`.
    pub fn code_added(&mut self, pid: i32, added: Option<CodeAdded>) {
        if let Some(CodeAdded { ranges, origins, probe_returns, return_trampolines, fork_code, counting_stubs, time }) =
            added.filter(|a| !a.ranges.is_empty())
        {
            let pid = pid as u32;
            self.queue.push(Event::CodeAdded { time, pid, ranges, origins, probe_returns, return_trampolines, fork_code, counting_stubs });
        }
    }

    /// Patches the functions `to_patch` in the running process.
    fn patch(&mut self, to_patch: &[usize]) -> Result<(), RecordError> {
        let (Some(clock), false) = (self.clock, to_patch.is_empty()) else { return Ok(()) };
        let (pid, functions) = (self.run.pid, self.run.functions());
        let wanted: Vec<bool> = (0..functions.len()).map(|f| to_patch.contains(&f)).collect();
        let how = self.run.options.engine_recording(self.off_cpu.as_deref());
        let engine = Patched::attach_held(pid, functions, Some(&wanted), how).map_err(|source| RecordError::Inject { pid, source })?;
        check_unwinders(&engine, self.run.options.may_unwind)?;
        for &f in to_patch {
            self.patched[f] = !engine.refused().iter().any(|(i, _)| *i == f);
        }
        self.code_added(pid, Some(CodeAdded::of(&engine)));
        self.consumer.engine = EngineMemory::of(pid, &engine, clock);
        self.inject = Some(InjectSource::start(engine, self.run.judge(), clock, self.off_cpu.clone(), self.run.options.trace_bytes));
        self.engine_attached = true;
        Ok(())
    }

    /// Whether the recording is over: the target ended, the user asked, or
    /// the time is up.
    fn done(&mut self) -> Result<bool, RecordError> {
        let gone = self.pidfd.as_ref().is_some_and(|fd| readable(fd.as_fd()));
        let control = &self.run.options.control;
        if self.child.is_none() {
            let asked = [&control.interrupt, &control.terminate, &control.detach].iter().any(|f| f.load(Ordering::Relaxed));
            self.attached_gone |= gone;
            return Ok(asked || self.attached_gone || self.deadline.is_some_and(|d| Instant::now() >= d));
        }
        if control.detach.load(Ordering::Relaxed) {
            return Ok(true);
        }
        if control.terminate.load(Ordering::Relaxed) && !self.terminated_sent {
            target::signal(self.run.pid, nix::sys::signal::Signal::SIGTERM);
            self.terminated_sent = true;
        }
        if control.interrupt_only_proftap.swap(false, Ordering::Relaxed) {
            target::signal(self.run.pid, nix::sys::signal::Signal::SIGINT);
        }
        if gone || self.pidfd.is_none() {
            self.ended = target::try_reap(self.run.pid)?;
        }
        Ok(self.ended.is_some())
    }

    /// Stops every source, aggregates what is left, and takes the probes out.
    fn finish(mut self) -> Result<Finished, RecordError> {
        // A throttle still being defined is not put in: those functions kept their probes.
        let throttling = std::mem::take(&mut self.throttling);
        self.keep_probes(&throttling);
        if !throttling.is_empty() {
            let waited_ns = monotonic_ns().saturating_sub(self.run.started_ns).saturating_sub(self.throttling_since_ns);
            let (functions, entries) = (self.run.functions(), self.uprobes.entries());
            let names = throttling
                .iter()
                .map(|&f| FunctionCalls {
                    name: functions[f as usize].info.name.clone(),
                    calls: entries.get(f as usize).copied().unwrap_or(0),
                })
                .collect();
            let budget_percent = self.run.options.overhead_budget.unwrap_or_default() * 100.0;
            let after_ms = self.throttling_since_ns / 1_000_000;
            self.tell(Finding::ThrottleUnfinished { after_ms, waited_ms: waited_ns / 1_000_000, functions: names, budget_percent }.into());
        }
        self.uprobes.stop(self.queue.pending());
        let consumer = &mut self.consumer;
        self.queue.release(None, |e| consumer.consume(e));
        // A launched program's recording ends with its last event, not when
        // proftap noticed it had exited.
        let now = monotonic_ns();
        let ended_monotonic_ns = if self.run.attached { now } else { self.consumer.last_event.clamp(self.run.started_ns, now) };
        let options = self.run.options;
        let compensation = options.compensate.then(|| {
            let c = options.cost.unwrap_or_default().injected;
            [Cost { own: c.self_ns, call: c.call_ns }, Cost { own: c.self_cpu_ns, call: c.call_cpu_ns }]
        });
        let aggregator = &self.consumer.aggregator;
        let names = |tid| aggregator.thread_name(tid);
        let counted_lines = options.lines.as_ref().filter(|_| options.count_lines).map(|plan| (plan, self.run.all));
        // Uprobes did not follow the lines the engine cannot count: the budget held them back.
        let held_back =
            options.overhead_budget.filter(|_| options.count_lines && proftap_probes::perf::may_define_uprobes()).map(|b| b * 100.0);
        let exited = self.ended.is_some();
        let end = InjectEnd { ns: ended_monotonic_ns, execs_ns: aggregator.exec_times(self.run.pid), exited };
        let inject =
            self.inject.take().map(|source| source.finish(end, options.metrics.len(), compensation, counted_lines, held_back, &names));
        let uprobes = self.uprobes.finish();
        if uprobes.unsampled_children > 0 {
            self.notes.push(Finding::ChildrenUnsampled { children: uprobes.unsampled_children }.into());
        }
        // The engine has read the off-CPU times: the last user of the array.
        let off_cpu = self.off_cpu.take().map(|o| Box::new(o) as Box<dyn Send>);
        let closing = Closing::start(std::iter::once(Box::new(uprobes.withdrawn) as Box<dyn Send>).chain(off_cpu).collect());
        drop(self.child);
        let engine = inject.transpose()?;
        let mut engine = engine.unwrap_or_default();
        self.notes.append(&mut engine.notes);
        let ending = Ending {
            exit_code: match self.ended {
                Some(Ended::Exited(code)) => Some(code),
                _ => None,
            },
            signal: match self.ended {
                Some(Ended::Signaled(signal)) => Some(signal),
                _ => None,
            },
            ended: self.ended.is_some() || self.attached_gone,
            ended_monotonic_ns,
            peak_events_per_second: self.rate.peak,
            engine: if self.engine_attached { Engine::Inject } else { Engine::Uprobe },
            probed: self.enabled[..self.run.measured].to_vec(),
            patched: self.patched[..self.run.measured].to_vec(),
            lost_samples: uprobes.lost_samples,
            engine_lost: 0,
            malformed: uprobes.malformed,
            engine_threads: engine.threads,
            engine_calls: engine.calls,
            calls_only_counted: engine.calls_only_counted,
            counting_stopped: engine.counting_stopped,
            notes: self.notes,
            throttled: Default::default(),
            in_counting_stubs: 0,
            sampled_on_every_cpu: uprobes.sampled_on_every_cpu,
            engine_trace: engine.trace,
            line_counts: engine.line_counts,
            line_branches: engine.line_branches,
            engine_regions: engine.regions.into_iter().map(|r| (r.entries, r.inclusive)).collect(),
        };
        Ok(Finished { consumer: self.consumer, ending, ended: self.ended, closing })
    }
}

fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_process_is_forgotten_once_it_ended() {
        let mut memory = EngineMemory::default();
        for pid in 100..1_100 {
            memory.forked(pid, pid as u64);
            memory.exited(pid, pid as u64 + 1);
        }
        memory.forked(7, 1);
        memory.forked(7, 0);
        assert_eq!(memory.forked_ns.len(), 1);
        assert_eq!(memory.forked_ns[&7], 1, "the latest fork of a pid is kept");
        // An earlier process of the pid ending, read after the fork of the next.
        memory.exited(7, 0);
        assert_eq!(memory.forked_ns[&7], 1);
    }
}

//! Resolved stack samples in, a [`SampleProfile`] out: frames, stacks and
//! source lines counted, each kept once.

use proftap_probes::inject::hooks::puts_returns_back;
use proftap_probes::sampling::{FORK_FRAME, PROBE_OVERHEAD_FRAME, ResolvedStack};
use proftap_probes::symbols::KERNEL_IMAGE;
use proftap_profile::{HeldSamples, KeptSamples, SampleProfile, SampledFrame, SampledLine, SampledStack, Throttled, ThrottledSamples};
use rustc_hash::FxHashMap;
use std::collections::{HashMap, HashSet};

/// Counts resolved stacks.
pub struct SampleAggregator {
    event: String,
    frequency_hz: u64,
    frames: Vec<SampledFrame>,
    frame_ids: HashMap<SampledFrame, u32>,
    stacks: FxHashMap<Vec<u32>, u64>,
    lines: HashMap<(String, u32), u64>,
    total: u64,
    /// The instrumented functions' names, by index.
    measured: Vec<String>,
    measured_names: HashSet<String>,
    /// Functions throttled so far (their probes removed).
    throttled: HashSet<String>,
    /// Throttled functions no longer counted either.
    uncounted: HashSet<String>,
    /// Those of them still counted in some processes, and which.
    counting_goes_on: HashMap<String, HashSet<i32>>,
    /// By throttled function: its samples since.
    after_throttle: HashMap<String, SinceThrottle>,
    /// The instrumented functions the in-process engine patched. In a
    /// process it patched, a call of one whose return no trampoline held
    /// was not timed: begun before the probes were placed (an attach to a
    /// loop that never returns), or left untimed by the engine.
    patched_functions: HashSet<String>,
    /// By such function not throttled: the samples of its calls not timed.
    untimed: HashMap<String, SinceThrottle>,
    /// By (thread, caller still instrumented, callee and its module):
    /// samples the caller's exclusive time holds.
    held: HashMap<(i32, String, (String, String)), u64>,
    /// By (thread, function timed): samples in its own code, which its
    /// exclusive time keeps.
    kept: HashMap<(i32, String), u64>,
    /// Each sample's process, thread, time and frames, for a timeline.
    timed: Option<Vec<(SampleTime, Vec<u32>)>>,
    /// Samples in the in-process engine's counting stubs.
    in_counting_stubs: u64,
    /// Processes running an image the in-process engine patched.
    patched: HashSet<i32>,
    /// The recording attached to running processes: calls under way then
    /// were never timed, whatever their stacks look like.
    attached: bool,
    /// Processes whose patched image an exec replaced, and their forked
    /// children: their samples are of code nothing measures, whatever its
    /// functions' names.
    replaced: HashSet<i32>,
}

/// A throttled function's samples since its probes were removed.
#[derive(Clone, Copy, Debug, Default)]
struct SinceThrottle {
    /// With it the innermost function measured.
    own: u64,
    /// With it anywhere on the stack.
    total: u64,
    /// Of those, the ones since its calls were no longer counted.
    total_uncounted: u64,
    /// Of the others, the ones in its counting stub.
    in_counting_stub: u64,
}

/// When a sample was taken, of which thread, and its stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleTime {
    /// Process id.
    pub pid: i32,
    /// Thread id.
    pub tid: i32,
    /// When (CLOCK_MONOTONIC).
    pub time: u64,
    /// An index into the profile's stacks (0 until [`SampleAggregator::timeline`]).
    pub stack: u32,
}

impl SampleAggregator {
    /// Samples of `event` taken at `frequency_hz`.
    pub fn new(event: &str, frequency_hz: u64) -> Self {
        SampleAggregator {
            event: event.into(),
            frequency_hz,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: FxHashMap::default(),
            lines: HashMap::new(),
            total: 0,
            measured: Vec::new(),
            measured_names: HashSet::new(),
            throttled: HashSet::new(),
            uncounted: HashSet::new(),
            counting_goes_on: HashMap::new(),
            after_throttle: HashMap::new(),
            patched_functions: HashSet::new(),
            untimed: HashMap::new(),
            held: HashMap::new(),
            kept: HashMap::new(),
            timed: None,
            in_counting_stubs: 0,
            patched: HashSet::new(),
            attached: false,
            replaced: HashSet::new(),
        }
    }

    /// Keeps each sample's time too, for [`Self::timeline`].
    pub fn timed(mut self) -> Self {
        self.timed = Some(Vec::new());
        self
    }

    /// The instrumented functions' names, by index: what throttling refers to.
    pub fn measuring(mut self, names: Vec<String>) -> Self {
        self.measured_names = names.iter().filter(|n| !n.is_empty()).cloned().collect();
        self.measured = names;
        self
    }

    /// Which of the functions measured (by name) the in-process engine
    /// patches, rather than kernel probes: those whose calls are timed
    /// only where a trampoline holds their return.
    pub fn patching(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.patched_functions = names.into_iter().filter(|n| !n.is_empty()).collect();
        self
    }

    /// The recording attached to running processes: a frame's return
    /// address put back by an unwinder may be that of a call begun before
    /// the probes were placed.
    pub fn attached(mut self) -> Self {
        self.attached = true;
        self
    }

    /// Process `pid` runs an image the in-process engine patched.
    pub fn patched(&mut self, pid: i32) {
        self.patched.insert(pid);
    }

    /// Process `pid` executed a program: if it ran a patched image, its
    /// samples from the next on hold no time of an instrumented caller,
    /// nor estimate a throttled function's.
    pub fn executed(&mut self, pid: i32) {
        if self.patched.remove(&pid) {
            self.replaced.insert(pid);
        }
    }

    /// Process `parent` forked `child`, which runs the same image.
    pub fn forked(&mut self, parent: i32, child: i32) {
        if self.patched.contains(&parent) {
            self.patched.insert(child);
        }
        if self.replaced.contains(&parent) {
            self.replaced.insert(child);
        }
        // The child counts what its parent still counted when it forked
        // (its code a copy), whatever a process on its pid before did.
        for pids in self.counting_goes_on.values_mut() {
            if pids.contains(&parent) {
                pids.insert(child);
            } else {
                pids.remove(&child);
            }
        }
    }

    /// From the next sample on, these functions (by index) are no longer
    /// instrumented: the samples tell their time.
    pub fn throttle(&mut self, functions: &[u32]) {
        self.throttled.extend(functions.iter().filter_map(|&f| self.measured.get(f as usize).cloned()));
    }

    /// From the next sample on, the calls of these throttled functions (by
    /// index) are no longer counted either: the samples tell how many.
    pub fn uncounted(&mut self, functions: &[u32]) {
        self.uncounted.extend(functions.iter().filter_map(|&f| self.measured.get(f as usize).cloned()));
    }

    /// The calls of these functions (by index) are still counted in
    /// process `pid` (a forked child that could not be held as their
    /// counting stopped): its samples do not tell how many.
    pub fn counting_goes_on(&mut self, pid: i32, functions: &[u32]) {
        for name in functions.iter().filter_map(|&f| self.measured.get(f as usize)) {
            self.counting_goes_on.entry(name.clone()).or_default().insert(pid);
        }
    }

    /// Takes in one sample of thread `tid`.
    pub fn add(&mut self, tid: i32, stack: &ResolvedStack) {
        self.add_at(0, tid, 0, stack);
    }

    /// Takes in one sample of thread `tid` of process `pid` taken at `time`.
    pub fn add_at(&mut self, pid: i32, tid: i32, time: u64, stack: &ResolvedStack) {
        self.total += 1;
        if !self.measured_names.is_empty() && !self.replaced.contains(&pid) {
            self.count_held(pid, tid, stack);
        }
        let ids: Vec<u32> = stack.frames.iter().map(|frame| self.frame_id(frame)).collect();
        if let Some(timed) = self.timed.as_mut() {
            timed.push((SampleTime { pid, tid, time, stack: 0 }, ids.clone()));
        }
        *self.stacks.entry(ids).or_default() += 1;
        if let Some(line) = &stack.line {
            *self.lines.entry(line.clone()).or_default() += 1;
        }
    }

    /// Each sample's process, thread, time and stack (an index into
    /// `profile`'s stacks, made by [`Self::profile`]), in the order taken;
    /// empty unless [`Self::timed`].
    pub fn timeline(&self, profile: &SampleProfile) -> Vec<SampleTime> {
        let index: FxHashMap<&[u32], u32> = profile.stacks.iter().enumerate().map(|(i, s)| (s.frames.as_slice(), i as u32)).collect();
        let timed = self.timed.iter().flatten();
        timed.filter_map(|(at, ids)| Some(SampleTime { stack: *index.get(ids.as_slice())?, ..*at })).collect()
    }

    /// Whose time a sample is, when the nearest call being timed holds it
    /// in its measured exclusive time: that of a measured function's call
    /// not timed, innermost among the measured ones, or that of a function
    /// never instrumented (a library's, one left unpatched) at the top of
    /// the stack. A call is timed when a probe was timing it (a trampoline
    /// held its return address: a throttled function's call under way
    /// when its probes were removed is timed to its end), or when its
    /// function is instrumented by kernel probes and not throttled (their
    /// trampoline does not tell). The holder gives the time back at the
    /// end; every measured function on the stack not timed there has the
    /// sample in its total.
    fn count_held(&mut self, pid: i32, tid: i32, stack: &ResolvedStack) {
        // Indices from a saved recording may be anything: out of range, they name no frame.
        let mut timed_call = vec![false; stack.frames.len()];
        for &i in &stack.timed_calls {
            if let Some(flag) = timed_call.get_mut(i as usize) {
                *flag = true;
            }
        }
        let physical: Vec<(&SampledFrame, bool)> = stack.frames.iter().zip(timed_call).rev().filter(|(f, _)| !f.inlined).collect();
        let Some(&(leaf, _)) = physical.first() else { return };
        let patched_here = self.patched.contains(&pid);
        let throttled = |frame: &SampledFrame| self.throttled.contains(&frame.name);
        // While an unwinder runs, the frames that called it have their own
        // return addresses back: their calls are timed all the same, but
        // those of throttled functions, which only a trampoline tells, and
        // in a process attached to, those that may have begun before.
        let unwinding_from = if self.attached { None } else { physical.iter().position(|(f, _)| puts_returns_back(&f.name)) };
        let unwound = |i: usize, frame: &SampledFrame| unwinding_from.is_some_and(|u| i > u) && !throttled(frame);
        let measured: Vec<(&SampledFrame, bool)> = physical
            .iter()
            .enumerate()
            .filter(|(_, (f, _))| f.module != KERNEL_IMAGE && self.measured_names.contains(&f.name))
            .map(|(i, &(f, through_probe))| (f, through_probe || unwound(i, f)))
            .collect();
        // Calls the engine times only through a trampoline: those of throttled
        // functions, and in a process it patched, of those it patched.
        let timed_by_trampoline_only =
            |frame: &SampledFrame| throttled(frame) || patched_here && self.patched_functions.contains(&frame.name);
        let timed = |frame: &SampledFrame, through_probe: bool| through_probe || !timed_by_trampoline_only(frame);
        let mut seen: Vec<&str> = Vec::new();
        let mut holder = None;
        for &(frame, through_probe) in &measured {
            if timed(frame, through_probe) {
                holder = holder.or(Some(&frame.name));
            } else if !seen.contains(&frame.name.as_str()) {
                seen.push(&frame.name);
                let untimed = if throttled(frame) { &mut self.after_throttle } else { &mut self.untimed };
                let since = untimed.entry(frame.name.clone()).or_default();
                since.total += 1;
                let counted_here = self.counting_goes_on.get(&frame.name).is_some_and(|pids| pids.contains(&pid));
                if self.uncounted.contains(&frame.name) && !counted_here {
                    since.total_uncounted += 1;
                }
            }
        }
        // A pseudo-frame (`[unknown: ...]`) names no function to give the
        // time to: it stays with the measured one. The probes' own time
        // (`[probe overhead]`) is the compensation's to take out, not a
        // throttled caller's, and a forked child's making its memory is no
        // call's (it comes before the call's entry time). The kernel's,
        // named or not, is its own.
        let unmeasured = leaf.module == KERNEL_IMAGE || !self.measured_names.contains(&leaf.name) && !leaf.name.starts_with('[');
        let owner = match measured.first() {
            _ if leaf.name == PROBE_OVERHEAD_FRAME || leaf.name == FORK_FRAME => return,
            _ if unmeasured => leaf,
            Some(&(innermost, through_probe)) if !timed(innermost, through_probe) => {
                let untimed = if throttled(innermost) { &mut self.after_throttle } else { &mut self.untimed };
                untimed.entry(innermost.name.clone()).or_default().own += 1;
                innermost
            }
            Some(&(innermost, _)) => {
                *self.kept.entry((tid, innermost.name.clone())).or_default() += 1;
                return;
            }
            None => return,
        };
        if let Some(holder) = holder {
            *self.held.entry((tid, holder.clone(), (owner.name.clone(), owner.module.clone()))).or_default() += 1;
        }
    }

    fn frame_id(&mut self, frame: &SampledFrame) -> u32 {
        if let Some(&id) = self.frame_ids.get(frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame.clone(), id);
        id
    }

    /// The sample added last was taken in the counting stub of `function`
    /// (by index; see [`SampleProfile::in_counting_stubs`]).
    pub fn in_counting_stub(&mut self, function: u32) {
        self.in_counting_stubs += 1;
        if let Some(since) = self.measured.get(function as usize).and_then(|name| self.after_throttle.get_mut(name)) {
            since.in_counting_stub += 1;
        }
    }

    /// Hot functions by samples anywhere on the stack so far: (frame name, module, samples).
    pub fn hottest(&self) -> Vec<(String, String, u64)> {
        self.profile().functions().into_iter().map(|f| (f.frame.name, f.frame.module, f.total_samples)).collect()
    }

    /// The samples so far, as a profile: stacks by count, lines by file and line.
    pub fn profile(&self) -> SampleProfile {
        let mut stacks: Vec<SampledStack> =
            self.stacks.iter().map(|(frames, &count)| SampledStack { frames: frames.clone(), count }).collect();
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        let mut lines: Vec<SampledLine> =
            self.lines.iter().map(|((file, line), &count)| SampledLine { file: file.clone(), line: *line, count }).collect();
        lines.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        let functions = by_function(&self.after_throttle);
        let untimed = by_function(&self.untimed);
        let mut held: Vec<HeldSamples> = self
            .held
            .iter()
            .map(|((tid, name, (callee, callee_module)), &samples)| HeldSamples {
                tid: *tid,
                name: name.clone(),
                callee: callee.clone(),
                callee_module: callee_module.clone(),
                samples,
                taken_ns: None,
            })
            .collect();
        held.sort_by(|a, b| (a.tid, &a.name, &a.callee, &a.callee_module).cmp(&(b.tid, &b.name, &b.callee, &b.callee_module)));
        // Only a holder's: what its exclusive time keeps tells how much of
        // the rest is its callees'.
        let holders: HashSet<(i32, &str)> = held.iter().map(|h| (h.tid, h.name.as_str())).collect();
        let mut kept: Vec<KeptSamples> = self
            .kept
            .iter()
            .filter(|((tid, name), _)| holders.contains(&(*tid, name.as_str())))
            .map(|((tid, name), &samples)| KeptSamples { tid: *tid, name: name.clone(), samples })
            .collect();
        kept.sort_by(|a, b| (a.tid, &a.name).cmp(&(b.tid, &b.name)));
        SampleProfile {
            event: self.event.clone(),
            frequency_hz: self.frequency_hz,
            total: self.total,
            frames: self.frames.clone(),
            stacks,
            lines,
            throttled: Throttled { functions, untimed, held, kept },
            in_counting_stubs: self.in_counting_stubs,
            on_every_cpu: false,
        }
    }
}

/// Samples by function, the most first.
fn by_function(samples: &HashMap<String, SinceThrottle>) -> Vec<ThrottledSamples> {
    let mut functions: Vec<ThrottledSamples> = samples
        .iter()
        .map(|(name, since)| ThrottledSamples {
            name: name.clone(),
            self_samples: since.own,
            total_samples: since.total,
            total_samples_uncounted: since.total_uncounted,
            counting_samples: since.in_counting_stub,
        })
        .collect();
    functions.sort_by(|a, b| b.total_samples.cmp(&a.total_samples).then(a.name.cmp(&b.name)));
    functions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> SampledFrame {
        SampledFrame { name: name.into(), module: "/bin/p".into(), inlined: false }
    }

    #[test]
    fn stacks_frames_and_lines_are_counted_once_each() {
        let mut samples = SampleAggregator::new("cpu-clock", 1000);
        let deep = ResolvedStack { frames: vec![frame("main"), frame("f")], line: Some(("p.c".into(), 3)), timed_calls: Vec::new() };
        let shallow = ResolvedStack { frames: vec![frame("main")], line: None, timed_calls: Vec::new() };
        for stack in [&deep, &shallow, &deep] {
            samples.add(1, stack);
        }
        let profile = samples.profile();
        assert_eq!((profile.total, profile.frames.len()), (3, 2));
        assert_eq!(profile.stacks[0], SampledStack { frames: vec![0, 1], count: 2 });
        assert_eq!(profile.lines, vec![SampledLine { file: "p.c".into(), line: 3, count: 2 }]);
        assert_eq!(samples.hottest()[0], ("main".into(), "/bin/p".into(), 3));
        assert!(profile.throttled.is_empty());
    }

    #[test]
    fn after_a_throttle_samples_tell_the_functions_time_and_which_caller_held_it() {
        let names = ["main", "outer", "tiny"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        let stack =
            |names: &[&str]| ResolvedStack { frames: names.iter().map(|n| frame(n)).collect(), line: None, timed_calls: Vec::new() };
        let in_tiny = stack(&["main", "outer", "tiny"]);
        samples.add(7, &in_tiny);
        assert!(samples.profile().throttled.is_empty(), "before the throttle, tiny's calls were timed");
        // tiny and outer throttled: main holds their time.
        samples.throttle(&[2, 1]);
        samples.add(7, &in_tiny);
        samples.add(7, &stack(&["main", "outer"]));
        samples.add(7, &stack(&["main"]));
        let throttled = samples.profile().throttled;
        let of = |name: &str| throttled.functions.iter().find(|t| t.name == name).map(|t| (t.self_samples, t.total_samples));
        assert_eq!(of("tiny"), Some((1, 1)));
        assert_eq!(of("outer"), Some((1, 2)));
        let held = |callee: &str| HeldSamples {
            tid: 7,
            name: "main".into(),
            callee: callee.into(),
            callee_module: "/bin/p".into(),
            samples: 1,
            taken_ns: None,
        };
        assert_eq!(throttled.held, vec![held("outer"), held("tiny")]);
        // outer's calls no longer counted either: the samples since are told apart.
        samples.uncounted(&[1]);
        samples.add(7, &in_tiny);
        samples.add(7, &stack(&["main"]));
        let throttled = samples.profile().throttled;
        let of = |name: &str| throttled.functions.iter().find(|t| t.name == name).map(|t| (t.total_samples, t.total_samples_uncounted));
        assert_eq!(of("outer"), Some((3, 1)));
        assert_eq!(of("tiny"), Some((2, 0)), "still counted");
    }

    /// A forked child that could not be held as a function's counting
    /// stopped counts its calls still: its samples are not among those
    /// the calls since are estimated from, the other processes' are.
    #[test]
    fn samples_of_a_process_still_counting_a_function_do_not_estimate_its_calls() {
        let names = ["main", "work"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        let in_work = ResolvedStack { frames: vec![frame("main"), frame("work")], line: None, timed_calls: Vec::new() };
        samples.throttle(&[1]);
        samples.uncounted(&[1]);
        samples.counting_goes_on(20, &[1]);
        for (pid, tid) in [(10, 10), (10, 11), (20, 21), (20, 21), (20, 22)] {
            samples.add_at(pid, tid, 0, &in_work);
        }
        let throttled = samples.profile().throttled;
        let work = throttled.functions.iter().find(|t| t.name == "work").unwrap();
        assert_eq!((work.total_samples, work.total_samples_uncounted), (5, 2));
        // Its pid taken again by a new child of a process whose counting
        // stopped: so did the child's, and its samples tell its calls. A
        // child of the one still counting counts too.
        samples.forked(10, 20);
        samples.add_at(20, 23, 0, &in_work);
        samples.counting_goes_on(30, &[1]);
        samples.forked(30, 31);
        samples.add_at(31, 31, 0, &in_work);
        samples.add_at(31, 31, 0, &in_work);
        let throttled = samples.profile().throttled;
        let work = throttled.functions.iter().find(|t| t.name == "work").unwrap();
        assert_eq!((work.total_samples, work.total_samples_uncounted), (8, 3));
    }

    /// A sample in a throttled function's counting stub is counting's
    /// time: kept apart from the samples that stand for its calls.
    #[test]
    fn samples_in_a_throttled_functions_counting_stub_are_kept_apart() {
        let names = ["main", "work"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        let in_work = ResolvedStack { frames: vec![frame("main"), frame("work")], line: None, timed_calls: Vec::new() };
        samples.throttle(&[1]);
        for stub in [false, true, false, true, true] {
            samples.add_at(10, 10, 0, &in_work);
            if stub {
                samples.in_counting_stub(1);
            }
        }
        // A stub of a function not throttled, or past the functions, counts only in all.
        samples.add_at(10, 10, 0, &in_work);
        samples.in_counting_stub(0);
        samples.in_counting_stub(7);
        let profile = samples.profile();
        let work = profile.throttled.functions.iter().find(|t| t.name == "work").unwrap();
        assert_eq!((work.total_samples, work.counting_samples), (6, 3));
        assert_eq!(profile.in_counting_stubs, 5);
    }

    #[test]
    fn a_patched_functions_call_no_trampoline_holds_is_estimated_from_its_samples() {
        // main and serve patched in process 10 before the sample; serve's
        // loop began before the attach (no trampoline holds its return),
        // handle's call is timed (one does). short is on kernel probes.
        let names = ["main", "serve", "handle", "short"].map(String::from).to_vec();
        let patched = ["main", "serve", "handle"].map(String::from);
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names).patching(patched);
        samples.patched(10);
        let frames = |names: &[&str]| names.iter().map(|n| frame(n)).collect::<Vec<_>>();
        let in_serve = ResolvedStack { frames: frames(&["main", "serve"]), line: None, timed_calls: Vec::new() };
        let in_handle = ResolvedStack { frames: frames(&["main", "serve", "handle"]), line: None, timed_calls: vec![2] };
        let in_short = ResolvedStack { frames: frames(&["main", "serve", "handle", "short"]), line: None, timed_calls: vec![2] };
        let in_memset = ResolvedStack { frames: frames(&["main", "serve", "memset"]), line: None, timed_calls: Vec::new() };
        for stack in [&in_serve, &in_serve, &in_handle, &in_short, &in_memset] {
            samples.add_at(10, 10, 0, stack);
        }
        // The same stacks under kernel probes (process 20): every call of an
        // instrumented function is taken as timed, as their trampoline does not tell.
        samples.add_at(20, 20, 0, &in_serve);
        let throttled = samples.profile().throttled;
        let of = |name: &str| throttled.untimed.iter().find(|t| t.name == name).map(|t| (t.self_samples, t.total_samples));
        assert_eq!(of("serve"), Some((2, 5)), "its own two, and under it three");
        assert_eq!(of("main"), Some((0, 5)));
        assert_eq!(of("handle"), None, "timed");
        assert!(throttled.functions.is_empty(), "nothing throttled");
        // memset's time is serve's own call's, which nothing timed holds.
        assert!(throttled.held.is_empty(), "{:?}", throttled.held);
    }

    #[test]
    fn frames_that_called_an_unwinder_are_timed_calls_unless_the_recording_attached() {
        // main called walk, which called glibc's backtrace (named by its
        // global symbol): the runtime put both return addresses back for it.
        let names = ["main", "walk", "cleanup"].map(String::from).to_vec();
        let patched = names.clone();
        let frames = |names: &[&str]| names.iter().map(|n| frame(n)).collect::<Vec<_>>();
        let in_walk = ResolvedStack { frames: frames(&["main", "walk", "__backtrace"]), line: None, timed_calls: vec![] };
        // A throw's unwinder calls back into the program (a cleanup run as
        // it walks): that call is timed, its callers' frames as before.
        let in_cleanup =
            ResolvedStack { frames: frames(&["main", "walk", "_Unwind_RaiseException", "cleanup"]), line: None, timed_calls: vec![3] };
        let untimed = |samples: SampleAggregator| -> Vec<(String, u64, u64)> {
            let throttled = samples.profile().throttled;
            throttled.untimed.iter().map(|t| (t.name.clone(), t.self_samples, t.total_samples)).collect()
        };
        let mut launched = SampleAggregator::new("cpu-clock", 1000).measuring(names.clone()).patching(patched.clone());
        launched.patched(10);
        let mut attached = SampleAggregator::new("cpu-clock", 1000).measuring(names).patching(patched).attached();
        attached.patched(10);
        for samples in [&mut launched, &mut attached] {
            samples.add_at(10, 10, 0, &in_walk);
            samples.add_at(10, 10, 0, &in_cleanup);
        }
        assert_eq!(untimed(launched), Vec::new());
        // Attached, main or walk may have begun before the probes: untimed as their frames say.
        let mut seen = untimed(attached);
        seen.sort();
        assert_eq!(seen, [("main".to_string(), 0, 2), ("walk".to_string(), 0, 2)]);
    }

    #[test]
    fn a_throttled_functions_call_still_timed_holds_what_its_callees_took_after_the_throttle() {
        // emit recurses; throttled while its outermost call was under way,
        // which the probes time to its end (its return still goes through
        // a trampoline): that call, not main, holds the time of the calls
        // below it, and only the untimed ones count as emit's estimate.
        let names = ["main", "emit", "match"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        samples.throttle(&[1, 2]);
        let frames = |names: &[&str]| names.iter().map(|n| frame(n)).collect::<Vec<_>>();
        // Frame 1, the outer emit, is a timed call; frame 2 is not.
        let in_match = ResolvedStack { frames: frames(&["main", "emit", "emit", "match"]), line: None, timed_calls: vec![1] };
        let in_inner_emit = ResolvedStack { frames: frames(&["main", "emit", "emit"]), line: None, timed_calls: vec![1] };
        let in_outer_emit = ResolvedStack { frames: frames(&["main", "emit"]), line: None, timed_calls: vec![1] };
        samples.add(7, &in_match);
        samples.add(7, &in_inner_emit);
        samples.add(7, &in_outer_emit);
        let throttled = samples.profile().throttled;
        let held = |callee: &str| HeldSamples {
            tid: 7,
            name: "emit".into(),
            callee: callee.into(),
            callee_module: "/bin/p".into(),
            samples: 1,
            taken_ns: None,
        };
        assert_eq!(throttled.held, vec![held("emit"), held("match")]);
        let of = |name: &str| throttled.functions.iter().find(|t| t.name == name).map(|t| (t.self_samples, t.total_samples));
        assert_eq!(of("match"), Some((1, 1)));
        assert_eq!(of("emit"), Some((1, 2)), "the outer call's own sample is measured, not estimated");
    }

    #[test]
    fn samples_of_an_image_an_exec_replaced_estimate_nothing_instrumented() {
        // The same program executed again: its functions have the names of
        // those measured in the image before, and none of their time.
        let names = ["main", "work"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        samples.throttle(&[1]);
        let in_work = ResolvedStack { frames: vec![frame("main"), frame("work")], line: None, timed_calls: Vec::new() };
        // 40's own exec started it; the engine patched it; it forked 41.
        samples.executed(40);
        samples.patched(40);
        samples.forked(40, 41);
        samples.add_at(40, 40, 1, &in_work);
        samples.add_at(41, 41, 1, &in_work);
        // 40 executes itself again and forks 43 from the new image; 41 runs
        // on the patched one; 44, never patched (uprobes stay on the file),
        // executed too.
        samples.executed(40);
        samples.forked(40, 43);
        samples.executed(44);
        for pid in [40, 43, 41, 44] {
            samples.add_at(pid, pid, 2, &in_work);
        }
        let profile = samples.profile();
        let work = profile.throttled.functions.iter().find(|t| t.name == "work").map(|t| (t.self_samples, t.total_samples));
        assert_eq!(work, Some((4, 4)), "40 and 41 before the exec, 41 and 44 after");
        assert_eq!(profile.throttled.held.iter().map(|h| h.samples).sum::<u64>(), 4);
        assert_eq!(profile.total, 6, "every sample stays in the stacks");
    }

    #[test]
    fn the_kernels_time_is_its_own_even_under_a_name_a_library_has() {
        let names = ["main", "copy"].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        let kernel = |name: &str| SampledFrame { name: name.into(), module: KERNEL_IMAGE.into(), inlined: false };
        let stack = |frames: Vec<SampledFrame>| ResolvedStack { frames, line: None, timed_calls: Vec::new() };
        // copy calls the library's memcpy, which faults: the kernel's memcpy
        // (and its unnamed time, where its symbols are hidden) is not the
        // library's, nor copy's.
        samples.add(7, &stack(vec![frame("main"), frame("copy"), frame("memcpy"), kernel("memcpy")]));
        samples.add(7, &stack(vec![frame("main"), frame("copy"), frame("memcpy"), kernel("memcpy")]));
        samples.add(7, &stack(vec![frame("main"), frame("copy"), kernel("[kernel]")]));
        samples.add(7, &stack(vec![frame("main"), frame("copy"), frame("memcpy")]));
        let held = |callee: &str, module: &str, samples| HeldSamples {
            tid: 7,
            name: "copy".into(),
            callee: callee.into(),
            callee_module: module.into(),
            samples,
            taken_ns: None,
        };
        assert_eq!(
            samples.profile().throttled.held,
            vec![held("[kernel]", KERNEL_IMAGE, 1), held("memcpy", "/bin/p", 1), held("memcpy", KERNEL_IMAGE, 2)]
        );
    }

    #[test]
    fn a_library_functions_time_is_held_by_the_nearest_caller_still_instrumented() {
        let names = ["main", "clear", ""].map(String::from).to_vec();
        let mut samples = SampleAggregator::new("cpu-clock", 1000).measuring(names);
        let stack =
            |names: &[&str]| ResolvedStack { frames: names.iter().map(|n| frame(n)).collect(), line: None, timed_calls: Vec::new() };
        let in_memset = stack(&["main", "clear", "memset"]);
        samples.add(7, &in_memset);
        samples.add(7, &stack(&["main", "clear"]));
        samples.add(7, &stack(&["main", "clear", "[unknown: unmapped]"]));
        samples.add(7, &stack(&["main", "clear", "[probe overhead]"]));
        samples.add(7, &stack(&["_start", "__libc_start_main"]));
        let held = |name: &str, callee: &str, samples: u64| HeldSamples {
            tid: 7,
            name: name.into(),
            callee: callee.into(),
            callee_module: "/bin/p".into(),
            samples,
            taken_ns: None,
        };
        let throttled = samples.profile().throttled;
        assert_eq!(throttled.held, vec![held("clear", "memset", 1)], "only memset's own sample is clear's to give back");
        let kept = |name: &str, samples: u64| KeptSamples { tid: 7, name: name.into(), samples };
        assert_eq!(throttled.kept, vec![kept("clear", 2)], "its own code's and the unnamed frame's; not the probes'");
        assert!(throttled.functions.is_empty());
        // clear throttled: main holds memset's time, clear has it in its total only.
        samples.throttle(&[1]);
        samples.add(7, &in_memset);
        // The probes' own time under clear is nobody's to give back.
        samples.add(7, &stack(&["main", "clear", "[probe overhead]"]));
        samples.add(7, &stack(&["main", "clear"]));
        samples.add(7, &stack(&["main"]));
        let throttled = samples.profile().throttled;
        assert_eq!(throttled.held, vec![held("clear", "memset", 1), held("main", "clear", 1), held("main", "memset", 1)]);
        assert_eq!(throttled.kept, vec![kept("clear", 2), kept("main", 1)], "clear's own code is main's to give back now");
        let clear = &throttled.functions[0];
        assert_eq!((clear.name.as_str(), clear.self_samples, clear.total_samples), ("clear", 1, 3));
    }
}

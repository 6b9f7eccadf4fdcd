//! Stack samples named and counted on a thread of their own: loading a
//! module's symbols and unwinding stacks take time the recording loop,
//! which decides when probes change, cannot wait for. Inputs are taken in
//! the order given.

use crate::governor::SampledOverhead;
use crate::samples::{SampleAggregator, SampleTime};
use proftap_probes::inject::patcher::CountingStub;
use proftap_probes::metrics::Metric;
use proftap_probes::sampling::{ENGINE_MODULE, PROBE_OVERHEAD_FRAME, ResolvedStack, StackResolver, StackSample};
use proftap_profile::SampleProfile;
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

enum Input {
    Mapped { pid: u32, start: u64, len: u64, pgoff: u64, path: String },
    Exec(u32, std::time::SystemTime),
    Forked { parent: u32, child: u32 },
    EngineCode(u32, std::ops::Range<u64>),
    ForkCode(u32, Vec<std::ops::Range<u64>>),
    Origins(u32, Vec<(u64, u64)>),
    CountingStubs(u32, Vec<CountingStub>),
    ProbeReturns(u32, Vec<u64>, Vec<u64>),
    Throttle(Vec<u32>),
    Uncounted(Vec<u32>),
    CountingGoesOn(u32, Vec<u32>),
    Sample(Box<StackSample>, Vec<(u64, u64)>),
    Hottest(Sender<Vec<(String, String, u64)>>),
}

/// What the sampler counted, and the stacks in the order it counted them
/// when asked to keep them (to save with the events).
pub struct Sampled {
    /// The samples, as a profile.
    pub profile: SampleProfile,
    /// The named stacks, in order.
    pub stacks: Vec<ResolvedStack>,
    /// Each sample's process, thread, time and stack (an index into the
    /// profile's), when they were timed.
    pub timeline: Vec<SampleTime>,
}

/// The sampler's thread.
pub struct SamplerThread {
    input: Sender<Input>,
    worker: JoinHandle<Sampled>,
}

/// The event stack samples count: hardware cycles where the machine has them.
pub fn sampling_event() -> &'static str {
    let cycles = Metric::Hardware(perf_event::events::Hardware::CPU_CYCLES);
    if cycles.check_available().is_ok() { "cycles" } else { "cpu-clock" }
}

impl SamplerThread {
    /// Names samples with `resolver` and counts them with `samples`, and
    /// in `overhead` those taken in the probes' code; `keep` keeps the
    /// named stacks too.
    pub fn spawn(mut resolver: StackResolver, mut samples: SampleAggregator, overhead: Arc<SampledOverhead>, keep: bool) -> Self {
        let (input, inputs) = channel();
        let worker = std::thread::spawn(move || {
            let mut stacks = Vec::new();
            for input in inputs {
                match input {
                    Input::Mapped { pid, start, len, pgoff, path } => resolver.mapped(pid, start, len, pgoff, &path),
                    Input::Exec(pid, at) => {
                        resolver.exec(pid, at);
                        samples.executed(pid as i32);
                    }
                    Input::Forked { parent, child } => {
                        resolver.forked(parent, child);
                        samples.forked(parent as i32, child as i32);
                    }
                    Input::EngineCode(pid, range) => {
                        resolver.engine_code(pid, range);
                        samples.patched(pid as i32);
                    }
                    Input::ForkCode(pid, ranges) => resolver.fork_code(pid, ranges),
                    Input::Origins(pid, origins) => resolver.origins(pid, origins),
                    Input::CountingStubs(pid, stubs) => resolver.counting_stubs(pid, stubs),
                    Input::ProbeReturns(pid, returns, return_trampolines) => resolver.probe_returns(pid, returns, return_trampolines),
                    Input::Throttle(functions) => samples.throttle(&functions),
                    Input::Uncounted(functions) => samples.uncounted(&functions),
                    Input::CountingGoesOn(pid, functions) => samples.counting_goes_on(pid as i32, &functions),
                    Input::Sample(sample, returns) => {
                        let stack = resolver.resolve(&sample, &returns);
                        let in_engine =
                            stack.frames.last().is_some_and(|leaf| leaf.name == PROBE_OVERHEAD_FRAME && leaf.module == ENGINE_MODULE);
                        let counting = if in_engine { None } else { resolver.counting_stub_of(&sample) };
                        samples.add_at(sample.pid as i32, sample.tid as i32, sample.time, &stack);
                        if in_engine {
                            overhead.count();
                        } else if let Some(function) = counting {
                            overhead.count_counting(function);
                            samples.in_counting_stub(function);
                        }
                        if keep {
                            stacks.push(stack);
                        }
                    }
                    Input::Hottest(reply) => {
                        let _ = reply.send(samples.hottest());
                    }
                }
            }
            crate::recorder::drop_aside(resolver);
            let profile = samples.profile();
            Sampled { timeline: samples.timeline(&profile), profile, stacks }
        });
        SamplerThread { input, worker }
    }

    /// See [`StackResolver::mapped`].
    pub fn mapped(&self, pid: u32, start: u64, len: u64, pgoff: u64, path: &str) {
        let _ = self.input.send(Input::Mapped { pid, start, len, pgoff, path: path.to_string() });
    }

    /// See [`StackResolver::forked`].
    pub fn forked(&self, parent: u32, child: u32) {
        let _ = self.input.send(Input::Forked { parent, child });
    }

    /// See [`StackResolver::exec`].
    pub fn exec(&self, pid: u32, at: std::time::SystemTime) {
        let _ = self.input.send(Input::Exec(pid, at));
    }

    /// See [`StackResolver::engine_code`].
    pub fn engine_code(&self, pid: u32, range: std::ops::Range<u64>) {
        let _ = self.input.send(Input::EngineCode(pid, range));
    }

    /// See [`StackResolver::fork_code`].
    pub fn fork_code(&self, pid: u32, ranges: Vec<std::ops::Range<u64>>) {
        if !ranges.is_empty() {
            let _ = self.input.send(Input::ForkCode(pid, ranges));
        }
    }

    /// See [`StackResolver::origins`].
    pub fn origins(&self, pid: u32, origins: Vec<(u64, u64)>) {
        if !origins.is_empty() {
            let _ = self.input.send(Input::Origins(pid, origins));
        }
    }

    /// See [`StackResolver::counting_stubs`].
    pub fn counting_stubs(&self, pid: u32, stubs: Vec<CountingStub>) {
        if !stubs.is_empty() {
            let _ = self.input.send(Input::CountingStubs(pid, stubs));
        }
    }

    /// See [`StackResolver::probe_returns`].
    pub fn probe_returns(&self, pid: u32, returns: Vec<u64>, return_trampolines: Vec<u64>) {
        if !returns.is_empty() {
            let _ = self.input.send(Input::ProbeReturns(pid, returns, return_trampolines));
        }
    }

    /// See [`SampleAggregator::uncounted`].
    pub fn uncounted(&self, functions: Vec<u32>) {
        if !functions.is_empty() {
            let _ = self.input.send(Input::Uncounted(functions));
        }
    }

    /// See [`SampleAggregator::counting_goes_on`].
    pub fn counting_goes_on(&self, pid: u32, functions: Vec<u32>) {
        let _ = self.input.send(Input::CountingGoesOn(pid, functions));
    }

    /// See [`SampleAggregator::throttle`].
    pub fn throttle(&self, functions: Vec<u32>) {
        let _ = self.input.send(Input::Throttle(functions));
    }

    /// A sample, with the thread's return addresses by stack slot (see
    /// [`StackResolver::resolve`]).
    pub fn sample(&self, sample: Box<StackSample>, returns: Vec<(u64, u64)>) {
        let _ = self.input.send(Input::Sample(sample, returns));
    }

    /// See [`SampleAggregator::hottest`]: waits for the samples given so far.
    pub fn hottest(&self) -> Vec<(String, String, u64)> {
        let (reply, answer) = channel();
        let _ = self.input.send(Input::Hottest(reply));
        answer.recv().unwrap_or_default()
    }

    /// Every sample given, counted.
    pub fn finish(self) -> Sampled {
        drop(self.input);
        match self.worker.join() {
            Ok(sampled) => sampled,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

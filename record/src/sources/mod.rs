//! Where a recording's events come from: kernel uprobes and the perf
//! events that go with them ([`uprobes`]), the in-process engine's rings
//! ([`inject`]), and the stack sampler, which names the samples those
//! events carry ([`sampler`]). Each speaks [`crate::events::Event`].

pub mod inject;
pub mod sampler;
pub mod uprobes;

/// Kernel objects closing on a thread of their own while the recording is
/// put together: each perf event, BPF tracepoint program or uprobe closes
/// only after an RCU grace period (tens of milliseconds each here).
pub struct Closing(Option<std::thread::JoinHandle<()>>);

impl Closing {
    /// Starts closing `items`, in parallel.
    pub fn start(items: Vec<Box<dyn Send>>) -> Closing {
        let closer = std::thread::Builder::new().name("proftap-close".into());
        // A thread that cannot be made drops its closure, and the items, here.
        Closing(closer.spawn(move || proftap_probes::perf::close_in_parallel(items)).ok())
    }
}

/// Waits until everything is closed (the uprobes removed).
impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(closer) = self.0.take() {
            let _ = closer.join();
        }
    }
}

/// CLOCK_MONOTONIC now, nanoseconds: the clock of every event.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

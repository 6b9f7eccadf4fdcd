//! Where a recording's events come from: kernel uprobes and the perf
//! events that go with them ([`uprobes`]), the in-process engine's rings
//! ([`inject`]), and the stack sampler, which names the samples those
//! events carry ([`sampler`]). Each speaks [`crate::events::Event`].

pub mod inject;
pub mod sampler;
pub mod uprobes;

/// CLOCK_MONOTONIC now, nanoseconds: the clock of every event.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

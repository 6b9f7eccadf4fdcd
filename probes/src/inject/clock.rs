//! Converting the TSC, which the runtime reads in the target, to
//! CLOCK_MONOTONIC nanoseconds, the clock of every other proftap event.
//!
//! With the kernel's own parameters when it offers them (the perf mmap
//! page's `time_mult`, `time_shift` and `time_zero`, with the perf clock
//! tied to CLOCK_MONOTONIC by a measurement); otherwise (a VM whose
//! scheduler clock is not the TSC) by measuring the TSC against the kernel's
//! CLOCK_MONOTONIC, which the vDSO reads from the TSC itself: two readings
//! a while apart give the rate, refreshed as the recording goes on.

use std::io;

/// Offsets in `struct perf_event_mmap_page`.
mod page {
    pub const LOCK: usize = 8;
    pub const CAPABILITIES: usize = 40;
    pub const TIME_SHIFT: usize = 50;
    pub const TIME_MULT: usize = 52;
    pub const TIME_ZERO: usize = 64;
    /// `cap_user_time_zero`.
    pub const CAP_USER_TIME_ZERO: u64 = 1 << 4;
}

/// The kernel's TSC to perf clock parameters.
#[derive(Clone, Copy, Debug)]
struct PerfTime {
    shift: u32,
    mult: u64,
    zero: u64,
}

impl PerfTime {
    fn ns(&self, tsc: u64) -> u64 {
        let quot = tsc >> self.shift;
        let rem = tsc & ((1u64 << self.shift) - 1);
        self.zero.wrapping_add(quot.wrapping_mul(self.mult)).wrapping_add((rem * self.mult) >> self.shift)
    }
}

/// TSC to CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug)]
pub struct TscClock {
    kernel: Option<PerfTime>,
    /// A (TSC, CLOCK_MONOTONIC) pair.
    first: (u64, u64),
    /// A later pair: with `first`, the rate when the kernel gives none; with
    /// the kernel's parameters, the offset to CLOCK_MONOTONIC.
    latest: (u64, u64),
}

impl TscClock {
    /// A clock for this machine's TSC, which must tick at a constant rate.
    pub fn new() -> io::Result<TscClock> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or_default();
        if !flags.split_whitespace().any(|f| f == "constant_tsc") || !flags.split_whitespace().any(|f| f == "nonstop_tsc") {
            return Err(io::Error::other("this CPU's TSC does not tick at a constant rate (no constant_tsc and nonstop_tsc)"));
        }
        let first = pair();
        let kernel = perf_time();
        if kernel.is_none() {
            // A rate from a millisecond to begin with; refreshed as time goes on.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut clock = TscClock { kernel, first, latest: first };
        clock.refresh();
        Ok(clock)
    }

    /// A clock whose TSC ticks `cycles` times in `ns` nanoseconds and read 0
    /// at CLOCK_MONOTONIC 0: the same rate on every machine, for tests and
    /// the fuzz target of the totals (`fuzz/src/bin/totals.rs`).
    #[doc(hidden)]
    pub fn with_rate(cycles: u64, ns: u64) -> TscClock {
        TscClock { kernel: None, first: (0, 0), latest: (cycles, ns) }
    }

    /// Measures the TSC against CLOCK_MONOTONIC again: the longer since the
    /// first measurement, the better the rate.
    pub fn refresh(&mut self) {
        self.latest = pair();
    }

    /// TSC cycles per nanosecond.
    pub fn cycles_per_ns(&self) -> f64 {
        match &self.kernel {
            Some(kernel) => (1u64 << kernel.shift) as f64 / kernel.mult as f64,
            None => {
                let (t0, n0) = self.first;
                let (t1, n1) = self.latest;
                t1.saturating_sub(t0) as f64 / (n1.saturating_sub(n0)).max(1) as f64
            }
        }
    }

    /// TSC cycles of a number of nanoseconds.
    pub fn cycles_of(&self, ns: u64) -> u64 {
        (ns as f64 * self.cycles_per_ns()) as u64
    }

    /// The TSC reading at CLOCK_MONOTONIC `ns`.
    pub fn tsc_at(&self, ns: u64) -> u64 {
        let now = rdtsc();
        let delta = ns as i64 - self.ns(now) as i64;
        (now as i64 + (delta as f64 * self.cycles_per_ns()) as i64) as u64
    }

    /// Nanoseconds of a number of TSC cycles.
    pub fn duration_ns(&self, cycles: u64) -> u64 {
        (cycles as f64 / self.cycles_per_ns()) as u64
    }

    /// CLOCK_MONOTONIC nanoseconds of a TSC reading.
    pub fn ns(&self, tsc: u64) -> u64 {
        match &self.kernel {
            Some(kernel) => {
                let offset = self.latest.1 as i64 - kernel.ns(self.latest.0) as i64;
                (kernel.ns(tsc) as i64 + offset) as u64
            }
            None => {
                let (t0, n0) = self.first;
                let (t1, n1) = self.latest;
                let rate = (n1 - n0) as f64 / (t1.saturating_sub(t0)).max(1) as f64;
                (n0 as f64 + (tsc as f64 - t0 as f64) * rate) as u64
            }
        }
    }
}

/// The kernel's TSC parameters, when it offers them to user space.
fn perf_time() -> Option<PerfTime> {
    let mut builder = perf_event::Builder::new(perf_event::events::Software::DUMMY);
    builder.observe_self().any_cpu().enabled(true);
    let event = builder.build().ok()?;
    let len = 4096;
    // SAFETY: mapping one page of a perf event's fd read-only, as perf_event_open(2) describes.
    let mapped =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&event), 0) };
    if mapped == libc::MAP_FAILED {
        return None;
    }
    let base = mapped.cast::<u8>();
    // SAFETY: reads of the mapped page at the struct's offsets, under the
    // seqlock at LOCK as perf_event_open(2) describes.
    let read64 = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u64>()) };
    let read32 = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u32>()) };
    let read16 = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u16>()) };
    let time = loop {
        let seq = read32(page::LOCK);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let capabilities = read64(page::CAPABILITIES);
        let time = PerfTime {
            shift: u32::from(read16(page::TIME_SHIFT)),
            mult: u64::from(read32(page::TIME_MULT)),
            zero: read64(page::TIME_ZERO),
        };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        if read32(page::LOCK) == seq {
            break (capabilities & page::CAP_USER_TIME_ZERO != 0 && time.mult != 0).then_some(time);
        }
    };
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(mapped, len) };
    time
}

/// A TSC reading and CLOCK_MONOTONIC at the same moment: the tightest of a few tries.
fn pair() -> (u64, u64) {
    let mut best = (u64::MAX, (0, 0));
    for _ in 0..16 {
        let before = monotonic_ns();
        let tsc = rdtsc();
        let after = monotonic_ns();
        if after - before < best.0 {
            best = (after - before, (tsc, before / 2 + after / 2));
        }
    }
    best.1
}

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// CLOCK_MONOTONIC now, nanoseconds.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_converts_to_monotonic_time() {
        let mut clock = match TscClock::new() {
            Ok(clock) => clock,
            Err(e) => {
                assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "{e}");
                eprintln!("skipped: {e}");
                return;
            }
        };
        let t0 = rdtsc();
        let m0 = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(30));
        clock.refresh();
        let m1 = monotonic_ns();
        let t1 = rdtsc();
        // Within a couple of microseconds of the kernel's clock, at both ends.
        assert!(clock.ns(t0).abs_diff(m0) < 5_000, "{} vs {m0}", clock.ns(t0));
        assert!(clock.ns(t1).abs_diff(m1) < 5_000, "{} vs {m1}", clock.ns(t1));
        let elapsed = clock.ns(t1) - clock.ns(t0);
        assert!((30_000_000..45_000_000).contains(&elapsed), "{elapsed} ns");
    }
}

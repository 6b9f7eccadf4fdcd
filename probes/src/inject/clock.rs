//! Converting the TSC, which the runtime reads in the target, to
//! CLOCK_MONOTONIC nanoseconds, the clock of every other proftap event, with
//! the kernel's own parameters (the perf mmap page's `time_mult`,
//! `time_shift` and `time_zero`).

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

/// TSC to CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug)]
pub struct TscClock {
    shift: u32,
    mult: u64,
    zero: u64,
    /// CLOCK_MONOTONIC minus the perf clock, in ns.
    offset: i64,
}

impl TscClock {
    /// Reads the conversion from the kernel (through a perf event on this
    /// process) and measures the perf clock against CLOCK_MONOTONIC.
    pub fn new() -> io::Result<TscClock> {
        let mut builder = perf_event::Builder::new(perf_event::events::Software::DUMMY);
        builder.observe_self().any_cpu();
        let event = builder.build()?;
        let len = 4096;
        // SAFETY: mapping one page of a perf event's fd read-only, as perf_event_open(2) describes.
        let mapped =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&event), 0) };
        if mapped == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = mapped.cast::<u8>();
        // SAFETY: reads of the mapped page at the struct's offsets; the
        // kernel updates it under the seqlock at LOCK, read as it documents.
        let read = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u64>()) };
        let read32 = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u32>()) };
        let read16 = |offset: usize| unsafe { std::ptr::read_volatile(base.add(offset).cast::<u16>()) };
        let clock = loop {
            let seq = read32(page::LOCK);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let capabilities = read(page::CAPABILITIES);
            let clock = TscClock {
                shift: u32::from(read16(page::TIME_SHIFT)),
                mult: u64::from(read32(page::TIME_MULT)),
                zero: read(page::TIME_ZERO),
                offset: 0,
            };
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if read32(page::LOCK) == seq {
                break (capabilities & page::CAP_USER_TIME_ZERO != 0).then_some(clock);
            }
        };
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(mapped, len) };
        let mut clock =
            clock.ok_or_else(|| io::Error::other("the kernel does not let the TSC be converted to time here (no cap_user_time_zero)"))?;
        // The perf clock against CLOCK_MONOTONIC: the closest of a few tries.
        let mut best = (u64::MAX, 0i64);
        for _ in 0..16 {
            let before = monotonic_ns();
            let tsc = rdtsc();
            let after = monotonic_ns();
            let middle = before / 2 + after / 2;
            if after - before < best.0 {
                best = (after - before, middle as i64 - clock.perf_ns(tsc) as i64);
            }
        }
        clock.offset = best.1;
        Ok(clock)
    }

    fn perf_ns(&self, tsc: u64) -> u64 {
        let quot = tsc >> self.shift;
        let rem = tsc & ((1u64 << self.shift) - 1);
        self.zero.wrapping_add(quot.wrapping_mul(self.mult)).wrapping_add((rem * self.mult) >> self.shift)
    }

    /// CLOCK_MONOTONIC nanoseconds of a TSC reading.
    pub fn ns(&self, tsc: u64) -> u64 {
        (self.perf_ns(tsc) as i64 + self.offset) as u64
    }
}

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_converts_to_monotonic_time() {
        let clock = match TscClock::new() {
            Ok(clock) => clock,
            Err(e) => {
                assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "{e}");
                eprintln!("skipped: {e}");
                return;
            }
        };
        let before = monotonic_ns();
        let converted = clock.ns(rdtsc());
        let after = monotonic_ns();
        assert!(converted + 2_000 >= before && converted <= after + 2_000, "{before} <= {converted} <= {after}");
        // A known interval.
        let t0 = rdtsc();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let elapsed = clock.ns(rdtsc()) - clock.ns(t0);
        assert!((20_000_000..40_000_000).contains(&elapsed), "{elapsed} ns");
    }
}

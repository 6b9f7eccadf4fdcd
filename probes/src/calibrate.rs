//! The calibration helper: four tiny functions proftap times to learn what
//! a probe costs on this machine. proftap runs itself as a helper process
//! that calls each one many times: one uninstrumented, one whose first
//! instruction the kernel emulates (`push`), one it must single-step
//! (`lea`), one long enough for the in-process engine to patch. The helper
//! times each loop; the recorder records it once with uprobes and once with
//! the in-process engine and compares.

/// Calls per loop in the helper.
pub const CALLS: u64 = 20_000;
/// Calls of the patched function: enough for the engine's steady state
/// (its rings' pages in place), where a call costs tens of nanoseconds.
pub const PATCHED_CALLS: u64 = 400_000;
/// Calls in each loop: bare, emulated, stepped, patched.
pub const LOOP_CALLS: [u64; 4] = [CALLS, CALLS, CALLS, PATCHED_CALLS];

/// The helper's function whose first instruction the kernel emulates.
pub const EMULATED: &str = "proftap_calibrate_emulated";
/// The helper's function whose first instruction the kernel single-steps.
pub const STEPPED: &str = "proftap_calibrate_stepped";
/// The helper's function the in-process engine patches.
pub const PATCHED: &str = "proftap_calibrate_patched";

/// Where each function's loop is in the helper's timings.
pub const EMULATED_LOOP: usize = 1;
/// See [`EMULATED_LOOP`].
pub const STEPPED_LOOP: usize = 2;
/// See [`EMULATED_LOOP`].
pub const PATCHED_LOOP: usize = 3;

#[cfg(target_arch = "x86_64")]
mod tiny {
    /// An empty function whose first instruction (`push`) the kernel emulates.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub extern "C" fn proftap_calibrate_emulated() {
        core::arch::naked_asm!("push rbp", "pop rbp", "ret")
    }

    /// An empty function whose first instruction (`lea`) the kernel single-steps.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub extern "C" fn proftap_calibrate_stepped() {
        core::arch::naked_asm!("lea rax, [rdi + 1]", "ret")
    }

    /// An empty function with a frame: its first five bytes are whole
    /// instructions, which the in-process engine patches.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub extern "C" fn proftap_calibrate_patched() {
        core::arch::naked_asm!("push rbp", "mov rbp, rsp", "pop rbp", "ret")
    }

    /// The same, never instrumented: the baseline.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub extern "C" fn proftap_calibrate_bare() {
        core::arch::naked_asm!("push rbp", "mov rbp, rsp", "pop rbp", "ret")
    }
}

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a local timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Calls timed together in each loop (bare, emulated, stepped, patched):
/// each loop is timed in chunks of tens of microseconds and the fastest
/// chunk stands for all, so that the chunks the scheduler interrupted (a
/// loaded machine, tests in parallel) change nothing.
const CHUNK_CALLS: [u64; 4] = [1_000, 20, 5, 1_000];

/// The helper's side: calls each function its loop's number of times and
/// returns `wall cpu` nanoseconds per loop (bare, emulated, stepped,
/// patched) on one line, each the fastest chunk's times the chunks in the
/// loop.
#[cfg(target_arch = "x86_64")]
pub fn helper_main() -> String {
    let functions: [extern "C" fn(); 4] =
        [tiny::proftap_calibrate_bare, tiny::proftap_calibrate_emulated, tiny::proftap_calibrate_stepped, tiny::proftap_calibrate_patched];
    let mut out = Vec::new();
    for ((f, calls), chunk) in functions.into_iter().zip(LOOP_CALLS).zip(CHUNK_CALLS) {
        let f = std::hint::black_box(f);
        let (mut wall, mut cpu) = (u64::MAX, u64::MAX);
        let chunks = calls / chunk;
        for _ in 0..chunks {
            let (wall_start, cpu_start) = (now(libc::CLOCK_MONOTONIC), now(libc::CLOCK_THREAD_CPUTIME_ID));
            for _ in 0..chunk {
                f();
            }
            wall = wall.min(now(libc::CLOCK_MONOTONIC) - wall_start);
            cpu = cpu.min(now(libc::CLOCK_THREAD_CPUTIME_ID) - cpu_start);
        }
        out.push(format!("{} {}", wall * chunks, cpu * chunks));
    }
    out.join(" ")
}

/// Not measurable on this architecture.
#[cfg(not(target_arch = "x86_64"))]
pub fn helper_main() -> String {
    String::new()
}

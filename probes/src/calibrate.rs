//! Measuring what a probe costs on this machine, so that reports can say how
//! much of a run the instrumentation took and `--compensate` can subtract it.
//!
//! proftap runs itself as a helper process that calls four tiny functions
//! many times: one uninstrumented, one whose first instruction the kernel
//! emulates (`push`), one it must single-step (`lea`), one long enough for
//! the in-process engine to patch. The helper times each loop; proftap
//! records the helper with the same machinery as any target, once with
//! uprobes and once with the in-process engine. The difference per call is
//! what one instrumented call adds to its caller; the inclusive time the
//! empty functions show is what a call adds to itself.

use crate::entry::EntryKind;
use crate::exits::ExitMode;
use crate::metrics::Metric;
use crate::plan::{ProbedFunction, Role};
use crate::record::{CallCost, Engine, ProbeCost, RecordOptions, TargetSpec, record};
use crate::select::Selected;
use crate::symbols::{LoadOptions, SymbolIndex};
use proftap_profile::Profile;
use std::path::Path;

/// Calls per loop in the helper.
const CALLS: u64 = 20_000;
/// Calls of the patched function: enough for the engine's steady state
/// (its rings' pages in place), where a call costs tens of nanoseconds.
const PATCHED_CALLS: u64 = 400_000;
/// Calls in each loop: bare, emulated, stepped, patched.
const LOOP_CALLS: [u64; 4] = [CALLS, CALLS, CALLS, PATCHED_CALLS];

/// The helper's functions, by symbol name.
const EMULATED: &str = "proftap_calibrate_emulated";
const STEPPED: &str = "proftap_calibrate_stepped";
const PATCHED: &str = "proftap_calibrate_patched";

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

/// The helper's side: calls each function `CALLS` times and prints
/// `wall cpu` nanoseconds per loop (bare, emulated, stepped, patched) on one line.
#[cfg(target_arch = "x86_64")]
pub fn helper_main() -> String {
    let functions: [extern "C" fn(); 4] =
        [tiny::proftap_calibrate_bare, tiny::proftap_calibrate_emulated, tiny::proftap_calibrate_stepped, tiny::proftap_calibrate_patched];
    let mut out = Vec::new();
    for (f, calls) in functions.into_iter().zip(LOOP_CALLS) {
        let f = std::hint::black_box(f);
        let (wall, cpu) = (now(libc::CLOCK_MONOTONIC), now(libc::CLOCK_THREAD_CPUTIME_ID));
        for _ in 0..calls {
            f();
        }
        out.push(format!("{} {}", now(libc::CLOCK_MONOTONIC) - wall, now(libc::CLOCK_THREAD_CPUTIME_ID) - cpu));
    }
    out.join(" ")
}

/// Not measurable on this architecture.
#[cfg(not(target_arch = "x86_64"))]
pub fn helper_main() -> String {
    String::new()
}

/// Errors calibrating.
#[derive(Debug, thiserror::Error)]
#[error("cannot measure the cost of a probe: {0}")]
pub struct CalibrationError(String);

/// Measures the probe cost by recording `exe` (proftap itself) run as
/// `exe HELPER_ARG OUT`, where the helper writes its timings to OUT.
pub fn calibrate(exe: &Path, helper_arg: &str, exits: ExitMode) -> Result<ProbeCost, CalibrationError> {
    let index = SymbolIndex::load(exe, &LoadOptions::default()).map_err(|e| CalibrationError(e.to_string()))?;
    let probed = Helper::record(exe, &index, helper_arg, &[EMULATED, STEPPED], exits, Engine::Uprobe)?;
    if !probed.functions.iter().any(|f| f.entry == EntryKind::Emulated) || !probed.functions.iter().any(|f| f.entry == EntryKind::Stepped) {
        return Err(CalibrationError("the helper's functions were not classified as expected".into()));
    }
    let patched = Helper::record(exe, &index, helper_arg, &[PATCHED], exits, Engine::Inject)?;
    if patched.profile.recording.engine != "inject" || patched.profile.notes.iter().any(|n| n.contains(PATCHED)) {
        return Err(CalibrationError(format!("the in-process engine did not patch {PATCHED}: {}", patched.profile.notes.join("; "))));
    }
    Ok(ProbeCost {
        emulated: probed.cost(EMULATED, EMULATED_LOOP),
        stepped: probed.cost(STEPPED, STEPPED_LOOP),
        injected: patched.cost(PATCHED, PATCHED_LOOP),
    })
}

/// Where each function's loop is in the helper's timings.
const EMULATED_LOOP: usize = 1;
const STEPPED_LOOP: usize = 2;
const PATCHED_LOOP: usize = 3;

/// One recording of the helper.
struct Helper {
    functions: Vec<ProbedFunction>,
    profile: Profile,
    /// Wall and CPU nanoseconds of each loop: bare, emulated, stepped, patched.
    loops: Vec<(u64, u64)>,
}

impl Helper {
    /// Runs the helper with `names` instrumented by `engine`.
    fn record(
        exe: &Path,
        index: &SymbolIndex,
        helper_arg: &str,
        names: &[&str],
        exits: ExitMode,
        engine: Engine,
    ) -> Result<Helper, CalibrationError> {
        let err = |e: &dyn std::fmt::Display| CalibrationError(e.to_string());
        let selected: Vec<Selected> = names
            .iter()
            .map(|name| {
                index
                    .functions
                    .iter()
                    .position(|f| f.raw_name == *name)
                    .map(|function| Selected { module: 0, function })
                    .ok_or_else(|| CalibrationError(format!("{name} is missing from {}", exe.display())))
            })
            .collect::<Result<_, _>>()?;
        let mut warnings = Vec::new();
        let functions: Vec<ProbedFunction> = crate::plan::plan(&[index], &[exe.to_path_buf()], &selected, exits, &mut warnings);
        debug_assert!(functions.iter().all(|f| f.role == Role::Measured));

        // A fresh private directory: a predictable name in a shared one
        // would let another user put a link there for proftap to write through.
        let dir = tempfile::Builder::new().prefix("proftap-calibrate-").tempdir().map_err(|e| err(&e))?;
        let out = dir.path().join("timings");
        let argv = vec![exe.as_os_str().to_owned(), helper_arg.into(), out.as_os_str().to_owned()];
        let options = RecordOptions { metrics: vec![Metric::Wall, Metric::Cpu], engine, ..RecordOptions::default() };
        let recorded = record(&functions, &TargetSpec::Launch { path: exe.to_path_buf(), argv, launch: Default::default() }, &options)
            .map_err(|e| err(&e));
        let timings = std::fs::read_to_string(&out);
        drop(dir);
        let recorded = recorded?;
        let t: Vec<u64> = timings.map_err(|e| err(&e))?.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        if t.len() != 8 {
            return Err(CalibrationError("the helper reported no timings".into()));
        }
        Ok(Helper { functions, profile: recorded.profile, loops: t.chunks_exact(2).map(|p| (p[0], p[1])).collect() })
    }

    /// The cost of a call of function `name`, whose loop is `timed`.
    fn cost(&self, name: &str, timed: usize) -> CallCost {
        let id = self.functions.iter().position(|f| f.info.name == name);
        let calls = LOOP_CALLS[timed];
        let per_call = |loop_ns: u64, bare_ns: u64| loop_ns.saturating_sub(bare_ns * calls / CALLS) / calls;
        // What the empty function showed as its own inclusive time.
        let merged = self.profile.merged_functions();
        let own = |metric: usize| -> u64 {
            merged.iter().find(|s| Some(s.function as usize) == id).map_or(0, |s| s.inclusive[metric].avg(s.calls))
        };
        let ((bare_wall, bare_cpu), (wall, cpu)) = (self.loops[0], self.loops[timed]);
        CallCost { call_ns: per_call(wall, bare_wall), call_cpu_ns: per_call(cpu, bare_cpu), self_ns: own(0), self_cpu_ns: own(1) }
    }
}

//! Measuring what a probe costs on this machine, so that reports can say how
//! much of a run the instrumentation took and `--compensate` can subtract it.
//!
//! proftap runs itself as a helper process that calls three tiny functions
//! many times: one uninstrumented, one whose first instruction the kernel
//! emulates (`push`), one it must single-step (`lea`). The helper times each
//! loop; proftap records the helper with the same machinery as any target.
//! The difference per call is what one instrumented call adds to its caller;
//! the inclusive time the empty functions show is what a call adds to itself.

use crate::exits::ExitMode;
use crate::metrics::Metric;
use crate::plan::{EntryKind, ProbedFunction, Role};
use crate::record::{CallCost, ProbeCost, RecordOptions, TargetSpec, record};
use crate::select::Selected;
use crate::symbols::{LoadOptions, SymbolIndex};
use std::path::Path;

/// Calls per loop in the helper.
const CALLS: u64 = 20_000;

/// The helper's functions, by symbol name.
const EMULATED: &str = "proftap_calibrate_emulated";
const STEPPED: &str = "proftap_calibrate_stepped";

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

    /// The same as the emulated one, never probed: the baseline.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub extern "C" fn proftap_calibrate_bare() {
        core::arch::naked_asm!("push rbp", "pop rbp", "ret")
    }
}

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a local timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The helper's side: calls each function `CALLS` times and prints
/// `wall cpu` nanoseconds per loop (bare, emulated, stepped) on one line.
#[cfg(target_arch = "x86_64")]
pub fn helper_main() -> String {
    let functions: [extern "C" fn(); 3] = [tiny::proftap_calibrate_bare, tiny::proftap_calibrate_emulated, tiny::proftap_calibrate_stepped];
    let mut out = Vec::new();
    for f in functions {
        let f = std::hint::black_box(f);
        let (wall, cpu) = (now(libc::CLOCK_MONOTONIC), now(libc::CLOCK_THREAD_CPUTIME_ID));
        for _ in 0..CALLS {
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
    let err = |e: &dyn std::fmt::Display| CalibrationError(e.to_string());
    let index = SymbolIndex::load(exe, &LoadOptions::default()).map_err(|e| err(&e))?;
    let selected: Vec<Selected> = [EMULATED, STEPPED]
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
    let functions: Vec<ProbedFunction> = crate::plan::plan(&[&index], &[exe.to_path_buf()], &selected, exits, &mut warnings);
    debug_assert!(functions.iter().all(|f| f.role == Role::Measured));

    let dir = tempdir().map_err(|e| err(&e))?;
    let out = dir.join("timings");
    let argv = vec![exe.as_os_str().to_owned(), helper_arg.into(), out.as_os_str().to_owned()];
    let options = RecordOptions { metrics: vec![Metric::Wall, Metric::Cpu], ..RecordOptions::default() };
    let recorded = record(&functions, &TargetSpec::Launch { path: exe.to_path_buf(), argv, launch: Default::default() }, &options)
        .map_err(|e| err(&e));
    let timings = std::fs::read_to_string(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let recorded = recorded?;
    let t: Vec<u64> = timings.map_err(|e| err(&e))?.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let [bare_wall, bare_cpu, emu_wall, emu_cpu, step_wall, step_cpu] = t[..] else {
        return Err(CalibrationError("the helper reported no timings".into()));
    };
    let per_call = |loop_ns: u64, bare_ns: u64| loop_ns.saturating_sub(bare_ns) / CALLS;
    // What the empty functions showed as their own inclusive time.
    let merged = recorded.profile.merged_functions();
    let own = |kind: EntryKind, metric: usize| -> u64 {
        let id = functions.iter().position(|f| f.entry == kind);
        merged.iter().find(|s| Some(s.function as usize) == id).map_or(0, |s| s.inclusive[metric].avg(s.calls))
    };
    if !functions.iter().any(|f| f.entry == EntryKind::Emulated) || !functions.iter().any(|f| f.entry == EntryKind::Stepped) {
        return Err(CalibrationError("the helper's functions were not classified as expected".into()));
    }
    let cost = |kind, wall, cpu| CallCost {
        call_ns: per_call(wall, bare_wall),
        call_cpu_ns: per_call(cpu, bare_cpu),
        self_ns: own(kind, 0),
        self_cpu_ns: own(kind, 1),
    };
    Ok(ProbeCost { emulated: cost(EntryKind::Emulated, emu_wall, emu_cpu), stepped: cost(EntryKind::Stepped, step_wall, step_cpu) })
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("proftap-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

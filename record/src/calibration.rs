//! What a probe costs on this machine, measured once per boot and kept, so
//! that reports can say how much of a run the instrumentation took and
//! times can be compensated.
//!
//! proftap runs itself as the calibration helper
//! ([`proftap_probes::calibrate`]) and records it with the same machinery as
//! any target, once with uprobes and once with the in-process engine. The
//! difference per call is what one instrumented call adds to its caller; the
//! inclusive time the empty functions show is what a call adds to itself.

use crate::cost::{CallCost, ProbeCost};
use crate::options::{RecordOptions, TargetSpec};
use crate::recorder::record;
use proftap_probes::boot_cache;
pub use proftap_probes::calibrate::helper_main;
use proftap_probes::calibrate::{CALLS, EMULATED, EMULATED_LOOP, LOOP_CALLS, PATCHED, PATCHED_LOOP, STEPPED, STEPPED_LOOP};
use proftap_probes::entry::EntryKind;
use proftap_probes::exits::ExitMode;
use proftap_probes::metrics::Metric;
use proftap_probes::plan::{ProbedFunction, Role};
use proftap_probes::select::Selected;
use proftap_probes::symbols::{ElfImage, LoadOptions, SymbolIndex};
use proftap_profile::{Engine, Profile};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The argument a program given as the helper runs
/// [`proftap_probes::calibrate::helper_main`] with (both `proftap` and
/// `proftapd` take it).
pub const HELPER_ARGUMENT: &str = "__calibrate-helper";

#[derive(Serialize, Deserialize, Default)]
struct Cache {
    boot_id: String,
    version: String,
    uretprobe: Option<ProbeCost>,
    return_sites: Option<ProbeCost>,
}

/// Where this boot's measurement is kept.
fn cache_path() -> Option<PathBuf> {
    Some(boot_cache::dir()?.join("calibration.json"))
}

/// The probe cost for `exits`: from the cache when this boot measured it
/// already (unless `fresh`), else measured now (about half a second) by
/// running `exe HELPER_ARG OUT`, `exe` being a program whose `helper_arg`
/// runs [`proftap_probes::calibrate::helper_main`] and writes its result to OUT.
pub fn probe_cost(exe: &Path, helper_arg: &str, exits: ExitMode, fresh: bool) -> Result<ProbeCost, CalibrationError> {
    let path = cache_path();
    let mut cache: Cache =
        path.as_ref().and_then(|p| std::fs::read(p).ok()).and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    if cache.boot_id != boot_cache::boot_id() || cache.version != env!("CARGO_PKG_VERSION") {
        cache = Cache { boot_id: boot_cache::boot_id(), version: env!("CARGO_PKG_VERSION").into(), ..Cache::default() };
    }
    let slot = match exits {
        ExitMode::Uretprobe => &mut cache.uretprobe,
        ExitMode::ReturnSites => &mut cache.return_sites,
    };
    if let (Some(cost), false) = (*slot, fresh) {
        return Ok(cost);
    }
    let cost = calibrate(exe, helper_arg, exits)?;
    *slot = Some(cost);
    if let Some(path) = &path {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Ok(json) = serde_json::to_vec(&cache) {
            let _ = proftap_profile::write_atomically(path, |out| std::io::Write::write_all(out, &json));
        }
    }
    Ok(cost)
}

/// Why the probe cost could not be measured.
#[derive(Debug, thiserror::Error)]
#[error("cannot measure the cost of a probe: {0}")]
pub struct CalibrationError(String);

impl CalibrationError {
    /// An error saying why, in a few words.
    pub fn new(why: impl Into<String>) -> Self {
        CalibrationError(why.into())
    }

    /// Why, in a few words.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

/// Measures the probe cost by recording `exe` (proftap itself) run as
/// `exe HELPER_ARG OUT`, where the helper writes its timings to OUT.
fn calibrate(exe: &Path, helper_arg: &str, exits: ExitMode) -> Result<ProbeCost, CalibrationError> {
    let image = ElfImage::open(exe).map_err(|e| CalibrationError(e.to_string()))?;
    let index = SymbolIndex::of_image(&image, &LoadOptions::default()).map_err(|e| CalibrationError(e.to_string()))?;
    // Without the right to place uprobes no recording will: only the
    // in-process engine is measured, the uprobes' cost stays the estimate.
    let uprobes = if proftap_probes::perf::may_define_uprobes() {
        let probed = Helper::record(exe, (&index, &image), helper_arg, &[EMULATED, STEPPED], exits, Engine::Uprobe)?;
        let kinds = [EntryKind::Emulated, EntryKind::Stepped].map(|kind| probed.functions.iter().any(|f| f.entry == kind));
        if kinds != [true, true] {
            return Err(CalibrationError("the helper's functions were not classified as expected".into()));
        }
        Some(probed)
    } else {
        None
    };
    let patched = Helper::record(exe, (&index, &image), helper_arg, &[PATCHED], exits, Engine::Inject)?;
    let patched_it = patched.profile.functions.iter().any(|f| f.name == PATCHED && f.engine == Some(Engine::Inject));
    if patched.profile.recording.engine != Engine::Inject || !patched_it {
        return Err(CalibrationError(format!("the in-process engine did not patch {PATCHED}")));
    }
    Ok(ProbeCost {
        emulated: uprobes.as_ref().map_or(ProbeCost::ESTIMATE.emulated, |u| u.cost(EMULATED, EMULATED_LOOP)),
        stepped: uprobes.as_ref().map_or(ProbeCost::ESTIMATE.stepped, |u| u.cost(STEPPED, STEPPED_LOOP)),
        injected: patched.cost(PATCHED, PATCHED_LOOP),
    })
}

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
        (index, image): (&SymbolIndex, &ElfImage),
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
        let functions: Vec<ProbedFunction> =
            proftap_probes::plan::plan(&[index], &[Some(image)], &[exe.to_path_buf()], &selected, exits, &mut warnings);
        debug_assert!(functions.iter().all(|f| f.role == Role::Measured));

        // A fresh private directory: a predictable name in a shared one
        // would let another user put a link there for proftap to write through.
        let dir = tempfile::Builder::new().prefix("proftap-calibrate-").tempdir().map_err(|e| err(&e))?;
        let out = dir.path().join("timings");
        let argv = vec![exe.as_os_str().to_owned(), helper_arg.into(), out.as_os_str().to_owned()];
        let options = RecordOptions { metrics: vec![Metric::Wall, Metric::Cpu], engine, ..RecordOptions::default() };
        let recorded =
            record(&functions, &TargetSpec::Launch { path: exe.to_path_buf(), argv, launch: Default::default() }, None, &options, None)
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
            merged.iter().find(|s| Some(s.function as usize) == id).map_or(0, |s| s.inclusive[metric].avg(s.timed_calls()))
        };
        let ((bare_wall, bare_cpu), (wall, cpu)) = (self.loops[0], self.loops[timed]);
        // The scheduler stretches a call's wall time, never its CPU time,
        // and an empty function's are otherwise the same.
        let (self_ns, self_cpu_ns) = (own(0).min(own(1)), own(1));
        // A call costs its caller at least what it shows as its own time:
        // a difference of loops coming out under it was noise.
        CallCost {
            call_ns: per_call(wall, bare_wall).max(self_ns),
            call_cpu_ns: per_call(cpu, bare_cpu).max(self_cpu_ns),
            self_ns,
            self_cpu_ns,
        }
    }
}

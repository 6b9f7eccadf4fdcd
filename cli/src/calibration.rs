//! The measured cost of a probe, cached for the machine's current boot.

use proftap_probes::calibrate::calibrate;
use proftap_probes::exits::ExitMode;
use proftap_probes::record::ProbeCost;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The hidden subcommand proftap runs itself with to be measured.
pub const HELPER: &str = "__calibrate-helper";

#[derive(Serialize, Deserialize, Default)]
struct Cache {
    boot_id: String,
    version: String,
    uretprobe: Option<ProbeCost>,
    return_sites: Option<ProbeCost>,
}

/// Where this boot's measurement is kept: a directory only this user can
/// write to (`/run/proftap` for root, `$XDG_RUNTIME_DIR` for others), or
/// nowhere, since a shared directory such as /tmp would let another user
/// plant the file proftap reads.
fn cache_path() -> Option<PathBuf> {
    let dir =
        if nix::unistd::geteuid().is_root() { PathBuf::from("/run/proftap") } else { PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?) };
    Some(dir.join("calibration.json"))
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string()
}

/// The probe cost for `exits`: from the cache when this boot measured it
/// already (unless `fresh`), else measured now (about half a second).
/// `None`, with a warning, when it cannot be measured.
pub fn probe_cost(exits: ExitMode, fresh: bool) -> Option<ProbeCost> {
    let path = cache_path();
    let mut cache: Cache =
        path.as_ref().and_then(|p| std::fs::read(p).ok()).and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    if cache.boot_id != boot_id() || cache.version != env!("CARGO_PKG_VERSION") {
        cache = Cache { boot_id: boot_id(), version: env!("CARGO_PKG_VERSION").into(), ..Cache::default() };
    }
    let slot = match exits {
        ExitMode::Uretprobe => &mut cache.uretprobe,
        ExitMode::ReturnSites => &mut cache.return_sites,
    };
    if let (Some(cost), false) = (*slot, fresh) {
        return Some(cost);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("proftap: warning: cannot measure the probe cost: {e}; the report will not estimate the overhead");
            return None;
        }
    };
    match calibrate(&exe, HELPER, exits) {
        Ok(cost) => {
            *slot = Some(cost);
            if let Some(path) = &path {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                if let Ok(json) = serde_json::to_vec(&cache) {
                    let _ = proftap_profile::write_atomically(path, |out| std::io::Write::write_all(out, &json));
                }
            }
            Some(cost)
        }
        Err(e) => {
            eprintln!("proftap: warning: {e}; the report will not estimate the overhead");
            None
        }
    }
}

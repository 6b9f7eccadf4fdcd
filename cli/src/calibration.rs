//! The measured cost of a probe, cached for the machine's current boot.

use proftap_probes::exits::ExitMode;
use proftap_record::recorder::ProbeCost;

/// The hidden subcommand proftap runs itself with to be measured.
pub const HELPER: &str = "__calibrate-helper";

/// The probe cost for `exits`: from this boot's cache unless `fresh`, else
/// measured now (about half a second). `None`, with a warning, when it
/// cannot be measured.
pub fn probe_cost(exits: ExitMode, fresh: bool) -> Option<ProbeCost> {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("proftap: warning: cannot measure the probe cost: {e}; the report will not estimate the overhead");
            return None;
        }
    };
    match proftap_record::calibration::probe_cost(&exe, HELPER, exits, fresh) {
        Ok(cost) => Some(cost),
        Err(e) => {
            eprintln!("proftap: warning: {e}; the report will not estimate the overhead");
            None
        }
    }
}

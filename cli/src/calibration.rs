//! The probe cost, measured by running proftap itself as the helper.

use proftap_probes::exits::ExitMode;
use proftap_record::calibration::{CalibrationError, HELPER_ARGUMENT, probe_cost};
use proftap_record::cost::ProbeCost;
use proftap_record::prepare::ProbeCostSource;

/// Measures with this very program as the helper (see `__calibrate-helper`).
pub struct OwnHelper;

impl ProbeCostSource for OwnHelper {
    fn probe_cost(&self, exits: ExitMode, fresh: bool) -> Result<ProbeCost, CalibrationError> {
        let exe = std::env::current_exe().map_err(|e| CalibrationError::new(format!("cannot find proftap's own program: {e}")))?;
        probe_cost(&exe, HELPER_ARGUMENT, exits, fresh)
    }
}

//! What an instrumented call costs: measured once per machine and boot (the
//! calibration), subtracted from the times when compensation is on, and
//! added up into the profile's overhead estimate.

use crate::aggregate::Compensation;
use crate::events::Values;
use proftap_probes::entry::EntryKind;
use proftap_probes::metrics::{MAX_METRICS, Metric};
use proftap_profile::Overhead;
use serde::{Deserialize, Serialize};

/// What one instrumented call costs, measured on this machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCost {
    /// Wall time one instrumented call adds to its caller.
    pub call_ns: u64,
    /// CPU time it adds to the thread.
    pub call_cpu_ns: u64,
    /// Wall time an empty instrumented function shows as its own inclusive time.
    pub self_ns: u64,
    /// CPU time the same.
    pub self_cpu_ns: u64,
}

/// Calibrated cost of the probes, by how the kernel handles the probed
/// first instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeCost {
    /// Emulated first instruction (push, call, jmp, nop).
    pub emulated: CallCost,
    /// Single-stepped first instruction.
    pub stepped: CallCost,
    /// A function patched by the in-process engine.
    #[serde(default)]
    pub injected: CallCost,
}

impl ProbeCost {
    /// A rough cost when none was measured (this machine's order of magnitude).
    pub const ESTIMATE: ProbeCost = ProbeCost {
        emulated: CallCost { call_ns: 2_000, call_cpu_ns: 2_000, self_ns: 1_000, self_cpu_ns: 1_000 },
        stepped: CallCost { call_ns: 12_000, call_cpu_ns: 12_000, self_ns: 10_000, self_cpu_ns: 10_000 },
        injected: CallCost { call_ns: 30, call_cpu_ns: 30, self_ns: 15, self_cpu_ns: 15 },
    };

    /// What one uprobe hit on a line costs, on an instruction of `kind`: a
    /// call's entry probe, which is its cost less its return probe's (taken
    /// as half an emulated call's, the two probes of one costing alike).
    pub fn line_hit_ns(&self, kind: EntryKind) -> u64 {
        let return_probe = self.emulated.call_ns / 2;
        self.of(kind, false).call_ns.saturating_sub(return_probe).max(return_probe)
    }

    /// What a call costs: patched by the in-process engine (`injected`), or
    /// probed by uprobes on an entry of kind `entry`.
    pub fn of(&self, entry: EntryKind, injected: bool) -> &CallCost {
        match (injected, entry) {
            (true, _) => &self.injected,
            (false, EntryKind::Emulated) => &self.emulated,
            (false, EntryKind::Stepped) => &self.stepped,
        }
    }
}

/// What each function's uprobes cost the target per hit, for the governor:
/// a call's entry and return, and a hit of each line probe, which is one
/// probe of the two a call has.
#[derive(Clone, Debug, Default)]
pub struct UprobeCosts {
    /// Per function (0: not the governor's to judge).
    pub call_ns: Vec<u64>,
    /// Per line probe: its function and what a hit costs.
    pub line_ns: Vec<(u32, u64)>,
}

impl UprobeCosts {
    /// Per function, what its probes cost so far: `entries` calls (by
    /// function) and `line_hits` (by line probe).
    pub fn spent(&self, entries: &[u64], line_hits: &[u64]) -> Vec<u64> {
        let calls = |f: usize| entries.get(f).copied().unwrap_or(0);
        let mut spent: Vec<u64> = self.call_ns.iter().enumerate().map(|(f, &ns)| calls(f).saturating_mul(ns)).collect();
        for (&(function, ns), &hits) in self.line_ns.iter().zip(line_hits) {
            if let Some(total) = spent.get_mut(function as usize) {
                *total = total.saturating_add(hits.saturating_mul(ns));
            }
        }
        spent
    }
}

/// What to subtract per call of each function (entries of kind
/// `entries[f]`, patched when `injected[f]`), for the recording's metrics.
pub fn compensation(entries: &[EntryKind], injected: &[bool], metrics: &[Metric], cost: ProbeCost) -> Compensation {
    let values = |wall: u64, cpu: u64| -> Values {
        let mut v: Values = [0; MAX_METRICS];
        for (i, m) in metrics.iter().enumerate().take(MAX_METRICS) {
            v[i] = match m {
                Metric::Wall => wall,
                Metric::Cpu => cpu,
                _ => 0,
            };
        }
        v
    };
    let costs = || entries.iter().zip(injected).map(|(&entry, &injected)| cost.of(entry, injected));
    Compensation {
        call: costs().map(|c| values(c.call_ns, c.call_cpu_ns)).collect(),
        own: costs().map(|c| values(c.self_ns, c.self_cpu_ns)).collect(),
    }
}

/// What the instrumentation cost the target: `calls[f]` calls of each
/// function, the hits of each line probe (on an instruction of its kind),
/// `hits` probe hits in all.
pub fn overhead(
    entries: &[EntryKind],
    injected: &[bool],
    calls: &[u64],
    line_hits: &[(EntryKind, u64)],
    hits: u64,
    cost: Option<ProbeCost>,
    compensated: bool,
) -> Overhead {
    let Some(cost) = cost else { return Overhead { hits, ..Overhead::default() } };
    let of_calls =
        entries.iter().zip(injected).zip(calls).map(|((&entry, &injected), &n)| n.saturating_mul(cost.of(entry, injected).call_ns));
    let of_lines = line_hits.iter().map(|&(kind, n)| n.saturating_mul(cost.line_hit_ns(kind)));
    let estimated: u64 = of_calls.chain(of_lines).fold(0, u64::saturating_add);
    Overhead {
        per_hit_ns: estimated.checked_div(hits).unwrap_or(0),
        hits,
        estimated_ns: estimated,
        compensated,
        call_ns_emulated: cost.emulated.call_ns,
        call_ns_stepped: cost.stepped.call_ns,
        call_ns_injected: cost.injected.call_ns,
        call_cpu_ns: cost.stepped.call_cpu_ns,
        self_ns: cost.stepped.self_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_hit_costs_a_calls_entry_probe() {
        let cost = ProbeCost::ESTIMATE;
        // An emulated call is two probes alike; a stepped one steps its entry only.
        assert_eq!(cost.line_hit_ns(EntryKind::Emulated), 1_000);
        assert_eq!(cost.line_hit_ns(EntryKind::Stepped), 11_000);
        let calls = overhead(
            &[EntryKind::Stepped],
            &[false],
            &[10],
            &[(EntryKind::Stepped, 100), (EntryKind::Emulated, 1_000)],
            1_220,
            Some(cost),
            false,
        );
        assert_eq!(calls.estimated_ns, 10 * 12_000 + 100 * 11_000 + 1_000 * 1_000);
        assert_eq!(calls.per_hit_ns, calls.estimated_ns / 1_220);
    }
}

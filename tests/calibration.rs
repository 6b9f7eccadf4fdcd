//! The probe cost measured on a busy machine, as it is while tests run in
//! parallel or a build goes on beside a recording: the governor and the
//! compensation both rest on it. Alone in its test binary, since it keeps
//! a core busy.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Keeps the calling thread, or a process about to exec, on the first CPU.
fn on_first_cpu() -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity only read and write that local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What one call costs patched and under a uprobe the kernel emulates,
/// measured afresh by a recording kept on the first CPU.
fn call_costs(binary: &std::path::Path) -> [u64; 2] {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.profile");
    let mut command = proftap();
    command.args(["run", "--engine", "inject", "--recalibrate", "-f", "rare", "-o"]).arg(&file).arg("--").arg(binary).arg("1");
    // SAFETY: the hook makes one system call and allocates nothing.
    unsafe { command.pre_exec(on_first_cpu) };
    run_ok(&mut command);
    let overhead = &report_json(&file)["overhead"];
    ["call_ns_injected", "call_ns_emulated"].map(|cost| overhead[cost].as_u64().unwrap_or_else(|| panic!("{overhead}")))
}

#[test]
fn the_probe_cost_measured_on_a_busy_cpu_is_what_a_call_costs_on_an_idle_one() {
    require_probes();
    let binary = Build::c("hot.c", "-O2").build();
    let idle = call_costs(&binary);
    // Two clock reads and the trampolines: tens of nanoseconds, never
    // nothing (a governor told a call costs nothing never throttles).
    assert!((10..2_000).contains(&idle[0]), "{idle:?} ns a call");

    // Three threads spinning on the same CPU: the helper's loops are
    // interrupted for the scheduler's slices.
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                on_first_cpu().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let loaded: Vec<[u64; 2]> = (0..2).map(|_| call_costs(&binary)).collect();
    stop.store(true, Ordering::Relaxed);
    busy.into_iter().for_each(|t| t.join().unwrap());
    for costs in loaded {
        for (call_ns, idle) in costs.into_iter().zip(idle) {
            assert!((idle / 2..=idle * 2 + 20).contains(&call_ns), "{costs:?} ns a call on a busy CPU, {idle} on an idle one");
        }
    }
}

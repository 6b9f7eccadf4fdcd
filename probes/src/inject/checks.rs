//! What proftap checks of the memory it shares with a patched process. The
//! process can write anything there, by mistake or on purpose (a profiled
//! program is hostile input to a root service): ring positions, counters
//! and records are checked before anything is sized, indexed or counted
//! from them, and the first lie ends the recording with its reason.

use super::runtime;
use std::collections::HashSet;

/// Larger counts than this (over a trillion events) are lies.
pub const MOST_COUNT: u64 = 1 << 40;
/// Thread ids in the records that are not threads of the process when
/// first seen (a thread may end before its records are read) are believed
/// up to this many; more is a lie.
const MOST_UNCONFIRMED_TIDS: usize = 10_000;
/// A record's time may run this many cycles ahead of proftap's reading.
const TSC_SLACK: u64 = 1 << 32;

/// The checks of one patched process's records.
pub struct Checks {
    pid: i32,
    functions: u32,
    catch_id: u32,
    earliest_tsc: u64,
    pid_max: u32,
    tids: HashSet<u32>,
    unconfirmed: usize,
}

/// The time-stamp counter now.
pub fn tsc_now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    u64::MAX
}

impl Checks {
    /// Checks for process `pid`, patched for `functions` functions, whose
    /// handlers' catches carry `catch_id`.
    pub fn new(pid: i32, functions: usize, catch_id: u32) -> Self {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(1 << 22);
        Checks {
            pid,
            functions: u32::try_from(functions).unwrap_or(u32::MAX),
            catch_id,
            earliest_tsc: tsc_now().saturating_sub(TSC_SLACK),
            pid_max,
            tids: HashSet::new(),
            unconfirmed: 0,
        }
    }

    /// How many functions are patched.
    pub fn functions(&self) -> usize {
        self.functions as usize
    }

    /// A ring's positions: `head` written by the process, `tail` proftap's.
    pub fn positions(slot: u64, head: u64, tail: u64) -> Result<(), String> {
        match head.checked_sub(tail) {
            Some(held) if held <= runtime::RING => Ok(()),
            _ => Err(format!("the ring of thread slot {slot} says its writer is at record {head} and its reader at {tail}")),
        }
    }

    /// A counter the process keeps (records lost, calls not timed).
    pub fn count(what: &str, value: u64) -> Result<u64, String> {
        if value > MOST_COUNT { Err(format!("it reports {value} {what}")) } else { Ok(value) }
    }

    /// The records of one ring, written by thread `slot_tid` unless a
    /// record names its own thread.
    pub fn records(&mut self, bytes: &[u8], slot_tid: u32) -> Result<(), String> {
        let latest = tsc_now().saturating_add(TSC_SLACK);
        let mut last_tid = None;
        for record in bytes.chunks_exact(runtime::RECORD as usize) {
            let word = |i: usize| u64::from_ne_bytes(record[8 * i..8 * i + 8].try_into().unwrap_or_default());
            let (tsc, payload) = (word(0), word(1));
            let function = payload as u32;
            let known = match (payload >> runtime::KIND_SHIFT) as u8 as u32 {
                runtime::ENTRY | runtime::EXIT => function < self.functions,
                runtime::CATCH => function == self.catch_id,
                other => return Err(format!("a record of an unknown kind ({other})")),
            };
            if !known {
                return Err(format!("a record of function {function}, which was not patched"));
            }
            if tsc < self.earliest_tsc || tsc > latest {
                return Err(format!("a record dated {tsc} cycles, outside the recording"));
            }
            let tid = match (payload >> runtime::TID_SHIFT) as u32 {
                0 => slot_tid,
                tid => tid,
            };
            if last_tid != Some(tid) {
                self.thread(tid)?;
                last_tid = Some(tid);
            }
        }
        Ok(())
    }

    fn thread(&mut self, tid: u32) -> Result<(), String> {
        if tid == 0 || tid > self.pid_max {
            return Err(format!("a record of thread {tid}, which cannot exist"));
        }
        if self.tids.contains(&tid) {
            return Ok(());
        }
        if !std::path::Path::new(&format!("/proc/{}/task/{tid}", self.pid)).exists() {
            self.unconfirmed += 1;
            if self.unconfirmed > MOST_UNCONFIRMED_TIDS {
                return Err(format!("records of more than {MOST_UNCONFIRMED_TIDS} threads that are not the process's"));
            }
        }
        self.tids.insert(tid);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tsc: u64, kind: u32, function: u32, tid: u32) -> Vec<u8> {
        let payload = u64::from(function) | (u64::from(kind) << runtime::KIND_SHIFT) | (u64::from(tid) << runtime::TID_SHIFT);
        [tsc, payload, 0, 0].iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn records_that_lie_are_named() {
        let me = std::process::id() as i32;
        let mut checks = Checks::new(me, 3, 7);
        let now = tsc_now();
        let good: Vec<u8> = [record(now, runtime::ENTRY, 2, 0), record(now, runtime::CATCH, 7, me as u32)].concat();
        assert_eq!(checks.records(&good, me as u32), Ok(()));
        let err = |bytes: Vec<u8>, checks: &mut Checks| checks.records(&bytes, me as u32).expect_err("a lie");
        assert!(err(record(now, runtime::ENTRY, 3, 0), &mut checks).contains("not patched"));
        assert!(err(record(now, 9, 0, 0), &mut checks).contains("unknown kind"));
        assert!(err(record(u64::MAX, runtime::EXIT, 0, 0), &mut checks).contains("outside the recording"));
        assert!(err(record(now, runtime::EXIT, 0, u32::MAX >> 8), &mut checks).contains("cannot exist"));
        assert!(Checks::positions(0, 5, 6).is_err() && Checks::positions(0, runtime::RING + 1, 0).is_err());
        assert_eq!(Checks::positions(0, runtime::RING + 9, 9), Ok(()));
        assert!(Checks::count("lost records", u64::MAX - 67).is_err());
    }

    #[test]
    fn a_flood_of_made_up_threads_is_a_lie() {
        let mut checks = Checks::new(std::process::id() as i32, 1, 0);
        let now = tsc_now();
        // Thread ids this process does not have (past pid_max is refused at
        // once, so ids from its top down, skipping this process's threads).
        let ours = |tid: u32| std::path::Path::new(&format!("/proc/self/task/{tid}")).exists();
        let made_up: Vec<u8> = (1..=checks.pid_max)
            .rev()
            .filter(|&tid| !ours(tid))
            .take(MOST_UNCONFIRMED_TIDS + 1)
            .flat_map(|tid| record(now, runtime::ENTRY, 0, tid))
            .collect();
        assert!(checks.records(&made_up, 1).expect_err("a lie").contains("not the process's"));
    }
}

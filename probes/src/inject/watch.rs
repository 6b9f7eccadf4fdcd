//! Watching a patched process while it runs: a thread of its own reads the
//! calls by function every few milliseconds, asks a judge (the overhead
//! governor) which functions to unpatch, and unpatches them at once.
//! Nothing is lost while it waits: the runtime adds everything up in place.

use super::patched::Patched;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Decides, from the calls counted so far by function, which functions to
/// unpatch now.
pub type Judge = Box<dyn FnMut(&[u64]) -> Vec<usize> + Send>;

/// Functions the judge had unpatched while the process ran.
#[derive(Debug)]
pub struct Unpatched {
    /// When (CLOCK_MONOTONIC).
    pub time: u64,
    /// The functions, with the calls counted until then.
    pub functions: Vec<(usize, u64)>,
    /// Why their code could not be restored, if it could not.
    pub error: Option<String>,
}

/// How often the calls are read.
const PERIOD: Duration = Duration::from_millis(5);
/// Looks in a row at which unpatching may fail before the failure is told.
const TRIES: u32 = 40;

/// A patched process watched by a thread of its own.
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Patched>,
    unpatched: std::sync::mpsc::Receiver<Unpatched>,
}

impl Watch {
    /// Starts watching `patched` with `judge`, if any.
    pub fn spawn(mut patched: Patched, mut judge: Option<Judge>) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (tell, unpatched) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let functions = patched.functions();
            let mut calls = vec![0u64; functions];
            // Judged over budget, not yet unpatched, and how often tried.
            let mut pending: Vec<usize> = Vec::new();
            let mut tries = 0;
            while !flag.load(Ordering::Relaxed) {
                if let (Some(judge), Some(view)) = (judge.as_mut(), patched.view()) {
                    calls.iter_mut().for_each(|c| *c = 0);
                    view.calls(&mut calls);
                    pending.extend(judge(&calls));
                    if !pending.is_empty() {
                        let outcome = patched.unpatch(&pending);
                        tries += 1;
                        // Holding the process can fail for a moment (another
                        // holder letting go): tried again at the next look.
                        if outcome.is_ok() || tries >= TRIES {
                            let error = outcome.err().map(|e| e.to_string());
                            let functions = pending.iter().map(|&f| (f, calls.get(f).copied().unwrap_or(0))).collect();
                            let _ = tell.send(Unpatched { time: super::clock::monotonic_ns(), functions, error });
                            pending.clear();
                            tries = 0;
                        }
                    }
                }
                std::thread::sleep(PERIOD);
            }
            patched
        });
        Watch { stop, thread, unpatched }
    }

    /// Functions the judge had unpatched since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.unpatched.try_iter().collect()
    }

    /// Stops watching; gives the patched process back.
    pub fn finish(self) -> Patched {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(patched) => patched,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

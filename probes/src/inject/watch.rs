//! Watching a patched process while it runs: a thread of its own reads the
//! calls by function every few milliseconds, asks a judge (the overhead
//! governor) which functions to unpatch, and unpatches them at once.
//! Nothing is lost while it waits: the runtime adds everything up in place.

use super::patched::{Patched, SteppedDown};
use super::reading::{MOST_CONTEXT_BYTES, ThreadTotals, TotalsView, TraceCursor};
use super::totals::Traced;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// For `n` functions it is given `2n` counts: function `f`'s timed calls
/// at `f`, and at `n + f` its calls only counted since its probes were
/// taken out; and whether those counts go without `lock` (the process has
/// had one thread so far, see [`TotalsView::counts_alone`]). It answers
/// `f` to take its probes out (its calls only counted from then on), `n +
/// f` to stop counting them too.
pub type Decide = Box<dyn FnMut(&[u64], bool) -> Vec<usize> + Send>;

/// Decides, from the calls so far by function, which functions to take a
/// step down now.
pub struct Judge {
    /// Which functions to step down, given their calls (see [`Decide`]).
    pub decide: Decide,
    /// Looks are at least this many times their own duration apart (at
    /// least [`LOOKS_APART`]): reading thousands of functions' calls is a
    /// cost of the recording too, taken from a machine whose CPUs the
    /// target may all use.
    pub looks_apart: u32,
}

/// Functions the judge had unpatched while the process ran.
#[derive(Debug)]
pub struct Unpatched {
    /// When (CLOCK_MONOTONIC).
    pub time: u64,
    /// The functions whose probes were taken out, with their calls timed until then.
    pub functions: Vec<(usize, u64)>,
    /// The functions no longer counted either, with their calls counted until then.
    pub uncounted: Vec<(usize, u64)>,
    /// Why their code could not be restored, if it could not.
    pub error: Option<String>,
    /// Forked children that could not be held as counting stopped, found
    /// since the last told, with the functions still counted there (see
    /// [`Patched::counting_goes_on`]); told apart from the change itself.
    pub counting_goes_on: Vec<(i32, usize)>,
}

/// How often the calls are read: a function that turns hot past what the
/// governor allows costs the target until the next look (at 5 ms,
/// SQLite's phases of new hot functions cost it a tenth of its time in
/// probes, where the governor allows a twentieth).
const PERIOD: Duration = Duration::from_millis(1);
/// Looks are at least this many times their own duration apart (more
/// with a judge: see [`Judge::looks_apart`]): reading the calls of
/// thousands of threads' blocks takes time, and the watch shares the
/// machine with the target. Unpatching (a millisecond to four,
/// holding the target's threads) counts once, not four times: spaced by
/// four, ripgrep's hot functions stayed patched 10 to 30 ms more after each
/// round; not at all, rounds in a row could hold the target most of the time.
const LOOKS_APART: u32 = 4;
/// The longest that looks spaced by their duration may be apart: a
/// function turning hot past what the governor allows costs the target
/// until the next look.
const MOST_PERIOD: Duration = Duration::from_millis(50);
/// The shortest time between two looks, when a thread asks for a block.
const SOONEST: Duration = Duration::from_millis(1);
/// Looks in a row at which unpatching may fail before the failure is told.
const TRIES: u32 = 40;

/// The CPU time the calling thread has used: what a look costs the
/// machine, however long the scheduler kept the watch waiting during it
/// (on a busy machine, a look's wall time spaced the next ones by seconds).
fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(Duration::ZERO, Duration::from)
}

/// Takes the probes of the functions among `pending` below `functions`
/// out, and stops counting the calls of those `functions` above (see
/// [`Judge`]); then takes out of `pending` what is done, and what is
/// given up on once `give_up`: each with why, if it failed.
fn step_down(patched: &mut Patched, pending: &mut Vec<usize>, functions: usize, give_up: bool) -> Vec<(Vec<usize>, Option<String>)> {
    let (unpatch, uncount): (Vec<usize>, Vec<usize>) = pending.iter().partition(|&&f| f < functions);
    let uncount: Vec<usize> = uncount.into_iter().map(|f| f - functions).collect();
    sort_out(pending, functions, patched.step_down(&unpatch, &uncount), give_up)
}

/// Every process's calls so far into `calls`: at `f` those of function
/// `f` timed (with the threads' that ended), at `functions + f` those only
/// counted since its probes were taken out.
fn read_calls(calls: &mut [u64], functions: usize, view: &TotalsView, retired: &Retired, patched: &mut Patched) {
    calls.iter_mut().for_each(|c| *c = 0);
    let (timed, counted) = calls.split_at_mut(functions);
    view.calls(timed);
    timed.iter_mut().zip(&retired.calls).for_each(|(total, &n)| *total = total.saturating_add(n));
    patched.add_children_calls(timed);
    patched.add_counted_calls(counted);
}

/// Of `pending` (functions below `functions` to unpatch, those above to
/// uncount), what `outcome` did, taken out of it: a half that took effect
/// is told now, whatever the other did; a failed one stays to be asked
/// again, until `give_up`, then is told with its error.
fn sort_out(
    pending: &mut Vec<usize>,
    functions: usize,
    outcome: Result<SteppedDown, super::remote::RemoteError>,
    give_up: bool,
) -> Vec<(Vec<usize>, Option<String>)> {
    let (done, error): (Vec<usize>, Option<String>) = match outcome {
        Ok(SteppedDown { unpatched, uncounted }) => {
            let half = |uncount: bool| pending.iter().copied().filter(move |&f| (f >= functions) == uncount);
            let done = [(unpatched.is_ok(), false), (uncounted.is_ok(), true)]
                .into_iter()
                .filter(|(ok, _)| *ok)
                .flat_map(|(_, u)| half(u))
                .collect();
            (done, unpatched.err().or(uncounted.err()).map(|e| e.to_string()))
        }
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut told = Vec::new();
    if !done.is_empty() {
        pending.retain(|f| !done.contains(f));
        told.push((done, None));
    }
    if let Some(error) = error.filter(|_| give_up && !pending.is_empty()) {
        told.push((std::mem::take(pending), Some(error)));
    }
    told
}

/// A patched process watched by a thread of its own.
pub struct Watch {
    stop: Arc<AtomicBool>,
    /// What the watch waits on between looks (up to [`MOST_PERIOD`]),
    /// ended at the finish: the recording's end need not wait for it.
    waiting_on: Option<TotalsView>,
    thread: std::thread::JoinHandle<Watched>,
    unpatched: std::sync::mpsc::Receiver<Unpatched>,
}

/// What watching a patched process leaves.
pub struct Watched {
    /// The process, still patched.
    pub patched: Patched,
    /// Threads that ended while it ran.
    pub retired: Retired,
    /// The calls its threads finished, when they were traced.
    pub trace: Option<CallTrace>,
}

/// Threads that ended while the process ran, read from their blocks before
/// the blocks went to other threads.
#[derive(Debug)]
pub struct Retired {
    /// Their totals.
    pub threads: Vec<ThreadTotals>,
    /// Their calls by function, for the governor: a block retired leaves
    /// the process's running totals, not the run's.
    calls: Vec<u64>,
    /// Bytes of their contexts still to copy, of [`MOST_CONTEXT_BYTES`]
    /// over the whole recording: a target making up threads gets no more.
    budget: u64,
    /// Why their blocks could not be read, if they could not (the target
    /// wrote what the runtime never writes): none was retired after.
    pub error: Option<String>,
}

impl Default for Retired {
    fn default() -> Self {
        Retired { threads: Vec::new(), calls: Vec::new(), budget: MOST_CONTEXT_BYTES, error: None }
    }
}

impl Retired {
    /// Retires the blocks of `patched`'s threads that ended, once most are
    /// taken; what their trace rings hold must be in `trace` already.
    fn look(&mut self, patched: &Patched, trace: &mut TraceCursor) {
        let Some(view) = patched.view().filter(|v| v.blocks_mostly_taken()) else { return };
        if self.error.is_some() {
            return;
        }
        let pid = patched.pid();
        // One listing of the threads rather than a look per block: a
        // program with a thousand threads has a thousand blocks to judge
        // every few milliseconds. A thread made since the listing is not
        // in it: one not listed is looked for again before its block goes.
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        let listed: std::collections::HashSet<u32> = tasks.filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok()).collect();
        let alive = |tid: u32| listed.contains(&tid) || std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
        match view.retire_ended(alive, &mut self.budget, trace) {
            Ok(threads) => {
                for thread in &threads {
                    self.calls.resize(self.calls.len().max(thread.calls.len()), 0);
                    self.calls.iter_mut().zip(&thread.calls).for_each(|(total, &n)| *total = total.saturating_add(n));
                }
                self.threads.extend(threads);
            }
            Err(error) => self.error = Some(error),
        }
    }
}

/// The calls the threads of a patched process finished, one by one, as
/// read from their trace rings, up to a limit.
#[derive(Debug, Default)]
pub struct CallTrace {
    /// By thread: its calls in the order they returned.
    pub threads: HashMap<u32, Vec<Traced>>,
    /// Calls not kept because the limit was reached.
    pub cut: u64,
    /// Calls not kept because the ring overwrote them before they were
    /// read, or they were not what the runtime writes.
    pub missed: u64,
    /// Calls it may keep.
    limit: u64,
    kept: u64,
    cursor: TraceCursor,
}

impl CallTrace {
    /// A trace that keeps at most `limit` calls.
    pub fn new(limit: u64) -> Self {
        CallTrace { limit, ..CallTrace::default() }
    }

    /// Reads the calls finished since the last reading.
    pub fn read(&mut self, view: &TotalsView) {
        let CallTrace { threads, cut, missed, limit, kept, cursor } = self;
        let unread = view.drain_trace(cursor, &mut |tid, calls| {
            let room = (*limit - *kept).min(calls.len() as u64) as usize;
            threads.entry(tid).or_default().extend_from_slice(&calls[..room]);
            *kept += room as u64;
            *cut = cut.saturating_add((calls.len() - room) as u64);
        });
        *missed = missed.saturating_add(unread);
    }
}

impl Watch {
    /// Starts watching `patched` with `judge`, if any; `trace` keeps the
    /// calls its threads finish, when they are traced.
    pub fn spawn(mut patched: Patched, mut judge: Option<Judge>, mut trace: Option<CallTrace>) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (tell, unpatched) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let waiting_on = patched.view();
        let thread = std::thread::spawn(move || {
            let functions = patched.functions();
            let mut calls = vec![0u64; 2 * functions];
            // Judged over budget, not yet unpatched, and how often tried.
            let mut pending: Vec<usize> = Vec::new();
            let mut tries = 0;
            let mut retired = Retired::default();
            let mut cursor = TraceCursor::default();
            let mut answered = 0;
            let mut counting_goes_on_told = 0;
            let view = patched.view();
            let looks_apart = judge.as_ref().map_or(LOOKS_APART, |j| j.looks_apart.max(LOOKS_APART));
            while !flag.load(Ordering::Relaxed) {
                let looked = std::time::Instant::now();
                let looked_cpu = thread_cpu_time();
                // The CPU time looking took, and unpatching after it (wall time,
                // holding the target): over-budget functions cost until the next look.
                let mut looking = None;
                let mut unpatching = Duration::ZERO;
                let wanted = view.as_ref().map_or(0, TotalsView::blocks_wanted);
                if let (Some(trace), Some(view)) = (trace.as_mut(), &view) {
                    trace.read(view);
                }
                retired.look(&patched, trace.as_mut().map_or(&mut cursor, |t| &mut t.cursor));
                // The process's one thread waits, as its first thread or
                // process starts, for the counts the runtime could not make
                // atomic: first, since it wakes this through the same word.
                // Where it gave up waiting, they are locked still, late.
                if let Some(view) = &view {
                    match view.lock_request() {
                        super::totals::LOCK_ASKED => {
                            if let Some(locked) = patched.lock_counts() {
                                view.answer_lock_request(locked);
                            }
                        }
                        super::totals::LOCK_LATE => {
                            let _ = patched.lock_counts();
                        }
                        _ => {}
                    }
                }
                if let Some(view) = view.as_ref().filter(|_| wanted != answered) {
                    view.answer_block_requests();
                    answered = wanted;
                }
                if let (Some(judge), Some(view)) = (judge.as_mut(), &view) {
                    read_calls(&mut calls, functions, view, &retired, &mut patched);
                    pending.extend((judge.decide)(&calls, view.counts_alone()));
                    if !pending.is_empty() {
                        looking = Some(thread_cpu_time().saturating_sub(looked_cpu));
                        let unpatch_started = std::time::Instant::now();
                        tries += 1;
                        // Holding the process can fail for a moment (another
                        // holder letting go): tried again at the next look.
                        let told = step_down(&mut patched, &mut pending, functions, tries >= TRIES);
                        unpatching = unpatch_started.elapsed();
                        // The calls as the change left them, which the profile's counts go on from.
                        if !told.is_empty() {
                            read_calls(&mut calls, functions, view, &retired, &mut patched);
                        }
                        let with_calls = |f: usize| (f % functions, calls.get(f).copied().unwrap_or(0));
                        for (changed, error) in told {
                            let (unpatched, uncounted): (Vec<usize>, Vec<usize>) = changed.into_iter().partition(|&f| f < functions);
                            let time = super::clock::monotonic_ns();
                            let functions = unpatched.into_iter().map(with_calls).collect();
                            let uncounted = uncounted.into_iter().map(with_calls).collect();
                            let _ = tell.send(Unpatched { time, functions, uncounted, error, counting_goes_on: Vec::new() });
                        }
                        if pending.is_empty() {
                            tries = 0;
                        }
                    }
                    // Children that could not be held as counting stopped, in
                    // them or (at their first look) since.
                    if patched.counting_goes_on().len() > counting_goes_on_told {
                        let counting_goes_on = patched.counting_goes_on()[counting_goes_on_told..].to_vec();
                        counting_goes_on_told += counting_goes_on.len();
                        let time = super::clock::monotonic_ns();
                        let _ = tell.send(Unpatched { time, functions: Vec::new(), uncounted: Vec::new(), error: None, counting_goes_on });
                    }
                }
                // A thread that finds no block wakes this at once; the
                // word is the target's to write, so however often it
                // changes, looks are at least SOONEST apart.
                let looking = looking.unwrap_or_else(|| thread_cpu_time().saturating_sub(looked_cpu));
                let period = PERIOD.max((looking * looks_apart).min(MOST_PERIOD)).max(unpatching);
                match &view {
                    Some(view) => view.wait_for_block_request(wanted, period),
                    None => std::thread::park_timeout(period),
                }
                std::thread::sleep(SOONEST.saturating_sub(looked.elapsed()));
            }
            Watched { patched, retired, trace }
        });
        Watch { stop, waiting_on, thread, unpatched }
    }

    /// What the judge had taken out since the last call.
    pub fn unpatched(&self) -> Vec<Unpatched> {
        self.unpatched.try_iter().collect()
    }

    /// Stops watching; gives the patched process back, with the threads
    /// whose blocks were retired and the trace.
    pub fn finish(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        if let Some(view) = &self.waiting_on {
            // A wake between the watch's look at the flag and its wait
            // would be lost: woken until it is seen to end.
            while !self.thread.is_finished() {
                view.end_wait_for_block_request();
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        match self.thread.join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::remote::RemoteError;

    fn held_elsewhere() -> RemoteError {
        RemoteError::Unsupported("held elsewhere".into())
    }

    /// Of a step down that took its probes out but could not stop a
    /// counting, the probes' half is told at once, and the counting's
    /// asked again, then told with its error once given up on; a process
    /// that could not be held keeps both asked.
    #[test]
    fn a_half_that_took_effect_is_told_and_a_failed_one_asked_again_until_given_up() {
        // Ten functions: 3's probes to take out, 7's counting to stop (17).
        let mut pending = vec![3, 17];
        let half_done = || Ok(SteppedDown { unpatched: Ok(()), uncounted: Err(held_elsewhere()) });
        assert_eq!(sort_out(&mut pending, 10, half_done(), false), vec![(vec![3], None)]);
        assert_eq!(pending, vec![17]);
        assert!(sort_out(&mut pending, 10, half_done(), false).is_empty());
        let told = sort_out(&mut pending, 10, half_done(), true);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].0, vec![17]);
        assert!(told[0].1.as_deref().is_some_and(|e| e.contains("held elsewhere")), "{told:?}");
        assert!(pending.is_empty());
        let mut pending = vec![3, 17];
        assert!(sort_out(&mut pending, 10, Err(held_elsewhere()), false).is_empty());
        assert_eq!(pending, vec![3, 17]);
        let both = Ok(SteppedDown { unpatched: Ok(()), uncounted: Ok(()) });
        assert_eq!(sort_out(&mut pending, 10, both, false), vec![(vec![3, 17], None)]);
        assert!(pending.is_empty());
    }
}

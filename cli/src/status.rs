//! What proftap shows on a terminal while it works: a spinner for slow
//! steps (reading a large binary's symbols, placing many probes) and, while
//! recording, a live status line. Nothing when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use proftap_record::recorder::Progress;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Steps quicker than this show nothing.
const SHOW_AFTER: Duration = Duration::from_millis(300);

/// Whether output on this stream may be coloured: a terminal, and `NO_COLOR`
/// unset (<https://no-color.org>).
pub fn colour(stream: &impl IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `text` in an ANSI colour (`31` red, `32` green) when `on`.
pub fn paint(text: &str, code: u8, on: bool) -> String {
    if on { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
}

fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").unwrap_or_else(|_| ProgressStyle::default_spinner()));
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A step that may take a while: a spinner appears if it is still going
/// after a moment, and goes when the step (this value) is dropped.
pub struct Activity {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Activity {
    /// Starts showing `message` (on a terminal, after a moment).
    pub fn start(message: impl Into<String>) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return Activity { done, thread: None };
        }
        let message = message.into();
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let since = Instant::now();
            let mut bar = None;
            while !flag.load(Ordering::Relaxed) {
                if bar.is_none() && since.elapsed() >= SHOW_AFTER {
                    bar = Some(spinner(message.clone()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
        });
        Activity { done, thread: Some(thread) }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// While a recording runs: "placing probes" until they are live, then, if
/// `live`, hits, hits per second and losses; cleared at the end.
pub struct RecordingStatus {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RecordingStatus {
    /// Follows `progress`; `functions` is how many functions get probes.
    pub fn start(progress: Arc<Progress>, functions: usize, live: bool) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return RecordingStatus { done, thread: None };
        }
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let since = Instant::now();
            let mut bar: Option<ProgressBar> = None;
            let mut last = (Instant::now(), 0u64);
            let mut rate = 0.0;
            while !flag.load(Ordering::Relaxed) {
                if !progress.started.load(Ordering::Acquire) {
                    if bar.is_none() && since.elapsed() >= SHOW_AFTER {
                        bar = Some(spinner(format!("placing probes on {functions} functions")));
                    }
                } else if !live {
                    if let Some(b) = bar.take() {
                        b.finish_and_clear();
                    }
                } else {
                    let b = bar.get_or_insert_with(|| spinner(String::new()));
                    let hits = progress.hits.load(Ordering::Relaxed);
                    if last.0.elapsed() >= Duration::from_millis(500) {
                        rate = (hits - last.1.min(hits)) as f64 / last.0.elapsed().as_secs_f64();
                        last = (Instant::now(), hits);
                    }
                    b.set_message(format!(
                        "recording pid {}: {} probe hits, {:.0}/s, {} lost",
                        progress.pid.load(Ordering::Relaxed),
                        hits,
                        rate,
                        progress.lost.load(Ordering::Relaxed)
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
        });
        RecordingStatus { done, thread: Some(thread) }
    }
}

impl Drop for RecordingStatus {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

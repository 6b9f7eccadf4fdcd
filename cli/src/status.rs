//! What proftap shows while it records: the recorder's warnings and
//! probe-set changes on stderr, and on a terminal a spinner for slow steps
//! (reading a large binary's symbols, downloading debug info, placing many
//! probes) and, while recording, a live status line. No spinner when stderr
//! is not a terminal.

use crate::wording;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use proftap_record::observer::{Download, Observer, RecordEvent, Step};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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

/// What the status line shows.
struct Shown {
    /// A slow step, and since when.
    step: Option<(String, Instant)>,
    /// A download under way, shown over the step that needed it.
    download: Option<Downloading>,
    /// Recording: the pid, hits and losses so far.
    live: Option<(i32, u64, u64)>,
    bar: Option<ProgressBar>,
    /// Hits per second, from the hits at the last measure.
    rate: (Instant, u64, f64),
    /// The governor's changes of the probes told, and those past them.
    probe_changes: (usize, wording::MoreProbeChanges),
}

impl Shown {
    /// Prints a line above the status line.
    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    /// Brings the status line up to date (called every few tens of ms).
    fn refresh(&mut self, live_line: bool) {
        if let Some(download) = &self.download {
            self.bar.get_or_insert_with(|| spinner(String::new())).set_message(download.describe());
            return;
        }
        if let Some((message, since)) = &self.step {
            match &self.bar {
                None if since.elapsed() >= SHOW_AFTER => self.bar = Some(spinner(message.clone())),
                // Back from a download.
                Some(bar) if bar.message() != *message => bar.set_message(message.clone()),
                _ => {}
            }
            return;
        }
        let Some((pid, hits, lost)) = self.live.filter(|_| live_line) else { return };
        if self.rate.0.elapsed() >= Duration::from_millis(500) {
            self.rate = (Instant::now(), hits, (hits - self.rate.1.min(hits)) as f64 / self.rate.0.elapsed().as_secs_f64());
        }
        let bar = self.bar.get_or_insert_with(|| spinner(String::new()));
        bar.set_message(format!("recording pid {pid}: {hits} probe hits, {:.0}/s, {lost} lost", self.rate.2));
    }
}

/// A download of debug info, as far as it got.
struct Downloading {
    build_id: String,
    server: String,
    size: Option<u64>,
    received: u64,
}

impl Downloading {
    fn describe(&self) -> String {
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        let got = match self.size {
            Some(size) => format!("{:.1} of {:.1} MiB", mib(self.received), mib(size)),
            None => format!("{:.1} MiB", mib(self.received)),
        };
        format!("downloading the debug info of build-id {} from {}: {got}", self.build_id, self.server)
    }
}

/// Renders a recording's events on stderr: warnings and probe-set changes
/// as lines, `attach`'s announcement, and on a terminal the status line.
pub struct Terminal {
    shown: Arc<Mutex<Shown>>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Terminal {
    /// Starts rendering; `live` adds the live line of counters while recording.
    pub fn start(live: bool) -> Self {
        let shown = Arc::new(Mutex::new(Shown {
            step: None,
            download: None,
            live: None,
            bar: None,
            rate: (Instant::now(), 0, 0.0),
            probe_changes: (0, wording::MoreProbeChanges::default()),
        }));
        let done = Arc::new(AtomicBool::new(false));
        let thread = std::io::stderr().is_terminal().then(|| {
            let (shown, done) = (shown.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Ok(mut shown) = shown.lock() {
                        shown.refresh(live);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        });
        Terminal { shown, done, thread }
    }
}

impl Observer for Terminal {
    fn event(&self, event: RecordEvent) {
        let Ok(mut shown) = self.shown.lock() else { return };
        match event {
            RecordEvent::Step(step) => {
                shown.clear();
                shown.step = Some((describe(&step), Instant::now()));
            }
            RecordEvent::StepEnded => {
                shown.clear();
                shown.step = None;
            }
            RecordEvent::Warning(warning) => shown.say(&format!("proftap: warning: {}", wording::warning(&warning))),
            RecordEvent::Started { pid, functions, attached } => {
                shown.clear();
                shown.step = None;
                shown.live = Some((pid, 0, 0));
                // Tells the user (and scripts waiting for it) that the probes are live.
                if attached {
                    shown.say(&format!(
                        "proftap: attached to process {pid}: {} probed; stop with Ctrl-C",
                        wording::counted(functions, "function", "functions")
                    ));
                }
            }
            RecordEvent::Counters { hits, lost } => {
                if let Some(live) = shown.live.as_mut() {
                    (live.1, live.2) = (hits, lost);
                }
            }
            RecordEvent::ProbesChanged(change) => match wording::probe_change(&change) {
                // Dozens in a real program's run, in the program's terminal: told at the end.
                Some(change) if shown.probe_changes.0 >= wording::PROBE_CHANGES_TOLD => shown.probe_changes.1.add(change),
                told => {
                    shown.probe_changes.0 += usize::from(told.is_some());
                    shown.say(&format!("proftap: {}", wording::note(&change)));
                }
            },
            RecordEvent::Download(Download::Started { build_id, server, size }) => {
                shown.download = Some(Downloading { build_id, server, size, received: 0 });
            }
            RecordEvent::Download(Download::Received { bytes }) => {
                if let Some(download) = shown.download.as_mut() {
                    download.received = bytes;
                }
            }
            RecordEvent::Download(Download::Ended) => {
                shown.download = None;
                if shown.step.is_none() {
                    shown.clear();
                }
            }
            RecordEvent::Calls { .. } => {}
        }
    }
}

fn describe(step: &Step) -> String {
    match step {
        Step::ReadingSymbols { module } => format!("reading the symbols of {module}"),
        Step::MeasuringProbeCost => "measuring what a probe costs on this machine".into(),
        Step::PlacingProbes { functions } => format!("placing probes on {functions} functions"),
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Ok(mut shown) = self.shown.lock() {
            shown.clear();
            if let Some(more) = shown.probe_changes.1.sentence() {
                shown.say(&format!("proftap: {more}"));
            }
        }
    }
}

//! `proftap top PID`: a running process's most called functions, live, as
//! `perf top` shows its hottest symbols: exact calls and calls per second
//! from the engine's counters, redrawn every second, until Ctrl-C,
//! `--duration` or the process's exit; the original code comes back after.

use crate::calibration::OwnHelper;
use crate::report::text::group_digits;
use crate::status::Terminal;
use anyhow::Result;
use proftap_profile::FunctionCalls;
use proftap_record::observer::{Observer, RecordEvent};
use proftap_record::request::{EngineChoice, Governor, RecordRequest, RecordTarget, Sampling};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arguments of `proftap top`.
#[derive(clap::Args)]
pub struct Args {
    /// The process to watch.
    #[arg(required_unless_present = "pid_option", conflicts_with = "pid_option", value_name = "PID")]
    pid: Option<i32>,
    /// The process to watch (as `perf top -p`).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pid_option: Option<i32>,
    /// Functions to count (globs, as `run -f`); default: every function of
    /// the executable with debug info.
    #[arg(short = 'f', long = "functions", value_name = "PAT")]
    functions: Vec<String>,
    /// Stop after this long (`30s`, `2m`); otherwise at Ctrl-C or the process's exit.
    #[arg(long, value_name = "D", value_parser = super::record::parse_duration)]
    duration: Option<Duration>,
    /// Rows shown (default: as many as the terminal has room for, else 20).
    #[arg(short = 'n', long = "top", value_name = "N")]
    top: Option<usize>,
    /// Also write the profile of the whole watch to FILE.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let pid = args.pid.or(args.pid_option).unwrap_or_default();
    let mut request = RecordRequest::new(RecordTarget::Attach { pid, duration: args.duration, auto_instrument: None });
    request.functions = args.functions.clone();
    request.debuginfod = super::symbols::debuginfod_from_env();
    // Exact counts for every function while watched: no governor, no sampler.
    (request.engine, request.sampling, request.governor, request.live_calls) = (EngineChoice::Auto, Sampling::Off, Governor::Off, true);
    if let Some(output) = &args.output {
        proftap_profile::check_writable(output)?;
    }
    let terminal = Arc::new(Terminal::start(false));
    let screen = Arc::new(Screen { terminal: terminal.clone(), view: Mutex::new(View::new(args.top)) });
    let prepared = proftap_record::prepare::prepare(&request, terminal.as_ref(), &OwnHelper)?;
    let recorded = prepared.record(super::record::control()?, screen.clone())?;
    if let Some(output) = &args.output {
        super::record::finish(&recorded.profile, output)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Hears the recording: calls by function go to the view, the rest to the
/// status terminal (warnings, the moment it attached).
struct Screen {
    terminal: Arc<Terminal>,
    view: Mutex<View>,
}

impl Observer for Screen {
    fn event(&self, event: RecordEvent) {
        match event {
            RecordEvent::Calls { elapsed_ns, functions } => {
                if let Ok(mut view) = self.view.lock() {
                    let text = view.update(elapsed_ns, functions);
                    let mut out = std::io::stdout().lock();
                    // A reader gone away is no reason to stop restoring the process.
                    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
                }
            }
            other => self.terminal.event(other),
        }
    }
}

/// The table, with the counts of the previous refresh for the rates.
struct View {
    rows: Option<usize>,
    previous: HashMap<String, u64>,
    previous_ns: u64,
}

impl View {
    fn new(rows: Option<usize>) -> Self {
        View { rows, previous: HashMap::new(), previous_ns: 0 }
    }

    /// The screen for these counts: on a terminal, drawn over the last one.
    fn update(&mut self, elapsed_ns: u64, functions: Vec<FunctionCalls>) -> String {
        let seconds = elapsed_ns.saturating_sub(self.previous_ns) as f64 / 1e9;
        let mut rows: Vec<(f64, &FunctionCalls)> = functions
            .iter()
            .filter(|f| f.calls > 0)
            .map(|f| {
                let before = self.previous.get(&f.name).copied().unwrap_or(0);
                (f.calls.saturating_sub(before) as f64 / seconds.max(1e-3), f)
            })
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.calls.cmp(&a.1.calls)));
        let terminal = std::io::stdout().is_terminal();
        let height = terminal_size::terminal_size().map_or(24, |(_, h)| usize::from(h.0));
        let shown = self.rows.unwrap_or(if terminal { height.saturating_sub(4).max(1) } else { 20 });
        let width = crate::output::terminal_width().unwrap_or(usize::MAX);
        let total: u64 = functions.iter().map(|f| f.calls).fold(0, u64::saturating_add);
        let mut out = String::new();
        if terminal {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&format!(
            "proftap top: {} calls in {} functions, {:.0} s (Ctrl-C ends and restores the process)\n",
            group_digits(total),
            rows.len(),
            elapsed_ns as f64 / 1e9
        ));
        out.push_str(&format!("{:>14} {:>16}  function\n", "calls/s", "calls"));
        for (rate, f) in rows.iter().take(shown) {
            let name = crate::output::shorten_middle(&f.name, width.saturating_sub(33).max(16));
            out.push_str(&format!("{:>14} {:>16}  {name}\n", group_digits(rate.round() as u64), group_digits(f.calls)));
        }
        if !terminal {
            out.push('\n');
        }
        self.previous = functions.into_iter().map(|f| (f.name, f.calls)).collect();
        self.previous_ns = elapsed_ns;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_calls_since_the_last_refresh() {
        let calls = |a: u64, b: u64| vec![FunctionCalls { name: "a".into(), calls: a }, FunctionCalls { name: "b".into(), calls: b }];
        let mut view = View::new(Some(5));
        view.update(1_000_000_000, calls(100, 5_000));
        // a: 1,000 more in 2 s; b: none.
        let text = view.update(3_000_000_000, calls(1_100, 5_000));
        let rows: Vec<&str> = text.lines().skip(2).filter(|l| !l.is_empty()).collect();
        assert_eq!(rows[0].split_whitespace().collect::<Vec<_>>(), ["500", "1,100", "a"]);
        assert_eq!(rows[1].split_whitespace().collect::<Vec<_>>(), ["0", "5,000", "b"]);
        assert!(text.starts_with("proftap top: 6,100 calls in 2 functions, 3 s"), "{text}");
    }
}

//! `proftap`: the command-line front end. Arguments become plain option
//! structs here; the libraries never see clap.

use clap::{Parser, Subcommand};
use proftap_cli::commands;
use std::io::Write as _;
use std::process::ExitCode;

/// Exact call counts, per-call costs and line counts of unmodified Linux programs.
#[derive(Parser)]
#[command(name = "proftap", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Profile a command from its first instruction.
    Run(commands::record::RunArgs),
    /// Profile a running process until Ctrl-C, --duration or its exit.
    Attach(commands::record::AttachArgs),
    /// Watch a running process's most called functions, live (as perf top).
    Top(commands::top::Args),
    /// Show a profile as text or JSON.
    #[command(after_long_help = REPORT_COLUMNS)]
    Report(commands::report::Args),
    /// Show a function's source with each line's count, time and samples.
    Annotate(commands::annotate::Args),
    /// Draw a flame graph (SVG) of sampled stacks or of the call tree.
    Flamegraph(commands::flamegraph::Args),
    /// Write line counts as gcov's .gcov files.
    Gcov(commands::gcov::Args),
    /// Write a profile in another format (json, folded, pprof, lcov, gcov-json; a trace as chrome-trace, speedscope, firefox).
    Export(commands::export::Args),
    /// Add profiles of several runs of the same build into one.
    Merge(commands::merge::Args),
    /// Compare two profiles, or two sets of runs: exit status 1 when a function got slower.
    Diff(commands::diff::Args),
    /// Check a profile against budgets (limits per function or region): exit status 1 when one breaks.
    Check(commands::check::Args),
    /// Sessions run by proftapd: start, list, status, stop, fetch, delete.
    Session(commands::session::Args),
    /// List the functions (and line rows) of a binary or a running process.
    Symbols(commands::symbols::Args),
    /// Writes the man pages and shell completions into DIR (packaging).
    #[command(name = "__generate-docs", hide = true)]
    GenerateDocs {
        /// Where.
        dir: std::path::PathBuf,
    },
    /// proftap measuring its own probe cost runs itself with this.
    #[command(name = "__calibrate-helper", hide = true)]
    CalibrateHelper {
        /// Where to write the timings.
        out: std::path::PathBuf,
    },
}

/// What the report's columns mean (in `report --help` and its man page).
const REPORT_COLUMNS: &str = "\
COLUMNS OF THE FLAT PROFILE:
  calls       calls seen (exact while the function was instrumented; a
              throttled function's count is those before its throttle)
  inclusive   the metric over all its calls, callees included
  exclusive   the same, less the time its instrumented callees took (its
              own code, and uninstrumented code it called)
  %run        share of the recording's wall-clock duration (time metrics);
              several threads can add up past 100
  avg min max inclusive cost per call: average, fastest, slowest
  %smp        share of stack samples with the function anywhere on the stack

THROTTLED FUNCTIONS (after their probes were removed):
  calls       calls since the throttle, counted in process; `~N` estimated:
              after counting stopped, from the calls a sample stood for while
              counted; where nothing counted them, from the time and the cost
              per call before (rough for short functions); `N+?` counted
              until counting stopped, the rest unknown (too few samples)
  ~self       time in itself since the throttle, from its samples
  ~total      the same with its callees

METRICS: wall (elapsed time, waiting included), cpu (time on a CPU: the
thread's task-clock), and kernel counters (page-faults, context-switches,
...) counted between a call's entry and its return.

The first line names the hottest function: the most exclusive cost in the
first metric. On a terminal, tables fit its width (names shortened in the
middle; pipes and --format json get everything) and the report goes through
$PAGER (less by default; --no-pager).

EXIT STATUS: 0 on success, 2 on an error (unreadable profile, bad option).";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::record::run(args),
        Command::Attach(args) => commands::record::attach(args),
        Command::Report(args) => commands::report::run(args),
        Command::Annotate(args) => commands::annotate::run(args),
        Command::Top(args) => commands::top::run(args),
        Command::Gcov(args) => commands::gcov::run(args),
        Command::Flamegraph(args) => commands::flamegraph::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Merge(args) => commands::merge::run(args),
        Command::Diff(args) => commands::diff::run(args),
        Command::Check(args) => commands::check::run(args),
        Command::Session(args) => commands::session::run(args),
        Command::Symbols(args) => commands::symbols::run(args),
        Command::GenerateDocs { dir } => generate_docs(&dir).map(|()| ExitCode::SUCCESS),
        Command::CalibrateHelper { out } => {
            std::fs::write(&out, proftap_probes::calibrate::helper_main()).map(|()| ExitCode::SUCCESS).map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            // A closed or full standard error takes the message, not the exit code.
            let _ = writeln!(std::io::stderr(), "proftap: {}", proftap_cli::wording::error(&error));
            ExitCode::from(2)
        }
    }
}

/// proftap.1 and a page per subcommand (proftap-run.1, ...), and
/// completions for bash, zsh and fish.
fn generate_docs(dir: &std::path::Path) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let command = Cli::command();
    clap_mangen::generate_to(command.clone(), &man)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut command.clone(), "proftap", &completions)?;
    }
    Ok(())
}

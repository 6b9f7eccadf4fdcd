//! `proftap session`: profiling sessions run by `proftapd`, which outlive the
//! terminal that started them.

use crate::report::text::{format_ns, group_digits};
use crate::session::{Client, Request, Response, SessionInfo, StartArgs, State};
use anyhow::{Result, bail};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap session`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Start a session on a running process (--pid) or a command (after
    /// `--`), with the options of `run` and `attach`; prints its id last.
    Start(Box<StartArgs>),
    /// Your sessions (every session, for root).
    List,
    /// One session's live counters.
    Status {
        /// The session.
        id: u64,
    },
    /// End a session (the program runs on) and keep its profile.
    Stop {
        /// The session.
        id: u64,
    },
    /// Write a finished session's profile to a file.
    Fetch {
        /// The session.
        id: u64,
        /// Where to write it.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
    },
    /// Forget a finished session and its profile.
    Delete {
        /// The session.
        id: u64,
    },
}

/// Runs the command against the daemon at `socket`; `argv` is proftap's own
/// command line (`session start` forwards its arguments as given).
pub fn run(args: Args, socket: PathBuf, argv: Vec<OsString>) -> Result<ExitCode> {
    let mut client = Client::connect(&socket)?;
    match args.command {
        Command::Start(start) => {
            if start.pid.is_none() && start.command.is_empty() {
                bail!("session start needs a process (--pid PID) or a command (-- CMD ARGS...)");
            }
            if start.record.output.is_some() {
                bail!("proftapd returns profiles over its socket, not to a file: leave out -o and use `proftap session fetch ID -o FILE`");
            }
            let args = forwarded(&argv, &start)?;
            let cwd = std::env::current_dir()?;
            let env = std::env::vars_os().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect();
            let streams = start.streams.open()?;
            let info = session(client.request_with_streams(&Request::Start { args, cwd, env }, &streams)?)?;
            eprintln!("proftap: session {} records {} (pid {}, {} functions probed)", info.id, info.target, info.pid, info.functions);
            println!("{}", info.id);
        }
        Command::List => match client.request(&Request::List)? {
            Response::Sessions(sessions) => {
                println!("{:>5} {:<9} {:>10} {:>12} {:>8}  target", "id", "state", "uptime", "events", "lost");
                for s in sessions {
                    println!(
                        "{:>5} {:<9} {:>10} {:>12} {:>8}  {}",
                        s.id,
                        state(s.state),
                        format_ns(s.uptime_ms * 1_000_000),
                        group_digits(s.events),
                        group_digits(s.lost),
                        s.target
                    );
                }
            }
            other => bail!("proftapd answered list with {other:?}"),
        },
        Command::Status { id } => print_info(&session(client.request(&Request::Status { id })?)?),
        Command::Stop { id } => print_info(&session(client.request(&Request::Stop { id })?)?),
        Command::Fetch { id, output } => match client.request(&Request::Fetch { id })? {
            Response::Profile { bytes } => {
                let data = client.read_bytes(bytes)?;
                proftap_profile::write_atomically(&output, |out| out.write_all(&data))?;
                // What arrived must be a profile this proftap reads.
                if let Err(e) = proftap_profile::read_profile(&output) {
                    let _ = std::fs::remove_file(&output);
                    return Err(e.into());
                }
                eprintln!("proftap: session {id}'s profile written to {} (see: proftap report {})", output.display(), output.display());
            }
            other => bail!("proftapd answered fetch with {other:?}"),
        },
        Command::Delete { id } => {
            client.request(&Request::Delete { id })?;
            eprintln!("proftap: session {id} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn session(response: Response) -> Result<SessionInfo> {
    match response {
        Response::Session(info) => Ok(info),
        other => bail!("proftapd sent {other:?} where a session was expected"),
    }
}

fn state(state: State) -> &'static str {
    match state {
        State::Starting => "starting",
        State::Running => "running",
        State::Finished => "finished",
        State::Failed => "failed",
    }
}

fn print_info(s: &SessionInfo) {
    println!("session     {}", s.id);
    println!("target      {}", s.target);
    println!("pid         {}", s.pid);
    println!("state       {}", state(s.state));
    println!("uptime      {}", format_ns(s.uptime_ms * 1_000_000));
    println!("functions   {}", group_digits(s.functions));
    println!("events      {}", group_digits(s.events));
    println!("lost        {}", group_digits(s.lost));
    if let Some(error) = &s.error {
        println!("error       {error}");
    }
}

/// The arguments after `session start` as given, without `--socket`, and
/// with the command's path made absolute: the daemon resolves nothing
/// against its own `PATH` or directory.
fn forwarded(argv: &[OsString], start: &StartArgs) -> Result<Vec<String>> {
    let at = argv.windows(2).position(|w| w[0] == "session" && w[1] == "start").map_or(argv.len(), |i| i + 2);
    let mut args = Vec::new();
    let mut rest = argv[at..].iter();
    let mut command_next = false;
    while let Some(arg) = rest.next() {
        let text = arg.to_str().ok_or_else(|| anyhow::anyhow!("argument {arg:?} is not valid UTF-8"))?.to_string();
        if command_next {
            let path = proftap_probes::target::resolve_command(arg)?;
            let path = std::fs::canonicalize(&path).unwrap_or(path);
            args.push(path.to_string_lossy().into_owned());
            args.extend(rest.map(|a| a.to_string_lossy().into_owned()));
            break;
        }
        if text == "--socket" {
            rest.next();
            continue;
        }
        if text.starts_with("--socket=") {
            continue;
        }
        command_next = text == "--" && !start.command.is_empty();
        args.push(text);
    }
    Ok(args)
}

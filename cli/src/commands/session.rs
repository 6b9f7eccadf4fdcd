//! `proftap session`: profiling sessions run by `proftapd`, which outlive the
//! terminal that started them.

use crate::client::Client;
use crate::commands::record::{AttachOptions, RecordArgs};
use crate::report::text::{format_ns, group_digits};
use crate::wording;
use anyhow::{Result, bail};
use proftap_record::protocol::{Request, Response, Sealed, SessionInfo, State};
use proftap_record::request::{RecordRequest, RecordTarget};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `proftap session`.
#[derive(clap::Args)]
pub struct Args {
    /// The proftapd socket (default /run/proftap/proftapd.sock as root,
    /// else $XDG_RUNTIME_DIR/proftap.sock).
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
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
    /// Wait for a session to end on its own (its command exits, its
    /// process ends or its duration is up) and for its profile.
    Wait {
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

/// Runs the command against the daemon at `--socket`.
pub fn run(args: Args) -> Result<ExitCode> {
    let socket = args.socket.clone().unwrap_or_else(proftap_record::protocol::default_socket);
    let mut client = Client::connect(&socket)?;
    match args.command {
        Command::Start(start) => {
            let request = start.request()?;
            let streams = start.streams.open()?;
            let info = session(client.request_with_streams(&Request::Start { request: Sealed::new(&request)? }, &streams)?)?;
            for warning in &info.warnings {
                eprintln!("proftap: warning: {}", wording::warning(warning));
            }
            eprintln!(
                "proftap: session {} records {} (pid {}, {} probed)",
                info.id,
                info.target,
                info.pid,
                crate::wording::counted(info.functions as u64, "function", "functions")
            );
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
        Command::Wait { id } => print_info(&session(client.request(&Request::Wait { id })?)?),
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
    print!("{}", info(s));
}

/// A session's status, a line for each thing known of it; the governor's
/// changes of the probes past the first few folded into one line.
fn info(s: &SessionInfo) -> String {
    let mut out = format!(
        "session     {}\ntarget      {}\npid         {}\nstate       {}\nuptime      {}\nfunctions   {}\nevents      {}\nlost        {}\n",
        s.id,
        s.target,
        s.pid,
        state(s.state),
        format_ns(s.uptime_ms * 1_000_000),
        group_digits(s.functions),
        group_digits(s.events),
        group_digits(s.lost)
    );
    for warning in &s.warnings {
        out += &format!("warning     {}\n", wording::warning(warning));
    }
    for change in wording::notes(&s.changes) {
        out += &format!("change      {change}\n");
    }
    if let Some(error) = &s.error {
        out += &format!("error       {error}\n");
    }
    out
}

impl StartArgs {
    /// The request to send: the command's path made absolute and its
    /// working directory and environment this client's, since the daemon
    /// resolves nothing against its own `PATH` or directory.
    fn request(&self) -> Result<RecordRequest> {
        if self.record.output.is_some() {
            bail!("proftapd returns profiles over its socket, not to a file: leave out -o and use `proftap session fetch ID -o FILE`");
        }
        if self.record.save_events.is_some() {
            bail!("proftapd does not save a session's events; record with proftap run or attach to save them");
        }
        let target = match (self.pid, self.command.split_first()) {
            (Some(pid), _) => self.attach.target(pid),
            (None, Some((program, args))) => {
                let path = proftap_probes::target::resolve_command(program)?;
                let path = std::fs::canonicalize(&path).unwrap_or(path);
                let command = std::iter::once(path.into_os_string()).chain(args.iter().cloned()).collect();
                let env = std::env::vars_os()
                    .map(|(mut key, value)| {
                        key.push("=");
                        key.push(value);
                        key
                    })
                    .collect();
                RecordTarget::Launch { command, cwd: Some(std::env::current_dir()?), env: Some(env) }
            }
            (None, None) => bail!("session start needs a process (--pid PID) or a command (-- CMD ARGS...)"),
        };
        self.record.request(target)
    }
}

/// What `session start` takes: the options of `run` and `attach`, and a
/// process (`--pid`) or a command.
#[derive(clap::Args, Clone)]
pub struct StartArgs {
    /// Attach to this running process.
    #[arg(long, conflicts_with = "command")]
    pub pid: Option<i32>,
    /// How to record.
    #[command(flatten)]
    pub record: RecordArgs,
    /// With --pid: how long, and what when.
    #[command(flatten)]
    pub attach: AttachOptions,
    /// Where the launched command's standard streams go.
    #[command(flatten)]
    pub streams: Streams,
    /// The command to launch and profile, with its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Where a command launched by a session reads and writes: files this
/// client opens as its user (default /dev/null), or its own streams.
#[derive(clap::Args, Clone, Default)]
pub struct Streams {
    /// The command reads this file as its standard input.
    #[arg(long, value_name = "FILE", conflicts_with = "inherit_streams")]
    pub stdin: Option<PathBuf>,
    /// The command's standard output is appended to this file.
    #[arg(long, value_name = "FILE", conflicts_with = "inherit_streams")]
    pub stdout: Option<PathBuf>,
    /// The command's standard error is appended to this file.
    #[arg(long, value_name = "FILE", conflicts_with = "inherit_streams")]
    pub stderr: Option<PathBuf>,
    /// The command uses this terminal's (this client's) standard streams,
    /// for as long as it runs.
    #[arg(long)]
    pub inherit_streams: bool,
}

impl Streams {
    /// The three streams to send, opened as the user running the client.
    pub fn open(&self) -> std::io::Result<[std::os::fd::OwnedFd; 3]> {
        use std::os::fd::AsFd;
        if self.inherit_streams {
            let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned();
            return Ok([dup(std::io::stdin().as_fd())?, dup(std::io::stdout().as_fd())?, dup(std::io::stderr().as_fd())?]);
        }
        let null = Path::new("/dev/null");
        let read = |p: &Option<PathBuf>| std::fs::File::open(p.as_deref().unwrap_or(null));
        let append = |p: &Option<PathBuf>| std::fs::OpenOptions::new().create(true).append(true).open(p.as_deref().unwrap_or(null));
        let named = |p: &Option<PathBuf>, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot open {}: {e}", p.as_deref().unwrap_or(null).display()))
        };
        let stdin = read(&self.stdin).map_err(|e| named(&self.stdin, e))?;
        let stdout = append(&self.stdout).map_err(|e| named(&self.stdout, e))?;
        let stderr = append(&self.stderr).map_err(|e| named(&self.stderr, e))?;
        Ok([stdin.into(), stdout.into(), stderr.into()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{Finding, FunctionCalls, Note};

    #[test]
    fn a_sessions_status_folds_the_probe_changes_past_the_first_few() {
        let change = |after_ms| {
            Note::Found(Finding::Throttled {
                after_ms,
                functions: vec![FunctionCalls { name: format!("f{after_ms}"), calls: 10 }],
                budget_percent: 5.0,
                sampled: true,
                counted: true,
            })
        };
        let s = SessionInfo {
            id: 1,
            uid: 0,
            target: "work".into(),
            pid: 2,
            state: State::Running,
            started_unix_ns: 0,
            uptime_ms: 10,
            functions: 3,
            events: 4,
            lost: 0,
            warnings: Vec::new(),
            changes: (1..=6).map(change).collect(),
            error: None,
        };
        let shown = info(&s);
        let changes: Vec<&str> = shown.lines().filter(|l| l.starts_with("change")).collect();
        assert_eq!(changes.len(), 4, "{shown}");
        assert!(changes[3].contains("3 more changes of the probes") && changes[3].contains("4 to 6 ms"), "{shown}");
    }
}

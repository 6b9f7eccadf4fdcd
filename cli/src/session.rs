//! The session protocol between `proftap session` and `proftapd`: newline
//! separated JSON messages over a Unix socket (see `docs/PROTOCOL.md`).

use crate::commands::record::{AttachOptions, RecordArgs};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The protocol version; a client and a daemon must speak the same.
pub const PROTOCOL_VERSION: u32 = 1;

/// Where the daemon listens unless told otherwise: `/run/proftap/proftapd.sock`
/// for root, `$XDG_RUNTIME_DIR/proftap.sock` for other users.
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/proftap/proftapd.sock")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from).join("proftap.sock")
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

/// The first message each way.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub protocol: u32,
    /// The sender's program and version (`proftap 0.1.0`).
    pub program: String,
}

/// A client's request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Start a session: `args` as `session start` takes them (the command,
    /// if any, with an absolute path), run from `cwd` with `env`.
    Start {
        /// The arguments.
        args: Vec<String>,
        /// The client's working directory.
        cwd: PathBuf,
        /// The client's environment, `KEY=VALUE`.
        env: Vec<String>,
    },
    /// The caller's sessions (every session, for root).
    List,
    /// One session.
    Status {
        /// Its id.
        id: u64,
    },
    /// End a session (the program runs on) and wait for its profile.
    Stop {
        /// Its id.
        id: u64,
    },
    /// A finished session's profile: the reply is followed by its bytes.
    Fetch {
        /// Its id.
        id: u64,
    },
    /// Forget a finished session and its profile.
    Delete {
        /// Its id.
        id: u64,
    },
}

/// Where a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Probes being placed.
    Starting,
    /// Recording.
    Running,
    /// Ended; its profile is kept.
    Finished,
    /// Ended without a profile.
    Failed,
}

/// A session as `list` and `status` show it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Its id.
    pub id: u64,
    /// The user who started it.
    pub uid: u32,
    /// What it records: the command line, or `pid N (command)`.
    pub target: String,
    /// The process recorded (0 until known).
    pub pid: i32,
    /// Where it is.
    pub state: State,
    /// When it started (Unix time, ns).
    pub started_unix_ns: u64,
    /// How long it has been (or was) recording, ms.
    pub uptime_ms: u64,
    /// Functions probed.
    pub functions: u64,
    /// Probe hits so far.
    pub events: u64,
    /// Probe hits lost so far.
    pub lost: u64,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The daemon's reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// A session.
    Session(SessionInfo),
    /// Sessions.
    Sessions(Vec<SessionInfo>),
    /// A profile of this many bytes follows.
    Profile {
        /// Its size.
        bytes: u64,
    },
    /// Deleted.
    Deleted {
        /// The session.
        id: u64,
    },
    /// Refused or failed: one sentence.
    Error {
        /// Why.
        message: String,
    },
}

/// Why talking to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon there.
    #[error("cannot connect to proftapd at {}: {source} (is proftapd running? --socket names another socket)", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The connection broke or the daemon said something unreadable.
    #[error("the connection to proftapd broke: {0}")]
    Broken(String),
    /// Different protocol versions.
    #[error(
        "proftapd speaks session protocol {theirs} ({program}) and this proftap speaks {PROTOCOL_VERSION}; use the proftap that came with the daemon"
    )]
    Version {
        /// The daemon's version.
        theirs: u32,
        /// The daemon.
        program: String,
    },
    /// The daemon refused.
    #[error("{0}")]
    Refused(String),
}

/// Writes one message as a line.
pub fn send<T: Serialize>(out: &mut impl Write, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Reads one message line (`None` at end of input).
pub fn receive<T: for<'de> Deserialize<'de>>(input: &mut impl BufRead) -> std::io::Result<Option<T>> {
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A connection to the daemon.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects and greets.
    pub fn connect(socket: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect { socket: socket.into(), source })?;
        let writer = stream.try_clone().map_err(|e| ClientError::Broken(e.to_string()))?;
        let mut client = Client { reader: BufReader::new(stream), writer };
        let hello = Hello { protocol: PROTOCOL_VERSION, program: format!("proftap {}", env!("CARGO_PKG_VERSION")) };
        send(&mut client.writer, &hello).map_err(|e| ClientError::Broken(e.to_string()))?;
        let theirs: Hello = receive(&mut client.reader)
            .map_err(|e| ClientError::Broken(e.to_string()))?
            .ok_or_else(|| ClientError::Broken("proftapd closed the connection".into()))?;
        if theirs.protocol != PROTOCOL_VERSION {
            return Err(ClientError::Version { theirs: theirs.protocol, program: theirs.program });
        }
        Ok(client)
    }

    /// Sends a request and reads the reply; an `Error` reply is an error.
    pub fn request(&mut self, request: &Request) -> Result<Response, ClientError> {
        send(&mut self.writer, request).map_err(|e| ClientError::Broken(e.to_string()))?;
        self.reply()
    }

    /// Sends a request with the standard input, output and error that a
    /// command the daemon launches uses (the user's, not the daemon's), and
    /// reads the reply.
    pub fn request_with_streams(&mut self, request: &Request, streams: &[std::os::fd::OwnedFd; 3]) -> Result<Response, ClientError> {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        use std::os::fd::AsRawFd;
        let mut line = serde_json::to_vec(request).map_err(|e| ClientError::Broken(e.to_string()))?;
        line.push(b'\n');
        let fds = streams.each_ref().map(|fd| fd.as_raw_fd());
        let rights = [ControlMessage::ScmRights(&fds)];
        let broken = |e: std::io::Error| ClientError::Broken(e.to_string());
        // The descriptors go with the first byte; the rest follows plainly.
        let sent = sendmsg::<()>(self.writer.as_raw_fd(), &[std::io::IoSlice::new(&line[..1])], &rights, MsgFlags::empty(), None)
            .map_err(|e| broken(e.into()))?;
        self.writer.write_all(&line[sent..]).map_err(broken)?;
        self.writer.flush().map_err(broken)?;
        self.reply()
    }

    fn reply(&mut self) -> Result<Response, ClientError> {
        match receive(&mut self.reader).map_err(|e| ClientError::Broken(e.to_string()))? {
            Some(Response::Error { message }) => Err(ClientError::Refused(message)),
            Some(response) => Ok(response),
            None => Err(ClientError::Broken("proftapd closed the connection".into())),
        }
    }

    /// After a `Profile` reply: its bytes.
    pub fn read_bytes(&mut self, n: u64) -> Result<Vec<u8>, ClientError> {
        let mut bytes = Vec::with_capacity(n.min(1 << 30) as usize);
        (&mut self.reader).take(n).read_to_end(&mut bytes).map_err(|e| ClientError::Broken(e.to_string()))?;
        if bytes.len() as u64 != n {
            return Err(ClientError::Broken(format!("the profile was cut short ({} of {n} bytes)", bytes.len())));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_of_another_protocol_version_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let daemon = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let hello: Option<Hello> = receive(&mut reader).expect("hello");
            assert_eq!(hello.map(|h| h.protocol), Some(PROTOCOL_VERSION));
            send(&mut &stream, &Hello { protocol: PROTOCOL_VERSION + 1, program: "proftapd 9.0.0".into() }).expect("send");
        });
        let err = Client::connect(&socket).err().expect("refused");
        assert_eq!(
            err.to_string(),
            format!(
                "proftapd speaks session protocol {} (proftapd 9.0.0) and this proftap speaks {PROTOCOL_VERSION}; use the proftap that came with the daemon",
                PROTOCOL_VERSION + 1
            )
        );
        daemon.join().expect("daemon");
    }
}

//! The session protocol between `proftap session` and `proftapd`: newline
//! separated JSON messages over a Unix socket (see `docs/PROTOCOL.md`).

use crate::observer::Warning;
use crate::request::RecordRequest;
use proftap_profile::Note;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::io::{BufRead, Read, Write};
use std::marker::PhantomData;
use std::path::PathBuf;

/// The protocol version; a client and a daemon must speak the same.
pub const PROTOCOL_VERSION: u32 = 2;

/// Where the daemon listens unless told otherwise: `/run/proftap/proftapd.sock`
/// for root, `$XDG_RUNTIME_DIR/proftap.sock` for other users.
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/proftap/proftapd.sock")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from).join("proftap.sock")
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
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Start a session recording what the request says; a launched
    /// command's path is absolute (the daemon resolves nothing against its
    /// own `PATH` or directory). The daemon does not read the request: the
    /// session's worker does, once it runs as the user.
    Start {
        /// What to record.
        request: Sealed<RecordRequest>,
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
    /// Wait for a session to end on its own (its command exits, its
    /// process ends or its duration is up) and for its profile.
    Wait {
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

/// A value carried as the JSON it arrived as, read only where it is opened:
/// the daemon passes a start request on to the session's worker unread.
pub struct Sealed<T> {
    json: Box<RawValue>,
    of: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> Sealed<T> {
    /// Seals `value`.
    pub fn new(value: &T) -> serde_json::Result<Self> {
        Ok(Sealed { json: serde_json::value::to_raw_value(value)?, of: PhantomData })
    }

    /// Reads the value.
    pub fn open(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.json.get())
    }
}

impl<T> std::fmt::Debug for Sealed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed({} bytes)", self.json.get().len())
    }
}

impl<T> Serialize for Sealed<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl<'de, T> Deserialize<'de> for Sealed<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Sealed { json: Box::<RawValue>::deserialize(d)?, of: PhantomData })
    }
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
    /// What preparing the recording warned of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
    /// Changes to the probe set while it ran, as they happened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Note>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SessionInfo {
    /// A session of user `uid` that has recorded nothing yet.
    pub fn new(id: u64, uid: u32, state: State, started_unix_ns: u64) -> Self {
        SessionInfo {
            id,
            uid,
            target: String::new(),
            pid: 0,
            state,
            started_unix_ns,
            uptime_ms: 0,
            functions: 0,
            events: 0,
            lost: 0,
            warnings: Vec::new(),
            changes: Vec::new(),
            error: None,
        }
    }
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

/// Writes one message as a line.
pub fn send<T: Serialize>(out: &mut impl Write, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Longest message line [`receive`] reads: far more than a list of every
/// session needs, little enough that a peer cannot make the reader hold
/// what it sends for ever.
pub const MOST_MESSAGE_BYTES: u64 = 16 << 20;

/// Reads one message line (`None` at end of input); a line longer than
/// [`MOST_MESSAGE_BYTES`] is an error.
pub fn receive<T: DeserializeOwned>(input: &mut impl BufRead) -> std::io::Result<Option<T>> {
    let mut line = String::new();
    if input.by_ref().take(MOST_MESSAGE_BYTES + 1).read_line(&mut line)? == 0 {
        return Ok(None);
    }
    if line.len() as u64 > MOST_MESSAGE_BYTES {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a message longer than {MOST_MESSAGE_BYTES} bytes")));
    }
    serde_json::from_str(&line).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::RecordTarget;

    #[test]
    fn a_message_line_longer_than_the_limit_is_refused_unread() {
        let mut long = vec![b' '; MOST_MESSAGE_BYTES as usize + 10];
        long.extend_from_slice(b"{\"deleted\":{\"id\":1}}\n");
        let error = receive::<Response>(&mut long.as_slice()).expect_err("a line over the limit");
        assert!(error.to_string().contains("longer than"), "{error}");
        let fits = b"{\"deleted\":{\"id\":1}}\n";
        assert!(matches!(receive::<Response>(&mut fits.as_slice()), Ok(Some(Response::Deleted { id: 1 }))));
    }

    #[test]
    fn a_start_request_travels_sealed_and_opens_as_sent() {
        let record = RecordRequest::new(RecordTarget::Attach { pid: 42, duration: None, auto_instrument: None });
        let line = serde_json::to_string(&Request::Start { request: Sealed::new(&record).expect("seal") }).expect("json");
        let Request::Start { request } = serde_json::from_str(&line).expect("request") else { panic!("not a start: {line}") };
        assert_eq!(request.open().expect("open"), record);
        // Forwarded unread, it opens the same.
        let forwarded: Sealed<RecordRequest> = serde_json::from_str(&serde_json::to_string(&request).expect("json")).expect("sealed");
        assert_eq!(forwarded.open().expect("open"), record);
    }
}

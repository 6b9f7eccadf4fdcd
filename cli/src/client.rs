//! The client side of the session protocol (`docs/PROTOCOL.md`; the
//! messages are [`proftap_record::protocol`]'s).

use proftap_record::protocol::{Hello, PROTOCOL_VERSION, Request, Response, receive, send};
use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

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

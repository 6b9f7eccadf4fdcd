//! One client's connection: request lines read within bounds, with the
//! descriptors a `start` request carries (the client's standard streams),
//! and a cap on the connections each user holds at once.

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use tokio::io::Interest;
use tokio::net::unix::OwnedReadHalf;

/// The longest request line: a `start` request carries the client's
/// environment, a few kilobytes as a rule.
pub const MOST_LINE_BYTES: usize = 1 << 20;
/// The descriptors one request may carry (standard input, output, error).
const MOST_FDS: usize = 3;

/// A request line and the descriptors that came with it.
pub type Line = (String, Vec<OwnedFd>);

/// Reads request lines from a client.
pub struct Lines {
    read: OwnedReadHalf,
    buffer: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Lines {
    /// Lines from `read`.
    pub fn new(read: OwnedReadHalf) -> Self {
        Lines { read, buffer: Vec::new(), fds: Vec::new() }
    }

    /// The next line, `None` at the end; a line longer than
    /// [`MOST_LINE_BYTES`] is an error that ends the connection.
    pub async fn next(&mut self) -> io::Result<Option<Line>> {
        loop {
            if let Some(text) = take_line(&mut self.buffer)? {
                return Ok(Some((text, std::mem::take(&mut self.fds))));
            }
            self.read.as_ref().readable().await?;
            let fd = self.read.as_ref().as_raw_fd();
            let mut chunk = [0u8; 64 * 1024];
            let received = self.read.as_ref().try_io(Interest::READABLE, || receive(fd, &mut chunk, &mut self.fds));
            match received {
                Ok(0) => return Ok(None),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The first line of what a client sent so far, taken out of `buffer`
/// (without its `\n`; bytes that are not UTF-8 replaced), or `None` until
/// one has come whole; a line longer than [`MOST_LINE_BYTES`] is an error.
pub fn take_line(buffer: &mut Vec<u8>) -> io::Result<Option<String>> {
    let end = buffer.iter().position(|&b| b == b'\n');
    if end.unwrap_or(buffer.len()) > MOST_LINE_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a request longer than {MOST_LINE_BYTES} bytes")));
    }
    let Some(end) = end else { return Ok(None) };
    let line: Vec<u8> = buffer.drain(..=end).collect();
    Ok(Some(String::from_utf8_lossy(&line[..end]).into_owned()))
}

/// One `recvmsg`, keeping at most [`MOST_FDS`] descriptors (more are closed).
fn receive(fd: RawFd, chunk: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; MOST_FDS]);
    let mut parts = [IoSliceMut::new(chunk)];
    let message = recvmsg::<()>(fd, &mut parts, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT)?;
    for control in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = control {
            for raw in received {
                // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fds.len() < MOST_FDS {
                    fds.push(owned);
                }
            }
        }
    }
    Ok(message.bytes)
}

/// Connections open per user.
#[derive(Clone, Default)]
pub struct Counts(Arc<Mutex<HashMap<u32, usize>>>);

/// One counted connection; uncounted when dropped.
pub struct Counted {
    counts: Counts,
    uid: u32,
}

impl Counts {
    /// Counts a connection of `uid`, unless that user already holds `most`.
    pub fn admit(&self, uid: u32, most: usize) -> Option<Counted> {
        let mut counts = self.0.lock().ok()?;
        let count = counts.entry(uid).or_default();
        if *count >= most {
            return None;
        }
        *count += 1;
        Some(Counted { counts: self.clone(), uid })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.counts.0.lock()
            && let Some(count) = counts.get_mut(&self.uid)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_whole_and_bounded() {
        let mut buffer = b"{\"list\":1}\n\"li".to_vec();
        assert_eq!(take_line(&mut buffer).expect("a line").as_deref(), Some("{\"list\":1}"));
        assert_eq!(take_line(&mut buffer).expect("not yet"), None);
        buffer.extend_from_slice(b"st\"\n");
        assert_eq!(take_line(&mut buffer).expect("a line").as_deref(), Some("\"list\""));
        assert!(buffer.is_empty());
        // A line too long is refused whether or not its end has come.
        let mut long = vec![b'x'; MOST_LINE_BYTES + 1];
        assert!(take_line(&mut long).is_err());
        long.push(b'\n');
        assert!(take_line(&mut long).is_err());
        let mut longest = vec![b'x'; MOST_LINE_BYTES];
        longest.push(b'\n');
        assert_eq!(take_line(&mut longest).expect("the longest line").map(|l| l.len()), Some(MOST_LINE_BYTES));
    }
}

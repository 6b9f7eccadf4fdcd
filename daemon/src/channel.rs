//! The socket between proftapd and one session worker: JSON messages in
//! frames, each frame with the file descriptors it carries (the user's
//! standard streams, the files to probe, the finished profile).
//!
//! A frame is an 8-byte header (body length, descriptor count; little
//! endian) sent together with its descriptors, then the body. The worker
//! runs as the user it records for, so what it sends is checked like any
//! request: bounded in size, its descriptor count matched.

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The largest body a frame may have.
pub const MOST_BYTES: u32 = 16 << 20;
/// The most descriptors one frame may carry (the kernel's own limit is 253).
pub const MOST_FDS: usize = 200;

/// One end of the socket.
pub struct Channel {
    stream: UnixStream,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Channel {
    /// Wraps a connected stream socket.
    pub fn new(stream: UnixStream) -> Self {
        Channel { stream }
    }

    /// Sends `message` with `fds`.
    pub fn send<T: Serialize>(&self, message: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MOST_FDS {
            return Err(invalid(format!("{} descriptors in one message, more than {MOST_FDS}", fds.len())));
        }
        let body = serde_json::to_vec(message).map_err(io::Error::other)?;
        let length = u32::try_from(body.len()).ok().filter(|&n| n <= MOST_BYTES).ok_or_else(|| invalid("a message too large".into()))?;
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&length.to_le_bytes());
        header[4..].copy_from_slice(&(fds.len() as u32).to_le_bytes());
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let control: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        let sent = sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(&header)], control, MsgFlags::MSG_NOSIGNAL, None)?;
        (&self.stream).write_all(&header[sent..])?;
        (&self.stream).write_all(&body)
    }

    /// The next message and the descriptors it carries; `None` when the
    /// other end has closed the socket between messages.
    pub fn receive<T: DeserializeOwned>(&self) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
        let mut header = [0u8; 8];
        let mut fds = Vec::new();
        let mut filled = 0;
        while filled < header.len() {
            let n = self.receive_part(&mut header[filled..], &mut fds)?;
            if n == 0 {
                return if filled == 0 { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
            }
            filled += n;
        }
        let length = u32::from_le_bytes(header[..4].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(header[4..].try_into().unwrap_or_default()) as usize;
        if length > MOST_BYTES {
            return Err(invalid(format!("a message of {length} bytes, more than {MOST_BYTES}")));
        }
        if count != fds.len() {
            return Err(invalid(format!("a message said it carried {count} descriptors and carried {}", fds.len())));
        }
        let mut body = vec![0u8; length as usize];
        (&self.stream).read_exact(&mut body)?;
        let message = serde_json::from_slice(&body).map_err(|e| invalid(format!("an unreadable message: {e}")))?;
        Ok(Some((message, fds)))
    }

    /// Reads into `buffer`, keeping the descriptors that come with it (at
    /// most [`MOST_FDS`]; more are closed and make the frame wrong).
    fn receive_part(&self, buffer: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
        let mut space = nix::cmsg_space!([RawFd; MOST_FDS]);
        let mut parts = [IoSliceMut::new(buffer)];
        let message =
            recvmsg::<()>(self.stream.as_raw_fd(), &mut parts, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
        for control in message.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(received) = control {
                // SAFETY: the kernel just gave us these descriptors; nothing else owns them.
                fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if message.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(invalid("a message carried more descriptors than allowed".into()));
        }
        Ok(message.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn messages_carry_their_descriptors() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (a, b) = (Channel::new(a), Channel::new(b));
        let file = tempfile::tempfile().expect("tempfile");
        a.send(&vec!["x".to_string()], &[file.as_fd()]).expect("send");
        a.send(&7u32, &[]).expect("send");
        let (first, fds): (Vec<String>, _) = b.receive().expect("receive").expect("a message");
        assert_eq!((first, fds.len()), (vec!["x".to_string()], 1));
        let (second, fds): (u32, _) = b.receive().expect("receive").expect("a message");
        assert_eq!((second, fds.len()), (7, 0));
        drop(a);
        assert!(b.receive::<u32>().expect("end").is_none());
    }

    #[test]
    fn a_frame_that_lies_is_refused() {
        let (a, b) = UnixStream::pair().expect("pair");
        let b = Channel::new(b);
        // Claims a descriptor it does not carry.
        (&a).write_all(&[2, 0, 0, 0, 1, 0, 0, 0, b'4', b'2']).expect("write");
        assert!(b.receive::<u32>().is_err());
        // Claims a body far too large.
        let (a, b) = UnixStream::pair().expect("pair");
        let b = Channel::new(b);
        (&a).write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).expect("write");
        let err = b.receive::<u32>().expect_err("too large");
        assert!(err.to_string().contains("more than"), "{err}");
    }
}

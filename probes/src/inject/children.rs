//! Forked children of a patched process. A child inherits the patched code
//! and, at its first call into the runtime, makes shared memory of its own
//! and sends it here, on an abstract socket whose name the runtime's
//! configuration holds (see `adopt` in `probes/runtime/runtime.c`), or,
//! from a network namespace of its own (where abstract names are
//! another's), on a second socket bound to a path in a directory of its
//! own. Each child's totals are then read like the parent's, as a process
//! of their own.
//!
//! Anyone on the machine can connect to either socket: a sender must
//! be of the target's user (or root), send one memfd of the expected size,
//! which is sealed against shrinking before it is mapped; what it holds is
//! read as any target's memory is, checked. A child seen to end is read
//! and its memory let go, its totals kept (at most [`MOST_LET_GO_BYTES`]
//! of them), once every sample taken before it ended was named (their
//! stacks are read through its memory), so that the end of a recording
//! does not read hundreds of them. Past [`MOST_HELD_CHILDREN`] held at
//! once, those that ended are let go whatever their totals take, so that
//! a program forking children by the thousand has each one counted.
//! Children past the limits are counted.
//!
//! A child's calls in progress when it ends never return: they end when it
//! did, which the thread taking children notes as each child's process
//! descriptor becomes ready.

use super::reading::{Totals, TotalsView};
use super::remote::Shared;
use super::totals::{Geometry, SocketPath};
use nix::cmsg_space;
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessageOwned, MsgFlags, Shutdown, SockFlag, SockType, UnixAddr, accept, bind, getsockopt, listen,
    recvmsg, send, setsockopt, shutdown, socket, sockopt,
};
use nix::sys::time::TimeVal;
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Children followed at most in one recording.
pub const MOST_CHILDREN: usize = 1 << 20;

/// Children whose memory is held at once (each holds two descriptors, its
/// memory's and its process's). Past it, those that ended are read and
/// their memory let go, [`LET_GO_AT_ONCE`] at a time, whatever their
/// totals take (before, as they end, only while they fit).
pub const MOST_HELD_CHILDREN: usize = 4096;

/// How many ended children's memory is read and let go at once: reading
/// one takes tens of microseconds, while children wait to be taken.
const LET_GO_AT_ONCE: usize = 64;

/// How many ended children are read and let go at once as they end: each
/// read leaves a child that connects meanwhile waiting for its answer.
const LET_GO_BESIDE: usize = 8;

/// Most bytes of totals kept of children whose memory was let go: a
/// shell's child takes a few kilobytes, so hundreds of thousands fit.
pub const MOST_LET_GO_BYTES: u64 = 1 << 30;

/// Bytes of the socket's name (`FORK_SOCKET_NAME` in runtime.h).
pub const NAME_BYTES: usize = 32;

/// A child that handed its memory over.
pub struct Child {
    /// Its process id.
    pub pid: i32,
    /// The process: the socket's peer as the kernel knew it, so surely
    /// it, even if it ended before it was taken. None where the kernel
    /// cannot say (before 6.5) and it had ended: it is taken as ended.
    process: Option<OwnedFd>,
    memory: Memory,
    /// When it handed its memory over (CLOCK_MONOTONIC, ns).
    taken_ns: u64,
    /// When it was seen to end (CLOCK_MONOTONIC, ns).
    ended_ns: Option<u64>,
}

/// What proftap has of a child's memory.
enum Memory {
    /// The memory it handed over.
    Held(OwnedFd),
    /// What its memory held once it had ended, read so that the memory
    /// could be let go (or why it could not be read).
    LetGo(Result<Arc<Totals>, String>),
}

impl Memory {
    fn held(&self) -> Option<&OwnedFd> {
        match self {
            Memory::Held(memory) => Some(memory),
            Memory::LetGo(_) => None,
        }
    }
}

/// A child that handed its memory over, and when it ended: its memory is
/// mapped only while it is read. Each child's takes as much address space
/// as the parent's (most of it never touched): a few hundred children
/// mapped at once would fill the address space.
pub struct ChildView {
    /// Its process id.
    pub pid: i32,
    /// When it was seen to end (CLOCK_MONOTONIC, ns), if it did while children were taken.
    pub ended_ns: Option<u64>,
    /// Its place among the children received.
    index: usize,
    memories: ChildMemories,
}

impl ChildView {
    /// Whether it was seen to end by now (`ended_ns` says whether it had
    /// when the view was made).
    pub fn ended(&self) -> bool {
        let received = self.memories.received.lock().unwrap_or_else(|e| e.into_inner());
        received.children.get(self.index).is_some_and(|child| child.ended_ns.is_some())
    }

    /// Its totals, or why they cannot be read: those kept as it ended
    /// are shared, not copied (a shell forks hundreds of children).
    pub fn totals(&self) -> Result<Arc<Totals>, String> {
        match self.memory().map_err(|e| format!("cannot map its memory: {e}"))? {
            Memory::Held(memory) => self.memories.map(memory).map_err(|e| format!("cannot map its memory: {e}"))?.totals().map(Arc::new),
            Memory::LetGo(totals) => totals,
        }
    }

    /// Adds its calls so far, by function, to `into`; false when its
    /// memory cannot be mapped now (the address space full for a moment).
    pub fn calls(&self, into: &mut [u64]) -> bool {
        match self.memory() {
            Ok(Memory::Held(memory)) => self.memories.map(memory).map(|view| view.calls(into)).is_ok(),
            Ok(Memory::LetGo(totals)) => {
                if let Ok(totals) = &totals {
                    add_calls(totals, into);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Its memory, or what was read of it.
    fn memory(&self) -> io::Result<Memory> {
        let received = self.memories.received.lock().unwrap_or_else(|e| e.into_inner());
        match &received.children.get(self.index).ok_or_else(|| io::Error::other("no such child"))?.memory {
            Memory::Held(memory) => Ok(Memory::Held(memory.try_clone()?)),
            Memory::LetGo(totals) => Ok(Memory::LetGo(totals.clone())),
        }
    }
}

/// Adds the calls of every thread of `totals`, by function, to `into`.
fn add_calls(totals: &Totals, into: &mut [u64]) {
    for thread in &totals.threads {
        for (total, calls) in into.iter_mut().zip(&thread.calls) {
            *total = total.saturating_add(*calls);
        }
    }
}

#[derive(Default)]
struct Received {
    children: Vec<Child>,
    /// Children whose memory is held.
    held: usize,
    /// No child before this one has its memory held.
    first_held: usize,
    /// Bytes of the totals kept of children whose memory was let go.
    let_go_bytes: u64,
    /// Samples taken before this (CLOCK_MONOTONIC, ns) were named: a
    /// child that ended earlier needs its memory no more for its stacks.
    samples_named_until_ns: u64,
    /// Children seen to end (their process descriptor ready), in the order
    /// they were, whose memory was not read yet as they ended.
    ended_held: std::collections::VecDeque<usize>,
    /// Handed over past the limits, or refused (wrong user, not a memfd
    /// of the right size).
    refused: u64,
}

impl Received {
    /// Lets go of the memory of up to [`LET_GO_AT_ONCE`] children that
    /// ended, the first taken first, keeping what it held (read through
    /// `memories`), while the totals kept stay within [`MOST_LET_GO_BYTES`].
    fn let_go_of_ended(&mut self, memories: &ChildMemories) {
        while self.children.get(self.first_held).is_some_and(|child| child.memory.held().is_none()) {
            self.first_held += 1;
        }
        let mut let_go = 0;
        for child in &mut self.children[self.first_held..] {
            if let_go == LET_GO_AT_ONCE || self.let_go_bytes >= MOST_LET_GO_BYTES {
                break;
            }
            let Some(memory) = child.memory.held().filter(|_| child.ended_ns.is_some()) else { continue };
            let totals = memory
                .try_clone()
                .map_err(|e| format!("cannot map its memory: {e}"))
                .and_then(|memory| memories.map(memory).map_err(|e| format!("cannot map its memory: {e}")))
                // What a child claims to hold counts against what is kept: past it, its calls are counted, not timed.
                .and_then(|view| view.totals_within(MOST_LET_GO_BYTES - self.let_go_bytes));
            self.let_go_bytes = self.let_go_bytes.saturating_add(totals.as_ref().map_or(0, Totals::bytes)).min(MOST_LET_GO_BYTES);
            child.memory = Memory::LetGo(totals.map(Arc::new));
            child.process = None;
            self.held -= 1;
            let_go += 1;
        }
    }

    /// The next child seen to end whose memory is held and whose samples
    /// were all named, with a copy of its memory's descriptor and the
    /// bytes its totals may take; none when the first to end is not yet named.
    fn next_ended(&mut self) -> Option<(usize, OwnedFd, u64)> {
        while let Some(&at) = self.ended_held.front() {
            let child = &self.children[at];
            if child.ended_ns.is_none_or(|ended| ended >= self.samples_named_until_ns) {
                return None;
            }
            self.ended_held.pop_front();
            let Some(Ok(memory)) = child.memory.held().map(OwnedFd::try_clone) else { continue };
            return Some((at, memory, MOST_LET_GO_BYTES.saturating_sub(self.let_go_bytes)));
        }
        None
    }

    /// Keeps `totals` for child `at` and lets its memory go, unless it was already.
    fn keep_totals(&mut self, at: usize, totals: Totals) {
        let Some(child) = self.children.get_mut(at).filter(|child| child.memory.held().is_some()) else { return };
        self.let_go_bytes = self.let_go_bytes.saturating_add(totals.bytes()).min(MOST_LET_GO_BYTES);
        child.memory = Memory::LetGo(Ok(Arc::new(totals)));
        child.process = None;
        self.held -= 1;
    }
}

/// Reads up to [`LET_GO_BESIDE`] children seen to end whose samples were
/// all named, and lets their memory go, beside the program rather than all
/// at the end of the recording (a shell forks hundreds). Each is read
/// without the lock that the recording's readers take. One whose totals do
/// not fit what may be kept, or cannot be read, stays held: it is read at
/// the end, with the budget of a process of its own, or said not to be.
fn let_go_of_ended_beside(memories: &ChildMemories) {
    let lock = || memories.received.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..LET_GO_BESIDE {
        let Some((at, memory, budget)) = lock().next_ended() else { return };
        let Ok(totals) = memories.map(memory).and_then(|view| view.totals_within(budget).map_err(io::Error::other)) else { continue };
        if totals.over_budget == 0 {
            lock().keep_totals(at, totals);
        }
    }
}

/// The socket forked children send their memory to, and what came.
pub struct Children {
    name: [u8; NAME_BYTES],
    /// The second socket's path, and the directory that holds it.
    path: Option<(SocketPath, tempfile::TempDir)>,
    /// The abstract socket, then the one with a path.
    listeners: Arc<Vec<OwnedFd>>,
    received: Arc<Mutex<Received>>,
    accepting: Option<JoinHandle<()>>,
}

impl Children {
    /// Listens for the children of a process of user `uid` whose shared
    /// memory is laid out as `geometry` says, at `remote` in the process.
    pub fn listen(uid: u32, geometry: Geometry, remote: u64) -> io::Result<Children> {
        crate::target::raise_open_files_limit();
        let name = random_name()?;
        let mut listeners = vec![listening_at(&UnixAddr::new_abstract(&name)?)?];
        // Without it, a child in a network namespace of its own is counted, not recorded.
        let path = listening_at_a_path().ok().map(|(path, dir, listener)| {
            listeners.push(listener);
            (path, dir)
        });
        let listeners = Arc::new(listeners);
        let received = Arc::new(Mutex::new(Received::default()));
        let accepting = {
            let listeners = listeners.clone();
            let memories = ChildMemories { received: received.clone(), geometry, remote };
            std::thread::Builder::new().name("proftap-forks".into()).spawn(move || accept_children(&listeners, uid, &memories))?
        };
        Ok(Children { name, path, listeners, received, accepting: Some(accepting) })
    }

    /// The socket's name, for the runtime's configuration.
    pub fn name(&self) -> [u8; NAME_BYTES] {
        self.name
    }

    /// The second socket's path, for the runtime's configuration (all
    /// zero: none).
    pub fn path(&self) -> SocketPath {
        self.path.as_ref().map_or_else(SocketPath::default, |(path, _)| *path)
    }

    /// Stops taking children: a child that forks from now on runs unrecorded.
    pub fn stop(&mut self) {
        // Wakes the accepting thread (accept on a shut down listener fails).
        shut_down(&self.listeners);
        if let Some(thread) = self.accepting.take() {
            let _ = thread.join();
        }
    }

    /// The children still running, with a descriptor of each process.
    pub fn running(&self) -> Vec<(i32, OwnedFd)> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received
            .children
            .iter()
            .filter_map(|child| Some((child.pid, child.process.as_ref()?)))
            .filter(|(_, process)| !crate::target::has_exited(process))
            .filter_map(|(pid, process)| Some((pid, process.try_clone().ok()?)))
            .collect()
    }

    /// The file of the memory child `pid` handed over, which it maps
    /// for as long as it runs the image it forked with.
    pub fn memory_file(&self, pid: i32) -> Option<super::remote::FileId> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        // The latest with that pid: an earlier one ended, its pid reused.
        let child = received.children.iter().rev().find(|c| c.pid == pid)?;
        super::remote::file_of(child.memory.held()?).ok()
    }

    /// Each child after the first `first` so far, with a view of its
    /// memory laid out as the parent's (`geometry`, at `remote` in the
    /// process) and when it ended, and how many were refused or past the limit.
    pub fn views(&self, first: usize, geometry: Geometry, remote: u64) -> (Vec<ChildView>, u64) {
        let memories = self.memories(geometry, remote);
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let views = received
            .children
            .iter()
            .enumerate()
            .skip(first)
            .map(|(index, child)| ChildView { pid: child.pid, ended_ns: child.ended_ns, index, memories: memories.clone() })
            .collect();
        (views, received.refused)
    }

    /// A handle that finds a child's memory by its process id, for
    /// another thread (the memory of those to come included).
    pub fn memories(&self, geometry: Geometry, remote: u64) -> ChildMemories {
        ChildMemories { received: self.received.clone(), geometry, remote }
    }
}

/// The memory of each forked child, by process id (see [`Children::memories`]).
#[derive(Clone)]
pub struct ChildMemories {
    received: Arc<Mutex<Received>>,
    geometry: Geometry,
    remote: u64,
}

impl ChildMemories {
    /// Every sample taken before `ns` (CLOCK_MONOTONIC) was named: the
    /// memory of a child that ended before may be let go.
    pub fn samples_named_until(&self, ns: u64) {
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        received.samples_named_until_ns = received.samples_named_until_ns.max(ns);
    }

    /// A view of the memory of child `pid` forked at `forked_ns` (CLOCK_MONOTONIC),
    /// if it handed it over: not that of an earlier child whose pid it reuses.
    pub fn view(&self, pid: i32, forked_ns: u64) -> Option<TotalsView> {
        let memory = {
            let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
            let mut with_pid = received.children.iter().filter(|c| c.pid == pid);
            // The first to hand over after that fork (a later one with the
            // pid forked later); the last, where the fork is not known.
            let child = if forked_ns == 0 { with_pid.next_back() } else { with_pid.find(|c| c.taken_ns >= forked_ns) };
            child?.memory.held()?.try_clone().ok()?
        };
        self.map(memory).ok()
    }

    /// A view of a child's memory, laid out as the parent's.
    fn map(&self, memory: OwnedFd) -> io::Result<TotalsView> {
        let shared = Shared::map(memory, self.geometry.shared_bytes() as usize, self.remote)?;
        Ok(TotalsView::new(shared, self.geometry))
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A socket listening at `address` for children.
fn listening_at(address: &UnixAddr) -> io::Result<OwnedFd> {
    let listener = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    bind(listener.as_raw_fd(), address)?;
    listen(&listener, Backlog::new(128)?)?;
    Ok(listener)
}

/// A socket listening at a path in a new directory of the temporary one,
/// that any process may reach (as the abstract name): what connects is
/// checked as it is there. The directory lists nothing but to its owner.
fn listening_at_a_path() -> io::Result<(SocketPath, tempfile::TempDir, OwnedFd)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("proftap-forks-").tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    let path = dir.path().join("children");
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= SocketPath::BYTES || bytes.contains(&0) {
        return Err(io::Error::other("the temporary directory's path is too long for a socket"));
    }
    let listener = listening_at(&UnixAddr::new(&path)?)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let mut named = SocketPath::default();
    named.0[..bytes.len()].copy_from_slice(bytes);
    Ok((named, dir, listener))
}

/// Shuts `listeners` down: children are refused from now on.
fn shut_down(listeners: &[OwnedFd]) {
    for listener in listeners {
        let _ = shutdown(listener.as_raw_fd(), Shutdown::Both);
    }
}

/// `proftap-` and 24 random hex digits: not to be guessed before it exists.
fn random_name() -> io::Result<[u8; NAME_BYTES]> {
    let mut random = [0u8; 12];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let text = format!("proftap-{}", random.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let mut name = [0u8; NAME_BYTES];
    name.copy_from_slice(text.as_bytes());
    Ok(name)
}

/// Takes children as they connect, and notes when each one taken ends,
/// until the listener is shut down.
fn accept_children(listeners: &[OwnedFd], uid: u32, memories: &ChildMemories) {
    let received = &memories.received;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    // Children taken and not yet seen to end, by their place in `received`.
    let mut watched: Vec<(usize, OwnedFd)> = Vec::new();
    loop {
        let mut ready = listeners
            .iter()
            .map(|listener| listener.as_fd())
            .chain(watched.iter().map(|(_, process)| process.as_fd()))
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect::<Vec<_>>();
        match poll(&mut ready, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            // Children are refused from now on, at once rather than at their timeout.
            Err(_) => {
                shut_down(listeners);
                break;
            }
        }
        let now = super::clock::monotonic_ns();
        let (listening, watching) = ready.split_at(listeners.len());
        let listeners_ready: Vec<bool> = listening.iter().map(|fd| fd.any().unwrap_or(true)).collect();
        let ended: Vec<bool> = watching.iter().map(|fd| fd.any().unwrap_or(false)).collect();
        drop(ready);
        if ended.contains(&true) {
            let mut received = received.lock().unwrap_or_else(|e| e.into_inner());
            let mut ended = ended.into_iter();
            watched.retain(|(at, _)| {
                let gone = ended.next().unwrap_or(false);
                if gone && let Some(child) = received.children.get_mut(*at) {
                    child.ended_ns = Some(now);
                    received.ended_held.push_back(*at);
                }
                !gone
            });
        }
        let_go_of_ended_beside(memories);
        let ready = listeners.iter().zip(listeners_ready).filter(|(_, ready)| *ready);
        if !ready.fold(true, |open, (listener, _)| open && accept_child(listener, uid, memories, &mut watched)) {
            // Children that connected before are taken, from every listener
            // (a shut down listener gives those it holds, then fails): a
            // recording that ends before this thread had its turn loses none.
            shut_down(listeners);
            for listener in listeners {
                while accept_child(listener, uid, memories, &mut watched) {}
            }
            break;
        }
    }
}

/// Takes one connecting child; false once the listener is shut down.
fn accept_child(listener: &OwnedFd, uid: u32, memories: &ChildMemories, watched: &mut Vec<(usize, OwnedFd)>) -> bool {
    let fd = match accept(listener.as_raw_fd()) {
        Ok(fd) => fd,
        Err(Errno::EINTR | Errno::ECONNABORTED | Errno::EAGAIN) => return true,
        // Shut down, or out of descriptors: children are refused from now on.
        Err(_) => {
            let _ = shutdown(listener.as_raw_fd(), Shutdown::Both);
            return false;
        }
    };
    // SAFETY: accept just made this descriptor.
    let connection = unsafe { OwnedFd::from_raw_fd(fd) };
    let child = take_child(&connection, uid, memories.geometry.shared_bytes());
    let mut received = memories.received.lock().unwrap_or_else(|e| e.into_inner());
    if child.is_some() && received.held >= MOST_HELD_CHILDREN {
        received.let_go_of_ended(memories);
    }
    match child {
        Some(child) if received.held < MOST_HELD_CHILDREN && received.children.len() < MOST_CHILDREN => {
            if let Some(Ok(process)) = child.process.as_ref().map(OwnedFd::try_clone) {
                watched.push((received.children.len(), process));
            }
            received.children.push(child);
            received.held += 1;
            drop(received);
            // A child whose calls in progress end when it is seen to end
            // (no time off CPU) waits for this, so as not to end unseen.
            let _ = send(connection.as_raw_fd(), &[1], MsgFlags::MSG_NOSIGNAL);
        }
        _ => received.refused += 1,
    }
    true
}

/// The memory a connected child sends, if it is what a child of the
/// target's would send.
fn take_child(connection: &OwnedFd, uid: u32, bytes: u64) -> Option<Child> {
    let credentials = getsockopt(connection, sockopt::PeerCredentials).ok()?;
    if credentials.uid() != uid && credentials.uid() != 0 {
        return None;
    }
    setsockopt(connection, sockopt::ReceiveTimeout, &TimeVal::new(1, 0)).ok()?;
    let mut pid = [0u8; 8];
    let mut space = cmsg_space!([RawFd; 1]);
    let mut buffers = [IoSliceMut::new(&mut pid)];
    let message = recvmsg::<()>(connection.as_raw_fd(), &mut buffers, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).ok()?;
    let mut descriptors: Vec<OwnedFd> = Vec::new();
    for control in message.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = control {
            // SAFETY: the kernel installed these descriptors for us.
            descriptors.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let [memory] = <[OwnedFd; 1]>::try_from(descriptors).ok()?;
    seal(&memory, bytes).ok()?;
    let process = peer_process(connection, credentials.pid());
    let taken_ns = super::clock::monotonic_ns();
    let ended_ns = process.is_none().then_some(taken_ns);
    Some(Child { pid: credentials.pid(), process, memory: Memory::Held(memory), taken_ns, ended_ns })
}

/// A descriptor of the process at the other end of `connection`, which
/// connected as process `pid`: the kernel's own (`SO_PEERPIDFD`), which is
/// that process even after it ended and its pid was taken again; none for
/// one the kernel says has ended. Where the kernel has no such option
/// (before 6.5), the process of that pid if it runs still (a pid is taken
/// again only once its parent waited for it, and pids went round).
fn peer_process(connection: &OwnedFd, pid: i32) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let got = unsafe { libc::getsockopt(connection.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERPIDFD, (&raw mut fd).cast(), &mut len) };
    if got == 0 && fd >= 0 {
        // SAFETY: the kernel just made this descriptor for us.
        return Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    match Errno::last() {
        // Ended and reaped (refused so before 6.17).
        Errno::ESRCH | Errno::EINVAL => None,
        _ => crate::target::pidfd(pid).ok(),
    }
}

/// Seals a memfd against shrinking (a mapping of memory that shrank would
/// fault on reading) after checking it is one, of `bytes` bytes.
fn seal(memory: &OwnedFd, bytes: u64) -> io::Result<()> {
    let fd = memory.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let size = std::fs::File::from(memory.try_clone()?).metadata()?.len();
    if size != bytes {
        return Err(io::Error::other(format!("{size} bytes, not {bytes}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A memfd the size of a child's memory, with `magic` as its header's.
    fn memory(geometry: Geometry, magic: u64) -> OwnedFd {
        // SAFETY: memfd_create takes a name and flags.
        let fd = unsafe { libc::memfd_create(c"child".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: the kernel just gave us this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(fd.try_clone().expect("a copy"));
        file.set_len(geometry.shared_bytes()).expect("sized");
        file.write_all_at(&magic.to_ne_bytes(), std::mem::offset_of!(super::super::totals::Header, magic) as u64).expect("written");
        fd
    }

    /// A child's memory is read and let go beside the program once it
    /// ended, but only after every sample taken before its end was named
    /// (those samples' stacks are read through its memory); one that cannot
    /// be read stays held, for the end of the recording to say so.
    #[test]
    fn an_ended_childs_memory_is_let_go_only_once_its_samples_were_named() {
        let geometry = Geometry { functions: 1, blocks: 1, ..Geometry::default() };
        let memories = ChildMemories { received: Arc::default(), geometry, remote: 0 };
        let held = |at: usize| memories.received.lock().expect("not poisoned").children[at].memory.held().is_some();
        {
            let mut received = memories.received.lock().expect("not poisoned");
            for (pid, magic, ended_ns) in [(7, super::super::totals::MAGIC, 100), (8, 0, 90)] {
                let child =
                    Child { pid, process: None, memory: Memory::Held(memory(geometry, magic)), taken_ns: 10, ended_ns: Some(ended_ns) };
                received.children.push(child);
                received.held += 1;
            }
            received.ended_held.extend([1, 0]);
        }
        let_go_of_ended_beside(&memories);
        assert!(held(0) && held(1), "let go before their samples were named");
        memories.samples_named_until(100);
        let_go_of_ended_beside(&memories);
        assert!(held(0), "let go with a sample taken as it ended unnamed");
        memories.samples_named_until(101);
        let_go_of_ended_beside(&memories);
        assert!(!held(0), "held after its samples were named");
        assert!(held(1), "a memory that cannot be read was let go");
        assert_eq!(memories.received.lock().expect("not poisoned").held, 1);
        // What was read is what a view gives.
        let view = ChildView { pid: 7, ended_ns: Some(100), index: 0, memories: memories.clone() };
        assert!(view.totals().is_ok_and(|totals| totals.threads.is_empty()), "{:?}", view.totals().err());
    }
}

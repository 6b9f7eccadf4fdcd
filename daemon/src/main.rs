//! `proftapd`: runs proftap profiling sessions for local users over a Unix
//! socket. Sessions outlive the clients that start them; a user profiles
//! only what that user could ptrace, and profiles come back over the socket.
//! The protocol is in `docs/PROTOCOL.md`.

use clap::Parser;
use proftap_record::protocol::{Hello, PROTOCOL_VERSION, Request, Response, State, default_socket};
use proftapd::access::Peer;
use proftapd::connection::{Counts, Lines};
use proftapd::messages::Limits;
use proftapd::sessions::{self, Registry, Shared, StartRequest};
use proftapd::worker;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};

/// Runs proftap profiling sessions for local users over a Unix socket.
#[derive(Parser)]
#[command(name = "proftapd", version, about)]
struct Args {
    /// The socket to listen on (default /run/proftap/proftapd.sock as root,
    /// else $XDG_RUNTIME_DIR/proftap.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Where ended sessions' profiles are kept (default /var/lib/proftap as
    /// root, else ~/.local/state/proftap).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Ended sessions kept; the oldest go first.
    #[arg(long, value_name = "N", default_value_t = 50)]
    keep: usize,
    /// Sessions recording at once per user (root: no limit).
    #[arg(long, value_name = "N", default_value_t = 4)]
    max_sessions: usize,
    /// Functions probed per session (root: no limit).
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    max_functions: usize,
    /// Ring buffer per CPU, MiB, a session may ask for (root: no limit).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    max_buffer: usize,
    /// Uprobes placed at once per session (root: no limit).
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    max_probes: usize,
    /// The largest profile kept per session, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    max_profile: usize,
    /// Connections open at once per user.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_connections: usize,
}

fn default_state_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/lib/proftap")
    } else {
        std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(std::env::temp_dir)
            .join("proftap")
    }
}

fn main() -> ExitCode {
    // proftap measuring its own probe cost runs itself this way.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(proftap_record::calibration::HELPER_ARGUMENT) {
        let Some(out) = argv.get(2) else { return ExitCode::from(2) };
        return match std::fs::write(out, proftap_record::calibration::helper_main()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    }
    // Each session is recorded by proftapd run this way (see worker.rs).
    if argv.get(1).map(String::as_str) == Some(worker::ARGUMENT) {
        return worker::main(&argv[2..]);
    }
    // Packaging writes the man page this way.
    if argv.get(1).map(String::as_str) == Some("__generate-man") {
        use clap::CommandFactory;
        let Some(dir) = argv.get(2) else { return ExitCode::from(2) };
        let page = Args::command().name("proftapd");
        let mut out = Vec::new();
        let written = clap_mangen::Man::new(page).section("8").render(&mut out).is_ok()
            && std::fs::write(std::path::Path::new(dir).join("proftapd.8"), out).is_ok();
        return if written { ExitCode::SUCCESS } else { ExitCode::from(2) };
    }
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("proftapd: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proftapd: {}", proftap_record::error::sentence(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    use anyhow::Context;
    let socket = args.socket.clone().unwrap_or_else(default_socket);
    let state_dir = args.state_dir.clone().unwrap_or_else(default_state_dir);
    let limits = Limits {
        sessions_per_user: args.max_sessions,
        functions: args.max_functions,
        probes: args.max_probes,
        buffer_mib: args.max_buffer,
        profile_mib: args.max_profile,
    };
    let registry =
        Registry::open(state_dir.clone(), args.keep, limits).with_context(|| format!("cannot use {} for profiles", state_dir.display()))?;
    let listener = listen(&socket)?;
    eprintln!("proftapd: listening on {}, profiles kept in {}", socket.display(), state_dir.display());

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let counts = Counts::default();
    let mut refusals = Refusals::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (registry, counts, most) = (registry.clone(), counts.clone(), args.max_connections);
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, registry, counts, most).await {
                            eprintln!("proftapd: a connection ended: {e}");
                        }
                    });
                }
                // Out of descriptors or memory: wait for connections to end
                // rather than spin, and say so once in a while.
                Err(e) => {
                    refusals.note(&e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    // Stop: every session ends, its program runs on and its profile is kept.
    drop(listener);
    let _ = std::fs::remove_file(&socket);
    if let Ok(r) = registry.lock() {
        r.stop_all();
    }
    // A worker that does not end is killed after the grace period; its
    // session ends then, so this wait is bounded too.
    let deadline = Instant::now() + sessions::STOP_GRACE + Duration::from_secs(5);
    while registry.lock().is_ok_and(|r| r.any_live()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("proftapd: stopped; every session's profile is kept in {}", state_dir.display());
    Ok(())
}

/// Failed accepts, told at most every ten seconds.
#[derive(Default)]
struct Refusals {
    since: Option<Instant>,
    count: u64,
}

impl Refusals {
    fn note(&mut self, error: &std::io::Error) {
        self.count += 1;
        if self.since.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            eprintln!("proftapd: cannot accept connections ({error}); {} refused since the last report", self.count);
            self.since = Some(Instant::now());
            self.count = 0;
        }
    }
}

/// Listens on `socket`, which any local user may connect to; replaces a
/// socket file no daemon answers on.
fn listen(socket: &std::path::Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            anyhow::bail!("another proftapd is listening on {}", socket.display());
        }
        std::fs::remove_file(socket).with_context(|| format!("cannot replace {}", socket.display()))?;
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("cannot listen on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot open {} to every user", socket.display()))?;
    Ok(listener)
}

async fn send<T: serde::Serialize>(out: &mut tokio::net::unix::OwnedWriteHalf, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await
}

async fn connection(stream: UnixStream, registry: Shared, counts: Counts, most: usize) -> std::io::Result<()> {
    let credentials = stream.peer_cred()?;
    let peer = Peer { uid: credentials.uid(), gid: credentials.gid(), pid: credentials.pid() };
    let (read, mut write) = stream.into_split();
    let counted = counts.admit(peer.uid, most);
    let mut lines = Lines::new(read);
    let ours = Hello { protocol: PROTOCOL_VERSION, program: format!("proftapd {}", env!("CARGO_PKG_VERSION")) };
    let Some((line, _)) = lines.next().await? else { return Ok(()) };
    send(&mut write, &ours).await?;
    if counted.is_none() {
        // Answers the request it was sent with, then hangs up.
        let _ = lines.next().await;
        let refusal = Response::Error { message: format!("you have {most} connections to proftapd open, the most it takes from one user") };
        return send(&mut write, &refusal).await;
    }
    match serde_json::from_str::<Hello>(&line) {
        Ok(hello) if hello.protocol == PROTOCOL_VERSION => {}
        // The client sees our version in our hello and says so.
        _ => return Ok(()),
    }
    while let Some((line, fds)) = lines.next().await? {
        let (response, data) = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Fetch { id }) => fetch(id, &peer, &registry),
            Ok(request) => (handle(request, fds, &peer, &registry).await, None),
            Err(e) => (Response::Error { message: format!("proftapd cannot read this request: {e}") }, None),
        };
        send(&mut write, &response).await?;
        if let Some(data) = data {
            // A profile's bytes follow its reply.
            write.write_all(&data).await?;
        }
    }
    Ok(())
}

async fn handle(request: Request, stdio: Vec<std::os::fd::OwnedFd>, peer: &Peer, registry: &Shared) -> Response {
    let error = |message: String| Response::Error { message };
    let locked = || registry.lock().map_err(|_| "proftapd is shutting down".to_string());
    match request {
        Request::Start { request } => {
            let id = match sessions::start(registry, *peer, StartRequest { request, stdio }) {
                Ok(id) => id,
                Err(message) => return error(message),
            };
            // Wait until the probes are live, or the session failed.
            loop {
                let info = match locked().and_then(|r| r.status(peer, id)) {
                    Ok(info) => info,
                    Err(message) => return error(message),
                };
                match info.state {
                    State::Running => return Response::Session(info),
                    State::Failed => {
                        if let Ok(mut r) = locked() {
                            r.forget(id);
                        }
                        return error(info.error.unwrap_or_else(|| "the session failed".into()));
                    }
                    // A session can end before it is seen running: it did run.
                    State::Finished => return Response::Session(info),
                    State::Starting => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }
        Request::List => locked().map_or_else(error, |r| Response::Sessions(r.list(peer))),
        Request::Status { id } => locked().and_then(|r| r.status(peer, id)).map_or_else(error, Response::Session),
        Request::Stop { id } => {
            if let Err(message) = locked().and_then(|r| r.stop(peer, id)) {
                return error(message);
            }
            ended(id, peer, registry).await
        }
        Request::Wait { id } => ended(id, peer, registry).await,
        Request::Fetch { id } => fetch(id, peer, registry).0,
        Request::Delete { id } => locked().and_then(|mut r| r.delete(peer, id)).map_or_else(error, |()| Response::Deleted { id }),
    }
}

/// The session once it has ended and its profile is kept (or it failed).
async fn ended(id: u64, peer: &Peer, registry: &Shared) -> Response {
    loop {
        match registry.lock().map_err(|_| "proftapd is shutting down".to_string()).and_then(|r| r.status(peer, id)) {
            Ok(info) if matches!(info.state, State::Finished | State::Failed) => return Response::Session(info),
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(message) => return Response::Error { message },
        }
    }
}

/// A finished session's profile: the reply, and the bytes to follow it.
fn fetch(id: u64, peer: &Peer, registry: &Shared) -> (Response, Option<Vec<u8>>) {
    let path = match registry.lock().map_err(|_| "proftapd is shutting down".to_string()).and_then(|r| r.profile(peer, id)) {
        Ok(path) => path,
        Err(message) => return (Response::Error { message }, None),
    };
    match std::fs::read(&path) {
        Ok(data) => (Response::Profile { bytes: data.len() as u64 }, Some(data)),
        Err(e) => (Response::Error { message: format!("session {id}'s profile is gone from {}: {e}", path.display()) }, None),
    }
}

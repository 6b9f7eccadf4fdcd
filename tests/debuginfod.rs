//! Debug info fetched from a debuginfod server (elfutils' own, on
//! loopback) for a stripped program: profiled by function name with line
//! counts, named by `proftap symbols`, and served from the cache once the
//! server is gone.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// elfutils' `debuginfod` serving the debug files of a directory, killed
/// whichever way the test ends.
struct Server {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Server {
    /// Starts the server on `dir` and waits until it serves `build_id`.
    fn start(dir: &Path, work: &Path, build_id: &str) -> Server {
        require("debuginfod", "to serve debug info over HTTP as distributions do");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = work.join("debuginfod.log");
        let child = Command::new("debuginfod")
            .args(["-p", &port.to_string(), "-F", "-t", "0", "-g", "0", "-d"])
            .arg(work.join("debuginfod.sqlite"))
            .arg(dir)
            // No federation: a server that lacks a file must answer 404 itself.
            .env_remove("DEBUGINFOD_URLS")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start debuginfod: {e}"));
        let server = Server { child, url: format!("http://127.0.0.1:{port}"), log };
        server.wait_for(build_id);
        server
    }

    /// Polls until the file is served: the server indexes `dir` after it starts.
    fn wait_for(&self, build_id: &str) {
        let path = format!("/buildid/{build_id}/debuginfo");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if status(&self.url, &path) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("debuginfod did not serve {path} within a minute:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
    }
}

impl Server {
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The HTTP status of `GET url/path` (debuginfod answers GET only), without
/// reading the body; `None`
/// while nothing answers.
fn status(url: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(url.strip_prefix("http://")?).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn build_id(binary: &Path) -> String {
    let out = run_ok(Command::new("readelf").arg("-n").arg(binary));
    out.lines().find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string)).expect("a build-id")
}

/// `calls.c` built with -g, its DWARF moved to `served/` and the program
/// stripped of everything but its dynamic symbols, as distributions ship.
fn stripped_calls(dir: &Path, name: &str, opt: &'static str) -> (PathBuf, String) {
    require("objcopy", "to split debug info off a program");
    let binary = dir.join(name);
    Build::c("calls.c", opt).compile_to(&binary);
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let debug = served.join(format!("{name}.debug"));
    run_ok(Command::new("objcopy").arg("--only-keep-debug").arg(&binary).arg(&debug));
    run_ok(Command::new("strip").arg("--strip-all").arg(&binary));
    let id = build_id(&binary);
    (binary, id)
}

/// `proftap ARGS` with the debuginfod settings given (and no others).
fn with_debuginfod(args: &[&str], urls: Option<&str>, cache: &Path) -> Output {
    let mut cmd = proftap();
    cmd.args(args).env_remove("DEBUGINFOD_URLS").env("DEBUGINFOD_CACHE_PATH", cache).env("DEBUGINFOD_TIMEOUT", "20");
    if let Some(urls) = urls {
        cmd.env("DEBUGINFOD_URLS", urls);
    }
    run(&mut cmd)
}

fn succeeded(out: Output) -> (String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed ({}):\n{stderr}", out.status);
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// Records `leaf` with line counts; returns the report and proftap's stderr.
fn record_leaf(binary: &Path, urls: Option<&str>, cache: &Path, work: &Path) -> (serde_json::Value, String) {
    let profile = work.join("leaf.profile");
    let _ = std::fs::remove_file(&profile);
    let args = ["run", "-f", "leaf", "--lines", "-o", profile.to_str().unwrap(), "--", binary.to_str().unwrap(), "1000"];
    let (_, stderr) = succeeded(with_debuginfod(&args, urls, cache));
    (report_json(&profile), stderr)
}

/// leaf is called 2000 times (1000 from left, 2 x 500 from right), and its
/// source lines are counted.
fn check_leaf(report: &serde_json::Value) {
    assert_eq!(calls_by_name(report)["leaf"], 2000, "{report}");
    let counted: Vec<&serde_json::Value> = report["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["file"].as_str().unwrap().ends_with("calls.c") && l["count"].as_u64().unwrap() > 0)
        .collect();
    assert!(!counted.is_empty(), "no line of calls.c counted: {}", report["lines"]);
    let sink = std::fs::read_to_string(examples().join("calls.c")).unwrap().lines().position(|l| l.contains("sink += x;")).unwrap() + 1;
    let line = counted.iter().find(|l| l["line"] == sink as u64).unwrap_or_else(|| panic!("line {sink} not counted: {counted:?}"));
    assert_eq!(line["count"], 2000, "{line}");
}

#[test]
fn a_stripped_program_is_profiled_with_debug_info_from_debuginfod_then_from_its_cache() {
    require_probes();
    let work = tempfile::tempdir().unwrap();
    let (binary, id) = stripped_calls(work.path(), "calls", "-O1");
    let b = binary.to_str().unwrap();
    let mut server = Server::start(&work.path().join("served"), work.path(), &id);
    let url = server.url.clone();

    // Without DEBUGINFOD_URLS nothing is fetched: leaf is not even a name.
    let nowhere = work.path().join("unused-cache");
    let out = with_debuginfod(&["run", "-f", "leaf", "--", b, "10"], None, &nowhere);
    assert!(!out.status.success(), "leaf found without debug info:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!nowhere.exists(), "a cache was made with no server to ask");

    // `proftap symbols` says where the debug info came from.
    let shown = work.path().join("symbols-cache");
    let (json, _) = succeeded(with_debuginfod(&["symbols", b, "--format", "json"], Some(&url), &shown));
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let debug_info = &json["modules"][0]["debug_info"];
    let cached = shown.join(&id).join("debuginfo");
    assert_eq!(debug_info["kind"], "debuginfod", "{debug_info}");
    assert_eq!(debug_info["path"], cached.to_str().unwrap());
    assert_eq!(debug_info["server"], url.as_str());
    assert!(json["functions"].as_array().unwrap().iter().any(|f| f["name"] == "leaf" && f["file"].is_string()), "{json}");

    // A run downloads into its cache and profiles leaf with its lines.
    let cache = work.path().join("cache");
    let (report, stderr) = record_leaf(&binary, Some(&url), &cache, work.path());
    check_leaf(&report);
    assert!(cache.join(&id).join("debuginfo").is_file(), "nothing cached:\n{stderr}");

    // Gone the server, the cache serves the next run, as it serves gdb's and perf's.
    server.stop();
    let (report, stderr) = record_leaf(&binary, Some(&url), &cache, work.path());
    check_leaf(&report);
    assert!(!stderr.contains("debuginfod") && !stderr.contains("cannot fetch"), "{stderr}");
    let (text, _) = succeeded(with_debuginfod(&["symbols", b], Some(&url), &cache));
    let expected = format!("debug info: {} (debuginfod cache)", cache.join(&id).join("debuginfo").display());
    assert!(text.lines().next().unwrap().contains(&expected), "{text}");
}

#[test]
fn a_build_id_the_server_lacks_is_a_warning_naming_it_and_the_server() {
    let work = tempfile::tempdir().unwrap();
    let (_, served_id) = stripped_calls(work.path(), "calls", "-O1");
    let server = Server::start(&work.path().join("served"), work.path(), &served_id);
    // Another build, whose debug info the server never saw (its symbol table kept).
    let other = work.path().join("other");
    Build::c("calls.c", "-O0").compile_to(&other);
    run_ok(Command::new("strip").arg("--strip-debug").arg(&other));
    let other_id = build_id(&other);
    assert_ne!(other_id, served_id);

    let cache = work.path().join("cache");
    let (text, stderr) = succeeded(with_debuginfod(&["symbols", other.to_str().unwrap()], Some(&server.url), &cache));
    let expected = format!("no debuginfod server has the debug info of {} (build-id {other_id}; asked {})", other.display(), server.url);
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(text.lines().next().unwrap().contains("no debug info"), "{text}");
    assert!(!cache.join(&other_id).join("debuginfo").exists());
}

#[test]
fn a_session_downloads_as_its_user_into_their_cache_and_never_as_root() {
    use proftap_tests::daemon::{Daemon, shared_copies, test_user};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    require_probes();
    let (uid, gid) = test_user();
    let (shared, copies) = shared_copies(&[&binary("proftap")]);
    let (binary, id) = stripped_calls(shared.path(), "calls", "-O1");
    let server = Server::start(&shared.path().join("served"), shared.path(), &id);
    let daemon = Daemon::start(shared.path());
    let start = |cache: &Path| {
        run(Command::new(&copies[0])
            .uid(uid)
            .gid(gid)
            .env("DEBUGINFOD_URLS", &server.url)
            .env("DEBUGINFOD_CACHE_PATH", cache)
            .args(["session", "--socket"])
            .arg(&daemon.socket)
            .args(["start", "-f", "leaf", "--"])
            .arg(&binary)
            .arg("10"))
    };

    // The user's cache: the worker, as the user, fills it.
    let users = shared.path().join("users-cache");
    std::fs::create_dir(&users).unwrap();
    run_ok(Command::new("chown").arg(format!("{uid}:{gid}")).arg(&users));
    let out = start(&users);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("1 function probed"), "{stderr}");
    let cached = users.join(&id).join("debuginfo");
    let meta = cached.metadata().unwrap_or_else(|e| panic!("{}: {e}\n{stderr}", cached.display()));
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "the cache entry is the user's");

    // A cache only root may write: the user's session cannot write there.
    let roots = shared.path().join("roots-cache");
    std::fs::create_dir(&roots).unwrap();
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = start(&roots);
    assert!(!out.status.success(), "leaf found with no debug info to read:\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(&roots).unwrap().count(), 0, "something was written as root into {}", roots.display());
}

use super::*;
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

fn settings_from(vars: &[(&str, &str)]) -> (Option<Debuginfod>, Vec<String>) {
    let vars: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
    Debuginfod::from_vars(|name| vars.get(name).cloned())
}

#[test]
fn without_debuginfod_urls_nothing_is_asked() {
    let (settings, warnings) = settings_from(&[("HOME", "/home/u"), ("DEBUGINFOD_CACHE_PATH", "/c")]);
    assert_eq!(settings, None);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(settings_from(&[("DEBUGINFOD_URLS", "  "), ("HOME", "/home/u")]).0, None);
}

#[test]
fn the_cache_is_where_elfutils_puts_it() {
    let urls = ("DEBUGINFOD_URLS", "http://a.example/ https://b.example");
    let cache = |vars: &[(&str, &str)]| settings_from(&[&[urls], vars].concat()).0.map(|s| s.cache);
    assert_eq!(cache(&[("HOME", "/home/u")]), Some(PathBuf::from("/home/u/.cache/debuginfod_client")));
    assert_eq!(cache(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")]), Some(PathBuf::from("/x/debuginfod_client")));
    assert_eq!(
        cache(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x"), ("DEBUGINFOD_CACHE_PATH", "/explicit")]),
        Some(PathBuf::from("/explicit"))
    );
    // elfutils' old location, used while it exists.
    let home = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(home.path().join(".debuginfod_client_cache")).expect("old cache");
    let home_text = home.path().to_str().expect("UTF-8 temp dir");
    assert_eq!(cache(&[("HOME", home_text), ("XDG_CACHE_HOME", "/x")]), Some(home.path().join(".debuginfod_client_cache")));

    let (settings, warnings) = settings_from(&[urls]);
    assert_eq!(settings, None);
    assert!(warnings[0].contains("DEBUGINFOD_CACHE_PATH"), "{warnings:?}");
}

#[test]
fn urls_timeout_and_size_are_read_as_elfutils_reads_them() {
    let (settings, warnings) = settings_from(&[
        ("DEBUGINFOD_URLS", "http://a.example/  ima:enforcing https://b.example:8002"),
        ("HOME", "/home/u"),
        ("DEBUGINFOD_TIMEOUT", "7"),
        ("DEBUGINFOD_MAXSIZE", "1000"),
    ]);
    let settings = settings.expect("settings");
    assert_eq!(settings.urls, ["http://a.example", "https://b.example:8002"]);
    assert_eq!(settings.timeout, Duration::from_secs(7));
    assert_eq!(settings.max_size, 1000);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("\"ima:enforcing\""), "{warnings:?}");

    let (settings, warnings) = settings_from(&[("DEBUGINFOD_URLS", "http://a"), ("HOME", "/h"), ("DEBUGINFOD_TIMEOUT", "soon")]);
    let settings = settings.expect("settings");
    assert_eq!((settings.timeout, settings.max_size), (DEFAULT_TIMEOUT, MAX_DOWNLOAD));
    assert!(warnings[0].contains("DEBUGINFOD_TIMEOUT"), "{warnings:?}");
}

/// A server answering every request with `status` and `body` (with a
/// Content-Length when `length`); the request lines it got.
fn serve(status: &str, body: Vec<u8>, length: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let (status, heard) = (status.to_string(), asked.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = Vec::new();
            let mut byte = [0u8];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            let line = String::from_utf8_lossy(&request).lines().next().unwrap_or_default().to_string();
            heard.lock().expect("requests").push(line);
            let length = if length { format!("Content-Length: {}\r\n", body.len()) } else { String::new() };
            let head = format!("HTTP/1.1 {status}\r\n{length}Connection: close\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
        }
    });
    (url, asked)
}

fn settings_for(urls: Vec<String>, cache: &Path) -> Debuginfod {
    Debuginfod { urls, cache: cache.to_path_buf(), timeout: Duration::from_secs(10), max_size: MAX_DOWNLOAD }
}

/// Every file under `dir`.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { files_in(&e.path()) } else { vec![e.path()] }).collect()
}

const SOME_ID: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn a_server_without_the_build_id_is_a_warning_naming_it_and_the_servers() {
    let (first, asked) = serve("404 Not Found", b"not here".to_vec(), true);
    let (second, _) = serve("404 Not Found", Vec::new(), true);
    let cache = tempfile::tempdir().expect("temp dir");
    let mut warnings = Vec::new();
    let settings = settings_for(vec![first.clone(), second.clone()], cache.path());
    let found = fetch(&settings, SOME_ID, Path::new("/usr/bin/prog"), &Unheard, &mut warnings);
    assert!(found.is_none());
    assert_eq!(asked.lock().expect("requests").as_slice(), [format!("GET /buildid/{SOME_ID}/debuginfo HTTP/1.1")]);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for expected in [SOME_ID, "/usr/bin/prog", &first, &second, "no debuginfod server has"] {
        assert!(warnings[0].contains(expected), "{expected} not in {warnings:?}");
    }
    assert_eq!(files_in(cache.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_file_of_another_build_is_refused_and_never_cached() {
    // This test's own program: an ELF file with DWARF, and not of SOME_ID.
    let exe = std::fs::read(std::env::current_exe().expect("this test's program")).expect("read it");
    let (server, _) = serve("200 OK", exe, true);
    let cache = tempfile::tempdir().expect("temp dir");
    let mut warnings = Vec::new();
    let found = fetch(&settings_for(vec![server.clone()], cache.path()), SOME_ID, Path::new("/bin/prog"), &Unheard, &mut warnings);
    assert!(found.is_none());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains(&format!("refused what {server} sent as the debug info of build-id {SOME_ID}")), "{warnings:?}");
    assert!(warnings[0].contains("build-id"), "{warnings:?}");
    assert_eq!(files_in(cache.path()), Vec::<PathBuf>::new(), "a refused file stays out of the cache");
}

#[test]
fn a_file_that_is_not_elf_is_refused() {
    let (server, _) = serve("200 OK", b"<html>a captive portal</html>".to_vec(), true);
    let cache = tempfile::tempdir().expect("temp dir");
    let mut warnings = Vec::new();
    assert!(fetch(&settings_for(vec![server], cache.path()), SOME_ID, Path::new("/bin/prog"), &Unheard, &mut warnings).is_none());
    assert!(warnings[0].contains("ELF magic"), "{warnings:?}");
    assert_eq!(files_in(cache.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_file_over_the_size_limit_is_refused_whether_or_not_announced() {
    for announced in [true, false] {
        let (server, _) = serve("200 OK", vec![0x7f; 5000], announced);
        let cache = tempfile::tempdir().expect("temp dir");
        let settings = Debuginfod { max_size: 4096, ..settings_for(vec![server], cache.path()) };
        let mut warnings = Vec::new();
        assert!(fetch(&settings, SOME_ID, Path::new("/bin/prog"), &Unheard, &mut warnings).is_none());
        assert!(warnings[0].contains("larger than 4096 bytes, the most proftap accepts"), "{warnings:?}");
        assert_eq!(files_in(cache.path()), Vec::<PathBuf>::new(), "announced: {announced}");
    }
}

#[test]
fn a_server_that_cannot_be_reached_is_a_warning_and_the_next_is_asked() {
    let closed = TcpListener::bind("127.0.0.1:0").expect("listen");
    let unreachable = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let (lacking, _) = serve("404 Not Found", Vec::new(), true);
    let cache = tempfile::tempdir().expect("temp dir");
    let mut warnings = Vec::new();
    let settings = settings_for(vec![unreachable.clone(), lacking.clone()], cache.path());
    assert!(fetch(&settings, SOME_ID, Path::new("/bin/prog"), &Unheard, &mut warnings).is_none());
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].starts_with(&format!("cannot fetch the debug info of build-id {SOME_ID} from {unreachable}: ")), "{warnings:?}");
    assert!(warnings[1].contains(&lacking) && !warnings[1].contains(&unreachable), "{warnings:?}");
}

#[test]
fn a_build_id_that_is_not_hex_never_becomes_a_path() {
    let cache = tempfile::tempdir().expect("temp dir");
    let mut warnings = Vec::new();
    let settings = settings_for(vec!["http://127.0.0.1:9".into()], cache.path());
    assert!(fetch(&settings, "../../etc", Path::new("/bin/prog"), &Unheard, &mut warnings).is_none());
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// Counts what a download reports.
#[derive(Default)]
struct Counted(Mutex<(u32, u64, u32)>);

impl FetchProgress for Counted {
    fn started(&self, _: &str, _: &str, _: Option<u64>) {
        self.0.lock().expect("counts").0 += 1;
    }
    fn received(&self, bytes: u64) {
        self.0.lock().expect("counts").1 = bytes;
    }
    fn ended(&self) {
        self.0.lock().expect("counts").2 += 1;
    }
}

#[test]
fn a_matching_file_is_cached_and_the_cache_serves_it_without_a_server() {
    // This test's own program stands for a debug file: it has DWARF and a build-id.
    let exe = std::env::current_exe().expect("this test's program");
    let bytes = std::fs::read(&exe).expect("read it");
    let id = ElfImage::open(&exe).expect("open").build_id().expect("parse").expect("the linker gave this program a build-id");
    let (server, asked) = serve("200 OK", bytes.clone(), true);
    let cache = tempfile::tempdir().expect("temp dir");
    let progress = Counted::default();
    let mut warnings = Vec::new();
    let settings = settings_for(vec![server.clone()], cache.path());
    let (image, path, from) = fetch(&settings, &id, &exe, &progress, &mut warnings).expect("fetched");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!((path.clone(), from), (cache.path().join(&id).join("debuginfo"), Some(server)));
    assert_eq!(image.path(), path);
    assert_eq!(std::fs::read(&path).expect("cached"), bytes);
    assert_eq!(*progress.0.lock().expect("counts"), (1, bytes.len() as u64, 1));
    assert_eq!(files_in(cache.path()), std::slice::from_ref(&path), "no temporary file left behind");

    let offline = settings.cache_only();
    let (_, again, from) = fetch(&offline, &id, &exe, &Unheard, &mut warnings).expect("from the cache");
    assert_eq!((again, from), (path, None));
    assert_eq!(asked.lock().expect("requests").len(), 1, "the cache was read first");
}

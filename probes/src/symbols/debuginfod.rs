//! Debug info fetched by build-id from debuginfod servers, as gdb, perf and
//! valgrind fetch it (elfutils' `debuginfod-client`): the same environment
//! variables, the same cache, shared with them.
//!
//! What a server sends is hostile input: its size is bounded, it is checked
//! as any separate debug file (an ELF file with DWARF whose build-id is the
//! one asked for) before it enters the cache, and it is only ever read.

use super::elf::ElfImage;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The largest debug file accepted (the biggest distributions ship are a few
/// hundred MiB).
pub const MAX_DOWNLOAD: u64 = 4 << 30;

/// elfutils' default for `DEBUGINFOD_TIMEOUT`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// Where debug info missing on disk is fetched, and kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debuginfod {
    /// Server base URLs, asked in order (empty: the cache is only read).
    pub urls: Vec<String>,
    /// The cache: `<cache>/<build-id>/debuginfo`.
    pub cache: PathBuf,
    /// How long a server may take to connect, answer, or send more data.
    pub timeout: Duration,
    /// The largest file accepted, bytes.
    pub max_size: u64,
}

/// Hears about downloads while they run (a front end shows a progress bar).
pub trait FetchProgress: Send + Sync {
    /// A download of `size` bytes (when the server says) has begun.
    fn started(&self, build_id: &str, server: &str, size: Option<u64>);
    /// `bytes` have arrived so far.
    fn received(&self, bytes: u64);
    /// The download has ended, well or not.
    fn ended(&self);
}

/// Progress nobody hears.
pub struct Unheard;

impl FetchProgress for Unheard {
    fn started(&self, _: &str, _: &str, _: Option<u64>) {}
    fn received(&self, _: u64) {}
    fn ended(&self) {}
}

impl Debuginfod {
    /// The settings elfutils reads from the environment, looked up through
    /// `var`: `DEBUGINFOD_URLS` (none: `None`, and no network use at all),
    /// `DEBUGINFOD_CACHE_PATH`, `DEBUGINFOD_TIMEOUT` and
    /// `DEBUGINFOD_MAXSIZE`. Settings that cannot be honoured are said in
    /// the sentences returned.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> (Option<Debuginfod>, Vec<String>) {
        let text = |name: &str| var(name).map(|v| v.to_string_lossy().trim().to_string()).filter(|v| !v.is_empty());
        let mut warnings = Vec::new();
        let Some(listed) = text("DEBUGINFOD_URLS") else { return (None, warnings) };
        let mut urls = Vec::new();
        for word in listed.split_whitespace() {
            if word.starts_with("http://") || word.starts_with("https://") {
                urls.push(word.trim_end_matches('/').to_string());
            } else {
                warnings.push(format!("ignored {word:?} in DEBUGINFOD_URLS: proftap asks servers over http:// and https:// only"));
            }
        }
        let Some(cache) = cache_path(&var) else {
            warnings.push("DEBUGINFOD_URLS is set but there is no cache to keep downloads in: set DEBUGINFOD_CACHE_PATH or HOME".into());
            return (None, warnings);
        };
        let timeout = match text("DEBUGINFOD_TIMEOUT").map(|t| t.parse::<u64>()) {
            None => DEFAULT_TIMEOUT,
            Some(Ok(seconds)) => Duration::from_secs(seconds.max(1)),
            Some(Err(_)) => {
                warnings.push(format!("DEBUGINFOD_TIMEOUT is not a number of seconds: using {} s", DEFAULT_TIMEOUT.as_secs()));
                DEFAULT_TIMEOUT
            }
        };
        // elfutils: 0 or unset means no limit of the user's; ours still holds.
        let max_size = match text("DEBUGINFOD_MAXSIZE").and_then(|m| m.parse::<u64>().ok()) {
            Some(limit) if limit > 0 => limit.min(MAX_DOWNLOAD),
            _ => MAX_DOWNLOAD,
        };
        (Some(Debuginfod { urls, cache, timeout, max_size }), warnings)
    }

    /// The same settings, reading the cache and never the network: for
    /// symbols read while a program runs, when a download would stall the
    /// recording.
    pub fn cache_only(&self) -> Debuginfod {
        Debuginfod { urls: Vec::new(), ..self.clone() }
    }

    /// Where the debug file of `build_id` is kept.
    pub fn cached_path(&self, build_id: &str) -> PathBuf {
        self.cache.join(build_id).join("debuginfo")
    }
}

/// elfutils' rules: `DEBUGINFOD_CACHE_PATH`, else the old
/// `$HOME/.debuginfod_client_cache` if it exists, else
/// `$XDG_CACHE_HOME/debuginfod_client`, else `$HOME/.cache/debuginfod_client`.
fn cache_path(var: &impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let path = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(explicit) = path("DEBUGINFOD_CACHE_PATH") {
        return Some(explicit);
    }
    let home = path("HOME");
    if let Some(old) = home.as_ref().map(|h| h.join(".debuginfod_client_cache")).filter(|old| old.is_dir()) {
        return Some(old);
    }
    if let Some(xdg) = path("XDG_CACHE_HOME") {
        return Some(xdg.join("debuginfod_client"));
    }
    home.map(|h| h.join(".cache").join("debuginfod_client"))
}

/// Why a server did not give a debug file.
enum Refusal {
    /// It does not have it (HTTP 404).
    NotFound,
    /// Anything else, in a sentence.
    Failed(String),
}

/// The debug file of `image` from debuginfod, by its build-id.
pub(crate) fn find(
    image: &ElfImage,
    settings: &Debuginfod,
    progress: &dyn FetchProgress,
    warnings: &mut Vec<String>,
) -> Option<(ElfImage, super::DebugSource)> {
    let build_id = image.build_id().ok().flatten()?;
    let (debug, path, server) = fetch(settings, &build_id, image.path(), progress, warnings)?;
    Some((debug, super::DebugSource::Debuginfod { path, server }))
}

/// The debug file of `build_id` (the binary `binary`'s): from the cache, or
/// downloaded from the first server that has it, checked, and cached. The
/// path returned is in the cache; the server is `None` when the cache had it.
pub(crate) fn fetch(
    settings: &Debuginfod,
    build_id: &str,
    binary: &Path,
    progress: &dyn FetchProgress,
    warnings: &mut Vec<String>,
) -> Option<(ElfImage, PathBuf, Option<String>)> {
    // The build-id becomes a path: only hex digits may.
    if build_id.len() < 2 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let cached = settings.cached_path(build_id);
    // elfutils records a miss as an empty file: not a debug file, and no reason to complain.
    if cached.metadata().is_ok_and(|m| m.len() > 0)
        && let Some(image) = super::debuginfo::open_build_id_file(&cached, build_id, binary, warnings)
    {
        return Some((image, cached, None));
    }
    let mut lacking = Vec::new();
    for server in &settings.urls {
        match download(settings, server, build_id, progress) {
            Ok(file) => {
                if let Some(image) = keep(file, &cached, build_id, binary, server, warnings) {
                    return Some((image, cached, Some(server.clone())));
                }
            }
            Err(Refusal::NotFound) => lacking.push(server.as_str()),
            Err(Refusal::Failed(why)) => warnings.push(format!("cannot fetch the debug info of build-id {build_id} from {server}: {why}")),
        }
    }
    if !lacking.is_empty() {
        warnings.push(format!(
            "no debuginfod server has the debug info of {} (build-id {build_id}; asked {})",
            binary.display(),
            lacking.join(", ")
        ));
    }
    None
}

/// Checks a downloaded file before it takes its place in the cache: a file
/// that is not the debug file asked for never becomes one.
fn keep(
    file: tempfile::NamedTempFile,
    cached: &Path,
    build_id: &str,
    binary: &Path,
    server: &str,
    warnings: &mut Vec<String>,
) -> Option<ElfImage> {
    let mut rejected = Vec::new();
    if super::debuginfo::open_build_id_file(file.path(), build_id, binary, &mut rejected).is_none() {
        let why = rejected.join("; ");
        warnings.push(format!("refused what {server} sent as the debug info of build-id {build_id}: {why}"));
        return None;
    }
    // A rename: gdb or perf reading the cache at the same time sees the
    // whole file or none.
    if let Err(e) = file.persist(cached) {
        warnings.push(format!("cannot keep the debug info of build-id {build_id} in {}: {}", cached.display(), e.error));
        return None;
    }
    super::debuginfo::open_build_id_file(cached, build_id, binary, warnings)
}

/// `GET <server>/buildid/<id>/debuginfo` into a temporary file beside the
/// cache entry, at most `settings.max_size` bytes.
fn download(settings: &Debuginfod, server: &str, build_id: &str, progress: &dyn FetchProgress) -> Result<tempfile::NamedTempFile, Refusal> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(settings.timeout))
        .timeout_recv_response(Some(settings.timeout))
        .timeout_per_read(Some(settings.timeout))
        .build()
        .into();
    let url = format!("{server}/buildid/{build_id}/debuginfo");
    let response = agent.get(&url).call().map_err(|e| Refusal::Failed(e.to_string()))?;
    match response.status().as_u16() {
        200 => {}
        404 => return Err(Refusal::NotFound),
        status => return Err(Refusal::Failed(format!("it answered HTTP {status}"))),
    }
    let too_large = || Refusal::Failed(format!("the file is larger than {}, the most proftap accepts", in_words(settings.max_size)));
    let size = response.body().content_length();
    if size.is_some_and(|s| s > settings.max_size) {
        return Err(too_large());
    }
    let dir = settings.cache.join(build_id);
    std::fs::create_dir_all(&dir).map_err(|e| Refusal::Failed(format!("cannot create {}: {e}", dir.display())))?;
    let mut file = tempfile::Builder::new()
        .prefix(".debuginfo.")
        .tempfile_in(&dir)
        .map_err(|e| Refusal::Failed(format!("cannot create a file in {}: {e}", dir.display())))?;
    progress.started(build_id, server, size);
    let copied = copy_bounded(response.into_body().into_reader(), file.as_file_mut(), settings.max_size, progress);
    progress.ended();
    match copied {
        Ok(written) if written > settings.max_size => Err(too_large()),
        Ok(_) => Ok(file),
        Err(e) => Err(Refusal::Failed(format!("the download broke off: {e}"))),
    }
}

/// A size as people read it: MiB from one MiB on.
fn in_words(bytes: u64) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{bytes} bytes") }
}

/// Copies at most `limit + 1` bytes (one more tells a file too large),
/// telling `progress` as they arrive.
fn copy_bounded(reader: impl Read, out: &mut std::fs::File, limit: u64, progress: &dyn FetchProgress) -> std::io::Result<u64> {
    let mut reader = reader.take(limit.saturating_add(1));
    let mut buffer = vec![0u8; 256 << 10];
    let mut written = 0u64;
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buffer[..read])?;
        written += read as u64;
        progress.received(written);
    }
    out.flush()?;
    Ok(written)
}

#[cfg(test)]
mod tests;

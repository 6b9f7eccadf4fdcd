//! The profile file: a text header line naming the format and its version,
//! then the profile as gzip-compressed JSON. See `docs/FORMAT.md`.

use crate::error::FileError;
use crate::model::Profile;
use crate::write::{write_atomically, write_private};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

/// The version this code writes and the newest it reads. Version 2 has
/// notes with kinds (objects) where version 1 had sentences (strings);
/// version 1 files read as version 2 files whose notes are all sentences.
pub const FORMAT_VERSION: u32 = 2;
const MAGIC: &str = "proftap-profile";

/// The most JSON a profile file may hold once decompressed.
pub const MAX_JSON_BYTES: u64 = 1 << 30;

/// How many times its compressed size a profile's JSON may be, once past
/// [`EXPANSION_FLOOR`]: recorded profiles compress 5 to 10-fold, while a
/// gzip bomb expands a thousandfold.
pub const MAX_EXPANSION: u64 = 100;

/// JSON up to this size may expand any amount.
pub const EXPANSION_FLOOR: u64 = 64 << 20;

/// Reads a profile file.
pub fn read_profile(path: &Path) -> Result<Profile, FileError> {
    let file = std::fs::File::open(path).map_err(|source| FileError::Io { action: "read", path: path.into(), source })?;
    read_profile_from(file, path)
}

/// Decodes a profile file's bytes held in memory (a profile received
/// rather than read from disk); errors call it "the profile".
pub fn decode(bytes: &[u8]) -> Result<Profile, FileError> {
    read_profile_from(bytes, Path::new("the profile"))
}

/// Reads a profile from `reader`, naming it `name` in errors: the header,
/// the decompressed JSON (bounded by [`MAX_JSON_BYTES`] and
/// [`MAX_EXPANSION`]), then [`Profile::validate`].
pub fn read_profile_from(reader: impl Read, name: &Path) -> Result<Profile, FileError> {
    let mut reader = BufReader::new(reader);
    read_header(&mut reader, name)?;
    let json = inflate(reader, name, MAX_JSON_BYTES, EXPANSION_FLOOR)?;
    let damaged = |reason: String| FileError::Damaged { path: name.into(), reason: one_line(&reason) };
    let profile: Profile = serde_json::from_slice(&json).map_err(|e| damaged(e.to_string()))?;
    drop(json);
    profile.validate().map_err(|e| damaged(e.to_string()))?;
    Ok(profile)
}

/// The longest reason an error quotes.
const MAX_REASON: usize = 300;

/// A reason as one short line: it may quote the damaged file's own text
/// (a string the JSON parser did not expect, a file name), which can hold
/// line breaks or run for megabytes.
fn one_line(reason: &str) -> String {
    let mut line = String::new();
    for c in reason.chars() {
        if line.len() >= MAX_REASON {
            line.push_str("...");
            break;
        }
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// Checks the header line and returns the format version.
fn read_header(reader: &mut impl BufRead, name: &Path) -> Result<u32, FileError> {
    let mut header = Vec::new();
    reader.take(64).read_until(b'\n', &mut header).map_err(|source| FileError::Io { action: "read", path: name.into(), source })?;
    let header = String::from_utf8_lossy(&header);
    let Some(version) = header.trim_end().strip_prefix(MAGIC).and_then(|v| v.trim().parse::<u32>().ok()) else {
        return Err(FileError::Foreign { path: name.into() });
    };
    if version > FORMAT_VERSION {
        return Err(FileError::Newer { path: name.into(), version, reads: FORMAT_VERSION });
    }
    Ok(version)
}

/// Counts the bytes read through it: the compressed size so far.
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Decompresses the JSON, stopping as soon as it passes `limit` bytes or
/// expands more than [`MAX_EXPANSION`]-fold past `floor`, before a bomb
/// can take the memory.
fn inflate(reader: impl Read, name: &Path, limit: u64, floor: u64) -> Result<Vec<u8>, FileError> {
    let mut gz = GzDecoder::new(Counted { inner: reader, bytes: 0 });
    let mut json = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match gz.read(&mut chunk) {
            Ok(0) => return Ok(json),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FileError::Damaged { path: name.into(), reason: e.to_string() }),
        };
        json.extend_from_slice(&chunk[..n]);
        let size = json.len() as u64;
        if size > limit {
            return Err(FileError::TooLarge { path: name.into(), limit });
        }
        if size > floor && size > gz.get_ref().bytes.saturating_mul(MAX_EXPANSION) {
            let reason = format!("its data expands more than {MAX_EXPANSION}-fold when decompressed, which no profile does");
            return Err(FileError::Damaged { path: name.into(), reason });
        }
    }
}

/// Writes a profile file atomically (see [`write_atomically`]).
pub fn write_profile(path: &Path, profile: &Profile) -> Result<(), FileError> {
    write_atomically(path, |out| write_profile_to(out, profile))
}

/// Writes a profile file atomically, readable by its owner only (see
/// [`write_private`]): for profiles a service keeps.
pub fn write_profile_private(path: &Path, profile: &Profile) -> Result<(), FileError> {
    write_private(path, |out| write_profile_to(out, profile))
}

/// Writes a profile file's bytes to `out` (standard output, a socket).
pub fn write_profile_to(out: &mut dyn Write, profile: &Profile) -> std::io::Result<()> {
    writeln!(out, "{MAGIC} {FORMAT_VERSION}")?;
    // The fastest level: a fifth larger than the default, a third of its
    // time, which every recording waits for at its end.
    let mut gz = GzEncoder::new(out, Compression::fast());
    std::thread::scope(|scope| {
        // Serialized on a thread of its own while this one compresses: each
        // takes about half the time, and a recording waits for both.
        let (to, chunks) = std::sync::mpsc::sync_channel(CHUNKS_AHEAD);
        let serialize = move || {
            let mut sender = ChunkSender { chunk: Vec::with_capacity(CHUNK_BYTES), to };
            serde_json::to_writer(&mut sender, profile).map_err(std::io::Error::from)?;
            sender.flush()
        };
        let Ok(serializer) = std::thread::Builder::new().spawn_scoped(scope, serialize) else {
            // No thread to be had: both here, the JSON gathered first (serde_json
            // writes a few bytes at a time, each write to the encoder a call).
            let mut buffered = std::io::BufWriter::with_capacity(CHUNK_BYTES, &mut gz);
            serde_json::to_writer(&mut buffered, profile).map_err(std::io::Error::from)?;
            return buffered.flush();
        };
        // On a failure to write, the chunks stop being taken: the
        // serializer fails its next send and ends.
        let compressed = chunks.iter().try_for_each(|chunk: Vec<u8>| gz.write_all(&chunk));
        drop(chunks);
        let serialized = serializer.join().unwrap_or_else(|panic| {
            let why = panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str));
            Err(std::io::Error::other(format!("the profile could not be serialized: {}", why.unwrap_or("its thread panicked"))))
        });
        compressed.and(serialized)
    })?;
    gz.finish()?;
    Ok(())
}

/// The bytes of JSON handed to the compressor at a time.
const CHUNK_BYTES: usize = 1 << 16;

/// Chunks serialized ahead of the compressor, at most.
const CHUNKS_AHEAD: usize = 8;

/// Hands what is written on to `to`, a chunk of at least [`CHUNK_BYTES`]
/// at a time (and what is left, when flushed).
struct ChunkSender {
    chunk: Vec<u8>,
    to: std::sync::mpsc::SyncSender<Vec<u8>>,
}

impl Write for ChunkSender {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.write_all(bytes).map(|()| bytes.len())
    }

    // serde_json writes a token at a time: each is one copy, not the
    // default's loop of partial writes.
    #[inline]
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.chunk.extend_from_slice(bytes);
        if self.chunk.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK_BYTES));
        self.to.send(full).map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FunctionInfo, Target};

    fn sample() -> Profile {
        Profile {
            target: Target { command: vec!["./prog".into()], pid: 42, ..Target::default() },
            metrics: vec!["wall_ns".into()],
            functions: vec![FunctionInfo { name: "f".into(), ..FunctionInfo::default() }],
            ..Profile::default()
        }
    }

    /// A writer that takes `room` bytes, then fails.
    struct Full {
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.room < bytes.len() {
                return Err(std::io::Error::other("no room"));
            }
            self.room -= bytes.len();
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_destination_that_fails_midway_fails_the_write() {
        let mut profile = sample();
        profile.functions = (0..200_000).map(|i| FunctionInfo { name: format!("f{i}"), ..FunctionInfo::default() }).collect();
        let err = write_profile_to(&mut Full { room: 1000 }, &profile).expect_err("no room");
        assert_eq!(err.to_string(), "no room");
        let mut whole = Vec::new();
        write_profile_to(&mut whole, &profile).expect("written");
        assert!(whole.len() > 100_000, "{} bytes", whole.len());
        // Many chunks of JSON, compressed as they come, read back whole.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.proftap");
        std::fs::write(&path, &whole).expect("write");
        let back = read_profile(&path).expect("read");
        assert_eq!(back.functions.len(), profile.functions.len());
        assert!(back.functions.iter().zip(&profile.functions).all(|(a, b)| a.name == b.name));
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.proftap");
        write_profile(&path, &sample()).expect("write");
        let back = read_profile(&path).expect("read");
        assert_eq!(back.target.pid, 42);
        assert_eq!(back.functions[0].name, "f");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }

    #[test]
    fn damaged_foreign_and_newer_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.proftap");
        write_profile(&path, &sample()).expect("write");
        let bytes = std::fs::read(&path).expect("read");

        std::fs::write(&path, &bytes[..bytes.len() - 10]).expect("write");
        let err = read_profile(&path).expect_err("truncated");
        assert!(matches!(err, FileError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("damaged or truncated"));

        std::fs::write(&path, b"hello\n").expect("write");
        assert!(matches!(read_profile(&path), Err(FileError::Foreign { .. })));

        let mut newer = b"proftap-profile 99\n".to_vec();
        newer.extend_from_slice(&bytes[bytes.iter().position(|&b| b == b'\n').expect("header") + 1..]);
        std::fs::write(&path, newer).expect("write");
        let err = read_profile(&path).expect_err("newer");
        assert!(err.to_string().contains("format 99"), "{err}");

        let err = read_profile(&dir.path().join("missing")).expect_err("missing");
        assert!(err.to_string().starts_with("cannot read"), "{err}");
    }

    /// A profile file of `json`, compressed at `level`.
    fn file_of(json: &[u8], level: u32) -> Vec<u8> {
        let mut out = format!("{MAGIC} {FORMAT_VERSION}\n").into_bytes();
        let mut gz = GzEncoder::new(&mut out, Compression::new(level));
        gz.write_all(json).expect("compress");
        gz.finish().expect("compress");
        out
    }

    #[test]
    fn a_format_1_profile_reads_with_its_sentences_and_engines() {
        // As format 1 wrote them: notes as sentences, engines and exits as
        // strings (empty for a sampled function's engine, absent exits).
        let json = r#"{"target":{"command":["./p"],"pid":7,"exe":"/bin/p","build_id":null,"exit_code":0,"signal":null,"attached":false},
            "recording":{"engine":"inject","started_unix_ns":1,"started_monotonic_ns":2,"duration_ns":3,"events":4,
                "peak_events_per_second":5,"follow_forks":true,"proftap_version":"0.1.0"},
            "metrics":["wall_ns","cpu_ns"],
            "functions":[{"name":"f","module":"/bin/p","file":null,"line":0,"address":4096,"mode":"instrumented","engine":"uprobe"},
                {"name":"g","module":"/bin/p","file":null,"line":0,"address":4200,"mode":"sampled"}],
            "threads":[],"lost":{"events":0,"by_function":[],"by_thread":[],"unmatched_returns":0},
            "overhead":{"per_hit_ns":0,"hits":0,"estimated_ns":0,"compensated":false,"call_ns_emulated":0,"call_ns_stepped":0,
                "call_cpu_ns":0,"self_ns":0},
            "processes":[],"notes":["1 call ended without its own return"],"runs":1}"#;
        let mut file = format!("{MAGIC} 1\n").into_bytes();
        let mut gz = GzEncoder::new(&mut file, Compression::new(6));
        gz.write_all(json.as_bytes()).expect("compress");
        gz.finish().expect("compress");
        let profile = decode(&file).expect("a format 1 profile");
        assert_eq!((profile.recording.engine, profile.recording.exits), (crate::Engine::Inject, crate::ExitMode::Uretprobe));
        assert_eq!((profile.functions[0].engine, profile.functions[1].engine), (Some(crate::Engine::Uprobe), None));
        assert_eq!(profile.notes, vec![crate::Note::Text("1 call ended without its own return".into())]);
    }

    #[test]
    fn profiles_decode_from_memory_and_are_validated() {
        let json = serde_json::to_vec(&sample()).expect("json");
        assert_eq!(decode(&file_of(&json, 6)).expect("valid").functions[0].name, "f");
        let mut bad = sample();
        bad.threads.push(crate::model::ThreadProfile {
            pid: 1,
            tid: 2,
            name: String::new(),
            functions: vec![crate::model::FunctionStats::new(9, 1)],
            tree: crate::model::CallTree::new(1),
        });
        let err = decode(&file_of(&serde_json::to_vec(&bad).expect("json"), 6)).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "the profile is damaged or truncated (thread 2 names function 9, but the profile has 1 functions); record it again"
        );
    }

    #[test]
    fn reasons_quoting_the_file_stay_one_short_line() {
        let mut bad = sample();
        bad.lines.push(crate::model::LineRecord {
            file: format!("a\nb{}", "x".repeat(1000)),
            line: u32::MAX,
            count: 0,
            cost: vec![0],
            branches: Vec::new(),
            throttled: false,
        });
        let err = decode(&file_of(&serde_json::to_vec(&bad).expect("json"), 6)).expect_err("invalid").to_string();
        assert!(err.starts_with("the profile is damaged or truncated (a line record of a\\nbxxx"), "{err}");
        assert!(err.ends_with("xxx...); record it again") && err.len() < 400, "{err}");
        // The parser quotes a string it did not expect.
        let json = String::from_utf8(serde_json::to_vec(&sample()).expect("json")).expect("utf-8");
        let json = json.replace("\"instrumented\"", "\"a\\nb\"");
        let err = decode(&file_of(json.as_bytes(), 6)).expect_err("no such mode").to_string();
        assert!(err.contains("unknown variant `a\\nb`"), "{err}");
    }

    #[test]
    fn decompression_stops_at_the_limit_and_at_a_bomb() {
        let bomb = file_of(&vec![b' '; 4 << 20], 9);
        let header = bomb.iter().position(|&b| b == b'\n').expect("header") + 1;
        let inflated = |limit, floor| inflate(&bomb[header..], Path::new("bomb"), limit, floor);
        assert_eq!(inflated(8 << 20, 8 << 20).expect("within both").len(), 4 << 20);
        let err = inflated(1 << 20, 8 << 20).expect_err("past the limit");
        assert!(matches!(err, FileError::TooLarge { .. }), "{err}");
        assert_eq!(err.to_string(), "bomb holds more than 1 MiB of profile data once decompressed, more than proftap reads");
        let err = inflated(8 << 20, 1 << 20).expect_err("expands a thousandfold");
        assert!(err.to_string().contains("expands more than 100-fold"), "{err}");
    }
}

use super::*;
use std::io::Write;

#[test]
fn pieces_are_named_by_the_line_written_last_that_holds_them() {
    let mut names = JitNames::default();
    let text = b"7f0000001000 40 LazyCompile:*fib /tmp/bench.js:1\n0x7f0000002000 0x20 JS:~main\nnot a line\n7f0000003000 0 empty\n7f0000004000 10\n";
    assert_eq!(names.add_lines(text), text.len());
    assert_eq!(names.len(), 2, "the line that is no piece, one of no size and one with no name are skipped");
    assert_eq!(names.name_at(0x7f00_0000_1000), Some("LazyCompile:*fib /tmp/bench.js:1"));
    assert_eq!(names.name_at(0x7f00_0000_103f), Some("LazyCompile:*fib /tmp/bench.js:1"));
    assert_eq!(names.name_at(0x7f00_0000_1040), None, "past its end");
    assert_eq!(names.name_at(0x7f00_0000_2010), Some("JS:~main"));
    assert_eq!(names.name_at(0x7f00_0000_0fff), None);
    // Code moved over the first piece's memory: the later line names it.
    names.add_lines(b"7f0000001020 100 JS:*moved\n");
    assert_eq!(names.name_at(0x7f00_0000_1000), Some("LazyCompile:*fib /tmp/bench.js:1"));
    assert_eq!(names.name_at(0x7f00_0000_1030), Some("JS:*moved"));
    assert_eq!(names.name_at(0x7f00_0000_1100), Some("JS:*moved"));
}

#[test]
fn a_line_still_being_written_is_read_the_next_time() {
    let mut names = JitNames::default();
    assert_eq!(names.add_lines(b"1000 10 whole\n2000 10 ha"), 14);
    assert_eq!((names.len(), names.name_at(0x2000)), (1, None));
    assert_eq!(names.add_lines(b"2000 10 half\n"), 13);
    assert_eq!(names.name_at(0x2005), Some("half"));
    assert_eq!(names.add_lines(b"no newline yet"), 0);
}

#[test]
fn hostile_lines_are_bounded_and_do_not_panic() {
    let mut names = JitNames::default();
    let long = format!("1000 10 {}\u{e9}\n", "x".repeat(MOST_NAME_BYTES - 1));
    names.add_lines(long.as_bytes());
    assert_eq!(names.name_at(0x1000).map(str::len), Some(MOST_NAME_BYTES - 1), "cut at a character's boundary");
    for line in ["ffffffffffffffff 2 wraps\n", "zz 10 bad\n", "1000 zz bad\n", "\n\n\n", "1000\n", "\u{0} \u{0} \u{0}\n"] {
        names.add_lines(line.as_bytes());
    }
    names.add_lines(&[0xff, b' ', 0xfe, b'\n', b'5', b' ', b'5', b' ', 0xff, b'\n']);
    assert_eq!(names.name_at(0x5), Some("\u{fffd}"));
    assert_eq!(names.name_at(u64::MAX), None);
}

/// The map `name` in directory `dir`, opened as [`PerfMap::open`] opens
/// one in a process's `/tmp`, for a program of `owner`'s.
fn opened(dir: &std::path::Path, name: &str, owner: u32) -> io::Result<PerfMap> {
    PerfMap::open_in(&File::open(dir).unwrap(), name, owner, None)
}

#[test]
fn a_map_is_read_as_it_grows_and_only_as_its_programs_owners_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-1.map");
    let mut writer = std::fs::File::create(&path).unwrap();
    writer.write_all(b"1000 10 first\n2000 10 sec").unwrap();
    let me = std::fs::metadata(&path).unwrap().uid();
    let mut map = opened(dir.path(), "perf-1.map", me).unwrap();
    map.read_more().unwrap();
    assert_eq!((map.names().name_at(0x1000), map.names().name_at(0x2000)), (Some("first"), None));
    writer.write_all(b"ond\n").unwrap();
    map.read_more().unwrap();
    assert_eq!(map.names().name_at(0x2000), Some("second"));
    // Started again by the program: read from its start, shorter than
    // what was read, or longer.
    std::fs::write(&path, b"3000 10 third\n").unwrap();
    map.read_more().unwrap();
    assert_eq!((map.names().name_at(0x1000), map.names().name_at(0x3000)), (None, Some("third")));
    std::fs::write(&path, b"4000 10 fourth, written again and longer than before\n").unwrap();
    map.read_more().unwrap();
    assert_eq!((map.names().name_at(0x3000), map.names().name_at(0x4000).map(|n| &n[..6])), (None, Some("fourth")));
    // A line with no end in sight is no line: skipped to its end, not read
    // again and again, and its end not taken for a line.
    let mut writer = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    writer.write_all(&vec![b'x'; MOST_LINE_BYTES]).unwrap();
    let before = map.read;
    map.read_more().unwrap();
    assert_eq!(map.read, before + MOST_LINE_BYTES as u64, "skipped");
    writer.write_all(b" 6000 10 rest of the long line\n5000 10 [probe overhead]\n").unwrap();
    map.read_more().unwrap();
    assert_eq!(map.names().name_at(0x6000), None, "the long line's end is no line");
    assert_eq!(map.names().name_at(0x5000), Some("jit [probe overhead]"), "not taken for proftap's own frame");

    // Through a link, as a second name of a file, or a FIFO: refused, without blocking.
    std::os::unix::fs::symlink(&path, dir.path().join("perf-2.map")).unwrap();
    assert!(opened(dir.path(), "perf-2.map", me).is_err());
    std::fs::hard_link(&path, dir.path().join("perf-3.map")).unwrap();
    let err = opened(dir.path(), "perf-3.map", me).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    std::fs::remove_file(dir.path().join("perf-3.map")).unwrap();
    let fifo = std::ffi::CString::new(dir.path().join("perf-4.map").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and mode.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let err = opened(dir.path(), "perf-4.map", me).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    // A path out of the directory stays in it, as in the program's root.
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    std::os::unix::fs::symlink("/", dir.path().join("tmp/up")).unwrap();
    assert!(opened(dir.path(), "tmp/up/perf-1.map", me).is_ok(), "/ is the directory");
    assert!(opened(dir.path(), "../perf-1.map", me).is_ok(), ".. of the root is the root");
    // Root's is read; another user's than the program's owner is not
    // (only root can give a file away to show it).
    if me == 0 {
        assert!(opened(dir.path(), "perf-1.map", 4242).is_ok(), "root's");
        std::os::unix::fs::chown(&path, Some(4242), None).unwrap();
        assert!(opened(dir.path(), "perf-1.map", 4242).is_ok(), "the program's owner's");
        let err = opened(dir.path(), "perf-1.map", 4243).map(|_| ()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(opened(dir.path(), "perf-1.map", 0).is_err(), "a root program's map is root's");
    }
}

/// This process's own map, at `/tmp/perf-PID.map`: none, then one it
/// writes, then one left from before it started. One test: they share
/// the file.
#[test]
fn a_process_reads_its_own_map_and_not_one_older_than_itself() {
    let pid = std::process::id();
    let err = PerfMap::open(pid, None).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    let path = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
    struct Removed<'a>(&'a std::path::Path);
    impl Drop for Removed<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _removed = Removed(&path);
    std::fs::write(&path, b"1000 10 mine\n").unwrap();
    let mut map = PerfMap::open(pid, None).unwrap();
    map.read_more().unwrap();
    assert_eq!(map.names().name_at(0x1000), Some("mine"));
    // An hour old: an earlier process's of the same pid.
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(hour_ago).unwrap();
    let err = PerfMap::open(pid, None).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
}

#[test]
fn a_map_last_written_before_the_programs_exec_is_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("perf-1.map"), b"1000 10 old\n").unwrap();
    let me = std::fs::metadata(dir.path().join("perf-1.map")).unwrap().uid();
    let root = File::open(dir.path()).unwrap();
    let now = std::time::SystemTime::now();
    let executed_later = now + std::time::Duration::from_secs(5);
    let err = PerfMap::open_in(&root, "perf-1.map", me, Some(executed_later)).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    let executed_before = now - std::time::Duration::from_secs(5);
    assert!(PerfMap::open_in(&root, "perf-1.map", me, Some(executed_before)).is_ok());
}

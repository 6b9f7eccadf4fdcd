//! Doing things inside a stopped process: `cat` waiting for input is held,
//! made to call the kernel, given memory near its code and memory shared
//! with us, then let go; it must read its input as if nothing happened.
#![allow(clippy::unwrap_used, missing_docs)]

use proftap_probes::inject::remote::Remote;
use proftap_probes::procfs::read_maps;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn a_held_process_calls_the_kernel_maps_memory_and_runs_on() {
    let mut cat = Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let pid = cat.id() as i32;
    let mut out = BufReader::new(cat.stdout.take().unwrap());
    let mut input = cat.stdin.take().unwrap();
    // cat is running (blocked in read) once it echoed a line.
    writeln!(input, "first").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n");

    let remote = match Remote::attach(pid) {
        Ok(remote) => remote,
        Err(e) => {
            let _ = cat.kill();
            let _ = cat.wait();
            panic!("cannot hold a process here ({e}): tracing it needs root or CAP_SYS_PTRACE");
        }
    };
    // A system call made by the process itself.
    assert_eq!(remote.syscall("getpid", libc::SYS_getpid, [0; 6]).unwrap(), pid as u64);

    // Code within 2 GiB of its code, never writable in the process, written all the same.
    let text =
        read_maps(pid).unwrap().into_iter().find(|m| m.executable && m.path.as_deref().is_some_and(|p| p.ends_with("/cat"))).unwrap();
    let near = remote.map_code_near(text.start.0..text.end.0, 8192).unwrap();
    assert!(near.abs_diff(text.start.0) < 0x8000_0000, "{near:#x} is out of reach of {:#x}", text.start.0);
    remote.write(near, b"\x90\xc3").unwrap();
    let maps = read_maps(pid).unwrap();
    let mapped = maps.iter().find(|m| m.start.0 == near).unwrap();
    assert!(mapped.executable && !mapped.writable, "{mapped:?}");
    assert_eq!(remote.read(near, 2).unwrap(), b"\x90\xc3");

    // Memory both sides see.
    let shared = remote.share(4096, Some(text.start.0..text.end.0)).unwrap();
    assert!(shared.remote.abs_diff(text.start.0) < 0x8000_0000, "{:#x}", shared.remote);
    shared.store(0, 0x1122_3344_5566_7788);
    assert_eq!(remote.read(shared.remote, 8).unwrap(), 0x1122_3344_5566_7788u64.to_ne_bytes());
    remote.write(shared.remote + 8, &42u64.to_ne_bytes()).unwrap();
    assert_eq!(shared.load(8), 42);

    // Let go: the read it was blocked in goes on.
    drop(remote);
    writeln!(input, "second").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "second\n");
    drop(input);
    assert!(cat.wait().unwrap().success());
    // Our side of the shared memory outlives the process.
    assert_eq!(shared.load(0), 0x1122_3344_5566_7788);
}

/// A threaded program changing its user id all the time (examples/setxid.c),
/// held again and again, each time made to call the kernel: the C
/// library's signal for a change, which a thread may stop for as it is
/// held, is passed on as it came, from the process itself, which is all
/// the C library heeds; else setuid() never returns and the program never
/// ends.
#[test]
fn a_threaded_program_changing_its_user_id_runs_on_after_holds() {
    // One thread beside the main one: each hold is short, and there are many.
    let (_dir, mut program, mut out) = started("setxid", &["1"]);
    let pid = program.id() as i32;
    let mut line = String::new();
    for hold in 0..5000 {
        let remote = Remote::attach(pid).unwrap_or_else(|e| {
            let _ = program.kill();
            panic!("hold {hold}: {e} (holding a process needs root or CAP_SYS_PTRACE)")
        });
        assert_eq!(remote.syscall("getpid", libc::SYS_getpid, [0; 6]).unwrap(), pid as u64);
    }
    drop(program.stdin.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while program.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = program.kill();
            let _ = program.wait();
            panic!("the program did not end after its input did: a setuid() never returned");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.ends_with(" changes\n"), "{line}");
}

/// A program with a SIGTRAP handler of its own (examples/trapped.c), held
/// and made to call the kernel, which proftap steps: it keeps its
/// handler. (A step's trap is forced through a blocked SIGTRAP, and the
/// kernel then resets the handler to the default, which ends the program.)
#[test]
fn a_program_held_and_stepped_keeps_its_own_trap_handler() {
    let (_dir, mut program, mut out) = started("trapped", &[]);
    let pid = program.id() as i32;
    let mut line = String::new();
    for _ in 0..3 {
        let remote = Remote::attach(pid).unwrap();
        assert_eq!(remote.syscall("getpid", libc::SYS_getpid, [0; 6]).unwrap(), pid as u64);
    }
    drop(program.stdin.take());
    let status = program.wait().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(status.success() && line == "handled\n", "{status}: {line:?}");
}

/// examples/`name`.c built (in the directory returned, kept while it
/// runs) and run with `args`, its input and output piped, once it said
/// "started".
fn started(name: &str, args: &[&str]) -> (tempfile::TempDir, std::process::Child, BufReader<std::process::ChildStdout>) {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join(name);
    let source = format!("{}/../examples/{name}.c", env!("CARGO_MANIFEST_DIR"));
    assert!(Command::new("gcc").args(["-O2", "-pthread", "-o"]).arg(&binary).arg(source).status().unwrap().success());
    let mut program = Command::new(&binary).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(program.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    (dir, program, out)
}

//! What a live process has loaded, read from `/proc/PID`.

use crate::addr::{FileOffset, LoadBias, RuntimeAddr, VirtAddr};
use crate::error::{Error, Result};
use crate::symbols::ElfImage;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: RuntimeAddr,
    /// One past the last address.
    pub end: RuntimeAddr,
    /// `r`, `w`, `x` permissions.
    pub readable: bool,
    /// Writable.
    pub writable: bool,
    /// Executable.
    pub executable: bool,
    /// Offset in the mapped file.
    pub offset: FileOffset,
    /// Device of the mapped file, as `st_dev` encodes it (0 for anonymous memory).
    pub device: u64,
    /// Inode of the mapped file (0 for anonymous memory).
    pub inode: u64,
    /// The file as the process sees it, or a pseudo name (`[heap]`, `[vdso]`).
    pub path: Option<String>,
}

/// The number the kernel setting `name` (under `/proc/sys`, as
/// "kernel/pid_max") holds, if it can be read.
pub fn sysctl_number(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/{name}")).ok()?.trim().parse().ok()
}

/// Parses the text of `/proc/PID/maps`; lines it cannot read are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_map_line).collect()
}

fn parse_map_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?.as_bytes();
    let offset = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?;
    let path = fields.next().map(str::trim_start).filter(|p| !p.is_empty()).map(String::from);
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: RuntimeAddr(u64::from_str_radix(start, 16).ok()?),
        end: RuntimeAddr(u64::from_str_radix(end, 16).ok()?),
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        offset: FileOffset(u64::from_str_radix(offset, 16).ok()?),
        device: libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode: inode.parse().ok()?,
        path,
    })
}

/// A file-backed ELF module loaded in a process.
#[derive(Clone, Debug)]
pub struct LoadedModule {
    /// The path as the process sees it.
    pub path: PathBuf,
    /// The path to open from here: through `/proc/PID/root`, so that a
    /// process in another mount namespace (a container) is read correctly.
    pub open_path: PathBuf,
    /// `runtime address = ELF virtual address + bias`.
    pub bias: LoadBias,
    /// Executable address ranges.
    pub text: Vec<(RuntimeAddr, RuntimeAddr)>,
    /// Whether this is the process's executable.
    pub is_main: bool,
}

impl LoadedModule {
    /// Whether `addr` is in this module's executable code.
    pub fn contains(&self, addr: RuntimeAddr) -> bool {
        self.text.iter().any(|&(s, e)| addr >= s && addr < e)
    }
}

/// Reads `/proc/PID/maps` of a process.
pub fn read_maps(pid: i32) -> Result<Vec<Mapping>> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let text = std::fs::read_to_string(&path).map_err(|e| process_error(pid, path, e))?;
    Ok(parse_maps(&text))
}

/// What `address` is in, in process `pid`, asked of the kernel alone
/// (`PROCMAP_QUERY`, Linux 6.11 on): without its path. An error where the
/// kernel cannot answer so (older kernels: read [`read_maps`] instead).
pub fn mapping_at(pid: i32, address: u64) -> std::io::Result<Option<Mapping>> {
    /// `struct procmap_query` (include/uapi/linux/fs.h).
    #[repr(C)]
    #[derive(Default)]
    struct Query {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }
    const PROCMAP_QUERY: u64 = 0xc000_0000 | ((size_of::<Query>() as u64) << 16) | (b'f' as u64) << 8 | 17;
    use std::os::fd::AsRawFd;
    let maps = std::fs::File::open(format!("/proc/{pid}/maps"))?;
    let mut query = Query { size: size_of::<Query>() as u64, query_addr: address, ..Query::default() };
    // SAFETY: the ioctl reads and writes `query`, a live struct of the size it says.
    if unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut query) } != 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(error),
        };
    }
    let device = libc::makedev(query.dev_major, query.dev_minor);
    Ok(Some(Mapping {
        start: RuntimeAddr(query.vma_start),
        end: RuntimeAddr(query.vma_end),
        readable: query.vma_flags & 1 != 0,
        writable: query.vma_flags & 2 != 0,
        executable: query.vma_flags & 4 != 0,
        offset: FileOffset(query.vma_offset),
        device,
        inode: query.inode,
        path: None,
    }))
}

/// Whether process `pid` is in the initial pid namespace, where the thread
/// ids it sees are the kernel's own (those tracepoints report).
pub fn sees_kernel_thread_ids(pid: i32) -> bool {
    /// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
    const INITIAL_PID_NAMESPACE: u64 = 0xefff_fffc;
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns.ino() == INITIAL_PID_NAMESPACE)
}

/// The ELF modules a process has mapped executable, main executable first.
pub fn loaded_modules(pid: i32) -> Result<Vec<LoadedModule>> {
    let maps = read_maps(pid)?;
    let exe_link = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe = match std::fs::read_link(&exe_link) {
        Ok(exe) => exe,
        Err(e) if e.kind() == ErrorKind::NotFound && Path::new(&format!("/proc/{pid}")).exists() => {
            return Err(Error::NoExecutable { pid });
        }
        Err(e) => return Err(process_error(pid, exe_link, e)),
    };
    let root = PathBuf::from(format!("/proc/{pid}/root"));

    let mut modules: Vec<LoadedModule> = Vec::new();
    for map in maps.iter().filter(|m| m.executable) {
        let Some(path) = map.path.as_deref().filter(|p| p.starts_with('/')) else { continue };
        let path = PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(path));
        if let Some(module) = modules.iter_mut().find(|m| m.path == path) {
            module.text.push((map.start, map.end));
            continue;
        }
        let open_path = root.join(path.strip_prefix("/").unwrap_or(&path));
        let Some(bias) = load_bias(&open_path, map) else { continue };
        modules.push(LoadedModule { is_main: path == exe, path, open_path, bias, text: vec![(map.start, map.end)] });
    }
    modules.sort_by_key(|m| !m.is_main);
    Ok(modules)
}

/// The bias of a module from one of its mappings: the mapping's start holds
/// file offset `map.offset`, which the segment containing it places at a
/// known virtual address.
fn load_bias(open_path: &Path, map: &Mapping) -> Option<LoadBias> {
    let image = ElfImage::open(open_path).ok()?;
    let segments = image.segments().ok()?;
    let page = 4096;
    let holds = |s: &&crate::symbols::Segment| {
        let first = s.offset.0 & !(page - 1);
        map.offset.0 >= first && map.offset.0 < s.offset.0 + s.file_size.max(1)
    };
    // A page can hold the end of one segment and the start of the next:
    // the mapping is the one with its permissions.
    let segment = segments.iter().filter(holds).find(|s| s.executable == map.executable).or_else(|| segments.iter().find(holds))?;
    let vaddr_at_start = VirtAddr(segment.vaddr.0.wrapping_add(map.offset.0).wrapping_sub(segment.offset.0));
    Some(LoadBias(map.start.0.wrapping_sub(vaddr_at_start.0)))
}

fn process_error(pid: i32, path: PathBuf, source: std::io::Error) -> Error {
    if source.kind() == ErrorKind::NotFound && !Path::new(&format!("/proc/{pid}")).exists() {
        return Error::NoSuchProcess { pid };
    }
    let hint = if source.kind() == ErrorKind::PermissionDenied {
        "; profiling another user's process needs root or CAP_SYS_PTRACE".to_string()
    } else {
        String::new()
    };
    Error::Process { pid, path, source, hint }
}

/// Which of `places` (a file as process `pid` maps it, opened through the
/// given path, and an offset in it) hold in the process's memory the
/// instruction the file holds there. A uprobe runs the file's instruction
/// out of line wherever it is hit, then goes on in memory: where the
/// process's code was changed (another tool's patch, or one a recording
/// killed before it could restore it left), it would run code that is not
/// there. A breakpoint over the instruction's first byte (another uprobe's
/// at the same place) is no change. A place not mapped, or that cannot be
/// read, is not said to differ: no code of it runs now.
pub fn code_as_in_file(pid: i32, places: &[(&Path, u64)]) -> Vec<bool> {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let maps = read_maps(pid).unwrap_or_default();
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok();
    let mut files: std::collections::HashMap<&Path, Option<(std::fs::File, u64)>> = std::collections::HashMap::new();
    places
        .iter()
        .map(|&(path, offset)| {
            let Some((file, inode)) = files.entry(path).or_insert_with(|| {
                // The target's files are its to swap: a FIFO must not hold proftap.
                let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
                let meta = file.metadata().ok()?;
                meta.is_file().then(|| (file, meta.ino()))
            }) else {
                return true;
            };
            let mapped = maps
                .iter()
                .find(|m| m.executable && m.inode == *inode && (m.offset.0..m.offset.0 + (m.end.0 - m.start.0)).contains(&offset));
            let (Some(map), Some(memory)) = (mapped, &memory) else { return true };
            let mut code = [0u8; 16];
            let Ok(read) = file.read_at(&mut code, offset) else { return true };
            let code = &code[..read];
            let length = iced_x86::Decoder::new(64, code, iced_x86::DecoderOptions::NONE).decode().len().clamp(1, code.len().max(1));
            let mut now = vec![0u8; length];
            if code.len() < length || memory.read_exact_at(&mut now, map.start.0 + (offset - map.offset.0)).is_err() {
                return true;
            }
            now == code[..length] || (now[0] == 0xcc && now[1..] == code[1..length])
        })
        .collect()
}

/// When a process started (clock ticks after boot, the 22nd field), from
/// the text of its `/proc/PID/stat`.
pub fn start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it follow the last `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_name_with_parentheses() {
        let fields = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 19 20";
        assert_eq!(start_time(&format!("77 (a) b) c) {fields}")), Some(4242));
        assert_eq!(start_time(&format!("77 (sh) {fields}")), Some(4242));
        assert_eq!(start_time("77 (sh) S 1 2"), None);
        assert_eq!(start_time("77 no name"), None);
    }

    #[test]
    fn maps_lines_parse() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /usr/bin/prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /usr/bin/prog
7ffd5e1f0000-7ffd5e211000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 
garbage
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[1].start, RuntimeAddr(0x55d0c0a01000));
        assert!(maps[1].executable && !maps[1].writable);
        assert_eq!(maps[1].offset, FileOffset(0x1000));
        assert_eq!(maps[1].path.as_deref(), Some("/usr/bin/prog"));
        assert_eq!(maps[2].path.as_deref(), Some("[stack]"));
        assert_eq!(maps[3].path, None);
    }

    #[test]
    fn the_kernel_asked_for_one_address_answers_as_the_whole_list_says() {
        let maps = read_maps(std::process::id() as i32).unwrap();
        let asked = |address| mapping_at(std::process::id() as i32, address);
        if let Err(e) = asked(maps[0].start.0) {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "this kernel has PROCMAP_QUERY: {e}");
            eprintln!("skipped: this kernel answers no PROCMAP_QUERY ({e})");
            return;
        }
        // Files' mappings: other tests' threads map and unmap memory meanwhile.
        for m in maps.iter().filter(|m| m.inode != 0) {
            let found = asked(m.end.0 - 1).unwrap().unwrap_or_else(|| panic!("nothing at {:#x}", m.end.0 - 1));
            let key = |m: &Mapping| (m.start, m.end, m.readable, m.writable, m.executable, m.offset, m.device, m.inode);
            assert_eq!(key(&found), key(m), "{:?}", m.path);
        }
        assert!(asked(0).unwrap().is_none(), "nothing is mapped at 0");
    }

    #[test]
    fn this_process_sees_the_kernel_s_thread_ids_and_one_in_a_pid_namespace_does_not() {
        // Tests run in the initial pid namespace (CI's machine, as root).
        assert!(sees_kernel_thread_ids(std::process::id() as i32));
        let Ok(mut child) = std::process::Command::new("unshare").args(["--pid", "--fork", "--kill-child", "sleep", "5"]).spawn() else {
            assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "unshare(1) runs here");
            return;
        };
        // `unshare` forks `sleep` into the new namespace: its child.
        let sleeper = loop {
            let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id())).unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                break pid.parse::<i32>().unwrap();
            }
            if let Some(status) = child.try_wait().unwrap() {
                // A pid namespace takes CAP_SYS_ADMIN.
                assert!(std::env::var_os("PROFTAP_TESTS_STRICT").is_none(), "unshare --pid ended ({status}) before it made its child");
                eprintln!("skipped: unshare --pid ended ({status}): making a pid namespace takes CAP_SYS_ADMIN");
                return;
            }
            std::thread::yield_now();
        };
        let sees = sees_kernel_thread_ids(sleeper);
        let _ = child.kill();
        let _ = child.wait();
        assert!(!sees, "a process in a pid namespace of its own");
    }

    #[test]
    fn a_mapped_files_device_and_inode_are_its_stat() {
        use std::os::unix::fs::MetadataExt;
        let maps = read_maps(std::process::id() as i32).expect("this process's maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("this executable");
        let mapped = maps.iter().find(|m| m.path.as_deref() == exe.to_str()).expect("this executable is mapped");
        let meta = std::fs::metadata(&exe).expect("stat");
        assert_eq!((mapped.device, mapped.inode), (meta.dev(), meta.ino()));
        assert_eq!(parse_maps("1000-2000 rw-p 00000000 00:00 0 \n")[0].device, 0);
    }

    #[test]
    fn paths_with_spaces_survive() {
        let maps = parse_maps("1000-2000 r-xp 00000000 fd:01 7    /tmp/my prog (deleted)\n");
        assert_eq!(maps[0].path.as_deref(), Some("/tmp/my prog (deleted)"));
    }

    #[test]
    fn a_missing_process_is_named() {
        let err = loaded_modules(i32::MAX).expect_err("no such pid");
        assert_eq!(err.to_string(), format!("no process with PID {} exists", i32::MAX));
    }
}

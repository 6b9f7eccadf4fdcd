//! Shared libraries an executable will load, found before it runs the way
//! its dynamic loader finds them (`DT_NEEDED`, `DT_RPATH`, `LD_LIBRARY_PATH`,
//! `DT_RUNPATH`, the loader's configured and default directories), by
//! reading files only. Nothing of the program is ever run: its interpreter
//! (`PT_INTERP`) is a path the program's author chose, and running it with
//! `--list`, as `ldd` does, runs their code with proftap's rights.

use crate::symbols::ElfImage;
use object::read::elf::{Dyn as _, ProgramHeader as _};
use object::{Object, elf};
use std::collections::{HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The most libraries followed from one executable: a bound on what a
/// crafted chain of `DT_NEEDED` entries can make proftap read.
const MOST_LIBRARIES: usize = 2_000;

/// Where glibc looks after the configured directories, on x86-64 Debian
/// and Ubuntu (multiarch) and elsewhere.
const DEFAULT_DIRS: &[&str] = &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// What the loader knows of one object: the libraries it needs and where
/// it says to look for them.
struct Dynamic {
    needed: Vec<String>,
    rpath: Vec<String>,
    runpath: Vec<String>,
    machine: object::Architecture,
}

/// The libraries `exe` loads at start, by path, its interpreter included;
/// empty for static executables. `library_path` is the `LD_LIBRARY_PATH`
/// the program will run with. Libraries that cannot be found or read are
/// left out, as the loader would fail on them anyway.
pub fn needed_libraries(exe: &Path, library_path: Option<&OsStr>) -> Vec<PathBuf> {
    let Ok(image) = ElfImage::open(exe) else { return Vec::new() };
    let Some(main) = dynamic(&image) else { return Vec::new() };
    let interpreter = interpreter(&image);
    let env_dirs: Vec<String> = library_path
        .map(|p| p.as_bytes().split(|&b| b == b':' || b == b';').map(|d| String::from_utf8_lossy(d).into_owned()).collect())
        .unwrap_or_default();
    let configured = configured_dirs(Path::new("/etc/ld.so.conf"));
    let mut found: Vec<PathBuf> = Vec::new();
    // The loader is loaded already: a library needing it by name gets it.
    let mut seen: HashSet<String> = interpreter.iter().filter_map(|i| i.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    let mut queue: VecDeque<(PathBuf, Dynamic)> = VecDeque::from([(exe.to_path_buf(), main)]);
    let main_rpath = queue[0].1.rpath.clone();
    while let Some((object, info)) = queue.pop_front() {
        let origin = object.parent().map(Path::to_path_buf).unwrap_or_default();
        for name in &info.needed {
            if found.len() >= MOST_LIBRARIES || !seen.insert(name.clone()) {
                continue;
            }
            let search = SearchPath { origin: &origin, info: &info, main_rpath: &main_rpath, env_dirs: &env_dirs, configured: &configured };
            if let Some((path, library)) = search.find(name) {
                found.push(path.clone());
                queue.push_back((path, library));
            }
        }
    }
    if let Some(interpreter) = interpreter.filter(|i| i.is_file() && !found.contains(i)) {
        found.push(interpreter);
    }
    found
}

/// The directories one object's needed libraries are looked for in.
struct SearchPath<'a> {
    origin: &'a Path,
    info: &'a Dynamic,
    main_rpath: &'a [String],
    env_dirs: &'a [String],
    configured: &'a [PathBuf],
}

impl SearchPath<'_> {
    /// The first candidate for `name` that is an ELF object of the
    /// executable's machine, in the loader's order.
    fn find(&self, name: &str) -> Option<(PathBuf, Dynamic)> {
        if name.contains('/') {
            return self.candidate(PathBuf::from(expand(name, self.origin)));
        }
        // DT_RPATH counts only for an object without DT_RUNPATH.
        let rpath: &[String] = if self.info.runpath.is_empty() { &self.info.rpath } else { &[] };
        let main_rpath: &[String] = if self.info.runpath.is_empty() { self.main_rpath } else { &[] };
        let listed = rpath.iter().chain(main_rpath).chain(self.env_dirs).chain(&self.info.runpath);
        let expanded = listed.filter(|d| !d.is_empty()).map(|d| PathBuf::from(expand(d, self.origin)));
        let fixed = self.configured.iter().cloned().chain(DEFAULT_DIRS.iter().map(PathBuf::from));
        expanded.chain(fixed).find_map(|dir| self.candidate(dir.join(name)))
    }

    fn candidate(&self, path: PathBuf) -> Option<(PathBuf, Dynamic)> {
        if !path.is_file() {
            return None;
        }
        let image = ElfImage::open(&path).ok()?;
        let info = dynamic(&image)?;
        (info.machine == self.info.machine).then_some((path, info))
    }
}

/// `$ORIGIN`, `$LIB` and `$PLATFORM` as glibc expands them on x86-64.
fn expand(text: &str, origin: &Path) -> String {
    let origin = origin.to_string_lossy();
    let mut out = text.to_string();
    for (token, value) in [("ORIGIN", origin.as_ref()), ("LIB", "lib/x86_64-linux-gnu"), ("PLATFORM", "x86_64")] {
        out = out.replace(&format!("${{{token}}}"), value).replace(&format!("${token}"), value);
    }
    out
}

fn dynamic(image: &ElfImage) -> Option<Dynamic> {
    let elf = image.parse().ok()?;
    let endian = elf.endian();
    let data = image.data();
    let sections = elf.elf_section_table();
    let mut info = Dynamic { needed: Vec::new(), rpath: Vec::new(), runpath: Vec::new(), machine: elf.architecture() };
    let Ok(Some((entries, link))) = sections.dynamic(endian, data) else { return Some(info) };
    let strings = sections.strings(endian, data, link).ok()?;
    for entry in entries {
        let Ok(text) = entry.string(endian, strings) else { continue };
        let text = String::from_utf8_lossy(text).into_owned();
        let split = || text.split(':').map(str::to_string).collect::<Vec<_>>();
        match entry.d_tag(endian) {
            elf::DT_NEEDED => info.needed.push(text),
            elf::DT_RPATH => info.rpath.extend(split()),
            elf::DT_RUNPATH => info.runpath.extend(split()),
            _ => {}
        }
    }
    Some(info)
}

fn interpreter(image: &ElfImage) -> Option<PathBuf> {
    let elf = image.parse().ok()?;
    let interp = elf
        .elf_program_headers()
        .iter()
        .find_map(|ph| (ph.p_type(elf.endian()) == elf::PT_INTERP).then(|| ph.data(elf.endian(), image.data()).ok()).flatten())?;
    let end = interp.iter().position(|&b| b == 0).unwrap_or(interp.len());
    Some(PathBuf::from(OsStr::from_bytes(&interp[..end])))
}

/// The directories of `/etc/ld.so.conf` and the files it includes, in order.
fn configured_dirs(conf: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut visited = HashSet::new();
    read_conf(conf, &mut dirs, &mut visited);
    dirs
}

fn read_conf(conf: &Path, dirs: &mut Vec<PathBuf>, visited: &mut HashSet<PathBuf>) {
    // Bounded: a loop of includes is read once.
    let key = conf.canonicalize().unwrap_or_else(|_| conf.to_path_buf());
    if visited.len() > 256 || !visited.insert(key) {
        return;
    }
    let Ok(text) = std::fs::read_to_string(conf) else { return };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if let Some(pattern) = line.strip_prefix("include").filter(|p| p.starts_with(char::is_whitespace)) {
            for file in matching(pattern.trim(), conf) {
                read_conf(&file, dirs, visited);
            }
        } else if line.starts_with('/') {
            dirs.push(PathBuf::from(line));
        }
    }
}

/// The files an `include` pattern names: a `*` is allowed in the last part.
fn matching(pattern: &str, conf: &Path) -> Vec<PathBuf> {
    let pattern = match Path::new(pattern) {
        p if p.is_absolute() => p.to_path_buf(),
        p => conf.parent().unwrap_or(Path::new("/")).join(p),
    };
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name().and_then(|n| n.to_str())) else { return Vec::new() };
    let Ok(glob) = globset::Glob::new(name).map(|g| g.compile_matcher()) else { return Vec::new() };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| glob.is_match(n))).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_needs_libc_and_its_loader() {
        let libs = needed_libraries(Path::new("/bin/sh"), None);
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "{libs:?}");
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("ld-linux")), "{libs:?}");
    }

    #[test]
    fn origin_and_platform_tokens_expand() {
        assert_eq!(expand("$ORIGIN/../lib", Path::new("/opt/app/bin")), "/opt/app/bin/../lib");
        assert_eq!(expand("${ORIGIN}/x/$PLATFORM", Path::new("/a")), "/a/x/x86_64");
    }

    #[test]
    fn included_configuration_files_are_read_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("ld.so.conf");
        let included = dir.path().join("conf.d");
        std::fs::create_dir(&included).expect("mkdir");
        std::fs::write(&conf, "# comment\n/first\ninclude conf.d/*.conf\n").expect("write");
        std::fs::write(included.join("a.conf"), "/second # trailing\ninclude ../ld.so.conf\n").expect("write");
        std::fs::write(included.join("b.txt"), "/ignored\n").expect("write");
        assert_eq!(configured_dirs(&conf), vec![PathBuf::from("/first"), PathBuf::from("/second")]);
    }
}

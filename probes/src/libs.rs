//! Shared libraries an executable will load, found before it runs by asking
//! its dynamic loader (`ld.so --list`, what `ldd` does) without running it.

use crate::symbols::ElfImage;
use object::Object;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries `exe` loads at start, by path; empty for static binaries.
pub fn needed_libraries(exe: &Path) -> Vec<PathBuf> {
    let Some(interpreter) = interpreter(exe) else { return Vec::new() };
    let Ok(out) = Command::new(&interpreter).arg("--list").arg(exe).output() else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    parse_list(&String::from_utf8_lossy(&out.stdout))
}

fn interpreter(exe: &Path) -> Option<PathBuf> {
    let image = ElfImage::open(exe).ok()?;
    let elf = image.parse().ok()?;
    let interp = elf.elf_program_headers().iter().find_map(|ph| {
        use object::read::elf::ProgramHeader;
        (ph.p_type(elf.endian()) == object::elf::PT_INTERP).then(|| ph.data(elf.endian(), image.data()).ok()).flatten()
    })?;
    let _ = elf.architecture();
    let end = interp.iter().position(|&b| b == 0).unwrap_or(interp.len());
    Some(PathBuf::from(String::from_utf8_lossy(&interp[..end]).into_owned()))
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)` lines to paths.
fn parse_list(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let path = path.rsplit_once(" (").map_or(path, |(p, _)| p).trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_lists_parse() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f00)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f11)\n\tlibgone.so => not found\n";
        assert_eq!(parse_list(text), vec![PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"), PathBuf::from("/lib64/ld-linux-x86-64.so.2")]);
    }

    #[test]
    fn a_dynamic_executable_needs_libc() {
        let libs = needed_libraries(Path::new("/bin/sh"));
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "{libs:?}");
    }
}

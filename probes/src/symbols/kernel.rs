//! The kernel's functions, from `/proc/kallsyms`: what a sample taken in
//! the kernel was doing there (a page fault, a system call), named as perf
//! names it. The kernel shows their addresses only to a process allowed to
//! observe it (`kptr_restrict`, `perf_event_paranoid`, `CAP_SYSLOG`); to
//! any other it shows zeros, and the table is then empty: nothing is named
//! that the reader could not have read itself.
//!
//! The kernel formats the file anew at every read (tens of milliseconds of
//! its time, competing with the program being recorded), while its own
//! functions and its modules' stay where they are for the whole boot: the
//! table is kept for the boot (`boot_cache`), valid while the same modules
//! are loaded at the same places. Code the kernel makes as it runs (BPF
//! programs, trampolines) is not kept: an address outside the kernel's
//! code and its modules' is looked up in the file read afresh.

use crate::boot_cache;
use std::ops::RangeInclusive;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::OnceLock;

/// The module perf gives the kernel's own functions.
pub const KERNEL_IMAGE: &str = "[kernel.kallsyms]";

/// The kernel's text symbols, by address. A loadable module's functions
/// are named as the kernel's own (perf names their module; a sample's
/// kernel frame is one frame, whatever module it is in).
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (start address, where its name is in `names`), sorted by address.
    starts: Vec<(u64, std::ops::Range<u32>)>,
    /// Every name, one after another: one allocation, not one each.
    names: String,
    /// For a table kept from earlier in the boot, the addresses it names
    /// as the file read now would: the kernel's own code and the modules'.
    covers: Option<Vec<RangeInclusive<u64>>>,
}

/// The most lines read from the file: today's kernels have about 200 000.
const MOST_SYMBOLS: usize = 4_000_000;

impl KernelSymbols {
    /// The running kernel's, read once (empty when they cannot be read or
    /// their addresses are hidden from this process).
    pub fn running() -> &'static KernelSymbols {
        static RUNNING: OnceLock<KernelSymbols> = OnceLock::new();
        RUNNING.get_or_init(|| {
            // Hidden from this process now (kptr_restrict, perf_event_paranoid
            // changed since): nothing kept is shown either.
            if !addresses_shown() {
                return KernelSymbols::default();
            }
            let key = CacheKey::now();
            let path = boot_cache::dir().map(|dir| dir.join("kernel-symbols"));
            if let Some(kept) = path.as_deref().and_then(read_own).and_then(|text| Self::from_cache(&text, &key)) {
                return kept;
            }
            let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
            let table = Self::parse(text.as_str());
            // Kept only if no module came or went while the file was read.
            let unchanged = CacheKey::now().text() == key.text();
            if let (Some(path), false, true) = (&path, table.is_empty(), unchanged) {
                let kept = cache_text(&text, &key);
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = proftap_profile::write_private(path, |out| out.write_all(kept.as_bytes()));
            }
            table
        })
    }

    /// The file read now, once, for what a kept table does not cover.
    fn afresh() -> &'static KernelSymbols {
        static AFRESH: OnceLock<KernelSymbols> = OnceLock::new();
        AFRESH.get_or_init(|| std::fs::read_to_string("/proc/kallsyms").map(Self::parse).unwrap_or_default())
    }

    /// A table kept earlier (its file's text), if it was kept in the boot
    /// `boot_id` with the modules `/proc/modules` lists (its text) loaded
    /// where they are.
    pub fn read_kept(text: &str, boot_id: &str, modules: &str) -> Option<KernelSymbols> {
        Self::from_cache(text, &CacheKey::of(boot_id, modules))
    }

    /// A table kept by [`cache_text`], if it was kept with `key`.
    fn from_cache(text: &str, key: &CacheKey) -> Option<KernelSymbols> {
        let (header, symbols) = text.strip_suffix(CACHE_END)?.split_once('\n')?;
        let mut fields = header.strip_prefix(CACHE_HEADER)?.split_ascii_whitespace();
        if fields.next()? != key.text() {
            return None;
        }
        let kernel_start = u64::from_str_radix(fields.next()?, 16).ok()?;
        let kernel_end = u64::from_str_radix(fields.next()?, 16).ok()?;
        let mut table = Self::parse(symbols);
        let modules = key.modules.iter().map(|&(start, size)| start..=start.saturating_add(size.saturating_sub(1)));
        table.covers = Some(std::iter::once(kernel_start..=kernel_end).chain(modules).collect());
        (!table.is_empty()).then_some(table)
    }

    /// Reads the `/proc/kallsyms` format: `address type name [module]`.
    /// Only functions (text symbols) are kept; a line that does not parse
    /// is skipped. The text itself holds the names.
    pub fn parse(text: impl Into<String>) -> KernelSymbols {
        let names: String = text.into();
        let mut starts = Vec::with_capacity(names.len() / 40);
        let base = names.as_ptr() as usize;
        for line in names.lines().take(MOST_SYMBOLS) {
            if let Some((address, name)) = text_symbol(line) {
                let at = name.as_ptr() as usize - base;
                let (Ok(start), Ok(end)) = (u32::try_from(at), u32::try_from(at + name.len())) else { break };
                starts.push((address, start..end));
            }
        }
        // Stable: of several names at one address, the first listed wins.
        starts.sort_by_key(|(address, _)| *address);
        starts.dedup_by_key(|(address, _)| *address);
        KernelSymbols { starts, names, covers: None }
    }

    /// The function `address` is in: the nearest one starting at or below
    /// it (kallsyms gives no sizes). None below the first, or with no table.
    pub fn function_at(&self, address: u64) -> Option<&str> {
        if self.covers.as_ref().is_some_and(|covers| !covers.iter().any(|range| range.contains(&address))) {
            return Self::afresh().function_at(address);
        }
        let after = self.starts.partition_point(|&(start, _)| start <= address);
        let (_, name) = self.starts.get(after.checked_sub(1)?)?;
        // Past the end of the kernel's code (before the modules'): none.
        self.names.get(name.start as usize..name.end as usize).filter(|&name| name != "_etext")
    }

    /// Whether no function could be read.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// A text symbol's address and name, if `line` is one (`address type
/// name [module]`, fields apart by spaces or tabs).
fn text_symbol(line: &str) -> Option<(u64, &str)> {
    // The kernel writes addresses 16 digits wide and a kind of one letter:
    // found where they are, not searched for (most of the time went there).
    let (address, rest) = match line.as_bytes().get(16) {
        Some(b' ') => (line.get(..16)?, line.get(17..)?),
        _ => line.split_once(' ')?,
    };
    let (kind, rest) = match rest.as_bytes().get(1) {
        Some(b' ') => (rest.get(..1)?, rest.get(2..)?),
        _ => rest.split_once(' ')?,
    };
    if !matches!(kind, "t" | "T" | "w" | "W") {
        return None;
    }
    let name = rest.get(..rest.bytes().position(|b| b.is_ascii_whitespace()).unwrap_or(rest.len()))?;
    let address = u64::from_str_radix(address, 16).ok().filter(|&a| a != 0)?;
    (!name.is_empty()).then_some((address, name))
}

/// What a kept table starts with, then its key and where the kernel's own
/// functions start and end.
const CACHE_HEADER: &str = "proftap kernel symbols 2 ";

/// What a whole kept table ends with.
const CACHE_END: &str = "proftap end\n";

/// The most bytes of a kept table read: about 5 MB for 200 000 symbols.
const MOST_CACHE_BYTES: u64 = 256 << 20;

/// What a kept table is valid for: this boot, with these modules loaded
/// at these places.
struct CacheKey {
    boot_id: String,
    /// Each module's start and size, as `/proc/modules` gives them.
    modules: Vec<(u64, u64)>,
    /// A checksum of the modules' names, sizes and places.
    modules_sum: u32,
}

impl CacheKey {
    fn now() -> CacheKey {
        CacheKey::of(&boot_cache::boot_id(), &std::fs::read_to_string("/proc/modules").unwrap_or_default())
    }

    /// From a boot id and the text of `/proc/modules` (`name size
    /// references users state address`, the references changing as it is
    /// used).
    fn of(boot_id: &str, modules: &str) -> CacheKey {
        let mut sum = crc32fast::Hasher::new();
        let mut places = Vec::new();
        for line in modules.lines() {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let (Some(name), Some(size), Some(address)) = (fields.first(), fields.get(1), fields.get(5)) else { continue };
            sum.update(format!("{name} {size} {address}\n").as_bytes());
            let size = size.parse().unwrap_or(0);
            let start = address.strip_prefix("0x").and_then(|a| u64::from_str_radix(a, 16).ok()).unwrap_or(0);
            places.push((start, size));
        }
        CacheKey { boot_id: boot_id.replace(char::is_whitespace, ""), modules: places, modules_sum: sum.finalize() }
    }

    fn text(&self) -> String {
        format!("{}/{:08x}", self.boot_id, self.modules_sum)
    }
}

/// The functions of `kallsyms` (the file's text) worth keeping for the
/// boot, under a header naming `key`: the kernel's own and its modules',
/// not code the kernel makes as it runs (modules named `[bpf]` and
/// `[__builtin__...]`).
fn cache_text(kallsyms: &str, key: &CacheKey) -> String {
    let kept: Vec<&str> = kallsyms
        .lines()
        .filter(|line| {
            let module = line.split_ascii_whitespace().nth(3).unwrap_or("");
            module != "[bpf]" && !module.starts_with("[__builtin__")
        })
        .collect();
    // The kernel's own functions are those with no module.
    let kernel: Vec<u64> = kept
        .iter()
        .filter(|line| line.split_ascii_whitespace().nth(3).is_none())
        .filter_map(|line| u64::from_str_radix(line.split_ascii_whitespace().next()?, 16).ok())
        .filter(|&address| address != 0)
        .collect();
    let (kernel_start, kernel_end) = (kernel.iter().min().copied().unwrap_or(0), kernel.iter().max().copied().unwrap_or(0));
    let mut text = format!("{CACHE_HEADER}{} {kernel_start:x} {kernel_end:x}\n", key.text());
    for line in kept {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(CACHE_END);
    text
}

/// Whether `/proc/kallsyms` shows this process addresses (its first line,
/// which the kernel formats alone).
fn addresses_shown() -> bool {
    use std::io::Read;
    let mut first = [0u8; 64];
    let read = std::fs::File::open("/proc/kallsyms").and_then(|mut f| f.read(&mut first)).unwrap_or(0);
    let line = String::from_utf8_lossy(&first[..read]);
    line.split_ascii_whitespace().next().and_then(|a| u64::from_str_radix(a, 16).ok()).is_some_and(|a| a != 0)
}

/// The file at `path` if this user owns it (and it is not too large).
fn read_own(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 || meta.len() > MOST_CACHE_BYTES {
        return None;
    }
    let mut text = String::with_capacity(usize::try_from(meta.len()).ok()?);
    file.take(MOST_CACHE_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_address_is_named_by_the_nearest_function_below_it() {
        let table = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000000 T _text\n\
             ffffffff81001000 t clear_page_erms\n\
             ffffffff81002000 D some_data\n\
             ffffffff81003000 T copy_to_user\n\
             ffffffff81004000 T _etext\n\
             garbage line\n\
             ffffffffc0001000 t snd_open\t[snd]\n",
        );
        let at = |address| table.function_at(address);
        assert_eq!(at(0xffffffff80ffffff), None);
        assert_eq!(at(0xffffffff81000010), Some("_stext"));
        assert_eq!(at(0xffffffff81001fff), Some("clear_page_erms"));
        // Data is not a function: the function before it goes on.
        assert_eq!(at(0xffffffff81002010), Some("clear_page_erms"));
        assert_eq!(at(0xffffffff81004010), None, "past the kernel's code");
        assert_eq!(at(0xffffffffc0001234), Some("snd_open"));
    }

    #[test]
    fn hidden_addresses_make_an_empty_table() {
        let table = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 t clear_page_erms\n");
        assert!(table.is_empty());
        assert_eq!(table.function_at(0xffffffff81001000), None);
    }

    const KALLSYMS: &str = "ffffffff81000000 T _stext\n\
                            ffffffff81001000 t clear_page_erms\n\
                            ffffffff81004000 T _etext\n\
                            ffffffffc0001000 t snd_open\t[snd]\n\
                            ffffffffc0100000 t bpf_prog_6deef7357e7b4530_sd_fw_egress\t[bpf]\n";
    const MODULES: &str = "snd 8192 2 - Live 0xffffffffc0001000\n";

    #[test]
    fn a_kept_table_names_what_it_kept_for_the_same_boot_and_modules() {
        let key = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", MODULES);
        let kept = KernelSymbols::from_cache(&cache_text(KALLSYMS, &key), &key).expect("kept for this key");
        assert_eq!(kept.function_at(0xffffffff81001fff), Some("clear_page_erms"));
        assert_eq!(kept.function_at(0xffffffffc0001234), Some("snd_open"));
        let covered = |address| kept.covers.as_ref().unwrap().iter().any(|r| r.contains(&address));
        assert!(covered(0xffffffff81003000) && covered(0xffffffffc0002fff));
        // A BPF program is not kept: its address is looked up afresh.
        assert!(!covered(0xffffffffc0100010), "{:?}", kept.covers);
        // Below the kernel (where another architecture keeps modules and BPF code): not kept either.
        assert!(!covered(0xffffffff80000000));
        assert!(!kept.names.contains("bpf_prog"));
    }

    #[test]
    fn a_kept_table_is_not_used_after_a_reboot_or_a_module_change() {
        let key = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", MODULES);
        let text = cache_text(KALLSYMS, &key);
        let rebooted = CacheKey::of("00000000-b365-4807-95b6-863eae1ed95e", MODULES);
        assert!(KernelSymbols::from_cache(&text, &rebooted).is_none());
        let reloaded = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", "snd 8192 2 - Live 0xffffffffc0009000\n");
        assert!(KernelSymbols::from_cache(&text, &reloaded).is_none());
        // Its users changing is not a change of place.
        let used = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", "snd 8192 5 - Live 0xffffffffc0001000\n");
        assert!(KernelSymbols::from_cache(&text, &used).is_some());
        for broken in
            ["", "proftap kernel symbols 1 ", "garbage\nffffffff81000000 T _stext\n", &text[..text.len() - 1], &text[..text.len() / 2]]
        {
            assert!(KernelSymbols::from_cache(broken, &key).is_none(), "{broken:?}");
        }
    }
}

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
//! are loaded at the same places, as the table itself (parsing its 120,000
//! lines again took 8 ms of each recording's start). Code the kernel makes
//! as it runs (BPF programs, trampolines) is not kept: an address outside
//! the kernel's code and its modules' is looked up in the file read afresh.

use crate::boot_cache;
use std::ops::RangeInclusive;
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
            let kept = path.as_deref().and_then(|path| boot_cache::read_private(path, MOST_CACHE_BYTES));
            if let Some(kept) = kept.and_then(|bytes| Self::from_cache(&bytes, &key)) {
                return kept;
            }
            let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
            let table = Self::parse(text.as_str());
            // Kept only if no module came or went while the file was read.
            let unchanged = CacheKey::now().text() == key.text();
            if let (Some(path), false, true, Some(kept)) = (&path, table.is_empty(), unchanged, cache_bytes(&text, &key)) {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = proftap_profile::write_private(path, |out| out.write_all(&kept));
            }
            table
        })
    }

    /// The file read now, once, for what a kept table does not cover.
    fn afresh() -> &'static KernelSymbols {
        static AFRESH: OnceLock<KernelSymbols> = OnceLock::new();
        AFRESH.get_or_init(|| std::fs::read_to_string("/proc/kallsyms").map(Self::parse).unwrap_or_default())
    }

    /// A table kept earlier (its file's bytes), if it was kept in the boot
    /// `boot_id` with the modules `/proc/modules` lists (its text) loaded
    /// where they are.
    pub fn read_kept(bytes: &[u8], boot_id: &str, modules: &str) -> Option<KernelSymbols> {
        Self::from_cache(bytes, &CacheKey::of(boot_id, modules))
    }

    /// A table kept by [`cache_bytes`], if it was kept with `key` and is
    /// whole: its functions in address order, each name within the names.
    fn from_cache(bytes: &[u8], key: &CacheKey) -> Option<KernelSymbols> {
        let kept: KeptTable = postcard::from_bytes(bytes).ok()?;
        if kept.format != CACHE_FORMAT || kept.key != key.text() || kept.starts.is_empty() {
            return None;
        }
        let names = kept.names;
        let (mut address, mut at) = (0u64, 0u32);
        let mut starts = Vec::with_capacity(kept.starts.len());
        for (i, (after, len)) in kept.starts.into_iter().enumerate() {
            // In address order, each name within the names.
            if i > 0 && after == 0 {
                return None;
            }
            address = address.checked_add(after)?;
            let end = at.checked_add(len)?;
            names.get(at as usize..end as usize)?;
            starts.push((address, at..end));
            at = end;
        }
        let modules = key.modules.iter().map(|&(start, size)| start..=start.saturating_add(size.saturating_sub(1)));
        let covers = Some(std::iter::once(kept.kernel.0..=kept.kernel.1).chain(modules).collect());
        Some(KernelSymbols { starts, names, covers })
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

/// Changes whenever what is kept changes meaning.
const CACHE_FORMAT: u32 = 3;

/// A kept table: the functions by address, each as how far it starts
/// after the one before (from 0) and how long its name is in `names`,
/// which holds them one after another; under the key it was kept with,
/// and where the kernel's own functions start and end.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptTable {
    format: u32,
    key: String,
    kernel: (u64, u64),
    starts: Vec<(u64, u32)>,
    names: String,
}

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
/// boot, as a kept table under `key`: the kernel's own and its modules',
/// not code the kernel makes as it runs (modules named `[bpf]` and
/// `[__builtin__...]`).
fn cache_bytes(kallsyms: &str, key: &CacheKey) -> Option<Vec<u8>> {
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
    let kernel = (kernel.iter().min().copied().unwrap_or(0), kernel.iter().max().copied().unwrap_or(0));
    let table = KernelSymbols::parse(kept.join("\n"));
    // Only the names, one after another.
    let mut names = String::new();
    let mut starts = Vec::with_capacity(table.starts.len());
    let mut before = 0;
    for (address, name) in &table.starts {
        names.push_str(table.names.get(name.start as usize..name.end as usize)?);
        starts.push((address - before, name.end - name.start));
        before = *address;
    }
    postcard::to_stdvec(&KeptTable { format: CACHE_FORMAT, key: key.text(), kernel, starts, names }).ok()
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
        let kept = KernelSymbols::from_cache(&cache_bytes(KALLSYMS, &key).expect("kept"), &key).expect("kept for this key");
        assert_eq!(kept.function_at(0xffffffff81001fff), Some("clear_page_erms"));
        assert_eq!(kept.function_at(0xffffffffc0001234), Some("snd_open"));
        let covered = |address| kept.covers.as_ref().unwrap().iter().any(|r| r.contains(&address));
        assert!(covered(0xffffffff81003000) && covered(0xffffffffc0002fff));
        // A BPF program is not kept: its address is looked up afresh.
        assert!(!covered(0xffffffffc0100010), "{:?}", kept.covers);
        // Below the kernel (where another architecture keeps modules and BPF code): not kept either.
        assert!(!covered(0xffffffff80000000));
        assert!(!kept.names.contains("bpf_prog"));
        // Read back as the file read afresh would be.
        let fresh = KernelSymbols::parse(KALLSYMS);
        for address in [0xffffffff81000010, 0xffffffff81001fff, 0xffffffff81003fff, 0xffffffffc0001234] {
            assert_eq!(kept.function_at(address), fresh.function_at(address), "{address:x}");
        }
    }

    #[test]
    fn a_kept_table_is_not_used_after_a_reboot_or_a_module_change() {
        let key = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", MODULES);
        let text = cache_bytes(KALLSYMS, &key).expect("kept");
        let rebooted = CacheKey::of("00000000-b365-4807-95b6-863eae1ed95e", MODULES);
        assert!(KernelSymbols::from_cache(&text, &rebooted).is_none());
        let reloaded = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", "snd 8192 2 - Live 0xffffffffc0009000\n");
        assert!(KernelSymbols::from_cache(&text, &reloaded).is_none());
        // Its users changing is not a change of place.
        let used = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", "snd 8192 5 - Live 0xffffffffc0001000\n");
        assert!(KernelSymbols::from_cache(&text, &used).is_some());
        for end in 0..text.len() {
            assert!(KernelSymbols::from_cache(&text[..end], &key).is_none(), "cut at {end}");
        }
        for at in 0..text.len() {
            let mut damaged = text.clone();
            damaged[at] ^= 0x80;
            // Refused, or names what it names without a panic.
            if let Some(table) = KernelSymbols::from_cache(&damaged, &key) {
                let _ = table.function_at(0xffffffff81001000);
            }
        }
    }

    #[test]
    fn a_kept_table_out_of_order_or_naming_past_its_names_is_refused() {
        let key = CacheKey::of("8e93daa8-b365-4807-95b6-863eae1ed95e", MODULES);
        let table = |starts: Vec<(u64, u32)>, names: &str| {
            let kept = KeptTable { format: CACHE_FORMAT, key: key.text(), kernel: (1, 2), starts, names: names.into() };
            KernelSymbols::from_cache(&postcard::to_stdvec(&kept).expect("encodes"), &key)
        };
        let whole = table(vec![(1, 1), (1, 1)], "ab").expect("whole");
        assert_eq!((whole.function_at(1), whole.function_at(2)), (Some("a"), Some("b")));
        assert!(table(vec![(1, 1), (0, 1)], "ab").is_none(), "two at one address");
        assert!(table(vec![(1, 1), (1, 2)], "ab").is_none(), "past the names");
        assert!(table(vec![(1, 1), (u64::MAX, 1)], "ab").is_none(), "past the last address");
        assert!(table(vec![(1, 1)], "é").is_none(), "within a character");
        assert!(table(Vec::new(), "").is_none(), "empty");
    }
}

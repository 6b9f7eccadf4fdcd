//! The kernel's functions, from `/proc/kallsyms`: what a sample taken in
//! the kernel was doing there (a page fault, a system call), named as perf
//! names it. The kernel shows their addresses only to a process allowed to
//! observe it (`kptr_restrict`, `perf_event_paranoid`, `CAP_SYSLOG`); to
//! any other it shows zeros, and the table is then empty: nothing is named
//! that the reader could not have read itself.

use std::sync::OnceLock;

/// The module perf gives the kernel's own functions.
pub const KERNEL_IMAGE: &str = "[kernel.kallsyms]";

/// The kernel's text symbols, by address. A loadable module's functions
/// are named as the kernel's own (perf names their module; a sample's
/// kernel frame is one frame, whatever module it is in).
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (start address, index into `names`), sorted by address.
    starts: Vec<(u64, u32)>,
    names: Vec<String>,
}

/// The most lines read from the file: today's kernels have about 200 000.
const MOST_SYMBOLS: usize = 4_000_000;

impl KernelSymbols {
    /// The running kernel's, read once (empty when they cannot be read or
    /// their addresses are hidden from this process).
    pub fn running() -> &'static KernelSymbols {
        static RUNNING: OnceLock<KernelSymbols> = OnceLock::new();
        RUNNING.get_or_init(|| std::fs::read_to_string("/proc/kallsyms").map(|text| Self::parse(&text)).unwrap_or_default())
    }

    /// Reads the `/proc/kallsyms` format: `address type name [module]`.
    /// Only functions (text symbols) are kept; a line that does not parse
    /// is skipped.
    pub fn parse(text: &str) -> KernelSymbols {
        let mut table = KernelSymbols::default();
        for line in text.lines().take(MOST_SYMBOLS) {
            let mut fields = line.split_ascii_whitespace();
            let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else { continue };
            let Ok(address) = u64::from_str_radix(address, 16) else { continue };
            if address == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            table.starts.push((address, table.names.len() as u32));
            table.names.push(name.to_string());
        }
        // Stable: of several names at one address, the first listed wins.
        table.starts.sort_by_key(|&(address, _)| address);
        table.starts.dedup_by_key(|&mut (address, _)| address);
        table
    }

    /// The function `address` is in: the nearest one starting at or below
    /// it (kallsyms gives no sizes). None below the first, or with no table.
    pub fn function_at(&self, address: u64) -> Option<&str> {
        let after = self.starts.partition_point(|&(start, _)| start <= address);
        let &(_, index) = self.starts.get(after.checked_sub(1)?)?;
        // Past the end of the kernel's code (before the modules'): none.
        self.names.get(index as usize).map(String::as_str).filter(|&name| name != "_etext")
    }

    /// Whether no function could be read.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
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
}

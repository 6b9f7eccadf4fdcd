//! Where the runtime finds, when a second thread or process may count,
//! the counts made without `lock` while one thread counted
//! (`proftap_lock_counters` in `probes/runtime/runtime.c`): a table per
//! region of stubs, written after them, `next, region, region_bytes,
//! count`, then `count` entries, each a byte's address (low 56 bits) and
//! the byte to write there (top 8 bits). A user-space address has 47.

use std::ops::Range;

/// Bytes of a table of `entries` entries.
pub fn bytes(entries: usize) -> usize {
    8 * (HEADER + entries)
}

const HEADER: usize = 4;

/// The table of `entries` (where, the byte to write) for code in `region`,
/// before the table at `next` (0: none).
pub fn write(next: u64, region: &Range<u64>, entries: &[(u64, u8)]) -> Vec<u8> {
    let header = [next, region.start, region.end - region.start, entries.len() as u64];
    let entries = entries.iter().map(|&(at, byte)| at | u64::from(byte) << 56);
    header.into_iter().chain(entries).flat_map(u64::to_ne_bytes).collect()
}

/// Writes `entries` now, in a process held with one thread: what the
/// runtime would do at a thread's start, where no start is seen.
pub fn apply_now(remote: &super::remote::Remote, entries: &[(u64, u8)]) -> Result<(), super::remote::RemoteError> {
    let bytes: Vec<[u8; 1]> = entries.iter().map(|&(_, byte)| [byte]).collect();
    let pieces: Vec<(u64, &[u8])> = entries.iter().zip(&bytes).map(|(&(at, _), byte)| (at, byte.as_slice())).collect();
    remote.write_pieces(&pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_its_address_and_its_byte() {
        let table = write(0x10, &(0x1000..0x3000), &[(0x7fff_1234_5678, 0xf0), (0x2000, 0x2b)]);
        let words: Vec<u64> = table.chunks(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap())).collect();
        assert_eq!(words, [0x10, 0x1000, 0x2000, 2, 0xf000_7fff_1234_5678, 0x2b00_0000_0000_2000]);
        assert_eq!(table.len(), bytes(2));
    }
}

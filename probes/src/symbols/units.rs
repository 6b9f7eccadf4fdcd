//! Which compilation units of a file are read, and their abbreviation
//! tables parsed once each. A file can make both cost without bound: tens
//! of millions of empty units (a few bytes each, compressed to nearly
//! nothing), or thousands of units whose tables start inside one long
//! table, each of which gimli parses from its start to that table's end.

use gimli::{DebugAbbrevOffset, Reader, ReaderOffset, UnitHeader};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Units read of one file: past this, the rest are left unread. The
/// largest real programs have some tens of thousands (a web browser's).
pub(super) const MOST_UNITS: usize = 1 << 18;

/// Of `headers`, those whose abbreviation table ends before the next
/// table of any unit starts and, if several share it, parses; with how
/// many were left out; and into `dwarf`'s cache, once, each table that
/// more than one of them shares.
///
/// No compiler or linker starts a table inside another: where one does,
/// each unit's table would be parsed from its start on, through the
/// others, which is quadratic in the section.
pub(super) fn with_tables_apart<R: Reader>(dwarf: &mut gimli::Dwarf<R>, headers: Vec<UnitHeader<R>>) -> (Vec<UnitHeader<R>>, usize) {
    let mut units_of: BTreeMap<u64, usize> = BTreeMap::new();
    for header in &headers {
        *units_of.entry(header.debug_abbrev_offset().0.into_u64()).or_default() += 1;
    }
    let mut apart = tables_apart(&dwarf.debug_abbrev, &units_of.keys().copied().collect::<Vec<_>>());
    // A shared table gimli refuses would be parsed again for each of its
    // units, to fail each time: they are left out with it.
    let shared: Vec<u64> = units_of.iter().filter(|&(offset, &units)| units > 1 && apart.contains(offset)).map(|(&o, _)| o).collect();
    for offset in shared {
        let table = R::Offset::from_u64(offset).and_then(|at| Ok((at, dwarf.debug_abbrev.abbreviations(DebugAbbrevOffset(at))?)));
        match table {
            Ok((at, table)) => dwarf.abbreviations_cache.set::<R>(DebugAbbrevOffset(at), Arc::new(table)),
            Err(_) => {
                apart.remove(&offset);
            }
        }
    }
    let before = headers.len();
    let kept: Vec<_> = headers.into_iter().filter(|h| apart.contains(&h.debug_abbrev_offset().0.into_u64())).collect();
    let left_out = before - kept.len();
    (kept, left_out)
}

/// Of the tables at `starts` (sorted, distinct), those that end before the
/// next starts. Each byte of the section is read once.
fn tables_apart<R: Reader>(debug_abbrev: &gimli::DebugAbbrev<R>, starts: &[u64]) -> std::collections::HashSet<u64> {
    let section = gimli::Section::reader(debug_abbrev).to_slice().unwrap_or_default();
    let mut apart = std::collections::HashSet::new();
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(section.len() as u64, |&next| next.min(section.len() as u64));
        let table = usize::try_from(start).ok().zip(usize::try_from(end).ok()).and_then(|(s, e)| section.get(s..e));
        // A table that runs off the section's end is gimli's to refuse.
        if table.is_none_or(|table| i + 1 == starts.len() || ends_within(table)) {
            apart.insert(start);
        }
    }
    apart
}

/// Whether the abbreviation table at the start of `bytes` ends (with its
/// null entry) within them.
fn ends_within(bytes: &[u8]) -> bool {
    let mut at = 0;
    // A LEB128 number (signed ones end the same way) of ten bytes at most,
    // as gimli reads them (its check of the tenth byte's value left to
    // gimli, which refuses the table then); None past the end or past ten bytes.
    let mut number = || -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = *bytes.get(at)?;
            at += 1;
            value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    };
    loop {
        match number() {
            None => return false,
            Some(0) => return true,
            Some(_code) => {}
        }
        // The tag, then whether it has children: one byte, which reads as
        // a number of one byte or ends the table early, as gimli finds.
        if number().is_none() || number().is_none() {
            return false;
        }
        loop {
            let (Some(name), Some(form)) = (number(), number()) else { return false };
            if name == 0 && form == 0 {
                break;
            }
            if form == u64::from(gimli::DW_FORM_implicit_const.0) && number().is_none() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of `entries` abbreviations of `DW_TAG_subprogram` with no
    /// attributes, codes from `first` on, ended with its null entry.
    fn table(first: u8, entries: u8) -> Vec<u8> {
        let mut bytes: Vec<u8> = (first..first + entries).flat_map(|code| [code, 0x2e, 0, 0, 0]).collect();
        bytes.push(0);
        bytes
    }

    #[test]
    fn a_table_ends_at_its_null_entry_and_not_before() {
        let bytes = table(1, 3);
        assert!(ends_within(&bytes));
        assert!(!ends_within(&bytes[..bytes.len() - 1]), "no null entry: it runs on");
        // An implicit constant's value is read past, not taken for the end.
        let implicit = [1, 0x2e, 0, 0x03, 0x21, 0x00, 0, 0, 0];
        assert!(ends_within(&implicit));
        assert!(!ends_within(&implicit[..6]));
        // A number whose bytes all say "more" is cut at ten bytes.
        assert!(!ends_within(&[0x80; 100]));
        let mut long = vec![0x81; 10];
        long.extend([0, 0x2e, 0, 0, 0, 0]);
        assert!(!ends_within(&long), "a code of eleven bytes is no number");
    }

    #[test]
    fn a_table_starting_inside_another_leaves_that_ones_units_out() {
        // The unit at 0 names a table of four entries, the one at 10 the
        // last two of them: the first runs on through the second's. The
        // two units at 21 share a table apart from the rest.
        let mut section = table(1, 4);
        assert_eq!(section.len(), 21);
        section.extend(table(1, 2));
        let headers = [0u64, 10, 21, 21];
        let kept = kept_of(&section, &headers);
        assert_eq!(kept, vec![10, 21, 21], "the table at 0 runs into the one at 10");
        // Apart, every unit is read.
        let mut apart = table(1, 2);
        let second = apart.len() as u64;
        apart.extend(table(1, 2));
        assert_eq!(kept_of(&apart, &[0, second, second]), vec![0, second, second]);
    }

    #[test]
    fn units_sharing_a_table_that_does_not_parse_are_left_out() {
        // Two entries of one code: whole to the scan, refused by gimli,
        // which would parse it again for each unit.
        let twice: Vec<u8> = [&table(1, 1)[..5], &table(1, 1)].concat();
        assert!(ends_within(&twice));
        assert_eq!(kept_of(&twice, &[0, 0, 0]), Vec::<u64>::new());
        // One unit alone keeps it: gimli refuses it once, as it reads the unit.
        assert_eq!(kept_of(&twice, &[0]), vec![0]);
    }

    /// The abbreviation offsets of the units [`with_tables_apart`] keeps of
    /// empty DWARF 4 units naming `offsets` in `abbrev`.
    fn kept_of(abbrev: &[u8], offsets: &[u64]) -> Vec<u64> {
        let info: Vec<u8> = offsets
            .iter()
            .flat_map(|&o| [7u32.to_le_bytes().as_slice(), &4u16.to_le_bytes(), &(o as u32).to_le_bytes(), &[8]].concat())
            .collect();
        let sections = gimli::DwarfSections::load(|id| -> Result<Vec<u8>, ()> {
            Ok(match id {
                gimli::SectionId::DebugInfo => info.clone(),
                gimli::SectionId::DebugAbbrev => abbrev.to_vec(),
                _ => Vec::new(),
            })
        })
        .expect("sections");
        let mut dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
        let mut headers = Vec::new();
        let mut units = dwarf.units();
        while let Some(header) = units.next().expect("a unit header") {
            headers.push(header);
        }
        assert_eq!(headers.len(), offsets.len());
        let (kept, left_out) = with_tables_apart(&mut dwarf, headers);
        assert_eq!(kept.len() + left_out, offsets.len());
        kept.iter().map(|h| h.debug_abbrev_offset().0 as u64).collect()
    }
}

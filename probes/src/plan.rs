//! From selected functions to the probes a recording places.

use crate::addr::FileOffset;
use crate::entry::{EntryKind, classify_entry, uprobe_refuses};
use crate::exits::{ExitMode, emulated_entry, exit_offsets};
use crate::parallel::on_all_cpus;
use crate::select::Selected;
use crate::symbols::{ElfImage, SymbolIndex};
use proftap_profile::FunctionInfo;
use std::collections::HashMap;
use std::path::PathBuf;

/// Why a function is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A function of the profile: entry and return probes.
    Measured,
    /// Where the C++ runtime starts a catch handler (`__cxa_begin_catch`):
    /// an entry probe only. Frames below the catching frame are gone at
    /// that moment, so a call made right after the catch, at the same
    /// stack depth as a frame the exception left, is not mistaken for its callee.
    CatchMarker,
}

/// A function to probe.
#[derive(Clone, Debug)]
pub struct ProbedFunction {
    /// How the profile names it.
    pub info: FunctionInfo,
    /// The file the probe goes in (through `/proc/PID/root` for a live process).
    pub open_path: PathBuf,
    /// Entry offset in that file.
    pub offset: FileOffset,
    /// Size of its code in bytes (0 when unknown).
    pub size: u64,
    /// Cost class of the probed instruction.
    pub entry: EntryKind,
    /// Measured function or marker.
    pub role: Role,
    /// Where its returns are seen: `None` for a return probe (uretprobe),
    /// else the offsets of its `ret` and tail-jump instructions.
    pub exit_sites: Option<Vec<FileOffset>>,
    /// Where its entry is seen, when not at `offset`: a cheaper instruction
    /// of the entry block, and how far the stack pointer has moved down there.
    pub entry_probe: Option<(FileOffset, u64)>,
    /// The link-time address ranges of the cold parts the compiler split
    /// off it (`f.cold`): code of the function, jumped to, never called.
    pub cold: Vec<(u64, u64)>,
    /// The kernel refuses a uprobe on its entry instruction
    /// ([`crate::entry::uprobe_refuses`]).
    pub uprobe_refused: bool,
    /// Offsets from its entry, within its first bytes, that other code of
    /// its module branches to ([`entered_inside`]): a jump written over
    /// them would be landed in the middle of.
    pub entered_inside: Vec<u32>,
    /// Bytes after its code, before the next function, that hold only
    /// padding (`nop`, `int3`), up to 4 ([`padding_after`]): a jump
    /// written over a function shorter than the jump may take them.
    pub padding: u8,
    /// Bytes right before its entry, after the function before it, that
    /// hold only padding ([`padding_before`]): where a short jump over its
    /// entry may lead.
    pub padding_before: u8,
}

/// The probes for `selected` functions of `modules`; `images[m]` is module
/// `m`'s file as read (its code), `open_paths[m]` the path the probes open it
/// through. Functions without a file offset (not backed by the file) are
/// skipped and named in the warnings.
pub fn plan(
    modules: &[&SymbolIndex],
    images: &[Option<&ElfImage>],
    open_paths: &[PathBuf],
    selected: &[Selected],
    exits: ExitMode,
    warnings: &mut Vec<String>,
) -> Vec<ProbedFunction> {
    let mut planned = Vec::with_capacity(selected.len());
    // A scan of every function for each would take a second in a large program.
    let mut cold_by_module: HashMap<usize, ColdParts<'_>> = HashMap::new();
    let mut entered_by_module: HashMap<usize, EnteredInside> = HashMap::new();
    let mut spans_by_module: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
    for s in selected {
        let index = modules[s.module];
        let f = &index.functions[s.function];
        let Some(offset) = f.file_offset else {
            warnings.push(format!("{} in {} has no code in the file; not probed", f.name, index.path.display()));
            continue;
        };
        let file = images.get(s.module).copied().flatten().map_or(&[][..], |i| i.data());
        let code = file.get(offset.0 as usize..).unwrap_or(&[]);
        let cold =
            cold_by_module.entry(s.module).or_insert_with(|| cold_parts(index)).get(f.raw_name.as_str()).cloned().unwrap_or_default();
        let entered_inside =
            entered_by_module.entry(s.module).or_insert_with(|| entered_inside(index, file)).get(&f.address.0).cloned().unwrap_or_default();
        let spans = &*spans_by_module.entry(s.module).or_insert_with(|| function_spans(index));
        let exit_sites = match exits {
            // A return probe replaces the return address as a trampoline does.
            _ if crate::entry::return_address_untouchable(&f.name) => Some(Vec::new()),
            ExitMode::Uretprobe => None,
            ExitMode::ReturnSites => {
                let sites = exit_offsets(file, f.address, offset, f.size, &cold);
                if f.size == 0 {
                    warnings.push(format!("{}: its size is unknown, so its returns cannot be found; only its calls are counted", f.name));
                }
                // Returns in the cold part count too.
                let mut all = sites;
                for &(lo, hi) in &cold {
                    if let Some(cold_offset) = crate::symbols::file_offset(&index.segments, crate::addr::VirtAddr(lo)) {
                        all.extend(exit_offsets(
                            file,
                            crate::addr::VirtAddr(lo),
                            cold_offset,
                            hi - lo,
                            &[(f.address.0, f.address.0 + f.size)],
                        ));
                    }
                }
                Some(all)
            }
        };
        // With returns seen at return instructions, the entry probe may move
        // to an instruction the kernel emulates.
        let entry_probe = match exits {
            ExitMode::ReturnSites => {
                let body = code.get(..f.size as usize).unwrap_or(&[]);
                emulated_entry(f.address, body).map(|(at, pushed)| (FileOffset(offset.0 + at), pushed))
            }
            ExitMode::Uretprobe => None,
        };
        // A site where the entry is seen too (a function that is one tail
        // jump, or one `ret`) would report its return before or after its
        // entry, as the kernel happens to order the two probes: it has no
        // return of its own to see, and its calls are counted only.
        let entry_at = entry_probe.map_or(offset, |(at, _)| at);
        let exit_sites = exit_sites.map(|sites| sites.into_iter().filter(|&site| site != entry_at).collect());
        planned.push(ProbedFunction {
            info: FunctionInfo {
                name: f.name.clone(),
                module: index.path.display().to_string(),
                file: index.decl_path(f).map(str::to_string),
                line: f.decl_line,
                address: f.address.0,
                mode: proftap_profile::Mode::Instrumented,
                engine: None,
                calls_after_throttle: None,
                calls_counted_until_stopped: None,
                calls_after_counting_unknown: false,
            },
            open_path: open_paths[s.module].clone(),
            offset,
            size: f.size,
            entry: if entry_probe.is_some() { EntryKind::Emulated } else { classify_entry(code) },
            role: Role::Measured,
            exit_sites,
            uprobe_refused: uprobe_refuses(entry_probe.map_or(code, |(at, _)| file.get(at.0 as usize..).unwrap_or(&[]))),
            entry_probe,
            cold,
            entered_inside,
            padding: padding_after(spans, f.address.0, f.size, file, offset.0),
            padding_before: padding_before(spans, f.address.0, file, offset.0),
        });
    }
    planned
}

/// By function address, the offsets within its first bytes that code of
/// other functions branches to.
type EnteredInside = HashMap<u64, Vec<u32>>;

/// Bytes from a function's entry in which a branch from elsewhere matters:
/// an `endbr64` and the instructions a jump replaces.
const ENTRY_BYTES: u64 = 24;

/// Where code of `index`'s module (`file` its bytes) branches into the
/// first bytes of a function other than its own, past their start. The
/// code that does so is hand-written assembly (glibc's `mempcpy` goes on
/// at `memcpy`+3), which DWARF describes without a declaring file, or the
/// cold parts a compiler splits off; a compiler's own functions are
/// entered at their start alone, so only those are decoded.
pub fn entered_inside(index: &SymbolIndex, file: &[u8]) -> EnteredInside {
    let mut starts: Vec<u64> = index.functions.iter().filter(|f| f.size > 0).map(|f| f.address.0).collect();
    starts.sort_unstable();
    starts.dedup();
    let sources: Vec<_> = index.functions.iter().filter(|f| f.size > 0 && (f.decl_file.is_none() || f.is_cold_part())).collect();
    // A program whose symbol table alone names most functions (`node`'s
    // 60 MB of code) has them all decoded: 80 ms on one CPU.
    let found = on_all_cpus(sources, SOURCES_WORTH_THREADS, |source| branches_into_entries(source, &starts, file));
    let mut entered = EnteredInside::new();
    for (start, offset) in found.into_iter().flatten() {
        let offsets = entered.entry(start).or_default();
        if !offsets.contains(&offset) {
            offsets.push(offset);
        }
    }
    entered
}

/// Below this many functions to decode, they are decoded on the calling thread.
const SOURCES_WORTH_THREADS: usize = 2_000;

/// The branches of function `source` (its code in `file`) into the first
/// bytes of another function past its start (`starts`, sorted): each as
/// that function's start and the offset from it.
fn branches_into_entries(source: &crate::symbols::Function, starts: &[u64], file: &[u8]) -> Vec<(u64, u32)> {
    let Some(offset) = source.file_offset else { return Vec::new() };
    let Some(code) = offset.0.checked_add(source.size).and_then(|end| file.get(offset.0 as usize..end as usize)) else {
        return Vec::new();
    };
    // A lying symbol table's address and size may pass the end of the address space.
    let own = source.address.0..source.address.0.saturating_add(source.size);
    let decoder = iced_x86::Decoder::with_ip(64, code, source.address.0, iced_x86::DecoderOptions::NONE);
    let mut found = Vec::new();
    for instruction in decoder {
        if instruction.op0_kind() != iced_x86::OpKind::NearBranch64 {
            continue;
        }
        let target = instruction.near_branch_target();
        let start = match starts.binary_search(&target) {
            Ok(_) | Err(0) => continue,
            Err(i) => starts[i - 1],
        };
        if !own.contains(&target) && target - start < ENTRY_BYTES {
            found.push((start, (target - start) as u32));
        }
    }
    found
}

/// Address ranges of cold parts by the raw name of their function.
type ColdParts<'a> = HashMap<&'a str, Vec<(u64, u64)>>;

/// The address ranges of the cold parts the compiler split off functions
/// (`f.cold`, `f.cold.1`), by the raw name of the function they belong to:
/// every name a cold part's name starts with, up to a `.cold`.
fn cold_parts(index: &SymbolIndex) -> ColdParts<'_> {
    let mut parts = ColdParts::new();
    for c in index.functions.iter().filter(|c| c.is_cold_part()) {
        for (at, _) in c.raw_name.match_indices(".cold") {
            parts.entry(&c.raw_name[..at]).or_default().push((c.address.0, c.address.0 + c.size));
        }
    }
    parts
}

/// The catch marker for a process that uses the C++ runtime `libstdcxx`
/// (its file `image`, opened at `open_path`), or `None` when it has no
/// `__cxa_begin_catch`.
pub fn catch_marker(libstdcxx: &SymbolIndex, image: &ElfImage, open_path: &std::path::Path) -> Option<ProbedFunction> {
    let f = libstdcxx.functions.iter().find(|f| f.raw_name == "__cxa_begin_catch" || f.aliases.iter().any(|a| a == "__cxa_begin_catch"))?;
    let offset = f.file_offset?;
    let code = image.data().get(offset.0 as usize..offset.0 as usize + 16).map(<[u8]>::to_vec);
    Some(ProbedFunction {
        info: FunctionInfo {
            name: f.name.clone(),
            module: libstdcxx.path.display().to_string(),
            file: None,
            line: 0,
            address: f.address.0,
            mode: proftap_profile::Mode::Instrumented,
            engine: None,
            calls_after_throttle: None,
            calls_counted_until_stopped: None,
            calls_after_counting_unknown: false,
        },
        open_path: open_path.to_path_buf(),
        offset,
        size: f.size,
        entry: classify_entry(code.as_deref().unwrap_or(&[])),
        role: Role::CatchMarker,
        exit_sites: None,
        entry_probe: None,
        cold: Vec::new(),
        uprobe_refused: uprobe_refuses(code.as_deref().unwrap_or(&[])),
        entered_inside: Vec::new(),
        padding: 0,
        padding_before: 0,
    })
}

/// Every function's start in `index`, sorted, with the furthest end of
/// the functions starting there or before (one may hold others).
fn function_spans(index: &SymbolIndex) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = index.functions.iter().map(|f| (f.address.0, f.address.0.saturating_add(f.size))).collect();
    furthest_ends(&mut spans);
    spans
}

/// Sorts `spans` (start, end) by start, one a start, each with the
/// furthest end of those starting there or before.
fn furthest_ends(spans: &mut Vec<(u64, u64)>) {
    spans.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    spans.dedup_by_key(|s| s.0);
    let mut furthest = 0;
    for span in spans {
        furthest = furthest.max(span.1);
        span.1 = furthest;
    }
}

/// Whether `bytes`, at `address`, are `nop` and `int3` instructions that
/// end where they do: padding.
fn all_padding(bytes: &[u8], address: u64) -> bool {
    iced_x86::Decoder::with_ip(64, bytes, address, iced_x86::DecoderOptions::NONE)
        .into_iter()
        .all(|i| !i.is_invalid() && matches!(i.mnemonic(), iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3))
}

/// The padding after the function at `address`, `size` bytes long, whose
/// code is at `offset` in `file`: the `nop` and `int3` instructions that
/// follow it before the next of `spans`, counted up to 4 bytes (a jump is 5).
fn padding_after(spans: &[(u64, u64)], address: u64, size: u64, file: &[u8], offset: u64) -> u8 {
    let end = address.saturating_add(size);
    let next = spans.get(spans.partition_point(|&(s, _)| s <= address)).map_or(u64::MAX, |s| s.0);
    let gap = next.saturating_sub(end).min(16) as usize;
    let Some(after) = offset.checked_add(size).and_then(|at| file.get(at as usize..(at as usize).checked_add(gap)?)) else { return 0 };
    let mut decoder = iced_x86::Decoder::with_ip(64, after, end, iced_x86::DecoderOptions::NONE);
    let mut padding = 0usize;
    while decoder.can_decode() && padding < 4 {
        let instruction = decoder.decode();
        if instruction.is_invalid() || !matches!(instruction.mnemonic(), iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3) {
            break;
        }
        padding += instruction.len();
    }
    padding.min(4) as u8
}

/// Most bytes of padding before a function looked at: alignment leaves at most 63.
const MOST_PADDING_BEFORE: u64 = 63;

/// The padding before the function at `address`, whose code is at
/// `offset` in `file`: all the bytes from the furthest end of the
/// functions before it in `spans`, when they are `nop` and `int3`
/// instructions (else 0).
fn padding_before(spans: &[(u64, u64)], address: u64, file: &[u8], offset: u64) -> u8 {
    let Some(&(_, previous_end)) = spans.get(spans.partition_point(|&(s, _)| s < address).wrapping_sub(1)) else { return 0 };
    let gap = address.saturating_sub(previous_end);
    if gap == 0 || gap > MOST_PADDING_BEFORE {
        return 0;
    }
    let Some(bytes) = offset.checked_sub(gap).and_then(|from| file.get(from as usize..offset as usize)) else { return 0 };
    if all_padding(bytes, previous_end) { gap as u8 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The padding before a function runs from the furthest end of those
    /// before it (one may hold another), and is padding only if every byte
    /// of it is a `nop` or an `int3`.
    #[test]
    fn the_padding_before_a_function_is_all_nops_from_the_end_of_those_before() {
        // 0x1000: a function of 0x10 bytes holding one at 0x1004 of 4 bytes;
        // 0x1010..0x1018: nop dword [rax+rax+0]; int3 x3 (8 bytes); 0x1018: the function.
        let mut file = vec![0xc3; 0x10];
        file.extend([0x0f, 0x1f, 0x44, 0x00, 0x00, 0xcc, 0xcc, 0xcc]);
        file.extend([0xc3; 8]);
        let spans = [(0x1000, 0x1010), (0x1004, 0x1010), (0x1018, 0x1020)];
        assert_eq!(padding_before(&spans, 0x1018, &file, 0x18), 8);
        // Measured from the inner function's end, it would take code as padding.
        let mut nested = vec![(0x1018, 0x1020), (0x1004, 0x1008), (0x1000, 0x1010), (0x1000, 0x1002)];
        furthest_ends(&mut nested);
        assert_eq!(nested, [(0x1000, 0x1010), (0x1004, 0x1010), (0x1018, 0x1020)]);
        // A byte of code among them: none.
        file[0x12] = 0xc3;
        assert_eq!(padding_before(&spans, 0x1018, &file, 0x18), 0);
        // The first function: none.
        assert_eq!(padding_before(&spans, 0x1000, &file, 0), 0);
    }
}

//! Where a function's calls end.
//!
//! A uretprobe is the cheapest way to see a return: the kernel replaces the
//! return address on the stack with its trampoline. But an unwinder (a C++
//! throw, a Rust panic, `backtrace()`, `pthread_cancel`) that meets the
//! trampoline finds no unwind information there and the program terminates.
//! So for programs that unwind, proftap probes the function's own exits
//! instead: every `ret`, and every direct jump out of the function (a tail
//! call). The stack is never touched; a probe on `ret` costs a single-step.

use crate::addr::{FileOffset, VirtAddr};
use crate::entry::{EntryKind, classify_entry};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind, Register};

pub use proftap_profile::ExitMode;

/// Names whose presence means the program may unwind its stack: the C++ and
/// Rust runtimes, glibc's `backtrace()`, thread cancellation.
const UNWINDING: &[&str] = &[
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Backtrace",
    "_Unwind_ForcedUnwind",
    "__cxa_throw",
    "backtrace",
    "pthread_cancel",
    "pthread_exit",
];

/// Names whose presence means the program may switch stacks within a
/// thread (coroutines, fibers): the kernel keeps one chain of return
/// probes per thread, and a return on another stack than the chain's
/// takes another call's return address.
const STACK_SWITCHING: &[&str] = &["swapcontext", "setcontext", "jump_fcontext", "ontop_fcontext"];

/// Whether a module may unwind the stack or switch stacks: a runtime
/// library that does, or a module that imports or defines an unwinding or
/// stack-switching entry point.
pub fn unwinds(path: &std::path::Path, symbols: impl IntoIterator<Item = impl AsRef<str>>) -> bool {
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    ["libstdc++", "libgcc_s", "libunwind", "libc++"].iter().any(|p| file_name.starts_with(p))
        || symbols.into_iter().any(|s| UNWINDING.contains(&s.as_ref()) || STACK_SWITCHING.contains(&s.as_ref()))
}

/// The exit instructions of the code at `address` (`code` holds its bytes):
/// returns and direct jumps whose target is outside `[address, address +
/// code.len())` and outside `also_inside` (the function's cold part).
/// Offsets are relative to the start of `code`.
pub fn exit_sites(address: VirtAddr, code: &[u8], also_inside: &[(u64, u64)]) -> Vec<u64> {
    let end = address.0 + code.len() as u64;
    let inside = |target: u64| (address.0..end).contains(&target) || also_inside.iter().any(|&(lo, hi)| (lo..hi).contains(&target));
    let mut decoder = Decoder::with_ip(64, code, address.0, DecoderOptions::NONE);
    let mut sites = Vec::new();
    for instruction in &mut decoder {
        if instruction.is_invalid() {
            continue;
        }
        let exit = match instruction.flow_control() {
            FlowControl::Return => true,
            FlowControl::UnconditionalBranch => {
                instruction.mnemonic() == Mnemonic::Jmp && instruction.is_jmp_short_or_near() && !inside(instruction.near_branch_target())
            }
            _ => false,
        };
        if exit {
            sites.push(instruction.ip() - address.0);
        }
    }
    sites
}

/// File offsets of the exit sites of a function at `address` whose code
/// starts at `offset` in `file`.
pub fn exit_offsets(file: &[u8], address: VirtAddr, offset: FileOffset, size: u64, also_inside: &[(u64, u64)]) -> Vec<FileOffset> {
    let start = offset.0 as usize;
    let Some(code) = file.get(start..start.saturating_add(size as usize)) else { return Vec::new() };
    exit_sites(address, code, also_inside).into_iter().map(|rel| FileOffset(offset.0 + rel)).collect()
}

/// A cheaper place for a function's entry probe: the first instruction of
/// the entry block the kernel emulates, when the first instruction is one it
/// must single-step. Every call runs the entry block exactly once, so a
/// probe there counts the same calls. Only where no branch of the function
/// lands between the entry and that instruction, and the stack pointer moves
/// by a known amount before it. Returns (offset from the entry, bytes the
/// stack pointer moved down): the probe's stack pointer plus that is the
/// entry's. (Only with exits seen at return instructions: a return probe
/// must sit at the entry, where the return address is on top of the stack.)
pub fn emulated_entry(address: VirtAddr, code: &[u8]) -> Option<(u64, u64)> {
    if classify_entry(code) == EntryKind::Emulated {
        return None;
    }
    let mut decoder = Decoder::with_ip(64, code, address.0, DecoderOptions::NONE);
    let mut pushed: u64 = 0;
    let mut candidate = None;
    for instruction in &mut decoder {
        let at = instruction.ip() - address.0;
        if instruction.is_invalid() {
            return None;
        }
        if at > 0 && classify_entry(&code[at as usize..]) == EntryKind::Emulated {
            candidate = Some((at, pushed));
            break;
        }
        if instruction.flow_control() != FlowControl::Next {
            return None;
        }
        let immediate = || match instruction.op1_kind() {
            OpKind::Immediate8to64 | OpKind::Immediate32to64 => Some(instruction.immediate64()),
            OpKind::Immediate8 | OpKind::Immediate32 => Some(instruction.immediate32() as u64),
            _ => None,
        };
        match instruction.mnemonic() {
            Mnemonic::Sub if instruction.op0_register() == Register::RSP => pushed = pushed.checked_add(immediate()?)?,
            Mnemonic::Add if instruction.op0_register() == Register::RSP => pushed = pushed.checked_sub(immediate()?)?,
            Mnemonic::Pop => pushed = pushed.checked_sub(8)?,
            Mnemonic::Leave | Mnemonic::Enter => return None,
            _ if instruction.op0_register() == Register::RSP || instruction.op0_register() == Register::ESP => return None,
            _ => {}
        }
    }
    let (offset, pushed) = candidate?;
    // No branch of the function may land in the skipped instructions.
    let end = address.0 + code.len() as u64;
    let lands_inside = Decoder::with_ip(64, code, address.0, DecoderOptions::NONE).into_iter().any(|i| {
        matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call)
            && (address.0 + 1..=address.0 + offset).contains(&i.near_branch_target())
            && i.near_branch_target() < end
    });
    (!lands_inside).then_some((offset, pushed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_and_tail_jumps_are_exits_internal_jumps_are_not() {
        // 0: push rbp; 1: test edi,edi; 3: je +3 (to 8); 5: pop rbp; 6: jmp +0x20 (out);
        // 8: pop rbp; 9: ret; a: jmp -7 (to 5, inside); c: rep ret
        let code = [0x55, 0x85, 0xff, 0x74, 0x03, 0x5d, 0xeb, 0x20, 0x5d, 0xc3, 0xeb, 0xf9, 0xf3, 0xc3];
        assert_eq!(exit_sites(VirtAddr(0x1000), &code, &[]), vec![6, 9, 0xc]);
        // A jump into the cold part is not an exit.
        assert_eq!(exit_sites(VirtAddr(0x1000), &code, &[(0x1028, 0x1030)]), vec![9, 0xc]);
    }

    #[test]
    fn a_stepped_entry_moves_to_the_first_emulated_instruction() {
        // 0: mov eax, edi (stepped); 2: sub rsp, 0x18; 6: push rbx (emulated); 7: ret
        let code = [0x89, 0xf8, 0x48, 0x83, 0xec, 0x18, 0x53, 0xc3];
        assert_eq!(emulated_entry(VirtAddr(0x1000), &code), Some((6, 0x18)));
        // Already emulated at the entry: stay.
        assert_eq!(emulated_entry(VirtAddr(0x1000), &[0x55, 0xc3]), None);
        // A conditional branch is emulated and runs once per call: it will do.
        assert_eq!(emulated_entry(VirtAddr(0x1000), &[0x89, 0xf8, 0x74, 0x01, 0x53, 0xc3]), Some((2, 0)));
        // A branch the kernel steps (indirect jump) before any emulated instruction: stay.
        assert_eq!(emulated_entry(VirtAddr(0x1000), &[0x89, 0xf8, 0xff, 0xe0, 0x53, 0xc3]), None);
        // A loop back into the skipped instructions: stay.
        // 0: mov eax, edi; 2: mov ecx, esi; 4: push rbx; 5: jmp -5 (to 2)
        assert_eq!(emulated_entry(VirtAddr(0x1000), &[0x89, 0xf8, 0x89, 0xf1, 0x53, 0xeb, 0xfb]), None);
        // The stack pointer set in a way we cannot follow: stay.
        assert_eq!(emulated_entry(VirtAddr(0x1000), &[0x48, 0x89, 0xec, 0x53, 0xc3]), None);
    }

    #[test]
    fn unwinding_programs_are_recognised() {
        use std::path::Path;
        assert!(unwinds(Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"), [""; 0]));
        assert!(unwinds(Path::new("/app/prog"), ["printf", "backtrace"]));
        assert!(!unwinds(Path::new("/app/prog"), ["printf", "malloc"]));
    }
}

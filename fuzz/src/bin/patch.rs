//! The in-process engine's patches of any bytes as a function's code: the
//! plans of its entry (checked whole, or from its first instructions alone)
//! and of its returns, and the trampolines their instructions move to, as
//! `proftap run` makes them for every function of a program it is given
//! (the binary is the user's to write). A plan's instructions must land in
//! its trampoline where the trampoline says (a thread stopped at one goes
//! on from there), and those that depend on no address must land as the
//! same instructions.
//!
//! A short jump to an island must reach it, and the island must be five
//! bytes of the padding before the function or of its own code, past the
//! bytes the short jump replaces; taken out, an island in the function's
//! code jumps back to the entry.
//!
//! The input: a byte saying how many of the last bytes are padding after
//! the function (its value modulo 5), whether it is a compiler's code
//! (bit 3) and how many `int3` bytes pad it before (its high four bits),
//! then the code, at 0x40_1000.

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use proftap_probes::inject::patch::{
    CpuBlocks, IslandRoom, PatchPlan, SHORT_JUMP_LEN, count_call, count_call_on_cpu, plan, plan_checked, plan_returns, trampoline,
};

proftap_fuzz::target!(run);

const CODE: u64 = 0x40_1000;
/// Trampolines near the code, and out of a 32-bit displacement's reach.
const PLACES: [u64; 2] = [0x40_8000, 0x7fff_0000_0000];

fn run(data: &[u8]) {
    let Some((&shape, code)) = data.split_first() else { return };
    let padding = usize::from(shape % 5).min(code.len());
    let before = vec![0xcc; usize::from(shape >> 4)];
    let room = IslandRoom { before: &before, compiled: shape & 8 != 0 };
    let mut plans: Vec<PatchPlan> = plan(CODE, code, padding, room).into_iter().chain(plan_checked(CODE, code, padding)).collect();
    plans.extend(plan_returns(CODE, code).unwrap_or_default());
    for patch in &plans {
        check(code, &before, patch);
    }
}

fn check(code: &[u8], before: &[u8], patch: &PatchPlan) {
    let start = (patch.at - CODE) as usize;
    assert_eq!(code.get(start..start + patch.len()), Some(patch.original.as_slice()), "a plan's bytes are the code's");
    let (site, replaced) = patch.jump_site();
    assert_eq!(patch.jump_to(PLACES[0]).len(), replaced.len(), "the jump and its padding cover what it replaces exactly");
    if let Some(island) = &patch.island {
        assert_eq!(replaced.len(), 5, "an island holds a 5-byte jump");
        let source = match site.checked_sub(CODE) {
            Some(offset) => code.get(offset as usize..offset as usize + 5),
            None => before.len().checked_sub((CODE - site) as usize).and_then(|from| before.get(from..from + 5)),
        };
        assert_eq!(source, Some(island.original.as_slice()), "an island's bytes are the padding's or the code's");
        if site >= CODE {
            let back = Decoder::with_ip(64, &island.restored, site, DecoderOptions::NONE).decode();
            assert_eq!((back.len(), back.near_branch_target()), (SHORT_JUMP_LEN, patch.at), "taken out, an island jumps back to the entry");
        } else {
            assert_eq!(island.restored, island.original, "taken out, padding before the entry is padding again");
        }
        assert!(site >= patch.at + patch.len() as u64 || site + 5 <= CODE, "an island lies past the bytes its short jump replaces");
        let short = patch.short_jump().expect("a short jump reaches its island");
        assert_eq!(short.len(), patch.len());
        let jump = Decoder::with_ip(64, &short, patch.at, DecoderOptions::NONE).decode();
        assert_eq!((jump.len(), jump.near_branch_target()), (SHORT_JUMP_LEN, site), "the short jump leads to the island");
    }
    // Either count: one counter, or the running CPU's (a longer prologue).
    let counts: [fn(u64) -> Vec<u8>; 2] =
        [|own| count_call(own, own + 0x1000), |own| count_call_on_cpu(own, own + 0x1000, CpuBlocks { mask: 15, shift: 12 })];
    for (address, count) in PLACES.into_iter().flat_map(|a| counts.map(|c| (a, c))) {
        let Ok(moved) = trampoline(patch, address, |own| Ok(count(own))) else { continue };
        for &(from, to) in &moved.moved {
            let Some(original) = patch.replaced.iter().find(|i| i.ip() == from) else {
                // A return's own address: it goes on in proftap's code.
                assert_eq!(patch.replaced.last().map_or(patch.at, |i| i.next_ip()), from, "{from:#x} is no moved instruction");
                continue;
            };
            let offset = to.checked_sub(address).map(|o| o as usize).filter(|&o| o < moved.code.len());
            let offset = offset.unwrap_or_else(|| panic!("{from:#x} moved to {to:#x}, outside its trampoline at {address:#x}"));
            if original.is_ip_rel_memory_operand() || original.flow_control() != FlowControl::Next {
                continue;
            }
            // The same instruction, if not the same bytes (the encoder drops redundant prefixes).
            let landed = Decoder::with_ip(64, &moved.code[offset..], to, DecoderOptions::NONE).decode();
            assert!(landed == *original, "{from:#x} ({:?}) landed as {:?} at {to:#x}", original.code(), landed.code());
        }
    }
}

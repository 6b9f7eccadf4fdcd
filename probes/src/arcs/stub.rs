//! The code a site's jump leads to: its counters and the instructions the
//! jump replaced, moved, then back to the code after the window.
//!
//! ```text
//! lea rsp, [rsp-128]          ; only if the flags are live there:
//! pushfq                      ; a leaf function's red zone survives
//! lock inc qword [rip+counter]; `nop; inc` while one thread counts
//! popfq                       ; as pushfq
//! lea rsp, [rsp+128]
//! <region hooks>              ; each a call to the runtime (see
//!                             ; `inject::totals::region_hook`)
//! <the replaced instructions> ; a final jcc jumps to `taken:` if its
//!                             ; taken edge is counted; a final call
//!                             ; pushes its original return address
//!                             ; and jumps, unless what follows it is
//!                             ; counted: then it returns here
//! <not-taken counter>         ; as above, if counted
//! <after-call counter>        ; as above, if counted
//! jmp <end of the window>     ; unless the last one was a jmp or ret
//! taken: <taken counter>; jmp <the jcc's target>
//! ```
//!
//! The counter is addressed relative to rip. A process's code lies
//! anywhere in the address space (PIE, ASLR), so an absolute `[disp32]`,
//! which reaches only the lowest 2 GiB, would not do; the stubs are within
//! a rel32 of the code anyway (the window's jump), and the counters beside
//! them are within a rel32 of the stubs. No register is taken (a
//! `mov reg, imm64` would need one saved on the stack). `lock inc` is one
//! atomic read-modify-write: threads lose no increment.
//!
//! Everything is encoded by iced-x86's block encoder, which rewrites the
//! moved instructions' rip-relative operands and branches for their new
//! address. The moved instructions are given no address of their own
//! there, so that a branch of theirs back to the window's start (a loop of
//! one block) goes to the original code, through the jump, and counts again.

use super::Error;
use super::sites::{Place, Site, SiteCounter};
use crate::inject::patch::{call_from_original, is_emulated_call};
use iced_x86::{Code, FlowControl, IcedError, Instruction, MemoryOperand, Register};

/// Bytes below rsp that a leaf function may use without moving rsp.
const RED_ZONE: i64 = 128;

/// A site's stub.
#[derive(Clone, Debug)]
pub struct Stub {
    /// Its code, for its address.
    pub code: Vec<u8>,
    /// For each replaced instruction, its address in the original code and
    /// where a thread stopped there goes on in the stub (the first: the
    /// stub's start, so that its block still counts).
    pub moved: Vec<(u64, u64)>,
    /// From each address of the stub on (by address), the address in the
    /// original code a thread there stands for: where an unwinder finds the
    /// same stack. A call that returns into the stub returns to the second
    /// of these after it.
    pub origins: Vec<(u64, u64)>,
    /// Where an increment without `lock` has a `nop` before it: writing a
    /// `lock` prefix (0xf0) there makes it atomic, in place (see
    /// [`LOCK_PREFIX`]).
    pub lockable: Vec<u64>,
}

/// The `lock` prefix, written over the `nop` before an increment when a
/// second thread may start counting: the increment's end, and so its
/// rip-relative counter, stay where they were.
pub const LOCK_PREFIX: u8 = 0xf0;

/// Builds the stub of `site` at `address`, counter `i` of the placement
/// being the 8 bytes at `counters[i]`. Fails if a counter or something a
/// moved instruction refers to is out of a rel32's reach of `address`.
pub fn stub(site: &Site, address: u64, counters: &[u64]) -> Result<Stub, Error> {
    stub_with_hooks(site, address, counters, None)
}

/// [`stub`], with the site's region hooks calling the region trampoline
/// whose address is the 8 bytes at `hook_slot` (see
/// [`crate::inject::totals::region_hook`]). Fails if the site has hooks and
/// there is no slot.
pub fn stub_with_hooks(site: &Site, address: u64, counters: &[u64], hook_slot: Option<u64>) -> Result<Stub, Error> {
    let (code, origins, moved_from) = instructions(site, address, counters, hook_slot)?;
    let encoded = crate::inject::patch::encode_block(&code, address)
        .map_err(|e| Error::Stub { at: site.at, reason: format!("the stub cannot be encoded: {e}") })?;
    let starts = crate::inject::patch::encoded_starts(&encoded.code_buffer, address, &encoded.new_instruction_offsets)
        .map_err(|reason| Error::Stub { at: site.at, reason: format!("the stub cannot be encoded: {reason}") })?;
    let mut moved: Vec<(u64, u64)> =
        site.replaced.iter().enumerate().map(|(k, i)| (i.ip(), starts.get(moved_from + k).copied().unwrap_or(address))).collect();
    if let Some(first) = moved.first_mut() {
        first.1 = address;
    }
    let lockable =
        (1..code.len()).filter(|&k| code[k - 1].code() == Code::Nopd && increments(&code[k], counters)).map(|k| starts[k - 1]).collect();
    let origins = starts.into_iter().zip(origins).collect();
    Ok(Stub { code: encoded.code_buffer, moved, origins, lockable })
}

/// Whether `instruction` increments one of `counters` (the moved
/// instructions never do: the counters are proftap's own memory).
fn increments(instruction: &Instruction, counters: &[u64]) -> bool {
    instruction.code() == Code::Inc_rm64
        && instruction.memory_base() == Register::RIP
        && counters.contains(&instruction.memory_displacement64())
}

/// The stub's instructions, the original address each stands for, and
/// the index of the first moved one.
fn instructions(site: &Site, address: u64, counters: &[u64], hook_slot: Option<u64>) -> Result<(Vec<Instruction>, Vec<u64>, usize), Error> {
    let fail = |reason: String| Error::Stub { at: site.at, reason };
    let iced = |e: IcedError| fail(e.to_string());
    let Some(&last) = site.replaced.last() else { return Err(fail("the site replaces nothing".into())) };
    let counting = |place: Place| -> Result<Vec<Instruction>, Error> {
        let mut code = Vec::new();
        for counter in site.counters.iter().filter(|c| c.place == place) {
            let at = counters.get(counter.index).copied().ok_or_else(|| fail(format!("no address for counter {}", counter.index)))?;
            code.extend(count(at, counter).map_err(iced)?);
        }
        for &(region, leave, _) in site.hooks.iter().filter(|h| h.2 == place) {
            let slot = hook_slot.ok_or_else(|| fail("region hooks with no runtime to call".into()))?;
            code.extend(crate::inject::totals::region_hook(region, leave, slot).map_err(iced)?);
        }
        Ok(code)
    };
    let jcc = last.flow_control() == FlowControl::ConditionalBranch;
    let call = is_emulated_call(&last);
    let places = || site.counters.iter().map(|c| c.place).chain(site.hooks.iter().map(|h| h.2));
    let after_call = places().any(|p| p == Place::AfterCall);
    if places().any(|p| matches!(p, Place::Taken | Place::NotTaken)) && !jcc {
        return Err(fail("an edge counted at a window that does not end with its jcc".into()));
    }
    if after_call && !call {
        return Err(fail("a return counted at a window that does not end with its call".into()));
    }
    let mut code = counting(Place::Start)?;
    let mut origins = vec![site.at; code.len()];
    let moved_from = code.len();
    code.extend(site.replaced.iter().map(|&i| without_address(i)));
    origins.extend(site.replaced.iter().map(Instruction::ip));
    if call && !after_call {
        code.pop();
        origins.pop();
        let made = call_from_original(&last).map_err(iced)?;
        origins.extend([last.ip(); 3]);
        code.extend(made);
    }
    if after_call {
        // The callee returns into the stub, which counts and goes back.
        let after = counting(Place::AfterCall)?;
        origins.extend(std::iter::repeat_n(site.end(), after.len() + 1));
        code.extend(after);
        code.push(jump(site.end()).map_err(iced)?);
        return Ok((code, origins, moved_from));
    }
    let mut taken = counting(Place::Taken)?;
    if let (Some(first), Some(moved_jcc)) = (taken.first_mut(), code.last_mut()) {
        if last.near_branch_target() == address {
            return Err(fail("the jcc jumps to the stub's own address".into()));
        }
        // The label of the taken counter: the stub's own address, which no
        // original branch targets.
        first.set_ip(address);
        moved_jcc.set_near_branch64(address);
    }
    if matches!(last.flow_control(), FlowControl::Next | FlowControl::ConditionalBranch) {
        let not_taken = counting(Place::NotTaken)?;
        origins.extend(std::iter::repeat_n(site.end(), not_taken.len() + 1));
        code.extend(not_taken);
        code.push(jump(site.end()).map_err(iced)?);
    }
    if !taken.is_empty() {
        origins.extend(std::iter::repeat_n(last.near_branch_target(), taken.len() + 1));
        code.append(&mut taken);
        code.push(jump(last.near_branch_target()).map_err(iced)?);
    }
    Ok((code, origins, moved_from))
}

/// The instruction with no address: the block encoder keeps it as it is,
/// its branch and rip-relative targets absolute, and never takes it for
/// a branch's target.
fn without_address(mut instruction: Instruction) -> Instruction {
    instruction.set_ip(0);
    instruction
}

fn jump(target: u64) -> Result<Instruction, IcedError> {
    Instruction::with_branch(Code::Jmp_rel32_64, target)
}

/// `lock inc qword [rip+counter]` (`nop; inc qword [rip+counter]` while
/// only one thread counts, the `nop` to become `lock` when that changes),
/// and if the flags are live, around it `lea rsp,[rsp-128]`, `pushfq` ...
/// `popfq`, `lea rsp,[rsp+128]`: no register or flag changes, and what a
/// leaf function keeps below rsp stays.
fn count(at: u64, counter: &SiteCounter) -> Result<Vec<Instruction>, IcedError> {
    let rsp = |offset: i64| Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, offset));
    let mut inc = vec![Instruction::with1(Code::Inc_rm64, MemoryOperand::with_base_displ(Register::RIP, at as i64))?];
    match counter.atomic {
        true => inc[0].set_has_lock_prefix(true),
        false => inc.insert(0, Instruction::with(Code::Nopd)),
    }
    if !counter.flags_live {
        // Nothing touches the stack.
        return Ok(inc);
    }
    let mut code = vec![rsp(-RED_ZONE)?, Instruction::with(Code::Pushfq)];
    code.extend(inc);
    code.extend([Instruction::with(Code::Popfq), rsp(RED_ZONE)?]);
    Ok(code)
}

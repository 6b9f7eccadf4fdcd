//! Which function entries can take a 5-byte jump, and the trampolines the
//! jumps lead to: proftap's code, then the instructions the jump replaced
//! (relocated by iced-x86's block encoder), then a jump back.

use iced_x86::{BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionBlock};

/// Bytes of a `jmp rel32`.
pub const JUMP_LEN: usize = 5;

/// How a function's entry is patched.
#[derive(Clone, Debug)]
pub struct PatchPlan {
    /// Where the jump goes: the entry, or just after a leading `endbr64`
    /// (which indirect calls must still find there).
    pub at: u64,
    /// The instructions the jump overwrites, at their original addresses.
    pub replaced: Vec<Instruction>,
    /// Their bytes.
    pub original: Vec<u8>,
}

impl PatchPlan {
    /// Bytes the patch covers (the jump, then `int3` up to an instruction boundary).
    pub fn len(&self) -> usize {
        self.original.len()
    }

    /// Whether it covers nothing (never, for a plan that was made).
    pub fn is_empty(&self) -> bool {
        self.original.is_empty()
    }

    /// The bytes written over the entry: a jump to `trampoline`, then `int3`.
    pub fn jump_to(&self, trampoline: u64) -> Vec<u8> {
        let mut bytes = vec![0xe9];
        bytes.extend_from_slice(&rel32(self.at + JUMP_LEN as u64, trampoline).to_le_bytes());
        bytes.resize(self.len(), 0xcc);
        bytes
    }
}

fn rel32(from_next: u64, to: u64) -> i32 {
    to.wrapping_sub(from_next) as i64 as i32
}

/// Whether `to` is in reach of a rel32 from the instruction ending at `from_next`.
pub fn in_reach(from_next: u64, to: u64) -> bool {
    let distance = to.wrapping_sub(from_next) as i64;
    i64::from(i32::MIN) <= distance && distance <= i64::from(i32::MAX)
}

/// Plans the patch of the function at `entry` whose code is `code` (its
/// whole body, `code.len()` its size), or says why it cannot be patched.
pub fn plan(entry: u64, code: &[u8]) -> Result<PatchPlan, String> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut body = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            // Data or padding in the body ends what can be checked.
            break;
        }
        body.push(instruction);
    }
    let mut at = entry;
    let mut first = 0;
    if body.first().is_some_and(|i| i.code() == Code::Endbr64) {
        at = body[0].next_ip();
        first = 1;
    }
    let mut replaced = Vec::new();
    let mut covered = 0usize;
    for instruction in &body[first..] {
        if covered >= JUMP_LEN {
            break;
        }
        match instruction.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => {
                return Err("a call among its first instructions (moved, it would confuse unwinders)".into());
            }
            FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => {
                return Err(format!("it ends within its first {JUMP_LEN} bytes"));
            }
            _ => {}
        }
        if matches!(instruction.code(), Code::Loop_rel8_64_RCX | Code::Loope_rel8_64_RCX | Code::Loopne_rel8_64_RCX | Code::Jrcxz_rel8_64) {
            return Err("a loop or jrcxz among its first instructions".into());
        }
        replaced.push(*instruction);
        covered += instruction.len();
    }
    if covered < JUMP_LEN {
        return Err(format!("its code is shorter than the {JUMP_LEN}-byte jump"));
    }
    let end = at + covered as u64;
    // A branch of its own into the replaced bytes (other than to their
    // start) would land in the middle of the jump.
    for instruction in &body {
        if matches!(instruction.flow_control(), FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch)
            && instruction.near_branch_target() > at
            && instruction.near_branch_target() < end
        {
            return Err(format!("it jumps back into its first {covered} bytes"));
        }
    }
    let offset = (at - entry) as usize;
    let original = code[offset..offset + covered].to_vec();
    Ok(PatchPlan { at, replaced, original })
}

/// A trampoline: `prologue` (position-independent code of proftap's, given
/// its own address), the replaced instructions relocated after it, and a
/// jump back to the instruction after the patch.
#[derive(Clone, Debug)]
pub struct Trampoline {
    /// Its code.
    pub code: Vec<u8>,
    /// For each replaced instruction, its address in the original code and in
    /// the trampoline: a thread stopped inside the patch moves there.
    pub moved: Vec<(u64, u64)>,
}

/// Builds the trampoline of `patch` at address `address`.
pub fn trampoline(patch: &PatchPlan, address: u64, prologue: impl FnOnce(u64) -> Vec<u8>) -> Result<Trampoline, String> {
    let mut code = prologue(address);
    let relocated_at = address + code.len() as u64;
    let block = InstructionBlock::new(&patch.replaced, relocated_at);
    let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(|e| format!("its first instructions cannot be moved: {e}"))?;
    let moved = patch.replaced.iter().zip(&encoded.new_instruction_offsets).map(|(i, &o)| (i.ip(), relocated_at + u64::from(o))).collect();
    code.extend_from_slice(&encoded.code_buffer);
    let back = patch.at + patch.len() as u64;
    let jump_at = address + code.len() as u64;
    if !in_reach(jump_at + JUMP_LEN as u64, back) {
        return Err("the trampoline is out of reach of the code".into());
    }
    code.push(0xe9);
    code.extend_from_slice(&rel32(jump_at + JUMP_LEN as u64, back).to_le_bytes());
    Ok(Trampoline { code, moved })
}

/// `lock inc qword [rip + counter]`: counts a call in memory at `counter`,
/// for a trampoline at `address`. Flags change, which a function entry
/// does not mind (the ABI keeps none across a call but the direction flag).
pub fn count_call(address: u64, counter: u64) -> Vec<u8> {
    let mut code = vec![0xf0, 0x48, 0xff, 0x05];
    code.extend_from_slice(&rel32(address + 8, counter).to_le_bytes());
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_pointer_prologue_is_patched_after_endbr64() {
        // endbr64; push rbp; mov rbp,rsp; mov eax,1; pop rbp; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0xb8, 0x01, 0, 0, 0, 0x5d, 0xc3];
        let patch = plan(0x1000, &code).expect("patchable");
        assert_eq!(patch.at, 0x1004);
        // push rbp (1) + mov rbp,rsp (3) + mov eax,1 (5) = 9 bytes, the first boundary past 5.
        assert_eq!(patch.len(), 9);
        let jump = patch.jump_to(0x2000);
        assert_eq!(jump[0], 0xe9);
        assert_eq!(i32::from_le_bytes(jump[1..5].try_into().expect("4 bytes")), 0x2000 - 0x1009);
        assert_eq!(&jump[5..], &[0xcc; 4]);
    }

    #[test]
    fn rip_relative_instructions_are_relocated() {
        // mov rax,[rip+0x100]; nop; ret  (the load reads 0x1107)
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x90, 0xc3];
        let patch = plan(0x1000, &code).expect("patchable");
        let t = trampoline(&patch, 0x5000, |a| count_call(a, 0x6000)).expect("relocatable");
        // The moved load still reads 0x1107.
        let mut decoder = Decoder::with_ip(64, &t.code[8..], 0x5008, DecoderOptions::NONE);
        let load = decoder.decode();
        assert_eq!(load.ip_rel_memory_address(), 0x1107);
        assert_eq!(t.moved[0], (0x1000, 0x5008));
        // Then the jump back to the instruction after the patch.
        let back = decoder.decode();
        assert_eq!(back.near_branch_target(), 0x1007);
    }

    #[test]
    fn unsafe_entries_say_why() {
        // call rel32 first.
        assert!(plan(0x1000, &[0xe8, 0, 0, 0, 0, 0xc3]).expect_err("call").contains("call"));
        // ret within the first bytes.
        assert!(plan(0x1000, &[0x31, 0xc0, 0xc3]).expect_err("short").contains("ends within"));
        // A loop jumping back to the second instruction: xor eax,eax; inc eax; cmp eax,10; jne -> inc.
        let code = [0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x75, 0xf9, 0xc3];
        assert!(plan(0x1000, &code).expect_err("loop").contains("jumps back into"));
    }
}

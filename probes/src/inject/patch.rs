//! Which function entries can take a 5-byte jump, and the trampolines the
//! jumps lead to: proftap's code, then the instructions the jump replaced
//! (relocated by iced-x86's block encoder), then a jump back.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, IcedError, Instruction, InstructionBlock, MemoryOperand,
    OpKind, Register,
};

/// Bytes of a `jmp rel32`.
pub const JUMP_LEN: usize = 5;

/// Bytes of a `jmp rel8`: what an entry takes when its own code branches
/// back into its first five bytes; it leads to an [`Island`].
pub const SHORT_JUMP_LEN: usize = 2;

/// Where a patch goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// Over a function's first instructions: the trampoline runs proftap's
    /// code, then those instructions, then jumps back.
    Entry,
    /// Over the last instructions before a `ret`: the trampoline runs them,
    /// then proftap's code, which returns.
    Return,
}

/// How a function's entry (or one of its returns) is patched.
#[derive(Clone, Debug)]
pub struct PatchPlan {
    /// Where it goes.
    pub site: Site,
    /// Where the jump goes: the entry, or just after a leading `endbr64`
    /// (which indirect calls must still find there).
    pub at: u64,
    /// The instructions the jump overwrites, at their original addresses.
    pub replaced: Vec<Instruction>,
    /// Their bytes.
    pub original: Vec<u8>,
    /// Where the 5-byte jump goes when only a short one fits over the
    /// replaced instructions (see [`SHORT_JUMP_LEN`]).
    pub island: Option<Island>,
}

/// Five bytes of padding no code runs (before the function, or after a
/// jump or return of its own) that hold the jump to the trampoline; the
/// entry holds a short jump to them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Island {
    /// Where it is.
    pub at: u64,
    /// Its padding bytes.
    pub original: Vec<u8>,
    /// What it holds once its jump is taken out: its padding, which runs
    /// into the entry, before the function; after one of the function's
    /// returns, a short jump back to the entry, then the rest of its
    /// padding. A thread a signal interrupted there goes on from where it
    /// would have, whenever its handler returns.
    pub restored: Vec<u8>,
}

/// Padding a function's short jump may lead to, when its code branches
/// back into its first five bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct IslandRoom<'a> {
    /// The padding right before its entry (`nop`, `int3`), ending there.
    pub before: &'a [u8],
    /// Whether it is a compiler's code: padding before it and after its own
    /// jumps and returns is never run (hand-written code may fall through
    /// into padding, or branch into it). Without it, no island.
    pub compiled: bool,
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

    /// Every range of bytes the patch writes: over the entry, and its island.
    pub fn writes(&self) -> impl Iterator<Item = (u64, usize)> + Clone + '_ {
        std::iter::once((self.at, self.len())).chain(self.island.as_ref().map(|i| (i.at, i.original.len())))
    }

    /// Where the jump to a trampoline is written, and the bytes it
    /// replaces there: over the entry, or in its island.
    pub fn jump_site(&self) -> (u64, &[u8]) {
        match &self.island {
            Some(island) => (island.at, &island.original),
            None => (self.at, &self.original),
        }
    }

    /// The bytes written at [`PatchPlan::jump_site`]: a jump to
    /// `trampoline`, then `int3` over what is left of the replaced bytes.
    pub fn jump_to(&self, trampoline: u64) -> Vec<u8> {
        let (at, original) = self.jump_site();
        let mut bytes = vec![0xe9];
        bytes.extend_from_slice(&rel32(at + JUMP_LEN as u64, trampoline).to_le_bytes());
        bytes.resize(original.len(), 0xcc);
        bytes
    }

    /// The bytes written over the entry when the jump is in an island: a
    /// short jump there, then `int3`.
    pub fn short_jump(&self) -> Option<Vec<u8>> {
        let island = self.island.as_ref()?;
        let displacement = island.at.wrapping_sub(self.at + SHORT_JUMP_LEN as u64) as i64;
        let mut bytes = vec![0xeb, i8::try_from(displacement).ok()? as u8];
        bytes.resize(self.len(), 0xcc);
        Some(bytes)
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

/// The instructions of a function's body, up to the first that does not
/// decode (data or padding ends what can be checked).
fn decode(entry: u64, code: &[u8]) -> Vec<Instruction> {
    let mut decoder = Decoder::with_ip(64, code, entry, DecoderOptions::NONE);
    let mut body = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        body.push(instruction);
    }
    body
}

/// Whether a branch among `instructions` (up to an invalid one) lands
/// strictly inside `(start, end)`: in the middle of a jump written over
/// `[start, end)`.
fn branches_into(instructions: impl IntoIterator<Item = Instruction>, start: u64, end: u64) -> bool {
    lowest_branch_into(instructions, start, end).is_some()
}

/// The lowest target of a branch among `instructions` (up to an invalid
/// one) strictly inside `(start, end)`.
fn lowest_branch_into(instructions: impl IntoIterator<Item = Instruction>, start: u64, end: u64) -> Option<u64> {
    instructions
        .into_iter()
        .take_while(|i| !i.is_invalid())
        .filter(|i| matches!(i.flow_control(), FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch))
        .map(|i| i.near_branch_target())
        .filter(|&target| start < target && target < end)
        .min()
}

/// Plans patches over every `ret` of the function at `entry` (code as for
/// [`plan`]): each covers the instructions leading to it, which no branch
/// may enter but at the first. All of them, or why not.
pub fn plan_returns(entry: u64, code: &[u8]) -> Result<Vec<PatchPlan>, String> {
    let body = decode(entry, code);
    let mut plans = Vec::new();
    for (r, ret) in body.iter().enumerate().filter(|(_, i)| i.flow_control() == FlowControl::Return) {
        if ret.code() != Code::Retnq {
            return Err(format!("it returns with {:?}", ret.code()));
        }
        let mut first = r;
        while ret.next_ip() - body[first].ip() < JUMP_LEN as u64 {
            let Some(previous) = first.checked_sub(1) else {
                return Err("a return too close to its entry".into());
            };
            if body[previous].flow_control() != FlowControl::Next || body[previous].is_ip_rel_memory_operand() {
                return Err(format!("a branch, call or rip-relative access within {JUMP_LEN} bytes before a return"));
            }
            first = previous;
        }
        let (start, end) = (body[first].ip(), ret.next_ip());
        if branches_into(body.iter().copied(), start, end) {
            return Err("it branches into the instructions before a return".into());
        }
        let offset = (start - entry) as usize;
        plans.push(PatchPlan {
            site: Site::Return,
            at: start,
            replaced: body[first..r].to_vec(),
            original: code[offset..offset + (end - start) as usize].to_vec(),
            island: None,
        });
    }
    if plans.is_empty() {
        return Err("it has no return".into());
    }
    Ok(plans)
}

/// Plans the patch of the function at `entry` whose code is `code` (its
/// whole body, then `padding` bytes of the padding after it, which no code
/// runs), or says why it cannot be patched. A function whose code branches
/// back into its first five bytes gets a short jump to an island of
/// `room`, when it has one.
pub fn plan(entry: u64, code: &[u8], padding: usize, room: IslandRoom<'_>) -> Result<PatchPlan, String> {
    plan_entry(entry, code, padding, Some(room))
}

/// [`plan`] for a function whose whole code was found patchable already,
/// at another address (the verdict is the same at any): only its first
/// instructions are decoded, not the body a branch back into them would
/// be looked for in.
pub fn plan_checked(entry: u64, code: &[u8], padding: usize) -> Result<PatchPlan, String> {
    plan_entry(entry, code, padding, None)
}

/// Bytes that hold a function's first instructions the jump replaces: an
/// `endbr64`, then instructions up to the jump's length, the last as long
/// as an instruction may be.
const FIRST_BYTES: usize = 4 + JUMP_LEN + 15;

/// `room`: the whole body is decoded (a branch back into the first bytes
/// looked for), and where an island may go; `None` for a checked function.
fn plan_entry(entry: u64, code: &[u8], padding: usize, room: Option<IslandRoom<'_>>) -> Result<PatchPlan, String> {
    let own = code.len().saturating_sub(padding);
    let function_end = entry + own as u64;
    let body = decode(entry, &code[..own.min(FIRST_BYTES)]);
    let mut at = entry;
    let mut first = 0;
    if body.first().is_some_and(|i| i.code() == Code::Endbr64) {
        at = body[0].next_ip();
        first = 1;
    }
    let (replaced, covered) = covering(&body[first..], JUMP_LEN, function_end, padding)?;
    // Moved, it would read the jump that replaced them (`call [rip-x]`
    // through a slot among them, say).
    let replaced_bytes = at..at + covered as u64;
    if replaced.iter().any(|i| i.is_ip_rel_memory_operand() && replaced_bytes.contains(&i.ip_rel_memory_address())) {
        return Err(format!("it reads its own first {covered} bytes"));
    }
    let offset = (at - entry) as usize;
    let plan = |replaced: Vec<Instruction>, covered: usize, island| PatchPlan {
        site: Site::Entry,
        at,
        replaced,
        original: code[offset..offset + covered].to_vec(),
        island,
    };
    // A branch of its own into the replaced bytes (other than to their
    // start) would land in the middle of the jump.
    // Decoded as it goes, kept nowhere: a large program's functions are megabytes.
    let Some(room) = room else { return Ok(plan(replaced, covered, None)) };
    let Some(entered) = lowest_branch_into(Decoder::with_ip(64, code, entry, DecoderOptions::NONE), at, at + covered as u64) else {
        return Ok(plan(replaced, covered, None));
    };
    let refused = || format!("it jumps back into its first {covered} bytes");
    let (replaced, covered) = covering(&body[first..], SHORT_JUMP_LEN, function_end, padding).map_err(|_| refused())?;
    if entered < at + covered as u64 {
        return Err(format!("it jumps back into its first {covered} bytes"));
    }
    let island = island(entry, &code[..own], at..at + covered as u64, room)
        .ok_or_else(|| format!("{}, and has no padding near it for a short jump to lead to", refused()))?;
    Ok(plan(replaced, covered, Some(island)))
}

/// The instructions from the first of `body` that cover `need` bytes, and
/// how many they cover; or why they cannot be moved. A `ret` may complete
/// them with the padding after the function (`function_end`, `padding`).
fn covering(body: &[Instruction], need: usize, function_end: u64, padding: usize) -> Result<(Vec<Instruction>, usize), String> {
    let mut replaced = Vec::new();
    let mut covered = 0usize;
    for instruction in body {
        if covered >= need {
            break;
        }
        match instruction.flow_control() {
            // A call that the jump needs whole is emulated in the
            // trampoline with the original return address (see
            // [`trampoline`]), so the callee returns into the original code
            // and unwinders see the stack they expect.
            FlowControl::Call | FlowControl::IndirectCall if is_emulated_call(instruction) && covered + instruction.len() >= need => {}
            FlowControl::Call | FlowControl::IndirectCall => {
                return Err("a call among its first instructions (moved, it would confuse unwinders)".into());
            }
            // A `ret` that completes the jump's bytes, alone or with the
            // padding after the function, moves to the trampoline as the rest
            // does: it returns through proftap's return, as the function's
            // would (`xor eax,eax; ret`, then padding no code runs).
            FlowControl::Return
                if instruction.code() == Code::Retnq
                    && (covered + instruction.len() >= need
                        || (instruction.next_ip() == function_end && covered + instruction.len() + padding >= need)) =>
            {
                replaced.push(*instruction);
                covered = (covered + instruction.len()).max(need);
                break;
            }
            FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => {
                return Err(format!("it ends within its first {need} bytes"));
            }
            _ => {}
        }
        if matches!(instruction.code(), Code::Loop_rel8_64_RCX | Code::Loope_rel8_64_RCX | Code::Loopne_rel8_64_RCX | Code::Jrcxz_rel8_64) {
            return Err("a loop or jrcxz among its first instructions".into());
        }
        replaced.push(*instruction);
        covered += instruction.len();
    }
    if covered < need {
        return Err(format!("its code is shorter than the {need}-byte jump"));
    }
    Ok((replaced, covered))
}

/// Where the 5-byte jump of a short jump over `replaced` (the bytes from
/// the jump's start) may go, for the function at `entry` whose own code is
/// `code`: the last five bytes of the padding before it, or padding past
/// `replaced` after one of its own jumps or returns that no branch of its
/// enters and nothing reads, within a `jmp rel8`'s reach of the short
/// jump, and of the entry for the jump back (see [`Island::restored`]).
fn island(entry: u64, code: &[u8], replaced: std::ops::Range<u64>, room: IslandRoom<'_>) -> Option<Island> {
    if !room.compiled {
        return None;
    }
    let from = replaced.start + SHORT_JUMP_LEN as u64;
    let back = |island: u64| i8::try_from(replaced.start.wrapping_sub(island + SHORT_JUMP_LEN as u64) as i64).ok();
    let reaches = |island: u64| i8::try_from(island.wrapping_sub(from) as i64).is_ok() && back(island).is_some();
    if let Some(last) = room.before.len().checked_sub(JUMP_LEN) {
        // Before the entry, always in reach; the previous function's own
        // jump may take the padding's first four bytes.
        let original = room.before[last..].to_vec();
        return Some(Island { at: entry - JUMP_LEN as u64, restored: original.clone(), original });
    }
    let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
    let mut entered: Vec<u64> = Vec::new();
    let mut after_end_of_flow = false;
    // Decoded as it goes, kept nowhere.
    for instruction in Decoder::with_ip(64, code, entry, DecoderOptions::NONE).into_iter().take_while(|i| !i.is_invalid()) {
        let is_padding = matches!(instruction.mnemonic(), iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Int3);
        match runs.last_mut() {
            Some(run) if is_padding && run.end == instruction.ip() => run.end = instruction.next_ip(),
            _ if is_padding && after_end_of_flow => runs.push(instruction.ip()..instruction.next_ip()),
            _ => {}
        }
        if instruction.op0_kind() == OpKind::NearBranch64 || instruction.op0_kind() == OpKind::NearBranch32 {
            entered.push(instruction.near_branch_target());
        }
        if instruction.is_ip_rel_memory_operand() {
            entered.push(instruction.ip_rel_memory_address());
        }
        after_end_of_flow = match instruction.flow_control() {
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch | FlowControl::Return => true,
            _ => is_padding && after_end_of_flow,
        };
    }
    let run = runs.into_iter().find(|run| {
        run.end - run.start >= JUMP_LEN as u64
            && run.start >= replaced.end
            && reaches(run.start)
            && !entered.iter().any(|t| run.contains(t))
    })?;
    let offset = (run.start - entry) as usize;
    let original = code[offset..offset + JUMP_LEN].to_vec();
    let mut restored = vec![0xeb, back(run.start)? as u8];
    restored.extend_from_slice(&original[SHORT_JUMP_LEN..]);
    Some(Island { at: run.start, original, restored })
}

/// Whether `instruction` is a call that [`call_from_original`] makes: a
/// direct near call, or one through a register or memory not read through
/// rsp (which the pushed return address moves).
pub fn is_emulated_call(instruction: &Instruction) -> bool {
    instruction.is_call_near() || (instruction.code() == Code::Call_rm64 && !uses_rsp(instruction))
}

/// Whether `call`'s operand is read through rsp, or esp with a 32-bit
/// address size.
fn uses_rsp(call: &Instruction) -> bool {
    let rsp = |register: Register| register.full_register() == Register::RSP;
    match call.op0_kind() {
        OpKind::Register => rsp(call.op0_register()),
        OpKind::Memory => rsp(call.memory_base()) || rsp(call.memory_index()),
        _ => true,
    }
}

/// A call made as if from its original address: push the return address
/// (its low half sign-extended, then its high half written), and jump
/// where the call went (`jmp rel32`, or `jmp` through the same register or
/// memory). The callee returns into the original code, and an unwinder
/// sees the return address it expects. The instructions have no address
/// (see [`is_emulated_call`] for the calls it makes).
pub fn call_from_original(call: &Instruction) -> Result<[Instruction; 3], IcedError> {
    let back = call.next_ip();
    let push = Instruction::with1(Code::Pushq_imm32, back as u32 as i32)?;
    let high = Instruction::with2(Code::Mov_rm32_imm32, MemoryOperand::with_base_displ(Register::RSP, 4), (back >> 32) as u32)?;
    let go = if call.is_call_near() {
        Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch_target())?
    } else {
        let mut go = *call;
        go.set_code(Code::Jmp_rm64);
        go
    };
    Ok([push, high, go].map(|mut i| {
        // The block encoder keeps it as it is, its branch and rip-relative
        // targets absolute, and never takes it for a branch's target.
        i.set_ip(0);
        i
    }))
}

/// Refuses `plan`, the patch of the function entered at `entry`, when code
/// elsewhere branches into the bytes its jump replaces, past their start
/// (`entered_inside`: offsets from `entry`).
pub fn not_entered_inside(plan: &PatchPlan, entry: u64, entered_inside: &[u32]) -> Result<(), String> {
    let inside = |&offset: &u32| (plan.at + 1..plan.at + plan.len() as u64).contains(&(entry + u64::from(offset)));
    match entered_inside.iter().find(|o| inside(o)) {
        Some(offset) => Err(format!("code elsewhere jumps to its byte {offset}, within the {} bytes a jump would replace", plan.len())),
        None => Ok(()),
    }
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

/// Builds the trampoline of `patch` at address `address`, with proftap's
/// code `own` (given its address): before the replaced instructions at an
/// entry, after them at a return (then `own` returns).
///
/// A call ending the replaced instructions becomes a push of its original
/// return address and a jump to its target: the callee returns straight
/// into the function, after the patch.
pub fn trampoline(patch: &PatchPlan, address: u64, own: impl FnOnce(u64) -> Result<Vec<u8>, String>) -> Result<Trampoline, String> {
    if patch.site == Site::Return {
        let encoded = encode_block(&patch.replaced, address).map_err(|e| format!("its last instructions cannot be moved: {e}"))?;
        let mut moved = relocated(&patch.replaced, &encoded.code_buffer, address, &encoded.new_instruction_offsets)?;
        let mut code = encoded.code_buffer;
        // A thread stopped at the `ret` goes on from proftap's code. It
        // follows the replaced instructions: a `ret` may be longer than
        // its one byte (`rep ret`).
        let ret = patch.replaced.last().map_or(patch.at, Instruction::next_ip);
        moved.push((ret, address + code.len() as u64));
        code.extend(own(address + code.len() as u64)?);
        return Ok(Trampoline { code, moved });
    }
    let mut code = own(address)?;
    let relocated_at = address + code.len() as u64;
    let mut instructions = patch.replaced.clone();
    let call = instructions.last().filter(|i| is_emulated_call(i)).copied();
    if let Some(call) = call {
        instructions.pop();
        instructions.extend(call_from_original(&call).map_err(|e| e.to_string())?);
    }
    let as_they_are = patch.original.get(..instructions.iter().map(Instruction::len).sum::<usize>());
    let moved = if let Some(bytes) = as_they_are.filter(|_| call.is_none() && instructions.iter().all(moves_as_it_is)) {
        // Nothing in them depends on where they are: their bytes, as they are.
        code.extend_from_slice(bytes);
        instructions.iter().map(|i| (i.ip(), relocated_at + (i.ip() - patch.at))).collect()
    } else {
        let encoded = encode_block(&instructions, relocated_at).map_err(|e| format!("its first instructions cannot be moved: {e}"))?;
        code.extend_from_slice(&encoded.code_buffer);
        relocated(&patch.replaced, &encoded.code_buffer, relocated_at, &encoded.new_instruction_offsets)?
    };
    if call.is_some() {
        return Ok(Trampoline { code, moved });
    }
    let back = patch.at + patch.len() as u64;
    let jump_at = address + code.len() as u64;
    if !in_reach(jump_at + JUMP_LEN as u64, back) {
        return Err("the trampoline is out of reach of the code".into());
    }
    code.push(0xe9);
    code.extend_from_slice(&rel32(jump_at + JUMP_LEN as u64, back).to_le_bytes());
    Ok(Trampoline { code, moved })
}

/// `instructions` encoded at `address` by iced-x86's block encoder, with
/// each one's new offset. An operand relative to EIP (a RIP-relative one
/// under an address-size prefix) is refused first: the encoder asserts on
/// one it has to move (found by fuzzing).
pub fn encode_block(instructions: &[Instruction], address: u64) -> Result<iced_x86::BlockEncoderResult, String> {
    if let Some(i) = instructions.iter().find(|i| i.is_ip_rel_memory_operand() && i.memory_base() == Register::EIP) {
        return Err(format!("{:?} reads memory relative to EIP", i.code()));
    }
    BlockEncoder::encode(64, InstructionBlock::new(instructions, address), BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(|e| e.to_string())
}

/// Where each of `replaced` went in `code`, which the block encoder made
/// at `at` with `offsets`: a thread stopped at a replaced instruction goes
/// on from there.
fn relocated(replaced: &[Instruction], code: &[u8], at: u64, offsets: &[u32]) -> Result<Vec<(u64, u64)>, String> {
    let starts = encoded_starts(code, at, offsets)?;
    // An instruction that depends on no address must land as itself: the
    // encoder re-encodes it, and some it does not encode back (a 3DNow!
    // instruction loses the REX prefix of its base register).
    for (instruction, &start) in replaced.iter().zip(&starts).filter(|(i, _)| moves_as_it_is(i)) {
        let rest = code.get((start - at) as usize..).unwrap_or_default();
        if Decoder::with_ip(64, rest, start, DecoderOptions::NONE).decode() != *instruction {
            return Err(format!("{:?} cannot be moved: encoded again, it would not be the same instruction", instruction.code()));
        }
    }
    Ok(replaced.iter().zip(starts).map(|(i, start)| (i.ip(), start)).collect())
}

/// Where each instruction of a block starts in `code`, which the block
/// encoder made at `at` with `offsets` (`RETURN_NEW_INSTRUCTION_OFFSETS`).
/// It gives no offset for an instruction it rewrote (a short branch made
/// near, a branch out of reach made indirect): such an instruction starts
/// where the one before it ends.
pub fn encoded_starts(code: &[u8], at: u64, offsets: &[u32]) -> Result<Vec<u64>, String> {
    let mut starts = Vec::with_capacity(offsets.len());
    // Where the next instruction starts, when the one before it was not rewritten.
    let mut follows = Some(0u64);
    for &offset in offsets {
        let start = match offset {
            u32::MAX => follows.ok_or("two branches in a row are rewritten: where the second went is unknown")?,
            offset => u64::from(offset),
        };
        follows = match offset {
            u32::MAX => None,
            _ => {
                let rest = code.get(start as usize..).ok_or("an instruction was encoded outside its code")?;
                Some(start + Decoder::with_ip(64, rest, at + start, DecoderOptions::NONE).decode().len() as u64)
            }
        };
        starts.push(at + start);
    }
    Ok(starts)
}

/// Whether `instruction` does the same wherever it is: no operand relative
/// to the instruction pointer, no branch (most prologues: pushes, moves,
/// `sub rsp`), so that its bytes need no re-encoding.
fn moves_as_it_is(instruction: &Instruction) -> bool {
    !instruction.is_ip_rel_memory_operand() && instruction.flow_control() == iced_x86::FlowControl::Next
}

/// `lock inc qword [rip + counter]`: counts a call in memory at `counter`,
/// for a trampoline at `address`. Flags change, which a function entry
/// does not mind (the ABI keeps none across a call but the direction flag).
pub fn count_call(address: u64, counter: u64) -> Vec<u8> {
    let mut code = vec![0xf0, 0x48, 0xff, 0x05];
    code.extend_from_slice(&rel32(address + 8, counter).to_le_bytes());
    code
}

/// `jmp +0` then `inc qword [rip + counter]`: counts a call without
/// `lock`, for a trampoline at `address` in a process of one thread, where
/// nothing else increments the counter. When a second thread or process
/// may count, the jump's displacement (the byte at [`SWITCH_BYTE`]) comes
/// to lead past this count to [`count_call_then_return`]'s.
pub fn count_call_alone(address: u64, counter: u64) -> Vec<u8> {
    let mut code = vec![0xeb, 0x00, 0x48, 0xff, 0x05];
    code.extend_from_slice(&rel32(address + COUNT_ALONE_LEN as u64, counter).to_le_bytes());
    code
}

/// The bytes of [`count_call_alone`].
pub const COUNT_ALONE_LEN: usize = 9;

/// Where in [`count_call_alone`] the jump's displacement is.
pub const SWITCH_BYTE: u64 = 1;

/// The displacement that makes [`count_call_alone`]'s jump, at `alone`,
/// lead to `to`, if a short jump reaches it.
pub fn switch_displacement(alone: u64, to: u64) -> Option<u8> {
    let displacement = to.wrapping_sub(alone + 2) as i64;
    i8::try_from(displacement).ok().filter(|&d| d >= 0).map(|d| d as u8)
}

/// The count a [`count_call_alone`] is switched to, at `address`: on the
/// running CPU's block (shared where there are no blocks per CPU), then a
/// jump to `back`, the instructions after the count it stands in for.
pub fn count_call_then_return(address: u64, counter: u64, blocks: Option<CpuBlocks>, back: u64) -> Vec<u8> {
    let mut code = match blocks {
        Some(blocks) => count_call_on_cpu(address, counter, blocks),
        None => count_call(address, counter),
    };
    let next = address + code.len() as u64 + JUMP_LEN as u64;
    code.push(0xe9);
    code.extend_from_slice(&rel32(next, back).to_le_bytes());
    code
}

/// Counters kept apart per CPU: block `cpu & mask`, `1 << shift` bytes
/// from the last, holds the calls counted on that CPU. Threads and forked
/// children calling one function on two CPUs then never wait for each
/// other's cache line, which one shared counter made them do at each call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuBlocks {
    /// The blocks less one (a power of two less one).
    pub mask: u32,
    /// The log2 of the bytes from a block to the next.
    pub shift: u8,
}

/// Counts a call in the counter at `counter` of the running CPU's block
/// (see [`CpuBlocks`]), for a trampoline at `address`:
///
/// ```text
/// mov [rsp-8], r11 ; mov [rsp-16], r10     kept below the stack pointer, where
///                                          no handler writes (the red zone)
/// lea r10, [rip + counter]
/// rdpid r11                                the kernel's CPU number (and node above)
/// and r11d, mask ; shl r11, shift
/// lock inc qword [r10 + r11]               locked: a thread may move CPUs meanwhile
/// mov r11, [rsp-8] ; mov r10, [rsp-16]
/// ```
///
/// Every register is kept, as a caller that knows its callee's registers
/// (GCC's `-fipa-ra`) may expect; the stack pointer never moves, so a
/// sample here unwinds as at the function's entry.
pub fn count_call_on_cpu(address: u64, counter: u64, blocks: CpuBlocks) -> Vec<u8> {
    let mut code = vec![0x4c, 0x89, 0x5c, 0x24, 0xf8, 0x4c, 0x89, 0x54, 0x24, 0xf0, 0x4c, 0x8d, 0x15];
    code.extend_from_slice(&rel32(address + code.len() as u64 + 4, counter).to_le_bytes());
    code.extend_from_slice(&[0xf3, 0x41, 0x0f, 0xc7, 0xfb, 0x41, 0x81, 0xe3]);
    code.extend_from_slice(&blocks.mask.to_le_bytes());
    code.extend_from_slice(&[0x49, 0xc1, 0xe3, blocks.shift]);
    code.extend_from_slice(&[0xf0, 0x4b, 0xff, 0x04, 0x1a, 0x4c, 0x8b, 0x5c, 0x24, 0xf8, 0x4c, 0x8b, 0x54, 0x24, 0xf0]);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_the_encoder_would_change_is_not_moved() {
        // `pi2fw mm1, [r9 - 0x13071621]` then `ret`: encoded again, the
        // 3DNow! instruction loses its REX.B and reads [rcx - 0x13071621].
        let code = [0x47, 0x0f, 0x0f, 0x89, 0xdf, 0xe9, 0xf8, 0xec, 0x0c, 0xc3];
        let plans = plan_returns(0x40_1000, &code).expect("a return");
        let err = trampoline(&plans[0], 0x40_8000, |_| Ok(Vec::new())).expect_err("refused");
        assert!(err.contains("D3NOW_Pi2fw_mm_mmm64 cannot be moved"), "{err}");
        // The same with rcx as base moves.
        let plain = [0x0f, 0x0f, 0x89, 0xdf, 0xe9, 0xf8, 0xec, 0x0c, 0xc3];
        let plans = plan_returns(0x40_1000, &plain).expect("a return");
        assert!(trampoline(&plans[0], 0x40_8000, |_| Ok(Vec::new())).is_ok());
    }

    /// The per-CPU count is the instructions its comment names: the
    /// counter reached from where the trampoline is, and the stack pointer
    /// never moved.
    #[test]
    fn counting_on_a_cpu_decodes_as_described() {
        let (address, counter) = (0x7f00_0040_5000u64, 0x7f00_1040_9008u64);
        let code = count_call_on_cpu(address, counter, CpuBlocks { mask: 3, shift: 17 });
        let decoded: Vec<Instruction> = Decoder::with_ip(64, &code, address, DecoderOptions::NONE).into_iter().collect();
        let codes: Vec<Code> = decoded.iter().map(Instruction::code).collect();
        use Code::*;
        assert_eq!(
            codes,
            [Mov_rm64_r64, Mov_rm64_r64, Lea_r64_m, Rdpid_r64, And_rm32_imm32, Shl_rm64_imm8, Inc_rm64, Mov_r64_rm64, Mov_r64_rm64]
        );
        assert!(decoded.iter().all(|i| !i.is_invalid() && i.op0_register() != Register::RSP), "the stack pointer is never written");
        let saves: Vec<(Register, i64)> = decoded.iter().map(|i| (i.op1_register(), i.memory_displacement64() as i64)).take(2).collect();
        assert_eq!(saves, [(Register::R11, -8), (Register::R10, -16)]);
        assert_eq!((decoded[2].op0_register(), decoded[2].ip_rel_memory_address()), (Register::R10, counter));
        assert_eq!((decoded[3].op0_register(), decoded[4].immediate32(), decoded[5].immediate8()), (Register::R11, 3, 17));
        let inc = &decoded[6];
        assert!(inc.has_lock_prefix());
        assert_eq!((inc.memory_base(), inc.memory_index(), inc.memory_displacement64()), (Register::R10, Register::R11, 0));
        let restores: Vec<(Register, i64)> = decoded[7..].iter().map(|i| (i.op0_register(), i.memory_displacement64() as i64)).collect();
        assert_eq!(restores, [(Register::R11, -8), (Register::R10, -16)]);
    }

    /// A page of `code`, made executable, and four pages of counters
    /// after it, given to `test` (the code's address, the counters'),
    /// then unmapped.
    fn with_code_and_counters(code: impl FnOnce(u64, u64) -> Vec<u8>, test: impl FnOnce(*mut u8, *mut u8)) {
        // SAFETY: fresh anonymous pages, the code written within the first
        // (checked) and made executable; unmapped after the test.
        unsafe {
            let page = libc::mmap(
                std::ptr::null_mut(),
                5 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(page, libc::MAP_FAILED);
            let (code_at, counters) = (page.cast::<u8>(), page.cast::<u8>().add(4096));
            let code = code(code_at as u64, counters as u64);
            assert!(code.len() <= 4096);
            std::ptr::copy_nonoverlapping(code.as_ptr(), code_at, code.len());
            assert_eq!(libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_EXEC), 0);
            test(code_at, counters);
            libc::munmap(page, 5 * 4096);
        }
    }

    /// Calls the code at `code_at` with r10 and r11 set: it must give them back.
    ///
    /// # Safety
    /// `code_at` holds code that returns, keeping every register the C ABI keeps.
    unsafe fn call_keeping_r10_r11(code_at: *mut u8) {
        let (r10, r11): (u64, u64);
        // SAFETY: as the caller says.
        unsafe {
            std::arch::asm!(
                "call {code}",
                code = in(reg) code_at,
                inout("r10") 0x1010_1010u64 => r10,
                inout("r11") 0x1111_1111u64 => r11,
                clobber_abi("C"),
            );
        }
        assert_eq!((r10, r11), (0x1010_1010, 0x1111_1111));
    }

    /// The counts of counter `index` in each of the four blocks at `counters`.
    ///
    /// # Safety
    /// `counters` is the start of the four pages `with_code_and_counters`
    /// maps, and `index` within a page.
    unsafe fn counts_of(counters: *mut u8, index: usize) -> Vec<u64> {
        // SAFETY: as the caller says.
        (0..4).map(|b| unsafe { *counters.add(b * 4096 + 8 * index).cast::<u64>() }).collect()
    }

    /// Pins this thread to `cpu` while `f` runs; false (nothing run) where it may not.
    fn on_cpu(cpu: usize, f: impl FnOnce()) -> bool {
        // SAFETY: plain affinity calls on this thread, with sets it owns.
        unsafe {
            let mut before: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut before), 0);
            let mut only: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut only);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &only) != 0 {
                return false;
            }
            f();
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &before);
            true
        }
    }

    /// The CPUs this thread may run on.
    fn allowed_cpus() -> Vec<usize> {
        // SAFETY: a plain affinity query into a set this function owns.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set), 0);
            (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
        }
    }

    /// Run on each CPU in turn, the per-CPU count adds one to that CPU's
    /// block only, and gives the caller back every register it had.
    #[test]
    fn counting_on_a_cpu_counts_in_its_block_and_keeps_the_registers() {
        assert!(crate::inject::patcher::has_rdpid(), "this processor has no rdpid: counting per CPU cannot be run");
        let blocks = CpuBlocks { mask: 3, shift: 12 };
        let code = |at: u64, counters: u64| {
            let mut code = count_call_on_cpu(at, counters + 8 * 5, blocks);
            code.push(0xc3);
            code
        };
        with_code_and_counters(code, |code_at, counters| {
            let mut ran = Vec::new();
            for cpu in allowed_cpus().into_iter().take(8) {
                // SAFETY: the count then `ret`, keeping every register.
                if !on_cpu(cpu, || unsafe { call_keeping_r10_r11(code_at) }) {
                    continue;
                }
                ran.push(cpu);
                let expected: Vec<u64> = (0..4).map(|b| ran.iter().filter(|&&c| c % 4 == b).count() as u64).collect();
                // SAFETY: the counters mapped, counter 5.
                assert_eq!(unsafe { counts_of(counters, 5) }, expected, "after a call on CPU {cpu}");
            }
            assert!(!ran.is_empty(), "this thread may run on no CPU it is allowed");
        });
    }

    /// A count made alone adds to the first block without `lock`; with
    /// its switch's byte written, as the runtime writes it when a thread
    /// starts, the same call counts in the running CPU's block instead,
    /// and returns through the instructions after the count.
    #[test]
    fn a_count_alone_switched_counts_on_its_cpu() {
        assert!(crate::inject::patcher::has_rdpid(), "this processor has no rdpid: counting per CPU cannot be run");
        let blocks = CpuBlocks { mask: 3, shift: 12 };
        let code = |alone: u64, counters: u64| {
            let mut code = count_call_alone(alone, counters + 8 * 3);
            code.push(0xc3); // what the count stands before: a `ret`
            code.resize(32, 0xcc);
            code.extend(count_call_then_return(alone + 32, counters + 8 * 3, Some(blocks), alone + COUNT_ALONE_LEN as u64));
            code
        };
        with_code_and_counters(code, |code_at, counters| {
            // SAFETY: the count then `ret`, keeping every register.
            let call = || unsafe { call_keeping_r10_r11(code_at) };
            call();
            call();
            // SAFETY: the counters mapped, counter 3.
            assert_eq!(unsafe { counts_of(counters, 3) }, [2, 0, 0, 0], "alone: the first block, twice");
            let (alone, tail) = (code_at as u64, code_at as u64 + 32);
            let page = code_at.cast::<libc::c_void>();
            // SAFETY: the code's own page, writable while the switch's byte is written.
            unsafe {
                assert_eq!(libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC), 0);
                *code_at.add(SWITCH_BYTE as usize) = switch_displacement(alone, tail).expect("in a short jump's reach");
                assert_eq!(libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_EXEC), 0);
            }
            // On one CPU, whose block is not the first's where it may run on such a one.
            let allowed = allowed_cpus();
            let cpu = allowed.iter().copied().find(|c| c & 3 != 0).or(allowed.first().copied()).expect("a CPU");
            assert!(on_cpu(cpu, call), "cannot run on CPU {cpu}");
            let mut expected = vec![2, 0, 0, 0];
            expected[cpu & 3] += 1;
            // SAFETY: the counters mapped, counter 3.
            assert_eq!(unsafe { counts_of(counters, 3) }, expected, "switched, on CPU {cpu}");
        });
    }

    #[test]
    fn a_switch_reaches_only_forwards_and_within_a_short_jump() {
        assert_eq!(switch_displacement(0x1000, 0x1002), Some(0));
        assert_eq!(switch_displacement(0x1000, 0x1002 + 127), Some(127));
        assert_eq!(switch_displacement(0x1000, 0x1002 + 128), None);
        assert_eq!(switch_displacement(0x1000, 0x1000), None);
    }

    /// A function shorter than the jump that ends with its `ret` takes the
    /// padding after it; not a `ret` before its end, nor without padding.
    #[test]
    fn a_short_function_ending_in_ret_takes_the_padding_after_it() {
        // xor eax,eax; ret; then xchg ax,ax (padding)
        let code = [0x31, 0xc0, 0xc3, 0x66, 0x90];
        let patch = plan(0x1000, &code, 2, IslandRoom::default()).expect("patchable over its padding");
        assert_eq!((patch.len(), patch.replaced.len()), (5, 2));
        assert_eq!(&patch.original, &code);
        assert!(trampoline(&patch, 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).is_ok());
        // ret alone, four bytes of int3 after it.
        assert_eq!(plan(0x1000, &[0xc3, 0xcc, 0xcc, 0xcc, 0xcc], 4, IslandRoom::default()).expect("patchable").len(), 5);
        // Not enough padding.
        assert!(plan(0x1000, &[0x31, 0xc0, 0xc3, 0x90], 1, IslandRoom::default()).expect_err("short").contains("ends within"));
        // A ret before the function's end (a nop of its own follows).
        assert!(plan(0x1000, &[0x31, 0xc0, 0xc3, 0x90, 0x90], 1, IslandRoom::default()).expect_err("not its end").contains("ends within"));
    }

    #[test]
    fn a_frame_pointer_prologue_is_patched_after_endbr64() {
        // endbr64; push rbp; mov rbp,rsp; mov eax,1; pop rbp; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0xb8, 0x01, 0, 0, 0, 0x5d, 0xc3];
        let patch = plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        assert_eq!(patch.at, 0x1004);
        // push rbp (1) + mov rbp,rsp (3) + mov eax,1 (5) = 9 bytes, the first boundary past 5.
        assert_eq!(patch.len(), 9);
        let jump = patch.jump_to(0x2000);
        assert_eq!(jump[0], 0xe9);
        assert_eq!(i32::from_le_bytes(jump[1..5].try_into().expect("4 bytes")), 0x2000 - 0x1009);
        assert_eq!(&jump[5..], &[0xcc; 4]);
    }

    #[test]
    fn a_checked_function_is_planned_from_its_first_instructions_alone() {
        // endbr64; push rbp; mov rbp,rsp; mov eax,1; then 100 bytes of nops; pop rbp; ret
        let mut code = vec![0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0xb8, 0x01, 0, 0, 0];
        code.extend([0x90; 100]);
        code.extend([0x5d, 0xc3]);
        let (whole, first) =
            (plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable"), plan_checked(0x1000, &code, 0).expect("patchable"));
        assert_eq!((whole.at, &whole.original, whole.replaced.len()), (first.at, &first.original, first.replaced.len()));
        assert!(whole.replaced.iter().zip(&first.replaced).all(|(a, b)| a == b && a.ip() == b.ip()));
        // What only the whole body shows is the earlier check's to see.
        // xor eax,eax; inc eax; cmp eax,10; jne -> inc; ret
        let looping = [0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x75, 0xf9, 0xc3];
        assert!(plan(0x1000, &looping, 0, IslandRoom::default()).is_err());
        assert!(plan_checked(0x1000, &looping, 0).is_ok());
    }

    #[test]
    fn instructions_that_depend_on_nothing_move_as_the_encoder_would_move_them() {
        // endbr64; push rbp; mov rbp,rsp; push r15; sub rsp,0x18; mov eax,1; pop rbp; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x57, 0x48, 0x83, 0xec, 0x18, 0xb8, 1, 0, 0, 0, 0x5d, 0xc3];
        let patch = plan(0x40_1000, &code, 0, IslandRoom::default()).expect("patchable");
        assert!(patch.replaced.iter().all(moves_as_it_is));
        let t = trampoline(&patch, 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).expect("movable");
        let block = InstructionBlock::new(&patch.replaced, 0x40_5008);
        let encoded = BlockEncoder::encode(64, block, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS).expect("encodable");
        assert_eq!(&t.code[8..8 + encoded.code_buffer.len()], encoded.code_buffer.as_slice());
        let by_encoder: Vec<(u64, u64)> =
            patch.replaced.iter().zip(&encoded.new_instruction_offsets).map(|(i, &o)| (i.ip(), 0x40_5008 + u64::from(o))).collect();
        assert_eq!(t.moved, by_encoder);
        // Then the jump back to the instruction after the patch.
        let back = Decoder::with_ip(64, &t.code[8 + encoded.code_buffer.len()..], 0, DecoderOptions::NONE).decode();
        assert!(back.is_jmp_short_or_near());
    }

    #[test]
    fn a_short_branch_made_near_is_where_a_thread_stopped_at_it_goes_on() {
        // test edi,edi; je +0x10; mov eax,1; ...: the `je` is rewritten (rel8 -> rel32).
        let mut code = vec![0x85, 0xff, 0x74, 0x10, 0xb8, 1, 0, 0, 0];
        code.extend([0x90; 16]);
        code.push(0xc3);
        let patch = plan_checked(0x40_1000, &code, 0).expect("patchable");
        assert_eq!(patch.replaced.len(), 3);
        let t = trampoline(&patch, 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).expect("movable");
        for (&(from, to), original) in t.moved.iter().zip(&patch.replaced) {
            assert_eq!(from, original.ip());
            let offset = (to - 0x40_5000) as usize;
            assert!(offset < t.code.len(), "{from:#x} moved to {to:#x}, outside the trampoline");
            let landed = Decoder::with_ip(64, &t.code[offset..], to, DecoderOptions::NONE).decode();
            assert_eq!(landed.mnemonic(), original.mnemonic(), "{from:#x}");
            if original.is_jcc_short_or_near() {
                assert_eq!(landed.near_branch_target(), original.near_branch_target());
            }
        }
    }

    #[test]
    fn a_thread_stopped_at_a_prefixed_return_goes_on_from_proftaps_code() {
        // push rbp; mov rbp,rsp; mov eax,1; pop rbp; rep ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0xb8, 1, 0, 0, 0, 0x5d, 0xf3, 0xc3];
        let plans = plan_returns(0x40_1000, &code).expect("patchable");
        let t = trampoline(&plans[0], 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).expect("movable");
        let (ret, to) = *t.moved.last().expect("the return moves");
        assert_eq!(ret, 0x40_100a, "the `rep ret` starts after `pop rbp`");
        assert_eq!(to - 0x40_5000, t.code.len() as u64 - 8, "it goes on from proftap's code");
    }

    #[test]
    fn rip_relative_instructions_are_relocated() {
        // mov rax,[rip+0x100]; nop; ret  (the load reads 0x1107)
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x90, 0xc3];
        let patch = plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        let t = trampoline(&patch, 0x5000, |a| Ok(count_call(a, 0x6000))).expect("relocatable");
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
    fn a_call_that_ends_the_patch_returns_into_the_original_code() {
        // push rbx; mov rbx,rdi; call 0x90000000 (far from the trampoline); pop rbx; ret
        let target: u64 = 0x9000_0000;
        let mut code = vec![0x53, 0x48, 0x89, 0xfb, 0xe8];
        code.extend_from_slice(&((target as i64 - 0x1009) as i32).to_le_bytes());
        code.extend_from_slice(&[0x5b, 0xc3]);
        let patch = plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        assert_eq!(patch.len(), 9);
        let t = trampoline(&patch, 0x7fff_0000_0000, |_| Ok(Vec::new())).expect("relocatable");
        let decoded: Vec<Instruction> = Decoder::with_ip(64, &t.code, 0x7fff_0000_0000, DecoderOptions::NONE).into_iter().collect();
        let mnemonics: Vec<String> = decoded.iter().map(|i| format!("{:?}", i.mnemonic())).collect();
        assert_eq!(&mnemonics[..5], ["Push", "Mov", "Push", "Mov", "Jmp"], "{decoded:?}");
        // The pushed address, once its high half is written, is the instruction after the call.
        assert_eq!(decoded[2].immediate32() as u64 | (decoded[3].immediate32() as u64) << 32, 0x1009);
        // The jump reaches the callee (through memory: it is out of rel32 reach).
        assert!(decoded[4].is_jmp_near_indirect() || decoded[4].near_branch_target() == target);
    }

    #[test]
    fn returns_are_patched_over_the_instructions_before_them() {
        // push rbp; mov rbp,rsp; test edi,edi; jle L; mov eax,1; mov rbx,[rbp-8]; leave; ret;
        // L: xor eax,eax; mov rbx,[rbp-8]; pop rbp; ret
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x85, 0xff, 0x7e, 0x0b, 0xb8, 1, 0, 0, 0, 0x48, 0x8b, 0x5d, 0xf8, 0xc9, 0xc3, 0x31, 0xc0, 0x48, 0x8b,
            0x5d, 0xf8, 0x5d, 0xc3,
        ];
        let plans = plan_returns(0x1000, &code).expect("patchable");
        assert_eq!(plans.len(), 2);
        // mov rbx,[rbp-8]; leave; ret: 6 bytes from 0x100d.
        assert_eq!((plans[0].at, plans[0].len(), plans[0].replaced.len()), (0x100d, 6, 2));
        let t = trampoline(&plans[0], 0x5000, |a| Ok(vec![0xc3; usize::from(a == 0x5005)])).expect("relocatable");
        assert_eq!(t.code.len(), 5 + 1);
        assert_eq!(t.moved.last(), Some(&(0x1012, 0x5005)));
        // The branch to L (0x1013) lands before the second plan.
        assert_eq!((plans[1].at, plans[1].len()), (0x1015, 6));
        // A branch into the middle of the bytes before a return is not allowed.
        let mut bad = code;
        bad[7] = 0x11; // jle -> 0x1019 (pop rbp), inside the second plan
        assert!(plan_returns(0x1000, &bad).expect_err("entered").contains("branches into"));
    }

    #[test]
    fn a_patch_over_bytes_code_elsewhere_jumps_into_is_refused() {
        // mov rax,rdi (3); add rax,1 (4); ret
        let code = [0x48, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x01, 0xc3];
        let patch = plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        assert!(not_entered_inside(&patch, 0x1000, &[3]).expect_err("entered at 3").contains("byte 3"));
        // At its start, or past the replaced bytes, a jump lands as it should.
        assert!(not_entered_inside(&patch, 0x1000, &[0, 7]).is_ok());
    }

    #[test]
    fn an_indirect_call_that_ends_the_patch_jumps_through_its_operand_from_the_original_return_address() {
        // push rax; call [rip+0x1000]; mov rdi,rax; pop rax; ret (Rust's vtable shims start so)
        let code = [0x50, 0xff, 0x15, 0x00, 0x10, 0x00, 0x00, 0x48, 0x89, 0xc7, 0x58, 0xc3];
        let patch = plan(0x1000, &code, 0, IslandRoom::default()).expect("patchable");
        assert_eq!(patch.len(), 7);
        let at = 0x1000_0000;
        let t = trampoline(&patch, at, |_| Ok(Vec::new())).expect("relocatable");
        let decoded: Vec<Instruction> = Decoder::with_ip(64, &t.code, at, DecoderOptions::NONE).into_iter().collect();
        let mnemonics: Vec<String> = decoded.iter().take(4).map(|i| format!("{:?}", i.mnemonic())).collect();
        assert_eq!(mnemonics, ["Push", "Push", "Mov", "Jmp"], "{decoded:?}");
        assert_eq!(decoded[1].immediate32() as u64 | (decoded[2].immediate32() as u64) << 32, 0x1007, "the original return address");
        // Through the same memory, relocated: 0x1007 + 0x1000.
        assert_eq!(decoded[3].ip_rel_memory_address(), 0x2007);
        // Through a register: mov rbx,rdi; call rbx.
        let patch = plan(0x1000, &[0x48, 0x89, 0xfb, 0xff, 0xd3, 0xc3], 0, IslandRoom::default()).expect("patchable");
        let t = trampoline(&patch, at, |_| Ok(Vec::new())).expect("relocatable");
        let decoded: Vec<Instruction> = Decoder::with_ip(64, &t.code, at, DecoderOptions::NONE).into_iter().collect();
        assert_eq!(decoded[3].code(), Code::Jmp_rm64);
        assert_eq!(decoded[3].op0_register(), Register::RBX);
        // Through memory read through rsp, which the pushed address moves:
        // push rax; call [rsp+8], and with a 32-bit address, call [esp+8].
        assert!(plan(0x1000, &[0x50, 0xff, 0x54, 0x24, 0x08, 0xc3], 0, IslandRoom::default()).expect_err("rsp").contains("call"));
        assert!(plan(0x1000, &[0x50, 0x67, 0xff, 0x54, 0x24, 0x08, 0xc3], 0, IslandRoom::default()).expect_err("esp").contains("call"));
        // Through a slot among the bytes the jump replaces: push rax; call [rip-7].
        let code = [0x50, 0xff, 0x15, 0xf9, 0xff, 0xff, 0xff, 0xc3];
        assert!(plan(0x1000, &code, 0, IslandRoom::default()).expect_err("own bytes").contains("reads its own"));
    }

    /// xor eax,eax; inc eax; cmp eax,10; jne -> inc: a loop back to +2.
    const LOOPING: [u8; 9] = [0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x75, 0xf9];

    #[test]
    fn a_function_looping_back_into_its_first_bytes_takes_a_short_jump_to_the_padding_before_it() {
        let mut code = LOOPING.to_vec();
        code.push(0xc3);
        let before = [0xcc; 7];
        let room = IslandRoom { before: &before, compiled: true };
        let patch = plan(0x1000, &code, 0, room).expect("patchable with a short jump");
        // xor eax,eax alone: the loop comes back right after it.
        assert_eq!((patch.len(), patch.replaced.len()), (2, 1));
        let island = patch.island.as_ref().expect("an island");
        assert_eq!((island.at, island.original.as_slice()), (0x1000 - 5, &[0xcc; 5][..]));
        assert_eq!(patch.short_jump(), Some(vec![0xeb, 0xf9]), "jmp -7: from 0x1002 back to 0xffb");
        assert_eq!(patch.jump_site(), (0xffb, &[0xcc; 5][..]));
        // Taken out, its padding runs into the entry as before.
        assert_eq!(island.restored, island.original);
        let jump = patch.jump_to(0x2000);
        assert_eq!(Decoder::with_ip(64, &jump, 0xffb, DecoderOptions::NONE).decode().near_branch_target(), 0x2000);
        // Its trampoline goes back after xor eax,eax.
        let t = trampoline(&patch, 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).expect("movable");
        let back = Decoder::with_ip(64, &t.code[t.code.len() - 5..], 0x40_5000 + t.code.len() as u64 - 5, DecoderOptions::NONE).decode();
        assert_eq!(back.near_branch_target(), 0x1002);
        // Hand-written code may run its padding: no island.
        let err = plan(0x1000, &code, 0, IslandRoom { before: &before, compiled: false }).expect_err("no island");
        assert!(err.contains("no padding near it"), "{err}");
        // Nor in too little of it.
        assert!(plan(0x1000, &code, 0, IslandRoom { before: &before[..4], compiled: true }).is_err());
    }

    #[test]
    fn an_island_may_be_padding_after_a_return_of_the_function_that_no_branch_enters() {
        // The loop; ret; nop dword [rax+rax] (5 bytes of padding); ret.
        let mut code = LOOPING.to_vec();
        code.extend([0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]);
        let patch = plan(0x1000, &code, 0, IslandRoom { before: &[], compiled: true }).expect("patchable");
        let island = patch.island.as_ref().expect("an island");
        assert_eq!((island.at, island.original.as_slice()), (0x100a, &code[10..15]));
        assert_eq!(patch.short_jump(), Some(vec![0xeb, 0x08]));
        // Taken out, it jumps back to the entry: jmp -0xc, from 0x100c to 0x1000.
        assert_eq!(island.restored, [0xeb, 0xf4, 0x44, 0x00, 0x00]);
        // A jump into that padding (jmp -7 to 0x100a, after it) runs it: no island.
        let mut entered = code[..15].to_vec();
        entered.extend([0xeb, 0xf9, 0xc3]);
        let err = plan(0x1000, &entered, 0, IslandRoom { before: &[], compiled: true }).expect_err("entered");
        assert!(err.contains("jumps back into its first 7 bytes, and has no padding"), "{err}");
        // A loop back into the bytes even a short jump replaces is refused:
        // push rbx; xor eax,eax; ... jne -> xor (+1).
        let mut tight = vec![0x53];
        tight.extend(&LOOPING);
        tight[9] = 0xf7;
        tight.push(0xc3);
        let err = plan(0x1000, &tight, 0, IslandRoom { before: &[0xcc; 8], compiled: true }).expect_err("inside the short jump");
        assert!(err.contains("jumps back into its first 3 bytes"), "{err}");
    }

    /// A jmp rel8 reaches 127 bytes past its own end (not past the bytes
    /// it replaces), and the island's jump back, taken out, 128 bytes
    /// before its own: an island is at most 126 bytes past the entry.
    #[test]
    fn an_island_is_within_a_short_jumps_reach_both_ways() {
        // push rbx; xor ebx,ebx; 1: add rbx,rdi; sub rdi,1; jg 1b (to +3);
        // then moves up to a ret at `ret_at`; 5 bytes of padding; ret.
        let code = |ret_at: usize| {
            let mut code = vec![0x53, 0x31, 0xdb, 0x48, 0x01, 0xfb, 0x48, 0x83, 0xef, 0x01, 0x7f, 0xf7];
            while code.len() + 5 <= ret_at {
                code.extend([0xb8, 0, 0, 0, 0]);
            }
            code.resize(ret_at, 0x90);
            code.extend([0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]);
            code
        };
        let room = IslandRoom { before: &[], compiled: true };
        let patch = plan(0x1000, &code(125), 0, room).expect("in reach");
        let island = patch.island.as_ref().expect("an island");
        assert_eq!((patch.len(), island.at), (3, 0x1000 + 126));
        assert_eq!(patch.short_jump(), Some(vec![0xeb, 0x7c, 0xcc]));
        assert_eq!(island.restored[..2], [0xeb, 0x80], "back 128 bytes, to the entry");
        // One byte further, the way back is 129 bytes; three further, the
        // way there 128 past the short jump (125 past the bytes it replaces).
        for ret_at in [126, 128] {
            assert!(plan(0x1000, &code(ret_at), 0, room).expect_err("out of reach").contains("no padding near it"), "{ret_at}");
        }
    }

    /// An operand relative to EIP (`addr32` on a RIP-relative one) is
    /// refused before the block encoder, which asserts on one it has to
    /// move: `mov rax, [eip + 0x100]; ret`, and what fuzzing found
    /// (`enqcmds` under two address-size prefixes).
    #[test]
    fn an_eip_relative_operand_is_refused_not_moved() {
        let code = [0x67, 0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0xc3];
        let patch = plan_checked(0x1000, &code, 0).expect("planned");
        let err = trampoline(&patch, 0x40_5000, |a| Ok(count_call(a, 0x40_6000))).expect_err("refused");
        assert!(err.contains("relative to EIP"), "{err}");
        let found = [0x67, 0x67, 0xf3, 0x0f, 0x38, 0xf8, 0x25, 0x02, 0xc3, 0x01, 0x0c, 0x55, 0x34, 0xa1, 0xc3];
        for patch in plan_checked(0x40_1000, &found, 3).into_iter().chain(plan_returns(0x40_1000, &found).unwrap_or_default()) {
            let err = trampoline(&patch, 0x40_8000, |a| Ok(count_call(a, a + 0x1000))).expect_err("refused");
            assert!(err.contains("relative to EIP"), "{err}");
        }
    }

    #[test]
    fn unsafe_entries_say_why() {
        // A call that does not end the patch: call rax (2 bytes) first.
        assert!(plan(0x1000, &[0xff, 0xd0, 0x31, 0xc0, 0x90, 0x90, 0xc3], 0, IslandRoom::default()).expect_err("call").contains("call"));
        // ret within the first bytes.
        assert!(plan(0x1000, &[0x31, 0xc0, 0xc3], 0, IslandRoom::default()).expect_err("short").contains("ends within"));
        // A loop jumping back to the second instruction: xor eax,eax; inc eax; cmp eax,10; jne -> inc.
        let code = [0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x75, 0xf9, 0xc3];
        assert!(plan(0x1000, &code, 0, IslandRoom::default()).expect_err("loop").contains("jumps back into"));
    }
}

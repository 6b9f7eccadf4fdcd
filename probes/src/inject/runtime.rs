//! The code proftap puts in a target to time calls, and the memory it uses.
//!
//! A patched entry jumps to the function's trampoline, which saves the
//! registers a call may carry arguments in and calls `entry` with the
//! address of the return-address slot and the function's id. `entry` finds
//! the thread's slot (keyed by its TLS block, `fs:[0]`, which the x86-64 TLS
//! ABI makes point to itself), pushes the return address on the thread's
//! shadow stack, puts the return trampoline's address in the slot and
//! records the entry. The return trampoline calls `exit`, which pops the
//! shadow stack (dropping frames a longjmp or an exception skipped), puts the
//! original return address back and records the exit.
//!
//! Memory: the slot table and shadow stacks are private to the process (a
//! forked child gets its own copy, so its returns still work); the event
//! rings are shared with proftap; a one-page "live" flag is wiped on fork, so
//! a child writes no event into its parent's rings.

use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::*;

/// Bytes set aside for the runtime's code.
pub const CODE_ROOM: usize = 2048;
/// Threads with a slot; more threads run their calls untimed.
pub const SLOTS: u64 = 64;
/// Calls deep a thread's shadow stack goes; deeper calls go untimed.
pub const STACK_DEPTH: u64 = 8192;
/// Bytes of a shadow stack entry: return address, its slot, function.
pub const STACK_ENTRY: u64 = 32;
/// Bytes of a thread's entry in the slot table: key, tid, depth, and
/// whether an unwinder had its return addresses put back.
pub const SLOT_BYTES: u64 = 32;
/// Records per thread ring (a power of two).
pub const RING: u64 = 1 << 19;
/// Bytes of a record: TSC, function and kind, return-address slot, return address.
pub const RECORD: u64 = 32;
/// Bytes of a thread's ring control in shared memory: tid, head, tail,
/// lost, untimed.
pub const CONTROL: u64 = 64;
/// Bytes of the shared memory's header, before the ring controls.
pub const HEADER: u64 = 64;

/// Where in a record's second word the kind is (the function is in the
/// low 32 bits, the thread's id above the kind).
pub const KIND_SHIFT: u32 = 32;
/// Where the thread's id is in a record's second word.
pub const TID_SHIFT: u32 = 40;

/// Record kinds.
pub const ENTRY: u32 = 0;
/// A return.
pub const EXIT: u32 = 1;
/// A handler caught an exception (the slot is the catching frame's call).
pub const CATCH: u32 = 2;

/// Offset in a slot table entry of the flag "return addresses put back".
const UNHOOKED: i32 = 24;

/// Offsets of a ring control's fields.
pub mod control {
    /// The thread's tid (0 until it made a call).
    pub const TID: usize = 0;
    /// Records written (the producer's counter).
    pub const HEAD: usize = 8;
    /// Records read (proftap's counter).
    pub const TAIL: usize = 16;
    /// Records dropped because the ring was full.
    pub const LOST: usize = 24;
    /// Calls not timed because the thread's shadow stack was full.
    pub const UNTIMED: usize = 32;
}

/// Offsets of the shared header's fields.
pub mod header {
    /// Calls not timed because every slot was taken by another thread.
    pub const UNSLOTTED: usize = 0;
}

/// Bytes of the private memory: slot table and shadow stacks.
pub const PRIVATE_BYTES: u64 = SLOTS * SLOT_BYTES + SLOTS * STACK_DEPTH * STACK_ENTRY;
/// Bytes of the shared memory: header, ring controls, then rings.
pub const SHARED_BYTES: u64 = HEADER + SLOTS * CONTROL + SLOTS * RING * RECORD;

/// Where the runtime's memory is in the target.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Slot table, then shadow stacks.
    pub private: u64,
    /// The live flag (a page wiped on fork).
    pub live: u64,
    /// Header, ring controls, then rings.
    pub shared: u64,
    /// Where the C library keeps a thread's id in its thread control block
    /// (an offset from the thread pointer), when known: a thread that gets
    /// the block of one that ended is told apart by it.
    pub tcb_tid: Option<i32>,
}

impl Layout {
    fn table(&self) -> u64 {
        self.private
    }
    fn stacks(&self) -> u64 {
        self.private + SLOTS * SLOT_BYTES
    }
    fn controls(&self) -> u64 {
        self.shared + HEADER
    }
    fn rings(&self) -> u64 {
        self.shared + HEADER + SLOTS * CONTROL
    }
    /// Offset in the shared memory of slot `slot`'s ring control.
    pub fn control_offset(slot: u64) -> usize {
        (HEADER + slot * CONTROL) as usize
    }
    /// Offset in the shared memory of record `n` of slot `slot`'s ring.
    pub fn record_offset(slot: u64, n: u64) -> usize {
        (HEADER + SLOTS * CONTROL + (slot * RING + (n & (RING - 1))) * RECORD) as usize
    }
}

/// The runtime's code, assembled for an address.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// The code.
    pub code: Vec<u8>,
    /// Where `entry` is.
    pub entry: u64,
    /// Where the return trampoline is.
    pub return_trampoline: u64,
    /// Where `unhook` is: called where an unwinder starts, it puts the
    /// thread's original return addresses back.
    pub unhook: u64,
    /// Where `rehook` is: called where a handler catches, it hijacks the
    /// live frames' return addresses again.
    pub rehook: u64,
    /// Where `resume` is: called where a stack walker returns, it hijacks
    /// the return addresses it had put back.
    pub resume: u64,
}

fn asm_error(e: IcedError) -> String {
    format!("cannot assemble the runtime: {e}")
}

/// Finds the calling thread's slot: r9 = its entry in the table, r10 = its
/// index, and goes on at `found` (set here: the next instruction). Claims a
/// free one when `claim` (and records the tid), else jumps to `missing`.
/// Clobbers rax, rcx, rdx, r8, r11; keeps rdi and rsi.
fn find_slot(a: &mut CodeAssembler, layout: &Layout, claim: bool, missing: CodeLabel, found: &mut CodeLabel) -> Result<(), IcedError> {
    let mut lookup = a.create_label();
    let mut next = a.create_label();
    let mut take = a.create_label();
    a.mov(r8, qword_ptr(0).fs())?;
    a.mov(r10, r8)?;
    a.shr(r10, 8)?;
    a.and(r10, (SLOTS - 1) as i32)?;
    a.mov(r11, SLOTS)?;
    a.set_label(&mut lookup)?;
    a.mov(r9, r10)?;
    a.shl(r9, SLOT_BYTES.trailing_zeros() as i32)?;
    a.mov(rax, layout.table())?;
    a.add(r9, rax)?;
    a.mov(rax, qword_ptr(r9))?;
    a.cmp(rax, r8)?;
    a.je(*found)?;
    a.test(rax, rax)?;
    a.jz(take)?;
    a.set_label(&mut next)?;
    a.inc(r10)?;
    a.and(r10, (SLOTS - 1) as i32)?;
    a.dec(r11)?;
    a.jnz(lookup)?;
    a.jmp(missing)?;
    a.set_label(&mut take)?;
    if claim {
        a.xor(eax, eax)?;
        a.lock().cmpxchg(qword_ptr(r9), r8)?;
        a.jne(next)?;
        // The thread's id, for proftap: gettid (syscall clobbers rcx, r11).
        a.push(rdi)?;
        a.push(rsi)?;
        a.mov(eax, libc::SYS_gettid as u32)?;
        a.syscall()?;
        a.pop(rsi)?;
        a.pop(rdi)?;
        a.mov(qword_ptr(r9 + 8), rax)?;
        control_address(a, layout, rcx, rdx)?;
        a.mov(qword_ptr(rcx + control::TID as i32), rax)?;
        a.jmp(*found)?;
    } else {
        a.jmp(missing)?;
    }
    a.set_label(found)?;
    Ok(())
}

/// `into` = the address of the ring control of slot index r10; clobbers `scratch`.
fn control_address(a: &mut CodeAssembler, layout: &Layout, into: AsmRegister64, scratch: AsmRegister64) -> Result<(), IcedError> {
    a.mov(into, r10)?;
    a.shl(into, CONTROL.trailing_zeros() as i32)?;
    a.mov(scratch, layout.controls())?;
    a.add(into, scratch)
}

/// Goes on at `skip` unless recording is live in this process (the flag is
/// wiped in a forked child). Clobbers rax.
fn skip_unless_live(a: &mut CodeAssembler, layout: &Layout, skip: CodeLabel) -> Result<(), IcedError> {
    a.mov(rax, layout.live)?;
    a.cmp(qword_ptr(rax), 0i32)?;
    a.je(skip)
}

/// rcx = the address of shadow stack entry `rax` of slot index r10 (of
/// entry `rax - 1`, the top, with `top`). Clobbers rdx.
fn stack_entry(a: &mut CodeAssembler, layout: &Layout, top: bool) -> Result<(), IcedError> {
    a.mov(rcx, r10)?;
    a.imul_3(rcx, rcx, STACK_DEPTH as i32)?;
    a.add(rcx, rax)?;
    if top {
        a.dec(rcx)?;
    }
    a.shl(rcx, STACK_ENTRY.trailing_zeros() as i32)?;
    a.mov(rdx, layout.stacks())?;
    a.add(rcx, rdx)
}

/// Pops the frames of the shadow stack (r9 = the thread's table entry,
/// r10 = its index) whose return-address slot is below rdi, or at it with
/// `at_too`: they are gone. Leaves the depth in rax. Clobbers rcx, rdx.
fn drop_below(a: &mut CodeAssembler, layout: &Layout, at_too: bool) -> Result<(), IcedError> {
    let mut test = a.create_label();
    let mut done = a.create_label();
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.set_label(&mut test)?;
    a.test(rax, rax)?;
    a.jz(done)?;
    stack_entry(a, layout, true)?;
    a.cmp(qword_ptr(rcx + 8), rdi)?;
    if at_too {
        a.ja(done)?;
    } else {
        a.jae(done)?;
    }
    a.dec(rax)?;
    a.jmp(test)?;
    a.set_label(&mut done)?;
    a.mov(qword_ptr(r9 + 16), rax)
}

/// For each shadow stack entry (rax of them, of slot index r10) whose
/// return-address slot is above rdi and holds `from` (the entry's original
/// return address when `from` is None), writes `to` (the original when
/// None). Clobbers rax, rcx, rdx, r8, r11.
fn rewrite_slots(a: &mut CodeAssembler, layout: &Layout, from: Option<u64>, to: Option<u64>) -> Result<(), IcedError> {
    let mut next = a.create_label();
    let mut skip = a.create_label();
    let mut done = a.create_label();
    a.mov(r11, rax)?;
    a.xor(eax, eax)?;
    stack_entry(a, layout, false)?;
    a.set_label(&mut next)?;
    a.test(r11, r11)?;
    a.jz(done)?;
    a.mov(r8, qword_ptr(rcx + 8))?;
    a.cmp(r8, rdi)?;
    a.jbe(skip)?;
    match from {
        Some(value) => a.mov(rax, value)?,
        None => a.mov(rax, qword_ptr(rcx))?,
    }
    a.cmp(qword_ptr(r8), rax)?;
    a.jne(skip)?;
    match to {
        Some(value) => a.mov(rax, value)?,
        None => a.mov(rax, qword_ptr(rcx))?,
    }
    a.mov(qword_ptr(r8), rax)?;
    a.set_label(&mut skip)?;
    a.add(rcx, STACK_ENTRY as i32)?;
    a.dec(r11)?;
    a.jmp(next)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// Assembles the runtime at `address` for memory at `layout`. Hijacked
/// returns go to `return_trampoline` (one shared by every copy of the
/// runtime in the process), or to this copy's own when `None`.
pub fn assemble(address: u64, layout: &Layout, return_trampoline: Option<u64>) -> Result<Runtime, String> {
    build(address, layout, return_trampoline).map_err(asm_error)
}

fn build(address: u64, layout: &Layout, shared_return: Option<u64>) -> Result<Runtime, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut entry = a.create_label();
    let mut exit = a.create_label();
    let mut return_trampoline = a.create_label();
    let mut record = a.create_label();
    let mut done = a.create_label();
    let mut lost = a.create_label();
    let mut broken = a.create_label();
    let mut pop = a.create_label();
    let mut matched = a.create_label();

    let mut unhook = a.create_label();
    let mut rehook = a.create_label();
    let mut rehook_found = a.create_label();
    let mut resume = a.create_label();

    // entry(rdi = return-address slot, esi = function).
    a.set_label(&mut entry)?;
    let mut found = a.create_label();
    let mut unslotted = a.create_label();
    let mut too_deep = a.create_label();
    find_slot(&mut a, layout, true, unslotted, &mut found)?;
    if let Some(offset) = layout.tcb_tid {
        // A thread in the slot of one that ended (the C library gave it the
        // same thread control block): the slot is its own from now on.
        let mut same = a.create_label();
        a.mov(eax, dword_ptr(offset).fs())?;
        a.cmp(eax, dword_ptr(r9 + 8))?;
        a.je(same)?;
        a.mov(qword_ptr(r9 + 8), rax)?;
        a.mov(qword_ptr(r9 + 16), 0i32)?;
        a.mov(qword_ptr(r9 + UNHOOKED), 0i32)?;
        control_address(&mut a, layout, rcx, rdx)?;
        a.mov(qword_ptr(rcx + control::TID as i32), rax)?;
        a.set_label(&mut same)?;
    }
    // After an unwinder walked the stack (backtrace()), the frames still
    // live are hijacked again at the thread's next call.
    let mut hooked = a.create_label();
    a.cmp(qword_ptr(r9 + UNHOOKED), 0i32)?;
    a.je(hooked)?;
    a.call(rehook_found)?;
    a.set_label(&mut hooked)?;
    // Frames a longjmp or an exception left are dropped first: those deeper
    // than this call, and one in this very slot unless the slot still holds
    // the return trampoline (then this is its tail call, and it lives on).
    let mut push = a.create_label();
    let mut drop_top = a.create_label();
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.test(rax, rax)?;
    a.jz(push)?;
    stack_entry(&mut a, layout, true)?;
    a.mov(rdx, qword_ptr(rcx + 8))?;
    a.cmp(rdx, rdi)?;
    a.jb(drop_top)?;
    a.jne(push)?;
    a.mov(r8, qword_ptr(rdi))?;
    a.mov(rdx, return_trampoline_placeholder())?;
    a.cmp(r8, rdx)?;
    a.je(push)?;
    a.set_label(&mut drop_top)?;
    a.dec(rax)?;
    a.mov(qword_ptr(r9 + 16), rax)?;
    a.jmp(found)?;
    a.set_label(&mut push)?;
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.cmp(rax, STACK_DEPTH as i32)?;
    a.jae(too_deep)?;
    // Shadow stack entry: stacks + (index * depth + depth) * 32.
    stack_entry(&mut a, layout, false)?;
    a.mov(rdx, qword_ptr(rdi))?;
    a.mov(qword_ptr(rcx), rdx)?;
    a.mov(qword_ptr(rcx + 8), rdi)?;
    a.mov(qword_ptr(rcx + 16), rsi)?;
    a.inc(rax)?;
    a.mov(qword_ptr(r9 + 16), rax)?;
    // The record carries the original return address (rdx) and the slot (rdi).
    a.mov(r8, rdx)?;
    a.mov(rdx, return_trampoline_placeholder())?;
    a.mov(qword_ptr(rdi), rdx)?;
    a.mov(ecx, ENTRY)?;
    a.jmp(record)?;

    // exit(rdi = the room for the return address, which is the slot it was in).
    a.set_label(&mut exit)?;
    find_slot(&mut a, layout, false, broken, &mut pop)?;
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.test(rax, rax)?;
    a.jz(broken)?;
    a.dec(rax)?;
    a.mov(qword_ptr(r9 + 16), rax)?;
    stack_entry(&mut a, layout, false)?;
    a.cmp(qword_ptr(rcx + 8), rdi)?;
    a.je(matched)?;
    // A deeper frame that never returned (longjmp, exception): dropped.
    a.jb(pop)?;
    a.jmp(broken)?;
    a.set_label(&mut matched)?;
    a.mov(r8, qword_ptr(rcx))?;
    a.mov(qword_ptr(rdi), r8)?;
    a.mov(rsi, qword_ptr(rcx + 16))?;
    a.mov(ecx, EXIT)?;
    a.jmp(record)?;

    // record(esi = function, ecx = kind, rdi = slot, r8 = return address, r10 = index).
    a.set_label(&mut record)?;
    a.shl(rcx, KIND_SHIFT as i32)?;
    a.or(rsi, rcx)?;
    a.mov(rax, qword_ptr(r9 + 8))?;
    a.shl(rax, TID_SHIFT as i32)?;
    a.or(rsi, rax)?;
    skip_unless_live(&mut a, layout, done)?;
    control_address(&mut a, layout, r11, rax)?;
    a.mov(r9, qword_ptr(r11 + control::HEAD as i32))?;
    a.mov(rax, r9)?;
    a.sub(rax, qword_ptr(r11 + control::TAIL as i32))?;
    a.cmp(rax, RING as i32)?;
    a.jae(lost)?;
    a.mov(rcx, r9)?;
    a.and(rcx, (RING - 1) as i32)?;
    a.mov(rax, r10)?;
    a.shl(rax, RING.trailing_zeros() as i32)?;
    a.add(rcx, rax)?;
    a.shl(rcx, RECORD.trailing_zeros() as i32)?;
    a.mov(rax, layout.rings())?;
    a.add(rcx, rax)?;
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)?;
    a.mov(qword_ptr(rcx), rax)?;
    a.mov(qword_ptr(rcx + 8), rsi)?;
    a.mov(qword_ptr(rcx + 16), rdi)?;
    a.mov(qword_ptr(rcx + 24), r8)?;
    // Published after the record (x86 keeps stores in order).
    a.inc(r9)?;
    a.mov(qword_ptr(r11 + control::HEAD as i32), r9)?;
    a.set_label(&mut done)?;
    a.ret()?;
    a.set_label(&mut lost)?;
    a.inc(qword_ptr(r11 + control::LOST as i32))?;
    a.ret()?;
    // Calls that go untimed are counted, in this process only (a forked
    // child shares the rings but not the live flag).
    a.set_label(&mut unslotted)?;
    skip_unless_live(&mut a, layout, done)?;
    a.mov(rax, layout.shared)?;
    a.lock().inc(qword_ptr(rax + header::UNSLOTTED as i32))?;
    a.ret()?;
    a.set_label(&mut too_deep)?;
    skip_unless_live(&mut a, layout, done)?;
    control_address(&mut a, layout, r11, rax)?;
    a.inc(qword_ptr(r11 + control::UNTIMED as i32))?;
    a.ret()?;
    // No shadow stack entry for a return: nothing to return to.
    a.set_label(&mut broken)?;
    a.ud2()?;

    // unhook(rdi = the return-address slot of a call into the unwinder):
    // frames below it are gone; the others get their return addresses
    // back, for the unwinder to read.
    a.set_label(&mut unhook)?;
    let mut unhook_found = a.create_label();
    find_slot(&mut a, layout, false, done, &mut unhook_found)?;
    drop_below(&mut a, layout, true)?;
    rewrite_slots(&mut a, layout, Some(PLACEHOLDER), None)?;
    a.mov(qword_ptr(r9 + UNHOOKED), 1i32)?;
    a.ret()?;

    // rehook(rdi = the return-address slot of a call a handler makes, esi =
    // the id catches are recorded with): frames below it are gone (an
    // exception left them); those above return through the trampoline again.
    a.set_label(&mut rehook)?;
    let mut rehook_slot = a.create_label();
    find_slot(&mut a, layout, false, done, &mut rehook_slot)?;
    a.call(rehook_found)?;
    a.mov(r8, qword_ptr(rdi))?;
    a.mov(ecx, CATCH)?;
    a.jmp(record)?;
    // resume(rdi = where a stack walker's return address is, as it
    // returns): the frames it had put back are hijacked again.
    a.set_label(&mut resume)?;
    let mut resume_found = a.create_label();
    find_slot(&mut a, layout, false, done, &mut resume_found)?;
    a.cmp(qword_ptr(r9 + UNHOOKED), 0i32)?;
    a.je(done)?;
    a.call(rehook_found)?;
    a.ret()?;
    // With r9 and r10 found: keeps rdi, rsi, r9, r10.
    a.set_label(&mut rehook_found)?;
    a.mov(qword_ptr(r9 + UNHOOKED), 0i32)?;
    drop_below(&mut a, layout, false)?;
    rewrite_slots(&mut a, layout, None, Some(PLACEHOLDER))?;
    a.ret()?;

    // The return trampoline: a hijacked return lands here.
    a.set_label(&mut return_trampoline)?;
    a.sub(rsp, 8)?;
    for r in SAVED {
        a.push(r)?;
    }
    a.lea(rdi, qword_ptr(rsp + 8 * SAVED.len() as i32))?;
    a.call(exit)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.ret()?;

    let result = a.assemble_options(address, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let entry_ip = result.label_ip(&entry)?;
    let return_ip = shared_return.unwrap_or(result.label_ip(&return_trampoline)?);
    let (unhook, rehook, resume) = (result.label_ip(&unhook)?, result.label_ip(&rehook)?, result.label_ip(&resume)?);
    let mut code = result.inner.code_buffer;
    // The hijack stores the return trampoline's address, known only now.
    patch_placeholder(&mut code, return_ip);
    Ok(Runtime { code, entry: entry_ip, return_trampoline: return_ip, unhook, rehook, resume })
}

/// The registers a trampoline saves: those a call may pass arguments or
/// return values in, and the scratch ones the runtime uses.
const SAVED: [AsmRegister64; 9] = [rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11];

const PLACEHOLDER: u64 = 0x7072_6f66_7461_7031;

fn return_trampoline_placeholder() -> u64 {
    PLACEHOLDER
}

fn patch_placeholder(code: &mut [u8], value: u64) {
    let needle = PLACEHOLDER.to_le_bytes();
    while let Some(at) = code.windows(8).position(|w| w == needle) {
        code[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
}

/// The start of a function's trampoline: save registers, call `routine`
/// (`entry`, `unhook` or `rehook`) with the return-address slot and
/// `function`, restore.
pub fn call_routine(address: u64, routine: u64, function: u32) -> Result<Vec<u8>, String> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        for r in SAVED {
            a.push(r)?;
        }
        a.lea(rdi, qword_ptr(rsp + 8 * SAVED.len() as i32))?;
        a.mov(esi, function)?;
        a.call(routine)?;
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.assemble(address)
    };
    build().map_err(asm_error)
}

/// The code that ends a trampoline over a return: save registers (the
/// return value among them), call `routine` with the return-address slot,
/// restore, return.
pub fn call_routine_and_return(address: u64, routine: u64) -> Result<Vec<u8>, String> {
    let mut code = call_routine(address, routine, 0)?;
    code.push(0xc3);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_assembles_and_knows_its_return_trampoline() {
        let layout = Layout { private: 0x10_0000, live: 0x20_0000, shared: 0x30_0000, tcb_tid: Some(0x2d0) };
        let rt = assemble(0x40_0000, &layout, None).expect("assembles");
        assert!(rt.code.len() <= CODE_ROOM, "{} bytes", rt.code.len());
        assert_eq!(rt.entry, 0x40_0000);
        assert!((0x40_0000..0x40_0000 + rt.code.len() as u64).contains(&rt.return_trampoline));
        // Every use of the return trampoline's address was filled in.
        assert!(!rt.code.windows(8).any(|w| w == PLACEHOLDER.to_le_bytes()));
        assert_eq!(rt.code.windows(8).filter(|w| *w == rt.return_trampoline.to_le_bytes()).count(), 4);
        // A second copy hijacks returns to the first one's trampoline.
        let copy = assemble(0x80_0000, &layout, Some(rt.return_trampoline)).expect("assembles");
        assert_eq!(copy.code.windows(8).filter(|w| *w == rt.return_trampoline.to_le_bytes()).count(), 4);
    }
}

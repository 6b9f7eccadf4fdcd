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

/// Threads with a slot; more threads run their calls untimed.
pub const SLOTS: u64 = 64;
/// Calls deep a thread's shadow stack goes; deeper calls go untimed.
pub const STACK_DEPTH: u64 = 512;
/// Bytes of a shadow stack entry: return address, its slot, function.
pub const STACK_ENTRY: u64 = 32;
/// Bytes of a thread's entry in the slot table: key, tid, depth.
pub const SLOT_BYTES: u64 = 32;
/// Records per thread ring (a power of two).
pub const RING: u64 = 1 << 18;
/// Bytes of a record: TSC, function and kind, return-address slot, return address.
pub const RECORD: u64 = 32;
/// Bytes of a thread's ring control in shared memory: tid, head, tail, lost.
pub const CONTROL: u64 = 64;

/// Record kinds.
pub const ENTRY: u32 = 0;
/// A return.
pub const EXIT: u32 = 1;

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
}

/// Bytes of the private memory: slot table and shadow stacks.
pub const PRIVATE_BYTES: u64 = SLOTS * SLOT_BYTES + SLOTS * STACK_DEPTH * STACK_ENTRY;
/// Bytes of the shared memory: ring controls, then rings.
pub const SHARED_BYTES: u64 = SLOTS * CONTROL + SLOTS * RING * RECORD;

/// Where the runtime's memory is in the target.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Slot table, then shadow stacks.
    pub private: u64,
    /// The live flag (a page wiped on fork).
    pub live: u64,
    /// Ring controls, then rings.
    pub shared: u64,
}

impl Layout {
    fn table(&self) -> u64 {
        self.private
    }
    fn stacks(&self) -> u64 {
        self.private + SLOTS * SLOT_BYTES
    }
    fn controls(&self) -> u64 {
        self.shared
    }
    fn rings(&self) -> u64 {
        self.shared + SLOTS * CONTROL
    }
    /// Offset in the shared memory of slot `slot`'s ring control.
    pub fn control_offset(slot: u64) -> usize {
        (slot * CONTROL) as usize
    }
    /// Offset in the shared memory of record `n` of slot `slot`'s ring.
    pub fn record_offset(slot: u64, n: u64) -> usize {
        (SLOTS * CONTROL + (slot * RING + (n & (RING - 1))) * RECORD) as usize
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
        a.mov(rcx, r10)?;
        a.shl(rcx, CONTROL.trailing_zeros() as i32)?;
        a.mov(rdx, layout.controls())?;
        a.add(rcx, rdx)?;
        a.mov(qword_ptr(rcx + control::TID as i32), rax)?;
        a.jmp(*found)?;
    } else {
        a.jmp(missing)?;
    }
    a.set_label(found)?;
    Ok(())
}

/// Assembles the runtime at `address` for memory at `layout`.
pub fn assemble(address: u64, layout: &Layout) -> Result<Runtime, String> {
    build(address, layout).map_err(asm_error)
}

fn build(address: u64, layout: &Layout) -> Result<Runtime, IcedError> {
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

    // entry(rdi = return-address slot, esi = function).
    a.set_label(&mut entry)?;
    let mut found = a.create_label();
    find_slot(&mut a, layout, true, done, &mut found)?;
    // Frames a longjmp or an exception left are dropped first: those deeper
    // than this call, and one in this very slot unless the slot still holds
    // the return trampoline (then this is its tail call, and it lives on).
    let mut push = a.create_label();
    let mut drop_top = a.create_label();
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.test(rax, rax)?;
    a.jz(push)?;
    a.mov(rcx, r10)?;
    a.imul_3(rcx, rcx, STACK_DEPTH as i32)?;
    a.add(rcx, rax)?;
    a.dec(rcx)?;
    a.shl(rcx, STACK_ENTRY.trailing_zeros() as i32)?;
    a.mov(rdx, layout.stacks())?;
    a.add(rcx, rdx)?;
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
    a.jae(done)?;
    // Shadow stack entry: stacks + (index * depth + depth) * 32.
    a.mov(rcx, r10)?;
    a.imul_3(rcx, rcx, STACK_DEPTH as i32)?;
    a.add(rcx, rax)?;
    a.shl(rcx, STACK_ENTRY.trailing_zeros() as i32)?;
    a.mov(rdx, layout.stacks())?;
    a.add(rcx, rdx)?;
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
    a.mov(rcx, r10)?;
    a.imul_3(rcx, rcx, STACK_DEPTH as i32)?;
    a.add(rcx, rax)?;
    a.shl(rcx, STACK_ENTRY.trailing_zeros() as i32)?;
    a.mov(rdx, layout.stacks())?;
    a.add(rcx, rdx)?;
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
    a.shl(rcx, 32)?;
    a.or(rsi, rcx)?;
    a.mov(rax, layout.live)?;
    a.cmp(qword_ptr(rax), 0i32)?;
    a.je(done)?;
    a.mov(r11, r10)?;
    a.shl(r11, CONTROL.trailing_zeros() as i32)?;
    a.mov(rax, layout.controls())?;
    a.add(r11, rax)?;
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
    // No shadow stack entry for a return: nothing to return to.
    a.set_label(&mut broken)?;
    a.ud2()?;

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
    let return_ip = result.label_ip(&return_trampoline)?;
    let mut code = result.inner.code_buffer;
    // The hijack stores the return trampoline's address, known only now.
    patch_placeholder(&mut code, return_ip);
    Ok(Runtime { code, entry: entry_ip, return_trampoline: return_ip })
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

/// The start of a function's trampoline: save registers, call `entry` with
/// the return-address slot and `function`, restore.
pub fn call_entry(address: u64, entry: u64, function: u32) -> Result<Vec<u8>, String> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        for r in SAVED {
            a.push(r)?;
        }
        a.lea(rdi, qword_ptr(rsp + 8 * SAVED.len() as i32))?;
        a.mov(esi, function)?;
        a.call(entry)?;
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.assemble(address)
    };
    build().map_err(asm_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_assembles_and_knows_its_return_trampoline() {
        let layout = Layout { private: 0x10_0000, live: 0x20_0000, shared: 0x30_0000 };
        let rt = assemble(0x40_0000, &layout).expect("assembles");
        assert!(rt.code.len() < 1024, "{} bytes", rt.code.len());
        assert_eq!(rt.entry, 0x40_0000);
        assert!((0x40_0000..0x40_0000 + rt.code.len() as u64).contains(&rt.return_trampoline));
        // Every use of the return trampoline's address was filled in.
        assert!(!rt.code.windows(8).any(|w| w == PLACEHOLDER.to_le_bytes()));
        assert_eq!(rt.code.windows(8).filter(|w| *w == rt.return_trampoline.to_le_bytes()).count(), 2);
    }
}

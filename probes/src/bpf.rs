//! BPF programs written as instructions, loaded and attached with the
//! `bpf(2)` system call: the few proftap needs are too small to call for a
//! compiler and a loader library, and are checked by the kernel's verifier
//! as they load.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const BPF_MAP_CREATE: i32 = 0;
pub const BPF_MAP_LOOKUP_ELEM: i32 = 1;
pub const BPF_MAP_UPDATE_ELEM: i32 = 2;
pub const BPF_MAP_DELETE_ELEM: i32 = 3;
pub const BPF_PROG_LOAD: i32 = 5;
pub const BPF_RAW_TRACEPOINT_OPEN: i32 = 17;
pub const BPF_MAP_FREEZE: i32 = 22;
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;
pub const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// The `bpf(2)` system call `command` with its attribute union, for a
/// command that returns a new descriptor.
pub fn bpf(command: i32, attr: &mut [u64; 16]) -> io::Result<OwnedFd> {
    // SAFETY: the bpf(2) system call with a zero-padded attribute union of 128 bytes.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_mut_ptr(), size_of::<[u64; 16]>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: bpf(2) returned a new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The `bpf(2)` system call `command` for one that returns 0 or an error.
pub fn bpf_call(command: i32, attr: &mut [u64; 16]) -> io::Result<()> {
    // SAFETY: the bpf(2) system call with a zero-padded attribute union of 128 bytes; it returns 0, no descriptor.
    if unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_mut_ptr(), size_of::<[u64; 16]>()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A BPF instruction: opcode, registers, offset, immediate.
pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code) | u64::from(dst | (src << 4)) << 8 | u64::from(off as u16) << 16 | u64::from(imm as u32) << 32
}

/// The opcodes and helpers the programs use.
pub mod op {
    pub const LDX_W: u8 = 0x61;
    pub const LDX_DW: u8 = 0x79;
    pub const STX_W: u8 = 0x63;
    pub const STX_DW: u8 = 0x7b;
    pub const MOV_X: u8 = 0xbf;
    pub const MOV_K: u8 = 0xb7;
    pub const ADD_K: u8 = 0x07;
    pub const SUB_X: u8 = 0x1f;
    pub const OR_X: u8 = 0x4f;
    pub const LSH_K: u8 = 0x67;
    pub const RSH_K: u8 = 0x77;
    pub const JEQ_K: u8 = 0x15;
    pub const JEQ_X: u8 = 0x1d;
    pub const JNE_K: u8 = 0x55;
    pub const JSLE_K: u8 = 0xd5;
    pub const CALL: u8 = 0x85;
    pub const EXIT: u8 = 0x95;
    pub const LD_DW_IMM: u8 = 0x18;
    pub const ATOMIC_DW: u8 = 0xdb;
    pub const PSEUDO_MAP_FD: u8 = 1;
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const ATOMIC_ADD: i32 = 0;
}

/// A program being written, whose forward jumps to its end (`r0 = 0;
/// exit`) are placed when it is finished. Raw tracepoint programs keep
/// their context in r6.
pub struct Code {
    code: Vec<u64>,
    to_end: Vec<usize>,
}

impl Code {
    pub fn new() -> Code {
        Code { code: Vec::new(), to_end: Vec::new() }
    }

    pub fn push(&mut self, code: impl IntoIterator<Item = u64>) {
        self.code.extend(code);
    }

    /// Jumps to the end when `register` compares by `jump` to `value`: an
    /// immediate, or for a `_X` jump the register numbered `value`.
    pub fn end_if(&mut self, jump: u8, register: u8, value: i32) {
        self.to_end.push(self.code.len());
        let by_register = jump & 0x08 != 0;
        self.code.push(if by_register { insn(jump, register, value as u8, 0, 0) } else { insn(jump, register, 0, 0, value) });
    }

    /// r0 = the value in `map` of the key on the stack at `key`; to the
    /// end when there is none.
    pub fn look_up(&mut self, map: i32, key: i16) {
        self.push(map_and_key(map, key));
        self.push([insn(op::CALL, 0, 0, 0, op::MAP_LOOKUP_ELEM)]);
        self.end_if(op::JEQ_K, 0, 0);
    }

    /// `bytes` at `offset` of the structure the raw tracepoint's argument
    /// at `argument` (bytes into the context) points to, to the stack at
    /// `stack`, read with `bpf_probe_read_kernel`; to the end when it
    /// cannot be read.
    pub fn read_field(&mut self, argument: i16, offset: i32, bytes: i32, stack: i16) {
        self.push([insn(op::LDX_DW, 3, 6, argument, 0), insn(op::ADD_K, 3, 0, 0, offset)]);
        self.read_at(bytes, stack);
    }

    /// `bytes` at the kernel address in r3 to the stack at `stack`; to the
    /// end when they cannot be read.
    pub fn read_at(&mut self, bytes: i32, stack: i16) {
        self.push([
            insn(op::MOV_X, 1, 10, 0, 0),
            insn(op::ADD_K, 1, 0, 0, i32::from(stack)),
            insn(op::MOV_K, 2, 0, 0, bytes),
            insn(op::CALL, 0, 0, 0, op::PROBE_READ_KERNEL),
        ]);
        self.end_if(op::JNE_K, 0, 0);
    }

    /// The code, after `ending` (which leaves r0 and exits, or falls
    /// through to the end).
    pub fn finish(mut self, ending: &[u64]) -> Vec<u64> {
        self.push(ending.iter().copied());
        let end = self.code.len();
        for at in self.to_end {
            let forward = (end - at - 1) as u16;
            self.code[at] |= u64::from(forward) << 16;
        }
        self.code.extend([insn(op::MOV_K, 0, 0, 0, 0), insn(op::EXIT, 0, 0, 0, 0)]);
        self.code
    }
}

/// r1 = `map`, r2 = the address of the key on the stack at `key`.
pub fn map_and_key(map: i32, key: i16) -> [u64; 4] {
    [insn(op::LD_DW_IMM, 1, op::PSEUDO_MAP_FD, 0, map), 0, insn(op::MOV_X, 2, 10, 0, 0), insn(op::ADD_K, 2, 0, 0, i32::from(key))]
}

/// Loads program `code` of type `kind`; `what` names it in an error.
pub fn load_program(kind: u32, code: &[u64], what: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = [0u64; 16];
    attr[0] = u64::from(kind) | ((code.len() as u64) << 32);
    attr[1] = code.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| context(&format!("cannot load {what}"), e))
}

/// Attaches a program to the scheduler's tracepoint `name` as a raw
/// tracepoint: it runs on every CPU while the link is open.
pub fn attach_raw(name: &std::ffi::CStr, program: &OwnedFd, what: &str) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    attr[0] = name.as_ptr() as u64;
    attr[1] = program.as_raw_fd() as u64;
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr).map_err(|e| context(&format!("cannot attach {what} to {}", name.to_string_lossy()), e))
}

pub fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

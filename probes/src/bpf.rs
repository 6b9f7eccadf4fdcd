//! BPF programs written as instructions, loaded and attached with the
//! `bpf(2)` system call: the few proftap needs are too small to call for a
//! compiler and a loader library, and are checked by the kernel's verifier
//! as they load.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const BPF_MAP_CREATE: i32 = 0;
pub const BPF_MAP_UPDATE_ELEM: i32 = 2;
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
    pub const JNE_X: u8 = 0x5d;
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

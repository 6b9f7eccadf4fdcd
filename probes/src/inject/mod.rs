//! The in-process engine: proftap's own code in the target, reached by
//! jumps patched over function entries, recording into memory shared with
//! proftap. Cheaper per call than any kernel probe, and it attaches to a
//! running process.
//!
//! [`remote`] stops a process and makes system calls in it, maps memory near
//! its code and memory shared with proftap; [`patch`] decides which entries
//! take a jump and builds the trampolines; [`counting`] counts calls through them.

pub mod clock;
pub mod counting;
pub mod patch;
pub mod patcher;
pub mod remote;
pub mod runtime;
pub mod tracing;

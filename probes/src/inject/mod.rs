//! The in-process engine: proftap's own code in the target, reached by
//! jumps patched over function entries, recording into memory shared with
//! proftap. Cheaper per call than any kernel probe, and it attaches to a
//! running process.
//!
//! This module holds the means: [`remote`] stops a process and makes system
//! calls in it, maps memory near its code and memory shared with proftap.

pub mod remote;

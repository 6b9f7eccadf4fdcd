//! The in-process engine: proftap's own code in the target, reached by
//! jumps patched over function entries, recording into memory shared with
//! proftap. Cheaper per call than any kernel probe, and it attaches to a
//! running process.
//!
//! [`remote`] stops a process and makes system calls in it, maps memory near
//! its code and memory shared with proftap; [`patch`] decides which entries
//! take a jump and builds the trampolines, [`patcher`] puts them in place;
//! [`runtime`] is the code that times calls, [`tracing`] drives it and
//! reads what it records, [`hooks`] keeps unwinders working; [`counting`]
//! counts calls through trampolines.

pub mod checks;
pub mod clock;
pub mod counting;
pub mod hooks;
pub mod patch;
pub mod patched;
pub mod patcher;
pub mod reading;
pub mod remote;
pub mod runtime;
pub mod threads;
pub mod totals;
pub mod tracing;
pub mod watch;

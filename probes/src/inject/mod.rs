//! The in-process engine: proftap's own code in the target, reached by
//! jumps patched over function entries, adding every call up in memory
//! shared with proftap. Cheaper per call than any kernel probe, nothing
//! lost on the way, and it attaches to a running process.
//!
//! [`claim`] keeps a second proftap from patching a process one records;
//! [`remote`] stops a process and makes system calls in it, maps memory near
//! its code and memory shared with proftap; [`patch`] decides which entries
//! take a jump and builds the trampolines, [`patcher`] puts them in place;
//! [`totals`] is the runtime (C, in `probes/runtime/`) and its memory,
//! [`patched`] drives it in a process, [`reading`] reads what it added up
//! (checked), [`threads`] turns that into per-thread profiles, [`watch`]
//! runs the governor while the process runs; [`hooks`] keeps unwinders
//! working; [`clock`] converts the TSC.

pub mod children;
pub mod claim;
pub mod clock;
pub mod counting;
pub mod hooks;
pub mod judged;
pub mod lock_table;
pub mod patch;
pub mod patched;
pub mod patcher;
pub mod reading;
pub mod remote;
pub mod threads;
pub mod totals;
pub mod watch;

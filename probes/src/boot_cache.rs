//! State proftap keeps for the rest of a boot (a probe's measured cost, the
//! kernel's symbols): where, and which boot it is of.

use std::path::PathBuf;

/// A directory only this user can write to (`/run/proftap` for root,
/// `$XDG_RUNTIME_DIR` for others), or none: a shared directory such as
/// /tmp would let another user plant the file proftap reads.
pub fn dir() -> Option<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        Some(PathBuf::from("/run/proftap"))
    } else {
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
    }
}

/// This boot's id (empty when the kernel does not say).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string()
}

//! Memory files proftap makes for data: never executable.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A memory file named `name`, closed on exec, sealed against ever being
/// executed: Linux 6.3 to 6.5 under `vm.memfd_noexec=2` refuse one that
/// does not say. Made without the seal where the kernel knows no such
/// flag (before 6.3), or a filter refuses it.
pub fn never_executable(name: &CStr) -> io::Result<OwnedFd> {
    let make = |flags: libc::c_uint| {
        // SAFETY: memfd_create with a valid C string and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        // SAFETY: a descriptor memfd_create just returned, owned here alone.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }).ok_or_else(io::Error::last_os_error)
    };
    make(libc::MFD_CLOEXEC | libc::MFD_NOEXEC_SEAL).or_else(|_| make(libc::MFD_CLOEXEC))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_memory_file_for_data_is_sealed_against_execution() {
        let fd = never_executable(c"proftap-test").expect("memfd");
        // SAFETY: F_GET_SEALS on a descriptor owned here.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        const F_SEAL_EXEC: i32 = 0x20;
        assert!(seals >= 0 && seals & F_SEAL_EXEC != 0, "seals {seals:#x}");
    }
}

//! Who may do what. The kernel decides, since a session's worker runs as
//! its user; what is here only says why in words before the kernel refuses.

use std::fs;

/// The user on the other end of a connection, from `SO_PEERCRED`.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// The client's pid, when the kernel gives it.
    pub pid: Option<i32>,
}

impl Peer {
    /// Root may do anything the daemon can.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// The ids and effective capabilities of a process, from `/proc/PID/status`.
struct Credentials {
    uids: Vec<u32>,
    gids: Vec<u32>,
    capabilities: u64,
}

fn credentials(pid: i32) -> Option<Credentials> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default()
    };
    let capabilities = status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    Some(Credentials { uids: ids("Uid:"), gids: ids("Gid:"), capabilities })
}

/// Whether this process (a worker running as its user, or root) may
/// profile process `pid`, as the kernel would let the user ptrace it: the
/// process runs with the user's ids only, is dumpable (not a set-id
/// program), and has no capability the client (`client_pid`) lacks.
pub fn may_profile(root: bool, client_pid: Option<i32>, pid: i32) -> Result<(), String> {
    let Some(target) = credentials(pid) else {
        return Err(format!("there is no process {pid}"));
    };
    if root {
        return Ok(());
    }
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    // Status lists real, effective, saved and file-system ids.
    let (real, effective) = (target.uids.first().copied().unwrap_or(0), target.uids.get(1).copied().unwrap_or(0));
    if real == uid && target.uids.iter().chain(&target.gids).any(|&id| id != uid && id != gid) {
        return Err(format!("process {pid} is a set-id program running as user {effective}: only root may profile it"));
    }
    if target.uids.iter().any(|&u| u != uid) || target.gids.iter().any(|&g| g != gid) {
        return Err(format!("process {pid} runs as user {real}, not as you (uid {uid}): you may profile only your own processes"));
    }
    // The kernel makes /proc/PID root's when the process is not dumpable.
    let dumpable = fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m) == uid).unwrap_or(false);
    if !dumpable {
        return Err(format!("process {pid} is not dumpable (a set-id program, or it said so with prctl): only root may profile it"));
    }
    let peer_capabilities = client_pid.and_then(credentials).map_or(0, |c| c.capabilities);
    if target.capabilities & !peer_capabilities != 0 {
        return Err(format!("process {pid} holds capabilities you do not: only root may profile it"));
    }
    Ok(())
}

/// The supplementary groups of user `uid` (with `gid`), for a command run as them.
pub fn groups(uid: u32, gid: u32) -> Vec<u32> {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else { return vec![gid] };
    let Ok(name) = std::ffi::CString::new(user.name) else { return vec![gid] };
    nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
        .map_or_else(|_| vec![gid], |g| g.into_iter().map(|g| g.as_raw()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_profiles_anything_and_a_user_not_others_processes() {
        let me = std::process::id() as i32;
        assert!(may_profile(true, None, me).is_ok());
        // pid 1 runs as root; this test runs as root or as a user.
        if !nix::unistd::getuid().is_root() {
            let err = may_profile(false, None, 1).expect_err("root's process");
            assert!(err.contains("you may profile only your own processes"), "{err}");
        }
        assert!(may_profile(false, None, i32::MAX).expect_err("no such process").contains("there is no process"));
    }
}

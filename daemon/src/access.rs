//! Who may do what: a user profiles only processes that user could ptrace,
//! and commands run as that user.

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

/// Whether `peer` may profile process `pid`, as the kernel would let it
/// ptrace it: the process runs with the peer's user and group ids only, is
/// dumpable (not a set-id program), and has no capability the peer lacks.
pub fn may_profile(peer: &Peer, pid: i32) -> Result<(), String> {
    let Some(target) = credentials(pid) else {
        return Err(format!("there is no process {pid}"));
    };
    if peer.is_root() {
        return Ok(());
    }
    let owner = target.uids.first().copied().unwrap_or(0);
    if target.uids.iter().any(|&u| u != peer.uid) || target.gids.iter().any(|&g| g != peer.gid) {
        return Err(format!("process {pid} runs as user {owner}, not as you (uid {}): you may profile only your own processes", peer.uid));
    }
    // The kernel makes /proc/PID root's when the process is not dumpable.
    let dumpable = fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m) == peer.uid).unwrap_or(false);
    if !dumpable {
        return Err(format!("process {pid} is not dumpable (a set-id program, or it said so with prctl): only root may profile it"));
    }
    let peer_capabilities = peer.pid.and_then(credentials).map_or(0, |c| c.capabilities);
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

/// Whether user `uid` (in `groups`) may read `path`, by its permission bits.
pub fn readable_by(path: &std::path::Path, uid: u32, groups: &[u32]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::metadata(path) else { return false };
    let mode = m.mode();
    if m.uid() == uid {
        mode & 0o400 != 0
    } else if groups.contains(&m.gid()) {
        mode & 0o040 != 0
    } else {
        mode & 0o004 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_profiles_anything_and_a_user_not_roots_processes() {
        let me = std::process::id() as i32;
        assert!(may_profile(&Peer { uid: 0, gid: 0, pid: None }, me).is_ok());
        // A user who is not this test's user may not profile it.
        let other = Peer { uid: 65_534, gid: 65_534, pid: None };
        let err = may_profile(&other, me).expect_err("someone else's process");
        assert!(err.contains("you may profile only your own processes"), "{err}");
        assert!(may_profile(&other, i32::MAX).expect_err("no such process").contains("there is no process"));
    }
}

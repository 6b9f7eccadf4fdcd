//! A session worker gives up root before it reads anything of the user's:
//! it takes the user's uid, gid and groups, keeps only the capabilities
//! recording needs (`CAP_PERFMON`: perf events on the user's processes,
//! uprobe tracepoints, sampling; `CAP_IPC_LOCK`: the perf ring buffers,
//! which the kernel counts as locked memory, beyond the few hundred
//! kilobytes it allows a user), and can never gain more (`no_new_privs`,
//! an emptied bounding set). From then on the kernel decides what it may
//! open, trace or signal, by the same rules as for the user's own programs.

use caps::{CapSet, Capability, CapsHashSet};
use nix::unistd::{Gid, Uid};

/// Why dropping privileges failed: the worker must not go on.
#[derive(Debug, thiserror::Error)]
#[error("cannot take the user's identity ({what}): {source}")]
pub struct DropError {
    what: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
}

fn step<E: std::error::Error + Send + Sync + 'static>(what: &'static str) -> impl FnOnce(E) -> DropError {
    move |e| DropError { what, source: Box::new(e) }
}

/// The capabilities a worker keeps.
const KEPT: [Capability; 2] = [Capability::CAP_PERFMON, Capability::CAP_IPC_LOCK];

/// Becomes user `uid` with primary group `gid` and supplementary `groups`,
/// keeping [`KEPT`] only.
pub fn become_user(uid: u32, gid: u32, groups: &[u32]) -> Result<(), DropError> {
    // Bounding set first: dropping from it needs CAP_SETPCAP, which goes next.
    for cap in caps::all() {
        if !KEPT.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(step("the bounding set"))?;
        }
    }
    nix::sys::prctl::set_keepcaps(true).map_err(step("keeping capabilities"))?;
    let groups: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
    nix::unistd::setgroups(&groups).map_err(step("the groups"))?;
    let (gid, uid) = (Gid::from_raw(gid), Uid::from_raw(uid));
    nix::unistd::setresgid(gid, gid, gid).map_err(step("the group id"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(step("the user id"))?;
    let kept: CapsHashSet = KEPT.into_iter().collect();
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new()).map_err(step("the inheritable set"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(step("the permitted set"))?;
    caps::set(None, CapSet::Effective, &kept).map_err(step("the effective set"))?;
    caps::clear(None, CapSet::Ambient).map_err(step("the ambient set"))?;
    nix::sys::prctl::set_keepcaps(false).map_err(step("keeping capabilities"))?;
    nix::sys::prctl::set_no_new_privs().map_err(step("no_new_privs"))?;
    // Changing ids made the process undumpable: the user cannot trace the
    // worker or read its memory while it holds a capability they lack.
    if nix::sys::prctl::get_dumpable().map_err(step("dumpable"))? {
        nix::sys::prctl::set_dumpable(false).map_err(step("dumpable"))?;
    }
    check(uid, gid)
}

/// Proves the change took: every id is the user's, and root cannot be had back.
fn check(uid: Uid, gid: Gid) -> Result<(), DropError> {
    let ids = nix::unistd::getresuid().map_err(step("reading the user ids"))?;
    let gids = nix::unistd::getresgid().map_err(step("reading the group ids"))?;
    let mismatch =
        [ids.real, ids.effective, ids.saved].iter().any(|&u| u != uid) || [gids.real, gids.effective, gids.saved].iter().any(|&g| g != gid);
    if mismatch || nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(DropError { what: "checking", source: "an id is still root's".into() });
    }
    Ok(())
}

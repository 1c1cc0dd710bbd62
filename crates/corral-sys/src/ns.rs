//! Namespaces: unshare and the UTS hostname.

use crate::{cvt, SysResult};

/// New user namespace.
pub const CLONE_NEWUSER: i32 = libc::CLONE_NEWUSER;
/// New mount namespace.
pub const CLONE_NEWNS: i32 = libc::CLONE_NEWNS;
/// New pid namespace (for children created afterwards).
pub const CLONE_NEWPID: i32 = libc::CLONE_NEWPID;
/// New System V IPC namespace.
pub const CLONE_NEWIPC: i32 = libc::CLONE_NEWIPC;
/// New UTS (hostname) namespace.
pub const CLONE_NEWUTS: i32 = libc::CLONE_NEWUTS;
/// New network namespace.
pub const CLONE_NEWNET: i32 = libc::CLONE_NEWNET;
/// New cgroup namespace.
pub const CLONE_NEWCGROUP: i32 = libc::CLONE_NEWCGROUP;

/// `unshare(2)`.
pub fn unshare(flags: i32) -> SysResult<()> {
    // SAFETY: unshare takes an integer flag set and no memory.
    cvt(unsafe { libc::unshare(flags) }).map(drop)
}

/// `sethostname(2)` in the current UTS namespace.
pub fn sethostname(name: &str) -> SysResult<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, valid for the
    // call; the kernel copies them and needs no NUL terminator.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

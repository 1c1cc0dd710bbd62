//! A mount namespace of the server's own, so that every workspace can be a
//! size-limited tmpfs.
//!
//! Workspaces used to be plain directories on `work_dir`'s disk: one
//! execution could fill the host's disk, whatever `workspace_size` said.
//! A tmpfs per workspace bounds it in the kernel (`ENOSPC` inside), but
//! mounting one on the host would need root and leave mounts behind after
//! `kill -9`. So the server enters a mount namespace of its own at
//! start-up, while it is still single-threaded (`unshare(2)` refuses
//! `CLONE_NEWUSER` in a threaded process): as root only that; otherwise a
//! user namespace too, mapping its own uid and gid to themselves (so files
//! it creates stay owned by the same user, and `execve` drops the
//! namespace's capabilities from every helper it starts). Mounts made there
//! are private, invisible to the host, and gone with the last process of
//! the namespace. See user_namespaces(7), mount_namespaces(7).
//!
//! The directories the workspaces are mounted on live on a tmpfs of their
//! own too ([`mount_workspace_base`]): on the host's disk each one was a
//! `mkdir` and an `rmdir` per execution, with a block allocated, journaled
//! and (on a disk mounted with `discard`) discarded each time, about 5% of
//! the server's CPU per execution (docs/PERFORMANCE.md). It only saves
//! CPU: when it cannot be mounted, the server warns and goes on with a
//! plain directory.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use corral_sys::mount as sys;
use corral_sys::ns::{unshare, CLONE_NEWNS, CLONE_NEWUSER};
use corral_sys::Errno;

/// Set once the server is in its own mount namespace.
static PRIVATE: AtomicBool = AtomicBool::new(false);

/// Why the server could not get a mount namespace of its own.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot give workspaces their size limit (a tmpfs of workspace_size each): {step} failed: {source}. \
     Unprivileged, this needs user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
     user.max_user_namespaces > 0); or run as root. To accept workspaces on the host disk \
     without a size limit instead, set `unbounded_workspaces = true` in [server]"
)]
pub struct PrivateMountsError {
    /// The step that failed.
    step: &'static str,
    /// The kernel's answer.
    source: std::io::Error,
}

/// Enters a mount namespace of the server's own (see the module
/// documentation). Call it before any thread starts. Afterwards
/// [`workspaces_bounded`] is true. When it cannot, the error, unless
/// `unbounded_ok` (`server.unbounded_workspaces`): then a warning is
/// logged and workspaces stay plain directories on the host disk.
pub fn enter_private_mounts(unbounded_ok: bool) -> Result<(), PrivateMountsError> {
    match enter() {
        Err(e) if unbounded_ok => {
            tracing::warn!(
                error = %e,
                "workspaces are on the host disk without a size limit (unbounded_workspaces = true)"
            );
            Ok(())
        }
        other => other,
    }
}

fn enter() -> Result<(), PrivateMountsError> {
    let fail = |step: &'static str| {
        move |e: Errno| PrivateMountsError {
            step,
            source: e.into(),
        }
    };
    let (_, euid) = corral_sys::process::uids();
    if euid == 0 {
        unshare(CLONE_NEWNS).map_err(fail("unshare(CLONE_NEWNS)"))?;
    } else {
        let egid = corral_sys::process::getegid();
        unshare(CLONE_NEWUSER | CLONE_NEWNS)
            .map_err(fail("unshare(CLONE_NEWUSER | CLONE_NEWNS)"))?;
        // An unprivileged process may map only its own ids, and must give
        // up setgroups(2) before it maps its gid.
        for (file, text) in [
            ("/proc/self/setgroups", "deny".to_string()),
            ("/proc/self/uid_map", format!("{euid} {euid} 1")),
            ("/proc/self/gid_map", format!("{egid} {egid} 1")),
        ] {
            std::fs::write(file, text).map_err(|source| PrivateMountsError {
                step: "writing the user namespace's id maps",
                source,
            })?;
        }
    }
    // Nothing mounted here may propagate back to the host's namespace.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(fail("making / private (mount --make-rprivate /)"))?;
    PRIVATE.store(true, Ordering::Release);
    Ok(())
}

/// Whether workspaces are tmpfs mounts of `workspace_size` (the server
/// entered its own mount namespace).
pub fn workspaces_bounded() -> bool {
    PRIVATE.load(Ordering::Acquire)
}

/// Room for the workspace base's own content: directories only (each
/// workspace is a tmpfs of its own mounted on one), so a few pages.
const BASE_BYTES: u64 = 1 << 20;
/// Directories the workspace base may hold: far more than the sandboxes
/// and sessions a server runs at once, and still a bound.
const BASE_INODES: u64 = 1 << 16;

/// Mounts a small tmpfs (mode 0711, `nosuid`, `nodev`, `noexec`) on
/// `dir`, the server's fresh directory of workspaces, when the server has
/// a mount namespace of its own; nothing otherwise (workspaces are then
/// plain directories on the host's disk anyway). Answers whether it
/// mounted one, for [`unmount_workspace_base`]; an error leaves `dir` a
/// plain directory.
pub(crate) fn mount_workspace_base(dir: &Path) -> std::io::Result<bool> {
    if !workspaces_bounded() {
        return Ok(false);
    }
    let target = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the path contains a NUL byte"))?;
    let data = CString::new(format!(
        "size={BASE_BYTES},nr_inodes={BASE_INODES},mode=0711"
    ))
    .map_err(|_| std::io::Error::other("the tmpfs options contain a NUL byte"))?;
    sys::mount(
        Some(c"corral-mountpoints"),
        &target,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&data),
    )?;
    Ok(true)
}

/// Detaches the tmpfs [`mount_workspace_base`] mounted on `dir` (and any
/// workspace still mounted below it), so that the directory itself can be
/// removed from the host's disk.
pub(crate) fn unmount_workspace_base(dir: &Path) {
    if let Ok(target) = CString::new(dir.as_os_str().as_bytes()) {
        let _ = sys::umount2(&target, libc::MNT_DETACH);
    }
}

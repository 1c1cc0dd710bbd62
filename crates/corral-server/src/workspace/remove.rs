//! Deleting a workspace without following links and without recursion.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use corral_sys::mount::{self as sys, RENAME_NOREPLACE};
use corral_sys::Errno;

use super::paths::{cstring, invalid, shown};
use super::{
    open_dir_for_reading, open_dir_path, random_suffix, Workspace, WorkspaceError, DIR_MODE,
    HOIST_PREFIX, MAX_REMOVE_OPS, NAME_ATTEMPTS, REMOVE_BATCH, ROOT_MODE,
};

impl Workspace {
    /// Deletes the workspace and everything in it, without following any
    /// symlink. Call it once the sandbox has exited; if it is still
    /// writing, removal is still safe but may fail.
    ///
    /// Why not `std::fs::remove_dir_all`: since Rust 1.58.1 (the fix for
    /// CVE-2022-21658) it is symlink-safe — it opens each directory with
    /// `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor and
    /// unlinks entries relative to that descriptor, so a symlink swapped in
    /// mid-way is unlinked rather than followed; before, it checked "is
    /// this a directory?" by path and then recursed into the path, a race
    /// an attacker could win to delete files outside the tree. But it
    /// recurses: one stack frame and one open descriptor per directory
    /// level, and the sandbox can nest directories as deep as it likes
    /// (`mkdir d; cd d` in a loop knows no PATH_MAX). That ends in `EMFILE`
    /// (the workspace leaks) or, with a high descriptor limit, a stack
    /// overflow that aborts the whole service.
    ///
    /// So this removes iteratively from the workspace's own descriptor:
    /// entries at the top level are unlinked (`unlinkat`, which removes a
    /// symlink itself); a non-empty directory has its children renamed up
    /// to the top level (`renameat2` with `RENAME_NOREPLACE`, which never
    /// follows a name either) and is removed on a later pass. Memory, stack
    /// and descriptors stay constant whatever the depth. A directory the
    /// sandbox made unwritable to us (rootless mode, same uid) is chmodded
    /// back through its descriptor. Finally the workspace directory itself
    /// is removed from its parent, after checking that the host path still
    /// names the very directory this workspace holds open.
    pub fn remove(self) -> Result<(), WorkspaceError> {
        self.delete()
    }

    /// What [`remove`](Workspace::remove) does, for an owner that cannot
    /// give the workspace away (one deleted when its last user drops it).
    /// The directory is gone afterwards; the descriptor stays open until
    /// the `Workspace` is dropped.
    pub fn delete(&self) -> Result<(), WorkspaceError> {
        let shown_path = shown(&self.path.to_string_lossy());
        let io = |op: &'static str, e: Errno| WorkspaceError::Io {
            path: shown_path.clone(),
            op,
            source: e.into(),
        };
        let (parent, name) = match (self.path.parent(), self.path.file_name()) {
            (Some(parent), Some(name)) => (parent, name),
            _ => {
                return Err(invalid(
                    &shown_path,
                    "the workspace path has no parent directory",
                ))
            }
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        let parent_c = cstring(&shown_path, parent.as_os_str().as_bytes())?;
        let name_c = cstring(&shown_path, name.as_bytes())?;
        let parent_fd = sys::openat2(
            libc::AT_FDCWD,
            &parent_c,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            0,
        )
        .map_err(|e| io("open the workspace's parent directory", e))?;
        let here = sys::fstatat_nofollow(parent_fd.as_fd(), &name_c)
            .map_err(|e| io("stat the workspace path", e))?;
        let ours = sys::fstat(self.root.as_fd()).map_err(|e| io("stat the workspace", e))?;
        if !here.is_dir() || here.dev != ours.dev || here.ino != ours.ino {
            return Err(invalid(
                &shown_path,
                "the workspace path no longer names this workspace's directory; not deleting it",
            ));
        }
        if self.mounted {
            // A tmpfs of its own: detaching it frees its contents once the
            // last user (this descriptor, a sandbox still running) lets go;
            // nothing is walked. The path is ours (the server's private
            // directory); the last component is not followed.
            let path_c = cstring(&shown_path, self.path.as_os_str().as_bytes())?;
            sys::umount2(&path_c, libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW)
                .map_err(|e| io("unmount the workspace's tmpfs", e))?;
        } else {
            self.empty().map_err(|(op, e)| io(op, e))?;
        }
        sys::unlinkat(parent_fd.as_fd(), &name_c, true)
            .map_err(|e| io("remove the workspace directory", e))
    }

    /// Empties the workspace directory (see `remove`).
    fn empty(&self) -> Result<(), (&'static str, Errno)> {
        let root = self.root.as_fd();
        let mut ops = 0usize;
        loop {
            let dir = match open_dir_for_reading(root, c".") {
                Err(e) if e.0 == libc::EACCES => {
                    sys::chmod_fd(root, ROOT_MODE)
                        .map_err(|e| ("make the workspace writable", e))?;
                    open_dir_for_reading(root, c".")
                }
                other => other,
            }
            .map_err(|e| ("open the workspace", e))?;
            let (names, _) = sys::read_dir_names(dir.as_fd(), REMOVE_BATCH)
                .map_err(|e| ("read the workspace", e))?;
            if names.is_empty() {
                return Ok(());
            }
            for name in &names {
                ops += 1;
                if ops > MAX_REMOVE_OPS {
                    return Err((
                        "empty the workspace (it keeps changing)",
                        Errno(libc::EBUSY),
                    ));
                }
                match unlink_either(root, name) {
                    Ok(()) => {}
                    Err(e) if e.0 == libc::ENOTEMPTY || e.0 == libc::EEXIST => {
                        hoist_children(root, name, &mut ops)?;
                    }
                    Err(e) if e.0 == libc::EACCES => {
                        sys::chmod_fd(root, ROOT_MODE)
                            .map_err(|e| ("make the workspace writable", e))?;
                    }
                    Err(e) => return Err(("delete an entry", e)),
                }
            }
        }
    }
}

/// Unlinks `name` in `dir` whether it is a directory (which must be empty)
/// or anything else; a name already gone counts as success.
fn unlink_either(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    match sys::unlinkat(dir, name, false) {
        Err(e) if e.0 == libc::EISDIR => {}
        Err(e) if e.0 == libc::ENOENT => return Ok(()),
        other => return other,
    }
    match sys::unlinkat(dir, name, true) {
        Err(e) if e.0 == libc::ENOENT => Ok(()),
        other => other,
    }
}

/// Renames (a batch of) the children of the directory `name` up into the
/// workspace root under fresh names.
fn hoist_children(
    root: BorrowedFd<'_>,
    name: &CStr,
    ops: &mut usize,
) -> Result<(), (&'static str, Errno)> {
    let sub = match open_dir_for_reading(root, name) {
        Ok(sub) => sub,
        Err(e) if e.0 == libc::EACCES => {
            // Made unreadable by the sandbox (same uid in rootless mode):
            // open it without read access, chmod through that descriptor.
            let path_fd = open_dir_path(root, name).map_err(|e| ("open a directory", e))?;
            sys::chmod_fd(path_fd.as_fd(), DIR_MODE)
                .map_err(|e| ("make a directory writable", e))?;
            return Ok(());
        }
        // Swapped for a symlink or a file, or gone: the next pass unlinks
        // whatever is there now.
        Err(e) if e.0 == libc::ELOOP || e.0 == libc::ENOTDIR || e.0 == libc::ENOENT => {
            return Ok(());
        }
        Err(e) => return Err(("open a directory", e)),
    };
    let (children, _) =
        sys::read_dir_names(sub.as_fd(), REMOVE_BATCH).map_err(|e| ("read a directory", e))?;
    for child in &children {
        *ops += 1;
        if *ops > MAX_REMOVE_OPS {
            return Err((
                "empty the workspace (it keeps changing)",
                Errno(libc::EBUSY),
            ));
        }
        for attempt in 0.. {
            let new = CString::new(format!("{HOIST_PREFIX}{}", random_suffix()))
                .map_err(|_| ("name a hoisted entry", Errno(libc::EINVAL)))?;
            match sys::renameat2(sub.as_fd(), child, root, &new, RENAME_NOREPLACE) {
                Ok(()) => break,
                Err(e) if e.0 == libc::ENOENT => break,
                Err(e) if e.0 == libc::EEXIST && attempt < NAME_ATTEMPTS => continue,
                Err(e) if e.0 == libc::EACCES && attempt < NAME_ATTEMPTS => {
                    // Moving needs write access to the directory moved from
                    // and, for a directory, to the one moved (its `..`
                    // entry changes).
                    sys::chmod_fd(sub.as_fd(), DIR_MODE)
                        .map_err(|e| ("make a directory writable", e))?;
                    if let Ok(child_dir) = open_dir_path(sub.as_fd(), child) {
                        sys::chmod_fd(child_dir.as_fd(), DIR_MODE)
                            .map_err(|e| ("make a directory writable", e))?;
                    }
                }
                Err(e) => return Err(("move an entry up", e)),
            }
        }
    }
    Ok(())
}

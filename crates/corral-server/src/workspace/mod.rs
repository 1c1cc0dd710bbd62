//! Host-side handling of a workspace directory the sandbox can write to.
//!
//! The execution service gives every execution (and every MCP session) a
//! fresh directory, mounted read-write at `/workspace` inside the sandbox.
//! corral itself writes input files into it, lists and reads files for the
//! MCP file tools, collects outputs from it and deletes it afterwards. All
//! of that happens with host privileges (usually root) on a tree whose
//! contents the sandboxed code controls, and may change at any moment: an
//! MCP session's sandbox can run while a file tool call is served. Peers
//! were broken exactly here: a host write through a symlink the sandbox had
//! planted (Judge0, CVE-2024-28185), then a host `chown` through a symlink
//! (CVE-2024-28189).
//!
//! The rules this module follows:
//!
//! - **The kernel resolves, not us.** Every path is resolved by one
//!   `openat2(2)` relative to the workspace's own directory descriptor
//!   with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//!   RESOLVE_NO_XDEV`: a symlink anywhere on the path, an escape above the
//!   workspace or a crossed mount point is refused by the kernel during
//!   the very lookup that opens the file, so there is no check-then-open
//!   window. The lexical checks done first (absolute paths, `..`, NUL,
//!   reserved names) exist to give callers a clear error; they are not
//!   what keeps the host safe.
//! - **Decide on the descriptor.** What a path turned out to be (regular
//!   file, directory, FIFO…) is learnt with `fstat` on the descriptor that
//!   was opened, never from an earlier `stat` of the path.
//! - **Reads never block and never open devices blindly.** A file is first
//!   opened with `O_PATH` (no side effects, even for a FIFO or a device)
//!   and refused unless it is a regular file; only then is it opened with
//!   `O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY` and checked again. A
//!   FIFO swapped in between the two opens still cannot block the read
//!   (`O_NONBLOCK`) and is refused by the second check. (The sandbox cannot
//!   create device nodes: that needs `CAP_MKNOD` in the initial user
//!   namespace.)
//! - **Writes never go through an existing inode.** [`Workspace::write_file`]
//!   creates a fresh temporary file next to the target with
//!   `O_CREAT | O_EXCL | O_NOFOLLOW`, writes it, and `rename`s it over the
//!   target. There is no `O_TRUNC` open of a file the sandbox may have
//!   prepared, so a hard link, a FIFO or a symlink sitting at the target
//!   name cannot redirect or block the write; `rename` replaces the name
//!   itself and never follows it.
//! - **`chown` only what we just created, by descriptor.** The workspace
//!   directory, directories made by `write_file` and each new file are
//!   chowned to the sandbox's uid/gid with `fchownat(fd, "", AT_EMPTY_PATH)`
//!   on the descriptor we created them through. Nothing is ever chowned by
//!   path, and nothing recursively.
//! - **Cleanup never follows links and does not recurse.** See
//!   [`Workspace::remove`].
//!
//! Hard links: a hard link is a regular file, and `read_file`/`collect`
//! read it. That is deliberate: `link(2)` refuses to link across mounts
//! (`EXDEV`), so the sandbox can only link a file it reaches through the
//! same mount as the workspace, and with `fs.protected_hardlinks` only one
//! it owns or may read and write. Whatever it could link, it could read and
//! print to stdout, so reading the link discloses nothing new. What would
//! matter — the host *writing* or *chowning* through a link — cannot
//! happen: writes replace the name (see above) and chown only touches new
//! files.
//!
//! openat2 needs Linux 5.6. There is no fallback to a userspace walk: on an
//! older kernel every operation fails with an `io` error naming `ENOSYS`.

mod error;
mod files;
mod paths;
mod remove;
#[cfg(test)]
mod tests;

use std::collections::hash_map::RandomState;
use std::ffi::{CStr, CString, OsString};
use std::hash::{BuildHasher, Hasher};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use corral_sys::mount::{
    self as sys, FileStat, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS,
    RESOLVE_NO_XDEV,
};
use corral_sys::Errno;

pub use error::WorkspaceError;
pub use paths::check_path;
use paths::{cstring, shown};

/// How every path inside a workspace is resolved: beneath the workspace
/// directory, no symlinks (magic or not), no mount crossings.
const RESOLVE: u64 =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/// Name prefix of workspace directories under the base directory, so that
/// a restarted service can recognise stale ones.
pub const WORKSPACE_PREFIX: &str = "corral-ws-";
/// Prefix of the temporary file `write_file` renames over its target.
const TEMP_PREFIX: &str = ".corral-tmp-";
/// Prefix of the names `remove` hoists nested entries to.
const HOIST_PREFIX: &str = ".corral-rm-";

/// A reserved-name list that keeps corral's own names (`.corral…`) out of
/// callers' reach; `output` and everything else stay allowed.
pub const DEFAULT_RESERVED: &[&str] = &[".corral*"];

/// Longest relative path accepted (PATH_MAX minus the NUL).
const MAX_REL_BYTES: usize = 4095;
/// Longest single name accepted (NAME_MAX).
const MAX_NAME_BYTES: usize = 255;
/// How deep `collect` and the usage scan descend.
const MAX_WALK_DEPTH: usize = 64;
/// How many directory entries one `collect` or usage scan looks at.
const MAX_WALK_ENTRIES: usize = 100_000;
/// Directory entries read per batch while deleting.
const REMOVE_BATCH: usize = 4096;
/// Upper bound on unlink/rename operations in one `remove`, so that a
/// sandbox still running and refilling the tree cannot keep us busy forever.
const MAX_REMOVE_OPS: usize = 4_000_000;
/// Attempts at finding an unused random name.
const NAME_ATTEMPTS: usize = 16;

/// Mode of the workspace directory itself.
const ROOT_MODE: u32 = 0o700;
/// Mode of directories `write_file` creates (the root's 0700 keeps others out).
const DIR_MODE: u32 = 0o755;
/// Mode of files `write_file` creates.
const FILE_MODE: u32 = 0o644;

/// Caps and name rules for [`Workspace::write_file`].
#[derive(Debug, Clone, Copy)]
pub struct FileLimits<'a> {
    /// Largest file one call may write.
    pub max_file_bytes: u64,
    /// Largest total of regular-file sizes in the workspace after the
    /// write (what the sandbox wrote counts too). This bounds what the host
    /// adds; it is no disk quota on the sandbox itself (the workspace
    /// mount's size is). It is measured before each write, so concurrent
    /// writers to one workspace should be serialised by the caller.
    pub max_workspace_bytes: u64,
    /// First path components callers may not write: an exact name, or a
    /// prefix followed by `*` (`".corral*"`). See [`DEFAULT_RESERVED`].
    pub reserved: &'a [&'a str],
}

/// What a directory entry is, as seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry of [`Workspace::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's name (the sandbox chose it: it need not be UTF-8).
    pub name: OsString,
    /// What it is.
    pub kind: EntryKind,
    /// Its size (for a symlink, the length of its target).
    pub size_bytes: u64,
}

/// The result of [`Workspace::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The entries, sorted by name.
    pub entries: Vec<Entry>,
    /// The directory had more entries than the cap; the ones returned are
    /// an arbitrary subset (the first the kernel reported), sorted.
    pub truncated: bool,
}

/// One file of [`Workspace::collect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedFile {
    /// The path relative to the collected directory (may be non-UTF-8).
    pub path: PathBuf,
    /// The whole content.
    pub data: Vec<u8>,
}

/// The result of [`Workspace::collect`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// Regular files, depth-first, each directory's entries in name order.
    pub files: Vec<CollectedFile>,
    /// Sum of the sizes of `files`.
    pub total_bytes: u64,
    /// Entries passed over: symlinks, FIFOs, sockets, devices, entries that
    /// vanished or changed type while being read, unreadable directories.
    pub skipped: usize,
    /// Collection stopped early: the next regular file would have exceeded
    /// `max_files` or `max_total_bytes`, or the tree is deeper or larger
    /// than the scan bounds. Files are never cut short: one that does not
    /// fit is left out whole.
    pub truncated: bool,
}

impl Collected {
    /// Whether anything was left out, for whatever reason.
    pub fn skipped_anything(&self) -> bool {
        self.skipped > 0 || self.truncated
    }
}

/// A per-execution (or per-MCP-session) directory the sandbox can write
/// to, handled from the host without ever following a link the sandbox
/// planted. See the module documentation for the rules.
///
/// Dropping a `Workspace` leaves the directory in place; call
/// [`remove`](Workspace::remove) (a restarted service removes stale
/// `corral-ws-*` directories itself).
#[derive(Debug)]
pub struct Workspace {
    /// `O_PATH | O_DIRECTORY` descriptor of the workspace directory: every
    /// resolution starts here, whatever happens to `path`.
    root: OwnedFd,
    /// Where the directory is on the host, for bind-mounting it.
    path: PathBuf,
    /// The sandbox's uid/gid, given to everything corral creates inside.
    owner: Option<(u32, u32)>,
    /// Whether the directory is a size-limited tmpfs of its own (see
    /// [`Workspace::create`]), unmounted rather than emptied on removal.
    mounted: bool,
}

impl Workspace {
    /// Creates a fresh, empty directory (mode 0700) with a unique
    /// `corral-ws-…` name under `base`. When `owner` is given (corral runs
    /// as root, the sandbox as an unprivileged uid) the new directory is
    /// chowned to it through the descriptor it was opened by: it is our own
    /// new directory, never a host file.
    ///
    /// `base` is trusted host configuration (it is resolved normally) and
    /// should be writable by nobody but corral: a directory in a shared
    /// `/tmp` could be raced by other local users. As a cheap guard, the
    /// directory opened after `mkdir` must be owned by corral's effective
    /// uid and closed to group and others, or creation fails.
    ///
    /// With `size`, the directory becomes a tmpfs of that many bytes
    /// (`nosuid`, `nodev`, mode 0700) before anything is written to it:
    /// the kernel then answers `ENOSPC` to the sandbox (and to corral's own
    /// writes) at the limit, and the host disk never holds the workspace.
    /// This needs a mount namespace of the server's own (see
    /// [`crate::private_mounts`]): the mount is invisible to the host and
    /// disappears with the server, even after `kill -9`.
    pub fn create(
        base: &Path,
        owner: Option<(u32, u32)>,
        size: Option<u64>,
    ) -> Result<Workspace, WorkspaceError> {
        let shown_base = shown(&base.to_string_lossy());
        let io = |op: &'static str, e: Errno| WorkspaceError::Io {
            path: shown_base.clone(),
            op,
            source: e.into(),
        };
        let base_c =
            CString::new(base.as_os_str().as_bytes()).map_err(|_| WorkspaceError::Invalid {
                path: shown_base.clone(),
                reason: "the base directory's path contains a NUL byte",
            })?;
        let base_fd = sys::openat2(
            libc::AT_FDCWD,
            &base_c,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            0,
        )
        .map_err(|e| io("open the workspace base directory", e))?;

        let mut made = None;
        for _ in 0..NAME_ATTEMPTS {
            let name = format!("{WORKSPACE_PREFIX}{}", random_suffix());
            let name_c = cstring(&shown_base, name.as_bytes())?;
            match sys::mkdirat(base_fd.as_raw_fd(), &name_c, ROOT_MODE) {
                Ok(()) => {
                    made = Some((name, name_c));
                    break;
                }
                Err(e) if e.0 == libc::EEXIST => continue,
                Err(e) => return Err(io("create the workspace directory", e)),
            }
        }
        let Some((name, name_c)) = made else {
            return Err(io("find an unused workspace name", Errno(libc::EEXIST)));
        };
        let discard = |op: &'static str, e: Errno| {
            let _ = sys::unlinkat(base_fd.as_fd(), &name_c, true);
            io(op, e)
        };
        let mut root = sys::openat2(
            base_fd.as_raw_fd(),
            &name_c,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            RESOLVE,
        )
        .map_err(|e| discard("open the new workspace directory", e))?;
        if let Some(bytes) = size {
            root = mount_tmpfs(&root, base_fd.as_fd(), &name_c, bytes)
                .map_err(|(op, e)| discard(op, e))?;
        }
        let st = sys::fstat(root.as_fd()).map_err(|e| discard("stat the new workspace", e))?;
        let (_, euid) = corral_sys::process::uids();
        if !st.is_dir() || st.uid != euid || st.mode & 0o077 != 0 {
            return Err(discard(
                "check the new workspace directory is ours and private",
                Errno(libc::EPERM),
            ));
        }
        if let Some((uid, gid)) = owner {
            sys::fchown(root.as_fd(), uid, gid)
                .map_err(|e| discard("chown the workspace to the sandbox user", e))?;
        }
        Ok(Workspace {
            root,
            path: base.join(name),
            owner,
            mounted: size.is_some(),
        })
    }

    /// The workspace directory on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Mounts a tmpfs of `bytes` on the fresh directory `dir` (named `name`
/// beneath `base`) and answers a descriptor of the tmpfs's root, checked
/// to be a different filesystem than the directory it covers. The mount
/// target is the descriptor's magic link, so no path is resolved twice.
/// Inodes are bounded too (one per KiB of size, 16 Ki to 1 Mi), so a flood
/// of empty files cannot pin kernel memory beyond the size's order.
fn mount_tmpfs(
    dir: &OwnedFd,
    base: BorrowedFd<'_>,
    name: &CStr,
    bytes: u64,
) -> Result<OwnedFd, (&'static str, Errno)> {
    let target = CString::new(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|_| ("name the workspace directory", Errno(libc::EINVAL)))?;
    let inodes = (bytes / 1024).clamp(16 << 10, 1 << 20);
    let data = CString::new(format!("size={bytes},nr_inodes={inodes},mode=0700"))
        .map_err(|_| ("format the tmpfs options", Errno(libc::EINVAL)))?;
    sys::mount(
        Some(c"corral-workspace"),
        &target,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&data),
    )
    .map_err(|e| ("mount the workspace's tmpfs", e))?;
    let unmount = |op: &'static str, e: Errno| {
        let _ = sys::umount2(&target, libc::MNT_DETACH);
        (op, e)
    };
    let root = sys::openat2(
        base.as_raw_fd(),
        name,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE & !RESOLVE_NO_XDEV,
    )
    .map_err(|e| unmount("open the workspace's tmpfs", e))?;
    let under = sys::fstat(dir.as_fd()).map_err(|e| unmount("stat the workspace", e))?;
    let over = sys::fstat(root.as_fd()).map_err(|e| unmount("stat the workspace's tmpfs", e))?;
    if under.dev == over.dev {
        return Err(unmount(
            "check the workspace's tmpfs is mounted",
            Errno(libc::EXDEV),
        ));
    }
    Ok(root)
}

/// `O_PATH` descriptor of the directory at `path` beneath `dir`; a symlink
/// (at any component, the last included) gives ELOOP.
fn open_dir_path(dir: BorrowedFd<'_>, path: &CStr) -> Result<OwnedFd, Errno> {
    sys::openat2(
        dir.as_raw_fd(),
        path,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE,
    )
}

/// Readable descriptor (for getdents) of the directory at `path` beneath `dir`.
fn open_dir_for_reading(dir: BorrowedFd<'_>, path: &CStr) -> Result<OwnedFd, Errno> {
    sys::openat2(
        dir.as_raw_fd(),
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
        0,
        RESOLVE,
    )
}

fn kind_of(st: &FileStat) -> EntryKind {
    if st.is_regular() {
        EntryKind::File
    } else if st.is_dir() {
        EntryKind::Dir
    } else if st.is_symlink() {
        EntryKind::Symlink
    } else {
        EntryKind::Other
    }
}

/// 16 hex digits that differ on every call (process-wide counter mixed
/// with the standard library's randomly keyed hasher). Uniqueness is
/// enforced by the kernel (`mkdir`, `O_EXCL`, `RENAME_NOREPLACE`), not by
/// this.
fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

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

use std::collections::hash_map::RandomState;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use corral_sys::mount::{
    self as sys, FileStat, RENAME_NOREPLACE, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS, RESOLVE_NO_XDEV,
};
use corral_sys::Errno;

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

/// Why a workspace operation was refused or failed. Every variant carries
/// the caller's relative path (shortened if very long); [`code`] gives a
/// stable machine-readable string for API error bodies.
///
/// [`code`]: WorkspaceError::code
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The path starts with `/`.
    #[error("{path:?}: absolute paths are not allowed; give a path relative to the workspace")]
    Absolute {
        /// The path as given.
        path: String,
    },
    /// The path contains a `..` component or would leave the workspace.
    #[error("{path:?}: the path leaves the workspace (`..` is not allowed)")]
    Traversal {
        /// The path as given.
        path: String,
    },
    /// A symbolic link is on the path; workspace paths never follow one.
    #[error("{path:?}: a symbolic link is on the path; workspace paths never follow links")]
    Symlink {
        /// The path as given.
        path: String,
    },
    /// The first component is a reserved name.
    #[error("{path:?}: the name is reserved")]
    Reserved {
        /// The path as given.
        path: String,
    },
    /// The path is malformed (empty, NUL byte, too long, names a directory
    /// where a file is needed…).
    #[error("{path:?}: {reason}")]
    Invalid {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The file is larger than the cap.
    #[error("{path:?}: larger than the limit of {limit_bytes} bytes")]
    TooLarge {
        /// The path as given.
        path: String,
        /// The cap that was exceeded.
        limit_bytes: u64,
    },
    /// The path names something other than a regular file.
    #[error("{path:?}: not a regular file (a {kind})")]
    NotRegular {
        /// The path as given.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// Nothing exists at the path.
    #[error("{path:?}: no such file or directory")]
    NotFound {
        /// The path as given.
        path: String,
    },
    /// The workspace cap (or the filesystem) has no room for the write.
    #[error("{path:?}: the workspace is full{}", limit_note(*limit_bytes))]
    Full {
        /// The path as given.
        path: String,
        /// The per-workspace cap, when that is what was hit (`None`: the
        /// filesystem itself is full).
        limit_bytes: Option<u64>,
    },
    /// Any other system error.
    #[error("{path:?}: {op} failed: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// What corral was doing.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn limit_note(limit: Option<u64>) -> String {
    match limit {
        Some(n) => format!(" (limit {n} bytes)"),
        None => " (no space left on the filesystem)".to_owned(),
    }
}

impl WorkspaceError {
    /// A stable, machine-readable code: `path.absolute`, `path.traversal`,
    /// `path.symlink`, `path.reserved`, `path.invalid`, `file.too_large`,
    /// `file.not_regular`, `file.not_found`, `workspace.full` or `io`.
    pub fn code(&self) -> &'static str {
        match self {
            WorkspaceError::Absolute { .. } => "path.absolute",
            WorkspaceError::Traversal { .. } => "path.traversal",
            WorkspaceError::Symlink { .. } => "path.symlink",
            WorkspaceError::Reserved { .. } => "path.reserved",
            WorkspaceError::Invalid { .. } => "path.invalid",
            WorkspaceError::TooLarge { .. } => "file.too_large",
            WorkspaceError::NotRegular { .. } => "file.not_regular",
            WorkspaceError::NotFound { .. } => "file.not_found",
            WorkspaceError::Full { .. } => "workspace.full",
            WorkspaceError::Io { .. } => "io",
        }
    }

    /// The relative path the error is about, as the caller gave it.
    pub fn path(&self) -> &str {
        match self {
            WorkspaceError::Absolute { path }
            | WorkspaceError::Traversal { path }
            | WorkspaceError::Symlink { path }
            | WorkspaceError::Reserved { path }
            | WorkspaceError::Invalid { path, .. }
            | WorkspaceError::TooLarge { path, .. }
            | WorkspaceError::NotRegular { path, .. }
            | WorkspaceError::NotFound { path }
            | WorkspaceError::Full { path, .. }
            | WorkspaceError::Io { path, .. } => path,
        }
    }
}

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
    pub fn create(base: &Path, owner: Option<(u32, u32)>) -> Result<Workspace, WorkspaceError> {
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
        let root = sys::openat2(
            base_fd.as_raw_fd(),
            &name_c,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            RESOLVE,
        )
        .map_err(|e| discard("open the new workspace directory", e))?;
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
        })
    }

    /// The workspace directory on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid/gid given to everything corral creates inside.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Writes `data` to the file at `rel`, creating missing parent
    /// directories (mode 0755, chowned to the owner).
    ///
    /// Refused: absolute paths, `..`, empty or NUL-containing paths, paths
    /// ending in `/`, a first component in `limits.reserved`, a symlink
    /// anywhere on the path (the kernel refuses it while resolving each
    /// parent), a target that is a directory or another non-regular file,
    /// `data` over `max_file_bytes`, and a workspace total over
    /// `max_workspace_bytes` (the replaced file's old size does not count).
    ///
    /// Semantics: create-or-replace. The data goes to a new file created
    /// with `O_CREAT | O_EXCL | O_NOFOLLOW` (mode 0644, chowned to the
    /// owner through its fd) next to the target, which is then renamed
    /// over the target: the replacement is atomic, and nothing is ever
    /// written through an existing inode (no `O_TRUNC`), so a hard link at
    /// the target keeps its old content. The symlink check on the target
    /// name before the rename only produces a clear error: if the sandbox
    /// plants a link after it, the rename replaces the link itself.
    ///
    /// A write refused after its parents were made (a full workspace, a
    /// directory at the target) leaves those new, empty directories behind.
    pub fn write_file(
        &self,
        rel: &str,
        data: &[u8],
        limits: &FileLimits<'_>,
    ) -> Result<(), WorkspaceError> {
        let comps = parse_rel(rel, Want::File)?;
        check_reserved(rel, &comps, limits.reserved)?;
        let (leaf, parents) = match comps.split_last() {
            Some((leaf, parents)) => (*leaf, parents),
            None => return Err(invalid(rel, "the path is empty")),
        };
        let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        if len > limits.max_file_bytes {
            return Err(WorkspaceError::TooLarge {
                path: shown(rel),
                limit_bytes: limits.max_file_bytes,
            });
        }
        let used = if limits.max_workspace_bytes == u64::MAX {
            0
        } else {
            self.usage(rel, limits.max_workspace_bytes)?
        };

        let parent_fd = self.make_parents(rel, parents)?;
        let parent = parent_fd
            .as_ref()
            .map_or(self.root.as_fd(), |fd| fd.as_fd());
        let leaf_c = cstring(rel, leaf.as_bytes())?;
        let replaced = match sys::fstatat_nofollow(parent, &leaf_c) {
            Ok(st) if st.is_symlink() => return Err(WorkspaceError::Symlink { path: shown(rel) }),
            Ok(st) if st.is_dir() => return Err(invalid(rel, "the path names a directory")),
            Ok(st) if !st.is_regular() => {
                return Err(WorkspaceError::NotRegular {
                    path: shown(rel),
                    kind: st.kind_name(),
                })
            }
            Ok(st) => st.size,
            Err(e) if e.0 == libc::ENOENT => 0,
            Err(e) => return Err(sys_err(rel, "stat the target", e)),
        };
        if used.saturating_sub(replaced).saturating_add(len) > limits.max_workspace_bytes {
            return Err(WorkspaceError::Full {
                path: shown(rel),
                limit_bytes: Some(limits.max_workspace_bytes),
            });
        }

        let (tmp_c, file) = self.create_temp(rel, parent)?;
        let written = self.fill_and_rename(rel, file, data, parent, &tmp_c, &leaf_c);
        if written.is_err() {
            let _ = sys::unlinkat(parent, &tmp_c, false);
        }
        written
    }

    /// Reads the regular file at `rel`, at most `max_bytes` of it (a larger
    /// file is refused, not cut). Same resolution rules as `write_file`;
    /// anything but a regular file (directory, FIFO — which would block a
    /// plain open —, socket, device) is refused without reading, see the
    /// module documentation. A hard link is a regular file and is read.
    pub fn read_file(&self, rel: &str, max_bytes: u64) -> Result<Vec<u8>, WorkspaceError> {
        let comps = parse_rel(rel, Want::File)?;
        let path = join(rel, &comps)?;
        match read_regular(self.root.as_fd(), &path, max_bytes) {
            Ok(ReadOutcome::Data(data)) => Ok(data),
            Ok(ReadOutcome::TooLarge) => Err(WorkspaceError::TooLarge {
                path: shown(rel),
                limit_bytes: max_bytes,
            }),
            Ok(ReadOutcome::NotRegular(kind)) => Err(WorkspaceError::NotRegular {
                path: shown(rel),
                kind,
            }),
            Err(e) => Err(sys_err(rel, "read", e)),
        }
    }

    /// Lists the directory at `rel` (`""` is the workspace itself): each
    /// entry's name, kind and size, without following anything. At most
    /// `max_entries` entries; `truncated` says when there were more.
    pub fn list(&self, rel: &str, max_entries: usize) -> Result<Listing, WorkspaceError> {
        let comps = parse_rel(rel, Want::Dir)?;
        let path = join(rel, &comps)?;
        let dir = open_dir_for_reading(self.root.as_fd(), &path)
            .map_err(|e| sys_err(rel, "open the directory", e))?;
        let (names, truncated) = sys::read_dir_names(dir.as_fd(), max_entries)
            .map_err(|e| sys_err(rel, "read the directory", e))?;
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            let st = match sys::fstatat_nofollow(dir.as_fd(), &name) {
                Ok(st) => st,
                // Removed since it was listed: not there any more.
                Err(e) if e.0 == libc::ENOENT => continue,
                Err(e) => return Err(sys_err(rel, "stat a directory entry", e)),
            };
            entries.push(Entry {
                name: OsString::from_vec(name.into_bytes()),
                kind: kind_of(&st),
                size_bytes: st.size,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Listing { entries, truncated })
    }

    /// Collects the regular files under the directory `rel` (e.g.
    /// `"output"`), recursively, without following symlinks (they are
    /// skipped, as are FIFOs, sockets and devices), stopping before the
    /// file that would exceed `max_files` or `max_total_bytes`. Paths are
    /// relative to `rel`. The scan itself is bounded too (64 levels,
    /// 100 000 entries); hitting a bound sets `truncated`.
    pub fn collect(
        &self,
        rel: &str,
        max_files: usize,
        max_total_bytes: u64,
    ) -> Result<Collected, WorkspaceError> {
        let comps = parse_rel(rel, Want::Dir)?;
        let mut out = Collected::default();
        let walked = self.walk(rel, &comps, |path, dir, name, st| {
            if !st.is_regular() {
                out.skipped += 1;
                return Visit::Continue;
            }
            let remaining = max_total_bytes.saturating_sub(out.total_bytes);
            if out.files.len() >= max_files || st.size > remaining {
                out.truncated = true;
                return Visit::Stop;
            }
            match read_regular(dir, name, remaining) {
                Ok(ReadOutcome::Data(data)) => {
                    out.total_bytes = out
                        .total_bytes
                        .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
                    out.files.push(CollectedFile {
                        path: path.to_path_buf(),
                        data,
                    });
                    Visit::Continue
                }
                // It grew past the budget while we read it.
                Ok(ReadOutcome::TooLarge) => {
                    out.truncated = true;
                    Visit::Stop
                }
                Ok(ReadOutcome::NotRegular(_)) | Err(_) => {
                    out.skipped += 1;
                    Visit::Continue
                }
            }
        })?;
        out.skipped += walked.skipped;
        out.truncated |= walked.limit_hit;
        Ok(out)
    }

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
        self.empty().map_err(|(op, e)| io(op, e))?;
        sys::unlinkat(parent_fd.as_fd(), &name_c, true)
            .map_err(|e| io("remove the workspace directory", e))
    }

    /// Sum of the sizes of the regular files in the workspace.
    fn usage(&self, rel: &str, limit: u64) -> Result<u64, WorkspaceError> {
        let mut used = 0u64;
        let walked = self.walk("", &[], |_, _, _, st| {
            if st.is_regular() {
                used = used.saturating_add(st.size);
            }
            Visit::Continue
        });
        let walked = walked.map_err(|e| match e {
            WorkspaceError::Io { op, source, .. } => WorkspaceError::Io {
                path: shown(rel),
                op,
                source,
            },
            other => other,
        })?;
        if walked.limit_hit {
            // Too big to measure within the scan bounds: treat as full.
            return Err(WorkspaceError::Full {
                path: shown(rel),
                limit_bytes: Some(limit),
            });
        }
        Ok(used)
    }

    /// Opens (creating when missing) each parent directory in turn, each
    /// step a one-component openat2 from the previous descriptor. Returns
    /// the last one, or `None` when the file is at the top level.
    fn make_parents(&self, rel: &str, parents: &[&str]) -> Result<Option<OwnedFd>, WorkspaceError> {
        let mut current: Option<OwnedFd> = None;
        for comp in parents {
            let dir = current.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
            let comp_c = cstring(rel, comp.as_bytes())?;
            let next = match open_dir_path(dir, &comp_c) {
                Ok(fd) => fd,
                Err(e) if e.0 == libc::ENOENT => {
                    let created = match sys::mkdirat(dir.as_raw_fd(), &comp_c, DIR_MODE) {
                        Ok(()) => true,
                        // Made meanwhile (by the sandbox): use it if it is
                        // a directory; open_dir_path refuses anything else.
                        Err(e) if e.0 == libc::EEXIST => false,
                        Err(e) => return Err(sys_err(rel, "create a directory", e)),
                    };
                    let fd = open_dir_path(dir, &comp_c)
                        .map_err(|e| sys_err(rel, "open a directory", e))?;
                    if created {
                        // If the sandbox swapped another directory in since
                        // our mkdir, this chowns a directory inside the
                        // workspace to the sandbox user: harmless.
                        self.give_to_owner(rel, fd.as_fd())?;
                    }
                    fd
                }
                Err(e) => return Err(sys_err(rel, "open a directory", e)),
            };
            current = Some(next);
        }
        Ok(current)
    }

    /// Creates a new, empty temporary file in `parent`.
    fn create_temp(
        &self,
        rel: &str,
        parent: BorrowedFd<'_>,
    ) -> Result<(CString, OwnedFd), WorkspaceError> {
        for _ in 0..NAME_ATTEMPTS {
            let tmp_c = cstring(rel, format!("{TEMP_PREFIX}{}", random_suffix()).as_bytes())?;
            match sys::openat2(
                parent.as_raw_fd(),
                &tmp_c,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                FILE_MODE,
                RESOLVE,
            ) {
                Ok(fd) => return Ok((tmp_c, fd)),
                Err(e) if e.0 == libc::EEXIST => continue,
                Err(e) => return Err(sys_err(rel, "create the file", e)),
            }
        }
        Err(sys_err(
            rel,
            "find an unused temporary name",
            Errno(libc::EEXIST),
        ))
    }

    /// Chowns, fills and renames the new temporary file over the target.
    fn fill_and_rename(
        &self,
        rel: &str,
        file: OwnedFd,
        data: &[u8],
        parent: BorrowedFd<'_>,
        tmp: &CStr,
        leaf: &CStr,
    ) -> Result<(), WorkspaceError> {
        self.give_to_owner(rel, file.as_fd())?;
        let mut file = std::fs::File::from(file);
        file.write_all(data).map_err(|e| {
            let errno = Errno(e.raw_os_error().unwrap_or(libc::EIO));
            sys_err(rel, "write the file", errno)
        })?;
        drop(file);
        sys::renameat2(parent, tmp, parent, leaf, 0).map_err(|e| match e.0 {
            libc::EISDIR | libc::ENOTEMPTY => invalid(rel, "the path names a directory"),
            _ => sys_err(rel, "rename the file into place", e),
        })
    }

    fn give_to_owner(&self, rel: &str, fd: BorrowedFd<'_>) -> Result<(), WorkspaceError> {
        match self.owner {
            Some((uid, gid)) => {
                sys::fchown(fd, uid, gid).map_err(|e| sys_err(rel, "chown to the sandbox user", e))
            }
            None => Ok(()),
        }
    }

    /// Depth-first walk of the directory `start` (components relative to
    /// the workspace), each directory's entries in name order, calling
    /// `visit` for every entry that is not a directory with the path
    /// relative to `start`, the directory's descriptor, the entry's name
    /// and its `lstat`. Each directory is opened by one openat2 from the
    /// workspace root, so one swapped for a symlink is skipped, never
    /// entered. Bounded by MAX_WALK_DEPTH and MAX_WALK_ENTRIES; holds one
    /// directory descriptor at a time.
    fn walk<F>(&self, rel: &str, start: &[&str], mut visit: F) -> Result<Walked, WorkspaceError>
    where
        F: FnMut(&Path, BorrowedFd<'_>, &CStr, &FileStat) -> Visit,
    {
        let start_path: PathBuf = start.iter().collect();
        let mut walked = Walked::default();
        let mut budget = MAX_WALK_ENTRIES;
        let mut stack: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
        while let Some((sub, depth)) = stack.pop() {
            let is_start = depth == 0;
            let full = start_path.join(&sub);
            let opened = cstring(rel, full.as_os_str().as_bytes()).and_then(|c| {
                let c = if c.is_empty() { c".".to_owned() } else { c };
                open_dir_for_reading(self.root.as_fd(), &c)
                    .map_err(|e| sys_err(rel, "open the directory", e))
            });
            let dir = match opened {
                Ok(dir) => dir,
                Err(e) if is_start => return Err(e),
                Err(_) => {
                    walked.skipped += 1;
                    continue;
                }
            };
            let (mut names, more) = match sys::read_dir_names(dir.as_fd(), budget) {
                Ok(read) => read,
                Err(e) if is_start => return Err(sys_err(rel, "read the directory", e)),
                Err(_) => {
                    walked.skipped += 1;
                    continue;
                }
            };
            budget = budget.saturating_sub(names.len());
            names.sort();
            let mut subdirs = Vec::new();
            for name in &names {
                let st = match sys::fstatat_nofollow(dir.as_fd(), name) {
                    Ok(st) => st,
                    Err(_) => {
                        walked.skipped += 1;
                        continue;
                    }
                };
                let child = sub.join(OsStr::from_bytes(name.to_bytes()));
                if st.is_dir() {
                    if depth < MAX_WALK_DEPTH {
                        subdirs.push(child);
                    } else {
                        walked.limit_hit = true;
                    }
                    continue;
                }
                if let Visit::Stop = visit(&child, dir.as_fd(), name, &st) {
                    return Ok(walked);
                }
            }
            if more {
                walked.limit_hit = true;
                return Ok(walked);
            }
            stack.extend(subdirs.into_iter().rev().map(|d| (d, depth + 1)));
        }
        Ok(walked)
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

#[derive(Debug, Default)]
struct Walked {
    skipped: usize,
    limit_hit: bool,
}

enum Visit {
    Continue,
    Stop,
}

enum ReadOutcome {
    Data(Vec<u8>),
    TooLarge,
    NotRegular(&'static str),
}

/// Reads the regular file at `path` beneath `dir` (see the module
/// documentation for the two-step open).
fn read_regular(dir: BorrowedFd<'_>, path: &CStr, max: u64) -> Result<ReadOutcome, Errno> {
    // Without O_NOFOLLOW, RESOLVE_NO_SYMLINKS refuses a final symlink too
    // (ELOOP) instead of handing back an O_PATH fd to the link itself.
    let probe = sys::openat2(dir.as_raw_fd(), path, libc::O_PATH, 0, RESOLVE)?;
    let st = sys::fstat(probe.as_fd())?;
    if !st.is_regular() {
        return Ok(ReadOutcome::NotRegular(st.kind_name()));
    }
    if st.size > max {
        return Ok(ReadOutcome::TooLarge);
    }
    drop(probe);
    let fd = sys::openat2(
        dir.as_raw_fd(),
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
        RESOLVE,
    )?;
    let st = sys::fstat(fd.as_fd())?;
    if !st.is_regular() {
        return Ok(ReadOutcome::NotRegular(st.kind_name()));
    }
    if st.size > max {
        return Ok(ReadOutcome::TooLarge);
    }
    let mut data = Vec::with_capacity(usize::try_from(st.size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(max.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
    if u64::try_from(data.len()).unwrap_or(u64::MAX) > max {
        return Ok(ReadOutcome::TooLarge);
    }
    Ok(ReadOutcome::Data(data))
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A file: at least one component, no trailing `/`.
    File,
    /// A directory: `""` (or `.`) is the workspace itself.
    Dir,
}

/// Checks a caller's relative path and splits it into its normal
/// components (`.` and empty components from `//` are dropped).
fn parse_rel(rel: &str, want: Want) -> Result<Vec<&str>, WorkspaceError> {
    if rel.as_bytes().contains(&0) {
        return Err(invalid(rel, "the path contains a NUL byte"));
    }
    if rel.starts_with('/') {
        return Err(WorkspaceError::Absolute { path: shown(rel) });
    }
    if rel.len() > MAX_REL_BYTES {
        return Err(invalid(rel, "the path is longer than 4095 bytes"));
    }
    let mut comps = Vec::new();
    for comp in rel.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err(WorkspaceError::Traversal { path: shown(rel) }),
            _ if comp.len() > MAX_NAME_BYTES => {
                return Err(invalid(rel, "a path component is longer than 255 bytes"))
            }
            _ => comps.push(comp),
        }
    }
    if want == Want::File {
        if rel.is_empty() {
            return Err(invalid(rel, "the path is empty"));
        }
        if comps.is_empty() || rel.ends_with('/') || rel.ends_with("/.") || rel == "." {
            return Err(invalid(rel, "the path names a directory, not a file"));
        }
    }
    Ok(comps)
}

/// Whether the first component is reserved: an exact entry of `reserved`,
/// or matching an entry `prefix*`.
fn check_reserved(rel: &str, comps: &[&str], reserved: &[&str]) -> Result<(), WorkspaceError> {
    let Some(first) = comps.first() else {
        return Ok(());
    };
    let hit = reserved
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => first.starts_with(prefix),
            None => first == pattern,
        });
    if hit {
        Err(WorkspaceError::Reserved { path: shown(rel) })
    } else {
        Ok(())
    }
}

/// Validates `rel` as a file path the way [`Workspace::write_file`] does,
/// including the reserved-name check, without touching the filesystem.
/// For API layers that also want reserved names hidden from reads.
pub fn check_path(rel: &str, reserved: &[&str]) -> Result<(), WorkspaceError> {
    let comps = parse_rel(rel, Want::File)?;
    check_reserved(rel, &comps, reserved)
}

/// The components joined with `/` (`.` when there are none).
fn join(rel: &str, comps: &[&str]) -> Result<CString, WorkspaceError> {
    if comps.is_empty() {
        Ok(c".".to_owned())
    } else {
        cstring(rel, comps.join("/").as_bytes())
    }
}

fn cstring(rel: &str, bytes: &[u8]) -> Result<CString, WorkspaceError> {
    CString::new(bytes).map_err(|_| invalid(rel, "the path contains a NUL byte"))
}

fn invalid(rel: &str, reason: &'static str) -> WorkspaceError {
    WorkspaceError::Invalid {
        path: shown(rel),
        reason,
    }
}

/// The caller's path for an error message, cut to a sane length.
fn shown(rel: &str) -> String {
    const MAX_CHARS: usize = 256;
    if rel.len() <= MAX_CHARS {
        return rel.to_owned();
    }
    let mut s: String = rel.chars().take(MAX_CHARS).collect();
    s.push('…');
    s
}

/// Maps an errno from resolving or using a workspace path to an error.
fn sys_err(rel: &str, op: &'static str, e: Errno) -> WorkspaceError {
    let path = shown(rel);
    match e.0 {
        libc::ELOOP => WorkspaceError::Symlink { path },
        libc::EXDEV => WorkspaceError::Traversal { path },
        libc::ENOENT => WorkspaceError::NotFound { path },
        libc::ENOTDIR => WorkspaceError::Invalid {
            path,
            reason: "the path, or one of its parents, is not a directory",
        },
        libc::ENAMETOOLONG => WorkspaceError::Invalid {
            path,
            reason: "the path is too long",
        },
        libc::ENOSPC | libc::EDQUOT => WorkspaceError::Full {
            path,
            limit_bytes: None,
        },
        _ => WorkspaceError::Io {
            path,
            op,
            source: e.into(),
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    const LIMITS: FileLimits<'static> = FileLimits {
        max_file_bytes: 1 << 20,
        max_workspace_bytes: 4 << 20,
        reserved: DEFAULT_RESERVED,
    };

    /// A scratch directory with `base/` (where workspaces go) and
    /// `outside/` (host files the sandbox must never reach).
    struct Scratch {
        top: PathBuf,
    }

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let top = std::env::temp_dir().join(format!(
                "corral-workspace-test-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&top);
            std::fs::create_dir_all(top.join("base")).unwrap();
            std::fs::create_dir_all(top.join("outside")).unwrap();
            std::fs::write(top.join("outside/secret"), b"host secret").unwrap();
            Scratch { top }
        }
        fn base(&self) -> PathBuf {
            self.top.join("base")
        }
        fn outside(&self) -> PathBuf {
            self.top.join("outside")
        }
        fn workspace(&self) -> Workspace {
            Workspace::create(&self.base(), None).unwrap()
        }
        /// Names in outside/, to show nothing was created there.
        fn outside_names(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(self.outside())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.top);
        }
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
    }

    fn code<T: std::fmt::Debug>(r: Result<T, WorkspaceError>) -> &'static str {
        r.unwrap_err().code()
    }

    #[test]
    fn workspace_create_is_private_and_unique() {
        let s = Scratch::new("create");
        let a = s.workspace();
        let b = s.workspace();
        assert_ne!(a.path(), b.path());
        let meta = std::fs::symlink_metadata(a.path()).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o777, 0o700);
        assert!(a
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(WORKSPACE_PREFIX));
        assert!(a.list("", 10).unwrap().entries.is_empty());
        assert_eq!(
            Workspace::create(&s.top.join("missing"), None)
                .unwrap_err()
                .code(),
            "io"
        );
    }

    #[test]
    fn workspace_nested_write_read_list_overwrite() {
        let s = Scratch::new("happy");
        let ws = s.workspace();
        ws.write_file("a/b/c.txt", b"hello", &LIMITS).unwrap();
        ws.write_file("./a//b/d.txt", b"", &LIMITS).unwrap();
        ws.write_file("output", b"a file named output is fine", &LIMITS)
            .unwrap();
        assert_eq!(ws.read_file("a/b/c.txt", 100).unwrap(), b"hello");
        assert_eq!(ws.read_file("a/b/d.txt", 100).unwrap(), b"");
        assert_eq!(
            std::fs::read(ws.path().join("a/b/c.txt")).unwrap(),
            b"hello"
        );

        let root = ws.list("", 100).unwrap();
        assert!(!root.truncated);
        let names: Vec<_> = root.entries.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names, [OsString::from("a"), OsString::from("output")]);
        assert_eq!(root.entries[0].kind, EntryKind::Dir);
        let ab = ws.list("a/b", 100).unwrap();
        assert_eq!(
            ab.entries,
            vec![
                Entry {
                    name: "c.txt".into(),
                    kind: EntryKind::File,
                    size_bytes: 5
                },
                Entry {
                    name: "d.txt".into(),
                    kind: EntryKind::File,
                    size_bytes: 0
                },
            ]
        );

        // Create-or-replace, and no temporary file is left behind.
        ws.write_file("a/b/c.txt", b"second", &LIMITS).unwrap();
        assert_eq!(ws.read_file("a/b/c.txt", 100).unwrap(), b"second");
        assert_eq!(ws.list("a/b", 100).unwrap().entries.len(), 2);
        assert_eq!(code(ws.read_file("a/b/missing", 100)), "file.not_found");
        assert_eq!(code(ws.list("nope", 100)), "file.not_found");
        assert_eq!(code(ws.list("output", 100)), "path.invalid");
        assert_eq!(code(ws.read_file("a", 100)), "file.not_regular");
        assert_eq!(code(ws.write_file("a/b", b"x", &LIMITS)), "path.invalid");
        assert_eq!(
            code(ws.write_file("output/x", b"x", &LIMITS)),
            "path.invalid"
        );
        ws.remove().unwrap();
    }

    #[test]
    fn workspace_refuses_bad_paths() {
        let s = Scratch::new("refuse");
        let ws = s.workspace();
        let cases: &[(&str, &str)] = &[
            ("/etc/passwd", "path.absolute"),
            ("/", "path.absolute"),
            ("../x", "path.traversal"),
            ("a/../../x", "path.traversal"),
            ("a/..", "path.traversal"),
            ("a\0b", "path.invalid"),
            ("", "path.invalid"),
            (".", "path.invalid"),
            ("a/", "path.invalid"),
            ("a/.", "path.invalid"),
            (".corral", "path.reserved"),
            (".corral-state/x", "path.reserved"),
            ("./.corralx", "path.reserved"),
        ];
        for (rel, want) in cases {
            assert_eq!(
                code(ws.write_file(rel, b"x", &LIMITS)),
                *want,
                "write {rel:?}"
            );
            if *want != "path.reserved" {
                assert_eq!(code(ws.read_file(rel, 10)), *want, "read {rel:?}");
                assert_eq!(code(check_path(rel, DEFAULT_RESERVED)), *want, "{rel:?}");
            }
        }
        for rel in ["/etc", "../", "a/../..", "a\0"] {
            assert!(ws.list(rel, 10).is_err(), "list {rel:?}");
            assert!(ws.collect(rel, 10, 10).is_err(), "collect {rel:?}");
        }
        // Over-long paths and names: refused, and the message stays short.
        let long = "a/".repeat(3000);
        let err = ws.write_file(&long, b"x", &LIMITS).unwrap_err();
        assert_eq!(err.code(), "path.invalid");
        assert!(err.to_string().len() < 400);
        assert_eq!(
            code(ws.write_file(&"n".repeat(256), b"x", &LIMITS)),
            "path.invalid"
        );
        // Reserved names only bite on the first component, and only those listed.
        ws.write_file("sub/.corral", b"ok", &LIMITS).unwrap();
        ws.write_file("..a", b"ok", &LIMITS).unwrap();
        let custom = FileLimits {
            reserved: &["secret", "tmp*"],
            ..LIMITS
        };
        assert_eq!(
            code(ws.write_file("secret", b"x", &custom)),
            "path.reserved"
        );
        assert_eq!(
            code(ws.write_file("tmpfile", b"x", &custom)),
            "path.reserved"
        );
        ws.write_file("secrets", b"ok", &custom).unwrap();
        ws.write_file(".corral", b"ok", &custom).unwrap();
        // Nothing escaped.
        assert_eq!(s.outside_names(), ["secret"]);
        assert!(!s.top.join("x").exists());
        assert!(!s.base().join("x").exists());
    }

    #[test]
    fn workspace_odd_inputs_never_panic() {
        let s = Scratch::new("odd");
        let ws = s.workspace();
        let inputs = [
            "",
            "/",
            "//",
            ".",
            "..",
            "...",
            "./",
            "a//b",
            "a/./b",
            "\u{0}",
            "é/ü",
            "\n",
            "a\\..\\b",
            "~",
            "-",
            "*",
            "a/b/c/d/e/f/g/h",
            "\u{202e}txt.exe",
        ];
        for rel in inputs {
            let _ = ws.write_file(rel, b"x", &LIMITS);
            let _ = ws.read_file(rel, 10);
            let _ = ws.list(rel, 10);
            let _ = ws.collect(rel, 10, 10);
            let _ = check_path(rel, DEFAULT_RESERVED);
        }
        // "a\..\b" is one ordinary name on Linux.
        assert_eq!(ws.read_file("a\\..\\b", 10).unwrap(), b"x");
        assert_eq!(s.outside_names(), ["secret"]);
    }

    #[test]
    fn workspace_symlink_at_leaf_refused() {
        let s = Scratch::new("leaflink");
        let ws = s.workspace();
        let victim = s.outside().join("victim");
        std::fs::write(&victim, b"original").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.path().join("out")).unwrap();
        std::os::unix::fs::symlink(&victim, ws.path().join("out2")).unwrap();
        std::os::unix::fs::symlink("dangling-target", ws.path().join("out3")).unwrap();

        let passwd_before = std::fs::read("/etc/passwd").unwrap();
        assert_eq!(code(ws.read_file("out", 1 << 20)), "path.symlink");
        assert_eq!(
            code(ws.write_file("out", b"pwned", &LIMITS)),
            "path.symlink"
        );
        assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd_before);
        assert_eq!(code(ws.read_file("out2", 1 << 20)), "path.symlink");
        assert_eq!(
            code(ws.write_file("out2", b"pwned", &LIMITS)),
            "path.symlink"
        );
        assert_eq!(
            code(ws.write_file("out3", b"pwned", &LIMITS)),
            "path.symlink"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"original");
        assert!(!ws.path().join("dangling-target").exists());
        // The links are still links, nothing was created next to them.
        assert!(std::fs::symlink_metadata(ws.path().join("out2"))
            .unwrap()
            .file_type()
            .is_symlink());
        let kinds: Vec<_> = ws
            .list("", 10)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [EntryKind::Symlink; 3]);
        assert_eq!(s.outside_names(), ["secret", "victim"]);
    }

    #[test]
    fn workspace_symlink_in_the_middle_refused() {
        let s = Scratch::new("midlink");
        let ws = s.workspace();
        std::os::unix::fs::symlink(s.outside(), ws.path().join("dir")).unwrap();
        std::os::unix::fs::symlink("/tmp", ws.path().join("tmp")).unwrap();
        std::fs::create_dir(ws.path().join("real")).unwrap();
        std::os::unix::fs::symlink("../dir", ws.path().join("real/up")).unwrap();

        for rel in ["dir/x", "tmp/x", "dir/sub/x", "real/up/x"] {
            assert_eq!(
                code(ws.write_file(rel, b"pwned", &LIMITS)),
                "path.symlink",
                "{rel}"
            );
        }
        assert_eq!(code(ws.read_file("dir/secret", 100)), "path.symlink");
        assert_eq!(code(ws.read_file("real/up/secret", 100)), "path.symlink");
        assert_eq!(code(ws.list("dir", 100)), "path.symlink");
        assert_eq!(code(ws.collect("dir", 10, 100)), "path.symlink");
        assert_eq!(s.outside_names(), ["secret"]);
    }

    #[test]
    fn workspace_hard_link_is_read_but_never_written_through() {
        let s = Scratch::new("hardlink");
        let ws = s.workspace();
        // Same filesystem (both under the scratch directory), so link(2) works.
        std::fs::hard_link(s.outside().join("secret"), ws.path().join("linked")).unwrap();
        // Documented: a hard link is a regular file; reading it reveals
        // nothing the sandbox could not read itself.
        assert_eq!(ws.read_file("linked", 100).unwrap(), b"host secret");
        // Replacing it replaces the name, not the shared inode.
        ws.write_file("linked", b"new content", &LIMITS).unwrap();
        assert_eq!(ws.read_file("linked", 100).unwrap(), b"new content");
        assert_eq!(
            std::fs::read(s.outside().join("secret")).unwrap(),
            b"host secret"
        );
        assert_eq!(
            std::fs::metadata(s.outside().join("secret"))
                .unwrap()
                .nlink(),
            1
        );
    }

    #[test]
    fn workspace_fifo_and_socket_refused_without_blocking() {
        let s = Scratch::new("fifo");
        let ws = s.workspace();
        mkfifo(&ws.path().join("pipe"));
        std::fs::create_dir(ws.path().join("output")).unwrap();
        mkfifo(&ws.path().join("output/pipe"));
        std::fs::write(ws.path().join("output/real"), b"data").unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(ws.path().join("sock")).unwrap();

        let (tx, rx) = mpsc::channel();
        let ws = std::sync::Arc::new(ws);
        let ws2 = std::sync::Arc::clone(&ws);
        let started = Instant::now();
        std::thread::spawn(move || {
            let read = ws2.read_file("pipe", 100).map_err(|e| e.code());
            let write = ws2.write_file("pipe", b"x", &LIMITS).map_err(|e| e.code());
            let collected = ws2.collect("output", 10, 100).map_err(|e| e.code());
            let _ = tx.send((read, write, collected));
        });
        let (read, write, collected) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a FIFO blocked the host");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(read.unwrap_err(), "file.not_regular");
        assert_eq!(write.unwrap_err(), "file.not_regular");
        let collected = collected.unwrap();
        assert_eq!(collected.files.len(), 1);
        assert_eq!(collected.files[0].data, b"data");
        assert_eq!(collected.skipped, 1);
        assert_eq!(code(ws.read_file("sock", 100)), "file.not_regular");
        let kinds: Vec<_> = ws
            .list("", 10)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [EntryKind::Dir, EntryKind::Other, EntryKind::Other]);
    }

    #[test]
    fn workspace_size_caps() {
        let s = Scratch::new("caps");
        let ws = s.workspace();
        let limits = FileLimits {
            max_file_bytes: 60,
            max_workspace_bytes: 100,
            reserved: DEFAULT_RESERVED,
        };
        let err = ws.write_file("big", &[b'x'; 61], &limits).unwrap_err();
        assert_eq!((err.code(), err.path()), ("file.too_large", "big"));
        ws.write_file("a", &[b'a'; 60], &limits).unwrap();
        // 60 + 60 > 100.
        assert_eq!(
            code(ws.write_file("b", &[b'b'; 60], &limits)),
            "workspace.full"
        );
        assert!(!ws.path().join("b").exists());
        // Replacing a file only counts the difference.
        ws.write_file("a", &[b'A'; 60], &limits).unwrap();
        ws.write_file("b", &[b'b'; 40], &limits).unwrap();
        // What the sandbox wrote counts too.
        std::fs::write(ws.path().join("sandbox-made"), [0u8; 10]).unwrap();
        assert_eq!(code(ws.write_file("c", b"x", &limits)), "workspace.full");
        // Reads are capped; exactly at the cap is fine.
        assert_eq!(ws.read_file("a", 60).unwrap().len(), 60);
        assert_eq!(code(ws.read_file("a", 59)), "file.too_large");
        // No temporary files were left behind by any of the refusals.
        let names: Vec<_> = ws
            .list("", 10)
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["a", "b", "sandbox-made"]);
    }

    #[test]
    fn workspace_collect_happy_path() {
        let s = Scratch::new("collect");
        let ws = s.workspace();
        ws.write_file("output/b.txt", b"bb", &LIMITS).unwrap();
        ws.write_file("output/a.txt", b"a", &LIMITS).unwrap();
        ws.write_file("output/sub/c.txt", b"ccc", &LIMITS).unwrap();
        ws.write_file("output/sub/deeper/d.txt", b"dddd", &LIMITS)
            .unwrap();
        ws.write_file("input.txt", b"not collected", &LIMITS)
            .unwrap();
        let got = ws.collect("output", 10, 1000).unwrap();
        let paths: Vec<_> = got
            .files
            .iter()
            .map(|f| f.path.to_string_lossy().into_owned())
            .collect();
        assert_eq!(paths, ["a.txt", "b.txt", "sub/c.txt", "sub/deeper/d.txt"]);
        assert_eq!(got.files[3].data, b"dddd");
        assert_eq!(got.total_bytes, 10);
        assert!(!got.skipped_anything());
        // The whole workspace.
        assert_eq!(ws.collect("", 10, 1000).unwrap().files.len(), 5);
        assert_eq!(code(ws.collect("missing", 10, 1000)), "file.not_found");
    }

    #[test]
    fn workspace_collect_skips_symlinks_and_stops_at_caps() {
        let s = Scratch::new("collectcaps");
        let ws = s.workspace();
        for (name, data) in [
            ("1", &b"11"[..]),
            ("2", b"22"),
            ("3", b"33"),
            ("4", b"4444"),
        ] {
            ws.write_file(&format!("output/{name}"), data, &LIMITS)
                .unwrap();
        }
        let out = ws.path().join("output");
        std::os::unix::fs::symlink(s.outside().join("secret"), out.join("0-file-link")).unwrap();
        std::os::unix::fs::symlink(s.outside(), out.join("0-dir-link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", out.join("0-passwd")).unwrap();

        let all = ws.collect("output", 10, 1000).unwrap();
        assert_eq!(all.files.len(), 4);
        assert_eq!(all.skipped, 3);
        assert!(!all.truncated);
        assert!(all
            .files
            .iter()
            .all(|f| f.data != b"host secret" && !f.data.starts_with(b"root:")));

        let by_count = ws.collect("output", 2, 1000).unwrap();
        assert_eq!(by_count.files.len(), 2);
        assert!(by_count.truncated);

        // "1", "2", "3" fit in 7 bytes, "4" (4 bytes) does not: stop there,
        // never a cut file.
        let by_bytes = ws.collect("output", 10, 7).unwrap();
        assert_eq!(by_bytes.files.len(), 3);
        assert_eq!(by_bytes.total_bytes, 6);
        assert!(by_bytes.truncated);
        assert!(by_bytes.skipped_anything());

        let none = ws.collect("output", 0, 1000).unwrap();
        assert!(none.files.is_empty() && none.truncated);
    }

    #[test]
    fn workspace_list_is_bounded() {
        let s = Scratch::new("listcap");
        let ws = s.workspace();
        for i in 0..10 {
            ws.write_file(&format!("f{i}"), b"x", &LIMITS).unwrap();
        }
        let listing = ws.list("", 3).unwrap();
        assert_eq!(listing.entries.len(), 3);
        assert!(listing.truncated);
        let listing = ws.list("", 10).unwrap();
        assert_eq!(listing.entries.len(), 10);
        assert!(!listing.truncated);
    }

    /// Makes `depth` nested directories `d/d/d/…` under `top`, deeper than
    /// PATH_MAX allows a single path to name (so fd-relative).
    fn nest(top: &Path, depth: usize) {
        let top_c = CString::new(top.as_os_str().as_bytes()).unwrap();
        let mut cur = sys::openat2(
            libc::AT_FDCWD,
            &top_c,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            0,
        )
        .unwrap();
        for _ in 0..depth {
            sys::mkdirat(cur.as_raw_fd(), c"d", 0o755).unwrap();
            cur = open_dir_path(cur.as_fd(), c"d").unwrap();
        }
    }

    #[test]
    fn workspace_remove_does_not_follow_symlinks() {
        let s = Scratch::new("remove");
        let ws = s.workspace();
        ws.write_file("output/result.txt", b"r", &LIMITS).unwrap();
        std::os::unix::fs::symlink(s.outside(), ws.path().join("outside-dir")).unwrap();
        std::os::unix::fs::symlink(s.outside(), ws.path().join("output/nested-link")).unwrap();
        std::os::unix::fs::symlink(s.outside().join("secret"), ws.path().join("file-link"))
            .unwrap();
        std::fs::hard_link(s.outside().join("secret"), ws.path().join("output/hard")).unwrap();
        mkfifo(&ws.path().join("pipe"));
        let path = ws.path().to_path_buf();
        ws.remove().unwrap();
        assert!(!path.exists());
        assert_eq!(s.outside_names(), ["secret"]);
        assert_eq!(
            std::fs::read(s.outside().join("secret")).unwrap(),
            b"host secret"
        );
        // Only the workspace went; its base directory stays.
        assert!(s.base().is_dir());
    }

    #[test]
    fn workspace_deep_tree_is_bounded_and_removable() {
        let s = Scratch::new("deep");
        let ws = s.workspace();
        nest(ws.path(), 3000);
        std::os::unix::fs::symlink(s.outside(), ws.path().join("d/d/link")).unwrap();
        let started = Instant::now();
        let got = ws.collect("", 10, 1000).unwrap();
        assert!(got.truncated, "the depth bound is reported");
        assert_eq!(got.skipped, 1, "the link is skipped");
        assert_eq!(
            code(ws.write_file("x", b"x", &LIMITS)),
            "workspace.full",
            "an unmeasurable workspace takes no more input"
        );
        let path = ws.path().to_path_buf();
        ws.remove().unwrap();
        assert!(!path.exists());
        assert_eq!(s.outside_names(), ["secret"]);
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn workspace_remove_refuses_a_swapped_path() {
        let s = Scratch::new("swap");
        let ws = s.workspace();
        ws.write_file("f", b"x", &LIMITS).unwrap();
        let path = ws.path().to_path_buf();
        let moved = s.base().join("moved");
        std::fs::rename(&path, &moved).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), b"not the workspace").unwrap();
        // Operations follow the directory, not the path.
        assert_eq!(ws.read_file("f", 10).unwrap(), b"x");
        assert_eq!(ws.remove().unwrap_err().code(), "path.invalid");
        assert_eq!(
            std::fs::read(path.join("keep")).unwrap(),
            b"not the workspace"
        );
        assert!(moved.join("f").exists());
    }

    /// In rootless mode the sandbox runs as our own uid and may take its
    /// permission bits away from its directories. (As root, permission
    /// bits do not bind corral, so there this only shows no harm; run the
    /// test binary as an unprivileged user to exercise the chmod path.)
    #[test]
    fn workspace_remove_recovers_from_sandbox_chmod() {
        use std::fs::{set_permissions, Permissions};
        use std::os::unix::fs::PermissionsExt;
        let s = Scratch::new("chmod");
        let ws = s.workspace();
        ws.write_file("locked/inner/f", b"x", &LIMITS).unwrap();
        ws.write_file("locked/read-only", b"x", &LIMITS).unwrap();
        let p = ws.path();
        set_permissions(p.join("locked/read-only"), Permissions::from_mode(0o400)).unwrap();
        set_permissions(p.join("locked/inner"), Permissions::from_mode(0o000)).unwrap();
        set_permissions(p.join("locked"), Permissions::from_mode(0o500)).unwrap();
        set_permissions(p, Permissions::from_mode(0o000)).unwrap();
        let path = p.to_path_buf();
        ws.remove().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn workspace_owner_is_applied() {
        let (_, euid) = corral_sys::process::uids();
        if euid != 0 {
            eprintln!("SKIP workspace_owner_is_applied: needs root to chown (euid {euid})");
            return;
        }
        let s = Scratch::new("owner");
        let ws = Workspace::create(&s.base(), Some((4242, 4242))).unwrap();
        assert_eq!(ws.owner(), Some((4242, 4242)));
        let meta = std::fs::metadata(ws.path()).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o777),
            (4242, 4242, 0o700)
        );
        std::fs::create_dir(ws.path().join("pre")).unwrap();
        ws.write_file("pre/new/file", b"x", &LIMITS).unwrap();
        for (rel, want) in [
            ("pre/new", (4242, 4242)),
            ("pre/new/file", (4242, 4242)),
            // Not created by write_file: left alone (no recursive chown).
            ("pre", (0, 0)),
        ] {
            let m = std::fs::symlink_metadata(ws.path().join(rel)).unwrap();
            assert_eq!((m.uid(), m.gid()), want, "{rel}");
        }
        // A symlink the "sandbox" planted is never chowned through.
        let victim = s.outside().join("secret");
        std::os::unix::fs::symlink(&victim, ws.path().join("link")).unwrap();
        assert_eq!(code(ws.write_file("link", b"x", &LIMITS)), "path.symlink");
        assert_eq!(std::fs::metadata(&victim).unwrap().uid(), 0);
        ws.remove().unwrap();
    }

    #[test]
    fn workspace_error_codes_are_distinct() {
        let path = String::new();
        let all = [
            WorkspaceError::Absolute { path: path.clone() },
            WorkspaceError::Traversal { path: path.clone() },
            WorkspaceError::Symlink { path: path.clone() },
            WorkspaceError::Reserved { path: path.clone() },
            WorkspaceError::Invalid {
                path: path.clone(),
                reason: "r",
            },
            WorkspaceError::TooLarge {
                path: path.clone(),
                limit_bytes: 1,
            },
            WorkspaceError::NotRegular {
                path: path.clone(),
                kind: "fifo",
            },
            WorkspaceError::NotFound { path: path.clone() },
            WorkspaceError::Full {
                path: path.clone(),
                limit_bytes: None,
            },
            WorkspaceError::Io {
                path,
                op: "op",
                source: std::io::Error::from_raw_os_error(libc::EIO),
            },
        ];
        let mut codes: Vec<_> = all.iter().map(WorkspaceError::code).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        // The path in messages is escaped: a NUL or newline cannot forge log lines.
        let e = invalid("a\nb\0", "r");
        assert!(e.to_string().starts_with("\"a\\nb\\0\""));
    }
}

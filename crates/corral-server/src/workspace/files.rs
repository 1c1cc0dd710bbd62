//! Writing, reading, listing and collecting files inside a workspace.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use corral_sys::mount::{self as sys, FileStat};
use corral_sys::Errno;

use super::error::sys_err;
use super::paths::{check_reserved, cstring, invalid, join, parse_rel, shown, Want};
use super::{
    kind_of, open_dir_for_reading, open_dir_path, random_suffix, Collected, CollectedFile, Entry,
    FileLimits, Listing, Workspace, WorkspaceError, DIR_MODE, FILE_MODE, MAX_WALK_DEPTH,
    MAX_WALK_ENTRIES, NAME_ATTEMPTS, RESOLVE, TEMP_PREFIX,
};

impl Workspace {
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

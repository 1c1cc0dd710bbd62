//! Mounts: the classic `mount(2)` family and the fd-based mount API
//! (`open_tree`, `move_mount`, `mount_setattr`, kernel 5.12+), plus
//! `openat2` for resolving paths without following symlinks and the other
//! directory-fd-relative file operations (`fstatat`, `fchownat`,
//! `unlinkat`, `renameat2`, `getdents64`, `fchmod`) that host-side handling of
//! sandbox-writable directories is built from.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::{cvt, Errno, SysResult};

// From include/uapi/linux/mount.h; defined here so the build does not
// depend on how recent the libc crate is.
/// `open_tree`: clone the tree instead of opening the mount itself.
pub const OPEN_TREE_CLONE: u32 = 1;
/// `open_tree`: close-on-exec.
pub const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
/// `move_mount`: the source is the fd itself.
pub const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x04;
/// `move_mount`: the target is the fd itself.
pub const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
/// Mount attribute: read-only.
pub const MOUNT_ATTR_RDONLY: u64 = 0x01;
/// Mount attribute: ignore setuid/setgid bits.
pub const MOUNT_ATTR_NOSUID: u64 = 0x02;
/// Mount attribute: no device access.
pub const MOUNT_ATTR_NODEV: u64 = 0x04;
/// Mount attribute: no exec.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x08;
/// `AT_RECURSIVE`: apply to the whole subtree.
pub const AT_RECURSIVE: u32 = 0x8000;
/// openat2 `RESOLVE_NO_XDEV`.
pub const RESOLVE_NO_XDEV: u64 = 0x01;
/// openat2 `RESOLVE_NO_MAGICLINKS`.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// openat2 `RESOLVE_NO_SYMLINKS`.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// openat2 `RESOLVE_BENEATH`.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// openat2 `RESOLVE_IN_ROOT`.
pub const RESOLVE_IN_ROOT: u64 = 0x10;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `mount(2)`.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: u64,
    data: Option<&CStr>,
) -> SysResult<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is either null (allowed by mount(2) for the
    // arguments we leave out) or a NUL-terminated string alive for the call.
    cvt(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
    .map(drop)
}

/// `umount2(2)`.
pub fn umount2(target: &CStr, flags: i32) -> SysResult<()> {
    // SAFETY: `target` is a NUL-terminated string alive for the call.
    cvt(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// `pivot_root(2)`.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> SysResult<()> {
    // SAFETY: both are NUL-terminated strings alive for the call.
    cvt(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// `chroot(2)`.
pub fn chroot(path: &CStr) -> SysResult<()> {
    // SAFETY: `path` is a NUL-terminated string alive for the call.
    cvt(unsafe { libc::chroot(path.as_ptr()) }).map(drop)
}

/// `chdir(2)`.
pub fn chdir(path: &CStr) -> SysResult<()> {
    // SAFETY: `path` is a NUL-terminated string alive for the call.
    cvt(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// `open_tree(2)`: a detached copy of the mount tree at `path` (relative to
/// `dirfd`, or the fd itself when `path` is empty and `AT_EMPTY_PATH` is in
/// `flags`).
pub fn open_tree(dirfd: RawFd, path: &CStr, flags: u32) -> SysResult<OwnedFd> {
    // SAFETY: `path` is NUL-terminated and alive; dirfd is an integer.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) })?;
    let fd = RawFd::try_from(fd).map_err(|_| Errno(libc::EBADF))?;
    // SAFETY: on success open_tree returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches the detached tree `from` onto the object `to` refers to
/// (`move_mount(2)` with both paths empty).
pub fn move_mount_fds(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> SysResult<()> {
    let empty = c"";
    // SAFETY: both fds are valid for the call; the empty paths are static
    // NUL-terminated strings; the flags say both sides are the fds.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            empty.as_ptr(),
            to.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// `mount_setattr(2)`: sets (`set`) and clears (`clear`) mount attributes
/// on the mount at `dirfd`/`path`. Unlike a remount it never clears a flag
/// it was not asked to, so flags locked by a parent user namespace stay.
pub fn mount_setattr(dirfd: RawFd, path: &CStr, flags: u32, set: u64, clear: u64) -> SysResult<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is NUL-terminated; `attr` is a valid mount_attr whose
    // size we pass, alive for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// `openat2(2)` with `resolve` flags (e.g. `RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS`): the kernel refuses, rather than follows, any
/// path that would leave `dirfd` or cross a symlink, with no
/// check-then-open race.
pub fn openat2(
    dirfd: RawFd,
    path: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> SysResult<OwnedFd> {
    // Open flags are bits of a non-negative int; a negative value is no
    // valid set of them.
    let flags = u64::try_from(flags | libc::O_CLOEXEC).map_err(|_| Errno(libc::EINVAL))?;
    let how = OpenHow {
        flags,
        mode: mode as u64,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated; `how` is a valid open_how whose size
    // we pass, alive for the call.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    let fd = RawFd::try_from(fd).map_err(|_| Errno(libc::EBADF))?;
    // SAFETY: on success openat2 returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mkdirat(2)`.
pub fn mkdirat(dirfd: RawFd, path: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated and alive for the call.
    cvt(unsafe { libc::mkdirat(dirfd, path.as_ptr(), mode) }).map(drop)
}

/// `symlinkat(2)`: creates `linkpath` (relative to `dirfd`) pointing to
/// `target`.
pub fn symlinkat(target: &CStr, dirfd: RawFd, linkpath: &CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated and alive for the call.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dirfd, linkpath.as_ptr()) }).map(drop)
}

/// `openat(2)` that creates a new regular file at `name` and returns its
/// fd; `EEXIST` when anything is there already (`O_EXCL`), a symlink
/// included, which is not followed. Nothing that exists is ever opened
/// for writing: a read-only file, a FIFO or a device a sandbox left in a
/// writable bind, where a later run's mount point goes, is the caller's
/// to look at (an `O_PATH` open), not written through or waited on.
pub fn create_file_at(dirfd: RawFd, name: &CStr, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and alive; O_EXCL with O_CREAT never
    // opens what exists, a final symlink included (open(2)).
    let fd = cvt(unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: on success openat returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Mount attribute: an idmapped mount (`mount_setattr(2)`, kernel 5.12+).
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Makes the detached tree `tree` (recursively) an idmapped mount: file ownership on disk
/// is translated through the id maps of the user namespace `userns`. Lets
/// an unprivileged sandbox uid own files the invoking user owns on disk,
/// with no chown of host files.
pub fn idmap_tree(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> SysResult<()> {
    let userns_fd = u64::try_from(userns.as_raw_fd()).map_err(|_| Errno(libc::EBADF))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd,
    };
    // SAFETY: the empty path is a static NUL-terminated string; `attr` is a
    // valid mount_attr whose size we pass, alive for the call; both fds are
    // valid for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// The parts of `struct stat` callers decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// `st_mode`: file type and permission bits.
    pub mode: u32,
    /// `st_size` in bytes (for a symlink: the length of its target).
    pub size: u64,
    /// `st_nlink`.
    pub nlink: u64,
    /// `st_uid`.
    pub uid: u32,
    /// `st_gid`.
    pub gid: u32,
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileStat {
    /// The file type bits (`mode & S_IFMT`).
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// A regular file.
    pub fn is_regular(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }

    /// A short name for the file type, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self.file_type() {
            libc::S_IFREG => "regular file",
            libc::S_IFDIR => "directory",
            libc::S_IFLNK => "symbolic link",
            libc::S_IFIFO => "fifo",
            libc::S_IFSOCK => "socket",
            libc::S_IFCHR => "character device",
            libc::S_IFBLK => "block device",
            _ => "unknown file type",
        }
    }

    // st_nlink is u64 on x86_64 but u32 on aarch64; the cast is needed on
    // one of them and "unnecessary" on the other.
    #[allow(clippy::unnecessary_cast)]
    fn from_stat(st: &libc::stat) -> FileStat {
        FileStat {
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            nlink: st.st_nlink as u64,
            uid: st.st_uid,
            gid: st.st_gid,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// `fstatat(2)` with an empty path and `AT_EMPTY_PATH`: the status of the
/// object `fd` refers to. Works on `O_PATH` descriptors too.
pub fn fstat(fd: BorrowedFd<'_>) -> SysResult<FileStat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the empty path is a static NUL-terminated string; `st` points
    // to writable memory of the size fstatat fills; fd is valid for the call.
    cvt(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })?;
    // SAFETY: fstatat returned success, so it initialised the whole struct.
    let st = unsafe { st.assume_init() };
    Ok(FileStat::from_stat(&st))
}

/// `fstatat(2)` with `AT_SYMLINK_NOFOLLOW`: the status of the entry `name`
/// in the directory `dir` itself, a symlink reported as a symlink.
pub fn fstatat_nofollow(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<FileStat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated and alive; `st` points to writable
    // memory of the size fstatat fills; dir is valid for the call.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat returned success, so it initialised the whole struct.
    let st = unsafe { st.assume_init() };
    Ok(FileStat::from_stat(&st))
}

/// `fchownat(2)` with an empty path and `AT_EMPTY_PATH`: changes the owner
/// of the object `fd` refers to (works on `O_PATH` descriptors) without
/// resolving any path, so no link can redirect it.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: the empty path is a static NUL-terminated string; fd is valid
    // for the call.
    cvt(unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) })
        .map(drop)
}

/// `unlinkat(2)`: removes the entry `name` of `dir` (an empty directory
/// when `remove_dir`). Never follows a symlink: a link is itself removed.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> SysResult<()> {
    let flags = if remove_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated and alive; dir is valid for the call.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(2)` flag: fail with `EEXIST` instead of replacing the target.
pub const RENAME_NOREPLACE: u32 = 1;

/// `renameat2(2)`: renames the entry `old` of `old_dir` to `new` in
/// `new_dir`. Neither name is followed if it is a symlink.
pub fn renameat2(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    flags: u32,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated and alive; both fds are valid
    // for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// The names in the directory open (for reading, not `O_PATH`) at `dir`,
/// without `.` and `..`, read with `getdents64(2)` from the fd's current
/// offset: at most `max` of them, and whether more were left unread.
pub fn read_dir_names(dir: BorrowedFd<'_>, max: usize) -> SysResult<(Vec<CString>, bool)> {
    // struct linux_dirent64: u64 d_ino, i64 d_off, u16 d_reclen,
    // u8 d_type, then the NUL-terminated name, padded to d_reclen.
    const NAME_OFFSET: usize = 19;
    let mut buf = vec![0u8; 32 * 1024];
    let mut names = Vec::new();
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes and alive for the
        // call; the kernel writes at most that many; dir is valid.
        let n = cvt(unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        })?;
        let filled = usize::try_from(n).unwrap_or(0).min(buf.len());
        if filled == 0 {
            return Ok((names, false));
        }
        let mut at = 0;
        while at < filled {
            let reclen = match buf.get(at + 16..at + 18) {
                Some(&[a, b]) => usize::from(u16::from_ne_bytes([a, b])),
                _ => return Err(crate::Errno(libc::EIO)),
            };
            let record = match buf.get(at..at + reclen) {
                Some(r) if reclen > NAME_OFFSET => r,
                _ => return Err(crate::Errno(libc::EIO)),
            };
            at += reclen;
            let name = match CStr::from_bytes_until_nul(&record[NAME_OFFSET..]) {
                Ok(name) => name,
                Err(_) => return Err(crate::Errno(libc::EIO)),
            };
            if name == c"." || name == c".." {
                continue;
            }
            if names.len() >= max {
                return Ok((names, true));
            }
            names.push(name.to_owned());
        }
    }
}

/// Sets the permission bits of the object `fd` refers to, without
/// resolving any path that could be swapped: `fchmod(2)` for an ordinary
/// descriptor; for an `O_PATH` one (where fchmod gives `EBADF`),
/// `fchmodat2(2)` with `AT_EMPTY_PATH` (Linux 6.6+), else `chmod(2)` of the
/// descriptor's own `/proc/self/fd/N` entry, which names exactly the
/// object already open (glibc's `fchmodat` fallback does the same).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    // SAFETY: fchmod takes two integers; fd is valid for the call.
    match cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }) {
        Err(e) if e.0 == libc::EBADF => {}
        other => return other.map(drop),
    }
    // SAFETY: the empty path is a static NUL-terminated string; fd is
    // valid for the call.
    match cvt(unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EMPTY_PATH,
        )
    }) {
        Err(e) if e.0 == libc::ENOSYS || e.0 == libc::EINVAL => {}
        other => return other.map(drop),
    }
    let proc_path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| crate::Errno(libc::EINVAL))?;
    // SAFETY: `proc_path` is NUL-terminated and alive for the call.
    cvt(unsafe { libc::chmod(proc_path.as_ptr(), mode) }).map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn what_exists_where_a_file_is_created_is_never_opened() {
        let dir = std::env::temp_dir().join(format!("corral-sys-create-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.clone();
        let path = move |name: &str| CString::new(at.join(name).to_str().unwrap()).unwrap();
        // A FIFO: opening it for writing would block until a reader came.
        let fifo = path("fifo");
        // SAFETY: `fifo` is NUL-terminated and alive for the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        // A file nobody may write, and a dangling symlink.
        std::fs::write(dir.join("read-only"), "kept").unwrap();
        std::fs::set_permissions(
            dir.join("read-only"),
            std::os::unix::fs::PermissionsExt::from_mode(0o444),
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("link")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let made: Vec<_> = ["fifo", "read-only", "link"]
                .iter()
                .map(|name| create_file_at(libc::AT_FDCWD, &path(name), 0o644).map(drop))
                .collect();
            let _ = tx.send(made);
        });
        let made = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening the FIFO blocked");
        let nowhere = dir.join("nowhere").exists();
        let kept = std::fs::read_to_string(dir.join("read-only")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(made, vec![Err(Errno(libc::EEXIST)); 3]);
        assert!(!nowhere, "the symlink was followed");
        assert_eq!(kept, "kept");
    }
}

//! Building the sandbox's root filesystem inside the new mount namespace.
//!
//! The approach follows bubblewrap's: make every mount private, mount a
//! scratch tmpfs, `pivot_root` into it with the host root parked at
//! `/oldroot`, build the real root at `/newroot` from binds of
//! `/oldroot/...`, mount `/proc` while the host `/proc` is still visible
//! (the kernel refuses a new procfs otherwise: `mount_too_revealing`),
//! detach the host root, and `pivot_root` a second time.
//!
//! Mount targets are opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` and mounts are attached by fd (`move_mount`), so a
//! symlink planted in a bound directory cannot redirect a mount or a
//! `mkdir` to the host. Bind sources are resolved with `RESOLVE_IN_ROOT`
//! against the host root, so absolute symlinks in them mean what they mean
//! on the host.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use corral_sys::mount::{self as m, AT_RECURSIVE};
use corral_sys::Errno;

use crate::plan::{MountOp, SandboxPlan};
use crate::protocol::FailureKind;

/// A failed step: which kind, and a message naming the path and errno.
pub(super) type StepError = (FailureKind, String);

fn cstr(s: &str) -> Result<CString, StepError> {
    CString::new(s).map_err(|_| {
        (
            FailureKind::Mount,
            format!("path {s:?} contains a NUL byte"),
        )
    })
}

fn mount_err(what: String) -> impl FnOnce(Errno) -> StepError {
    move |e| (FailureKind::Mount, format!("{what}: {e}"))
}

const MS_FLAGS_TMPFS: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;
const RESOLVE_STRICT: u64 = m::RESOLVE_BENEATH | m::RESOLVE_NO_SYMLINKS | m::RESOLVE_NO_MAGICLINKS;

/// Builds the root and pivots into it. On return the process's root is the
/// sandbox root, its cwd is `/`, and the host filesystem is unreachable.
pub(super) fn build(
    plan: &SandboxPlan,
    mut prepared: Vec<(usize, OwnedFd)>,
) -> Result<(), StepError> {
    // Nothing we mount may propagate back to the host (mount_namespaces(7)).
    m::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(mount_err("making / private".into()))?;
    // Scratch root: a tiny tmpfs on /tmp, then pivot into it so the host
    // root sits at /oldroot and the sandbox root is built at /newroot.
    m::mount(
        Some(c"tmpfs"),
        c"/tmp",
        Some(c"tmpfs"),
        MS_FLAGS_TMPFS,
        Some(c"mode=0755,size=64k"),
    )
    .map_err(mount_err("mounting the scratch tmpfs".into()))?;
    m::chdir(c"/tmp").map_err(mount_err("chdir /tmp".into()))?;
    for dir in [c"newroot", c"oldroot", c"empty-dir"] {
        m::mkdirat(libc::AT_FDCWD, dir, 0o755).map_err(mount_err(format!("mkdir {dir:?}")))?;
    }
    m::pivot_root(c".", c"oldroot")
        .map_err(mount_err("pivot_root into the scratch tmpfs".into()))?;
    m::chdir(c"/").map_err(mount_err("chdir /".into()))?;
    // Empty, mode-000 stand-ins bound over denied paths.
    std::fs::set_permissions(
        "/empty-dir",
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .map_err(|e| (FailureKind::Mount, format!("chmod /empty-dir: {e}")))?;
    m::create_file_at(libc::AT_FDCWD, c"/empty-file", 0o000)
        .map_err(mount_err("creating /empty-file".into()))?;

    let root_size =
        CString::new("mode=0755,size=1m").map_err(|_| (FailureKind::Mount, String::new()))?;
    m::mount(
        Some(c"tmpfs"),
        c"/newroot",
        Some(c"tmpfs"),
        MS_FLAGS_TMPFS,
        Some(&root_size),
    )
    .map_err(mount_err("mounting the root tmpfs".into()))?;
    let oldroot = m::openat2(
        libc::AT_FDCWD,
        c"/oldroot",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )
    .map_err(mount_err("opening /oldroot".into()))?;
    let newroot = m::openat2(
        libc::AT_FDCWD,
        c"/newroot",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )
    .map_err(mount_err("opening /newroot".into()))?;

    for file in &plan.files {
        write_file(&newroot, file.path.relative(), file.contents.as_bytes())?;
    }
    for (i, op) in plan.mounts.iter().enumerate() {
        match prepared.iter().position(|(j, _)| *j == i) {
            Some(k) => {
                let (_, tree) = prepared.swap_remove(k);
                attach_prepared(&newroot, tree, op)?;
            }
            None => apply(&oldroot, &newroot, op)?,
        }
    }
    mount_tmp(&newroot, plan)?;
    mount_dev(&newroot, plan)?;
    // procfs of the new pid namespace; nosuid/nodev/noexec as everywhere.
    ensure_target(&newroot, "proc", true)?;
    m::mount(
        Some(c"proc"),
        c"/newroot/proc",
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(mount_err("mounting /proc".into()))?;
    for path in &plan.deny {
        deny(&newroot, path.relative())?;
    }
    drop(oldroot);
    drop(newroot);
    // Detach the host root, then make /newroot the root (pivot_root(".",
    // ".") stacks the old root on the new one; the lazy unmount drops it).
    m::umount2(c"/oldroot", libc::MNT_DETACH)
        .map_err(mount_err("detaching the host root".into()))?;
    m::chdir(c"/newroot").map_err(mount_err("chdir /newroot".into()))?;
    m::pivot_root(c".", c".").map_err(mount_err("pivot_root into the sandbox root".into()))?;
    m::umount2(c".", libc::MNT_DETACH).map_err(mount_err("detaching the scratch root".into()))?;
    m::chdir(c"/").map_err(mount_err("chdir /".into()))?;
    // The root itself is read-only: the program writes only to /workspace,
    // /tmp and read-write binds.
    m::mount_setattr(
        libc::AT_FDCWD,
        c"/",
        0,
        m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(mount_err("making / read-only".into()))?;
    Ok(())
}

/// Opens (creating if needed) `rel` below `root` as an `O_PATH` fd,
/// walking one component at a time and refusing symlinks anywhere.
fn ensure_target(root: &OwnedFd, rel: &str, dir: bool) -> Result<OwnedFd, StepError> {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let mut cur = m::openat2(
        root.as_raw_fd(),
        c".",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE_STRICT,
    )
    .map_err(mount_err(format!("opening the root for /{rel}")))?;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let name = cstr(part)?;
        let want_dir = !last || dir;
        if want_dir {
            match m::mkdirat(cur.as_raw_fd(), &name, 0o755) {
                Ok(()) => {}
                Err(e) if e.0 == libc::EEXIST => {}
                Err(e) => return Err(mount_err(format!("creating mount point /{rel}"))(e)),
            }
        } else {
            match m::create_file_at(cur.as_raw_fd(), &name, 0o644) {
                Ok(_) => {}
                Err(e) if e.0 == libc::EEXIST => {}
                Err(e) => return Err(mount_err(format!("creating mount point /{rel}"))(e)),
            }
        }
        let flags = libc::O_PATH | if want_dir { libc::O_DIRECTORY } else { 0 };
        cur = m::openat2(cur.as_raw_fd(), &name, flags, 0, RESOLVE_STRICT).map_err(|e| {
            let why = if e.0 == libc::ELOOP {
                " (a symlink is in the way; corral never mounts through symlinks)"
            } else {
                ""
            };
            (
                FailureKind::Mount,
                format!("opening mount point /{rel}: {e}{why}"),
            )
        })?;
    }
    Ok(cur)
}

/// Splits `rel` into its parent's fd and the last component.
fn parent_of(root: &OwnedFd, rel: &str) -> Result<(OwnedFd, CString), StepError> {
    let (parent, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
    Ok((ensure_target(root, parent, true)?, cstr(leaf)?))
}

fn write_file(root: &OwnedFd, rel: &str, contents: &[u8]) -> Result<(), StepError> {
    let (parent, leaf) = parent_of(root, rel)?;
    let fd = m::create_file_at(parent.as_raw_fd(), &leaf, 0o644)
        .map_err(mount_err(format!("creating /{rel}")))?;
    File::from(fd)
        .write_all(contents)
        .map_err(|e| (FailureKind::Mount, format!("writing /{rel}: {e}")))
}

/// Clones the host tree at `source` (resolved inside the host root) and
/// attaches it at `dest` with `attrs` set on every mount of the tree.
fn bind(
    oldroot: &OwnedFd,
    newroot: &OwnedFd,
    source: &str,
    dest: &str,
    attrs: u64,
) -> Result<(), StepError> {
    let src_rel = cstr(source.trim_start_matches('/'))?;
    let src = m::openat2(
        oldroot.as_raw_fd(),
        &src_rel,
        libc::O_PATH,
        0,
        m::RESOLVE_IN_ROOT | m::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(mount_err(format!("opening bind source {source}")))?;
    let is_dir = File::from(
        src.try_clone()
            .map_err(|e| (FailureKind::Mount, format!("dup: {e}")))?,
    )
    .metadata()
    .map_err(|e| (FailureKind::Mount, format!("stat {source}: {e}")))?
    .is_dir();
    let tree = m::open_tree(
        src.as_raw_fd(),
        c"",
        m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC | AT_RECURSIVE | libc::AT_EMPTY_PATH as u32,
    )
    .map_err(mount_err(format!("cloning mount tree of {source}")))?;
    m::mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
        attrs,
        0,
    )
    .map_err(mount_err(format!("setting attributes on {source}")))?;
    let target = ensure_target(newroot, dest, is_dir)?;
    m::move_mount_fds(tree.as_fd(), target.as_fd())
        .map_err(mount_err(format!("attaching {source} at /{dest}")))
}

fn apply(oldroot: &OwnedFd, newroot: &OwnedFd, op: &MountOp) -> Result<(), StepError> {
    match op {
        MountOp::Bind {
            source,
            dest,
            writable,
            ..
        } => {
            let mut attrs = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
            if !writable {
                attrs |= m::MOUNT_ATTR_RDONLY;
            }
            bind(oldroot, newroot, source, dest.relative(), attrs)
        }
        MountOp::Symlink { target, dest } => {
            let (parent, leaf) = parent_of(newroot, dest.relative())?;
            m::symlinkat(&cstr(target)?, parent.as_raw_fd(), &leaf)
                .map_err(mount_err(format!("creating symlink {dest} -> {target}")))
        }
        MountOp::Tmpfs { dest, size, mode } => {
            ensure_target(newroot, dest.relative(), true)?;
            let path = cstr(&format!("/newroot/{}", dest.relative()))?;
            let data = cstr(&format!("mode={mode:o},size={size}"))?;
            m::mount(
                Some(c"tmpfs"),
                &path,
                Some(c"tmpfs"),
                MS_FLAGS_TMPFS,
                Some(&data),
            )
            .map_err(mount_err(format!("mounting tmpfs at {dest}")))
        }
    }
}

/// Attaches a tree the helper prepared before dropping root (an idmapped
/// workdir) at the op's destination.
fn attach_prepared(newroot: &OwnedFd, tree: OwnedFd, op: &MountOp) -> Result<(), StepError> {
    let MountOp::Bind { source, dest, .. } = op else {
        return Err((
            FailureKind::Mount,
            format!("prepared tree for a non-bind step at {}", op.dest()),
        ));
    };
    m::mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32,
        m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(mount_err(format!("setting attributes on {source}")))?;
    let target = ensure_target(newroot, dest.relative(), true)?;
    m::move_mount_fds(tree.as_fd(), target.as_fd())
        .map_err(mount_err(format!("attaching idmapped {source} at {dest}")))
}

fn mount_tmp(newroot: &OwnedFd, plan: &SandboxPlan) -> Result<(), StepError> {
    ensure_target(newroot, "tmp", true)?;
    let data = cstr(&format!("mode=1777,size={}", plan.tmp_size))?;
    m::mount(
        Some(c"tmpfs"),
        c"/newroot/tmp",
        Some(c"tmpfs"),
        MS_FLAGS_TMPFS,
        Some(&data),
    )
    .map_err(mount_err("mounting /tmp".into()))
}

/// A minimal `/dev`: the five harmless character devices bound from the
/// host, the usual symlinks, `/dev/shm`, and `/dev/pts` only when asked.
/// No `/dev/tty`, no disks, no `/dev/mem`.
fn mount_dev(newroot: &OwnedFd, plan: &SandboxPlan) -> Result<(), StepError> {
    ensure_target(newroot, "dev", true)?;
    m::mount(
        Some(c"tmpfs"),
        c"/newroot/dev",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"mode=0755,size=64k"),
    )
    .map_err(mount_err("mounting /dev".into()))?;
    let oldroot = m::openat2(
        libc::AT_FDCWD,
        c"/oldroot",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )
    .map_err(mount_err("opening /oldroot".into()))?;
    for dev in ["null", "zero", "full", "random", "urandom"] {
        bind(
            &oldroot,
            newroot,
            &format!("/dev/{dev}"),
            &format!("dev/{dev}"),
            m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NOEXEC,
        )?;
    }
    let dev = ensure_target(newroot, "dev", true)?;
    for (name, target) in [
        (c"fd", c"/proc/self/fd"),
        (c"stdin", c"/proc/self/fd/0"),
        (c"stdout", c"/proc/self/fd/1"),
        (c"stderr", c"/proc/self/fd/2"),
    ] {
        m::symlinkat(target, dev.as_raw_fd(), name)
            .map_err(mount_err(format!("creating /dev/{name:?}")))?;
    }
    ensure_target(newroot, "dev/shm", true)?;
    let shm = cstr(&format!("mode=1777,size={}", plan.tmp_size))?;
    m::mount(
        Some(c"tmpfs"),
        c"/newroot/dev/shm",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&shm),
    )
    .map_err(mount_err("mounting /dev/shm".into()))?;
    if plan.dev_pts {
        ensure_target(newroot, "dev/pts", true)?;
        m::mount(
            Some(c"devpts"),
            c"/newroot/dev/pts",
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=620"),
        )
        .map_err(mount_err("mounting /dev/pts".into()))?;
        m::symlinkat(c"pts/ptmx", dev.as_raw_fd(), c"ptmx")
            .map_err(mount_err("creating /dev/ptmx".into()))?;
    }
    // Nothing else can be created in /dev.
    m::mount_setattr(
        dev.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32,
        m::MOUNT_ATTR_RDONLY,
        0,
    )
    .map_err(mount_err("making /dev read-only".into()))
}

/// Hides `rel` behind an empty, mode-000, read-only stand-in. A path that
/// does not exist is left alone.
fn deny(newroot: &OwnedFd, rel: &str) -> Result<(), StepError> {
    let path = cstr(rel)?;
    let target = match m::openat2(
        newroot.as_raw_fd(),
        &path,
        libc::O_PATH,
        0,
        m::RESOLVE_IN_ROOT | m::RESOLVE_NO_SYMLINKS,
    ) {
        Ok(fd) => fd,
        Err(e) if e.0 == libc::ENOENT => return Ok(()),
        Err(e) => return Err(mount_err(format!("opening denied path /{rel}"))(e)),
    };
    let is_dir = File::from(
        target
            .try_clone()
            .map_err(|e| (FailureKind::Mount, format!("dup: {e}")))?,
    )
    .metadata()
    .map_err(|e| (FailureKind::Mount, format!("stat /{rel}: {e}")))?
    .is_dir();
    let standin = if is_dir {
        c"/empty-dir"
    } else {
        c"/empty-file"
    };
    let tree = m::open_tree(
        libc::AT_FDCWD,
        standin,
        m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC,
    )
    .map_err(mount_err(format!("cloning stand-in for /{rel}")))?;
    m::mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32,
        m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_NOEXEC,
        0,
    )
    .map_err(mount_err(format!("sealing stand-in for /{rel}")))?;
    m::move_mount_fds(tree.as_fd(), target.as_fd()).map_err(mount_err(format!("hiding /{rel}")))
}

//! Building the sandbox's root filesystem inside the new mount namespace.
//!
//! The approach follows bubblewrap's: make every mount private, mount a
//! scratch tmpfs, `pivot_root` into it with the host root parked at
//! `/oldroot`, build the real root in its directory `/newroot` (bound
//! onto itself, so it is a mount point) from binds of `/oldroot/...`,
//! mount `/proc` while the host `/proc` is still visible (the kernel
//! refuses a new procfs otherwise: `mount_too_revealing`), detach the
//! host root, and `pivot_root` a second time. The sandbox's root and its
//! `/dev` are directories of that one tmpfs, not filesystems of their
//! own: every tmpfs costs its creation in the launch and its teardown in
//! init's exit (~30-50 us each on the project's VM, docs/PERFORMANCE.md).
//!
//! Mount targets are opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` and mounts are attached by fd (`move_mount`), so a
//! symlink planted in a bound directory cannot redirect a mount or a
//! `mkdir` to the host. Bind sources are resolved with `RESOLVE_IN_ROOT`
//! against the host root, so absolute symlinks in them mean what they mean
//! on the host.

use std::ffi::CString;

use corral_policy::path::is_at_or_below;
use corral_sys::mount::{self as m, AT_RECURSIVE};
use corral_sys::Errno;

use crate::kernel::{At, Kernel};
use crate::plan::{MountOp, SandboxPlan};
use crate::protocol::FailureKind;
use crate::StepError;

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

fn stat_err(what: &str) -> impl FnOnce(Errno) -> StepError + '_ {
    move |e| (FailureKind::Mount, format!("stat {what}: {e}"))
}

const MS_FLAGS_TMPFS: u64 = libc::MS_NOSUID | libc::MS_NODEV;
const RESOLVE_STRICT: u64 = m::RESOLVE_BENEATH | m::RESOLVE_NO_SYMLINKS | m::RESOLVE_NO_MAGICLINKS;

/// Builds the root and pivots into it. On return the process's root is the
/// sandbox root, its cwd is `/`, and the host filesystem is unreachable.
/// `prepared` holds the trees the helper cloned (idmapped) before dropping
/// root, by index in `plan.mounts`.
pub(super) fn build<K: Kernel>(
    k: &mut K,
    plan: &SandboxPlan,
    mut prepared: Vec<(usize, K::Fd)>,
) -> Result<(), StepError> {
    // Nothing we mount may propagate back to the host (mount_namespaces(7)).
    k.mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(mount_err("making / private".into()))?;
    // Scratch root: a small tmpfs on /tmp, then pivot into it so the host
    // root sits at /oldroot and the sandbox root is built at /newroot.
    // The sandbox root is that directory of the same tmpfs (bubblewrap's
    // layout): 1 MiB holds the generated files and the mount points, and
    // it is read-only once built.
    k.mount(
        Some(c"tmpfs"),
        c"/tmp",
        Some(c"tmpfs"),
        MS_FLAGS_TMPFS,
        Some(c"mode=0755,size=1m"),
    )
    .map_err(mount_err("mounting the scratch tmpfs".into()))?;
    k.chdir(c"/tmp").map_err(mount_err("chdir /tmp".into()))?;
    for dir in [c"newroot", c"oldroot", c"empty-dir"] {
        k.mkdir_at(At::Cwd, dir, 0o755)
            .map_err(mount_err(format!("mkdir {dir:?}")))?;
    }
    k.pivot_root(c".", c"oldroot")
        .map_err(mount_err("pivot_root into the scratch tmpfs".into()))?;
    k.chdir(c"/").map_err(mount_err("chdir /".into()))?;
    // The sandbox's `/`, 0755 whatever corral's umask (as the mode of a
    // root tmpfs of its own was).
    k.chmod("/newroot", 0o755)
        .map_err(|e| (FailureKind::Mount, format!("chmod /newroot: {e}")))?;
    // Empty, mode-000 stand-ins bound over denied paths. They stay out of
    // the sandbox's view: its root is /newroot.
    k.chmod("/empty-dir", 0o000)
        .map_err(|e| (FailureKind::Mount, format!("chmod /empty-dir: {e}")))?;
    k.create_file_at(At::Cwd, c"/empty-file", 0o000)
        .map_err(mount_err("creating /empty-file".into()))?;
    // pivot_root(2) needs the new root to be a mount point: a bind of the
    // directory onto itself, which costs no filesystem of its own.
    k.mount(Some(c"/newroot"), c"/newroot", None, libc::MS_BIND, None)
        .map_err(mount_err("binding /newroot onto itself".into()))?;
    let oldroot = k
        .open_at(At::Cwd, c"/oldroot", libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(mount_err("opening /oldroot".into()))?;
    let newroot = k
        .open_at(At::Cwd, c"/newroot", libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(mount_err("opening /newroot".into()))?;

    let mut targets = Targets::new(&newroot);
    write_files(k, &mut targets, &plan.files)?;
    let writable = Writable::of(plan);
    for (i, op) in plan.mounts.iter().enumerate() {
        match prepared.iter().position(|(j, _)| *j == i) {
            Some(at) => {
                let (_, tree) = prepared.swap_remove(at);
                attach_prepared(k, &mut targets, tree, op, writable)?;
            }
            None => apply(k, &oldroot, &mut targets, op, writable)?,
        }
    }
    mount_tmp(k, &mut targets, plan, writable)?;
    mount_dev(k, &oldroot, &mut targets, plan, writable)?;
    // procfs of the new pid namespace; nosuid/nodev/noexec as everywhere.
    targets.mount_point(k, "proc", true)?;
    k.mount(
        Some(c"proc"),
        c"/newroot/proc",
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(mount_err("mounting /proc".into()))?;
    for path in &plan.deny {
        targets.covered(path.relative());
        deny(k, &newroot, path.relative())?;
    }
    drop(targets);
    drop(oldroot);
    drop(newroot);
    // Make /newroot the root: pivot_root(".", ".") stacks the scratch root,
    // with the host root parked at its /oldroot, on the new one; one lazy
    // unmount detaches that whole tree, host root included. One unmount,
    // not one per tree: each waits for an expedited RCU grace period
    // (namespace_unlock), which is wall time on every start.
    k.chdir(c"/newroot")
        .map_err(mount_err("chdir /newroot".into()))?;
    k.pivot_root(c".", c".")
        .map_err(mount_err("pivot_root into the sandbox root".into()))?;
    k.umount(c".", libc::MNT_DETACH).map_err(mount_err(
        "detaching the scratch root and the host root".into(),
    ))?;
    k.chdir(c"/").map_err(mount_err("chdir /".into()))?;
    // The root itself, /dev's directory included, is read-only and runs
    // nothing: the program writes only to /workspace, /tmp, /dev/shm and
    // read-write binds, and runs what binds of their own (/usr) hold.
    k.mount_setattr(
        At::Cwd,
        c"/",
        0,
        m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_NOEXEC,
        0,
    )
    .map_err(mount_err("making / read-only".into()))?;
    Ok(())
}

/// How the places the program can write are mounted: `noexec` as well
/// under `commands.restrict_exec` (the plan's Landlock rules then name the
/// only files that may be executed).
///
/// Landlock's execute right covers `execve` and the ELF loader the kernel
/// opens for it, not `mmap(PROT_EXEC)`: the dynamic loader run as a
/// program (`ld-linux-x86-64.so.2 /workspace/a.out`), which an allowed
/// dynamically linked command needs to be executable, would map and run
/// any file the sandbox wrote. A `noexec` mount refuses such a mapping
/// (EPERM) and any `execve` there (EACCES), so no file the sandbox writes
/// runs as a program or a library (an allowed interpreter may still make
/// code in its own memory: that is what it computes, not what runs).
#[derive(Clone, Copy)]
struct Writable {
    noexec: bool,
}

impl Writable {
    fn of(plan: &SandboxPlan) -> Writable {
        Writable {
            noexec: plan.security.landlock.execute_only.is_some(),
        }
    }

    /// `mount_setattr` attributes of a writable bind.
    fn bind_attrs(self) -> u64 {
        let attrs = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
        if self.noexec {
            attrs | m::MOUNT_ATTR_NOEXEC
        } else {
            attrs
        }
    }

    /// `mount(2)` flags of a writable tmpfs.
    fn tmpfs_flags(self) -> u64 {
        if self.noexec {
            MS_FLAGS_TMPFS | libc::MS_NOEXEC
        } else {
            MS_FLAGS_TMPFS
        }
    }
}

/// Opens (creating if needed) `rel` below `root` as an `O_PATH` fd,
/// walking one component at a time and refusing symlinks anywhere.
fn ensure_target<K: Kernel>(
    k: &mut K,
    root: &K::Fd,
    rel: &str,
    dir: bool,
) -> Result<K::Fd, StepError> {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    // The first component is opened relative to `root` itself, with the
    // same RESOLVE_STRICT walk: an fd of "." below it would be the same
    // directory, at the cost of an openat2 and a close per mount target.
    let mut cur: Option<K::Fd> = None;
    for (i, part) in parts.iter().enumerate() {
        let want_dir = i + 1 < parts.len() || dir;
        let next = entry(k, cur.as_ref().unwrap_or(root), part, want_dir, rel)?;
        cur = Some(next);
    }
    match cur {
        Some(fd) => Ok(fd),
        // `rel` is the root itself: an fd of it, opened the same way.
        None => k
            .open_at(
                At::Fd(root),
                c".",
                libc::O_PATH | libc::O_DIRECTORY,
                RESOLVE_STRICT,
            )
            .map_err(mount_err(format!("opening the root for /{rel}"))),
    }
}

/// Creates `name` in `parent` unless it exists (a directory when `dir`,
/// else an empty file) and opens it as an `O_PATH` fd without following a
/// symlink. `rel` is the whole path, for errors. What is there already is
/// used as it is, never opened for writing: in a writable bind a file the
/// sandbox identity may not write, or a FIFO a sandbox left, is as good a
/// mount point as a new one.
fn entry<K: Kernel>(
    k: &mut K,
    parent: &K::Fd,
    name: &str,
    dir: bool,
    rel: &str,
) -> Result<K::Fd, StepError> {
    let name = cstr(name)?;
    let made = if dir {
        k.mkdir_at(At::Fd(parent), &name, 0o755)
    } else {
        k.create_file_at(At::Fd(parent), &name, 0o644).map(drop)
    };
    match made {
        Ok(()) | Err(Errno(libc::EEXIST)) => {}
        Err(e) => return Err(mount_err(format!("creating mount point /{rel}"))(e)),
    }
    let flags = libc::O_PATH | if dir { libc::O_DIRECTORY } else { 0 };
    let fd = k
        .open_at(At::Fd(parent), &name, flags, RESOLVE_STRICT)
        .map_err(|e| {
            let why = match e.0 {
                libc::ENOTDIR if dir => {
                    " (a file is in the way of a directory's mount point; remove it or mount elsewhere)"
                        .to_owned()
                }
                _ => if_symlink(
                    e,
                    "a symlink is in the way; corral never mounts through symlinks",
                ),
            };
            (
                FailureKind::Mount,
                format!("opening mount point /{rel}: {e}{why}"),
            )
        })?;
    // A file can be bound onto any entry but a directory (the mount would
    // fail with ENOTDIR); one that was there already (not made above) is
    // checked, for a message that says so.
    if !dir && made.is_err() && k.is_dir(&fd).unwrap_or(false) {
        return Err((
            FailureKind::Mount,
            format!(
                "mount point /{rel} is a directory, and a file is bound there; \
                 remove the directory or bind the file elsewhere"
            ),
        ));
    }
    Ok(fd)
}

/// ` (why)` when `e` is the ELOOP of an `openat2` that met a symlink it
/// was told not to follow, else nothing: the hint for the error message.
fn if_symlink(e: Errno, why: &str) -> String {
    if e.0 == libc::ELOOP {
        format!(" ({why})")
    } else {
        String::new()
    }
}

/// Mount points below the new root, and the directory the last one was
/// made in, kept open for the next.
///
/// A profile's mounts come in runs in one directory (`/etc/ld.so.cache`,
/// `/etc/ld.so.conf`, ..., the five nodes of `/dev`): each mount point
/// after the first in a directory then costs its own creation and
/// `openat2`, not a walk from the root (a `mkdir` and an `openat2` per
/// component, and the closes). A mount at that directory or above it
/// would leave the open descriptor on what it covers, so announcing such a
/// mount ([`Targets::covered`]) closes it first and the next mount point
/// there is walked to again, through the new mount.
///
/// Only directories of the scratch root are kept: below a mount (a host
/// tree, whose owner can rename its directories while init works) each
/// mount point is walked to afresh, so the time between the walk and the
/// mount stays as short as it was.
struct Targets<'r, K: Kernel> {
    root: &'r K::Fd,
    /// The open directory, with its path relative to the root when it may
    /// serve the next mount point.
    open: Option<(Option<String>, K::Fd)>,
    /// Where mounts were announced so far.
    mounted: Vec<String>,
}

impl<'r, K: Kernel> Targets<'r, K> {
    fn new(root: &'r K::Fd) -> Self {
        Targets {
            root,
            open: None,
            mounted: Vec::new(),
        }
    }

    /// The directory `rel` below the root (the root itself for `""`),
    /// made if missing.
    fn dir(&mut self, k: &mut K, rel: &str) -> Result<&K::Fd, StepError> {
        if rel.is_empty() {
            return Ok(self.root);
        }
        let open = match self.open.take() {
            Some((Some(path), fd)) if path == rel => (Some(path), fd),
            _ => {
                let fd = ensure_target(k, self.root, rel, true)?;
                let in_scratch_root = !self.mounted.iter().any(|m| is_at_or_below(rel, m));
                (in_scratch_root.then(|| rel.to_owned()), fd)
            }
        };
        Ok(&self.open.insert(open).1)
    }

    /// Opens (creating if needed) the mount point `rel`, a directory when
    /// `dir`, for a mount the caller attaches next.
    fn mount_point(&mut self, k: &mut K, rel: &str, dir: bool) -> Result<K::Fd, StepError> {
        self.covered(rel);
        let (parent, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
        let parent = self.dir(k, parent)?;
        entry(k, parent, leaf, dir, rel)
    }

    /// Something is about to be mounted at `rel`: the open directory is
    /// closed if that mount would cover it, and nothing below `rel` is
    /// kept open from now on.
    fn covered(&mut self, rel: &str) {
        if let Some((Some(open), _)) = &self.open {
            if is_at_or_below(open, rel) {
                self.open = None;
            }
        }
        self.mounted.push(rel.to_owned());
    }
}

/// Writes the generated files, each parent directory opened (and made)
/// once for the files that follow in it (`/etc/passwd`, `/etc/group`...).
fn write_files<K: Kernel>(
    k: &mut K,
    targets: &mut Targets<'_, K>,
    files: &[crate::plan::GeneratedFile],
) -> Result<(), StepError> {
    for file in files {
        let rel = file.path.relative();
        let (parent, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = targets.dir(k, parent)?;
        let fd = k
            .create_file_at(At::Fd(dir), &cstr(leaf)?, 0o644)
            .map_err(mount_err(format!("creating /{rel}")))?;
        k.write_all(fd, file.contents.as_bytes())
            .map_err(|e| (FailureKind::Mount, format!("writing /{rel}: {e}")))?;
    }
    Ok(())
}

/// Clones the host tree at `source` (resolved inside the host root, and
/// without following any symlink when `no_symlinks`) and attaches it at
/// `dest` with `attrs` set on every mount of the tree.
fn bind<K: Kernel>(
    k: &mut K,
    oldroot: &K::Fd,
    targets: &mut Targets<'_, K>,
    source: &str,
    dest: &str,
    attrs: u64,
    no_symlinks: bool,
) -> Result<(), StepError> {
    let src_rel = cstr(source.trim_start_matches('/'))?;
    let mut resolve = m::RESOLVE_IN_ROOT | m::RESOLVE_NO_MAGICLINKS;
    if no_symlinks {
        // What the planner checked is what is mounted: a link planted
        // since (by a sandbox that can write a directory on the path) is
        // refused with ELOOP rather than followed (openat2(2)).
        resolve |= m::RESOLVE_NO_SYMLINKS;
    }
    let src = k
        .open_at(At::Fd(oldroot), &src_rel, libc::O_PATH, resolve)
        .map_err(mount_err(format!("opening bind source {source}")))?;
    let is_dir = k.is_dir(&src).map_err(stat_err(source))?;
    let tree = k
        .open_tree(
            At::Fd(&src),
            c"",
            m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC | AT_RECURSIVE | libc::AT_EMPTY_PATH as u32,
        )
        .map_err(mount_err(format!("cloning mount tree of {source}")))?;
    // The attributes are set on the detached clone, before it is attached:
    // the bind is never visible in the new root without them.
    k.mount_setattr(
        At::Fd(&tree),
        c"",
        libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
        attrs,
        0,
    )
    .map_err(mount_err(format!("setting attributes on {source}")))?;
    let target = targets.mount_point(k, dest, is_dir)?;
    k.move_mount(&tree, &target)
        .map_err(mount_err(format!("attaching {source} at /{dest}")))
}

fn apply<K: Kernel>(
    k: &mut K,
    oldroot: &K::Fd,
    targets: &mut Targets<'_, K>,
    op: &MountOp,
    writable_mounts: Writable,
) -> Result<(), StepError> {
    match op {
        MountOp::Bind {
            source,
            dest,
            writable,
            no_symlinks,
            ..
        } => {
            let attrs = if *writable {
                writable_mounts.bind_attrs()
            } else {
                m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_RDONLY
            };
            bind(
                k,
                oldroot,
                targets,
                source,
                dest.relative(),
                attrs,
                *no_symlinks,
            )
        }
        MountOp::Protect {
            source,
            dest,
            read_only,
            ..
        } => {
            targets.covered(dest.relative());
            protect(k, targets.root, source, dest.relative(), *read_only)
        }
        MountOp::Symlink { target, dest } => {
            let rel = dest.relative();
            let (parent, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
            let parent = targets.dir(k, parent)?;
            k.symlink_at(&cstr(target)?, At::Fd(parent), &cstr(leaf)?)
                .map_err(mount_err(format!("creating symlink {dest} -> {target}")))
        }
        MountOp::Tmpfs { dest, size, mode } => {
            targets.mount_point(k, dest.relative(), true)?;
            let path = cstr(&format!("/newroot/{}", dest.relative()))?;
            let data = cstr(&format!("mode={mode:o},size={size}"))?;
            k.mount(
                Some(c"tmpfs"),
                &path,
                Some(c"tmpfs"),
                writable_mounts.tmpfs_flags(),
                Some(&data),
            )
            .map_err(mount_err(format!("mounting tmpfs at {dest}")))
        }
    }
}

/// Binds the entry at `dest` (inside an earlier bind) onto itself,
/// read-only when `read_only`. The entry is opened once, without following
/// a symlink anywhere below the new root, and the clone of that very
/// object is attached on it: a link swapped in by another sandbox sharing
/// the directory is refused (`ELOOP`), never followed to the host.
fn protect<K: Kernel>(
    k: &mut K,
    newroot: &K::Fd,
    source: &str,
    dest: &str,
    read_only: bool,
) -> Result<(), StepError> {
    let rel = cstr(dest)?;
    let target = k
        .open_at(
            At::Fd(newroot),
            &rel,
            libc::O_PATH | libc::O_NOFOLLOW,
            RESOLVE_STRICT,
        )
        .map_err(|e| {
            let why = if_symlink(e, "it is a symlink now; a protected entry must not be one");
            (
                FailureKind::Mount,
                format!("opening protected entry {source} at /{dest}: {e}{why}"),
            )
        })?;
    let tree = k
        .open_tree(
            At::Fd(&target),
            c"",
            m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC | AT_RECURSIVE | libc::AT_EMPTY_PATH as u32,
        )
        .map_err(mount_err(format!("cloning protected entry {source}")))?;
    let mut attrs = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
    if read_only {
        attrs |= m::MOUNT_ATTR_RDONLY;
    }
    k.mount_setattr(
        At::Fd(&tree),
        c"",
        libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
        attrs,
        0,
    )
    .map_err(mount_err(format!(
        "setting attributes on protected entry {source}"
    )))?;
    k.move_mount(&tree, &target)
        .map_err(mount_err(format!("protecting {source} at /{dest}")))
}

/// Attaches a tree the helper prepared before dropping root (an idmapped
/// workdir) at the op's destination.
fn attach_prepared<K: Kernel>(
    k: &mut K,
    targets: &mut Targets<'_, K>,
    tree: K::Fd,
    op: &MountOp,
    writable: Writable,
) -> Result<(), StepError> {
    let MountOp::Bind { source, dest, .. } = op else {
        return Err((
            FailureKind::Mount,
            format!("prepared tree for a non-bind step at {}", op.dest()),
        ));
    };
    k.mount_setattr(
        At::Fd(&tree),
        c"",
        libc::AT_EMPTY_PATH as u32,
        writable.bind_attrs(),
        0,
    )
    .map_err(mount_err(format!("setting attributes on {source}")))?;
    let target = targets.mount_point(k, dest.relative(), true)?;
    k.move_mount(&tree, &target)
        .map_err(mount_err(format!("attaching idmapped {source} at {dest}")))
}

fn mount_tmp<K: Kernel>(
    k: &mut K,
    targets: &mut Targets<'_, K>,
    plan: &SandboxPlan,
    writable: Writable,
) -> Result<(), StepError> {
    targets.mount_point(k, "tmp", true)?;
    let data = cstr(&format!("mode=1777,size={}", plan.tmp_size))?;
    k.mount(
        Some(c"tmpfs"),
        c"/newroot/tmp",
        Some(c"tmpfs"),
        writable.tmpfs_flags(),
        Some(&data),
    )
    .map_err(mount_err("mounting /tmp".into()))
}

/// A minimal `/dev`: the five harmless character devices bound from the
/// host, the usual symlinks, `/dev/shm`, and `/dev/pts` only when asked.
/// No `/dev/tty`, no disks, no `/dev/mem`. `/dev` itself is a directory of
/// the root, read-only and `noexec` with it once built (nothing else can
/// be created there); each device is a bind with `nosuid` and `noexec`.
fn mount_dev<K: Kernel>(
    k: &mut K,
    oldroot: &K::Fd,
    targets: &mut Targets<'_, K>,
    plan: &SandboxPlan,
    writable: Writable,
) -> Result<(), StepError> {
    targets.dir(k, "dev")?;
    // 0755 whatever corral's umask, as its own tmpfs's `mode=0755` was.
    k.chmod("/newroot/dev", 0o755)
        .map_err(|e| (FailureKind::Mount, format!("chmod /dev: {e}")))?;
    for name in ["null", "zero", "full", "random", "urandom"] {
        bind(
            k,
            oldroot,
            targets,
            &format!("/dev/{name}"),
            &format!("dev/{name}"),
            m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NOEXEC,
            true,
        )?;
    }
    for (name, target) in [
        (c"fd", c"/proc/self/fd"),
        (c"stdin", c"/proc/self/fd/0"),
        (c"stdout", c"/proc/self/fd/1"),
        (c"stderr", c"/proc/self/fd/2"),
    ] {
        let dev = targets.dir(k, "dev")?;
        k.symlink_at(target, At::Fd(dev), name)
            .map_err(mount_err(format!("creating /dev/{name:?}")))?;
    }
    targets.mount_point(k, "dev/shm", true)?;
    let shm = cstr(&format!("mode=1777,size={}", plan.tmp_size))?;
    k.mount(
        Some(c"tmpfs"),
        c"/newroot/dev/shm",
        Some(c"tmpfs"),
        writable.tmpfs_flags(),
        Some(&shm),
    )
    .map_err(mount_err("mounting /dev/shm".into()))?;
    if plan.dev_pts {
        targets.mount_point(k, "dev/pts", true)?;
        k.mount(
            Some(c"devpts"),
            c"/newroot/dev/pts",
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=620"),
        )
        .map_err(mount_err("mounting /dev/pts".into()))?;
        let dev = targets.dir(k, "dev")?;
        k.symlink_at(c"pts/ptmx", At::Fd(dev), c"ptmx")
            .map_err(mount_err("creating /dev/ptmx".into()))?;
    }
    Ok(())
}

/// Hides `rel` behind an empty, mode-000, read-only stand-in. A path that
/// does not exist is left alone.
fn deny<K: Kernel>(k: &mut K, newroot: &K::Fd, rel: &str) -> Result<(), StepError> {
    let path = cstr(rel)?;
    let target = match k.open_at(
        At::Fd(newroot),
        &path,
        libc::O_PATH,
        m::RESOLVE_IN_ROOT | m::RESOLVE_NO_SYMLINKS,
    ) {
        Ok(fd) => fd,
        Err(e) if e.0 == libc::ENOENT => return Ok(()),
        Err(e) => return Err(mount_err(format!("opening denied path /{rel}"))(e)),
    };
    let is_dir = k.is_dir(&target).map_err(stat_err(&format!("/{rel}")))?;
    let standin = if is_dir {
        c"/empty-dir"
    } else {
        c"/empty-file"
    };
    let tree = k
        .open_tree(At::Cwd, standin, m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC)
        .map_err(mount_err(format!("cloning stand-in for /{rel}")))?;
    k.mount_setattr(
        At::Fd(&tree),
        c"",
        libc::AT_EMPTY_PATH as u32,
        m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_NOEXEC,
        0,
    )
    .map_err(mount_err(format!("sealing stand-in for /{rel}")))?;
    k.move_mount(&tree, &target)
        .map_err(mount_err(format!("hiding /{rel}")))
}

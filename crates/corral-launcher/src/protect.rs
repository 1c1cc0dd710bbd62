//! Protected entries of writable binds (a profile's `filesystem.protect`):
//! planning the helper's [`MountOp::Protect`] steps, and, around the run,
//! the placeholders that stand in for missing entries.
//!
//! A missing entry cannot be covered by a mount (a mount needs something
//! to sit on), and a sandbox that could create `.mcp.json` or a whole
//! `.git` with a `core.fsmonitor` command has planted code the user runs
//! later. So the launcher creates a placeholder before the run (which the
//! helper then binds read-only) and removes it afterwards if it is still
//! the empty placeholder it made. A project entry's placeholder is an
//! empty directory, whatever the entry would be: the name is taken either
//! way, and git ignores empty directories, so a `git add -A` inside or
//! outside the sandbox never commits one. A home directory's entries
//! (`~/.bashrc`) get empty files, which shells and git read as "nothing
//! configured". Placeholders
//! carry the extended attribute [`PLACEHOLDER_XATTR`], so one left behind
//! by a corral that was killed is recognised, reused and removed by the
//! next run on the same directory; every run holds a shared `flock(2)` on
//! each placeholder it uses and removes one only when it can take the lock
//! exclusively, so a concurrent run's protection is never unmounted under
//! it (unlinking a mount point in another mount namespace detaches it).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use corral_helper::MountOp;
use corral_policy::{ProtectEntry, SandboxPath};
use corral_sys::fd::{self, FlockMode};
use corral_sys::mount as m;

use crate::plan::PlanError;

/// Marks a placeholder corral created (value `1`).
pub const PLACEHOLDER_XATTR: &std::ffi::CStr = c"user.corral.placeholder";

/// The [`MountOp::Protect`] steps for the writable bind of `root` (host
/// path, symlink-free) at `root_dest`: per entry, every existing directory
/// on the way pinned (read-write self-bind), the entry itself read-only;
/// a missing component becomes a read-only placeholder (nothing further
/// down the path is needed then). Steps already planned for another entry are
/// not repeated (read-only wins), and nothing below a read-only step.
/// `home` says whether `root` is a home directory ([`is_home_directory`]):
/// only then do `~/` entries count.
pub(crate) fn plan_protect(
    root: &Path,
    root_dest: &SandboxPath,
    entries: &[ProtectEntry],
    home: bool,
) -> Result<Vec<MountOp>, PlanError> {
    let mut ops: Vec<MountOp> = Vec::new();
    let concrete = entries
        .iter()
        .filter(|e| home || !e.home_only())
        .map(|e| Ok((e, expand(root, e)?)))
        .collect::<Result<Vec<_>, PlanError>>()?;
    for (entry, parts) in concrete
        .iter()
        .flat_map(|(e, all)| all.iter().map(move |p| (*e, p)))
    {
        let mut host = root.to_path_buf();
        let mut dest = root_dest.as_str().trim_end_matches('/').to_string();
        for (i, part) in parts.iter().enumerate() {
            host.push(part);
            dest.push('/');
            dest.push_str(part);
            let last = i + 1 == parts.len();
            let step = |read_only: bool| -> Result<MountOp, PlanError> {
                Ok(MountOp::Protect {
                    source: host_str(&host)?,
                    dest: SandboxPath::new(&dest).map_err(|e| PlanError::Mount(e.to_string()))?,
                    read_only,
                    dir: !(last && entry.home_only()),
                })
            };
            let (op, stop) = match std::fs::symlink_metadata(&host) {
                // A `*` entry protects what exists; nothing to stand in for.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && entry.has_wildcard() => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (step(true)?, true),
                Err(e) => {
                    return Err(PlanError::Mount(format!(
                        "cannot inspect the protected entry {}: {e}",
                        host.display()
                    )))
                }
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target = std::fs::read_link(&host)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".into());
                    return Err(PlanError::ProtectedSymlink {
                        entry: entry.to_string(),
                        link: host.display().to_string(),
                        target,
                    });
                }
                // The entry itself; or `.git` as a file (a worktree's or
                // submodule's gitfile): the file is what must not change.
                Ok(meta) if last || !meta.is_dir() => (step(true)?, true),
                Ok(_) => (step(false)?, false),
            };
            merge(&mut ops, op);
            if stop {
                break;
            }
        }
    }
    // Nothing needs binding below a read-only step.
    let read_only: Vec<SandboxPath> = ops
        .iter()
        .filter(|op| {
            matches!(
                op,
                MountOp::Protect {
                    read_only: true,
                    ..
                }
            )
        })
        .map(|op| op.dest().clone())
        .collect();
    ops.retain(|op| {
        !read_only
            .iter()
            .any(|ro| op.dest() != ro && op.dest().starts_with(ro))
    });
    Ok(ops)
}

/// The concrete paths (component lists) of `entry` below `root`: itself,
/// or for each `*` every directory there now (a symlink there is refused,
/// as anywhere on a protected path).
fn expand(root: &Path, entry: &ProtectEntry) -> Result<Vec<Vec<String>>, PlanError> {
    let mut paths: Vec<Vec<String>> = vec![Vec::new()];
    for part in entry.components() {
        if part != "*" {
            paths.iter_mut().for_each(|p| p.push(part.to_string()));
            continue;
        }
        let mut next = Vec::new();
        for prefix in paths {
            let dir = prefix.iter().fold(root.to_path_buf(), |d, c| d.join(c));
            let Ok(list) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<String> = Vec::new();
            for child in list.flatten() {
                let Ok(kind) = child.file_type() else {
                    continue;
                };
                let Some(name) = child.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if kind.is_symlink() {
                    let link = dir.join(&name);
                    return Err(PlanError::ProtectedSymlink {
                        entry: entry.to_string(),
                        target: std::fs::read_link(&link)
                            .map(|t| t.display().to_string())
                            .unwrap_or_else(|_| "?".into()),
                        link: link.display().to_string(),
                    });
                }
                if kind.is_dir() {
                    names.push(name);
                }
            }
            names.sort();
            next.extend(names.into_iter().map(|n| {
                let mut p = prefix.clone();
                p.push(n);
                p
            }));
        }
        paths = next;
    }
    Ok(paths)
}

/// Whether `dir` is a home directory: corral's own `$HOME`, or one named
/// in `/etc/passwd`. Only there are `~/` entries protected.
pub(crate) fn is_home_directory(dir: &Path) -> bool {
    let same = |home: &str| !home.is_empty() && Path::new(home) == dir;
    if std::env::var("HOME").is_ok_and(|h| same(h.trim_end_matches('/'))) {
        return true;
    }
    std::fs::read_to_string("/etc/passwd").is_ok_and(|passwd| {
        passwd
            .lines()
            .filter_map(|l| l.split(':').nth(5))
            .any(|h| same(h.trim_end_matches('/')))
    })
}

/// Adds `op` unless a step for the same destination exists; a read-only
/// step replaces a pin of the same path.
fn merge(ops: &mut Vec<MountOp>, op: MountOp) {
    match ops.iter_mut().find(|o| o.dest() == op.dest()) {
        Some(existing) => {
            if matches!(
                op,
                MountOp::Protect {
                    read_only: true,
                    ..
                }
            ) {
                *existing = op;
            }
        }
        None => ops.push(op),
    }
}

fn host_str(p: &Path) -> Result<String, PlanError> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| PlanError::Mount(format!("{} is not UTF-8", p.display())))
}

/// One read-only protected entry held for the run.
struct Held {
    /// The entry's parent directory (`O_PATH`).
    parent: OwnedFd,
    /// Its name there.
    name: CString,
    /// The entry, open for reading (holding the shared lock), when it is
    /// a regular file or directory.
    fd: Option<OwnedFd>,
    /// Whether it is a placeholder of corral's: removed after the run
    /// when still empty and no other run holds it.
    placeholder: bool,
    /// A directory.
    dir: bool,
}

/// The read-only protected entries of one run, with their placeholders:
/// made by [`Protection::prepare`] before the launch, undone by
/// [`Protection::finish`] (or on drop) after it.
#[derive(Default)]
pub struct Protection {
    held: Vec<Held>,
}

/// Why protected entries could not be prepared.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProtectError(String);

impl ProtectError {
    /// Stable error code.
    pub const CODE: &'static str = "mount.protect";
}

impl Protection {
    /// Creates the placeholders the plan's `mounts` need (owned like the
    /// directory they sit in), adopts stale ones, and takes a shared lock
    /// on every read-only entry.
    pub fn prepare(mounts: &[MountOp]) -> Result<Protection, ProtectError> {
        let mut out = Protection::default();
        for op in mounts {
            if let MountOp::Protect {
                source,
                read_only: true,
                dir,
                ..
            } = op
            {
                out.held.push(hold(source, *dir)?);
            }
        }
        Ok(out)
    }

    /// How many placeholders this run created or adopted.
    pub fn placeholders(&self) -> usize {
        self.held.iter().filter(|h| h.placeholder).count()
    }

    /// Removes this run's placeholders that are still empty and that no
    /// other run holds; releases every lock.
    pub fn finish(mut self) {
        self.release();
    }

    fn release(&mut self) {
        for h in self.held.drain(..) {
            if h.placeholder {
                remove_placeholder(&h);
            }
        }
    }
}

impl Drop for Protection {
    fn drop(&mut self) {
        self.release();
    }
}

const RESOLVE_HERE: u64 = m::RESOLVE_BENEATH | m::RESOLVE_NO_SYMLINKS | m::RESOLVE_NO_MAGICLINKS;

/// How long a run waits for an exclusive lock someone else holds on an
/// entry before it refuses: corral's own runs hold one only for the
/// moment of a removal; a sandbox that holds one (any process that can
/// open the entry can) must not hang the next run before its timeout
/// even starts.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Looks of one entry before it is held: a name replaced between the look
/// and the lock (a concurrent run removing a stale placeholder) is looked
/// at again, this many times.
const HOLD_ATTEMPTS: usize = 3;

fn hold(source: &str, dir: bool) -> Result<Held, ProtectError> {
    let path = Path::new(source);
    let refuse = |what: &str| {
        ProtectError(format!(
            "cannot protect {source}: {what}. Check the directory, or turn protection off \
             (`--no-protect`, or `protect = []` in the profile's [filesystem])"
        ))
    };
    let fail = |what: &str, e: corral_sys::Errno| refuse(&format!("{what}: {e}"));
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => return Err(fail("no parent directory", corral_sys::Errno(libc::EINVAL))),
    };
    let cpath = |p: &Path| {
        CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| ProtectError(format!("{source} contains a NUL byte")))
    };
    let parent = m::openat2(
        libc::AT_FDCWD,
        &cpath(parent)?,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        m::RESOLVE_NO_SYMLINKS | m::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| fail("opening its directory", e))?;
    let name = cpath(Path::new(name))?;
    let deadline = Instant::now() + LOCK_WAIT;
    for _ in 0..HOLD_ATTEMPTS {
        // `None`: replaced while it was being locked; look again.
        if let Some(looked) = hold_once(&parent, &name, dir, deadline, &refuse)? {
            return Ok(Held {
                parent,
                name,
                fd: looked.fd,
                placeholder: looked.placeholder,
                dir: looked.dir,
            });
        }
    }
    Err(refuse(
        "it was replaced each time corral locked it (another process renaming it?)",
    ))
}

/// What [`hold_once`] found and holds.
struct Looked {
    /// The entry, open and share-locked (a directory or regular file).
    fd: Option<OwnedFd>,
    /// A placeholder of corral's (made now, or an empty marked one).
    placeholder: bool,
    /// A directory.
    dir: bool,
}

/// One look at the entry `name` in `parent`: made as a placeholder when
/// missing, opened and share-locked when a directory or regular file.
/// `None` when the name no longer leads to the entry once it is locked.
fn hold_once(
    parent: &OwnedFd,
    name: &CString,
    dir: bool,
    deadline: Instant,
    refuse: &dyn Fn(&str) -> ProtectError,
) -> Result<Option<Looked>, ProtectError> {
    let fail = |what: &str, e: corral_sys::Errno| refuse(&format!("{what}: {e}"));
    // What a concurrent run (or a sandbox writing the directory) does
    // between two steps: made, removed or retyped the entry. Look again.
    let changed = |e: &corral_sys::Errno| {
        matches!(
            e.0,
            libc::ENOENT | libc::EEXIST | libc::ENOTDIR | libc::ELOOP
        )
    };
    let (fd, created) = match m::fstatat_nofollow(parent.as_fd(), name) {
        Err(e) if e.0 == libc::ENOENT => {
            let fd = match create_placeholder(parent, name, dir) {
                Ok(Some(fd)) => fd,
                Ok(None) => {
                    return Err(refuse(
                        "the directory corral made there was replaced at once \
                         (another process writing the directory?)",
                    ))
                }
                Err(e) if changed(&e) => return Ok(None),
                Err(e) => return Err(fail("creating a placeholder", e)),
            };
            // Given away and marked at once, through the descriptor of
            // what was made: a run refused from here on leaves a
            // placeholder the next run on the directory adopts and
            // removes, not a stray entry of root's.
            adopt_as_placeholder(parent, &fd)
                .map_err(|e| fail("giving it to the directory's owner", e))?;
            (fd, true)
        }
        Err(e) => return Err(fail("inspecting it", e)),
        Ok(st) if st.is_symlink() => {
            return Err(refuse(
                "it is a symlink (planted since the plan was made?); remove it",
            ))
        }
        Ok(st) if st.is_dir() || st.is_regular() => {
            let flags = libc::O_RDONLY
                | libc::O_NONBLOCK
                | libc::O_NOFOLLOW
                | libc::O_NOCTTY
                | if st.is_dir() { libc::O_DIRECTORY } else { 0 };
            match m::openat2(parent.as_raw_fd(), name, flags, 0, RESOLVE_HERE) {
                Ok(fd) => (fd, false),
                Err(e) if changed(&e) => return Ok(None),
                Err(e) => return Err(fail("opening it", e)),
            }
        }
        // Neither a directory nor a regular file: not opened, not locked.
        Ok(_) => {
            return Ok(Some(Looked {
                fd: None,
                placeholder: false,
                dir: false,
            }))
        }
    };
    lock_shared(&fd, deadline, refuse)?;
    // Still the entry at that name (a concurrent run may have removed a
    // stale placeholder between the look and the lock)?
    let now = m::fstatat_nofollow(parent.as_fd(), name);
    let held = m::fstat(fd.as_fd()).map_err(|e| fail("inspecting it", e))?;
    if !now.is_ok_and(|n| (n.dev, n.ino) == (held.dev, held.ino)) {
        if created {
            return Err(refuse(
                "it was replaced right after corral made it (another process writing the directory?)",
            ));
        }
        return Ok(None);
    }
    let placeholder = created || (is_marked(&fd) && is_empty(&fd, held.is_dir()));
    Ok(Some(Looked {
        fd: Some(fd),
        placeholder,
        dir: held.is_dir(),
    }))
}

/// Marks a placeholder just made (open at `fd`) as corral's, then, when
/// corral is root, gives it to the owner of `parent`, so the user can
/// remove one a killed corral left behind. Marked first: one left by a
/// failed chown is still adopted and removed by the next run. A
/// filesystem without user xattrs only loses that adoption.
fn adopt_as_placeholder(parent: &OwnedFd, fd: &OwnedFd) -> corral_sys::SysResult<()> {
    let _ = fd::set_xattr(fd.as_fd(), PLACEHOLDER_XATTR, b"1");
    if corral_sys::process::uids().1 == 0 {
        let dir_st = m::fstat(parent.as_fd())?;
        m::fchown(fd.as_fd(), dir_st.uid, dir_st.gid)?;
    }
    Ok(())
}

/// A shared lock on `fd`, waiting until `deadline` for an exclusive one
/// someone else holds.
fn lock_shared(
    fd: &OwnedFd,
    deadline: Instant,
    refuse: &dyn Fn(&str) -> ProtectError,
) -> Result<(), ProtectError> {
    loop {
        match fd::flock(fd.as_fd(), FlockMode::SharedNow) {
            Ok(()) => return Ok(()),
            Err(e) if e.0 == libc::EWOULDBLOCK && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.0 == libc::EWOULDBLOCK => {
                return Err(refuse(&format!(
                    "another process kept an exclusive lock on it through corral's wait ({} s; \
                     a sandbox of a run still going?)",
                    LOCK_WAIT.as_secs()
                )))
            }
            Err(e) => return Err(refuse(&format!("locking it: {e}"))),
        }
    }
}

/// Makes the placeholder `name` in `parent` (a directory, else an empty
/// file) and returns it open for reading: a file through the descriptor
/// that created it; a directory opened by name after `mkdirat` (which
/// returns none), `None` when what is there then does not look just made
/// ([`is_fresh_dir`]): something was swapped in, which corral must not
/// give away.
fn create_placeholder(
    parent: &OwnedFd,
    name: &CString,
    dir: bool,
) -> corral_sys::SysResult<Option<OwnedFd>> {
    if !dir {
        return m::openat2(
            parent.as_raw_fd(),
            name,
            libc::O_CREAT | libc::O_EXCL | libc::O_RDONLY | libc::O_NOFOLLOW,
            0o644,
            RESOLVE_HERE,
        )
        .map(Some);
    }
    m::mkdirat(parent.as_raw_fd(), name, 0o755)?;
    let fd = m::openat2(
        parent.as_raw_fd(),
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
        RESOLVE_HERE,
    )?;
    Ok(is_fresh_dir(parent, &fd).then_some(fd))
}

/// Whether the directory open at `fd` looks as `mkdirat` in `parent` just
/// left it: empty, without corral's mark, and, when corral is root (and
/// gives it away next), root's or already the parent's owner's (a
/// filesystem mounted with a fixed owner makes it so). What else passes,
/// an empty unmarked directory of root's renamed in from the same
/// directory, is harmless to give away.
fn is_fresh_dir(parent: &OwnedFd, fd: &OwnedFd) -> bool {
    let Ok(st) = m::fstat(fd.as_fd()) else {
        return false;
    };
    let owner_ok = corral_sys::process::uids().1 != 0
        || st.uid == 0
        || m::fstat(parent.as_fd()).is_ok_and(|p| (p.uid, p.gid) == (st.uid, st.gid));
    st.is_dir() && owner_ok && is_empty(fd, true) && !is_marked(fd)
}

fn is_marked(fd: &OwnedFd) -> bool {
    fd::get_xattr(fd.as_fd(), PLACEHOLDER_XATTR, 8).is_ok_and(|v| v == b"1")
}

/// A regular file of 0 bytes, or a directory without entries.
fn is_empty(fd: &OwnedFd, dir: bool) -> bool {
    if dir {
        // A fresh fd: the held one's offset must not move.
        let Ok(d) = m::openat2(
            fd.as_raw_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            RESOLVE_HERE,
        ) else {
            return false;
        };
        m::read_dir_names(d.as_fd(), 1).is_ok_and(|(names, more)| names.is_empty() && !more)
    } else {
        m::fstat(fd.as_fd()).is_ok_and(|st| st.size == 0)
    }
}

/// Removes a placeholder if no other run holds it and it is still the
/// empty object this run held; anything else stays (nothing is lost).
fn remove_placeholder(h: &Held) {
    let Some(fd) = &h.fd else { return };
    if fd::flock(fd.as_fd(), FlockMode::ExclusiveNow).is_err() {
        return;
    }
    let (Ok(now), Ok(held)) = (
        m::fstatat_nofollow(h.parent.as_fd(), &h.name),
        m::fstat(fd.as_fd()),
    ) else {
        return;
    };
    if (now.dev, now.ino) != (held.dev, held.ino) || !is_empty(fd, h.dir) {
        return;
    }
    let _ = m::unlinkat(h.parent.as_fd(), &h.name, h.dir);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use corral_policy::protect::default_protect;

    fn dest(s: &str) -> SandboxPath {
        SandboxPath::new(s).unwrap()
    }

    /// (dest, read_only, dir) of each step, in order.
    fn shape(ops: &[MountOp]) -> Vec<(String, bool, bool)> {
        ops.iter()
            .map(|op| match op {
                MountOp::Protect {
                    dest,
                    read_only,
                    dir,
                    ..
                } => (dest.to_string(), *read_only, *dir),
                other => panic!("not a protect step: {other:?}"),
            })
            .collect()
    }

    fn entries(list: &[&str]) -> Vec<ProtectEntry> {
        list.iter()
            .map(|e| ProtectEntry::parse(e).unwrap())
            .collect()
    }

    #[test]
    fn existing_entries_are_bound_read_only_and_their_parents_pinned() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".git/hooks")).unwrap();
        std::fs::write(root.path().join(".git/config"), "").unwrap();
        let ops = plan_protect(
            root.path(),
            &dest("/workspace"),
            &entries(&[".git/hooks", ".git/config", ".mcp.json"]),
            false,
        )
        .unwrap();
        assert_eq!(
            shape(&ops),
            vec![
                ("/workspace/.git".into(), false, true),
                ("/workspace/.git/hooks".into(), true, true),
                ("/workspace/.git/config".into(), true, true),
                // Missing: a placeholder directory.
                ("/workspace/.mcp.json".into(), true, true),
            ]
        );
    }

    #[test]
    fn a_missing_parent_is_protected_whole() {
        let root = tempfile::tempdir().unwrap();
        let ops = plan_protect(
            root.path(),
            &dest("/workspace"),
            &entries(&[".git/hooks", ".git/config"]),
            false,
        )
        .unwrap();
        assert_eq!(shape(&ops), vec![("/workspace/.git".into(), true, true)]);
    }

    #[test]
    fn a_gitfile_is_protected_itself() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(".git"), "gitdir: ../x\n").unwrap();
        let ops = plan_protect(root.path(), &dest("/w"), &default_protect(), false).unwrap();
        assert!(shape(&ops).contains(&("/w/.git".into(), true, true)));
        assert!(!shape(&ops).iter().any(|(d, ..)| d.starts_with("/w/.git/")));
    }

    #[test]
    fn home_entries_count_only_in_a_home_directory_and_stand_in_as_files() {
        let root = tempfile::tempdir().unwrap();
        let list = entries(&["~/.bashrc", ".vscode"]);
        let project = plan_protect(root.path(), &dest("/w"), &list, false).unwrap();
        assert_eq!(shape(&project), vec![("/w/.vscode".into(), true, true)]);
        let home = plan_protect(root.path(), &dest("/w"), &list, true).unwrap();
        assert_eq!(
            shape(&home),
            vec![
                ("/w/.bashrc".into(), true, false),
                ("/w/.vscode".into(), true, true)
            ]
        );
    }

    #[test]
    fn a_symlinked_entry_or_parent_is_refused() {
        for link in [".vscode", ".git"] {
            let root = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink("/etc", root.path().join(link)).unwrap();
            let err =
                plan_protect(root.path(), &dest("/w"), &default_protect(), false).unwrap_err();
            assert_eq!(err.code(), "mount.protect_symlink", "{link}: {err}");
            assert!(err.to_string().contains("--no-protect"), "{err}");
        }
    }

    #[test]
    fn a_wildcard_protects_what_exists_and_makes_no_placeholder() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".git/modules/lib/hooks")).unwrap();
        std::fs::create_dir_all(root.path().join(".git/modules/ui")).unwrap();
        std::fs::write(root.path().join(".git/modules/ui/config"), "").unwrap();
        let ops = plan_protect(
            root.path(),
            &dest("/w"),
            &entries(&[".git/modules/*/hooks", ".git/modules/*/config"]),
            false,
        )
        .unwrap();
        assert_eq!(
            shape(&ops),
            vec![
                ("/w/.git".into(), false, true),
                ("/w/.git/modules".into(), false, true),
                ("/w/.git/modules/lib".into(), false, true),
                ("/w/.git/modules/lib/hooks".into(), true, true),
                ("/w/.git/modules/ui".into(), false, true),
                ("/w/.git/modules/ui/config".into(), true, true),
            ]
        );
        let none = tempfile::tempdir().unwrap();
        let ops = plan_protect(
            none.path(),
            &dest("/w"),
            &entries(&[".git/modules/*/hooks"]),
            false,
        )
        .unwrap();
        assert!(ops.is_empty(), "{ops:?}");
        std::os::unix::fs::symlink("/etc", root.path().join(".git/modules/evil")).unwrap();
        let err = plan_protect(
            root.path(),
            &dest("/w"),
            &entries(&[".git/modules/*/config"]),
            false,
        )
        .unwrap_err();
        assert_eq!(err.code(), "mount.protect_symlink");
    }

    #[test]
    fn a_read_only_entry_covers_what_lies_below_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".git/hooks")).unwrap();
        let ops = plan_protect(
            root.path(),
            &dest("/w"),
            &entries(&[".git/hooks", ".git"]),
            false,
        )
        .unwrap();
        assert_eq!(shape(&ops), vec![("/w/.git".into(), true, true)]);
    }

    fn plan_for(root: &Path, list: &[&str]) -> Vec<MountOp> {
        plan_protect(root, &dest("/w"), &entries(list), false).unwrap()
    }

    #[test]
    fn placeholders_are_made_marked_and_removed_when_empty() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(".idea"), "the user's").unwrap();
        let plan = plan_for(root.path(), &[".mcp.json", ".cursor", ".idea"]);
        let protection = Protection::prepare(&plan).unwrap();
        assert_eq!(protection.placeholders(), 2);
        assert!(root.path().join(".mcp.json").is_dir());
        assert!(root.path().join(".cursor").is_dir());
        // Something written into a placeholder meanwhile is never lost.
        std::fs::write(root.path().join(".cursor/kept"), "x").unwrap();
        protection.finish();
        assert!(!root.path().join(".mcp.json").exists());
        assert!(root.path().join(".cursor/kept").exists());
        assert_eq!(
            std::fs::read_to_string(root.path().join(".idea")).unwrap(),
            "the user's"
        );
    }

    #[test]
    fn a_placeholder_another_run_holds_stays() {
        let root = tempfile::tempdir().unwrap();
        let plan = plan_for(root.path(), &[".mcp.json"]);
        let first = Protection::prepare(&plan).unwrap();
        let second = Protection::prepare(&plan).unwrap();
        // The second run found the first one's placeholder and adopted it.
        assert_eq!(second.placeholders(), 1);
        first.finish();
        assert!(root.path().join(".mcp.json").is_dir(), "removed while held");
        second.finish();
        assert!(!root.path().join(".mcp.json").exists(), "left behind");
    }

    #[test]
    fn an_entry_another_process_keeps_locked_refuses_the_run_after_a_bounded_wait() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(".cursor")).unwrap();
        let plan = plan_for(root.path(), &[".cursor"]);
        // What a sandbox could do to an entry of its workdir.
        let entry = std::fs::File::open(root.path().join(".cursor")).unwrap();
        fd::flock(entry.as_fd(), FlockMode::ExclusiveNow).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Protection::prepare(&plan).err().map(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the run waited on the lock without bound");
        let err = err.expect("held despite another process's exclusive lock");
        assert!(err.contains("exclusive lock"), "{err}");
        assert!(err.contains(".cursor"), "{err}");
    }

    #[test]
    fn a_placeholder_is_chowned_only_when_it_looks_just_made() {
        let root = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            m::openat2(
                libc::AT_FDCWD,
                &CString::new(root.path().join(name).to_str().unwrap()).unwrap(),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
                0,
            )
            .unwrap()
        };
        let parent = open(".");
        std::fs::create_dir(root.path().join("fresh")).unwrap();
        assert!(is_fresh_dir(&parent, &open("fresh")));
        // Swapped in instead: something with content, corral's mark, or
        // another user's directory.
        std::fs::create_dir_all(root.path().join("full/x")).unwrap();
        assert!(!is_fresh_dir(&parent, &open("full")));
        std::fs::create_dir(root.path().join("marked")).unwrap();
        fd::set_xattr(open("marked").as_fd(), PLACEHOLDER_XATTR, b"1").unwrap();
        assert!(!is_fresh_dir(&parent, &open("marked")));
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        // As root only, where 4242 is mapped (not in every user namespace).
        if corral_sys::process::uids().1 == 0
            && std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).is_ok()
        {
            assert!(!is_fresh_dir(&parent, &open("theirs")));
        }
    }
}

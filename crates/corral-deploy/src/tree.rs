//! The host side of a tree: hashing and copying the source, the staging
//! directory that becomes the tree or disappears, and pinning the result
//! read-only. Nothing here follows a symlink the source or a phase made.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::DeployError;

/// Entries never copied from the source: version control and caches
/// anywhere; at the top, what the phases make and corral's own files.
const SKIP_ANYWHERE: &[&str] = &[".git", ".hg", ".svn", "__pycache__"];
const SKIP_TOP: &[&str] = &[
    ".venv",
    "node_modules",
    ".corral",
    crate::manifest::MANIFEST_FILE,
];

/// Hex of a SHA-256.
pub(crate) fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`, in hex.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    hex(Sha256::digest(bytes))
}

/// SHA-256 of a regular file (not through a link), in hex.
pub(crate) fn file_sha256(path: &Path) -> Option<String> {
    if !std::fs::symlink_metadata(path).ok()?.is_file() {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(hex(h.finalize()))
}

/// Writes a new file (mode 0644); an existing name, link or not, is an
/// error rather than something written through.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> Result<(), DeployError> {
    write_new_mode(path, bytes, 0o644)
}

/// [`write_new`] with another mode.
pub(crate) fn write_new_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DeployError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| DeployError::io(format!("creating {}", path.display()), e))?;
    f.write_all(bytes)
        .map_err(|e| DeployError::io(format!("writing {}", path.display()), e))
}

/// Who owns what corral creates in the staging directory: the sandbox's
/// identity when corral is root (so the phase can write it), else nobody
/// is changed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner(pub Option<(u32, u32)>);

impl Owner {
    fn apply(self, path: &Path) -> Result<(), DeployError> {
        if let Some((uid, gid)) = self.0 {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))
                .map_err(|e| DeployError::io(format!("chown {}", path.display()), e))?;
        }
        Ok(())
    }
}

fn source_err(path: &Path, reason: impl Into<String>) -> DeployError {
    DeployError::Source {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A symlink target that stays inside the tree from `rel` (the link's
/// path relative to the root): relative, and never climbing above it.
fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth = rel.components().count().saturating_sub(1);
    for c in target.components() {
        match c {
            std::path::Component::ParentDir => {
                if depth == 0 {
                    return false;
                }
                depth -= 1;
            }
            std::path::Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    true
}

/// Walks `src` in name order, hashing every entry corral would copy, and
/// copies it into `dst` when given. Symlinks are copied as links, only
/// when they stay inside the source; devices, sockets and FIFOs are
/// refused.
pub(crate) fn hash_and_copy(
    src: &Path,
    dst: Option<&Path>,
    owner: Owner,
) -> Result<String, DeployError> {
    let mut h = Sha256::new();
    walk(src, src, dst, owner, &mut h)?;
    Ok(hex(h.finalize()))
}

fn walk(
    root: &Path,
    dir: &Path,
    dst: Option<&Path>,
    owner: Owner,
    h: &mut Sha256,
) -> Result<(), DeployError> {
    let rd = std::fs::read_dir(dir).map_err(|e| source_err(dir, format!("cannot list it: {e}")))?;
    let mut names: Vec<std::ffi::OsString> = rd
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| source_err(dir, format!("cannot list it: {e}")))?;
    names.sort();
    let top = dir == root;
    for name in names {
        let n = name.to_string_lossy();
        if SKIP_ANYWHERE.contains(&n.as_ref()) || (top && SKIP_TOP.contains(&n.as_ref())) {
            continue;
        }
        let path = dir.join(&name);
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        let rel_text = rel
            .to_str()
            .ok_or_else(|| source_err(&path, "the name is not UTF-8; rename it"))?;
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| source_err(&path, format!("cannot read it: {e}")))?;
        let out: Option<PathBuf> = dst.map(|d| d.join(&rel));
        let ft = meta.file_type();
        if ft.is_dir() {
            h.update(format!("D\0{rel_text}\0"));
            if let Some(o) = &out {
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(o)
                    .map_err(|e| DeployError::io(format!("creating {}", o.display()), e))?;
                owner.apply(o)?;
            }
            walk(root, &path, dst, owner, h)?;
        } else if ft.is_file() {
            let exec = meta.mode() & 0o111 != 0;
            let mut f = std::fs::File::open(&path)
                .map_err(|e| source_err(&path, format!("cannot read it: {e}")))?;
            let opened = f
                .metadata()
                .map_err(|e| source_err(&path, format!("cannot read it: {e}")))?;
            if opened.ino() != meta.ino() || opened.dev() != meta.dev() {
                return Err(DeployError::SourceChanged(root.to_path_buf()));
            }
            h.update(format!(
                "F\0{rel_text}\0{}\0{}\0",
                u8::from(exec),
                meta.len()
            ));
            let mut writer = match &out {
                Some(o) => Some(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(if exec { 0o755 } else { 0o644 })
                        .open(o)
                        .map_err(|e| DeployError::io(format!("creating {}", o.display()), e))?,
                ),
                None => None,
            };
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0u64;
            loop {
                let n = f
                    .read(&mut buf)
                    .map_err(|e| source_err(&path, format!("cannot read it: {e}")))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                h.update(&buf[..n]);
                if let Some(w) = writer.as_mut() {
                    w.write_all(&buf[..n])
                        .map_err(|e| DeployError::io(format!("writing {}", rel.display()), e))?;
                }
            }
            if total != meta.len() {
                return Err(DeployError::SourceChanged(root.to_path_buf()));
            }
            if let Some(o) = &out {
                owner.apply(o)?;
            }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path)
                .map_err(|e| source_err(&path, format!("cannot read the link: {e}")))?;
            if !link_stays_inside(&rel, &target) {
                return Err(source_err(
                    &path,
                    format!(
                        "a symlink to {}, outside the source; corral copies only links that stay inside it. Replace it with the file",
                        target.display()
                    ),
                ));
            }
            h.update(format!("L\0{rel_text}\0{}\0", target.display()));
            if let Some(o) = &out {
                std::os::unix::fs::symlink(&target, o)
                    .map_err(|e| DeployError::io(format!("creating {}", o.display()), e))?;
                owner.apply(o)?;
            }
        } else {
            return Err(source_err(
                &path,
                "a device, socket or FIFO; a source holds only files, directories and links",
            ));
        }
    }
    Ok(())
}

/// Applies `f` to every entry under `root` (root included), directories
/// before their contents, never following a link. `before_read` runs on a
/// directory before it is listed (to make it listable).
fn visit(
    root: &Path,
    f: &mut dyn FnMut(&Path, &std::fs::Metadata) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(root)?;
    f(root, &meta)?;
    if meta.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(root)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for n in names {
            visit(&root.join(n), f)?;
        }
    }
    Ok(())
}

/// Pins a finished tree: no write bit anywhere (directories 0555, files
/// keep their read and execute bits), and owned by root when corral is
/// root, so no sandbox identity can change it afterwards.
pub(crate) fn make_read_only(root: &Path, to_root: bool) -> Result<(), DeployError> {
    visit(root, &mut |p, m| {
        if to_root {
            std::os::unix::fs::lchown(p, Some(0), Some(0))?;
        }
        if m.file_type().is_symlink() {
            return Ok(());
        }
        let mode = if m.is_dir() {
            0o555
        } else {
            // setuid/setgid never survive into a tree.
            (m.mode() & 0o555) | 0o444
        };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
    })
    .map_err(|e| DeployError::io(format!("making {} read-only", root.display()), e))
}

/// Removes a tree corral made (staging, or a replaced tree), whatever
/// modes a phase or [`make_read_only`] left in it.
pub(crate) fn remove_tree(root: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(root) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return std::fs::remove_file(root),
        Ok(_) => {}
    }
    // Directories must be writable and listable to empty them.
    let _ = visit(root, &mut |p, m| {
        if m.is_dir() {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    });
    std::fs::remove_dir_all(root)
}

/// The disk space a directory tree takes: allocated blocks, each inode
/// once (hard links), never following a link; what vanishes while it is
/// walked (a phase is writing) is skipped. Walked with a stack, so a
/// deeply nested tree cannot overflow corral's. The walk ends early once
/// the total passes `cap` or `stop` is set: while a phase runs, it could
/// swap a directory for a link between two steps and lead the walk
/// elsewhere, which then costs at most a spurious quota failure of its
/// own deployment, and never keeps the walk going after the phase.
pub(crate) fn disk_usage(
    root: &Path,
    cap: u64,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total: u64 = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if total > cap || stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
            break;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.nlink() <= 1 || seen.insert((m.dev(), m.ino())) {
            total = total.saturating_add(m.blocks().saturating_mul(512));
        }
        if m.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hash_is_stable_and_sees_changes_and_copy_matches() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path().join("src");
        std::fs::create_dir_all(s.join("pkg/.git")).unwrap();
        std::fs::write(s.join("pkg/a.py"), "x").unwrap();
        std::fs::write(s.join("pkg/.git/HEAD"), "x").unwrap();
        std::fs::create_dir_all(s.join("node_modules/x")).unwrap();
        std::os::unix::fs::symlink("pkg/a.py", s.join("link")).unwrap();
        let h1 = hash_and_copy(&s, None, Owner(None)).unwrap();
        assert_eq!(h1, hash_and_copy(&s, None, Owner(None)).unwrap());
        // Skipped entries do not count.
        std::fs::write(s.join("node_modules/x/y"), "z").unwrap();
        assert_eq!(h1, hash_and_copy(&s, None, Owner(None)).unwrap());
        let out = d.path().join("out");
        std::fs::create_dir(&out).unwrap();
        assert_eq!(h1, hash_and_copy(&s, Some(&out), Owner(None)).unwrap());
        assert_eq!(std::fs::read_to_string(out.join("pkg/a.py")).unwrap(), "x");
        assert!(!out.join("pkg/.git").exists());
        assert!(!out.join("node_modules").exists());
        assert_eq!(
            std::fs::read_link(out.join("link")).unwrap(),
            Path::new("pkg/a.py")
        );
        // Content and the executable bit count.
        std::fs::write(s.join("pkg/a.py"), "y").unwrap();
        let h2 = hash_and_copy(&s, None, Owner(None)).unwrap();
        assert_ne!(h1, h2);
        std::fs::set_permissions(s.join("pkg/a.py"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        assert_ne!(h2, hash_and_copy(&s, None, Owner(None)).unwrap());
        // Links leaving the source are refused.
        std::os::unix::fs::symlink("../../etc/passwd", s.join("pkg/bad")).unwrap();
        let e = hash_and_copy(&s, None, Owner(None)).unwrap_err();
        assert_eq!(e.code(), "deploy.source");
        assert!(e.to_string().contains("outside the source"), "{e}");
        // The tree is pinned, and removable again.
        std::fs::remove_file(s.join("pkg/bad")).unwrap();
        make_read_only(&out, false).unwrap();
        assert!(std::fs::write(out.join("pkg/new"), "x").is_err() || is_root());
        assert_eq!(
            std::fs::metadata(out.join("pkg")).unwrap().mode() & 0o777,
            0o555
        );
        remove_tree(&out).unwrap();
        assert!(!out.exists());
    }

    fn is_root() -> bool {
        std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    }

    #[test]
    fn links_inside() {
        assert!(link_stays_inside(Path::new("a/b"), Path::new("../c")));
        assert!(!link_stays_inside(Path::new("a/b"), Path::new("../../c")));
        assert!(!link_stays_inside(Path::new("a"), Path::new("/etc")));
        assert!(link_stays_inside(Path::new("a"), Path::new("x/../y")));
    }

    #[test]
    fn disk_usage_counts_blocks_once() {
        let d = tempfile::tempdir().unwrap();
        let all = |p: &Path| disk_usage(p, u64::MAX, None);
        let empty = all(d.path());
        std::fs::write(d.path().join("a"), vec![1u8; 1 << 20]).unwrap();
        let one = all(d.path());
        assert!(one >= empty + (1 << 20), "{empty} {one}");
        std::fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("c")).unwrap();
        let linked = all(d.path());
        assert!(linked < one + 8192, "{one} {linked}");
        // A sparse file takes what it allocated, not its length.
        let f = std::fs::File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        assert!(all(d.path()) < linked + (1 << 20));
        // Past the cap, or stopped, the walk ends early.
        std::fs::create_dir(d.path().join("z")).unwrap();
        std::fs::write(d.path().join("z/more"), vec![1u8; 1 << 20]).unwrap();
        assert!(disk_usage(d.path(), 0, None) < all(d.path()));
        let stop = std::sync::atomic::AtomicBool::new(true);
        assert_eq!(disk_usage(d.path(), u64::MAX, Some(&stop)), 0);
    }
}

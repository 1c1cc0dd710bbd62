//! Tests of the workspace rules, against real directories.

use super::paths::invalid;
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
        Workspace::create(&self.base(), None, None).unwrap()
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
    r.unwrap_err().code().as_str()
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
        Workspace::create(&s.top.join("missing"), None, None)
            .unwrap_err()
            .code()
            .as_str(),
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
    assert_eq!(err.code().as_str(), "path.invalid");
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
        let read = ws2.read_file("pipe", 100).map_err(|e| e.code().as_str());
        let write = ws2
            .write_file("pipe", b"x", &LIMITS)
            .map_err(|e| e.code().as_str());
        let collected = ws2
            .collect("output", 10, 100)
            .map_err(|e| e.code().as_str());
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
    assert_eq!((err.code().as_str(), err.path()), ("file.too_large", "big"));
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
    std::os::unix::fs::symlink(s.outside().join("secret"), ws.path().join("file-link")).unwrap();
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
    assert_eq!(ws.remove().unwrap_err().code().as_str(), "path.invalid");
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
    let ws = Workspace::create(&s.base(), Some((4242, 4242)), None).unwrap();
    assert_eq!(ws.owner, Some((4242, 4242)));
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
    let mut codes: Vec<_> = all.iter().map(|e| e.code().as_str()).collect();
    codes.sort();
    codes.dedup();
    assert_eq!(codes.len(), all.len());
    // The path in messages is escaped: a NUL or newline cannot forge log lines.
    let e = invalid("a\nb\0", "r");
    assert!(e.to_string().starts_with("\"a\\nb\\0\""));
}

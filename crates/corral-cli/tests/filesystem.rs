//! The sandbox's filesystem: read-only system, one writable workspace,
//! private /tmp, no host secrets, no symlink escapes.

mod common;
use common::*;

#[test]
fn writes_outside_the_workspace_and_tmp_fail() {
    let script = "import os\n\
        for p in ['/usr/corral-x', '/etc/corral-x', '/corral-x', '/bin/corral-x', '/dev/corral-x', '/proc/corral-x', '/proc/sys/kernel/hostname']:\n\
        \x20   try:\n\
        \x20       open(p, 'w').write('x')\n\
        \x20       print('WROTE', p)\n\
        \x20   except OSError as e:\n\
        \x20       print('denied', p, e.errno)\n\
        open('/workspace/ok', 'w').write('x'); open('/tmp/ok', 'w').write('x')\n\
        print('workspace+tmp ok')\n";
    let s = py(script);
    assert!(!s.contains("WROTE"), "{s}");
    assert_eq!(s.matches("denied").count(), 7, "{s}");
    assert!(s.contains("workspace+tmp ok"), "{s}");
    assert!(!std::path::Path::new("/usr/corral-x").exists());
}

#[test]
fn host_secrets_and_root_only_files_are_unreadable() {
    // /etc/shadow is not in the sandbox at all.
    let (code, _, _) = sh("test -e /etc/shadow");
    assert_eq!(code, 1);
    // The generated /etc/passwd holds no host accounts.
    let (_, passwd, _) = sh("cat /etc/passwd");
    assert!(!passwd.contains("root:"), "{passwd}");
    // Even when a root-only file is bound in on purpose, the program (never
    // host root) cannot read it.
    let out = run(
        &["--ro", "/etc/shadow:/data/shadow"],
        &["sh", "-c", "cat /data/shadow"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    if is_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root-only").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let ro = format!("{}:/data", dir.path().display());
        let out = run(&["--ro", &ro], &["sh", "-c", "cat /data/secret"]);
        assert!(!text(&out.stdout).contains("root-only"));
        assert!(text(&out.stderr).contains("Permission denied"));
    }
}

#[test]
fn workdir_is_bound_read_write_at_workspace() {
    let dir = workdir();
    std::fs::write(dir.path().join("input.txt"), "from host").unwrap();
    let out = run(
        &["--workdir", dir.path().to_str().unwrap()],
        &[
            "sh",
            "-c",
            "pwd; cat input.txt; echo from sandbox > output.txt",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        "/workspace\nfrom host",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("output.txt")).unwrap(),
        "from sandbox\n"
    );
}

#[test]
fn root_owned_writable_dirs_are_refused_when_corral_is_root() {
    if !is_root() {
        eprintln!("unprivileged pass: the program runs as the invoking user; no idmap is involved");
        return;
    }
    // Through an idmap, files created there would be root-owned on the
    // host: a chmod 4755 inside would plant a setuid-root binary.
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &["--workdir", dir.path().to_str().unwrap()],
        &["sh", "-c", "echo x > f; chmod 4755 f"],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("owned by root"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("f").exists());
    let rw = format!("{}:/out", dir.path().display());
    let out = run(&["--rw", &rw], &["sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125));
}

/// The refusal above suggests a command to type. It names the directory
/// as one shell word (a space or `;` in the name would make the pasted
/// `chown` act on other paths), and for a system directory it suggests no
/// `chown` at all: `chown 65534:65534 /etc`, pasted, breaks the host.
#[test]
fn the_suggested_chown_is_quoted_and_never_for_a_system_directory() {
    if !is_root() {
        eprintln!("unprivileged pass: the program runs as the invoking user; no idmap is involved");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("my project;x");
    std::fs::create_dir(&odd).unwrap();
    let out = run(&["--workdir", odd.to_str().unwrap()], &["sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let expected = format!("`chown 65534:65534 '{}'`", odd.display());
    assert!(
        text(&out.stderr).contains(&expected),
        "{}",
        text(&out.stderr)
    );
    for system in ["/etc", "/"] {
        let out = run(&["--workdir", system], &["sh", "-c", "true"]);
        assert_eq!(out.status.code(), Some(125), "{system}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("owned by root"), "{system}: {stderr}");
        assert!(!stderr.contains("chown"), "{system}: {stderr}");
        assert!(
            stderr.contains("never change the owner of a system or top-level directory"),
            "{system}: {stderr}"
        );
    }
}

#[test]
fn default_workspace_is_fresh_and_gone_afterwards() {
    assert_eq!(
        sh("ls -A /workspace; echo x > /workspace/f; cat /workspace/f").1,
        "x\n"
    );
    assert_eq!(
        sh("ls -A /workspace").1,
        "",
        "a second run must not see the first one's files"
    );
}

#[test]
fn symlinks_in_the_workspace_cannot_reach_host_files() {
    let dir = workdir();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("etc-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out-link")).unwrap();
    let out = run(
        &["--workdir", dir.path().to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo pwned > etc-link/corral-pwned; echo pwned > out-link/pwned; ls etc-link/shadow",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!std::path::Path::new("/etc/corral-pwned").exists());
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "a write landed outside the workspace"
    );
}

#[test]
fn mounts_never_follow_symlinks_planted_in_the_workspace() {
    let dir = workdir();
    let target = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(target.path(), dir.path().join("sub")).unwrap();
    let out = run(
        &[
            "--workdir",
            dir.path().to_str().unwrap(),
            "--ro",
            "/usr/share:/workspace/sub/x",
        ],
        &["sh", "-c", "true"],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("symlink"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
}

#[test]
fn a_file_bound_over_an_existing_entry_of_the_workdir_leaves_it_untouched() {
    use std::os::unix::fs::PermissionsExt;
    let dir = workdir();
    let host = workdir();
    let source = host.path().join("cfg.json");
    std::fs::write(&source, "from the bind").unwrap();
    let workdir_flag = dir.path().to_str().unwrap();
    // `--ro SOURCE:/workspace/AT`, then `script` in the sandbox.
    let run_bound = |source: &str, at: &str, script: &str| {
        let bind = format!("{source}:/workspace/{at}");
        run(
            &["--workdir", workdir_flag, "--ro", &bind, "--timeout", "20"],
            &["sh", "-c", script],
        )
    };
    let reads_the_bind = |at: &str| {
        let out = run_bound(source.to_str().unwrap(), at, &format!("cat {at}"));
        assert_eq!(
            (out.status.code(), text(&out.stdout)),
            (Some(0), "from the bind".to_owned()),
            "{at}: {}",
            text(&out.stderr)
        );
    };
    let refused = |source: &str, at: &str, why: &str| {
        let out = run_bound(source, at, "true");
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
    };
    // A file nobody may write sits where the file is bound: the mount
    // point exists, so the run needs no write access to it.
    let kept = dir.path().join("cfg.json");
    std::fs::write(&kept, "kept").unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o444)).unwrap();
    reads_the_bind("cfg.json");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "kept");
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o444);
    // A FIFO (one an earlier sandbox left there): opened for writing, it
    // would hold the run's setup until something read it.
    let fifo = std::ffi::CString::new(dir.path().join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: `fifo` is NUL-terminated and alive for the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    reads_the_bind("pipe");
    // A directory where a file is bound cannot be its mount point, nor a
    // file where a directory is: the run is refused, saying so, and what
    // is there stays as it was.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a"), "a").unwrap();
    refused(
        source.to_str().unwrap(),
        "sub",
        "/workspace/sub is a directory",
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("sub/a")).unwrap(),
        "a"
    );
    refused("/usr/share", "cfg.json", "a file is in the way");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "kept");
}

#[test]
fn extra_binds_are_read_only_or_read_write_as_asked() {
    let ro = workdir();
    let rw = workdir();
    std::fs::write(ro.path().join("a"), "A").unwrap();
    let ro_flag = format!("{}:/in", ro.path().display());
    let rw_flag = format!("{}:/out", rw.path().display());
    let out = run(
        &["--ro", &ro_flag, "--rw", &rw_flag],
        &[
            "sh",
            "-c",
            "cat /in/a; echo x > /in/b || echo ro-denied; echo y > /out/c && echo rw-ok",
        ],
    );
    let s = text(&out.stdout);
    assert!(
        s.starts_with('A') && s.contains("ro-denied") && s.contains("rw-ok"),
        "{s} {}",
        text(&out.stderr)
    );
    assert!(!ro.path().join("b").exists());
    assert_eq!(std::fs::read_to_string(rw.path().join("c")).unwrap(), "y\n");
}

#[test]
fn denied_paths_are_hidden() {
    let (_d, cfg) = config("[profile.d]\nextends = \"code\"\n[profile.d.filesystem]\ndeny = [\"/usr/share/doc\", \"/etc/nsswitch.conf\"]\n");
    let out = run(
        &["--config", cfg.to_str().unwrap(), "--profile", "d"],
        &["sh", "-c", "ls /usr/share/doc | wc -l; cat /etc/nsswitch.conf && echo readable; echo x > /usr/share/doc/x || echo write-denied"],
    );
    let s = text(&out.stdout);
    assert!(s.starts_with("0\n"), "{s} {}", text(&out.stderr));
    assert!(!s.contains("readable") && s.contains("write-denied"), "{s}");
}

/// `/` and `/dev` are directories of corral's scratch tmpfs, made with
/// `mkdir`: their mode is 0755 all the same when corral runs under a
/// restrictive umask (it was a tmpfs's `mode=0755` before).
#[test]
fn root_and_dev_are_0755_whatever_the_umask() {
    let out = corral_run_via_bash("umask 077; exec \"$@\"", &[])
        .args(["--", "sh", "-c", "stat -c %a / /dev"])
        .output()
        .expect("spawn corral");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "755\n755\n");
}

#[test]
fn dev_is_minimal_and_tmp_is_private() {
    let (code, out, err) =
        sh("ls /dev | tr '\\n' ' '; echo; echo hi > /dev/null && head -c 4 /dev/urandom | wc -c");
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let devs = lines.next().unwrap();
    assert_eq!(
        devs.trim(),
        "fd full null random shm stderr stdin stdout urandom zero",
        "{out}"
    );
    assert_eq!(lines.next(), Some("4"));
    let marker = tempfile::Builder::new()
        .prefix("corral-host-tmp-")
        .tempfile_in("/tmp")
        .unwrap();
    let name = marker
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let (code, _, _) = sh(&format!("test -e /tmp/{name}"));
    assert_eq!(code, 1, "host /tmp is visible in the sandbox");
}

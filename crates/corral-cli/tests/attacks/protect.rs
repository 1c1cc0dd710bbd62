//! Protected entries of writable binds (`filesystem.protect`): a sandbox
//! that may write a project directory still cannot plant what the user
//! runs later outside any sandbox — git hooks and config, shell start-up
//! files, editor and agent configuration — by writing, replacing,
//! removing, renaming (the entry or its parent), swapping in a symlink, or
//! creating a missing one. The checks Codex and sandbox-runtime make of
//! their own protected paths, ported here.

use crate::common::*;
use crate::support::*;

use std::path::Path;
use std::process::Command;

/// The default list's project entries (`corral explain` prints it), the
/// directories marked with `/` for the attack's write attempt.
const PROJECT_ENTRIES: &[&str] = &[
    ".git/hooks/",
    ".git/config",
    ".gitmodules",
    ".vscode/",
    ".idea/",
    ".mcp.json",
    ".claude/",
    ".cursor/",
    ".codex/",
];

/// Its home-directory entries (`~/...`), protected in binds of a home.
const HOME_ENTRIES: &[&str] = &[
    ".gitconfig",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".ripgreprc",
];

/// Every file below `dir` with its contents, sorted (directories as
/// `name/`).
fn snapshot(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            let rel = e
                .path()
                .strip_prefix(dir)
                .expect("prefix")
                .display()
                .to_string();
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                out.push((format!("{rel}/"), String::new()));
                stack.push(e.path());
            } else if ft.is_symlink() {
                let t = std::fs::read_link(e.path()).expect("readlink");
                out.push((rel, format!("-> {}", t.display())));
            } else {
                out.push((rel, std::fs::read_to_string(e.path()).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// A project directory holding some of the entries (with known contents);
/// the others are missing.
fn project() -> tempfile::TempDir {
    let dir = workdir();
    let p = dir.path();
    for d in [
        ".git/hooks",
        ".git/modules/lib/hooks",
        ".vscode",
        ".claude",
        "src",
    ] {
        std::fs::create_dir_all(p.join(d)).expect("mkdir");
    }
    for (f, body) in [
        (".git/config", "[core]\n\tbare = false\n"),
        (".git/hooks/pre-commit", "#!/bin/sh\nexit 0\n"),
        // A submodule's git directory (`.git/modules/*/...` entries).
        (".git/modules/lib/config", "[core]\n"),
        (".vscode/settings.json", "{}\n"),
        (".claude/settings.json", "{}\n"),
        (".bashrc", "# the user's\n"),
        ("src/main.py", "print('hi')\n"),
    ] {
        std::fs::write(p.join(f), body).expect("write");
    }
    own(p);
    dir
}

/// The Python that attacks each entry in turn: write (a file) or create in
/// (a directory), remove, rename away, replace by a symlink (rename over
/// it), and for nested entries rename the parent away and rebuild it.
/// Prints `entry attempt result` per line; `ok` means the attack worked.
fn attack_body(entries: &[&str]) -> String {
    let list = entries
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"import shutil
os.chdir('/workspace')
def rm(p):
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    else:
        os.unlink(p)
def write(p, d):
    if d:
        os.makedirs(p, exist_ok=True)
        open(p + '/planted', 'w').write('EVIL')
    else:
        open(p, 'a').write('EVIL')
def swap(p):
    os.symlink('/tmp', 'swap-link')
    try:
        os.rename('swap-link', p)
    finally:
        if os.path.islink('swap-link'):
            os.unlink('swap-link')
def parent_swap(p):
    top = p.split('/')[0]
    os.rename(top, top + '.moved')
    os.makedirs(p.rstrip('/'), exist_ok=True)
for e in [{list}]:
    d = e.endswith('/')
    p = e.rstrip('/')
    say(e, 'write', try_(lambda: write(p, d)))
    say(e, 'remove', try_(lambda: rm(p)))
    say(e, 'rename', try_(lambda: os.rename(p, p + '.moved')))
    say(e, 'symlink', try_(lambda: swap(p)))
    if '/' in p:
        say(e, 'parent', try_(lambda: parent_swap(p)))
"#
    )
}

#[test]
fn attack_protected_entries_cannot_be_written_removed_renamed_or_swapped() {
    let dir = project();
    let before = snapshot(dir.path());
    let w = dir.path().display().to_string();
    let mut targets = PROJECT_ENTRIES.to_vec();
    targets.extend([".git/modules/lib/hooks/", ".git/modules/lib/config"]);
    let (code, out, err) = attack(&["--workdir", &w], &attack_body(&targets));
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    // 4 attempts per entry, 5 for the four nested ones.
    assert_eq!(lines.len(), targets.len() * 4 + 4, "{out}");
    for line in &lines {
        assert!(!line.ends_with(" ok"), "an attack worked: {line}\n{out}");
        // The refusal is the mount's: read-only, or a mount point that
        // cannot be renamed or removed — not a missing file.
        assert!(
            ["EROFS", "EBUSY", "EEXIST", "EISDIR", "ENOTEMPTY", "EXDEV"]
                .iter()
                .any(|e| line.ends_with(e)),
            "unexpected answer: {line}\n{out}"
        );
    }
    // On the host: the entries that existed are unchanged, the missing
    // ones are still missing (their placeholders are gone), nothing else
    // appeared.
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn attack_a_missing_git_cannot_be_created_so_no_fsmonitor_runs_later() {
    // `core.fsmonitor` in a repository's config runs on any `git status`,
    // a shell prompt's included: a sandbox must not create a repository
    // (or `.mcp.json`, `.vscode/`...) where there was none.
    let dir = workdir();
    std::fs::write(dir.path().join("notes.txt"), "mine\n").expect("write");
    own(dir.path());
    let w = dir.path().display().to_string();
    let script = "cd /workspace; git init -q . 2>/dev/null; echo init=$?; \
                  mkdir -p .git/hooks 2>/dev/null; echo mkdir=$?; \
                  printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' > .git/config 2>/dev/null; echo config=$?; \
                  echo '{\"mcpServers\":{}}' > .mcp.json 2>/dev/null; echo mcp=$?; \
                  mkdir -p .vscode 2>/dev/null && echo '{}' > .vscode/tasks.json 2>/dev/null; echo vscode=$?; \
                  echo ok > notes.txt; echo notes=$?";
    let out = run(&["--workdir", &w], &["sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "init=128\nmkdir=1\nconfig=2\nmcp=2\nvscode=2\nnotes=0\n"
    );
    let names = names(dir.path());
    assert_eq!(names, vec!["notes.txt".to_string()], "left on the host");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).expect("read"),
        "ok\n"
    );
}

#[test]
fn attack_a_protected_entry_planted_as_a_symlink_refuses_the_next_run() {
    // A run without protection plants `.vscode` -> a victim directory; the
    // next, protected run refuses to start rather than mount through it.
    let victim = readable_dir();
    std::fs::write(victim.path().join("tasks.json"), "VICTIM\n").expect("write");
    let dir = workdir();
    let w = dir.path().display().to_string();
    let plant = format!("ln -s {} /workspace/.vscode", victim.path().display());
    let out = run(&["--workdir", &w, "--no-protect"], &["sh", "-c", &plant]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (v, out) = run_json(
        &["--workdir", &w],
        &["sh", "-c", "echo EVIL > /workspace/.vscode/tasks.json"],
    );
    assert_eq!(out.status.code(), Some(125), "{v}");
    assert_eq!(v["error"]["code"], "mount.protect_symlink", "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(".vscode") && message.contains("--no-protect"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(victim.path().join("tasks.json")).expect("read"),
        "VICTIM\n"
    );
}

#[test]
fn no_protect_turns_the_protection_off() {
    // The control for the tests above: the same writes succeed when the
    // caller opts out, so what stops them there is the protection.
    let dir = project();
    let w = dir.path().display().to_string();
    let script = "cd /workspace; echo EVIL >> .git/hooks/pre-commit && echo EVIL > .mcp.json \
                  && mkdir .cursor && echo done";
    let out = run(&["--workdir", &w, "--no-protect"], &["sh", "-c", script]);
    assert_eq!(text(&out.stdout), "done\n", "{}", text(&out.stderr));
    assert!(
        std::fs::read_to_string(dir.path().join(".git/hooks/pre-commit"))
            .expect("read")
            .contains("EVIL")
    );
    assert!(dir.path().join(".mcp.json").exists());
    assert!(dir.path().join(".cursor").is_dir());
}

#[test]
fn git_still_commits_in_a_protected_repository() {
    let dir = workdir();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "safe.directory=*", "-C"])
            .arg(dir.path())
            .args(args)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    git(&["init", "-q"]);
    std::fs::write(dir.path().join("a.txt"), "one\n").expect("write");
    own(dir.path());
    let w = dir.path().display().to_string();
    let script = "cd /workspace && echo two >> a.txt && git add a.txt && \
                  git -c user.name=sandbox -c user.email=s@example.invalid commit -q -m inside && \
                  git log --oneline | wc -l";
    let out = run(&["--workdir", &w], &["sh", "-c", script]);
    assert_eq!(text(&out.stdout).trim(), "1", "{}", text(&out.stderr));
    assert_eq!(git(&["log", "--format=%s"]), "inside\n");
    // The placeholders did not end up in the commit.
    assert_eq!(git(&["ls-files"]), "a.txt\n");
}

#[test]
fn attack_a_home_directory_bind_keeps_its_start_up_files() {
    // A `--rw` bind of a home directory (here: corral's own $HOME): the
    // shell start-up files and git's global config cannot be written or
    // created, the project entries neither; other files stay writable.
    let dir = project();
    let home = dir.path().display().to_string();
    let bind = format!("{home}:/home/user");
    let body = format!(
        "{}\nsay('notes', try_(lambda: open('/home/user/notes.txt', 'w').write('ok')))\n",
        attack_body(HOME_ENTRIES).replace("os.chdir('/workspace')", "os.chdir('/home/user')")
    );
    let before = snapshot(dir.path());
    let mut c = corral_run();
    c.env("HOME", &home)
        .args(["--timeout", "30", "--rw", &bind, "--", "python3", "-c"])
        .arg(format!("{PRELUDE}{body}"));
    let out = c.output().expect("spawn corral");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), HOME_ENTRIES.len() * 4 + 1, "{stdout}");
    for line in &lines[..lines.len() - 1] {
        assert!(!line.ends_with(" ok"), "an attack worked: {line}\n{stdout}");
    }
    assert_eq!(lines[lines.len() - 1], "notes ok");
    let mut after = snapshot(dir.path());
    after.retain(|(name, _)| name != "notes.txt");
    assert_eq!(after, before);
    let events = events(&out.stderr);
    let protected = events
        .iter()
        .find(|e| e["code"] == "fs.protected")
        .unwrap_or_else(|| panic!("no fs.protected event: {}", text(&out.stderr)));
    let entries = protected["fields"]["entries"].as_array().expect("entries");
    assert!(
        entries.iter().any(|e| e == "/home/user/.bashrc"),
        "{protected}"
    );
    assert!(
        entries.iter().any(|e| e == "/home/user/.git/hooks"),
        "{protected}"
    );
}

#[test]
fn start_up_files_of_a_project_directory_are_not_protected() {
    // `~/` entries are about home directories: a project's own `.bashrc`
    // is ordinary content, and in-sandbox tools (HOME is /workspace) may
    // create their `.gitconfig` there.
    let dir = project();
    let w = dir.path().display().to_string();
    let out = run(
        &["--workdir", &w],
        &[
            "sh",
            "-c",
            "echo more >> /workspace/.bashrc && git config --global user.name x && echo done",
        ],
    );
    assert_eq!(text(&out.stdout), "done\n", "{}", text(&out.stderr));
    assert!(dir.path().join(".gitconfig").is_file());
}

#[test]
fn a_placeholder_left_by_a_killed_corral_is_adopted_and_removed() {
    // A corral killed with SIGKILL cannot remove its placeholders; they
    // carry an xattr, so the next run on the directory removes them. An
    // empty file of the user's (no mark) stays.
    let dir = workdir();
    let p = dir.path();
    std::fs::write(p.join(".mcp.json"), "").expect("write");
    std::fs::create_dir(p.join(".cursor")).expect("mkdir");
    std::fs::write(p.join(".zshrc"), "").expect("write");
    for name in [".mcp.json", ".cursor"] {
        let status = Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import os, sys; os.setxattr(sys.argv[1], 'user.corral.placeholder', b'1')",
            ])
            .arg(p.join(name))
            .status()
            .expect("python3");
        assert!(status.success(), "setting the xattr on {name}");
    }
    own(p);
    let w = p.display().to_string();
    let out = run(&["--workdir", &w], &["sh", "-c", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(names(p), vec![".zshrc".to_string()]);
}

#[test]
fn a_concurrent_run_keeps_its_placeholders_until_it_ends() {
    // Run A holds placeholders while it sleeps; run B on the same
    // directory starts and ends meanwhile. B must not remove A's
    // placeholders (unlinking a mount point in another mount namespace
    // would detach A's protection): A still cannot create `.mcp.json`
    // after B is gone, and the placeholders go when A ends.
    let dir = workdir();
    own(dir.path());
    let w = dir.path().display().to_string();
    let marker = dir.path().join("a-started");
    let a = corral_run()
        .args(["--workdir", &w, "--", "sh", "-c"])
        .arg(
            "touch /workspace/a-started; while [ ! -e /workspace/b-done ]; do sleep 0.1; done; \
             echo EVIL > /workspace/.mcp.json; echo a=$?",
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn A");
    wait_until(30, "run A to start", || marker.exists());
    let out = run(&["--workdir", &w], &["sh", "-c", "true"]);
    assert!(out.status.success(), "B: {}", text(&out.stderr));
    assert!(
        dir.path().join(".mcp.json").exists(),
        "B removed A's placeholder"
    );
    std::fs::write(dir.path().join("b-done"), "").expect("write");
    let a = a.wait_with_output().expect("wait A");
    assert_eq!(text(&a.stdout), "a=2\n", "{}", text(&a.stderr));
    assert!(!dir.path().join(".mcp.json").exists(), "placeholder left");
    assert!(!dir.path().join(".git").exists(), "placeholder left");
}

#[test]
fn reduced_mode_refuses_to_leave_protected_entries_writable() {
    let dir = project();
    let w = dir.path().display().to_string();
    let (v, out) = run_json(
        &["--without-namespaces", "--workdir", &w],
        &["sh", "-c", "true"],
    );
    assert_eq!(out.status.code(), Some(125), "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("--no-protect"), "{message}");
}

//! Helpers shared by the attack modules: the Python prelude and the
//! `attack`/`expect` runners, C programs compiled at test time, secrets,
//! host directories.

use crate::common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// True on x86_64; elsewhere prints why the test does nothing.
pub fn x86_64(test: &str) -> bool {
    if std::env::consts::ARCH == "x86_64" {
        return true;
    }
    eprintln!(
        "SKIPPED {test}: it uses x86_64 syscall numbers or ABI; this machine is {}",
        std::env::consts::ARCH
    );
    false
}

/// Python prelude: `sc(nr, *args)` makes a raw syscall and answers `ok` or
/// the errno name; `scr` also returns the value; `try_(f)` does the same for
/// a Python call; `say` prints one line.
pub const PRELUDE: &str = r#"import ctypes, errno, os, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def _arg(a):
    if isinstance(a, int):
        return ctypes.c_ulong(a & 0xffffffffffffffff)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return a
def _name(e):
    return errno.errorcode.get(e, str(e))
def scr(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return r, (_name(ctypes.get_errno()) if r == -1 else 'ok')
def sc(nr, *args):
    return scr(nr, *args)[1]
def lc(fn, *args):
    ctypes.set_errno(0)
    r = getattr(libc, fn)(*[_arg(a) for a in args])
    return _name(ctypes.get_errno()) if r == -1 else 'ok'
def try_(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return _name(e.errno)
def say(*a):
    print(*a, flush=True)
"#;

/// Runs `PRELUDE + body` with python3 in a sandbox with `flags` (and a 30 s
/// timeout); returns (exit code, stdout, stderr).
pub fn attack(flags: &[&str], body: &str) -> (i32, String, String) {
    let code = format!("{PRELUDE}{body}");
    let mut all = vec!["--timeout", "30"];
    all.extend_from_slice(flags);
    let out = run(&all, &["python3", "-c", &code]);
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `attack` in the default sandbox: the program must answer exactly
/// `expected` and exit 0 (the attack was refused, nothing crashed).
pub fn expect(body: &str, expected: &str) {
    expect_with(&[], body, expected);
}

pub fn expect_with(flags: &[&str], body: &str, expected: &str) {
    let (code, out, err) = attack(flags, body);
    assert_eq!(out, expected, "exit {code}; stderr: {err}");
    assert_eq!(code, 0, "stderr: {err}");
}

/// A profile that runs programs by absolute path (the compiled attacks).
const ATTACK_PROFILE: &str =
    "[profile.attack]\nextends = \"code\"\n[profile.attack.commands]\nallow_paths = true\n";

/// A C program compiled with gcc into a directory the sandbox can read,
/// bound read-only at /opt/attack.
pub struct CProgram {
    pub dir: tempfile::TempDir,
    _cfg_dir: tempfile::TempDir,
    pub cfg: PathBuf,
}

impl CProgram {
    pub fn compile(name: &str, source: &str) -> CProgram {
        CProgram::compile_with(name, source, &[])
    }

    /// [`CProgram::compile`] with more gcc flags (`-static`).
    pub fn compile_with(name: &str, source: &str, flags: &[&str]) -> CProgram {
        let dir = readable_dir();
        let src = dir.path().join(format!("{name}.c"));
        std::fs::write(&src, source).expect("write C source");
        let out = Command::new("gcc")
            .args(flags)
            .args(["-O1", "-Wall", "-o"])
            .arg(dir.path().join(name))
            .arg(&src)
            .output()
            .expect("gcc (the suite compiles its C attacks at test time)");
        assert!(out.status.success(), "gcc: {}", text(&out.stderr));
        let (cfg_dir, cfg) = config(ATTACK_PROFILE);
        CProgram {
            dir,
            _cfg_dir: cfg_dir,
            cfg,
        }
    }

    pub fn bind(&self) -> String {
        format!("{}:/opt/attack", self.dir.path().display())
    }

    /// Runs `argv` (an /opt/attack path first) in the attack profile.
    pub fn run(&self, extra: &[&str], argv: &[&str]) -> Output {
        let cfg = self.cfg.to_str().expect("utf-8 path");
        let bind = self.bind();
        let mut flags = vec![
            "--config",
            cfg,
            "--profile",
            "attack",
            "--ro",
            &bind,
            "--timeout",
            "30",
        ];
        flags.extend_from_slice(extra);
        run(&flags, argv)
    }
}

/// A fresh secret that never appears literally in any argv: the programs
/// get it as hex and decode it.
pub fn secret() -> String {
    format!(
        "corral-secret-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A host directory the sandbox identity can read (mode 0755).
pub fn readable_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("corral-attack-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).expect("chmod");
    dir
}

/// Lists a host directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Gives the tree to the workdir's owner (root runs: uid 4242, which the
/// sandbox sees as its own), so a refusal is the layer's, not a
/// permission's.
pub fn own(dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "4242:4242"])
            .arg(dir)
            .status()
            .expect("chown");
        assert!(status.success());
    }
}

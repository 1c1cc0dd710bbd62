//! The Landlock layer: filesystem rules that mirror the mount policy, TCP
//! port rules, and scoping of signals and abstract unix sockets, so a
//! mistake in the mount layer is still contained.
//!
//! Rules are built in PID 1 after `pivot_root` (they need fds of the
//! sandbox's own paths) and enforced by the program's process just before
//! the seccomp filter and `execve`.

use std::os::fd::AsFd;
use std::path::Path;

use corral_sys::Errno;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use serde::{Deserialize, Serialize};

use crate::kernel::{Enforcement, LandlockStatus};

/// The ABI corral writes its rules for; older kernels get the subset they
/// support (the result reports which ABI was in force).
const TARGET_ABI: ABI = ABI::V6;

/// What Landlock allows, in sandbox paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Refuse to run when the kernel cannot enforce the ruleset.
    pub required: bool,
    /// Refuse to run unless every right is enforced (reduced mode, where
    /// Landlock is the only filesystem layer and its signal scoping the
    /// only thing between the program and the user's other processes).
    #[serde(default)]
    pub require_full: bool,
    /// Read and execute (system trees, read-only binds, `/etc`, `/proc`).
    pub read: Vec<String>,
    /// Everything (workspace, `/tmp`, `/dev/shm`, read-write binds).
    pub write: Vec<String>,
    /// Device files: read, write and device ioctls (`/dev`).
    pub devices: Vec<String>,
    /// Directories that may only be listed (`/`).
    pub list: Vec<String>,
    /// Whether TCP bind/connect are restricted at all (not in network
    /// mode `host`).
    #[serde(default)]
    pub restrict_tcp: bool,
    /// TCP ports the program may bind.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the program may connect to.
    pub tcp_connect: Vec<u16>,
    /// When set, the only files the program may execute (`execve`, and the
    /// ELF loader the kernel opens for it): every other rule is granted
    /// without Landlock's execute right (`commands.restrict_exec`).
    #[serde(default)]
    pub execute_only: Option<Vec<String>>,
}

/// How Landlock ended up, reported in the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockOutcome {
    /// The kernel's Landlock ABI (0 when unavailable).
    pub abi: i32,
    /// `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub status: String,
}

pub(crate) fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("landlock: {what}: {e}")
}

/// How a rule's path is opened.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Links {
    /// Through symlinks: the files a program may execute (`python3 ->
    /// python3.11`), and reduced mode's host paths (`/bin -> usr/bin`).
    Follow,
    /// Never through one: the full sandbox's directories are the mounts
    /// corral made, none of them a link, and a link there (a caller
    /// who owns a workdir swapping a directory at the right moment) would
    /// move the rule elsewhere in the sandbox. Such a path fails the run.
    Refuse,
}

fn add_path(
    ruleset: RulesetCreated,
    path: &str,
    access: BitFlags<AccessFs>,
    links: Links,
) -> Result<RulesetCreated, String> {
    // One open and one fstat per rule (the rules are built at every
    // sandbox start): the object opened is the one whose type is checked.
    let resolve = match links {
        Links::Follow => 0,
        Links::Refuse => corral_sys::mount::RESOLVE_NO_SYMLINKS,
    };
    let opened = std::ffi::CString::new(path)
        .map_err(|_| Errno(libc::EINVAL))
        .and_then(|c| corral_sys::mount::openat2(libc::AT_FDCWD, &c, libc::O_PATH, 0, resolve));
    let fd = match opened {
        Ok(fd) => fd,
        // A path the plan lists but the sandbox lacks (an absent /lib64)
        // needs no rule.
        Err(Errno(libc::ENOENT)) => return Ok(ruleset),
        Err(e) if e.0 == libc::ELOOP && links == Links::Refuse => {
            return Err(err(
                &format!("opening {path}"),
                format!("{e}: a symlink where the sandbox's own directory should be"),
            ))
        }
        Err(e) => return Err(err(&format!("opening {path}"), e)),
    };
    let is_dir = corral_sys::mount::fstat(fd.as_fd())
        .map_err(|e| err(&format!("stat {path}"), e))?
        .is_dir();
    let access = if is_dir {
        access
    } else {
        access & AccessFs::from_file(TARGET_ABI)
    };
    ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| err(&format!("rule for {path}"), e))
}

/// Builds the ruleset (in PID 1, after `pivot_root`).
pub fn prepare(plan: &LandlockPlan) -> Result<RulesetCreated, String> {
    let abi = TARGET_ABI;
    let handled = Ruleset::default().handle_access(AccessFs::from_all(abi));
    let handled = if plan.restrict_tcp {
        handled.and_then(|r| r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp))
    } else {
        handled
    };
    let mut ruleset = handled
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .map_err(|e| err("creating the ruleset", e))?;
    // With an execute allowlist, no tree grants execution; the listed
    // files alone do.
    let no_exec = |a: BitFlags<AccessFs>| match plan.execute_only {
        Some(_) => a & !AccessFs::Execute,
        None => a,
    };
    let read = no_exec(AccessFs::from_read(abi));
    let device = read | AccessFs::WriteFile | AccessFs::IoctlDev;
    // Reduced mode (`require_full`) names host paths, whose system trees
    // may be links; the full sandbox's are its own mounts.
    let dirs = if plan.require_full {
        Links::Follow
    } else {
        Links::Refuse
    };
    for p in &plan.list {
        ruleset = add_path(ruleset, p, BitFlags::from(AccessFs::ReadDir), dirs)?;
    }
    for p in &plan.read {
        ruleset = add_path(ruleset, p, read, dirs)?;
    }
    for p in &plan.devices {
        ruleset = add_path(ruleset, p, device, dirs)?;
    }
    for p in &plan.write {
        ruleset = add_path(ruleset, p, no_exec(AccessFs::from_all(abi)), dirs)?;
    }
    if let Some(files) = &plan.execute_only {
        for p in with_interpreters(files) {
            let access = AccessFs::Execute | AccessFs::ReadFile;
            ruleset = add_path(ruleset, &p, access, Links::Follow)?;
        }
    }
    let ports = |list: &[u16]| {
        if plan.restrict_tcp {
            list.to_vec()
        } else {
            Vec::new()
        }
    };
    for port in ports(&plan.tcp_bind) {
        ruleset = ruleset
            .add_rule(NetPort::new(port, AccessNet::BindTcp))
            .map_err(|e| err(&format!("bind rule for port {port}"), e))?;
    }
    for port in ports(&plan.tcp_connect) {
        ruleset = ruleset
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| err(&format!("connect rule for port {port}"), e))?;
    }
    Ok(ruleset)
}

/// `files` and what the kernel executes to run them, as seen inside the
/// sandbox: the interpreter of a `#!` line (and, for `#!/usr/bin/env
/// NAME`, NAME found in the standard directories) and an ELF program's
/// loader (`PT_INTERP`, opened with the execute right too), followed a few
/// levels deep. A file that cannot be read adds nothing.
pub(crate) fn with_interpreters(files: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut todo: Vec<(String, u8)> = files.iter().map(|f| (f.clone(), 0)).collect();
    while let Some((file, depth)) = todo.pop() {
        if out.contains(&file) {
            continue;
        }
        if depth < 4 {
            todo.extend(interpreters_of(&file).into_iter().map(|i| (i, depth + 1)));
        }
        out.push(file);
    }
    out.sort();
    out
}

/// Directories a `#!/usr/bin/env NAME` line is resolved in.
const ENV_DIRS: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

fn interpreters_of(file: &str) -> Vec<String> {
    use std::io::Read;
    let mut head = [0u8; 4096];
    let n = match std::fs::File::open(file).and_then(|mut f| f.read(&mut head)) {
        Ok(n) => n,
        Err(_) => return Vec::new(),
    };
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.split_whitespace();
        let Some(interp) = words.next() else {
            return Vec::new();
        };
        let mut found = vec![interp.to_string()];
        if interp.ends_with("/env") {
            if let Some(name) = words.find(|w| !w.starts_with('-')) {
                found.extend(
                    ENV_DIRS
                        .iter()
                        .map(|d| format!("{d}/{name}"))
                        .find(|p| Path::new(p).exists()),
                );
            }
        }
        return found;
    }
    elf_interpreter(file, head).into_iter().collect()
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF file, if any.
fn elf_interpreter(file: &str, head: &[u8]) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let u16_at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    // ELFCLASS64, ELFDATA2LSB.
    if head.get(..6) != Some(b"\x7fELF\x02\x01") {
        return None;
    }
    let phoff = usize::try_from(u64_at(head, 0x20)?).ok()?;
    let phentsize = usize::from(u16_at(head, 0x36)?);
    let phnum = usize::from(u16_at(head, 0x38)?);
    for i in 0..phnum.min(64) {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        // PT_INTERP
        if u32_at(head, at)? != 3 {
            continue;
        }
        let offset = u64_at(head, at + 0x08)?;
        let size = usize::try_from(u64_at(head, at + 0x20)?).ok()?.min(4096);
        let mut f = std::fs::File::open(file).ok()?;
        f.seek(SeekFrom::Start(offset)).ok()?;
        let mut buf = vec![0u8; size];
        f.read_exact(&mut buf).ok()?;
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        return String::from_utf8(buf[..end].to_vec()).ok();
    }
    None
}

/// Judges what `landlock_restrict_self` achieved (the program, before
/// exec) against the plan. Fails when `required` and the kernel enforced
/// nothing, or when `require_full` and it enforced less than everything.
pub(crate) fn outcome(
    status: LandlockStatus,
    required: bool,
    require_full: bool,
) -> Result<LandlockOutcome, String> {
    let abi = status.abi;
    let label = match status.enforced {
        Enforcement::Full => "fully_enforced",
        Enforcement::Partial => "partially_enforced",
        Enforcement::None => "not_enforced",
    };
    if required && status.enforced == Enforcement::None {
        return Err(format!(
            "landlock is required but this kernel enforces none of it (ABI {abi}); boot with Landlock \
             enabled (lsm=...,landlock) or set security.landlock = \"best-effort\" to accept a weaker sandbox"
        ));
    }
    if require_full && status.enforced != Enforcement::Full {
        return Err(format!(
            "running without namespaces needs Landlock ABI 6 or later fully enforced (this kernel: ABI {abi}, {label}): \
             it is the only filesystem layer and its signal scoping the only barrier to your other processes"
        ));
    }
    Ok(LandlockOutcome {
        abi,
        status: label.into(),
    })
}

#[cfg(test)]
mod link_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_full_sandboxs_rule_path_that_is_a_link_fails_and_reduced_modes_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let plan = |path: &Path, require_full: bool| LandlockPlan {
            write: vec![path.to_str().unwrap().to_string()],
            require_full,
            ..LandlockPlan::default()
        };
        assert!(prepare(&plan(&real, false)).is_ok());
        let refused = prepare(&plan(&link, false)).err().unwrap();
        assert!(
            refused.contains("ELOOP") && refused.contains("symlink"),
            "{refused}"
        );
        // Through a link in a parent directory too.
        let through = link.join("sub");
        std::fs::create_dir(real.join("sub")).unwrap();
        assert!(prepare(&plan(&through, false)).is_err());
        // Reduced mode: host paths, links followed (`/bin -> usr/bin`).
        assert!(prepare(&plan(&link, true)).is_ok());
        // A path the sandbox lacks needs no rule.
        assert!(prepare(&plan(&dir.path().join("absent"), false)).is_ok());
    }
}

#[cfg(test)]
mod interpreter_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_elf_program_brings_its_loader_and_a_script_its_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("tool");
        std::fs::write(&script, "#!/usr/bin/env -S sh -e\necho hi\n").unwrap();
        let direct = dir.path().join("direct");
        std::fs::write(&direct, "#!/bin/sh -e\necho hi\n").unwrap();
        let files = [
            script.display().to_string(),
            direct.display().to_string(),
            "/bin/sh".to_string(),
        ];
        let all = with_interpreters(&files);
        for f in &files {
            assert!(all.contains(f), "{f} in {all:?}");
        }
        assert!(all.contains(&"/usr/bin/env".to_string()), "{all:?}");
        // `/bin/sh` is an ELF program: its loader (PT_INTERP) comes along.
        assert!(
            all.iter()
                .any(|f| f.contains("ld-linux") || f.contains("ld-musl")),
            "{all:?}"
        );
        // Unreadable or missing files add nothing and break nothing.
        assert_eq!(
            with_interpreters(&["/nonexistent".into()]),
            ["/nonexistent"]
        );
    }
}

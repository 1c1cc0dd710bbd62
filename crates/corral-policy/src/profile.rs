//! A validated profile: the complete policy for one sandbox.

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::limits::RunLimit;
use crate::path::{MountSpec, SandboxPath};
use crate::size::ByteSize;

/// The complete, validated policy of one sandbox. Built from a built-in
/// profile, optionally overridden by a config file, then by CLI flags.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The profile's name (`code`, or one from a config file).
    pub name: String,
    /// One line saying what the profile is for.
    pub description: String,
    /// Hostname inside the sandbox's UTS namespace.
    pub hostname: String,
    /// What the sandbox sees of the filesystem.
    pub filesystem: Filesystem,
    /// What environment the program receives.
    pub env: EnvPolicy,
    /// Which commands may run, and which argument lists are refused.
    pub commands: CommandPolicy,
    /// Resource and time limits.
    pub limits: Limits,
    /// Which host identity runs the program when corral itself is root.
    pub identity: Identity,
    /// The syscall filter and the Landlock layer.
    pub security: Security,
    /// Network mode and egress rules.
    pub network: crate::network::NetworkPolicy,
}

impl Profile {
    /// Makes `tree` (a venv, or a `node_modules` directory) the runtime:
    /// bound read-only at its own path (scripts in it name it in their
    /// `#!` lines), its `bin` directory first where commands are resolved
    /// and on `PATH`, so `python3` is the venv's interpreter; a venv also
    /// gets `VIRTUAL_ENV`.
    pub fn set_runtime(&mut self, tree: SandboxPath) -> Result<(), crate::PathError> {
        let bin = Self::runtime_bin(&tree)?;
        let fs = &mut self.filesystem;
        if !fs.read_only.iter().any(|m| m.dest == tree) {
            fs.read_only.push(MountSpec {
                source: tree.clone(),
                dest: tree.clone(),
            });
        }
        self.commands.search_path.retain(|d| d != &bin);
        self.commands.search_path.insert(0, bin.clone());
        let path = self
            .env
            .set
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| crate::env::BASE_PATH.to_string());
        self.env.set.insert("PATH".into(), format!("{bin}:{path}"));
        if !tree.as_str().ends_with("/node_modules") {
            self.env.set.insert("VIRTUAL_ENV".into(), tree.to_string());
        }
        fs.runtime = Some(tree);
        Ok(())
    }

    /// The host paths the profile binds (read-only, read-write, then the
    /// runtime tree), for messages about the host: where a filesystem
    /// that stops answering is likely to be.
    pub fn host_sources(&self) -> Vec<&str> {
        let fs = &self.filesystem;
        fs.read_only
            .iter()
            .chain(&fs.read_write)
            .map(|m| m.source.as_str())
            .chain(fs.runtime.iter().map(SandboxPath::as_str))
            .collect()
    }

    /// The directory of a runtime tree's commands.
    pub fn runtime_bin(tree: &SandboxPath) -> Result<SandboxPath, crate::PathError> {
        let sub = if tree.as_str().ends_with("/node_modules") {
            ".bin"
        } else {
            "bin"
        };
        SandboxPath::new(&format!("{tree}/{sub}"))
    }
}

/// Which seccomp filter the program runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeccompProfile {
    /// A deny-list of syscalls a sandbox never needs (EPERM), namespace
    /// flags on clone, clone3 (ENOSYS), TIOCSTI/TIOCLINUX and unneeded
    /// socket families; other architectures' syscalls kill the process.
    Default,
    /// An allowlist of the syscalls ordinary programs use; everything else
    /// fails with EPERM. For snippets.
    Strict,
}

/// How hard Landlock is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Refuse to run on a kernel without Landlock.
    Required,
    /// Use Landlock where the kernel has it; report when it does not.
    BestEffort,
}

/// Security layers beyond namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Security {
    /// The seccomp filter.
    pub seccomp: SeccompProfile,
    /// Whether Landlock must be available.
    pub landlock: LandlockMode,
    /// TCP ports the program may bind (Landlock ABI 4+); none by default.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the program may connect to (Landlock ABI 4+); none by
    /// default, the network namespace having nothing to reach anyway.
    pub tcp_connect: Vec<u16>,
    /// Whether the program may create `AF_UNIX` sockets with `socket(2)`.
    /// Off by default: a read-only bind does not stop `connect(2)` to a
    /// socket file inside it (an ssh or GPG agent, a D-Bus bus, a docker
    /// socket), so without this the sandbox cannot open one at all.
    /// `socketpair(2)` stays allowed either way (runtimes use it).
    pub unix_sockets: bool,
}

/// The sandbox's filesystem: a fresh read-only root holding only what is
/// listed here, plus `/proc`, a minimal `/dev`, a tmpfs `/tmp` and the
/// workspace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Filesystem {
    /// System paths bound read-only at the same place when they exist on the
    /// host (a missing one is skipped: `/lib64` is not on every machine).
    /// Symlinks such as a merged-usr `/bin -> usr/bin` are recreated as
    /// symlinks.
    pub system: Vec<SandboxPath>,
    /// Extra read-only binds; the source must exist.
    pub read_only: Vec<MountSpec>,
    /// Extra read-write binds; the source must exist.
    pub read_write: Vec<MountSpec>,
    /// Paths made inaccessible even if a mount above exposes them.
    pub deny: Vec<SandboxPath>,
    /// Size of the tmpfs at `/tmp`.
    pub tmp_size: ByteSize,
    /// Size of the tmpfs used as `/workspace` when no workdir is given.
    pub workspace_size: ByteSize,
    /// Whether `/dev/pts` and `/dev/ptmx` exist (a private devpts instance).
    pub dev_pts: bool,
    /// A runtime tree (`filesystem.runtime`, `--runtime`): a Python venv
    /// or a `node_modules` directory, bound read-only at its own path with
    /// its `bin` (`.bin` for `node_modules`) first on the search path and
    /// on `PATH`; set with [`Profile::set_runtime`].
    pub runtime: Option<SandboxPath>,
    /// Entries of every writable bind of the caller's (the workdir, and
    /// `read_write` binds) the sandbox may read but never change: each is
    /// bound read-only onto itself, its directories on the way pinned so
    /// they cannot be renamed away, and a missing one stands in as an
    /// empty placeholder for the run. Empty turns the protection off.
    pub protect: Vec<crate::protect::ProtectEntry>,
}

/// Environment policy. The program starts from an empty environment; only
/// the profile's base variables, `pass` and `set` reach it, and the
/// blocklist (see [`crate::env`]) always wins.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvPolicy {
    /// Names copied from the invoking environment when present.
    pub pass: Vec<String>,
    /// Variables set to fixed values.
    pub set: BTreeMap<String, String>,
    /// Extra glob patterns of names that are always stripped, on top of the
    /// built-in blocklist.
    pub block: Vec<String>,
}

/// Command policy: an allowlist of command names resolved to absolute paths
/// once, plus argument deny patterns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommandPolicy {
    /// Bare command names that may run (`python3`, `node`, ...).
    pub allow: Vec<String>,
    /// Whether a request may name an absolute path instead of an allowed
    /// name. Off by default: `/bin/bash` would bypass the allowlist.
    pub allow_paths: bool,
    /// Glob patterns matched against the whole command line (arguments
    /// joined by single spaces); a match refuses the command.
    pub deny_args: Vec<String>,
    /// Directories searched, in order, to resolve allowed names. Only
    /// directories visible inside the sandbox count.
    pub search_path: Vec<SandboxPath>,
    /// Whether the kernel lets the program `execve` only the allowed
    /// commands (as resolved), their interpreters (`#!` lines, the ELF
    /// loader) and the path a request named: Landlock's execute right is
    /// granted on those files alone, so any other program, a script the
    /// sandbox wrote included, fails with `EACCES`. Needs Landlock.
    pub restrict_exec: bool,
}

/// Time and resource limits. Every limit set here is enforced, or the run
/// is refused naming the limit, unless `allow_unenforced` accepts a weaker
/// sandbox (the result then lists what was not enforced).
///
/// Each value lies in its [`RunLimit`] range, checked wherever it is set
/// (config file, `corral run` flags, `corral serve` requests) and by
/// [`Limits::check`]; the bounds below are those ranges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    /// Wall-clock limit in seconds; `None` means no limit (`timeout_secs =
    /// "none"` removes an inherited one). 1 to
    /// [`crate::limits::MAX_TIMEOUT_SECS`] (24 days, what poll(2) can wait).
    pub timeout_secs: Option<u64>,
    /// Memory, swap included (cgroup `memory.max` + `memory.swap.max`, or
    /// v1 `memory.limit_in_bytes` + `memory.memsw.limit_in_bytes`). 1 MiB
    /// to [`crate::limits::MAX_BYTES`] (`i64::MAX`).
    pub memory_bytes: Option<ByteSize>,
    /// Processes and threads in the sandbox (cgroup `pids.max`).
    /// [`crate::limits::MIN_PIDS`] (3: corral's helper, init and the
    /// program) to [`crate::limits::MAX_PIDS`] (the kernel's most pids).
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a core (cgroup `cpu.max`). 10 (the
    /// kernel's smallest quota) to [`crate::limits::MAX_CPU_MILLICORES`]
    /// (8192 CPUs).
    pub cpu_millicores: Option<u64>,
    /// CPU time in seconds (`RLIMIT_CPU`: SIGXCPU, then SIGKILL). 1 to
    /// [`crate::limits::MAX_CPU_TIME_SECS`] (366 days).
    pub cpu_time_secs: Option<u64>,
    /// Virtual address space (`RLIMIT_AS`). Off by default: runtimes such
    /// as node reserve far more address space than they use. 4 KiB to
    /// [`crate::limits::MAX_BYTES`].
    pub address_space_bytes: Option<ByteSize>,
    /// Largest file the program may write (`RLIMIT_FSIZE`: SIGXFSZ). 4 KiB
    /// to [`crate::limits::MAX_BYTES`] (the kernel compares it with signed
    /// file offsets).
    pub file_size_bytes: Option<ByteSize>,
    /// Open file descriptors per process (`RLIMIT_NOFILE`). 1 to
    /// [`crate::limits::MAX_OPEN_FILES`] (the default `fs.nr_open`).
    pub open_files: u64,
    /// Processes of the sandbox's uid in its user namespace
    /// (`RLIMIT_NPROC`); a second fork-bomb guard that needs no cgroup. 1
    /// to [`crate::limits::MAX_PIDS`].
    pub processes: Option<u64>,
    /// Bytes of each output stream kept: the head and the tail, with an
    /// elision marker between them. 64 bytes (room for the marker) to
    /// [`crate::limits::MAX_BYTES`].
    pub output_bytes: ByteSize,
    /// Bytes per stream (in total, over the run) after which the whole
    /// sandbox is killed and the output marked truncated; `None` means no
    /// ceiling (`output_kill = "none"`). At least `output_bytes`, and 64
    /// bytes to [`crate::limits::MAX_BYTES`].
    pub output_kill_bytes: Option<ByteSize>,
    /// Accept a host that cannot enforce some limit (no cgroup
    /// delegation): run anyway and report the limit as not enforced.
    pub allow_unenforced: bool,
}

/// The unprivileged host identity the program runs as when corral is
/// started as root. When corral runs as an ordinary user, the program runs
/// as that user and these are unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// Host uid (default 65534, `nobody`).
    pub uid: u32,
    /// Host gid (default 65534, `nogroup`).
    pub gid: u32,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            uid: 65534,
            gid: 65534,
        }
    }
}

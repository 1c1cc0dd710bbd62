//! A validated profile: the complete policy for one sandbox.

use std::collections::BTreeMap;

use serde::Serialize;

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
}

/// Time and resource limits. Every limit set here is enforced, or the run
/// is refused naming the limit, unless `allow_unenforced` accepts a weaker
/// sandbox (the result then lists what was not enforced).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    /// Wall-clock limit in seconds; `None` means no limit.
    pub timeout_secs: Option<u64>,
    /// Memory, swap included (cgroup `memory.max` + `memory.swap.max`, or
    /// v1 `memory.limit_in_bytes` + `memory.memsw.limit_in_bytes`).
    pub memory_bytes: Option<ByteSize>,
    /// Processes and threads in the sandbox (cgroup `pids.max`).
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a core (cgroup `cpu.max`).
    pub cpu_millicores: Option<u64>,
    /// CPU time in seconds (`RLIMIT_CPU`: SIGXCPU, then SIGKILL).
    pub cpu_time_secs: Option<u64>,
    /// Virtual address space (`RLIMIT_AS`). Off by default: runtimes such
    /// as node reserve far more address space than they use.
    pub address_space_bytes: Option<ByteSize>,
    /// Largest file the program may write (`RLIMIT_FSIZE`: SIGXFSZ).
    pub file_size_bytes: Option<ByteSize>,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Processes of the sandbox's uid in its user namespace
    /// (`RLIMIT_NPROC`); a second fork-bomb guard that needs no cgroup.
    pub processes: Option<u64>,
    /// Bytes of each output stream kept: the head and the tail, with an
    /// elision marker between them.
    pub output_bytes: ByteSize,
    /// Bytes per stream after which the whole sandbox is killed and the
    /// output marked truncated.
    pub output_kill_bytes: ByteSize,
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

/// A limit a caller may set for one run, on top of the profile: the flags
/// of `corral run` and the `limits` of a `corral serve` request. Both check
/// the smallest value they accept here, so the two refuse the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLimit {
    /// Wall-clock limit, in seconds.
    Timeout,
    /// Memory, swap included, in bytes.
    Memory,
    /// Bytes kept of each output stream.
    Output,
    /// Processes and threads at once.
    Pids,
    /// CPU time per process, in seconds.
    CpuTime,
}

impl RunLimit {
    /// The smallest value accepted, in the limit's unit (seconds, bytes or
    /// a count). Below 1 MiB of memory the interpreters cannot even start;
    /// below 64 bytes the head-and-tail output has no room for its marker.
    pub const fn minimum(self) -> u64 {
        match self {
            RunLimit::Memory => 1 << 20,
            RunLimit::Output => 64,
            RunLimit::Timeout | RunLimit::Pids | RunLimit::CpuTime => 1,
        }
    }

    /// `value` (in the limit's unit) if it is at least [`RunLimit::minimum`],
    /// else what the minimum is, for the caller's message (e.g. `at least
    /// 1MiB`).
    pub fn check(self, value: u64) -> Result<u64, String> {
        let min = self.minimum();
        if value >= min {
            return Ok(value);
        }
        Err(match self {
            RunLimit::Memory => format!("at least {}", ByteSize(min)),
            RunLimit::Output => format!("at least {min} bytes"),
            RunLimit::Timeout | RunLimit::CpuTime => format!("at least {min} second"),
            RunLimit::Pids => format!("at least {min}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_limits_have_minimums() {
        assert_eq!(RunLimit::Memory.check(1 << 20), Ok(1 << 20));
        assert_eq!(
            RunLimit::Memory.check((1 << 20) - 1),
            Err("at least 1MiB".into())
        );
        assert_eq!(RunLimit::Output.check(63), Err("at least 64 bytes".into()));
        assert_eq!(RunLimit::Output.check(64), Ok(64));
        assert!(RunLimit::Timeout.check(0).is_err());
        assert!(RunLimit::Pids.check(0).is_err());
        assert_eq!(RunLimit::CpuTime.check(1), Ok(1));
    }
}

//! The plan: everything the helper does, decided in advance by the
//! launcher and sent over the control socket. These types are the contract
//! between the two sides; the helper only carries them out.

use corral_policy::{NetworkMode, SandboxPath, SeccompProfile};
use serde::{Deserialize, Serialize};

use crate::filters::CompiledFilters;
use crate::landlock::LandlockPlan;

/// Who runs the program, decided by who runs corral.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxIdentity {
    /// Host uid of the program (and the same number inside).
    pub uid: u32,
    /// Host gid of the program (and the same number inside).
    pub gid: u32,
    /// Whether the helper starts as root and must switch to `uid`/`gid`
    /// before creating the user namespace.
    pub drop_from_root: bool,
}

/// One filesystem step inside the new root, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MountOp {
    /// Bind a host path (recursively).
    Bind {
        /// Host path.
        source: String,
        /// Sandbox path.
        dest: SandboxPath,
        /// Read-write instead of read-only.
        writable: bool,
        /// When corral runs as root: the on-disk (uid, gid) shown as the
        /// sandbox identity through an idmapped mount, so a workdir owned
        /// by the invoking user is writable without chowning host files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idmap_from: Option<(u32, u32)>,
        /// Resolve `source` without following any symlink
        /// (`RESOLVE_NO_SYMLINKS`): set for the binds a caller asked for
        /// (`--ro`, `--rw`, `--workdir`, a profile's binds), whose paths may
        /// pass through a directory an earlier sandbox could write. The
        /// planner refuses such a path when it holds a link; this makes the
        /// kernel refuse one planted after that check.
        #[serde(default)]
        no_symlinks: bool,
    },
    /// Create a symlink (recreating a host symlink such as `/bin -> usr/bin`).
    Symlink {
        /// Link target, as on the host.
        target: String,
        /// Sandbox path.
        dest: SandboxPath,
    },
    /// Bind an entry of an earlier writable bind onto itself (a profile's
    /// `protect` list): read-only for a protected entry, read-write for a
    /// directory on the way to one, which as a mount point cannot be
    /// renamed or removed (rename(2), rmdir(2): `EBUSY`), so the entry
    /// cannot be swapped out by moving its parent. The target is opened
    /// without following any symlink; it must exist (the launcher creates
    /// a placeholder for a missing entry before the run).
    Protect {
        /// The entry's host path (for messages and the launcher's
        /// placeholder).
        source: String,
        /// Sandbox path.
        dest: SandboxPath,
        /// Read-only (a protected entry) or read-write (a pinned parent).
        read_only: bool,
        /// While the entry is missing, the launcher's placeholder is a
        /// directory (project entries: git ignores empty directories, so
        /// `git add -A` never commits one), else an empty file (a home
        /// directory's start-up files, which programs read as files).
        dir: bool,
    },
    /// Mount a fresh tmpfs.
    Tmpfs {
        /// Sandbox path.
        dest: SandboxPath,
        /// Size limit in bytes.
        size: u64,
        /// Mode of the root directory.
        mode: u32,
    },
}

impl MountOp {
    /// The sandbox path this step creates.
    pub fn dest(&self) -> &SandboxPath {
        match self {
            MountOp::Bind { dest, .. }
            | MountOp::Protect { dest, .. }
            | MountOp::Symlink { dest, .. }
            | MountOp::Tmpfs { dest, .. } => dest,
        }
    }
}

/// A resource limit the program's process gets just before execve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitKind {
    /// `RLIMIT_AS`.
    AddressSpace,
    /// `RLIMIT_CPU`, seconds.
    CpuTime,
    /// `RLIMIT_FSIZE`.
    FileSize,
    /// `RLIMIT_NOFILE`.
    OpenFiles,
    /// `RLIMIT_NPROC`.
    Processes,
    /// `RLIMIT_CORE`.
    Core,
    /// `RLIMIT_SIGPENDING`: signals queued to the sandbox's processes.
    PendingSignals,
}

/// One rlimit: soft and hard values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    /// Which limit.
    pub kind: RlimitKind,
    /// Soft value (the one that triggers).
    pub soft: u64,
    /// Hard value (the ceiling the program cannot raise past).
    pub hard: u64,
}

/// The kernel resource number of a limit.
pub fn rlimit_resource(kind: RlimitKind) -> libc::__rlimit_resource_t {
    match kind {
        RlimitKind::AddressSpace => libc::RLIMIT_AS,
        RlimitKind::CpuTime => libc::RLIMIT_CPU,
        RlimitKind::FileSize => libc::RLIMIT_FSIZE,
        RlimitKind::OpenFiles => libc::RLIMIT_NOFILE,
        RlimitKind::Processes => libc::RLIMIT_NPROC,
        RlimitKind::Core => libc::RLIMIT_CORE,
        RlimitKind::PendingSignals => libc::RLIMIT_SIGPENDING,
    }
}

/// A small file corral writes into the sandbox's root (`/etc/passwd`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedFile {
    /// Sandbox path.
    pub path: SandboxPath,
    /// Contents.
    pub contents: String,
}

/// Everything the helper needs, decided in advance. Sent as JSON over the
/// control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// pid of the corral process that spawned the helper; the helper exits
    /// if its parent is already someone else.
    pub parent_pid: i32,
    /// Who runs the program.
    pub identity: SandboxIdentity,
    /// Hostname in the UTS namespace.
    pub hostname: String,
    /// Size of `/tmp`.
    pub tmp_size: u64,
    /// Whether `/dev/pts` and `/dev/ptmx` exist.
    pub dev_pts: bool,
    /// Filesystem steps, parents before children.
    pub mounts: Vec<MountOp>,
    /// Paths hidden after all mounts.
    pub deny: Vec<SandboxPath>,
    /// Files written into the root.
    pub files: Vec<GeneratedFile>,
    /// Working directory.
    pub cwd: SandboxPath,
    /// Absolute path of the program inside the sandbox.
    pub exec_path: String,
    /// argv, `argv[0]` as requested.
    pub argv: Vec<String>,
    /// Environment as `NAME=VALUE`.
    pub env: Vec<String>,
    /// Resource limits set just before execve.
    pub rlimits: Vec<Rlimit>,
    /// Landlock and seccomp, prepared here so the helper only installs.
    pub security: SecurityPlan,
    /// Set in reduced mode: no namespaces, no mounts; the program runs on
    /// the host filesystem as Landlock allows, in this host directory.
    pub reduced: Option<ReducedPlan>,
    /// The network mode.
    pub network: NetworkMode,
    /// Build the whole sandbox, then wait for the program: init forks the
    /// program's process at once, which takes its steps that need no run
    /// and waits until a [`crate::PROGRAM_MESSAGE`] brings the run's stdio
    /// and its [`ProgramPlan`]. A server prepares sandboxes this way ahead
    /// of its requests (each used once).
    #[serde(default)]
    pub hold: bool,
    /// cgroup v1 `tasks` files a re-executed helper writes `0` to, before
    /// any other step, to move itself into its sandbox's group: a thread
    /// that moves itself takes no global lock, while a move by pid waits
    /// for an RCU grace period holding the lock every cgroup operation of
    /// the host needs. Empty when corral moved it already (or there is no
    /// group); a failure stops the helper before it does anything else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroup_join: Vec<String>,
}

/// The part of a plan that is the program rather than its sandbox: what a
/// held sandbox ([`SandboxPlan::hold`]) gets when its run arrives. Nothing
/// here changes a namespace, a mount or a rule; the program's own steps
/// (rlimits, working directory, Landlock, seccomp) apply it as for any run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramPlan {
    /// Working directory.
    pub cwd: SandboxPath,
    /// Absolute path of the program inside the sandbox.
    pub exec_path: String,
    /// argv, `argv[0]` as requested.
    pub argv: Vec<String>,
    /// Environment as `NAME=VALUE`.
    pub env: Vec<String>,
    /// Resource limits set just before execve.
    pub rlimits: Vec<Rlimit>,
}

impl SandboxPlan {
    /// The program's part of this plan.
    pub fn program(&self) -> ProgramPlan {
        ProgramPlan {
            cwd: self.cwd.clone(),
            exec_path: self.exec_path.clone(),
            argv: self.argv.clone(),
            env: self.env.clone(),
            rlimits: self.rlimits.clone(),
        }
    }

    /// Puts `program` in place of this plan's own program part.
    pub fn set_program(&mut self, program: ProgramPlan) {
        let ProgramPlan {
            cwd,
            exec_path,
            argv,
            env,
            rlimits,
        } = program;
        self.cwd = cwd;
        self.exec_path = exec_path;
        self.argv = argv;
        self.env = env;
        self.rlimits = rlimits;
    }

    /// Whether `other` builds exactly the sandbox this plan builds: equal
    /// in everything but the program part, [`SandboxPlan::hold`] and how
    /// the helper joined its group ([`SandboxPlan::cgroup_join`]). Only
    /// then may a sandbox held for this plan run `other`'s program.
    /// Compared field by field, without a copy (once per request); the
    /// destructuring makes a new field a compile error here until it is
    /// sorted into one side or the other.
    pub fn same_sandbox(&self, other: &SandboxPlan) -> bool {
        let SandboxPlan {
            parent_pid,
            identity,
            hostname,
            tmp_size,
            dev_pts,
            mounts,
            deny,
            files,
            security,
            reduced,
            network,
            // The program part, and how the sandbox was started.
            cwd: _,
            exec_path: _,
            argv: _,
            env: _,
            rlimits: _,
            hold: _,
            cgroup_join: _,
        } = self;
        *parent_pid == other.parent_pid
            && *identity == other.identity
            && *hostname == other.hostname
            && *tmp_size == other.tmp_size
            && *dev_pts == other.dev_pts
            && *mounts == other.mounts
            && *deny == other.deny
            && *files == other.files
            && *security == other.security
            && *reduced == other.reduced
            && *network == other.network
    }
}

/// Port of the HTTP proxy on the sandbox's loopback (mode `allow`).
pub const HTTP_PROXY_PORT: u16 = 3128;
/// Port of the SOCKS5 proxy on the sandbox's loopback (mode `allow`).
pub const SOCKS_PROXY_PORT: u16 = 1080;

/// Reduced mode's own facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReducedPlan {
    /// The workspace, a host directory (also the working directory).
    pub workdir: String,
}

/// The Landlock rules and compiled seccomp filters of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityPlan {
    /// Which seccomp profile the filters implement.
    pub seccomp_profile: SeccompProfile,
    /// The compiled filters, installed last.
    pub filters: CompiledFilters,
    /// The filter init (PID 1) installs once the program runs: only what a
    /// reaper needs (wait, signals, its report to corral, exit, memory).
    #[serde(default)]
    pub init_filters: CompiledFilters,
    /// The Landlock rules.
    pub landlock: LandlockPlan,
}

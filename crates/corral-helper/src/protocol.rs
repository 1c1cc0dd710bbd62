//! Messages on the control socket between corral and its sandbox helper.
//!
//! The parent sends one [`crate::SandboxPlan`] as JSON in a sealed memfd
//! attached to a [`PLAN_MESSAGE`] (a forked helper has its plan already
//! and gets [`GO_AHEAD`]). The helper, the
//! sandbox's init and the program's pre-exec child answer with
//! [`HelperMessage`]s, one JSON object per `SOCK_SEQPACKET` message. The
//! program's copy of the socket is close-on-exec, so a successful exec
//! sends nothing; init reports how the program ended.

use serde::{Deserialize, Serialize};

/// What went wrong while building the sandbox, by stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The plan could not be read.
    Protocol,
    /// Dropping root to the sandbox identity failed.
    Identity,
    /// User namespaces are not available to this user on this host.
    UserNamespace,
    /// Another namespace could not be created.
    Namespace,
    /// A mount step failed.
    Mount,
    /// Hostname, loopback or another small step failed.
    Setup,
    /// Dropping privileges failed.
    Privileges,
    /// Landlock or seccomp could not be put in force.
    Security,
    /// execve failed with ENOENT.
    ExecNotFound,
    /// execve failed otherwise (EACCES, ENOEXEC, ...).
    ExecFailed,
}

/// A message from the helper side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HelperMessage {
    /// Setup failed; nothing of the program ran.
    Failed {
        /// The stage.
        kind: FailureKind,
        /// What failed, with paths and the errno name.
        message: String,
    },
    /// The proxy's listening sockets, created inside the sandbox's network
    /// namespace, are attached to this message (`SCM_RIGHTS`): HTTP first,
    /// then SOCKS5.
    Listeners {
        /// Port of the HTTP proxy inside the sandbox.
        http_port: u16,
        /// Port of the SOCKS5 proxy inside the sandbox.
        socks_port: u16,
    },
    /// The program's last layers are in force (sent just before execve).
    Layers {
        /// How Landlock ended up.
        landlock: crate::landlock::LandlockOutcome,
    },
    /// The program ended, and every other process of the sandbox was
    /// killed and reaped: only init (or the reduced-mode helper) is left,
    /// and it leaves next.
    Exited {
        /// Exit code, when it exited.
        code: Option<i32>,
        /// Signal, when a signal killed it.
        signal: Option<i32>,
        /// CPU time (user plus system) of every process init reaped, in
        /// microseconds: what `wait4` on the helper would add up, less
        /// init and the helper themselves.
        cpu_us: u64,
        /// Largest resident set of any of them, in bytes.
        max_rss_bytes: u64,
    },
}

/// Largest plan a helper accepts. The plan travels in a sealed memfd, not
/// in the socket message, so it is bounded by this and not by the socket
/// buffer (argv and environment of a run can be megabytes).
pub const MAX_PLAN_BYTES: usize = 64 << 20;

/// The bytes of the message that carries a re-executed helper's plan: the
/// run's stdin, stdout and stderr and a sealed memfd holding the plan as
/// JSON are attached to it (`SCM_RIGHTS`), in that order.
pub const PLAN_MESSAGE: &[u8] = b"plan";

/// The bytes of the message that starts the program of a held sandbox
/// ([`crate::SandboxPlan::hold`]): the run's stdin, stdout and stderr and
/// a sealed memfd holding its [`crate::ProgramPlan`] as JSON are attached
/// (`SCM_RIGHTS`), in that order. The program's process, forked ahead by
/// init, reads it; end of file instead means corral let the sandbox go
/// unused.
pub const PROGRAM_MESSAGE: &[u8] = b"program";

/// What the parent sends a forked helper (which already has its plan) once
/// it sits in its cgroup.
pub const GO_AHEAD: &[u8] = b"go";

/// What corral sends init it cloned before the sandbox's cgroup existed
/// (cgroup v1, `corral run`): the group's `tasks` files, opened for
/// writing by corral, are attached (`SCM_RIGHTS`), one per hierarchy.
/// init moves itself in through them once it has built the sandbox's root
/// and before it starts the program; end of file instead means corral is
/// gone.
pub const JOIN_MESSAGE: &[u8] = b"join";

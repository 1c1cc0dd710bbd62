//! The result of one run: what `corral run --json` prints and what the
//! service returns. Field names carry their units; the schema is documented
//! in README.md and only grows.

use corral_policy::AuditEvent;
use serde::Serialize;

/// Which protections were in force for this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Enforced {
    /// Namespaces the program ran in.
    pub namespaces: Vec<&'static str>,
    /// Host uid the program ran as (never 0).
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
    /// Whether every capability was dropped, the bounding set included:
    /// false only in reduced mode as an ordinary user, who cannot empty
    /// the bounding set (`no_new_privs` keeps it unusable).
    pub capabilities_dropped: bool,
    /// Whether no_new_privs was set (always true).
    pub no_new_privs: bool,
    /// Root filesystem: "pivot_root" into a fresh read-only tmpfs.
    pub root: &'static str,
    /// rlimits set, e.g. `{"open_files": 1024}`.
    pub rlimits: std::collections::BTreeMap<String, u64>,
    /// The cgroup holding the sandbox, when there is one.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub cgroup: Option<corral_cgroup::CgroupEnforced>,
    /// Limits the policy asked for that this host could not enforce (only
    /// with `allow_unenforced`), e.g. `["memory", "pids"]`.
    pub not_enforced: Vec<String>,
    /// The seccomp profile installed (`default` or `strict`).
    pub seccomp: Option<String>,
    /// Landlock as enforced: the kernel ABI and the ruleset status.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub landlock: Option<corral_helper::LandlockOutcome>,
    /// The network mode: `none` (loopback only), `allow` (corral's proxy
    /// only) or `host`.
    pub network: String,
}

impl Enforced {
    /// Reduced mode: no namespaces, no private root.
    pub fn reduced(uid: u32, gid: u32) -> Self {
        Enforced {
            namespaces: Vec::new(),
            network: "none (reduced mode: no network namespace; seccomp refuses every socket(2))"
                .into(),
            root: "host filesystem through Landlock only (reduced mode)",
            ..Enforced::full_sandbox(uid, gid)
        }
    }

    /// The namespace and privilege layers every sandbox gets.
    pub fn full_sandbox(uid: u32, gid: u32) -> Self {
        Enforced {
            namespaces: vec!["user", "mount", "pid", "ipc", "uts", "net", "cgroup"],
            uid,
            gid,
            capabilities_dropped: true,
            no_new_privs: true,
            root: "pivot_root",
            rlimits: std::collections::BTreeMap::new(),
            cgroup: None,
            not_enforced: Vec::new(),
            seccomp: None,
            landlock: None,
            network: "none".into(),
        }
    }
}

/// corral's own error, when the program did not run (or did not run to
/// completion because corral refused or failed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorInfo {
    /// Stable code, e.g. `command.not_allowed`, `sandbox.user_namespace`.
    pub code: String,
    /// What happened and what to do.
    pub message: String,
}

/// One run's outcome.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunResult {
    /// corral's exit status: the program's code, 128+N for signal N, 125
    /// corral error, 126 not executable, 127 not found.
    pub exit_code: i32,
    /// The signal that ended the program, if one did.
    pub signal: Option<i32>,
    /// Whether the wall-clock timeout ended the run.
    pub timed_out: bool,
    /// Whether the kernel's OOM killer killed a process of the sandbox
    /// (needs the memory cgroup; `false` when none was in force).
    pub oom_killed: bool,
    /// Whether an output stream passed its kill ceiling, so the sandbox
    /// was killed.
    pub output_limit_exceeded: bool,
    /// Every limit this run ran into, in this order: `timeout`, `output`
    /// (the kill ceiling), `memory` (an OOM kill), `pids` (a fork failed at
    /// the cgroup's pids limit, from its `pids.events`), `file_size` (the
    /// program was ended by SIGXFSZ under a `file_size` limit), `cpu_time`
    /// (ended by SIGXCPU under a `cpu_time_secs` limit). Empty when none.
    pub limits_hit: Vec<&'static str>,
    /// Captured standard output (UTF-8, invalid bytes replaced).
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// Bytes the program wrote to stdout in total.
    pub stdout_bytes: u64,
    /// Bytes the program wrote to stderr in total.
    pub stderr_bytes: u64,
    /// Whether `stdout` holds less than the program wrote.
    pub stdout_truncated: bool,
    /// Whether `stderr` holds less than the program wrote.
    pub stderr_truncated: bool,
    /// Wall-clock time from launch to the end of the sandbox, in ms.
    pub wall_ms: u64,
    /// CPU time (user + system) of every process of the sandbox, in ms.
    pub cpu_ms: u64,
    /// Peak memory: the cgroup's peak when one was in force, else the
    /// largest resident set of any single process.
    pub peak_memory_bytes: u64,
    /// corral's own error, if any.
    pub error: Option<ErrorInfo>,
    /// Security events of this run (stripped variables, refusals).
    pub events: Vec<AuditEvent>,
    /// Protections in force; `null` when the sandbox never started.
    pub enforced: Option<Enforced>,
}

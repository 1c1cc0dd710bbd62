//! corral's launcher: from a profile and a request to a finished sandbox
//! and its result. Runs in corral's own process (the CLI or the server).
//!
//! The data flow of one run ([`execute`]):
//!
//! 1. **Plan** ([`build_plan`]): the command is checked and resolved, the
//!    environment built, mounts ordered, rlimits clamped, Landlock rules
//!    listed and the seccomp filters compiled, into a [`SandboxPlan`]. Pure
//!    apart from looking at the host filesystem.
//! 2. **Contain** ([`RunCgroup`]): the run's cgroup with its limits, or a
//!    refusal when a limit cannot be enforced (fail closed), or the record
//!    of what is not enforced when the profile accepts that.
//! 3. **Launch** ([`launch`]): start the helper (forked from the
//!    single-threaded CLI, or re-executed: [`ReadyHelper`]), put it in the
//!    cgroup, hand it the plan, drain output, enforce the timeout and the
//!    output ceiling, run the egress proxy of network mode `allow`.
//! 4. **Result** ([`RunResult`]): what ran, how it ended, what was in force.
//!
//! What runs inside the sandbox is the `corral-helper` crate; this crate
//! never runs code between a fork and an `execve` except `dup2`s (and the
//! CLI's forked helper or cloned init, which check it is single-threaded
//! first).
#![forbid(unsafe_code)]

mod contain;
mod egress;
mod events;
mod execute;
mod gate;
mod host_paths;
mod launch;
mod output;
mod plan;
mod prepared;
mod protect;
mod pump;
mod reexec;
mod resolve;
mod result;
mod seccomp;

pub use contain::{cgroup_limits, LimitsUnenforceable, RunCgroup, RunCgroupStats};
pub use corral_cgroup::{CgroupEnforced, CgroupHost, CgroupLimits, Version as CgroupVersion};
pub use corral_helper::{
    FailureKind, LandlockOutcome, SandboxIdentity, SandboxPlan, EXIT_CORRAL_ERROR,
    EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND,
};
pub use events::{
    command_sha256, new_run_id, rfc3339, EventSink, EventWriter, NoEvents, RunStamp, MAX_EVENT_LINE,
};
pub use execute::{
    execute, ExecuteOptions, Execution, Prestarted, PrestartedSource, Refusal, Remains,
};
pub use gate::PlanGate;
pub use host_paths::{all_within, missing_for_profile, missing_host_paths, MissingHostPath};
pub use launch::{
    is_helper_invocation, launch, Containment, EgressProxy, HelperStart, LaunchError,
    LaunchOptions, Outcome, OutputMode, OutputTap, StartedHelper, StreamResult, FORWARDED_SIGNALS,
};
pub use output::elision_marker;
pub use plan::{build_plan, sandbox_identity, PlanError, RunRequest, PENDING_SIGNALS, WORKSPACE};
pub use prepared::{PrepareError, PreparedSandbox};
pub use protect::PLACEHOLDER_XATTR;
pub use reexec::{fork_helpers_on_this_thread, ReadyHelper};
pub use resolve::{CommandTable, Resolution};
pub use result::{Enforced, ErrorInfo, RunResult};
pub use seccomp::{describe as seccomp_rules, RuleAction, RuleDoc, INIT_ALLOWED as INIT_SYSCALLS};

/// Runs the sandbox helper in this process: the entry point of
/// `corral __sandbox-helper`, and of `corral __sandbox-zygote`, its fork
/// server (see [`is_helper_invocation`]). Never returns.
pub fn helper_main() -> ! {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == corral_helper::ZYGOTE_SUBCOMMAND)
    {
        corral_helper::zygote_main()
    }
    corral_helper::main()
}

//! corral's runtime: turn a profile and a request into a sandbox, run it,
//! and report what happened.
//!
//! - [`plan`] is pure decision-making: command checks, environment, the
//!   ordered list of mounts. It runs in the calling process.
//! - [`helper`] is the single-threaded sandbox helper: corral's own binary
//!   re-entered (`corral __sandbox-helper`) before any async runtime
//!   exists. It creates the namespaces, builds the filesystem, drops
//!   privileges and execs the program.
//! - [`launch`] is the parent side: spawn the helper, hand it the plan over
//!   a control socket, capture output, enforce the timeout, collect the
//!   [`RunResult`].
//! - [`warm`] keeps re-executed helpers started ahead of time for the
//!   server, so a request does not wait for a program start.
#![forbid(unsafe_code)]

pub mod cgroup;
pub mod contain;
pub mod egress;
pub mod execute;
pub mod helper;
pub mod landlock;
pub mod launch;
pub mod output;
pub mod plan;
pub mod protocol;
pub mod resolve;
pub mod result;
pub mod seccomp;
pub mod warm;
pub mod workspace;

pub use launch::{launch, Containment, LaunchError, LaunchOptions, Outcome, OutputMode};
pub use plan::{build_plan, PlanError, RunRequest, SandboxPlan};
pub use resolve::CommandTable;
pub use result::{Enforced, RunResult};

/// The hidden subcommand that re-enters corral's binary as the sandbox
/// helper. `main` must check for it before doing anything else.
pub const HELPER_SUBCOMMAND: &str = "__sandbox-helper";

/// Exit status for corral's own errors (bad policy, rejected command,
/// missing kernel feature), as `env(1)` and container runtimes use it.
pub const EXIT_CORRAL_ERROR: i32 = 125;
/// Exit status when the command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit status when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;

//! Sandboxes built ahead of their run, for a service's latency.
//!
//! A [`PreparedSandbox`] is a re-executed helper that has been given a
//! whole plan with [`SandboxPlan::hold`] set, or, where the thread has a
//! fork server and init can join its group itself, an init that fork
//! server cloned for that plan (see [`ReadyHelper::clone_init`]): it has
//! created its user and other namespaces, init has built the root
//! filesystem, pivoted into it, set the hostname and brought loopback up,
//! and then waits for the program. Nothing untrusted has run in it. When a run comes with the
//! inputs it was built from (the same profile, identity, workspace and
//! binds: [`SandboxInputs`]) and cgroup limits its group was made for,
//! [`crate::execute`] plans only the run's program (argv, environment,
//! working directory, executable, rlimits) and sends it that; otherwise
//! it is let go and the run builds its own sandbox as usual. Each one
//! serves one run: every execution still gets a fresh set of namespaces,
//! only sooner.

use corral_helper::{MountOp, SandboxPlan, PLAN_MESSAGE};
use corral_policy::Profile;

use crate::contain::{cgroup_limits, RunCgroup};
use crate::plan::{build_plan, sandbox_identity, RunRequest, SandboxInputs};
use crate::reexec::ReadyHelper;
use crate::resolve::CommandTable;
use corral_cgroup::CgroupLimits;

/// A sandbox built for a plan and waiting for its program.
pub struct PreparedSandbox {
    helper: ReadyHelper,
    plan: SandboxPlan,
    inputs: SandboxInputs,
    group: RunCgroup,
    made_for: CgroupLimits,
}

/// Why no sandbox could be prepared for a profile. The service then runs
/// its requests the usual way; nothing is refused because of this.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The template request's plan was refused.
    #[error("the plan was refused: {0}")]
    Plan(String),
    /// What the plan asks for cannot be built ahead: reduced mode, or
    /// protected entries (their placeholders and locks belong to one run).
    #[error("this profile's sandbox cannot be built ahead: {0}")]
    Unsupported(&'static str),
    /// The cgroup limits cannot be enforced and the profile does not accept
    /// that.
    #[error("{0}")]
    Limits(#[from] crate::contain::LimitsUnenforceable),
    /// Starting the helper, moving it into its group or sending the plan
    /// failed.
    #[error("starting the prepared sandbox ({what}): {source}")]
    Start {
        /// The step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl std::fmt::Debug for PreparedSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSandbox")
            .field("made_for", &self.made_for)
            .finish_non_exhaustive()
    }
}

impl PreparedSandbox {
    /// Starts building the sandbox `request` would get under `profile`:
    /// plans it (the server's environment never reaches it), makes its
    /// cgroup, and has init cloned for the plan with `hold` set (see
    /// [`ReadyHelper::clone_init`]), or starts a helper in the group and
    /// sends it that plan. Returns as soon as init is cloned or the plan
    /// sent; the helper and init do the rest on their own and then wait.
    /// A failure on their side ends them (see
    /// [`PreparedSandbox::is_alive`]).
    pub fn prepare(
        profile: &Profile,
        commands: &CommandTable,
        request: &RunRequest,
    ) -> Result<PreparedSandbox, PrepareError> {
        let identity = sandbox_identity(profile);
        let (mut plan, _) = build_plan(profile, commands, request, identity, &|_| None)
            .map_err(|e| PrepareError::Plan(e.to_string()))?;
        if plan.reduced.is_some() {
            return Err(PrepareError::Unsupported(
                "reduced mode has no sandbox to hold",
            ));
        }
        if plan
            .mounts
            .iter()
            .any(|m| matches!(m, MountOp::Protect { .. }))
        {
            return Err(PrepareError::Unsupported(
                "protected entries are prepared per run",
            ));
        }
        plan.hold = true;
        let group = RunCgroup::for_limits(&profile.limits)?;
        // Ahead of the request, like the rest of a prepared sandbox.
        group.settle();
        // init cloned straight into the namespaces by the thread's fork
        // server, where it can be: it has the plan and joins the group
        // (cgroup v1, or none) itself, first thing.
        let join = group.as_containment().map(|c| c.self_join_files());
        let clonable = join.as_ref().is_none_or(|files| !files.is_empty());
        let cloned = clonable
            .then(|| ReadyHelper::clone_init(&plan, join.as_deref().unwrap_or_default()))
            .flatten();
        let helper = match cloned {
            Some(init) => init,
            None => match start_helper(&mut plan, &group) {
                Ok(helper) => helper,
                Err(e) => {
                    group.finish();
                    return Err(e);
                }
            },
        };
        Ok(PreparedSandbox {
            helper,
            plan,
            inputs: SandboxInputs::of(profile, identity, request),
            group,
            made_for: cgroup_limits(&profile.limits),
        })
    }

    /// The helper's pid (a child of this process).
    pub fn pid(&self) -> i32 {
        self.helper.pid()
    }

    /// Whether the helper still waits. One whose build failed (or that was
    /// killed) has exited: it is reaped here, and the sandbox must then be
    /// dropped with [`PreparedSandbox::discard_reaped`].
    pub fn is_alive(&self) -> bool {
        matches!(corral_sys::process::waitpid(self.pid(), true), Ok(None))
    }

    /// Drops a sandbox whose helper [`PreparedSandbox::is_alive`] found
    /// dead (and reaped), and removes its group.
    pub fn discard_reaped(self) {
        self.helper.forget_reaped();
        self.group.finish();
    }

    /// Lets an unused sandbox go: the program's process waiting in it sees
    /// its control socket close and exits, init reaps it and exits, which
    /// ends the pid namespace; the helper follows and is reaped, then the
    /// (empty) group is removed.
    pub fn release(self) {
        drop(self.helper);
        self.group.finish();
    }

    /// Whether this sandbox was built from the inputs of `request` under
    /// `profile` (its program aside) and for these cgroup limits. The
    /// caller still plans what paths a run can write may change (see
    /// `plan::program_for_held`).
    pub(crate) fn fits(
        &self,
        profile: &Profile,
        identity: corral_helper::SandboxIdentity,
        request: &RunRequest,
        limits: &CgroupLimits,
    ) -> bool {
        self.made_for == *limits && self.inputs.matches(profile, identity, request)
    }

    /// The plan this sandbox was built from.
    pub(crate) fn plan(&self) -> &SandboxPlan {
        &self.plan
    }

    /// The helper, the group and the plan, for the run that takes this
    /// sandbox.
    pub(crate) fn into_parts(self) -> (ReadyHelper, RunCgroup, SandboxPlan) {
        (self.helper, self.group, self.plan)
    }
}

/// Starts a helper in `group` and sends it `plan`. A failure lets the
/// helper go (dropping it closes its socket, it exits and is reaped); the
/// caller then removes the group.
fn start_helper(plan: &mut SandboxPlan, group: &RunCgroup) -> Result<ReadyHelper, PrepareError> {
    let start = |what| move |source| PrepareError::Start { what, source };
    let helper = ReadyHelper::spawn().map_err(start("spawn"))?;
    // Into the group before it does anything: by itself where it can
    // (cgroup v1: no global lock held across an RCU grace period), else
    // moved by pid now.
    if let Some(c) = group.as_containment() {
        plan.cgroup_join =
            crate::launch::contain_new_helper(c, helper.pid()).map_err(start("cgroup"))?;
    }
    let payload =
        serde_json::to_vec(&plan).map_err(|e| start("encode plan")(std::io::Error::other(e)))?;
    let null = std::fs::File::open("/dev/null").map_err(start("/dev/null"))?;
    use std::os::fd::AsRawFd;
    let n = null.as_raw_fd();
    crate::launch::send_run_message(helper.ctrl_fd(), PLAN_MESSAGE, &[n, n, n], &payload)
        .map_err(start("send plan"))?;
    Ok(helper)
}

//! Sandboxes of the default profile built ahead of the HTTP executions
//! that use them, each with its workspace.
//!
//! The warm helpers ([`crate::warm`]) save a request the helper's program
//! start; this saves it the sandbox too: the namespaces, the root
//! filesystem, `pivot_root`, hostname and loopback (see
//! [`corral_launcher::PreparedSandbox`]). Such a sandbox binds its
//! workspace at `/workspace`, so the workspace is made first and travels
//! with it: a request that takes one writes its input files there (the
//! bind shows them) and sends only the program. Each is used once, so
//! every execution still gets namespaces of its own. A request whose plan
//! differs in anything but the program (another profile, other limits)
//! does not take one; one whose plan turns out to differ lets it go after
//! its answer, and one refused before it ran puts it back when it wrote
//! no input files into its workspace ([`give_back`]).

use std::sync::{Arc, OnceLock};

use corral_launcher::{cgroup_limits, CgroupLimits, PreparedSandbox, RunRequest};
use corral_policy::builtin::DEFAULT_PROFILE;
use corral_policy::Profile;

use crate::state::AppState;
use crate::warm::{Pool, Pooled, Unmade};
use crate::workspace::Workspace;

/// A sandbox built ahead, and the workspace it binds.
pub(crate) struct Held {
    /// The sandbox, waiting for its program.
    pub(crate) sandbox: PreparedSandbox,
    /// Bound at `/workspace` in it; the run writes its files here.
    pub(crate) workspace: Workspace,
}

impl Pooled for Held {
    /// Lets the sandbox go (it exits and is reaped, its group removed),
    /// then removes the workspace, which nothing uses any more.
    fn release(self) {
        self.sandbox.release();
        crate::exec::remove_workspace(self.workspace);
    }
}

static POOL: OnceLock<Pool<Held>> = OnceLock::new();

/// The directory, in the server's directory of workspaces, that holds the
/// workspaces of the sandboxes built ahead (and of the executions that
/// took them).
pub const AHEAD_DIR: &str = "ahead";

/// What the pool's sandboxes were built for.
struct Template {
    name: String,
    limits: CgroupLimits,
}

static TEMPLATE: OnceLock<Template> = OnceLock::new();

/// Sandboxes found dead in a row (their build failed) before the pool
/// stops building them: the host cannot, and requests build their own
/// (and report why).
const MAX_DEAD_IN_A_ROW: usize = 3;

static DEAD_IN_A_ROW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Keeps `count` sandboxes (at most [`crate::warm::MAX_READY`]) of the
/// default profile built and waiting from now on, refilled by a
/// background thread. Without a default profile, or when its sandbox
/// cannot be built ahead (say, its command table resolves nothing), it
/// logs why and keeps none.
pub fn keep_ready(state: Arc<AppState>, count: usize) {
    let Some(pool) = Pool::first(&POOL, count) else {
        return;
    };
    // Their workspaces apart from those of running executions and
    // sessions, so each kind can be told (and counted) at a glance.
    if let Err(e) = crate::state::create_own_dir(&state.workspaces.join(AHEAD_DIR)) {
        tracing::warn!(error = %e, "no sandboxes built ahead of requests");
        return;
    }
    if let Ok(profile) = state.config.profile(DEFAULT_PROFILE) {
        let _ = TEMPLATE.set(Template {
            name: profile.name.clone(),
            limits: cgroup_limits(&profile.limits),
        });
    }
    pool.start("corral-prepared", move || make(&state));
}

/// See [`crate::warm::answered`].
pub(crate) fn answered() {
    if let Some(pool) = POOL.get() {
        pool.answered();
    }
}

/// Puts back one that [`take`] handed out and nothing used: its sandbox
/// untouched, its workspace as it was made. It is the next one handed
/// out (see [`Pool::put_back`]); when the pool does not keep it, it comes
/// back, to be let go after the answer.
#[must_use = "one the pool did not keep must be let go"]
pub(crate) fn give_back(held: Held) -> Option<Held> {
    match POOL.get() {
        Some(pool) => pool.put_back(held),
        None => Some(held),
    }
}

/// Stops the pool and lets every waiting sandbox go.
pub fn shutdown() {
    if let Some(pool) = POOL.get() {
        pool.shutdown();
    }
}

/// Builds one: a workspace as the default profile's runs get, then the
/// sandbox of a run of its first allowed command in it.
fn make(state: &AppState) -> Result<Held, Unmade> {
    if DEAD_IN_A_ROW.load(std::sync::atomic::Ordering::Relaxed) >= MAX_DEAD_IN_A_ROW {
        return Err(Unmade::Never);
    }
    let never = |why: &dyn std::fmt::Display| {
        tracing::info!(reason = %why, "no sandboxes built ahead of requests");
        Unmade::Never
    };
    let profile = state
        .config
        .profile(DEFAULT_PROFILE)
        .map_err(|e| never(&e))?;
    // Still being resolved, or a plan of the profile's waits on the host:
    // later (this thread would wait on it too).
    let commands = state.commands.get(profile).map_err(|_| Unmade::Later)?;
    state.stalls.check(profile).map_err(|_| Unmade::Later)?;
    // Any allowed command that resolves: the program is sent per run.
    let found = commands
        .entries()
        .iter()
        .find(|(_, r)| matches!(r, corral_launcher::Resolution::Found(_)));
    let Some((command, _)) = found else {
        return Err(never(&"the default profile allows no command found here"));
    };
    let workspace = crate::exec::new_workspace_in(&state.workspaces.join(AHEAD_DIR), profile)
        .map_err(|e| {
            tracing::warn!(error = %e, "workspace for a sandbox built ahead");
            Unmade::Later
        })?;
    let request = RunRequest {
        argv: vec![command.clone()],
        workdir: Some(workspace.path().to_path_buf()),
        scratch_workdir: true,
        ..Default::default()
    };
    match PreparedSandbox::prepare(profile, &commands, &request) {
        Ok(sandbox) => Ok(Held { sandbox, workspace }),
        Err(e) => {
            crate::exec::remove_workspace(workspace);
            Err(match e {
                corral_launcher::PrepareError::Start { .. } => Unmade::Later,
                other => never(&other),
            })
        }
    }
}

/// A sandbox built ahead for a run under `profile`, when there is one
/// waiting and `profile` is the default one with the cgroup limits the
/// sandboxes were made for (a run with other limits would not fit one):
/// the oldest one still alive. Ones whose build failed are reaped, cleaned
/// up and skipped; after [`MAX_DEAD_IN_A_ROW`] of them in a row no more
/// are built or handed out.
pub(crate) fn take(profile: &Profile) -> Option<Held> {
    use std::sync::atomic::Ordering;
    if DEAD_IN_A_ROW.load(Ordering::Relaxed) >= MAX_DEAD_IN_A_ROW {
        return None;
    }
    let template = TEMPLATE.get()?;
    if profile.name != template.name || cgroup_limits(&profile.limits) != template.limits {
        return None;
    }
    let pool = POOL.get()?;
    while let Some(held) = pool.pop() {
        if held.sandbox.is_alive() {
            DEAD_IN_A_ROW.store(0, Ordering::Relaxed);
            return Some(held);
        }
        held.sandbox.discard_reaped();
        crate::exec::remove_workspace(held.workspace);
        if DEAD_IN_A_ROW.fetch_add(1, Ordering::Relaxed) + 1 == MAX_DEAD_IN_A_ROW {
            tracing::warn!(
                "sandboxes built ahead keep failing; requests build their own from now on"
            );
        }
    }
    None
}

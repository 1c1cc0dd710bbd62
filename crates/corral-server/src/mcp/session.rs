//! Executions in a workspace that outlives them: an MCP session's.
//!
//! [`crate::exec::run`] gives every execution a fresh workspace and deletes
//! it afterwards. An MCP session instead keeps one workspace for its whole
//! life, so that files written with the `write_file` tool are there for
//! `run_code`, and what the code leaves behind can be read back with
//! `read_file`. [`run_in_workspace`] is `exec::run` for that case: the same
//! [`exec::execute_in`], the same audit record, but the workspace is the
//! caller's and stays.

use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use corral_policy::Profile;

use crate::audit::now_ms;
use crate::error::ApiError;
use crate::exec::{self, ExecutionResponse, Job};
use crate::state::AppState;
use crate::workspace::{FileLimits, Workspace, WorkspaceError};

/// Largest code file corral writes for one execution.
const MAX_CODE_BYTES: u64 = 16 << 20;

/// A workspace that is deleted when the last reference to it goes away.
///
/// Shared (`Arc`) between a session and the executions running in it, so
/// the directory is removed only after the last sandbox using it is done,
/// even when the session ends first. Removal never follows a link the
/// sandbox planted (see [`Workspace::remove`]).
#[derive(Debug)]
pub struct SessionWorkspace(Workspace);

impl SessionWorkspace {
    /// A fresh workspace under the server's own directory (so a restarted
    /// server sweeps it if this one is killed), owned by the uid the
    /// sandbox of `profile` runs as.
    pub fn create(state: &AppState, profile: &Profile) -> Result<SessionWorkspace, WorkspaceError> {
        exec::new_workspace(state, profile).map(SessionWorkspace)
    }
}

impl Deref for SessionWorkspace {
    type Target = Workspace;

    fn deref(&self) -> &Workspace {
        &self.0
    }
}

impl Drop for SessionWorkspace {
    fn drop(&mut self) {
        if let Err(e) = self.0.delete() {
            tracing::warn!(
                workspace = %self.0.path().display(),
                error = %e,
                "session workspace not fully removed"
            );
        }
    }
}

/// Runs a prepared request in an existing workspace (blocking: call from
/// `spawn_blocking`), inside the job's span. The code file, when there is
/// one, is written under the reserved `.corral/` name first; then
/// [`exec::execute_in`] runs it, as it does every HTTP execution. Nothing
/// is collected and the workspace is left in place. One audit record, as
/// for [`exec::run`].
///
/// Callers must not run two executions in one workspace at once: both
/// would write the same code file.
pub fn run_in_workspace(
    state: &AppState,
    job: &Job,
    ws: &Workspace,
    cancel: Arc<AtomicBool>,
) -> Result<ExecutionResponse, ApiError> {
    let _in_span = job.span.enter();
    let since = Instant::now();
    let result = run_here(state, job, ws, cancel);
    job.finish(since, &result);
    result
}

fn run_here(
    state: &AppState,
    job: &Job,
    ws: &Workspace,
    cancel: Arc<AtomicBool>,
) -> Result<ExecutionResponse, ApiError> {
    let started = now_ms();
    // corral's own file: reserved names are allowed to corral itself.
    let own = FileLimits {
        max_file_bytes: MAX_CODE_BYTES,
        max_workspace_bytes: u64::MAX,
        reserved: &[],
    };
    if let Some((path, data)) = &job.prepared.code_file {
        ws.write_file(path, data, &own).map_err(|e| {
            ApiError::new(
                e.code(),
                format!("writing the code file into the session workspace: {e}"),
            )
        })?;
    }
    let (response, remains) = exec::execute_in(state, job, ws, cancel, None, &mut None)?;
    // The session's next call may use the workspace at once: the sandbox
    // is gone before this one is answered.
    if let Some(remains) = remains {
        remains.finish();
    }
    let recorded = exec::record(state, job, started, response);
    // The helper this call took may be replaced now (see `warm::Pool`);
    // a failed call leaves that to the pool's deadline.
    crate::warm::answered();
    recorded
}

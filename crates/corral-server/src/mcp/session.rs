//! Executions in a workspace that outlives them: an MCP session's.
//!
//! [`crate::exec::run`] gives every execution a fresh workspace and deletes
//! it afterwards. An MCP session instead keeps one workspace for its whole
//! life, so that files written with the `write_file` tool are there for
//! `run_code`, and what the code leaves behind can be read back with
//! `read_file`. [`run_in_workspace`] is `exec::run` for that case: same
//! sandbox, same audit record, but the workspace is the caller's and stays.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use corral_policy::env::EnvRequest;
use corral_policy::Profile;
use corral_runtime::execute::{execute, ExecuteOptions};
use corral_runtime::launch::HelperStart;
use corral_runtime::plan::SandboxIdentity;
use corral_runtime::workspace::{FileLimits, Workspace, WorkspaceError};
use corral_runtime::{OutputMode, RunRequest};
use serde_json::{json, Value};

use crate::audit::now_ms;
use crate::error::ApiError;
use crate::exec::{ceilings, Prepared};
use crate::state::AppState;

/// Largest code file corral writes for one execution.
const MAX_CODE_BYTES: u64 = 16 << 20;

/// A workspace that is deleted when the last reference to it goes away.
///
/// Shared (`Arc`) between a session and the executions running in it, so
/// the directory is removed only after the last sandbox using it is done,
/// even when the session ends first. Removal never follows a link the
/// sandbox planted (see [`Workspace::remove`]).
#[derive(Debug)]
pub struct SessionWorkspace(Option<Workspace>);

impl SessionWorkspace {
    /// A fresh workspace under the server's own directory (so a restarted
    /// server sweeps it if this one is killed), owned by the uid the
    /// sandbox of `profile` runs as.
    pub fn create(state: &AppState, profile: &Profile) -> Result<SessionWorkspace, WorkspaceError> {
        let identity = SandboxIdentity::for_current_process(profile);
        let owner = identity
            .drop_from_root
            .then_some((identity.uid, identity.gid));
        Workspace::create(&state.work_dir, owner).map(|ws| SessionWorkspace(Some(ws)))
    }
}

impl Deref for SessionWorkspace {
    type Target = Workspace;

    fn deref(&self) -> &Workspace {
        // Only `drop` takes the workspace out.
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for SessionWorkspace {
    fn drop(&mut self) {
        if let Some(ws) = self.0.take() {
            let path = ws.path().display().to_string();
            if let Err(e) = ws.remove() {
                eprintln!("corral: session workspace {path} not fully removed: {e}");
            }
        }
    }
}

/// Runs a prepared request in an existing workspace (blocking: call from
/// `spawn_blocking`). The code file, when there is one, is written under
/// the reserved `.corral/` name first; nothing is collected and the
/// workspace is left in place. One audit record, as for [`crate::exec::run`].
///
/// Callers must not run two executions in one workspace at once: both
/// would write the same code file.
pub fn run_in_workspace(
    state: &AppState,
    tenant: &str,
    id: &str,
    prepared: Prepared,
    ws: &Workspace,
    cancel: Arc<AtomicBool>,
) -> Result<Value, ApiError> {
    let started = now_ms();
    let internal = |m: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m);
    // corral's own file: reserved names are allowed to corral itself.
    let own = FileLimits {
        max_file_bytes: MAX_CODE_BYTES,
        max_workspace_bytes: u64::MAX,
        reserved: &[],
    };
    if let Some((path, data)) = &prepared.code_file {
        ws.write_file(path, data, &own).map_err(|e| {
            ApiError::new(
                StatusCode::CONFLICT,
                e.code(),
                format!("writing the code file into the session workspace: {e}"),
            )
        })?;
    }
    let stdin = stdin_file(state, prepared.stdin.as_deref())
        .map_err(|e| internal(format!("preparing stdin: {e}")))?;
    let request = RunRequest {
        argv: prepared.argv.clone(),
        workdir: Some(ws.path().to_path_buf()),
        env: EnvRequest {
            pass: Vec::new(),
            set: prepared.env.clone(),
        },
        ..Default::default()
    };
    let commands = state
        .commands
        .get(&prepared.profile.name)
        .cloned()
        .unwrap_or_default();
    let opts = ExecuteOptions {
        output: OutputMode::Capture,
        // This process has threads: the helper is always re-executed.
        helper: HelperStart::ReExec,
        forward_signals: false,
        cancel: Some(cancel.clone()),
        stdin: Some(Arc::new(stdin)),
        tap: None,
    };
    // The server's own environment never reaches a sandbox.
    let outcome = execute(
        &prepared.profile,
        &commands,
        &request,
        &|_| None,
        opts,
        &mut |_| {},
    );
    let (mut body, status) = match outcome {
        Ok(done) => {
            let m = &state.metrics;
            if done.result.timed_out {
                m.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            if done.result.oom_killed {
                m.oom_killed.fetch_add(1, Ordering::Relaxed);
            }
            (
                serde_json::to_value(&done.result).unwrap_or_else(|_| json!({})),
                StatusCode::OK,
            )
        }
        Err(r) => (
            json!({"exit_code": r.exit_code, "error": {"code": r.code, "message": r.message}, "events": r.events}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    };
    if let Value::Object(map) = &mut body {
        map.insert("id".into(), json!(id));
        map.insert("tenant".into(), json!(tenant));
        map.insert("profile".into(), json!(prepared.profile.name));
        map.insert("limits".into(), ceilings(&prepared.profile));
        map.insert("cancelled".into(), json!(cancel.load(Ordering::Relaxed)));
    }
    crate::exec::record_and_answer(state, tenant, id, &prepared, started, body, status)
}

/// `/dev/null`, or an unlinked file in the server's directory holding the
/// input.
fn stdin_file(state: &AppState, data: Option<&[u8]>) -> std::io::Result<std::fs::File> {
    let Some(data) = data else {
        return std::fs::File::open("/dev/null");
    };
    use std::io::{Seek, Write};
    let path = state
        .work_dir
        .join(format!(".corral-stdin-{}", crate::exec::new_id()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    f.write_all(data)?;
    f.rewind()?;
    Ok(f)
}

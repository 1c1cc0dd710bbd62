//! One execution: validated into a profile and a command ([`prepare()`]),
//! run in a workspace, recorded, answered as an [`ExecutionResponse`].
//!
//! The HTTP API ([`run`]: a fresh workspace per execution) and MCP
//! (`mcp::session::run_in_workspace`: the session's workspace) share
//! [`execute_in`] and [`record`]; each execution runs inside its own
//! `execution` tracing span ([`Job::span`]).

mod prepare;
mod response;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use corral_launcher::{
    execute, sandbox_identity, EventSink, ExecuteOptions, HelperStart, NoEvents, OutputMode,
    OutputTap, PlanGate, PreparedSandbox, Remains, RunRequest,
};
use corral_policy::env::EnvRequest;
use corral_policy::Profile;

pub use prepare::{prepare, prepare_code, ExecutionRequest, Language, Prepared};
pub use response::{Ceilings, Encoding, ExecutionResponse, Outputs, RunOutcome};
#[cfg(test)]
pub(crate) use response::{OutputFile, OutputsStatus};

use crate::audit::{now_ms, AuditRecord, OutputKeeping};
use crate::auth::sha256_hex;
use crate::error::ApiError;
use crate::state::AppState;
use crate::workspace::{FileLimits, Workspace, WorkspaceError, DEFAULT_RESERVED};

/// Largest input file, and all input files together.
pub const MAX_INPUT_BYTES: u64 = 16 << 20;

/// Most input files of one request.
pub const MAX_INPUT_FILES: usize = 10_000;

/// An admitted execution: its id, its tenant, what runs, and the tracing
/// span everything about it is logged in.
#[derive(Debug)]
pub struct Job {
    /// The execution id.
    pub id: String,
    /// The tenant's name.
    pub tenant: String,
    /// What runs.
    pub prepared: Prepared,
    /// The `execution` span (a child of the request's or tool call's).
    pub span: tracing::Span,
}

impl Job {
    /// A job and its span, as a child of the current span: call it where
    /// the request is handled, before the work moves to a blocking thread.
    pub fn new(id: String, tenant: String, prepared: Prepared) -> Job {
        let span = tracing::info_span!(
            "execution",
            execution_id = %id,
            tenant = %tenant,
            profile = %prepared.profile.name,
            outcome = tracing::field::Empty,
            exit_code = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        Job {
            id,
            tenant,
            prepared,
            span,
        }
    }

    /// Logs the end of the execution in its span: the outcome (the
    /// result's [`outcome_label`](ExecutionResponse::outcome_label), or
    /// the error's code), the exit status and the duration.
    pub fn finish(&self, since: Instant, result: &Result<ExecutionResponse, ApiError>) {
        self.finished(since, result).log();
    }

    /// What [`Job::finish`] logs, taken from `result` without formatting
    /// anything: an answer can go out first and the line follow (a log
    /// line costs tens of microseconds, which one execution's answer
    /// would otherwise wait for).
    pub fn finished(
        &self,
        since: Instant,
        result: &Result<ExecutionResponse, ApiError>,
    ) -> Finished {
        let ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        let end = match result {
            Ok(r) => End::Ran {
                outcome: r.outcome_label(),
                exit_code: r.exit_code(),
            },
            Err(ApiError::Refused(r)) => End::Refused {
                exit_code: r.exit_code(),
                code: r.refusal_code().unwrap_or_default().to_owned(),
            },
            Err(e) => End::Failed {
                server_error: e.status().is_server_error(),
                code: e.code().to_owned(),
                error: e.to_string(),
            },
        };
        Finished {
            span: self.span.clone(),
            ms,
            end,
        }
    }
}

/// The end of an execution, to be logged in its span ([`Job::finished`]).
#[derive(Debug)]
pub struct Finished {
    span: tracing::Span,
    ms: u64,
    end: End,
}

#[derive(Debug)]
enum End {
    Ran {
        outcome: &'static str,
        exit_code: i32,
    },
    Refused {
        exit_code: i32,
        code: String,
    },
    Failed {
        server_error: bool,
        code: String,
        error: String,
    },
}

impl Finished {
    /// Writes the line: the outcome, the exit status and the duration,
    /// recorded in the execution's span.
    pub fn log(self) {
        let span = &self.span;
        // Entered, so the line carries the request's span too (the
        // formatter lists the spans entered on this thread).
        let _in = span.enter();
        span.record("duration_ms", self.ms);
        match self.end {
            End::Ran { outcome, exit_code } => {
                span.record("outcome", outcome);
                span.record("exit_code", exit_code);
                tracing::info!("execution finished");
            }
            End::Refused { exit_code, code } => {
                span.record("outcome", "refused");
                span.record("exit_code", exit_code);
                tracing::info!(code = %code, "execution refused");
            }
            End::Failed {
                server_error: true,
                code,
                error,
            } => {
                span.record("outcome", "error");
                tracing::error!(code = %code, error = %error, "execution failed");
            }
            End::Failed { code, error, .. } => {
                span.record("outcome", "error");
                tracing::info!(code = %code, error = %error, "execution refused");
            }
        }
    }
}

/// Sets the cancellation flag when dropped before [`disarm`] was called:
/// a handler dropped before its execution finished means the client went
/// away.
///
/// [`disarm`]: CancelOnDrop::disarm
#[derive(Debug)]
pub struct CancelOnDrop {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl CancelOnDrop {
    /// A guard over `flag`, armed.
    pub fn new(flag: Arc<AtomicBool>) -> CancelOnDrop {
        CancelOnDrop { flag, armed: true }
    }

    /// The execution finished: dropping the guard no longer cancels it.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

/// A fresh random execution id: 12 bytes from the kernel's random source
/// (`getrandom(2)`), as 24 hex digits. When the kernel cannot give them,
/// the request fails with 500 `internal`: an id is never made up from
/// anything guessable.
pub fn new_id() -> Result<String, ApiError> {
    id_from(getrandom::fill)
}

/// An id from the bytes `fill` provides, or the error it reports.
fn id_from<E: std::fmt::Display>(
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<String, ApiError> {
    let mut bytes = [0u8; 12];
    fill(&mut bytes).map_err(|e| {
        ApiError::internal(format!(
            "no execution id: the system's random source failed: {e}"
        ))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A fresh workspace under the server's own directory, owned by the uid
/// the sandbox of `profile` runs as (when the server is root): a tmpfs of
/// the profile's `workspace_size` when the server has its own mount
/// namespace (see [`crate::mounts`]).
pub fn new_workspace(state: &AppState, profile: &Profile) -> Result<Workspace, WorkspaceError> {
    new_workspace_in(&state.workspaces, profile)
}

/// [`new_workspace`] in `base`, a directory of the server's own.
pub(crate) fn new_workspace_in(
    base: &std::path::Path,
    profile: &Profile,
) -> Result<Workspace, WorkspaceError> {
    let identity = sandbox_identity(profile);
    let owner = identity
        .drop_from_root
        .then_some((identity.uid, identity.gid));
    let size =
        crate::mounts::workspaces_bounded().then(|| profile.filesystem.workspace_size.bytes());
    Workspace::create(base, owner, size)
}

/// Runs an HTTP execution (blocking: call from `spawn_blocking`), with
/// output chunks also handed to `tap` as they arrive.
///
/// The execution gets a fresh workspace with the request's files; the
/// regular files it leaves under `output/` are collected into the result,
/// then the workspace is removed and the record written.
///
/// The answer stands before the sandbox is torn down: what is left of it
/// (its last processes, cgroup and workspace) comes back as a [`Cleanup`],
/// which the caller finishes after answering; so does the execution's
/// log line.
pub fn run(
    state: &AppState,
    job: &Job,
    cancel: Arc<AtomicBool>,
    tap: Option<OutputTap>,
) -> (Result<ExecutionResponse, ApiError>, Cleanup) {
    let _in_span = job.span.enter();
    let since = Instant::now();
    let mut cleanup = Cleanup::default();
    let result = run_in_fresh_workspace(state, job, cancel, tap, &mut cleanup);
    cleanup.finished = Some(job.finished(since, &result));
    (result, cleanup)
}

/// What an answered execution still holds: its log line, the sandbox on
/// its way out, then the workspace it used. [`Cleanup::finish`] (or
/// dropping it) writes the first, waits for the second and removes both;
/// blocking, milliseconds.
#[derive(Default)]
#[must_use = "an execution's sandbox and workspace must be cleaned up once it is answered"]
pub struct Cleanup {
    finished: Option<Finished>,
    remains: Option<Remains>,
    /// A sandbox built ahead that the run took but did not use and that
    /// cannot go back to the pool (input files were written into its
    /// workspace, or the pool is full): it binds `workspace`, so it goes
    /// first.
    unused: Option<PreparedSandbox>,
    workspace: Option<Workspace>,
}

impl Cleanup {
    /// Logs the execution's end, waits for the sandbox to be gone, then
    /// removes its workspace.
    pub fn finish(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if let Some(line) = self.finished.take() {
            line.log();
        }
        let ran = self.remains.is_some() || self.workspace.is_some();
        if let Some(remains) = self.remains.take() {
            remains.finish();
        }
        if let Some(sandbox) = self.unused.take() {
            sandbox.release();
        }
        if let Some(ws) = self.workspace.take() {
            remove_workspace(ws);
        }
        // Off this run's path now: what it took may be replaced.
        if ran {
            crate::warm::answered();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.release();
    }
}

fn run_in_fresh_workspace(
    state: &AppState,
    job: &Job,
    cancel: Arc<AtomicBool>,
    tap: Option<OutputTap>,
    cleanup: &mut Cleanup,
) -> Result<ExecutionResponse, ApiError> {
    let started = now_ms();
    let prepared = &job.prepared;
    // A sandbox built ahead comes with its workspace (it binds it).
    let (ws, mut sandbox) = match crate::prepared::take(&prepared.profile) {
        Some(held) => (held.workspace, Some(held.sandbox)),
        None => (
            new_workspace(state, &prepared.profile)
                .map_err(|e| ApiError::internal(format!("creating the workspace: {e}")))?,
            None,
        ),
    };
    // Callers may not write corral's reserved names; corral writes the code
    // file there itself. The totals were checked when the request was
    // prepared, and the workspace is new: no write measures it again.
    let callers = FileLimits {
        max_file_bytes: MAX_INPUT_BYTES,
        max_workspace_bytes: u64::MAX,
        reserved: DEFAULT_RESERVED,
    };
    let own = FileLimits {
        reserved: &[],
        ..callers
    };
    let writes = prepared
        .files
        .iter()
        .map(|(p, d)| (p, d, &callers))
        .chain(prepared.code_file.iter().map(|(p, d)| (p, d, &own)));
    for (path, data, limits) in writes {
        if let Err(e) = ws.write_file(path, data, limits) {
            // Let go after the answer, not on its path.
            cleanup.unused = sandbox;
            cleanup.workspace = Some(ws);
            return Err(ApiError::InputFile(e));
        }
    }
    let outcome =
        execute_in(state, job, &ws, cancel, tap, &mut sandbox).map(|(mut response, remains)| {
            // Nothing of the program runs any more: its outputs are final.
            response.outputs = Some(Outputs::collect(&ws));
            cleanup.remains = remains;
            response
        });
    match sandbox {
        // Refused before anything reached the sandbox built ahead: with
        // its workspace as it was made, the next request can have both.
        Some(sandbox) if prepared.files.is_empty() && prepared.code_file.is_none() => {
            let held = crate::prepared::Held {
                sandbox,
                workspace: ws,
            };
            if let Some(kept_not) = crate::prepared::give_back(held) {
                cleanup.unused = Some(kept_not.sandbox);
                cleanup.workspace = Some(kept_not.workspace);
            }
        }
        unused => {
            cleanup.unused = unused;
            cleanup.workspace = Some(ws);
        }
    }
    record(state, job, started, outcome?)
}

/// Removes an execution's workspace; a failure is logged (the directory
/// then stays until the server's own directory is removed).
pub(crate) fn remove_workspace(ws: Workspace) {
    let path = ws.path().to_path_buf();
    if let Err(e) = ws.remove() {
        tracing::warn!(workspace = %path.display(), error = %e, "workspace not fully removed");
    }
}

/// Runs a prepared request in `ws`, which the caller has set up and
/// removes (blocking: call from `spawn_blocking`). The one place where the
/// HTTP API ([`run`]) and MCP (`mcp::session::run_in_workspace`) build the
/// execution: its options, the call to the runtime, the metrics and the
/// service's fields of the result. A refusal of the runtime is an
/// `Ok` response with a [`RunOutcome::Refused`] outcome: it is recorded
/// like any execution, see [`record`]. No outputs are collected here.
/// `sandbox`: one built ahead with `ws` bound (see [`crate::prepared`]),
/// taken when the run has the inputs it was built from, and left there
/// when the run is refused (nothing was sent to it). The response comes
/// with what is left of the sandbox, to be finished before `ws` is
/// removed (see [`Remains`]).
pub fn execute_in(
    state: &AppState,
    job: &Job,
    ws: &Workspace,
    cancel: Arc<AtomicBool>,
    tap: Option<OutputTap>,
    sandbox: &mut Option<PreparedSandbox>,
) -> Result<(ExecutionResponse, Option<Remains>), ApiError> {
    let prepared = &job.prepared;
    let stdin = stdin_file(&state.work_dir, prepared.stdin.as_deref())
        .map_err(|e| ApiError::internal(format!("preparing stdin: {e}")))?;
    let request = RunRequest {
        argv: prepared.argv.clone(),
        workdir: Some(ws.path().to_path_buf()),
        // corral's own scratch directory, read back only through the API.
        scratch_workdir: true,
        env: EnvRequest {
            pass: Vec::new(),
            set: prepared.env.clone(),
        },
        ..Default::default()
    };
    let gate = Arc::new(PlanGate::new());
    let opts = ExecuteOptions {
        output: OutputMode::Capture,
        // This process has threads: the helper is always re-executed.
        helper: HelperStart::ReExec,
        forward_signals: false,
        cancel: Some(cancel.clone()),
        stdin: Some(Arc::new(stdin)),
        tap,
        prestarted: Some(crate::warm::take),
        prepared: None,
        gate: Some(gate.clone()),
    };
    let profile = &prepared.profile;
    // Refused before the sandbox built ahead is taken: it stays there.
    let table = state.commands.get(profile);
    let ran = table.and_then(|t| state.stalls.check(profile).map(|()| t));
    // Planned on a thread the run can leave behind, should the host not
    // answer (see `crate::host`); the server's own environment never
    // reaches a sandbox.
    let ran = ran.and_then(|commands| {
        let opts = ExecuteOptions {
            prepared: sandbox.take(),
            ..opts
        };
        let owned = profile.clone();
        crate::host::execute_bounded(
            &state.stalls,
            profile,
            crate::host::plan_limit(profile.limits.timeout_secs),
            gate,
            move || {
                let sink: Arc<dyn EventSink> = Arc::new(NoEvents);
                execute(&owned, &commands, &request, &|_| None, opts, &sink)
            },
            // A sandbox built ahead that the run given up took: its
            // workspace was removed with the answer; the sandbox goes now.
            |late| {
                if let Err(refused) = late {
                    if let Some(sandbox) = refused.unused {
                        sandbox.release();
                    }
                }
            },
        )
    });
    let (outcome, remains) = match ran {
        Ok(done) => {
            let m = &state.metrics;
            if done.result.timed_out {
                m.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            if done.result.oom_killed {
                m.oom_killed.fetch_add(1, Ordering::Relaxed);
            }
            (RunOutcome::Ran(Box::new(done.result)), Some(done.remains))
        }
        Err(mut refusal) => {
            *sandbox = refusal.unused.take().map(|b| *b);
            (refusal.into(), None)
        }
    };
    let response = ExecutionResponse {
        id: job.id.clone(),
        tenant: job.tenant.clone(),
        profile: prepared.profile.name.clone(),
        limits: Ceilings::of(&prepared.profile),
        cancelled: cancel.load(Ordering::Relaxed),
        outcome,
        outputs: None,
    };
    Ok((response, remains))
}

/// Stores the audit record of a finished execution (its answer is kept
/// even when storing fails) and turns a refused one into its API error,
/// whose body is the record.
pub fn record(
    state: &AppState,
    job: &Job,
    started: u64,
    response: ExecutionResponse,
) -> Result<ExecutionResponse, ApiError> {
    let prepared = &job.prepared;
    let finished = now_ms();
    let outcome = match &response.outcome {
        RunOutcome::Refused(_) => "refused",
        RunOutcome::Ran(r) if r.timed_out => "timeout",
        RunOutcome::Ran(r) if r.oom_killed => "oom",
        RunOutcome::Ran(r) if r.exit_code == 0 => "ok",
        RunOutcome::Ran(_) => "error",
    };
    state.metrics.execution(
        &job.tenant,
        &prepared.profile.name,
        outcome,
        finished.saturating_sub(started) as f64 / 1000.0,
    );
    let stored = AuditRecord::of(
        &response,
        OutputKeeping::of(&state.config.server),
        sha256_hex(prepared.code.as_bytes()),
        state
            .config
            .server
            .store_code
            .then(|| prepared.code.clone()),
        started,
        finished,
    )
    .and_then(|record| state.audit.record(&record));
    if let Err(e) = stored {
        // The execution happened; its answer must not be lost either.
        tracing::error!(execution_id = %job.id, error = %e, "audit record not stored");
    }
    match response.outcome {
        RunOutcome::Refused(_) => Err(ApiError::Refused(Box::new(response))),
        RunOutcome::Ran(_) => Ok(response),
    }
}

/// `/dev/null`, or an unlinked file holding the request's input. Opened
/// for each run: one open file description shared by every run would
/// carry one tenant's `fcntl` flags, owner and `flock` to the next.
fn stdin_file(dir: &std::path::Path, data: Option<&[u8]>) -> std::io::Result<std::fs::File> {
    let Some(data) = data else {
        return std::fs::File::open("/dev/null");
    };
    use std::io::{Seek, Write};
    let name = new_id().map_err(|e| std::io::Error::other(e.to_string()))?;
    let path = dir.join(format!(".corral-stdin-{name}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_never_made_without_randomness() {
        let e = id_from(|_| Err("EIO")).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (500, "internal"));
        assert!(e.to_string().contains("random"), "{e}");
        let id = id_from(|b| {
            b.fill(0xab);
            Ok::<(), &str>(())
        })
        .unwrap();
        assert_eq!(id, "ab".repeat(12));
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }

    #[test]
    fn a_dropped_guard_cancels_and_a_disarmed_one_does_not() {
        let flag = Arc::new(AtomicBool::new(false));
        let mut guard = CancelOnDrop::new(flag.clone());
        guard.disarm();
        drop(guard);
        assert!(!flag.load(Ordering::Relaxed));
        drop(CancelOnDrop::new(flag.clone()));
        assert!(flag.load(Ordering::Relaxed));
    }
}

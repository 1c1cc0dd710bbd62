//! `corral serve`: the execution service.
//!
//! An HTTP API (axum) in front of the same [`corral_launcher::execute`] the
//! CLI uses: bearer-token tenants, a global concurrency cap and per-tenant
//! quotas answered with 429 instead of a queue, per-execution workspaces
//! handled without following links the sandbox planted, and one audit
//! record per execution in SQLite (plus optional JSON lines). The same
//! service speaks MCP, at `/mcp` and over stdio ([`serve_stdio`]).
//!
//! Inside, requests and answers are typed (`exec::ExecutionRequest`,
//! `exec::ExecutionResponse`) and serialised once, at the edge; errors are
//! `error::ApiError` with a stable `error::ErrorCode`. Operational logs are
//! `tracing` events, JSON lines on stderr ([`init_logging`]).
//!
//! The server is multi-threaded, so every sandbox starts from a re-executed
//! helper (nothing but `dup2` between fork and exec here).
#![forbid(unsafe_code)]

mod api;
mod audit;
mod auth;
mod base64;
mod conn;
mod error;
mod exec;
mod host;
mod logging;
mod mcp;
mod mounts;
mod prepared;
mod state;
mod supervisor;
mod warm;
mod workspace;

/// Wrappers over private checks for the fuzz targets in `fuzz/`. Not a
/// stable API.
#[doc(hidden)]
pub mod fuzzing;

use std::net::SocketAddr;
use std::sync::Arc;

use corral_policy::Config;

pub use audit::AuditError;
pub use error::ServerError;
pub use logging::{init_logging, LogError};
pub use mcp::serve_stdio;
pub use mounts::{enter_private_mounts, PrivateMountsError};

use state::AppState;

/// Checks the configuration for a safe start: listening beyond loopback
/// without tenants (authentication) is refused.
fn check_startup(config: &Config) -> Result<(), ServerError> {
    let s = &config.server;
    if !s.listen.ip().is_loopback() && s.tenants.is_empty() {
        return Err(ServerError::Unauthenticated(s.listen));
    }
    Ok(())
}

/// Serves HTTP (and MCP at `/mcp`) until SIGINT or SIGTERM. Once it
/// listens, one line goes to stderr, `corral: serving on http://ADDR`,
/// before any log line.
pub async fn serve(
    config: Config,
    config_file: Option<std::path::PathBuf>,
) -> Result<(), ServerError> {
    check_startup(&config)?;
    let listen: SocketAddr = config.server.listen;
    let max_connections =
        conn::connection_cap(config.server.max_connections).map_err(ServerError::Connections)?;
    let state = Arc::new(AppState::new(config, config_file.as_deref())?);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    start_warm_helpers(&state.config);
    crate::prepared::keep_ready(state.clone(), state.config.server.max_concurrent as usize);
    // The announcement is the first line on stderr: the supervisor's
    // start-up (a refused server's warning) logs after it.
    announce(local);
    state.commands.log_missing(&state.config.profiles);
    // On a detached thread, not awaited: a bind on a filesystem that does
    // not answer would otherwise hold the server's start in `lstat` (or,
    // on the runtime's blocking pool, its stop: see `crate::host`).
    let checked = state.config.clone();
    let spawned = std::thread::Builder::new()
        .name("corral-host-paths".into())
        .spawn(move || {
            for missing in corral_launcher::missing_host_paths(&checked) {
                tracing::warn!(
                    profile = %missing.profile,
                    key = missing.key,
                    path = %missing.path,
                    code = missing.code,
                    "{}",
                    missing.message
                );
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the profiles' host paths are not checked: no thread for it");
    }
    state.supervisor.boot();
    keep_pruning(state.clone());
    tracing::info!(
        listen = %local,
        work_dir = %state.work_dir.display(),
        max_concurrent = state.config.server.max_concurrent,
        tenants = state.tenants.len(),
        code_mode = state.config.server.code_mode,
        max_connections,
        "serving"
    );
    let served = conn::serve(
        listener,
        api::router(state.clone(), local),
        max_connections,
        conn::Deadlines::of(&state.config.server),
        shutdown_signal(),
    )
    .await
    .map_err(ServerError::Serve);
    // Executions still running (their clients outlasted the drain) are
    // killed; answered ones may still be tearing their sandboxes down.
    // Both give their sandbox permit back once the sandbox is gone.
    state.cancel_all();
    let _ = state
        .sandboxes
        .acquire_many(state.config.server.max_concurrent)
        .await;
    state.supervisor.shutdown().await;
    tracing::info!("stopped");
    crate::prepared::shutdown();
    crate::warm::shutdown();
    served
}

/// The one line scripts and tests wait for (and read the port from). A
/// stderr that cannot be written is no reason to stop.
fn announce(local: SocketAddr) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "corral: serving on http://{local}");
}

/// One sandbox helper started ahead per execution slot, waiting in a
/// cgroup made for the default profile's limits: a request then pays
/// neither a program start nor (on cgroup v1) the wait of moving a process
/// into a group. `crate::warm::shutdown` lets them go.
fn start_warm_helpers(config: &Config) {
    let template = config
        .profile(corral_policy::builtin::DEFAULT_PROFILE)
        .ok()
        .map(|p| p.limits.clone());
    crate::warm::keep_ready(config.server.max_concurrent as usize, template);
}

/// How often the audit retention is applied while the server runs.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Applies the audit retention every [`PRUNE_EVERY`] (it was applied at
/// start-up already), off the async threads; a failure is logged and
/// tried again at the next tick.
fn keep_pruning(state: Arc<AppState>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.tick().await; // the first tick is immediate
        loop {
            tick.tick().await;
            let state = state.clone();
            let pruned =
                tokio::task::spawn_blocking(move || state.audit.prune(audit::now_ms())).await;
            if let Ok(Err(e)) = pruned {
                tracing::error!(error = %e, "audit retention not applied");
            }
        }
    });
}

/// Resolves on SIGINT or SIGTERM (never, if they cannot be watched).
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

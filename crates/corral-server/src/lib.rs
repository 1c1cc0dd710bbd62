//! `corral serve`: the execution service.
//!
//! An HTTP API (axum) in front of the same [`corral_launcher::execute`] the
//! CLI uses: bearer-token tenants, a global concurrency cap and per-tenant
//! quotas answered with 429 instead of a queue, per-execution workspaces
//! handled without following links the sandbox planted, and one audit
//! record per execution in SQLite (plus optional JSON lines).
//!
//! The server is multi-threaded, so every sandbox starts from a re-executed
//! helper (nothing but `dup2` between fork and exec here).
#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod auth;
pub mod error;
pub mod exec;
pub mod mcp;
pub mod state;
mod warm;
mod workspace;

use std::net::SocketAddr;
use std::sync::Arc;

use corral_policy::Config;

pub use error::ServerError;
pub use state::AppState;

/// Checks the configuration for a safe start: listening beyond loopback
/// without tenants (authentication) is refused.
pub fn check_startup(config: &Config) -> Result<(), ServerError> {
    let s = &config.server;
    if !s.listen.ip().is_loopback() && s.tenants.is_empty() {
        return Err(ServerError::Unsafe(format!(
            "refusing to listen on {} without authentication: anyone who can reach it could run code. \
             Add [[server.tenant]] entries (bearer tokens, stored as SHA-256) or listen on 127.0.0.1",
            s.listen
        )));
    }
    Ok(())
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve(config: Config) -> Result<(), ServerError> {
    check_startup(&config)?;
    let listen: SocketAddr = config.server.listen;
    let state = Arc::new(AppState::new(config)?);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| ServerError::Io(format!("binding {listen}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    start_warm_helpers(&state.config);
    eprintln!("corral: serving on http://{local}");
    let served = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| ServerError::Io(e.to_string()));
    crate::warm::shutdown();
    served
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

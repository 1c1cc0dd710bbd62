//! `corral mcp`: one MCP session over stdin and stdout. stdout carries
//! the protocol only; logs go to stderr.

use std::sync::{Arc, Mutex};

use corral_policy::{Config, Tenant};
use rmcp::ServiceExt;

use super::{CorralMcp, Shared};
use crate::error::ServerError;
use crate::state::{AppState, TenantState};

/// The stdio caller's tenant name.
const LOCAL_TENANT: &str = "local";

/// `corral mcp`: one MCP session over stdin/stdout until the client closes
/// it. Nothing else is ever written to stdout.
pub async fn serve_stdio(config: Config) -> Result<(), ServerError> {
    let state = Arc::new(AppState::new(config, None)?);
    let s = &state.config.server;
    let local = Arc::new(TenantState::new(
        Tenant {
            name: LOCAL_TENANT.into(),
            token_sha256: String::new(),
            profiles: crate::state::anonymous_profiles(&state.config),
            max_concurrent: s.max_concurrent,
        },
        s.tenant_answer_bytes,
    ));
    let shared = Arc::new(Shared {
        state: state.clone(),
        local: Some(local),
        live: Mutex::default(),
    });
    // A pipe (what MCP clients give their servers) is read without the
    // runtime's blocking pool, so a stop by signal does not wait for
    // input; anything else falls back to blocking reads.
    let running = CorralMcp::new(shared)
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| ServerError::Stdio(Box::new(e)))?;
    crate::start_warm_helpers(&state.config);
    tracing::info!(work_dir = %state.work_dir.display(), "serving MCP over stdio");
    state.commands.log_missing(&state.config.profiles);
    let ended = tokio::select! {
        r = running.waiting() => r.map(drop).map_err(|e| ServerError::Stdio(Box::new(e))),
        () = crate::shutdown_signal() => Ok(()),
    };
    // As `serve` does: a call still running is killed, and its sandbox is
    // gone (and recorded) before the process ends.
    state.cancel_all();
    let _ = state
        .sandboxes
        .acquire_many(state.config.server.max_concurrent)
        .await;
    crate::warm::shutdown();
    ended
}

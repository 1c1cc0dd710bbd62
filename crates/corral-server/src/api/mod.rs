//! Routes and the small handlers; executions are in [`executions`], the
//! JSON error body of the HTTP layer's own answers in [`fallback`].

mod browser;
mod chunks;
mod executions;
mod fallback;
mod openapi;
mod refusals;

pub use refusals::RefusalLimiter;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::auth::Authed;
use crate::error::{ApiError, ErrorCode};
use crate::exec::Ceilings;
use crate::state::AppState;

type Shared = Arc<AppState>;

/// The service's routes, each request traced in its own span.
pub fn router(state: Shared, local: std::net::SocketAddr) -> Router {
    let limit = usize::try_from(state.config.server.max_request_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/limits", get(limits))
        .route(
            "/v1/executions",
            post(executions::create).get(executions::list),
        )
        .route("/v1/executions/stream", post(executions::stream))
        .route("/v1/executions/{id}", get(executions::get))
        .route("/v1/mcp-servers", get(mcp_servers))
        .merge(crate::mcp::router(state.clone()))
        .merge(crate::supervisor::bridge::router(&state))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.config.server.max_request_bytes,
            fallback::json_errors,
        ))
        // Before authentication and everything else: no web page drives
        // the service.
        .layer(axum::middleware::from_fn_with_state(
            browser::BrowserGuard::new(&state.config.server, local),
            browser::guard,
        ))
        // Every refusal, the guard's included, becomes an audit event.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            refusals::record,
        ))
        // Outermost: the span covers authentication and the error body,
        // and sees the final status.
        .layer(crate::logging::http_trace())
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json")
}

/// `GET /healthz`.
#[derive(Serialize)]
struct Health {
    status: &'static str,
}

async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

async fn metrics(State(st): State<Shared>) -> Response {
    let m = &st.metrics;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let running =
        (st.config.server.max_concurrent as usize).saturating_sub(st.global.available_permits());
    let text = format!(
        "# HELP corral_executions_started_total Executions accepted.\n# TYPE corral_executions_started_total counter\ncorral_executions_started_total {}\n\
         # HELP corral_executions_finished_total Executions finished.\n# TYPE corral_executions_finished_total counter\ncorral_executions_finished_total {}\n\
         # HELP corral_executions_running Executions running now.\n# TYPE corral_executions_running gauge\ncorral_executions_running {running}\n\
         # HELP corral_busy_total Requests answered 429 (saturated).\n# TYPE corral_busy_total counter\ncorral_busy_total {}\n\
         # HELP corral_refused_total Requests refused with another 4xx.\n# TYPE corral_refused_total counter\ncorral_refused_total {}\n\
         # HELP corral_timed_out_total Executions ended by their timeout.\n# TYPE corral_timed_out_total counter\ncorral_timed_out_total {}\n\
         # HELP corral_oom_killed_total Executions hit by the OOM killer.\n# TYPE corral_oom_killed_total counter\ncorral_oom_killed_total {}\n",
        load(&m.started),
        load(&m.finished),
        load(&m.busy),
        load(&m.refused),
        load(&m.timed_out),
        load(&m.oom_killed),
    );
    let text = text + &crate::supervisor::metrics_text(&st.supervisor);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Json<serde_json::Value> {
    Json(openapi::openapi_document())
}

/// `GET /v1/mcp-servers`: the supervised servers the caller may reach.
async fn mcp_servers(State(st): State<Shared>, Authed(t): Authed) -> Response {
    Json(serde_json::json!({
        "servers": crate::supervisor::list_status(&st.supervisor, &t.tenant.name),
    }))
    .into_response()
}

/// `GET /v1/limits`: what the caller may ask for.
#[derive(Serialize)]
struct LimitsResponse<'a> {
    tenant: &'a str,
    max_concurrent: u32,
    code_mode: bool,
    /// The ceilings of each profile the tenant may use.
    profiles: BTreeMap<&'a str, Ceilings>,
}

async fn limits(State(st): State<Shared>, Authed(t): Authed) -> Response {
    let profiles = t
        .tenant
        .profiles
        .iter()
        .filter_map(|name| {
            st.config
                .profiles
                .get(name)
                .map(|p| (name.as_str(), Ceilings::of(p)))
        })
        .collect();
    Json(LimitsResponse {
        tenant: &t.tenant.name,
        max_concurrent: t.tenant.max_concurrent,
        code_mode: st.config.server.code_mode,
        profiles,
    })
    .into_response()
}

//! Routes and the small handlers; executions are in [`executions`], the
//! JSON error body of the HTTP layer's own answers in [`fallback`].

mod answers;

pub(crate) use answers::budget as answer_budget;
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
#[derive(Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness: answers while the server accepts requests.
#[utoipa::path(get, path = "/healthz", operation_id = "get_health", tag = "service",
    responses((status = 200, description = "The server is up", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Prometheus metrics (OpenMetrics 1.0 when `Accept` asks for it).
#[utoipa::path(get, path = "/metrics", operation_id = "get_metrics", tag = "service",
    responses((status = 200, description = "The exposition: Prometheus text 0.0.4, or OpenMetrics 1.0 for `Accept: application/openmetrics-text`",
        content(
            (String = "text/plain"),
            (String = "application/openmetrics-text"),
        ))))]
async fn metrics(State(st): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let m = &st.metrics;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let running =
        (st.config.server.max_concurrent as usize).saturating_sub(st.global.available_permits());
    let mut text = format!(
        "# HELP corral_build_info The corral serving, by version.\n# TYPE corral_build_info gauge\ncorral_build_info{{version=\"{}\"}} 1\n\
         # HELP corral_executions_started_total Executions accepted.\n# TYPE corral_executions_started_total counter\ncorral_executions_started_total {}\n\
         # HELP corral_executions_finished_total Executions finished.\n# TYPE corral_executions_finished_total counter\ncorral_executions_finished_total {}\n\
         # HELP corral_executions_running Executions running now.\n# TYPE corral_executions_running gauge\ncorral_executions_running {running}\n\
         # HELP corral_busy_total Requests answered 429 (saturated).\n# TYPE corral_busy_total counter\ncorral_busy_total {}\n\
         # HELP corral_refused_total Requests refused with another 4xx.\n# TYPE corral_refused_total counter\ncorral_refused_total {}\n\
         # HELP corral_timed_out_total Executions ended by their timeout.\n# TYPE corral_timed_out_total counter\ncorral_timed_out_total {}\n\
         # HELP corral_oom_killed_total Executions hit by the OOM killer.\n# TYPE corral_oom_killed_total counter\ncorral_oom_killed_total {}\n",
        env!("CARGO_PKG_VERSION"),
        load(&m.started),
        load(&m.finished),
        load(&m.busy),
        load(&m.refused),
        load(&m.timed_out),
        load(&m.oom_killed),
    );
    labelled(&mut text, m);
    let sessions = st
        .supervisor
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    let db = audit_db_bytes(&st.config.server.audit_db);
    let mcp = m.mcp_sessions.load(Ordering::Relaxed);
    text.push_str(&format!(
        "# HELP corral_mcp_sessions MCP sessions open at /mcp.\n# TYPE corral_mcp_sessions gauge\ncorral_mcp_sessions {mcp}\n\
         # HELP corral_mcp_bridge_sessions Sessions open at /mcp/servers.\n# TYPE corral_mcp_bridge_sessions gauge\ncorral_mcp_bridge_sessions {sessions}\n\
         # HELP corral_audit_db_bytes Size of the audit database with its WAL.\n# TYPE corral_audit_db_bytes gauge\ncorral_audit_db_bytes {db}\n"
    ));
    text.push_str(&crate::supervisor::metrics_text(&st.supervisor));
    let openmetrics = headers
        .get("accept")
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        let body = to_openmetrics(&text);
        return (
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response();
    }
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// The labelled execution counters and the duration histogram.
fn labelled(text: &mut String, m: &crate::state::Metrics) {
    use std::fmt::Write;
    let l = m.by_label.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(
        text,
        "# HELP corral_executions_total Recorded executions by tenant, profile and outcome (ok, error, timeout, oom, refused).\n# TYPE corral_executions_total counter"
    );
    for ((tenant, profile, outcome), n) in &l.executions {
        let _ = writeln!(
            text,
            "corral_executions_total{{tenant=\"{}\",profile=\"{}\",outcome=\"{outcome}\"}} {n}",
            label(tenant),
            label(profile)
        );
    }
    histogram(
        text,
        "corral_execution_duration_seconds",
        "Wall time of recorded executions.",
        "profile",
        l.durations.iter().map(|(k, v)| (k.as_str(), v)),
    );
    histogram(
        text,
        "corral_queue_wait_seconds",
        "Time from a request's acceptance to its execution slots, by where it came from (http, mcp).",
        "via",
        l.queue_waits.iter().map(|(k, v)| (*k, v)),
    );
}

/// One histogram family of [`crate::state::DURATION_BUCKETS`], a series
/// per value of the label `key`.
fn histogram<'a>(
    text: &mut String,
    h: &str,
    help: &str,
    key: &str,
    series: impl Iterator<
        Item = (
            &'a str,
            &'a ([u64; crate::state::DURATION_BUCKETS.len() + 1], f64),
        ),
    >,
) {
    use std::fmt::Write;
    let _ = writeln!(text, "# HELP {h} {help}\n# TYPE {h} histogram");
    for (value, (buckets, sum)) in series {
        let v = label(value);
        let mut cumulative = 0;
        for (i, bound) in crate::state::DURATION_BUCKETS.iter().enumerate() {
            cumulative += buckets[i];
            let _ = writeln!(
                text,
                "{h}_bucket{{{key}=\"{v}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += buckets[crate::state::DURATION_BUCKETS.len()];
        let _ = writeln!(text, "{h}_bucket{{{key}=\"{v}\",le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            text,
            "{h}_sum{{{key}=\"{v}\"}} {sum}\n{h}_count{{{key}=\"{v}\"}} {cumulative}"
        );
    }
}

/// A label value escaped as the exposition formats ask (`\\`, `\"`, `\n`).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The audit database's size with its WAL, bytes (0 when unreadable).
fn audit_db_bytes(db: &std::path::Path) -> u64 {
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    size(db) + size(std::path::Path::new(&wal))
}

/// The same samples in OpenMetrics 1.0: a counter's family is named
/// without `_total`, and the exposition ends with `# EOF`.
fn to_openmetrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut counters: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.push(name.to_string());
            }
        }
    }
    for line in text.lines() {
        let fixed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            (counters.iter().any(|c| c == name) && name.ends_with("_total"))
                .then(|| format!("{p}{} {tail}", name.trim_end_matches("_total")))
        });
        out.push_str(fixed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out.push_str("# EOF\n");
    out
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "get_openapi", tag = "service",
    responses((status = 200, description = "The OpenAPI 3.1 document of this server", body = Object)))]
async fn openapi(State(st): State<Shared>) -> Json<serde_json::Value> {
    Json(openapi::openapi_document(st.anonymous()))
}

/// The answer of `GET /v1/mcp-servers`.
#[derive(Serialize, utoipa::ToSchema)]
struct McpServers {
    /// The servers, by name.
    servers: Vec<crate::supervisor::ServerStatus>,
}

/// `GET /v1/mcp-servers`: the supervised servers the caller may reach.
#[utoipa::path(get, path = "/v1/mcp-servers", operation_id = "list_mcp_servers", tag = "service",
    responses((status = 200, description = "The supervised MCP servers the caller may reach, with their processes", body = McpServers)))]
async fn mcp_servers(State(st): State<Shared>, Authed(t): Authed) -> Json<McpServers> {
    Json(McpServers {
        servers: crate::supervisor::list_status(&st.supervisor, &t.tenant.name),
    })
}

/// `GET /v1/limits`: what the caller may ask for.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Limits)]
struct LimitsResponse<'a> {
    /// The caller's tenant (`anonymous` without tenants).
    tenant: &'a str,
    /// The tenant's concurrent executions.
    max_concurrent: u32,
    /// Whether `language` and `code` are accepted.
    code_mode: bool,
    /// The ceilings of each profile the tenant may use.
    profiles: BTreeMap<&'a str, Ceilings>,
}

/// The caller's tenant, its concurrency, and the ceilings of each profile it may use.
#[utoipa::path(get, path = "/v1/limits", operation_id = "get_limits", tag = "service",
    responses((status = 200, description = "What the caller may ask for", body = LimitsResponse)))]
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

//! Routes and handlers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::tenant;
use crate::error::ApiError;
use crate::exec::{self, ExecutionRequest};
use crate::state::AppState;

type Shared = Arc<AppState>;

/// The service's routes.
pub fn router(state: Shared) -> Router {
    let limit = usize::try_from(state.config.server.max_request_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/limits", get(limits))
        .route(
            "/v1/executions",
            post(create_execution).get(list_executions),
        )
        .route("/v1/executions/stream", post(stream_execution))
        .route("/v1/executions/{id}", get(get_execution))
        .merge(crate::mcp::router(state.clone()))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.config.server.max_request_bytes,
            crate::error::json_errors,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /openapi.json",
    )
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics(State(st): State<Shared>) -> Response {
    let m = &st.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let running = st.config.server.max_concurrent as usize - st.global.available_permits();
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
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Json<Value> {
    Json(crate::api::openapi_document())
}

async fn limits(State(st): State<Shared>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let t = tenant(&st, &headers)?;
    let profiles: serde_json::Map<String, Value> = t
        .tenant
        .profiles
        .iter()
        .filter_map(|name| {
            st.config
                .profiles
                .get(name)
                .map(|p| (name.clone(), exec::ceilings(p)))
        })
        .collect();
    Ok(Json(json!({
        "tenant": t.tenant.name,
        "max_concurrent": t.tenant.max_concurrent,
        "code_mode": st.config.server.code_mode,
        "profiles": profiles,
    })))
}

/// Kills the execution when the handler is dropped before it finished,
/// which is what happens when the client disconnects.
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// A request that passed authentication, validation and the concurrency
/// check, holding its two slots.
struct Admitted {
    tenant_name: String,
    prepared: exec::Prepared,
    slots: (
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    ),
    id: String,
}

/// Authenticates, parses and validates a request, and takes a tenant and a
/// global slot; saturated means a structured busy answer, never a queue.
fn admit(st: &Shared, headers: &HeaderMap, body: &[u8]) -> Result<Admitted, ApiError> {
    let refused = |e: ApiError| {
        st.metrics.refused.fetch_add(1, Ordering::Relaxed);
        e
    };
    let t = tenant(st, headers).map_err(refused)?;
    let req: ExecutionRequest = serde_json::from_slice(body).map_err(|e| {
        refused(ApiError::bad_request(
            "request.malformed",
            format!("invalid JSON body: {e}"),
        ))
    })?;
    let prepared = exec::prepare(st, &t.tenant.profiles, req).map_err(refused)?;
    let id = exec::new_id()?;
    let busy = || {
        st.metrics.busy.fetch_add(1, Ordering::Relaxed);
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            "all execution slots are in use; retry after the indicated delay",
        );
        e.retry_after = Some(1);
        e
    };
    let tenant_slot = t.slots.clone().try_acquire_owned().map_err(|_| busy())?;
    let global_slot = st.global.clone().try_acquire_owned().map_err(|_| busy())?;
    st.metrics.started.fetch_add(1, Ordering::Relaxed);
    Ok(Admitted {
        tenant_name: t.tenant.name.clone(),
        prepared,
        slots: (tenant_slot, global_slot),
        id,
    })
}

async fn create_execution(
    State(st): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let Admitted {
        tenant_name,
        prepared,
        slots,
        id,
    } = admit(&st, &headers, &body)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let mut guard = CancelOnDrop(cancel.clone(), false);
    let state = st.clone();
    let task = tokio::task::spawn_blocking(move || {
        let result = exec::run(&state, &tenant_name, &id, prepared, cancel);
        state.metrics.finished.fetch_add(1, Ordering::Relaxed);
        drop(slots);
        result
    });
    let result = task.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("execution task failed: {e}"),
        )
    })?;
    guard.1 = true;
    result.map(Json)
}

/// Seconds between heartbeat events on a stream.
const HEARTBEAT_SECS: u64 = 10;

/// `POST /v1/executions/stream`: the same request, answered as server-sent
/// events: `start`, `stdout`/`stderr` chunks as they come, `heartbeat`s,
/// and exactly one `result` (the non-streaming answer) once the whole
/// sandbox has exited. A client that goes away kills the execution.
async fn stream_execution(
    State(st): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let Admitted {
        tenant_name,
        prepared,
        slots,
        id,
    } = admit(&st, &headers, &body)?;
    // (is the final result, event)
    let (tx, rx) = tokio::sync::mpsc::channel::<(bool, Event)>(256);
    let start = json!({"id": id, "tenant": tenant_name, "profile": prepared.profile.name});
    let _ = tx.try_send((
        false,
        Event::default().event("start").data(start.to_string()),
    ));
    // Chunks a slow client cannot take are dropped from the stream (never
    // from the result, which keeps head and tail); the drain never waits.
    let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tap_tx = tx.clone();
    let tap_dropped = dropped.clone();
    let tap: corral_launcher::OutputTap = Arc::new(move |stream: u8, data: &[u8]| {
        let name = if stream == 1 { "stdout" } else { "stderr" };
        let ev = Event::default()
            .event(name)
            .data(json!({"data": String::from_utf8_lossy(data)}).to_string());
        if tap_tx.try_send((false, ev)).is_err() {
            tap_dropped.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    });
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone(), false);
    let state = st.clone();
    tokio::task::spawn_blocking(move || {
        let result = exec::run_streaming(&state, &tenant_name, &id, prepared, cancel, Some(tap));
        state.metrics.finished.fetch_add(1, Ordering::Relaxed);
        drop(slots);
        let mut body = match result {
            Ok(v) => v,
            Err(e) => {
                // The error object, or for a refusal the whole record (with
                // `error` and the id), plus the status the non-streaming
                // endpoint would have answered.
                let mut v = e.to_json();
                if let Value::Object(m) = &mut v {
                    m.insert("status".into(), json!(e.status.as_u16()));
                }
                v
            }
        };
        if let Value::Object(m) = &mut body {
            m.insert(
                "stream_dropped_bytes".into(),
                json!(dropped.load(Ordering::Relaxed)),
            );
        }
        // Exactly one result, after the whole tree has exited; waits for
        // room rather than drop it (fails only if the client left).
        let _ = tx.blocking_send((
            true,
            Event::default().event("result").data(body.to_string()),
        ));
    });
    let events = futures_util::stream::unfold((rx, guard), |(mut rx, mut guard)| async move {
        let (last, ev) = rx.recv().await?;
        if last {
            guard.1 = true;
        }
        Some((Ok::<_, std::convert::Infallible>(ev), (rx, guard)))
    });
    let keep_alive = KeepAlive::new()
        .interval(std::time::Duration::from_secs(HEARTBEAT_SECS))
        .event(Event::default().event("heartbeat").data("{}"));
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

async fn get_execution(
    State(st): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let t = tenant(&st, &headers)?;
    let name = t.tenant.name.clone();
    let state = st.clone();
    let found = tokio::task::spawn_blocking(move || state.audit.get(&name, &id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit", e.to_string()))?;
    // Another tenant's execution is indistinguishable from a missing one.
    found.map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "execution.not_found",
            "no such execution",
        )
    })
}

/// Query of `GET /v1/executions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<u32>,
    offset: Option<u32>,
    profile: Option<String>,
}

async fn list_executions(
    State(st): State<Shared>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let t = tenant(&st, &headers)?;
    let Query(q) = q.map_err(|e| ApiError::bad_request("request.invalid", e.body_text()))?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 500 {
        return Err(ApiError::bad_request(
            "request.invalid",
            "limit must be 1-500",
        ));
    }
    let offset = q.offset.unwrap_or(0);
    let name = t.tenant.name.clone();
    let state = st.clone();
    let items = tokio::task::spawn_blocking(move || {
        state.audit.list(&name, q.profile.as_deref(), limit, offset)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit", e.to_string()))?;
    Ok(Json(
        json!({"items": items, "limit": limit, "offset": offset}),
    ))
}

/// A compact OpenAPI 3 description of the API.
pub fn openapi_document() -> Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    json!({
        "openapi": "3.0.3",
        "info": {"title": "corral execution service", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "ExecutionRequest": {"type": "object", "additionalProperties": false, "properties": {
                    "profile": {"type": "string"},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "language": {"type": "string", "enum": ["python", "node", "bash"]},
                    "code": {"type": "string"},
                    "stdin": {"type": "string"},
                    "files": {"type": "array", "items": {"type": "object", "required": ["path", "content"], "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "encoding": {"type": "string", "enum": ["utf8", "base64"]}}}},
                    "limits": {"type": "object", "additionalProperties": false, "properties": {"timeout_ms": {"type": "integer"}, "memory_bytes": {"type": "integer"}, "output_bytes": {"type": "integer"}, "pids": {"type": "integer"}, "cpu_time_ms": {"type": "integer"}}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}}
                }}
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "alive"}}}},
            "/metrics": {"get": {"security": [], "responses": {"200": {"description": "Prometheus text"}}}},
            "/v1/limits": {"get": {"responses": {"200": {"description": "the caller's profiles and ceilings"}, "401": {"description": "unauthenticated", "content": {"application/json": {"schema": error}}}}}},
            "/v1/executions": {
                "post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecutionRequest"}}}},
                         "responses": {"200": {"description": "the result object (as `corral run --json`) plus id, tenant, profile, limits, outputs"},
                                       "400": {"description": "malformed request", "content": {"application/json": {"schema": error}}},
                                       "401": {"description": "unauthenticated", "content": {"application/json": {"schema": error}}},
                                       "403": {"description": "profile or code mode not available", "content": {"application/json": {"schema": error}}},
                                       "413": {"description": "body too large (body_too_large)", "content": {"application/json": {"schema": error}}},
                                       "422": {"description": "limits outside the minimums or ceilings, or a refused command (then the body is the stored record, with its id)", "content": {"application/json": {"schema": error}}},
                                       "429": {"description": "busy; see Retry-After", "content": {"application/json": {"schema": error}}}}},
                "get": {"parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"}}, {"name": "offset", "in": "query", "schema": {"type": "integer"}}, {"name": "profile", "in": "query", "schema": {"type": "string"}}],
                        "responses": {"200": {"description": "the caller's executions, newest first"}}}
            },
            "/v1/executions/stream": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecutionRequest"}}}},
                                               "responses": {"200": {"description": "text/event-stream: start, stdout, stderr, heartbeat, then exactly one result (the non-streaming answer)"},
                                                             "429": {"description": "busy; see Retry-After", "content": {"application/json": {"schema": error}}}}}},
            "/v1/executions/{id}": {"get": {"parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                                            "responses": {"200": {"description": "the stored result"}, "404": {"description": "not found (or another tenant's)", "content": {"application/json": {"schema": error}}}}}}
        }
    })
}

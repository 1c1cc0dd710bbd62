//! `/v1/executions`: run one (answered whole, or streamed as server-sent
//! events), read one back, list them.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::OwnedSemaphorePermit;

use super::answers;
use super::chunks::ChunkQueue;
use super::Shared;
use crate::audit::ExecutionSummary;
use crate::auth::Authed;
use crate::error::{ApiError, ErrorBody, ErrorCode, ErrorEnvelope};
use crate::exec::{self, CancelOnDrop, ExecutionRequest, ExecutionResponse, Job};

/// Seconds between heartbeat events on a stream.
const HEARTBEAT_SECS: u64 = 10;
/// Lifecycle events (start, result) queued for a stream's client; output
/// goes through a [`ChunkQueue`] bounded in bytes.
const STREAM_QUEUE: usize = 4;

/// A request that passed authentication, validation and the concurrency
/// check, holding its two slots (the tenant's and the server's).
struct Admitted {
    job: Job,
    slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    tenant: Arc<crate::state::TenantState>,
}

/// Authenticates, parses and validates a request, and takes a tenant and a
/// global slot; saturated means a structured busy answer, never a queue.
fn admit(st: &Shared, authed: Result<Authed, ApiError>, body: &[u8]) -> Result<Admitted, ApiError> {
    let accepted = std::time::Instant::now();
    let refused = |e: ApiError| {
        st.metrics.refused.fetch_add(1, Ordering::Relaxed);
        e
    };
    let Authed(t) = authed.map_err(refused)?;
    let req: ExecutionRequest = serde_json::from_slice(body).map_err(|e| {
        refused(ApiError::new(
            ErrorCode::RequestMalformed,
            format!("invalid JSON body: {e}"),
        ))
    })?;
    let prepared = exec::prepare(st, &t.tenant.profiles, req).map_err(refused)?;
    let id = exec::new_id()?;
    let busy = || {
        st.metrics.busy.fetch_add(1, Ordering::Relaxed);
        ApiError::busy("all execution slots are in use; retry after the indicated delay")
    };
    let tenant_slot = t.slots.clone().try_acquire_owned().map_err(|_| busy())?;
    let global_slot = st.global.clone().try_acquire_owned().map_err(|_| busy())?;
    st.metrics.started.fetch_add(1, Ordering::Relaxed);
    st.metrics.queue_wait("http", accepted.elapsed());
    Ok(Admitted {
        job: Job::new(id, t.tenant.name.clone(), prepared),
        slots: (tenant_slot, global_slot),
        tenant: t,
    })
}

/// `POST /v1/executions`: runs one execution and answers its result. The
/// answer takes its size from the tenant's budget of answers in flight
/// before the execution's slots are given back (see `answers`).
#[utoipa::path(post, path = "/v1/executions", operation_id = "create_execution", tag = "executions",
    request_body(content = ExecutionRequest, content_type = "application/json", description = "A command (`command`) or code (`language` and `code`, code mode), with input, files, limits, environment"),
    responses(
        (status = 200, description = "The execution's result: `corral run --json`'s result object plus id, tenant, profile, limits, outputs", body = ExecutionResponse),
        (status = 400, description = "Malformed JSON (`request.malformed`), or an invalid request: unknown language or profile, bad file path or encoding", body = ErrorEnvelope),
        (status = 403, description = "A profile the tenant may not use (`profile.forbidden`), code mode off (`code_mode.disabled`), or the browser guard", body = ErrorEnvelope),
        (status = 422, description = "Limits outside the minimums or ceilings (`limits.invalid`, `limits.above_ceiling`, an error body), or the runtime refused the execution (its stored record, with `error` and the `id`)", body = ErrorBody),
        (status = 429, description = "All execution slots (the tenant's or the server's) are in use (`busy`)", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(super) async fn create(
    State(st): State<Shared>,
    authed: Result<Authed, ApiError>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Admitted { job, slots, tenant } = admit(&st, authed, &body)?;
    let cancel = st.cancel_flag();
    // A client that goes away drops this handler: the execution is killed.
    let mut guard = CancelOnDrop::new(cancel.clone());
    let sandbox = st.sandbox_permit().await?;
    let state = st.clone();
    let (answer, answered) = tokio::sync::oneshot::channel();
    // The answer goes out as soon as it stands; the sandbox's teardown
    // follows in the same task, holding its permit. The slots come back
    // with the answer, or end with the task when nobody waits for it.
    tokio::task::spawn_blocking(move || {
        let (result, cleanup) = exec::run(&state, &job, cancel, None);
        state.metrics.finished.fetch_add(1, Ordering::Relaxed);
        let _ = answer.send((result, slots));
        cleanup.finish();
        drop(sandbox);
    });
    let (result, slots) = answered
        .await
        .map_err(|_| ApiError::internal("the execution task failed before answering"))?;
    guard.disarm();
    let result = result?;
    let permit = answers::reserve(
        &tenant.answers,
        tenant.answer_bytes,
        answers::json_len(&result),
    )
    .await;
    drop(slots);
    let body = serde_json::to_vec(&result)
        .map_err(|e| ApiError::internal(format!("encoding the result: {e}")))?;
    Ok(answers::json(axum::http::StatusCode::OK, body, permit))
}

/// The `start` event.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct StreamStart<'a> {
    /// The execution id.
    id: &'a str,
    /// The tenant.
    tenant: &'a str,
    /// The profile.
    profile: &'a str,
}

/// A `stdout` or `stderr` event.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct StreamChunk<'a> {
    /// The output (UTF-8, invalid bytes replaced).
    #[schema(value_type = String)]
    data: Cow<'a, str>,
}

/// The `result` event: the answer `POST /v1/executions` would have given
/// (with its status when that is an error), plus the output the stream
/// could not deliver (only ever non-zero once the client has gone).
#[derive(Serialize)]
struct StreamEnd<'a> {
    #[serde(flatten)]
    body: StreamBody<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    stream_dropped_bytes: u64,
}

#[derive(Serialize)]
#[serde(untagged)]
enum StreamBody<'a> {
    Result(&'a ExecutionResponse),
    Error(ErrorBody<'a>),
}

/// An event named `name` whose data is `data` as JSON.
fn event(name: &'static str, data: &impl Serialize) -> Event {
    let text = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    Event::default().event(name).data(text)
}

/// `POST /v1/executions/stream`: the same request, answered as server-sent
/// events: `start`, `stdout`/`stderr` chunks as they come, `heartbeat`s,
/// and exactly one `result` (the non-streaming answer) once the program
/// and every process it started have ended (the sandbox's teardown
/// follows). A client that goes away kills the execution.
#[utoipa::path(post, path = "/v1/executions/stream", operation_id = "stream_execution", tag = "executions",
    request_body(content = ExecutionRequest, content_type = "application/json", description = "As for `create_execution`"),
    responses(
        (status = 200, description = "Server-sent events, each with an `id`: `start` (StreamStart), `stdout` and `stderr` (StreamChunk), `heartbeat`, then exactly one `result`: the answer `create_execution` would give (with `status` when that is an error) and `stream_dropped_bytes`", content_type = "text/event-stream", body = super::openapi::StreamEvent),
        (status = 400, description = "Malformed JSON (`request.malformed`), or an invalid request: unknown language or profile, bad file path or encoding", body = ErrorEnvelope),
        (status = 403, description = "A profile the tenant may not use (`profile.forbidden`), code mode off (`code_mode.disabled`), or the browser guard", body = ErrorEnvelope),
        (status = 422, description = "Limits outside the minimums or ceilings (`limits.invalid`, `limits.above_ceiling`, an error body), or the runtime refused the execution (its stored record, with `error` and the `id`)", body = ErrorBody),
        (status = 429, description = "All execution slots (the tenant's or the server's) are in use (`busy`)", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(super) async fn stream(
    State(st): State<Shared>,
    authed: Result<Authed, ApiError>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Admitted { job, slots, .. } = admit(&st, authed, &body)?;
    // (is the final result, event)
    let (tx, rx) = tokio::sync::mpsc::channel::<(bool, Event)>(STREAM_QUEUE);
    let start = StreamStart {
        id: &job.id,
        tenant: &job.tenant,
        profile: &job.prepared.profile.name,
    };
    let _ = tx.try_send((false, event("start", &start)));
    // Output waits for a slow client (the program's writes block); it is
    // never dropped while the client is there.
    let queue = Arc::new(ChunkQueue::default());
    let tap_queue = queue.clone();
    let tap: corral_launcher::OutputTap =
        Arc::new(move |stream: u8, data: &[u8]| tap_queue.push(stream, data));
    let dropped = queue.clone();
    let cancel = st.cancel_flag();
    let guard = CancelOnDrop::new(cancel.clone());
    let sandbox = st.sandbox_permit().await?;
    let state = st.clone();
    tokio::task::spawn_blocking(move || {
        let (result, cleanup) = exec::run(&state, &job, cancel, Some(tap));
        state.metrics.finished.fetch_add(1, Ordering::Relaxed);
        drop(slots);
        let stream_dropped_bytes = dropped.lost();
        let end = match &result {
            Ok(r) => StreamEnd {
                body: StreamBody::Result(r),
                status: None,
                stream_dropped_bytes,
            },
            // The error object, or for a refusal the whole record (with
            // `error` and the id), plus the status the non-streaming
            // endpoint would have answered.
            Err(e) => StreamEnd {
                body: StreamBody::Error(e.body()),
                status: Some(e.status().as_u16()),
                stream_dropped_bytes,
            },
        };
        // Exactly one result, once nothing of the program runs any more;
        // waits for room rather than drop it (fails only if the client
        // left; the queue holds at most `start` before it).
        let _ = tx.blocking_send((true, event("result", &end)));
        // The response ends here: a keep-alive client's next request does
        // not wait for the teardown.
        drop(tx);
        cleanup.finish();
        drop(sandbox);
    });
    let events = futures_util::stream::unfold(
        Outflow {
            rx,
            guard,
            queue: Closing(queue),
            result: None,
            seq: 0,
        },
        |mut o| async move {
            let ev = o.next().await?;
            Some((Ok::<_, Infallible>(ev), o))
        },
    );
    let keep_alive = KeepAlive::new()
        .interval(Duration::from_secs(HEARTBEAT_SECS))
        .event(Event::default().event("heartbeat").data("{}"));
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

/// A stream's events in order: `start`, output merged from the queue,
/// then `result` once every byte before it has gone out. Each event has
/// an `id`, its position in the stream.
struct Outflow {
    rx: tokio::sync::mpsc::Receiver<(bool, Event)>,
    guard: CancelOnDrop,
    queue: Closing,
    /// The result, held until the output before it is out.
    result: Option<Event>,
    seq: u64,
}

/// Closes the queue when the stream ends (the client left): a drain
/// waiting for room goes on.
struct Closing(Arc<ChunkQueue>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Outflow {
    async fn next(&mut self) -> Option<Event> {
        let ev = loop {
            if let Some((stream, data)) = self.queue.0.pop() {
                let name = if stream == 1 { "stdout" } else { "stderr" };
                let chunk = StreamChunk {
                    data: String::from_utf8_lossy(&data),
                };
                break event(name, &chunk);
            }
            if let Some(result) = self.result.take() {
                self.guard.disarm();
                break result;
            }
            tokio::select! {
                () = self.queue.0.arrived.notified() => {}
                msg = self.rx.recv(), if self.result.is_none() => match msg {
                    Some((true, ev)) => self.result = Some(ev),
                    Some((false, ev)) => break ev,
                    None => return None,
                },
            }
        };
        self.seq += 1;
        Some(ev.id(self.seq.to_string()))
    }
}

/// `GET /v1/executions/{id}`: the stored answer, exactly as it was sent.
#[utoipa::path(get, path = "/v1/executions/{id}", operation_id = "get_execution", tag = "executions",
    params(("id" = String, Path, description = "The execution id")),
    responses(
        (status = 200, description = "The stored answer, byte for byte", body = ExecutionResponse),
        (status = 404, description = "No such execution for this tenant (`execution.not_found`)", body = ErrorEnvelope),
    ))]
pub(super) async fn get(
    State(st): State<Shared>,
    Authed(t): Authed,
    Path(id): Path<String>,
) -> Result<Json<Box<RawValue>>, ApiError> {
    let name = t.tenant.name.clone();
    let state = st.clone();
    let found = tokio::task::spawn_blocking(move || state.audit.get(&name, &id))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    // Another tenant's execution is indistinguishable from a missing one.
    found
        .map(Json)
        .ok_or_else(|| ApiError::new(ErrorCode::ExecutionNotFound, "no such execution"))
}

/// Query of `GET /v1/executions`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    /// Page size, 1-500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
    /// Executions to skip (default 0).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 4294967295_u64)]
    offset: Option<u32>,
    /// Only this profile's.
    profile: Option<String>,
}

/// The answer of `GET /v1/executions`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ExecutionList)]
pub(super) struct ListResponse {
    /// Newest first.
    items: Vec<ExecutionSummary>,
    /// The page size.
    limit: u32,
    /// The executions skipped.
    offset: u32,
}

/// `GET /v1/executions`: a page of the caller's executions, newest first.
#[utoipa::path(get, path = "/v1/executions", operation_id = "list_executions", tag = "executions",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of the caller's executions, newest first", body = ListResponse),
        (status = 400, description = "A limit outside 1-500 or an unknown parameter (`request.invalid`)", body = ErrorEnvelope),
    ))]
pub(super) async fn list(
    State(st): State<Shared>,
    Authed(t): Authed,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ListResponse>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(ErrorCode::RequestInvalid, e.body_text()))?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 500 {
        return Err(ApiError::new(
            ErrorCode::RequestInvalid,
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
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(ListResponse {
        items,
        limit,
        offset,
    }))
}

//! `/mcp/servers/{name}`: a supervised server over MCP streamable HTTP,
//! behind the API's bearer tokens.
//!
//! - A tenant the server does not list gets 404, as for a server that does
//!   not exist.
//! - 2025-11-25 (and older handshake revisions): `initialize` opens a
//!   session bound to (tenant, server); the answer is the process's own
//!   `initialize` result (corral performed the one handshake the process
//!   sees), with the revision the client asked for. Unknown sessions, and
//!   sessions of another tenant or server, get 404.
//! - 2026-07-28 (no sessions): `server/discover` is answered from the same
//!   result; requests carry `MCP-Protocol-Version: 2026-07-28` and no
//!   session, and the reserved `io.modelcontextprotocol/*` keys of their
//!   `_meta` are removed before they reach the process.
//! - Every request goes to the process with a corral-minted id and its
//!   answer comes back with the client's id, as JSON. The tool filter
//!   applies to `tools/list` and `tools/call` (a hidden tool is an unknown
//!   tool). Each tool call is audited (`mcp.call`): tenant, server, tool,
//!   duration, outcome; arguments only when the server's
//!   `audit_arguments` asks.
//! - No GET stream (405): server-initiated messages cannot be attributed
//!   to one client of a shared process and are dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use corral_policy::{AuditEvent, Level, ProcessMode, ReasonCode};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::backend::{Answer, CallError};
use super::{lock, Owner, ServerEntry, Session, Supervisor, Unavailable};
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

type Shared = Arc<AppState>;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";

/// Handshake revisions a client may ask for.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// Session-less revisions.
const MODERN_VERSIONS: [&str; 1] = ["2026-07-28"];

/// The routes: POST, GET (405) and DELETE on `/mcp/servers/{name}`.
pub fn router(state: &Shared) -> axum::Router<Shared> {
    use axum::routing::post;
    // Messages up to each server's limit pass, even past the API's
    // request limit.
    let limit = state
        .config
        .server
        .mcp_servers
        .iter()
        .map(|s| s.max_message_bytes.bytes())
        .max()
        .unwrap_or(0)
        .max(state.config.server.max_request_bytes);
    axum::Router::new()
        .route(
            "/mcp/servers/{name}",
            post(handle_post).get(handle_get).delete(handle_delete),
        )
        .layer(axum::extract::DefaultBodyLimit::max(
            usize::try_from(limit).unwrap_or(usize::MAX),
        ))
}

/// The first fields of a client's message.
#[derive(Deserialize)]
struct ClientMessage {
    #[serde(default)]
    id: Option<Box<RawValue>>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Box<RawValue>>,
}

/// A JSON-RPC error answer with an HTTP status.
fn rpc_error(status: StatusCode, id: Option<&RawValue>, code: i64, message: &str) -> Response {
    let id = id.map(RawValue::get).unwrap_or("null");
    let msg = serde_json::to_string(message).unwrap_or_else(|_| "\"error\"".into());
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{msg}}}}}"#);
    (status, [("content-type", "application/json")], body).into_response()
}

fn json_answer(body: String, session: Option<&str>) -> Response {
    let mut resp = (StatusCode::OK, [("content-type", "application/json")], body).into_response();
    if let Some(s) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
        resp.headers_mut().insert(SESSION_HEADER, s);
    }
    resp
}

fn not_found() -> Response {
    ApiError::new(ErrorCode::NotFound, "no such MCP server").into_response()
}

/// The server entry `name`, if the caller's tenant may reach it.
fn server_for(
    st: &AppState,
    headers: &HeaderMap,
    name: &str,
) -> Result<(String, Arc<ServerEntry>), Box<Response>> {
    let tenant = crate::auth::tenant(st, headers).map_err(|e| Box::new(e.into_response()))?;
    let tenant = tenant.tenant.name.clone();
    let sup = &st.supervisor;
    match sup.servers.get(name) {
        Some(e) if e.allows(&tenant, sup.anonymous()) => Ok((tenant, e.clone())),
        _ => Err(Box::new(not_found())),
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The session a request names, if it is this tenant's on this server.
fn session_of(sup: &Supervisor, id: &str, tenant: &str, server: &str) -> Option<Arc<Session>> {
    let s = lock(&sup.sessions).get(id).cloned()?;
    (s.tenant == tenant && s.server == server).then(|| {
        *lock(&s.last_seen) = Instant::now();
        s
    })
}

async fn handle_get(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = server_for(&st, &headers, &name) {
        return *r;
    }
    let mut resp = (
        StatusCode::METHOD_NOT_ALLOWED,
        "corral's bridge has no server-initiated stream: answers come with each POST",
    )
        .into_response();
    resp.headers_mut()
        .insert("allow", HeaderValue::from_static("POST, DELETE"));
    resp
}

async fn handle_delete(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let (tenant, _) = match server_for(&st, &headers, &name) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let sup = &st.supervisor;
    let Some(id) = header(&headers, SESSION_HEADER) else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            -32600,
            "DELETE needs the Mcp-Session-Id header",
        );
    };
    let Some(s) = session_of(sup, id, &tenant, &name) else {
        return rpc_error(StatusCode::NOT_FOUND, None, -32600, "unknown session");
    };
    lock(&sup.sessions).remove(&s.id);
    sup.session_ended(&s).await;
    StatusCode::NO_CONTENT.into_response()
}

async fn handle_post(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (tenant, entry) = match server_for(&st, &headers, &name) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let sup = st.supervisor.clone();
    let msg: ClientMessage = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            let why = if body.first() == Some(&b'[') {
                "batches are not supported (MCP 2025-06-18 removed them): send one message per request".to_string()
            } else {
                format!("not a JSON-RPC message: {e}")
            };
            return rpc_error(StatusCode::BAD_REQUEST, None, -32700, &why);
        }
    };
    let version = header(&headers, VERSION_HEADER);
    let modern = version.is_some_and(|v| MODERN_VERSIONS.contains(&v));
    if let Some(v) = version {
        if !modern && !HANDSHAKE_VERSIONS.contains(&v) {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                msg.id.as_deref(),
                -32600,
                &format!("unsupported MCP-Protocol-Version `{v}`"),
            );
        }
    }
    let Some(method) = msg.method.clone() else {
        // A client's answer to a server request corral never forwards.
        return StatusCode::ACCEPTED.into_response();
    };
    if let (Some(h), true) = (header(&headers, METHOD_HEADER), modern) {
        if h != method {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                msg.id.as_deref(),
                -32600,
                "the Mcp-Method header differs from the body's method",
            );
        }
    }
    let session_id = header(&headers, SESSION_HEADER).map(str::to_owned);
    let Some(id) = msg.id.as_deref() else {
        return notification(
            &sup,
            &entry,
            &tenant,
            session_id.as_deref(),
            &method,
            msg.params.as_deref(),
        )
        .await;
    };
    if method == "initialize" {
        return initialize(&sup, &entry, &tenant, id, msg.params.as_deref()).await;
    }
    if method == "server/discover" {
        return discover(&sup, &entry, &tenant, id).await;
    }
    let session = match (&session_id, modern) {
        (Some(sid), _) => match session_of(&sup, sid, &tenant, &entry.spec.name) {
            Some(s) => Some(s),
            None => {
                return rpc_error(
                    StatusCode::NOT_FOUND,
                    Some(id),
                    -32600,
                    "unknown or expired session: initialize again",
                )
            }
        },
        (None, true) if entry.spec.mode != ProcessMode::PerSession => None,
        (None, _) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Some(id),
                -32600,
                "missing Mcp-Session-Id: initialize first",
            )
        }
    };
    if let (Some(s), Some(v)) = (&session, version) {
        if v != s.protocol {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Some(id),
                -32600,
                &format!(
                    "MCP-Protocol-Version `{v}` is not the session's `{}`",
                    s.protocol
                ),
            );
        }
    }
    if method == "ping" {
        return json_answer(
            format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, id.get()),
            None,
        );
    }
    let params = match (modern, msg.params) {
        (true, Some(p)) => Some(strip_reserved_meta(&p).unwrap_or(p)),
        (_, p) => p,
    };
    let route = Route {
        sup: &sup,
        entry: &entry,
        tenant: &tenant,
        session: session.as_deref(),
        modern,
    };
    forward(&route, id, &method, params.as_deref()).await
}

/// A result of a handshake-era process, as 2026-07-28 requires it:
/// `resultType` on every result, `ttlMs` and `cacheScope` on list results
/// (inserted into the object's text: a large tool result is not parsed
/// and written again).
fn modernize(raw: &str, method: &str) -> String {
    #[derive(Deserialize)]
    struct Present {
        #[serde(rename = "resultType")]
        result_type: Option<serde::de::IgnoredAny>,
        #[serde(rename = "ttlMs")]
        ttl_ms: Option<serde::de::IgnoredAny>,
        #[serde(rename = "cacheScope")]
        cache_scope: Option<serde::de::IgnoredAny>,
    }
    let Ok(p) = serde_json::from_str::<Present>(raw) else {
        return raw.to_string();
    };
    let mut add = Vec::new();
    if p.result_type.is_none() {
        add.push(r#""resultType":"complete""#);
    }
    if method.ends_with("/list") {
        if p.ttl_ms.is_none() {
            add.push(r#""ttlMs":0"#);
        }
        if p.cache_scope.is_none() {
            add.push(r#""cacheScope":"private""#);
        }
    }
    let body = raw.trim_start();
    let Some(rest) = body.strip_prefix('{') else {
        return raw.to_string();
    };
    if add.is_empty() {
        return raw.to_string();
    }
    let sep = if rest.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    format!("{{{}{sep}{rest}", add.join(","))
}

/// `_meta` keys the 2026-07-28 envelope reserves, removed before a
/// handshake-era process sees the request. `None` when there are none.
fn strip_reserved_meta(params: &RawValue) -> Option<Box<RawValue>> {
    if !params.get().contains("io.modelcontextprotocol/") {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_str(params.get()).ok()?;
    let meta = v.get_mut("_meta")?.as_object_mut()?;
    meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    if meta.is_empty() {
        v.as_object_mut()?.remove("_meta");
    }
    serde_json::value::to_raw_value(&v).ok()
}

fn unavailable(e: &Unavailable, id: Option<&RawValue>) -> Response {
    let status = match e {
        Unavailable::Cap(_) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    rpc_error(status, id, -32000, &e.to_string())
}

async fn refuse_event(sup: &Supervisor, owner: &Owner, reason: &str, message: String) {
    sup.audit
        .emit(
            owner,
            AuditEvent::new(Level::Warn, ReasonCode::McpRefused, message).with("reason", reason),
        )
        .await;
}

fn owner(entry: &ServerEntry, tenant: &str, session: Option<&str>) -> Owner {
    Owner {
        server: entry.spec.name.clone(),
        tenant: tenant.to_string(),
        session: session.map(str::to_owned),
    }
}

async fn initialize(
    sup: &Arc<Supervisor>,
    entry: &Arc<ServerEntry>,
    tenant: &str,
    id: &RawValue,
    params: Option<&RawValue>,
) -> Response {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "protocolVersion")]
        protocol_version: Option<String>,
    }
    let asked = params
        .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
        .and_then(|p| p.protocol_version);
    let protocol = match asked {
        Some(v) if HANDSHAKE_VERSIONS.contains(&v.as_str()) => v,
        _ => HANDSHAKE_VERSIONS[HANDSHAKE_VERSIONS.len() - 1].to_string(),
    };
    // Caps on sessions, before anything starts.
    let (all, mine) = {
        let sessions = lock(&sup.sessions);
        let of_server = sessions.values().filter(|s| s.server == entry.spec.name);
        let (mut all, mut mine) = (0usize, 0usize);
        for s in of_server {
            all += 1;
            mine += usize::from(s.tenant == tenant);
        }
        (all, mine)
    };
    if all >= entry.spec.max_sessions as usize
        || mine >= entry.spec.max_sessions_per_tenant as usize
    {
        let why = format!(
            "server `{}` has {all} sessions ({mine} of this tenant), its limit (max_sessions {}, max_sessions_per_tenant {}): end one (DELETE) or wait for idle ones to expire",
            entry.spec.name, entry.spec.max_sessions, entry.spec.max_sessions_per_tenant
        );
        refuse_event(sup, &owner(entry, tenant, None), "session_cap", why.clone()).await;
        return rpc_error(StatusCode::TOO_MANY_REQUESTS, Some(id), -32000, &why);
    }
    let sid = match session_id() {
        Ok(s) => s,
        Err(e) => return rpc_error(StatusCode::INTERNAL_SERVER_ERROR, Some(id), -32603, &e),
    };
    let key = entry.key_for(tenant, Some(&sid));
    let init = match handshake_result(sup, entry, &key, tenant, id).await {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let mut result = (*init).clone();
    if let Some(o) = result.as_object_mut() {
        o.insert(
            "protocolVersion".into(),
            serde_json::Value::String(protocol.clone()),
        );
    }
    let session = Arc::new(Session {
        id: sid.clone(),
        tenant: tenant.to_string(),
        server: entry.spec.name.clone(),
        protocol,
        last_seen: std::sync::Mutex::new(Instant::now()),
        in_flight: std::sync::Mutex::default(),
    });
    lock(&sup.sessions).insert(sid.clone(), session);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
        id.get(),
        serde_json::to_string(&result).unwrap_or_else(|_| "{}".into())
    );
    json_answer(body, Some(&sid))
}

/// The `initialize` result of the process serving `key` (started if
/// needed), or the answer saying why there is none.
async fn handshake_result(
    sup: &Arc<Supervisor>,
    entry: &Arc<ServerEntry>,
    key: &super::InstanceKey,
    tenant: &str,
    id: &RawValue,
) -> Result<Arc<serde_json::Value>, Box<Response>> {
    let backend = sup
        .backend(entry, key, tenant)
        .await
        .map_err(|e| Box::new(unavailable(&e, Some(id))))?;
    backend.init_result().ok_or_else(|| {
        Box::new(rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(id),
            -32000,
            "the server is not initialised",
        ))
    })
}

/// A new session id: 16 bytes of `getrandom(2)` as hex (the spec asks
/// for a cryptographically random, visible-ASCII id).
fn session_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| format!("no session id: the random source failed: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

async fn discover(
    sup: &Arc<Supervisor>,
    entry: &Arc<ServerEntry>,
    tenant: &str,
    id: &RawValue,
) -> Response {
    if entry.spec.mode == ProcessMode::PerSession {
        // A process per session needs a session: the client falls back
        // to the initialize handshake.
        return rpc_error(
            StatusCode::OK,
            Some(id),
            -32601,
            "server/discover: this server runs a process per session; use initialize",
        );
    }
    let key = entry.key_for(tenant, None);
    let init = match handshake_result(sup, entry, &key, tenant, id).await {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let mut versions: Vec<&str> = HANDSHAKE_VERSIONS.to_vec();
    versions.extend(MODERN_VERSIONS);
    let mut result = serde_json::json!({
        "supportedVersions": versions,
        "capabilities": init.get("capabilities").cloned().unwrap_or_else(|| serde_json::json!({})),
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
    });
    if let Some(i) = init.get("instructions") {
        result["instructions"] = i.clone();
    }
    if let Some(info) = init.get("serverInfo") {
        result["_meta"] = serde_json::json!({"io.modelcontextprotocol/serverInfo": info});
    }
    json_answer(
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
            id.get(),
            result
        ),
        None,
    )
}

async fn notification(
    sup: &Arc<Supervisor>,
    entry: &Arc<ServerEntry>,
    tenant: &str,
    session: Option<&str>,
    method: &str,
    params: Option<&RawValue>,
) -> Response {
    if method != "notifications/cancelled" {
        // `initialized` was corral's to send; the rest concern a process
        // that may serve other clients too.
        return StatusCode::ACCEPTED.into_response();
    }
    #[derive(Deserialize)]
    struct Cancel {
        #[serde(rename = "requestId")]
        request_id: Box<RawValue>,
    }
    let Some(c) = params.and_then(|p| serde_json::from_str::<Cancel>(p.get()).ok()) else {
        return StatusCode::ACCEPTED.into_response();
    };
    let s = session.and_then(|sid| session_of(sup, sid, tenant, &entry.spec.name));
    let ours = s
        .as_ref()
        .and_then(|s| lock(&s.in_flight).get(c.request_id.get()).copied());
    if let Some(ours) = ours {
        let key = entry.key_for(tenant, session);
        let b = lock(&entry.slots)
            .get(&key)
            .and_then(|slot| match &*lock(&slot.state) {
                super::SlotState::Ready(b) => Some(b.clone()),
                _ => None,
            });
        if let Some(b) = b {
            b.cancel(ours).await;
        }
    }
    StatusCode::ACCEPTED.into_response()
}

#[derive(Deserialize)]
struct ToolCallParams {
    name: String,
}

/// Where a request goes.
struct Route<'a> {
    sup: &'a Arc<Supervisor>,
    entry: &'a Arc<ServerEntry>,
    tenant: &'a str,
    /// Its session (none in 2026-07-28).
    session: Option<&'a Session>,
    /// Whether it is a 2026-07-28 request.
    modern: bool,
}

/// Forwards one request and answers with the process's answer.
async fn forward(
    route: &Route<'_>,
    id: &RawValue,
    method: &str,
    params: Option<&RawValue>,
) -> Response {
    let Route {
        sup,
        entry,
        tenant,
        session,
        modern,
    } = *route;
    let sid = session.map(|s| s.id.as_str());
    let who = owner(entry, tenant, sid);
    let tool = if method == "tools/call" {
        let Some(name) = params
            .and_then(|p| serde_json::from_str::<ToolCallParams>(p.get()).ok())
            .map(|p| p.name)
        else {
            return rpc_error(
                StatusCode::OK,
                Some(id),
                -32602,
                "tools/call needs params.name",
            );
        };
        if !entry.spec.tools.allows(&name) {
            refuse_event(
                sup,
                &who,
                "tool_hidden",
                format!("call of hidden tool `{name}` refused"),
            )
            .await;
            return rpc_error(
                StatusCode::OK,
                Some(id),
                -32602,
                &format!("Unknown tool: {name}"),
            );
        }
        Some(name)
    } else {
        None
    };
    let key = entry.key_for(tenant, sid);
    let started = Instant::now();
    let timeout = Duration::from_secs(entry.spec.request_timeout_secs);
    let mut retried = false;
    let answer = loop {
        let backend = match sup.backend(entry, &key, tenant).await {
            Ok(b) => b,
            Err(e) => {
                if let Some(t) = &tool {
                    audit_call(sup, entry, &who, t, started, "unavailable", params).await;
                }
                return unavailable(&e, Some(id));
            }
        };
        if !retried {
            entry.metrics.calls.fetch_add(1, Ordering::Relaxed);
        }
        // The id is taken before the request is sent: a peek at the next
        // one could be taken by a concurrent request, and a client's
        // cancellation then cancel another client's call.
        let ours = backend.reserve_id();
        let _tracked = session.map(|s| InFlightId::track(s, id.get(), ours));
        let answer = backend.request_as(ours, method, params, timeout).await;
        match answer {
            // Retired (idle) between lookup and send: a new process takes
            // it.
            Err(CallError::Stopping) if !retried => retried = true,
            answer => break answer,
        }
    };
    let elapsed = started.elapsed();
    let (resp, outcome) = match answer {
        Ok(a) => answer_response(entry, id, method, a, modern),
        Err(e) => {
            // A JSON-RPC error in a 200: the HTTP exchange itself worked.
            let outcome = match e {
                CallError::Timeout(_) => "timeout",
                CallError::RequestTooLarge(..) | CallError::AnswerTooLarge(..) => "too_large",
                CallError::Gone(_) | CallError::Stopping => "gone",
                CallError::Cancelled => "cancelled",
            };
            if outcome == "too_large" {
                refuse_event(sup, &who, "too_large", e.to_string()).await;
            }
            (
                rpc_error(StatusCode::OK, Some(id), -32603, &e.to_string()),
                outcome,
            )
        }
    };
    if outcome != "ok" {
        entry.metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(t) = &tool {
        entry.metrics.observe(elapsed);
        audit_call(sup, entry, &who, t, started, outcome, params).await;
    }
    resp
}

/// A client request id in its session's `in_flight` map while the request
/// waits, removed however it ends (also when the client goes away).
struct InFlightId<'a>(&'a Session, String);

impl<'a> InFlightId<'a> {
    fn track(s: &'a Session, client_id: &str, ours: u64) -> InFlightId<'a> {
        lock(&s.in_flight).insert(client_id.to_string(), ours);
        InFlightId(s, client_id.to_string())
    }
}

impl Drop for InFlightId<'_> {
    fn drop(&mut self) {
        lock(&self.0.in_flight).remove(&self.1);
    }
}

/// The client's answer, and the call's outcome (`ok`, `tool_error`,
/// `error`).
fn answer_response(
    entry: &ServerEntry,
    id: &RawValue,
    method: &str,
    a: Answer,
    modern: bool,
) -> (Response, &'static str) {
    let (field, raw, outcome) = match (a.result, a.error) {
        (Some(r), _) => {
            let tool_error = method == "tools/call" && is_tool_error(&r);
            ("result", r, if tool_error { "tool_error" } else { "ok" })
        }
        (None, Some(e)) => ("error", e, "error"),
        (None, None) => {
            return (
                rpc_error(
                    StatusCode::OK,
                    Some(id),
                    -32603,
                    "the server answered with neither result nor error",
                ),
                "error",
            )
        }
    };
    let filtered = if method == "tools/list" && field == "result" {
        filter_tools(entry, &raw)
    } else {
        None
    };
    let text = filtered.as_deref().unwrap_or(raw.get());
    let modernized = (modern && field == "result").then(|| modernize(text, method));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{},"{field}":{}}}"#,
        id.get(),
        modernized.as_deref().unwrap_or(text)
    );
    (json_answer(body, None), outcome)
}

fn is_tool_error(result: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Flag {
        #[serde(rename = "isError", default)]
        is_error: bool,
    }
    serde_json::from_str::<Flag>(result.get()).is_ok_and(|f| f.is_error)
}

/// A `tools/list` result without the tools the filter hides.
fn filter_tools(entry: &ServerEntry, raw: &RawValue) -> Option<String> {
    if entry.spec.tools == corral_policy::ToolFilter::All {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    v.get_mut("tools")?.as_array_mut()?.retain(|t| {
        t.get("name")
            .and_then(|n| n.as_str())
            .is_some_and(|n| entry.spec.tools.allows(n))
    });
    serde_json::to_string(&v).ok()
}

async fn audit_call(
    sup: &Supervisor,
    entry: &ServerEntry,
    who: &Owner,
    tool: &str,
    started: Instant,
    outcome: &str,
    params: Option<&RawValue>,
) {
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let level = if outcome == "ok" {
        Level::Info
    } else {
        Level::Warn
    };
    let mut ev = AuditEvent::new(
        level,
        ReasonCode::McpCall,
        format!(
            "tool `{tool}` of `{}`: {outcome} in {ms} ms",
            entry.spec.name
        ),
    )
    .with("tool", tool)
    .with("outcome", outcome)
    .with("duration_ms", ms);
    if entry.spec.audit_arguments {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            arguments: serde_json::Value,
        }
        if let Some(a) = params.and_then(|p| serde_json::from_str::<Args>(p.get()).ok()) {
            ev = ev.with("arguments", a.arguments);
        }
    }
    sup.audit.emit(who, ev).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_meta_keys_are_removed_and_others_kept() {
        let p = RawValue::from_string(
            r#"{"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":1}}"#.into(),
        )
        .unwrap();
        let out: serde_json::Value =
            serde_json::from_str(strip_reserved_meta(&p).unwrap().get()).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"name":"t","_meta":{"progressToken":1}})
        );
        let only =
            RawValue::from_string(r#"{"_meta":{"io.modelcontextprotocol/x":1}}"#.into()).unwrap();
        let out: serde_json::Value =
            serde_json::from_str(strip_reserved_meta(&only).unwrap().get()).unwrap();
        assert_eq!(out, serde_json::json!({}));
        let none = RawValue::from_string(r#"{"name":"t"}"#.into()).unwrap();
        assert!(strip_reserved_meta(&none).is_none());
    }

    #[test]
    fn modern_results_get_their_required_fields() {
        let v = |s: String| serde_json::from_str::<serde_json::Value>(&s).unwrap();
        assert_eq!(
            v(modernize(r#"{"tools":[]}"#, "tools/list")),
            serde_json::json!({"resultType":"complete","ttlMs":0,"cacheScope":"private","tools":[]})
        );
        assert_eq!(
            v(modernize("{}", "ping")),
            serde_json::json!({"resultType":"complete"})
        );
        assert_eq!(
            v(modernize(
                r#"{"content":[],"resultType":"complete"}"#,
                "tools/call"
            )),
            serde_json::json!({"content":[],"resultType":"complete"})
        );
        // Nested keys are not the result's own.
        assert_eq!(
            v(modernize(r#"{"x":{"resultType":1}}"#, "tools/call")),
            serde_json::json!({"resultType":"complete","x":{"resultType":1}})
        );
    }

    #[test]
    fn tool_errors_are_told_from_results() {
        let e = RawValue::from_string(r#"{"content":[],"isError":true}"#.into()).unwrap();
        let ok = RawValue::from_string(r#"{"content":[]}"#.into()).unwrap();
        assert!(is_tool_error(&e));
        assert!(!is_tool_error(&ok));
    }
}

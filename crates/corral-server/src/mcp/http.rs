//! `/mcp`: MCP over streamable HTTP, behind the API's bearer tokens, each
//! session bound to the tenant that opened it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::RoleServer;
use tokio::sync::watch;

use super::{Caller, CorralMcp, Shared};

mod resume;
use crate::error::ApiError;
use crate::state::AppState;

/// `/mcp`: the streamable HTTP MCP endpoint, behind the API's bearer-token
/// authentication. Generic over the outer router's state; it carries its
/// own.
pub fn router<S>(state: Arc<AppState>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let shared = Arc::new(Shared {
        state: state.clone(),
        local: None,
        live: Mutex::default(),
    });
    let server = &state.config.server;
    let mut config = StreamableHttpServerConfig::default().with_max_request_body_bytes(
        usize::try_from(server.max_request_bytes).unwrap_or(usize::MAX),
    );
    if !server.listen.ip().is_loopback() {
        // The Host check guards unauthenticated loopback servers against
        // DNS rebinding; beyond loopback every caller has a bearer token
        // (checked at start-up) and the server's names are not known here.
        config = config.disable_allowed_hosts();
    }
    // Open event streams would keep a graceful shutdown waiting: end the
    // sessions on the signals that stop the server.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let token = config.cancellation_token.clone();
        rt.spawn(async move {
            crate::shutdown_signal().await;
            token.cancel();
        });
    }
    // Every event kept for a while, so that a client whose stream broke
    // during a call gets the answer when it resumes (see [`resume`]).
    let sessions = Arc::new(
        LocalSessionManager::default().with_event_store(Arc::new(resume::ResumeStore::default())),
    );
    let service = StreamableHttpService::new(
        move || Ok(CorralMcp::new(shared.clone())),
        sessions.clone(),
        config,
    );
    let gate = Arc::new(Gate {
        state,
        sessions,
        owners: Mutex::default(),
    });
    Router::new()
        .route_service("/mcp", service)
        .layer(middleware::from_fn_with_state(gate, authenticate))
}

/// What the authentication layer in front of `/mcp` knows.
struct Gate {
    state: Arc<AppState>,
    /// The SDK's sessions, to forget owners of sessions that are gone.
    sessions: Arc<LocalSessionManager>,
    /// Which tenant opened each session (by `Mcp-Session-Id`), and when
    /// a request of it last began or ended.
    owners: Mutex<HashMap<String, Owner>>,
}

/// A session's tenant and last use.
#[derive(Debug)]
struct Owner {
    caller: usize,
    last_used: Instant,
    /// Dropped when the session is forgotten (its `DELETE`, reaped for
    /// room, closed by the SDK): what [`session_ended`] waits for.
    end: watch::Sender<()>,
}

/// Attached to each request of a known session: its end, as
/// [`session_ended`] sees it.
#[derive(Debug, Clone)]
struct SessionEnd(watch::Receiver<()>);

/// Completes when the session of the request in `ctx` ends, and never for
/// a request outside a known session. rmcp cancels a closed session's
/// running handlers only after letting them finish for up to 5 s (to send
/// their answers, which nobody will read); a `run_code` waits on this too,
/// so that a `DELETE` kills its sandbox at once. The Python SDK 1.x sends
/// no cancel when a call times out: ending the session is how its user
/// stops one.
pub(super) async fn session_ended(ctx: &RequestContext<RoleServer>) {
    let end = ctx
        .extensions
        .get::<Parts>()
        .and_then(|p| p.extensions.get::<SessionEnd>())
        .cloned();
    match end {
        // No value is ever sent: this returns when the sender is dropped.
        Some(SessionEnd(mut rx)) => while rx.changed().await.is_ok() {},
        None => std::future::pending().await,
    }
}

impl Gate {
    /// Open sessions of `caller` and of everyone, after forgetting the
    /// ones the SDK has closed.
    async fn open_sessions(&self, caller: usize) -> (usize, usize) {
        let live: HashSet<String> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners.retain(|k, _| live.contains(k));
        let mine = owners.values().filter(|o| o.caller == caller).count();
        (mine, owners.len())
    }

    /// Marks a session used now.
    fn touch(&self, id: &str) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = owners.get_mut(id) {
            o.last_used = Instant::now();
        }
    }

    /// Under pressure (a new session of `caller` would pass a cap), ends
    /// the least recently used session idle for at least `idle` and with
    /// no request in progress: one of
    /// `caller`'s own when it is the tenant's cap, any when it is the
    /// server's. Answers whether one was ended.
    async fn reap_one(&self, caller: usize, own_cap: bool, idle: Duration) -> bool {
        let victim = {
            let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
            owners
                .iter()
                .filter(|(_, o)| !own_cap || o.caller == caller)
                .filter(|(_, o)| o.last_used.elapsed() >= idle)
                // A request of it still in the handler (a long run_code)
                // holds a receiver of its end: not idle, however old.
                .filter(|(_, o)| o.end.receiver_count() == 0)
                .min_by_key(|(_, o)| o.last_used)
                .map(|(id, o)| (id.clone(), o.caller, o.last_used))
        };
        let Some((id, owner, last_used)) = victim else {
            return false;
        };
        let closed = self.sessions.close_session(&Arc::from(id.as_str())).await;
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let tenant = self
            .state
            .tenants
            .get(owner)
            .map_or("", |t| t.tenant.name.as_str());
        tracing::info!(
            tenant,
            idle_secs = last_used.elapsed().as_secs(),
            closed = closed.is_ok(),
            "idle MCP session ended to make room for a new one"
        );
        true
    }
}

/// The session header, on requests and on the `initialize` answer.
const SESSION_HEADER: &str = "mcp-session-id";

/// MCP sessions one tenant may hold open at once.
pub const MAX_SESSIONS_PER_TENANT: usize = 64;
/// MCP sessions open at once, all tenants together.
pub const MAX_SESSIONS: usize = 1024;

/// The API's authentication in front of `/mcp`: 401 with the API's error
/// body, or the tenant attached to the request for the handler. A session
/// id opened by another tenant is answered like an unknown one (404), for
/// every method: posting to it, listening on it, deleting it.
async fn authenticate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let st = &gate.state;
    let index = match crate::auth::tenant(st, req.headers()) {
        Ok(t) => st.tenants.iter().position(|x| Arc::ptr_eq(x, t)),
        Err(e) => return e.into_response(),
    };
    let Some(caller) = index else {
        return ApiError::internal("tenant not found").into_response();
    };
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session {
        let owner = gate
            .owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(id)
            .map(|o| (o.caller, SessionEnd(o.end.subscribe())));
        if let Some((owner, end)) = owner {
            if owner != caller {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            req.extensions_mut().insert(end);
        }
    }
    if session.is_none() && req.method() == Method::POST {
        // A new session: within the caps (sessions the SDK has closed
        // since are forgotten first). At a cap, the least recently used
        // session idle for `mcp_pressure_idle_secs` is ended to make room,
        // long before the SDK's own idle expiry.
        let idle = Duration::from_secs(st.config.server.mcp_pressure_idle_secs);
        loop {
            let (mine, all) = gate.open_sessions(caller).await;
            if mine < MAX_SESSIONS_PER_TENANT && all < MAX_SESSIONS {
                break;
            }
            if !gate
                .reap_one(caller, mine >= MAX_SESSIONS_PER_TENANT, idle)
                .await
            {
                return ApiError::busy(format!(
                    "too many MCP sessions: this tenant holds {mine} (at most {MAX_SESSIONS_PER_TENANT}), \
                     the server {all} (at most {MAX_SESSIONS}), none idle for {} s; end one with DELETE and retry",
                    idle.as_secs()
                ))
                .into_response();
            }
        }
    }
    if let Some(id) = &session {
        gate.touch(id);
    }
    req.extensions_mut().insert(Caller(caller));
    let delete = req.method() == Method::DELETE;
    let mut resp = next.run(req).await;
    if let Some(id) = &session {
        gate.touch(id);
    }
    let status = resp.status();
    if delete && status == StatusCode::ACCEPTED {
        // The SDK answers a session's DELETE with 202 once the session is
        // closed; the Python SDK expects 200 or 204 and logs a failure
        // otherwise. It is done: say so.
        *resp.status_mut() = StatusCode::NO_CONTENT;
    }
    if let (Some(id), true) = (&session, delete && status.is_success()) {
        gate.owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(id);
    }
    let opened = resp
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|_| session.is_none());
    if let Some(id) = opened {
        // A new session: remember its tenant, and forget the sessions the
        // SDK has closed since (idle timeout, end of stream).
        let live: HashSet<String> = gate
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut owners = gate
            .owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        owners.retain(|k, _| live.contains(k));
        owners.insert(
            id.to_owned(),
            Owner {
                caller,
                last_used: Instant::now(),
                end: watch::channel(()).0,
            },
        );
    }
    resp
}

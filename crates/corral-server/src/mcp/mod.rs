//! The service as an MCP server (the official Rust SDK, `rmcp`): streamable
//! HTTP at `/mcp` next to the HTTP API ([`http`]), and stdio for
//! `corral mcp` ([`stdio`]).
//!
//! Tools ([`tools`]):
//!
//! - `run_code` {language, code, timeout_ms?, max_output_bytes?}: only
//!   listed (and only callable) when code mode is on. It goes through the same validation
//!   as `POST /v1/executions` ([`crate::exec::prepare_code`]: profile,
//!   ceilings, code mode gate), waits in the session's queue (one
//!   execution per session at a time; up to `server.mcp_session_queue`
//!   calls wait behind it, in order; a call cancelled while it waits
//!   leaves at once, a running one is killed), then takes a tenant slot
//!   and a global slot without waiting (saturated: a `busy` tool error), and
//!   is audited like every other execution. Its result is sized for the
//!   SDKs (whose SSE readers take 1 MiB per event): each stream is cut to
//!   `max_output_bytes` (default 64 KiB, at most 256 KiB; head and tail
//!   around an elision marker), sent once (as structured content; the text
//!   is a summary, the streams whole only when small), as
//!   `stdout_base64`/`stderr_base64` when JSON escaping would make it
//!   larger than base64 (control bytes).
//! - `write_file` {path, content, encoding?}, `read_file` {path, offset?,
//!   max_bytes?} (a window sized like `run_code`'s streams, once, as
//!   structured content; the text is the content only when small),
//!   `list_files` {path?}: the session's workspace, through
//!   [`crate::workspace::Workspace`] (openat2 beneath the workspace, no
//!   symlinks, reserved `.corral*` names denied, sizes capped). `run_code`
//!   runs *in* that workspace, so files go both ways.
//!
//! Sessions: each MCP session (an `initialize` handshake over HTTP, or one
//! stdio connection) gets its own workspace, created on first use under the
//! server's directory and removed when the session ends (a client's
//! DELETE, the SDK's idle timeout, the stdio pipe closing, shutdown), or by
//! the next start-up's sweep if the server was killed. The server speaks
//! the protocol revisions that have sessions (up to 2025-11-25): a
//! session-less 2026-07-28 client that probes with `server/discover` is told
//! so and falls back to the `initialize` handshake.
//!
//! Authentication on `/mcp` is the HTTP API's: the same bearer tokens, the
//! same 401 body. A session belongs to the tenant that opened it; requests
//! carrying its id with another tenant's token are refused. Over stdio there
//! is no token: the caller is whoever started `corral mcp` (who can read
//! its config anyway) and acts as the tenant `local`, with every profile.

mod http;
mod session;
mod stdio;
mod tools;

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::http::request::Parts;
use corral_policy::{AuditEvent, Level, ReasonCode};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, InitializeRequestParams, InitializeResult,
    ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use tracing::Instrument;

pub use http::router;
pub use stdio::serve_stdio;

use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, TenantState};
use session::SessionWorkspace;
use tools::{ListFilesArgs, ReadFileArgs, RunCodeArgs, WriteFileArgs};

/// Most sessions with a workspace one tenant may have open at once.
pub const MAX_SESSIONS_PER_TENANT: usize = 64;
/// The newest protocol revision served: the last one with sessions, which
/// the per-session workspace needs.
const PROTOCOL: ProtocolVersion = ProtocolVersion::LATEST_WITH_INITIALIZE;

/// The authenticated caller of one HTTP request: an index into
/// [`AppState::tenants`], put into the request's extensions by the
/// authentication layer in front of `/mcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caller(usize);

/// What every session of one MCP front end shares.
struct Shared {
    state: Arc<AppState>,
    /// The stdio caller's tenant; `None` over HTTP, where tenants come from
    /// the bearer token.
    local: Option<Arc<TenantState>>,
    /// Sessions holding a workspace, per tenant name.
    live: Mutex<HashMap<String, Live>>,
}

/// One tenant's session workspaces: how many, and the bytes their
/// `workspace_size` reserves (checked against
/// `server.tenant_workspace_bytes`).
#[derive(Debug, Default, Clone, Copy)]
struct Live {
    sessions: usize,
    bytes: u64,
}

/// Counts one tenant's session workspace (and its size) while it exists.
struct LiveSlot {
    shared: Arc<Shared>,
    tenant: String,
    bytes: u64,
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(n) = live.get_mut(&self.tenant) {
            n.sessions = n.sessions.saturating_sub(1);
            n.bytes = n.bytes.saturating_sub(self.bytes);
            if n.sessions == 0 {
                live.remove(&self.tenant);
            }
        }
    }
}

/// One MCP session's own state.
#[derive(Default)]
struct Session {
    /// The tenant that opened the session (HTTP).
    owner: OnceLock<usize>,
    /// The workspace, created on first use.
    workspace: Mutex<Option<(Arc<SessionWorkspace>, LiveSlot)>>,
    /// `write_file` calls one at a time (the workspace cap is measured
    /// before each write).
    writes: tokio::sync::Mutex<()>,
    /// One execution at a time: they share the workspace (and its code
    /// file). Calls wait for it in order (tokio's mutex is fair).
    running: tokio::sync::Mutex<()>,
    /// `run_code` calls waiting for `running`, at most
    /// `server.mcp_session_queue`.
    queued: std::sync::atomic::AtomicU32,
}

impl Drop for Session {
    fn drop(&mut self) {
        let taken = self
            .workspace
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let Some(held) = taken else { return };
        // Removal walks the tree: off the async workers when there are some.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || drop(held));
            }
            Err(_) => drop(held),
        }
    }
}

/// The MCP server handler: one per session.
pub struct CorralMcp {
    shared: Arc<Shared>,
    session: Arc<Session>,
    tool_router: ToolRouter<CorralMcp>,
    /// Counts this session in `corral_mcp_sessions` (HTTP) while it lives.
    _open: Option<OpenSession>,
}

/// One open `/mcp` session in the metrics, for as long as its handler
/// lives.
struct OpenSession(Arc<AppState>);

impl OpenSession {
    fn new(state: &Arc<AppState>) -> OpenSession {
        state
            .metrics
            .mcp_sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        OpenSession(state.clone())
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0
            .metrics
            .mcp_sessions
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CorralMcp {
    fn new(shared: Arc<Shared>) -> CorralMcp {
        let mut tool_router = Self::tool_router();
        if !shared.state.config.server.code_mode {
            tool_router.remove_route("run_code");
        }
        let open = shared
            .local
            .is_none()
            .then(|| OpenSession::new(&shared.state));
        CorralMcp {
            shared,
            session: Arc::default(),
            tool_router,
            _open: open,
        }
    }

    /// The tenant making this request, which must be the session's. Its
    /// name is recorded on the tool call's span.
    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<&Arc<TenantState>, ApiError> {
        let found = self.find_tenant(ctx)?;
        tracing::Span::current().record("tenant", found.tenant.name.as_str());
        Ok(found)
    }

    fn find_tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<&Arc<TenantState>, ApiError> {
        if let Some(local) = &self.shared.local {
            return Ok(local);
        }
        let caller = caller(ctx).ok_or_else(|| {
            ApiError::new(
                ErrorCode::AuthMissing,
                "the request carries no authenticated tenant",
            )
        })?;
        let owner = *self.session.owner.get_or_init(|| caller);
        if owner != caller {
            return Err(ApiError::new(
                ErrorCode::SessionForbidden,
                "this MCP session belongs to another tenant",
            ));
        }
        self.shared
            .state
            .tenants
            .get(caller)
            .ok_or_else(|| ApiError::internal("unknown tenant"))
    }

    /// The session's workspace, created on first use.
    fn workspace(&self, tenant: &TenantState) -> Result<Arc<SessionWorkspace>, ApiError> {
        let mut held = self
            .session
            .workspace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((ws, _)) = held.as_ref() {
            return Ok(ws.clone());
        }
        let shared = &self.shared;
        let name = &tenant.tenant.name;
        let profile_name = tenant
            .tenant
            .profiles
            .first()
            .map_or(corral_policy::builtin::DEFAULT_PROFILE, String::as_str);
        let profile = shared
            .state
            .config
            .profile(profile_name)
            .map_err(|e| ApiError::new(ErrorCode::ProfileUnknown, e.to_string()))?;
        let bytes = profile.filesystem.workspace_size.bytes();
        let budget = shared.state.config.server.tenant_workspace_bytes;
        {
            let mut live = shared
                .live
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let n = live.entry(name.clone()).or_default();
            if n.sessions >= MAX_SESSIONS_PER_TENANT {
                return Err(ApiError::busy(format!(
                    "this tenant already has {MAX_SESSIONS_PER_TENANT} MCP sessions with a workspace; close one (end its session) and retry"
                )));
            }
            if n.bytes.saturating_add(bytes) > budget {
                return Err(ApiError::busy(format!(
                    "this tenant's MCP session workspaces already reserve {} of its {budget} bytes (server.tenant_workspace_bytes; each takes its profile's workspace_size, {bytes}); end a session and retry",
                    n.bytes
                )));
            }
            n.sessions += 1;
            n.bytes += bytes;
        }
        let slot = LiveSlot {
            shared: shared.clone(),
            tenant: name.clone(),
            bytes,
        };
        let ws = SessionWorkspace::create(&shared.state, profile)
            .map(Arc::new)
            .map_err(|e| ApiError::internal(format!("creating the session workspace: {e}")))?;
        *held = Some((ws.clone(), slot));
        Ok(ws)
    }
}

impl CorralMcp {
    /// The caller's tenant name, for a refusal's audit event ("" when the
    /// request carries none).
    fn tenant_name(&self, ctx: &RequestContext<RoleServer>) -> String {
        self.find_tenant(ctx)
            .map(|t| t.tenant.name.clone())
            .unwrap_or_default()
    }

    /// Runs one tool call in its `mcp_tool` span and turns its error into
    /// a tool error: `message (code)` as text, the API's error body as
    /// structured content (for a refused execution, the stored record with
    /// its id). A refusal (a 4xx-class error that is not a runtime refusal,
    /// which has its execution record) is also an `api.refused` audit
    /// event, as over HTTP.
    async fn traced(
        &self,
        tool: &'static str,
        tenant: String,
        call: impl Future<Output = Result<CallToolResult, ApiError>>,
    ) -> Result<CallToolResult, ErrorData> {
        let span = tracing::info_span!(
            "mcp_tool",
            tool,
            tenant = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let since = Instant::now();
        let result = call.instrument(span.clone()).await;
        let ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        span.record("duration_ms", ms);
        let e = match result {
            Ok(done) => {
                span.in_scope(|| {
                    span.record("outcome", "ok");
                    tracing::info!("tool call finished");
                });
                return Ok(done);
            }
            Err(e) => e,
        };
        span.record("outcome", e.code());
        if e.status().is_server_error() {
            span.in_scope(|| tracing::error!(error = %e, "tool call failed"));
        } else {
            span.in_scope(|| tracing::info!(error = %e, "tool call refused"));
            if !matches!(e, ApiError::Refused(_)) {
                let ev = AuditEvent::new(
                    Level::Warn,
                    ReasonCode::ApiRefused,
                    format!("MCP tool {tool}: {e}"),
                )
                .with("error", e.code())
                .with("tool", tool)
                .with("via", "mcp");
                self.shared.state.events.emit_service(&tenant, ev).await;
            }
        }
        Ok(tool_error(&e))
    }
}

/// The API's error as a tool error.
fn tool_error(e: &ApiError) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{e} ({})", e.code()))]);
    r.structured_content = serde_json::to_value(e.body()).ok();
    r
}

/// The caller the authentication layer attached to this HTTP request.
fn caller(ctx: &RequestContext<RoleServer>) -> Option<usize> {
    ctx.extensions
        .get::<Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .map(|c| c.0)
}

#[tool_router]
impl CorralMcp {
    #[tool(
        description = "Run a program (python, node or bash) in a fresh sandbox whose working directory is this session's workspace: files written with write_file are there, and files the program writes can be read back with read_file. No network. Returns exit_code, stdout, stderr, timed_out and usage as structured content. Each stream is cut to max_output_bytes (default 65536, at most 262144): head and tail, marked stdout_truncated/stderr_truncated, with stdout_bytes/stderr_bytes the size written. Output mostly of control bytes comes as stdout_base64/stderr_base64 instead."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = self.tenant_name(&ctx);
        self.traced("run_code", tenant, self.run_code_inner(args, ctx))
            .await
    }

    #[tool(
        description = "Write a file into this session's workspace (created or replaced; parent directories are created). Paths are relative; `..`, absolute paths, symbolic links and names starting with .corral are refused; at most 1 MiB per file."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = self.tenant_name(&ctx);
        self.traced("write_file", tenant, self.write_file_inner(args, ctx))
            .await
    }

    #[tool(
        description = "Read a regular file (at most 1 MiB) from this session's workspace, one window at a time: max_bytes from offset (default 65536, at most 262144), as structured content (content, encoding, size_bytes, truncated, next_offset to continue). Symbolic links are never followed. Content that is not UTF-8, or mostly control bytes, comes back base64-encoded."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = self.tenant_name(&ctx);
        self.traced("read_file", tenant, self.read_file_inner(args, ctx))
            .await
    }

    #[tool(
        description = "List a directory of this session's workspace (default: its top): each entry's name, kind (file, dir, symlink, other) and size."
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = self.tenant_name(&ctx);
        self.traced("list_files", tenant, self.list_files_inner(args, ctx))
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CorralMcp {
    fn get_info(&self) -> ServerConfig {
        let code = if self.shared.state.config.server.code_mode {
            "run_code runs python, node or bash in a sandbox whose working directory is the workspace. "
        } else {
            ""
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(PROTOCOL)
            .with_server_info(Implementation::new("corral", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "corral: a sandbox for code nobody should trust. {code}Each session has its own workspace (write_file, read_file, list_files), deleted when the session ends."
            ))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&PROTOCOL))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // The session is bound to the tenant that opened it.
        if let Some(c) = caller(&context) {
            let _ = self.session.owner.set(c);
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }
}

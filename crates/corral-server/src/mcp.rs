//! The service as an MCP server (the official Rust SDK, `rmcp`): streamable
//! HTTP at `/mcp` next to the HTTP API, and stdio for `corral mcp`.
//!
//! Tools:
//!
//! - `run_code` {language, code, timeout_ms?}: only listed (and only
//!   callable) when code mode is on. It goes through the same
//!   [`exec::prepare`] as `POST /v1/executions` (profile, ceilings, code
//!   mode gate), takes a tenant slot and a global slot without waiting
//!   (saturated: a `busy` tool error, never a queue), and is audited like
//!   every other execution.
//! - `write_file` {path, content, encoding?}, `read_file` {path},
//!   `list_files` {path?}: the session's workspace, through
//!   [`crate::workspace::Workspace`] (openat2 beneath the
//!   workspace, no symlinks, reserved `.corral*` names denied, sizes
//!   capped). `run_code` runs *in* that workspace, so files go both ways.
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

pub mod session;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::workspace::{check_path, EntryKind, FileLimits, WorkspaceError, DEFAULT_RESERVED};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use corral_policy::{Config, Tenant};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, InitializeRequestParams, InitializeResult,
    ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::schemars::JsonSchema;
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::error::{ApiError, ServerError};
use crate::exec::{self, base64_decode, base64_encode, ExecutionRequest};
use crate::state::{AppState, TenantState};
use session::{run_in_workspace, SessionWorkspace};

/// Largest file `write_file` writes and `read_file` returns.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Largest total of regular files in a session workspace that `write_file`
/// still adds to (what the code wrote counts too).
pub const MAX_WORKSPACE_BYTES: u64 = 64 << 20;
/// Most entries `list_files` returns.
pub const MAX_LIST_ENTRIES: usize = 1000;
/// Most sessions with a workspace one tenant may have open at once.
pub const MAX_SESSIONS_PER_TENANT: usize = 64;
/// The newest protocol revision served: the last one with sessions, which
/// the per-session workspace needs.
const PROTOCOL: ProtocolVersion = ProtocolVersion::LATEST_WITH_INITIALIZE;
/// The stdio caller's tenant name.
const LOCAL_TENANT: &str = "local";

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
    local: Option<TenantState>,
    /// Sessions holding a workspace, per tenant name.
    live: Mutex<HashMap<String, usize>>,
}

/// Counts one tenant's session workspace while it exists.
struct LiveSlot {
    shared: Arc<Shared>,
    tenant: String,
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(n) = live.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
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
    /// One execution at a time: they share the workspace (and its code file).
    running: tokio::sync::Mutex<()>,
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
}

/// `python`, `node` or `bash`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// python3
    Python,
    /// node
    Node,
    /// bash
    Bash,
}

impl Language {
    fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
        }
    }
}

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RunCodeArgs {
    /// The interpreter: python, node or bash.
    pub language: Language,
    /// The program text.
    pub code: String,
    /// Wall-clock limit in milliseconds (rounded up to whole seconds; at
    /// most the profile's ceiling).
    pub timeout_ms: Option<u64>,
}

/// `utf8` (default) or `base64`.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The content is the text itself.
    #[default]
    Utf8,
    /// The content is base64 (binary files).
    Base64,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteFileArgs {
    /// Path relative to the workspace, e.g. `data/input.csv`.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// How `content` is encoded: utf8 (default) or base64.
    pub encoding: Option<Encoding>,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadFileArgs {
    /// Path relative to the workspace.
    pub path: String,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListFilesArgs {
    /// Directory relative to the workspace (default: the workspace itself).
    pub path: Option<String>,
}

/// A tool error: `{"error": {"code", "message"}}` as structured content,
/// and `message (code)` as text.
fn tool_error(code: &str, message: impl std::fmt::Display) -> CallToolResult {
    let message = message.to_string();
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{message} ({code})"))]);
    r.structured_content = Some(json!({"error": {"code": code, "message": message}}));
    r
}

/// The API's error as a tool error; its structured content is the API's
/// answer (for a refused execution, the stored record with its id).
fn api_error(e: &ApiError) -> CallToolResult {
    let mut r = tool_error(&e.code, &e.message);
    r.structured_content = Some(e.to_json());
    r
}

fn workspace_error(e: &WorkspaceError) -> CallToolResult {
    tool_error(e.code(), e)
}

/// A tool's answer: the error result, or the value to wrap.
type Outcome<T> = Result<T, CallToolResult>;

fn finish(outcome: Outcome<CallToolResult>) -> Result<CallToolResult, ErrorData> {
    Ok(outcome.unwrap_or_else(|e| e))
}

/// Kills the execution when the tool call is dropped before it finished
/// (the session closed, the client went away).
struct CancelOnDrop(Arc<AtomicBool>, bool);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

impl CorralMcp {
    fn new(shared: Arc<Shared>) -> CorralMcp {
        let mut tool_router = Self::tool_router();
        if !shared.state.config.server.code_mode {
            tool_router.remove_route("run_code");
        }
        CorralMcp {
            shared,
            session: Arc::default(),
            tool_router,
        }
    }

    /// The tenant making this request, which must be the session's.
    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Outcome<&TenantState> {
        if let Some(local) = &self.shared.local {
            return Ok(local);
        }
        let caller = caller(ctx).ok_or_else(|| {
            tool_error(
                "auth.missing",
                "the request carries no authenticated tenant",
            )
        })?;
        let owner = *self.session.owner.get_or_init(|| caller);
        if owner != caller {
            return Err(tool_error(
                "session.forbidden",
                "this MCP session belongs to another tenant",
            ));
        }
        self.shared
            .state
            .tenants
            .get(caller)
            .ok_or_else(|| tool_error("internal", "unknown tenant"))
    }

    /// The session's workspace, created on first use.
    fn workspace(&self, tenant: &TenantState) -> Outcome<Arc<SessionWorkspace>> {
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
        {
            let mut live = shared
                .live
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let n = live.entry(name.clone()).or_insert(0);
            if *n >= MAX_SESSIONS_PER_TENANT {
                return Err(tool_error(
                    "busy",
                    format!(
                        "this tenant already has {MAX_SESSIONS_PER_TENANT} MCP sessions with a workspace; close one (end its session) and retry"
                    ),
                ));
            }
            *n += 1;
        }
        let slot = LiveSlot {
            shared: shared.clone(),
            tenant: name.clone(),
        };
        let profile_name = tenant
            .tenant
            .profiles
            .first()
            .map_or("code", String::as_str);
        let profile = shared
            .state
            .config
            .profile(profile_name)
            .map_err(|e| tool_error("profile.unknown", e))?;
        let ws = SessionWorkspace::create(&shared.state, profile)
            .map(Arc::new)
            .map_err(|e| tool_error("internal", format!("creating the session workspace: {e}")))?;
        *held = Some((ws.clone(), slot));
        Ok(ws)
    }

    async fn run_code_inner(
        &self,
        args: RunCodeArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Outcome<CallToolResult> {
        let st = &self.shared.state;
        let t = self.tenant(&ctx)?;
        let refused = |e: ApiError| {
            st.metrics.refused.fetch_add(1, Ordering::Relaxed);
            api_error(&e)
        };
        if !st.config.server.code_mode {
            return Err(refused(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "code_mode.disabled",
                "code mode is off on this server",
            )));
        }
        // The very request body `POST /v1/executions` takes, through the
        // same validation.
        let mut body = json!({"language": args.language.as_str(), "code": args.code});
        if let Some(ms) = args.timeout_ms {
            body["limits"] = json!({"timeout_ms": ms});
        }
        let req: ExecutionRequest = serde_json::from_value(body).map_err(|e| {
            refused(ApiError::bad_request(
                "request.invalid",
                format!("invalid run_code arguments: {e}"),
            ))
        })?;
        let prepared = exec::prepare(st, &t.tenant.profiles, req).map_err(refused)?;
        let ws = self.workspace(t)?;
        let id = exec::new_id().map_err(|e| api_error(&e))?;
        // Saturated: a busy answer, never a queue.
        let busy = |what: &str| {
            st.metrics.busy.fetch_add(1, Ordering::Relaxed);
            tool_error(
                "busy",
                format!("{what}; retry in a moment (calls are not queued)"),
            )
        };
        let session_slot = self
            .session
            .running
            .try_lock()
            .map_err(|_| busy("this session is already running code"))?;
        let tenant_slot = t
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("all of this tenant's execution slots are in use"))?;
        let global_slot = st
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("all execution slots are in use"))?;
        st.metrics.started.fetch_add(1, Ordering::Relaxed);
        let cancel = Arc::new(AtomicBool::new(false));
        let mut guard = CancelOnDrop(cancel.clone(), false);
        let state = st.clone();
        let tenant_name = t.tenant.name.clone();
        let flag = cancel.clone();
        let mut task = tokio::task::spawn_blocking(move || {
            let result = run_in_workspace(&state, &tenant_name, &id, prepared, &ws, flag);
            state.metrics.finished.fetch_add(1, Ordering::Relaxed);
            drop((tenant_slot, global_slot));
            result
        });
        let joined = tokio::select! {
            r = &mut task => r,
            () = ctx.ct.cancelled() => {
                // The client cancelled the call: kill the sandbox, then
                // wait for it to be gone.
                cancel.store(true, Ordering::Relaxed);
                task.await
            }
        };
        guard.1 = true;
        drop(session_slot);
        let result = joined
            .map_err(|e| tool_error("internal", format!("execution task failed: {e}")))?
            .map_err(|e| api_error(&e))?;
        Ok(run_result(&result))
    }

    async fn write_file_inner(
        &self,
        args: WriteFileArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Outcome<CallToolResult> {
        let t = self.tenant(&ctx)?;
        let data = match args.encoding.unwrap_or_default() {
            Encoding::Utf8 => args.content.into_bytes(),
            Encoding::Base64 => base64_decode(&args.content).ok_or_else(|| {
                tool_error(
                    "files.encoding",
                    format!("{:?}: content is not valid base64", args.path),
                )
            })?,
        };
        // Refused before anything touches the disk (the workspace checks
        // again, and the kernel is what keeps the host safe).
        check_path(&args.path, DEFAULT_RESERVED).map_err(|e| workspace_error(&e))?;
        let len = data.len() as u64;
        if len > MAX_FILE_BYTES {
            return Err(workspace_error(&WorkspaceError::TooLarge {
                path: args.path,
                limit_bytes: MAX_FILE_BYTES,
            }));
        }
        let ws = self.workspace(t)?;
        let _one_writer = self.session.writes.lock().await;
        let path = args.path.clone();
        blocking(move || {
            let limits = FileLimits {
                max_file_bytes: MAX_FILE_BYTES,
                max_workspace_bytes: MAX_WORKSPACE_BYTES,
                reserved: DEFAULT_RESERVED,
            };
            ws.write_file(&path, &data, &limits)
        })
        .await?
        .map_err(|e| workspace_error(&e))?;
        let value = json!({"path": args.path, "size_bytes": len});
        let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
            "wrote {len} bytes to {}",
            args.path
        ))]);
        r.structured_content = Some(value);
        Ok(r)
    }

    async fn read_file_inner(
        &self,
        args: ReadFileArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Outcome<CallToolResult> {
        let t = self.tenant(&ctx)?;
        // corral's own files (the code file under `.corral/`) are not the
        // caller's to read either.
        check_path(&args.path, DEFAULT_RESERVED).map_err(|e| workspace_error(&e))?;
        let ws = self.workspace(t)?;
        let path = args.path.clone();
        let data = blocking(move || ws.read_file(&path, MAX_FILE_BYTES))
            .await?
            .map_err(|e| workspace_error(&e))?;
        let size = data.len() as u64;
        let (text, value) = match String::from_utf8(data) {
            Ok(text) => (
                text.clone(),
                json!({"path": args.path, "encoding": "utf8", "content": text, "size_bytes": size}),
            ),
            Err(e) => {
                let b64 = base64_encode(e.as_bytes());
                (
                    b64.clone(),
                    json!({"path": args.path, "encoding": "base64", "content": b64, "size_bytes": size}),
                )
            }
        };
        let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
        r.structured_content = Some(value);
        Ok(r)
    }

    async fn list_files_inner(
        &self,
        args: ListFilesArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Outcome<CallToolResult> {
        let t = self.tenant(&ctx)?;
        let path = args.path.unwrap_or_default();
        // A reserved first component is refused like a read of it.
        if let Some(first) = path.split('/').find(|c| !c.is_empty() && *c != ".") {
            check_path(first, DEFAULT_RESERVED).map_err(|e| workspace_error(&e))?;
        }
        let top = path.split('/').all(|c| c.is_empty() || c == ".");
        let ws = self.workspace(t)?;
        let rel = path.clone();
        let listing = blocking(move || ws.list(&rel, MAX_LIST_ENTRIES))
            .await?
            .map_err(|e| workspace_error(&e))?;
        let reserved = |name: &str| top && check_path(name, DEFAULT_RESERVED).is_err();
        let entries: Vec<Value> = listing
            .entries
            .iter()
            .filter_map(|e| {
                let name = e.name.to_string_lossy();
                if reserved(&name) {
                    return None;
                }
                let kind = match e.kind {
                    EntryKind::File => "file",
                    EntryKind::Dir => "dir",
                    EntryKind::Symlink => "symlink",
                    EntryKind::Other => "other",
                };
                Some(json!({"name": name, "kind": kind, "size_bytes": e.size_bytes}))
            })
            .collect();
        let text = if entries.is_empty() {
            "(empty)".to_string()
        } else {
            entries
                .iter()
                .map(|e| {
                    let suffix = match e["kind"].as_str() {
                        Some("dir") => "/",
                        Some("symlink") => "@",
                        _ => "",
                    };
                    format!(
                        "{}{suffix}\t{}",
                        e["name"].as_str().unwrap_or_default(),
                        e["size_bytes"]
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
        r.structured_content = Some(json!({
            "path": path,
            "entries": entries,
            "truncated": listing.truncated,
        }));
        Ok(r)
    }
}

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Outcome<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| tool_error("internal", format!("file task failed: {e}")))
}

/// The caller the authentication layer attached to this HTTP request.
fn caller(ctx: &RequestContext<RoleServer>) -> Option<usize> {
    ctx.extensions
        .get::<Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .map(|c| c.0)
}

/// `run_code`'s answer: the result object (as `POST /v1/executions`) as
/// structured content, and a readable summary as text.
fn run_result(v: &Value) -> CallToolResult {
    let mut head = format!("exit_code: {}", v["exit_code"]);
    if let Some(sig) = v["signal"].as_i64() {
        head.push_str(&format!(", signal: {sig}"));
    }
    for flag in [
        "timed_out",
        "oom_killed",
        "output_limit_exceeded",
        "cancelled",
    ] {
        if v[flag].as_bool() == Some(true) {
            head.push_str(&format!(", {flag}"));
        }
    }
    let stream = |name: &str| {
        let text = v[name].as_str().unwrap_or_default();
        let cut = if v[format!("{name}_truncated")].as_bool() == Some(true) {
            " (truncated)"
        } else {
            ""
        };
        format!("--- {name}{cut} ---\n{text}")
    };
    let text = format!("{head}\n{}\n{}", stream("stdout"), stream("stderr"));
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(v.clone());
    r
}

#[tool_router]
impl CorralMcp {
    #[tool(
        description = "Run a program (python, node or bash) in a fresh sandbox whose working directory is this session's workspace: files written with write_file are there, and files the program writes can be read back with read_file. No network. Returns exit_code, stdout, stderr, timed_out and usage."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        finish(self.run_code_inner(args, ctx).await)
    }

    #[tool(
        description = "Write a file into this session's workspace (created or replaced; parent directories are created). Paths are relative; `..`, absolute paths, symbolic links and names starting with .corral are refused; at most 1 MiB per file."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        finish(self.write_file_inner(args, ctx).await)
    }

    #[tool(
        description = "Read a regular file from this session's workspace (at most 1 MiB). Symbolic links are never followed. Non-UTF-8 content comes back base64-encoded."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        finish(self.read_file_inner(args, ctx).await)
    }

    #[tool(
        description = "List a directory of this session's workspace (default: its top): each entry's name, kind (file, dir, symlink, other) and size."
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        finish(self.list_files_inner(args, ctx).await)
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
            stop_signal().await;
            token.cancel();
        });
    }
    let sessions = Arc::new(LocalSessionManager::default());
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
    /// Which tenant opened each session (by `Mcp-Session-Id`).
    owners: Mutex<HashMap<String, usize>>,
}

/// The session header, on requests and on the `initialize` answer.
const SESSION_HEADER: &str = "mcp-session-id";

async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The API's authentication in front of `/mcp`: 401 with the API's error
/// body, or the tenant attached to the request for the handler. A session
/// id opened by another tenant is answered like an unknown one (404), for
/// every method: posting to it, listening on it, deleting it.
async fn authenticate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let st = &gate.state;
    let index = match crate::auth::tenant(st, req.headers()) {
        Ok(t) => st.tenants.iter().position(|x| std::ptr::eq(x, t)),
        Err(e) => return e.into_response(),
    };
    let Some(caller) = index else {
        return ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "tenant not found",
        )
        .into_response();
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
            .copied();
        if owner.is_some_and(|o| o != caller) {
            return (
                axum::http::StatusCode::NOT_FOUND,
                "Not Found: Session not found",
            )
                .into_response();
        }
    }
    req.extensions_mut().insert(Caller(caller));
    let delete = req.method() == axum::http::Method::DELETE;
    let mut resp = next.run(req).await;
    let status = resp.status();
    if delete && status == axum::http::StatusCode::ACCEPTED {
        // The SDK answers a session's DELETE with 202 once the session is
        // closed; the Python SDK expects 200 or 204 and logs a failure
        // otherwise. It is done: say so.
        *resp.status_mut() = axum::http::StatusCode::NO_CONTENT;
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
        let live: std::collections::HashSet<String> = gate
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
        owners.insert(id.to_owned(), caller);
    }
    resp
}

/// `corral mcp`: one MCP session over stdin/stdout until the client closes
/// it. Nothing else is ever written to stdout.
pub async fn serve_stdio(config: Config) -> Result<(), ServerError> {
    let state = Arc::new(AppState::new(config)?);
    let s = &state.config.server;
    let local = TenantState {
        tenant: Tenant {
            name: LOCAL_TENANT.into(),
            token_sha256: String::new(),
            profiles: crate::state::anonymous_profiles(&state.config),
            max_concurrent: s.max_concurrent,
        },
        slots: Arc::new(Semaphore::new(s.max_concurrent as usize)),
    };
    let shared = Arc::new(Shared {
        state: state.clone(),
        local: Some(local),
        live: Mutex::default(),
    });
    let running = CorralMcp::new(shared)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServerError::Io(format!("MCP over stdio: {e}")))?;
    crate::start_warm_helpers(&state.config);
    let ended = tokio::select! {
        r = running.waiting() => r.map(drop).map_err(|e| ServerError::Io(format!("MCP over stdio: {e}"))),
        () = stop_signal() => Ok(()),
    };
    crate::warm::shutdown();
    ended
}

//! One sandboxed MCP server process and the JSON-RPC traffic to it over
//! stdio: corral-minted request ids (clients' ids never reach the server,
//! so two clients' `1`s cannot collide), one `initialize` per process,
//! answers routed only to the request that waits for them, server-to-client
//! requests refused (they cannot be attributed to a client), non-JSON
//! stdout and stderr through the log limiter, every buffer bounded in
//! bytes.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_policy::{AuditEvent, Level, ReasonCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use super::launch::LaunchSpec;
use super::lines::{read_line, Line};
use super::loglimit::{Admit, LogLimiter};
use super::{Audit, ServerMetrics};

/// Bytes queued towards one process's stdin at most: a writer past it
/// waits (backpressure), nothing is dropped.
const STDIN_BUDGET: usize = 32 << 20;

/// stderr lines kept for the last-exit report.
const TAIL_LINES: usize = 20;

/// The protocol revision corral speaks to the servers it supervises.
pub const BACKEND_PROTOCOL: &str = "2025-11-25";

/// How a process ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExitInfo {
    /// Exit status, if it exited.
    pub code: Option<i32>,
    /// Signal, if one killed it.
    pub signal: Option<i32>,
    /// Whether corral asked it to stop (idle, shutdown, session end).
    pub requested: bool,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// How long it ran, ms.
    pub ran_ms: u64,
    /// Its last stderr lines (within the log limit).
    pub stderr_tail: Vec<String>,
}

/// Who a process serves, for logs and audit.
#[derive(Debug, Clone)]
pub struct Owner {
    /// Server name.
    pub server: String,
    /// Tenant (or `*` for a shared process).
    pub tenant: String,
    /// MCP session, for a per-session process.
    pub session: Option<String>,
}

/// The answer to a request.
#[derive(Debug)]
pub struct Answer {
    /// `result`, as the server wrote it.
    pub result: Option<Box<RawValue>>,
    /// `error`, as the server wrote it.
    pub error: Option<Box<RawValue>>,
}

/// Why a request got no answer from the server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The request is larger than the server's message limit.
    #[error("the request is {0} bytes, more than this server's max_message_bytes ({1})")]
    RequestTooLarge(usize, usize),
    /// The answer was larger than the limit (and skipped).
    #[error("the server's answer is {0} bytes, more than its max_message_bytes ({1})")]
    AnswerTooLarge(u64, usize),
    /// No answer in time.
    #[error("the server did not answer within {0} s")]
    Timeout(u64),
    /// The process ended (or is ending).
    #[error("the server's process ended before answering: {0}")]
    Gone(String),
    /// The client cancelled it (the server, told so, answers no more).
    #[error("cancelled by the client")]
    Cancelled,
    /// The process was retired (idle) before the request was sent: the
    /// request may go to a new process.
    #[error("the server's process is stopping")]
    Stopping,
}

enum Reply {
    Answer(Answer),
    TooLarge(u64),
    Cancelled,
}

enum Outgoing {
    Line(Vec<u8>, OwnedSemaphorePermit),
    Close,
}

/// One running process.
pub struct Backend {
    /// Who it serves.
    pub owner: Owner,
    /// The `corral run` process's pid.
    pub pid: u32,
    /// When it started.
    pub started: Instant,
    /// When it started, ms since the epoch.
    pub started_ms: u64,
    /// The server's `initialize` result.
    init: Mutex<Option<Arc<serde_json::Value>>>,
    to_stdin: mpsc::Sender<Outgoing>,
    budget: Arc<Semaphore>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    in_flight: AtomicUsize,
    last_used: Mutex<Instant>,
    stop_requested: AtomicBool,
    /// Its start failed (handshake, tools): corral's stop then ends a
    /// failure, not a requested stop.
    start_failed: AtomicBool,
    /// Stopped for being idle ([`Backend::retire_if_idle`]).
    retired_idle: AtomicBool,
    exit: watch::Receiver<Option<ExitInfo>>,
    max_message: usize,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// Everything a start needs.
pub struct StartContext {
    /// corral's own executable.
    pub exe: PathBuf,
    /// The resolved command.
    pub spec: LaunchSpec,
    /// The sandbox's host name.
    pub hostname: String,
    /// Who it serves.
    pub owner: Owner,
    /// Where `corral run` writes its events (read and audited here).
    pub events_file: PathBuf,
    /// Log limiter settings.
    pub log: corral_policy::LogLimits,
    /// Largest message either way.
    pub max_message: usize,
    /// Seconds to answer `initialize`.
    pub startup_timeout: Duration,
    /// Audit trail.
    pub audit: Audit,
    /// The server's counters.
    pub metrics: Arc<ServerMetrics>,
    /// Its tool filter (picked tools it lacks are reported at start).
    pub tools: corral_policy::ToolFilter,
}

/// The first fields of any JSON-RPC message, parsed once.
#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<Box<RawValue>>,
}

impl Backend {
    /// Starts the process and performs the `initialize` handshake.
    pub async fn start(ctx: StartContext) -> Result<Arc<Backend>, String> {
        let mut cmd = Command::new(&ctx.exe);
        cmd.args(&ctx.spec.run_args)
            .arg("--hostname")
            .arg(&ctx.hostname)
            .arg("--events")
            .arg(&ctx.events_file)
            .arg("--")
            .args(&ctx.spec.command)
            .env_clear()
            .env("CORRAL_PARENT_PID", std::process::id().to_string())
            .envs(ctx.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Ok(path) = std::env::var("PATH") {
            // corral resolves the profile's commands along it.
            cmd.env("PATH", path);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", ctx.exe.display()))?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the process has no pipes".into());
        };
        let (to_stdin, rx) = mpsc::channel(256);
        let (exit_tx, exit) = watch::channel(None);
        let backend = Arc::new(Backend {
            owner: ctx.owner.clone(),
            pid,
            started: Instant::now(),
            started_ms: crate::audit::now_ms(),
            init: Mutex::new(None),
            to_stdin,
            budget: Arc::new(Semaphore::new(STDIN_BUDGET)),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            stop_requested: AtomicBool::new(false),
            start_failed: AtomicBool::new(false),
            retired_idle: AtomicBool::new(false),
            exit,
            max_message: ctx.max_message,
            tail: Arc::default(),
        });
        let limiter = Arc::new(Mutex::new(LogLimiter::new(ctx.log.clone())));
        tokio::spawn(write_stdin(stdin, rx));
        tokio::spawn(read_stdout(
            backend.clone(),
            stdout,
            limiter.clone(),
            ctx.metrics.clone(),
        ));
        let stderr_done = tokio::spawn(read_stderr(
            backend.owner.clone(),
            stderr,
            limiter.clone(),
            backend.tail.clone(),
            ctx.metrics.clone(),
        ));
        tokio::spawn(summaries(
            backend.clone(),
            limiter.clone(),
            ctx.audit.clone(),
        ));
        tokio::spawn(super::events::follow(
            ctx.events_file.clone(),
            backend.exit.clone(),
            ctx.owner.clone(),
            ctx.audit.clone(),
        ));
        tokio::spawn(watch_exit(
            backend.clone(),
            child,
            exit_tx,
            stderr_done,
            limiter,
            ctx.audit.clone(),
        ));
        ctx.audit
            .emit(
                &ctx.owner,
                AuditEvent::new(
                    Level::Info,
                    ReasonCode::McpServerStart,
                    format!("server `{}` started", ctx.owner.server),
                )
                .with("pid", pid),
            )
            .await;
        let ready = match backend.handshake(ctx.startup_timeout).await {
            Ok(()) => backend.check_tools(ctx.startup_timeout, &ctx.tools).await,
            Err(e) => Err(format!("initialize failed: {e}")),
        };
        match ready {
            Ok(missing) => {
                if !missing.is_empty() {
                    ctx.audit
                        .emit(
                            &ctx.owner,
                            AuditEvent::new(
                                Level::Warn,
                                ReasonCode::McpServerStart,
                                format!(
                                    "server `{}` does not offer the picked tools {}: they stay unavailable",
                                    ctx.owner.server,
                                    missing.join(", ")
                                ),
                            )
                            .with("missing_tools", missing),
                        )
                        .await;
                }
                Ok(backend)
            }
            Err(e) => {
                backend.start_failed.store(true, Ordering::Relaxed);
                backend.stop(Duration::from_secs(1)).await;
                let tail: Vec<String> = backend.stderr_tail();
                let hint = if tail.is_empty() {
                    String::new()
                } else {
                    format!("; its last stderr lines: {}", tail.join(" | "))
                };
                Err(format!("{e}{hint}"))
            }
        }
    }

    /// Lists the server's tools once at start-up: a server that names two
    /// tools alike is refused (a call could not say which it means, and a
    /// filter could hide one and not the other); returns the picked tools
    /// it does not offer.
    async fn check_tools(
        &self,
        timeout: Duration,
        filter: &corral_policy::ToolFilter,
    ) -> Result<Vec<String>, String> {
        let offers_tools = self
            .init_result()
            .is_some_and(|i| i.get("capabilities").and_then(|c| c.get("tools")).is_some());
        if !offers_tools {
            return Ok(Vec::new());
        }
        let mut names: Vec<String> = Vec::new();
        let mut cursor: Option<String> = None;
        // A bounded number of pages: a server cannot keep corral listing.
        for _ in 0..16 {
            let params = cursor
                .as_ref()
                .map(|c| serde_json::value::to_raw_value(&serde_json::json!({ "cursor": c })))
                .transpose()
                .map_err(|e| e.to_string())?;
            let answer = self
                .request("tools/list", params.as_deref(), timeout)
                .await
                .map_err(|e| format!("tools/list failed: {e}"))?;
            let Some(result) = answer.result else {
                return Err(format!(
                    "tools/list failed: {}",
                    answer
                        .error
                        .map(|e| e.get().to_string())
                        .unwrap_or_default()
                ));
            };
            let page: serde_json::Value =
                serde_json::from_str(result.get()).map_err(|e| format!("tools/list: {e}"))?;
            for t in page
                .get("tools")
                .and_then(|t| t.as_array())
                .into_iter()
                .flatten()
            {
                let name = t
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("")
                    .to_string();
                if names.contains(&name) {
                    return Err(format!(
                        "the server lists the tool `{name}` twice: a call could not say which it means; corral refuses it"
                    ));
                }
                names.push(name);
            }
            cursor = page
                .get("nextCursor")
                .and_then(|c| c.as_str())
                .map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        Ok(match filter {
            corral_policy::ToolFilter::Pick(picked) => picked
                .iter()
                .filter(|p| !names.contains(p))
                .cloned()
                .collect(),
            _ => Vec::new(),
        })
    }

    async fn handshake(&self, timeout: Duration) -> Result<(), String> {
        let params = serde_json::json!({
            "protocolVersion": BACKEND_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "corral", "version": env!("CARGO_PKG_VERSION")},
        });
        let params = serde_json::value::to_raw_value(&params).map_err(|e| e.to_string())?;
        let answer = self
            .request("initialize", Some(&params), timeout)
            .await
            .map_err(|e| e.to_string())?;
        let result = match (answer.result, answer.error) {
            (Some(r), _) => r,
            (None, Some(e)) => return Err(format!("the server answered {}", e.get())),
            (None, None) => return Err("an empty answer".into()),
        };
        let value: serde_json::Value =
            serde_json::from_str(result.get()).map_err(|e| e.to_string())?;
        if !value.is_object() {
            return Err("the initialize result is not an object".into());
        }
        *lock(&self.init) = Some(Arc::new(value));
        self.notify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec())
            .await;
        Ok(())
    }

    /// The server's `initialize` result.
    pub fn init_result(&self) -> Option<Arc<serde_json::Value>> {
        lock(&self.init).clone()
    }

    /// Sends a request and waits for its answer.
    pub async fn request(
        &self,
        method: &str,
        params: Option<&RawValue>,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        self.request_as(self.reserve_id(), method, params, timeout)
            .await
    }

    /// A fresh corral id for [`Backend::request_as`], known before the
    /// request is sent (for cancellation bookkeeping).
    pub fn reserve_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// [`Backend::request`] with the id `id` from [`Backend::reserve_id`].
    pub async fn request_as(
        &self,
        id: u64,
        method: &str,
        params: Option<&RawValue>,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let method = serde_json::to_string(method).unwrap_or_else(|_| "\"\"".into());
        let mut line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method}"#).into_bytes();
        if let Some(p) = params {
            line.extend_from_slice(b",\"params\":");
            line.extend_from_slice(p.get().as_bytes());
        }
        line.push(b'}');
        if line.len() > self.max_message {
            return Err(CallError::RequestTooLarge(line.len(), self.max_message));
        }
        let Some(_busy) = InFlight::enter(self) else {
            return Err(if self.retired_idle.load(Ordering::Relaxed) {
                CallError::Stopping
            } else {
                CallError::Gone("it is stopping".into())
            });
        };
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        // Forgotten however this ends, also when the caller goes away
        // (a client that disconnects or cancels: the server may never
        // answer).
        let _pending = Pending(self, id);
        if self.exit.borrow().is_some() {
            return Err(CallError::Gone("it has exited".into()));
        }
        if !self.send(line).await {
            return Err(CallError::Gone("its stdin is closed".into()));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Reply::Answer(a))) => Ok(a),
            Ok(Ok(Reply::TooLarge(n))) => Err(CallError::AnswerTooLarge(n, self.max_message)),
            Ok(Ok(Reply::Cancelled)) => Err(CallError::Cancelled),
            Ok(Err(_)) => Err(CallError::Gone(self.exit_reason())),
            Err(_) => {
                // The server may stop working on it (MCP cancellation);
                // this one, not the guard's.
                lock(&self.pending).remove(&id);
                self.notify(
                    format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"timeout"}}}}"#
                    )
                    .into_bytes(),
                )
                .await;
                Err(CallError::Timeout(timeout.as_secs()))
            }
        }
    }

    /// Sends a notification (best effort: a closed stdin drops it).
    pub async fn notify(&self, line: Vec<u8>) {
        let _ = self.send(line).await;
    }

    /// The corral id a client's cancellation refers to is the caller's
    /// business; this forwards `notifications/cancelled` for `id` and ends
    /// its wait at once (a server answers no cancelled request: the wait
    /// would last the request timeout).
    pub async fn cancel(&self, id: u64) {
        self.deliver(id, Reply::Cancelled);
        self.notify(
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
            )
            .into_bytes(),
        )
        .await;
    }

    /// Queues a notification if there is room now (never waits).
    fn try_notify(&self, mut line: Vec<u8>) {
        line.push(b'\n');
        let want = u32::try_from(line.len()).unwrap_or(u32::MAX);
        if let Ok(permit) = self.budget.clone().try_acquire_many_owned(want) {
            let _ = self.to_stdin.try_send(Outgoing::Line(line, permit));
        }
    }

    async fn send(&self, mut line: Vec<u8>) -> bool {
        line.push(b'\n');
        let want = u32::try_from(line.len().min(STDIN_BUDGET)).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().acquire_many_owned(want).await else {
            return false;
        };
        self.to_stdin
            .send(Outgoing::Line(line, permit))
            .await
            .is_ok()
    }

    /// Whether the process still runs and was not asked to stop.
    pub fn alive(&self) -> bool {
        self.exit.borrow().is_none() && !self.stop_requested.load(Ordering::Relaxed)
    }

    /// Marks the process as stopping if no request is in flight and none
    /// came for `idle`; true if it did (then [`Backend::stop`] it). Atomic
    /// with a request's start ([`InFlight::enter`]): a request either
    /// counts as in flight first, or finds the process retired and is not
    /// sent to it.
    pub fn retire_if_idle(&self, idle: Duration) -> bool {
        let last = lock(&self.last_used);
        if self.in_flight.load(Ordering::Relaxed) == 0
            && last.elapsed() >= idle
            && !self.stop_requested.load(Ordering::Relaxed)
        {
            self.retired_idle.store(true, Ordering::Relaxed);
            self.stop_requested.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Waits until the process has exited; returns how.
    pub async fn exited(&self) -> ExitInfo {
        let mut rx = self.exit.clone();
        loop {
            if let Some(info) = rx.borrow_and_update().clone() {
                return info;
            }
            if rx.changed().await.is_err() {
                return ExitInfo {
                    code: None,
                    signal: None,
                    requested: self.stop_requested.load(Ordering::Relaxed),
                    at_ms: crate::audit::now_ms(),
                    ran_ms: 0,
                    stderr_tail: Vec::new(),
                };
            }
        }
    }

    /// Stops the process the way the MCP spec asks: close its stdin, wait,
    /// SIGTERM, wait, SIGKILL (which takes the whole sandbox: `corral run`
    /// dies, its helper gets PDEATHSIG, the pid namespace ends).
    pub async fn stop(&self, grace: Duration) {
        self.stop_requested.store(true, Ordering::Relaxed);
        let _ = self.to_stdin.try_send(Outgoing::Close);
        if self.wait_exit(grace).await {
            return;
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = corral_sys::process::kill(pid, libc::SIGTERM);
        }
        if self.wait_exit(grace).await {
            return;
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = corral_sys::process::kill(pid, libc::SIGKILL);
        }
        self.wait_exit(Duration::from_secs(5)).await;
    }

    async fn wait_exit(&self, d: Duration) -> bool {
        tokio::time::timeout(d, self.exited()).await.is_ok()
    }

    /// Its last stderr lines.
    pub fn stderr_tail(&self) -> Vec<String> {
        lock(&self.tail).iter().cloned().collect()
    }

    fn exit_reason(&self) -> String {
        match &*self.exit.borrow() {
            Some(e) => describe_exit(e),
            None => "it is stopping".into(),
        }
    }

    fn deliver(&self, id: u64, reply: Reply) {
        if let Some(tx) = lock(&self.pending).remove(&id) {
            let _ = tx.send(reply);
        }
    }
}

/// `exit status 3`, `killed by signal 9`.
pub fn describe_exit(e: &ExitInfo) -> String {
    match (e.code, e.signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// Removes a request's entry from `pending` when its waiter ends.
struct Pending<'a>(&'a Backend, u64);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        // Still waiting when dropped: its client went away (a closed
        // connection drops the request's future). The server may stop
        // working on it, as for an explicit cancellation; best effort,
        // without waiting (a Drop cannot).
        if lock(&self.0.pending).remove(&self.1).is_some() {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"the client went away"}}}}"#,
                self.1
            )
            .into_bytes();
            self.0.try_notify(line);
        }
    }
}

/// Counts a request as in flight for its lifetime.
struct InFlight<'a>(&'a Backend);

impl<'a> InFlight<'a> {
    /// Counts a request in, unless the process was retired (see
    /// [`Backend::retire_if_idle`]; both hold `last_used`'s lock).
    fn enter(b: &'a Backend) -> Option<InFlight<'a>> {
        let mut last = lock(&b.last_used);
        if b.stop_requested.load(Ordering::Relaxed) {
            return None;
        }
        b.in_flight.fetch_add(1, Ordering::Relaxed);
        *last = Instant::now();
        Some(InFlight(b))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        *lock(&self.0.last_used) = Instant::now();
    }
}

/// A lock that a panic elsewhere does not poison for good.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn write_stdin(mut stdin: ChildStdin, mut rx: mpsc::Receiver<Outgoing>) {
    while let Some(msg) = rx.recv().await {
        match msg {
            Outgoing::Line(bytes, _permit) => {
                if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
            }
            Outgoing::Close => return,
        }
    }
}

async fn read_stdout(
    backend: Arc<Backend>,
    stdout: tokio::process::ChildStdout,
    limiter: Arc<Mutex<LogLimiter>>,
    metrics: Arc<ServerMetrics>,
) {
    let mut reader = BufReader::with_capacity(64 << 10, stdout);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut reader, &mut buf, backend.max_message).await {
            Ok(Line::Complete) => on_message(&backend, &buf, &limiter, &metrics).await,
            Ok(Line::TooLong { len, id, .. }) => {
                metrics.oversized.fetch_add(1, Ordering::Relaxed);
                match id {
                    Some(id) => backend.deliver(id, Reply::TooLarge(len)),
                    None => tracing::warn!(
                        server = %backend.owner.server,
                        tenant = %backend.owner.tenant,
                        bytes = len,
                        "skipped an oversized stdout message that answers no request"
                    ),
                }
            }
            Ok(Line::Eof) | Err(_) => return,
        }
    }
}

async fn on_message(
    backend: &Backend,
    line: &[u8],
    limiter: &Mutex<LogLimiter>,
    metrics: &ServerMetrics,
) {
    let parsed: Option<Incoming> = serde_json::from_slice(line).ok();
    let Some(msg) = parsed else {
        // Banners and prints on stdout: never to a client, logged within
        // the limit.
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        log_line(
            &backend.owner,
            "stdout",
            line,
            limiter,
            &backend.tail,
            metrics,
        );
        return;
    };
    match (msg.id, msg.method) {
        (Some(id), None) => {
            if let Some(id) = id.as_u64() {
                backend.deliver(
                    id,
                    Reply::Answer(Answer {
                        result: msg.result,
                        error: msg.error,
                    }),
                );
            }
        }
        (Some(id), Some(method)) => {
            // A request from the server (sampling, elicitation, roots):
            // corral cannot tell which client it is for, so it answers.
            let id = serde_json::to_string(&id).unwrap_or_else(|_| "null".into());
            let reply = if method == "ping" {
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
            } else {
                metrics
                    .refused_server_requests
                    .fetch_add(1, Ordering::Relaxed);
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"corral does not forward server-to-client requests"}}}}"#
                )
            };
            backend.notify(reply.into_bytes()).await;
        }
        (None, Some(_)) => {
            // Notifications (progress, log messages, list changes) cannot
            // be attributed to one client's stream: dropped, counted.
            metrics
                .dropped_notifications
                .fetch_add(1, Ordering::Relaxed);
        }
        (None, None) => {}
    }
}

async fn read_stderr(
    owner: Owner,
    stderr: tokio::process::ChildStderr,
    limiter: Arc<Mutex<LogLimiter>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    metrics: Arc<ServerMetrics>,
) {
    let max = usize::try_from(lock(&limiter).line_max()).unwrap_or(1024);
    let mut reader = BufReader::with_capacity(64 << 10, stderr);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut reader, &mut buf, max).await {
            Ok(Line::Complete) => log_line(&owner, "stderr", &buf, &limiter, &tail, &metrics),
            Ok(Line::TooLong { prefix, .. }) => {
                log_line(&owner, "stderr", &prefix, &limiter, &tail, &metrics)
            }
            Ok(Line::Eof) | Err(_) => return,
        }
    }
}

fn log_line(
    owner: &Owner,
    stream: &'static str,
    line: &[u8],
    limiter: &Mutex<LogLimiter>,
    tail: &Mutex<VecDeque<String>>,
    metrics: &ServerMetrics,
) {
    let mut l = lock(limiter);
    if l.offer(Instant::now()) == Admit::Drop {
        metrics.log_dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    metrics.log_passed.fetch_add(1, Ordering::Relaxed);
    let (text, cut) = l.cut(line);
    drop(l);
    tracing::info!(
        target: "corral::mcp_server",
        server = %owner.server,
        tenant = %owner.tenant,
        stream,
        cut,
        line = %text,
        "server output"
    );
    let mut t = lock(tail);
    if t.len() == TAIL_LINES {
        t.pop_front();
    }
    t.push_back(text);
}

/// One `mcp.log_rate_limit_exceeded` per interval while lines are
/// dropped, and the last count when the process ends.
async fn summaries(backend: Arc<Backend>, limiter: Arc<Mutex<LogLimiter>>, audit: Audit) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let due = lock(&limiter).summary_due(Instant::now());
        if let Some(n) = due {
            audit.emit(&backend.owner, rate_event(n)).await;
        }
        if backend.exit.borrow().is_some() {
            return;
        }
    }
}

fn rate_event(dropped: u64) -> AuditEvent {
    AuditEvent::new(
        Level::Warn,
        ReasonCode::McpLogRateLimited,
        format!("dropped {dropped} output lines over the server's log rate limit"),
    )
    .with("dropped", dropped)
}

async fn watch_exit(
    backend: Arc<Backend>,
    mut child: Child,
    exit_tx: watch::Sender<Option<ExitInfo>>,
    stderr_done: tokio::task::JoinHandle<()>,
    limiter: Arc<Mutex<LogLimiter>>,
    audit: Audit,
) {
    use std::os::unix::process::ExitStatusExt;
    let status = child.wait().await;
    // The last lines the process wrote, before its exit is reported.
    let _ = tokio::time::timeout(Duration::from_secs(2), stderr_done).await;
    let (code, signal) = match status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    let info = ExitInfo {
        code,
        signal,
        requested: backend.stop_requested.load(Ordering::Relaxed)
            && !backend.start_failed.load(Ordering::Relaxed),
        at_ms: crate::audit::now_ms(),
        ran_ms: u64::try_from(backend.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        stderr_tail: backend.stderr_tail(),
    };
    let dropped = lock(&limiter).flush();
    if let Some(n) = dropped {
        audit.emit(&backend.owner, rate_event(n)).await;
    }
    let level = if info.requested {
        Level::Info
    } else {
        Level::Warn
    };
    let what = if info.requested { "stopped" } else { "failed" };
    audit
        .emit(
            &backend.owner,
            AuditEvent::new(
                level,
                ReasonCode::McpServerExit,
                format!(
                    "server `{}` {what} ({})",
                    backend.owner.server,
                    describe_exit(&info)
                ),
            )
            .with("requested", info.requested)
            .with("exit_code", info.code)
            .with("signal", info.signal)
            .with("ran_ms", info.ran_ms),
        )
        .await;
    let _ = exit_tx.send(Some(info));
    // Whoever still waits learns the process is gone.
    lock(&backend.pending).clear();
}

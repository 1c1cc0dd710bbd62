//! The supervisor: long-running MCP servers from `[[server.mcp_server]]`,
//! each process in its own sandbox (`corral run` of the server's profile,
//! dying with corral), started on demand or at boot with one start at a
//! time per instance, stopped when idle, restarted with exponential
//! back-off after exits corral did not ask for (status 0 included) until a
//! crash-loop limit, and bridged to clients at `/mcp/servers/{name}`
//! ([`bridge`]).
//!
//! An *instance* is what one process serves: every tenant (`shared`), one
//! tenant (`per-tenant`, the default) or one MCP session (`per-session`).
//! Its [`Slot`] holds its state (stopped, starting, ready, backing off,
//! failed), failures and last exit.

mod backend;
pub mod bridge;
mod events;
mod launch;
mod lines;
mod loglimit;
mod status;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_policy::{AuditEvent, Config, Level, McpServer, ProcessMode, ReasonCode, StartPolicy};
use tokio::sync::mpsc;

pub use backend::{lock, Backend, ExitInfo, Owner};
pub use status::{list as list_status, metrics_text, ServerStatus};

use crate::audit::{now_ms, AuditStore, EventRecord};
use backend::{describe_exit, StartContext};
use launch::{LaunchRefused, LaunchSpec};

/// Sessions unused this long are forgotten (clients rarely DELETE them).
const SESSION_IDLE: Duration = Duration::from_secs(1800);

/// Grace before each escalation of a stop (stdin closed, SIGTERM,
/// SIGKILL).
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The audit trail's writer: events go through a bounded queue to one
/// thread that stores them (a full queue makes the emitter wait: nothing
/// is dropped).
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<EventRecord>,
}

impl Audit {
    /// Starts the writer thread over `store`.
    pub fn start(store: Arc<AuditStore>) -> Audit {
        let (tx, mut rx) = mpsc::channel::<EventRecord>(4096);
        let spawned = std::thread::Builder::new()
            .name("corral-audit".into())
            .spawn(move || {
                while let Some(ev) = rx.blocking_recv() {
                    if let Err(e) = store.record_event(&ev) {
                        tracing::error!(error = %e, code = %ev.code, "audit event not stored");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the audit writer");
        }
        Audit { tx }
    }

    /// Records an event of the service itself (no server).
    pub async fn emit_service(&self, tenant: &str, event: AuditEvent) {
        let owner = Owner {
            server: String::new(),
            tenant: tenant.to_string(),
            session: None,
        };
        self.emit(&owner, event).await;
    }

    /// Records `event` for `owner`.
    pub async fn emit(&self, owner: &Owner, event: AuditEvent) {
        let code = event.code.as_str().to_string();
        let value = serde_json::to_value(&event).unwrap_or_default();
        self.emit_value(owner, code, value).await;
    }

    /// Records an event that arrived as JSON (from a sandbox's events).
    pub async fn emit_value(&self, owner: &Owner, code: String, event: serde_json::Value) {
        if matches!(
            event.get("level").and_then(|l| l.as_str()),
            Some("warn" | "error")
        ) {
            let message = event.get("message").and_then(|m| m.as_str()).unwrap_or("");
            // The service's own events (refusals of the API) are the API's,
            // for an operator's filter; a supervised server's name its server.
            if owner.server.is_empty() {
                tracing::warn!(target: "corral_server::api", tenant = %owner.tenant, code = %code, "{message}");
            } else {
                tracing::warn!(server = %owner.server, tenant = %owner.tenant, code = %code, "{message}");
            }
        }
        let rec = EventRecord {
            kind: "event",
            ts_ms: now_ms(),
            tenant: owner.tenant.clone(),
            server: owner.server.clone(),
            session: owner.session.clone(),
            code,
            event,
        };
        let _ = self.tx.send(rec).await;
    }
}

/// Counters of one server, for `/metrics` and `GET /v1/mcp-servers`.
#[derive(Default)]
pub struct ServerMetrics {
    /// Requests forwarded (tool calls and others).
    pub calls: AtomicU64,
    /// Requests that ended in an error (JSON-RPC error, tool error,
    /// timeout, process gone).
    pub errors: AtomicU64,
    /// Restarts after failures.
    pub restarts: AtomicU64,
    /// Output lines logged within the limit.
    pub log_passed: AtomicU64,
    /// Output lines dropped by the limit.
    pub log_dropped: AtomicU64,
    /// Messages over the size limit.
    pub oversized: AtomicU64,
    /// Server notifications dropped (unattributable).
    pub dropped_notifications: AtomicU64,
    /// Server-to-client requests answered with an error.
    pub refused_server_requests: AtomicU64,
    /// Tool-call latency histogram: counts per bucket of
    /// [`LATENCY_BUCKETS_MS`], then +Inf.
    pub latency: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
    /// Sum of tool-call latencies, microseconds.
    pub latency_sum_us: AtomicU64,
}

/// Upper bounds (ms) of the call latency histogram's buckets.
pub const LATENCY_BUCKETS_MS: [f64; 10] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 5000.0,
];

impl ServerMetrics {
    /// Counts one call of `d`.
    pub fn observe(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        let i = LATENCY_BUCKETS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(LATENCY_BUCKETS_MS.len());
        self.latency[i].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Which clients one process serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InstanceKey {
    /// All of them.
    Shared,
    /// One tenant's.
    Tenant(String),
    /// One MCP session's.
    Session(String),
}

/// The lifecycle state of an instance.
#[derive(Clone)]
pub enum SlotState {
    /// No process (never started, idle-stopped, or its session ended).
    Stopped,
    /// A start is under way.
    Starting,
    /// Running and initialised.
    Ready(Arc<Backend>),
    /// Failed; the next start waits until then.
    BackingOff(Instant),
    /// Failed too often; refused until the window has passed.
    Failed(Instant, String),
}

impl SlotState {
    /// The name `GET /v1/mcp-servers` shows.
    pub fn name(&self) -> &'static str {
        match self {
            SlotState::Stopped => "stopped",
            SlotState::Starting => "starting",
            SlotState::Ready(_) => "ready",
            SlotState::BackingOff(_) => "backing-off",
            SlotState::Failed(..) => "failed",
        }
    }
}

/// One instance's lifecycle.
pub struct Slot {
    /// Whom it serves.
    pub key: InstanceKey,
    /// Who it is, for logs and audit.
    pub owner: Owner,
    /// Its state.
    pub state: Mutex<SlotState>,
    /// One start at a time (single flight).
    start: tokio::sync::Mutex<()>,
    /// Recent failures, within the crash-loop window.
    failures: Mutex<VecDeque<Instant>>,
    /// Restarts after failures.
    pub restarts: AtomicU64,
    /// How its last process ended.
    pub last_exit: Mutex<Option<ExitInfo>>,
    /// Why its last start failed.
    pub last_error: Mutex<Option<String>>,
}

/// One configured server.
pub struct ServerEntry {
    /// Its configuration.
    pub spec: McpServer,
    /// Its command, resolved at start-up, or why it cannot start.
    pub launch: Result<LaunchSpec, LaunchRefused>,
    /// Instances by key.
    pub slots: Mutex<HashMap<InstanceKey, Arc<Slot>>>,
    /// Counters.
    pub metrics: Arc<ServerMetrics>,
}

impl ServerEntry {
    /// Whether `tenant` may reach it (a server without tenants is the
    /// anonymous caller's).
    pub fn allows(&self, tenant: &str, anonymous: bool) -> bool {
        if self.spec.tenants.is_empty() {
            anonymous
        } else {
            self.spec.tenants.iter().any(|t| t == tenant)
        }
    }

    /// The instance key of a request.
    pub fn key_for(&self, tenant: &str, session: Option<&str>) -> InstanceKey {
        match (self.spec.mode, session) {
            (ProcessMode::Shared, _) => InstanceKey::Shared,
            (ProcessMode::PerSession, Some(s)) => InstanceKey::Session(s.to_string()),
            _ => InstanceKey::Tenant(tenant.to_string()),
        }
    }

    fn slot(&self, key: &InstanceKey, tenant: &str) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        slots
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    key: key.clone(),
                    owner: Owner {
                        server: self.spec.name.clone(),
                        tenant: match key {
                            InstanceKey::Shared => "*".into(),
                            _ => tenant.to_string(),
                        },
                        session: match key {
                            InstanceKey::Session(s) => Some(s.clone()),
                            _ => None,
                        },
                    },
                    state: Mutex::new(SlotState::Stopped),
                    start: tokio::sync::Mutex::new(()),
                    failures: Mutex::default(),
                    restarts: AtomicU64::new(0),
                    last_exit: Mutex::new(None),
                    last_error: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Processes running or starting, in all and of `tenant`.
    fn running(&self, tenant: &str) -> (usize, usize) {
        let slots = lock(&self.slots);
        let live = slots
            .values()
            .filter(|s| matches!(*lock(&s.state), SlotState::Ready(_) | SlotState::Starting));
        let mut all = 0;
        let mut mine = 0;
        for s in live {
            all += 1;
            if s.owner.tenant == tenant {
                mine += 1;
            }
        }
        (all, mine)
    }
}

/// Why a request finds no process to serve it.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// The server cannot start at all (resolved at start-up).
    #[error("{0}")]
    Refused(String),
    /// It failed and waits before the next start.
    #[error("the server failed and restarts in {0} ms; try again then")]
    BackingOff(u64),
    /// It failed too often.
    #[error("the server is stopped after failing too often: {0}")]
    Failed(String),
    /// Too many processes.
    #[error("{0}")]
    Cap(String),
    /// The start failed.
    #[error("the server could not start: {0}")]
    StartFailed(String),
    /// corral is shutting down.
    #[error("corral is shutting down")]
    ShuttingDown,
}

/// One MCP session of the bridge.
pub struct Session {
    /// Its id (random, 128 bits, hex).
    pub id: String,
    /// The tenant that opened it.
    pub tenant: String,
    /// The server it belongs to.
    pub server: String,
    /// The protocol revision agreed.
    pub protocol: String,
    /// Last request.
    pub last_seen: Mutex<Instant>,
    /// Client request ids in flight → corral's ids at the process
    /// (for cancellation).
    pub in_flight: Mutex<HashMap<String, u64>>,
}

/// All supervised servers.
pub struct Supervisor {
    /// Servers by name.
    pub servers: HashMap<String, Arc<ServerEntry>>,
    /// Bridge sessions by id.
    pub sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Audit trail.
    pub audit: Audit,
    exe: PathBuf,
    dir: PathBuf,
    shutting_down: std::sync::atomic::AtomicBool,
    tenants: Vec<String>,
    anonymous: bool,
}

impl Supervisor {
    /// Resolves every server once (a server that cannot start is kept,
    /// refused, with an `mcp.server_refused` event at [`boot`]).
    ///
    /// [`boot`]: Supervisor::boot
    pub fn new(
        config: &Config,
        config_file: Option<&std::path::Path>,
        audit: Audit,
        work_dir: &std::path::Path,
        tenants: Vec<String>,
        anonymous: bool,
    ) -> Supervisor {
        // Each on a thread of its own, for at most START_WAIT together: a
        // server whose directory, runtime or binds sit on a filesystem
        // that does not answer is refused rather than holding the start.
        let jobs = config.server.mcp_servers.iter().map(|spec| {
            let (spec, config) = (spec.clone(), config.clone());
            let config_file = config_file.map(std::path::Path::to_path_buf);
            move || {
                let lookup = |k: &str| std::env::var(k).ok();
                launch::resolve(&spec, &config, config_file.as_deref(), &lookup)
            }
        });
        let resolved = corral_launcher::all_within(
            crate::host::START_WAIT,
            "corral-mcp-resolve",
            jobs.collect(),
        );
        let servers = config
            .server
            .mcp_servers
            .iter()
            .zip(resolved)
            .map(|(spec, launch)| {
                let entry = ServerEntry {
                    launch: launch.unwrap_or_else(|| Err(launch::unanswered(spec))),
                    spec: spec.clone(),
                    slots: Mutex::default(),
                    metrics: Arc::default(),
                };
                (spec.name.clone(), Arc::new(entry))
            })
            .collect();
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        Supervisor {
            servers,
            sessions: Mutex::default(),
            audit,
            exe,
            dir: work_dir.join("mcp"),
            shutting_down: Default::default(),
            tenants,
            anonymous,
        }
    }

    /// Whether the server runs without tenants.
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }

    /// Reports refused servers, starts the `start = "boot"` ones and the
    /// idle reaper. Needs the async runtime.
    pub fn boot(self: &Arc<Self>) {
        if !self.servers.is_empty() {
            let _ = std::fs::create_dir_all(&self.dir);
        }
        for entry in self.servers.values() {
            if let Err(r) = &entry.launch {
                let owner = Owner {
                    server: entry.spec.name.clone(),
                    tenant: "*".into(),
                    session: None,
                };
                let audit = self.audit.clone();
                let event = AuditEvent::new(
                    Level::Error,
                    ReasonCode::McpServerRefused,
                    r.message.clone(),
                )
                .with("reason", r.code);
                tokio::spawn(async move { audit.emit(&owner, event).await });
                continue;
            }
            if entry.spec.start != StartPolicy::Boot {
                continue;
            }
            let keys: Vec<(InstanceKey, String)> = match entry.spec.mode {
                ProcessMode::Shared => vec![(InstanceKey::Shared, "*".into())],
                ProcessMode::PerTenant => self
                    .tenants
                    .iter()
                    .filter(|t| entry.allows(t, self.anonymous))
                    .map(|t| (InstanceKey::Tenant(t.clone()), t.clone()))
                    .collect(),
                ProcessMode::PerSession => vec![],
            };
            for (key, tenant) in keys {
                let (sup, entry) = (self.clone(), entry.clone());
                tokio::spawn(async move {
                    if let Err(e) = sup.backend(&entry, &key, &tenant).await {
                        tracing::warn!(server = %entry.spec.name, tenant, error = %e, "boot start failed");
                    }
                });
            }
        }
        let sup = self.clone();
        tokio::spawn(async move { sup.reap().await });
    }

    /// The process serving `key`, started if needed (one start at a time;
    /// concurrent callers wait for the same start). Boxed: a failed start
    /// schedules a restart that comes back here.
    pub fn backend<'a>(
        self: &'a Arc<Self>,
        entry: &'a Arc<ServerEntry>,
        key: &'a InstanceKey,
        tenant: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<Arc<Backend>, Unavailable>> {
        Box::pin(self.start_or_get(entry, key, tenant))
    }

    async fn start_or_get(
        self: &Arc<Self>,
        entry: &Arc<ServerEntry>,
        key: &InstanceKey,
        tenant: &str,
    ) -> Result<Arc<Backend>, Unavailable> {
        let spec = match &entry.launch {
            Ok(s) => s.clone(),
            Err(r) => return Err(Unavailable::Refused(r.message.clone())),
        };
        let slot = entry.slot(key, tenant);
        let _one = slot.start.lock().await;
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(Unavailable::ShuttingDown);
        }
        let now = Instant::now();
        let current = lock(&slot.state).clone();
        match current {
            SlotState::Ready(b) if b.alive() => return Ok(b),
            SlotState::BackingOff(until) if until > now => {
                return Err(Unavailable::BackingOff(
                    u64::try_from((until - now).as_millis()).unwrap_or(u64::MAX),
                ))
            }
            SlotState::Failed(since, why) => {
                let window = Duration::from_secs(entry.spec.restart.window_secs);
                if now.duration_since(since) < window {
                    return Err(Unavailable::Failed(why));
                }
                lock(&slot.failures).clear();
            }
            _ => {}
        }
        let (all, mine) = entry.running(&slot.owner.tenant);
        if all >= entry.spec.max_processes as usize {
            return Err(Unavailable::Cap(format!(
                "server `{}` already runs {all} processes (max_processes); try again when one ends",
                entry.spec.name
            )));
        }
        if matches!(key, InstanceKey::Session(_))
            && mine >= entry.spec.max_processes_per_tenant as usize
        {
            return Err(Unavailable::Cap(format!(
                "server `{}` already runs {mine} processes for this tenant (max_processes_per_tenant); end a session first",
                entry.spec.name
            )));
        }
        *lock(&slot.state) = SlotState::Starting;
        let hostname = hostname_for(&slot.owner);
        let ctx = StartContext {
            exe: self.exe.clone(),
            spec,
            hostname,
            owner: slot.owner.clone(),
            events_file: self.events_file(&slot.owner),
            log: entry.spec.log.clone(),
            max_message: usize::try_from(entry.spec.max_message_bytes.bytes())
                .unwrap_or(usize::MAX),
            startup_timeout: Duration::from_secs(entry.spec.startup_timeout_secs),
            audit: self.audit.clone(),
            metrics: entry.metrics.clone(),
            tools: entry.spec.tools.clone(),
        };
        match Backend::start(ctx).await {
            Ok(b) => {
                *lock(&slot.state) = SlotState::Ready(b.clone());
                *lock(&slot.last_error) = None;
                let (sup, entry, slot2, b2) =
                    (self.clone(), entry.clone(), slot.clone(), b.clone());
                tokio::spawn(async move { sup.monitor(entry, slot2, b2).await });
                Ok(b)
            }
            Err(e) => {
                *lock(&slot.last_error) = Some(e.clone());
                self.failed(entry, &slot, Duration::ZERO, &e).await;
                Err(Unavailable::StartFailed(e))
            }
        }
    }

    fn events_file(&self, owner: &Owner) -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{}-{n}.events.jsonl", owner.server))
    }

    /// Waits for a process to end and applies the restart policy.
    async fn monitor(self: Arc<Self>, entry: Arc<ServerEntry>, slot: Arc<Slot>, b: Arc<Backend>) {
        let info = b.exited().await;
        *lock(&slot.last_exit) = Some(info.clone());
        let ours = matches!(&*lock(&slot.state), SlotState::Ready(x) if Arc::ptr_eq(x, &b));
        if !ours {
            return;
        }
        if info.requested || self.shutting_down.load(Ordering::Relaxed) {
            *lock(&slot.state) = SlotState::Stopped;
            return;
        }
        let why = format!("it exited on its own ({})", describe_exit(&info));
        self.failed(&entry, &slot, Duration::from_millis(info.ran_ms), &why)
            .await;
    }

    /// Counts a failure of `slot` (a process that ran `ran` before
    /// failing) and backs off, or stops it at the crash-loop limit.
    async fn failed(
        self: &Arc<Self>,
        entry: &Arc<ServerEntry>,
        slot: &Arc<Slot>,
        ran: Duration,
        why: &str,
    ) {
        let policy = &entry.spec.restart;
        let now = Instant::now();
        let count = {
            let mut f = lock(&slot.failures);
            if ran >= Duration::from_secs(policy.stable_after_secs) {
                // It ran long enough: a new series.
                f.clear();
            }
            let window = Duration::from_secs(policy.window_secs);
            while f.front().is_some_and(|t| now.duration_since(*t) > window) {
                f.pop_front();
            }
            f.push_back(now);
            f.len()
        };
        if count > policy.max_restarts as usize {
            let reason = format!(
                "{why}; {count} failures within {} s (max_restarts {})",
                policy.window_secs, policy.max_restarts
            );
            *lock(&slot.state) = SlotState::Failed(now, reason.clone());
            self.audit
                .emit(
                    &slot.owner,
                    AuditEvent::new(
                        Level::Error,
                        ReasonCode::McpCrashLoop,
                        format!("server `{}` stopped: {reason}", entry.spec.name),
                    )
                    .with("failures", count),
                )
                .await;
            return;
        }
        let shift = u32::try_from(count.saturating_sub(1))
            .unwrap_or(u32::MAX)
            .min(20);
        let delay = policy
            .backoff_initial_ms
            .saturating_mul(1u64 << shift)
            .min(policy.backoff_max_ms);
        let until = now + Duration::from_millis(delay);
        *lock(&slot.state) = SlotState::BackingOff(until);
        let (sup, entry, slot) = (self.clone(), entry.clone(), slot.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            if !matches!(*lock(&slot.state), SlotState::BackingOff(u) if u == until) {
                return;
            }
            slot.restarts.fetch_add(1, Ordering::Relaxed);
            entry.metrics.restarts.fetch_add(1, Ordering::Relaxed);
            let tenant = slot.owner.tenant.clone();
            if let Err(e) = sup.backend(&entry, &slot.key, &tenant).await {
                tracing::warn!(server = %entry.spec.name, tenant, error = %e, "restart failed");
            }
        });
    }

    /// Stops idle processes and forgets idle sessions, once a second.
    async fn reap(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if self.shutting_down.load(Ordering::Relaxed) {
                return;
            }
            let stale: Vec<Arc<Session>> = {
                let mut sessions = lock(&self.sessions);
                let gone: Vec<String> = sessions
                    .iter()
                    .filter(|(_, s)| lock(&s.last_seen).elapsed() > SESSION_IDLE)
                    .map(|(k, _)| k.clone())
                    .collect();
                gone.iter().filter_map(|k| sessions.remove(k)).collect()
            };
            for s in stale {
                self.session_ended(&s).await;
            }
            for entry in self.servers.values() {
                let Some(idle) = entry.spec.idle_stop_secs.map(Duration::from_secs) else {
                    continue;
                };
                let slots: Vec<Arc<Slot>> = lock(&entry.slots).values().cloned().collect();
                for slot in slots {
                    let b = match &*lock(&slot.state) {
                        // Retired at once: a request that comes now goes
                        // to a new process instead of this stopping one.
                        SlotState::Ready(b) if b.retire_if_idle(idle) => b.clone(),
                        _ => continue,
                    };
                    tracing::info!(server = %entry.spec.name, tenant = %slot.owner.tenant, "stopping an idle process");
                    tokio::spawn(async move { b.stop(STOP_GRACE).await });
                }
            }
        }
    }

    /// A session ended (DELETE, idle): a per-session process stops.
    pub async fn session_ended(&self, s: &Session) {
        let Some(entry) = self.servers.get(&s.server) else {
            return;
        };
        let key = InstanceKey::Session(s.id.clone());
        let slot = lock(&entry.slots).remove(&key);
        if let Some(slot) = slot {
            let b = match &*lock(&slot.state) {
                SlotState::Ready(b) => Some(b.clone()),
                _ => None,
            };
            *lock(&slot.state) = SlotState::Stopped;
            if let Some(b) = b {
                b.stop(STOP_GRACE).await;
            }
        }
    }

    /// Stops every process (at shutdown), all at once.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let mut stops = Vec::new();
        for entry in self.servers.values() {
            for slot in lock(&entry.slots).values() {
                if let SlotState::Ready(b) = &*lock(&slot.state) {
                    let b = b.clone();
                    stops.push(tokio::spawn(async move { b.stop(STOP_GRACE).await }));
                }
            }
        }
        for s in stops {
            let _ = s.await;
        }
    }
}

/// `mcp-{tenant}` (shared: `mcp-{server}`), cut to a valid host name.
fn hostname_for(owner: &Owner) -> String {
    let who = if owner.tenant == "*" {
        &owner.server
    } else {
        &owner.tenant
    };
    let mut name: String = format!("mcp-{who}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(63);
    while name.ends_with('-') {
        name.pop();
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_valid() {
        let o = |t: &str| Owner {
            server: "weather".into(),
            tenant: t.into(),
            session: None,
        };
        assert_eq!(hostname_for(&o("acme")), "mcp-acme");
        assert_eq!(hostname_for(&o("*")), "mcp-weather");
        assert_eq!(hostname_for(&o("a_b.C")), "mcp-a-b-c");
        assert!(hostname_for(&o(&"x".repeat(100))).len() <= 63);
    }
}

//! `GET /v1/mcp-servers`: the caller's servers, their processes' states,
//! restarts and last exits.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::{lock, ExitInfo, InstanceKey, SlotState, Supervisor};

/// One server as a tenant sees it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ServerStatus {
    /// Its name (`/mcp/servers/{name}`).
    pub name: String,
    /// Its runtime.
    pub runtime: &'static str,
    /// Process sharing.
    #[schema(value_type = String)]
    pub mode: corral_policy::ProcessMode,
    /// Overall: `refused` (cannot start), else the state of the caller's
    /// process (`stopped` when it has none).
    pub state: &'static str,
    /// Why it is refused or failed, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The caller's processes (shared: the one).
    pub instances: Vec<InstanceStatus>,
    /// Restarts after failures, all instances.
    pub restarts: u64,
    /// Tool calls and other requests forwarded.
    pub calls: u64,
    /// Requests that ended in an error.
    pub errors: u64,
    /// Output lines dropped by the log limit.
    pub dropped_log_lines: u64,
    /// Output lines logged within the limit.
    pub logged_lines: u64,
}

/// One process slot.
#[derive(Serialize, utoipa::ToSchema)]
pub struct InstanceStatus {
    /// `shared`, `tenant` or `session`.
    pub kind: &'static str,
    /// State.
    pub state: &'static str,
    /// `corral run`'s pid, when running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When the process started, ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// Restarts after failures.
    pub restarts: u64,
    /// How the last process ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub last_exit: Option<ExitInfo>,
    /// Why the last start failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The servers `tenant` may reach, by name.
pub fn list(sup: &Supervisor, tenant: &str) -> Vec<ServerStatus> {
    let mut out: Vec<ServerStatus> = sup
        .servers
        .values()
        .filter(|e| e.allows(tenant, sup.anonymous()))
        .map(|e| {
            let sessions = lock(&sup.sessions);
            let instances: Vec<InstanceStatus> = lock(&e.slots)
                .values()
                .filter(|s| match &s.key {
                    InstanceKey::Shared => true,
                    InstanceKey::Tenant(t) => t == tenant,
                    InstanceKey::Session(id) => {
                        sessions.get(id).is_some_and(|x| x.tenant == tenant)
                    }
                })
                .map(|s| {
                    let state = lock(&s.state).clone();
                    let (pid, started_ms) = match &state {
                        SlotState::Ready(b) => (Some(b.pid), Some(b.started_ms)),
                        _ => (None, None),
                    };
                    InstanceStatus {
                        kind: match s.key {
                            InstanceKey::Shared => "shared",
                            InstanceKey::Tenant(_) => "tenant",
                            InstanceKey::Session(_) => "session",
                        },
                        state: state.name(),
                        pid,
                        started_ms,
                        restarts: s.restarts.load(Ordering::Relaxed),
                        last_exit: lock(&s.last_exit).clone(),
                        last_error: match &state {
                            SlotState::Failed(_, why) => Some(why.clone()),
                            _ => lock(&s.last_error).clone(),
                        },
                    }
                })
                .collect();
            let (state, error) = match &e.launch {
                Err(r) => ("refused", Some(r.message.clone())),
                Ok(_) => (
                    instances.first().map(|i| i.state).unwrap_or("stopped"),
                    instances.first().and_then(|i| i.last_error.clone()),
                ),
            };
            let m = &e.metrics;
            ServerStatus {
                name: e.spec.name.clone(),
                runtime: e.spec.runtime.as_str(),
                mode: e.spec.mode,
                state,
                error,
                restarts: m.restarts.load(Ordering::Relaxed),
                calls: m.calls.load(Ordering::Relaxed),
                errors: m.errors.load(Ordering::Relaxed),
                dropped_log_lines: m.log_dropped.load(Ordering::Relaxed),
                logged_lines: m.log_passed.load(Ordering::Relaxed),
                instances,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The supervised servers' lines of `/metrics` (Prometheus text format),
/// labelled by server (names are `[a-z0-9_-]`: nothing to escape).
pub fn metrics_text(sup: &Supervisor) -> String {
    use std::fmt::Write;
    let mut names: Vec<&String> = sup.servers.keys().collect();
    names.sort();
    let mut out = String::new();
    if names.is_empty() {
        return out;
    }
    type Counter = (&'static str, &'static str, fn(&super::ServerMetrics) -> u64);
    let counters: [Counter; 6] = [
        (
            "corral_mcp_calls_total",
            "Requests forwarded to a supervised server.",
            |m| m.calls.load(Ordering::Relaxed),
        ),
        (
            "corral_mcp_errors_total",
            "Forwarded requests that ended in an error.",
            |m| m.errors.load(Ordering::Relaxed),
        ),
        (
            "corral_mcp_restarts_total",
            "Restarts after failures.",
            |m| m.restarts.load(Ordering::Relaxed),
        ),
        (
            "corral_mcp_log_lines_total",
            "Output lines of supervised processes logged.",
            |m| m.log_passed.load(Ordering::Relaxed),
        ),
        (
            "corral_mcp_log_lines_dropped_total",
            "Output lines dropped by the log rate limit.",
            |m| m.log_dropped.load(Ordering::Relaxed),
        ),
        (
            "corral_mcp_oversized_total",
            "Messages over max_message_bytes.",
            |m| m.oversized.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, get) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for n in &names {
            let m = &sup.servers[*n].metrics;
            let _ = writeln!(out, "{name}{{server=\"{n}\"}} {}", get(m));
        }
    }
    let h = "corral_mcp_call_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {h} Tool-call latency through the bridge.\n# TYPE {h} histogram"
    );
    for n in &names {
        let m = &sup.servers[*n].metrics;
        let mut cumulative = 0;
        for (i, bound) in super::LATENCY_BUCKETS_MS.iter().enumerate() {
            cumulative += m.latency[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{h}_bucket{{server=\"{n}\",le=\"{}\"}} {cumulative}",
                bound / 1000.0
            );
        }
        cumulative += m.latency[super::LATENCY_BUCKETS_MS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{h}_bucket{{server=\"{n}\",le=\"+Inf\"}} {cumulative}");
        let sum = m.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{h}_sum{{server=\"{n}\"}} {sum}\n{h}_count{{server=\"{n}\"}} {cumulative}"
        );
    }
    out
}

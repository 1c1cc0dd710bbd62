//! Every refusal is an audit record: the layer reads the [`Refusal`] an
//! error answer carries and stores an `auth.refused` (no valid token) or
//! `api.refused` event with the error code, the peer, the method and the
//! path. Authentication refusals are rate-limited per peer address, so a
//! token-guessing flood costs a counter, not the audit store: beyond
//! [`PER_MINUTE`] a minute, they are counted and the next recorded one
//! says how many were not.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use corral_policy::{AuditEvent, Level, ReasonCode};

use crate::error::Refusal;
use crate::state::AppState;

/// Authentication refusals recorded per peer address per minute.
pub const PER_MINUTE: u32 = 20;
/// Peers tracked at most (the oldest windows are forgotten beyond).
const MAX_PEERS: usize = 10_000;

/// Per-peer windows of recorded authentication refusals.
#[derive(Default)]
pub struct RefusalLimiter {
    windows: Mutex<HashMap<IpAddr, Window>>,
}

struct Window {
    start: Instant,
    recorded: u32,
    suppressed: u64,
}

impl RefusalLimiter {
    /// Whether to record one more refusal of `peer`; with the number not
    /// recorded since the last one that was.
    fn admit(&self, peer: IpAddr) -> Option<u64> {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if w.len() >= MAX_PEERS && !w.contains_key(&peer) {
            w.retain(|_, x| now.duration_since(x.start) < Duration::from_secs(60));
            if w.len() >= MAX_PEERS {
                w.clear();
            }
        }
        let win = w.entry(peer).or_insert(Window {
            start: now,
            recorded: 0,
            suppressed: 0,
        });
        if now.duration_since(win.start) >= Duration::from_secs(60) {
            win.start = now;
            win.recorded = 0;
        }
        if win.recorded < PER_MINUTE {
            win.recorded += 1;
            Some(std::mem::take(&mut win.suppressed))
        } else {
            win.suppressed += 1;
            None
        }
    }
}

/// The layer.
pub async fn record(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let headers = req.headers().clone();
    let resp = next.run(req).await;
    let Some(refusal) = resp.extensions().get::<Refusal>().cloned() else {
        return resp;
    };
    let auth = refusal.code.starts_with("auth.");
    let tenant = if auth {
        String::new()
    } else {
        crate::auth::tenant(&st, &headers)
            .map(|t| t.tenant.name.clone())
            .unwrap_or_default()
    };
    let suppressed = if auth {
        match peer.map(|p| st.refusals.admit(p.ip())) {
            Some(None) => return resp,
            Some(Some(n)) => n,
            None => 0,
        }
    } else {
        0
    };
    let code = if auth {
        ReasonCode::AuthRefused
    } else {
        ReasonCode::ApiRefused
    };
    let mut ev = AuditEvent::new(
        Level::Warn,
        code,
        format!("{method} {path}: {}", refusal.message),
    )
    .with("error", refusal.code.as_str())
    .with("status", resp.status().as_u16())
    .with("method", method.as_str())
    .with("path", path.as_str());
    if let Some(p) = peer {
        ev = ev.with("peer", p.to_string());
    }
    if suppressed > 0 {
        ev = ev.with("not_recorded_before", suppressed);
    }
    st.events.emit_service(&tenant, ev).await;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authentication_refusals_are_recorded_up_to_the_rate_then_counted() {
        let l = RefusalLimiter::default();
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        for _ in 0..PER_MINUTE {
            assert_eq!(l.admit(a), Some(0));
        }
        assert_eq!(l.admit(a), None);
        assert_eq!(l.admit(a), None);
        // Another peer has its own window.
        assert_eq!(l.admit(b), Some(0));
        // A new window reports what the last one did not record.
        l.windows.lock().unwrap().get_mut(&a).unwrap().start -= Duration::from_secs(61);
        assert_eq!(l.admit(a), Some(2));
        assert_eq!(l.admit(a), Some(0));
    }
}

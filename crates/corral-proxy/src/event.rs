//! Audit records: one [`ConnectionEvent`] per proxied connection or
//! refusal, with stable reason codes.
//!
//! The code strings in [`code`] are a public contract (monitoring matches
//! on them), so they never change meaning once released.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;

/// Stable reason codes of [`ConnectionEvent::code`].
pub mod code {
    /// The connection was proxied.
    pub const ALLOWED: &str = "net.allowed";
    /// A `deny_domains` rule matches the name.
    pub const DENIED_DOMAIN: &str = "net.denied.domain";
    /// No `allow_domains` rule matches the name.
    pub const DENIED_NOT_ALLOWED: &str = "net.denied.not_allowed";
    /// A rule matches the name but not the port.
    pub const DENIED_PORT: &str = "net.denied.port";
    /// Every address of the name is in a refused class (loopback, private,
    /// link-local/metadata, ...) and no `allow_cidrs` entry covers it.
    pub const DENIED_ADDRESS: &str = "net.denied.address";
    /// The target is an IP address and no `allow_cidrs` entry covers it.
    pub const DENIED_IP_LITERAL: &str = "net.denied.ip_literal";
    /// The TLS ClientHello's server name is missing or differs from the
    /// requested host, or the client did not speak TLS on port 443.
    pub const DENIED_SNI_MISMATCH: &str = "net.denied.sni_mismatch";
    /// The proxy already serves `max_connections` connections.
    pub const DENIED_LIMIT: &str = "net.denied.limit";
    /// The name could not be resolved.
    pub const ERROR_RESOLVE: &str = "net.error.resolve";
    /// The checked address could not be connected to.
    pub const ERROR_CONNECT: &str = "net.error.connect";
    /// The client sent something malformed or unsupported.
    pub const ERROR_PROTOCOL: &str = "net.error.protocol";
}

/// Values of [`ConnectionEvent::protocol`].
pub mod protocol {
    /// An absolute-form HTTP request forwarded by the proxy.
    pub const HTTP: &str = "http";
    /// An HTTP CONNECT tunnel (or a request on the HTTP listener whose kind
    /// could not be told).
    pub const CONNECT: &str = "connect";
    /// A SOCKS5 CONNECT.
    pub const SOCKS5: &str = "socks5";
}

/// One audit record per proxied connection or refusal.
///
/// Why: network access is a security decision; every one is recorded with
/// enough detail (what was asked, what was dialled, which rule decided,
/// how much flowed) to audit a run afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionEvent {
    /// Whether the connection was proxied.
    pub allowed: bool,
    /// Stable reason code, one of [`code`].
    pub code: &'static str,
    /// `"http"`, `"connect"` or `"socks5"` (see [`protocol`]).
    pub protocol: &'static str,
    /// The requested host name, normalised (absent for IP targets and for
    /// requests too malformed to name one).
    pub domain: Option<String>,
    /// The address dialled, or the refused address.
    pub address: Option<String>,
    /// The requested port (0 when the request never named one).
    pub port: u16,
    /// The rule that decided: an allow or deny pattern, or an allowed CIDR.
    pub rule: Option<String>,
    /// Bytes sent from the sandbox to the destination.
    pub bytes_up: u64,
    /// Bytes sent from the destination to the sandbox.
    pub bytes_down: u64,
    /// From accept to close.
    pub duration_ms: u64,
    /// A human-readable sentence.
    pub message: String,
}

/// What is known about a connection while it is being served; turned into
/// a [`ConnectionEvent`] when it ends.
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    pub started: Instant,
    pub protocol: &'static str,
    pub domain: Option<String>,
    pub address: Option<String>,
    pub port: u16,
    pub rule: Option<String>,
}

impl Draft {
    /// A connection accepted now.
    pub fn new(protocol: &'static str) -> Draft {
        Draft {
            started: Instant::now(),
            protocol,
            domain: None,
            address: None,
            port: 0,
            rule: None,
        }
    }

    /// The final record.
    pub fn finish(
        self,
        code: &'static str,
        bytes: (u64, u64),
        message: impl Into<String>,
    ) -> ConnectionEvent {
        ConnectionEvent {
            allowed: code == code::ALLOWED,
            code,
            protocol: self.protocol,
            domain: self.domain,
            address: self.address,
            port: self.port,
            rule: self.rule,
            bytes_up: bytes.0,
            bytes_down: bytes.1,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            message: message.into(),
        }
    }
}

/// Called with every [`ConnectionEvent`] the moment its connection ends
/// or is refused, on the proxy's thread, before the event is kept for
/// [`crate::ProxyHandle::stop`].
///
/// Why: a sandbox may run for days; its network decisions must reach the
/// audit log as they happen, not when the run ends. The hook must not
/// block for long: the proxy serves every connection on one thread.
#[derive(Clone)]
pub struct EventHook(pub Arc<dyn Fn(&ConnectionEvent) + Send + Sync>);

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventHook")
    }
}

/// Events in the order connections ended, at most `max` of them; the rest
/// are counted, so a sandbox opening connections in a loop cannot grow
/// corral's memory without bound. Every event, kept or not, goes to the
/// hook first.
#[derive(Debug)]
pub(crate) struct EventLog {
    inner: Mutex<LogInner>,
    hook: Option<EventHook>,
}

/// The log's state behind its lock.
#[derive(Debug, Default)]
struct LogInner {
    events: Vec<ConnectionEvent>,
    max: usize,
    dropped: u64,
}

impl EventLog {
    /// An empty log keeping at most `max` events, handing each to `hook`.
    pub fn new(max: usize, hook: Option<EventHook>) -> EventLog {
        EventLog {
            inner: Mutex::new(LogInner {
                max,
                ..LogInner::default()
            }),
            hook,
        }
    }

    /// Hands one event to the hook, then appends it (or counts it when
    /// the log is full).
    pub fn push(&self, event: ConnectionEvent) {
        if let Some(hook) = &self.hook {
            (hook.0)(&event);
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.events.len() < inner.max {
            inner.events.push(event);
        } else {
            inner.dropped += 1;
        }
    }

    /// Takes every kept event and the number dropped.
    pub fn take(&self) -> (Vec<ConnectionEvent>, u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let dropped = std::mem::take(&mut inner.dropped);
        (std::mem::take(&mut inner.events), dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_is_bounded_and_ordered() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook_seen = Arc::clone(&seen);
        let hook = EventHook(Arc::new(move |e: &ConnectionEvent| {
            hook_seen.lock().unwrap().push(e.port);
        }));
        let log = EventLog::new(2, Some(hook));
        for port in 1..=3 {
            let mut d = Draft::new(protocol::CONNECT);
            d.port = port;
            log.push(d.finish(code::ALLOWED, (1, 2), "ok"));
        }
        let (events, dropped) = log.take();
        assert_eq!(events.iter().map(|e| e.port).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(dropped, 1);
        // The hook saw all three, the one not kept too.
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
        assert!(events[0].allowed && events[0].bytes_down == 2);
        let denied = Draft::new(protocol::HTTP).finish(code::DENIED_PORT, (0, 0), "no");
        assert!(!denied.allowed);
        let json = serde_json::to_value(&denied).unwrap();
        assert_eq!(json["code"], "net.denied.port");
        assert_eq!(json["protocol"], "http");
    }
}

//! The egress proxy as the launcher uses it: `corral-proxy` serving the
//! listeners the sandbox handed over, its connection records turned into
//! audit events as they happen.

use std::sync::Arc;

use corral_policy::{AuditEvent, Level, NetworkPolicy, ReasonCode};
use corral_proxy::{ConnectionEvent, EventHook, ProxyConfig, ProxyHandle};

use crate::events::EventSink;
use crate::launch::EgressProxy;

/// corral's proxy for one sandbox, started when its listeners arrive.
pub struct ProxyService {
    config: Option<ProxyConfig>,
    handle: Option<ProxyHandle>,
    sink: Arc<dyn EventSink>,
}

impl ProxyService {
    /// A proxy that will enforce `policy`, handing each connection's audit
    /// event to `sink` from the proxy's thread when the connection ends or
    /// is refused.
    pub fn new(policy: NetworkPolicy, sink: Arc<dyn EventSink>) -> ProxyService {
        let hook_sink = Arc::clone(&sink);
        let mut config = ProxyConfig::new(policy);
        config.on_event = Some(EventHook(Arc::new(move |e: &ConnectionEvent| {
            hook_sink.emit(&audit_event(e));
        })));
        ProxyService {
            config: Some(config),
            handle: None,
            sink,
        }
    }
}

impl EgressProxy for ProxyService {
    fn start(
        &mut self,
        http: std::net::TcpListener,
        socks: std::net::TcpListener,
    ) -> std::io::Result<()> {
        let config = self.config.take().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the proxy was already started",
            )
        })?;
        let handle = corral_proxy::start(http, socks, config).map_err(std::io::Error::other)?;
        self.handle = Some(handle);
        Ok(())
    }

    fn stop(&mut self) -> Vec<AuditEvent> {
        let Some(handle) = self.handle.take() else {
            return Vec::new();
        };
        let report = handle.stop_report();
        let mut events: Vec<AuditEvent> = report.events.iter().map(audit_event).collect();
        if report.events_dropped > 0 {
            // They went to the sink as they happened; only the result
            // leaves them out.
            let dropped = AuditEvent::new(
                Level::Warn,
                ReasonCode::NetError,
                format!(
                    "{} more connection records were written to the event stream but not kept in the result",
                    report.events_dropped
                ),
            )
            .with("reason", "net.events_dropped")
            .with("dropped", report.events_dropped);
            self.sink.emit(&dropped);
            events.push(dropped);
        }
        events
    }
}

/// One connection record as an audit event: `net.allowed`, `net.denied`
/// or `net.error`, with the proxy's own reason code in `fields.reason`.
pub fn audit_event(e: &ConnectionEvent) -> AuditEvent {
    let (level, code) = if e.allowed {
        (Level::Info, ReasonCode::NetAllowed)
    } else if e.code.starts_with("net.denied") {
        (Level::Warn, ReasonCode::NetDenied)
    } else {
        (Level::Warn, ReasonCode::NetError)
    };
    let mut event = AuditEvent::new(level, code, e.message.clone())
        .with("reason", e.code)
        .with("protocol", e.protocol)
        .with("port", e.port)
        .with("bytes_up", e.bytes_up)
        .with("bytes_down", e.bytes_down)
        .with("duration_ms", e.duration_ms);
    if let Some(d) = &e.domain {
        event = event.with("domain", d.as_str());
    }
    if let Some(a) = &e.address {
        event = event.with("address", a.as_str());
    }
    if let Some(r) = &e.rule {
        event = event.with("rule", r.as_str());
    }
    event
}

//! corral's egress proxy: the only way out of a sandbox in network mode
//! `allow`.
//!
//! The sandbox has its own network namespace with loopback only. corral's
//! helper creates two listening sockets on 127.0.0.1 inside it and passes
//! them to the corral parent, which serves them with [`start`]: an HTTP
//! proxy (CONNECT tunnels and absolute-form `http://` requests) and a
//! SOCKS5 proxy (no authentication, CONNECT, remote name resolution).
//! Connections accepted there come from the sandbox; the proxy dials out
//! from the host.
//!
//! Every request is decided by the [`NetworkPolicy`]: IP literals need an
//! `allow_cidrs` entry; names are checked against `deny_domains` (deny
//! wins), then `allow_domains` and their ports; the proxy resolves allowed
//! names itself (static `hosts` entries first), screens every address with
//! [`denied_class`] unless an allowed CIDR covers it, and connects to
//! exactly an address it checked. Tunnels to port 443 may also have to
//! carry a TLS server name equal to the requested host. Each connection
//! or refusal becomes one [`ConnectionEvent`].
#![forbid(unsafe_code)]

mod address;
mod decision;
mod dial;
mod display;
mod event;
mod host_sources;
mod http;
mod http_session;
mod io;
mod relay;
mod server;
mod sni;
mod socks;
mod socks_session;
mod target;
mod tunnel;

/// Wrappers over the private parsers for the fuzz targets in `fuzz/`.
/// Not a stable API.
#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests_e2e;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use corral_policy::NetworkPolicy;
use tokio::sync::watch;

pub use address::{denied_class, embedded_ipv4};
pub use event::{code, protocol, ConnectionEvent, EventHook};

use decision::Rules;
use event::EventLog;
use io::Stop;
use server::Ctx;

/// Events kept by default; see [`ProxyConfig::max_events`].
pub const DEFAULT_MAX_EVENTS: usize = 10_000;

/// Longest idle timeout honoured (a week), so deadline arithmetic cannot
/// overflow whatever the policy says.
const MAX_IDLE_SECS: u64 = 7 * 24 * 3600;

/// How long the runtime waits for in-flight name lookups when stopping.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// What the proxy enforces.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Domains, ports, CIDRs, static hosts, SNI check, connection limit and
    /// idle timeout (taken as at least 1 s and at most a week; it also
    /// bounds how long a client may take to send its request).
    pub policy: NetworkPolicy,
    /// Events kept for [`ProxyHandle::stop`]; later ones are only counted
    /// ([`ProxyReport::events_dropped`]), so a sandbox opening connections
    /// in a loop cannot grow corral's memory without bound.
    pub max_events: usize,
    /// Sees every event as it happens (see [`EventHook`]), including those
    /// past `max_events`.
    pub on_event: Option<EventHook>,
}

impl ProxyConfig {
    /// `policy` with the default event cap.
    pub fn new(policy: NetworkPolicy) -> ProxyConfig {
        ProxyConfig {
            policy,
            max_events: DEFAULT_MAX_EVENTS,
            on_event: None,
        }
    }
}

/// What a stopped proxy reports.
#[derive(Debug, Clone, Default)]
pub struct ProxyReport {
    /// One event per connection or refusal, in the order they ended.
    pub events: Vec<ConnectionEvent>,
    /// Events not kept because [`ProxyConfig::max_events`] was reached.
    pub events_dropped: u64,
}

/// A running proxy. Dropping it stops it too (discarding the events).
#[derive(Debug)]
pub struct ProxyHandle {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    log: Arc<EventLog>,
    http_addr: SocketAddr,
    socks_addr: SocketAddr,
}

/// Starts serving `http` (HTTP proxy) and `socks` (SOCKS5) on a background
/// thread with its own tokio current-thread runtime.
///
/// Why a thread of its own: corral's CLI is otherwise single-threaded (it
/// forks its sandbox helper) and must stay so until this is called; the
/// listeners are already bound (inside the sandbox's network namespace),
/// so this only takes them over.
pub fn start(
    http: std::net::TcpListener,
    socks: std::net::TcpListener,
    config: ProxyConfig,
) -> std::io::Result<ProxyHandle> {
    let http_addr = http.local_addr()?;
    let socks_addr = socks.local_addr()?;
    http.set_nonblocking(true)?;
    socks.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .thread_name("corral-proxy")
        .build()?;
    let (http, socks) = {
        let _context = runtime.enter();
        (
            tokio::net::TcpListener::from_std(http)?,
            tokio::net::TcpListener::from_std(socks)?,
        )
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let log = Arc::new(EventLog::new(config.max_events, config.on_event));
    let idle = Duration::from_secs(config.policy.idle_timeout_secs.clamp(1, MAX_IDLE_SECS));
    let ctx = Arc::new(Ctx {
        rules: Rules::new(config.policy),
        idle,
        stop: Stop::new(stop_rx),
        log: Arc::clone(&log),
    });
    let thread = std::thread::Builder::new()
        .name("corral-proxy".to_string())
        .spawn(move || {
            runtime.block_on(server::serve(http, socks, ctx));
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
        })?;
    Ok(ProxyHandle {
        stop: stop_tx,
        thread: Some(thread),
        log,
        http_addr,
        socks_addr,
    })
}

impl ProxyHandle {
    /// The HTTP proxy's address (as the sandbox sees it): for
    /// `HTTP_PROXY`/`HTTPS_PROXY`.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The SOCKS5 proxy's address (as the sandbox sees it): for
    /// `ALL_PROXY=socks5h://...`.
    pub fn socks_addr(&self) -> SocketAddr {
        self.socks_addr
    }

    /// Stops accepting, closes every proxied connection, joins the thread,
    /// and returns all events in the order the connections ended.
    ///
    /// Every wait inside the proxy gives way to the stop signal, so this
    /// returns promptly; a connection still running 5 s later would be
    /// cancelled without an event.
    pub fn stop(self) -> Vec<ConnectionEvent> {
        self.stop_report().events
    }

    /// Like [`ProxyHandle::stop`], also saying how many events were not
    /// kept because of [`ProxyConfig::max_events`].
    pub fn stop_report(mut self) -> ProxyReport {
        self.shutdown();
        let (events, events_dropped) = self.log.take();
        ProxyReport {
            events,
            events_dropped,
        }
    }

    /// Signals stop and joins the thread (once).
    fn shutdown(&mut self) {
        self.stop.send_replace(true);
        if let Some(thread) = self.thread.take() {
            // A panicked proxy thread has nothing more to give back; the
            // events it recorded are still in the log.
            let _ = thread.join();
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

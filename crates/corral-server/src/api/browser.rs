//! Browser-origin safety on every route: a web page the user visits must
//! not be able to make the service run code. Browsers send any page's
//! "simple" cross-origin POST (`Content-Type: text/plain`) without a
//! preflight, and a DNS-rebinding page reaches a loopback server under its
//! own host name; this is the class of MCP Inspector's CVE-2025-49596, and
//! the MCP specification requires servers to validate `Origin`.
//!
//! So, before authentication: a `Host` outside the allowlist is refused
//! (the listen address and `localhost` by default), an `Origin` outside
//! `server.allowed_origins` is refused (none by default), a `POST` to the
//! API must say `application/json`, and CORS preflights are answered for
//! allowed origins only.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use corral_policy::ServerConfig;

use crate::error::{ApiError, ErrorCode};

/// What the guard allows, fixed at start-up.
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    /// Accepted `Host` values (lowercase, `name` or `name:port`); `None`:
    /// not checked (a wildcard listen address with no names configured).
    hosts: Option<Vec<String>>,
    /// Accepted `Origin` values, lowercase, without a trailing `/`.
    origins: Vec<String>,
}

impl BrowserGuard {
    /// The guard for `server` listening on `local` (the bound address: a
    /// configured port 0 is the kernel's choice): its `allowed_hosts` plus
    /// the listen address and `localhost` on that port, and its
    /// `allowed_origins`.
    pub fn new(server: &ServerConfig, local: std::net::SocketAddr) -> Arc<BrowserGuard> {
        let port = local.port();
        let ip = local.ip();
        let hosts = if ip.is_unspecified() && server.allowed_hosts.is_empty() {
            None
        } else {
            let listen = match ip {
                std::net::IpAddr::V4(v4) => v4.to_string(),
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            };
            let mut hosts: Vec<String> = Vec::new();
            for name in [listen.as_str(), "localhost", "127.0.0.1", "[::1]"] {
                hosts.push(format!("{name}:{port}"));
                if port == 80 {
                    hosts.push(name.to_string());
                }
            }
            hosts.extend(server.allowed_hosts.iter().cloned());
            Some(hosts)
        };
        Arc::new(BrowserGuard {
            hosts,
            origins: server.allowed_origins.clone(),
        })
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        let host = host.to_ascii_lowercase();
        hosts.iter().any(|allowed| {
            allowed == &host
                // A configured name without a port matches every port.
                || (!allowed.contains(':') || allowed.ends_with(']'))
                    && host
                        .strip_prefix(allowed.as_str())
                        .is_some_and(|rest| rest.starts_with(':'))
        })
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        self.origins.contains(&origin)
    }
}

fn refuse(code: ErrorCode, message: String) -> Response {
    ApiError::new(code, message).into_response()
}

/// The request's host: the `Host` header (HTTP/1.1) or the URI's authority
/// (HTTP/2's `:authority`).
fn host_of(req: &Request) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The API's `POST` routes, whose bodies must be JSON. A `POST` to any
/// other `/v1/` path is a wrong method, answered 405 by the router (a
/// test checks this list against the OpenAPI document's operations).
pub(super) const POST_PATHS: [&str; 2] = ["/v1/executions", "/v1/executions/stream"];

/// The headers a cross-origin page of an allowed origin may send.
const ALLOWED_REQUEST_HEADERS: &str =
    "authorization, content-type, accept, last-event-id, mcp-session-id, mcp-protocol-version, mcp-method, mcp-name";

/// Middleware: the checks above, then CORS headers on answers to allowed
/// origins.
pub async fn guard(State(g): State<Arc<BrowserGuard>>, req: Request, next: Next) -> Response {
    match host_of(&req) {
        Some(host) if !g.host_allowed(&host) => {
            return refuse(
                ErrorCode::HostRefused,
                format!(
                    "Host `{}` is not one this server answers to (a DNS-rebinding guard); \
                     use the listen address or localhost, or add the name to server.allowed_hosts",
                    host.escape_debug()
                ),
            )
        }
        None if g.hosts.is_some() => {
            return refuse(
                ErrorCode::HostRefused,
                "the request names no Host; send one (the listen address or localhost)".into(),
            )
        }
        _ => {}
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .map(|v| v.to_str().unwrap_or("").to_string());
    if let Some(origin) = &origin {
        if !g.origin_allowed(origin) {
            return refuse(
                ErrorCode::OriginRefused,
                format!(
                    "requests from the web origin `{}` are refused: a web page must not drive this server. \
                     Add the origin to server.allowed_origins if a page of yours should",
                    origin.escape_debug()
                ),
            );
        }
        if req.method() == Method::OPTIONS {
            return preflight(origin);
        }
    }
    if req.method() == Method::POST
        && POST_PATHS.contains(&req.uri().path())
        && !is_json(req.headers())
    {
        return refuse(
            ErrorCode::UnsupportedMediaType,
            "POST bodies must be sent as `Content-Type: application/json`".into(),
        );
    }
    let mut resp = next.run(req).await;
    if let Some(origin) = origin {
        allow_origin(resp.headers_mut(), &origin);
    }
    resp
}

fn allow_origin(headers: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("mcp-session-id, retry-after"),
        );
    }
}

/// The answer to a CORS preflight from an allowed origin.
fn preflight(origin: &str) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let h = resp.headers_mut();
    allow_origin(h, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOWED_REQUEST_HEADERS),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn guard_for(listen: &str, hosts: &[&str], origins: &[&str]) -> Arc<BrowserGuard> {
        let server = ServerConfig {
            listen: listen.parse().unwrap(),
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        BrowserGuard::new(&server, server.listen)
    }

    #[test]
    fn hosts_default_to_the_listen_address_and_localhost() {
        let g = guard_for("127.0.0.1:8080", &[], &[]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1:9999",
            "localhost",
            "localhost.evil:8080",
            "127.0.0.1:8080.evil",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn a_configured_name_without_a_port_matches_any_port() {
        let g = guard_for(
            "127.0.0.1:8080",
            &["corral.internal", "api.internal:443"],
            &[],
        );
        assert!(g.host_allowed("corral.internal:8080"));
        assert!(g.host_allowed("corral.internal"));
        assert!(g.host_allowed("api.internal:443"));
        assert!(!g.host_allowed("api.internal:80"));
        assert!(!g.host_allowed("corral.internal.evil:80"));
    }

    #[test]
    fn a_wildcard_listen_without_names_checks_no_host() {
        assert!(guard_for("0.0.0.0:8080", &[], &[]).host_allowed("anything:1"));
        assert!(!guard_for("0.0.0.0:8080", &["corral.lan"], &[]).host_allowed("anything:1"));
    }

    #[test]
    fn origins_are_exact() {
        let g = guard_for("127.0.0.1:8080", &[], &["https://app.example.com"]);
        assert!(g.origin_allowed("https://app.example.com"));
        assert!(g.origin_allowed("https://APP.example.com/"));
        assert!(!g.origin_allowed("https://app.example.com.evil"));
        assert!(!g.origin_allowed("http://app.example.com"));
        assert!(!g.origin_allowed("null"));
    }
}

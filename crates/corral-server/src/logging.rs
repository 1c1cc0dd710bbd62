//! Operational logs: `tracing` events as JSON lines on stderr.
//!
//! Every HTTP request runs in a `request` span (request id, method, path,
//! tenant once authenticated, status, duration), every execution in an
//! `execution` span below it (execution id, tenant, profile, outcome, exit
//! status, duration), every MCP tool call in an `mcp_tool` span. These are
//! operational logs; the audit store stays the record of security
//! decisions. stdout is never written: `corral mcp` speaks JSON-RPC there.

use std::time::Duration;

use axum::http::{Request, Response};
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// The environment variable read when no `--log-level` is given.
pub const LOG_ENV: &str = "CORRAL_LOG";
/// The filter when neither `--log-level` nor `CORRAL_LOG` says otherwise.
pub const DEFAULT_LOG: &str = "info";

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter does not parse.
    #[error("invalid log filter {filter:?} (from {origin}): {source}; give a level (error, warn, info, debug, trace, off) or directives such as `info,corral_server=debug`")]
    Filter {
        /// The filter as given.
        filter: String,
        /// Where it came from: `--log-level` or `CORRAL_LOG`.
        origin: &'static str,
        /// Why it does not parse.
        source: tracing_subscriber::filter::ParseError,
    },
    /// One word that is not a level (`EnvFilter` would take it as a target
    /// name and log nothing else, which a `--log-level` never means).
    #[error("invalid log filter {filter:?} (from {origin}): not a level; give error, warn, info, debug, trace or off, or directives such as `info,corral_server=debug`")]
    NotALevel {
        /// The filter as given.
        filter: String,
        /// Where it came from: `--log-level` or `CORRAL_LOG`.
        origin: &'static str,
    },
    /// Another subscriber was installed first.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// Sends this process's `tracing` events to stderr as JSON lines, one per
/// event, with the span they happened in and its parents. The filter is
/// `level` (the `--log-level` flag) when given, else `CORRAL_LOG`, else
/// `info`; it takes `tracing`'s directive syntax (`debug`,
/// `warn,corral_server=info`). A log line that cannot be written (stderr
/// closed) is dropped; it never stops the server.
pub fn init_logging(level: Option<&str>) -> Result<(), LogError> {
    let from_env = std::env::var(LOG_ENV).ok().filter(|v| !v.trim().is_empty());
    let (filter, origin) = match (level, from_env) {
        (Some(l), _) => (l.to_owned(), "--log-level"),
        (None, Some(e)) => (e, LOG_ENV),
        (None, None) => (DEFAULT_LOG.to_owned(), "the default"),
    };
    let word = filter.trim();
    if !word.contains([',', '=', '[', ':']) && word.parse::<LevelFilter>().is_err() {
        return Err(LogError::NotALevel {
            filter: filter.clone(),
            origin,
        });
    }
    let parsed = EnvFilter::builder()
        .parse(&filter)
        .map_err(|source| LogError::Filter {
            filter: filter.clone(),
            origin,
            source,
        })?;
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(parsed)
        .with_writer(std::io::stderr)
        .with_current_span(true)
        .with_span_list(true)
        // An unwritable stderr must not turn into a panic (the internal
        // error report would be printed to stderr too).
        .log_internal_errors(false)
        .try_init()
        .map_err(|e| LogError::Install(e.to_string()))
}

/// The `TraceLayer` in front of the HTTP service: one `request` span per
/// request, and one `request finished` event with the status and the time
/// to the response's head.
pub type HttpTrace =
    TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, (), RequestDone, (), (), ()>;

/// The layer that traces every HTTP request.
pub fn http_trace() -> HttpTrace {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(())
        .on_response(RequestDone)
        .on_body_chunk(())
        .on_eos(())
        .on_failure(())
}

/// Makes the `request` span: a fresh request id, the method and the path
/// (never the query or the headers, which may carry tokens); `tenant`,
/// `status` and `duration_ms` are filled in later.
#[derive(Debug, Clone, Copy)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        tracing::info_span!(
            "request",
            request_id = %request_id(),
            method = %request.method(),
            path = %request.uri().path(),
            tenant = tracing::field::Empty,
            status = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        )
    }
}

/// Logs the end of a request: `info`, `warn` for a server error.
#[derive(Debug, Clone, Copy)]
pub struct RequestDone;

impl<B> OnResponse<B> for RequestDone {
    fn on_response(self, response: &Response<B>, latency: Duration, span: &Span) {
        let status = response.status().as_u16();
        span.record("status", status);
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        span.record("duration_ms", ms);
        if response.status().is_server_error() {
            tracing::warn!(parent: span, "request finished");
        } else {
            tracing::info!(parent: span, "request finished");
        }
    }
}

/// 16 hex digits to tell requests apart in the logs: random, or a counter
/// when the kernel gives no random bytes (it need not be unguessable).
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    let n = match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_ne_bytes(bytes),
        Err(_) => COUNTER.fetch_add(1, Ordering::Relaxed),
    };
    format!("{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_distinct_hex() {
        let (a, b) = (request_id(), request_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_bad_filter_is_refused_with_its_origin() {
        let e = init_logging(Some("info,corral_server=loud")).unwrap_err();
        assert!(
            matches!(
                &e,
                LogError::Filter {
                    origin: "--log-level",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("--log-level"), "{e}");
        let e = init_logging(Some("loud")).unwrap_err();
        assert!(matches!(&e, LogError::NotALevel { .. }), "{e}");
    }
}

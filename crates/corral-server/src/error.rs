//! Errors: start-up errors, and API errors as `{"error": {"code", "message"}}`
//! with a stable code and the right status.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// An unsafe configuration.
    #[error("{0}")]
    Unsafe(String),
    /// The audit store could not be opened.
    #[error("audit store: {0}")]
    Audit(String),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(String),
}

/// An error answered to an API caller.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `auth.missing`, `request.invalid`, `busy`.
    pub code: String,
    /// What is wrong and what to do.
    pub message: String,
    /// Seconds to wait before retrying (429).
    pub retry_after: Option<u64>,
    /// The whole answer, when there is more to it than the error: a refused
    /// execution answers with its stored record (which has `error` and the
    /// `id` to look it up with), so the answer and the record agree.
    pub body: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
            body: None,
        }
    }

    /// 400 with a code.
    pub fn bad_request(code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The answer's body: `{"error": {"code", "message"}}`, or the record
    /// of a refused execution (which has that `error` too).
    pub fn to_json(&self) -> serde_json::Value {
        match &self.body {
            Some(b) => b.clone(),
            None => json!({"error": {"code": self.code, "message": self.message}}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_json();
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

/// The stable code of an error answered by the HTTP layer itself (axum,
/// hyper, the MCP SDK) rather than by a handler of the service.
pub fn code_for_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        406 => "not_acceptable",
        408 => "request_timeout",
        409 => "conflict",
        411 => "length_required",
        413 => "body_too_large",
        414 => "uri_too_long",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        429 => "busy",
        431 => "headers_too_large",
        501 => "not_implemented",
        503 => "unavailable",
        s if s >= 500 => "internal",
        _ => "http_error",
    }
}

/// Largest error body of the HTTP layer kept as the message.
const MAX_FRAMEWORK_MESSAGE: usize = 4096;

/// Middleware: every error answer has the service's JSON error body. Error
/// answers the handlers make are JSON already and pass untouched; those of
/// the framework (413 body too large, 405 wrong method with its `Allow`
/// header kept, extractor rejections, the MCP SDK's plain-text errors) get
/// `{"error": {"code", "message"}}` with a code from [`code_for_status`]
/// and their text, if any, as the message.
pub async fn json_errors(
    axum::extract::State(max_body): axum::extract::State<u64>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_FRAMEWORK_MESSAGE)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    // The MCP SDK answers a body that is not JSON with 415, though its
    // content type was right: it is the API's malformed request.
    let malformed = status == StatusCode::UNSUPPORTED_MEDIA_TYPE
        && text.starts_with("fail to deserialize request body");
    let (status, code) = if malformed {
        (StatusCode::BAD_REQUEST, "request.malformed")
    } else {
        (status, code_for_status(status))
    };
    parts.status = status;
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "the request body is larger than this server accepts: at most {max_body} bytes (server.max_request_bytes)"
        ),
        // (axum adds its `Allow` header outside this layer.)
        StatusCode::METHOD_NOT_ALLOWED => {
            format!("{method} is not allowed on {path}; the Allow header lists the methods that are")
        }
        _ if !text.is_empty() => text,
        _ => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_owned(),
    };
    let body = json!({"error": {"code": code, "message": message}}).to_string();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body))
}

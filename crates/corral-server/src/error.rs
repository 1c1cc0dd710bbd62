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
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with a code.
    pub fn bad_request(code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

//! The service's JSON error body on the HTTP layer's own error answers.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{ErrorBody, ErrorCode, ErrorEnvelope, ErrorObject};

/// Largest error body of the HTTP layer kept as the message.
const MAX_FRAMEWORK_MESSAGE: usize = 4096;

/// Middleware: every error answer has the service's JSON error body. Error
/// answers the handlers make are JSON already and pass untouched; those of
/// the framework (413 body too large, 405 wrong method with its `Allow`
/// header kept, extractor rejections, the MCP SDK's plain-text errors) get
/// `{"error": {"code", "message"}}` with a code from
/// [`ErrorCode::for_status`] and their text, if any, as the message.
pub async fn json_errors(State(max_body): State<u64>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    // RFC 7235: a 401 names the scheme it wants, so clients (MCP Inspector
    // among them) show corral's error rather than guess at OAuth.
    if status == StatusCode::UNAUTHORIZED && !resp.headers().contains_key(header::WWW_AUTHENTICATE)
    {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"corral\""),
        );
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
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
        (StatusCode::BAD_REQUEST, ErrorCode::RequestMalformed)
    } else {
        (status, ErrorCode::for_status(status))
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
    let body = ErrorBody::Error(ErrorEnvelope {
        error: ErrorObject {
            code: code.as_str(),
            message,
        },
    });
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    Response::from_parts(parts, Body::from(bytes))
}

//! Errors: why the server could not start ([`ServerError`]), and what an
//! API caller is answered ([`ApiError`]): `{"error": {"code", "message"}}`
//! with a stable [`ErrorCode`] and the status that goes with it.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::audit::AuditError;
use crate::exec::ExecutionResponse;
use crate::workspace::WorkspaceError;

/// Why the server could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Listening beyond loopback without tenants: anyone who can reach the
    /// port could run code.
    #[error(
        "refusing to listen on {0} without authentication: anyone who can reach it could run code. \
         Add [[server.tenant]] entries (bearer tokens, stored as SHA-256) or listen on 127.0.0.1"
    )]
    Unauthenticated(SocketAddr),
    /// The connection cap does not fit the open-file limit.
    #[error("{0}")]
    Connections(String),
    /// The config file could not be copied for the supervised servers.
    #[error("config {}: {message}", path.display())]
    ConfigSnapshot {
        /// The config file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The audit store could not be opened.
    #[error("audit store: {0}")]
    Audit(#[from] AuditError),
    /// `work_dir` could not be resolved.
    #[error("work_dir {}: {source}", path.display())]
    WorkDir {
        /// `server.work_dir` as configured.
        path: PathBuf,
        /// Why it could not be resolved.
        source: std::io::Error,
    },
    /// A directory above `work_dir` could not be examined.
    #[error("{}: {source}", path.display())]
    Stat {
        /// The directory.
        path: PathBuf,
        /// Why `stat` failed.
        source: std::io::Error,
    },
    /// As root, a directory above `work_dir` does not let the sandbox uid
    /// through.
    #[error(
        "work_dir {}: {} is not traversable by others (mode {mode:o}); sandboxes run as an unprivileged uid \
         and must reach their workspace below it. Pick a work_dir whose parents all allow `x` for others (e.g. /tmp)",
        work_dir.display(),
        dir.display()
    )]
    NotTraversable {
        /// `server.work_dir` as configured.
        work_dir: PathBuf,
        /// The directory that blocks.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// This server's own `corral-serve-<pid>` directory could not be
    /// created (it must be new).
    #[error(
        "creating {}: {source}; corral only works in a directory it creates itself (remove a stale one if it is yours)",
        path.display()
    )]
    OwnDir {
        /// The directory.
        path: PathBuf,
        /// Why `mkdir` failed.
        source: std::io::Error,
    },
    /// The mode of this server's own directory could not be set.
    #[error("chmod {}: {source}", path.display())]
    Chmod {
        /// The directory.
        path: PathBuf,
        /// Why `chmod` failed.
        source: std::io::Error,
    },
    /// The listening socket could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why `bind` failed.
        source: std::io::Error,
    },
    /// Serving HTTP failed.
    #[error("{0}")]
    Serve(#[source] std::io::Error),
    /// The MCP session over stdio failed.
    #[error("MCP over stdio: {0}")]
    Stdio(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The stable codes of the errors the service answers. [`as_str`] is what
/// clients match on; it never changes for a variant.
///
/// Refusals of the runtime (`command.not_allowed`, `env.invalid`, …) keep
/// the launcher's own codes and are not listed here: they travel in the
/// execution's record (see [`ApiError::Refused`]).
///
/// [`as_str`]: ErrorCode::as_str
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// `auth.missing`: no `Authorization` header.
    AuthMissing,
    /// `auth.invalid`: the header is not `Bearer <token>`.
    AuthInvalid,
    /// `auth.unknown_token`: no tenant has this token.
    AuthUnknownToken,
    /// `request.malformed`: the body is not JSON of the right shape.
    RequestMalformed,
    /// `request.invalid`: a well-formed request that makes no sense.
    RequestInvalid,
    /// `request.origin_refused`: a browser `Origin` not in
    /// `server.allowed_origins`.
    OriginRefused,
    /// `request.host_refused`: a `Host` this server does not answer to
    /// (DNS rebinding).
    HostRefused,
    /// `language.unknown`: code mode with another language.
    LanguageUnknown,
    /// `files.encoding`: an unknown encoding, or content that is not base64.
    FilesEncoding,
    /// `path.absolute`: a workspace path starting with `/`.
    PathAbsolute,
    /// `path.traversal`: a workspace path with `..`.
    PathTraversal,
    /// `path.symlink`: a symlink on a workspace path.
    PathSymlink,
    /// `path.reserved`: a workspace path under a reserved name.
    PathReserved,
    /// `path.invalid`: an empty, too long or otherwise malformed path.
    PathInvalid,
    /// `file.too_large`: a file over its cap.
    FileTooLarge,
    /// `file.not_regular`: a directory, FIFO, socket or device.
    FileNotRegular,
    /// `file.not_found`: nothing at the path.
    FileNotFound,
    /// `workspace.full`: the workspace cap or the filesystem is full.
    WorkspaceFull,
    /// `io`: a system error in a workspace.
    Io,
    /// `profile.unknown`: a profile the config does not have.
    ProfileUnknown,
    /// `profile.forbidden`: a profile the tenant may not use.
    ProfileForbidden,
    /// `code_mode.disabled`: `language`/`code` while code mode is off.
    CodeModeDisabled,
    /// `session.forbidden`: an MCP session of another tenant.
    SessionForbidden,
    /// `not_found`: no such endpoint (or MCP session).
    NotFound,
    /// `execution.not_found`: no such execution for this tenant.
    ExecutionNotFound,
    /// `limits.invalid`: a limit below `corral run`'s minimum.
    LimitsInvalid,
    /// `limits.above_ceiling`: a limit above the profile's.
    LimitsAboveCeiling,
    /// `busy`: no free execution slot.
    Busy,
    /// `cancelled`: an MCP call its client cancelled before it ran.
    Cancelled,
    /// `internal`: the service itself failed.
    Internal,
    /// `audit`: the audit store failed while reading.
    Audit,
    /// `bad_request`: the HTTP layer's 400.
    BadRequest,
    /// `unauthorized`: the HTTP layer's 401.
    Unauthorized,
    /// `forbidden`: the HTTP layer's 403.
    Forbidden,
    /// `method_not_allowed`: a known path with another method.
    MethodNotAllowed,
    /// `not_acceptable`: `/mcp` with an `Accept` it cannot satisfy.
    NotAcceptable,
    /// `request_timeout`: the HTTP layer's 408.
    RequestTimeout,
    /// `conflict`: the HTTP layer's 409.
    Conflict,
    /// `length_required`: the HTTP layer's 411.
    LengthRequired,
    /// `body_too_large`: the body is over `max_request_bytes`.
    BodyTooLarge,
    /// `uri_too_long`: the HTTP layer's 414.
    UriTooLong,
    /// `unsupported_media_type`: `/mcp` with another content type.
    UnsupportedMediaType,
    /// `unprocessable`: the HTTP layer's 422.
    Unprocessable,
    /// `headers_too_large`: the HTTP layer's 431.
    HeadersTooLarge,
    /// `not_implemented`: the HTTP layer's 501.
    NotImplemented,
    /// `unavailable`: the HTTP layer's 503.
    Unavailable,
    /// `http_error`: any other error status of the HTTP layer.
    HttpError,
}

impl ErrorCode {
    /// The code as clients see it.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            AuthMissing => "auth.missing",
            AuthInvalid => "auth.invalid",
            AuthUnknownToken => "auth.unknown_token",
            RequestMalformed => "request.malformed",
            RequestInvalid => "request.invalid",
            OriginRefused => "request.origin_refused",
            HostRefused => "request.host_refused",
            LanguageUnknown => "language.unknown",
            FilesEncoding => "files.encoding",
            PathAbsolute => "path.absolute",
            PathTraversal => "path.traversal",
            PathSymlink => "path.symlink",
            PathReserved => "path.reserved",
            PathInvalid => "path.invalid",
            FileTooLarge => "file.too_large",
            FileNotRegular => "file.not_regular",
            FileNotFound => "file.not_found",
            WorkspaceFull => "workspace.full",
            Io => "io",
            ProfileUnknown => "profile.unknown",
            ProfileForbidden => "profile.forbidden",
            CodeModeDisabled => "code_mode.disabled",
            SessionForbidden => "session.forbidden",
            NotFound => "not_found",
            ExecutionNotFound => "execution.not_found",
            LimitsInvalid => "limits.invalid",
            LimitsAboveCeiling => "limits.above_ceiling",
            Busy => "busy",
            Cancelled => "cancelled",
            Internal => "internal",
            Audit => "audit",
            BadRequest => "bad_request",
            Unauthorized => "unauthorized",
            Forbidden => "forbidden",
            MethodNotAllowed => "method_not_allowed",
            NotAcceptable => "not_acceptable",
            RequestTimeout => "request_timeout",
            Conflict => "conflict",
            LengthRequired => "length_required",
            BodyTooLarge => "body_too_large",
            UriTooLong => "uri_too_long",
            UnsupportedMediaType => "unsupported_media_type",
            Unprocessable => "unprocessable",
            HeadersTooLarge => "headers_too_large",
            NotImplemented => "not_implemented",
            Unavailable => "unavailable",
            HttpError => "http_error",
        }
    }

    /// The status the service answers this code with.
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            AuthMissing | AuthInvalid | AuthUnknownToken | Unauthorized => StatusCode::UNAUTHORIZED,
            RequestMalformed | RequestInvalid | LanguageUnknown | FilesEncoding | PathAbsolute
            | PathTraversal | PathSymlink | PathReserved | PathInvalid | FileTooLarge
            | FileNotRegular | FileNotFound | WorkspaceFull | Io | ProfileUnknown | BadRequest => {
                StatusCode::BAD_REQUEST
            }
            ProfileForbidden | CodeModeDisabled | SessionForbidden | Forbidden | OriginRefused
            | HostRefused => StatusCode::FORBIDDEN,
            NotFound | ExecutionNotFound => StatusCode::NOT_FOUND,
            LimitsInvalid | LimitsAboveCeiling | Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            Busy => StatusCode::TOO_MANY_REQUESTS,
            // The client is gone (nginx's "client closed request"); only
            // MCP calls end so, and their answer is a tool error.
            Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Conflict => StatusCode::CONFLICT,
            LengthRequired => StatusCode::LENGTH_REQUIRED,
            BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UriTooLong => StatusCode::URI_TOO_LONG,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            NotImplemented => StatusCode::NOT_IMPLEMENTED,
            Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Internal | Audit | HttpError => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code of an error answered by the HTTP layer itself (axum, hyper,
    /// the MCP SDK) rather than by a handler of the service.
    pub fn for_status(status: StatusCode) -> ErrorCode {
        use ErrorCode::*;
        match status.as_u16() {
            400 => BadRequest,
            401 => Unauthorized,
            403 => Forbidden,
            404 => NotFound,
            405 => MethodNotAllowed,
            406 => NotAcceptable,
            408 => RequestTimeout,
            409 => Conflict,
            411 => LengthRequired,
            413 => BodyTooLarge,
            414 => UriTooLong,
            415 => UnsupportedMediaType,
            422 => Unprocessable,
            429 => Busy,
            431 => HeadersTooLarge,
            501 => NotImplemented,
            503 => Unavailable,
            s if s >= 500 => Internal,
            _ => HttpError,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// An error answered to an API caller (HTTP or MCP).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Refused or failed by the service itself.
    #[error("{message}")]
    Service {
        /// The stable code; it also gives the status.
        code: ErrorCode,
        /// What is wrong and what to do.
        message: String,
    },
    /// An input file of an execution request that the workspace refused
    /// (400, with the workspace's code).
    #[error("files: {0}")]
    InputFile(#[source] WorkspaceError),
    /// A file tool's workspace operation refused or failed (MCP).
    #[error("{0}")]
    Workspace(#[from] WorkspaceError),
    /// The audit store failed while reading (500 `audit`).
    #[error("{0}")]
    Audit(#[from] AuditError),
    /// The runtime refused the execution before the sandbox ran (422). The
    /// refusal was recorded: the answer is the stored record itself, with
    /// its `error` and the `id` to look it up with.
    #[error("{}", .0.refusal_message().unwrap_or("the execution was refused"))]
    Refused(Box<ExecutionResponse>),
}

impl ApiError {
    /// An error with a stable code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::Service {
            code,
            message: message.into(),
        }
    }

    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Internal, message)
    }

    /// 429 `busy` (answered with `Retry-After`).
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Busy, message)
    }

    /// The stable code clients match on.
    pub fn code(&self) -> &str {
        match self {
            ApiError::Service { code, .. } => code.as_str(),
            ApiError::InputFile(e) | ApiError::Workspace(e) => e.code().as_str(),
            ApiError::Audit(_) => ErrorCode::Audit.as_str(),
            ApiError::Refused(record) => record.refusal_code().unwrap_or("execution.refused"),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Service { code, .. } => code.status(),
            ApiError::InputFile(_) => StatusCode::BAD_REQUEST,
            ApiError::Workspace(e) => e.code().status(),
            ApiError::Audit(_) => ErrorCode::Audit.status(),
            ApiError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// Seconds to wait before retrying, for a `busy` answer.
    pub fn retry_after(&self) -> Option<u64> {
        matches!(
            self,
            ApiError::Service {
                code: ErrorCode::Busy,
                ..
            }
        )
        .then_some(1)
    }

    /// The answer's body: the error object, or for a refused execution its
    /// record (which has the error object too).
    pub fn body(&self) -> ErrorBody<'_> {
        match self {
            ApiError::Refused(record) => ErrorBody::Record(record),
            other => ErrorBody::Error(ErrorEnvelope {
                error: ErrorObject {
                    code: other.code(),
                    message: other.to_string(),
                },
            }),
        }
    }
}

/// `{"code", "message"}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ErrorObject)]
pub struct ErrorObject<'a> {
    /// The stable code, e.g. `auth.unknown_token`, `busy`,
    /// `body_too_large` (docs/service.md lists them).
    pub code: &'a str,
    /// What is wrong and what to do.
    pub message: String,
}

/// `{"error": {"code", "message"}}`: every error answer of the service
/// but a refused execution's (which is its record). Nothing else is in it,
/// so a schema can tell it from a record.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
#[serde(deny_unknown_fields)]
pub struct ErrorEnvelope<'a> {
    /// The error.
    pub error: ErrorObject<'a>,
}

/// The body of an error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ErrorOrRecord)]
#[serde(untagged)]
pub enum ErrorBody<'a> {
    /// `{"error": {"code", "message"}}`.
    Error(ErrorEnvelope<'a>),
    /// A refused execution's record: its fields, `error` among them.
    Record(&'a ExecutionResponse),
}

/// What a refusal said, attached to its response for the audit layer
/// (`api::refusals`).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The stable error code.
    pub code: String,
    /// The message.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if resp.status().is_client_error() {
            resp.extensions_mut().insert(Refusal {
                code: self.code().to_string(),
                message: self.to_string(),
            });
        }
        if let Some(secs) = self.retry_after() {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_their_strings_and_statuses() {
        let cases = [
            (ErrorCode::AuthMissing, "auth.missing", 401),
            (ErrorCode::RequestMalformed, "request.malformed", 400),
            (ErrorCode::ProfileForbidden, "profile.forbidden", 403),
            (ErrorCode::CodeModeDisabled, "code_mode.disabled", 403),
            (ErrorCode::ExecutionNotFound, "execution.not_found", 404),
            (ErrorCode::LimitsAboveCeiling, "limits.above_ceiling", 422),
            (ErrorCode::Busy, "busy", 429),
            (ErrorCode::Audit, "audit", 500),
            (ErrorCode::BodyTooLarge, "body_too_large", 413),
            (ErrorCode::MethodNotAllowed, "method_not_allowed", 405),
            (ErrorCode::OriginRefused, "request.origin_refused", 403),
            (ErrorCode::HostRefused, "request.host_refused", 403),
        ];
        for (code, text, status) in cases {
            assert_eq!((code.as_str(), code.status().as_u16()), (text, status));
        }
    }

    #[test]
    fn framework_statuses_map_to_codes() {
        let code = |n: u16| {
            StatusCode::from_u16(n)
                .map(ErrorCode::for_status)
                .map(ErrorCode::as_str)
        };
        assert_eq!(code(413).ok(), Some("body_too_large"));
        assert_eq!(code(429).ok(), Some("busy"));
        assert_eq!(code(502).ok(), Some("internal"));
        assert_eq!(code(418).ok(), Some("http_error"));
    }

    #[test]
    fn an_error_answer_has_the_error_object_and_retry_after_when_busy() {
        let busy = ApiError::busy("all execution slots are in use");
        let body = serde_json::to_string(&busy.body()).unwrap_or_default();
        assert_eq!(
            body,
            r#"{"error":{"code":"busy","message":"all execution slots are in use"}}"#
        );
        let resp = busy.into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            resp.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        let file = ApiError::InputFile(WorkspaceError::Traversal {
            path: "../x".into(),
        });
        assert_eq!(
            (file.status().as_u16(), file.code()),
            (400, "path.traversal")
        );
        assert!(file.to_string().starts_with("files: "), "{file}");
        let quiet = ApiError::new(ErrorCode::ProfileForbidden, "no");
        assert!(quiet.retry_after().is_none());
    }
}

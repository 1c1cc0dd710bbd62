//! Why a workspace operation was refused or failed, with a stable code.

use corral_sys::Errno;

use super::paths::shown;
use crate::error::ErrorCode;

/// Why a workspace operation was refused or failed. Every variant carries
/// the caller's relative path (shortened if very long); [`code`] gives a
/// stable machine-readable string for API error bodies.
///
/// [`code`]: WorkspaceError::code
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The path starts with `/`.
    #[error("{path:?}: absolute paths are not allowed; give a path relative to the workspace")]
    Absolute {
        /// The path as given.
        path: String,
    },
    /// The path contains a `..` component or would leave the workspace.
    #[error("{path:?}: the path leaves the workspace (`..` is not allowed)")]
    Traversal {
        /// The path as given.
        path: String,
    },
    /// A symbolic link is on the path; workspace paths never follow one.
    #[error("{path:?}: a symbolic link is on the path; workspace paths never follow links")]
    Symlink {
        /// The path as given.
        path: String,
    },
    /// The first component is a reserved name.
    #[error("{path:?}: the name is reserved")]
    Reserved {
        /// The path as given.
        path: String,
    },
    /// The path is malformed (empty, NUL byte, too long, names a directory
    /// where a file is needed…).
    #[error("{path:?}: {reason}")]
    Invalid {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The file is larger than the cap.
    #[error("{path:?}: larger than the limit of {limit_bytes} bytes")]
    TooLarge {
        /// The path as given.
        path: String,
        /// The cap that was exceeded.
        limit_bytes: u64,
    },
    /// The path names something other than a regular file.
    #[error("{path:?}: not a regular file (a {kind})")]
    NotRegular {
        /// The path as given.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// Nothing exists at the path.
    #[error("{path:?}: no such file or directory")]
    NotFound {
        /// The path as given.
        path: String,
    },
    /// The workspace cap (or the filesystem) has no room for the write.
    #[error("{path:?}: the workspace is full{}", limit_note(*limit_bytes))]
    Full {
        /// The path as given.
        path: String,
        /// The per-workspace cap, when that is what was hit (`None`: the
        /// filesystem itself is full).
        limit_bytes: Option<u64>,
    },
    /// Any other system error.
    #[error("{path:?}: {op} failed: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// What corral was doing.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn limit_note(limit: Option<u64>) -> String {
    match limit {
        Some(n) => format!(" (limit {n} bytes)"),
        None => " (no space left on the filesystem)".to_owned(),
    }
}

impl WorkspaceError {
    /// The stable code answered to API callers: `path.absolute`,
    /// `path.traversal`, `path.symlink`, `path.reserved`, `path.invalid`,
    /// `file.too_large`, `file.not_regular`, `file.not_found`,
    /// `workspace.full` or `io`.
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkspaceError::Absolute { .. } => ErrorCode::PathAbsolute,
            WorkspaceError::Traversal { .. } => ErrorCode::PathTraversal,
            WorkspaceError::Symlink { .. } => ErrorCode::PathSymlink,
            WorkspaceError::Reserved { .. } => ErrorCode::PathReserved,
            WorkspaceError::Invalid { .. } => ErrorCode::PathInvalid,
            WorkspaceError::TooLarge { .. } => ErrorCode::FileTooLarge,
            WorkspaceError::NotRegular { .. } => ErrorCode::FileNotRegular,
            WorkspaceError::NotFound { .. } => ErrorCode::FileNotFound,
            WorkspaceError::Full { .. } => ErrorCode::WorkspaceFull,
            WorkspaceError::Io { .. } => ErrorCode::Io,
        }
    }

    /// The relative path the error is about, as the caller gave it.
    #[cfg(test)]
    pub fn path(&self) -> &str {
        match self {
            WorkspaceError::Absolute { path }
            | WorkspaceError::Traversal { path }
            | WorkspaceError::Symlink { path }
            | WorkspaceError::Reserved { path }
            | WorkspaceError::Invalid { path, .. }
            | WorkspaceError::TooLarge { path, .. }
            | WorkspaceError::NotRegular { path, .. }
            | WorkspaceError::NotFound { path }
            | WorkspaceError::Full { path, .. }
            | WorkspaceError::Io { path, .. } => path,
        }
    }
}

/// Maps an errno from resolving or using a workspace path to an error.
pub(super) fn sys_err(rel: &str, op: &'static str, e: Errno) -> WorkspaceError {
    let path = shown(rel);
    match e.0 {
        libc::ELOOP => WorkspaceError::Symlink { path },
        libc::EXDEV => WorkspaceError::Traversal { path },
        libc::ENOENT => WorkspaceError::NotFound { path },
        libc::ENOTDIR => WorkspaceError::Invalid {
            path,
            reason: "the path, or one of its parents, is not a directory",
        },
        libc::ENAMETOOLONG => WorkspaceError::Invalid {
            path,
            reason: "the path is too long",
        },
        libc::ENOSPC | libc::EDQUOT => WorkspaceError::Full {
            path,
            limit_bytes: None,
        },
        _ => WorkspaceError::Io {
            path,
            op,
            source: e.into(),
        },
    }
}

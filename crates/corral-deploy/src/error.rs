//! The one error type of a deployment, with stable codes.

use std::path::PathBuf;

/// Why a deployment did not happen. Every message says what, why and what
/// to do; [`DeployError::code`] is stable for scripts and tests. Whatever
/// the error, nothing was left behind: no half tree, no staging directory.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The source directory cannot be read or holds something corral will
    /// not copy.
    #[error("source {path}: {reason}")]
    Source {
        /// The source path, or the entry in it.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// No project pattern matched, or more than one runtime did.
    #[error("{0}")]
    Detect(String),
    /// No interpreter satisfies the project's constraints.
    #[error("{0}")]
    Python(String),
    /// A `package.json` script matched an argument deny pattern.
    #[error("package.json script `{script}` refused: {reason} (in `{text}`); corral re-checks build and install scripts before any phase runs. Remove the command from the script, or run the step yourself outside corral deploy")]
    ScriptDenied {
        /// The script's name (`postinstall`, `build`).
        script: String,
        /// The script text.
        text: String,
        /// The rule that matched.
        reason: String,
    },
    /// A dependency specification or requirements line was refused.
    #[error("{0}")]
    Dependency(String),
    /// No entry point could be resolved in the built tree.
    #[error("{0}")]
    Entry(String),
    /// The output path cannot be used.
    #[error("--out {path}: {reason}")]
    Out {
        /// The output path.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A flag or configuration value is invalid.
    #[error("{0}")]
    Config(String),
    /// corral refused a phase's sandbox, could not set it up, or a signal
    /// to corral interrupted its set-up: the phase's command never ran.
    #[error("{phase} phase: the sandbox did not run the phase ({code}): {message}")]
    Sandbox {
        /// `install` or `build`.
        phase: String,
        /// corral's error code (`limits.unenforceable`, `mount.invalid`,
        /// `run.interrupted`, ...).
        code: String,
        /// corral's message.
        message: String,
    },
    /// A phase ran and failed.
    #[error("{phase} phase failed ({how}); nothing was deployed. Its last output:\n{tail}")]
    Phase {
        /// `install` or `build`.
        phase: String,
        /// How it ended (`exit status 1`, `timed out after 120 s`).
        how: String,
        /// The end of its output.
        tail: String,
    },
    /// The tree took more disk space than `[deploy] max_tree_bytes`.
    #[error("{what} more than the tree's quota of {limit} bytes ([deploy] max_tree_bytes){seen}; nothing was deployed. If the tree really needs more, raise max_tree_bytes in [deploy] of the config or give --max-tree-bytes")]
    Quota {
        /// What passed it (`the install phase wrote`, `the source holds`).
        what: String,
        /// The quota.
        limit: u64,
        /// What was measured, as text (` (1234 bytes when it was stopped)`).
        seen: String,
    },
    /// A registry token was found where it must never be.
    #[error("{0}")]
    Credential(String),
    /// The source changed while it was being copied.
    #[error("source {0} changed while corral copied it; nothing was deployed. Deploy again once it is stable")]
    SourceChanged(PathBuf),
    /// A filesystem operation of corral's own failed.
    #[error("{what}: {err}")]
    Io {
        /// What corral was doing.
        what: String,
        /// The error.
        err: std::io::Error,
    },
}

impl DeployError {
    /// The stable code: `deploy.source`, `deploy.detect`, `deploy.python`,
    /// `deploy.script_denied`, `deploy.dependency`, `deploy.entry`,
    /// `deploy.out`, `deploy.config`, `deploy.sandbox`, `deploy.phase`,
    /// `deploy.quota`, `deploy.credential`,
    /// `deploy.source_changed`, `deploy.io`.
    pub fn code(&self) -> &'static str {
        match self {
            DeployError::Source { .. } => "deploy.source",
            DeployError::Detect(_) => "deploy.detect",
            DeployError::Python(_) => "deploy.python",
            DeployError::ScriptDenied { .. } => "deploy.script_denied",
            DeployError::Dependency(_) => "deploy.dependency",
            DeployError::Entry(_) => "deploy.entry",
            DeployError::Out { .. } => "deploy.out",
            DeployError::Config(_) => "deploy.config",
            DeployError::Sandbox { .. } => "deploy.sandbox",
            DeployError::Phase { .. } => "deploy.phase",
            DeployError::Quota { .. } => "deploy.quota",
            DeployError::Credential(_) => "deploy.credential",
            DeployError::SourceChanged(_) => "deploy.source_changed",
            DeployError::Io { .. } => "deploy.io",
        }
    }

    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> DeployError {
        DeployError::Io {
            what: what.into(),
            err,
        }
    }
}

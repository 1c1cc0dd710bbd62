//! Pure policy types for corral.
//!
//! Everything here is data and validation: what a sandbox may see, run and
//! receive. Nothing in this crate touches the kernel, so every rule can be
//! unit-tested and reviewed without root. The runtime turns a validated
//! [`Profile`] plus a request into a launch plan; the server (later) exposes
//! the same types over HTTP and MCP.
#![forbid(unsafe_code)]

pub mod audit;
pub mod builtin;
pub mod commands;
pub mod config;
pub mod env;
pub mod limits;
pub mod mcp_server;
pub mod network;
pub mod package;
pub mod path;
pub mod profile;
pub mod protect;
pub mod server;
pub mod shell;
pub mod size;

pub use audit::{AuditEvent, Level, ReasonCode};
pub use commands::{CommandDecision, CommandRejection};
pub use config::{Config, ConfigError, HostnameError};
pub use limits::{LimitError, RunLimit, NO_LIMIT};
pub use mcp_server::{
    LogLimits, McpRuntime, McpServer, ProcessMode, RestartPolicy, StartPolicy, ToolFilter,
};
pub use network::{Cidr, DomainRule, NetworkError, NetworkMode, NetworkPolicy};
pub use package::{PackageError, PackageKind, PackageSpec};
pub use path::{MountSpec, PathError, SandboxPath};
pub use profile::{
    CommandPolicy, EnvPolicy, Filesystem, Identity, LandlockMode, Limits, Profile, SeccompProfile,
    Security,
};
pub use protect::{ProtectEntry, ProtectError};
pub use server::{ServerConfig, Tenant};
pub use size::ByteSize;

//! One cgroup per sandbox: memory (swap included), pids and cpu limits,
//! whole-tree kill, and usage figures for the result.
//!
//! corral uses cgroup v2 where the host offers the controllers there and
//! falls back to v1 hierarchies where that is what the host has. On v1 a
//! sandbox gets a group only in the hierarchies its limits need (memory,
//! pids, cpu): no cpuacct group (CPU time comes from wait4) and no freezer
//! group (the pid namespace kills the tree, and the kill loop signals each
//! pid until none is left). The cpuacct and freezer hierarchies are still
//! searched by [`CgroupHost::sweep_stale`], for groups older corral
//! versions left there. Both paths are plain file operations on the
//! cgroup filesystem, so this module needs no `unsafe`.
//!
//! Layout: every sandbox gets `corral/<name>` below the cgroup mount (v2:
//! one directory, with the controllers enabled through
//! `cgroup.subtree_control` on the mount root and on `corral/`; v1: one
//! directory per hierarchy used). `corral/` itself is a permanent, empty
//! parent without limits, like a systemd slice. Names are
//! `<corral-pid>-<n>` ([`sandbox_group_name`]) so that the next corral can
//! tell which groups a killed corral left behind ([`CgroupHost::sweep_stale`]).
//!
//! Non-root use needs the administrator to delegate `corral/` (and, on v2,
//! to enable the controllers above it); moving a process into a group also
//! needs write access to the common ancestor's `cgroup.procs`, so in
//! practice non-root corral must itself run inside the delegated subtree.
//! [`CgroupHost::can_enforce`] says which limit cannot be enforced and why.

mod backend;
#[cfg(test)]
mod fake;
mod group;
mod host;
#[cfg(test)]
mod tests;
mod v1;
mod v2;

use backend::*;
pub use group::{CgroupEnforced, CgroupStats, SandboxCgroup};
use group::{GroupDir, StatFiles};
pub use host::CgroupHost;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The directory below each cgroup mount that holds corral's groups.
pub const BASE_DIR: &str = "corral";

/// How long [`SandboxCgroup::kill_all`] and [`SandboxCgroup::remove`] wait
/// for a group to empty: killed processes leave within milliseconds; one
/// stuck in uninterruptible sleep must not hang corral.
pub const EMPTY_WAIT: Duration = Duration::from_secs(1);

/// The cpu period corral uses, in microseconds (the kernel default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The smallest cpu limit the kernel accepts: a 1 ms quota per period.
pub const MIN_CPU_MILLICORES: u64 = 10;

/// Longest group name accepted.
const MAX_NAME_LEN: usize = 128;

/// Limits for one sandbox's cgroup. `None` leaves that resource unlimited
/// (on v2, memory and pids are still used for usage figures where
/// available; on v1 an unlimited resource gets no group).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CgroupLimits {
    /// Memory, swap included, in bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1000 = one full CPU).
    pub cpu_millicores: Option<u64>,
}

impl CgroupLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.pids.is_none() && self.cpu_millicores.is_none()
    }

    /// The limits that are set, as (limit name, controller, value).
    fn requested(&self) -> Vec<(&'static str, Controller, u64)> {
        let mut out = Vec::new();
        if let Some(v) = self.memory_bytes {
            out.push(("memory", Controller::Memory, v));
        }
        if let Some(v) = self.pids {
            out.push(("pids", Controller::Pids, v));
        }
        if let Some(v) = self.cpu_millicores {
            out.push(("cpu", Controller::Cpu, v));
        }
        out
    }

    /// Rejects values the kernel would refuse or that make no sense, so the
    /// error names the limit instead of a control file.
    fn validate(&self) -> Result<(), CgroupError> {
        let bad = |limit: &'static str, value: u64, reason: &'static str| {
            Err(CgroupError::InvalidLimit {
                limit,
                value,
                reason,
            })
        };
        if self.memory_bytes == Some(0) {
            return bad("memory", 0, "must be at least 1 byte");
        }
        if self.pids == Some(0) {
            return bad("pids", 0, "must be at least 1");
        }
        if let Some(m) = self.cpu_millicores {
            if m < MIN_CPU_MILLICORES {
                return bad(
                    "cpu",
                    m,
                    "is below the kernel's minimum of 10 millicores (1 ms per 100 ms period)",
                );
            }
            if cpu_quota_us(m).is_none() {
                return bad("cpu", m, "is too large");
            }
        }
        Ok(())
    }
}

/// The cpu quota in microseconds per [`CPU_PERIOD_US`] for `millicores`.
fn cpu_quota_us(millicores: u64) -> Option<u64> {
    millicores
        .checked_mul(CPU_PERIOD_US)
        .map(|q| q / 1000)
        .filter(|q| *q <= i64::MAX as u64 / 1000)
}

/// A cgroup controller corral uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    /// Memory limit, peak usage, OOM events.
    Memory,
    /// Process count limit.
    Pids,
    /// CPU bandwidth limit.
    Cpu,
    /// CPU usage accounting (v1 only; v2 has it in every group). corral
    /// makes no group in a cpuacct hierarchy of its own; it reads
    /// `cpuacct.usage` only where cpuacct is co-mounted with a limited
    /// cpu. The sweep still removes cpuacct groups of older versions.
    Cpuacct,
    /// Freezing a group so a kill cannot race with fork (v1 only; v2 has
    /// `cgroup.kill`). corral makes no freezer groups; it freezes only the
    /// stale groups of older versions that the sweep finds there.
    Freezer,
}

impl Controller {
    /// Every controller corral knows, in the order groups are created.
    pub const ALL: [Controller; 5] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Freezer,
    ];

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }

    /// The controller the kernel calls `name`, if corral uses it.
    pub fn from_name(name: &str) -> Option<Controller> {
        Controller::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Which cgroup version corral uses on this host, and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// The unified hierarchy.
    V2 {
        /// Where cgroup2 is mounted (e.g. `/sys/fs/cgroup`).
        mount: PathBuf,
        /// The controllers the mount root offers (its `cgroup.controllers`,
        /// every name, also ones corral does not use).
        controllers: Vec<String>,
    },
    /// Legacy per-controller hierarchies.
    V1 {
        /// Where each controller corral uses is mounted; co-mounted
        /// controllers (`cpu,cpuacct`) share a path.
        mounts: BTreeMap<Controller, PathBuf>,
    },
}

impl Version {
    /// `"v1"` or `"v2"`, as reported in results.
    pub fn label(&self) -> &'static str {
        match self {
            Version::V2 { .. } => "v2",
            Version::V1 { .. } => "v1",
        }
    }
}

/// Why a cgroup operation failed. Messages name the file, the value and
/// the limit concerned.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `/proc/self/mountinfo` or `/proc/self/cgroup` had a line that does
    /// not parse.
    #[error("malformed {file} line {line}: {text:?}")]
    Parse {
        /// Which file.
        file: &'static str,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// No cgroup filesystem corral could use is mounted.
    #[error(
        "no cgroup filesystem is mounted (neither cgroup2 nor a v1 memory, pids or cpu hierarchy in /proc/self/mountinfo)"
    )]
    NotMounted,
    /// A group name with characters other than `[A-Za-z0-9_-]`.
    #[error("invalid cgroup name {name:?}: use 1 to 128 letters, digits, '_' or '-'")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// A limit value that cannot be enforced as given.
    #[error("{limit} limit {value} {reason}")]
    InvalidLimit {
        /// `memory`, `pids` or `cpu`.
        limit: &'static str,
        /// The value.
        value: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A limit this host cannot enforce for the current user.
    #[error("{limit} limit needs the {controller} controller: {reason}")]
    Unavailable {
        /// `memory`, `pids` or `cpu`.
        limit: &'static str,
        /// The controller it needs.
        controller: &'static str,
        /// Why it is not available.
        reason: String,
    },
    /// Creating a group directory failed.
    #[error("cannot create cgroup {}: {source}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Writing a control file failed.
    #[error("cannot write {value:?} to {}: {source}", path.display())]
    Write {
        /// The control file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The OS error.
        source: io::Error,
    },
    /// cgroup v2 refuses to enable controllers below a group that has
    /// processes of its own.
    #[error(
        "cannot enable the {controller} controller below {}: it has processes of its own (cgroup v2 no-internal-processes rule); run corral in a child cgroup, e.g. with systemd Delegate=yes",
        path.display()
    )]
    InternalProcesses {
        /// The group whose `cgroup.subtree_control` refused.
        path: PathBuf,
        /// The controller.
        controller: &'static str,
    },
    /// Processes were still in the group after killing and waiting.
    #[error("cgroup {} still has processes {pids:?} after {waited_ms} ms", path.display())]
    Busy {
        /// The group.
        path: PathBuf,
        /// The pids still listed.
        pids: Vec<i32>,
        /// How long corral waited.
        waited_ms: u64,
    },
    /// Removing a group directory failed.
    #[error("cannot remove cgroup {}: {source}", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Returns a fresh group name for this process: `<pid>-<n>`.
pub fn sandbox_group_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Checks that `name` is a single safe path component.
pub fn validate_name(name: &str) -> Result<(), CgroupError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidName {
            name: name.to_string(),
        })
    }
}

/// The corral pid encoded in a group name `<pid>-<n>`, if it is one.
fn owner_pid(name: &str) -> Option<i32> {
    let (pid, n) = name.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(pid) || !all_digits(n) {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

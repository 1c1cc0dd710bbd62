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

mod v1;
mod v2;

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

/// Where cgroups live on this host and who is asking.
#[derive(Debug, Clone)]
pub struct CgroupHost {
    version: Version,
    /// Mount points (full paths) mounted read-only.
    read_only: BTreeSet<PathBuf>,
    /// This process's own cgroups from `/proc/self/cgroup`: controller list
    /// (empty for v2) -> path. For messages.
    own: Vec<(String, String)>,
    euid: u32,
    egid: u32,
    groups: Vec<u32>,
    backend: Backend,
}

/// One cgroup filesystem mount from mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupMount {
    mount_point: PathBuf,
    v2: bool,
    /// v1: the controllers corral uses that this hierarchy carries.
    controllers: Vec<Controller>,
    read_only: bool,
}

/// Decodes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mounts in `mountinfo` that are visible: not hidden by a later
/// mount on the same path or on an ancestor path (one that is not itself
/// below it in the mount tree).
fn parse_mountinfo(mountinfo: &str) -> Result<Vec<CgroupMount>, CgroupError> {
    // Every mount: (id, parent id, mount point); and the cgroup ones.
    let mut all: Vec<(u64, u64, PathBuf)> = Vec::new();
    let mut cgroups: Vec<(usize, CgroupMount)> = Vec::new();
    for (i, line) in mountinfo.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let malformed = || CgroupError::Parse {
            file: "/proc/self/mountinfo",
            line: i + 1,
            text: line.chars().take(200).collect(),
        };
        let (left, right) = line.split_once(" - ").ok_or_else(malformed)?;
        let fields: Vec<&str> = left.split(' ').collect();
        if fields.len() < 6 {
            return Err(malformed());
        }
        let id: u64 = fields[0].parse().map_err(|_| malformed())?;
        let parent: u64 = fields[1].parse().map_err(|_| malformed())?;
        let mount_point = PathBuf::from(unescape_mount_path(fields[4]));
        let mount_opts = fields[5];
        let rest: Vec<&str> = right.split(' ').collect();
        if rest.len() < 3 {
            return Err(malformed());
        }
        let (fstype, super_opts) = (rest[0], rest[2]);
        all.push((id, parent, mount_point.clone()));
        let v2 = fstype == "cgroup2";
        if !v2 && fstype != "cgroup" {
            continue;
        }
        let controllers = if v2 {
            Vec::new()
        } else {
            super_opts
                .split(',')
                .filter_map(Controller::from_name)
                .collect()
        };
        let read_only =
            mount_opts.split(',').any(|o| o == "ro") || super_opts.split(',').any(|o| o == "ro");
        cgroups.push((
            all.len() - 1,
            CgroupMount {
                mount_point,
                v2,
                controllers,
                read_only,
            },
        ));
    }
    // The ids of the mounts a mount sits on, up to the root.
    let ancestors = |pos: usize| {
        let mut ids = Vec::new();
        let mut parent = all[pos].1;
        while ids.len() < all.len() && !ids.contains(&parent) {
            ids.push(parent);
            match all.iter().find(|(id, _, _)| *id == parent) {
                Some((_, next, _)) => parent = *next,
                None => break,
            }
        }
        ids
    };
    Ok(cgroups
        .into_iter()
        .filter(|(pos, m)| {
            let below = ancestors(*pos);
            !all[pos + 1..]
                .iter()
                .any(|(id, _, point)| m.mount_point.starts_with(point) && !below.contains(id))
        })
        .map(|(_, m)| m)
        .collect())
}

/// `/proc/self/cgroup` as (controller list, path) pairs.
fn parse_self_cgroup(text: &str) -> Result<Vec<(String, String)>, CgroupError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(_), Some(ctrls), Some(path)) => out.push((ctrls.to_string(), path.to_string())),
            _ => {
                return Err(CgroupError::Parse {
                    file: "/proc/self/cgroup",
                    line: i + 1,
                    text: line.chars().take(200).collect(),
                })
            }
        }
    }
    Ok(out)
}

/// `path` with `root` prepended (`root` is `/` outside tests).
fn under_root(root: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix("/") {
        Ok(rel) => root.join(rel),
        Err(_) => root.join(path),
    }
}

/// The effective gid and supplementary groups of this process, from
/// `/proc/self/status` (no syscall wrapper needed).
fn own_groups() -> (u32, Vec<u32>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut egid = u32::MAX;
    let mut groups = Vec::new();
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Gid:") {
            egid = rest
                .split_whitespace()
                .nth(1)
                .and_then(|g| g.parse().ok())
                .unwrap_or(u32::MAX);
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = rest
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        }
    }
    (egid, groups)
}

impl CgroupHost {
    /// Discovers the host's cgroups from `/proc/self/mountinfo` and
    /// `/proc/self/cgroup`.
    pub fn detect() -> Result<CgroupHost, CgroupError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).map_err(|source| CgroupError::Read {
                path: PathBuf::from(p),
                source,
            })
        };
        let mountinfo = read("/proc/self/mountinfo")?;
        let self_cgroup = read("/proc/self/cgroup")?;
        CgroupHost::from_mountinfo(&mountinfo, &self_cgroup)
    }

    /// Like [`CgroupHost::detect`], from given file contents. Reads the
    /// cgroup2 root's `cgroup.controllers`.
    pub fn from_mountinfo(
        mountinfo: &str,
        proc_self_cgroup: &str,
    ) -> Result<CgroupHost, CgroupError> {
        CgroupHost::from_mountinfo_at(Path::new("/"), mountinfo, proc_self_cgroup)
    }

    /// Like [`CgroupHost::from_mountinfo`], with every mount point taken
    /// relative to `root` (a directory that fakes the host in tests).
    pub fn from_mountinfo_at(
        root: &Path,
        mountinfo: &str,
        proc_self_cgroup: &str,
    ) -> Result<CgroupHost, CgroupError> {
        let mounts = parse_mountinfo(mountinfo)?;
        let own = parse_self_cgroup(proc_self_cgroup)?;
        let mut read_only = BTreeSet::new();
        // cgroup2: prefer the one at /sys/fs/cgroup, then /sys/fs/cgroup/unified.
        let mut v2: Option<&CgroupMount> = None;
        let mut v1: BTreeMap<Controller, &CgroupMount> = BTreeMap::new();
        for m in &mounts {
            if m.v2 {
                let rank = |p: &Path| match p.to_str() {
                    Some("/sys/fs/cgroup") => 0,
                    Some("/sys/fs/cgroup/unified") => 1,
                    _ => 2,
                };
                if v2.is_none_or(|cur| rank(&m.mount_point) < rank(&cur.mount_point)) {
                    v2 = Some(m);
                }
            } else {
                for c in &m.controllers {
                    v1.entry(*c).or_insert(m);
                }
            }
        }
        let limiting = [Controller::Memory, Controller::Pids, Controller::Cpu];
        let v2_version = match v2 {
            Some(m) => {
                let mount = under_root(root, &m.mount_point);
                let file = mount.join("cgroup.controllers");
                let text = std::fs::read_to_string(&file)
                    .map_err(|source| CgroupError::Read { path: file, source })?;
                let controllers: Vec<String> =
                    text.split_whitespace().map(str::to_string).collect();
                let covered = limiting
                    .iter()
                    .filter(|c| controllers.iter().any(|n| n == c.name()))
                    .count();
                if m.read_only {
                    read_only.insert(mount.clone());
                }
                Some((covered, Version::V2 { mount, controllers }))
            }
            None => None,
        };
        let v1_covered = limiting.iter().filter(|c| v1.contains_key(c)).count();
        // Whichever version carries more of memory, pids and cpu; v2 on a tie.
        let version = match v2_version {
            Some((covered, version)) if covered >= v1_covered => version,
            _ if v1_covered > 0 => {
                let mut map = BTreeMap::new();
                for (c, m) in v1 {
                    let path = under_root(root, &m.mount_point);
                    if m.read_only {
                        read_only.insert(path.clone());
                    }
                    map.insert(c, path);
                }
                Version::V1 { mounts: map }
            }
            _ => return Err(CgroupError::NotMounted),
        };
        let (_, euid) = corral_sys::process::uids();
        let (egid, groups) = own_groups();
        Ok(CgroupHost {
            version,
            read_only,
            own,
            euid,
            egid,
            groups,
            backend: Backend::Kernel,
        })
    }

    /// The version in use and where it is mounted.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The cgroup this process is in, as `/proc/self/cgroup` shows it for
    /// the hierarchy corral uses for `controller` (v2: the unified one).
    pub fn own_cgroup(&self, controller: Controller) -> Option<&str> {
        let wanted = match self.version {
            Version::V2 { .. } => None,
            Version::V1 { .. } => Some(controller.name()),
        };
        self.own
            .iter()
            .find(|(ctrls, _)| match wanted {
                None => ctrls.is_empty(),
                Some(w) => ctrls.split(',').any(|c| c == w),
            })
            .map(|(_, p)| p.as_str())
    }

    /// Whether the current user may create groups below `mount`: the
    /// mount is writable and so is `corral/` (or the mount root, when
    /// `corral/` does not exist yet). On v2, `cgroup.subtree_control` must
    /// be writable too. A failure reason otherwise.
    fn write_access(&self, mount: &Path, controller: Controller) -> Result<(), String> {
        let v2 = matches!(self.version, Version::V2 { .. });
        if self.read_only.contains(mount) {
            return Err(format!("{} is mounted read-only", mount.display()));
        }
        if self.euid == 0 {
            return Ok(());
        }
        let base = mount.join(BASE_DIR);
        let dir = if base.exists() {
            base.clone()
        } else {
            mount.to_path_buf()
        };
        let mut needed = vec![dir.clone()];
        if v2 {
            needed.push(dir.join("cgroup.subtree_control"));
        }
        for p in needed {
            if !self.may_write(&p) {
                let where_ = self
                    .own_cgroup(controller)
                    .map(|p| format!("; corral runs in cgroup {p}"))
                    .unwrap_or_default();
                return Err(format!(
                    "corral cannot write {} (not root, no delegation{where_})",
                    base.display()
                ));
            }
        }
        Ok(())
    }

    /// Permission-bit check of write access for the current (non-root) user.
    fn may_write(&self, path: &Path) -> bool {
        let Ok(md) = std::fs::metadata(path) else {
            return false;
        };
        let mode = md.mode();
        if md.uid() == self.euid {
            mode & 0o200 != 0
        } else if md.gid() == self.egid || self.groups.contains(&md.gid()) {
            mode & 0o020 != 0
        } else {
            mode & 0o002 != 0
        }
    }

    /// Whether this host can enforce every limit in `limits` for the
    /// current user: the controller exists (v2: offered by the mount root;
    /// v1: its hierarchy is mounted) and the hierarchy is writable (root,
    /// or a delegated `corral/`). The error names the limit, the
    /// controller and why.
    pub fn can_enforce(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        limits.validate()?;
        for (limit, controller, _) in limits.requested() {
            let unavailable = |reason: String| CgroupError::Unavailable {
                limit,
                controller: controller.name(),
                reason,
            };
            match &self.version {
                Version::V2 { mount, controllers } => {
                    let offered = controllers.iter().any(|c| c == controller.name());
                    let access = self.write_access(mount, controller);
                    if offered && access.is_ok() {
                        continue;
                    }
                    let mut reason = format!(
                        "cgroup v2 at {} has controllers [{}]",
                        mount.display(),
                        controllers.join(" ")
                    );
                    if let Err(why) = access {
                        reason.push_str(" and ");
                        reason.push_str(&why);
                    }
                    return Err(unavailable(reason));
                }
                Version::V1 { mounts } => match mounts.get(&controller) {
                    None => {
                        let have: Vec<&str> = mounts.keys().map(|c| c.name()).collect();
                        return Err(unavailable(format!(
                            "cgroup v1 has no {} hierarchy mounted (mounted: [{}])",
                            controller.name(),
                            have.join(" ")
                        )));
                    }
                    Some(mount) => {
                        if let Err(why) = self.write_access(mount, controller) {
                            return Err(unavailable(format!("cgroup v1: {why}")));
                        }
                    }
                },
            }
        }
        Ok(())
    }

    /// Creates the sandbox's group(s) `corral/<name>` and writes `limits`.
    ///
    /// v2: one directory, with memory and pids (when offered) and cpu (when
    /// limited) enabled through `cgroup.subtree_control` at the mount root
    /// and at `corral/`; `memory.swap.max` is 0 so the memory limit
    /// includes swap, and `memory.oom.group` is 1 so an OOM kills the whole
    /// sandbox. v1: one directory in each hierarchy a set limit needs
    /// (memory, pids, cpu) and none in the others, so no limits means no
    /// directory; the memory limit is also written to
    /// `memory.memsw.limit_in_bytes` when swap accounting exists. Nothing
    /// is left behind on error.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<SandboxCgroup, CgroupError> {
        validate_name(name)?;
        self.can_enforce(limits)?;
        match &self.version {
            Version::V2 { mount, controllers } => {
                v2::create(&self.backend, mount, controllers, name, limits)
            }
            Version::V1 { mounts } => v1::create(&self.backend, mounts, name, limits),
        }
    }

    /// The group directories of `name`, wherever they exist.
    fn existing_group(&self, name: &str) -> Option<SandboxCgroup> {
        let dirs: Vec<GroupDir> = match &self.version {
            Version::V2 { mount, .. } => vec![GroupDir {
                path: mount.join(BASE_DIR).join(name),
                controllers: Vec::new(),
            }],
            Version::V1 { mounts } => v1::hierarchies(mounts)
                .into_iter()
                .map(|(mount, controllers)| GroupDir {
                    path: mount.join(BASE_DIR).join(name),
                    controllers,
                })
                .collect(),
        };
        let dirs: Vec<GroupDir> = dirs.into_iter().filter(|d| d.path.is_dir()).collect();
        if dirs.is_empty() {
            return None;
        }
        Some(SandboxCgroup {
            v2: matches!(self.version, Version::V2 { .. }),
            dirs,
            enforced: CgroupEnforced::none(self.version.label()),
            backend: self.backend.clone(),
            done: false,
        })
    }

    /// Removes the groups under `corral/` that a killed corral left
    /// behind: those named `<pid>-<n>` whose pid is not alive. Their
    /// processes are killed first. On v1 every hierarchy is searched,
    /// including cpuacct and freezer, where older corral versions made
    /// groups too. Returns how many groups were removed.
    ///
    /// Aliveness is judged in this process's pid namespace; corral
    /// instances in different pid namespaces must not share a cgroup
    /// hierarchy.
    pub fn sweep_stale(&self) -> usize {
        let bases: Vec<PathBuf> = match &self.version {
            Version::V2 { mount, .. } => vec![mount.join(BASE_DIR)],
            Version::V1 { mounts } => v1::hierarchies(mounts)
                .into_iter()
                .map(|(m, _)| m.join(BASE_DIR))
                .collect(),
        };
        let mut names = BTreeSet::new();
        for base in bases {
            let Ok(entries) = std::fs::read_dir(&base) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Some(name) = entry.file_name().to_str() {
                    names.insert(name.to_string());
                }
            }
        }
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        let mut removed = 0;
        for name in names {
            let Some(pid) = owner_pid(&name) else {
                continue;
            };
            if pid == me || process_alive(pid) {
                continue;
            }
            if let Some(group) = self.existing_group(&name) {
                if group.remove().is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// Whether `pid` exists in this pid namespace.
fn process_alive(pid: i32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// One directory of a sandbox's group.
#[derive(Debug, Clone)]
struct GroupDir {
    path: PathBuf,
    /// v1: the controllers of its hierarchy; v2: the ones enabled.
    controllers: Vec<Controller>,
}

/// What was enforced, for the result's `enforced` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupEnforced {
    /// `"v1"` or `"v2"`.
    pub version: &'static str,
    /// Controllers a limit was written to.
    pub controllers: Vec<&'static str>,
    /// The memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Whether the memory limit covers swap too.
    pub memory_includes_swap: bool,
    /// The pids limit.
    pub pids: Option<u64>,
    /// The cpu limit in millicores.
    pub cpu_millicores: Option<u64>,
    /// Caveats, e.g. swap not covered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl CgroupEnforced {
    fn none(version: &'static str) -> Self {
        CgroupEnforced {
            version,
            controllers: Vec::new(),
            memory_bytes: None,
            memory_includes_swap: false,
            pids: None,
            cpu_millicores: None,
            notes: Vec::new(),
        }
    }
}

/// Usage figures of a sandbox's group. `None` where the host does not
/// provide the figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CgroupStats {
    /// Peak memory use in bytes (v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`).
    pub peak_memory_bytes: Option<u64>,
    /// Whether the kernel OOM-killed a process of the group.
    pub oom_killed: bool,
    /// CPU time used by the group in nanoseconds (v2; v1 only where
    /// cpuacct is co-mounted with a limited cpu).
    pub cpu_usage_ns: Option<u64>,
    /// Most processes at once (`pids.peak`).
    pub pids_peak: Option<u64>,
    /// Whether a fork failed because of the pids limit.
    pub pids_limit_hit: bool,
}

/// A sandbox's cgroup. Removed (processes killed, directories deleted)
/// by [`SandboxCgroup::remove`] or, best effort, when dropped.
#[derive(Debug)]
pub struct SandboxCgroup {
    v2: bool,
    dirs: Vec<GroupDir>,
    enforced: CgroupEnforced,
    backend: Backend,
    done: bool,
}

impl SandboxCgroup {
    /// The group's directories (one on v2, one per hierarchy on v1), e.g.
    /// for `CLONE_INTO_CGROUP`.
    pub fn paths(&self) -> Vec<&Path> {
        self.dirs.iter().map(|d| d.path.as_path()).collect()
    }

    /// Moves `pid` into every hierarchy of this group. Call it for the
    /// sandbox helper before it forks anything, so every descendant starts
    /// inside.
    pub fn add_process(&self, pid: i32) -> Result<(), CgroupError> {
        if pid <= 0 {
            return Err(CgroupError::Write {
                path: self
                    .dirs
                    .first()
                    .map(|d| d.path.join("cgroup.procs"))
                    .unwrap_or_default(),
                value: pid.to_string(),
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        for dir in &self.dirs {
            write_file(
                &self.backend,
                &dir.path.join("cgroup.procs"),
                &pid.to_string(),
            )?;
        }
        Ok(())
    }

    /// The pids listed in the group's `cgroup.procs`, over all hierarchies.
    pub fn pids(&self) -> Vec<i32> {
        let mut all = BTreeSet::new();
        for dir in &self.dirs {
            all.extend(read_pids(&self.backend, &dir.path));
        }
        all.into_iter().collect()
    }

    /// Kills every process in the group and waits (up to [`EMPTY_WAIT`])
    /// until it is empty. v2: `cgroup.kill` when present, else SIGKILL each
    /// listed pid until none is left; v1: SIGKILL each listed pid until
    /// none is left (a stale group of an older version that has a freezer
    /// directory is frozen, killed and thawed first).
    pub fn kill_all(&self) {
        self.kill_until(Instant::now() + EMPTY_WAIT);
    }

    fn kill_until(&self, deadline: Instant) {
        if self.v2 {
            v2::kill(&self.backend, &self.dirs);
        } else {
            v1::kill(&self.backend, &self.dirs);
        }
        let mut pause = Duration::from_millis(1);
        loop {
            let left = self.pids();
            if left.is_empty() || Instant::now() >= deadline {
                return;
            }
            self.kill_members(&left);
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Sends SIGKILL to each of `listed` that is still a member. A pid read
    /// from `cgroup.procs` may belong to a process that has exited since,
    /// and the number to an unrelated host process by the time it is
    /// signalled (corral often runs as root). So each pid is first pinned
    /// with a pidfd (pidfd_open(2): it keeps naming that process), then the
    /// group is listed again, and only pidfds whose pid is still listed are
    /// signalled (pidfd_send_signal(2)). A pid reused between the two
    /// listings leaves a pidfd to the process that exited, which ESRCH
    /// makes harmless. Kernels without pidfds (before 5.3) get kill(2).
    fn kill_members(&self, listed: &[i32]) {
        let mut pinned = Vec::with_capacity(listed.len());
        for &pid in listed {
            match corral_sys::process::pidfd_open(pid) {
                Ok(fd) => pinned.push((pid, fd)),
                Err(corral_sys::Errno(libc::ENOSYS)) => {
                    let _ = corral_sys::process::kill(pid, libc::SIGKILL);
                }
                // Gone already (ESRCH): nothing to kill.
                Err(_) => {}
            }
        }
        if pinned.is_empty() {
            return;
        }
        let members: BTreeSet<i32> = self.pids().into_iter().collect();
        for (pid, fd) in &pinned {
            if members.contains(pid) {
                let _ = corral_sys::process::pidfd_send_signal(fd, libc::SIGKILL);
            }
        }
    }

    /// Usage figures: peak memory, OOM kill, cpu time, peak process count.
    pub fn stats(&self) -> CgroupStats {
        if self.v2 {
            v2::stats(&self.backend, &self.dirs)
        } else {
            v1::stats(&self.backend, &self.dirs)
        }
    }

    /// What was enforced: version and the controllers with limits written.
    pub fn enforced(&self) -> CgroupEnforced {
        self.enforced.clone()
    }

    /// Kills leftovers (skipped when the group has no processes any
    /// more, the usual case), waits (up to [`EMPTY_WAIT`]) until the group
    /// is empty and removes every directory.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_inner()
    }

    fn remove_inner(&mut self) -> Result<(), CgroupError> {
        if self.done {
            return Ok(());
        }
        // Whatever happens, Drop does not try again.
        self.done = true;
        let start = Instant::now();
        let deadline = start + EMPTY_WAIT;
        // The usual case: the pid namespace is gone and so is every process.
        if !self.pids().is_empty() {
            self.kill_until(deadline);
        }
        let mut first_err = None;
        // Leaf first does not matter (no children), but the order is fixed
        // for predictable errors.
        for dir in &self.dirs {
            let mut pause = Duration::from_millis(1);
            loop {
                match self.backend.rmdir(&dir.path) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(20));
                    }
                    Err(e) => {
                        let pids = read_pids(&self.backend, &dir.path);
                        let err = if e.raw_os_error() == Some(libc::EBUSY) && !pids.is_empty() {
                            CgroupError::Busy {
                                path: dir.path.clone(),
                                pids,
                                waited_ms: start.elapsed().as_millis() as u64,
                            }
                        } else {
                            CgroupError::Remove {
                                path: dir.path.clone(),
                                source: e,
                            }
                        };
                        first_err.get_or_insert(err);
                        break;
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        let _ = self.remove_inner();
    }
}

/// Writes one value to a control file (never creating it).
fn write_file(backend: &Backend, path: &Path, value: &str) -> Result<(), CgroupError> {
    backend
        .write(path, value)
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        })
}

/// Reads a control file, `None` when absent or unreadable (usage figures
/// are best effort).
fn read_opt(backend: &Backend, path: &Path) -> Option<String> {
    backend.read(path).ok()
}

/// Reads a file holding one number.
fn read_u64(backend: &Backend, path: &Path) -> Option<u64> {
    read_opt(backend, path)?.trim().parse().ok()
}

/// The value of `key` in a flat-keyed file (`key value` lines).
fn keyed_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

/// The pids in `dir/cgroup.procs`.
fn read_pids(backend: &Backend, dir: &Path) -> Vec<i32> {
    read_opt(backend, &dir.join("cgroup.procs"))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates a directory, treating "already exists" as success.
fn ensure_dir(backend: &Backend, path: &Path) -> Result<(), CgroupError> {
    match backend.mkdir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The file operations that touch the cgroup filesystem. The kernel
/// outside tests; in tests, a fake that emulates what the kernel does on
/// mkdir, write and rmdir.
#[derive(Debug, Clone)]
enum Backend {
    Kernel,
    #[cfg(test)]
    Fake(std::sync::Arc<fake::FakeKernel>),
}

impl Backend {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        match self {
            Backend::Kernel => std::fs::create_dir(path),
            #[cfg(test)]
            Backend::Fake(k) => k.mkdir(path),
        }
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        match self {
            Backend::Kernel => std::fs::remove_dir(path),
            #[cfg(test)]
            Backend::Fake(k) => k.rmdir(path),
        }
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        match self {
            Backend::Kernel => {
                // Control files exist or the kernel does not support the
                // knob: never create one. One write(2) per value.
                let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.write_all(value.as_bytes())
            }
            #[cfg(test)]
            Backend::Fake(k) => k.write(path, value),
        }
    }

    fn read(&self, path: &Path) -> io::Result<String> {
        match self {
            Backend::Kernel => std::fs::read_to_string(path),
            #[cfg(test)]
            Backend::Fake(k) => k.read(path),
        }
    }
}

/// A fake cgroup filesystem in a temporary directory, emulating the kernel
/// where plain files would not: mkdir creates the interface files, writes
/// to `cgroup.subtree_control`, `cgroup.procs`, `cgroup.kill`,
/// `freezer.state` and the v1 memory limits behave as in the kernel,
/// `cgroup.procs` lists only live processes, and rmdir succeeds only on an
/// empty group.
#[cfg(test)]
pub(crate) mod fake {
    use super::{under_root, Controller};
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A temporary directory removed on drop.
    pub struct TestDir(pub PathBuf);

    impl TestDir {
        pub fn new(tag: &str) -> TestDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "corral-cgroup-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TestDir(p)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// What the fake kernel supports.
    #[derive(Debug, Clone)]
    pub struct FakeKernel {
        /// v2 mount (full path), if any.
        pub v2_mount: Option<PathBuf>,
        /// v1 hierarchies (full path, controllers).
        pub v1: Vec<(PathBuf, Vec<Controller>)>,
        /// v2 groups have `cgroup.kill` (Linux 5.14+).
        pub cgroup_kill: bool,
        /// Swap accounting: v2 `memory.swap.max`, v1 `memory.memsw.*`.
        pub swap: bool,
    }

    fn io_err(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    /// A child process killed and reaped on drop.
    pub struct Guard(pub std::process::Child);

    impl Guard {
        /// A `sleep 30`.
        pub fn sleep() -> Guard {
            Guard(
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap(),
            )
        }

        pub fn pid(&self) -> i32 {
            self.0.id() as i32
        }

        /// Waits up to `secs` for the exit; the signal that ended it.
        pub fn wait_signal(&mut self, secs: u64) -> Option<i32> {
            use std::os::unix::process::ExitStatusExt;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
            while std::time::Instant::now() < deadline {
                if let Some(status) = self.0.try_wait().unwrap() {
                    return status.signal();
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            None
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Whether `pid` is a live (not zombie) process.
    pub fn live(pid: i32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        !matches!(state, Some("Z") | Some("X") | None)
    }

    fn put(dir: &Path, name: &str, content: &str) {
        let _ = std::fs::write(dir.join(name), content);
    }

    impl FakeKernel {
        /// A pure v2 host below `root` offering `controllers`; returns the
        /// kernel, mountinfo and /proc/self/cgroup texts.
        pub fn v2(
            root: &Path,
            controllers: &[&str],
            cgroup_kill: bool,
            swap: bool,
        ) -> (FakeKernel, String, String) {
            let mount = under_root(root, Path::new("/sys/fs/cgroup"));
            std::fs::create_dir_all(&mount).unwrap();
            put(
                &mount,
                "cgroup.controllers",
                &format!("{}\n", controllers.join(" ")),
            );
            put(&mount, "cgroup.subtree_control", "\n");
            put(&mount, "cgroup.procs", "");
            put(&mount, "cgroup.root", "");
            let mountinfo = "\
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
            (
                FakeKernel {
                    v2_mount: Some(mount),
                    v1: Vec::new(),
                    cgroup_kill,
                    swap,
                },
                mountinfo.to_string(),
                "0::/user.slice/user-1000.slice/session-1.scope\n".to_string(),
            )
        }

        /// A v1 host below `root` with the given hierarchies (directory
        /// name under /sys/fs/cgroup, controllers); returns the kernel,
        /// mountinfo and /proc/self/cgroup texts.
        pub fn v1(
            root: &Path,
            hierarchies: &[(&str, &[Controller])],
            swap: bool,
        ) -> (FakeKernel, String, String) {
            let mut mountinfo =
                String::from("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n");
            let mut self_cgroup = String::new();
            let mut v1 = Vec::new();
            for (i, (dir, ctrls)) in hierarchies.iter().enumerate() {
                let path = under_root(root, &Path::new("/sys/fs/cgroup").join(dir));
                std::fs::create_dir_all(&path).unwrap();
                put(&path, "cgroup.procs", "");
                put(&path, "tasks", "");
                let names: Vec<&str> = ctrls.iter().map(|c| c.name()).collect();
                mountinfo.push_str(&format!(
                    "{} 31 0:{} / /sys/fs/cgroup/{dir} rw,relatime - cgroup cgroup rw,{}\n",
                    32 + i,
                    29 + i,
                    names.join(",")
                ));
                self_cgroup.push_str(&format!("{}:{}:/\n", i + 1, names.join(",")));
                v1.push((path, ctrls.to_vec()));
            }
            self_cgroup.push_str("0::/\n");
            (
                FakeKernel {
                    v2_mount: None,
                    v1,
                    cgroup_kill: false,
                    swap,
                },
                mountinfo,
                self_cgroup,
            )
        }

        fn is_v2(&self, path: &Path) -> bool {
            self.v2_mount.as_ref().is_some_and(|m| path.starts_with(m))
        }

        fn v1_controllers(&self, path: &Path) -> Vec<Controller> {
            self.v1
                .iter()
                .find(|(m, _)| path.starts_with(m))
                .map(|(_, c)| c.clone())
                .unwrap_or_default()
        }

        pub fn mkdir(&self, path: &Path) -> io::Result<()> {
            std::fs::create_dir(path)?;
            let parent = path.parent().unwrap_or(path);
            put(path, "cgroup.procs", "");
            if self.is_v2(path) {
                let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control"))?;
                let enabled: Vec<&str> = enabled.split_whitespace().collect();
                put(
                    path,
                    "cgroup.controllers",
                    &format!("{}\n", enabled.join(" ")),
                );
                put(path, "cgroup.subtree_control", "\n");
                put(path, "cgroup.type", "domain\n");
                put(path, "cgroup.events", "populated 0\nfrozen 0\n");
                put(
                    path,
                    "cpu.stat",
                    "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
                );
                if self.cgroup_kill {
                    put(path, "cgroup.kill", "");
                }
                for c in enabled {
                    match c {
                        "memory" => {
                            put(path, "memory.max", "max\n");
                            put(path, "memory.current", "0\n");
                            put(path, "memory.peak", "0\n");
                            put(path, "memory.oom.group", "0\n");
                            put(
                                path,
                                "memory.events",
                                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                            );
                            if self.swap {
                                put(path, "memory.swap.max", "max\n");
                            }
                        }
                        "pids" => {
                            put(path, "pids.max", "max\n");
                            put(path, "pids.current", "0\n");
                            put(path, "pids.peak", "0\n");
                            put(path, "pids.events", "max 0\n");
                        }
                        "cpu" => {
                            put(path, "cpu.max", "max 100000\n");
                            put(path, "cpu.weight", "100\n");
                        }
                        _ => {}
                    }
                }
            } else {
                put(path, "tasks", "");
                put(path, "notify_on_release", "0\n");
                for c in self.v1_controllers(path) {
                    match c {
                        Controller::Memory => {
                            put(path, "memory.limit_in_bytes", "9223372036854771712\n");
                            put(path, "memory.max_usage_in_bytes", "0\n");
                            put(path, "memory.usage_in_bytes", "0\n");
                            put(
                                path,
                                "memory.oom_control",
                                "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                            );
                            if self.swap {
                                put(path, "memory.memsw.limit_in_bytes", "9223372036854771712\n");
                                put(path, "memory.memsw.max_usage_in_bytes", "0\n");
                            }
                        }
                        Controller::Pids => {
                            put(path, "pids.max", "max\n");
                            put(path, "pids.current", "0\n");
                            put(path, "pids.peak", "0\n");
                            put(path, "pids.events", "max 0\n");
                        }
                        Controller::Cpu => {
                            put(path, "cpu.cfs_period_us", "100000\n");
                            put(path, "cpu.cfs_quota_us", "-1\n");
                        }
                        Controller::Cpuacct => put(path, "cpuacct.usage", "0\n"),
                        Controller::Freezer => put(path, "freezer.state", "THAWED\n"),
                    }
                }
            }
            Ok(())
        }

        fn live_pids(&self, dir: &Path) -> Vec<i32> {
            std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|p| live(*p))
                .collect()
        }

        pub fn rmdir(&self, path: &Path) -> io::Result<()> {
            if !path.is_dir() {
                return Err(io_err(libc::ENOENT));
            }
            if !self.live_pids(path).is_empty() {
                return Err(io_err(libc::EBUSY));
            }
            for entry in std::fs::read_dir(path)? {
                if entry?.file_type()?.is_dir() {
                    return Err(io_err(libc::EBUSY));
                }
            }
            std::fs::remove_dir_all(path)
        }

        pub fn read(&self, path: &Path) -> io::Result<String> {
            let text = std::fs::read_to_string(path)?;
            match path.file_name().and_then(|n| n.to_str()) {
                Some("cgroup.procs") | Some("tasks") => {
                    let dir = path.parent().unwrap_or(path);
                    Ok(self
                        .live_pids(dir)
                        .iter()
                        .map(|p| format!("{p}\n"))
                        .collect())
                }
                _ => Ok(text),
            }
        }

        pub fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            if !path.is_file() {
                return Err(io_err(libc::ENOENT));
            }
            let dir = path.parent().unwrap_or(path);
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let value = value.trim();
            match name {
                "cgroup.procs" => {
                    let pid: i32 = value.parse().map_err(|_| io_err(libc::EINVAL))?;
                    if !live(pid) {
                        return Err(io_err(libc::ESRCH));
                    }
                    for file in ["cgroup.procs", "tasks"] {
                        let p = dir.join(file);
                        if p.is_file() {
                            let mut text = std::fs::read_to_string(&p)?;
                            text.push_str(&format!("{pid}\n"));
                            std::fs::write(&p, text)?;
                        }
                    }
                    Ok(())
                }
                "cgroup.subtree_control" => {
                    // What the parent enabled is what this group offers.
                    let offered = if self.v2_mount.as_deref() == Some(dir) {
                        std::fs::read_to_string(dir.join("cgroup.controllers"))?
                    } else {
                        let parent = dir.parent().unwrap_or(dir);
                        std::fs::read_to_string(parent.join("cgroup.subtree_control"))?
                    };
                    let mut enabled: Vec<String> = std::fs::read_to_string(path)?
                        .split_whitespace()
                        .map(str::to_string)
                        .collect();
                    for token in value.split_whitespace() {
                        let (plus, c) = match token.split_at_checked(1) {
                            Some(("+", c)) => (true, c),
                            Some(("-", c)) => (false, c),
                            _ => return Err(io_err(libc::EINVAL)),
                        };
                        if !offered.split_whitespace().any(|o| o == c) {
                            return Err(io_err(libc::ENOENT));
                        }
                        let is_mount_root = self.v2_mount.as_deref() == Some(dir);
                        if !is_mount_root && !self.live_pids(dir).is_empty() {
                            return Err(io_err(libc::EBUSY));
                        }
                        enabled.retain(|e| e != c);
                        if plus {
                            enabled.push(c.to_string());
                        }
                    }
                    std::fs::write(path, format!("{}\n", enabled.join(" ")))
                }
                "cgroup.kill" => {
                    if value != "1" {
                        return Err(io_err(libc::EINVAL));
                    }
                    for pid in self.live_pids(dir) {
                        let _ = corral_sys::process::kill(pid, libc::SIGKILL);
                    }
                    // Kept so tests can see it was used.
                    std::fs::write(path, "1\n")
                }
                "freezer.state" => match value {
                    "FROZEN" | "THAWED" => std::fs::write(path, format!("{value}\n")),
                    _ => Err(io_err(libc::EINVAL)),
                },
                "memory.limit_in_bytes" | "memory.memsw.limit_in_bytes" => {
                    let v: u64 = value.parse().map_err(|_| io_err(libc::EINVAL))?;
                    let num = |f: &str| -> Option<u64> {
                        std::fs::read_to_string(dir.join(f))
                            .ok()?
                            .trim()
                            .parse()
                            .ok()
                    };
                    // The kernel keeps memory <= memory+swap.
                    let bad = if name == "memory.limit_in_bytes" {
                        num("memory.memsw.limit_in_bytes").is_some_and(|sw| v > sw)
                    } else {
                        num("memory.limit_in_bytes").is_some_and(|m| v < m)
                    };
                    if bad {
                        return Err(io_err(libc::EINVAL));
                    }
                    std::fs::write(path, format!("{v}\n"))
                }
                _ => std::fs::write(path, format!("{value}\n")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{FakeKernel, TestDir};
    use super::*;

    /// This host's real /proc/self/mountinfo (cgroup v1 hybrid).
    const HYBRID: &str = "\
24 1 0:22 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
23 24 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const HYBRID_SELF: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/fa1f37a11c032bceb42c9d7dc4c143a1
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

    fn fake_root_with_unified(controllers: &str) -> TestDir {
        let dir = TestDir::new("mi");
        let unified = dir.0.join("sys/fs/cgroup/unified");
        std::fs::create_dir_all(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), controllers).unwrap();
        dir
    }

    #[test]
    fn hybrid_host_like_this_one_uses_v1() {
        // The unified mount offers no controller corral uses (here: hugetlb).
        let root = fake_root_with_unified("hugetlb\n");
        let host = CgroupHost::from_mountinfo_at(&root.0, HYBRID, HYBRID_SELF).unwrap();
        let Version::V1 { mounts } = host.version() else {
            panic!("expected v1, got {:?}", host.version());
        };
        let base = root.0.join("sys/fs/cgroup");
        assert_eq!(mounts.len(), 5);
        for c in Controller::ALL {
            assert_eq!(mounts[&c], base.join(c.name()), "{c:?}");
        }
        assert_eq!(host.version().label(), "v1");
        assert_eq!(
            host.own_cgroup(Controller::Memory),
            Some("/process_api/fa1f37a11c032bceb42c9d7dc4c143a1")
        );
        assert_eq!(host.own_cgroup(Controller::Pids), Some("/"));
    }

    #[test]
    fn pure_v2_host() {
        let root = TestDir::new("mi");
        let (_k, mountinfo, own) = FakeKernel::v2(
            &root.0,
            &["cpuset", "cpu", "io", "memory", "pids"],
            true,
            true,
        );
        let host = CgroupHost::from_mountinfo_at(&root.0, &mountinfo, &own).unwrap();
        assert_eq!(
            host.version(),
            &Version::V2 {
                mount: root.0.join("sys/fs/cgroup"),
                controllers: ["cpuset", "cpu", "io", "memory", "pids"]
                    .map(String::from)
                    .to_vec(),
            }
        );
        assert_eq!(
            host.own_cgroup(Controller::Memory),
            Some("/user.slice/user-1000.slice/session-1.scope")
        );
    }

    #[test]
    fn v1_only_host_with_comounted_cpu_cpuacct() {
        let mountinfo = "\
25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
28 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/freezer ro,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup ro,freezer
";
        let host = CgroupHost::from_mountinfo(mountinfo, "4:memory:/\n").unwrap();
        let Version::V1 { mounts } = host.version() else {
            panic!("expected v1");
        };
        assert_eq!(
            mounts[&Controller::Cpu],
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            mounts[&Controller::Cpuacct],
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            mounts[&Controller::Memory],
            Path::new("/sys/fs/cgroup/memory")
        );
        assert_eq!(mounts[&Controller::Pids], Path::new("/sys/fs/cgroup/pids"));
        assert!(host.read_only.contains(Path::new("/sys/fs/cgroup/freezer")));
        assert_eq!(
            v1::hierarchies(mounts).len(),
            4,
            "cpu and cpuacct share one directory"
        );
    }

    #[test]
    fn systemd_hybrid_with_controllers_on_unified_uses_v2() {
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let root = fake_root_with_unified("cpu memory pids\n");
        let host = CgroupHost::from_mountinfo_at(&root.0, mountinfo, "0::/\n").unwrap();
        assert!(
            matches!(host.version(), Version::V2 { mount, .. } if mount.ends_with("sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn over_mounted_and_escaped_mount_points() {
        // The v1 memory hierarchy at /sys/fs/cgroup/memory is hidden by a
        // later tmpfs on /sys/fs/cgroup; the pids one is mounted after it.
        // A root mount listed last does not hide what is mounted on it.
        let mountinfo = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
50 23 0:40 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw
51 50 0:36 / /sys/fs/cgroup/my\\040pids rw,relatime - cgroup cgroup rw,pids
1 0 0:1 / / rw - rootfs rootfs rw
";
        let host = CgroupHost::from_mountinfo(mountinfo, "").unwrap();
        let Version::V1 { mounts } = host.version() else {
            panic!("expected v1");
        };
        assert_eq!(mounts.len(), 1);
        assert_eq!(
            mounts[&Controller::Pids],
            Path::new("/sys/fs/cgroup/my pids")
        );
        assert_eq!(unescape_mount_path("a\\134b\\011c\\"), "a\\b\tc\\");
    }

    #[test]
    fn no_cgroups_and_malformed_input_are_errors() {
        let err =
            CgroupHost::from_mountinfo("24 1 0:22 / / rw - overlay overlay rw\n", "").unwrap_err();
        assert!(matches!(err, CgroupError::NotMounted), "{err}");
        let err = CgroupHost::from_mountinfo("24 1 0:22 / / rw overlay\n", "").unwrap_err();
        assert!(
            err.to_string()
                .contains("malformed /proc/self/mountinfo line 1"),
            "{err}"
        );
        let err = CgroupHost::from_mountinfo(HYBRID, "garbage\n").unwrap_err();
        assert!(
            err.to_string().contains("/proc/self/cgroup line 1"),
            "{err}"
        );
        // A cgroup2 mount whose root cannot be read names the file.
        let root = TestDir::new("mi");
        let err = CgroupHost::from_mountinfo_at(
            &root.0,
            "27 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "0::/\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("cgroup.controllers"), "{err}");
    }

    #[test]
    fn detect_works_on_this_host() {
        match CgroupHost::detect() {
            Ok(host) => eprintln!("cgroup host: {:?}", host.version()),
            Err(CgroupError::NotMounted) => eprintln!("no cgroups mounted here"),
            Err(e) => panic!("detect failed: {e}"),
        }
    }

    #[test]
    fn names_are_validated() {
        for good in ["1234-1", "abc_DEF-9", &"a".repeat(128)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a b",
            "a\0b",
            "é",
            &"a".repeat(129),
        ] {
            let err = validate_name(bad).unwrap_err();
            assert!(err.to_string().starts_with("invalid cgroup name"), "{err}");
        }
        let n = sandbox_group_name();
        assert_eq!(owner_pid(&n), Some(std::process::id() as i32));
        assert!(validate_name(&n).is_ok());
        assert_eq!(owner_pid("12-x"), None);
        assert_eq!(owner_pid("foreign"), None);
        assert_eq!(owner_pid("0-1"), None);
    }

    #[test]
    fn limit_values_are_validated() {
        let root = TestDir::new("lim");
        let (_k, mi, own) = FakeKernel::v2(&root.0, &["cpu", "memory", "pids"], true, true);
        let host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
        for (limits, text) in [
            (
                CgroupLimits {
                    memory_bytes: Some(0),
                    ..Default::default()
                },
                "memory limit 0",
            ),
            (
                CgroupLimits {
                    pids: Some(0),
                    ..Default::default()
                },
                "pids limit 0",
            ),
            (
                CgroupLimits {
                    cpu_millicores: Some(5),
                    ..Default::default()
                },
                "cpu limit 5 is below",
            ),
            (
                CgroupLimits {
                    cpu_millicores: Some(u64::MAX),
                    ..Default::default()
                },
                "too large",
            ),
        ] {
            let err = host.can_enforce(&limits).unwrap_err();
            assert!(err.to_string().contains(text), "{err}");
        }
        assert_eq!(cpu_quota_us(1500), Some(150_000));
    }

    #[test]
    fn can_enforce_names_the_missing_controller_and_why() {
        let root = TestDir::new("enf");
        let (_k, mi, own) = FakeKernel::v2(&root.0, &["cpu", "io"], true, true);
        let mut host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
        let memory = CgroupLimits {
            memory_bytes: Some(1 << 20),
            ..Default::default()
        };
        let cpu = CgroupLimits {
            cpu_millicores: Some(500),
            ..Default::default()
        };
        let mount = root.0.join("sys/fs/cgroup");
        // As the owner of the fake hierarchy: only the controller is missing.
        let err = host.can_enforce(&memory).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "memory limit needs the memory controller: cgroup v2 at {} has controllers [cpu io]",
                mount.display()
            )
        );
        assert!(host.can_enforce(&cpu).is_ok());
        // As some other unprivileged user: no delegation either.
        let owner = std::fs::metadata(&mount).unwrap().uid();
        host.euid = if owner == 4242 { 4243 } else { 4242 };
        host.egid = 4242;
        host.groups = vec![4242];
        let err = host.can_enforce(&memory).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "memory limit needs the memory controller: cgroup v2 at {} has controllers [cpu io] and corral cannot write {}/corral (not root, no delegation; corral runs in cgroup /user.slice/user-1000.slice/session-1.scope)",
                mount.display(),
                mount.display()
            )
        );
        assert!(host
            .can_enforce(&cpu)
            .unwrap_err()
            .to_string()
            .starts_with("cpu limit needs the cpu controller"));
        // Unlimited needs nothing.
        assert!(host.can_enforce(&CgroupLimits::default()).is_ok());
    }

    #[test]
    fn v1_missing_hierarchy_is_named() {
        let root = TestDir::new("enf1");
        let (_k, mi, own) = FakeKernel::v1(&root.0, &[("memory", &[Controller::Memory])], true);
        let host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
        let err = host
            .can_enforce(&CgroupLimits {
                pids: Some(10),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pids limit needs the pids controller: cgroup v1 has no pids hierarchy mounted (mounted: [memory])"
        );
    }
}

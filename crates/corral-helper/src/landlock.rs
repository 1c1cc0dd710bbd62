//! The Landlock layer: filesystem rules that mirror the mount policy, TCP
//! port rules, and scoping of signals and abstract unix sockets, so a
//! mistake in the mount layer is still contained.
//!
//! Rules are built in PID 1 after `pivot_root` (they need fds of the
//! sandbox's own paths) and enforced by the program's process just before
//! the seccomp filter and `execve`.

use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use serde::{Deserialize, Serialize};

use crate::kernel::{Enforcement, LandlockStatus};

/// The ABI corral writes its rules for; older kernels get the subset they
/// support (the result reports which ABI was in force).
const TARGET_ABI: ABI = ABI::V6;

/// What Landlock allows, in sandbox paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Refuse to run when the kernel cannot enforce the ruleset.
    pub required: bool,
    /// Refuse to run unless every right is enforced (reduced mode, where
    /// Landlock is the only filesystem layer and its signal scoping the
    /// only thing between the program and the user's other processes).
    #[serde(default)]
    pub require_full: bool,
    /// Read and execute (system trees, read-only binds, `/etc`, `/proc`).
    pub read: Vec<String>,
    /// Everything (workspace, `/tmp`, `/dev/shm`, read-write binds).
    pub write: Vec<String>,
    /// Device files: read, write and device ioctls (`/dev`).
    pub devices: Vec<String>,
    /// Directories that may only be listed (`/`).
    pub list: Vec<String>,
    /// Whether TCP bind/connect are restricted at all (not in network
    /// mode `host`).
    #[serde(default)]
    pub restrict_tcp: bool,
    /// TCP ports the program may bind.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the program may connect to.
    pub tcp_connect: Vec<u16>,
}

/// How Landlock ended up, reported in the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockOutcome {
    /// The kernel's Landlock ABI (0 when unavailable).
    pub abi: i32,
    /// `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub status: String,
}

pub(crate) fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("landlock: {what}: {e}")
}

fn add_path(
    ruleset: RulesetCreated,
    path: &str,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, String> {
    // A path the plan lists but the sandbox lacks (an absent /lib64) needs
    // no rule.
    if !Path::new(path).exists() {
        return Ok(ruleset);
    }
    let is_dir = Path::new(path).is_dir();
    let access = if is_dir {
        access
    } else {
        access & AccessFs::from_file(TARGET_ABI)
    };
    let fd = PathFd::new(path).map_err(|e| err(&format!("opening {path}"), e))?;
    ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| err(&format!("rule for {path}"), e))
}

/// Builds the ruleset (in PID 1, after `pivot_root`).
pub fn prepare(plan: &LandlockPlan) -> Result<RulesetCreated, String> {
    let abi = TARGET_ABI;
    let handled = Ruleset::default().handle_access(AccessFs::from_all(abi));
    let handled = if plan.restrict_tcp {
        handled.and_then(|r| r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp))
    } else {
        handled
    };
    let mut ruleset = handled
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .map_err(|e| err("creating the ruleset", e))?;
    let read = AccessFs::from_read(abi);
    let device = read | AccessFs::WriteFile | AccessFs::IoctlDev;
    for p in &plan.list {
        ruleset = add_path(ruleset, p, BitFlags::from(AccessFs::ReadDir))?;
    }
    for p in &plan.read {
        ruleset = add_path(ruleset, p, read)?;
    }
    for p in &plan.devices {
        ruleset = add_path(ruleset, p, device)?;
    }
    for p in &plan.write {
        ruleset = add_path(ruleset, p, AccessFs::from_all(abi))?;
    }
    let ports = |list: &[u16]| {
        if plan.restrict_tcp {
            list.to_vec()
        } else {
            Vec::new()
        }
    };
    for port in ports(&plan.tcp_bind) {
        ruleset = ruleset
            .add_rule(NetPort::new(port, AccessNet::BindTcp))
            .map_err(|e| err(&format!("bind rule for port {port}"), e))?;
    }
    for port in ports(&plan.tcp_connect) {
        ruleset = ruleset
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| err(&format!("connect rule for port {port}"), e))?;
    }
    Ok(ruleset)
}

/// Judges what `landlock_restrict_self` achieved (the program, before
/// exec) against the plan. Fails when `required` and the kernel enforced
/// nothing, or when `require_full` and it enforced less than everything.
pub(crate) fn outcome(
    status: LandlockStatus,
    required: bool,
    require_full: bool,
) -> Result<LandlockOutcome, String> {
    let abi = status.abi;
    let label = match status.enforced {
        Enforcement::Full => "fully_enforced",
        Enforcement::Partial => "partially_enforced",
        Enforcement::None => "not_enforced",
    };
    if required && status.enforced == Enforcement::None {
        return Err(format!(
            "landlock is required but this kernel enforces none of it (ABI {abi}); boot with Landlock \
             enabled (lsm=...,landlock) or set security.landlock = \"best-effort\" to accept a weaker sandbox"
        ));
    }
    if require_full && status.enforced != Enforcement::Full {
        return Err(format!(
            "running without namespaces needs Landlock ABI 6 or later fully enforced (this kernel: ABI {abi}, {label}): \
             it is the only filesystem layer and its signal scoping the only barrier to your other processes"
        ));
    }
    Ok(LandlockOutcome {
        abi,
        status: label.into(),
    })
}

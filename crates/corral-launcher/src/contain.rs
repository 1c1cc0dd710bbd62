//! Deciding and holding a sandbox's cgroup: enforce every cgroup limit the
//! policy sets, or refuse to run (fail closed), or, when the policy accepts
//! a weaker sandbox, run and say which limits were not enforced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use corral_policy::Limits;

use corral_cgroup::{CgroupEnforced, CgroupHost, CgroupLimits, SandboxCgroup};

/// What the cgroup measured, read after the sandbox ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCgroupStats {
    /// Whether the OOM killer fired inside.
    pub oom_killed: bool,
    /// CPU time of the whole group.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the whole group.
    pub peak_memory_bytes: Option<u64>,
    /// Whether a fork failed at the pids limit (`pids.events`, v1 and v2).
    pub pids_limit_hit: bool,
}

/// The cgroup one run gets, or the record that it has none (no cgroup
/// limits asked for, or limits the profile accepts as not enforced).
pub struct RunCgroup {
    cgroup: Option<SandboxCgroup>,
    not_enforced: Vec<String>,
}

/// The cgroup limits of a run cannot be enforced on this host, and the
/// profile does not accept that (`limits.allow_unenforced`). Stable code:
/// `limits.unenforceable`.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot enforce the {} limit{}: {why}. corral refuses to run with limits it cannot enforce; \
     run as root, delegate a cgroup to this user, or accept a weaker sandbox with \
     --allow-unenforced-limits (policy: limits.allow_unenforced = true)",
    limits.join(" and "),
    if limits.len() > 1 { "s" } else { "" }
)]
pub struct LimitsUnenforceable {
    /// The limits asked for (`memory`, `pids`, `cpu`).
    pub limits: Vec<String>,
    /// Why the host cannot enforce them.
    pub why: String,
}

impl LimitsUnenforceable {
    /// The stable error code.
    pub const CODE: &'static str = "limits.unenforceable";
}

static SWEEP: Once = Once::new();
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The cgroup part of a profile's limits.
pub fn cgroup_limits(limits: &Limits) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: limits.memory_bytes.map(|m| m.bytes()),
        pids: limits.pids,
        cpu_millicores: limits.cpu_millicores,
    }
}

fn names(limits: &CgroupLimits) -> Vec<String> {
    [
        ("memory", limits.memory_bytes.is_some()),
        ("pids", limits.pids.is_some()),
        ("cpu", limits.cpu_millicores.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(n, _)| n.to_string())
    .collect()
}

impl RunCgroup {
    /// Creates the cgroup for `limits`: what the sandbox needs before it
    /// starts (the directories and the limits; see [`RunCgroup::settle`]
    /// for the rest). The first call in a process also removes groups left
    /// behind by a corral that was killed: before the sandbox starts, since
    /// killing a stale group's processes may wait up to a second.
    pub fn for_limits(limits: &Limits) -> Result<RunCgroup, LimitsUnenforceable> {
        let want = cgroup_limits(limits);
        let asked = names(&want);
        if asked.is_empty() {
            return Ok(RunCgroup {
                cgroup: None,
                not_enforced: Vec::new(),
            });
        }
        let attempt = (|| {
            let host = CgroupHost::detect().map_err(|e| e.to_string())?;
            host.can_enforce(&want).map_err(|e| e.to_string())?;
            SWEEP.call_once(|| {
                host.sweep_stale();
            });
            let name = format!(
                "{}-{}",
                corral_sys::process::getpid(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            host.create(&name, &want).map_err(|e| e.to_string())
        })();
        match attempt {
            Ok(cgroup) => Ok(RunCgroup {
                cgroup: Some(cgroup),
                not_enforced: Vec::new(),
            }),
            Err(_) if limits.allow_unenforced => Ok(RunCgroup {
                cgroup: None,
                not_enforced: asked,
            }),
            Err(why) => Err(LimitsUnenforceable { limits: asked, why }),
        }
    }

    /// The hook `launch` uses, if there is a cgroup.
    pub fn as_containment(&self) -> Option<&dyn crate::launch::Containment> {
        self.cgroup
            .is_some()
            .then_some(self as &dyn crate::launch::Containment)
    }

    /// What the group needs, but not before its sandbox starts: opening
    /// the statistics files read at the end (once). `launch` calls it
    /// right after it started the sandbox, while init builds the root on
    /// the other CPU, which keeps four cgroup file system walks off
    /// `corral run`'s latency (docs/PERFORMANCE.md); a service calls it
    /// when it makes a group ahead of its requests.
    pub fn settle(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.open_stat_files();
        }
    }

    /// The cgroup part of the result's `enforced` field.
    pub fn enforced(&self) -> Option<CgroupEnforced> {
        self.cgroup.as_ref().map(SandboxCgroup::enforced)
    }

    /// Limits asked for but not enforced.
    pub fn not_enforced(&self) -> &[String] {
        &self.not_enforced
    }

    /// Reads the group's statistics and removes it.
    pub fn finish(self) -> RunCgroupStats {
        let stats = self.stats();
        self.remove();
        stats
    }

    /// The group's statistics, final once every process of the program
    /// has ended (init and the helper may still be inside).
    pub fn stats(&self) -> RunCgroupStats {
        let Some(cg) = &self.cgroup else {
            return RunCgroupStats::default();
        };
        let stats = cg.stats();
        RunCgroupStats {
            oom_killed: stats.oom_killed,
            cpu_ms: stats.cpu_usage_ns.map(|ns| ns / 1_000_000),
            peak_memory_bytes: stats.peak_memory_bytes,
            pids_limit_hit: stats.pids_limit_hit,
        }
    }

    /// Removes the group, once no process is left in it.
    pub fn remove(self) {
        if let Some(cg) = self.cgroup {
            let _ = cg.remove();
        }
    }
}

/// Only handed out by [`RunCgroup::as_containment`] when there is a group.
impl crate::launch::Containment for RunCgroup {
    fn add_process(&self, pid: i32) -> std::io::Result<()> {
        match &self.cgroup {
            Some(cg) => cg.add_process(pid).map_err(std::io::Error::other),
            None => Err(std::io::Error::other("the run has no cgroup")),
        }
    }

    fn self_join_files(&self) -> Vec<std::path::PathBuf> {
        self.cgroup
            .as_ref()
            .map(SandboxCgroup::self_join_files)
            .unwrap_or_default()
    }

    fn kill_all(&self) {
        if let Some(cg) = &self.cgroup {
            cg.kill_all();
        }
    }

    fn while_starting(&self) {
        self.settle();
    }
}

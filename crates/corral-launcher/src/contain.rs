//! Deciding and holding a sandbox's cgroup: enforce every cgroup limit the
//! policy sets, or refuse to run (fail closed), or, when the policy accepts
//! a weaker sandbox, run and say which limits were not enforced.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use corral_policy::Limits;

use corral_cgroup::{CgroupEnforced, CgroupHost, CgroupLimits, SandboxCgroup, Version};

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
/// Made when it is decided, or ([`RunCgroup::for_limits_made_after_start`])
/// checked then and made once the sandbox has started.
pub struct RunCgroup {
    cgroup: OnceLock<SandboxCgroup>,
    /// Checked, not made yet: what to make.
    pending: Mutex<Option<(CgroupHost, CgroupLimits)>>,
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
/// The host's cgroups as last detected. A service makes a group per
/// sandbox (ahead of its requests), and detecting them again each time
/// (`/proc/self/mountinfo`, `/proc/self/cgroup`, `/proc/self/status`, the
/// cgroup2 root's controllers) was about 5% of its CPU per execution
/// (docs/PERFORMANCE.md).
static HOST: Mutex<Option<CgroupHost>> = Mutex::new(None);

/// The host as last detected in this process, if it was.
fn known_host() -> Option<CgroupHost> {
    HOST.lock().ok().and_then(|h| h.clone())
}

/// Detects the host's cgroups now, and keeps what it found for
/// [`known_host`].
fn detect_host() -> Result<CgroupHost, String> {
    let host = CgroupHost::detect().map_err(|e| e.to_string())?;
    if let Ok(mut known) = HOST.lock() {
        *known = Some(host.clone());
    }
    Ok(host)
}
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
        RunCgroup::decide(limits, false)
    }

    /// Like [`RunCgroup::for_limits`], but on cgroup v1, where init joins
    /// its group itself, only the checks run now (the host's hierarchies,
    /// the controllers, the permissions: a refusal still comes before
    /// anything starts); the sweep of stale groups, the directories and
    /// the limits wait for [`crate::launch::Containment::make_for_init`],
    /// which `launch` calls once it has cloned init and init builds the
    /// sandbox's root on the other CPU. For `corral run`, where that
    /// takes the cgroup file system's work off the start's latency
    /// (docs/PERFORMANCE.md). Elsewhere (v2) the group is made now.
    pub fn for_limits_made_after_start(limits: &Limits) -> Result<RunCgroup, LimitsUnenforceable> {
        RunCgroup::decide(limits, true)
    }

    fn decide(limits: &Limits, later: bool) -> Result<RunCgroup, LimitsUnenforceable> {
        let want = cgroup_limits(limits);
        let asked = names(&want);
        let mut run = RunCgroup {
            cgroup: OnceLock::new(),
            pending: Mutex::new(None),
            not_enforced: Vec::new(),
        };
        if asked.is_empty() {
            return Ok(run);
        }
        // The group made now, or the host it is to be made on later.
        let attempt_on = |host: CgroupHost| {
            host.can_enforce(&want).map_err(|e| e.to_string())?;
            if later && matches!(host.version(), Version::V1 { .. }) {
                return Ok(Err(host));
            }
            create(&host, &want).map(Ok)
        };
        let attempt = match known_host() {
            // The host as detected before; if it no longer holds (the
            // hierarchies were remounted, this process was moved), it is
            // looked at again, so a cached view never refuses a run.
            Some(host) => attempt_on(host).or_else(|_| detect_host().and_then(attempt_on)),
            None => detect_host().and_then(attempt_on),
        };
        match attempt {
            Ok(Ok(cgroup)) => {
                let _ = run.cgroup.set(cgroup);
                Ok(run)
            }
            Ok(Err(host)) => {
                run.pending = Mutex::new(Some((host, want)));
                Ok(run)
            }
            Err(_) if limits.allow_unenforced => {
                run.not_enforced = asked;
                Ok(run)
            }
            Err(why) => Err(LimitsUnenforceable { limits: asked, why }),
        }
    }

    /// Makes the group checked by [`RunCgroup::for_limits_made_after_start`]
    /// (once; `Ok` when it exists already or there is none to make).
    fn make_pending(&self) -> std::io::Result<()> {
        let mut pending = self
            .pending
            .lock()
            .map_err(|_| std::io::Error::other("the run's cgroup state is poisoned"))?;
        if let Some((host, want)) = pending.take() {
            // The sandbox has started: fail closed whatever the profile
            // accepts (its init is killed, nothing of the program ran).
            let cgroup = create(&host, &want).map_err(|why| {
                std::io::Error::other(format!(
                    "making the run's cgroup for the {} limits failed after the checks passed: {why}",
                    names(&want).join(" and ")
                ))
            })?;
            let _ = self.cgroup.set(cgroup);
        }
        Ok(())
    }

    /// Whether the group waits to be made (see
    /// [`RunCgroup::for_limits_made_after_start`]).
    fn is_pending(&self) -> bool {
        self.pending.lock().map(|p| p.is_some()).unwrap_or(false)
    }

    /// The hook `launch` uses, if there is a cgroup (made or to make).
    pub fn as_containment(&self) -> Option<&dyn crate::launch::Containment> {
        (self.cgroup.get().is_some() || self.is_pending())
            .then_some(self as &dyn crate::launch::Containment)
    }

    /// What the group needs, but not before its sandbox starts: opening
    /// the statistics files read at the end (once). `launch` calls it
    /// right after it started the sandbox, while init builds the root on
    /// the other CPU, which keeps four cgroup file system walks off
    /// `corral run`'s latency (docs/PERFORMANCE.md); a service calls it
    /// when it makes a group ahead of its requests.
    pub fn settle(&self) {
        if let Some(cgroup) = self.cgroup.get() {
            cgroup.open_stat_files();
        }
    }

    /// The cgroup part of the result's `enforced` field.
    pub fn enforced(&self) -> Option<CgroupEnforced> {
        self.cgroup.get().map(SandboxCgroup::enforced)
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
        let Some(cg) = self.cgroup.get() else {
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
    pub fn remove(mut self) {
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.remove();
        }
    }
}

/// Opens each of `paths` for writing (the `tasks` files init joins
/// through: the kernel checks the opener's credentials, corral's).
pub(crate) fn open_for_writing(paths: &[std::path::PathBuf]) -> std::io::Result<Vec<OwnedFd>> {
    paths
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map(OwnedFd::from)
        })
        .collect()
}

/// Makes a run's group for `want` on `host`, named after this process and
/// a counter. The first call in a process also removes the groups a
/// killed corral left behind (their processes killed first, which may
/// wait up to a second): before the sandbox's program can start.
fn create(host: &CgroupHost, want: &CgroupLimits) -> Result<SandboxCgroup, String> {
    SWEEP.call_once(|| {
        host.sweep_stale();
    });
    let name = format!(
        "{}-{}",
        corral_sys::process::getpid(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    host.create(&name, want).map_err(|e| e.to_string())
}

/// Only handed out by [`RunCgroup::as_containment`] when there is a group.
impl crate::launch::Containment for RunCgroup {
    fn add_process(&self, pid: i32) -> std::io::Result<()> {
        self.make_pending()?;
        match self.cgroup.get() {
            Some(cg) => cg.add_process(pid).map_err(std::io::Error::other),
            None => Err(std::io::Error::other("the run has no cgroup")),
        }
    }

    fn self_join_files(&self) -> Vec<std::path::PathBuf> {
        self.cgroup
            .get()
            .map(SandboxCgroup::self_join_files)
            .unwrap_or_default()
    }

    fn made_after_start(&self) -> bool {
        self.is_pending()
    }

    fn make_for_init(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.make_pending()?;
        open_for_writing(&self.self_join_files())
    }

    fn kill_all(&self) {
        if let Some(cg) = self.cgroup.get() {
            cg.kill_all();
        }
    }

    fn while_starting(&self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view of a host whose hierarchies sit in an empty directory:
    /// nothing can be made there.
    fn stale_host(root: &std::path::Path) -> CgroupHost {
        let mountinfo = "\
31 24 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
";
        CgroupHost::from_mountinfo_at(root, mountinfo, "8:pids:/\n4:memory:/\n").unwrap()
    }

    #[test]
    fn a_view_of_the_host_that_no_longer_holds_is_detected_again_and_never_refuses_a_run() {
        let real = match CgroupHost::detect() {
            Ok(host) if corral_sys::process::uids().1 == 0 => host,
            _ => {
                eprintln!("skipped: needs root and a cgroup hierarchy it can write");
                return;
            }
        };
        let limits = corral_policy::builtin::code().limits;
        let want = cgroup_limits(&limits);
        if real.can_enforce(&want).is_err() {
            eprintln!("skipped: this host cannot enforce the code profile's cgroup limits");
            return;
        }
        let gone = std::env::temp_dir().join(format!("corral-stale-host-{}", std::process::id()));
        *HOST.lock().unwrap() = Some(stale_host(&gone));
        let run = RunCgroup::for_limits(&limits).expect("the real host enforces them");
        assert!(run.enforced().is_some(), "no group was made");
        assert!(run.not_enforced().is_empty());
        let known = known_host().expect("the host detected again is kept");
        assert_eq!(
            known.version(),
            real.version(),
            "the view kept is the real one"
        );
        assert!(!gone.exists(), "nothing was made under the stale view");
        run.remove();
    }
}

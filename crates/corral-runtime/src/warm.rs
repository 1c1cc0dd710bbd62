//! Re-executed sandbox helpers, started ahead of time.
//!
//! A multi-threaded process (the server) cannot fork its helper; it has to
//! start `corral __sandbox-helper` afresh: an `execve`, the dynamic loader
//! relocating a 4 MB binary, the Rust runtime's start. None of that depends
//! on the request, so a service can keep a few helpers started and waiting
//! for their plan ([`keep_ready`]); [`take`] hands one out and a background
//! thread starts its replacement while the sandbox runs.
//!
//! A waiting helper can also sit in its sandbox's cgroup already: on cgroup
//! v1 moving a process into a group takes a global lock whose write side
//! waits for an RCU grace period when no other move happened just before
//! (`cgroup_threadgroup_rwsem`), measured here at 7-20 ms. Done ahead, that
//! wait is off the request's path. The group is made for the limits the
//! server expects most (its default profile's); a run with other limits
//! gets a fresh group as without the pool.
//!
//! A waiting helper has done nothing but start: it has no namespace, no
//! privileges beyond corral's own, its stdio is `/dev/null`, and it reads
//! one message (the plan, with the run's stdin, stdout and stderr attached)
//! before anything else. It exits when corral closes its end of the control
//! socket, so a helper left waiting never outlives the server; [`shutdown`]
//! also removes the waiting groups.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use corral_policy::Limits;
use corral_sys::{fd, process};

use crate::cgroup::CgroupLimits;
use crate::contain::{cgroup_limits, Containment};
use crate::HELPER_SUBCOMMAND;

/// Most helpers kept waiting, whatever the caller asks.
pub const MAX_READY: usize = 16;

/// A started helper waiting for its plan.
#[derive(Debug)]
pub struct ReadyHelper {
    /// Its pid (a child of this process).
    pub(crate) pid: i32,
    /// Our end of its control socket; `None` once handed to a run.
    ctrl: Option<OwnedFd>,
}

impl ReadyHelper {
    /// The pid and our end of the control socket, for the run that takes
    /// this helper over (and with it the duty to reap it).
    pub(crate) fn into_parts(mut self) -> (i32, OwnedFd) {
        let ctrl = self.ctrl.take();
        // Always present: only this method takes it, and it consumes self.
        (self.pid, ctrl.unwrap_or_else(|| unreachable!()))
    }
}

impl Drop for ReadyHelper {
    /// A helper nobody will use: closing the control socket makes it exit
    /// (it is waiting for its plan), and it is reaped so no zombie is left.
    fn drop(&mut self) {
        if self.ctrl.take().is_some() {
            let _ = process::wait4(self.pid);
        }
    }
}

/// Starts one helper now: `/proc/self/exe __sandbox-helper`, empty
/// environment, own process group (a terminal's Ctrl-C reaches corral
/// only, which forwards it once), stdio on `/dev/null` until the plan
/// brings the run's own, control socket at [`fd::HELPER_CONTROL_FD`].
pub(crate) fn spawn() -> std::io::Result<ReadyHelper> {
    let (ours, theirs) = fd::seqpacket_pair()?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("corral-sandbox")
        .arg(HELPER_SUBCOMMAND)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    fd::pass_fd_as(&mut cmd, &theirs, fd::HELPER_CONTROL_FD);
    let child = cmd.spawn()?;
    Ok(ReadyHelper {
        pid: child.id() as i32,
        ctrl: Some(ours),
    })
}

/// A helper waiting in the pool, with the group it already sits in.
struct Waiting {
    helper: ReadyHelper,
    group: Option<(CgroupLimits, Containment)>,
}

/// The waiting helpers of this process.
struct Pool {
    ready: Mutex<VecDeque<Waiting>>,
    /// Signalled when a helper was taken (or the pool shuts down).
    taken: Condvar,
    wanted: usize,
    /// Limits the waiting groups are made for; `None`: no groups.
    template: Option<Limits>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// Keeps `count` helpers (at most [`MAX_READY`]) started and waiting from
/// now on, refilled by a background thread; with `template`, each waits in
/// a cgroup made for those limits. For long-running, multi-threaded front
/// ends (the server); calling it again changes nothing.
pub fn keep_ready(count: usize, template: Option<Limits>) {
    let wanted = count.min(MAX_READY);
    if wanted == 0 {
        return;
    }
    let mut first = false;
    POOL.get_or_init(|| {
        first = true;
        Pool {
            ready: Mutex::new(VecDeque::new()),
            taken: Condvar::new(),
            wanted,
            template,
        }
    });
    if first {
        let _ = std::thread::Builder::new()
            .name("corral-warm-helpers".into())
            .spawn(refill);
    }
}

/// Lets every waiting helper go (they exit), reaps them and removes their
/// groups. For a server's orderly shutdown; runs taken later start their
/// helper themselves.
pub fn shutdown() {
    let Some(pool) = POOL.get() else { return };
    let waiting = std::mem::take(&mut *lock(pool));
    for w in waiting {
        release(w);
    }
}

fn lock(pool: &Pool) -> std::sync::MutexGuard<'_, VecDeque<Waiting>> {
    pool.ready.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ends a waiting helper: closing its control socket makes it exit; once it
/// is reaped its group is empty and can go.
fn release(w: Waiting) {
    drop(w.helper);
    if let Some((_, group)) = w.group {
        group.finish();
    }
}

/// Starts one helper and, with a template, puts it in a new group.
fn prepare(template: Option<&Limits>) -> std::io::Result<Waiting> {
    let helper = spawn()?;
    let group = template.and_then(|limits| {
        let group = Containment::for_limits(limits).ok()?;
        let cgroup = group.as_launch()?;
        cgroup.add_process(helper.pid).ok()?;
        Some((cgroup_limits(limits), group))
    });
    Ok(Waiting { helper, group })
}

/// The background thread: tops the pool up whenever a helper is taken.
fn refill() {
    let Some(pool) = POOL.get() else { return };
    loop {
        {
            let mut ready = lock(pool);
            while ready.len() >= pool.wanted {
                ready = pool.taken.wait(ready).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Prepared outside the lock: `take` never waits for it.
        match prepare(pool.template.as_ref()) {
            Ok(w) => lock(pool).push_back(w),
            // Out of processes or fds: `take` starts helpers itself (and
            // reports the error) until this works again.
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// A helper for one run, and its group when it already sits in one made
/// for `limits`: a waiting helper when the pool has one that is still
/// alive, otherwise one started now (without a group). A waiting helper
/// whose group was made for other limits comes without it (the caller
/// makes the right one and moves the helper there; the old group is
/// removed once empty, after the run).
pub(crate) fn take(limits: &Limits) -> std::io::Result<(ReadyHelper, Option<Containment>)> {
    let Some(pool) = POOL.get() else {
        return Ok((spawn()?, None));
    };
    loop {
        // Oldest first, so every waiting helper comes round (a dead one is
        // found and its group removed).
        let next = lock(pool).pop_front();
        let Some(w) = next else { break };
        pool.taken.notify_one();
        // One that died while waiting (killed by hand, OOM) is reaped and
        // skipped; its group goes with it.
        if !matches!(process::waitpid(w.helper.pid, true), Ok(None)) {
            // Reaped already: no second wait (the pid may be reused).
            drop(w.helper.into_parts());
            if let Some((_, group)) = w.group {
                group.finish();
            }
            continue;
        }
        return Ok(match w.group {
            Some((made_for, group)) if made_for == cgroup_limits(limits) => (w.helper, Some(group)),
            Some((_, group)) => {
                STALE.lock().unwrap_or_else(|p| p.into_inner()).push(group);
                (w.helper, None)
            }
            None => (w.helper, None),
        });
    }
    Ok((spawn()?, None))
}

/// Groups whose helper moved to another group: removed on the next call to
/// [`remove_stale_groups`], when the move is long done.
static STALE: Mutex<Vec<Containment>> = Mutex::new(Vec::new());

/// Removes the groups left by helpers that moved to another group.
pub(crate) fn remove_stale_groups() {
    let stale = std::mem::take(&mut *STALE.lock().unwrap_or_else(|p| p.into_inner()));
    for group in stale {
        group.finish();
    }
}

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
//! A waiting helper ([`ReadyHelper`]) has done nothing but start, and exits
//! when corral closes its end of the control socket, so a helper left
//! waiting never outlives the server; [`shutdown`] also removes the waiting
//! groups.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use corral_launcher::{cgroup_limits, CgroupLimits, Prestarted, ReadyHelper, RunCgroup};
use corral_policy::Limits;
use corral_sys::process;

/// Most helpers kept waiting, whatever the caller asks.
pub const MAX_READY: usize = 16;

/// A helper waiting in the pool, with the group it already sits in.
struct Waiting {
    helper: ReadyHelper,
    group: Option<(CgroupLimits, RunCgroup)>,
}

impl Waiting {
    /// Lets the helper go (it exits and is reaped), then removes its group,
    /// empty by then.
    fn release(self) {
        drop(self.helper);
        if let Some((_, group)) = self.group {
            group.finish();
        }
    }
}

/// What the pool holds, under one lock.
struct Ready {
    waiting: VecDeque<Waiting>,
    /// Set by [`shutdown`]: nothing is added any more.
    stopped: bool,
}

/// The waiting helpers of this process.
struct Pool {
    ready: Mutex<Ready>,
    /// Signalled when a helper was taken or the pool stopped.
    changed: Condvar,
    wanted: usize,
    /// Limits the waiting groups are made for; `None`: no groups.
    template: Option<Limits>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// The refill thread, joined by [`shutdown`]: a helper (and group) it is
/// preparing when the process ends would otherwise be left behind.
static REFILL: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

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
            ready: Mutex::new(Ready {
                waiting: VecDeque::new(),
                stopped: false,
            }),
            changed: Condvar::new(),
            wanted,
            template,
        }
    });
    if first {
        let thread = std::thread::Builder::new()
            .name("corral-warm-helpers".into())
            .spawn(refill);
        if let Ok(t) = thread {
            *REFILL.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        }
    }
}

/// Stops the pool: lets every waiting helper go (they exit), reaps them and
/// removes their groups; the refill thread ends, and a helper it was
/// preparing meanwhile is let go too. For a server's orderly shutdown; runs
/// after this start their helper themselves.
pub fn shutdown() {
    let Some(pool) = POOL.get() else { return };
    let waiting = {
        let mut ready = pool.lock();
        ready.stopped = true;
        std::mem::take(&mut ready.waiting)
    };
    pool.changed.notify_all();
    for w in waiting {
        w.release();
    }
    // It releases what it was preparing and returns.
    let refill = REFILL.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(t) = refill {
        let _ = t.join();
    }
}

/// Starts one helper and, with a template, puts it in a new group.
fn prepare(template: Option<&Limits>) -> std::io::Result<Waiting> {
    let helper = ReadyHelper::spawn()?;
    let group = template.and_then(|limits| {
        let group = RunCgroup::for_limits(limits).ok()?;
        let cgroup = group.as_containment()?;
        cgroup.add_process(helper.pid()).ok()?;
        Some((cgroup_limits(limits), group))
    });
    Ok(Waiting { helper, group })
}

/// The background thread: tops the pool up whenever a helper is taken,
/// until the pool stops.
fn refill() {
    let Some(pool) = POOL.get() else { return };
    loop {
        {
            let mut ready = pool.lock();
            while !ready.stopped && ready.waiting.len() >= pool.wanted {
                ready = pool.changed.wait(ready).unwrap_or_else(|p| p.into_inner());
            }
            if ready.stopped {
                return;
            }
        }
        // Prepared outside the lock: `take` never waits for it.
        match prepare(pool.template.as_ref()) {
            Ok(w) => {
                let mut ready = pool.lock();
                if ready.stopped {
                    drop(ready);
                    w.release();
                    return;
                }
                ready.waiting.push_back(w);
            }
            // Out of processes or fds: `take` starts helpers itself (and
            // reports the error) until this works again.
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// A helper for one run: the oldest waiting one that is still alive, with
/// its group when that was made for `limits`; otherwise one started now,
/// without a group.
pub(crate) fn take(limits: &Limits) -> std::io::Result<Prestarted> {
    let fresh = || {
        Ok(Prestarted {
            helper: ReadyHelper::spawn()?,
            group: None,
            former_group: None,
        })
    };
    let Some(pool) = POOL.get() else {
        return fresh();
    };
    loop {
        // Oldest first, so every waiting helper comes round (a dead one is
        // found and its group removed).
        let next = pool.lock().waiting.pop_front();
        let Some(w) = next else { break };
        pool.changed.notify_one();
        // One that died while waiting (killed by hand, OOM) is reaped and
        // skipped; its group goes with it.
        if !matches!(process::waitpid(w.helper.pid(), true), Ok(None)) {
            // Reaped already: no second wait (the pid may be reused).
            w.helper.forget_reaped();
            if let Some((_, group)) = w.group {
                group.finish();
            }
            continue;
        }
        let (group, former_group) = match w.group {
            Some((made_for, group)) if made_for == cgroup_limits(limits) => (Some(group), None),
            Some((_, group)) => (None, Some(group)),
            None => (None, None),
        };
        return Ok(Prestarted {
            helper: w.helper,
            group,
            former_group,
        });
    }
    fresh()
}

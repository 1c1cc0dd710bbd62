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

/// Something a [`Pool`] keeps ready: it must be let go explicitly.
pub(crate) trait Pooled: Send + 'static {
    /// Lets an unused one go and cleans up after it.
    fn release(self);
}

/// Why the refill thread could not make one.
pub(crate) enum Unmade {
    /// A passing shortage (processes, fds): try again in a second.
    Later,
    /// It can never work (say, the template is refused): stop refilling
    /// (the thread stays until the pool stops: the helpers it started die
    /// with it).
    Never,
}

/// What a pool holds, under one lock.
struct Ready<T> {
    waiting: VecDeque<T>,
    /// Set by [`Pool::shutdown`]: nothing is added any more.
    stopped: bool,
}

/// Things made ahead of the requests that use them, kept at `wanted` by a
/// background thread: each [`Pool::pop`] wakes it to make a replacement.
pub(crate) struct Pool<T> {
    ready: Mutex<Ready<T>>,
    /// Signalled when one was taken or the pool stopped.
    changed: Condvar,
    wanted: usize,
    /// The refill thread, joined by [`Pool::shutdown`]: what it is making
    /// when the process ends would otherwise be left behind.
    refill: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl<T: Pooled> Pool<T> {
    /// An empty pool that will hold `wanted` (at most [`MAX_READY`]).
    pub(crate) fn new(wanted: usize) -> Pool<T> {
        Pool {
            ready: Mutex::new(Ready {
                waiting: VecDeque::new(),
                stopped: false,
            }),
            changed: Condvar::new(),
            wanted: wanted.min(MAX_READY),
            refill: Mutex::new(None),
        }
    }

    /// The pool in `cell` for `count` (at most [`MAX_READY`]), made on the
    /// first call with a `count` above 0: then returned, to be started;
    /// `None` on every later call.
    pub(crate) fn first(
        cell: &'static OnceLock<Pool<T>>,
        count: usize,
    ) -> Option<&'static Pool<T>> {
        if count == 0 {
            return None;
        }
        let mut first = false;
        let pool = cell.get_or_init(|| {
            first = true;
            Pool::new(count)
        });
        first.then_some(pool)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ready<T>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the thread `name` that keeps the pool full with `make`.
    pub(crate) fn start(
        &'static self,
        name: &str,
        make: impl FnMut() -> Result<T, Unmade> + Send + 'static,
    ) {
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || self.refill(make));
        if let Ok(t) = thread {
            *self.refill.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        }
    }

    /// The refill thread's loop: tops the pool up whenever one is taken,
    /// until the pool stops (or `make` says it never will work).
    fn refill(&self, mut make: impl FnMut() -> Result<T, Unmade>) {
        loop {
            {
                let mut ready = self.lock();
                while !ready.stopped && ready.waiting.len() >= self.wanted {
                    ready = self.changed.wait(ready).unwrap_or_else(|p| p.into_inner());
                }
                if ready.stopped {
                    drop(ready);
                    self.release_all();
                    return;
                }
            }
            // Made outside the lock: `pop` never waits for it.
            match make() {
                Ok(t) => self.lock().waiting.push_back(t),
                // Out of processes or fds: requests start their own until
                // this works again.
                Err(Unmade::Later) => std::thread::sleep(Duration::from_secs(1)),
                // The thread stays: helpers it started die with it.
                Err(Unmade::Never) => {
                    let mut ready = self.lock();
                    while !ready.stopped {
                        ready = self.changed.wait(ready).unwrap_or_else(|p| p.into_inner());
                    }
                    drop(ready);
                    self.release_all();
                    return;
                }
            }
        }
    }

    /// Lets every waiting one go. Called by the refill thread itself when
    /// the pool stops: the helpers it started die with it
    /// (`PR_SET_PDEATHSIG` follows the spawning thread), and one killed
    /// that way while being let go would leave its sandbox's init to the
    /// host's PID 1 to reap.
    fn release_all(&self) {
        let waiting = std::mem::take(&mut self.lock().waiting);
        for w in waiting {
            w.release();
        }
    }

    /// The oldest one waiting, if any; the refill thread makes another.
    pub(crate) fn pop(&self) -> Option<T> {
        let next = self.lock().waiting.pop_front();
        if next.is_some() {
            self.changed.notify_one();
        }
        next
    }

    /// Stops the pool: the refill thread lets every waiting one go (what
    /// it was making meanwhile too) and ends; returns once it has.
    pub(crate) fn shutdown(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
        let refill = self.refill.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = refill {
            let _ = t.join();
        }
        // A refill thread that gave up (or never started) left these.
        self.release_all();
    }
}

/// A helper waiting in the pool, with the group made for it.
struct Waiting {
    helper: ReadyHelper,
    group: Option<(CgroupLimits, RunCgroup)>,
    /// Whether it sits in that group already (else it joins it itself when
    /// its plan comes: cgroup v1).
    contained: bool,
}

impl Pooled for Waiting {
    /// Lets the helper go (it exits and is reaped), then removes its group,
    /// empty by then.
    fn release(self) {
        drop(self.helper);
        if let Some((_, group)) = self.group {
            group.finish();
        }
    }
}

/// The waiting helpers of this process.
static POOL: OnceLock<Pool<Waiting>> = OnceLock::new();

/// Keeps `count` helpers (at most [`MAX_READY`]) started and waiting from
/// now on, refilled by a background thread; with `template`, each waits in
/// a cgroup made for those limits. For long-running, multi-threaded front
/// ends (the server); calling it again changes nothing.
pub fn keep_ready(count: usize, template: Option<Limits>) {
    if let Some(pool) = Pool::first(&POOL, count) {
        pool.start("corral-warm-helpers", move || {
            prepare(template.as_ref()).map_err(|_| Unmade::Later)
        });
    }
}

/// Stops the pool: lets every waiting helper go (they exit), reaps them and
/// removes their groups; the refill thread ends, and a helper it was
/// preparing meanwhile is let go too. For a server's orderly shutdown; runs
/// after this start their helper themselves.
pub fn shutdown() {
    if let Some(pool) = POOL.get() {
        pool.shutdown();
    }
}

/// Starts one helper and, with a template, makes a group for it. On cgroup
/// v1 the helper joins the group itself once its plan comes (a thread that
/// moves itself takes no global lock); elsewhere it is moved in now, off
/// the request's path.
fn prepare(template: Option<&Limits>) -> std::io::Result<Waiting> {
    let helper = ReadyHelper::spawn()?;
    let mut contained = false;
    let group = template.and_then(|limits| {
        let group = RunCgroup::for_limits(limits).ok()?;
        let cgroup = group.as_containment()?;
        if cgroup.self_join_files().is_empty() {
            cgroup.add_process(helper.pid()).ok()?;
            contained = true;
        }
        Some((cgroup_limits(limits), group))
    });
    Ok(Waiting {
        helper,
        group,
        contained,
    })
}

/// A helper for one run: the oldest waiting one that is still alive, with
/// its group when that was made for `limits`; otherwise one started now,
/// without a group.
pub(crate) fn take(limits: &Limits) -> std::io::Result<Prestarted> {
    let fresh = || {
        Ok(Prestarted {
            helper: ReadyHelper::spawn()?,
            group: None,
            contained: false,
            former_group: None,
        })
    };
    let Some(pool) = POOL.get() else {
        return fresh();
    };
    // Oldest first, so every waiting helper comes round (a dead one is
    // found and its group removed).
    while let Some(w) = pool.pop() {
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
            contained: w.contained && group.is_some(),
            group,
            former_group,
        });
    }
    fresh()
}

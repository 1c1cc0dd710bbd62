//! Re-executed sandbox helpers, started ahead of time.
//!
//! A multi-threaded process (the server) cannot fork its helper; it has to
//! start `corral __sandbox-helper` afresh: an `execve`, the dynamic loader
//! relocating a 4 MB binary, the Rust runtime's start. None of that depends
//! on the request, so a service can keep a few helpers started and waiting
//! for their plan ([`keep_ready`]); [`take`] hands one out and a background
//! thread starts its replacement once the run is answered (see
//! [`Pool::pop`] for when it does not wait).
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
use std::time::{Duration, Instant};

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
    /// Replacements the refill thread may make now: one per run answered
    /// ([`Pool::answered`]) since the last ones were made.
    due: usize,
    /// When one was last taken: a replacement is made at the latest
    /// [`MAX_DEFERRAL`] after it, answered or not (a full pool's thread,
    /// which a take does not wake, looks at least that often).
    last_taken: Option<Instant>,
}

/// How long a replacement waits for the run that took one to be answered
/// before it is made anyway (a long run would otherwise keep the pool
/// short for its whole duration).
const MAX_DEFERRAL: Duration = Duration::from_millis(250);

/// Things made ahead of the requests that use them, kept at `wanted` by a
/// background thread.
///
/// When a replacement is made matters as much as that it is: making one
/// (a helper's start, for a sandbox its namespaces and mounts) takes a few
/// milliseconds of CPU, and made while the run that took one starts, it
/// competes with that run for the machine's cores and for kernel locks.
/// Measured on 2 cores: a `sh -c 'exit 0'` execution answered in 4.3 ms
/// with the refill at once, 2.6 ms with it out of the way. So a
/// replacement waits until that run is answered ([`Pool::answered`]),
/// unless the pool ran empty (the next request would build its own on its
/// path, which costs more) or [`MAX_DEFERRAL`] passed. A full pool's
/// thread looks every [`MAX_DEFERRAL`] for takes: a take wakes it only
/// when it empties the pool, as waking it costs the taking request.
pub(crate) struct Pool<T> {
    ready: Mutex<Ready<T>>,
    /// Signalled when a take emptied the pool, a run was answered, or the
    /// pool stopped.
    changed: Condvar,
    wanted: usize,
    /// [`MAX_DEFERRAL`], or another in tests.
    max_deferral: Duration,
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
                due: 0,
                last_taken: None,
            }),
            changed: Condvar::new(),
            wanted: wanted.min(MAX_READY),
            max_deferral: MAX_DEFERRAL,
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
            .spawn(move || {
                // This thread starts the helpers ahead of their runs, and
                // they die with it: a fork server of its own saves each
                // one the program start of corral's binary.
                corral_launcher::fork_helpers_on_this_thread();
                self.refill(make)
            });
        if let Ok(t) = thread {
            *self.refill.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        }
    }

    /// The refill thread's loop: tops the pool up when a replacement is
    /// due (see [`Pool`]), until the pool stops (or `make` says it never
    /// will work).
    fn refill(&self, mut make: impl FnMut() -> Result<T, Unmade>) {
        loop {
            {
                let mut ready = self.lock();
                loop {
                    if ready.stopped {
                        drop(ready);
                        self.release_all();
                        return;
                    }
                    match self.until_due(&ready) {
                        Some(wait) if wait.is_zero() => break,
                        Some(wait) => {
                            ready = self
                                .changed
                                .wait_timeout(ready, wait)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                        // Full: looks again after `max_deferral`, the only
                        // way it learns of a take that left the pool
                        // non-empty (`pop` does not wake it for those);
                        // it then waits out the rest of that take's
                        // deferral, so none waits longer.
                        None => {
                            ready = self
                                .changed
                                .wait_timeout(ready, self.max_deferral)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                }
                ready.due = ready.due.saturating_sub(1);
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

    /// How long the next replacement waits: `None` while the pool is full,
    /// zero once one is due (see [`Pool`]).
    fn until_due(&self, ready: &Ready<T>) -> Option<Duration> {
        if ready.waiting.len() >= self.wanted {
            return None;
        }
        if ready.waiting.is_empty() || ready.due > 0 {
            return Some(Duration::ZERO);
        }
        let since = ready.last_taken.map_or(self.max_deferral, |t| t.elapsed());
        Some(self.max_deferral.saturating_sub(since))
    }

    /// A run that took one has been answered (and torn down): its
    /// replacement may be made now.
    pub(crate) fn answered(&self) {
        let mut ready = self.lock();
        if ready.waiting.len() < self.wanted {
            ready.due = (ready.due + 1).min(self.wanted);
            self.changed.notify_one();
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

    /// Puts `one`, taken by [`Pool::pop`] and not used, back at the front,
    /// to be handed out next. Taking it may have emptied the pool and had
    /// the refill thread replace it meanwhile: the pool then holds one
    /// more than wanted until the next take. Beyond that, or once the
    /// pool stopped, `one` comes back, for the caller to let go when it
    /// is off its request's path.
    #[must_use = "one the pool did not keep must be let go"]
    pub(crate) fn put_back(&self, one: T) -> Option<T> {
        let mut ready = self.lock();
        if ready.stopped || ready.waiting.len() > self.wanted {
            return Some(one);
        }
        ready.waiting.push_front(one);
        None
    }

    /// The oldest one waiting, if any. The refill thread makes another at
    /// once if that left the pool empty, otherwise once the run is
    /// answered or [`MAX_DEFERRAL`] passed (see [`Pool`]).
    pub(crate) fn pop(&self) -> Option<T> {
        let (next, emptied) = {
            let mut ready = self.lock();
            let next = ready.waiting.pop_front();
            if next.is_some() {
                ready.last_taken = Some(Instant::now());
            }
            (next, ready.waiting.is_empty())
        };
        // Only an emptied pool wakes the refill thread from the request's
        // path (a wake-up there costs the request about 20 us); otherwise
        // it notices the take on its own (see `refill`).
        if next.is_some() && emptied {
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
            // One making a sandbox whose plan waits on a filesystem that
            // does not answer may never return (see `crate::host`): it is
            // left behind after a bounded wait (were it to return, it
            // finds the pool stopped and lets what it made go).
            let deadline = std::time::Instant::now() + REFILL_STOP_WAIT;
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(
                    waited_secs = REFILL_STOP_WAIT.as_secs(),
                    "a pool's refill thread did not stop (a look at the host that does not return?); left behind"
                );
            }
        }
        // A refill thread that gave up (or never started) left these.
        self.release_all();
    }
}

/// How long a stopping pool waits for its refill thread, which finishes
/// what it is making first (milliseconds, unless the host holds it).
const REFILL_STOP_WAIT: Duration = Duration::from_secs(5);

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

/// A run is answered and torn down: the helpers and the sandboxes built
/// ahead that runs took may be replaced now (see [`Pool`]). Every run
/// calls it, whether it took one or not: one that took none may bring
/// forward the replacement of one taken by a run still going, which
/// costs nothing but that timing.
pub(crate) fn answered() {
    if let Some(pool) = POOL.get() {
        pool.answered();
    }
    crate::prepared::answered();
}

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
        // Off the request's path: the statistics files' opens.
        group.settle();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Something made: its place in the order of making, and the count
    /// of those let go.
    struct Made(usize, Arc<AtomicUsize>);

    impl Pooled for Made {
        fn release(self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A started pool of `wanted` with `max_deferral`, the count of makes,
    /// and the count of releases; returns once it is full.
    fn full_pool(
        wanted: usize,
        max_deferral: Duration,
    ) -> (&'static Pool<Made>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let mut pool = Pool::new(wanted);
        pool.max_deferral = max_deferral;
        let pool: &'static Pool<Made> = Box::leak(Box::new(pool));
        let (made, released) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (m, r) = (made.clone(), released.clone());
        pool.start("test-pool", move || {
            Ok(Made(m.fetch_add(1, Ordering::SeqCst), r.clone()))
        });
        assert!(
            made_within(&made, wanted, Duration::from_secs(10)),
            "filled"
        );
        (pool, made, released)
    }

    /// Whether `count` reaches `n` within `limit`.
    fn made_within(count: &AtomicUsize, n: usize, limit: Duration) -> bool {
        let start = Instant::now();
        while count.load(Ordering::SeqCst) < n {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[test]
    fn a_replacement_waits_for_the_answer_while_the_pool_holds_another() {
        let (pool, made, released) = full_pool(2, Duration::from_secs(3600));
        let taken = pool.pop().expect("one waiting");
        // One is still waiting: nothing is made while the run goes on.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "no replacement before the answer"
        );
        pool.answered();
        assert!(
            made_within(&made, 3, Duration::from_secs(10)),
            "replaced once answered"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            made.load(Ordering::SeqCst),
            3,
            "one answer, one replacement"
        );
        assert_eq!(pool.lock().waiting.len(), 2);
        taken.release();
        pool.shutdown();
        assert_eq!(released.load(Ordering::SeqCst), 3, "every one let go");
    }

    /// A make that does not return (a plan waiting on a filesystem that
    /// stopped answering) holds the stop for a bounded time only; should
    /// it return later, what it made is let go.
    #[test]
    fn a_refill_thread_that_does_not_return_is_left_behind_at_the_stop() {
        let pool: &'static Pool<Made> = Box::leak(Box::new(Pool::new(1)));
        let released = Arc::new(AtomicUsize::new(0));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (making, started) = std::sync::mpsc::channel::<()>();
        let r = released.clone();
        pool.start("test-pool", move || {
            let _ = making.send(());
            let _ = wait.recv();
            Ok(Made(0, r.clone()))
        });
        started.recv().expect("the refill thread makes one");
        let stopping = Instant::now();
        pool.shutdown();
        let took = stopping.elapsed();
        assert!(
            took >= REFILL_STOP_WAIT && took < REFILL_STOP_WAIT + Duration::from_secs(5),
            "the stop took {took:?}"
        );
        go.send(()).expect("the make is still waiting");
        assert!(
            made_within(&released, 1, Duration::from_secs(10)),
            "made after the stop, let go"
        );
    }

    #[test]
    fn an_emptied_pool_is_refilled_at_once() {
        let (pool, made, _) = full_pool(1, Duration::from_secs(3600));
        let _taken = pool.pop().expect("one waiting");
        // The next request would build its own on its path: no waiting.
        assert!(
            made_within(&made, 2, Duration::from_secs(10)),
            "refilled without an answer"
        );
        pool.shutdown();
    }

    #[test]
    fn a_replacement_is_made_at_the_deadline_without_an_answer() {
        let (pool, made, _) = full_pool(2, Duration::from_millis(300));
        let _taken = pool.pop().expect("one waiting");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(made.load(Ordering::SeqCst), 2, "not before the deadline");
        assert!(
            made_within(&made, 3, Duration::from_secs(10)),
            "made at the deadline"
        );
        pool.shutdown();
    }

    #[test]
    fn answers_beyond_what_is_missing_make_nothing_more() {
        let (pool, made, _) = full_pool(2, Duration::from_secs(3600));
        for _ in 0..5 {
            pool.answered();
        }
        let _taken = pool.pop().expect("one waiting");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "answers of runs that took nothing"
        );
        pool.shutdown();
    }

    #[test]
    fn one_put_back_is_handed_out_next() {
        let (pool, made, released) = full_pool(2, Duration::from_secs(3600));
        let first = pool.pop().expect("one waiting");
        let serial = first.0;
        assert!(pool.put_back(first).is_none(), "kept");
        assert_eq!(
            pool.pop().map(|m| m.0),
            Some(serial),
            "the one put back comes first"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(made.load(Ordering::SeqCst), 2, "nothing made for it");
        assert_eq!(released.load(Ordering::SeqCst), 0);
        pool.shutdown();
    }

    #[test]
    fn a_pool_holds_at_most_one_more_than_wanted() {
        let (pool, made, released) = full_pool(1, Duration::from_secs(3600));
        let refilled = |n| {
            // Each take empties the pool: its replacement is made at once.
            assert!(made_within(&made, n, Duration::from_secs(10)), "refilled");
            while pool.lock().waiting.is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let first = pool.pop().expect("one waiting");
        refilled(2);
        let second = pool.pop().expect("its replacement");
        refilled(3);
        let serial = first.0;
        assert!(pool.put_back(first).is_none(), "kept: one more than wanted");
        assert_eq!(pool.lock().waiting.len(), 2);
        let not_kept = pool.put_back(second).expect("not kept beyond that");
        assert_eq!(released.load(Ordering::SeqCst), 0, "left to the caller");
        not_kept.release();
        assert_eq!(pool.lock().waiting.len(), 2);
        assert_eq!(pool.pop().map(|m| m.0), Some(serial), "put back first");
        pool.shutdown();
        assert_eq!(released.load(Ordering::SeqCst), 2, "the rest let go");
    }
}

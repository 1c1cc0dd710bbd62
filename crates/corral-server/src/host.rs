//! The host's filesystems as a server must expect them: some stop
//! answering.
//!
//! A profile's plan looks at the host: its command table resolves names
//! through the bind sources, each run checks its binds and the protected
//! entries in them. When the filesystem under a bind stops answering (a
//! hard-mounted NFS export whose server is down, a FUSE daemon that stopped
//! reading), each of those lookups waits in the kernel, uninterruptibly,
//! until the filesystem answers or the process dies; no thread can be
//! called back from one. A server that waited for them would not start, or
//! would give its execution slots, one request at a time, to lookups that
//! never return, and then refuse every tenant.
//!
//! So the server never waits for the host without a bound:
//! - at start, each profile's command table is resolved on a thread of its
//!   own, and the start waits [`START_WAIT`] for them all; a profile whose
//!   table is still missing then is refused, saying why, until it arrives
//!   ([`CommandTables`]);
//! - each execution plans on a thread it can leave behind
//!   ([`execute_bounded`]); a plan that takes longer than the run's timeout
//!   (within 5 to 10 s: [`plan_limit`]) is given up through its
//!   [`PlanGate`](corral_launcher::PlanGate), which makes sure it never
//!   launches, and the run is refused with `host.unanswered`, recorded like
//!   any refusal, its slots given back;
//! - while a plan given up is still waiting, new runs of its profile are
//!   refused at once ([`Stalls`]), so at most the runs already planning
//!   when the filesystem stopped are held, each for its bound. Other
//!   profiles are not touched.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use corral_launcher::{all_within, CommandTable, PlanGate, Refusal, EXIT_CORRAL_ERROR};
use corral_policy::Profile;

/// How long the start waits for the profiles' command tables: resolving
/// one takes milliseconds on a filesystem that answers.
pub const START_WAIT: Duration = Duration::from_secs(5);

/// The longest an execution's plan may look at the host before it is given
/// up: the run's timeout, but never more than this... A plan takes about a
/// millisecond on a filesystem that answers.
pub const PLAN_LIMIT: Duration = Duration::from_secs(10);

/// ...nor less than this: a slow filesystem that still answers (a cold
/// network cache) is not taken for one that stopped.
pub const PLAN_LIMIT_MIN: Duration = Duration::from_secs(5);

/// How long a run's plan may look at the host: its timeout (`None`: no
/// timeout), within [`PLAN_LIMIT_MIN`]..=[`PLAN_LIMIT`].
pub fn plan_limit(timeout_secs: Option<u64>) -> Duration {
    timeout_secs
        .map_or(PLAN_LIMIT, Duration::from_secs)
        .clamp(PLAN_LIMIT_MIN, PLAN_LIMIT)
}

/// Every profile's command table, resolved once, at start, each on a thread
/// of its own (see the module's doc): a table still missing after
/// [`START_WAIT`] arrives when its lookups return.
pub struct CommandTables {
    tables: HashMap<String, Arc<OnceLock<CommandTable>>>,
    /// When resolving began: how long a missing table has been awaited.
    since: Instant,
}

impl CommandTables {
    /// Resolves the tables of `profiles` against `path` (the server's
    /// `PATH`), waiting at most `wait` for all of them; a table not there
    /// by then is logged and filled in later.
    pub fn resolve(
        profiles: &BTreeMap<String, Profile>,
        path: Option<String>,
        wait: Duration,
    ) -> CommandTables {
        let since = Instant::now();
        let mut tables = HashMap::new();
        let mut jobs = Vec::new();
        for (name, profile) in profiles {
            let slot = Arc::new(OnceLock::new());
            tables.insert(name.clone(), slot.clone());
            let (profile, path) = (profile.clone(), path.clone());
            jobs.push(move || {
                let _ = slot.set(CommandTable::resolve(&profile, path.as_deref()));
            });
        }
        let _ = all_within(wait, "corral-commands", jobs);
        CommandTables { tables, since }
    }

    /// Logs each table still missing (after the server's announcement,
    /// which comes before any log line).
    pub fn log_missing(&self, profiles: &BTreeMap<String, Profile>) {
        for name in self.missing() {
            tracing::warn!(
                profile = %name,
                waited_secs = self.since.elapsed().as_secs(),
                code = PlanGate::CODE,
                binds = %bind_sources(profiles.get(name)),
                "the profile's commands are not resolved yet: a path of the host's that the profile sees does not answer (a network filesystem whose server is down?); its runs are refused until the lookups return"
            );
        }
    }

    fn missing(&self) -> impl Iterator<Item = &str> {
        self.tables
            .iter()
            .filter(|(_, t)| t.get().is_none())
            .map(|(n, _)| n.as_str())
    }

    /// The table of profile `name`: empty for a profile the server does not
    /// know; `Err` (the refusal) while it is still being resolved.
    pub fn get(&self, profile: &Profile) -> Result<CommandTable, Refusal> {
        match self.tables.get(&profile.name) {
            None => Ok(CommandTable::default()),
            Some(t) => t.get().cloned().ok_or_else(|| {
                unanswered(
                    profile,
                    format!(
                        "its allowlisted commands have been looked up for {} s and are not resolved yet",
                        self.since.elapsed().as_secs()
                    ),
                )
            }),
        }
    }
}

/// The profiles whose plans were given up and still wait on the host,
/// how many of each and since when.
#[derive(Default)]
pub struct Stalls {
    waiting: Mutex<HashMap<String, (usize, Instant)>>,
}

impl Stalls {
    /// `Err` (the refusal) while a plan of `profile`'s that was given up
    /// is still waiting.
    pub fn check(&self, profile: &Profile) -> Result<(), Refusal> {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match waiting.get(&profile.name) {
            Some((_, since)) => Err(unanswered(
                profile,
                format!(
                    "a plan of this profile's, given up, has waited on the host for {} s and is still waiting",
                    since.elapsed().as_secs()
                ),
            )),
            None => Ok(()),
        }
    }

    /// Counts one plan of `profile`'s as stalled until the guard drops.
    /// `since`: when that plan began.
    fn begin(self: &Arc<Stalls>, profile: &str, since: Instant) -> Stalled {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.entry(profile.to_string()).or_insert((0, since)).0 += 1;
        Stalled {
            stalls: self.clone(),
            profile: profile.to_string(),
        }
    }
}

/// One stalled plan, counted in [`Stalls`] until its lookups return.
struct Stalled {
    stalls: Arc<Stalls>,
    profile: String,
}

impl Drop for Stalled {
    fn drop(&mut self) {
        let mut waiting = self
            .stalls
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((n, _)) = waiting.get_mut(&self.profile) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.profile);
            }
        }
        tracing::info!(profile = %self.profile, "a plan given up has returned from the host");
    }
}

/// Between a plan's thread and the execution waiting for it: when the
/// task started (a full pool of blocking threads may queue it: its bound
/// counts from its start), whether it has returned, and the stall it ends
/// when it returns late.
#[derive(Default)]
struct Handover {
    started: Option<Instant>,
    returned: bool,
    stalled: Option<Stalled>,
}

/// Runs `run` (a call of [`corral_launcher::execute`] with `gate` in its
/// options) on a thread of its own and waits for it; gives it up (the
/// `host.unanswered` refusal) when its plan takes longer than `limit`.
/// A run that has launched is waited for: its own timeout bounds it.
/// The result of a run given up, which nobody waits for, goes to `late`
/// when its lookups return (to let go what it holds). Callers check
/// [`Stalls::check`] first.
pub fn execute_bounded<T: Send + 'static>(
    stalls: &Arc<Stalls>,
    profile: &Profile,
    limit: Duration,
    gate: Arc<PlanGate>,
    run: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
    late: impl FnOnce(Result<T, Refusal>) + Send + 'static,
) -> Result<T, Refusal> {
    let since = Instant::now();
    let handover = Arc::new(Mutex::new(Handover::default()));
    let theirs = handover.clone();
    let (send, result) = std::sync::mpsc::sync_channel(1);
    let task = move || {
        theirs.lock().unwrap_or_else(|p| p.into_inner()).started = Some(Instant::now());
        let ran = run();
        // Under the lock: the waiting side sees either this or the stall
        // it leaves here, never neither.
        let stalled = {
            let mut h = theirs.lock().unwrap_or_else(|p| p.into_inner());
            h.returned = true;
            h.stalled.take()
        };
        match stalled {
            // Given up: nobody waits for this result.
            Some(stalled) => {
                late(ran);
                drop(stalled);
            }
            None => {
                let _ = send.send(ran);
            }
        }
    };
    // On the runtime's pool of blocking threads, whose idle ones take a
    // task for a fraction of a new thread's start (a stopping server gives
    // one stuck in the host a bounded wait: see `run_async` in the CLI);
    // a thread of its own outside a runtime.
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(task)),
        Err(_) => {
            std::thread::Builder::new()
                .name("corral-plan".into())
                .spawn(task)
                .map_err(|e| {
                    refusal(
                        "sandbox.launch",
                        format!("no thread to plan the run on: {e}"),
                    )
                })?;
        }
    }
    let mut deadline = Instant::now() + limit;
    loop {
        match result.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(ran) => return ran,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(refusal(
                    "sandbox.launch",
                    "the run's thread ended without a result".into(),
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let mut h = handover.lock().unwrap_or_else(|p| p.into_inner());
        // Still queued, or started later than the wait began: the pool
        // was busy, not the host; the bound counts from the task's start.
        let bound = h.started.map_or(Instant::now(), |t| t) + limit;
        if bound > Instant::now() + Duration::from_millis(1) {
            deadline = bound;
            continue;
        }
        if !h.returned && gate.abandon() {
            h.stalled = Some(stalls.begin(&profile.name, since));
            tracing::warn!(
                profile = %profile.name,
                waited_secs = limit.as_secs(),
                code = PlanGate::CODE,
                binds = %bind_sources(Some(profile)),
                "an execution was given up while it planned: a path of the host's that it looks at does not answer"
            );
            return Err(unanswered(
                profile,
                format!(
                    "the run's plan waited on the host for {} s",
                    limit.as_secs()
                ),
            ));
        }
        break;
    }
    // Launched (or just returned): the run's own timeout bounds it now.
    result.recv().unwrap_or_else(|_| {
        Err(refusal(
            "sandbox.launch",
            "the run's thread ended without a result".into(),
        ))
    })
}

fn refusal(code: &str, message: String) -> Refusal {
    Refusal {
        exit_code: EXIT_CORRAL_ERROR,
        code: code.into(),
        message,
        events: Vec::new(),
        unused: None,
    }
}

/// The refusal of a run of `profile` that waits, or would wait, on a host
/// path that does not answer; `what` says what was seen.
fn unanswered(profile: &Profile, what: String) -> Refusal {
    refusal(
        PlanGate::CODE,
        format!(
            "profile `{}`: {what}: a path of the host's that the profile sees does not answer (a network filesystem whose server is down? its binds: {}); runs of this profile are refused until the host answers; check the mounts, then `corral check`",
            profile.name,
            bind_sources(Some(profile)),
        ),
    )
}

/// The host paths a profile binds, for messages: where a hung mount is
/// most likely to be.
fn bind_sources(profile: Option<&Profile>) -> String {
    match profile.map(Profile::host_sources) {
        Some(sources) if !sources.is_empty() => sources.join(", "),
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn profile(name: &str) -> Profile {
        let mut p = corral_policy::builtin::code();
        p.name = name.into();
        p
    }

    #[test]
    fn a_plans_bound_is_its_runs_timeout_within_5_to_10_s() {
        let s = Duration::from_secs;
        assert_eq!(
            plan_limit(Some(1)),
            s(5),
            "a slow filesystem is not a dead one"
        );
        assert_eq!(plan_limit(Some(7)), s(7));
        assert_eq!(plan_limit(Some(300)), s(10));
        assert_eq!(plan_limit(None), s(10));
    }

    /// A stand-in for `execute`: waits until `go`, then passes the gate
    /// as the launcher does once the plan stands.
    fn planning(
        gate: Arc<PlanGate>,
        go: mpsc::Receiver<()>,
        returned: mpsc::Sender<()>,
    ) -> impl FnOnce() -> Result<&'static str, Refusal> + Send + 'static {
        move || {
            let _ = go.recv();
            let ran = if gate.pass() {
                Ok("launched")
            } else {
                Err(refusal(PlanGate::CODE, "given up".into()))
            };
            let _ = returned.send(());
            ran
        }
    }

    #[test]
    fn a_plan_that_waits_too_long_is_given_up_and_stalls_its_profile_until_it_returns() {
        let stalls = Arc::new(Stalls::default());
        let (hung, other) = (profile("hung"), profile("other"));
        let (go, wait) = mpsc::channel();
        let (returned, has_returned) = mpsc::channel();
        let (late_results, late) = mpsc::channel();
        let gate = Arc::new(PlanGate::new());
        let ran = execute_bounded(
            &stalls,
            &hung,
            Duration::from_millis(200),
            gate.clone(),
            planning(gate.clone(), wait, returned),
            move |late| late_results.send(late.is_err()).unwrap(),
        );
        let refused = ran.expect_err("given up");
        assert_eq!(refused.code, PlanGate::CODE);
        assert!(
            refused.message.contains("profile `hung`"),
            "{}",
            refused.message
        );
        // Refused at once while that plan waits; another profile is not.
        let again = stalls.check(&hung).expect_err("stalled");
        assert!(again.message.contains("still waiting"), "{}", again.message);
        assert!(stalls.check(&other).is_ok());
        // Its lookups return: it never launches, its result goes to
        // `late`, and the stall is over.
        go.send(()).unwrap();
        has_returned.recv().unwrap();
        assert!(
            late.recv().unwrap(),
            "a run given up is refused at its gate"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while stalls.check(&hung).is_err() {
            assert!(Instant::now() < deadline, "the stall outlived its plan");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!gate.abandon(), "decided once");
    }

    /// On a pool of blocking threads that is full, a plan waits in its
    /// queue: that wait is the pool's, not the host's, and does not count
    /// against its bound.
    #[test]
    fn a_plan_queued_behind_a_full_pool_is_not_given_up() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_time()
            .build()
            .expect("a runtime");
        let ran = runtime.block_on(async {
            // The pool's other thread is busy for 1 s.
            let busy = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_secs(1)));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let waiting = tokio::task::spawn_blocking(|| {
                let stalls = Arc::new(Stalls::default());
                let gate = Arc::new(PlanGate::new());
                let passed = gate.clone();
                let ran = execute_bounded(
                    &stalls,
                    &profile("queued"),
                    Duration::from_millis(300),
                    gate,
                    move || {
                        assert!(passed.pass());
                        Ok("launched")
                    },
                    |_| panic!("not given up"),
                );
                (ran, stalls.check(&profile("queued")).is_ok())
            });
            busy.await.expect("the busy task");
            waiting.await.expect("the waiting task")
        });
        assert_eq!(ran.0.expect("planned once it started"), "launched");
        assert!(ran.1, "no stall");
    }

    #[test]
    fn a_plan_in_time_runs_and_a_launched_run_is_waited_for() {
        let stalls = Arc::new(Stalls::default());
        let hung = profile("hung");
        let (go, wait) = mpsc::channel();
        let (returned, _) = mpsc::channel();
        go.send(()).unwrap();
        let gate = Arc::new(PlanGate::new());
        let ran = execute_bounded(
            &stalls,
            &hung,
            Duration::from_secs(10),
            gate.clone(),
            planning(gate, wait, returned),
            |_| panic!("not given up"),
        );
        assert_eq!(ran.expect("ran"), "launched");
        // Past its gate, a run outlasting the plan's bound is waited for.
        let gate = Arc::new(PlanGate::new());
        let passed = gate.clone();
        let ran = execute_bounded(
            &stalls,
            &hung,
            Duration::from_millis(50),
            gate,
            move || {
                assert!(passed.pass());
                std::thread::sleep(Duration::from_millis(300));
                Ok("launched")
            },
            |_| panic!("not given up"),
        );
        assert_eq!(ran.expect("waited for"), "launched");
        assert!(stalls.check(&hung).is_ok());
    }
}

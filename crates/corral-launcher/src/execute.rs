//! One execution from request to result: plan, cgroup, proxy, launch, and
//! the [`RunResult`] every front end reports (`corral run --json`, the
//! HTTP service, MCP). Front ends only add their own input and output.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use corral_policy::{AuditEvent, Level, Limits, NetworkMode, Profile, ReasonCode};

use corral_helper::{FailureKind, RlimitKind, SandboxIdentity, SandboxPlan, EXIT_CORRAL_ERROR};

use crate::contain::{cgroup_limits, LimitsUnenforceable, RunCgroup, RunCgroupStats};
use crate::egress::ProxyService;
use crate::events::EventSink;
use crate::gate::PlanGate;
use crate::launch::{
    launch_settling, EgressProxy, HelperStart, LaunchOptions, Leftover, Outcome, OutputMode,
    StartedHelper,
};
use crate::plan::{build_plan, program_for_held, sandbox_identity, with_program, RunRequest};
use crate::prepared::PreparedSandbox;
use crate::protect::{ProtectError, Protection};
use crate::reexec::ReadyHelper;
use crate::resolve::CommandTable;
use crate::result::{Enforced, ErrorInfo, RunResult};

/// The error code of a run a signal ended while its sandbox was being set
/// up ([`Outcome::interrupted`]).
const RUN_INTERRUPTED: &str = "run.interrupted";

/// How the front end wants the run done.
pub struct ExecuteOptions {
    /// Streamed (CLI without --json) or captured.
    pub output: OutputMode,
    /// Fork (single-threaded CLI) or re-exec (anything with threads).
    pub helper: HelperStart,
    /// Forward the CLI's signals to the program.
    pub forward_signals: bool,
    /// Set to kill the sandbox early.
    pub cancel: Option<Arc<AtomicBool>>,
    /// The program's stdin; `None` inherits the caller's.
    pub stdin: Option<Arc<std::fs::File>>,
    /// Sees output chunks as they arrive (streaming front ends).
    pub tap: Option<crate::launch::OutputTap>,
    /// With [`HelperStart::ReExec`]: where a helper started ahead of the
    /// run comes from (a server's warm pool), asked once the plan stands;
    /// `None` starts one now.
    pub prestarted: Option<PrestartedSource>,
    /// With [`HelperStart::ReExec`]: a sandbox built ahead (a server's
    /// prepared pool). Used when the run has the inputs it was built from
    /// and the same cgroup limits, and its plan is that sandbox's (only
    /// the program is planned when no path a run can write shapes the
    /// sandbox); otherwise the run starts as
    /// without it and the sandbox is let go with the run's [`Remains`],
    /// after the answer. A refused run hands it back untouched
    /// ([`Refusal::unused`]).
    pub prepared: Option<PreparedSandbox>,
    /// Lets the caller give the run up while it plans (see [`PlanGate`]):
    /// checked once the plan stands, before anything is started.
    pub gate: Option<Arc<PlanGate>>,
}

/// Hands out a helper started ahead of a run with these limits (see
/// [`Prestarted`]).
pub type PrestartedSource = fn(&Limits) -> std::io::Result<Prestarted>;

/// A re-executed helper started before the run, with the cgroup it may
/// already wait in.
pub struct Prestarted {
    /// The helper, waiting for its plan.
    pub helper: ReadyHelper,
    /// The group made for it, for the run's limits.
    pub group: Option<RunCgroup>,
    /// Whether it already sits in `group`; if not, the run puts it there
    /// (on cgroup v1 the helper joins by itself, first thing).
    pub contained: bool,
    /// A group made for it for other limits (it may sit in it already):
    /// the run puts the helper into a group of its own and removes this
    /// one afterwards (with [`RunCgroup::finish`]), once it is empty.
    pub former_group: Option<RunCgroup>,
}

/// A run refused before (or while) the sandbox was built.
#[derive(Debug)]
pub struct Refusal {
    /// Exit status (125, or 127 for a missing command).
    pub exit_code: i32,
    /// Stable error code.
    pub code: String,
    /// What happened and what to do.
    pub message: String,
    /// Security events up to the refusal.
    pub events: Vec<AuditEvent>,
    /// The sandbox built ahead that the run was given
    /// ([`ExecuteOptions::prepared`]), untouched: the run was refused
    /// before it sent anything to it or launched a sandbox of its own.
    /// The caller may keep it for another run, or let it go after
    /// answering (letting one go waits for its processes to end). Boxed:
    /// a refusal is an `Err`, kept small.
    pub unused: Option<Box<PreparedSandbox>>,
}

/// A finished run.
pub struct Execution {
    /// The result object.
    pub result: RunResult,
    /// The launcher's own view, for front ends that report more.
    pub outcome: Outcome,
    /// The cgroup's measurements.
    pub stats: RunCgroupStats,
    /// What the sandbox still holds while it leaves; see [`Remains`].
    pub remains: Remains,
}

/// What a run still holds once its result stands: the sandbox's last
/// processes (init and the helper, tearing down the namespaces) and,
/// after them, its cgroup, its placeholders and a group its helper came
/// from. [`Remains::finish`] waits for the processes and removes the rest;
/// a front end answers first and calls it after, holding the run's slot
/// until it returns. Dropping it does the same, so nothing is ever left.
#[must_use = "the sandbox's remains must be finished (or dropped) once the result is out"]
pub struct Remains {
    leftover: Option<Leftover>,
    containment: Option<RunCgroup>,
    protection: Option<Protection>,
    former_group: Option<RunCgroup>,
    /// A sandbox built ahead that this run's plan did not fit.
    unused: Option<PreparedSandbox>,
}

impl Remains {
    /// Waits until the sandbox's last process has ended, then removes its
    /// cgroup and placeholders (blocking; milliseconds).
    pub fn finish(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if let Some(leftover) = self.leftover.take() {
            leftover.wait();
        }
        // Every process of the sandbox is gone: its group and placeholders
        // can go.
        if let Some(group) = self.containment.take() {
            group.remove();
        }
        if let Some(protection) = self.protection.take() {
            protection.finish();
        }
        // The helper left it when it was moved into this run's group.
        if let Some(group) = self.former_group.take() {
            group.finish();
        }
        if let Some(sandbox) = self.unused.take() {
            sandbox.release();
        }
    }
}

impl Drop for Remains {
    fn drop(&mut self) {
        self.release();
    }
}

fn refusal(exit_code: i32, code: &str, message: String, events: Vec<AuditEvent>) -> Refusal {
    Refusal {
        exit_code,
        code: code.into(),
        message,
        events,
        unused: None,
    }
}

/// Runs `request` under `profile`. `sink` gets every event as it
/// arises, from whichever thread decides it: security decisions before the
/// program starts, `limits.unenforced`, `run.start`, each network decision
/// of the proxy while the program runs, then `run.timeout`, `run.oom` and
/// `run.exit`. The result's `events` holds the security events (not the
/// `run.*` ones, whose facts are the result's own fields). A run refused
/// or failing to start also ends with `run.exit` (outcome `refused`, or
/// `error` when the sandbox could not be launched).
pub fn execute(
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    lookup_env: &dyn Fn(&str) -> Option<String>,
    mut opts: ExecuteOptions,
    sink: &Arc<dyn EventSink>,
) -> Result<Execution, Refusal> {
    // Still here after a refusal only when the run was refused before it
    // launched anything: see `execute_run`.
    let mut prepared = opts.prepared.take();
    let mut run = execute_run(
        profile,
        commands,
        request,
        lookup_env,
        opts,
        &mut prepared,
        sink,
    );
    if let Err(r) = &mut run {
        r.unused = prepared.map(Box::new);
    }
    if let Err(r) = &run {
        let (level, outcome) = if r.code == "sandbox.launch" {
            (Level::Error, "error")
        } else {
            (Level::Warn, "refused")
        };
        sink.emit(
            &AuditEvent::new(
                level,
                ReasonCode::RunExit,
                format!("run {outcome}: {}", r.message),
            )
            .with("outcome", outcome)
            .with("error", r.code.as_str())
            .with("exit_code", r.exit_code),
        );
    }
    run
}

/// What a run planned: its program, for the sandbox built ahead that fits
/// it (whose plan it borrows until it takes the sandbox), or its whole
/// plan.
enum Planned<'a> {
    Program(corral_helper::ProgramPlan, &'a SandboxPlan),
    Whole(Box<SandboxPlan>),
}

/// [`execute`] but for the `run.exit` of a refusal. Takes the sandbox
/// built ahead out of `prepared` when the run fits it; one it does not fit
/// stays there until the run launches its own sandbox (in the same
/// workspace, which the unused one then no longer has as it was made), and
/// goes with the run's [`Remains`] from then on, let go after the answer.
fn execute_run(
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    lookup_env: &dyn Fn(&str) -> Option<String>,
    opts: ExecuteOptions,
    prepared: &mut Option<PreparedSandbox>,
    sink: &Arc<dyn EventSink>,
) -> Result<Execution, Refusal> {
    let emit_all = |events: &[AuditEvent]| events.iter().for_each(|e| sink.emit(e));
    let identity = sandbox_identity(profile);
    // A sandbox built ahead from this run's inputs has planned all but
    // the program already; unless paths a run can write shape the
    // sandbox, the host is not looked at again.
    let fitting = prepared.as_ref().filter(|p| {
        opts.helper == HelperStart::ReExec
            && p.fits(profile, identity, request, &cgroup_limits(&profile.limits))
    });
    // Only the program, for the sandbox built ahead (its plan is taken
    // with it, below), or the whole plan.
    let for_held = fitting.map(|held| {
        let program = program_for_held(held.plan(), profile, commands, request, lookup_env);
        (held.plan(), program)
    });
    let planned = match for_held {
        Some((held, Ok(Some((program, events))))) => Ok((Planned::Program(program, held), events)),
        Some((_, Err(e))) => Err(e),
        _ => build_plan(profile, commands, request, identity, lookup_env)
            .map(|(plan, events)| (Planned::Whole(Box::new(plan)), events)),
    };
    let (planned, mut events) = match planned {
        Ok(p) => p,
        Err(e) => {
            let events: Vec<AuditEvent> = e.event().cloned().into_iter().collect();
            emit_all(&events);
            return Err(refusal(e.exit_code(), e.code(), e.to_string(), events));
        }
    };
    // The sandbox part of the run's plan, and whether the sandbox built
    // ahead is what it plans (planned in full: only if it is this one).
    let (plan, use_held) = match &planned {
        Planned::Program(_, held) => (*held, true),
        Planned::Whole(plan) => (
            &**plan,
            fitting.is_some_and(|p| p.plan().same_sandbox(plan)),
        ),
    };
    if plan.network == NetworkMode::Host {
        events.push(AuditEvent::new(
            Level::Warn,
            ReasonCode::NetHost,
            "the sandbox shares the HOST network, unfiltered (network mode `host`)",
        ));
    }
    if plan.reduced.is_some() {
        events.push(
            AuditEvent::new(
                Level::Warn,
                ReasonCode::SandboxReduced,
                "running WITHOUT namespaces (--without-namespaces): Landlock, seccomp, rlimits, env scrub and output bounds only",
            )
            .with("workdir", plan.cwd.as_str()),
        );
    }
    // A run given up while it planned: no placeholders made to be undone.
    let given_up = |events: Vec<AuditEvent>| {
        refusal(
            EXIT_CORRAL_ERROR,
            PlanGate::CODE,
            "the run was given up while it planned: a path of the host's that it looks at did not answer in time".into(),
            events,
        )
    };
    if opts.gate.as_ref().is_some_and(|g| g.is_abandoned()) {
        emit_all(&events);
        return Err(given_up(events));
    }
    let protection = match Protection::prepare(&plan.mounts) {
        Ok(p) => p,
        Err(e) => {
            emit_all(&events);
            return Err(refusal(
                EXIT_CORRAL_ERROR,
                ProtectError::CODE,
                e.to_string(),
                events,
            ));
        }
    };
    if let Some(event) = protection_event(plan, &protection) {
        events.push(event);
    }
    emit_all(&events);
    // The last look at the host is over: from here the run's own timeout
    // bounds it, unless its caller gave it up while it planned.
    if opts.gate.as_ref().is_some_and(|g| !g.pass()) {
        drop(protection);
        return Err(given_up(events));
    }
    let program = match planned {
        Planned::Program(program, _) => Ok(program),
        Planned::Whole(plan) => Err(plan),
    };
    // The sandbox built ahead that planned this run takes it whole, and
    // its plan with the run's program put in (or the run's own plan).
    let held = if use_held {
        prepared.take().map(PreparedSandbox::into_parts)
    } else {
        None
    };
    let (held, plan) = match (program, held) {
        (Err(plan), held) => (held.map(|(helper, group, _)| (helper, group)), *plan),
        (Ok(program), Some((helper, group, held_plan))) => {
            (Some((helper, group)), with_program(held_plan, program))
        }
        // Not reached: a program is planned only for the sandbox built
        // ahead, which is taken above.
        (Ok(_), None) => {
            return Err(refusal(
                EXIT_CORRAL_ERROR,
                "sandbox.setup",
                "the run's program was planned for a sandbox built ahead that is gone".into(),
                events,
            ))
        }
    };
    // The sandbox built ahead, or a re-executed helper that may be waiting
    // already, maybe in its group; the forked CLI helper starts in launch.
    let (started, waiting_group, former_group) = match (opts.helper, held) {
        (_, Some((helper, group))) => {
            let contained = group.as_containment().is_some();
            let started = StartedHelper {
                helper,
                contained,
                holding: true,
            };
            (Some(started), Some(group), None)
        }
        (HelperStart::ReExec, None) => {
            let waiting = match opts.prestarted {
                Some(source) => source(&profile.limits),
                None => ReadyHelper::spawn().map(|helper| Prestarted {
                    helper,
                    group: None,
                    contained: false,
                    former_group: None,
                }),
            };
            let t = waiting.map_err(|e| {
                refusal(
                    EXIT_CORRAL_ERROR,
                    "sandbox.launch",
                    format!("starting the sandbox helper: {e}"),
                    events.clone(),
                )
            })?;
            let started = StartedHelper {
                helper: t.helper,
                contained: t.contained && t.group.is_some(),
                holding: false,
            };
            (Some(started), t.group, t.former_group)
        }
        (HelperStart::Fork, None) => (None, None, None),
    };
    let containment = match waiting_group {
        Some(group) => Ok(group),
        // The CLI's own clone of init: on cgroup v1 the group is checked
        // now and made while init builds the root (see
        // `RunCgroup::for_limits_made_after_start`).
        None if opts.helper == HelperStart::Fork => {
            RunCgroup::for_limits_made_after_start(&profile.limits)
        }
        None => RunCgroup::for_limits(&profile.limits),
    }
    .map_err(|e| {
        refusal(
            EXIT_CORRAL_ERROR,
            LimitsUnenforceable::CODE,
            e.to_string(),
            events.clone(),
        )
    })?;
    let launch_opts = LaunchOptions {
        output: opts.output,
        output_bytes: usize::try_from(profile.limits.output_bytes.bytes()).unwrap_or(usize::MAX),
        output_kill_bytes: profile.limits.output_kill_bytes.map(|b| b.bytes()),
        timeout: profile.limits.timeout_secs.map(Duration::from_secs),
        forward_signals: opts.forward_signals,
        helper: opts.helper,
        cancel: opts.cancel,
        stdin: opts.stdin,
        tap: opts.tap,
    };
    if !containment.not_enforced().is_empty() {
        let unenforced = AuditEvent::new(
            Level::Warn,
            ReasonCode::LimitsUnenforced,
            format!(
                "running WITHOUT the {} limit (allow_unenforced): this host cannot enforce it for this user",
                containment.not_enforced().join(" and ")
            ),
        )
        .with("limits", containment.not_enforced().to_vec());
        sink.emit(&unenforced);
        events.push(unenforced);
    }
    sink.emit(&start_event(profile, &plan, request));
    let mut proxy = ProxyService::new(profile.network.clone(), Arc::clone(sink));
    let egress: Option<&mut dyn EgressProxy> =
        (plan.network == NetworkMode::Allow).then_some(&mut proxy as _);
    let displaced = prepared.take();
    let launched = launch_settling(
        &plan,
        &launch_opts,
        containment.as_containment(),
        egress,
        started,
    );
    let (outcome, leftover) = launched.map_err(|e| {
        refusal(
            EXIT_CORRAL_ERROR,
            "sandbox.launch",
            e.to_string(),
            events.clone(),
        )
    })?;
    // The proxy's events went to the sink as they happened.
    let in_force = enforced(&plan, identity, &containment, &outcome);
    // Final: nothing of the program runs any more.
    let stats = containment.stats();
    let remains = Remains {
        leftover: Some(leftover),
        containment: Some(containment),
        protection: Some(protection),
        former_group,
        unused: displaced,
    };
    let sandbox_started = (outcome.interrupted.is_none() || outcome.landlock.is_some())
        && outcome
            .failure
            .as_ref()
            .is_none_or(|(k, _)| matches!(k, FailureKind::ExecNotFound | FailureKind::ExecFailed));
    let error = match (&outcome.failure, outcome.interrupted_message()) {
        (Some((kind, message)), _) => Some(ErrorInfo {
            code: Outcome::failure_code(*kind).into(),
            message: message.clone(),
        }),
        (None, Some(message)) => Some(ErrorInfo {
            code: RUN_INTERRUPTED.into(),
            message,
        }),
        (None, None) => None,
    };
    events.extend(outcome.network_events.iter().cloned());
    let result = RunResult {
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        timed_out: outcome.timed_out,
        oom_killed: stats.oom_killed,
        output_limit_exceeded: outcome.output_killed,
        limits_hit: limits_hit(&plan, &outcome, &stats),
        stdout: String::from_utf8_lossy(&outcome.stdout.data).into_owned(),
        stderr: String::from_utf8_lossy(&outcome.stderr.data).into_owned(),
        stdout_bytes: outcome.stdout.total,
        stderr_bytes: outcome.stderr.total,
        stdout_truncated: outcome.stdout.truncated,
        stderr_truncated: outcome.stderr.truncated,
        wall_ms: u64::try_from(outcome.wall.as_millis()).unwrap_or(u64::MAX),
        cpu_ms: stats.cpu_ms.unwrap_or(outcome.usage.cpu_us / 1000),
        peak_memory_bytes: stats
            .peak_memory_bytes
            .unwrap_or(outcome.usage.max_rss_bytes),
        error,
        events,
        enforced: sandbox_started.then_some(in_force),
    };
    for e in end_events(&result, &outcome, profile) {
        sink.emit(&e);
    }
    Ok(Execution {
        result,
        outcome,
        stats,
        remains,
    })
}

/// The `fs.protected` event: which entries of writable binds are
/// read-only for this run, and how many are placeholders.
fn protection_event(plan: &SandboxPlan, protection: &Protection) -> Option<AuditEvent> {
    let entries: Vec<&str> = plan
        .mounts
        .iter()
        .filter_map(|op| match op {
            corral_helper::MountOp::Protect {
                dest,
                read_only: true,
                ..
            } => Some(dest.as_str()),
            _ => None,
        })
        .collect();
    if entries.is_empty() {
        return None;
    }
    Some(
        AuditEvent::new(
            Level::Info,
            ReasonCode::FsProtected,
            format!(
                "{} entries of writable binds are read-only ({} stand in as empty placeholders while missing)",
                entries.len(),
                protection.placeholders()
            ),
        )
        .with("entries", entries)
        .with("placeholders", protection.placeholders()),
    )
}

/// `run.start`: the sandbox is about to start. The argv itself is not
/// written (it may hold secrets); every line carries its hash.
fn start_event(profile: &Profile, plan: &SandboxPlan, request: &RunRequest) -> AuditEvent {
    let network = match plan.network {
        NetworkMode::None => "none",
        NetworkMode::Allow => "allow",
        NetworkMode::Host => "host",
    };
    let mut e = AuditEvent::new(Level::Info, ReasonCode::RunStart, "sandbox starting")
        .with(
            "command",
            request.argv.first().map(String::as_str).unwrap_or(""),
        )
        .with("network", network)
        .with("reduced", plan.reduced.is_some());
    if let Some(t) = profile.limits.timeout_secs {
        e = e.with("timeout_secs", t);
    }
    e
}

/// How a run ended, in one word: `error` (corral or the sandbox set-up
/// failed), `timeout`, `output_limit`, `oom`, `signal` or `exit`.
fn outcome_word(result: &RunResult) -> &'static str {
    let setup_failed = result
        .error
        .as_ref()
        .is_some_and(|e| !e.code.starts_with("exec."));
    if setup_failed {
        "error"
    } else if result.timed_out {
        "timeout"
    } else if result.output_limit_exceeded {
        "output_limit"
    } else if result.oom_killed {
        "oom"
    } else if result.signal.is_some() {
        "signal"
    } else {
        "exit"
    }
}

/// `run.timeout` and `run.oom` when they happened, then `run.exit`.
fn end_events(result: &RunResult, outcome: &Outcome, profile: &Profile) -> Vec<AuditEvent> {
    let mut out = Vec::new();
    if result.timed_out {
        let secs = profile.limits.timeout_secs.unwrap_or_default();
        out.push(
            AuditEvent::new(
                Level::Warn,
                ReasonCode::RunTimeout,
                outcome.timeout_message(secs),
            )
            .with("timeout_secs", secs)
            .with("program_started", outcome.landlock.is_some()),
        );
    }
    if result.oom_killed {
        let mut e = AuditEvent::new(
            Level::Warn,
            ReasonCode::RunOom,
            "out of memory: the kernel killed a process at the memory limit",
        );
        if let Some(m) = profile.limits.memory_bytes {
            e = e.with("memory_bytes", m.bytes());
        }
        out.push(e);
    }
    let outcome = outcome_word(result);
    let level = match outcome {
        "exit" | "signal" => Level::Info,
        "error" => Level::Error,
        _ => Level::Warn,
    };
    let mut exit = AuditEvent::new(level, ReasonCode::RunExit, format!("run ended ({outcome})"))
        .with("outcome", outcome)
        .with("exit_code", result.exit_code)
        .with("signal", result.signal)
        .with("wall_ms", result.wall_ms)
        .with("cpu_ms", result.cpu_ms)
        .with("peak_memory_bytes", result.peak_memory_bytes)
        .with("limits_hit", result.limits_hit.clone());
    if let Some(error) = &result.error {
        exit = exit.with("error", error.code.as_str());
    }
    out.push(exit);
    out
}

/// Which limits the run ran into (see [`RunResult::limits_hit`]).
fn limits_hit(plan: &SandboxPlan, outcome: &Outcome, stats: &RunCgroupStats) -> Vec<&'static str> {
    let rlimit_set = |kind: RlimitKind| plan.rlimits.iter().any(|r| r.kind == kind);
    [
        ("timeout", outcome.timed_out),
        ("output", outcome.output_killed),
        ("memory", stats.oom_killed),
        ("pids", stats.pids_limit_hit),
        (
            "file_size",
            outcome.signal == Some(libc::SIGXFSZ) && rlimit_set(RlimitKind::FileSize),
        ),
        (
            "cpu_time",
            outcome.signal == Some(libc::SIGXCPU) && rlimit_set(RlimitKind::CpuTime),
        ),
    ]
    .into_iter()
    .filter(|(_, hit)| *hit)
    .map(|(name, _)| name)
    .collect()
}

fn rlimit_name(kind: RlimitKind) -> &'static str {
    match kind {
        RlimitKind::AddressSpace => "address_space",
        RlimitKind::CpuTime => "cpu_time",
        RlimitKind::FileSize => "file_size",
        RlimitKind::OpenFiles => "open_files",
        RlimitKind::Processes => "processes",
        RlimitKind::Core => "core",
        RlimitKind::PendingSignals => "pending_signals",
    }
}

/// What was in force, for the result.
fn enforced(
    plan: &SandboxPlan,
    identity: SandboxIdentity,
    containment: &RunCgroup,
    outcome: &Outcome,
) -> Enforced {
    let mut e = if plan.reduced.is_some() {
        Enforced::reduced(identity.uid, identity.gid)
    } else {
        Enforced::full_sandbox(identity.uid, identity.gid)
    };
    // Without a user namespace an ordinary user cannot empty the bounding
    // set (no_new_privs keeps it unusable); say so.
    e.capabilities_dropped = plan.reduced.is_none() || identity.drop_from_root;
    if plan.reduced.is_none() {
        e.network = match plan.network {
            NetworkMode::None => "none".into(),
            NetworkMode::Allow => "allow".into(),
            NetworkMode::Host => {
                e.namespaces.retain(|n| *n != "net");
                "host".into()
            }
        };
    }
    for r in &plan.rlimits {
        e.rlimits.insert(rlimit_name(r.kind).into(), r.soft);
    }
    e.cgroup = containment.enforced();
    e.not_enforced = containment.not_enforced().to_vec();
    // Reported by the program's process itself, just before execve; absent
    // when it never got that far.
    if outcome.landlock.is_some() {
        e.seccomp = Some(match plan.security.seccomp_profile {
            corral_policy::SeccompProfile::Default => "default".into(),
            corral_policy::SeccompProfile::Strict => "strict".into(),
        });
        e.landlock = outcome.landlock.clone();
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::NoEvents;

    /// A run given up while it planned is refused at the gate, before
    /// anything is started (no helper, no group): no root needed.
    #[test]
    fn a_run_given_up_while_it_planned_never_launches() {
        let profile = corral_policy::builtin::code();
        let work = tempfile::tempdir().expect("tempdir");
        // As root, a workdir root owns is refused: the sandbox's own
        // (fails, harmlessly, unprivileged: the directory is the user's).
        let id = sandbox_identity(&profile);
        let _ = std::os::unix::fs::chown(work.path(), Some(id.uid), Some(id.gid));
        let request = RunRequest {
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            workdir: Some(work.path().to_path_buf()),
            ..Default::default()
        };
        let commands = CommandTable::resolve(&profile, Some("/usr/bin:/bin"));
        let gate = Arc::new(PlanGate::new());
        assert!(gate.abandon());
        let opts = ExecuteOptions {
            output: OutputMode::Capture,
            helper: HelperStart::ReExec,
            forward_signals: false,
            cancel: None,
            stdin: None,
            tap: None,
            // Would start a helper: never called.
            prestarted: Some(|_| panic!("a run given up started a helper")),
            prepared: None,
            gate: Some(gate),
        };
        let sink: Arc<dyn EventSink> = Arc::new(NoEvents);
        let refused = match execute(&profile, &commands, &request, &|_| None, opts, &sink) {
            Err(r) => r,
            Ok(_) => panic!("a run given up launched"),
        };
        assert_eq!(refused.code, PlanGate::CODE, "{}", refused.message);
        assert_eq!(refused.exit_code, EXIT_CORRAL_ERROR);
    }
}

//! The parent side: spawn the helper, send the plan, drain output, enforce
//! the wall-clock timeout and the output ceilings, and turn what happened
//! into an [`Outcome`].
//!
//! Captured output is read as fast as the program writes it (drain-and-kill,
//! never stop-and-wait), within the output budget. Streamed output is a
//! pipe: it moves at the reader's pace, and a stalled reader blocks the
//! program's writes, never corral's loop (see `pump`). Either way corral's
//! memory stays flat whatever the program prints, and past the kill
//! ceiling (when there is one) the whole sandbox is killed.
//!
//! Nothing here runs between fork and exec (re-executed helpers are
//! started with `posix_spawn`, see [`ReadyHelper::spawn`]), so it is safe
//! to call from a multi-threaded server.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use corral_sys::fd;
use corral_sys::process::{self, Usage, WaitStatus};
use corral_sys::signal::SignalFd;

use crate::pump::{Exit, Finished, Pump};
use corral_helper::{
    FailureKind, InitParent, LandlockOutcome, SandboxPlan, EXIT_CORRAL_ERROR, EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND, GO_AHEAD, HELPER_SUBCOMMAND, JOIN_MESSAGE, PLAN_MESSAGE, PROGRAM_MESSAGE,
};

use crate::reexec::ReadyHelper;

/// What happens to the program's stdout and stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Passed on to corral's own stdout/stderr as a pipe would: as fast as
    /// the reader takes it and no faster (spliced when corral's end is a
    /// pipe, else through a buffer of at most 64 KiB per stream). Nothing
    /// is kept, elided or added; the budget plays no part.
    Stream,
    /// Captured into the result: head and tail within the budget.
    Capture,
}

/// How to launch.
#[derive(Clone)]
pub struct LaunchOptions {
    /// Output handling.
    pub output: OutputMode,
    /// Bytes of each stream kept in [`OutputMode::Capture`].
    pub output_bytes: usize,
    /// Bytes written to one stream (in total) after which the sandbox is
    /// killed; `None`: no ceiling.
    pub output_kill_bytes: Option<u64>,
    /// Wall-clock limit.
    pub timeout: Option<Duration>,
    /// Forward SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
    /// received by this process to the program (through the helper and
    /// init). For the CLI; blocks those signals on the calling thread.
    pub forward_signals: bool,
    /// How the helper process starts.
    pub helper: HelperStart,
    /// Set to true by the caller to kill the sandbox early (a client that
    /// went away); checked at least every 100 ms.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The program's standard input; `None` passes corral's own (the CLI).
    /// A service passes `/dev/null` or a file with the request's input.
    pub stdin: Option<std::sync::Arc<File>>,
    /// Called with every chunk the program writes (1 = stdout, 2 =
    /// stderr) as it arrives, for streaming front ends. It must not block:
    /// the drain waits for nothing.
    pub tap: Option<OutputTap>,
}

/// A non-blocking observer of the program's output.
pub type OutputTap = std::sync::Arc<dyn Fn(u8, &[u8]) + Send + Sync>;

/// How the sandbox helper starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperStart {
    /// Re-execute corral's own binary as `corral __sandbox-helper` and send
    /// it the plan: the only safe way from a multi-threaded process (the
    /// server), since nothing but `dup2` runs between its fork and exec.
    ReExec,
    /// Fork this process and run the helper in the child without exec,
    /// saving a whole program start. Refused unless the calling process is
    /// single-threaded (the CLI).
    Fork,
}

/// A re-executed helper the caller started before the run (a server's
/// warm pool), and whether it already sits in the run's cgroup.
pub struct StartedHelper {
    /// The helper, waiting for its plan.
    pub helper: ReadyHelper,
    /// Whether it was already moved into the run's cgroup.
    pub contained: bool,
    /// Whether it already holds the sandbox of this run's plan, built
    /// ahead and waiting for the program (see
    /// [`crate::PreparedSandbox`]): the run then sends only the program.
    pub holding: bool,
}

/// Signals the CLI forwards to the program.
pub const FORWARDED_SIGNALS: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Whatever besides the pid namespace holds the sandbox's processes (its
/// cgroup): the launcher puts the helper in it before the helper does
/// anything, and kills through it.
pub trait Containment {
    /// Moves `pid` (the helper, still waiting for its plan) in.
    fn add_process(&self, pid: i32) -> std::io::Result<()>;
    /// Files a forked, single-threaded helper writes `0` to in order to
    /// move itself in, instead of being moved by pid (see
    /// `SandboxCgroup::self_join_files`); empty when it cannot (then
    /// [`Containment::add_process`] is used).
    fn self_join_files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
    /// Whether the group is still to be made (cgroup v1 only, see
    /// `RunCgroup::for_limits_made_after_start`): `launch` then clones init
    /// before it exists and calls [`Containment::make_for_init`] while init
    /// builds the sandbox's root; init joins before its program starts.
    fn made_after_start(&self) -> bool {
        false
    }
    /// Makes the group if it is still to be made, and opens the files init
    /// writes `0` to in order to move itself in (as
    /// [`Containment::self_join_files`]).
    fn make_for_init(&self) -> std::io::Result<Vec<OwnedFd>> {
        Ok(Vec::new())
    }
    /// Kills every process inside.
    fn kill_all(&self);
    /// Work that can wait until the sandbox has started (for a run's
    /// cgroup, [`crate::RunCgroup::settle`]). `launch` calls it once,
    /// right after it started the helper or init, so that it overlaps
    /// with their set-up instead of delaying it.
    fn while_starting(&self) {}
}

/// corral's egress proxy for network mode `allow`. The sandbox creates its
/// listening sockets inside its own network namespace and hands them over;
/// the launcher passes them here, on the host side.
pub trait EgressProxy {
    /// Starts serving the two listeners (called once, when they arrive).
    fn start(
        &mut self,
        http: std::net::TcpListener,
        socks: std::net::TcpListener,
    ) -> std::io::Result<()>;
    /// Stops serving and returns one audit event per connection.
    fn stop(&mut self) -> Vec<corral_policy::AuditEvent>;
}

/// One output stream as reported.
#[derive(Debug, Clone, Default)]
pub struct StreamResult {
    /// Bytes kept (captured mode) or the tail printed (stream mode).
    pub data: Vec<u8>,
    /// Bytes the program wrote in total.
    pub total: u64,
    /// Whether some bytes were not kept.
    pub truncated: bool,
}

/// What happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// corral's exit status for this run.
    pub exit_code: i32,
    /// Signal that ended the program.
    pub signal: Option<i32>,
    /// Whether the timeout fired.
    pub timed_out: bool,
    /// Whether a stream passed the kill ceiling and the sandbox was killed.
    pub output_killed: bool,
    /// The signal (SIGINT, SIGTERM, SIGHUP or SIGQUIT) that reached corral
    /// before the program's process reported its layers, so that it was
    /// not passed on: the whole sandbox was killed, and the exit status is
    /// 128 + it, as a shell expects of a process that signal ended. The
    /// program had not started, unless it got as far as its report while
    /// the kill was on its way ([`Outcome::landlock`] is then set).
    pub interrupted: Option<i32>,
    /// Set-up or exec failure reported by the helper.
    pub failure: Option<(FailureKind, String)>,
    /// stdout.
    pub stdout: StreamResult,
    /// stderr.
    pub stderr: StreamResult,
    /// Wall time.
    pub wall: Duration,
    /// CPU time and peak RSS of the whole sandbox tree, from wait4.
    pub usage: Usage,
    /// Landlock as the program's process reported it before exec.
    pub landlock: Option<LandlockOutcome>,
    /// One audit event per proxied (or refused) connection.
    pub network_events: Vec<corral_policy::AuditEvent>,
}

impl Outcome {
    /// What ended the run when a signal reached corral during the set-up
    /// ([`Outcome::interrupted`]), as one sentence.
    pub fn interrupted_message(&self) -> Option<String> {
        self.interrupted.map(|sig| {
            let name = match sig {
                libc::SIGINT => "SIGINT".to_string(),
                libc::SIGTERM => "SIGTERM".to_string(),
                libc::SIGHUP => "SIGHUP".to_string(),
                libc::SIGQUIT => "SIGQUIT".to_string(),
                other => format!("signal {other}"),
            };
            let when = if self.landlock.is_some() {
                "as the program started"
            } else {
                "while the sandbox was being set up (the program never started)"
            };
            format!("interrupted by {name} {when}; the whole sandbox was killed")
        })
    }

    /// What ended a run the timeout of `secs` seconds ended, as one
    /// sentence: it says so when the program never started (a set-up
    /// that waited on a filesystem that does not answer, say).
    pub fn timeout_message(&self, secs: u64) -> String {
        let when = if self.landlock.is_some() {
            ""
        } else {
            " while the sandbox was being set up (the program never started)"
        };
        format!("timed out after {secs}s{when}; the whole sandbox was killed")
    }

    /// Stable error code for a failure.
    pub fn failure_code(kind: FailureKind) -> &'static str {
        match kind {
            FailureKind::Protocol => "sandbox.protocol",
            FailureKind::Identity => "sandbox.identity",
            FailureKind::UserNamespace => "sandbox.user_namespace",
            FailureKind::Namespace => "sandbox.namespace",
            FailureKind::Mount => "sandbox.mount",
            FailureKind::Setup => "sandbox.setup",
            FailureKind::Privileges => "sandbox.privileges",
            FailureKind::Security => "sandbox.security",
            FailureKind::ExecNotFound => "exec.not_found",
            FailureKind::ExecFailed => "exec.failed",
        }
    }
}

/// Why the sandbox could not even be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Creating the control socket or spawning the helper failed.
    #[error("cannot start the sandbox helper ({what}): {source}")]
    Spawn {
        /// The step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The helper could not be put in its cgroup.
    #[error("cannot contain the sandbox: {0}")]
    Contain(std::io::Error),
    /// The timeout is beyond what the clock can represent from now.
    #[error("the timeout of {0:?} is too long to be measured from now; use a shorter one")]
    TimeoutTooLong(Duration),
    /// Network mode `allow` was asked for without an egress proxy.
    #[error("network mode `allow` needs an egress proxy, and none was given")]
    NoEgressProxy,
}

fn spawn_err(what: &'static str) -> impl FnOnce(std::io::Error) -> LaunchError {
    move |source| LaunchError::Spawn { what, source }
}

/// Puts a helper that has done nothing yet into `c`. Where it can join by
/// itself (cgroup v1: writing `0` to each `tasks` file takes no global
/// lock across an RCU grace period), the files for its plan's
/// `cgroup_join` are returned; otherwise it is moved by pid now and none
/// are.
pub(crate) fn contain_new_helper(c: &dyn Containment, pid: i32) -> std::io::Result<Vec<String>> {
    let join = c.self_join_files();
    if join.is_empty() {
        c.add_process(pid)?;
    }
    Ok(join.iter().map(|p| p.display().to_string()).collect())
}

/// Sends a re-executed helper (or a held sandbox's init, or a fork server
/// asked for an init) a message tagged `tag` with `fds` attached and
/// `payload` in the message when it is small (at most
/// `MAX_INLINE_BYTES`), else in a sealed memfd attached last: a socket
/// message is bounded by the socket buffer (~208 KiB), a plan only by
/// `MAX_PLAN_BYTES` (see `corral_helper::inline_run_message`). A run's
/// message has its stdin, stdout and stderr as `fds`.
pub(crate) fn send_run_message(
    sock: std::os::fd::RawFd,
    tag: &[u8],
    fds: &[std::os::fd::RawFd],
    payload: &[u8],
) -> std::io::Result<()> {
    if let Some(message) = corral_helper::inline_run_message(tag, payload) {
        match fd::send_with_fds(sock, &message, fds) {
            // A host whose socket buffers are smaller than the message
            // (net.core.wmem_default) refuses it whole: the memfd way.
            Err(e) if e.0 == libc::EMSGSIZE => {}
            sent => return sent.map_err(Into::into),
        }
    }
    let memfd = fd::sealed_memfd(c"corral-plan", payload)?;
    let with_memfd: Vec<std::os::fd::RawFd> =
        fds.iter().copied().chain([memfd.as_raw_fd()]).collect();
    fd::send_with_fds(sock, tag, &with_memfd)?;
    Ok(())
}

/// Runs `plan` in a new sandbox and waits until every process of it is
/// gone.
pub fn launch(
    plan: &SandboxPlan,
    opts: &LaunchOptions,
    containment: Option<&dyn Containment>,
    proxy: Option<&mut dyn EgressProxy>,
    started: Option<StartedHelper>,
) -> Result<Outcome, LaunchError> {
    let (outcome, leftover) = launch_settling(plan, opts, containment, proxy, started)?;
    leftover.wait();
    Ok(outcome)
}

/// What may be left of a sandbox once its result stands: init and the
/// helper on their way out (the namespaces' teardown). The caller answers
/// first and then calls [`Leftover::wait`], before removing anything the
/// sandbox used (its cgroup, workspace, placeholders). Dropping it waits
/// too, so nothing is ever left unreaped.
#[must_use = "the helper must be reaped before what the sandbox used is removed"]
pub(crate) struct Leftover {
    helper_pid: Option<i32>,
}

impl Leftover {
    /// Nothing left: the helper was reaped already.
    pub(crate) fn none() -> Leftover {
        Leftover { helper_pid: None }
    }

    /// Waits until the sandbox's last process, the helper, has ended.
    pub(crate) fn wait(mut self) {
        self.reap();
    }

    fn reap(&mut self) {
        if let Some(pid) = self.helper_pid.take() {
            let _ = process::wait4(pid);
        }
    }
}

impl Drop for Leftover {
    fn drop(&mut self) {
        self.reap();
    }
}

/// [`launch`], but returns as soon as the run's result stands: when init
/// has reported the program's end (every other process of the sandbox is
/// dead by then) and the output is complete, not when the namespaces are
/// torn down. The helper is reaped through the returned [`Leftover`].
pub(crate) fn launch_settling(
    plan: &SandboxPlan,
    opts: &LaunchOptions,
    containment: Option<&dyn Containment>,
    mut proxy: Option<&mut dyn EgressProxy>,
    started: Option<StartedHelper>,
) -> Result<(Outcome, Leftover), LaunchError> {
    if plan.network == corral_policy::NetworkMode::Allow && proxy.is_none() {
        return Err(LaunchError::NoEgressProxy);
    }
    let start = Instant::now();
    // Checked before anything starts: a timeout `Instant` cannot hold
    // would otherwise panic (or wrap) mid-run.
    let deadline = match opts.timeout {
        Some(t) => Some(start.checked_add(t).ok_or(LaunchError::TimeoutTooLong(t))?),
        None => None,
    };
    let signals = if opts.forward_signals {
        Some(SignalFd::new(&FORWARDED_SIGNALS).map_err(|e| spawn_err("signalfd")(e.into()))?)
    } else {
        None
    };
    let (out_r, out_w) = fd::pipe().map_err(|e| spawn_err("pipe")(e.into()))?;
    let (err_r, err_w) = fd::pipe().map_err(|e| spawn_err("pipe")(e.into()))?;
    // Whether the helper already sits in the cgroup (a waiting one can),
    // and whether it holds this run's sandbox already (a prepared one).
    let mut contained = false;
    let mut holding = false;
    // Held open while corral lives when it cloned init itself: init checks
    // it once its parent-death signal is armed.
    let mut init_lifeline = None;
    // The group init joins once it is made, after init was cloned.
    let mut joins_later: Option<&dyn Containment> = None;
    let (helper_pid, ours) = match opts.helper {
        HelperStart::ReExec => {
            let helper = match started {
                Some(s) => {
                    contained = s.contained;
                    holding = s.holding;
                    s.helper
                }
                None => ReadyHelper::spawn().map_err(spawn_err("spawn"))?,
            };
            let (pid, ctrl, lifeline) = helper.into_parts();
            init_lifeline = lifeline;
            (pid, ctrl)
        }
        HelperStart::Fork => {
            let (ours, theirs) =
                fd::seqpacket_pair().map_err(|e| spawn_err("socketpair")(e.into()))?;
            // A forked helper has one thread, so on cgroup v1 it can move
            // itself in (`tasks`), which skips the RCU grace period that
            // moving it by pid waits for. It does so right after the
            // go-ahead, before any other step (helper step 0). init cloned
            // into the namespaces does the same, first thing.
            // Where the group is made only once init exists, init joins
            // after it built the root, through descriptors sent then.
            let later = containment.filter(|c| c.made_after_start());
            let join = match later {
                Some(_) => Vec::new(),
                None => containment.map(|c| c.self_join_files()).unwrap_or_default(),
            };
            contained = later.is_some() || !join.is_empty();
            let clonable = plan.reduced.is_none() && (containment.is_none() || contained);
            let cloned = if clonable {
                clone_init(
                    plan,
                    opts,
                    &join,
                    later.is_some(),
                    [&out_w, &err_w, &theirs],
                )
            } else {
                None
            };
            match cloned {
                Some((pid, lifeline)) => {
                    init_lifeline = Some(lifeline);
                    joins_later = later;
                    (pid, ours)
                }
                None => {
                    // The forked helper joins first thing: the group must
                    // exist before it.
                    let join = match later {
                        Some(c) => {
                            c.make_for_init().map_err(LaunchError::Contain)?;
                            c.self_join_files()
                        }
                        None => join,
                    };
                    (
                        fork_helper(plan, opts, &join, [&out_w, &err_w, &theirs])?,
                        ours,
                    )
                }
            }
        }
    };
    let abort = |err: LaunchError| {
        let _ = process::kill(helper_pid, libc::SIGKILL);
        let _ = process::wait4(helper_pid);
        Err(err)
    };
    // Contained before it does anything: the re-executed helper waits for
    // its plan, the forked one for a go-ahead, both sent only after this.
    // Either joins its cgroup itself when it can (cgroup v1), first thing
    // (see `SandboxPlan::cgroup_join`); otherwise it is moved by pid here.
    let mut self_join = Vec::new();
    if let Some(c) = containment.filter(|_| !contained) {
        match contain_new_helper(c, helper_pid) {
            Ok(join) => self_join = join,
            Err(e) => return abort(LaunchError::Contain(e)),
        }
    }
    // Everything the wait for the sandbox needs is set up before the
    // message goes out: the helper (or the held program's process) it
    // wakes is often placed on this thread's CPU, and waits until this
    // thread sleeps in its first poll.
    let ctrl_fd = ours.as_raw_fd();
    let mut pump = Pump::new(
        helper_pid,
        [File::from(out_r), File::from(err_r)],
        File::from(ours),
        opts,
        signals,
    );
    let sent = match opts.helper {
        // The plan (or, to a held sandbox, only the program), with the
        // run's stdin, stdout and stderr attached: the helper may have been
        // started before this run (see `warm`).
        HelperStart::ReExec => {
            let stdin = match &opts.stdin {
                Some(f) => f.as_raw_fd(),
                None => 0,
            };
            let stdio = [stdin, out_w.as_raw_fd(), err_w.as_raw_fd()];
            let message = if holding {
                serde_json::to_vec(&plan.program()).map(|p| (PROGRAM_MESSAGE, p))
            } else if self_join.is_empty() {
                serde_json::to_vec(plan).map(|p| (PLAN_MESSAGE, p))
            } else {
                let mut joining = plan.clone();
                joining.cgroup_join = self_join;
                serde_json::to_vec(&joining).map(|p| (PLAN_MESSAGE, p))
            };
            match message {
                Ok((tag, payload)) => send_run_message(ctrl_fd, tag, &stdio, &payload),
                Err(e) => return abort(spawn_err("encode plan")(e.into())),
            }
        }
        // init cloned by corral waits for nothing but, when its group is
        // made now, the descriptors to join it through; it builds the
        // sandbox's root meanwhile.
        HelperStart::Fork if init_lifeline.is_some() => match joins_later {
            None => Ok(()),
            Some(c) => match c.make_for_init() {
                Ok(tasks) => {
                    let tasks: Vec<std::os::fd::RawFd> =
                        tasks.iter().map(AsRawFd::as_raw_fd).collect();
                    match fd::send_with_fds(ctrl_fd, JOIN_MESSAGE, &tasks) {
                        // init failed meanwhile and left: its report waits
                        // on the socket, and the pump reads it.
                        Err(e) if e.0 == libc::EPIPE || e.0 == libc::ECONNRESET => Ok(()),
                        sent => sent.map_err(std::io::Error::from),
                    }
                }
                Err(e) => return abort(LaunchError::Contain(e)),
            },
        },
        HelperStart::Fork => {
            fd::send_with_fds(ctrl_fd, GO_AHEAD, &[]).map_err(std::io::Error::from)
        }
    };
    // Only the helper writes to the pipes now: their end of file is its.
    drop(out_w);
    drop(err_w);
    if let Err(e) = sent {
        return abort(spawn_err("send plan")(e));
    }
    if let Some(c) = containment {
        c.while_starting();
    }
    let reduced = plan.reduced.is_some();
    let kill = || {
        if reduced {
            // No pid namespace: the helper, a subreaper, kills the tree.
            let _ = process::kill(helper_pid, corral_helper::kill_tree_signal());
        } else {
            // Killing the helper kills init (PDEATHSIG), or this is init
            // (cloned by corral); the kernel then kills every process of
            // the pid namespace.
            let _ = process::kill(helper_pid, libc::SIGKILL);
        }
        // The cgroup catches anything that raced out of either.
        if let Some(c) = containment {
            c.kill_all();
        }
    };
    let mut killed_at: Option<Instant> = None;
    // When corral first killed the sandbox, until live output is given up.
    let mut grace_from: Option<Instant> = None;
    let mut timed_out = false;
    let mut output_killed = false;
    let mut cancelled = false;
    let mut interrupted = None;
    // Without namespaces the helper itself reports and reaps: nothing
    // slow is left after its report, so there is no settling early.
    let settle_early = !reduced;
    while !pump.done() && (!settle_early || !pump.settled()) {
        if killed_at.is_some() && grace_from.is_none() {
            grace_from = killed_at;
        }
        // After a kill the reader gets a moment for what the program wrote
        // before it; a reader that stalls cannot hold corral longer.
        if grace_from.is_some_and(|t| t.elapsed() >= OUTPUT_GRACE) {
            pump.abandon_output();
        }
        if !output_killed && !timed_out && pump.over_kill_ceiling() {
            kill();
            output_killed = true;
            killed_at = Some(Instant::now());
        }
        if !cancelled
            && opts
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        {
            cancelled = true;
            kill();
            killed_at = Some(Instant::now());
        }
        if interrupted.is_none() && !(timed_out || output_killed || cancelled) {
            if let Some(sig) = pump.interrupted {
                interrupted = Some(sig);
                kill();
                killed_at = Some(Instant::now());
            }
        }
        // Should the helper not finish the job in time, it dies itself.
        if killed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            let _ = process::kill(helper_pid, libc::SIGKILL);
            killed_at = None;
        }
        let wait_ms = match deadline {
            // Once the sandbox has ended, what is left is handing its
            // output to the reader, which the timeout does not bound.
            Some(d)
                if !timed_out
                    && !output_killed
                    && interrupted.is_none()
                    && pump.sandbox_running() =>
            {
                let now = Instant::now();
                if now >= d {
                    kill();
                    timed_out = true;
                    killed_at = Some(Instant::now());
                    continue;
                }
                poll_wait_ms(d - now, opts.cancel.is_some())
            }
            _ if killed_at.is_some() || opts.cancel.is_some() => 100,
            _ => -1,
        };
        pump.poll(wait_ms);
        if let Some((http, socks)) = pump.listeners.take() {
            let started = match proxy.as_deref_mut() {
                Some(p) => p.start(
                    std::net::TcpListener::from(http),
                    std::net::TcpListener::from(socks),
                ),
                None => Err(std::io::Error::other("no egress proxy")),
            };
            if let Err(e) = started {
                pump.failure.get_or_insert((
                    FailureKind::Setup,
                    format!("starting the egress proxy: {e}"),
                ));
                kill();
                killed_at = Some(Instant::now());
            }
        }
    }
    let settled = !pump.done();
    let network_events = proxy.map(|p| p.stop()).unwrap_or_default();
    let Finished {
        stdout,
        stderr,
        exited: message,
        failure,
        landlock,
    } = pump.finish();
    let (helper_status, usage, leftover) = match message.filter(|_| settled) {
        // Settled: the program and everything it started are dead and
        // reaped; init leaves right after its report and the helper after
        // reaping it (not killed: init would be orphaned to the host).
        Some(exit) => {
            let leftover = Leftover {
                helper_pid: Some(helper_pid),
            };
            (None, exit.usage, leftover)
        }
        None => {
            let (status, usage) =
                process::wait4(helper_pid).map_err(|e| spawn_err("wait")(e.into()))?;
            (Some(status), usage, Leftover::none())
        }
    };
    let (mut exit_code, mut signal) = match (&failure, message) {
        (Some((FailureKind::ExecNotFound, _)), _) => (EXIT_NOT_FOUND, None),
        (Some((FailureKind::ExecFailed, _)), _) => (EXIT_NOT_EXECUTABLE, None),
        (Some(_), _) => (EXIT_CORRAL_ERROR, None),
        (
            None,
            Some(Exit {
                code: Some(code), ..
            }),
        ) => (code, None),
        (
            None,
            Some(Exit {
                signal: Some(sig), ..
            }),
        ) => (128 + sig, Some(sig)),
        _ => match helper_status {
            Some(WaitStatus::Signaled(sig)) => (128 + sig, Some(sig)),
            Some(WaitStatus::Exited(code)) => (code, None),
            None => (EXIT_CORRAL_ERROR, None),
        },
    };
    // A kill corral decided on (timeout, output ceiling, cancellation) is
    // an outcome, not a set-up failure.
    let killed_on_purpose = timed_out || output_killed || cancelled || interrupted.is_some();
    if killed_on_purpose && failure.is_none() {
        // The status says why (a shell expects 128 + the signal that ended
        // a process it ran); `signal` says what the program got, nothing
        // when it never started.
        exit_code = 128 + interrupted.unwrap_or(libc::SIGKILL);
        signal = landlock.is_some().then_some(libc::SIGKILL);
    }
    // A set-up that failed on its own before the signal keeps its cause.
    let interrupted = interrupted.filter(|_| failure.is_none());
    let failure = match (failure, killed_on_purpose, message) {
        (None, false, None) => Some((
            FailureKind::Setup,
            format!(
                "the sandbox's helper or init ended without reporting a result ({helper_status:?})"
            ),
        )),
        (f, _, _) => f,
    };
    let outcome = Outcome {
        exit_code,
        signal,
        timed_out,
        output_killed,
        interrupted,
        failure,
        stdout,
        stderr,
        wall: start.elapsed(),
        usage,
        landlock,
        network_events,
    };
    Ok((outcome, leftover))
}

/// Forks the helper from the single-threaded CLI: stdio and the control
/// socket (`theirs`) at 0-3, its own process group, nothing else kept,
/// then [`corral_helper::main_forked`]. Returns its pid.
fn fork_helper(
    plan: &SandboxPlan,
    opts: &LaunchOptions,
    join: &[std::path::PathBuf],
    [out_w, err_w, theirs]: [&OwnedFd; 3],
) -> Result<i32, LaunchError> {
    match process::fork_in_single_threaded_helper() {
        Err(e) => Err(spawn_err("fork")(e.into())),
        Ok(process::Fork::Child) => guard_forked_child(|| {
            let placed = place_child_fds(opts, [out_w, err_w, theirs])
                // Keep nothing else: above all not the parent's end of the
                // control socket, or the wait for the go-ahead below would
                // never see EOF if the parent died.
                .and_then(|_| fd::close_from(4))
                // Die with the parent from here on, not only once the
                // helper proper starts; it may already be gone.
                .and_then(|_| process::set_parent_death_signal(libc::SIGKILL));
            if placed.is_err() || process::getppid() != plan.parent_pid {
                process::exit_now(EXIT_CORRAL_ERROR);
            }
            corral_helper::main_forked(plan.clone(), join)
        }),
        Ok(process::Fork::Parent(pid)) => Ok(pid),
    }
}

/// In a child of the single-threaded CLI: the run's stdin (when given),
/// stdout and stderr at 0-2, the control socket at 3, and a process group
/// of its own.
fn place_child_fds(
    opts: &LaunchOptions,
    [out_w, err_w, theirs]: [&OwnedFd; 3],
) -> corral_sys::SysResult<()> {
    let stdin_ok = match &opts.stdin {
        Some(f) => f
            .try_clone()
            .map_err(|_| corral_sys::Errno(libc::EBADF))
            .and_then(|f| fd::place(&OwnedFd::from(f), 0)),
        None => Ok(()),
    };
    stdin_ok
        .and_then(|_| fd::place(out_w, 1))
        .and_then(|_| fd::place(err_w, 2))
        .and_then(|_| fd::place(theirs, fd::HELPER_CONTROL_FD))
        .and_then(|_| process::setpgid_self())
}

/// Clones init straight into the sandbox's namespaces, as bubblewrap makes
/// its PID 1: one process fewer than a forked helper that unshares them
/// and forks init (see [`corral_helper::init_cloned`] for init's side).
/// For a sandbox with namespaces whose cgroup, if any, init joins itself
/// (cgroup v1): through `join`, first thing, or, when `join_later`,
/// through the descriptors of a [`JOIN_MESSAGE`] once it has built the
/// sandbox's root. As root, corral acts as the sandbox identity for
/// the clone, keeping only its saved uid 0, so the new user namespace is
/// owned by that identity as the helper's is; it takes its ids back right
/// after (should that fail, corral stops: it must not go on with another
/// user's ids). Returns init's pid and the write end of its lifeline.
///
/// `None` when anything fails before init exists, the clone included:
/// the forked helper then makes the same sandbox step by step, and its
/// failure says precisely what is missing (the user namespace is tried on
/// its own first). Never a weaker sandbox: the same steps, in another
/// process layout.
fn clone_init(
    plan: &SandboxPlan,
    opts: &LaunchOptions,
    join: &[std::path::PathBuf],
    join_later: bool,
    fds: [&OwnedFd; 3],
) -> Option<(i32, OwnedFd)> {
    // Made after the pipes and the control socket, so none of these is at
    // 0-3, where the child puts its stdio and control socket.
    let Ok(join) = crate::contain::open_for_writing(join) else {
        return None;
    };
    let Ok(prepared) = corral_helper::prepare_idmapped(plan) else {
        return None;
    };
    let Ok((lifeline_r, lifeline_w)) = fd::pipe() else {
        return None;
    };
    // What init keeps must be out of the way of the child's dup2s onto
    // 0-3 (`close_from_except` keeps nothing below 4).
    let kept = join
        .iter()
        .chain(prepared.iter().map(|(_, tree)| tree))
        .chain([&lifeline_r]);
    if kept.map(|f| f.as_raw_fd()).any(|n| n < 4) {
        return None;
    }
    // init must not hold the lifeline's write end: the child closes its
    // copy by number, corral keeps the descriptor.
    let lifeline_w_in_child = lifeline_w.as_raw_fd();
    let cloned = corral_helper::clone_init_as_identity(plan, InitParent::Caller, move || {
        fd::close_raw(lifeline_w_in_child);
        // Die with corral from here on; init::run arms it again and checks
        // the lifeline.
        let placed = place_child_fds(opts, fds)
            .and_then(|_| process::set_parent_death_signal(libc::SIGKILL));
        if placed.is_err() {
            process::exit_now(EXIT_CORRAL_ERROR);
        }
        corral_helper::init_cloned(plan, join, join_later, lifeline_r, prepared)
    })
    .ok()?;
    let init_pid = cloned.pid.ok();
    if let Err(e) = cloned.ids_restored {
        if let Some(pid) = init_pid {
            let _ = process::kill(pid, libc::SIGKILL);
            let _ = process::wait4(pid);
        }
        // corral may be left acting as the sandbox identity, without its
        // groups: nothing more may run in it (cleaning up, writing the
        // audit) with those ids. The run's group, if any, is swept by the
        // next corral that makes one.
        eprintln!(
            "corral: cannot take its own ids back after cloning the sandbox's init: {e}; stopping"
        );
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    init_pid.map(|pid| (pid, lifeline_w))
}

/// How long after corral kills a sandbox (timeout, output ceiling,
/// cancellation) the reader of live output still gets what the program
/// wrote before; then the rest is dropped and corral ends.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Runs the body of a child forked from the CLI (the helper-to-be). The
/// child's stack is a copy of the parent's: a panic unwinding out of the
/// body would run the parent's destructors in the child (removing the
/// run's cgroup, the scratch directory) while the parent still uses them.
/// Release builds abort on panic; this makes every build end the child
/// with status 125 instead, whatever panics.
fn guard_forked_child(body: impl FnOnce() -> std::convert::Infallible) -> ! {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    process::exit_now(EXIT_CORRAL_ERROR)
}

/// How long one poll waits for a deadline `remaining` away: at most 100 ms
/// when a cancellation must be noticed, otherwise in slices poll(2) can
/// hold (an `int` of milliseconds), never wrapped to a negative "forever";
/// one more millisecond so the deadline has passed when poll returns.
fn poll_wait_ms(remaining: Duration, cancellable: bool) -> i32 {
    let cap: i32 = if cancellable { 100 } else { i32::MAX - 1 };
    i32::try_from(remaining.as_millis())
        .unwrap_or(i32::MAX)
        .min(cap)
        + 1
}

/// Whether this process was started as the sandbox helper (or as its fork
/// server).
pub fn is_helper_invocation(arg1: Option<&std::ffi::OsStr>) -> bool {
    arg1.is_some_and(|a| a == HELPER_SUBCOMMAND || a == corral_helper::ZYGOTE_SUBCOMMAND)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_run_message_goes_inline_and_in_a_memfd_when_the_socket_cannot_hold_it() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let n = null.as_raw_fd();
        let (ours, theirs) = fd::seqpacket_pair().unwrap();
        let receive = || {
            let mut buf = vec![0u8; 32 << 10];
            let (len, fds) = fd::recv_with_fds(theirs.as_raw_fd(), &mut buf).unwrap();
            buf.truncate(len);
            (buf, fds)
        };
        send_run_message(ours.as_raw_fd(), PLAN_MESSAGE, &[n, n, n], b"{}").unwrap();
        let (message, fds) = receive();
        assert_eq!(message, b"plan\0{}");
        assert_eq!(fds.len(), 3);
        // A host whose socket buffers are smaller than an inline message
        // refuses it (EMSGSIZE): the same payload goes in a memfd.
        fd::set_send_buffer(ours.as_raw_fd(), 4096).unwrap();
        let payload = vec![b'x'; 12 << 10];
        assert!(corral_helper::inline_run_message(PLAN_MESSAGE, &payload).is_some());
        send_run_message(ours.as_raw_fd(), PLAN_MESSAGE, &[n, n, n], &payload).unwrap();
        let (message, fds) = receive();
        assert_eq!(message, PLAN_MESSAGE);
        assert_eq!(fds.len(), 4);
        assert_eq!(fd::read_sealed_memfd(&fds[3], 1 << 20).unwrap(), payload);
    }

    /// Set in the re-executed test binary: where the outer frame's
    /// destructor would leave its mark.
    const SENTINEL_VAR: &str = "CORRAL_TEST_FORK_GUARD_SENTINEL";

    #[test]
    fn a_panic_in_a_forked_child_ends_it_with_125_and_runs_no_outer_destructor() {
        /// Stands for the parent's frames a forked child carries (a run's
        /// cgroup, a scratch directory): its destructor must not run.
        struct ParentState(std::path::PathBuf);
        impl Drop for ParentState {
            fn drop(&mut self) {
                let _ = std::fs::write(&self.0, b"dropped");
            }
        }
        if let Some(path) = std::env::var_os(SENTINEL_VAR) {
            // The child side, in a process of its own (the test harness is
            // multi-threaded and may not fork): a body that panics.
            let _state = ParentState(path.into());
            guard_forked_child(|| panic!("a bug in the forked child"));
        }
        let sentinel = std::env::temp_dir().join(format!(
            "corral-fork-guard-{}-{}",
            std::process::id(),
            line!()
        ));
        let _ = std::fs::remove_file(&sentinel);
        let me = std::env::current_exe().expect("test binary");
        let status = std::process::Command::new(me)
            .args([
                "--exact",
                "launch::tests::a_panic_in_a_forked_child_ends_it_with_125_and_runs_no_outer_destructor",
                "--test-threads=1",
            ])
            .env(SENTINEL_VAR, &sentinel)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("re-run the test binary");
        let dropped = sentinel.exists();
        let _ = std::fs::remove_file(&sentinel);
        assert_eq!(status.code(), Some(EXIT_CORRAL_ERROR));
        assert!(!dropped, "the panic unwound into the outer frame");
    }

    #[test]
    fn poll_waits_never_wrap_to_forever() {
        // 2^31 ms and more used to wrap to a negative (infinite) poll.
        for ms in [1u64 << 31, (1u64 << 31) + 5, u64::from(u32::MAX), 1 << 40] {
            let wait = poll_wait_ms(Duration::from_millis(ms), false);
            assert!(wait > 0, "{ms} ms became {wait}");
        }
        assert_eq!(poll_wait_ms(Duration::from_secs(366 * 86_400), true), 101);
        assert_eq!(poll_wait_ms(Duration::from_millis(5), false), 6);
        assert_eq!(poll_wait_ms(Duration::ZERO, true), 1);
    }

    #[test]
    fn a_timeout_the_clock_cannot_hold_is_refused_before_anything_starts() {
        let opts = LaunchOptions {
            output: OutputMode::Capture,
            output_bytes: 1024,
            output_kill_bytes: Some(1 << 20),
            timeout: Some(Duration::from_secs(u64::MAX)),
            forward_signals: false,
            // Never reached: the check comes before any process starts.
            helper: HelperStart::ReExec,
            cancel: None,
            stdin: None,
            tap: None,
        };
        let profile = corral_policy::builtin::code();
        let request = crate::RunRequest {
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            ..Default::default()
        };
        let commands = crate::CommandTable::resolve(&profile, None);
        let identity = crate::sandbox_identity(&profile);
        let (plan, _) = crate::build_plan(&profile, &commands, &request, identity, &|_| None)
            .expect("plan for `sh -c true`");
        match launch(&plan, &opts, None, None, None) {
            Err(LaunchError::TimeoutTooLong(t)) => assert_eq!(t.as_secs(), u64::MAX),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a run started with an unrepresentable timeout"),
        }
    }
}

//! PID 1 of the sandbox, and the last steps of the program before execve.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

use corral_sys::exec::ExecArgs;
use corral_sys::process::{self, Fork, WaitStatus};
use corral_sys::{fd, signal, Errno};

use crate::kernel::{Kernel, Sys};
use crate::plan::{ProgramPlan, Rlimit, SandboxPlan};
use crate::protocol::{FailureKind, HelperMessage};
use crate::rootfs;
use crate::{Control, Failure, StepError};
use crate::{EXIT_CORRAL_ERROR, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND};

/// Runs as PID 1: builds the sandbox, starts the program, then reaps,
/// forwards signals and, when the program ends, kills whatever it left
/// behind and reports its status.
pub(super) fn run(
    plan: &SandboxPlan,
    mut ctrl: Control,
    lifeline: OwnedFd,
    prepared: Vec<(usize, OwnedFd)>,
    join_later: bool,
) -> ! {
    // Die with the helper; it may have died before this was armed, which
    // the lifeline pipe tells us.
    if process::set_parent_death_signal(libc::SIGKILL).is_err()
        || fd::pipe_writer_gone(lifeline.as_raw_fd())
    {
        process::exit_now(crate::EXIT_CORRAL_ERROR);
    }
    drop(lifeline);
    if let Err((kind, msg)) = setup(&mut Sys, plan, prepared, &mut ctrl) {
        ctrl.fail(kind, msg);
    }
    // Into the group corral made meanwhile, before anything of the
    // program exists (see `init_joins_late`).
    if join_later {
        if let Err((kind, msg)) = crate::init_joins_late(&mut Sys, &mut ctrl) {
            ctrl.fail(kind, msg);
        }
    }
    // Both belong to the sandbox, not to the run: a held sandbox has them
    // before its program comes.
    let (ruleset, filters) = program_security(plan, &mut ctrl);
    // Nothing init does from here on needs a capability: it gives them up
    // before the program's process exists, so the program never runs next
    // to a capable init (its execve lets init go on at once).
    if let Err((kind, msg)) = give_up_privileges(&mut Sys) {
        ctrl.fail(kind, msg);
    }
    // A held sandbox (built ahead) forks its program's process now, which
    // takes every step that does not depend on the run and then waits for
    // the program part (see `program_steps`).
    // `setup` emptied the bounding set.
    let (program, mut ctrl) = start_program(plan, ruleset, &filters, true, ctrl);
    // The plan stays in memory until init exits: freeing it would only
    // write to pages init shares copy-on-write with corral.
    let reaper_filters = plan.security.init_filters.to_bpf();
    fd::stdio_to_devnull();
    if let Err((kind, msg)) = harden_reaper(&mut Sys, &reaper_filters) {
        // Leaving kills the pid namespace, the program with it.
        ctrl.fail(kind, msg);
    }
    // The program is gone: so is everything it left running (daemons,
    // double forks). kill(-1) from PID 1 reaches every process of this pid
    // namespace and nothing outside it.
    reap(program, ctrl, &|| {
        let _ = process::kill(-1, libc::SIGKILL);
    })
}

/// Init's own steps, in order: the root filesystem, hostname, loopback,
/// the proxy's listeners (network mode `allow`), non-dumpable, the empty
/// bounding set. Stops at the first failure.
pub(crate) fn setup<K: Kernel>(
    k: &mut K,
    plan: &SandboxPlan,
    prepared: Vec<(usize, K::Fd)>,
    ctrl: &mut Control,
) -> Result<(), StepError> {
    rootfs::build(k, plan, prepared)?;
    k.sethostname(&plan.hostname).map_err(|e| {
        (
            FailureKind::Setup,
            format!("sethostname {:?}: {e}", plan.hostname),
        )
    })?;
    if plan.network != corral_policy::NetworkMode::Host {
        k.loopback_up()
            .map_err(|e| (FailureKind::Setup, format!("bringing up loopback: {e}")))?;
    }
    if plan.network == corral_policy::NetworkMode::Allow {
        // The proxy's sockets must live in this network namespace (a socket
        // keeps the namespace it was created in) but be served by corral on
        // the host side: create them here, hand them over, keep no copy.
        hand_over_listeners(k, ctrl).map_err(|msg| (FailureKind::Setup, msg))?;
    }
    // PID 1 holds the plan in memory: nobody in the sandbox may read it
    // through /proc/1/mem, environ or ptrace (prctl(2), PR_SET_DUMPABLE).
    k.set_dumpable(false)
        .map_err(|e| (FailureKind::Privileges, format!("PR_SET_DUMPABLE: {e}")))?;
    // The bounding set, emptied once for the whole sandbox: the program's
    // process is forked from init after this and inherits it, and a
    // bounding set only ever shrinks (capabilities(7)). Each drop copies
    // the credentials (41 of them, ~44 us on the test VM), which the
    // program's process and init's own hardening would otherwise pay
    // again. init holds every capability of its user namespace, so it
    // must succeed: anything left is an error, not a weaker sandbox.
    let refused = |why: String| {
        (
            FailureKind::Privileges,
            format!(
                "emptying the capability bounding set in the sandbox's user namespace: {why} \
                 (is prctl(PR_CAPBSET_DROP) refused by a seccomp filter or security module \
                 around corral?)"
            ),
        )
    };
    match k.drop_bounding_set() {
        Ok(true) => Ok(()),
        Ok(false) => Err(refused("capabilities are left in it".to_string())),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// Init gives up its privileges before the program's process exists: from
/// then on it only reaps, forwards signals and reports, none of which
/// needs them. Its capabilities in the sandbox's user namespace would let
/// a program that reaches it (same uid) act with them; bubblewrap's PID 1
/// holds none either. Every capability set is emptied (capabilities(7);
/// the bounding set already is, by `setup`) and no_new_privs set
/// (prctl(2)). Done before the program's process is created, the program
/// never sees a capable init, not even while init wakes up from that
/// process's execve.
pub(crate) fn give_up_privileges<K: Kernel>(k: &mut K) -> Result<(), StepError> {
    k.drop_capability_sets().map_err(|e| {
        (
            FailureKind::Privileges,
            format!("init: dropping capabilities: {e}"),
        )
    })?;
    k.set_no_new_privs().map_err(|e| {
        (
            FailureKind::Privileges,
            format!("init: PR_SET_NO_NEW_PRIVS: {e}"),
        )
    })
}

/// Init's last step once the program runs: a seccomp allowlist of what a
/// reaper needs (seccomp(2)), after [`give_up_privileges`]; last, because
/// starting the program's process needs more than the list allows.
pub(crate) fn harden_reaper<K: Kernel>(
    k: &mut K,
    filters: &[seccompiler::BpfProgram],
) -> Result<(), StepError> {
    for prog in filters {
        k.seccomp_install(prog).map_err(|e| {
            (
                FailureKind::Security,
                format!("init: installing the reaper's seccomp filter: {e}"),
            )
        })?;
    }
    Ok(())
}

/// The program's Landlock ruleset, built from the sandbox's own paths, and
/// its seccomp filters as the kernel takes them: what the program's
/// process installs, prepared before its fork.
pub(super) fn program_security(
    plan: &SandboxPlan,
    ctrl: &mut Control,
) -> (landlock::RulesetCreated, Vec<seccompiler::BpfProgram>) {
    match crate::landlock::prepare(&plan.security.landlock) {
        Ok(ruleset) => (ruleset, plan.security.filters.to_bpf()),
        Err(msg) => ctrl.fail(FailureKind::Security, msg),
    }
}

/// Forks the program's process, which runs [`program_steps`]. Its program
/// part (argv/envp, working directory, rlimits) is made ready before the
/// fork, or, for a held sandbox, received by the process itself once the
/// run comes; the Landlock `ruleset` and seccomp `filters` come ready.
/// `bounding_emptied`: this process emptied its bounding set, which the
/// program's process then inherits. Returns the program's pid and the
/// control socket to the supervising parent.
pub(super) fn start_program(
    plan: &SandboxPlan,
    ruleset: landlock::RulesetCreated,
    filters: &[seccompiler::BpfProgram],
    bounding_emptied: bool,
    mut ctrl: Control,
) -> (i32, Control) {
    let ready = if plan.hold {
        None
    } else {
        match ProgramArgs::of(
            &plan.exec_path,
            &plan.argv,
            &plan.env,
            plan.cwd.as_str(),
            &plan.rlimits,
        ) {
            Ok(args) => Some(args),
            Err((kind, message)) => ctrl.fail(kind, message),
        }
    };
    let last = LastSteps {
        landlock_required: plan.security.landlock.required,
        landlock_full: plan.security.landlock.require_full,
        filters,
        bounding_emptied,
    };
    // Read here, once, before the program's process, which shares this
    // memory until its execve: where nothing emptied the bounding set for
    // it (reduced mode), it drops every capability up to this number.
    process::last_capability();
    if plan.hold {
        // Waits for its run: init must go on meanwhile, so a fork.
        return match process::fork_in_single_threaded_helper() {
            Err(e) => ctrl.fail(FailureKind::Setup, format!("fork of the program: {e}")),
            Ok(Fork::Child) => {
                let failure = program_steps(&mut Sys, &last, ruleset, ready, &mut ctrl);
                ctrl.exit_with(failure)
            }
            Ok(Fork::Parent(pid)) => (pid, ctrl),
        };
    }
    // The program's process goes straight on to execve: it shares init's
    // memory until then, init waiting (no page tables copied, no
    // copy-on-write faults on either side, nothing torn down at execve;
    // see `spawn_sharing_memory_in_single_threaded_process`). The program
    // part is moved to it, and init never touches it again; the ruleset
    // it duplicates into its own descriptor table, so init's copy closes
    // here. Nothing it frees is init's.
    let spawned = process::spawn_sharing_memory_in_single_threaded_process(|| {
        let failure = match ruleset.try_clone() {
            Ok(own) => program_steps(&mut Sys, &last, own, ready, &mut ctrl),
            Err(e) => Failure {
                kind: FailureKind::Security,
                message: crate::landlock::err("duplicating the ruleset", e),
                status: EXIT_CORRAL_ERROR,
            },
        };
        ctrl.exit_with(failure)
    });
    drop(ruleset);
    match spawned {
        Ok(pid) => (pid, ctrl),
        Err(e) => ctrl.fail(FailureKind::Setup, format!("start of the program: {e}")),
    }
}

/// What the program's process needs from the sandbox's part of the plan,
/// prepared before its fork.
pub(crate) struct LastSteps<'a> {
    pub(crate) landlock_required: bool,
    pub(crate) landlock_full: bool,
    pub(crate) filters: &'a [seccompiler::BpfProgram],
    /// The bounding set was emptied before this process was forked (by
    /// init), so only the other sets are left to empty.
    pub(crate) bounding_emptied: bool,
}

/// The program part of a run as `execve` and the last steps take it.
pub(crate) struct ProgramArgs {
    exec: ExecArgs,
    cwd: CString,
    path: String,
    rlimits: Vec<Rlimit>,
}

impl ProgramArgs {
    /// Checks and converts a program part; a NUL byte is an error.
    pub(crate) fn of(
        exec_path: &str,
        argv: &[String],
        env: &[String],
        cwd: &str,
        rlimits: &[Rlimit],
    ) -> Result<ProgramArgs, StepError> {
        let exec = ExecArgs::new(exec_path, argv, env).map_err(|_| {
            (
                FailureKind::ExecFailed,
                "argv or environment contains a NUL byte".to_string(),
            )
        })?;
        let cwd = CString::new(cwd).map_err(|_| {
            (
                FailureKind::Setup,
                "working directory contains a NUL byte".to_string(),
            )
        })?;
        Ok(ProgramArgs {
            exec,
            cwd,
            path: exec_path.to_string(),
            rlimits: rlimits.to_vec(),
        })
    }

    fn of_program(p: &ProgramPlan) -> Result<ProgramArgs, StepError> {
        ProgramArgs::of(&p.exec_path, &p.argv, &p.env, p.cwd.as_str(), &p.rlimits)
    }
}

/// The program's steps up to and including `execve`: first every step that
/// does not depend on the program part, then the rlimits, the working
/// directory, the `layers` report (when not made yet) and the seccomp
/// filters, last before `execve`, so every earlier step may still use the
/// syscalls they deny.
///
/// A held sandbox's process (`ready` is `None`) reports its `layers`,
/// installs the seccomp filters and only then waits for its run: after
/// them come the receive, `setrlimit` on itself, `chdir` and `execve`,
/// which every filter corral builds allows (a program makes them too),
/// and the filters' attach (their check and JIT, ~80 us) is off the
/// run's path. Nothing here allocates before the wait except for the
/// `layers` report, the wait's own receiving buffer and a failure's
/// message. Returns only when something failed, `execve` included: what
/// to report and the exit status.
pub(crate) fn program_steps<K: Kernel>(
    k: &mut K,
    last: &LastSteps<'_>,
    ruleset: K::Ruleset,
    ready: Option<ProgramArgs>,
    ctrl: &mut Control,
) -> Failure {
    let setup_failed = |(kind, message): StepError| Failure {
        kind,
        message,
        status: EXIT_CORRAL_ERROR,
    };
    let landlock = match harden(k, last, ruleset) {
        Ok(l) => l,
        Err(e) => return setup_failed(e),
    };
    // What is left of the filters for `finish` to install.
    let (program, unreported, filters) = match ready {
        Some(p) => (p, Some(landlock), last.filters),
        None => {
            // What is in force is known now: reported before the wait, it
            // is read with the run's start instead of waking corral on
            // the way to the run's execve.
            ctrl.send(&HelperMessage::Layers { landlock });
            if let Err(e) = install(k, last.filters) {
                return setup_failed(e);
            }
            // End of file (corral let the sandbox go) exits quietly in
            // there.
            match k
                .receive_program(ctrl)
                .map_err(|msg| (FailureKind::Protocol, msg))
                .and_then(|p| ProgramArgs::of_program(&p))
            {
                Ok(p) => (p, None, &[][..]),
                Err(e) => return setup_failed(e),
            }
        }
    };
    if let Err(e) = finish(k, filters, &program, unreported, ctrl) {
        return setup_failed(e);
    }
    let err = k.execve(&program.exec);
    let (kind, status) = if err.0 == libc::ENOENT {
        (FailureKind::ExecNotFound, EXIT_NOT_FOUND)
    } else {
        (FailureKind::ExecFailed, EXIT_NOT_EXECUTABLE)
    };
    Failure {
        kind,
        message: format!("cannot execute {}: {err}", program.path),
        status,
    }
}

/// The program's steps that do not depend on its program part, in order.
fn harden<K: Kernel>(
    k: &mut K,
    last: &LastSteps<'_>,
    ruleset: K::Ruleset,
) -> Result<crate::landlock::LandlockOutcome, StepError> {
    let privileges =
        |what: &'static str| move |e: Errno| (FailureKind::Privileges, format!("{what}: {e}"));
    // A fresh signal state: the blocked mask would survive execve.
    k.reset_signals().map_err(privileges("resetting signals"))?;
    // New session, no controlling terminal: TIOCSTI cannot inject input
    // into the invoking terminal (CVE-2017-5226).
    k.setsid().map_err(privileges("setsid"))?;
    k.set_parent_death_signal(libc::SIGKILL)
        .map_err(privileges("PR_SET_PDEATHSIG"))?;
    // Every capability in every set, bounding and ambient included
    // (capabilities(7)); the bounding set only where init has not emptied
    // it already (it is inherited). (Without a user namespace and as an
    // ordinary user the bounding set cannot be emptied; no_new_privs below
    // makes it unusable anyway.)
    if last.bounding_emptied {
        k.drop_capability_sets()
    } else {
        k.drop_capabilities().map(drop)
    }
    .map_err(privileges("dropping capabilities"))?;
    // No execve can grant privileges again (setuid binaries stay inert);
    // also what lets an unprivileged process enforce Landlock and seccomp.
    k.set_no_new_privs()
        .map_err(privileges("PR_SET_NO_NEW_PRIVS"))?;
    // Landlock: the second filesystem layer (landlock(7)). It governs
    // opening, creating and removing files, not chdir or setrlimit.
    let status = k.landlock_restrict_self(ruleset).map_err(|e| {
        (
            FailureKind::Security,
            crate::landlock::err("restrict_self", e),
        )
    })?;
    crate::landlock::outcome(status, last.landlock_required, last.landlock_full)
        .map_err(|msg| (FailureKind::Security, msg))
}

/// The program's steps that depend on its program part, in order, up to
/// `execve`; `filters` are the seccomp filters not installed yet (none for
/// a held sandbox's process, which installed them before its wait).
fn finish<K: Kernel>(
    k: &mut K,
    filters: &[seccompiler::BpfProgram],
    program: &ProgramArgs,
    unreported: Option<crate::landlock::LandlockOutcome>,
    ctrl: &mut Control,
) -> Result<(), StepError> {
    // Resource limits, while nothing untrusted runs yet (setrlimit(2)).
    // Lowering needs no capability; raising a hard limit would need
    // CAP_SYS_RESOURCE in the initial user namespace, never held here.
    for r in &program.rlimits {
        apply_rlimit(k, r).map_err(|e| {
            (
                FailureKind::Privileges,
                format!("setrlimit {:?} to {}: {e}", r.kind, r.soft),
            )
        })?;
    }
    k.chdir(&program.cwd).map_err(|e| {
        (
            FailureKind::Privileges,
            format!("chdir to the workspace: {e}"),
        )
    })?;
    if let Some(landlock) = unreported {
        ctrl.send(&HelperMessage::Layers { landlock });
    }
    // seccomp last (seccomp(2)): nothing after this but execve.
    install(k, filters)
}

/// Installs seccomp filters, in order.
fn install<K: Kernel>(k: &mut K, filters: &[seccompiler::BpfProgram]) -> Result<(), StepError> {
    for prog in filters {
        k.seccomp_install(prog).map_err(|e| {
            (
                FailureKind::Security,
                format!("installing the seccomp filter: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Sets one rlimit. A value above the inherited hard limit is clamped to
/// it: raising a hard limit needs CAP_SYS_RESOURCE in the initial user
/// namespace, which the sandbox never has.
fn apply_rlimit<K: Kernel>(k: &mut K, r: &Rlimit) -> Result<(), Errno> {
    let resource = crate::plan::rlimit_resource(r.kind);
    let (_, hard_now) = k.get_rlimit(resource)?;
    k.set_rlimit(resource, r.soft.min(hard_now), r.hard.min(hard_now))
}

/// Binds the proxy listeners on this namespace's loopback and sends them to
/// the parent.
fn hand_over_listeners<K: Kernel>(k: &mut K, ctrl: &mut Control) -> Result<(), String> {
    use crate::plan::{HTTP_PROXY_PORT, SOCKS_PROXY_PORT};
    let mut bind = |port: u16| {
        k.listen_loopback(port)
            .map_err(|e| format!("binding the proxy port {port} in the sandbox: {e}"))
    };
    let http = bind(HTTP_PROXY_PORT)?;
    let socks = bind(SOCKS_PROXY_PORT)?;
    ctrl.send_with_fds(
        &HelperMessage::Listeners {
            http_port: HTTP_PROXY_PORT,
            socks_port: SOCKS_PROXY_PORT,
        },
        &[http.as_raw_fd(), socks.as_raw_fd()],
    )
    .map_err(|e| format!("handing the proxy sockets to corral: {e}"))
}

/// PID 1's loop. Signals arrive synchronously; SIGCHLD reaps every child
/// (orphans are re-parented to us); others are forwarded to the program.
pub(super) fn reap(program: i32, mut ctrl: Control, kill_leftovers: &dyn Fn()) -> ! {
    let mut status: Option<WaitStatus> = None;
    // What every reaped process used, for the report.
    let mut usage = process::Usage::default();
    loop {
        let sig = signal::wait_any().unwrap_or(libc::SIGCHLD);
        if sig == crate::kill_tree_signal() {
            // The parent's timeout or output ceiling: everything dies now.
            status.get_or_insert(WaitStatus::Signaled(libc::SIGKILL));
        } else if sig != libc::SIGCHLD {
            if status.is_none() {
                let _ = process::kill(program, sig);
            }
            continue;
        }
        // Whether no child is left at all (ECHILD): every process of the
        // sandbox is then gone, for all of them are our descendants (pid 1
        // of their namespace, or their subreaper in reduced mode).
        let none_left = loop {
            match process::wait_with_usage(-1, true) {
                Ok(Some((pid, ws, used))) => {
                    usage = usage.with(used);
                    if pid == program {
                        status = Some(ws);
                    }
                }
                Ok(None) => break false,
                Err(e) => break e.0 == libc::ECHILD,
            }
        };
        if let Some(ws) = status {
            // Kill, reap one, repeat: a process may have forked, or (under a
            // subreaper) an orphan may have been handed to us meanwhile.
            // Not when nothing is left: kill(-1) walks every process of
            // the host, skipping those outside this namespace one by one
            // (kill_something_info in kernel/signal.c), and reduced mode's
            // kill reads all of /proc; both on the way to the report.
            if !none_left {
                loop {
                    kill_leftovers();
                    match process::wait_with_usage(-1, false) {
                        Ok(Some((_, _, used))) => usage = usage.with(used),
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            }
            let (code, signal) = match ws {
                WaitStatus::Exited(c) => (Some(c), None),
                WaitStatus::Signaled(s) => (None, Some(s)),
            };
            ctrl.send(&HelperMessage::Exited {
                code,
                signal,
                cpu_us: usage.cpu_us,
                max_rss_bytes: usage.max_rss_bytes,
            });
            process::exit_now(0)
        }
    }
}

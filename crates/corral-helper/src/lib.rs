//! The in-sandbox helper: everything between corral's fork and the
//! program's `execve`.
//!
//! This crate is the only code that runs inside the sandbox's processes:
//! the helper (corral's own binary re-entered as `corral __sandbox-helper`,
//! or forked from the single-threaded CLI), the sandbox's init (PID 1 of
//! the new pid namespace, forked by the helper or cloned by the CLI) and
//! the program's process up to `execve`.
//!
//! # Rules for code in this crate
//!
//! - **Single-threaded.** Every process here has exactly one thread: the
//!   re-executed helper starts fresh before any async runtime, a forked
//!   helper comes from a process that checked it had one thread
//!   (`corral_sys::process::fork_in_single_threaded_helper`). So no lock can
//!   be held by a thread that no longer exists after a fork, and these
//!   processes may allocate and use the standard library between their
//!   forks. Never start a thread here.
//! - **Fail closed.** A step that cannot be done ends the sandbox with a
//!   [`HelperMessage::Failed`] naming the stage ([`FailureKind`]) and exit
//!   status [`EXIT_CORRAL_ERROR`]; nothing degrades silently.
//! - **Seccomp last.** The program's process installs the seccomp filters
//!   as its very last step before `execve`, after Landlock.
//! - **Kernel steps go through one trait.** Each system call of the
//!   sequence is a method of `kernel::Kernel`, and each process's sequence
//!   is a function generic over it (`helper_steps`, `init::setup`,
//!   `init::program_steps`), so unit tests check the order on a recording
//!   fake without root. Forks stay outside those functions.
//! - **Input is the plan.** [`SandboxPlan`] is decided by the launcher; the
//!   helper never reads policy or configuration itself.
//!
//! Process tree and hardening order (see docs/architecture.md):
//!
//! ```text
//! corral (parent; may be multi-threaded)
//!  ├─ helper: read plan → [root: become the sandbox uid] → PDEATHSIG
//!  │    → unshare(user) → uid/gid maps → max_user_namespaces 0
//!  │    → non-dumpable
//!  │    → unshare(mnt,pid,ipc,uts,net,cgroup)
//!  │    └─ init (PID 1 of the new pid namespace), from PDEATHSIG on
//!  └─ or, from the single-threaded CLI: init cloned into every namespace
//!       but the cgroup one (`init_cloned`): [v1: join its group] → close
//!       fds → [root: dumpable] → uid/gid maps → non-dumpable → [root:
//!       every id the sandbox uid] → max_user_namespaces 0 → unshare(cgroup)
//!       → block signals
//!       → PDEATHSIG → build the root filesystem → pivot_root →
//!         hostname, loopback → non-dumpable → empty the bounding set
//!         → Landlock ruleset → drop its other capability sets →
//!         no_new_privs → start the program → reaper seccomp filter
//!       └─ program: reset signals → setsid → PDEATHSIG → drop the other
//!            capability sets → no_new_privs → Landlock → [held: wait
//!            for the program part] → rlimits → chdir → seccomp → execve
//! ```
#![forbid(unsafe_code)]

mod filters;
mod init;
mod kernel;
mod landlock;
mod plan;
mod protocol;
mod reduced;
mod rootfs;
mod zygote;

pub use filters::{CompiledFilters, Insn};
pub use landlock::{LandlockOutcome, LandlockPlan};
pub use plan::{
    rlimit_resource, GeneratedFile, MountOp, ProgramPlan, ReducedPlan, Rlimit, RlimitKind,
    SandboxIdentity, SandboxPlan, SecurityPlan, HTTP_PROXY_PORT, SOCKS_PROXY_PORT,
};
pub use protocol::{
    inline_run_message, FailureKind, HelperMessage, GO_AHEAD, JOIN_MESSAGE, MAX_INLINE_BYTES,
    MAX_PLAN_BYTES, PLAN_MESSAGE, PROGRAM_MESSAGE,
};

/// The hidden subcommand that re-enters corral's binary as the sandbox
/// helper. `main` must check for it before doing anything else.
pub const HELPER_SUBCOMMAND: &str = "__sandbox-helper";

pub use zygote::{
    main as zygote_main, ForkReport, ZYGOTE_INIT_REQUEST, ZYGOTE_REQUEST, ZYGOTE_SUBCOMMAND,
};

/// Exit status for corral's own errors (bad policy, rejected command,
/// missing kernel feature), as `env(1)` and container runtimes use it.
pub const EXIT_CORRAL_ERROR: i32 = 125;
/// Exit status when the command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit status when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// The signal the parent sends the helper to have the whole sandbox killed
/// (timeout, output ceiling) when there is no pid namespace to tear down.
pub fn kill_tree_signal() -> i32 {
    libc::SIGRTMIN() + 4
}

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use corral_sys::process::{self, Fork, WaitStatus};
use corral_sys::{fd, mount, ns, signal, Errno};

use kernel::{Kernel, Sys};

/// A failed step: which kind, and a message naming the path and errno.
pub(crate) type StepError = (FailureKind, String);

/// The control socket, shared by the helper, init and the program's
/// pre-exec child (each writes whole messages).
pub(crate) struct Control(File);

impl Control {
    pub(crate) fn send(&mut self, msg: &HelperMessage) {
        if let Ok(bytes) = serde_json::to_vec(msg) {
            // Best effort: if the parent is gone, nobody is left to tell.
            let _ = self.0.write_all(&bytes);
        }
    }

    /// Sends a message with descriptors attached.
    pub(crate) fn send_with_fds(&mut self, msg: &HelperMessage, fds: &[i32]) -> Result<(), String> {
        let bytes = serde_json::to_vec(msg).map_err(|e| e.to_string())?;
        use std::os::fd::AsRawFd;
        fd::send_with_fds(self.0.as_raw_fd(), &bytes, fds).map_err(|e| e.to_string())
    }

    pub(crate) fn fail(&mut self, kind: FailureKind, message: String) -> ! {
        self.send(&HelperMessage::Failed { kind, message });
        process::exit_now(EXIT_CORRAL_ERROR)
    }

    /// Reports `failure` and exits with its status.
    pub(crate) fn exit_with(&mut self, failure: Failure) -> ! {
        self.send(&HelperMessage::Failed {
            kind: failure.kind,
            message: failure.message,
        });
        process::exit_now(failure.status)
    }
}

/// Why a process of the sandbox stopped short of its goal: the stage and
/// message it reports to corral, and the status it exits with.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The stage.
    pub(crate) kind: FailureKind,
    /// What failed, with paths and the errno name.
    pub(crate) message: String,
    /// The exit status ([`EXIT_CORRAL_ERROR`], or 126/127 for `execve`).
    pub(crate) status: i32,
}

/// Entry point of `corral __sandbox-helper`. Never returns.
pub fn main() -> ! {
    // The control socket comes as stdin (see `take_control_from_stdin`).
    let Ok(ctrl) = fd::take_control_from_stdin(fd::HELPER_CONTROL_FD) else {
        eprintln!("corral: the sandbox helper is internal; run `corral run` instead");
        process::exit_now(EXIT_CORRAL_ERROR);
    };
    let mut ctrl = Control(File::from(ctrl));
    let plan = match read_plan(&mut ctrl.0) {
        Ok(plan) => plan,
        Err(msg) => ctrl.fail(FailureKind::Protocol, msg),
    };
    // Into the sandbox's group before anything else (see
    // `SandboxPlan::cgroup_join`).
    let join: Vec<std::path::PathBuf> = plan.cgroup_join.iter().map(Into::into).collect();
    if let Err(msg) = join_cgroup(&join) {
        ctrl.fail(FailureKind::Setup, msg);
    }
    run(plan, ctrl)
}

/// Entry point of a helper forked (not re-executed) from a single-threaded
/// corral: stdio and the control socket are already at 0-3, and the plan
/// is already in memory. After the go-ahead it moves itself into its
/// cgroup through `join` (cgroup v1 `tasks` files; empty when corral moved
/// it already), failing closed. Then the copy of corral's argv and
/// environment this process inherited is wiped, so `/proc/1/cmdline` of
/// the sandbox shows nothing of the caller and the environment strings are
/// gone from memory. Never returns.
pub fn main_forked(plan: SandboxPlan, join: &[std::path::PathBuf]) -> ! {
    let Ok(ctrl) = fd::take_inherited(fd::HELPER_CONTROL_FD) else {
        process::exit_now(EXIT_CORRAL_ERROR);
    };
    let mut ctrl = Control(File::from(ctrl));
    // Wait until the parent has put us in the sandbox's cgroup, or lets us
    // join it ourselves.
    let mut go = [0u8; 8];
    match ctrl.0.read(&mut go) {
        Ok(n) if &go[..n] == GO_AHEAD => {}
        _ => process::exit_now(EXIT_CORRAL_ERROR),
    }
    if let Err(msg) = join_cgroup(join) {
        ctrl.fail(FailureKind::Setup, msg);
    }
    wipe_inherited_args_and_env(&mut ctrl);
    run(plan, ctrl)
}

/// Entry point of init cloned by corral straight into the sandbox's
/// namespaces (see [`cloned_init_steps`]), as the single-threaded CLI does
/// where it can: one process fewer than a helper that unshares them and
/// forks init. stdio and the control socket are already at 0-3. `join`
/// holds the cgroup v1 `tasks` files corral opened (empty without a
/// cgroup, or when `join_later`: corral makes the group while init builds
/// the root and sends them in a [`JOIN_MESSAGE`]), `lifeline` the read end
/// of a pipe corral holds open while it lives, `prepared` the idmapped
/// trees corral cloned while root. Never returns.
pub fn init_cloned(
    plan: &SandboxPlan,
    join: Vec<OwnedFd>,
    join_later: bool,
    lifeline: OwnedFd,
    prepared: Vec<(usize, OwnedFd)>,
) -> ! {
    let Ok(ctrl) = fd::take_inherited(fd::HELPER_CONTROL_FD) else {
        process::exit_now(EXIT_CORRAL_ERROR);
    };
    let mut ctrl = Control(File::from(ctrl));
    let mut keep: Vec<RawFd> = vec![lifeline.as_raw_fd()];
    keep.extend(prepared.iter().map(|(_, tree)| tree.as_raw_fd()));
    if let Err((kind, msg)) = cloned_init_steps(&mut Sys, plan, join, join_later, &keep) {
        ctrl.fail(kind, msg);
    }
    wipe_inherited_args_and_env(&mut ctrl);
    init::run(plan, ctrl, lifeline, prepared, join_later)
}

/// init's own first steps when corral cloned it into the namespaces, in
/// order, up to where a forked init would start (`init::run`, which arms
/// the parent-death signal and checks the lifeline first). The clone made
/// every namespace but the cgroup one, owned by a user namespace whose
/// owner is the sandbox identity: corral, when root, acted as that
/// identity for the clone and kept only its saved uid 0, to take its own
/// ids back. `keep` is what init still needs beyond stdio and the control
/// socket. With `join_later` (the group is made while init builds the
/// root) the join and the cgroup namespace wait for [`init_joins_late`].
/// Stops at the first failure.
pub(crate) fn cloned_init_steps<K: Kernel>(
    k: &mut K,
    plan: &SandboxPlan,
    join: Vec<K::Fd>,
    join_later: bool,
    keep: &[RawFd],
) -> Result<(), StepError> {
    // 0. Into the sandbox's cgroup before anything else: `0` written to a
    //    v1 `tasks` file moves the calling thread without the grace period
    //    a move by pid waits for (`SandboxCgroup::self_join_files`). The
    //    kernel checks the credentials of whoever opened the file (corral)
    //    and of this process (cgroups(7)); each file is closed once written.
    move_into_group(k, join)?;
    // 1. Nothing inherited beyond stdio, the control socket and `keep`
    //    reaches the sandbox (close_range(2)).
    k.close_from_except(4, keep)
        .map_err(|e| (FailureKind::Setup, format!("close_range: {e}")))?;
    let id = plan.identity;
    // 2. corral's uid change for the clone made this process non-dumpable,
    //    which makes its own /proc/self/uid_map root-owned (prctl(2)).
    if id.drop_from_root {
        k.set_dumpable(true).map_err(|e| {
            (
                FailureKind::Identity,
                format!("PR_SET_DUMPABLE after the uid change: {e}"),
            )
        })?;
    }
    // 3. The maps, written by this process for itself, as the helper does;
    //    then non-dumpable at once, the maps being the one reason to be
    //    dumpable (see `make_non_dumpable`).
    write_id_maps(k, id.uid, id.gid).map_err(|e| {
        (
            FailureKind::UserNamespace,
            format!("writing uid/gid maps: {e}"),
        )
    })?;
    make_non_dumpable(k)?;
    // 4. The saved uid corral kept is host root: unmapped here, so it can
    //    never be named, and dropped now all the same (setresuid(2)). Only
    //    the saved ids change, which leaves this process non-dumpable.
    if id.drop_from_root {
        k.set_ids(id.uid, id.gid).map_err(|e| {
            (
                FailureKind::Identity,
                format!("setting uid {} gid {} inside: {e}", id.uid, id.gid),
            )
        })?;
    }
    // 5. No nested user namespace (the helper's step 4b).
    refuse_nested_user_namespaces(k)?;
    // 6. The cgroup namespace after the join, so its root is the
    //    sandbox's group (or both later, see `init_joins_late`).
    if !join_later {
        k.unshare(ns::CLONE_NEWCGROUP)
            .map_err(|e| (FailureKind::Namespace, format!("unshare(cgroup): {e}")))?;
    }
    // 7. Signals are taken synchronously from here on (sigwaitinfo).
    k.block_signals()
        .map_err(|e| (FailureKind::Setup, format!("blocking signals: {e}")))
}

/// init's join of a group corral made after cloning it (cgroup v1,
/// `corral run`): once init has built the sandbox's root, which runs no
/// code of the sandbox, and before it prepares and starts the program, it
/// receives the group's `tasks` files ([`JOIN_MESSAGE`]), moves itself in
/// through each (`0`: this thread, no RCU grace period, as in
/// [`cloned_init_steps`] step 0), then unshares the cgroup namespace, whose
/// root is therefore the sandbox's group. Everything the program and its
/// descendants do is inside the group: they are forked after this.
pub(crate) fn init_joins_late<K: Kernel>(k: &mut K, ctrl: &mut Control) -> Result<(), StepError> {
    let tasks = k
        .receive_join(ctrl)
        .map_err(|msg| (FailureKind::Protocol, msg))?;
    if tasks.is_empty() {
        return Err((
            FailureKind::Protocol,
            "the cgroup join message came without its group's files".into(),
        ));
    }
    move_into_group(k, tasks)?;
    k.unshare(ns::CLONE_NEWCGROUP)
        .map_err(|e| (FailureKind::Namespace, format!("unshare(cgroup): {e}")))
}

/// init moves itself into its cgroup: `0` into each v1 `tasks` file
/// (corral opened them), each closed once written.
fn move_into_group<K: Kernel>(k: &mut K, tasks: Vec<K::Fd>) -> Result<(), StepError> {
    for file in tasks {
        k.write_all(file, b"0").map_err(|e| {
            (
                FailureKind::Setup,
                format!("cannot contain the sandbox: moving init into its cgroup failed: {e}"),
            )
        })?;
    }
    Ok(())
}

/// The namespaces corral clones init into ([`init_cloned`]): every one the
/// helper unshares but the cgroup namespace, which init unshares itself
/// once in its group. Network mode `host` keeps the host's network.
pub fn cloned_init_namespaces(plan: &SandboxPlan) -> i32 {
    ns::CLONE_NEWUSER | (namespaces(plan) & !ns::CLONE_NEWCGROUP)
}

/// Whose child [`clone_init_as_identity`] makes init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitParent {
    /// The caller's (`corral run`): it reaps init and learns its pid from
    /// the clone.
    Caller,
    /// The caller's parent (`CLONE_PARENT`, the fork server): the server
    /// that asked for init reaps it.
    CallersParent,
}

/// What [`clone_init_as_identity`] left in the caller.
#[derive(Debug)]
pub struct ClonedInit {
    /// init's pid in the caller's pid namespace, or what stopped the clone.
    pub pid: Result<i32, Errno>,
    /// Whether the caller has its own ids back. An error leaves it acting
    /// as the sandbox identity, maybe without its groups: it must run
    /// nothing more and stop (init, if cloned, is in `pid`).
    pub ids_restored: Result<(), Errno>,
}

/// Clones `plan`'s init straight into [`cloned_init_namespaces`], the
/// one sequence both `corral run` and the fork server use:
///
/// 1. A root caller dropping to the sandbox identity first acts as that
///    identity while keeping saved uid 0 ([`process::act_as_keeping_root`]),
///    so the new user namespace is owned by the unprivileged uid (never by
///    host root) and init starts with the identity's ids and no groups.
/// 2. The clone (the caller must be single-threaded): the child runs
///    `child`, which never returns; a panic in it ends the child with
///    [`EXIT_CORRAL_ERROR`] rather than unwinding into the caller's
///    destructors on a copy of its stack.
/// 3. The caller takes its ids back, whether or not the clone worked.
///
/// `Err` only when step 1 failed, with nothing changed.
pub fn clone_init_as_identity(
    plan: &SandboxPlan,
    parent: InitParent,
    child: impl FnOnce() -> std::convert::Infallible,
) -> Result<ClonedInit, Errno> {
    let id = plan.identity;
    let held = if id.drop_from_root {
        Some(process::act_as_keeping_root(id.uid, id.gid)?)
    } else {
        None
    };
    let namespaces = cloned_init_namespaces(plan);
    let cloned = match parent {
        InitParent::Caller => process::fork_into_namespaces_in_single_threaded_process(namespaces),
        InitParent::CallersParent => {
            process::fork_sibling_into_namespaces_in_single_threaded_process(namespaces)
        }
    };
    let pid = match cloned {
        Ok(Fork::Child) => {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child));
            process::exit_now(EXIT_CORRAL_ERROR)
        }
        Ok(Fork::Parent(pid)) => Ok(pid),
        Err(e) => Err(e),
    };
    let ids_restored = held.map_or(Ok(()), process::RootIds::restore);
    Ok(ClonedInit { pid, ids_restored })
}

/// The namespaces besides the user namespace a sandbox gets: all of
/// mount, pid, ipc, uts, net (unless network mode `host`, which keeps the
/// host's, explicit and reported loudly by the caller) and cgroup.
fn namespaces(plan: &SandboxPlan) -> i32 {
    let net = if plan.network == corral_policy::NetworkMode::Host {
        0
    } else {
        ns::CLONE_NEWNET
    };
    ns::CLONE_NEWNS
        | ns::CLONE_NEWPID
        | ns::CLONE_NEWIPC
        | ns::CLONE_NEWUTS
        | net
        | ns::CLONE_NEWCGROUP
}

/// The sandbox's share of the inotify budget its host user has.
///
/// The kernel counts inotify instances and watches per user in each user
/// namespace up the chain (user_namespaces(7), "/proc/sys/user"), and at
/// the host's level every sandbox root starts is one user: 65534, which
/// owns each sandbox's user namespace (as an ordinary user, the user). A
/// sandbox that took all of them (128 instances by default) left every
/// other sandbox's `inotify_init` failing with EMFILE. The copy of these
/// limits in the sandbox's own user namespace caps what it can take; a
/// program rarely needs more than a few instances. A kernel without
/// inotify has no such file, and nothing to cap.
pub(crate) const INOTIFY_SHARE: [(&str, &str); 2] = [
    ("/proc/sys/user/max_inotify_instances", "16"),
    ("/proc/sys/user/max_inotify_watches", "16384"),
];

/// No user namespace below the sandbox's, and its share of the host
/// user's inotify budget ([`INOTIFY_SHARE`]).
fn refuse_nested_user_namespaces<K: Kernel>(k: &mut K) -> Result<(), StepError> {
    // No user namespace below this one: a second layer behind seccomp's
    // refusal of CLONE_NEWUSER (as bubblewrap's --disable-userns), so a
    // filter gap cannot reopen the kernel's largest unprivileged attack
    // surface. The limit is per user namespace (user_namespaces(7),
    // "/proc/sys/user"): 0 here refuses every nested one with ENOSPC and
    // leaves the host's value alone. We hold CAP_SYS_RESOURCE in the new
    // namespace, which makes its copy of the sysctl writable.
    k.write_proc_file(MAX_USER_NAMESPACES, "0").map_err(|e| {
        (
            FailureKind::UserNamespace,
            format!(
                "setting {MAX_USER_NAMESPACES} to 0 inside the sandbox's user namespace: {e}; \
                 corral needs it to refuse nested user namespaces"
            ),
        )
    })?;
    for (file, value) in INOTIFY_SHARE {
        match k.write_proc_file(file, value) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err((
                    FailureKind::UserNamespace,
                    format!(
                        "setting {file} to {value} inside the sandbox's user namespace: {e}; \
                         corral needs it to bound the sandbox's share of its host user's inotify budget"
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// `PR_SET_DUMPABLE` 0, once the id maps are written.
fn make_non_dumpable<K: Kernel>(k: &mut K) -> Result<(), StepError> {
    // Non-dumpable again, now that the maps are written (the one reason to
    // be dumpable): this process holds the plan (the run's environment,
    // its secrets), and a dumpable process can be ptraced, and its memory
    // read, by any host process of the same uid, which as root is the
    // shared 65534 (prctl(2), PR_SET_DUMPABLE; ptrace(2), "Ptrace access
    // mode checking"). init inherits it.
    k.set_dumpable(false)
        .map_err(|e| (FailureKind::Privileges, format!("PR_SET_DUMPABLE: {e}")))
}

/// Overwrites the argv and environment strings this process inherited
/// from corral (forked, not executed), so `/proc/1/cmdline` of the sandbox
/// shows `corral-sandbox` and nothing of the caller. Fails closed.
fn wipe_inherited_args_and_env(ctrl: &mut Control) {
    if let Err(e) = process::wipe_args_and_env(b"corral-sandbox") {
        ctrl.fail(
            FailureKind::Setup,
            format!("wiping the inherited argv/environment: {e}"),
        );
    }
}

/// Moves this process (which has one thread) into every group of `join`
/// by writing `0` to each `tasks` file: the calling thread moves itself,
/// which takes no global lock in the kernel. Any failure is returned, and
/// the helper then stops before doing anything else.
fn join_cgroup(join: &[std::path::PathBuf]) -> Result<(), String> {
    for path in join {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(b"0"))
            .map_err(|e| {
                format!(
                    "cannot contain the sandbox: moving the helper into {} failed: {e}",
                    path.display()
                )
            })?;
    }
    Ok(())
}

/// Reads the plan message: the run's stdin, stdout and stderr and the
/// plan (see [`PLAN_MESSAGE`]), and puts the three
/// streams at 0, 1 and 2: this helper may have been started before the run
/// existed (a server's warm pool), with `/dev/null` there. End of file
/// means corral let a waiting helper go: exit quietly.
fn read_plan(ctrl: &mut File) -> Result<SandboxPlan, String> {
    let bytes = read_run_message(ctrl, PLAN_MESSAGE, "plan")?;
    serde_json::from_slice(&bytes).map_err(|e| format!("decoding the plan: {e}"))
}

/// Reads one message of the form corral starts a run with (tagged
/// `expected`, see [`inline_run_message`]): the run's stdin, stdout and
/// stderr attached, in that order, and the payload in the message or in a
/// sealed memfd attached fourth (at most [`MAX_PLAN_BYTES`]). Puts the
/// three streams at 0, 1 and 2 and returns the payload. End of file means
/// corral let this process go unused: it exits quietly, status 0.
pub(crate) fn read_run_message(
    ctrl: &mut File,
    expected: &[u8],
    what: &str,
) -> Result<Vec<u8>, String> {
    use protocol::RunPayload;
    use std::os::fd::AsRawFd;
    // Room for the largest inline message and one byte more, so that a
    // longer one is cut short and refused rather than read in part.
    let mut buf = vec![0u8; expected.len() + 2 + MAX_INLINE_BYTES];
    let (n, fds) = fd::recv_with_fds(ctrl.as_raw_fd(), &mut buf)
        .map_err(|e| format!("reading the {what} message: {e}"))?;
    if n == 0 {
        process::exit_now(0);
    }
    let payload = protocol::parse_run_message(expected, &buf[..n])
        .ok_or_else(|| format!("the {what} message is not one corral sends"))?;
    let count = payload.descriptors();
    if fds.len() != count {
        let memfd = if count == 4 { ", the memfd" } else { "" };
        return Err(format!(
            "the {what} came with {} descriptors, not {count} (stdin, stdout, stderr{memfd})",
            fds.len()
        ));
    }
    for (fd_, target) in fds.iter().zip(0..3) {
        fd::place(fd_, target).map_err(|e| format!("placing stdio fd {target}: {e}"))?;
    }
    match payload {
        RunPayload::Inline(bytes) => Ok(bytes.to_vec()),
        RunPayload::InMemfd => fd::read_sealed_memfd(&fds[3], MAX_PLAN_BYTES).map_err(|e| {
            format!("reading the {what} (at most {MAX_PLAN_BYTES} bytes, sealed): {e}")
        }),
    }
}

fn run(plan: SandboxPlan, mut ctrl: Control) -> ! {
    let prepared = match helper_steps(&mut Sys, &plan, |_| prepare_idmapped(&plan)) {
        Err((kind, msg)) => ctrl.fail(kind, msg),
        Ok(Next::ParentGone) => process::exit_now(EXIT_CORRAL_ERROR),
        // Reduced mode (explicitly asked for): no namespaces at all.
        Ok(Next::Reduced(_)) => reduced::run(plan, ctrl),
        Ok(Next::Namespaces(prepared)) => prepared,
    };
    // A lifeline: init checks, after arming its own death signal, that we
    // are still alive (its getppid() is 0 across the pid namespace).
    let (lifeline_read, lifeline_write) = match fd::pipe() {
        Ok(p) => p,
        Err(e) => ctrl.fail(FailureKind::Setup, format!("pipe: {e}")),
    };
    match process::fork_in_single_threaded_helper() {
        Err(e) => ctrl.fail(
            FailureKind::Namespace,
            format!("fork into the pid namespace: {e}"),
        ),
        Ok(Fork::Child) => {
            drop(lifeline_write);
            init::run(&plan, ctrl, lifeline_read, prepared, false)
        }
        Ok(Fork::Parent(init_pid)) => {
            drop(prepared);
            drop(lifeline_read);
            drop(plan);
            drop(ctrl);
            fd::stdio_to_devnull();
            supervise(init_pid, lifeline_write)
        }
    }
}

/// Where the helper goes once its own steps are done.
#[derive(Debug)]
pub(crate) enum Next<P> {
    /// corral died before the death signal was armed: exit quietly.
    ParentGone,
    /// Reduced mode: no namespaces; `P` is what `prepare` returned.
    Reduced(P),
    /// The namespaces exist and signals are blocked: fork init.
    Namespaces(P),
}

/// The helper's own steps, in order, up to the fork of init. `prepare`
/// clones the idmapped binds while still root (it forks, so it is not a
/// kernel step); its error is a mount failure. Stops at the first failure.
pub(crate) fn helper_steps<K: Kernel, P>(
    k: &mut K,
    plan: &SandboxPlan,
    prepare: impl FnOnce(&mut K) -> Result<P, String>,
) -> Result<Next<P>, StepError> {
    // 1. Nothing inherited beyond stdio and the control socket reaches the
    //    sandbox (close_range(2)).
    k.close_from(4)
        .map_err(|e| (FailureKind::Setup, format!("close_range: {e}")))?;
    // 2. corral started as root: become the unprivileged sandbox identity
    //    before anything else, so even a kernel bug in namespace set-up
    //    runs as an ordinary user (the program must never be host root).
    let id = plan.identity;
    // Reduced mode as root: empty the bounding set while we still hold
    // CAP_SETPCAP (there is no user namespace to do it in later).
    if plan.reduced.is_some() && id.drop_from_root {
        k.drop_bounding_set().map_err(|e| {
            (
                FailureKind::Privileges,
                format!("emptying the bounding set: {e}"),
            )
        })?;
    }
    // Still root: clone the workdir as an idmapped mount now (it needs
    // CAP_SYS_ADMIN over the host filesystem), attach it later inside.
    let prepared = prepare(k).map_err(|msg| (FailureKind::Mount, msg))?;
    if id.drop_from_root {
        k.become_user(id.uid, id.gid).map_err(|e| {
            (
                FailureKind::Identity,
                format!("switching to uid {} gid {}: {e}", id.uid, id.gid),
            )
        })?;
        // The uid change made us non-dumpable, which makes our own
        // /proc/self/uid_map root-owned (prctl(2), PR_SET_DUMPABLE).
        k.set_dumpable(true).map_err(|e| {
            (
                FailureKind::Identity,
                format!("PR_SET_DUMPABLE after the uid change: {e}"),
            )
        })?;
    }
    // 3. Die with corral (set after the uid change, which clears it), and
    //    bail out if corral already died before we got here.
    if k.set_parent_death_signal(libc::SIGKILL).is_err() || k.getppid() != plan.parent_pid {
        return Ok(Next::ParentGone);
    }
    if plan.reduced.is_some() {
        return Ok(Next::Reduced(prepared));
    }
    // 4. The user namespace first, on its own, so its absence gets its own
    //    diagnosis (Ubuntu 24.04's AppArmor restriction, sysctls).
    k.unshare(ns::CLONE_NEWUSER)
        .map_err(|e| (FailureKind::UserNamespace, userns_hint(e)))?;
    write_id_maps(k, id.uid, id.gid).map_err(|e| {
        (
            FailureKind::UserNamespace,
            format!("writing uid/gid maps: {e}"),
        )
    })?;
    // 4b, 4c. No user namespace below this one, non-dumpable.
    refuse_nested_user_namespaces(k)?;
    make_non_dumpable(k)?;
    // 5. Every other namespace, owned by the new user namespace.
    let flags = namespaces(plan);
    k.unshare(flags).map_err(|e| {
        (
            FailureKind::Namespace,
            format!("unshare(mount, pid, ipc, uts, net, cgroup): {e}"),
        )
    })?;
    // 6. Signals are taken synchronously from here on (sigwaitinfo), never
    //    in handlers.
    k.block_signals()
        .map_err(|e| (FailureKind::Setup, format!("blocking signals: {e}")))?;
    Ok(Next::Namespaces(prepared))
}

/// The helper's last job: forward signals to init and leave with init's
/// status. Holding `_lifeline` open tells init we are alive.
fn supervise(init_pid: i32, _lifeline: OwnedFd) -> ! {
    loop {
        let Ok(sig) = signal::wait_any() else {
            process::exit_now(EXIT_CORRAL_ERROR);
        };
        if sig == libc::SIGCHLD {
            match process::waitpid(init_pid, true) {
                Ok(Some((_, WaitStatus::Exited(code)))) => process::exit_now(code),
                Ok(Some((_, WaitStatus::Signaled(s)))) => process::exit_now(128 + s),
                Ok(None) => {}
                Err(_) => process::exit_now(EXIT_CORRAL_ERROR),
            }
        } else {
            let _ = process::kill(init_pid, sig);
        }
    }
}

/// Idmapped clones of the binds that ask for one, by index in the plan.
/// Needs host root (`CAP_SYS_ADMIN` over the filesystems), so it runs
/// before the sandbox identity is taken: in the helper's steps, or in
/// corral before it clones init ([`init_cloned`]).
pub fn prepare_idmapped(plan: &SandboxPlan) -> Result<Vec<(usize, OwnedFd)>, String> {
    let mut out = Vec::new();
    for (i, op) in plan.mounts.iter().enumerate() {
        let MountOp::Bind {
            source,
            idmap_from: Some((ouid, ogid)),
            ..
        } = op
        else {
            continue;
        };
        let id = plan.identity;
        let userns = idmap_userns(
            &format!("{ouid} {} 1\n", id.uid),
            &format!("{ogid} {} 1\n", id.gid),
        )?;
        let path =
            CString::new(source.as_str()).map_err(|_| format!("{source:?} contains a NUL byte"))?;
        // Opened once, following no symlink (a sandbox may have planted
        // one on the path since the plan was made), and checked: the tree
        // cloned and idmapped is the directory whose owner the plan saw.
        let dir = mount::openat2(
            libc::AT_FDCWD,
            &path,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            mount::RESOLVE_NO_SYMLINKS | mount::RESOLVE_NO_MAGICLINKS,
        )
        .map_err(|e| {
            format!("opening {source} for an idmapped mount without following symlinks: {e}")
        })?;
        let meta = File::from(
            dir.try_clone()
                .map_err(|e| format!("duplicating the fd of {source}: {e}"))?,
        )
        .metadata()
        .map_err(|e| format!("stat of {source}: {e}"))?;
        if (meta.uid(), meta.gid()) != (*ouid, *ogid) {
            return Err(format!(
                "{source} changed owner since the plan was made (now {}:{}, was {ouid}:{ogid}); refusing to idmap it",
                meta.uid(),
                meta.gid()
            ));
        }
        let tree = mount::open_tree(
            dir.as_raw_fd(),
            c"",
            mount::OPEN_TREE_CLONE | mount::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32,
        )
        .map_err(|e| format!("cloning {source} for an idmapped mount: {e}"))?;
        mount::idmap_tree(tree.as_fd(), userns.as_fd()).map_err(|e| {
            format!("idmapping {source} (uid {ouid} shown as {}): {e}; the filesystem may not support idmapped mounts", id.uid)
        })?;
        out.push((i, tree));
    }
    Ok(out)
}

/// A user namespace with the given maps, held only by the returned fd: a
/// short-lived child unshares it, we (root) write its maps and keep a
/// reference, and the child exits.
fn idmap_userns(uid_map: &str, gid_map: &str) -> Result<OwnedFd, String> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        format!("creating the idmap user namespace ({what}): {e}")
    };
    let (ready_r, ready_w) = fd::pipe().map_err(|e| err("pipe", &e))?;
    let (go_r, go_w) = fd::pipe().map_err(|e| err("pipe", &e))?;
    match process::fork_in_single_threaded_helper().map_err(|e| err("fork", &e))? {
        Fork::Child => {
            drop(ready_r);
            drop(go_w);
            let ok = ns::unshare(ns::CLONE_NEWUSER).is_ok();
            let _ = File::from(ready_w).write_all(&[u8::from(ok)]);
            // Wait until the parent holds the namespace (it closes `go`).
            let _ = File::from(go_r).read(&mut [0u8; 1]);
            process::exit_now(0)
        }
        Fork::Parent(pid) => {
            drop(ready_w);
            drop(go_r);
            let mut ok = [0u8; 1];
            let result = (|| {
                File::from(ready_r)
                    .read_exact(&mut ok)
                    .map_err(|e| err("handshake", &e))?;
                if ok[0] != 1 {
                    return Err(err(
                        "unshare",
                        &"the child could not create a user namespace",
                    ));
                }
                std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)
                    .map_err(|e| err("uid_map", &e))?;
                std::fs::write(format!("/proc/{pid}/gid_map"), gid_map)
                    .map_err(|e| err("gid_map", &e))?;
                File::open(format!("/proc/{pid}/ns/user"))
                    .map(OwnedFd::from)
                    .map_err(|e| err("ns/user", &e))
            })();
            drop(go_w);
            let _ = process::waitpid(pid, false);
            result
        }
    }
}

/// The per-user-namespace limit on user namespaces below it.
pub(crate) const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";

fn write_id_maps<K: Kernel>(k: &mut K, uid: u32, gid: u32) -> std::io::Result<()> {
    // setgroups must be denied before an unprivileged gid_map write
    // (user_namespaces(7), CVE-2014-8989).
    k.write_proc_file("/proc/self/setgroups", "deny")?;
    k.write_proc_file("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
    k.write_proc_file("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    Ok(())
}

fn userns_hint(e: Errno) -> String {
    format!(
        "user namespaces are unavailable: unshare(CLONE_NEWUSER) failed with {e}. \
         corral needs them to build its sandbox without privileges. Likely causes: \
         kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 24.04), \
         user.max_user_namespaces=0, or a container that forbids them. \
         `corral doctor` checks each and says how to fix it. \
         corral does not silently fall back to a weaker sandbox: `corral run --without-namespaces` \
         accepts one explicitly (Landlock, seccomp, rlimits and output bounds only)."
    )
}

//! The fork server: `corral __sandbox-zygote`, a single-threaded process
//! that forks ready sandbox helpers on request, so a service does not pay
//! a helper's program start (`execve` of corral's binary, the dynamic
//! loader and its relocations, the Rust runtime's start: about 0.5 ms of
//! CPU here) for every sandbox it builds ahead.
//!
//! Protocol, on the `SOCK_SEQPACKET` socket it gets as stdin: each request
//! is [`ZYGOTE_REQUEST`] with one descriptor attached, the new helper's
//! control socket; the fork server sends nothing back on its own socket.
//! It forks with `CLONE_PARENT`, so the helper is a child of the fork
//! server's parent (which waits for it and is told when it exits, exactly
//! as for a helper it started itself). The helper reports itself first
//! thing, on its own control socket: a [`ForkReport`] with its pid. So
//! the owner learns the pid from the helper, whatever happens to the fork
//! server meanwhile, and can always reap it. When the fork fails, the fork
//! server sends the report (pid 0 and the errno) on that socket instead.
//!
//! After its report the helper puts its control socket where a
//! re-executed helper finds it (stdin), takes a process group of its own,
//! rewrites its command line to a re-executed helper's and goes on as
//! [`crate::main`]. What it shares with the fork server, and with every
//! other helper of the same fork server, unlike a helper started by
//! `execve`: the address layout, the stack protector's canary and glibc's
//! pointer guard. No untrusted code runs with them (the sandboxed program
//! is always a fresh `execve`), and the owner replaces its fork server
//! after a number of forks and a time, so they do not last.
//!
//! A second request, [`ZYGOTE_INIT_REQUEST`], has the fork server clone a
//! sandbox's init straight into its namespaces, for a plan it brings, as
//! `corral run` clones its init: one process fewer per sandbox than a
//! helper that unshares the namespaces and forks init (the helper's
//! `unshare`, fork and exit; docs/PERFORMANCE.md, issue 17). The clone is
//! the fork server's sibling too. The fork server replies on its own
//! socket with init's pid (or 0 and what stopped the clone); init's own
//! first message is its report, with its own pid (1, in its pid
//! namespace), from whose credentials (`SO_PASSCRED`) the kernel gives the
//! owner the same pid, translated into the owner's pid namespace: so the
//! owner knows whom to kill and reap if either of them fails it. For the
//! clone the fork server acts as the sandbox identity, keeping only its
//! saved uid 0, exactly as `corral run` does, and takes its own ids back
//! at once; it stops should that fail, or should its scheduling (nice
//! value, policy, affinity, I/O priority: what another process of that
//! uid may change meanwhile, and later sandboxes would inherit) differ
//! afterwards.
//!
//! The fork server reads nothing but requests and what they carry (a
//! plan, parsed; as root it opens the host paths of idmapped binds),
//! holds no descriptor of a request after it, and exits at end of file on
//! its socket (its owner is gone) or on anything but a well-formed
//! request. It dies with
//! the thread that started it (`PR_SET_PDEATHSIG`), as the helpers and
//! inits it forks do.

use std::os::fd::{AsRawFd, OwnedFd};

use corral_sys::fd;
use corral_sys::process::{self, Fork};

use crate::plan::SandboxPlan;
use crate::protocol::{self, RunPayload, MAX_INLINE_BYTES, MAX_PLAN_BYTES};
use crate::{InitParent, EXIT_CORRAL_ERROR};

/// The hidden subcommand that re-enters corral's binary as the fork
/// server. As long as [`crate::HELPER_SUBCOMMAND`], so a forked helper
/// can rewrite its command line in place.
pub const ZYGOTE_SUBCOMMAND: &str = "__sandbox-zygote";

/// One request: fork a helper for the attached control socket.
pub const ZYGOTE_REQUEST: &[u8] = b"helper";

/// The other request: clone a sandbox's init straight into its
/// namespaces. The message is framed as a run message (see
/// [`crate::inline_run_message`]): this tag, a NUL byte and the plan
/// (JSON, at most [`MAX_INLINE_BYTES`]), or this tag alone with the plan
/// in a sealed memfd attached last. Attached in this order: init's
/// control socket, the read end of its lifeline (a pipe whose write end
/// the owner holds while it lives), the cgroup v1 `tasks` files init joins
/// its group through, which the owner opened (none without a group), and
/// the memfd if any. Only for a plan with namespaces
/// whose group, if any, init can join itself (cgroup v1). The fork
/// server replies on its own socket with a [`ForkReport`]: init's pid, or
/// 0 and the errno that stopped the clone.
pub const ZYGOTE_INIT_REQUEST: &[u8] = b"init";

/// The command line a forked helper shows (`/proc/PID/cmdline`): a
/// re-executed helper's.
const HELPER_CMDLINE: &[u8] = b"corral-sandbox\0__sandbox-helper";

/// Who was forked, or why nobody was: the first message on a forked
/// helper's control socket (or the fork server's, there, when the fork
/// failed), and the fork server's reply to an init request on its own
/// socket (and init's own first message, with its pid inside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkReport {
    /// The helper's pid; 0 when the fork failed.
    pub pid: i32,
    /// 0, or the errno that stopped it: the fork's, or `ENOSYS` from a
    /// helper that cannot run forked this way (it exits; reap `pid`).
    pub errno: i32,
}

impl ForkReport {
    /// Size of the encoding.
    pub const LEN: usize = 8;

    /// Pid and errno, little-endian.
    pub fn encode(self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&self.pid.to_le_bytes());
        out[4..].copy_from_slice(&self.errno.to_le_bytes());
        out
    }

    /// The report in `bytes`, if it has the report's size.
    pub fn decode(bytes: &[u8]) -> Option<ForkReport> {
        let pid = i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        let errno = i32::from_le_bytes(bytes.get(4..Self::LEN)?.try_into().ok()?);
        (bytes.len() == Self::LEN).then_some(ForkReport { pid, errno })
    }
}

/// Entry point of `corral __sandbox-zygote`. Never returns.
pub fn main() -> ! {
    let Ok(ctrl) = fd::take_control_from_stdin(fd::HELPER_CONTROL_FD) else {
        eprintln!("corral: the sandbox fork server is internal; run `corral serve` instead");
        process::exit_now(EXIT_CORRAL_ERROR);
    };
    // Gone with the thread that started it, even before its socket says so.
    if process::kill_with_parent().is_err() {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    // What a process of the sandbox uid could change about this one while
    // it acts as that uid for a clone (see `clone_init`).
    let Ok(scheduling) = process::scheduling() else {
        process::exit_now(EXIT_CORRAL_ERROR);
    };
    // Room for the largest request and one byte more, so that a longer
    // one is cut short and refused rather than read in part.
    let mut request = vec![0u8; ZYGOTE_INIT_REQUEST.len() + 2 + MAX_INLINE_BYTES];
    loop {
        let (n, mut fds) = match fd::recv_with_fds(ctrl.as_raw_fd(), &mut request) {
            Ok(got) => got,
            Err(e) if e.0 == libc::EINTR => continue,
            Err(_) => process::exit_now(EXIT_CORRAL_ERROR),
        };
        if n == 0 {
            process::exit_now(0);
        }
        match protocol::parse_run_message(ZYGOTE_INIT_REQUEST, &request[..n]) {
            Some(RunPayload::Inline(plan)) if fds.len() >= 2 => {
                clone_init(plan, fds, &ctrl, &scheduling);
                continue;
            }
            Some(RunPayload::InMemfd) if fds.len() >= 3 => {
                let plan = fds
                    .pop()
                    .and_then(|memfd| fd::read_sealed_memfd(&memfd, MAX_PLAN_BYTES).ok());
                match plan {
                    Some(plan) => clone_init(&plan, fds, &ctrl, &scheduling),
                    None => reply(&ctrl, 0, libc::EINVAL),
                }
                continue;
            }
            Some(_) => process::exit_now(EXIT_CORRAL_ERROR),
            None => {}
        }
        let well_formed = fds.len() == 1 && &request[..n] == ZYGOTE_REQUEST;
        let (Some(helper_ctrl), true) = (fds.pop(), well_formed) else {
            process::exit_now(EXIT_CORRAL_ERROR);
        };
        match process::fork_sibling_in_single_threaded_process() {
            Ok(Fork::Child) => {
                drop(ctrl);
                become_helper(helper_ctrl)
            }
            // The helper reports itself.
            Ok(Fork::Parent(_)) => {}
            Err(e) => {
                let report = ForkReport { pid: 0, errno: e.0 };
                // Lost only when the owner already gave up on this helper.
                let _ = fd::send_with_fds(helper_ctrl.as_raw_fd(), &report.encode(), &[]);
            }
        }
        drop(helper_ctrl);
    }
}

/// Clones init for `plan` (JSON) into its namespaces as this process's
/// sibling; `fds` are the request's descriptors (init's control socket,
/// its lifeline, the `tasks` files to join through). Replies on its own
/// socket `ctrl`: init's pid, or 0 and what stopped the clone (the owner
/// then builds the sandbox with a helper, whose failure, if any, says
/// precisely what is missing). Holds nothing of the request afterwards.
/// Exits when its ids cannot be taken back, or when what another process
/// of the sandbox uid may change about it (`scheduling`, taken at start)
/// changed while it acted as that uid: the change would be inherited by
/// every later sandbox it makes, so it leaves that to a new fork server.
fn clone_init(plan: &[u8], fds: Vec<OwnedFd>, ctrl: &OwnedFd, scheduling: &process::Scheduling) {
    let mut fds = fds.into_iter();
    let (Some(init_ctrl), Some(lifeline)) = (fds.next(), fds.next()) else {
        return reply(ctrl, 0, libc::EINVAL);
    };
    let join: Vec<OwnedFd> = fds.collect();
    let plan: SandboxPlan = match serde_json::from_slice(plan) {
        Ok(plan) => plan,
        Err(_) => return reply(ctrl, 0, libc::EINVAL),
    };
    if plan.reduced.is_some() {
        return reply(ctrl, 0, libc::EINVAL);
    }
    // Still root: the idmapped clones of the binds that ask for one.
    let Ok(prepared) = crate::prepare_idmapped(&plan) else {
        return reply(ctrl, 0, libc::EPERM);
    };
    let cloned = crate::clone_init_as_identity(&plan, InitParent::CallersParent, || {
        become_init(&plan, init_ctrl, lifeline, join, prepared)
    });
    let cloned = match cloned {
        Ok(cloned) => cloned,
        Err(e) => return reply(ctrl, 0, e.0),
    };
    match cloned.pid {
        Ok(pid) => reply(ctrl, pid, 0),
        Err(e) => reply(ctrl, 0, e.0),
    }
    // Acting as another user, without its groups, or changed by one: no
    // more sandboxes from this fork server. The owner starts another;
    // init, if cloned, is known to it by the reply above.
    let changed = plan.identity.drop_from_root && process::scheduling().as_ref() != Ok(scheduling);
    if cloned.ids_restored.is_err() || changed {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
}

/// The fork server's reply to an init request, on its own socket: init's
/// pid, or 0 and the errno that stopped the clone. Lost only when the
/// owner already gave up on the fork server.
fn reply(ctrl: &OwnedFd, pid: i32, errno: i32) {
    let _ = fd::send_with_fds(ctrl.as_raw_fd(), &ForkReport { pid, errno }.encode(), &[]);
}

/// In the cloned init: die with the owner's thread, report (first, before
/// any message of init's own), take the control socket's place, then go
/// on as init cloned by corral. Never returns.
fn become_init(
    plan: &SandboxPlan,
    init_ctrl: OwnedFd,
    lifeline: OwnedFd,
    join: Vec<OwnedFd>,
    prepared: Vec<(usize, OwnedFd)>,
) -> std::convert::Infallible {
    // From here on, as `init::run` arms it again and then checks the
    // lifeline for an owner gone before that.
    if process::set_parent_death_signal(libc::SIGKILL).is_err() {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    // Its pid here is 1; the owner reads the pid it knows init by from the
    // message's credentials.
    let report = ForkReport {
        pid: process::getpid_from_kernel(),
        errno: 0,
    };
    let placed = fd::send_with_fds(init_ctrl.as_raw_fd(), &report.encode(), &[])
        .and_then(|()| fd::place(&init_ctrl, fd::HELPER_CONTROL_FD))
        .and_then(|()| process::setpgid_self());
    // The fork server's own socket was at the control socket's number
    // (`take_control_from_stdin`): the `dup2` above closed this copy.
    drop(init_ctrl);
    if placed.is_err() {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    crate::init_cloned(plan, join, false, lifeline, prepared)
}

/// In the forked child: report, set up as a re-executed helper starts,
/// then run as one. Never returns.
fn become_helper(helper_ctrl: OwnedFd) -> ! {
    let pid = process::getpid_from_kernel();
    // A C library that cached its parent's pid would get this process's
    // own wrong (the helper signals and waits by pid): such a helper is
    // not used.
    let errno = if process::libc_pid_is_current() {
        0
    } else {
        libc::ENOSYS
    };
    let report = ForkReport { pid, errno };
    if fd::send_with_fds(helper_ctrl.as_raw_fd(), &report.encode(), &[]).is_err() || errno != 0 {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    let ready = fd::place(&helper_ctrl, 0)
        .and_then(|()| process::setpgid_self())
        .map_err(|e| e.to_string())
        .and_then(|()| process::wipe_args_and_env(HELPER_CMDLINE).map_err(|e| e.to_string()));
    drop(helper_ctrl);
    if ready.is_err() {
        process::exit_now(EXIT_CORRAL_ERROR);
    }
    crate::main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_decodes_as_it_was_encoded_and_nothing_else_does() {
        let r = ForkReport {
            pid: 4_194_303,
            errno: libc::ENOSYS,
        };
        assert_eq!(ForkReport::decode(&r.encode()), Some(r));
        assert_eq!(ForkReport::decode(&r.encode()[..7]), None);
        assert_eq!(ForkReport::decode(&[0u8; 9]), None);
    }
}

//! Re-executed sandbox helpers: `corral __sandbox-helper` started as a new
//! program, for callers that are (or may be) multi-threaded and so must not
//! fork a helper that keeps running their code.
//!
//! A [`ReadyHelper`] has done nothing but start: it has no namespace, no
//! privileges beyond corral's own, its stdio is `/dev/null`, and it reads
//! one message (the plan, with the run's stdin, stdout and stderr attached)
//! before anything else. It exits when corral closes its end of the control
//! socket, so one that is never used does not outlive its owner. Because
//! nothing of a run is needed to start one, a service can start helpers
//! ahead of its requests (the server's warm pool).
//!
//! A thread that starts many (a pool's refill thread) can have them forked
//! by a fork server of its own instead ([`fork_helpers_on_this_thread`];
//! see `corral_helper::zygote`): the same helper, without the program start
//! of corral's binary each time. For a sandbox built ahead whose plan is
//! known, that fork server can instead clone the sandbox's init itself
//! ([`ReadyHelper::clone_init`]), which then stands where the helper
//! would: one process fewer per sandbox.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};

use corral_helper::{
    ForkReport, HELPER_SUBCOMMAND, ZYGOTE_INIT_REQUEST, ZYGOTE_REQUEST, ZYGOTE_SUBCOMMAND,
};
use corral_sys::{fd, process};

/// A started helper waiting for its plan, or a sandbox's init cloned by a
/// fork server ([`ReadyHelper::clone_init`]), which has its plan.
#[derive(Debug)]
pub struct ReadyHelper {
    /// Our end of its control socket. Declared before `reap`, so it is
    /// closed first when a helper is dropped unused: the helper sees end
    /// of file and exits, and then the wait returns.
    ctrl: OwnedFd,
    /// For a cloned init, the write end of its lifeline, held while its
    /// run may use it (init checks it once its death signal is armed).
    lifeline: Option<OwnedFd>,
    reap: Reap,
}

/// Reaps the helper when dropped, unless a run took it over.
#[derive(Debug)]
struct Reap {
    pid: i32,
    armed: bool,
}

impl Drop for Reap {
    fn drop(&mut self) {
        if self.armed {
            let _ = process::wait4(self.pid);
        }
    }
}

impl ReadyHelper {
    /// Drops a helper whose process the caller has already reaped (it died
    /// while waiting): closes the control socket without a second wait,
    /// which could reap an unrelated child that reused the pid.
    pub fn forget_reaped(self) {
        drop(self.into_parts());
    }

    /// Its pid (a child of this process).
    pub fn pid(&self) -> i32 {
        self.reap.pid
    }

    /// Our end of its control socket (the helper keeps running as long as
    /// it is open).
    pub(crate) fn ctrl_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ctrl.as_raw_fd()
    }

    /// The pid, our end of the control socket and a cloned init's
    /// lifeline, for the run that takes this helper over (and with it the
    /// duty to reap it and to hold the lifeline until then).
    pub(crate) fn into_parts(self) -> (i32, OwnedFd, Option<OwnedFd>) {
        let ReadyHelper {
            ctrl,
            lifeline,
            mut reap,
        } = self;
        reap.armed = false;
        (reap.pid, ctrl, lifeline)
    }

    /// A sandbox's init, cloned for `plan` straight into its namespaces by
    /// this thread's fork server (see `corral_helper::zygote`), where a
    /// helper would otherwise unshare them and fork init: one process
    /// fewer. init joins its cgroup first thing through `join` (the v1
    /// `tasks` files, opened here; empty without a group), then builds the
    /// sandbox as a helper's init would, and holds it when `plan.hold`.
    /// It stands where the helper would: its pid is a child of this
    /// process, and a run talks to it on the control socket.
    ///
    /// `None`, and nothing started, when the thread has no fork server
    /// ([`fork_helpers_on_this_thread`]), there are more `tasks` files
    /// than a message carries, or the fork server could not clone it (a
    /// missing kernel feature, say): the caller then starts a helper,
    /// whose failure, if any, names what is missing.
    pub(crate) fn clone_init(
        plan: &corral_helper::SandboxPlan,
        join: &[std::path::PathBuf],
    ) -> Option<ReadyHelper> {
        // init's socket, its lifeline, the files, and perhaps the memfd.
        if join.len() + 3 > fd::MAX_PASSED_FDS || plan.reduced.is_some() {
            return None;
        }
        let payload = serde_json::to_vec(plan).ok()?;
        let join = crate::contain::open_for_writing(join).ok()?;
        FORK_SERVER
            .try_with(|s| s.borrow_mut().start(|z| z.clone_init(&payload, &join)))
            .ok()
            .flatten()
    }

    /// Starts one helper now: `/proc/self/exe __sandbox-helper`, empty
    /// environment, own process group (a terminal's Ctrl-C reaches corral
    /// only, which forwards it once), the control socket as stdin (the
    /// helper moves it to [`corral_sys::fd::HELPER_CONTROL_FD`] and puts
    /// `/dev/null` there), stdout and stderr on `/dev/null` until the plan
    /// brings the run's own. Nothing but stdio is placed, so the standard
    /// library spawns it with `posix_spawn` (`CLONE_VM | CLONE_VFORK`): no
    /// code of ours runs between fork and exec, and this (multi-threaded)
    /// process's address space is not copied, which a `fork` would do and
    /// then make every thread pay in copy-on-write faults.
    ///
    /// On a thread that asked for it ([`fork_helpers_on_this_thread`]),
    /// the helper is forked by that thread's fork server instead, started
    /// on first use; when that fails, the helper is spawned as above.
    pub fn spawn() -> std::io::Result<ReadyHelper> {
        let forked = FORK_SERVER
            .try_with(|s| s.borrow_mut().start(Zygote::fork_helper))
            .ok()
            .flatten();
        if let Some(helper) = forked {
            return Ok(helper);
        }
        let (pid, ctrl) = spawn_reexec(HELPER_SUBCOMMAND)?;
        Ok(ReadyHelper {
            ctrl,
            lifeline: None,
            reap: Reap { pid, armed: true },
        })
    }
}

/// Starts `/proc/self/exe SUBCOMMAND` as described at
/// [`ReadyHelper::spawn`]: its pid and our end of its control socket.
fn spawn_reexec(subcommand: &str) -> std::io::Result<(i32, OwnedFd)> {
    let (ours, theirs) = fd::seqpacket_pair()?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("corral-sandbox")
        .arg(subcommand)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn()?;
    let Ok(pid) = i32::try_from(child.id()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other(format!(
            "pid {} does not fit in pid_t",
            child.id()
        )));
    };
    Ok((pid, ours))
}

/// Has the helpers this thread starts from now on forked by a fork server
/// of its own (`corral __sandbox-zygote`, started on first use): each costs
/// a `fork` of a small single-threaded process instead of a program start
/// of corral's binary. For a thread that starts helpers ahead of their
/// runs and lives as long as they may wait (a pool's refill thread): the
/// fork server and its helpers die with it (`PR_SET_PDEATHSIG` follows
/// the thread), as helpers it spawned itself do, and the fork server is
/// let go and reaped when the thread ends.
pub fn fork_helpers_on_this_thread() {
    let _ = FORK_SERVER.try_with(|s| {
        let mut s = s.borrow_mut();
        if matches!(*s, ForkServer::Off) {
            *s = ForkServer::Wanted { broken: 0 };
        }
    });
}

thread_local! {
    /// This thread's fork server, if it asked for one.
    static FORK_SERVER: RefCell<ForkServer> = const { RefCell::new(ForkServer::Off) };
}

/// Helpers one fork server forks before it is replaced, and how long it
/// serves at most: its helpers share its address layout, stack canary and
/// pointer guard (see `corral_helper::zygote`), so none of them lasts.
const FORKS_PER_SERVER: u32 = 1000;
const SERVER_LIFETIME: Duration = Duration::from_secs(3600);

/// How long a helper may take to report after its request (it does in
/// well under a millisecond when the fork server works at all).
const FORK_TIMEOUT: Duration = Duration::from_secs(5);

/// Fork servers in a row that die or stop answering before the thread
/// gives up on them and spawns its helpers.
const MAX_BROKEN_IN_A_ROW: u32 = 3;

/// Whether and how this thread's helpers are forked.
#[derive(Debug)]
enum ForkServer {
    /// Spawned one by one (the default, and for good once forked helpers
    /// cannot work here or fork servers keep breaking).
    Off,
    /// Forked by a fork server, none running now: one is started on the
    /// next helper. How many broke in a row so far.
    Wanted { broken: u32 },
    /// Forked by this one.
    Running(Zygote),
}

/// Why a fork server gave no helper.
enum Unforked {
    /// This helper: spawn it instead, keep the fork server.
    This,
    /// The fork server is gone or broken: spawn this helper, start a new
    /// fork server for the next.
    Server,
    /// Forked helpers cannot work here: spawn from now on.
    Never,
}

impl ForkServer {
    /// What `ask` gets from this thread's fork server (a helper it forks,
    /// an init it clones), the fork server started (or replaced) now if
    /// need be; `None` when the thread did not ask for one or `ask` got
    /// nothing.
    fn start(
        &mut self,
        ask: impl FnOnce(&mut Zygote) -> Result<ReadyHelper, Unforked>,
    ) -> Option<ReadyHelper> {
        let worn =
            |z: &Zygote| z.forks >= FORKS_PER_SERVER || z.started.elapsed() >= SERVER_LIFETIME;
        if matches!(self, ForkServer::Running(z) if worn(z)) {
            *self = ForkServer::Wanted { broken: 0 };
        }
        let mut broken = 0;
        if let ForkServer::Wanted { broken: b } = *self {
            broken = b;
            let (pid, ctrl) = spawn_reexec(ZYGOTE_SUBCOMMAND).ok()?;
            *self = ForkServer::Running(Zygote {
                ctrl,
                pid: Some(pid),
                forks: 0,
                started: Instant::now(),
            });
        }
        let ForkServer::Running(zygote) = self else {
            return None;
        };
        let forked = ask(zygote);
        let gone = zygote.pid.is_none();
        match forked {
            Ok(helper) if !gone => return Some(helper),
            Ok(helper) => {
                *self = ForkServer::Wanted { broken: 0 };
                return Some(helper);
            }
            Err(Unforked::This) if !gone => return None,
            Err(Unforked::Never) => {
                *self = ForkServer::Off;
                return None;
            }
            Err(Unforked::This | Unforked::Server) => {}
        }
        *self = if broken + 1 >= MAX_BROKEN_IN_A_ROW {
            ForkServer::Off
        } else {
            ForkServer::Wanted { broken: broken + 1 }
        };
        None
    }
}

/// A running fork server. Dropping it kills it (it holds nothing of any
/// helper's) and reaps it.
#[derive(Debug)]
struct Zygote {
    ctrl: OwnedFd,
    /// `None` once it has been stopped and reaped.
    pid: Option<i32>,
    forks: u32,
    started: Instant,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Zygote {
    /// Kills and reaps it (once).
    fn stop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = process::kill(pid, libc::SIGKILL);
            let _ = process::wait4(pid);
        }
    }

    /// Asks for one helper: sends the new helper's end of its control
    /// socket; the helper (a child of this process: `CLONE_PARENT`)
    /// reports its pid on it (see `corral_helper::ForkReport`). A fork
    /// server that does not answer within [`FORK_TIMEOUT`] is stopped
    /// here, and then only a helper it forked can still hold that socket:
    /// its report, or the end of file, comes at once, so no helper is left
    /// unreaped.
    fn fork_helper(&mut self) -> Result<ReadyHelper, Unforked> {
        let (ours, theirs) = fd::seqpacket_pair().map_err(|_| Unforked::This)?;
        if fd::send_with_fds(self.ctrl.as_raw_fd(), ZYGOTE_REQUEST, &[theirs.as_raw_fd()]).is_err()
        {
            self.stop();
            return Err(Unforked::Server);
        }
        drop(theirs);
        self.forks += 1;
        if !readable_within(ours.as_raw_fd(), FORK_TIMEOUT) {
            self.stop();
        }
        let mut buf = [0u8; ForkReport::LEN + 1];
        let report = match fd::recv_with_fds(ours.as_raw_fd(), &mut buf) {
            Ok((n, _)) => ForkReport::decode(&buf[..n]),
            Err(_) => None,
        };
        match report {
            Some(ForkReport { pid, errno: 0 }) if pid > 0 => Ok(ReadyHelper {
                ctrl: ours,
                lifeline: None,
                reap: Reap { pid, armed: true },
            }),
            // A helper that cannot run forked: it exits; reap it.
            Some(ForkReport { pid, errno }) if pid > 0 => {
                let _ = process::wait4(pid);
                Err(if errno == libc::ENOSYS {
                    Unforked::Never
                } else {
                    Unforked::This
                })
            }
            // The fork failed (out of processes, say).
            Some(ForkReport { pid: 0, errno }) if errno == libc::ENOSYS => Err(Unforked::Never),
            Some(ForkReport { pid: 0, .. }) => Err(Unforked::This),
            // End of file (the fork server died before forking) or a
            // malformed report.
            _ => {
                self.stop();
                Err(Unforked::Server)
            }
        }
    }

    /// Asks for a sandbox's init for `plan` (JSON; in the
    /// [`ZYGOTE_INIT_REQUEST`] or, when large, in a sealed memfd attached
    /// last), joined to its group through `join`. The fork server replies
    /// with init's pid (or 0 and what stopped the clone); init's own
    /// report follows on its control socket, whose credentials give the
    /// same pid (`SO_PASSCRED`, on only for that first message). Each is
    /// waited for at most [`FORK_TIMEOUT`]: a fork server that does not
    /// reply is stopped, and an init that does not report (stopped, or
    /// dead before its report) is killed and reaped by the pid the fork
    /// server gave. Only when both fail at once is an init left unknown.
    fn clone_init(&mut self, plan: &[u8], join: &[OwnedFd]) -> Result<ReadyHelper, Unforked> {
        let (ours, theirs) = fd::seqpacket_pair().map_err(|_| Unforked::This)?;
        let (lifeline_r, lifeline_w) = fd::pipe().map_err(|_| Unforked::This)?;
        fd::set_pass_credentials(ours.as_raw_fd(), true).map_err(|_| Unforked::This)?;
        let mut fds = vec![theirs.as_raw_fd(), lifeline_r.as_raw_fd()];
        fds.extend(join.iter().map(AsRawFd::as_raw_fd));
        if crate::launch::send_run_message(self.ctrl.as_raw_fd(), ZYGOTE_INIT_REQUEST, &fds, plan)
            .is_err()
        {
            self.stop();
            return Err(Unforked::Server);
        }
        drop(theirs);
        drop(lifeline_r);
        self.forks += 1;
        // The fork server's reply.
        let mut buf = [0u8; ForkReport::LEN + 1];
        let replied = readable_within(self.ctrl.as_raw_fd(), FORK_TIMEOUT)
            .then(|| fd::recv_with_fds(self.ctrl.as_raw_fd(), &mut buf).ok())
            .flatten()
            .and_then(|(n, _)| ForkReport::decode(&buf[..n]));
        let known = match replied {
            Some(ForkReport { pid, errno: 0 }) if pid > 0 => Some(pid),
            Some(ForkReport { pid: 0, errno }) if errno == libc::ENOSYS => {
                return Err(Unforked::Never)
            }
            Some(ForkReport { pid: 0, errno }) if errno != 0 => return Err(Unforked::This),
            // Gone, stuck or confused: init, if it was cloned, still
            // reports on its own.
            _ => {
                self.stop();
                None
            }
        };
        let give_up = |pid: Option<i32>| {
            if let Some(pid) = pid {
                let _ = process::kill(pid, libc::SIGKILL);
                let _ = process::wait4(pid);
            }
            Err(if known.is_some() {
                Unforked::This
            } else {
                Unforked::Server
            })
        };
        // init's report.
        if !readable_within(ours.as_raw_fd(), FORK_TIMEOUT) {
            return give_up(known);
        }
        let (report, sender) = match fd::recv_with_sender_pid(ours.as_raw_fd(), &mut buf) {
            Ok((n, sender)) => (ForkReport::decode(&buf[..n]), sender),
            Err(_) => (None, None),
        };
        let init = match (known, sender) {
            (Some(pid), Some(from)) if pid == from => pid,
            (None, Some(from)) => from,
            // Not init's (another sender, or none): kill what is known.
            _ => return give_up(known),
        };
        if !matches!(report, Some(ForkReport { pid, errno: 0 }) if pid > 0) {
            return give_up(Some(init));
        }
        // Its later messages (a run's) come without credentials.
        if fd::set_pass_credentials(ours.as_raw_fd(), false).is_err() {
            return give_up(Some(init));
        }
        Ok(ReadyHelper {
            ctrl: ours,
            lifeline: Some(lifeline_w),
            reap: Reap {
                pid: init,
                armed: true,
            },
        })
    }
}

/// Whether `fd` becomes readable (or hung up) within `limit`; a signal
/// that interrupts the wait does not end it.
fn readable_within(fd: std::os::fd::RawFd, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        let mut ready = [fd::PollFd::read(fd)];
        if matches!(fd::poll(&mut ready, ms), Ok(n) if n > 0) {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minor page faults of the calling thread so far
    /// (`/proc/thread-self/stat`, field 10).
    fn thread_minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
        let after_comm = stat.rsplit(") ").next().expect("stat fields");
        after_comm
            .split(' ')
            .nth(7)
            .and_then(|f| f.parse().ok())
            .expect("minflt")
    }

    /// A helper is spawned without copying this process: after a `fork`
    /// (which std falls back to as soon as a `pre_exec` hook is set) every
    /// page this process had written is write-protected, and writing it
    /// again faults once per page; after `posix_spawn` nothing does.
    #[test]
    fn spawning_a_helper_does_not_copy_this_process() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.contains("[always]") {
            eprintln!("SKIP: transparent huge pages are `always` here: a copy would fault once per 2 MiB, too few to tell");
            return;
        }
        const PAGES: usize = 4096;
        let mut pages: Vec<Vec<u8>> = (0..PAGES).map(|_| vec![1u8; 4096]).collect();
        let helper = ReadyHelper::spawn().expect("spawn a helper");
        let before = thread_minor_faults();
        for p in &mut pages {
            p[0] = 2;
        }
        let faults = thread_minor_faults() - before;
        drop(helper);
        assert!(
            faults < PAGES as u64 / 4,
            "writing {PAGES} pages after the spawn faulted {faults} times: the spawn copied this process"
        );
    }
}

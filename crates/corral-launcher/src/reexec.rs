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

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use corral_helper::HELPER_SUBCOMMAND;
use corral_sys::{fd, process};

/// A started helper waiting for its plan.
#[derive(Debug)]
pub struct ReadyHelper {
    /// Our end of its control socket. Declared before `reap`, so it is
    /// closed first when a helper is dropped unused: the helper sees end
    /// of file and exits, and then the wait returns.
    ctrl: OwnedFd,
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

    /// The pid and our end of the control socket, for the run that takes
    /// this helper over (and with it the duty to reap it).
    pub(crate) fn into_parts(self) -> (i32, OwnedFd) {
        let ReadyHelper { ctrl, mut reap } = self;
        reap.armed = false;
        (reap.pid, ctrl)
    }

    /// Starts one helper now: `/proc/self/exe __sandbox-helper`, empty
    /// environment, own process group (a terminal's Ctrl-C reaches corral
    /// only, which forwards it once), stdio on `/dev/null` until the plan
    /// brings the run's own, control socket at [`fd::HELPER_CONTROL_FD`].
    pub fn spawn() -> std::io::Result<ReadyHelper> {
        let (ours, theirs) = fd::seqpacket_pair()?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0("corral-sandbox")
            .arg(HELPER_SUBCOMMAND)
            .env_clear()
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        fd::pass_fd_as(&mut cmd, &theirs, fd::HELPER_CONTROL_FD);
        let mut child = cmd.spawn()?;
        let Ok(pid) = i32::try_from(child.id()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "helper pid {} does not fit in pid_t",
                child.id()
            )));
        };
        Ok(ReadyHelper {
            ctrl: ours,
            reap: Reap { pid, armed: true },
        })
    }
}

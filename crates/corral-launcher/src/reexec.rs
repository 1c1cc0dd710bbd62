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
    /// only, which forwards it once), the control socket as stdin (the
    /// helper moves it to [`corral_sys::fd::HELPER_CONTROL_FD`] and puts
    /// `/dev/null` there), stdout and stderr on `/dev/null` until the plan
    /// brings the run's own. Nothing but stdio is placed, so the standard
    /// library spawns it with `posix_spawn` (`CLONE_VM | CLONE_VFORK`): no
    /// code of ours runs between fork and exec, and this (multi-threaded)
    /// process's address space is not copied, which a `fork` would do and
    /// then make every thread pay in copy-on-write faults.
    pub fn spawn() -> std::io::Result<ReadyHelper> {
        let (ours, theirs) = fd::seqpacket_pair()?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0("corral-sandbox")
            .arg(HELPER_SUBCOMMAND)
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

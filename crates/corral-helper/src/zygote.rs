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
//! The fork server never reads anything but requests, holds no other
//! descriptor, and exits at end of file on its socket (its owner is gone)
//! or on anything but a well-formed request. It dies with the thread that
//! started it (`PR_SET_PDEATHSIG`), as the helpers it forks do.

use std::os::fd::{AsRawFd, OwnedFd};

use corral_sys::fd;
use corral_sys::process::{self, Fork};

use crate::EXIT_CORRAL_ERROR;

/// The hidden subcommand that re-enters corral's binary as the fork
/// server. As long as [`crate::HELPER_SUBCOMMAND`], so a forked helper
/// can rewrite its command line in place.
pub const ZYGOTE_SUBCOMMAND: &str = "__sandbox-zygote";

/// One request: fork a helper for the attached control socket.
pub const ZYGOTE_REQUEST: &[u8] = b"helper";

/// The command line a forked helper shows (`/proc/PID/cmdline`): a
/// re-executed helper's.
const HELPER_CMDLINE: &[u8] = b"corral-sandbox\0__sandbox-helper";

/// The first message on a forked helper's control socket: who it is, or
/// why there is none.
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
    loop {
        let mut request = [0u8; 16];
        let (n, mut fds) = match fd::recv_with_fds(ctrl.as_raw_fd(), &mut request) {
            Ok(got) => got,
            Err(e) if e.0 == libc::EINTR => continue,
            Err(_) => process::exit_now(EXIT_CORRAL_ERROR),
        };
        if n == 0 {
            process::exit_now(0);
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

//! The fork server: `corral __sandbox-zygote`, a single-threaded process
//! that forks ready sandbox helpers on request, so a service does not pay
//! a helper's program start (`execve` of corral's binary, the dynamic
//! loader and its relocations, the Rust runtime's start: about 0.5 ms of
//! CPU here) for every sandbox it builds ahead.
//!
//! Protocol, on the `SOCK_SEQPACKET` control socket it gets as stdin: each
//! request is [`ZYGOTE_REQUEST`] with one descriptor attached, the new
//! helper's control socket. The fork server forks with `CLONE_PARENT`, so
//! the helper is a child of the fork server's own parent (which waits for
//! it, and is told when it exits, exactly as for a helper it started
//! itself), and answers with the helper's pid as 4 little-endian bytes
//! (a negative errno when the fork failed). The helper puts its control
//! socket where a re-executed helper finds it (stdin), takes a process
//! group of its own, rewrites its command line to a re-executed helper's,
//! and goes on as [`crate::main`]: from here on nothing tells the two
//! apart but the address layout, which every helper forked from one fork
//! server shares with it. Nothing untrusted runs in that layout: the
//! sandboxed program is always a fresh `execve`.
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
        let (Some(helper_ctrl), true) =
            (fds.pop(), fds.is_empty() && &request[..n] == ZYGOTE_REQUEST)
        else {
            process::exit_now(EXIT_CORRAL_ERROR);
        };
        let answer = match process::fork_sibling_in_single_threaded_process() {
            Ok(Fork::Child) => {
                drop(ctrl);
                become_helper(helper_ctrl)
            }
            Ok(Fork::Parent(pid)) => pid,
            Err(e) => -e.0,
        };
        drop(helper_ctrl);
        if fd::send_with_fds(ctrl.as_raw_fd(), &answer.to_le_bytes(), &[]).is_err() {
            process::exit_now(EXIT_CORRAL_ERROR);
        }
    }
}

/// In the forked child: set up as a re-executed helper starts, then run as
/// one. Never returns.
fn become_helper(helper_ctrl: OwnedFd) -> ! {
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

//! Reduced mode: when user namespaces are unavailable and the caller
//! explicitly accepts a weaker sandbox. No namespaces and no mounts: the
//! program runs on the host filesystem as Landlock allows, under seccomp
//! (which here also refuses network sockets and SysV IPC), rlimits, the
//! environment scrub and the output bounds. The helper becomes a child
//! subreaper, so daemons the program leaves behind are re-parented to it
//! and killed, without a pid namespace.

use corral_sys::fd;
use corral_sys::process;

use crate::init::{program_security, reap, start_program};
use crate::kernel::{Kernel, Sys};
use crate::plan::SandboxPlan;
use crate::protocol::FailureKind;
use crate::{Control, StepError};

/// Runs the program in reduced mode and supervises it. Never returns.
pub(super) fn run(plan: SandboxPlan, mut ctrl: Control) -> ! {
    if let Err((kind, msg)) = setup(&mut Sys) {
        ctrl.fail(kind, msg);
    }
    let (ruleset, filters) = program_security(&plan, &mut ctrl);
    // The program's process empties the bounding set itself, as far as it
    // can: without a user namespace nothing here has emptied it for sure
    // (an ordinary user cannot).
    let (program, ctrl) = start_program(&plan, ruleset, &filters, false, ctrl);
    drop(plan);
    fd::stdio_to_devnull();
    reap(program, ctrl, &kill_children)
}

/// The helper's own steps in reduced mode, in order; stops at the first
/// failure.
pub(crate) fn setup<K: Kernel>(k: &mut K) -> Result<(), StepError> {
    // Orphans come back to us to be killed (prctl(2),
    // PR_SET_CHILD_SUBREAPER): there is no pid namespace.
    k.set_child_subreaper()
        .map_err(|e| (FailureKind::Setup, format!("PR_SET_CHILD_SUBREAPER: {e}")))?;
    k.block_signals()
        .map_err(|e| (FailureKind::Setup, format!("blocking signals: {e}")))?;
    // The helper holds the plan: nothing may read its memory.
    k.set_dumpable(false)
        .map_err(|e| (FailureKind::Privileges, format!("PR_SET_DUMPABLE: {e}")))
}

/// SIGKILLs every child of this process (direct children and the orphans
/// re-parented to this subreaper), found through /proc. Never `kill(-1)`:
/// outside a pid namespace that would reach every process of the user.
fn kill_children() {
    let me = process::getpid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Field 4, after the parenthesised command name: the parent pid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(me) {
            let _ = process::kill(pid, libc::SIGKILL);
        }
    }
}

//! Signal masks and synchronous signal waiting for the helper and init.

use crate::{cvt, Errno, SysResult};

fn full_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset initialises it fully.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        set
    }
}

/// Blocks every signal on the calling thread, so the helper and init can
/// take them one at a time with [`wait_any`] instead of in handlers.
pub fn block_all() -> SysResult<()> {
    let set = full_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(Errno(ret));
    }
    Ok(())
}

/// Unblocks every signal and resets every handler to its default, so the
/// program starts with the signal state a fresh process would have (the
/// mask survives `execve`).
pub fn reset_all() -> SysResult<()> {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL for a valid signal number; errors for
        // numbers glibc reserves are harmless and ignored.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    let set = full_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(Errno(ret));
    }
    Ok(())
}

/// Waits for any blocked signal and returns its number. Retries on EINTR.
pub fn wait_any() -> SysResult<i32> {
    let set = full_set();
    loop {
        // SAFETY: `set` is initialised; a null siginfo pointer is allowed.
        let ret = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        match cvt(ret) {
            Ok(sig) => return Ok(sig),
            Err(e) if e.0 == libc::EINTR => continue,
            Err(e) => return Err(e),
        }
    }
}

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

/// A `signalfd(2)` for a set of signals, which are blocked on the calling
/// thread so they arrive only through the fd. Used by the CLI to forward
/// SIGINT/SIGTERM/... to the sandbox from its poll loop.
pub struct SignalFd {
    fd: std::os::fd::OwnedFd,
}

impl SignalFd {
    /// Blocks `signals` on this thread and opens a non-blocking,
    /// close-on-exec signalfd for them.
    pub fn new(signals: &[i32]) -> SysResult<SignalFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t.
        unsafe { libc::sigemptyset(&mut set) };
        for &s in signals {
            // SAFETY: `set` is initialised; invalid numbers return EINVAL.
            cvt(unsafe { libc::sigaddset(&mut set, s) })?;
        }
        // SAFETY: `set` is initialised; a null old-set pointer is allowed.
        let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if ret != 0 {
            return Err(Errno(ret));
        }
        // SAFETY: -1 asks for a new fd; `set` is initialised.
        let fd = cvt(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
        // SAFETY: signalfd returned a new fd that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { fd })
    }

    /// The fd, for polling.
    pub fn raw(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Takes one pending signal, if any.
    pub fn take(&self) -> Option<i32> {
        // SAFETY: signalfd_siginfo is plain data; all-zero is valid.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is a writable buffer of exactly `size` bytes.
        let n = unsafe {
            libc::read(
                self.raw(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if usize::try_from(n).ok() != Some(size) {
            return None;
        }
        i32::try_from(info.ssi_signo).ok()
    }
}

/// Restores the default SIGPIPE action (Rust ignores it), so a
/// report-printing command piped into `head` ends quietly like any Unix
/// tool instead of failing on EPIPE.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

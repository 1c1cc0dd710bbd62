//! Every `unsafe` syscall wrapper corral uses, in one auditable crate.
//!
//! Each wrapper is a thin, typed shell around one system call. Each
//! `unsafe` block carries a `// SAFETY:` argument. Wrappers return
//! [`Errno`] instead of allocating error strings, so the ones documented as
//! async-signal-safe may be called between `fork` and `exec`.
//!
//! Callers compose these into the sandbox set-up sequence in
//! `corral-helper` (and the launcher in `corral-launcher`); no policy lives here.

pub mod entry;
pub mod exec;
pub mod fd;
pub mod mount;
pub mod net;
pub mod ns;
pub mod pages;
pub mod process;
pub mod signal;
pub mod splice;

use std::fmt;

/// A raw `errno` value from a failed system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's current `errno`. Reading it does not allocate.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The symbolic name, e.g. `EPERM`, for messages and audit records.
    pub fn name(self) -> &'static str {
        match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::ESRCH => "ESRCH",
            libc::EINTR => "EINTR",
            libc::EIO => "EIO",
            libc::E2BIG => "E2BIG",
            libc::ENOEXEC => "ENOEXEC",
            libc::EBADF => "EBADF",
            libc::ECHILD => "ECHILD",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EACCES => "EACCES",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::EEXIST => "EEXIST",
            libc::EXDEV => "EXDEV",
            libc::ENOTDIR => "ENOTDIR",
            libc::EISDIR => "EISDIR",
            libc::EINVAL => "EINVAL",
            libc::EMFILE => "EMFILE",
            libc::ENOSPC => "ENOSPC",
            libc::EROFS => "EROFS",
            libc::ELOOP => "ELOOP",
            libc::ENAMETOOLONG => "ENAMETOOLONG",
            libc::ENOSYS => "ENOSYS",
            libc::EUSERS => "EUSERS",
            libc::ENOTSUP => "ENOTSUP",
            _ => "E?",
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.name(),
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

impl std::error::Error for Errno {}

/// Result of a wrapped system call.
pub type SysResult<T> = Result<T, Errno>;

/// Turns a C-style return value (`-1` means failure) into a result.
fn cvt<T: Copy + PartialOrd + Default>(ret: T) -> SysResult<T> {
    if ret < T::default() {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// Turns a byte count from a call returning `ssize_t` (`-1` means
/// failure) into a result: a negative value is the error in `errno`.
fn cvt_len(ret: isize) -> SysResult<usize> {
    usize::try_from(ret).map_err(|_| Errno::last())
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// Kernel feature probes for `corral doctor`.
pub mod probe {
    /// The Landlock ABI version the kernel offers (`landlock_create_ruleset`
    /// with `LANDLOCK_CREATE_RULESET_VERSION`), or the errno (EOPNOTSUPP:
    /// built but disabled at boot; ENOSYS: not built).
    pub fn landlock_abi() -> crate::SysResult<i32> {
        const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
        // SAFETY: a null attr with size 0 and the VERSION flag only queries
        // the ABI version; no memory is read or written.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        let version = crate::cvt(ret)?;
        i32::try_from(version).map_err(|_| crate::Errno(libc::EOVERFLOW))
    }
}

//! `execve` with arguments prepared before any fork.

use std::ffi::{CString, NulError};

use crate::Errno;

/// A program, its argv and envp as NUL-terminated C arrays, built before
/// forking so the child only has to call [`ExecArgs::exec`].
pub struct ExecArgs {
    path: CString,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

impl ExecArgs {
    /// Prepares `path`, `argv` and `env` (`NAME=VALUE` strings). Fails if
    /// any contains a NUL byte.
    pub fn new(path: &str, argv: &[String], env: &[String]) -> Result<Self, NulError> {
        let path = CString::new(path)?;
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        Ok(ExecArgs {
            path,
            _argv: argv,
            _envp: envp,
            argv_ptrs,
            envp_ptrs,
        })
    }

    /// `execve(2)`. Returns only on failure, with the errno. Allocation-free.
    pub fn exec(&self) -> Errno {
        // SAFETY: path, argv and envp are NUL-terminated strings owned by
        // `self`, and both pointer arrays end with a null pointer, as
        // execve(2) requires.
        unsafe {
            libc::execve(
                self.path.as_ptr(),
                self.argv_ptrs.as_ptr(),
                self.envp_ptrs.as_ptr(),
            )
        };
        Errno::last()
    }
}

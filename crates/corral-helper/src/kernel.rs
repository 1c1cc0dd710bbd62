//! The kernel boundary of the helper's steps.
//!
//! Every system call the helper, init's root-filesystem build and the
//! program's last steps make goes through [`Kernel`]. Production code uses
//! [`Sys`], which makes exactly the calls the code made before this trait
//! existed (same wrappers, same arguments, same errors). Tests use the
//! recording fake (`fake.rs`), which stores each call with its arguments
//! and can be told to fail one, so the hardening order and the fail-closed
//! behaviour are checked without root (the idea of youki's `Syscall` trait
//! and its recording `TestHelperSyscall`).
//!
//! Arguments are plain data (paths, flag bitsets, ids) so the fake records
//! them exactly; descriptors are the associated type [`Kernel::Fd`].
//! Callers are generic over `K: Kernel` (static dispatch) and [`Sys`] is
//! zero-sized: the program's process allocates nothing more between its
//! fork and `execve` than it did before.
//!
//! Forks are not kernel steps here: the sequence of steps inside one
//! process is a function taking `&mut K`, and the fork around it stays in
//! the caller.

use std::ffi::CStr;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use corral_sys::exec::ExecArgs;

use crate::plan::ProgramPlan;
use corral_sys::{fd, mount, net, ns, process, signal, Errno, SysResult};

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

/// The directory a path-relative call resolves against: the working
/// directory (`AT_FDCWD`) or an open directory.
pub(crate) enum At<'a, F> {
    /// `AT_FDCWD`.
    Cwd,
    /// An open directory (or, with an empty path and `AT_EMPTY_PATH`, the
    /// object itself).
    Fd(&'a F),
}

/// How much of a Landlock ruleset the kernel put in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enforcement {
    /// Every requested right.
    Full,
    /// Some of them (an older ABI).
    Partial,
    /// None (no Landlock in this kernel).
    None,
}

/// What `landlock_restrict_self` achieved, with the kernel's Landlock ABI
/// for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LandlockStatus {
    /// How much is enforced.
    pub(crate) enforced: Enforcement,
    /// The kernel's Landlock ABI (0 when unavailable).
    pub(crate) abi: i32,
}

/// One method per kernel step of the sandbox's processes, in the order
/// they come (helper, root filesystem, init, program). Each has the
/// semantics of the `corral_sys` wrapper (or std call) named in its doc.
pub(crate) trait Kernel {
    /// An open descriptor: a directory, a file or a detached mount tree.
    type Fd;
    /// A Landlock ruleset built before the program's fork.
    type Ruleset;
    /// Why `landlock_restrict_self` failed.
    type LandlockError: fmt::Display;

    // The helper.

    /// Closes every descriptor from `first` up (`fd::close_from`).
    fn close_from(&mut self, first: u32) -> SysResult<()>;
    /// Closes every descriptor from `first` up but those in `keep`
    /// (`fd::close_from_except`).
    fn close_from_except(&mut self, first: u32, keep: &[RawFd]) -> SysResult<()>;
    /// Empties the capability bounding set (`process::drop_bounding_set`).
    fn drop_bounding_set(&mut self) -> SysResult<bool>;
    /// `setgroups(0)`, `setresgid`, `setresuid` (`process::become_user`).
    fn become_user(&mut self, uid: u32, gid: u32) -> SysResult<()>;
    /// `setresgid`, `setresuid`, groups left alone (`process::set_ids`).
    fn set_ids(&mut self, uid: u32, gid: u32) -> SysResult<()>;
    /// `PR_SET_DUMPABLE` 1 or 0.
    fn set_dumpable(&mut self, dumpable: bool) -> SysResult<()>;
    /// `PR_SET_PDEATHSIG`.
    fn set_parent_death_signal(&mut self, sig: i32) -> SysResult<()>;
    /// `getppid(2)`.
    fn getppid(&mut self) -> i32;
    /// `unshare(2)` with `CLONE_NEW*` flags.
    fn unshare(&mut self, flags: i32) -> SysResult<()>;
    /// Writes `contents` to a `/proc` file (`setgroups`, the id maps).
    fn write_proc_file(&mut self, path: &str, contents: &str) -> io::Result<()>;
    /// Blocks every signal (`signal::block_all`).
    fn block_signals(&mut self) -> SysResult<()>;
    /// `PR_SET_CHILD_SUBREAPER` (reduced mode).
    fn set_child_subreaper(&mut self) -> SysResult<()>;

    // The root filesystem.

    /// `mount(2)`.
    fn mount(
        &mut self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: u64,
        data: Option<&CStr>,
    ) -> SysResult<()>;
    /// `umount2(2)`.
    fn umount(&mut self, target: &CStr, flags: i32) -> SysResult<()>;
    /// `pivot_root(2)`.
    fn pivot_root(&mut self, new_root: &CStr, put_old: &CStr) -> SysResult<()>;
    /// `chdir(2)`.
    fn chdir(&mut self, path: &CStr) -> SysResult<()>;
    /// `mkdirat(2)`.
    fn mkdir_at(&mut self, dir: At<'_, Self::Fd>, name: &CStr, mode: u32) -> SysResult<()>;
    /// Sets the permission bits of `path` (`std::fs::set_permissions`).
    fn chmod(&mut self, path: &str, mode: u32) -> io::Result<()>;
    /// Creates a new regular file, `EEXIST` when anything is there
    /// (`mount::create_file_at`).
    fn create_file_at(
        &mut self,
        dir: At<'_, Self::Fd>,
        name: &CStr,
        mode: u32,
    ) -> SysResult<Self::Fd>;
    /// Writes all of `contents` to `file` and closes it.
    fn write_all(&mut self, file: Self::Fd, contents: &[u8]) -> io::Result<()>;
    /// `openat2(2)` with mode 0 and the `resolve` flags.
    fn open_at(
        &mut self,
        dir: At<'_, Self::Fd>,
        path: &CStr,
        flags: i32,
        resolve: u64,
    ) -> SysResult<Self::Fd>;
    /// Whether `fd` is a directory.
    fn is_dir(&mut self, fd: &Self::Fd) -> SysResult<bool>;
    /// `open_tree(2)`: a detached mount tree.
    fn open_tree(&mut self, dir: At<'_, Self::Fd>, path: &CStr, flags: u32) -> SysResult<Self::Fd>;
    /// `mount_setattr(2)`: sets `set` and clears `clear`.
    fn mount_setattr(
        &mut self,
        dir: At<'_, Self::Fd>,
        path: &CStr,
        flags: u32,
        set: u64,
        clear: u64,
    ) -> SysResult<()>;
    /// `move_mount(2)` of the detached tree `from` onto `to`.
    fn move_mount(&mut self, from: &Self::Fd, to: &Self::Fd) -> SysResult<()>;
    /// `symlinkat(2)`: `name` in `dir` pointing to `target`.
    fn symlink_at(&mut self, target: &CStr, dir: At<'_, Self::Fd>, name: &CStr) -> SysResult<()>;

    // Init.

    /// `sethostname(2)`.
    fn sethostname(&mut self, name: &str) -> SysResult<()>;
    /// Brings `lo` up (`net::loopback_up`).
    fn loopback_up(&mut self) -> SysResult<()>;
    /// A TCP listener on `127.0.0.1:port` in this network namespace.
    fn listen_loopback(&mut self, port: u16) -> io::Result<OwnedFd>;

    // The program.

    /// Default handlers and an empty mask (`signal::reset_all`).
    fn reset_signals(&mut self) -> SysResult<()>;
    /// `setsid(2)`.
    fn setsid(&mut self) -> SysResult<()>;
    /// `getrlimit(2)`: (soft, hard).
    fn get_rlimit(&mut self, resource: libc::__rlimit_resource_t) -> SysResult<(u64, u64)>;
    /// `setrlimit(2)`.
    fn set_rlimit(
        &mut self,
        resource: libc::__rlimit_resource_t,
        soft: u64,
        hard: u64,
    ) -> SysResult<()>;
    /// Empties every capability set (`process::drop_all_capabilities`).
    fn drop_capabilities(&mut self) -> SysResult<bool>;
    /// Empties every capability set but the bounding set, which
    /// [`Kernel::drop_bounding_set`] emptied before this process existed
    /// (`process::drop_capability_sets`).
    fn drop_capability_sets(&mut self) -> SysResult<()>;
    /// `PR_SET_NO_NEW_PRIVS`.
    fn set_no_new_privs(&mut self) -> SysResult<()>;
    /// `landlock_restrict_self(2)` with the prepared ruleset.
    fn landlock_restrict_self(
        &mut self,
        ruleset: Self::Ruleset,
    ) -> Result<LandlockStatus, Self::LandlockError>;
    /// `seccomp(SECCOMP_SET_MODE_FILTER)` with one program.
    fn seccomp_install(
        &mut self,
        program: &seccompiler::BpfProgram,
    ) -> Result<(), seccompiler::Error>;
    /// A held sandbox's program part, received on the control socket with
    /// the run's stdin, stdout and stderr, which go to 0, 1 and 2
    /// (`PROGRAM_MESSAGE`). End of file (corral let the sandbox go) exits
    /// quietly.
    fn receive_program(&mut self, ctrl: &mut crate::Control) -> Result<ProgramPlan, String>;
    /// Receives the cgroup `tasks` files of a [`crate::JOIN_MESSAGE`]. End
    /// of file (corral is gone) exits quietly.
    fn receive_join(&mut self, ctrl: &mut crate::Control) -> Result<Vec<Self::Fd>, String>;
    /// `execve(2)`; returns only on failure.
    fn execve(&mut self, exec: &ExecArgs) -> Errno;
}

/// The real kernel: each method is the `corral_sys` (or std, landlock,
/// seccompiler) call the helper has always made.
pub(crate) struct Sys;

fn raw(dir: At<'_, OwnedFd>) -> RawFd {
    match dir {
        At::Cwd => libc::AT_FDCWD,
        At::Fd(fd) => fd.as_raw_fd(),
    }
}

impl Kernel for Sys {
    type Fd = OwnedFd;
    type Ruleset = landlock::RulesetCreated;
    type LandlockError = landlock::RulesetError;

    fn close_from(&mut self, first: u32) -> SysResult<()> {
        fd::close_from(first)
    }
    fn close_from_except(&mut self, first: u32, keep: &[RawFd]) -> SysResult<()> {
        fd::close_from_except(first, keep)
    }
    fn drop_bounding_set(&mut self) -> SysResult<bool> {
        process::drop_bounding_set()
    }
    fn become_user(&mut self, uid: u32, gid: u32) -> SysResult<()> {
        process::become_user(uid, gid)
    }
    fn set_ids(&mut self, uid: u32, gid: u32) -> SysResult<()> {
        process::set_ids(uid, gid)
    }
    fn set_dumpable(&mut self, dumpable: bool) -> SysResult<()> {
        if dumpable {
            process::set_dumpable()
        } else {
            process::set_non_dumpable()
        }
    }
    fn set_parent_death_signal(&mut self, sig: i32) -> SysResult<()> {
        process::set_parent_death_signal(sig)
    }
    fn getppid(&mut self) -> i32 {
        process::getppid()
    }
    fn unshare(&mut self, flags: i32) -> SysResult<()> {
        ns::unshare(flags)
    }
    fn write_proc_file(&mut self, path: &str, contents: &str) -> io::Result<()> {
        std::fs::write(path, contents)
    }
    fn block_signals(&mut self) -> SysResult<()> {
        signal::block_all()
    }
    fn set_child_subreaper(&mut self) -> SysResult<()> {
        process::set_child_subreaper()
    }

    fn mount(
        &mut self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: u64,
        data: Option<&CStr>,
    ) -> SysResult<()> {
        mount::mount(source, target, fstype, flags, data)
    }
    fn umount(&mut self, target: &CStr, flags: i32) -> SysResult<()> {
        mount::umount2(target, flags)
    }
    fn pivot_root(&mut self, new_root: &CStr, put_old: &CStr) -> SysResult<()> {
        mount::pivot_root(new_root, put_old)
    }
    fn chdir(&mut self, path: &CStr) -> SysResult<()> {
        mount::chdir(path)
    }
    fn mkdir_at(&mut self, dir: At<'_, OwnedFd>, name: &CStr, mode: u32) -> SysResult<()> {
        mount::mkdirat(raw(dir), name, mode)
    }
    fn chmod(&mut self, path: &str, mode: u32) -> io::Result<()> {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
    }
    fn create_file_at(
        &mut self,
        dir: At<'_, OwnedFd>,
        name: &CStr,
        mode: u32,
    ) -> SysResult<OwnedFd> {
        mount::create_file_at(raw(dir), name, mode)
    }
    fn write_all(&mut self, file: OwnedFd, contents: &[u8]) -> io::Result<()> {
        File::from(file).write_all(contents)
    }
    fn open_at(
        &mut self,
        dir: At<'_, OwnedFd>,
        path: &CStr,
        flags: i32,
        resolve: u64,
    ) -> SysResult<OwnedFd> {
        mount::openat2(raw(dir), path, flags, 0, resolve)
    }
    fn is_dir(&mut self, fd: &OwnedFd) -> SysResult<bool> {
        // One fstatat on the fd itself (O_PATH included).
        Ok(mount::fstat(fd.as_fd())?.is_dir())
    }
    fn open_tree(&mut self, dir: At<'_, OwnedFd>, path: &CStr, flags: u32) -> SysResult<OwnedFd> {
        mount::open_tree(raw(dir), path, flags)
    }
    fn mount_setattr(
        &mut self,
        dir: At<'_, OwnedFd>,
        path: &CStr,
        flags: u32,
        set: u64,
        clear: u64,
    ) -> SysResult<()> {
        mount::mount_setattr(raw(dir), path, flags, set, clear)
    }
    fn move_mount(&mut self, from: &OwnedFd, to: &OwnedFd) -> SysResult<()> {
        mount::move_mount_fds(from.as_fd(), to.as_fd())
    }
    fn symlink_at(&mut self, target: &CStr, dir: At<'_, OwnedFd>, name: &CStr) -> SysResult<()> {
        mount::symlinkat(target, raw(dir), name)
    }

    fn sethostname(&mut self, name: &str) -> SysResult<()> {
        ns::sethostname(name)
    }
    fn loopback_up(&mut self) -> SysResult<()> {
        net::loopback_up()
    }
    fn listen_loopback(&mut self, port: u16) -> io::Result<OwnedFd> {
        std::net::TcpListener::bind(("127.0.0.1", port)).map(OwnedFd::from)
    }

    fn reset_signals(&mut self) -> SysResult<()> {
        signal::reset_all()
    }
    fn setsid(&mut self) -> SysResult<()> {
        process::setsid()
    }
    fn get_rlimit(&mut self, resource: libc::__rlimit_resource_t) -> SysResult<(u64, u64)> {
        process::get_rlimit(resource)
    }
    fn set_rlimit(
        &mut self,
        resource: libc::__rlimit_resource_t,
        soft: u64,
        hard: u64,
    ) -> SysResult<()> {
        process::set_rlimit(resource, soft, hard)
    }
    fn drop_capabilities(&mut self) -> SysResult<bool> {
        process::drop_all_capabilities()
    }
    fn drop_capability_sets(&mut self) -> SysResult<()> {
        process::drop_capability_sets()
    }
    fn set_no_new_privs(&mut self) -> SysResult<()> {
        process::set_no_new_privs()
    }
    fn landlock_restrict_self(
        &mut self,
        ruleset: landlock::RulesetCreated,
    ) -> Result<LandlockStatus, landlock::RulesetError> {
        let status = ruleset.restrict_self()?;
        let abi = corral_sys::probe::landlock_abi().unwrap_or(0);
        let enforced = match status.ruleset {
            landlock::RulesetStatus::FullyEnforced => Enforcement::Full,
            landlock::RulesetStatus::PartiallyEnforced => Enforcement::Partial,
            _ => Enforcement::None,
        };
        Ok(LandlockStatus { enforced, abi })
    }
    fn seccomp_install(
        &mut self,
        program: &seccompiler::BpfProgram,
    ) -> Result<(), seccompiler::Error> {
        seccompiler::apply_filter(program)
    }
    fn receive_program(&mut self, ctrl: &mut crate::Control) -> Result<ProgramPlan, String> {
        let bytes =
            crate::read_run_message(&mut ctrl.0, crate::protocol::PROGRAM_MESSAGE, "program")?;
        serde_json::from_slice(&bytes).map_err(|e| format!("decoding the program: {e}"))
    }

    fn receive_join(&mut self, ctrl: &mut crate::Control) -> Result<Vec<OwnedFd>, String> {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 16];
        let (n, fds) = fd::recv_with_fds(ctrl.0.as_raw_fd(), &mut buf)
            .map_err(|e| format!("reading the cgroup join message: {e}"))?;
        if n == 0 {
            process::exit_now(0);
        }
        if &buf[..n] != crate::JOIN_MESSAGE {
            return Err("the cgroup join message is not one corral sends".into());
        }
        Ok(fds)
    }

    fn execve(&mut self, exec: &ExecArgs) -> Errno {
        exec.exec()
    }
}

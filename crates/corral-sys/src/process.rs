//! Processes: fork, wait, signals to processes, identity, privileges.

use crate::{cvt, Errno, SysResult};

/// Which side of a `fork` we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fork {
    /// In the parent; the child's pid.
    Parent(i32),
    /// In the child.
    Child,
}

/// `EDEADLK` unless the calling process has exactly one thread (a fork
/// in a process with others could leave the child holding their locks).
/// One `stat` of `/proc/self/task`, whose link count procfs makes 2 plus
/// the number of threads: no allocation (the allocator's pages are shared
/// copy-on-write with init, which checks this too).
fn only_thread() -> SysResult<()> {
    // SAFETY: `stat` is plain data, all-zero a valid value; the path is a
    // static C string and `stat` writes only into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    cvt(unsafe { libc::stat(c"/proc/self/task".as_ptr(), &mut st) })?;
    // procfs counts the threads into the task directory's link count: 2
    // plus one per thread (`proc_task_getattr`). One system call, where
    // the stat line takes four and the kernel's longest proc file.
    match st.st_nlink {
        3 => Ok(()),
        n if n > 3 => Err(Errno(libc::EDEADLK)),
        // A procfs that does not count them: read `num_threads`.
        _ => only_thread_by_stat_line(),
    }
}

/// [`only_thread`] from `num_threads` in `/proc/self/stat`.
fn only_thread_by_stat_line() -> SysResult<()> {
    let io = |e: std::io::Error| Errno(e.raw_os_error().unwrap_or(libc::EIO));
    let mut buf = [0u8; STAT_LINE_MAX];
    // Field 20: num_threads.
    if stat_field(read_own_stat_line(&mut buf).map_err(io)?, 20) != Some("1") {
        return Err(Errno(libc::EDEADLK));
    }
    Ok(())
}

/// Room for a `/proc/self/stat` line: pid, a command name of at most 16
/// bytes and 50 numbers, about 300 bytes in practice and under 1.2 KB
/// with every number at its widest.
const STAT_LINE_MAX: usize = 2048;

/// `/proc/self/stat` read into `buf` on the caller's stack: an `open`, one
/// `read` (procfs produces the line at once) and the `read` of its end,
/// where `fs::read` adds a `statx`, growing reads and an allocation.
fn read_own_stat_line(buf: &mut [u8; STAT_LINE_MAX]) -> std::io::Result<&[u8]> {
    use std::io::Read;
    let mut stat = std::fs::File::open("/proc/self/stat")?;
    let mut len = 0;
    loop {
        match stat.read(&mut buf[len..])? {
            0 => return Ok(&buf[..len]),
            n => len += n,
        }
        if len == buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "/proc/self/stat is longer than a stat line can be",
            ));
        }
    }
}

/// Field `n` of a `/proc/PID/stat` line, numbered from 1 as proc(5)
/// does (`n` >= 3: the fields after the command name). Counted after the
/// name's closing parenthesis, since the name may hold spaces and
/// parentheses itself.
fn stat_field(line: &[u8], n: usize) -> Option<&str> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(line.get(close + 1..)?).ok()?;
    // Field 3 (state) is the first after the name.
    rest.split_ascii_whitespace().nth(n.checked_sub(3)?)
}

/// `fork(2)`, refused unless the calling process has exactly one thread.
///
/// After `fork` the child has only the calling thread; any lock another
/// thread held (the allocator's, stdio's) would stay locked forever. corral
/// forks only in its single-threaded sandbox helper, and this check makes
/// that a property of the API rather than of the caller's care.
pub fn fork_in_single_threaded_helper() -> SysResult<Fork> {
    only_thread()?;
    // SAFETY: the process is single-threaded (checked above), so the child
    // inherits no lock held by another thread.
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// `clone(CLONE_PARENT)`: a `fork` whose child is this process's sibling
/// (a child of this process's parent, which is told when it exits, with
/// this process's own exit signal), refused unless the calling process has
/// exactly one thread. For a fork server: its parent reaps, waits for and
/// signals the children as its own. See clone(2); the raw system call
/// skips glibc's `fork` handlers, which a single-threaded process that
/// registered none does not need. The child should check
/// [`libc_pid_is_current`] before relying on the C library's idea of its
/// pid. `ENOSYS` on architectures whose `clone` takes its arguments in
/// another order (this passes only zeros after the flags, which x86_64
/// and aarch64 read alike).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn fork_sibling_in_single_threaded_process() -> SysResult<Fork> {
    raw_fork(libc::CLONE_PARENT)
}

/// `clone(2)` with `CLONE_NEW*` flags: a `fork` whose child starts in new
/// namespaces, refused unless the calling process has exactly one thread.
/// With `CLONE_NEWPID` the child is PID 1 of the new pid namespace; with
/// `CLONE_NEWUSER` it holds every capability in the new user namespace
/// (owned by this process's effective uid) and none outside it, and the
/// other new namespaces are owned by that user namespace (user_namespaces(7)).
/// This is how bubblewrap makes its PID 1: one process instead of a fork
/// that unshares and forks again. Same caveats as
/// [`fork_sibling_in_single_threaded_process`]: the raw system call, so the
/// child should not rely on the C library's idea of its pid.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn fork_into_namespaces_in_single_threaded_process(namespaces: i32) -> SysResult<Fork> {
    raw_fork(namespaces | libc::SIGCHLD)
}

/// See the other architectures' version.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn fork_into_namespaces_in_single_threaded_process(_namespaces: i32) -> SysResult<Fork> {
    Err(Errno(libc::ENOSYS))
}

/// [`fork_into_namespaces_in_single_threaded_process`] with
/// `CLONE_PARENT`: the child starts in new namespaces as this process's
/// sibling, a child of this process's parent (which reaps it and is told
/// when it exits, with this process's own exit signal), as
/// [`fork_sibling_in_single_threaded_process`] makes it. For a fork server
/// that clones a sandbox's init for its parent.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn fork_sibling_into_namespaces_in_single_threaded_process(namespaces: i32) -> SysResult<Fork> {
    raw_fork(namespaces | libc::CLONE_PARENT)
}

/// See the other architectures' version.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn fork_sibling_into_namespaces_in_single_threaded_process(
    _namespaces: i32,
) -> SysResult<Fork> {
    Err(Errno(libc::ENOSYS))
}

/// The raw `clone` of the two functions above: `flags` (with the child's
/// exit signal in the low byte), no new stack.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn raw_fork(flags: i32) -> SysResult<Fork> {
    only_thread()?;
    let flags = libc::c_ulong::try_from(flags).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: a clone without CLONE_VM and with no new stack is a fork: the
    // child runs on a copy of this address space. The process is
    // single-threaded (checked above), so the child inherits no lock held
    // by another thread; glibc no longer caches the pid, and its `raise`
    // asks the kernel for the thread id of the calling thread.
    let ret = cvt(unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })?;
    Ok(match i32::try_from(ret) {
        Ok(0) => Fork::Child,
        Ok(pid) => Fork::Parent(pid),
        Err(_) => return Err(Errno(libc::EOVERFLOW)),
    })
}

/// Bytes of stack the child of [`spawn_sharing_memory_in_single_threaded_process`]
/// gets (one guard page more below it). Only the pages it touches are
/// ever allocated.
const SHARED_CHILD_STACK_BYTES: usize = 256 * 1024;

/// Starts `child` in a new process that shares this process's memory until
/// it calls `execve` or exits, and returns its pid once it has: the
/// calling process is suspended meanwhile (`clone(CLONE_VM | CLONE_VFORK)`,
/// what `posix_spawn` and `vfork(2)` do). Refused unless the calling
/// process has exactly one thread. The child has its own descriptor table,
/// signal handlers, credentials, seccomp filters and resource limits (none
/// of `CLONE_FILES`, `CLONE_SIGHAND`, `CLONE_THREAD` or `CLONE_FS`), on its
/// own stack with a guard page; its exit signal is `SIGCHLD`.
///
/// Why: a `fork` copies the page tables of every written page, marks them
/// copy-on-write on both sides (each later write by either process then
/// faults and copies a page), and the child's `execve` tears that copy
/// down again. Sharing skips all three, which is what a process that only
/// prepares itself and calls `execve` needs.
///
/// The contract `child` must keep (checked by review, not by the type
/// system: corral keeps every `unsafe` in this crate, and its one caller,
/// init, is in a crate that forbids it): it runs on memory the suspended
/// caller resumes with, as a thread that runs to completion would. So
/// - whatever it frees must be its own (moved into it);
/// - it must start no thread: `execve` ends other threads before the
///   caller resumes, but an exit does not wait for them;
/// - it must not rely on the C library's idea of its pid or thread
///   (glibc's `raise` asks the kernel).
///
/// A panic never unwinds into the caller: it ends the child with status
/// 125 where panics unwind, and with SIGABRT under `panic = "abort"` (the
/// release profile). If `clone` fails, `child` is dropped here, unrun.
pub fn spawn_sharing_memory_in_single_threaded_process<F>(child: F) -> SysResult<i32>
where
    F: FnOnce() -> std::convert::Infallible,
{
    only_thread()?;
    spawn_sharing_memory(child)
}

/// [`spawn_sharing_memory_in_single_threaded_process`] without the check
/// for other threads (the tests run in a multi-threaded harness).
fn spawn_sharing_memory<F>(child: F) -> SysResult<i32>
where
    F: FnOnce() -> std::convert::Infallible,
{
    /// The child's first frame: takes `child` out of the caller's slot
    /// and runs it, never to return.
    extern "C" fn entry<F>(slot: *mut libc::c_void) -> libc::c_int
    where
        F: FnOnce() -> std::convert::Infallible,
    {
        // SAFETY: `slot` points at the caller's `ManuallyDrop<F>`, alive
        // (the caller is suspended inside `clone`) and read exactly once:
        // the caller never drops or reads it after a successful clone.
        let child = unsafe { std::ptr::read(slot.cast::<F>()) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child));
        exit_now(125)
    }
    let stack = ChildStack::map(SHARED_CHILD_STACK_BYTES)?;
    let mut slot = std::mem::ManuallyDrop::new(child);
    let arg: *mut F = &mut *slot;
    // SAFETY: `entry::<F>` matches the pointer it is given (`arg`, see
    // there); `stack.top()` is the 16-byte aligned end of a writable
    // mapping that outlives the child's use of it (CLONE_VFORK: clone
    // returns only once the child has called execve or exited, and the
    // mapping is unmapped after that). Without CLONE_SETTLS the child
    // runs with this thread's TLS, which nothing else uses meanwhile: the
    // process has no other thread (checked by the caller) and this one is
    // suspended.
    let pid = unsafe {
        libc::clone(
            entry::<F>,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg.cast(),
        )
    };
    if pid == -1 {
        let err = Errno::last();
        // Never ran: ours to drop.
        drop(std::mem::ManuallyDrop::into_inner(slot));
        return Err(err);
    }
    Ok(pid)
}

/// An anonymous mapping used as a child's stack, with a guard page at its
/// low end (stacks grow down) so an overflow faults instead of writing
/// into whatever lies below. Unmapped on drop.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    fn map(bytes: usize) -> SysResult<ChildStack> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .map_err(|_| Errno(libc::EINVAL))?;
        let len = bytes.div_ceil(page) * page + page;
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of the mapping made above.
        cvt(unsafe { libc::mprotect(base, page, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// The stack's start for `clone`: its high end.
    fn top(&self) -> *mut libc::c_void {
        // Page-aligned, so 16-byte aligned as the ABI wants.
        self.base.wrapping_byte_add(self.len)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, no longer used by anyone: the
        // child that ran on it has called execve or exited.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// See the other architectures' version.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn fork_sibling_in_single_threaded_process() -> SysResult<Fork> {
    Err(Errno(libc::ENOSYS))
}

/// The process id, asked of the kernel (`SYS_getpid`), not of the C
/// library.
pub fn getpid_from_kernel() -> i32 {
    // SAFETY: getpid has no arguments and no preconditions.
    let pid = unsafe { libc::syscall(libc::SYS_getpid) };
    i32::try_from(pid).unwrap_or(-1)
}

/// Whether the C library's `getpid` is this process's (glibc before 2.25
/// cached it, and a child of a raw `clone` would see its parent's).
pub fn libc_pid_is_current() -> bool {
    getpid() == getpid_from_kernel()
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

impl WaitStatus {
    /// How a child ended, from a raw wait status; `None` for stop and
    /// continue reports (we never ask for them, but `__WALL` can see them).
    fn decode(status: libc::c_int) -> Option<WaitStatus> {
        if libc::WIFEXITED(status) {
            Some(WaitStatus::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(WaitStatus::Signaled(libc::WTERMSIG(status)))
        } else {
            None
        }
    }
}

/// `waitpid(2)`. Returns `None` with `WNOHANG` when nothing has changed.
/// Stopped/continued reports are skipped (we never ask for them).
pub fn waitpid(pid: i32, nohang: bool) -> SysResult<Option<(i32, WaitStatus)>> {
    Ok(wait_with_usage(pid, nohang)?.map(|(pid, ws, _)| (pid, ws)))
}

/// [`waitpid`] that also returns the child's resource usage, which
/// includes every descendant it reaped in turn (`wait4(2)`; the same
/// system call, so a seccomp filter that allows one allows the other).
pub fn wait_with_usage(pid: i32, nohang: bool) -> SysResult<Option<(i32, WaitStatus, Usage)>> {
    let flags = if nohang { libc::WNOHANG } else { 0 } | libc::__WALL;
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data; all-zero is valid.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `ru` are valid, writable and live across the
        // call.
        let ret = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
        if ret < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if ret == 0 {
            return Ok(None);
        }
        let Some(ws) = WaitStatus::decode(status) else {
            continue;
        };
        return Ok(Some((ret, ws, Usage::of(&ru))));
    }
}

/// `kill(2)`.
pub fn kill(pid: i32, sig: i32) -> SysResult<()> {
    // SAFETY: kill takes plain integers and touches no memory of ours.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `pidfd_open(2)`: a descriptor that refers to the process that has `pid`
/// now, and keeps referring to it (never to a later process given the same
/// number) after it exits.
pub fn pidfd_open(pid: i32) -> SysResult<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let raw = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })?;
    let raw = i32::try_from(raw).map_err(|_| Errno(libc::EBADF))?;
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// `pidfd_send_signal(2)`: signals exactly the process `pidfd` refers to
/// (`ESRCH` once it has exited), never whoever got its pid later.
pub fn pidfd_send_signal(pidfd: &std::os::fd::OwnedFd, sig: i32) -> SysResult<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a null siginfo asks for the kill(2)-like default; the fd is
    // borrowed for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    })
    .map(drop)
}

/// `_exit(2)`: ends the process at once without running destructors or
/// flushing stdio (correct in a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}

/// `getpid(2)`.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// `getppid(2)`.
pub fn getppid() -> i32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

/// Real and effective user ids.
pub fn uids() -> (u32, u32) {
    // SAFETY: getuid/geteuid have no preconditions.
    unsafe { (libc::getuid(), libc::geteuid()) }
}

/// Effective group id.
pub fn getegid() -> u32 {
    // SAFETY: getegid has no preconditions.
    unsafe { libc::getegid() }
}

/// Becomes `uid`/`gid` for real, effective and saved ids, with no
/// supplementary groups. Used when corral starts as root: the sandbox must
/// never run as host root.
pub fn become_user(uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: a null list with size 0 clears the supplementary groups.
    cvt(unsafe { libc::setgroups(0, std::ptr::null()) })?;
    set_ids(uid, gid)
}

/// Sets real, effective and saved ids to `uid`/`gid` and leaves the
/// supplementary groups alone: inside a user namespace whose `setgroups`
/// is denied, where `setgroups` would fail (user_namespaces(7)).
pub fn set_ids(uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::setresuid(uid, uid, uid) })?;
    Ok(())
}

/// A root process's own ids, set aside by [`act_as_keeping_root`].
#[must_use = "the process acts as another user until the ids are restored"]
#[derive(Debug)]
pub struct RootIds {
    uids: [u32; 3],
    gids: [u32; 3],
    groups: Vec<libc::gid_t>,
    /// The parent-death signal (`PR_GET_PDEATHSIG`, 0 for none), which
    /// every change of the effective uid clears (prctl(2)), and the parent
    /// it was armed for.
    death_signal: (i32, i32),
}

/// Makes a root process act as `uid`/`gid` for a moment: no supplementary
/// groups, every gid `gid`, real and effective uid `uid`, saved uid 0.
/// Meanwhile its effective capabilities are empty; the permitted ones stay
/// because the saved uid is still 0 (capabilities(7), "Effect of user ID
/// changes on capabilities"), which is what lets [`RootIds::restore`] take
/// everything back. A child cloned meanwhile starts with these ids, and a
/// user namespace it is cloned into is owned by `uid`. `EPERM` unless the
/// effective uid is 0; on failure nothing is left changed. The
/// parent-death signal (`corral run --die-with-parent`), which the uid
/// change clears, is armed again by [`RootIds::restore`].
pub fn act_as_keeping_root(uid: u32, gid: u32) -> SysResult<RootIds> {
    let mut uids = [0u32; 3];
    let mut gids = [0u32; 3];
    // SAFETY: each pointer is to a live, writable u32.
    cvt(unsafe { libc::getresuid(&mut uids[0], &mut uids[1], &mut uids[2]) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::getresgid(&mut gids[0], &mut gids[1], &mut gids[2]) })?;
    if uids[1] != 0 {
        return Err(Errno(libc::EPERM));
    }
    // SAFETY: size 0 with a null list asks for the count only.
    let n = cvt(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
    let mut groups = vec![0 as libc::gid_t; usize::try_from(n).unwrap_or(0)];
    // SAFETY: the list has room for `n` entries, and `n` is passed.
    let n = cvt(unsafe { libc::getgroups(n, groups.as_mut_ptr()) })?;
    groups.truncate(usize::try_from(n).unwrap_or(0));
    let mut signal: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG stores an int through the pointer, which
    // points to a live c_int.
    cvt(unsafe { libc::prctl(libc::PR_GET_PDEATHSIG, &mut signal as *mut libc::c_int) })?;
    let held = RootIds {
        uids,
        gids,
        groups,
        death_signal: (signal, getppid()),
    };
    let switched = (|| {
        // SAFETY: a null list with size 0 clears the supplementary groups.
        cvt(unsafe { libc::setgroups(0, std::ptr::null()) })?;
        // SAFETY: plain integer arguments.
        cvt(unsafe { libc::setresgid(gid, gid, gid) })?;
        // SAFETY: plain integer arguments.
        cvt(unsafe { libc::setresuid(uid, uid, 0) })
    })();
    match switched {
        Ok(_) => Ok(held),
        Err(e) => {
            // Still root where the switch stopped: put back what changed.
            let _ = held.restore();
            Err(e)
        }
    }
}

impl RootIds {
    /// Takes the ids set aside back: uids first (allowed, the saved uid is
    /// 0), which restores the effective capabilities, then gids and
    /// supplementary groups (with `CAP_SETGID` again). Then the
    /// parent-death signal, if one was armed; should the parent have died
    /// while it was cleared, the signal is sent now, as the kernel would
    /// have sent it.
    pub fn restore(self) -> SysResult<()> {
        let [ru, eu, su] = self.uids;
        let [rg, eg, sg] = self.gids;
        // SAFETY: plain integer arguments.
        cvt(unsafe { libc::setresuid(ru, eu, su) })?;
        // SAFETY: plain integer arguments.
        cvt(unsafe { libc::setresgid(rg, eg, sg) })?;
        // SAFETY: the list holds `len` entries.
        cvt(unsafe { libc::setgroups(self.groups.len(), self.groups.as_ptr()) })?;
        let (signal, parent) = self.death_signal;
        if signal != 0 {
            set_parent_death_signal(signal)?;
            if getppid() != parent {
                kill(getpid(), signal)?;
            }
        }
        Ok(())
    }
}

/// `setsid(2)`: a new session with no controlling terminal, so `TIOCSTI`
/// cannot push keystrokes into the invoking terminal (CVE-2017-5226).
pub fn setsid() -> SysResult<()> {
    // SAFETY: setsid has no memory arguments.
    cvt(unsafe { libc::setsid() }).map(drop)
}

fn prctl(option: i32, arg: libc::c_ulong) -> SysResult<()> {
    // SAFETY: every option passed by this module takes integer arguments
    // only; unused arguments are zero as prctl(2) requires.
    cvt(unsafe {
        libc::prctl(
            option,
            arg,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
    .map(drop)
}

/// `PR_SET_PDEATHSIG`: receive `sig` when the parent thread dies.
pub fn set_parent_death_signal(sig: i32) -> SysResult<()> {
    let sig = libc::c_ulong::try_from(sig).map_err(|_| Errno(libc::EINVAL))?;
    prctl(libc::PR_SET_PDEATHSIG, sig)
}

/// `PR_SET_PDEATHSIG SIGKILL`: die, without a chance to linger, when the
/// parent thread dies (`corral run --die-with-parent`).
pub fn kill_with_parent() -> SysResult<()> {
    set_parent_death_signal(libc::SIGKILL)
}

/// `PR_SET_DUMPABLE 0`: no core dumps, and `/proc/PID/{mem,environ,...}`
/// and ptrace are closed to processes without `CAP_SYS_PTRACE`.
pub fn set_non_dumpable() -> SysResult<()> {
    prctl(libc::PR_SET_DUMPABLE, 0)
}

/// `PR_SET_DUMPABLE 1`. Changing uid from root makes a process
/// non-dumpable, which also makes its `/proc/self/uid_map` root-owned and
/// unwritable; the helper restores the flag to write its own maps.
pub fn set_dumpable() -> SysResult<()> {
    prctl(libc::PR_SET_DUMPABLE, 1)
}

/// `PR_SET_NO_NEW_PRIVS`: execve can never grant privileges again (setuid
/// bits and file capabilities are ignored).
pub fn set_no_new_privs() -> SysResult<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    cvt(unsafe {
        libc::prctl(
            libc::PR_SET_NO_NEW_PRIVS,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
    .map(drop)
}

/// Empties the capability bounding set, so no exec can ever regain a
/// capability. Needs CAP_SETPCAP (root, or any process inside its own user
/// namespace). Returns whether the set is empty afterwards.
pub fn drop_bounding_set() -> SysResult<bool> {
    let last = last_capability();
    let mut each_dropped = true;
    for cap in 0..=last {
        match prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            // EINVAL: the kernel does not know this cap; EPERM: no
            // CAP_SETPCAP (an unprivileged process without a user
            // namespace), checked below.
            Ok(()) => {}
            Err(e) if e.0 == libc::EINVAL || e.0 == libc::EPERM => each_dropped = false,
            Err(e) => return Err(e),
        }
    }
    // Every capability the kernel knows was dropped (and the set holds no
    // other): empty, without reading each one back. The program's process
    // runs this between its fork and `execve`.
    if each_dropped {
        return Ok(true);
    }
    // Read each one back. EINVAL: a number the kernel does not know, so
    // not held; any other refusal (an outer seccomp filter or LSM) proves
    // nothing, and is an error rather than an empty set.
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_READ takes integer arguments only.
        match cvt(unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) }) {
            Ok(1) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.0 == libc::EINVAL => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Drops every capability from every set: bounding (as far as
/// [`drop_bounding_set`] can), ambient, and effective/permitted/inheritable.
/// Returns whether the bounding set is empty.
pub fn drop_all_capabilities() -> SysResult<bool> {
    let bounding_empty = drop_bounding_set()?;
    drop_capability_sets()?;
    Ok(bounding_empty)
}

/// Drops every capability from the ambient, effective, permitted and
/// inheritable sets, leaving the bounding set as it is: for a process
/// whose bounding set was emptied before it existed (a bounding set is
/// inherited and can only shrink, capabilities(7)), where emptying it
/// again would cost one credential copy per capability for nothing.
pub fn drop_capability_sets() -> SysResult<()> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integer arguments only.
    cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data match the kernel's v3 capset layout
    // (capability.h: one header, two 32-bit data words) and live across the
    // call.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) })
        .map(drop)
}

/// The highest capability number this kernel knows
/// (`/proc/sys/kernel/cap_last_cap`), or 63 when it cannot be read.
/// Dropping unknown numbers is harmless (EINVAL is ignored). Read once per
/// process and kept: a process that asks before it forks (init, before
/// the program's fork) spares its children the file's five system calls.
pub fn last_capability() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

/// Sets a resource limit's soft and hard values.
pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> SysResult<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit that outlives the call.
    cvt(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// Raises the soft limit on open files to the hard one (a server's
/// connections are files); returns the soft limit now in force.
pub fn raise_open_files() -> SysResult<u64> {
    let (soft, hard) = get_rlimit(libc::RLIMIT_NOFILE)?;
    if soft < hard {
        set_rlimit(libc::RLIMIT_NOFILE, hard, hard)?;
        return Ok(hard);
    }
    Ok(soft)
}

/// Resource usage of a reaped child and all its reaped descendants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User plus system CPU time, in microseconds.
    pub cpu_us: u64,
    /// Largest resident set of any process in the tree, in bytes.
    pub max_rss_bytes: u64,
}

/// `wait4(2)`: waits for `pid` and returns how it ended with its resource
/// usage (which includes every descendant it reaped in turn).
pub fn wait4(pid: i32) -> SysResult<(WaitStatus, Usage)> {
    loop {
        if let Some((_, ws, usage)) = wait_with_usage(pid, false)? {
            return Ok((ws, usage));
        }
    }
}

impl Usage {
    fn of(ru: &libc::rusage) -> Usage {
        // The kernel reports no negative times or sizes; were one ever
        // negative, it counts as 0.
        fn count(v: impl TryInto<u64>) -> u64 {
            v.try_into().unwrap_or(0)
        }
        let tv = |t: libc::timeval| count(t.tv_sec) * 1_000_000 + count(t.tv_usec);
        Usage {
            cpu_us: tv(ru.ru_utime) + tv(ru.ru_stime),
            max_rss_bytes: count(ru.ru_maxrss) * 1024,
        }
    }

    /// Usage of two trees together: CPU adds up, the peak is the larger.
    pub fn with(self, other: Usage) -> Usage {
        Usage {
            cpu_us: self.cpu_us.saturating_add(other.cpu_us),
            max_rss_bytes: self.max_rss_bytes.max(other.max_rss_bytes),
        }
    }
}

/// What another process with this process's real or effective uid may
/// change about it without any privilege (setpriority(2),
/// sched_setaffinity(2), sched_setscheduler(2), ioprio_set(2)), and what
/// its children inherit: the nice value, the scheduling policy and
/// priority, the CPU affinity, the I/O priority. A process that acts as
/// another uid for a moment compares a snapshot from before with one
/// from after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduling {
    nice: i32,
    policy: i32,
    priority: i32,
    affinity: Vec<u8>,
    io_priority: i64,
}

/// This process's [`Scheduling`] now.
pub fn scheduling() -> SysResult<Scheduling> {
    // getpriority returns the nice value, and -1 both as a value and as an
    // error: errno is cleared first and checked after.
    // SAFETY: __errno_location returns this thread's errno, writable.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: integer arguments only.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if nice == -1 && Errno::last().0 != 0 {
        return Err(Errno::last());
    }
    // SAFETY: integer argument only.
    let policy = cvt(unsafe { libc::sched_getscheduler(0) })?;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a live, writable sched_param.
    cvt(unsafe { libc::sched_getparam(0, &mut param) })?;
    // SAFETY: cpu_set_t is plain data; all-zero is a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is live and writable, and its size is passed.
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) })?;
    // SAFETY: cpu_set_t is plain data; viewing it as bytes reads only it.
    let affinity = unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(&set).cast::<u8>(),
            std::mem::size_of_val(&set),
        )
    }
    .to_vec();
    // ioprio_get(IOPRIO_WHO_PROCESS = 1, 0): this process.
    // SAFETY: integer arguments only.
    let io_priority = cvt(unsafe { libc::syscall(libc::SYS_ioprio_get, 1, 0) })?;
    Ok(Scheduling {
        nice,
        policy,
        priority: param.sched_priority,
        affinity,
        io_priority,
    })
}

/// Reads a resource limit as (soft, hard).
pub fn get_rlimit(resource: libc::__rlimit_resource_t) -> SysResult<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call.
    cvt(unsafe { libc::getrlimit(resource, &mut lim) })?;
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// `setpgid(0, 0)`: a process group of its own.
pub fn setpgid_self() -> SysResult<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::setpgid(0, 0) }).map(drop)
}

/// `PR_SET_CHILD_SUBREAPER`: orphaned descendants are re-parented to this
/// process instead of the host's init, so it can find and kill them.
pub fn set_child_subreaper() -> SysResult<()> {
    prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
}

/// Overwrites this process's argv and environment string areas (what
/// `/proc/PID/cmdline` and `/proc/PID/environ` show): argv becomes
/// `argv0_replacement` followed by NULs, the environment all NULs. Used by
/// a helper forked from corral, whose copies of corral's arguments and
/// environment would otherwise show through PID 1's `/proc` entries.
///
/// The bounds come from the kernel (`/proc/self/stat` fields 48-51).
pub fn wipe_args_and_env(argv0_replacement: &[u8]) -> std::io::Result<()> {
    let mut buf = [0u8; STAT_LINE_MAX];
    let stat = read_own_stat_line(&mut buf)?;
    // arg_start is field 48 ... env_end field 51.
    let field = |n: usize| -> usize {
        stat_field(stat, n)
            .and_then(|f| f.parse().ok())
            .unwrap_or(0)
    };
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "unexpected argv/env bounds in /proc/self/stat",
        )
    };
    for (start, end, prefix) in [
        (field(48), field(49), argv0_replacement),
        (field(50), field(51), &b""[..]),
    ] {
        if start == 0 || end < start || end - start > (64 << 20) {
            return Err(bad());
        }
        // An empty environment (a process started with none) has nothing
        // to wipe.
        if end == start {
            continue;
        }
        let len = end - start;
        let ptr = start as *mut u8;
        // SAFETY: [start, end) is this process's argv (or environment)
        // string area as the kernel reports it: mapped, writable (the
        // initial stack), and owned by no Rust object. The process is a
        // single-threaded fork, and no one reads these strings after this
        // (std's cached argv/environ then see empty strings).
        unsafe {
            std::ptr::write_bytes(ptr, 0, len);
            std::ptr::copy_nonoverlapping(
                prefix.as_ptr(),
                ptr,
                prefix.len().min(len.saturating_sub(1)),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Refused drops whose read-back is refused too (an outer seccomp
    /// filter here) prove nothing: an error, never "empty".
    #[test]
    fn a_bounding_set_that_cannot_be_read_back_is_an_error() {
        // Read now: the child shares this memory and must not allocate.
        last_capability();
        let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
        let k = |v: i64| u32::try_from(v).unwrap();
        // prctl(PR_CAPBSET_DROP | PR_CAPBSET_READ, ...) -> EPERM; anything
        // else is allowed (seccomp_data: nr at 0, args[0] at 16).
        let filter = [
            op(0x20, 0, 0, 0),
            op(0x15, 0, 4, k(libc::SYS_prctl)),
            op(0x20, 0, 0, 16),
            op(0x15, 1, 0, k(libc::PR_CAPBSET_DROP.into())),
            op(0x15, 0, 1, k(libc::PR_CAPBSET_READ.into())),
            op(0x06, 0, 0, 0x0005_0000 | k(libc::EPERM.into())),
            op(0x06, 0, 0, 0x7fff_0000),
        ];
        let prog = libc::sock_fprog {
            len: u16::try_from(filter.len()).unwrap(),
            filter: filter.as_ptr().cast_mut(),
        };
        let pid = spawn_sharing_memory(|| {
            if set_no_new_privs().is_err() {
                exit_now(10);
            }
            // SAFETY: `prog` points at `filter`, both alive across the call.
            let installed = unsafe {
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                    &prog as *const libc::sock_fprog,
                )
            };
            if installed != 0 {
                exit_now(11);
            }
            match drop_bounding_set() {
                Err(Errno(libc::EPERM)) => exit_now(0),
                Err(_) => exit_now(12),
                Ok(true) => exit_now(13),
                Ok(false) => exit_now(14),
            }
        })
        .unwrap();
        assert_eq!(wait4(pid).unwrap().0, WaitStatus::Exited(0));
    }

    #[test]
    fn a_child_sharing_memory_has_run_when_its_spawn_returns() {
        let mut written = 0u32;
        let pid = spawn_sharing_memory(|| {
            written = 7;
            exit_now(3)
        })
        .unwrap();
        // Shared memory, and the parent resumed only after the child's
        // exit: the write is there without any wait.
        assert_eq!(written, 7);
        assert_eq!(wait4(pid).unwrap().0, WaitStatus::Exited(3));
    }

    #[test]
    fn a_child_sharing_memory_can_exec() {
        let exec = crate::exec::ExecArgs::new(
            "/bin/sh",
            &["sh".into(), "-c".into(), "exit 4".into()],
            &[],
        )
        .unwrap();
        let pid = spawn_sharing_memory(|| {
            let err = exec.exec();
            exit_now(100 + err.0)
        })
        .unwrap();
        assert_eq!(wait4(pid).unwrap().0, WaitStatus::Exited(4));
    }

    #[test]
    fn a_child_sharing_memory_that_panics_ends_alone_with_125() {
        let pid = spawn_sharing_memory(|| panic!("in the child")).unwrap();
        assert_eq!(wait4(pid).unwrap().0, WaitStatus::Exited(125));
    }

    #[test]
    fn sharing_memory_is_refused_with_other_threads_and_the_child_is_dropped_unrun() {
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || wait.recv());
        let dropped = std::rc::Rc::new(std::cell::Cell::new(false));
        struct Flag(std::rc::Rc<std::cell::Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let flag = Flag(std::rc::Rc::clone(&dropped));
        let res = spawn_sharing_memory_in_single_threaded_process(move || {
            let _flag = flag;
            exit_now(0)
        });
        assert_eq!(res.unwrap_err(), Errno(libc::EDEADLK));
        assert!(dropped.get(), "the closure is dropped");
        stop.send(()).unwrap();
        other.join().unwrap().unwrap();
    }

    #[test]
    fn stat_fields_are_counted_past_a_command_name_with_spaces_and_parentheses() {
        let line = b"4242 (a) b (c) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 77\n";
        assert_eq!(stat_field(line, 3), Some("S"));
        assert_eq!(stat_field(line, 20), Some("3"));
        assert_eq!(stat_field(line, 23), None);
        assert_eq!(stat_field(line, 2), None);
        assert_eq!(stat_field(b"4242 (x) S 1", 20), None);
        assert_eq!(stat_field(b"", 3), None);
        // This process's own line parses (other tests come and go with
        // their threads, so only that there is at least this one).
        let own = std::fs::read("/proc/self/stat").unwrap();
        let threads: u64 = stat_field(&own, 20).unwrap().parse().unwrap();
        assert!(threads >= 1);
    }
}

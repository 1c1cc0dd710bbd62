//! File descriptors: the helper's control socket, closing inherited fds,
//! polling, and placing an fd at a fixed number in a spawned child.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::{cvt, cvt_len, Errno, SysResult};

/// The fd number at which the sandbox helper finds its control socket.
pub const HELPER_CONTROL_FD: RawFd = 3;

/// A connected `AF_UNIX`/`SOCK_SEQPACKET` pair (message boundaries kept,
/// close-on-exec): the parent talks to the helper over it.
pub fn seqpacket_pair() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds socketpair writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two new fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets a socket's send buffer (`SO_SNDBUF`, socket(7): the kernel doubles
/// the value and keeps a minimum). On an `AF_UNIX` datagram or seqpacket
/// socket it bounds the largest message that can be sent at all: tests
/// use it to stand for a host with small socket buffers.
pub fn set_send_buffer(sock: RawFd, bytes: libc::c_int) -> SysResult<()> {
    set_int_option(sock, libc::SO_SNDBUF, bytes)
}

/// `setsockopt(sock, SOL_SOCKET, option, &value)` for an `int` option.
fn set_int_option(sock: RawFd, option: libc::c_int, value: libc::c_int) -> SysResult<()> {
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: the option value points at a c_int alive for the call, and
    // its length is passed with it.
    cvt(unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(&value).cast(),
            len,
        )
    })
    .map(drop)
}

/// Sets or clears `SO_PASSCRED` on a unix socket (unix(7)): while set,
/// each message received on it comes with its sender's credentials
/// (`SCM_CREDENTIALS`), which the kernel fills in
/// and translates into the receiver's pid namespace; see
/// [`recv_with_sender_pid`].
pub fn set_pass_credentials(sock: RawFd, on: bool) -> SysResult<()> {
    set_int_option(sock, libc::SO_PASSCRED, on.into())
}

/// Receives one message on a unix socket that has [`set_pass_credentials`]
/// on, with the pid of the process that sent it as this process's pid
/// namespace names it: the kernel records the sender at `sendmsg` and
/// translates the pid at `recvmsg`, so a process in a pid namespace below
/// this one is named by its pid here, whatever it believes its own pid is
/// (unix(7), `SCM_CREDENTIALS`). `None` when no credentials came (the
/// option was off) or the sender has no pid here. A message cut short, or
/// one that brought descriptors (closed at once), is refused (`EMSGSIZE`,
/// `EBADMSG`).
pub fn recv_with_sender_pid(sock: RawFd, buf: &mut [u8]) -> SysResult<(usize, Option<i32>)> {
    let got = recv_message(sock, buf)?;
    if got.truncated {
        return Err(Errno(libc::EMSGSIZE));
    }
    if !got.fds.is_empty() {
        return Err(Errno(libc::EBADMSG));
    }
    Ok((got.len, got.sender))
}

/// Closes every fd from `first` upwards (`close_range(2)`).
pub fn close_from(first: u32) -> SysResult<()> {
    // SAFETY: close_range takes integers; closing fds we do not own is the
    // point (they were inherited and must not reach the sandbox).
    cvt(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) }).map(drop)
}

/// Closes every fd from `first` upwards except those in `keep`
/// (`close_range(2)` over each gap between them).
pub fn close_from_except(first: u32, keep: &[RawFd]) -> SysResult<()> {
    let mut kept: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .filter(|&fd| fd >= first)
        .collect();
    kept.sort_unstable();
    kept.dedup();
    let mut from = first;
    for fd in kept {
        if fd > from {
            // SAFETY: close_range takes integers; see `close_from`.
            cvt(unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32) })?;
        }
        from = fd + 1;
    }
    close_from(from)
}

/// Closes one raw fd, ignoring errors (used on inherited stdio).
pub fn close_raw(fd: RawFd) {
    // SAFETY: closing an fd number; the caller no longer uses it.
    unsafe { libc::close(fd) };
}

/// Sets or clears `FD_CLOEXEC`.
pub fn set_cloexec(fd: RawFd, on: bool) -> SysResult<()> {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: fcntl F_SETFD takes an integer.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flag) }).map(drop)
}

/// Sets `O_NONBLOCK`.
pub fn set_nonblocking(fd: RawFd) -> SysResult<()> {
    // SAFETY: F_GETFL/F_SETFL take integers.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(drop)
}

/// One fd to watch with [`poll`].
#[derive(Debug, Clone, Copy)]
pub struct PollFd {
    /// The fd.
    pub fd: RawFd,
    /// Wait until it is writable instead of readable.
    pub write: bool,
    /// Set by [`poll`] when the fd is ready, hung up or in error.
    pub ready: bool,
}

impl PollFd {
    /// Watch `fd` for reading.
    pub fn read(fd: RawFd) -> Self {
        PollFd {
            fd,
            write: false,
            ready: false,
        }
    }

    /// Watch `fd` for writing.
    pub fn write(fd: RawFd) -> Self {
        PollFd {
            fd,
            write: true,
            ready: false,
        }
    }
}

/// Waits up to `timeout_ms` (-1: forever) until one of `fds` is ready
/// (readable or writable as asked) or hung up. Returns how many are ready (0 on timeout).
pub fn poll(fds: &mut [PollFd], timeout_ms: i32) -> SysResult<usize> {
    let mut raw: Vec<libc::pollfd> = fds
        .iter()
        .map(|p| libc::pollfd {
            fd: p.fd,
            events: if p.write { libc::POLLOUT } else { libc::POLLIN },
            revents: 0,
        })
        .collect();
    // SAFETY: `raw` is a valid array of `raw.len()` pollfd structs.
    let n = unsafe { libc::poll(raw.as_mut_ptr(), raw.len() as libc::nfds_t, timeout_ms) };
    let Ok(n) = usize::try_from(n) else {
        let e = Errno::last();
        if e.0 == libc::EINTR {
            return Ok(0);
        }
        return Err(e);
    };
    for (p, r) in fds.iter_mut().zip(&raw) {
        p.ready = r.revents != 0;
    }
    Ok(n)
}

/// Takes the control socket a re-executed helper finds as its stdin and
/// puts it at `target` (close-on-exec), with `/dev/null` on 0 instead.
/// corral starts its helpers with `posix_spawn`, which places nothing but
/// stdio: no code of corral's runs between fork and exec, and the
/// multi-threaded parent's address space is never copied. Fails, touching
/// nothing, when stdin is not a `SOCK_SEQPACKET` socket (the helper was
/// started by hand).
pub fn take_control_from_stdin(target: RawFd) -> SysResult<OwnedFd> {
    let mut kind: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: getsockopt writes at most `len` bytes into `kind`, which
    // lives across the call.
    cvt(unsafe {
        libc::getsockopt(
            0,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            std::ptr::addr_of_mut!(kind).cast(),
            &mut len,
        )
    })?;
    if kind != libc::SOCK_SEQPACKET {
        return Err(Errno(libc::ENOTSOCK));
    }
    // SAFETY: dup3 on integers: `target` is the control socket's number,
    // which this freshly started helper owns (whatever was there is
    // closed by dup3).
    cvt(unsafe { libc::dup3(0, target, libc::O_CLOEXEC) })?;
    stdio_to_devnull();
    // SAFETY: dup3 made `target` a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(target) })
}

/// Takes ownership of an fd inherited at a fixed number (the helper's
/// control socket), after checking it is open, and marks it close-on-exec
/// so the sandboxed program never inherits it.
pub fn take_inherited(fd: RawFd) -> SysResult<OwnedFd> {
    // SAFETY: F_GETFD only queries the fd table.
    cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    set_cloexec(fd, true)?;
    // SAFETY: the fd is open (checked above), was placed here by our parent
    // for us alone, and nothing else in this process wraps it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    pipe2(0)
}

/// A close-on-exec pipe whose both ends are non-blocking.
pub fn nonblocking_pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    pipe2(libc::O_NONBLOCK)
}

/// `pipe2(2)` with close-on-exec and `flags`.
fn pipe2(flags: libc::c_int) -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) })?;
    // SAFETY: pipe2 returned two new fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether the write side of a pipe is gone (every writer closed), checked
/// without blocking.
pub fn pipe_writer_gone(read_end: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd: read_end,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLHUP != 0
}

/// Redirects stdin, stdout and stderr to `/dev/null` so a supervisor
/// process keeps no copy of the program's pipes (the parent sees EOF as
/// soon as the program's tree is gone).
pub fn stdio_to_devnull() {
    // SAFETY: open with a static NUL-terminated path.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    for fd in 0..3 {
        if null >= 0 {
            // SAFETY: dup2 onto the stdio numbers, which we own.
            unsafe { libc::dup2(null, fd) };
        } else {
            close_raw(fd);
        }
    }
    if null > 2 {
        close_raw(null);
    }
}

/// Places `fd` at number `target` without close-on-exec (`dup2`, or
/// clearing the flag when it is already there). For a forked child.
pub fn place(fd: &OwnedFd, target: RawFd) -> SysResult<()> {
    let src = fd.as_raw_fd();
    if src == target {
        return set_cloexec(target, false);
    }
    // SAFETY: dup2 on integers; `target` is one of the stdio/control
    // numbers this child owns.
    cvt(unsafe { libc::dup2(src, target) }).map(drop)
}

/// Most descriptors passed in one control message (the control buffers
/// of [`send_with_fds`] and [`recv_with_fds`] hold 64 bytes: one header
/// and up to 12 descriptors).
pub const MAX_PASSED_FDS: usize = 8;

/// Sends `data` as one message on a unix socket with `fds` attached
/// (`SCM_RIGHTS`, unix(7)). The receiver gets its own copies.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> SysResult<()> {
    if fds.len() > MAX_PASSED_FDS {
        return Err(Errno(libc::EINVAL));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for MAX_PASSED_FDS ints, aligned for cmsghdr.
    let mut space = [0u64; 8];
    // At most MAX_PASSED_FDS descriptors (checked above), so a few bytes.
    let fds_bytes = u32::try_from(std::mem::size_of_val(fds)).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let cmsg_len = unsafe { libc::CMSG_SPACE(fds_bytes) } as usize;
    // SAFETY: msghdr is plain data; all-zero is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_len;
        // SAFETY: msg_control points at `space`, which is large enough for
        // one header plus MAX_PASSED_FDS descriptors (64 bytes), so the
        // first header and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fds_bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` and everything it points to live across the call.
    cvt(unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) }).map(drop)
}

/// Receives one message into `buf`, with any descriptors attached (made
/// close-on-exec). Returns the byte count (0: peer closed) and the fds.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> SysResult<(usize, Vec<OwnedFd>)> {
    let got = recv_message(sock, buf)?;
    // A message larger than `buf`, or with more descriptors than the
    // control buffer holds, arrives cut short: refuse it rather than act
    // on a part (the descriptors that did arrive are closed on drop).
    if got.truncated {
        return Err(Errno(libc::EMSGSIZE));
    }
    Ok((got.len, got.fds))
}

/// One message as [`recv_message`] received it.
struct Received {
    /// Its length in bytes (0: the peer closed).
    len: usize,
    /// The descriptors attached (`SCM_RIGHTS`), made close-on-exec.
    fds: Vec<OwnedFd>,
    /// The sender's pid here, when credentials came (`SCM_CREDENTIALS`).
    sender: Option<i32>,
    /// Cut short: the message or its control data did not fit.
    truncated: bool,
}

/// Receives one message into `buf` with what came with it; the callers
/// decide what they accept.
fn recv_message(sock: RawFd, buf: &mut [u8]) -> SysResult<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // One header with up to 12 descriptors, or credentials and fewer.
    let mut space = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space);
    // SAFETY: `msg` points at `iov`/`buf` and `space`, all alive and
    // writable for the call.
    let len = cvt_len(unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) })?;
    let mut got = Received {
        len,
        fds: Vec::new(),
        sender: None,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    };
    // SAFETY: the kernel filled msg_control with well-formed headers within
    // msg_controllen; CMSG_FIRSTHDR/NXTHDR stay inside it, and each header's
    // data is as long as its `cmsg_len` says (checked against the type's
    // size before reading).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let data_len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
            if (*cmsg).cmsg_level == libc::SOL_SOCKET {
                if (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    for i in 0..data_len / std::mem::size_of::<RawFd>() {
                        // Each received fd is new and owned by us alone.
                        got.fds
                            .push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                } else if (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
                    && data_len >= std::mem::size_of::<libc::ucred>()
                {
                    let cred: libc::ucred =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::ucred>());
                    got.sender = (cred.pid > 0).then_some(cred.pid);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(got)
}

/// The seals of a sealed memfd: neither its size nor its contents can
/// change any more, and no seal can be removed.
const FULL_SEALS: i32 =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// A memfd holding `data`, sealed against any change (`memfd_create(2)`,
/// `F_ADD_SEALS` in `fcntl(2)`): a message too large for one socket
/// datagram is passed as such an fd, and the receiver can trust that what
/// it reads is what was written, whole.
pub fn sealed_memfd(name: &std::ffi::CStr, data: &[u8]) -> SysResult<OwnedFd> {
    // SAFETY: `name` is a valid C string; memfd_create returns a new fd.
    let raw = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: memfd_create returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut done = 0;
    while done < data.len() {
        let rest = &data[done..];
        // SAFETY: `rest` is a live slice of `rest.len()` readable bytes.
        match cvt_len(unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) }) {
            Ok(n) => done += n,
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    // SAFETY: F_ADD_SEALS takes an integer bit set.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, FULL_SEALS) })?;
    Ok(fd)
}

/// Reads the whole of a memfd made by [`sealed_memfd`]: refused with
/// `EPERM` unless every seal is set (a writer could still change it) and
/// with `EMSGSIZE` if it holds more than `max` bytes.
pub fn read_sealed_memfd(fd: &OwnedFd, max: usize) -> SysResult<Vec<u8>> {
    // SAFETY: F_GET_SEALS takes no argument and returns an integer.
    let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & FULL_SEALS != FULL_SEALS {
        return Err(Errno(libc::EPERM));
    }
    // SAFETY: `st` is plain data the kernel fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable for the call.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    let size = usize::try_from(st.st_size).map_err(|_| Errno(libc::EMSGSIZE))?;
    if size > max {
        return Err(Errno(libc::EMSGSIZE));
    }
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let rest = &mut buf[done..];
        let offset = libc::off_t::try_from(done).map_err(|_| Errno(libc::EMSGSIZE))?;
        // SAFETY: `rest` is a live, writable slice of `rest.len()` bytes.
        match cvt_len(unsafe {
            libc::pread(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len(), offset)
        }) {
            Ok(0) => return Err(Errno(libc::EIO)),
            Ok(n) => done += n,
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn a_message_larger_than_the_buffer_is_refused_not_cut() {
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(a.as_raw_fd(), &[7u8; 100], &[]).unwrap();
        let mut buf = [0u8; 10];
        assert_eq!(
            recv_with_fds(b.as_raw_fd(), &mut buf).map(|(n, _)| n),
            Err(Errno(libc::EMSGSIZE))
        );
    }

    #[test]
    fn a_sealed_memfd_carries_megabytes_whole_and_cannot_change() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let fd = sealed_memfd(c"corral-test", &data).unwrap();
        assert_eq!(read_sealed_memfd(&fd, data.len()).unwrap(), data);
        assert_eq!(
            read_sealed_memfd(&fd, data.len() - 1),
            Err(Errno(libc::EMSGSIZE))
        );
        // The seals hold: no write, no growth.
        let mut f = std::fs::File::from(fd.try_clone().unwrap());
        assert!(f.write_all(b"x").is_err());
        // Passed over a socket, as the launcher does, it arrives whole.
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(a.as_raw_fd(), b"plan", &[fd.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, mut fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"plan");
        let got = fds.pop().unwrap();
        assert_eq!(read_sealed_memfd(&got, 4 << 20).unwrap(), data);
    }

    #[test]
    fn an_unsealed_memfd_is_refused() {
        // SAFETY: a valid C string; the new fd is owned below.
        let raw = unsafe { libc::memfd_create(c"corral-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: memfd_create returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        assert_eq!(read_sealed_memfd(&fd, 16), Err(Errno(libc::EPERM)));
    }

    #[test]
    fn a_pidfd_signals_its_process_only() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).expect("a pid fits in pid_t");
        let fd = crate::process::pidfd_open(pid).unwrap();
        crate::process::pidfd_send_signal(&fd, libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd now names a process that is gone, whoever gets
        // its number next.
        assert_eq!(
            crate::process::pidfd_send_signal(&fd, libc::SIGKILL),
            Err(Errno(libc::ESRCH))
        );
    }

    #[test]
    fn a_message_names_its_sender_only_while_credentials_are_asked_for() {
        let (ours, theirs) = seqpacket_pair().unwrap();
        set_pass_credentials(ours.as_raw_fd(), true).unwrap();
        // Another process sends (its stdin is the socket): the pid that
        // comes is that process's, not this one's.
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import socket; s = socket.socket(fileno=0); s.send(b'one'); s.send(b'two')",
            ])
            .stdin(std::process::Stdio::from(theirs))
            .spawn()
            .unwrap();
        let mut buf = [0u8; 8];
        let (n, sender) = recv_with_sender_pid(ours.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"one");
        assert_eq!(sender, i32::try_from(child.id()).ok());
        assert_ne!(sender, i32::try_from(std::process::id()).ok());
        // Off again: no credentials on the next message.
        set_pass_credentials(ours.as_raw_fd(), false).unwrap();
        let (n, sender) = recv_with_sender_pid(ours.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], sender), (&b"two"[..], None));
        assert!(child.wait().unwrap().success());
        // Descriptors are not taken this way.
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(a.as_raw_fd(), b"x", &[a.as_raw_fd()]).unwrap();
        assert_eq!(
            recv_with_sender_pid(b.as_raw_fd(), &mut buf),
            Err(Errno(libc::EBADMSG))
        );
    }

    #[test]
    fn descriptors_cross_a_seqpacket_socket() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = pipe().unwrap();
        send_with_fds(a.as_raw_fd(), b"hello", &[w.as_raw_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        // The received copy writes into the same pipe.
        std::fs::File::from(fds.into_iter().next().unwrap())
            .write_all(b"x")
            .unwrap();
        let mut got = [0u8; 1];
        std::fs::File::from(r).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
        assert!(send_with_fds(a.as_raw_fd(), b"", &[0; MAX_PASSED_FDS + 1]).is_err());
    }
}

/// How [`flock`] locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlockMode {
    /// `LOCK_SH | LOCK_NB`: shared, or `EWOULDBLOCK` at once when someone
    /// holds an exclusive lock. (No waiting variant: whoever can open a
    /// file can hold its exclusive lock forever.)
    SharedNow,
    /// `LOCK_EX | LOCK_NB`: exclusive, or `EWOULDBLOCK` at once when
    /// anyone else holds a lock.
    ExclusiveNow,
}

/// `flock(2)` on `fd` (an advisory lock on the open file, released when
/// the last fd of that open file description is closed).
pub fn flock(fd: std::os::fd::BorrowedFd<'_>, mode: FlockMode) -> SysResult<()> {
    let op = match mode {
        FlockMode::SharedNow => libc::LOCK_SH | libc::LOCK_NB,
        FlockMode::ExclusiveNow => libc::LOCK_EX | libc::LOCK_NB,
    };
    // SAFETY: flock takes an fd, valid for the call, and an integer.
    cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// `fsetxattr(2)`: sets the extended attribute `name` of the file open at
/// `fd` (not an `O_PATH` fd) to `value`.
pub fn set_xattr(
    fd: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    value: &[u8],
) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated; `value` is valid for `value.len()`
    // bytes; both outlive the call, as does the fd.
    cvt(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// `fgetxattr(2)`: the value of the extended attribute `name` of the file
/// open at `fd`, at most `max` bytes (`ERANGE` if longer, `ENODATA` if
/// unset).
pub fn get_xattr(
    fd: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    max: usize,
) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; max];
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `buf.len()`
    // bytes; both outlive the call, as does the fd.
    let n = cvt_len(unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

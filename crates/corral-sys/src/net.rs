//! Network interface set-up inside a fresh network namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{cvt, Errno, SysResult};

/// Brings the loopback interface `lo` up, the only interface of a new
/// network namespace.
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: socket takes integer arguments only.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket returned a new fd that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: `req` is a valid ifreq naming "lo"; SIOCGIFFLAGS fills its
    // flags field.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    let up = libc::c_short::try_from(libc::IFF_UP).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: the union field written by SIOCGIFFLAGS is ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= up };
    // SAFETY: `req` is a valid ifreq with the new flags.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })?;
    Ok(())
}

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

/// Makes the C library's host-name lookups (`getaddrinfo`) consult only
/// `sources`, a `hosts:` line of nsswitch.conf(5) such as `files dns`,
/// instead of the line in `/etc/nsswitch.conf`. Fails with `EINVAL` if
/// the C library refuses the line. Where the C library is not glibc there
/// is no name-service switch, and nothing it could load: `Ok`.
///
/// Why: corral is a static glibc binary (`.cargo/config.toml`). glibc
/// builds its `files` and `dns` sources in, but loads any other source
/// named in nsswitch.conf (`mdns4_minimal`, `resolve`, `myhostname`, …)
/// with `dlopen`, which in a static program maps a second, shared C
/// library into the process. With the sources fixed here it never does;
/// glibc then also stops re-reading nsswitch.conf for this database.
///
/// Call it before the process's first host lookup, which it must not
/// race: glibc documents no locking for it.
pub fn use_host_sources(sources: &std::ffi::CStr) -> SysResult<()> {
    #[cfg(target_env = "gnu")]
    {
        unsafe extern "C" {
            /// glibc's `<nss.h>`: "Change the service used for the
            /// database DBNAME to SERVICE_LINE."
            fn __nss_configure_lookup(
                dbname: *const libc::c_char,
                service_line: *const libc::c_char,
            ) -> libc::c_int;
        }
        // SAFETY: both arguments are NUL-terminated strings that outlive
        // the call; glibc copies what it keeps.
        let rc = unsafe { __nss_configure_lookup(c"hosts".as_ptr(), sources.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Errno(libc::EINVAL))
        }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = sources;
        Ok(())
    }
}

//! Moving socket bytes through a pipe with `splice(2)`, so the egress proxy
//! relays a connection without copying its payload through user space.
//!
//! `splice` needs a pipe on one side, so a relay direction owns one
//! [`SplicePipe`]: it fills the pipe from the source socket, then drains the
//! pipe into the destination socket. On TCP the kernel moves page
//! references rather than bytes (`tcp_splice_read`, then `MSG_SPLICE_PAGES`
//! on the sending side). See splice(2) and pipe(7).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::{cvt_len, SysResult};

/// A non-blocking, close-on-exec pipe used only as a splice buffer.
#[derive(Debug)]
pub struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl SplicePipe {
    /// A new pipe; asks for `capacity` bytes of pipe buffer (`F_SETPIPE_SZ`)
    /// and keeps the default (64 KiB) when the kernel refuses (a user over
    /// `pipe-user-pages-soft`, or a size above `pipe-max-size`): the size
    /// only changes how many bytes one round moves.
    pub fn new(capacity: usize) -> SysResult<SplicePipe> {
        let (read, write) = crate::fd::nonblocking_pipe()?;
        let size = libc::c_int::try_from(capacity).unwrap_or(libc::c_int::MAX);
        // SAFETY: F_SETPIPE_SZ takes an integer; failure leaves the pipe as
        // it was, which is fine (see above).
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        Ok(SplicePipe { read, write })
    }

    /// Moves up to `max` bytes from `src` into the pipe, without blocking.
    /// `Ok(0)` means `src` reached its end; `EAGAIN` means `src` has nothing
    /// now (or the pipe is full: callers drain before they fill again).
    pub fn fill_from(&self, src: BorrowedFd<'_>, max: usize) -> SysResult<usize> {
        splice(src, self.write.as_fd(), max)
    }

    /// Moves up to `max` bytes from the pipe into `dst`, without blocking.
    /// `EAGAIN` means `dst` cannot take more now.
    pub fn drain_into(&self, dst: BorrowedFd<'_>, max: usize) -> SysResult<usize> {
        splice(self.read.as_fd(), dst, max)
    }
}

/// Moves up to `max` bytes from the pipe `from` into the pipe `to` without
/// copying them and without blocking on either, whatever their `O_NONBLOCK`
/// flags (for two pipes `SPLICE_F_NONBLOCK` covers both ends). `Ok(0)`: `from`
/// is empty and has no writer left. `EAGAIN`: `from` is empty, or `to` is
/// full; a caller that knows `from` holds bytes (it polled readable and is
/// its only reader) knows `to` is full. `EPIPE`: `to` has no reader.
pub fn pipe_to_pipe(from: BorrowedFd<'_>, to: BorrowedFd<'_>, max: usize) -> SysResult<usize> {
    splice(from, to, max)
}

/// One non-blocking `splice` between two fds, one of them a pipe.
fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, max: usize) -> SysResult<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: both fds are borrowed for the call, the offsets are null (the
    // fds' own positions; sockets and pipes have none), and splice reads or
    // writes no memory of ours.
    cvt_len(unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            max,
            flags,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_to_pipe_never_blocks_on_a_full_blocking_pipe_and_reports_a_gone_reader() {
        let (src_r, src_w) = crate::fd::pipe().unwrap();
        // A blocking pipe, like the stdout corral inherits.
        let (dst_r, dst_w) = crate::fd::pipe().unwrap();
        let mut src_w = std::fs::File::from(src_w);
        let chunk = vec![7u8; 16 << 10];
        std::io::Write::write_all(&mut src_w, &chunk).unwrap();
        let mut moved = 0;
        loop {
            match pipe_to_pipe(src_r.as_fd(), dst_w.as_fd(), 1 << 20) {
                Ok(n) => {
                    assert!(n > 0);
                    moved += n;
                    std::io::Write::write_all(&mut src_w, &chunk).unwrap();
                }
                Err(e) => {
                    assert_eq!(e.0, libc::EAGAIN, "a full pipe is EAGAIN, not a block");
                    break;
                }
            }
        }
        assert!(moved >= 64 << 10, "filled the destination: {moved}");
        drop(dst_r);
        let e = pipe_to_pipe(src_r.as_fd(), dst_w.as_fd(), 1 << 20).unwrap_err();
        assert_eq!(e.0, libc::EPIPE);
        drop(src_w);
        let (src_r2, src_w2) = crate::fd::pipe().unwrap();
        drop(src_w2);
        let (_r, w) = crate::fd::pipe().unwrap();
        assert_eq!(pipe_to_pipe(src_r2.as_fd(), w.as_fd(), 4096).unwrap(), 0);
    }
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn moves_bytes_between_sockets_and_reports_end_of_stream() {
        let (mut writer, src) = UnixStream::pair().unwrap();
        let (dst, mut reader) = UnixStream::pair().unwrap();
        src.set_nonblocking(true).unwrap();
        let pipe = SplicePipe::new(1 << 20).unwrap();
        // Nothing sent yet: the source would block.
        assert_eq!(
            pipe.fill_from(src.as_fd(), 4096).unwrap_err().0,
            libc::EAGAIN
        );
        writer.write_all(b"hello, splice").unwrap();
        let n = pipe.fill_from(src.as_fd(), 4096).unwrap();
        assert_eq!(n, 13);
        assert_eq!(pipe.drain_into(dst.as_fd(), n).unwrap(), 13);
        let mut got = [0u8; 13];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello, splice");
        drop(writer);
        assert_eq!(pipe.fill_from(src.as_fd(), 4096).unwrap(), 0);
    }
}

//! The process entry of corral's binary, without the Rust runtime's start.
//!
//! `fn main` in Rust is called by the standard library's `lang_start`,
//! which first runs the runtime's start: it checks fds 0-2, ignores
//! SIGPIPE, and installs the stack-overflow handler, which asks glibc for
//! the main thread's stack (`pthread_getattr_np`: `/proc/self/maps` opened,
//! read and parsed, `sched_getaffinity`) and maps an alternate signal
//! stack with a guard page (`mmap`, `mprotect`, `sigaltstack`, two
//! `sigaction`s), undone at exit. Fifteen system calls and their page
//! faults at every start of corral, about 0.06 ms of CPU on the project's
//! VM (docs/PERFORMANCE.md, issue 17), paid by every `corral run`.
//!
//! [`entry!`] defines the C `main` instead (the binary is `#![no_main]`)
//! and does what corral needs of that start itself ([`start`]): fds 0-2
//! open (so no file corral opens lands on them), SIGPIPE ignored (`run`,
//! `serve`, `mcp` and `deploy` rely on `EPIPE`). What it gives up: a stack
//! overflow ends the process with `SIGSEGV` instead of a message first.
//! Arguments and the environment are unchanged (`std::env` gets them from
//! glibc at load time), and `std::process::exit` still flushes stdout.

/// Defines the process's C `main` to call [`start`] and then `$body`, a
/// `fn() -> !`, for a binary crate with `#![no_main]`.
#[macro_export]
macro_rules! entry {
    ($body:path) => {
        // SAFETY: the C runtime (`__libc_start_main`) calls `main` once, on
        // the main thread, with the program's arguments, which are not
        // read here; the crate is `#![no_main]`, so nothing else defines
        // the symbol.
        #[unsafe(no_mangle)]
        extern "C" fn main(
            _argc: ::core::ffi::c_int,
            _argv: *const *const ::core::ffi::c_char,
        ) -> ::core::ffi::c_int {
            $crate::entry::start();
            $body()
        }
    };
}

/// What corral keeps of the Rust runtime's start: each of fds 0, 1 and 2
/// that is closed is opened on `/dev/null` (else the first file corral
/// opens would become its stdout, say), and SIGPIPE is ignored. Exits with
/// status 125 when a closed one cannot be opened.
pub fn start() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    let closed: [bool; 3] = loop {
        // SAFETY: three valid pollfds, zero timeout.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } >= 0 {
            break fds.map(|p| p.revents & libc::POLLNVAL != 0);
        }
        match crate::Errno::last().0 {
            libc::EINTR => continue,
            // poll refused (RLIMIT_NOFILE below 3, no memory): ask each
            // fd, as the Rust runtime does then.
            libc::EINVAL | libc::EAGAIN | libc::ENOMEM => break [0, 1, 2].map(fd_is_closed),
            _ => crate::process::exit_now(125),
        }
    };
    for (fd, closed) in (0..3).zip(closed) {
        if closed {
            // SAFETY: a static NUL-terminated path; the lowest free number
            // is the closed one (the lower ones are open, or were opened
            // here just before).
            let opened = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if opened != fd {
                crate::process::exit_now(125);
            }
        }
    }
    // SAFETY: installing SIG_IGN for SIGPIPE touches no memory of ours.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Whether `fd` is closed (`fcntl(F_GETFD)` fails with `EBADF`).
fn fd_is_closed(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFD on an integer; no memory is touched.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    flags == -1 && crate::Errno::last().0 == libc::EBADF
}

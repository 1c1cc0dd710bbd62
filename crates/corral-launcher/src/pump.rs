//! The pump: reads the control socket and the output pipes of a running
//! sandbox until all are closed, sends each stream where it goes (captured
//! head and tail, or passed on live as a pipe with backpressure: a
//! [`Relay`]), forwards the CLI's signals, and collects what the helper
//! side reported. It never blocks: writes to a reader wait for POLLOUT,
//! so the caller's timeout and cancellation are always serviced.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, IsTerminal, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileTypeExt;

use corral_helper::{FailureKind, HelperMessage, LandlockOutcome};
use corral_sys::fd::{self, PollFd};
use corral_sys::process;
use corral_sys::signal::SignalFd;
use corral_sys::splice;

use crate::launch::{LaunchOptions, OutputMode, OutputTap, StreamResult};
use crate::output::HeadTail;

/// The most bytes of one live stream corral holds between the program's
/// pipe and the reader when it cannot splice (a terminal, a file, a socket,
/// or a tap that must see the bytes). Past it corral stops reading the
/// program's pipe, which then fills and blocks the program's writes: the
/// reader's pace is the program's, and corral's memory stays flat.
pub(crate) const STREAM_BOUND: usize = 64 << 10;

/// The most bytes one splice moves; a pipe holds 64 KiB by default.
const SPLICE_MAX: usize = 1 << 20;

/// Where one output stream's bytes go.
pub(crate) enum Sink {
    /// Head and tail kept for the result.
    Capture(HeadTail),
    /// Passed on to corral's own stdout or stderr as a pipe would.
    Stream(Relay),
}

/// How a live stream reaches the reader.
enum Path {
    /// corral's end is a pipe too: the kernel moves the bytes from pipe to
    /// pipe (splice), and corral holds none of them.
    Splice,
    /// Read into `pending` (at most [`STREAM_BOUND`]), written when the
    /// reader has room, at most `chunk` bytes per write so that a write
    /// after POLLOUT does not block.
    Copy { pending: VecDeque<u8>, chunk: usize },
}

/// One live stream: the program's bytes go to `to` at the reader's pace.
pub(crate) struct Relay {
    to: File,
    path: Path,
    /// Bytes read from the program.
    total: u64,
    /// Bytes the reader was given.
    delivered: u64,
    /// The reader cannot take more now (a splice found its pipe full):
    /// wait for POLLOUT before moving more.
    blocked: bool,
    /// The program tried to write past the kill ceiling.
    over: bool,
}

impl Relay {
    fn new(to: File, tapped: bool) -> Relay {
        let kind = to.metadata().map(|m| m.file_type()).ok();
        let path = match kind {
            Some(k) if k.is_fifo() && !tapped => Path::Splice,
            // A regular file or a device other than a terminal (/dev/null)
            // takes any write without blocking for long.
            Some(k) if k.is_file() || (k.is_char_device() && !to.is_terminal()) => Path::Copy {
                pending: VecDeque::new(),
                chunk: STREAM_BOUND,
            },
            // A terminal or a socket with room takes a page.
            _ => Path::Copy {
                pending: VecDeque::new(),
                chunk: 4096,
            },
        };
        Relay {
            to,
            path,
            total: 0,
            delivered: 0,
            blocked: false,
            over: false,
        }
    }

    /// Whether corral should read the program's pipe now.
    fn wants_input(&self) -> bool {
        match &self.path {
            _ if self.over => false,
            Path::Splice => !self.blocked,
            Path::Copy { pending, .. } => pending.len() < STREAM_BOUND,
        }
    }

    /// The fd to wait on for writing, when bytes wait for the reader.
    fn wants_write(&self) -> Option<i32> {
        let waiting = match &self.path {
            Path::Splice => self.blocked,
            Path::Copy { pending, .. } => !pending.is_empty(),
        };
        waiting.then(|| self.to.as_raw_fd())
    }

    /// Moves what the program's pipe holds (it polled readable) towards
    /// the reader, at most `cap` bytes (what is left below the kill
    /// ceiling). Returns how many bytes it read into `buf` (the copy path:
    /// a tap may look at them; a splice reads none into memory), or `None`
    /// when this stream is over: the program closed its end, or the reader
    /// went away (then the program's next write fails with EPIPE, as it
    /// would on a pipe).
    fn pump_from(&mut self, from: &mut File, buf: &mut [u8], cap: u64) -> Option<usize> {
        if cap == 0 {
            // At the ceiling: one more byte is the program passing it (the
            // launcher then kills); none is its end.
            return match from.read(&mut buf[..1]) {
                Ok(0) => None,
                Ok(n) => {
                    self.total += n as u64;
                    self.over = true;
                    Some(0)
                }
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {
                    Some(0)
                }
                Err(_) => None,
            };
        }
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        match &mut self.path {
            Path::Splice => {
                match splice::pipe_to_pipe(from.as_fd(), self.to.as_fd(), cap.min(SPLICE_MAX)) {
                    Ok(0) => None,
                    Ok(n) => {
                        self.total += n as u64;
                        self.delivered += n as u64;
                        self.blocked = false;
                        Some(0)
                    }
                    // The program's pipe polled readable, so the reader's
                    // is full.
                    Err(e) if e.0 == libc::EAGAIN => {
                        self.blocked = true;
                        Some(0)
                    }
                    Err(e) if e.0 == libc::EINTR => Some(0),
                    Err(_) => None,
                }
            }
            Path::Copy { pending, .. } => {
                let room = (STREAM_BOUND - pending.len().min(STREAM_BOUND))
                    .min(buf.len())
                    .min(cap);
                if room == 0 {
                    // Full (not polled then); a read of 0 would look like
                    // the end.
                    return Some(0);
                }
                match from.read(&mut buf[..room]) {
                    Ok(0) => None,
                    Ok(n) => {
                        self.total += n as u64;
                        pending.extend(&buf[..n]);
                        Some(n)
                    }
                    Err(e)
                        if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) =>
                    {
                        Some(0)
                    }
                    Err(_) => None,
                }
            }
        }
    }

    /// The reader has room (POLLOUT): give it what waits. Returns false
    /// when the reader went away.
    fn flush_some(&mut self, from: Option<&mut File>) -> bool {
        match &mut self.path {
            // Bytes still wait in the program's pipe: move them now.
            Path::Splice => match from {
                Some(from) => {
                    match splice::pipe_to_pipe(from.as_fd(), self.to.as_fd(), SPLICE_MAX) {
                        Ok(n) => {
                            self.total += n as u64;
                            self.delivered += n as u64;
                            self.blocked = false;
                            true
                        }
                        Err(e) if e.0 == libc::EAGAIN || e.0 == libc::EINTR => true,
                        Err(_) => false,
                    }
                }
                None => {
                    self.blocked = false;
                    true
                }
            },
            Path::Copy { pending, chunk } => {
                let (a, _) = pending.as_slices();
                let part = &a[..a.len().min(*chunk)];
                match self.to.write(part) {
                    Ok(n) => {
                        pending.drain(..n);
                        self.delivered += n as u64;
                        true
                    }
                    Err(e)
                        if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) =>
                    {
                        true
                    }
                    Err(_) => false,
                }
            }
        }
    }

    /// Whether bytes corral read still wait for the reader.
    fn holds_bytes(&self) -> bool {
        matches!(&self.path, Path::Copy { pending, .. } if !pending.is_empty())
    }

    /// Drops what waits for the reader (it went away, or the grace after a
    /// kill ran out).
    fn abandon(&mut self) {
        if let Path::Copy { pending, .. } = &mut self.path {
            pending.clear();
        }
        self.blocked = false;
    }
}

impl Sink {
    pub(crate) fn new(mode: OutputMode, budget: usize, to: Option<File>, tapped: bool) -> Sink {
        match (mode, to) {
            (OutputMode::Stream, Some(to)) => Sink::Stream(Relay::new(to, tapped)),
            _ => Sink::Capture(HeadTail::new(budget)),
        }
    }

    fn total(&self) -> u64 {
        match self {
            Sink::Capture(h) => h.total(),
            Sink::Stream(r) => r.total,
        }
    }

    pub(crate) fn finish(self) -> StreamResult {
        match self {
            Sink::Capture(h) => {
                let (total, truncated) = (h.total(), h.truncated());
                StreamResult {
                    data: h.into_bytes(),
                    total,
                    truncated,
                }
            }
            // Everything went to the reader already; nothing is added.
            Sink::Stream(r) => StreamResult {
                data: Vec::new(),
                total: r.total,
                truncated: r.delivered < r.total || r.over,
            },
        }
    }
}

/// How the program ended, as init reported it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    /// Exit code, when it exited.
    pub(crate) code: Option<i32>,
    /// Signal, when a signal killed it.
    pub(crate) signal: Option<i32>,
    /// What every process init reaped used.
    pub(crate) usage: process::Usage,
}

/// What the pump collected.
pub(crate) struct Finished {
    pub(crate) stdout: StreamResult,
    pub(crate) stderr: StreamResult,
    pub(crate) exited: Option<Exit>,
    pub(crate) failure: Option<(FailureKind, String)>,
    pub(crate) landlock: Option<LandlockOutcome>,
}

/// The pump's read buffer. Mapped pages (`PageBuf`): a run's control
/// messages and small output touch one or two of its 16, where a zeroed
/// `Vec` was written whole by `calloc` right after the clone of init, 16
/// page faults at each `corral run` (issue 17). On the heap should the
/// mapping fail.
enum Scratch {
    Pages(corral_sys::pages::PageBuf),
    Heap(Vec<u8>),
}

impl Scratch {
    fn new(len: usize) -> Scratch {
        match corral_sys::pages::PageBuf::new(len) {
            Ok(pages) => Scratch::Pages(pages),
            Err(_) => Scratch::Heap(vec![0u8; len]),
        }
    }
}

impl std::ops::Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Scratch::Pages(p) => p,
            Scratch::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Scratch::Pages(p) => p,
            Scratch::Heap(v) => v,
        }
    }
}

/// Reads the control socket and the output pipes until all are closed.
pub(crate) struct Pump {
    helper_pid: i32,
    signals: Option<SignalFd>,
    ctrl: Option<File>,
    pipes: [Option<File>; 2],
    sinks: [Sink; 2],
    kill_bytes: Option<u64>,
    buf: Scratch,
    exited: Option<Exit>,
    pub(crate) failure: Option<(FailureKind, String)>,
    landlock: Option<LandlockOutcome>,
    /// A signal that ends a run (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that
    /// reached corral before the program's process reported its layers,
    /// that is before the program started: kept here, not passed on (see
    /// [`Pump::poll`]).
    pub(crate) interrupted: Option<i32>,
    pub(crate) listeners: Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
    tap: Option<OutputTap>,
}

/// The forwarded signals whose default action ends a process and that a
/// terminal, a supervisor or `timeout(1)` sends to stop a run. SIGUSR1 and
/// SIGUSR2 end a process by default too, but are the program's to define:
/// they are always passed on.
const ENDS_THE_RUN: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

impl Pump {
    pub(crate) fn new(
        helper_pid: i32,
        pipes: [File; 2],
        ctrl: File,
        opts: &LaunchOptions,
        signals: Option<SignalFd>,
    ) -> Pump {
        let pipes = pipes.map(Some);
        for f in pipes.iter().flatten() {
            let _ = fd::set_nonblocking(f.as_raw_fd());
        }
        // Only streamed output goes to corral's own stdout and stderr.
        let dup = |fd: std::os::fd::BorrowedFd<'_>| {
            (opts.output == OutputMode::Stream)
                .then(|| fd.try_clone_to_owned().ok().map(File::from))
                .flatten()
        };
        let tapped = opts.tap.is_some();
        let sinks = [
            Sink::new(
                opts.output,
                opts.output_bytes,
                dup(std::io::stdout().as_fd_borrowed()),
                tapped,
            ),
            Sink::new(
                opts.output,
                opts.output_bytes,
                dup(std::io::stderr().as_fd_borrowed()),
                tapped,
            ),
        ];
        Pump {
            helper_pid,
            signals,
            ctrl: Some(ctrl),
            pipes,
            sinks,
            kill_bytes: opts.output_kill_bytes,
            buf: Scratch::new(64 * 1024),
            exited: None,
            failure: None,
            landlock: None,
            interrupted: None,
            listeners: None,
            tap: opts.tap.clone(),
        }
    }

    /// Whether the sandbox is gone (its control socket closed), every
    /// pipe is at its end and the reader has been given everything.
    pub(crate) fn done(&self) -> bool {
        self.ctrl.is_none() && self.output_done()
    }

    /// Whether the run's result stands although the sandbox is still on
    /// its way out: the program's end was reported (init sends it after
    /// killing and reaping every other process, so nothing of the program
    /// runs any more), no set-up failure came before it, every pipe is at
    /// its end and the reader has everything. What is left is init and the
    /// helper exiting (the namespaces' teardown), which no answer needs
    /// to wait for.
    pub(crate) fn settled(&self) -> bool {
        self.exited.is_some() && self.failure.is_none() && self.output_done()
    }

    /// Every pipe is at its end and the reader has been given everything.
    fn output_done(&self) -> bool {
        self.pipes.iter().all(Option::is_none)
            && !self
                .sinks
                .iter()
                .any(|s| matches!(s, Sink::Stream(r) if r.holds_bytes()))
    }

    /// Whether the sandbox still runs: its control socket closes only when
    /// the helper, the last of its processes, has ended, and nothing of the
    /// program runs once init has reported its end. After that the pump
    /// only hands what is left to the reader, and the timeout no longer
    /// applies.
    pub(crate) fn sandbox_running(&self) -> bool {
        self.ctrl.is_some() && self.exited.is_none()
    }

    /// Stops passing live output on: after a kill, once the reader has had
    /// its grace, what it has not taken is dropped (the program's pipes are
    /// closed, so their end comes at once). Captured output is unaffected.
    pub(crate) fn abandon_output(&mut self) {
        for (pipe, sink) in self.pipes.iter_mut().zip(&mut self.sinks) {
            if let Sink::Stream(r) = sink {
                r.abandon();
                *pipe = None;
            }
        }
    }

    pub(crate) fn over_kill_ceiling(&self) -> bool {
        self.kill_bytes
            .is_some_and(|k| self.sinks.iter().any(|s| s.total() > k))
    }

    pub(crate) fn poll(&mut self, timeout_ms: i32) {
        let mut fds: Vec<PollFd> = Vec::with_capacity(4);
        let mut watch = |fd: i32| fds.push(PollFd::read(fd));
        if let Some(c) = &self.ctrl {
            watch(c.as_raw_fd());
        }
        for (f, sink) in self.pipes.iter().zip(&self.sinks) {
            // A live stream whose reader is behind is not read: the
            // program's pipe fills and its writes wait (backpressure).
            let wanted = match sink {
                Sink::Capture(_) => true,
                Sink::Stream(r) => r.wants_input(),
            };
            if let Some(f) = f.as_ref().filter(|_| wanted) {
                watch(f.as_raw_fd());
            }
        }
        if let Some(s) = &self.signals {
            watch(s.raw());
        }
        for sink in &self.sinks {
            if let Sink::Stream(r) = sink {
                if let Some(fd) = r.wants_write() {
                    fds.push(PollFd::write(fd));
                }
            }
        }
        if fd::poll(&mut fds, timeout_ms).unwrap_or(0) == 0 {
            return;
        }
        let ready = |fd: i32| fds.iter().any(|p| p.fd == fd && !p.write && p.ready);
        // The control socket first: a `layers` report that came with a
        // signal means the program has started, and the signal is its.
        if self.ctrl.as_ref().is_some_and(|c| ready(c.as_raw_fd())) {
            self.read_ctrl();
        }
        let signalled = self.signals.as_ref().is_some_and(|s| ready(s.raw()));
        if signalled && self.landlock.is_none() {
            // One message per poll above: a `layers` report queued behind
            // another (the proxy's `listeners`) decides too.
            while self.landlock.is_none() && self.ctrl_has_more() {
                self.read_ctrl();
            }
        }
        if let Some(s) = self.signals.as_ref().filter(|_| signalled) {
            while let Some(sig) = s.take() {
                if self.landlock.is_none() && ENDS_THE_RUN.contains(&sig) {
                    // No program yet to pass it to: init holds every
                    // signal blocked until it starts one, and a set-up
                    // that waits on a filesystem that does not answer
                    // would keep it waiting until the timeout. The caller
                    // kills the sandbox instead.
                    self.interrupted.get_or_insert(sig);
                } else {
                    let _ = process::kill(self.helper_pid, sig);
                }
            }
        }
        for i in 0..2 {
            let writable = match &self.sinks[i] {
                Sink::Stream(r) => r
                    .wants_write()
                    .is_some_and(|fd| fds.iter().any(|p| p.fd == fd && p.write && p.ready)),
                Sink::Capture(_) => false,
            };
            if writable {
                self.flush(i);
            }
            if self.pipes[i].as_ref().is_some_and(|f| ready(f.as_raw_fd())) {
                self.read_pipe(i);
            }
        }
    }

    /// Whether the control socket has a message (or its end) waiting now.
    fn ctrl_has_more(&self) -> bool {
        let Some(c) = &self.ctrl else {
            return false;
        };
        let mut fds = [PollFd::read(c.as_raw_fd())];
        fd::poll(&mut fds, 0).unwrap_or(0) > 0
    }

    fn read_ctrl(&mut self) {
        let Some(ctrl) = self.ctrl.as_mut() else {
            return;
        };
        match fd::recv_with_fds(ctrl.as_raw_fd(), &mut self.buf).map_err(std::io::Error::from) {
            Ok((0, _)) => self.ctrl = None,
            Ok((n, mut fds)) => match serde_json::from_slice::<HelperMessage>(&self.buf[..n]) {
                Ok(HelperMessage::Listeners { .. }) if fds.len() == 2 => {
                    let socks = fds.pop();
                    let http = fds.pop();
                    if let (Some(h), Some(s)) = (http, socks) {
                        self.listeners = Some((h, s));
                    }
                }
                Ok(HelperMessage::Listeners { .. }) => {
                    self.failure.get_or_insert((
                        FailureKind::Protocol,
                        "proxy sockets arrived without descriptors".into(),
                    ));
                }
                Ok(HelperMessage::Failed { kind, message }) => {
                    // The first failure is the cause; later ones are echoes.
                    self.failure.get_or_insert((kind, message));
                }
                Ok(HelperMessage::Exited {
                    code,
                    signal,
                    cpu_us,
                    max_rss_bytes,
                }) => {
                    self.exited = Some(Exit {
                        code,
                        signal,
                        usage: process::Usage {
                            cpu_us,
                            max_rss_bytes,
                        },
                    });
                }
                Ok(HelperMessage::Layers { landlock }) => self.landlock = Some(landlock),
                Err(_) => {}
            },
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // The other end left with a message of ours unread (init that
            // failed while corral's `join` was on its way): the kernel
            // reports that once, ahead of what it sent before it left,
            // which is still to read (its failure report); the end of
            // file follows.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Err(_) => self.ctrl = None,
        }
    }

    /// Gives the reader of live stream `i` what waits for it (it has room).
    fn flush(&mut self, i: usize) {
        let Sink::Stream(r) = &mut self.sinks[i] else {
            return;
        };
        if !r.flush_some(self.pipes[i].as_mut()) {
            // The reader went away: close the program's end too, so its
            // next write fails with EPIPE as it would on a pipe.
            r.abandon();
            self.pipes[i] = None;
        }
    }

    /// Moves what the pipe of live stream `i` holds towards the reader.
    fn relay_pipe(&mut self, i: usize) {
        let cap = self
            .kill_bytes
            .map_or(u64::MAX, |k| k.saturating_sub(self.sinks[i].total()));
        let (Sink::Stream(r), Some(from)) = (&mut self.sinks[i], self.pipes[i].as_mut()) else {
            return;
        };
        match r.pump_from(from, &mut self.buf, cap) {
            None => {
                // The program's end (or a gone reader, found by a splice):
                // no more input. Bytes already read still go to the reader.
                r.blocked = false;
                self.pipes[i] = None;
            }
            Some(n) if n > 0 => {
                if let Some(tap) = &self.tap {
                    // Pipe 0 is stdout (stream 1), pipe 1 stderr (2).
                    tap(if i == 0 { 1 } else { 2 }, &self.buf[..n]);
                }
            }
            Some(_) => {}
        }
        if matches!(&self.sinks[i], Sink::Stream(r) if r.over) {
            // Past the kill ceiling nothing more is passed on; what was
            // read below it still goes to the reader.
            self.pipes[i] = None;
        }
    }

    /// Drains what is in the pipe now (bounded per call, so one busy stream
    /// cannot starve the other or the control socket).
    fn read_pipe(&mut self, i: usize) {
        if matches!(self.sinks[i], Sink::Stream(_)) {
            self.relay_pipe(i);
            return;
        }
        for _ in 0..16 {
            let Some(f) = self.pipes[i].as_mut() else {
                return;
            };
            match f.read(&mut self.buf) {
                Ok(0) => {
                    self.pipes[i] = None;
                    return;
                }
                Ok(n) => {
                    if let Sink::Capture(h) = &mut self.sinks[i] {
                        h.push(&self.buf[..n]);
                    }
                    if let Some(tap) = &self.tap {
                        // Pipe 0 is stdout (stream 1), pipe 1 stderr (2).
                        let stream = if i == 0 { 1 } else { 2 };
                        tap(stream, &self.buf[..n]);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.pipes[i] = None;
                    return;
                }
            }
        }
    }

    pub(crate) fn finish(self) -> Finished {
        let [out, err] = self.sinks;
        Finished {
            stdout: out.finish(),
            stderr: err.finish(),
            exited: self.exited,
            failure: self.failure,
            landlock: self.landlock,
        }
    }
}

/// Borrowing stdio fds without unsafe.
trait AsFdBorrowed {
    fn as_fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_>;
}

impl<T: std::os::fd::AsFd> AsFdBorrowed for T {
    fn as_fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_> {
        self.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::HelperStart;

    #[test]
    fn a_report_waiting_when_init_left_with_a_message_unread_is_still_read() {
        // init failed and reported it, while corral's `join` was on its
        // way: init exits with that message unread, and the kernel marks
        // corral's end ECONNRESET (unix_release_sock), reported once, ahead
        // of the report still queued.
        let (ours, init) = fd::seqpacket_pair().unwrap();
        let report = serde_json::to_vec(&HelperMessage::Failed {
            kind: FailureKind::Mount,
            message: "opening denied path /workspace/x".into(),
        })
        .unwrap();
        fd::send_with_fds(init.as_raw_fd(), &report, &[]).unwrap();
        fd::send_with_fds(ours.as_raw_fd(), b"join", &[]).unwrap();
        drop(init);
        let opts = LaunchOptions {
            output: OutputMode::Capture,
            output_bytes: 1024,
            output_kill_bytes: None,
            timeout: None,
            forward_signals: false,
            helper: HelperStart::ReExec,
            cancel: None,
            stdin: None,
            tap: None,
        };
        let null = || File::open("/dev/null").unwrap();
        let mut pump = Pump::new(0, [null(), null()], File::from(ours), &opts, None);
        for _ in 0..3 {
            pump.read_ctrl();
        }
        assert_eq!(
            pump.failure,
            Some((
                FailureKind::Mount,
                "opening denied path /workspace/x".into()
            ))
        );
        assert!(pump.ctrl.is_none(), "the end of the socket was seen");
    }
}

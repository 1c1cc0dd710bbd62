//! The pump: reads the control socket and the output pipes of a running
//! sandbox until all are closed, sends each stream where it goes (captured
//! head and tail, or forwarded live), forwards the CLI's signals, and
//! collects what the helper side reported.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;

use corral_helper::{FailureKind, HelperMessage, LandlockOutcome};
use corral_sys::fd::{self, PollFd};
use corral_sys::process;
use corral_sys::signal::SignalFd;

use crate::launch::{LaunchOptions, OutputMode, OutputTap, StreamResult};
use crate::output::{elision_marker, HeadTail};

/// Where one output stream's bytes go.
pub(crate) enum Sink {
    /// Head and tail kept for the result.
    Capture(HeadTail),
    /// Forwarded live until `budget` bytes; after that a tail of `budget`
    /// bytes is kept for the end. Live bytes wait in `pending` until the
    /// reader can take them, so a stalled reader never blocks the drain or
    /// the timeout.
    Stream {
        to: File,
        pending: VecDeque<u8>,
        forwarded: usize,
        budget: usize,
        tail: VecDeque<u8>,
        total: u64,
        broken: bool,
    },
}

impl Sink {
    pub(crate) fn new(mode: OutputMode, budget: usize, to: Option<File>) -> Sink {
        match (mode, to) {
            (OutputMode::Stream, Some(to)) => Sink::Stream {
                to,
                pending: VecDeque::new(),
                forwarded: 0,
                budget,
                tail: VecDeque::new(),
                total: 0,
                broken: false,
            },
            _ => Sink::Capture(HeadTail::new(budget)),
        }
    }

    fn total(&self) -> u64 {
        match self {
            Sink::Capture(h) => h.total(),
            Sink::Stream { total, .. } => *total,
        }
    }

    fn push(&mut self, data: &[u8]) {
        match self {
            Sink::Capture(h) => h.push(data),
            Sink::Stream {
                pending,
                forwarded,
                budget,
                tail,
                total,
                broken,
                ..
            } => {
                *total += data.len() as u64;
                let live = (*budget - *forwarded).min(data.len());
                if !*broken {
                    pending.extend(&data[..live]);
                }
                *forwarded += live;
                let rest = &data[live..];
                let overflow = (tail.len() + rest.len()).saturating_sub(*budget);
                if overflow >= tail.len() {
                    tail.clear();
                    tail.extend(&rest[rest.len().saturating_sub(*budget)..]);
                } else {
                    tail.drain(..overflow);
                    tail.extend(rest);
                }
            }
        }
    }

    /// The fd to wait on for writing, when live bytes are waiting.
    fn wants_write(&self) -> Option<i32> {
        match self {
            Sink::Stream {
                to,
                pending,
                broken: false,
                ..
            } if !pending.is_empty() => Some(to.as_raw_fd()),
            _ => None,
        }
    }

    /// Writes one chunk of pending bytes (the reader said it has room).
    fn write_some(&mut self) {
        if let Sink::Stream {
            to,
            pending,
            broken,
            ..
        } = self
        {
            let (a, _) = pending.as_slices();
            // A pipe with room takes a page without blocking.
            let chunk = &a[..a.len().min(4096)];
            match to.write(chunk) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    // A reader that went away must not stop the drain.
                    *broken = true;
                    pending.clear();
                }
            }
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
            Sink::Stream {
                mut to,
                pending,
                forwarded,
                tail,
                total,
                mut broken,
                ..
            } => {
                let kept = forwarded as u64 + tail.len() as u64;
                let elided = total - kept;
                // The sandbox is gone; what is left goes out at the
                // reader's pace.
                if !broken {
                    let (a, b) = pending.as_slices();
                    broken = to.write_all(a).and_then(|_| to.write_all(b)).is_err();
                }
                if !broken && !tail.is_empty() {
                    let _ = to.write_all(elision_marker(elided).as_bytes());
                    let (a, b) = tail.as_slices();
                    let _ = to.write_all(a).and_then(|_| to.write_all(b));
                }
                StreamResult {
                    data: Vec::new(),
                    total,
                    truncated: elided > 0,
                }
            }
        }
    }
}

/// What the pump collected.
pub(crate) struct Finished {
    pub(crate) stdout: StreamResult,
    pub(crate) stderr: StreamResult,
    pub(crate) exited: Option<(Option<i32>, Option<i32>)>,
    pub(crate) failure: Option<(FailureKind, String)>,
    pub(crate) landlock: Option<LandlockOutcome>,
}

/// Reads the control socket and the output pipes until all are closed.
pub(crate) struct Pump {
    helper_pid: i32,
    signals: Option<SignalFd>,
    ctrl: Option<File>,
    pipes: [Option<File>; 2],
    sinks: [Sink; 2],
    kill_bytes: Option<u64>,
    buf: Vec<u8>,
    exited: Option<(Option<i32>, Option<i32>)>,
    pub(crate) failure: Option<(FailureKind, String)>,
    landlock: Option<LandlockOutcome>,
    pub(crate) listeners: Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
    tap: Option<OutputTap>,
}

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
        let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().ok().map(File::from);
        let sinks = [
            Sink::new(
                opts.output,
                opts.output_bytes,
                dup(std::io::stdout().as_fd_borrowed()),
            ),
            Sink::new(
                opts.output,
                opts.output_bytes,
                dup(std::io::stderr().as_fd_borrowed()),
            ),
        ];
        Pump {
            helper_pid,
            signals,
            ctrl: Some(ctrl),
            pipes,
            sinks,
            kill_bytes: opts.output_kill_bytes,
            buf: vec![0u8; 64 * 1024],
            exited: None,
            failure: None,
            landlock: None,
            listeners: None,
            tap: opts.tap.clone(),
        }
    }

    pub(crate) fn done(&self) -> bool {
        self.ctrl.is_none() && self.pipes.iter().all(Option::is_none)
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
        for f in self.pipes.iter().flatten() {
            watch(f.as_raw_fd());
        }
        if let Some(s) = &self.signals {
            watch(s.raw());
        }
        for sink in &self.sinks {
            if let Some(fd) = sink.wants_write() {
                fds.push(PollFd::write(fd));
            }
        }
        if fd::poll(&mut fds, timeout_ms).unwrap_or(0) == 0 {
            return;
        }
        let ready = |fd: i32| fds.iter().any(|p| p.fd == fd && p.ready);
        if let Some(s) = self.signals.as_ref().filter(|s| ready(s.raw())) {
            while let Some(sig) = s.take() {
                let _ = process::kill(self.helper_pid, sig);
            }
        }
        if self.ctrl.as_ref().is_some_and(|c| ready(c.as_raw_fd())) {
            self.read_ctrl();
        }
        for i in 0..2 {
            if self.pipes[i].as_ref().is_some_and(|f| ready(f.as_raw_fd())) {
                self.read_pipe(i);
            }
        }
        for sink in &mut self.sinks {
            if sink
                .wants_write()
                .is_some_and(|fd| fds.iter().any(|p| p.fd == fd && p.write && p.ready))
            {
                sink.write_some();
            }
        }
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
                Ok(HelperMessage::Exited { code, signal }) => self.exited = Some((code, signal)),
                Ok(HelperMessage::Layers { landlock }) => self.landlock = Some(landlock),
                Err(_) => {}
            },
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => self.ctrl = None,
        }
    }

    /// Drains what is in the pipe now (bounded per call, so one busy stream
    /// cannot starve the other or the control socket).
    fn read_pipe(&mut self, i: usize) {
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
                    self.sinks[i].push(&self.buf[..n]);
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

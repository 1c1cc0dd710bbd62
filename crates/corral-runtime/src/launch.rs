//! The parent side: spawn the helper, send the plan, capture output,
//! enforce the wall-clock timeout, and turn what happened into an
//! [`Outcome`].
//!
//! Nothing here runs between fork and exec except the fd placement in
//! [`corral_sys::fd::pass_fd_as`], so it is safe to call from a
//! multi-threaded server.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_sys::fd::{self, PollFd};
use corral_sys::signal::SignalFd;

use crate::plan::SandboxPlan;
use crate::protocol::{FailureKind, HelperMessage};
use crate::{EXIT_CORRAL_ERROR, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, HELPER_SUBCOMMAND};

/// What happens to the program's stdout and stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Straight to corral's own stdout/stderr.
    Inherit,
    /// Captured; at most `limit` bytes per stream are kept.
    Capture {
        /// Bytes kept per stream.
        limit: usize,
    },
}

/// How to launch.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Output handling.
    pub output: OutputMode,
    /// Wall-clock limit.
    pub timeout: Option<Duration>,
    /// Forward SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
    /// received by this process to the program (through the helper and
    /// init). For the CLI; blocks those signals on the calling thread.
    pub forward_signals: bool,
}

/// Signals the CLI forwards to the program.
pub const FORWARDED_SIGNALS: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// A captured stream.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    /// Bytes kept.
    pub data: Vec<u8>,
    /// Bytes the program wrote in total.
    pub total: u64,
}

impl Captured {
    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }
}

/// What happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// corral's exit status for this run.
    pub exit_code: i32,
    /// Signal that ended the program.
    pub signal: Option<i32>,
    /// Whether the timeout fired.
    pub timed_out: bool,
    /// Set-up or exec failure reported by the helper.
    pub failure: Option<(FailureKind, String)>,
    /// Captured stdout (empty when inherited).
    pub stdout: Captured,
    /// Captured stderr (empty when inherited).
    pub stderr: Captured,
    /// Wall time.
    pub wall: Duration,
}

impl Outcome {
    /// Stable error code for a failure.
    pub fn failure_code(kind: FailureKind) -> &'static str {
        match kind {
            FailureKind::Protocol => "sandbox.protocol",
            FailureKind::Identity => "sandbox.identity",
            FailureKind::UserNamespace => "sandbox.user_namespace",
            FailureKind::Namespace => "sandbox.namespace",
            FailureKind::Mount => "sandbox.mount",
            FailureKind::Setup => "sandbox.setup",
            FailureKind::Privileges => "sandbox.privileges",
            FailureKind::ExecNotFound => "exec.not_found",
            FailureKind::ExecFailed => "exec.failed",
        }
    }
}

/// Why the sandbox could not even be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Creating the control socket or spawning the helper failed.
    #[error("cannot start the sandbox helper ({what}): {source}")]
    Spawn {
        /// The step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

fn spawn_err(what: &'static str) -> impl FnOnce(std::io::Error) -> LaunchError {
    move |source| LaunchError::Spawn { what, source }
}

/// Runs `plan` in a new sandbox and waits for it to end.
pub fn launch(plan: &SandboxPlan, opts: &LaunchOptions) -> Result<Outcome, LaunchError> {
    let start = Instant::now();
    let (ours, theirs) = fd::seqpacket_pair().map_err(|e| spawn_err("socketpair")(e.into()))?;
    let signals = if opts.forward_signals {
        Some(SignalFd::new(&FORWARDED_SIGNALS).map_err(|e| spawn_err("signalfd")(e.into()))?)
    } else {
        None
    };
    let mut cmd = Command::new("/proc/self/exe");
    // Its own process group: a terminal's Ctrl-C reaches corral only, which
    // forwards it once.
    cmd.arg0("corral-sandbox")
        .arg(HELPER_SUBCOMMAND)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::inherit());
    let capture = matches!(opts.output, OutputMode::Capture { .. });
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    fd::pass_fd_as(&mut cmd, &theirs, fd::HELPER_CONTROL_FD);
    let mut child = cmd.spawn().map_err(spawn_err("spawn"))?;
    drop(theirs);
    let mut ctrl = File::from(ours);
    let payload = serde_json::to_vec(plan).map_err(|e| spawn_err("encode plan")(e.into()))?;
    if let Err(e) = ctrl.write_all(&payload) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(spawn_err("send plan")(e));
    }
    let limit = match opts.output {
        OutputMode::Capture { limit } => limit,
        OutputMode::Inherit => 0,
    };
    let mut pump = Pump::new(&mut child, ctrl, limit, signals);
    let deadline = opts.timeout.map(|t| start + t);
    let mut timed_out = false;
    while !pump.done() {
        let wait_ms = match deadline {
            Some(d) if !timed_out => {
                let now = Instant::now();
                if now >= d {
                    // Killing the helper kills init (PDEATHSIG), and the
                    // kernel then kills every process of the pid namespace.
                    let _ = child.kill();
                    timed_out = true;
                    continue;
                }
                (d - now).as_millis().min(i32::MAX as u128) as i32 + 1
            }
            _ => -1,
        };
        pump.poll(wait_ms);
    }
    let helper_status = child.wait().map_err(spawn_err("wait"))?;
    let (stdout, stderr, message, failure) = pump.finish();
    let (mut exit_code, mut signal) = match (&failure, message) {
        (Some((FailureKind::ExecNotFound, _)), _) => (EXIT_NOT_FOUND, None),
        (Some((FailureKind::ExecFailed, _)), _) => (EXIT_NOT_EXECUTABLE, None),
        (Some(_), _) => (EXIT_CORRAL_ERROR, None),
        (None, Some((Some(code), _))) => (code, None),
        (None, Some((_, Some(sig)))) => (128 + sig, Some(sig)),
        _ => {
            use std::os::unix::process::ExitStatusExt;
            match helper_status.signal() {
                Some(sig) => (128 + sig, Some(sig)),
                None => (helper_status.code().unwrap_or(EXIT_CORRAL_ERROR), None),
            }
        }
    };
    if timed_out && failure.is_none() {
        exit_code = 128 + libc::SIGKILL;
        signal = Some(libc::SIGKILL);
    }
    let failure = match (failure, timed_out, message) {
        (None, false, None) => Some((
            FailureKind::Setup,
            format!("the sandbox helper ended without reporting a result ({helper_status})"),
        )),
        (f, _, _) => f,
    };
    Ok(Outcome {
        exit_code,
        signal,
        timed_out,
        failure,
        stdout,
        stderr,
        wall: start.elapsed(),
    })
}

/// Reads the control socket and the output pipes until all are closed.
struct Pump {
    helper_pid: i32,
    signals: Option<SignalFd>,
    ctrl: Option<File>,
    out: [Option<File>; 2],
    captured: [Captured; 2],
    limit: usize,
    exited: Option<(Option<i32>, Option<i32>)>,
    failure: Option<(FailureKind, String)>,
}

impl Pump {
    fn new(child: &mut Child, ctrl: File, limit: usize, signals: Option<SignalFd>) -> Pump {
        let out = [
            child
                .stdout
                .take()
                .map(|s| File::from(std::os::fd::OwnedFd::from(s))),
            child
                .stderr
                .take()
                .map(|s| File::from(std::os::fd::OwnedFd::from(s))),
        ];
        for f in out.iter().flatten() {
            let _ = fd::set_nonblocking(f.as_raw_fd());
        }
        Pump {
            helper_pid: child.id() as i32,
            signals,
            ctrl: Some(ctrl),
            out,
            captured: [Captured::default(), Captured::default()],
            limit,
            exited: None,
            failure: None,
        }
    }

    fn done(&self) -> bool {
        self.ctrl.is_none() && self.out.iter().all(Option::is_none)
    }

    fn poll(&mut self, timeout_ms: i32) {
        let mut fds: Vec<PollFd> = Vec::with_capacity(3);
        if let Some(c) = &self.ctrl {
            fds.push(PollFd {
                fd: c.as_raw_fd(),
                ready: false,
            });
        }
        for f in self.out.iter().flatten() {
            fds.push(PollFd {
                fd: f.as_raw_fd(),
                ready: false,
            });
        }
        if let Some(s) = &self.signals {
            fds.push(PollFd {
                fd: s.raw(),
                ready: false,
            });
        }
        if fd::poll(&mut fds, timeout_ms).unwrap_or(0) == 0 {
            return;
        }
        let ready = |fd: i32| fds.iter().any(|p| p.fd == fd && p.ready);
        if let Some(s) = self.signals.as_ref().filter(|s| ready(s.raw())) {
            while let Some(sig) = s.take() {
                let _ = corral_sys::process::kill(self.helper_pid, sig);
            }
        }
        if self.ctrl.as_ref().is_some_and(|c| ready(c.as_raw_fd())) {
            self.read_ctrl();
        }
        for i in 0..2 {
            if self.out[i].as_ref().is_some_and(|f| ready(f.as_raw_fd())) {
                self.read_out(i);
            }
        }
    }

    fn read_ctrl(&mut self) {
        let Some(ctrl) = self.ctrl.as_mut() else {
            return;
        };
        let mut buf = vec![0u8; 64 * 1024];
        match ctrl.read(&mut buf) {
            Ok(0) => self.ctrl = None,
            Ok(n) => match serde_json::from_slice::<HelperMessage>(&buf[..n]) {
                Ok(HelperMessage::Failed { kind, message }) => {
                    // The first failure is the cause; later ones are echoes.
                    self.failure.get_or_insert((kind, message));
                }
                Ok(HelperMessage::Exited { code, signal }) => self.exited = Some((code, signal)),
                Err(_) => {}
            },
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => self.ctrl = None,
        }
    }

    fn read_out(&mut self, i: usize) {
        let Some(f) = self.out[i].as_mut() else {
            return;
        };
        let mut buf = [0u8; 64 * 1024];
        loop {
            match f.read(&mut buf) {
                Ok(0) => {
                    self.out[i] = None;
                    return;
                }
                Ok(n) => {
                    let c = &mut self.captured[i];
                    c.total += n as u64;
                    let room = self.limit.saturating_sub(c.data.len());
                    c.data.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.out[i] = None;
                    return;
                }
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn finish(
        self,
    ) -> (
        Captured,
        Captured,
        Option<(Option<i32>, Option<i32>)>,
        Option<(FailureKind, String)>,
    ) {
        let [out, err] = self.captured;
        (out, err, self.exited, self.failure)
    }
}

/// Whether this process may have been started as the sandbox helper.
pub fn is_helper_invocation(arg1: Option<&std::ffi::OsStr>) -> bool {
    arg1.is_some_and(|a| a == HELPER_SUBCOMMAND)
}

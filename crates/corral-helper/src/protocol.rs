//! Messages on the control socket between corral and its sandbox helper.
//!
//! The parent sends one [`crate::SandboxPlan`] as JSON in a
//! [`PLAN_MESSAGE`]: in the message itself when it is small, else in a
//! sealed memfd attached to it (see [`inline_run_message`]; a forked
//! helper has its plan already and gets [`GO_AHEAD`]). The helper, the
//! sandbox's init and the program's pre-exec child answer with
//! [`HelperMessage`]s, one JSON object per `SOCK_SEQPACKET` message. The
//! program's copy of the socket is close-on-exec, so a successful exec
//! sends nothing; init reports how the program ended.

use serde::{Deserialize, Serialize};

/// What went wrong while building the sandbox, by stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The plan could not be read.
    Protocol,
    /// Dropping root to the sandbox identity failed.
    Identity,
    /// User namespaces are not available to this user on this host.
    UserNamespace,
    /// Another namespace could not be created.
    Namespace,
    /// A mount step failed.
    Mount,
    /// Hostname, loopback or another small step failed.
    Setup,
    /// Dropping privileges failed.
    Privileges,
    /// Landlock or seccomp could not be put in force.
    Security,
    /// execve failed with ENOENT.
    ExecNotFound,
    /// execve failed otherwise (EACCES, ENOEXEC, ...).
    ExecFailed,
}

/// A message from the helper side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HelperMessage {
    /// Setup failed; nothing of the program ran.
    Failed {
        /// The stage.
        kind: FailureKind,
        /// What failed, with paths and the errno name.
        message: String,
    },
    /// The proxy's listening sockets, created inside the sandbox's network
    /// namespace, are attached to this message (`SCM_RIGHTS`): HTTP first,
    /// then SOCKS5.
    Listeners {
        /// Port of the HTTP proxy inside the sandbox.
        http_port: u16,
        /// Port of the SOCKS5 proxy inside the sandbox.
        socks_port: u16,
    },
    /// The program's last layers are in force (sent just before execve).
    Layers {
        /// How Landlock ended up.
        landlock: crate::landlock::LandlockOutcome,
    },
    /// The program ended, and every other process of the sandbox was
    /// killed and reaped: only init (or the reduced-mode helper) is left,
    /// and it leaves next.
    Exited {
        /// Exit code, when it exited.
        code: Option<i32>,
        /// Signal, when a signal killed it.
        signal: Option<i32>,
        /// CPU time (user plus system) of every process init reaped, in
        /// microseconds: what `wait4` on the helper would add up, less
        /// init and the helper themselves.
        cpu_us: u64,
        /// Largest resident set of any of them, in bytes.
        max_rss_bytes: u64,
    },
}

/// Largest plan a helper accepts. The plan travels in a sealed memfd, not
/// in the socket message, so it is bounded by this and not by the socket
/// buffer (argv and environment of a run can be megabytes).
pub const MAX_PLAN_BYTES: usize = 64 << 20;

/// The tag of the message that carries a re-executed helper's plan as
/// JSON (a run message, see [`inline_run_message`]); the run's stdin,
/// stdout and stderr are attached to it (`SCM_RIGHTS`), in that order.
pub const PLAN_MESSAGE: &[u8] = b"plan";

/// The tag of the message that starts the program of a held sandbox
/// ([`crate::SandboxPlan::hold`]) with its [`crate::ProgramPlan`] as JSON
/// (a run message, see [`inline_run_message`]); the run's stdin, stdout
/// and stderr are attached (`SCM_RIGHTS`), in that order. The program's
/// process, forked ahead by init, reads it; end of file instead means
/// corral let the sandbox go unused.
pub const PROGRAM_MESSAGE: &[u8] = b"program";

/// Largest payload a run message carries in the message itself. A program
/// part is a few hundred bytes; a memfd for it cost a `memfd_create`, a
/// write, three seals and a close on the sender's side and an `fstat`, a
/// seal check, a read and a close on the receiver's, on the path of every
/// execution of a service (docs/PERFORMANCE.md). Far below the default
/// socket buffer (~208 KiB) that bounds one `SOCK_SEQPACKET` message; a
/// smaller one makes the sender fall back to the memfd.
pub const MAX_INLINE_BYTES: usize = 16 << 10;

/// The bytes of a run message ([`PLAN_MESSAGE`], [`PROGRAM_MESSAGE`]) that
/// carries `payload` itself: `tag`, a NUL byte, the payload; the run's
/// three streams are attached. `None` when the payload is larger than
/// [`MAX_INLINE_BYTES`]: the message is then `tag` alone, with a fourth
/// descriptor attached, a sealed memfd holding the payload (at most
/// [`MAX_PLAN_BYTES`]: argv and environment can be megabytes).
pub fn inline_run_message(tag: &[u8], payload: &[u8]) -> Option<Vec<u8>> {
    (payload.len() <= MAX_INLINE_BYTES).then(|| [tag, &[0], payload].concat())
}

/// Where a received run message's payload is.
#[derive(Debug, PartialEq, Eq)]
pub enum RunPayload<'a> {
    /// In the message (after the tag and a NUL byte); three descriptors
    /// come with it.
    Inline(&'a [u8]),
    /// In the sealed memfd attached as the fourth descriptor.
    InMemfd,
}

impl RunPayload<'_> {
    /// How many descriptors come with a message framed this way: the
    /// run's three streams, and the memfd.
    pub fn descriptors(&self) -> usize {
        match self {
            RunPayload::Inline(_) => 3,
            RunPayload::InMemfd => 4,
        }
    }
}

/// Reads the framing of a run message tagged `tag` (see
/// [`inline_run_message`]); `None` for anything else: another tag, a tag
/// followed by anything but a NUL byte, an inline payload over
/// [`MAX_INLINE_BYTES`].
pub fn parse_run_message<'a>(tag: &[u8], message: &'a [u8]) -> Option<RunPayload<'a>> {
    match message.strip_prefix(tag)? {
        [] => Some(RunPayload::InMemfd),
        [0, payload @ ..] if payload.len() <= MAX_INLINE_BYTES => Some(RunPayload::Inline(payload)),
        _ => None,
    }
}

/// What the parent sends a forked helper (which already has its plan) once
/// it sits in its cgroup.
pub const GO_AHEAD: &[u8] = b"go";

/// What corral sends init it cloned before the sandbox's cgroup existed
/// (cgroup v1, `corral run`): the group's `tasks` files, opened for
/// writing by corral, are attached (`SCM_RIGHTS`), one per hierarchy.
/// init moves itself in through them once it has built the sandbox's root
/// and before it starts the program; end of file instead means corral is
/// gone.
pub const JOIN_MESSAGE: &[u8] = b"join";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_message_carries_a_small_payload_itself_and_a_large_one_in_a_memfd() {
        let small = inline_run_message(PROGRAM_MESSAGE, br#"{"argv":["sh"]}"#).unwrap();
        assert_eq!(small, b"program\0{\"argv\":[\"sh\"]}");
        assert_eq!(
            parse_run_message(PROGRAM_MESSAGE, &small),
            Some(RunPayload::Inline(br#"{"argv":["sh"]}"#))
        );
        // An empty payload is still inline (tag and NUL).
        let empty = inline_run_message(PLAN_MESSAGE, b"").unwrap();
        assert_eq!(
            parse_run_message(PLAN_MESSAGE, &empty),
            Some(RunPayload::Inline(b""))
        );
        let limit = vec![b'x'; MAX_INLINE_BYTES];
        assert!(inline_run_message(PLAN_MESSAGE, &limit).is_some());
        assert!(inline_run_message(PLAN_MESSAGE, &[limit.as_slice(), b"x"].concat()).is_none());
        // Over the limit, the message is the tag alone.
        assert_eq!(
            parse_run_message(PLAN_MESSAGE, PLAN_MESSAGE),
            Some(RunPayload::InMemfd)
        );
    }

    #[test]
    fn anything_but_a_run_message_of_the_expected_tag_is_refused() {
        for bad in [
            &b"plan"[..],
            b"programme",
            b"program{}",
            b"progra",
            b"",
            b"\0program",
        ] {
            assert_eq!(parse_run_message(PROGRAM_MESSAGE, bad), None, "{bad:?}");
        }
        let over = [PLAN_MESSAGE, &[0], &vec![b'x'; MAX_INLINE_BYTES + 1]].concat();
        assert_eq!(parse_run_message(PLAN_MESSAGE, &over), None);
    }

    #[test]
    fn an_inline_message_comes_with_the_three_streams_and_a_memfd_one_with_four() {
        let inline = inline_run_message(PLAN_MESSAGE, b"{}").unwrap();
        let parsed = parse_run_message(PLAN_MESSAGE, &inline).unwrap();
        assert_eq!(parsed.descriptors(), 3);
        assert_eq!(
            parse_run_message(PLAN_MESSAGE, PLAN_MESSAGE)
                .unwrap()
                .descriptors(),
            4
        );
    }
}

//! The event stream of a run: every [`AuditEvent`] as one JSON line,
//! stamped with the time, the run id, the profile and the command hash,
//! written as it happens.
//!
//! Why one writer type: the CLI's `--events` file, its stderr, and any
//! JSON-lines log the server keeps must carry the same line format, and
//! each line must reach the file the moment it is decided (a network
//! decision during a run that lasts days, or a `kill -9` of corral, must
//! not lose what was already decided).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use corral_policy::AuditEvent;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Longest line written (bytes, newline included). A longer event keeps its
/// stamp, kind, level and code; its message is cut and its fields dropped
/// (`"truncated": true`), so one event can never hold much of corral's
/// memory or of the log.
pub const MAX_EVENT_LINE: usize = 16 * 1024;

/// Receives audit events as they arise, from any of corral's threads (the
/// launcher's, and the egress proxy's for network decisions).
pub trait EventSink: Send + Sync {
    /// Takes one event; must not block for long (the proxy waits on it).
    fn emit(&self, event: &AuditEvent);
}

/// Discards every event (front ends that only want them in the result).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn emit(&self, _event: &AuditEvent) {}
}

/// What every line of one run carries besides the event itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunStamp {
    /// The run's id: 24 hex digits (the server's execution id, or a fresh
    /// random one for `corral run`).
    pub run_id: String,
    /// The profile's name.
    pub profile: String,
    /// [`command_sha256`] of the argv, written as `command_sha256`.
    #[serde(rename = "command_sha256")]
    command: CommandHash,
}

impl RunStamp {
    /// The stamp of a run of `argv` under `profile` with id `run_id`.
    pub fn new(run_id: String, profile: &str, argv: &[String]) -> RunStamp {
        RunStamp {
            run_id,
            profile: profile.to_string(),
            command: CommandHash {
                argv: argv.to_vec(),
                hex: std::sync::OnceLock::new(),
            },
        }
    }

    /// [`command_sha256`] of the run's argv.
    pub fn command_sha256(&self) -> &str {
        self.command.hex()
    }
}

/// An argv's [`command_sha256`], computed when a line first needs it: a
/// `corral run` that writes no event line never hashes (the SHA-256
/// implementation's CPU feature probe alone is two `CPUID` instructions,
/// each a trap to the hypervisor in a VM; issue 17).
#[derive(Debug, Clone)]
struct CommandHash {
    argv: Vec<String>,
    hex: std::sync::OnceLock<String>,
}

/// Equal when the argv is: whether the hash was computed yet does not
/// count.
impl PartialEq for CommandHash {
    fn eq(&self, other: &CommandHash) -> bool {
        self.argv == other.argv
    }
}

impl Eq for CommandHash {}

impl CommandHash {
    fn hex(&self) -> &str {
        self.hex.get_or_init(|| command_sha256(&self.argv))
    }
}

impl Serialize for CommandHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.hex())
    }
}

/// SHA-256 (hex) of the argv encoded as a JSON array of strings: unlike
/// the arguments joined by spaces, `["a b"]` and `["a", "b"]` differ.
pub fn command_sha256(argv: &[String]) -> String {
    // A list of strings always serialises.
    let encoded = serde_json::to_vec(argv).unwrap_or_default();
    hex(&Sha256::digest(&encoded))
}

/// `bytes` as lowercase hex digits, two per byte, into one allocation
/// (a `format!` per byte cost more than the hash it prints).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// A fresh run id: 12 bytes from the kernel's random source as 24 hex
/// digits, the form of the server's execution ids.
pub fn new_run_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(hex(&bytes))
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g.
/// `2026-11-23T23:30:05.123Z`. Written by hand: the civil date from the
/// day count (Howard Hinnant's `civil_from_days`), no date crate needed.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// One line as written: the stamp, then the event's own fields.
#[derive(Serialize)]
struct Line<'a> {
    ts: &'a str,
    #[serde(flatten)]
    stamp: &'a RunStamp,
    #[serde(flatten)]
    event: &'a AuditEvent,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// Where an [`EventWriter`] writes.
enum Target {
    /// An append-only file (`--events FILE`, a server's log).
    File(File),
    /// corral's stderr.
    Stderr,
}

/// The line writer: stamps each event, serialises it once, and writes it
/// with one `write` (no user-space buffer, so a line is in the file, or
/// in the pipe, before `emit` returns; `O_APPEND` keeps concurrent
/// writers' lines whole). Lines are at most [`MAX_EVENT_LINE`] bytes and
/// nothing is queued, so its memory is bounded. Safe to share between
/// threads.
pub struct EventWriter {
    stamp: RunStamp,
    target: Mutex<Target>,
    /// Also write lifecycle (`run.*`) events; off for stderr, where they
    /// would clutter a terminal.
    lifecycle: bool,
}

impl EventWriter {
    /// Appends to `path` (created with mode 0600 when missing), every kind
    /// of event.
    pub fn append_to(path: &Path, stamp: RunStamp) -> std::io::Result<EventWriter> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(EventWriter {
            stamp,
            target: Mutex::new(Target::File(file)),
            lifecycle: true,
        })
    }

    /// Writes security events (not the `run.*` lifecycle ones) to stderr.
    pub fn stderr(stamp: RunStamp) -> EventWriter {
        EventWriter {
            stamp,
            target: Mutex::new(Target::Stderr),
            lifecycle: false,
        }
    }

    /// This writer, shareable with the proxy's thread.
    pub fn shared(self) -> Arc<dyn EventSink> {
        Arc::new(self)
    }

    /// The stamped line for `event`, newline included, at most
    /// [`MAX_EVENT_LINE`] bytes.
    pub fn line(&self, event: &AuditEvent, at: SystemTime) -> String {
        let ts = rfc3339(at);
        let mut line = Line {
            ts: &ts,
            stamp: &self.stamp,
            event,
            truncated: false,
        }
        .encode();
        if line.len() >= MAX_EVENT_LINE {
            let mut short = AuditEvent::new(event.level, event.code, String::new());
            short.event = event.event;
            // An escaped character takes at most 6 bytes (`\u0001`).
            short.message = cut(&event.message, MAX_EVENT_LINE / 8);
            line = Line {
                ts: &ts,
                stamp: &self.stamp,
                event: &short,
                truncated: true,
            }
            .encode();
        }
        line.push('\n');
        line
    }
}

impl Line<'_> {
    fn encode(&self) -> String {
        // Strings, numbers and JSON values always serialise.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl EventSink for EventWriter {
    fn emit(&self, event: &AuditEvent) {
        if !self.lifecycle && event.code.is_lifecycle() {
            return;
        }
        let line = self.line(event, SystemTime::now());
        let mut target = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        let written = match &mut *target {
            Target::File(f) => f.write_all(line.as_bytes()),
            Target::Stderr => std::io::stderr().write_all(line.as_bytes()),
        };
        if let Err(e) = written {
            // The event must not be lost: say why, and put it on stderr.
            if matches!(*target, Target::File(_)) {
                let mut err = std::io::stderr();
                let _ = writeln!(err, "corral: cannot write an event to the events file: {e}");
                let _ = err.write_all(line.as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use corral_policy::{Level, ReasonCode};
    use std::time::Duration;

    #[test]
    fn rfc3339_matches_known_dates() {
        let at = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_796_081_405, 123)), "2026-11-30T23:30:05.123Z");
        assert_eq!(rfc3339(at(4_107_542_399, 999)), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let by_format: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), by_format);
        assert_eq!(hex(&[]), "");
        let id = new_run_id().unwrap();
        assert_eq!(id.len(), 24);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn command_hash_keeps_argument_boundaries() {
        let a = command_sha256(&["a b".into()]);
        let b = command_sha256(&["a".into(), "b".into()]);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        // sha256 of `["a"]`, computed independently with sha256sum.
        assert_eq!(
            command_sha256(&["a".into()]),
            "0eb5b8d6f81bc677da8a08567cc4fa9a06a57e9ec8da85ed73a7f62727996002"
        );
    }

    #[test]
    fn lines_are_stamped_flushed_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let stamp = RunStamp::new("00ff".into(), "code", &["true".into()]);
        let w = EventWriter::append_to(&path, stamp.clone()).unwrap();
        w.emit(&AuditEvent::new(Level::Info, ReasonCode::RunStart, "start"));
        // On disk as soon as emit returns, without dropping the writer.
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["run_id"], "00ff");
        assert_eq!(v["profile"], "code");
        assert_eq!(v["command_sha256"], stamp.command_sha256());
        assert_eq!(v["event"], "run");
        assert_eq!(v["code"], "run.start");
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        let huge = AuditEvent::new(Level::Warn, ReasonCode::EnvBlocked, "\u{1}".repeat(100_000))
            .with("name", "y".repeat(100_000));
        let line = w.line(&huge, SystemTime::now());
        assert!(line.len() <= MAX_EVENT_LINE, "{}", line.len());
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(
            (v["truncated"].as_bool(), v["code"].as_str()),
            (Some(true), Some("env.blocked"))
        );
        assert!(v.get("fields").is_none());
    }
}

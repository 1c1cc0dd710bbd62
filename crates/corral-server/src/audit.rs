//! The audit store: one record per execution in SQLite (WAL, survives
//! restarts, old records pruned), optionally mirrored as JSON lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use corral_policy::server::AuditOutputs;

use crate::auth::sha256_hex;
use crate::exec::{ExecutionResponse, RunOutcome};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// SQLite failed.
    #[error("sqlite {path}: {source}")]
    Sqlite {
        /// Database path.
        path: String,
        /// The error.
        source: rusqlite::Error,
    },
    /// The JSON-lines file failed.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The store's lock was poisoned by a panic elsewhere.
    #[error("audit store lock poisoned")]
    Poisoned,
    /// The result could not be serialised.
    #[error("encoding the result: {0}")]
    Encode(#[source] serde_json::Error),
}

/// One execution's audit record, as the JSON-lines file has it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRecord {
    /// Execution id.
    pub id: String,
    /// Tenant name.
    pub tenant: String,
    /// Profile name.
    pub profile: String,
    /// SHA-256 of the code or command line.
    pub code_sha256: String,
    /// The code itself, when the server stores it.
    pub code: Option<String>,
    /// Start, ms since the epoch.
    pub started_ms: u64,
    /// End, ms since the epoch.
    pub finished_ms: u64,
    /// The whole result object as returned to the caller (exit, signal,
    /// timed_out, truncation, OOM, bytes, enforced layers, security
    /// events), serialised once.
    pub result: Box<RawValue>,
    /// The exit status (an indexed column of its own).
    #[serde(skip)]
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it (a column of its own).
    #[serde(skip)]
    pub timed_out: bool,
    /// Whether the OOM killer acted (a column of its own).
    #[serde(skip)]
    pub oom_killed: bool,
}

impl AuditRecord {
    /// The record of an answered execution: its answer with the outputs
    /// reduced as `keep` says (see [`bounded_result`]), serialised here,
    /// and the columns read from it.
    pub fn of(
        response: &ExecutionResponse,
        keep: OutputKeeping,
        code_sha256: String,
        code: Option<String>,
        started_ms: u64,
        finished_ms: u64,
    ) -> Result<AuditRecord, AuditError> {
        let (timed_out, oom_killed) = match &response.outcome {
            RunOutcome::Ran(r) => (r.timed_out, r.oom_killed),
            RunOutcome::Refused(_) => (false, false),
        };
        Ok(AuditRecord {
            id: response.id.clone(),
            tenant: response.tenant.clone(),
            profile: response.profile.clone(),
            code_sha256,
            code,
            started_ms,
            finished_ms,
            result: bounded_result(response, keep)?,
            exit_code: Some(response.exit_code()),
            timed_out,
            oom_killed,
        })
    }
}

/// What a record keeps of outputs: `[server] audit_outputs` and
/// `audit_output_max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputKeeping {
    /// Digests only, or digests and text.
    pub mode: AuditOutputs,
    /// With [`AuditOutputs::Full`], the bytes kept of each stream or file.
    pub max_bytes: u64,
}

impl OutputKeeping {
    /// The keeping the `[server]` section asks for.
    pub fn of(server: &corral_policy::server::ServerConfig) -> OutputKeeping {
        OutputKeeping {
            mode: server.audit_outputs,
            max_bytes: server.audit_output_max_bytes,
        }
    }
}

/// The answer as an audit record stores it: the same object, except that
/// `stdout`, `stderr` and each output file's `content` are replaced by
/// their SHA-256 (`stdout_sha256`, `stderr_sha256`, a file's `sha256`, of
/// the bytes the caller got: a base64 file's decoded bytes) and, for
/// files, `bytes`. With [`AuditOutputs::Full`] the text stays too, cut
/// at `max_bytes` on a character boundary, and `stdout_audit_truncated`
/// (`stderr_…`, a file's `audit_truncated`) says whether it was cut. A
/// record's size is then bounded by the request, not by what the program
/// printed: the byte counts the answer already carries (`stdout_bytes`…)
/// stay as they are.
pub fn bounded_result(
    response: &ExecutionResponse,
    keep: OutputKeeping,
) -> Result<Box<RawValue>, AuditError> {
    use serde_json::Value;
    let mut value = serde_json::to_value(response).map_err(AuditError::Encode)?;
    let full = keep.mode == AuditOutputs::Full;
    let cap = usize::try_from(keep.max_bytes).unwrap_or(usize::MAX);
    if let Value::Object(map) = &mut value {
        for stream in ["stdout", "stderr"] {
            let Some(Value::String(text)) = map.remove(stream) else {
                continue;
            };
            map.insert(
                format!("{stream}_sha256"),
                Value::String(sha256_hex(text.as_bytes())),
            );
            if full {
                let (kept, cut) = cut_at(text, cap);
                map.insert(stream.to_string(), Value::String(kept));
                map.insert(format!("{stream}_audit_truncated"), Value::Bool(cut));
            }
        }
        if let Some(Value::Array(files)) = map.get_mut("outputs") {
            for file in files.iter_mut().filter_map(Value::as_object_mut) {
                let Some(Value::String(content)) = file.remove("content") else {
                    continue;
                };
                let base64 = file.get("encoding").and_then(Value::as_str) == Some("base64");
                let decoded = base64.then(|| crate::base64::decode(&content)).flatten();
                let bytes = decoded.as_deref().unwrap_or(content.as_bytes());
                file.insert("sha256".into(), Value::String(sha256_hex(bytes)));
                file.insert("bytes".into(), Value::from(bytes.len()));
                if full {
                    let (kept, cut) = cut_at(content, cap);
                    file.insert("content".into(), Value::String(kept));
                    file.insert("audit_truncated".into(), Value::Bool(cut));
                }
            }
        }
    }
    serde_json::value::to_raw_value(&value).map_err(AuditError::Encode)
}

/// `text` cut to at most `max` bytes on a character boundary, and whether
/// it was cut.
fn cut_at(mut text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// One event of the supervisor, as stored.
#[derive(Debug, Clone, Serialize)]
pub struct EventRecord {
    /// Always `event`: tells these lines from execution records in the
    /// JSON-lines file.
    pub kind: &'static str,
    /// When, ms since the epoch.
    pub ts_ms: u64,
    /// Tenant (`*` for a shared process).
    pub tenant: String,
    /// Supervised server.
    pub server: String,
    /// MCP session, when one is concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Stable reason code (`mcp.call`, `net.denied`, ...).
    pub code: String,
    /// The event itself (level, message, fields), as its source wrote it.
    pub event: serde_json::Value,
}

/// One line of `GET /v1/executions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ExecutionSummary {
    /// Execution id.
    pub id: String,
    /// Profile name.
    pub profile: String,
    /// Start, ms since the epoch.
    pub started_ms: i64,
    /// End, ms since the epoch.
    pub finished_ms: i64,
    /// The exit status.
    pub exit_code: Option<i64>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Whether the OOM killer acted.
    pub oom_killed: bool,
}

/// The store.
pub struct AuditStore {
    db: Mutex<Connection>,
    path: String,
    jsonl: Option<(Mutex<File>, PathBuf)>,
    retention_days: u32,
}

/// Opens the JSON-lines file for appending (mode 0600 when created).
fn open_append(p: &Path) -> Result<File, AuditError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(p)
        .map_err(|source| AuditError::Io {
            path: p.display().to_string(),
            source,
        })
}

fn sqlite(path: &str) -> impl Fn(rusqlite::Error) -> AuditError + '_ {
    move |source| AuditError::Sqlite {
        path: path.to_string(),
        source,
    }
}

/// How long a write waits for another connection's lock on the database
/// before it fails (and the record is logged as not stored).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl AuditStore {
    /// Opens (creating) the database and prunes records older than
    /// `retention_days`.
    pub fn open(
        db: &Path,
        jsonl: Option<&Path>,
        retention_days: u32,
    ) -> Result<AuditStore, AuditError> {
        let path = db.display().to_string();
        // The records hold what programs printed and the code they ran:
        // the files are the server user's alone (SQLite gives its -wal and
        // -shm files the database's mode).
        for file in [db.to_path_buf(), sidecar(db, "-wal"), sidecar(db, "-shm")] {
            let create = file == db;
            private_file(&file, create).map_err(|source| AuditError::Io {
                path: file.display().to_string(),
                source,
            })?;
        }
        let conn = Connection::open(db).map_err(sqlite(&path))?;
        // Another process may hold the database's write lock for a moment
        // (a second server on the same file while one hands over to the
        // other, an operator's `sqlite3`): wait for it rather than lose the
        // record. rusqlite's default today; said here so that it stays.
        conn.busy_timeout(BUSY_WAIT).map_err(sqlite(&path))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite(&path))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sqlite(&path))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS executions (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                profile TEXT NOT NULL,
                code_sha256 TEXT NOT NULL,
                code TEXT,
                started_ms INTEGER NOT NULL,
                finished_ms INTEGER NOT NULL,
                exit_code INTEGER,
                timed_out INTEGER NOT NULL,
                oom_killed INTEGER NOT NULL,
                result TEXT NOT NULL
            );
            CREATE INDEX IF NOT EXISTS executions_tenant ON executions (tenant, started_ms);
            CREATE TABLE IF NOT EXISTS events (
                ts_ms INTEGER NOT NULL,
                tenant TEXT NOT NULL,
                server TEXT NOT NULL,
                code TEXT NOT NULL,
                event TEXT NOT NULL
            );
            CREATE INDEX IF NOT EXISTS events_server ON events (server, ts_ms);",
        )
        .map_err(sqlite(&path))?;
        let jsonl = match jsonl {
            Some(p) => {
                private_file(p, true).map_err(|source| AuditError::Io {
                    path: p.display().to_string(),
                    source,
                })?;
                Some((Mutex::new(open_append(p)?), p.to_path_buf()))
            }
            None => None,
        };
        let store = AuditStore {
            db: Mutex::new(conn),
            path,
            jsonl,
            retention_days,
        };
        store.prune(now_ms())?;
        Ok(store)
    }

    /// Applies the retention as of `now_ms`: deletes the records and events
    /// older than `retention_days` from the database and rewrites the
    /// JSON-lines file without them. Runs at start-up and then hourly
    /// while the server runs, so a long-running server's store does not
    /// grow without end.
    pub fn prune(&self, now_ms: u64) -> Result<(), AuditError> {
        let cutoff = now_ms.saturating_sub(u64::from(self.retention_days) * 86_400_000);
        let cutoff_sql = i64::try_from(cutoff).unwrap_or(i64::MAX);
        {
            let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
            for table in [
                "DELETE FROM executions WHERE finished_ms < ?1",
                "DELETE FROM events WHERE ts_ms < ?1",
            ] {
                db.execute(table, params![cutoff_sql])
                    .map_err(sqlite(&self.path))?;
            }
        }
        if let Some((file, p)) = &self.jsonl {
            // Writers wait while the file is rewritten; the handle is then
            // reopened on the new file.
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            let io = |source| AuditError::Io {
                path: p.display().to_string(),
                source,
            };
            if prune_jsonl(p, cutoff).map_err(io)? {
                *f = open_append(p)?;
            }
        }
        Ok(())
    }

    /// Stores a record (and appends it to the JSON-lines file).
    pub fn record(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        {
            let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
            // Prepared once per connection (rusqlite's statement cache):
            // parsing and planning the statement cost more than the row.
            db.prepare_cached(
                "INSERT OR REPLACE INTO executions (id, tenant, profile, code_sha256, code, started_ms, finished_ms, exit_code, timed_out, oom_killed, result)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )
            .and_then(|mut insert| insert.execute(params![
                    rec.id,
                    rec.tenant,
                    rec.profile,
                    rec.code_sha256,
                    rec.code,
                    i64::try_from(rec.started_ms).unwrap_or(i64::MAX),
                    i64::try_from(rec.finished_ms).unwrap_or(i64::MAX),
                    rec.exit_code,
                    rec.timed_out,
                    rec.oom_killed,
                    rec.result.get(),
                ]))
            .map_err(sqlite(&self.path))?;
        }
        if let Some((file, path)) = &self.jsonl {
            let line = serde_json::to_string(rec).map_err(AuditError::Encode)?;
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            writeln!(f, "{line}").map_err(|source| AuditError::Io {
                path: path.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// Stores one supervisor event (`mcp.*`, or an event of a supervised
    /// server's sandbox) and appends it to the JSON-lines file as
    /// `{"kind":"event", ...}`.
    pub fn record_event(&self, ev: &EventRecord) -> Result<(), AuditError> {
        let line = serde_json::to_string(ev).map_err(AuditError::Encode)?;
        {
            let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
            db.prepare_cached(
                "INSERT INTO events (ts_ms, tenant, server, code, event) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut insert| insert.execute(params![
                    i64::try_from(ev.ts_ms).unwrap_or(i64::MAX),
                    ev.tenant,
                    ev.server,
                    ev.code,
                    line,
                ]))
            .map_err(sqlite(&self.path))?;
        }
        if let Some((file, path)) = &self.jsonl {
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            writeln!(f, "{line}").map_err(|source| AuditError::Io {
                path: path.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// One record's stored result, exactly as it was answered, if it
    /// belongs to `tenant`.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<Box<RawValue>>, AuditError> {
        let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
        let row: Option<String> = db
            .query_row(
                "SELECT result FROM executions WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite(&self.path))?;
        Ok(row.and_then(|s| RawValue::from_string(s).ok()))
    }

    /// A page of `tenant`'s records, newest first, optionally only those
    /// with a given profile.
    pub fn list(
        &self,
        tenant: &str,
        profile: Option<&str>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<ExecutionSummary>, AuditError> {
        let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
        let mut stmt = db
            .prepare(
                "SELECT id, profile, started_ms, finished_ms, exit_code, timed_out, oom_killed FROM executions
                 WHERE tenant = ?1 AND (?2 IS NULL OR profile = ?2)
                 ORDER BY started_ms DESC, id LIMIT ?3 OFFSET ?4",
            )
            .map_err(sqlite(&self.path))?;
        let rows = stmt
            .query_map(params![tenant, profile, limit, offset], |r| {
                Ok(ExecutionSummary {
                    id: r.get(0)?,
                    profile: r.get(1)?,
                    started_ms: r.get(2)?,
                    finished_ms: r.get(3)?,
                    exit_code: r.get(4)?,
                    timed_out: r.get(5)?,
                    oom_killed: r.get(6)?,
                })
            })
            .map_err(sqlite(&self.path))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sqlite(&self.path))
    }
}

/// `<db>-wal`, `<db>-shm`: SQLite's files next to the database.
fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes `path` a file only its owner can read and write (mode 0600):
/// created so when `create` and missing, tightened when it exists with
/// more (a store made by an older corral under a lax umask).
fn private_file(path: &Path, create: bool) -> std::io::Result<()> {
    let opened = OpenOptions::new()
        .read(true)
        .create(create)
        .append(create)
        .mode(0o600)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(mode & !0o077))?;
    }
    Ok(())
}

/// Applies the retention to the JSON-lines file: drops the records whose
/// `finished_ms` (events: `ts_ms`) is before `cutoff`, by writing the
/// others to a new file (mode 0600) that replaces it. Lines that are
/// neither (not JSON, no time) are kept. Nothing is rewritten when nothing
/// is old; the answer says whether the file was replaced.
fn prune_jsonl(path: &Path, cutoff: u64) -> std::io::Result<bool> {
    use std::io::{BufRead, BufReader, BufWriter};
    /// The one field retention looks at; the rest of a line is ignored.
    #[derive(Deserialize)]
    struct Finished {
        finished_ms: Option<u64>,
        ts_ms: Option<u64>,
    }
    let old = |line: &str| {
        serde_json::from_str::<Finished>(line)
            .ok()
            .and_then(|f| f.finished_ms.or(f.ts_ms))
            .is_some_and(|t| t < cutoff)
    };
    let reader = || File::open(path).map(BufReader::new);
    let mut any_old = false;
    for line in reader()?.split(b'\n') {
        if old(&String::from_utf8_lossy(&line?)) {
            any_old = true;
            break;
        }
    }
    if !any_old {
        return Ok(false);
    }
    let tmp = sidecar(path, &format!(".prune-{}", std::process::id()));
    let result = (|| {
        let mut out = BufWriter::new(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?,
        );
        for line in reader()?.split(b'\n') {
            let line = line?;
            if !old(&String::from_utf8_lossy(&line)) {
                out.write_all(&line)?;
                out.write_all(b"\n")?;
            }
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record whose result is `result` (JSON text).
    fn record(id: &str, tenant: &str, finished_ms: u64, result: &str) -> AuditRecord {
        AuditRecord {
            id: id.into(),
            tenant: tenant.into(),
            profile: "code".into(),
            code_sha256: "00".repeat(32),
            code: None,
            started_ms: finished_ms,
            finished_ms,
            result: RawValue::from_string(result.into()).unwrap(),
            exit_code: Some(3),
            timed_out: false,
            oom_killed: false,
        }
    }

    #[test]
    fn records_survive_reopening_and_stay_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let jsonl = dir.path().join("audit.jsonl");
        let rec = record("e1", "acme", now_ms(), r#"{"exit_code":3,"stdout":"x"}"#);
        AuditStore::open(&db, Some(&jsonl), 30)
            .unwrap()
            .record(&rec)
            .unwrap();
        let store = AuditStore::open(&db, None, 30).unwrap();
        // The stored result is the answer's text, byte for byte.
        assert_eq!(
            store.get("acme", "e1").unwrap().unwrap().get(),
            r#"{"exit_code":3,"stdout":"x"}"#
        );
        let listed = store.list("acme", None, 10, 0).unwrap();
        assert_eq!(
            (listed[0].id.as_str(), listed[0].exit_code),
            ("e1", Some(3))
        );
        assert!(
            store.get("other", "e1").unwrap().is_none(),
            "tenants never see each other's records"
        );
        assert_eq!(store.list("acme", None, 10, 0).unwrap().len(), 1);
        assert_eq!(store.list("acme", Some("strict"), 10, 0).unwrap().len(), 0);
        let line = std::fs::read_to_string(&jsonl).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(
            (v["id"].as_str(), v["result"]["stdout"].as_str()),
            (Some("e1"), Some("x"))
        );
        assert!(
            v.get("exit_code").is_none(),
            "columns stay out of the line: {v}"
        );
    }

    /// An answer of a program that printed `stdout` and `stderr` and left
    /// one base64 output file holding `file`.
    fn ran(stdout: &str, stderr: &str, file: &[u8]) -> ExecutionResponse {
        use crate::exec::{Ceilings, Encoding, OutputFile, Outputs, OutputsStatus};
        let (encoding, content) = Encoding::encode(file.to_vec());
        ExecutionResponse {
            id: "cd".repeat(12),
            tenant: "t".into(),
            profile: "code".into(),
            limits: Ceilings::of(&corral_policy::builtin::code()),
            cancelled: false,
            outcome: RunOutcome::Ran(Box::new(corral_launcher::RunResult {
                exit_code: 0,
                signal: None,
                timed_out: false,
                oom_killed: false,
                output_limit_exceeded: false,
                limits_hit: Vec::new(),
                stdout: stdout.into(),
                stderr: stderr.into(),
                stdout_bytes: stdout.len() as u64,
                stderr_bytes: stderr.len() as u64,
                stdout_truncated: false,
                stderr_truncated: false,
                wall_ms: 1,
                cpu_ms: 1,
                peak_memory_bytes: 1,
                error: None,
                events: Vec::new(),
                enforced: None,
            })),
            outputs: Some(Outputs {
                outputs: vec![OutputFile {
                    path: "out.bin".into(),
                    encoding,
                    content,
                }],
                status: OutputsStatus::Collected(false),
            }),
        }
    }

    #[test]
    fn records_keep_digests_of_outputs_not_the_outputs() {
        let big = "\u{1}".repeat(1 << 20);
        let file = [0xffu8; 3000];
        let answer = ran(&big, "warn\n", &file);
        let keep = OutputKeeping {
            mode: AuditOutputs::Digest,
            max_bytes: 64,
        };
        let raw = bounded_result(&answer, keep).unwrap();
        // A megabyte of control bytes (six megabytes escaped) leaves a
        // record of a few hundred bytes.
        assert!(raw.get().len() < 2048, "{} bytes", raw.get().len());
        let v: serde_json::Value = serde_json::from_str(raw.get()).unwrap();
        assert!(
            v.get("stdout").is_none() && v.get("stderr").is_none(),
            "{v}"
        );
        assert_eq!(v["stdout_sha256"], sha256_hex(big.as_bytes()));
        assert_eq!(v["stderr_sha256"], sha256_hex(b"warn\n"));
        assert_eq!(v["stdout_bytes"], 1 << 20, "the answer's counts stay");
        let f = &v["outputs"][0];
        assert!(f.get("content").is_none(), "{f}");
        assert_eq!(
            (
                f["sha256"].as_str(),
                f["bytes"].as_u64(),
                f["path"].as_str()
            ),
            (
                Some(sha256_hex(&file).as_str()),
                Some(3000),
                Some("out.bin")
            ),
            "the digest is of the file's bytes, not of its base64"
        );
    }

    #[test]
    fn full_records_keep_text_up_to_the_cap_on_a_character_boundary() {
        let answer = ran("ééééé", "ok", b"text file");
        let keep = OutputKeeping {
            mode: AuditOutputs::Full,
            max_bytes: 5,
        };
        let v: serde_json::Value =
            serde_json::from_str(bounded_result(&answer, keep).unwrap().get()).unwrap();
        assert_eq!(
            (v["stdout"].as_str(), v["stdout_audit_truncated"].as_bool()),
            (Some("éé"), Some(true)),
            "{v}"
        );
        assert_eq!(
            (v["stderr"].as_str(), v["stderr_audit_truncated"].as_bool()),
            (Some("ok"), Some(false))
        );
        assert_eq!(v["stdout_sha256"], sha256_hex("ééééé".as_bytes()));
        let f = &v["outputs"][0];
        assert_eq!(
            (f["content"].as_str(), f["audit_truncated"].as_bool()),
            (Some("text "), Some(true)),
            "{f}"
        );
    }

    #[test]
    fn retention_applies_while_the_store_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let jsonl = dir.path().join("audit.jsonl");
        let store = AuditStore::open(&db, Some(&jsonl), 1).unwrap();
        let day = 86_400_000;
        let now = now_ms();
        store.record(&record("early", "t", now, "{}")).unwrap();
        store.record(&record("late", "t", now + day, "{}")).unwrap();
        // Two days on, the first record is more than a day old.
        store.prune(now + 2 * day - 1000).unwrap();
        assert!(store.get("t", "early").unwrap().is_none());
        assert!(store.get("t", "late").unwrap().is_some());
        // The file was rewritten, and later records land in the new one.
        store
            .record(&record("after", "t", now + 2 * day, "{}"))
            .unwrap();
        let ids: Vec<String> = std::fs::read_to_string(&jsonl)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
            .collect();
        assert_eq!(ids, ["\"late\"", "\"after\""]);
    }

    #[test]
    fn old_records_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let store = AuditStore::open(&db, None, 1).unwrap();
        let old = record("old", "t", 1, "{}");
        store.record(&old).unwrap();
        drop(store);
        let store = AuditStore::open(&db, None, 1).unwrap();
        assert!(store.get("t", "old").unwrap().is_none());
    }

    #[test]
    fn the_json_lines_file_keeps_the_same_retention() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let jsonl = dir.path().join("audit.jsonl");
        let now = now_ms();
        let day = 86_400_000;
        let line = |id: &str, finished: u64| {
            format!("{{\"id\":\"{id}\",\"finished_ms\":{finished},\"result\":{{}}}}\n")
        };
        let kept = [
            line("recent", now - day / 2),
            "not a record\n".to_string(),
            line("fresh", now),
        ];
        let text = [line("old", now - 3 * day), kept[0].clone(), kept[1].clone()].concat()
            + &line("older", now - 40 * day)
            + &kept[2];
        std::fs::write(&jsonl, text).unwrap();
        drop(AuditStore::open(&db, Some(&jsonl), 1).unwrap());
        assert_eq!(std::fs::read_to_string(&jsonl).unwrap(), kept.concat());
        // Nothing old: the file is left as it is.
        let before = std::fs::metadata(&jsonl).unwrap();
        drop(AuditStore::open(&db, Some(&jsonl), 1).unwrap());
        let after = std::fs::metadata(&jsonl).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&before),
            std::os::unix::fs::MetadataExt::ino(&after)
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("prune"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let jsonl = dir.path().join("audit.jsonl");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let store = AuditStore::open(&db, Some(&jsonl), 30).unwrap();
        let rec = record("e", "t", now_ms(), "{}");
        store.record(&rec).unwrap();
        for p in [
            db.clone(),
            sidecar(&db, "-wal"),
            sidecar(&db, "-shm"),
            jsonl.clone(),
        ] {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        drop(store);
        // A store left readable by an older corral is tightened.
        for p in [&db, &jsonl] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        drop(AuditStore::open(&db, Some(&jsonl), 30).unwrap());
        assert_eq!((mode(&db), mode(&jsonl)), (0o600, 0o600));
    }
}

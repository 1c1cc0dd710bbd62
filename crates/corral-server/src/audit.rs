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
    /// The record of an answered execution: its answer, serialised here,
    /// and the columns read from it.
    pub fn of(
        response: &ExecutionResponse,
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
            result: serde_json::value::to_raw_value(response).map_err(AuditError::Encode)?,
            exit_code: Some(response.exit_code()),
            timed_out,
            oom_killed,
        })
    }
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
    jsonl: Option<(Mutex<File>, String)>,
}

fn sqlite(path: &str) -> impl Fn(rusqlite::Error) -> AuditError + '_ {
    move |source| AuditError::Sqlite {
        path: path.to_string(),
        source,
    }
}

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
        let cutoff = now_ms().saturating_sub(u64::from(retention_days) * 86_400_000);
        for table in [
            "DELETE FROM executions WHERE finished_ms < ?1",
            "DELETE FROM events WHERE ts_ms < ?1",
        ] {
            conn.execute(table, params![i64::try_from(cutoff).unwrap_or(i64::MAX)])
                .map_err(sqlite(&path))?;
        }
        let jsonl = match jsonl {
            Some(p) => {
                let io = |source| AuditError::Io {
                    path: p.display().to_string(),
                    source,
                };
                private_file(p, true).map_err(io)?;
                prune_jsonl(p, cutoff).map_err(io)?;
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(p)
                    .map_err(io)?;
                Some((Mutex::new(f), p.display().to_string()))
            }
            None => None,
        };
        Ok(AuditStore {
            db: Mutex::new(conn),
            path,
            jsonl,
        })
    }

    /// Stores a record (and appends it to the JSON-lines file).
    pub fn record(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        {
            let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
            db.execute(
                "INSERT OR REPLACE INTO executions (id, tenant, profile, code_sha256, code, started_ms, finished_ms, exit_code, timed_out, oom_killed, result)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
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
                ],
            )
            .map_err(sqlite(&self.path))?;
        }
        if let Some((file, path)) = &self.jsonl {
            let line = serde_json::to_string(rec).map_err(AuditError::Encode)?;
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            writeln!(f, "{line}").map_err(|source| AuditError::Io {
                path: path.clone(),
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
            db.execute(
                "INSERT INTO events (ts_ms, tenant, server, code, event) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    i64::try_from(ev.ts_ms).unwrap_or(i64::MAX),
                    ev.tenant,
                    ev.server,
                    ev.code,
                    line,
                ],
            )
            .map_err(sqlite(&self.path))?;
        }
        if let Some((file, path)) = &self.jsonl {
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            writeln!(f, "{line}").map_err(|source| AuditError::Io {
                path: path.clone(),
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
/// neither (not JSON, no time) are kept. Nothing is rewritten when nothing is old.
fn prune_jsonl(path: &Path, cutoff: u64) -> std::io::Result<()> {
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
        return Ok(());
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
    result
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

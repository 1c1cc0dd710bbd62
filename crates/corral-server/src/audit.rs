//! The audit store: one record per execution in SQLite (WAL, survives
//! restarts, old records pruned), optionally mirrored as JSON lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

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
}

/// One execution's audit record.
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
    /// timed_out, truncation, OOM, bytes, enforced layers, security events).
    pub result: serde_json::Value,
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
            CREATE INDEX IF NOT EXISTS executions_tenant ON executions (tenant, started_ms);",
        )
        .map_err(sqlite(&path))?;
        let cutoff = now_ms().saturating_sub(u64::from(retention_days) * 86_400_000);
        conn.execute(
            "DELETE FROM executions WHERE finished_ms < ?1",
            params![cutoff as i64],
        )
        .map_err(sqlite(&path))?;
        let jsonl = match jsonl {
            Some(p) => {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| AuditError::Io {
                        path: p.display().to_string(),
                        source,
                    })?;
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
        let result = serde_json::to_string(&rec.result).unwrap_or_else(|_| "{}".into());
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
                    rec.started_ms as i64,
                    rec.finished_ms as i64,
                    rec.result["exit_code"].as_i64(),
                    rec.result["timed_out"].as_bool().unwrap_or(false),
                    rec.result["oom_killed"].as_bool().unwrap_or(false),
                    result,
                ],
            )
            .map_err(sqlite(&self.path))?;
        }
        if let Some((file, path)) = &self.jsonl {
            let line = serde_json::to_string(rec).unwrap_or_else(|_| "{}".into());
            let mut f = file.lock().map_err(|_| AuditError::Poisoned)?;
            writeln!(f, "{line}").map_err(|source| AuditError::Io {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// One record's stored result, if it belongs to `tenant`.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<serde_json::Value>, AuditError> {
        let db = self.db.lock().map_err(|_| AuditError::Poisoned)?;
        let row: Option<String> = db
            .query_row(
                "SELECT result FROM executions WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite(&self.path))?;
        Ok(row.and_then(|s| serde_json::from_str(&s).ok()))
    }

    /// A page of `tenant`'s records, newest first, optionally only those
    /// with a given profile.
    pub fn list(
        &self,
        tenant: &str,
        profile: Option<&str>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<serde_json::Value>, AuditError> {
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
                Ok(serde_json::json!({
                    "id": r.get::<_, String>(0)?,
                    "profile": r.get::<_, String>(1)?,
                    "started_ms": r.get::<_, i64>(2)?,
                    "finished_ms": r.get::<_, i64>(3)?,
                    "exit_code": r.get::<_, Option<i64>>(4)?,
                    "timed_out": r.get::<_, bool>(5)?,
                    "oom_killed": r.get::<_, bool>(6)?,
                }))
            })
            .map_err(sqlite(&self.path))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sqlite(&self.path))
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening_and_stay_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let jsonl = dir.path().join("audit.jsonl");
        let rec = AuditRecord {
            id: "e1".into(),
            tenant: "acme".into(),
            profile: "code".into(),
            code_sha256: "00".repeat(32),
            code: None,
            started_ms: now_ms(),
            finished_ms: now_ms(),
            result: serde_json::json!({"exit_code": 3, "timed_out": false, "oom_killed": false}),
        };
        AuditStore::open(&db, Some(&jsonl), 30)
            .unwrap()
            .record(&rec)
            .unwrap();
        let store = AuditStore::open(&db, None, 30).unwrap();
        assert_eq!(store.get("acme", "e1").unwrap().unwrap()["exit_code"], 3);
        assert!(
            store.get("other", "e1").unwrap().is_none(),
            "tenants never see each other's records"
        );
        assert_eq!(store.list("acme", None, 10, 0).unwrap().len(), 1);
        assert_eq!(store.list("acme", Some("strict"), 10, 0).unwrap().len(), 0);
        assert!(std::fs::read_to_string(&jsonl)
            .unwrap()
            .contains("\"id\":\"e1\""));
    }

    #[test]
    fn old_records_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("audit.db");
        let store = AuditStore::open(&db, None, 1).unwrap();
        let old = AuditRecord {
            id: "old".into(),
            tenant: "t".into(),
            profile: "code".into(),
            code_sha256: String::new(),
            code: None,
            started_ms: 1,
            finished_ms: 1,
            result: serde_json::json!({}),
        };
        store.record(&old).unwrap();
        drop(store);
        let store = AuditStore::open(&db, None, 1).unwrap();
        assert!(store.get("t", "old").unwrap().is_none());
    }
}

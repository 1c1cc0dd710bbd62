//! The events `corral run` writes for a supervised process (`--events`:
//! run start and exit, each network decision of its proxy, security
//! decisions), followed while the process runs and stored in the audit
//! trail with the server and tenant they belong to.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::watch;

use super::{Audit, ExitInfo, Owner};

/// Bytes read per poll at most (the file is drained over several polls).
const CHUNK: usize = 1 << 20;

/// Follows `path` until the process has exited and the file is drained,
/// then removes it.
pub async fn follow(
    path: PathBuf,
    mut exit: watch::Receiver<Option<ExitInfo>>,
    owner: Owner,
    audit: Audit,
) {
    let mut offset: u64 = 0;
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let exited = exit.borrow().is_some();
        let drained = read_new(&path, &mut offset, &mut partial, &owner, &audit).await;
        if exited && drained {
            break;
        }
        if drained {
            let _ = tokio::time::timeout(Duration::from_secs(1), exit.changed()).await;
        }
    }
    let _ = tokio::fs::remove_file(&path).await;
}

/// Reads what was appended since `offset`; true when nothing more is
/// there.
async fn read_new(
    path: &PathBuf,
    offset: &mut u64,
    partial: &mut Vec<u8>,
    owner: &Owner,
    audit: &Audit,
) -> bool {
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return true;
    };
    if f.seek(std::io::SeekFrom::Start(*offset)).await.is_err() {
        return true;
    }
    let mut buf = vec![0u8; CHUNK];
    let n = match f.read(&mut buf).await {
        Ok(n) => n,
        Err(_) => return true,
    };
    *offset += n as u64;
    partial.extend_from_slice(&buf[..n]);
    while let Some(i) = partial.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = partial.drain(..=i).collect();
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&line) else {
            continue;
        };
        let code = value
            .get("code")
            .and_then(|c| c.as_str())
            .unwrap_or("sandbox.event")
            .to_string();
        audit.emit_value(owner, code, value).await;
    }
    if partial.len() > CHUNK {
        // Not a line corral writes (they are bounded): forget it.
        partial.clear();
    }
    n < CHUNK
}

//! One execution request: validated into a profile and a command, run in a
//! fresh workspace, recorded, answered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::workspace::{FileLimits, Workspace, WorkspaceError, DEFAULT_RESERVED};
use axum::http::StatusCode;
use corral_launcher::sandbox_identity;
use corral_launcher::HelperStart;
use corral_launcher::{execute, ExecuteOptions};
use corral_launcher::{OutputMode, RunRequest};
use corral_policy::env::EnvRequest;
use corral_policy::{ByteSize, Profile, RunLimit};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::audit::{now_ms, AuditRecord};
use crate::auth::sha256_hex;
use crate::error::ApiError;
use crate::state::AppState;

/// Where programs write files the caller gets back.
pub const OUTPUT_DIR: &str = "output";
/// Largest input file, and all input files together.
pub const MAX_INPUT_BYTES: u64 = 16 << 20;
/// Most output files returned, and their total size.
pub const MAX_OUTPUT_FILES: usize = 64;
/// Total bytes of output files returned.
pub const MAX_OUTPUT_BYTES: u64 = 8 << 20;

/// The body of `POST /v1/executions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    /// Profile (default: the tenant's first).
    pub profile: Option<String>,
    /// A command from the profile's allowlist, with arguments.
    pub command: Option<Vec<String>>,
    /// `python`, `node` or `bash` (code mode only).
    pub language: Option<String>,
    /// The code to run (code mode only).
    pub code: Option<String>,
    /// Standard input.
    pub stdin: Option<String>,
    /// Files written into the workspace first.
    pub files: Option<Vec<InputFile>>,
    /// Limits, at most the profile's.
    pub limits: Option<RequestLimits>,
    /// Environment variables (the blocklist applies).
    pub env: Option<BTreeMap<String, String>>,
}

/// An input file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// Path relative to the workspace.
    pub path: String,
    /// Content.
    pub content: String,
    /// `utf8` (default) or `base64`.
    pub encoding: Option<String>,
}

/// Requested limits; units in the names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    /// Wall-clock limit (rounded up to whole seconds).
    pub timeout_ms: Option<u64>,
    /// Memory, swap included.
    pub memory_bytes: Option<u64>,
    /// Bytes kept per output stream.
    pub output_bytes: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU time (rounded up to whole seconds).
    pub cpu_time_ms: Option<u64>,
}

/// A request turned into what runs.
pub struct Prepared {
    /// The profile with the request's limits applied.
    pub profile: Profile,
    /// argv.
    pub argv: Vec<String>,
    /// The caller's files to write first (path, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// The code file corral writes under the reserved `.corral/` (code mode).
    pub code_file: Option<(String, Vec<u8>)>,
    /// Standard input.
    pub stdin: Option<Vec<u8>>,
    /// Environment to set.
    pub env: Vec<(String, String)>,
    /// What the audit record hashes (and stores when configured).
    pub code: String,
}

fn invalid(code: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
}

/// Validates a request for `tenant`.
pub fn prepare(
    state: &AppState,
    tenant_profiles: &[String],
    req: ExecutionRequest,
) -> Result<Prepared, ApiError> {
    let name = match &req.profile {
        Some(p) => p.clone(),
        None => tenant_profiles
            .first()
            .cloned()
            .unwrap_or_else(|| "code".into()),
    };
    if !tenant_profiles.contains(&name) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "profile.forbidden",
            format!(
                "profile `{name}` is not available to this tenant (available: {})",
                tenant_profiles.join(", ")
            ),
        ));
    }
    let mut profile = state
        .config
        .profile(&name)
        .map_err(|e| ApiError::bad_request("profile.unknown", e.to_string()))?
        .clone();
    apply_limits(&mut profile, req.limits.unwrap_or_default())?;
    let mut files = Vec::new();
    for f in req.files.unwrap_or_default() {
        let data = match f.encoding.as_deref().unwrap_or("utf8") {
            "utf8" => f.content.into_bytes(),
            "base64" => base64_decode(&f.content).ok_or_else(|| {
                ApiError::bad_request(
                    "files.encoding",
                    format!("{}: content is not valid base64", f.path),
                )
            })?,
            other => {
                return Err(ApiError::bad_request(
                    "files.encoding",
                    format!("{}: unknown encoding `{other}` (utf8 or base64)", f.path),
                ))
            }
        };
        files.push((f.path, data));
    }
    let mut code_file = None;
    let (argv, code) = match (req.command, req.language, req.code) {
        (Some(cmd), None, None) => {
            if cmd.is_empty() {
                return Err(ApiError::bad_request(
                    "request.invalid",
                    "`command` is empty",
                ));
            }
            let line = command_text(&cmd);
            (cmd, line)
        }
        (None, Some(lang), Some(code)) => {
            if !state.config.server.code_mode {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "code_mode.disabled",
                    "code mode is off on this server: send a `command`, or enable [server] code_mode",
                ));
            }
            let (interp, file) = match lang.as_str() {
                "python" => ("python3", "main.py"),
                "node" => ("node", "main.js"),
                "bash" => ("bash", "main.sh"),
                other => {
                    return Err(ApiError::bad_request(
                        "language.unknown",
                        format!("unknown language `{other}` (python, node or bash)"),
                    ))
                }
            };
            code_file = Some((format!(".corral/{file}"), code.clone().into_bytes()));
            (vec![interp.to_string(), format!(".corral/{file}")], code)
        }
        _ => {
            return Err(ApiError::bad_request(
                "request.invalid",
                "send either `command` (an array) or `language` and `code`",
            ))
        }
    };
    let env = req.env.unwrap_or_default().into_iter().collect();
    Ok(Prepared {
        profile,
        argv,
        files,
        code_file,
        stdin: req.stdin.map(String::into_bytes),
        env,
        code,
    })
}

/// What the audit record hashes (`code_sha256`) and stores (`code`) for a
/// `command` request: the command as a compact JSON array, as serde_json
/// writes it (`["sh","-c","echo hi"]`). Unlike the arguments joined with
/// spaces it is unambiguous: `["a b"]` and `["a","b"]` differ.
pub fn command_text(argv: &[String]) -> String {
    serde_json::to_string(argv).unwrap_or_default()
}

/// Applies requested limits: each in the range `corral run` and config
/// files accept for the same limit ([`RunLimit::check`], else 422
/// `limits.invalid`) and at most the profile's ceiling (else 422
/// `limits.above_ceiling`). Times in milliseconds are rounded up to whole
/// seconds first.
fn apply_limits(p: &mut Profile, req: RequestLimits) -> Result<(), ApiError> {
    let l = &mut p.limits;
    // `value` and `ceiling` are in the request's unit; `in_limit_unit` is
    // the value in the unit `RunLimit` counts in (seconds for `_ms`).
    let check = |field: &str,
                 limit: RunLimit,
                 value: u64,
                 in_limit_unit: u64,
                 ceiling: Option<u64>|
     -> Result<u64, ApiError> {
        limit.check(in_limit_unit).map_err(|e| {
            // `e` shows the value in the limit's unit: say what was asked
            // when that differs (milliseconds rounded up to seconds).
            let asked = if value == in_limit_unit {
                String::new()
            } else {
                format!(" = {value}")
            };
            invalid(e.code(), format!("limits.{field}{asked}: {e}"))
        })?;
        match ceiling {
            Some(c) if value > c => Err(invalid(
                "limits.above_ceiling",
                format!("limits.{field} = {value} is above this profile's ceiling of {c}; see GET /v1/limits"),
            )),
            _ => Ok(value),
        }
    };
    if let Some(ms) = req.timeout_ms {
        let ceiling = l.timeout_secs.map(|s| s * 1000);
        let v = check(
            "timeout_ms",
            RunLimit::Timeout,
            ms,
            ms.div_ceil(1000),
            ceiling,
        )?;
        l.timeout_secs = Some(v.div_ceil(1000));
    }
    if let Some(b) = req.memory_bytes {
        let ceiling = l.memory_bytes.map(ByteSize::bytes);
        l.memory_bytes = Some(ByteSize(check(
            "memory_bytes",
            RunLimit::Memory,
            b,
            b,
            ceiling,
        )?));
    }
    if let Some(b) = req.output_bytes {
        let ceiling = Some(l.output_bytes.bytes());
        l.output_bytes = ByteSize(check("output_bytes", RunLimit::Output, b, b, ceiling)?);
    }
    if let Some(n) = req.pids {
        l.pids = Some(check("pids", RunLimit::Pids, n, n, l.pids)?);
    }
    if let Some(ms) = req.cpu_time_ms {
        let ceiling = l.cpu_time_secs.map(|s| s * 1000);
        let v = check(
            "cpu_time_ms",
            RunLimit::CpuTime,
            ms,
            ms.div_ceil(1000),
            ceiling,
        )?;
        l.cpu_time_secs = Some(v.div_ceil(1000));
    }
    Ok(())
}

/// The ceilings a caller may ask for, per profile (`GET /v1/limits`).
pub fn ceilings(p: &Profile) -> Value {
    let l = &p.limits;
    json!({
        "timeout_ms": l.timeout_secs.map(|s| s * 1000),
        "memory_bytes": l.memory_bytes.map(ByteSize::bytes),
        "output_bytes": l.output_bytes.bytes(),
        "pids": l.pids,
        "cpu_time_ms": l.cpu_time_secs.map(|s| s * 1000),
    })
}

/// A fresh random execution id: 12 bytes from the kernel's random source
/// (`getrandom(2)`), as 24 hex digits. When the kernel cannot give them,
/// the request fails with 500 `internal`: an id is never made up from
/// anything guessable.
pub fn new_id() -> Result<String, ApiError> {
    id_from(|buf| getrandom::fill(buf).map_err(|e| e.to_string()))
}

/// An id from the bytes `fill` provides, or the error it reports.
fn id_from(fill: impl FnOnce(&mut [u8]) -> Result<(), String>) -> Result<String, ApiError> {
    let mut bytes = [0u8; 12];
    fill(&mut bytes).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("no execution id: the system's random source failed: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A fresh workspace under the server's own directory, owned by the uid
/// the sandbox of `profile` runs as (when the server is root).
pub fn new_workspace(state: &AppState, profile: &Profile) -> Result<Workspace, WorkspaceError> {
    let identity = sandbox_identity(profile);
    let owner = identity
        .drop_from_root
        .then_some((identity.uid, identity.gid));
    Workspace::create(&state.work_dir, owner)
}

/// Runs a prepared request (blocking: call from `spawn_blocking`).
pub fn run(
    state: &AppState,
    tenant: &str,
    id: &str,
    prepared: Prepared,
    cancel: Arc<AtomicBool>,
) -> Result<Value, ApiError> {
    run_streaming(state, tenant, id, prepared, cancel, None)
}

/// Like [`run`], with output chunks also handed to `tap` as they arrive.
///
/// The execution gets a fresh workspace with the request's files; the
/// regular files it leaves under `output/` are collected into the result,
/// then the workspace is removed and the record written.
pub fn run_streaming(
    state: &AppState,
    tenant: &str,
    id: &str,
    prepared: Prepared,
    cancel: Arc<AtomicBool>,
    tap: Option<corral_launcher::OutputTap>,
) -> Result<Value, ApiError> {
    let started = now_ms();
    let ws = new_workspace(state, &prepared.profile).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("creating the workspace: {e}"),
        )
    })?;
    // Callers may not write corral's reserved names; corral writes the code
    // file there itself.
    let callers = FileLimits {
        max_file_bytes: MAX_INPUT_BYTES,
        max_workspace_bytes: MAX_INPUT_BYTES,
        reserved: DEFAULT_RESERVED,
    };
    let own = FileLimits {
        reserved: &[],
        ..callers
    };
    let writes = prepared
        .files
        .iter()
        .map(|(p, d)| (p, d, &callers))
        .chain(prepared.code_file.iter().map(|(p, d)| (p, d, &own)));
    for (path, data, limits) in writes {
        if let Err(e) = ws.write_file(path, data, limits) {
            let _ = ws.remove();
            return Err(ApiError::bad_request(e.code(), format!("files: {e}")));
        }
    }
    let outcome =
        execute_in(state, tenant, id, &prepared, &ws, cancel, tap).map(|(mut body, status)| {
            collect_outputs(&ws, &mut body);
            (body, status)
        });
    let _ = ws.remove();
    let (body, status) = outcome?;
    record_and_answer(state, tenant, id, &prepared, started, body, status)
}

/// Runs a prepared request in `ws`, which the caller has set up and
/// removes (blocking: call from `spawn_blocking`). The one place where the
/// HTTP API ([`run_streaming`]) and MCP (`mcp::session::run_in_workspace`)
/// build the execution: its options, the call to the runtime, the metrics
/// and the common fields of the result (`id`, `tenant`, `profile`,
/// `limits`, `cancelled`). Answers the result body and its status: 200, or
/// 422 when the runtime refused the request (the body then has `error`).
/// Records nothing: see [`record_and_answer`].
pub fn execute_in(
    state: &AppState,
    tenant: &str,
    id: &str,
    prepared: &Prepared,
    ws: &Workspace,
    cancel: Arc<AtomicBool>,
    tap: Option<corral_launcher::OutputTap>,
) -> Result<(Value, StatusCode), ApiError> {
    let stdin = stdin_file(&state.work_dir, prepared.stdin.as_deref()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("preparing stdin: {e}"),
        )
    })?;
    let request = RunRequest {
        argv: prepared.argv.clone(),
        workdir: Some(ws.path().to_path_buf()),
        env: EnvRequest {
            pass: Vec::new(),
            set: prepared.env.clone(),
        },
        ..Default::default()
    };
    let commands = state
        .commands
        .get(&prepared.profile.name)
        .cloned()
        .unwrap_or_default();
    let opts = ExecuteOptions {
        output: OutputMode::Capture,
        // This process has threads: the helper is always re-executed.
        helper: HelperStart::ReExec,
        forward_signals: false,
        cancel: Some(cancel.clone()),
        stdin: Some(Arc::new(stdin)),
        tap,
        prestarted: Some(crate::warm::take),
    };
    // The server's own environment never reaches a sandbox.
    let outcome = execute(
        &prepared.profile,
        &commands,
        &request,
        &|_| None,
        opts,
        &mut |_| {},
    );
    let (mut body, status) = match outcome {
        Ok(done) => {
            let m = &state.metrics;
            if done.result.timed_out {
                m.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            if done.result.oom_killed {
                m.oom_killed.fetch_add(1, Ordering::Relaxed);
            }
            (
                serde_json::to_value(&done.result).unwrap_or_else(|_| json!({})),
                StatusCode::OK,
            )
        }
        Err(r) => (
            json!({"exit_code": r.exit_code, "error": {"code": r.code, "message": r.message}, "events": r.events}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    };
    if let Value::Object(map) = &mut body {
        map.insert("id".into(), json!(id));
        map.insert("tenant".into(), json!(tenant));
        map.insert("profile".into(), json!(prepared.profile.name));
        map.insert("limits".into(), ceilings(&prepared.profile));
        map.insert("cancelled".into(), json!(cancel.load(Ordering::Relaxed)));
    }
    Ok((body, status))
}

/// Adds `outputs` (and `outputs_truncated`, or `outputs_error`) to a
/// result: the regular files under the workspace's `output/`. A program
/// that made no `output/` simply has no outputs; an `output/` that cannot
/// be collected (a symlink, not a directory, …) is reported.
fn collect_outputs(ws: &Workspace, body: &mut Value) {
    let Value::Object(map) = body else {
        return;
    };
    let (files, outcome) = match ws.collect(OUTPUT_DIR, MAX_OUTPUT_FILES, MAX_OUTPUT_BYTES) {
        Ok(c) => {
            let files: Vec<Value> = c
                .files
                .iter()
                .map(|f| {
                    let path = f.path.to_string_lossy();
                    match std::str::from_utf8(&f.data) {
                        Ok(text) => json!({"path": path, "encoding": "utf8", "content": text}),
                        Err(_) => {
                            json!({"path": path, "encoding": "base64", "content": base64_encode(&f.data)})
                        }
                    }
                })
                .collect();
            (files, ("outputs_truncated", json!(c.truncated)))
        }
        Err(WorkspaceError::NotFound { .. }) => (Vec::new(), ("outputs_truncated", json!(false))),
        Err(e) => (Vec::new(), ("outputs_error", json!(e.to_string()))),
    };
    map.insert("outputs".into(), json!(files));
    map.insert(outcome.0.into(), outcome.1);
}

/// Stores the audit record of a finished execution (its answer is kept
/// even when storing fails) and turns a refused one into its API error.
pub fn record_and_answer(
    state: &AppState,
    tenant: &str,
    id: &str,
    prepared: &Prepared,
    started: u64,
    body: Value,
    status: StatusCode,
) -> Result<Value, ApiError> {
    let record = AuditRecord {
        id: id.to_string(),
        tenant: tenant.to_string(),
        profile: prepared.profile.name.clone(),
        code_sha256: sha256_hex(prepared.code.as_bytes()),
        code: state
            .config
            .server
            .store_code
            .then(|| prepared.code.clone()),
        started_ms: started,
        finished_ms: now_ms(),
        result: body.clone(),
    };
    if let Err(e) = state.audit.record(&record) {
        // The execution happened; its answer must not be lost either.
        eprintln!("corral: audit record {id} not stored: {e}");
    }
    if status != StatusCode::OK {
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or("execution.refused")
            .to_string();
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        // The record's id goes back with the refusal: the answer is the
        // record itself, as `GET /v1/executions/{id}` returns it.
        let mut e = ApiError::new(status, &code, message);
        e.body = Some(body);
        return Err(e);
    }
    Ok(body)
}

/// `/dev/null`, or an unlinked file holding the request's input.
fn stdin_file(dir: &std::path::Path, data: Option<&[u8]>) -> std::io::Result<std::fs::File> {
    let Some(data) = data else {
        return std::fs::File::open("/dev/null");
    };
    use std::io::{Seek, Write};
    let name = new_id().map_err(|e| std::io::Error::other(e.message))?;
    let path = dir.join(format!(".corral-stdin-{name}"));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    f.write_all(data)?;
    f.rewind()?;
    Ok(f)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional, whitespace refused).
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let clean = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in clean.bytes() {
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"\x00\xff\x10binary",
        ] {
            assert_eq!(base64_decode(&base64_encode(data)).unwrap(), data);
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert!(base64_decode("not base64!").is_none());
    }

    #[test]
    fn limits_above_the_ceiling_name_the_field() {
        let mut p = corral_policy::builtin::code();
        let e = apply_limits(
            &mut p,
            RequestLimits {
                memory_bytes: Some(64 << 30),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.code, "limits.above_ceiling");
        assert!(e.message.contains("limits.memory_bytes"), "{}", e.message);
        apply_limits(
            &mut p,
            RequestLimits {
                timeout_ms: Some(1500),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.limits.timeout_secs, Some(2));
    }

    #[test]
    fn limits_below_the_cli_minimums_name_the_field() {
        let cases = [
            (
                RequestLimits {
                    memory_bytes: Some((1 << 20) - 1),
                    ..Default::default()
                },
                "limits.memory_bytes",
            ),
            (
                RequestLimits {
                    output_bytes: Some(63),
                    ..Default::default()
                },
                "limits.output_bytes",
            ),
            (
                RequestLimits {
                    timeout_ms: Some(0),
                    ..Default::default()
                },
                "limits.timeout_ms",
            ),
            (
                RequestLimits {
                    pids: Some(2),
                    ..Default::default()
                },
                "limits.pids",
            ),
            // Above the maxima: a timeout that would overflow the deadline.
            (
                RequestLimits {
                    timeout_ms: Some(u64::MAX),
                    ..Default::default()
                },
                "limits.timeout_ms",
            ),
        ];
        for (req, field) in cases {
            let mut p = corral_policy::builtin::code();
            let e = apply_limits(&mut p, req).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.code.as_str()),
                (422, "limits.invalid")
            );
            assert!(e.message.contains(field), "{}", e.message);
        }
        let mut p = corral_policy::builtin::code();
        apply_limits(
            &mut p,
            RequestLimits {
                memory_bytes: Some(1 << 20),
                output_bytes: Some(64),
                timeout_ms: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.limits.timeout_secs, Some(1));
    }

    #[test]
    fn an_id_is_never_made_without_randomness() {
        let e = id_from(|_| Err("EIO".into())).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code.as_str()), (500, "internal"));
        assert!(e.message.contains("random"), "{}", e.message);
        let id = id_from(|b| {
            b.fill(0xab);
            Ok(())
        })
        .unwrap();
        assert_eq!(id, "ab".repeat(12));
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }

    #[test]
    fn the_command_text_is_unambiguous() {
        let text =
            |argv: &[&str]| command_text(&argv.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        assert_ne!(text(&["a b"]), text(&["a", "b"]));
        assert_eq!(
            text(&["sh", "-c", "echo \"hi\"\n"]),
            r#"["sh","-c","echo \"hi\"\n"]"#
        );
    }
}

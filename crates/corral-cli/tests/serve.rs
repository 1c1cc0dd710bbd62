//! `corral serve`: a real server process, real HTTP requests, real
//! sandboxes behind it.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn post(s: &Server, token: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    let (status, _, body) = http(&s.addr, "POST", "/v1/executions", token, Some(body));
    (status, json(&body))
}

/// Another process holding the audit database's write lock for a moment
/// (a second server handing over, an operator's `sqlite3`) must not cost
/// an execution its record: the write waits for the lock, and the answer
/// (which follows the record) with it.
#[test]
fn a_record_waits_for_another_holder_of_the_database_lock() {
    let s = start_server("", &[]);
    let db = s.path().join("audit.db");
    // Python's own SQLite: takes the write lock, says so, and holds it
    // until its input ends.
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('locked', flush=True)\n\
             sys.stdin.read()\n\
             c.execute('COMMIT')\n",
        ])
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 holding the lock");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the holder's line");
    assert_eq!(line.trim(), "locked");
    let addr = s.addr.clone();
    let started = std::time::Instant::now();
    let posted = std::thread::spawn(move || {
        let (status, _, body) = http(
            &addr,
            "POST",
            "/v1/executions",
            None,
            Some(r#"{"command": ["sh", "-c", "echo kept"]}"#),
        );
        (status, json(&body), started.elapsed())
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    drop(holder.stdin.take());
    assert!(holder.wait().expect("the holder").success());
    let (status, v, took) = posted.join().expect("the request");
    assert_eq!(status, 200, "{v}");
    assert!(
        took >= std::time::Duration::from_secs(1),
        "answered in {took:?}, before the lock was let go: the record was not waited for"
    );
    let id = v["id"].as_str().unwrap();
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200, "the record was lost: {body}");
    assert_eq!(json(&body)["stdout_bytes"], 5, "{body}");
}

#[test]
fn runs_a_command_and_keeps_its_record() {
    let s = start_server("", &[]);
    let (status, v) = post(
        &s,
        None,
        r#"{"command": ["python3", "-c", "print(6 * 7)"]}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "42\n");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["enforced"]["seccomp"], "default");
    let id = v["id"].as_str().unwrap();
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200);
    // The record is the answer with the output's digest in its place.
    let record = json(&body);
    assert_eq!(record["stdout_sha256"], sha256("42\n"), "{record}");
    assert_eq!(
        (record.get("stdout"), record["stdout_bytes"].as_u64()),
        (None, Some(3))
    );
    let (_, _, body) = http(&s.addr, "GET", "/v1/executions?limit=10", None, None);
    assert_eq!(json(&body)["items"][0]["id"], id);
    let (status, _, body) = http(&s.addr, "GET", "/healthz", None, None);
    assert_eq!((status, json(&body)["status"].clone()), (200, "ok".into()));
    let (_, _, metrics) = http(&s.addr, "GET", "/metrics", None, None);
    assert!(
        metrics.contains("corral_executions_finished_total 1"),
        "{metrics}"
    );
    let (_, _, api) = http(&s.addr, "GET", "/openapi.json", None, None);
    assert!(json(&api)["paths"]["/v1/executions"]["post"].is_object());
}

#[test]
fn code_mode_is_off_unless_enabled() {
    let s = start_server("", &[]);
    let (status, v) = post(&s, None, r#"{"language": "python", "code": "print(1)"}"#);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("code_mode.disabled")),
        "{v}"
    );
    let s = start_server("", &["--code-mode"]);
    let (status, v) = post(
        &s,
        None,
        r#"{"language": "python", "code": "import sys\nprint(sys.stdin.read().upper())", "stdin": "shout"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "SHOUT\n");
    let (_, v) = post(
        &s,
        None,
        r#"{"language": "node", "code": "console.log(2 + 2)"}"#,
    );
    assert_eq!(v["stdout"], "4\n");
}

#[test]
fn tenants_authenticate_and_never_see_each_other() {
    let extra = tenant("alice", "alice-token") + &tenant("bob", "bob-token");
    let s = start_server(&extra, &[]);
    let body = r#"{"command": ["sh", "-c", "echo hi"]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("auth.missing"))
    );
    let (status, v) = post(&s, Some("wrong"), body);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("auth.unknown_token"))
    );
    let (status, v) = post(&s, Some("alice-token"), body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tenant"], "alice");
    let id = v["id"].as_str().unwrap();
    let (status, _, _) = http(
        &s.addr,
        "GET",
        &format!("/v1/executions/{id}"),
        Some("bob-token"),
        None,
    );
    assert_eq!(status, 404, "bob must not see alice's execution");
    let (_, _, list) = http(&s.addr, "GET", "/v1/executions", Some("bob-token"), None);
    assert_eq!(json(&list)["items"].as_array().unwrap().len(), 0);
    let (status, _, lim) = http(&s.addr, "GET", "/v1/limits", Some("alice-token"), None);
    assert_eq!(status, 200);
    assert!(json(&lim)["profiles"]["code"]["timeout_ms"].is_u64());
}

#[test]
fn bad_requests_get_clear_4xx() {
    let s = start_server("", &[]);
    let cases: &[(&str, u16, &str)] = &[
        ("{not json", 400, "request.malformed"),
        (
            r#"{"command": ["sh"], "surprise": 1}"#,
            400,
            "request.malformed",
        ),
        (r#"{"command": []}"#, 400, "request.invalid"),
        (
            r#"{"profile": "nope", "command": ["sh"]}"#,
            403,
            "profile.forbidden",
        ),
        (
            r#"{"command": ["sh", "-c", "true"], "limits": {"memory_bytes": 1099511627776}}"#,
            422,
            "limits.above_ceiling",
        ),
        (
            r#"{"command": ["sh", "-c", "true"], "limits": {"timeout_ms": 0}}"#,
            422,
            "limits.invalid",
        ),
        // The minimums of `corral run --memory` and `--output-limit`.
        (
            r#"{"command": ["sh", "-c", "true"], "limits": {"memory_bytes": 1048575}}"#,
            422,
            "limits.invalid",
        ),
        (
            r#"{"command": ["sh", "-c", "true"], "limits": {"output_bytes": 63}}"#,
            422,
            "limits.invalid",
        ),
        (
            r#"{"command": ["perl", "-e", "1"]}"#,
            422,
            "command.not_allowed",
        ),
        (r#"{"command": ["/bin/sh"]}"#, 422, "command.path_rejected"),
        (
            r#"{"command": ["sh"], "files": [{"path": "../escape", "content": "x"}]}"#,
            400,
            "path.traversal",
        ),
        (
            r#"{"command": ["sh"], "files": [{"path": "/etc/passwd", "content": "x"}]}"#,
            400,
            "path.absolute",
        ),
        (
            r#"{"command": ["sh"], "files": [{"path": "a", "content": "!!", "encoding": "base64"}]}"#,
            400,
            "files.encoding",
        ),
    ];
    for (body, status, code) in cases {
        let (got, v) = post(&s, None, body);
        assert_eq!(
            (got, v["error"]["code"].as_str().unwrap_or("")),
            (*status, *code),
            "{body} -> {v}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    for (body, field) in [
        (
            r#"{"limits": {"memory_bytes": 1048575}}"#,
            "limits.memory_bytes",
        ),
        (r#"{"limits": {"output_bytes": 63}}"#, "limits.output_bytes"),
    ] {
        let mut v = json(body);
        v["command"] = serde_json::json!(["sh", "-c", "true"]);
        let (_, v) = post(&s, None, &v.to_string());
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains("too small"),
            "{v}"
        );
    }
}

/// The error object of an answer, checked to be the service's format.
fn error_code(status: u16, head: &str, body: &str) -> (u16, String) {
    let v = json(body);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    (status, v["error"]["code"].as_str().unwrap().to_string())
}

#[test]
fn every_error_answer_is_a_json_error_object() {
    let s = start_server("", &[]);
    let (status, head, body) = http(&s.addr, "GET", "/nope", None, None);
    assert_eq!(error_code(status, &head, &body), (404, "not_found".into()));
    // Too large: refused by the framework before any handler.
    let huge = format!(
        r#"{{"command": ["sh"], "stdin": "{}"}}"#,
        "x".repeat(9 << 20)
    );
    let (status, head, body) = http(&s.addr, "POST", "/v1/executions", None, Some(&huge));
    assert_eq!(
        error_code(status, &head, &body),
        (413, "body_too_large".into())
    );
    assert!(body.contains("8388608"), "names the limit: {body}");
    // A known path, a wrong method: 405 keeps its Allow header.
    let (status, head, body) = http(&s.addr, "DELETE", "/v1/executions", None, None);
    assert_eq!(
        error_code(status, &head, &body),
        (405, "method_not_allowed".into())
    );
    assert!(head.to_ascii_lowercase().contains("allow: "), "{head}");
    let (status, head, body) = http(&s.addr, "PUT", "/healthz", None, None);
    assert_eq!(
        error_code(status, &head, &body),
        (405, "method_not_allowed".into())
    );
    // The API's own JSON errors are unchanged.
    let (status, head, body) = http(&s.addr, "POST", "/v1/executions", None, Some("{not json"));
    assert_eq!(
        error_code(status, &head, &body),
        (400, "request.malformed".into())
    );
    // The MCP SDK's plain-text errors: a wrong content type, a body that is
    // not JSON, a client that does not accept event streams.
    let accept = ("Accept", "application/json, text/event-stream");
    let (status, head, body) = http_with(
        &s.addr,
        "POST",
        "/mcp",
        &[("Content-Type", "text/plain"), accept],
        Some("{}"),
    );
    assert_eq!(
        error_code(status, &head, &body),
        (415, "unsupported_media_type".into())
    );
    let (status, head, body) = http_with(
        &s.addr,
        "POST",
        "/mcp",
        &[("Content-Type", "application/json"), accept],
        Some("{not json"),
    );
    assert_eq!(
        error_code(status, &head, &body),
        (400, "request.malformed".into())
    );
    let (status, head, body) = http_with(
        &s.addr,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/plain"),
        ],
        Some("{}"),
    );
    assert_eq!(
        error_code(status, &head, &body),
        (406, "not_acceptable".into())
    );
}

#[test]
fn input_files_go_in_and_output_files_come_back() {
    let s = start_server("", &[]);
    let body = r#"{"command": ["sh", "-c", "mkdir -p output && tr a-z A-Z < data/in.txt > output/out.txt && cat data/in.txt"],
                   "files": [{"path": "data/in.txt", "content": "hello"}]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "hello");
    assert_eq!(v["outputs"][0]["path"], "out.txt", "{v}");
    assert_eq!(v["outputs"][0]["content"], "HELLO");
    // A planted symlink in output/ does not make the server read host files.
    let body = r#"{"command": ["sh", "-c", "mkdir -p output && ln -s /etc/hostname output/leak && echo ok > output/fine"]}"#;
    let (_, v) = post(&s, None, body);
    let names: Vec<&str> = v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fine"], "{v}");
}

#[test]
fn no_output_directory_is_no_outputs_and_no_error() {
    let s = start_server("", &[]);
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "true"]}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["outputs"], serde_json::json!([]), "{v}");
    assert_eq!(v["outputs_truncated"], false, "{v}");
    assert!(v.get("outputs_error").is_none(), "{v}");
    // An output/ that is there but cannot be collected is still reported.
    let (_, v) = post(
        &s,
        None,
        r#"{"command": ["sh", "-c", "mkdir elsewhere && ln -s elsewhere output"]}"#,
    );
    assert_eq!(v["outputs"], serde_json::json!([]), "{v}");
    assert!(
        v["outputs_error"]
            .as_str()
            .is_some_and(|e| e.contains("symbolic link")),
        "{v}"
    );
}

#[test]
fn a_refused_execution_answers_its_record_with_its_id() {
    let s = start_server("", &[]);
    let (status, v) = post(&s, None, r#"{"command": ["perl", "-e", "1"]}"#);
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "command.not_allowed", "{v}");
    let id = v["id"].as_str().unwrap_or_else(|| panic!("no id: {v}"));
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), v, "the answer is the record");
    // The stream's result event carries the same record and the status.
    let (status, _, raw) = http(
        &s.addr,
        "POST",
        "/v1/executions/stream",
        None,
        Some(r#"{"command": ["perl", "-e", "1"]}"#),
    );
    assert_eq!(status, 200);
    let events = sse_events(&raw);
    let start_id = events[0].1["id"].as_str().unwrap();
    let result = &events.last().unwrap().1;
    assert_eq!(
        (result["status"].as_u64(), result["id"].as_str()),
        (Some(422), Some(start_id)),
        "{result}"
    );
    assert_eq!(result["error"]["code"], "command.not_allowed");
    let (status, _, _) = http(
        &s.addr,
        "GET",
        &format!("/v1/executions/{start_id}"),
        None,
        None,
    );
    assert_eq!(status, 200);
}

#[test]
fn audit_files_are_private_and_hash_the_command_unambiguously() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("audit.jsonl");
    let s = start_server(&format!("audit_jsonl = \"{}\"\n", jsonl.display()), &[]);
    let argvs = [
        serde_json::json!(["sh", "-c", "true", "a b"]),
        serde_json::json!(["sh", "-c", "true", "a", "b"]),
    ];
    for argv in &argvs {
        let (status, v) = post(
            &s,
            None,
            &serde_json::json!({ "command": argv }).to_string(),
        );
        assert_eq!(status, 200, "{v}");
    }
    let db = s.path().join("audit.db");
    for file in [
        db.clone(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
        jsonl.clone(),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}: mode {mode:o}", file.display());
    }
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(json)
        .collect();
    assert_eq!(records.len(), 2);
    for (rec, argv) in records.iter().zip(&argvs) {
        // The SHA-256 of the command as a compact JSON array.
        assert_eq!(
            rec["code_sha256"].as_str().unwrap(),
            sha256(&argv.to_string()),
            "{rec}"
        );
    }
    assert_ne!(records[0]["code_sha256"], records[1]["code_sha256"]);
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let s = start_server(&tenant("alice", "alice-token"), &[]);
    for value in [
        "bearer alice-token",
        "BEARER alice-token",
        "Bearer  alice-token",
    ] {
        let (status, _, body) = http_with(
            &s.addr,
            "GET",
            "/v1/limits",
            &[("Authorization", value)],
            None,
        );
        assert_eq!(status, 200, "{value}: {body}");
        assert_eq!(json(&body)["tenant"], "alice");
    }
    // The token itself is exact.
    let (status, _, body) = http_with(
        &s.addr,
        "GET",
        "/v1/limits",
        &[("Authorization", "bearer ALICE-TOKEN")],
        None,
    );
    assert_eq!(
        (status, json(&body)["error"]["code"].clone()),
        (401, "auth.unknown_token".into())
    );
    let (status, _, body) = http_with(
        &s.addr,
        "GET",
        "/v1/limits",
        &[("Authorization", "Basic alice-token")],
        None,
    );
    assert_eq!(
        (status, json(&body)["error"]["code"].clone()),
        (401, "auth.invalid".into())
    );
}

#[test]
fn the_anonymous_default_profile_is_code() {
    // `a-first` sorts before `code`.
    let s = start_server("[profile.a-first]\nextends = \"code\"\n", &[]);
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "true"]}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["profile"], "code", "{v}");
}

#[test]
fn saturation_answers_429_with_retry_after_and_never_queues() {
    let s = start_server("", &["--max-concurrent", "2"]);
    let addr = s.addr.clone();
    let handles: Vec<_> = (0..5)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                http(
                    &addr,
                    "POST",
                    "/v1/executions",
                    None,
                    Some(r#"{"command": ["sh", "-c", "sleep 2; echo done"]}"#),
                )
            })
        })
        .collect();
    let results: Vec<(u16, String, String)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let busy: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!((ok, busy.len()), (2, 3), "{results:?}");
    for (_, head, body) in busy {
        assert!(
            head.to_ascii_lowercase().contains("retry-after: 1"),
            "{head}"
        );
        assert_eq!(json(body)["error"]["code"], "busy");
    }
}

#[test]
fn a_client_that_disconnects_kills_its_execution() {
    let s = start_server("", &[]);
    let token = format!("corral-disconnect-{}", std::process::id());
    let body =
        format!(r#"{{"command": ["python3", "-c", "import time; time.sleep(60)", "{token}"]}}"#);
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let req = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        s.addr,
        body.len()
    );
    conn.write_all(req.as_bytes()).unwrap();
    let running = || process_running("python3", &token);
    wait_until(10, "the execution never started", &running);
    drop(conn);
    wait_until(5, "the execution outlived its client", || !running());
    assert_only_record_cancelled(&s);
}

/// The server's only execution was recorded as cancelled.
fn assert_only_record_cancelled(s: &Server) {
    // The record is written once the sandbox is gone and its workspace
    // removed: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let (_, _, list) = http(&s.addr, "GET", "/v1/executions", None, None);
        if let Some(id) = json(&list)["items"][0]["id"].as_str() {
            break id.to_string();
        }
        assert!(Instant::now() < deadline, "no record of the execution");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200);
    let v = json(&body);
    assert_eq!(v["cancelled"], true, "{v}");
    assert_eq!(v["signal"], 9, "{v}");
}

#[test]
fn an_http2_client_that_disconnects_kills_its_execution() {
    let s = start_server("", &[]);
    let url = |path: &str| format!("http://{}{path}", s.addr);
    // The server speaks HTTP/2 over cleartext to a client that knows it
    // (h2c with prior knowledge, no upgrade).
    let out = std::process::Command::new("curl")
        .args(["-sS", "--http2-prior-knowledge", "-o", "/dev/null"])
        .args(["-w", "%{http_version}", &url("/healthz")])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "2", "{}", text(&out.stderr));
    let token = format!("corral-h2-disconnect-{}", std::process::id());
    let body =
        format!(r#"{{"command": ["python3", "-c", "import time; time.sleep(60)", "{token}"]}}"#);
    let mut client = std::process::Command::new("curl")
        .args(["-sS", "--http2-prior-knowledge", "-X", "POST"])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
        ])
        .arg(url("/v1/executions"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = || process_running("python3", &token);
    wait_until(10, "the execution never started", &running);
    // The client dies: its connection, and the HTTP/2 stream on it, drop.
    client.kill().unwrap();
    client.wait().unwrap();
    wait_until(5, "the execution outlived its HTTP/2 client", || !running());
    assert_only_record_cancelled(&s);
}

#[test]
fn killing_the_server_leaves_no_sandbox_and_records_survive_a_restart() {
    let s = start_server("", &[]);
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "echo kept"]}"#);
    assert_eq!(status, 200);
    let id = v["id"].as_str().unwrap().to_string();
    let token = format!("corral-serverkill-{}", std::process::id());
    let addr = s.addr.clone();
    let body =
        format!(r#"{{"command": ["python3", "-c", "import time; time.sleep(60)", "{token}"]}}"#);
    std::thread::spawn(move || {
        let _ =
            std::panic::catch_unwind(|| http(&addr, "POST", "/v1/executions", None, Some(&body)));
    });
    let running = || process_running("python3", &token);
    wait_until(10, "the execution never started", &running);
    let mut s = s;
    let dir = s.dir.take().unwrap();
    s.child.kill().unwrap(); // SIGKILL: no chance to clean up
    s.child.wait().unwrap();
    drop(s);
    wait_until(5, "a sandbox outlived its killed server", || !running());
    // Same config, same audit database: the record is still there, and the
    // killed server's workspace is swept.
    let cfg = dir.path().join("corral.toml");
    let s = start_server_in(dir, &cfg, &[]);
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200);
    assert_eq!(json(&body)["stdout_sha256"], sha256("kept\n"));
    // Only the new server's own (empty) directory is left.
    let left: Vec<String> = std::fs::read_dir(s.path().join("work"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        [format!("corral-serve-{}", s.child.id())],
        "stale workspaces were not swept"
    );
}

#[test]
fn listening_beyond_loopback_without_tenants_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\naudit_db = \"{}\"\n",
            dir.path().join("a.db").display()
        ),
    )
    .unwrap();
    let out = corral()
        .args(["serve", "--config"])
        .arg(&cfg)
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("without authentication"),
        "{}",
        text(&out.stderr)
    );
}

/// Parses a server-sent event stream into (event, data) pairs.
fn sse_events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = Some(e.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            event.map(|e| {
                (
                    e,
                    serde_json::from_str(&data).unwrap_or(serde_json::Value::Null),
                )
            })
        })
        .collect()
}

#[test]
fn streaming_sends_typed_events_and_exactly_one_final_result() {
    let s = start_server("", &[]);
    let body = r#"{"command": ["sh", "-c", "echo one; sleep 0.3; echo two >&2; (sleep 0.5; echo late) & exit 3"]}"#;
    let (status, head, raw) = http(&s.addr, "POST", "/v1/executions/stream", None, Some(body));
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    let events = sse_events(&raw);
    let names: Vec<&str> = events
        .iter()
        .map(|(e, _)| e.as_str())
        .filter(|e| *e != "heartbeat")
        .collect();
    assert_eq!(names.first(), Some(&"start"), "{names:?}");
    assert_eq!(names.last(), Some(&"result"), "{names:?}");
    assert_eq!(names.iter().filter(|e| **e == "result").count(), 1);
    let out: String = events
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| d["data"].as_str().unwrap().to_string())
        .collect();
    let err: String = events
        .iter()
        .filter(|(e, _)| e == "stderr")
        .map(|(_, d)| d["data"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        (out.as_str(), err.as_str()),
        ("one\n", "two\n"),
        "{events:?}"
    );
    let result = &events.last().unwrap().1;
    assert_eq!(result["exit_code"], 3);
    assert_eq!(
        result["stdout"], "one\n",
        "the leftover background job died with the program: {result}"
    );
    // The same record is kept as for a non-streaming call.
    let id = result["id"].as_str().unwrap();
    let (status, _, _) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200);
}

/// The server's v1 memory groups (`corral/<server pid>-<n>`).
fn memory_groups(server: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup/memory/corral") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{server}-")))
        .collect()
}

#[test]
fn helpers_and_sandboxes_wait_ahead_and_leave_with_the_server() {
    let mut s = start_server("", &["--max-concurrent", "2"]);
    let server = s.child.id();
    let v1 = is_root() && std::path::Path::new("/sys/fs/cgroup/memory/corral").is_dir();
    wait_until(10, "two waiting helpers and two prepared sandboxes", || {
        waiting_helpers(server).len() == 2 && prepared_sandboxes(server).len() == 2
    });
    let waiting = waiting_helpers(server);
    let prepared = prepared_sandboxes(server);
    // Each init has forked its program's process ahead too: it waits for
    // the run, every step that does not need the run taken.
    wait_until(10, "a program's process waiting in each sandbox", || {
        prepared
            .iter()
            .all(|(_, init)| children_of(*init).len() == 1)
    });
    let programs: Vec<i32> = prepared
        .iter()
        .flat_map(|(_, init)| children_of(*init))
        .collect();
    if v1 {
        // A group each, made ahead: the waiting helpers join theirs when
        // their plan comes; a prepared sandbox sits in its own, helper and
        // init, as the sandbox's every process will.
        wait_until(10, "four groups", || memory_groups(server).len() == 4);
        for ((helper, init), program) in prepared.iter().zip(&programs) {
            for pid in [helper, init, program] {
                let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
                assert!(
                    cg.lines()
                        .any(|l| l.contains(":memory:/corral/")
                            && l.contains(&format!("/{server}-"))),
                    "{pid} of a prepared sandbox is not in a corral group: {cg}"
                );
            }
        }
    }
    // A waiting helper killed by hand is skipped, not used; so is a
    // prepared sandbox whose init was killed (its helper then exits).
    for pid in [waiting[0], prepared[0].1] {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    // Dead (zombies until the pools reap them) before the next request.
    for pid in [waiting[0], prepared[0].0] {
        wait_until(10, "the killed one to be a zombie", || ended(pid));
    }
    for _ in 0..3 {
        let (status, v) = post(&s, None, r#"{"command": ["python3", "-c", "print(1)"]}"#);
        assert_eq!((status, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
        assert_eq!(v["error"], serde_json::Value::Null, "{v}");
    }
    // Other limits than the waiting groups were made for: a group of the
    // run's own, and the waiting one it left is removed after the run.
    let (status, v) = post(
        &s,
        None,
        r#"{"command": ["python3", "-c", "print(2)"], "limits": {"memory_bytes": 268435456}}"#,
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("2\n")), "{v}");
    if v1 {
        assert_eq!(v["enforced"]["cgroup"]["memory_bytes"], 268435456u64, "{v}");
    }
    wait_until(10, "the pools full again and no other group", || {
        waiting_helpers(server).len() == 2
            && prepared_sandboxes(server).len() == 2
            && (!v1 || memory_groups(server).len() == 4)
    });
    // SIGTERM: the waiting helpers and the prepared sandboxes go, and so do
    // their groups and workspaces.
    let mut waiting = waiting_helpers(server);
    for (helper, init) in prepared_sandboxes(server) {
        waiting.extend([helper, init]);
        waiting.extend(children_of(init));
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.to_string()])
        .status();
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    for pid in waiting {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        assert!(
            stat.is_err(),
            "waiting helper or sandbox {pid} outlived the server: {stat:?}"
        );
    }
    assert_nothing_left(&s, server);
}

/// After `server` (of `s`) has stopped: no cgroup of its own and nothing
/// in its work directory.
fn assert_nothing_left(s: &Server, server: u32) {
    assert_eq!(memory_groups(server), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir(s.path().join("work"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the work directory: {left:?}");
}

/// An execution is answered once init has reported the program's end
/// (nothing of it runs any more), before the sandbox is torn down; the
/// teardown holds a sandbox permit, not the execution's slot. So a client
/// sending one execution after another to a server with one slot is
/// never told it is busy, and each sandbox's group and workspace are gone
/// soon after its answer.
#[test]
fn back_to_back_executions_on_one_slot_are_never_busy_and_leave_nothing() {
    let s = start_server("", &["--max-concurrent", "1"]);
    let server = s.child.id();
    let v1 = is_root() && std::path::Path::new("/sys/fs/cgroup/memory/corral").is_dir();
    for i in 0..15 {
        let code = format!(r#"{{"command": ["python3", "-c", "print({i} * 7)"]}}"#);
        let (status, v) = post(&s, None, &code);
        assert_eq!(status, 200, "execution {i} was refused: {v}");
        assert_eq!(v["stdout"], format!("{}\n", i * 7), "{v}");
        assert_eq!(v["exit_code"], 0, "{v}");
    }
    let work = s.work();
    let workspaces = || {
        std::fs::read_dir(&work)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", work.display()))
            .flatten()
            .filter(|e| e.file_name() != "ahead")
            .count()
    };
    wait_until(10, "the executions' groups and workspaces removed", || {
        workspaces() == 0
            && waiting_helpers(server).len() == 1
            && prepared_sandboxes(server).len() == 1
            && (!v1 || memory_groups(server).len() == 2)
    });
}

/// A server told to stop while an execution runs (its client still
/// connected) kills it once the connections' drain is over and waits only
/// for its teardown, not for the execution's own timeout (300 s here):
/// nothing of the sandbox is left after the server exits.
#[test]
fn a_stop_kills_running_executions_and_leaves_nothing() {
    let mut s = start_server("", &["--max-concurrent", "1"]);
    let server = s.child.id();
    let addr = s.addr.clone();
    let client = std::thread::spawn(move || {
        http(
            &addr,
            "POST",
            "/v1/executions",
            None,
            Some(r#"{"command": ["sh", "-c", "sleep 117.25"]}"#),
        )
    });
    wait_until(10, "the execution to run", || {
        process_running("sleep", "117.25")
    });
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.to_string()])
        .status();
    let stopping = Instant::now();
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(40),
            "the server is still waiting for its running execution"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    let stopped_after = stopping.elapsed();
    // (What the client got, and when the server stopped, say which way a
    // failure below went.)
    let answer = client.join().map_err(|_| "the client found no answer");
    assert!(
        !process_running("sleep", "117.25"),
        "the program outlived the server, which stopped {stopped_after:?} after SIGTERM; the client got {answer:?}"
    );
    assert_nothing_left(&s, server);
}

/// A program's start time and its sandbox's init's, in clock ticks since
/// boot, and its namespaces, as a Python snippet prints them (one JSON
/// line).
const SANDBOX_FACTS: &str = r#"
import json, os, sys
start = lambda p: int(open(p).read().rsplit(")", 1)[1].split()[19])
ns = {n: os.readlink("/proc/self/ns/" + n) for n in ("user", "mnt", "pid", "net", "uts", "ipc", "cgroup")}
import time
# How long before this program ran its sandbox's init started (its program's
# process is forked ahead too, so the program's own start time says nothing).
ahead = time.clock_gettime(time.CLOCK_BOOTTIME) - start("/proc/1/stat") / os.sysconf("SC_CLK_TCK")
print(json.dumps({"ahead_s": ahead,
                  "ns": ns, "files": sorted(os.listdir("data")), "in": open("data/in.txt").read(),
                  "env": os.environ.get("GREETING"), "stdin": sys.stdin.read(), "argv": sys.argv[1:],
                  "cwd": os.getcwd(), "pid": os.getpid()}))
"#;

#[test]
fn executions_take_sandboxes_built_ahead_each_with_its_own_namespaces() {
    let s = start_server("", &["--max-concurrent", "2"]);
    let server = s.child.id();
    wait_until(10, "two prepared sandboxes", || {
        prepared_sandboxes(server).len() == 2
    });
    // Long enough that a sandbox built ahead is told apart by its init's
    // start time from one built for the request (~1 ms apart).
    std::thread::sleep(Duration::from_millis(600));
    let run = |n: usize, limits: &str| {
        let body = serde_json::json!({
            "command": ["python3", "-c", SANDBOX_FACTS, "arg", n.to_string()],
            "files": [{"path": "data/in.txt", "content": format!("input {n}")}],
            "env": {"GREETING": format!("hello {n}")},
            "stdin": format!("stdin {n}"),
        });
        let mut body = body.to_string();
        if !limits.is_empty() {
            body = body.replacen('{', &format!("{{\"limits\": {limits}, "), 1);
        }
        let (status, v) = post(&s, None, &body);
        assert_eq!(
            (status, &v["error"]),
            (200, &serde_json::Value::Null),
            "{v}"
        );
        let facts = json(v["stdout"].as_str().unwrap());
        // Everything of the request reached the program: its files
        // (written after the sandbox was built), environment, stdin, argv.
        assert_eq!(facts["files"], serde_json::json!(["in.txt"]), "{facts}");
        assert_eq!(facts["in"], format!("input {n}"));
        assert_eq!(facts["env"], format!("hello {n}"));
        assert_eq!(facts["stdin"], format!("stdin {n}"));
        assert_eq!(facts["argv"], serde_json::json!(["arg", n.to_string()]));
        assert_eq!(
            (facts["cwd"].as_str(), facts["pid"].as_u64()),
            (Some("/workspace"), Some(2))
        );
        (facts, v)
    };
    let (first, _) = run(1, "");
    let (second, _) = run(2, "");
    for facts in [&first, &second] {
        assert!(
            facts["ahead_s"].as_f64().unwrap() >= 0.3,
            "the sandbox was not built ahead of the request: {facts}"
        );
    }
    // Each execution had namespaces of its own, every kind. (Both sandboxes
    // existed at once, built ahead, so their numbers cannot be reused ones.)
    for (kind, id) in first["ns"].as_object().unwrap() {
        assert_ne!(
            &second["ns"][kind], id,
            "{kind} namespace shared by two executions"
        );
    }
    // Limits other than the sandboxes were built for: one built for the
    // request, and still namespaces of its own.
    let (third, v) = run(3, r#"{"memory_bytes": 268435456}"#);
    assert!(
        third["ahead_s"].as_f64().unwrap() < 0.3,
        "a run with other limits took a sandbox built for the default ones: {third}"
    );
    if is_root() && std::path::Path::new("/sys/fs/cgroup/memory/corral").is_dir() {
        assert_eq!(v["enforced"]["cgroup"]["memory_bytes"], 268435456u64, "{v}");
    }
    // (Its namespaces' numbers are not compared with the first two: those
    // are gone by now, and the kernel reuses the numbers of freed ones.)
}

#[test]
fn a_sandbox_built_ahead_counts_its_program_in_its_group() {
    if !(is_root() && std::path::Path::new("/sys/fs/cgroup/memory/corral").is_dir()) {
        eprintln!("SKIP: needs root and cgroup v1 memory groups (CI has both)");
        return;
    }
    let s = start_server("", &["--max-concurrent", "1"]);
    wait_until(10, "a prepared sandbox", || {
        prepared_sandboxes(s.child.id()).len() == 1
    });
    std::thread::sleep(Duration::from_millis(400));
    // 64 MiB touched by the program: the group's peak shows it only if the
    // program ran inside the group the sandbox was built in.
    // (How long ago init started, in seconds: the program's own process
    // is forked ahead as well.)
    let body = r#"{"command": ["python3", "-c", "import os, time; b = bytearray(64 << 20); print(time.clock_gettime(time.CLOCK_BOOTTIME) - int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]) / os.sysconf('SC_CLK_TCK'))"]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    let ahead_s: f64 = v["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(ahead_s >= 0.2, "not a sandbox built ahead: {v}");
    let peak = v["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        peak >= 64 << 20,
        "the program's memory is not in the group: {v}"
    );
    assert_eq!(v["enforced"]["cgroup"]["version"], "v1", "{v}");
}

/// Runs `sh -c 'echo i'` on `s` (with `extra` JSON members after the
/// command, e.g. `, "limits": {...}`) and asserts it printed `i`.
fn echo_runs(s: &Server, i: usize, extra: &str) {
    let body = format!(r#"{{"command": ["sh", "-c", "echo {i}"]{extra}}}"#);
    let (status, v) = post(s, None, &body);
    assert_eq!(
        (status, v["stdout"].clone()),
        (200, format!("{i}\n").into()),
        "{v}"
    );
}

/// Whether `pid` has ended: gone, or a zombie not yet reaped.
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|st| st.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
        .unwrap_or(true)
}

/// Where corral's binary is mapped in `pid` (the start of its first
/// mapping), if its maps can be read.
fn image_base(pid: i32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .find(|l| l.ends_with(&*exe.to_string_lossy()))
        .and_then(|l| l.split('-').next())
        .map(str::to_string)
}

/// The server's fork servers: children of any of its threads (each is a
/// refill thread's) running as `__sandbox-zygote`.
fn fork_servers(server: u32) -> Vec<i32> {
    // What a fork server forks or clones shows its command line until it
    // rewrites it, a moment later: an init cloned into its own pid
    // namespace (told apart by that) and a forked helper (gone from the
    // list at the next look).
    let level = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .map(|ids| ids.split_whitespace().count())
            })
    };
    let server_level = level(&server.to_string());
    let look = || -> Vec<(i32, String)> {
        children_of_process(server)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"corral-sandbox\0__sandbox-zygote\0"))
                    && level(&pid.to_string()) == server_level
            })
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // The start time (field 22) tells a reused pid apart.
                let start = stat.rsplit(") ").next()?.split(' ').nth(19)?.to_string();
                Some((pid, start))
            })
            .collect()
    };
    let first = look();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let second = look();
    first
        .into_iter()
        .filter(|p| second.contains(p))
        .map(|(pid, _)| pid)
        .collect()
}

/// The helpers a server starts ahead are forked by a fork server
/// (`__sandbox-zygote`) its refill thread started, not each a program
/// start of corral's binary: they are the server's children all the same,
/// and share the fork server's address layout (a helper started by
/// `execve` gets a layout of its own). The fork servers end with the
/// server, even one killed outright.
#[test]
fn helpers_started_ahead_are_forked_by_a_fork_server_that_ends_with_the_server() {
    if std::fs::read_to_string("/proc/sys/kernel/randomize_va_space").is_ok_and(|v| v.trim() == "0")
    {
        eprintln!(
            "SKIP: address space layout randomisation is off: every process has the same layout"
        );
        return;
    }
    let mut s = start_server("", &["--max-concurrent", "2"]);
    let server = s.child.id();
    wait_until(10, "two waiting helpers", || {
        waiting_helpers(server).len() == 2
    });
    let zygotes = fork_servers(server);
    assert!(
        !zygotes.is_empty(),
        "no fork server among the server's children"
    );
    let layouts: Vec<String> = zygotes.iter().filter_map(|z| image_base(*z)).collect();
    assert_eq!(
        layouts.len(),
        zygotes.len(),
        "the fork servers' maps are readable"
    );
    for helper in waiting_helpers(server) {
        let base = image_base(helper).expect("a waiting helper's maps");
        assert!(
            layouts.contains(&base),
            "helper {helper} at {base} was not forked by a fork server (at {layouts:?})"
        );
    }
    // The sandboxes built ahead have no helper: each init was cloned by a
    // fork server straight into its namespaces, as `corral run` clones
    // its own (where init joins its group itself: cgroup v1, or none).
    // A helper's init would be its child, not the server's.
    let v2_root = is_root() && !std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
    if v2_root {
        eprintln!("NOTE: cgroup v2 as root: sandboxes built ahead keep their helper");
    } else {
        wait_until(10, "two prepared sandboxes", || {
            prepared_sandboxes(server).len() == 2
        });
        for (child, init) in prepared_sandboxes(server) {
            assert_eq!(child, init, "a prepared sandbox with a helper: {child}");
            // The fork server cloned it acting as the sandbox identity with
            // saved uid 0 kept: init dropped that, so every uid and gid it
            // has is the identity's (65534 under root, the server's own
            // otherwise), and under root it holds no supplementary group.
            let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .unwrap_or_default()
            };
            let (uid, gid) = if is_root() {
                ("65534".to_string(), "65534".to_string())
            } else {
                let own = std::fs::read_to_string(format!("/proc/{server}/status")).unwrap();
                let first = |name: &str| {
                    own.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .and_then(|v| v.split_whitespace().next().map(str::to_string))
                        .unwrap()
                };
                (first("Uid:"), first("Gid:"))
            };
            assert_eq!(field("Uid:"), vec![uid; 4], "{status}");
            assert_eq!(field("Gid:"), vec![gid; 4], "{status}");
            if is_root() {
                assert_eq!(field("Groups:"), Vec::<String>::new(), "{status}");
            }
        }
    }
    // A run still works with a helper from a fork server.
    let (status, v) = post(&s, None, r#"{"command": ["python3", "-c", "print(3)"]}"#);
    assert_eq!((status, v["stdout"].as_str()), (200, Some("3\n")), "{v}");
    // A fork server killed by hand is found out at its next request,
    // reaped and replaced; meanwhile runs work as ever. (Runs with other
    // limits than the sandboxes built ahead take waiting helpers: both
    // pools refill.)
    let runs_from_both_pools = |n: usize| {
        for i in 0..n {
            for limits in ["", r#", "limits": {"memory_bytes": 268435456}"#] {
                echo_runs(&s, i, limits);
            }
        }
    };
    let signal = |pid: i32, sig: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status();
    };
    let killed = zygotes[0];
    signal(killed, "-9");
    runs_from_both_pools(4);
    wait_until(10, "the killed fork server reaped and replaced", || {
        let now = fork_servers(server);
        !std::path::Path::new(&format!("/proc/{killed}")).exists()
            && now.len() == zygotes.len()
            && !now.contains(&killed)
    });
    // One that stops answering (stopped here) is given up after its
    // timeout, killed, reaped and replaced; no run waits for it.
    let stuck = fork_servers(server);
    for z in &stuck {
        signal(*z, "-STOP");
    }
    runs_from_both_pools(2);
    wait_until(30, "the stopped fork servers reaped and replaced", || {
        let now = fork_servers(server);
        stuck
            .iter()
            .all(|z| !std::path::Path::new(&format!("/proc/{z}")).exists())
            && now.len() == stuck.len()
    });
    let zygotes = fork_servers(server);
    let _ = s.child.kill();
    let _ = s.child.wait();
    wait_until(10, "the fork servers gone with the server", || {
        zygotes.iter().all(|z| ended(*z))
    });
}

/// A fork server acts as the sandbox uid for each clone of an init, and
/// a process of that uid may meanwhile change its nice value, affinity,
/// scheduling policy or I/O priority, which every later sandbox would
/// inherit. So a fork server whose scheduling differs after a clone from
/// what it had at start makes no more: it exits after that clone (whose
/// init is reaped as usual) and the server starts another. Here root
/// renices the fork servers by hand; the one that clones the next init
/// goes, is replaced, and runs go on.
#[test]
fn a_fork_server_whose_scheduling_changed_is_replaced_after_its_next_clone() {
    if !is_root() || !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        eprintln!("SKIP: root on cgroup v1 only (elsewhere no fork server acts as another uid; CI is both)");
        return;
    }
    require_tool("renice");
    let s = start_server("", &["--max-concurrent", "1"]);
    let server = s.child.id();
    wait_until(10, "a prepared sandbox", || {
        prepared_sandboxes(server).len() == 1
    });
    let reniced = fork_servers(server);
    assert!(!reniced.is_empty(), "no fork server");
    for z in &reniced {
        let status = std::process::Command::new("renice")
            .args(["-n", "5", "-p", &z.to_string()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "renice {z}");
    }
    // The run takes the prepared sandbox; its replacement is cloned by
    // a reniced fork server, which then exits.
    let run = |i: usize| echo_runs(&s, i, "");
    run(1);
    wait_until(10, "a reniced fork server to exit", || {
        reniced.iter().any(|z| ended(*z))
    });
    // Found out (and reaped) at its thread's next request, and replaced.
    for i in 2..5 {
        run(i);
    }
    wait_until(10, "the fork server replaced", || {
        let now = fork_servers(server);
        now.len() == reniced.len() && now.iter().any(|z| !reniced.contains(z))
    });
    wait_until(10, "a prepared sandbox cloned by a fork server", || {
        prepared_sandboxes(server)
            .iter()
            .any(|(child, init)| child == init)
    });
}

/// A default profile whose plan is larger than a message carries inline
/// (16 KiB; here a 24,000-byte variable it sets) still has its sandboxes
/// built ahead by init cloned by the fork server: the plan goes in a
/// sealed memfd, and a run gets the variable whole.
#[test]
fn a_plan_too_large_for_a_message_still_has_init_cloned_ahead() {
    let big = "x".repeat(24_000);
    let s = start_server(
        &format!("[profile.code.env]\nset = {{ BIG = \"{big}\" }}\n"),
        &["--max-concurrent", "1"],
    );
    let server = s.child.id();
    let v2_root = is_root() && !std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
    wait_until(10, "a prepared sandbox", || {
        prepared_sandboxes(server).len() == 1
    });
    if v2_root {
        eprintln!("NOTE: cgroup v2 as root: sandboxes built ahead keep their helper");
    } else {
        let (child, init) = prepared_sandboxes(server)[0];
        assert_eq!(child, init, "a prepared sandbox with a helper: {child}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let body = r#"{"command": ["python3", "-c", "import os, time; print(len(os.environ['BIG']), time.clock_gettime(time.CLOCK_BOOTTIME) - int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]) / os.sysconf('SC_CLK_TCK'))"]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    let out = v["stdout"].as_str().unwrap_or_default().to_string();
    let mut words = out.split_whitespace();
    assert_eq!(words.next(), Some("24000"), "{v}");
    let ahead_s: f64 = words.next().unwrap().parse().unwrap();
    assert!(ahead_s >= 0.2, "not a sandbox built ahead: {v}");
}

/// A sandbox built ahead holds its program's process with the seccomp
/// filters already installed (their attach is then off the run's path),
/// and under the strict allowlist that process still receives its run,
/// small or too large for a message (a sealed memfd), sets it up and
/// executes it.
#[test]
fn a_held_programs_process_waits_under_its_seccomp_filters_and_still_runs() {
    let s = start_server(
        "[profile.code.security]\nseccomp = \"strict\"\n",
        &["--max-concurrent", "1"],
    );
    let server = s.child.id();
    let seccomp_of = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_string()))
    };
    let held = || -> Vec<i32> {
        prepared_sandboxes(server)
            .into_iter()
            .flat_map(|(_, init)| children_of_process(init.unsigned_abs()))
            .collect()
    };
    wait_until(
        10,
        "a sandbox built ahead with its program's process",
        || held().len() == 1,
    );
    let pid = held()[0];
    wait_until(5, "the held process's seccomp filters", || {
        seccomp_of(pid).as_deref() == Some("2")
    });
    let body = r#"{"command": ["sh", "-c", "grep '^Seccomp:' /proc/self/status; echo ok"]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout"], "Seccomp:\t2\nok\n", "{v}");
    // Over 16 KiB of argv: the run travels in a sealed memfd, which the
    // held process reads under the strict allowlist.
    wait_until(10, "the next sandbox built ahead", || held().len() == 1);
    let big = "y".repeat(20_000);
    let body = format!(r#"{{"command": ["sh", "-c", "echo ${{#1}}", "sh", "{big}"]}}"#);
    let (status, v) = post(&s, None, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "20000\n", "{v}");
}

/// A sandbox built ahead holds no capability in its program's process or
/// in its init, the bounding set included: init empties the bounding set
/// once, before it forks the held process, which inherits it.
#[test]
fn a_sandbox_built_ahead_holds_no_capability_in_its_program_or_its_init() {
    let s = start_server("", &["--max-concurrent", "1"]);
    let server = s.child.id();
    wait_until(10, "a sandbox built ahead", || {
        prepared_sandboxes(server).len() == 1
    });
    let held = prepared_sandboxes(server)[0].1;
    let body = r#"{"command": ["sh", "-c", "grep -H '^Cap' /proc/self/status /proc/1/status"]}"#;
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    let out = v["stdout"].as_str().unwrap_or_default();
    for file in ["/proc/self/status", "/proc/1/status"] {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let line = format!("{file}:{set}:\t0000000000000000");
            assert!(out.lines().any(|l| l == line), "no {line:?} in {out}");
        }
    }
    // The run took the sandbox that was built ahead.
    wait_until(10, "a new sandbox built ahead", || {
        prepared_sandboxes(server)
            .first()
            .is_some_and(|(_, init)| *init != held)
    });
}

/// A request refused before its program starts (a command the profile
/// does not allow) sent nothing to the sandbox built ahead it took: with
/// no input files written into its workspace, that sandbox waits for the
/// next request instead of being torn down (on the refused request's
/// path) and built again. One whose files were written is let go and its
/// workspace removed.
/// A profile that denies a path inside the workspace: a request's own
/// input file there is hidden, also in a sandbox built ahead (which was
/// built before the file existed; the run plans its sandbox in full and
/// takes the held one only if the plans are equal).
#[test]
fn attack_an_input_file_at_a_denied_path_stays_hidden_in_a_sandbox_built_ahead() {
    let s = start_server(
        "[profile.code.filesystem]\ndeny = [\"/workspace/a/secret\"]\n",
        &["--max-concurrent", "1"],
    );
    let server = s.child.id();
    let body = r#"{"command": ["sh", "-c", "cat a/secret; echo rc=$?"],
        "files": [{"path": "a/secret", "content": "TOPSECRET"}]}"#;
    for round in 0..2 {
        wait_until(10, "a prepared sandbox", || {
            prepared_sandboxes(server).len() == 1
        });
        let (status, v) = post(&s, None, body);
        assert_eq!(status, 200, "{v}");
        let out = v["stdout"].as_str().unwrap_or_default();
        assert!(
            !out.contains("TOPSECRET"),
            "round {round}: the denied file was read: {v}"
        );
        assert!(out.contains("rc=1"), "round {round}: {v}");
    }
}

#[test]
fn a_refused_request_leaves_its_sandbox_built_ahead_to_the_next() {
    let s = start_server("", &["--max-concurrent", "1"]);
    let server = s.child.id();
    let ahead = s.work().join("ahead");
    let count = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .count()
    };
    wait_until(10, "a prepared sandbox", || {
        prepared_sandboxes(server).len() == 1
    });
    let old = prepared_sandboxes(server)[0];
    let (status, v) = post(&s, None, r#"{"command": ["perl", "-e", "1"]}"#);
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "command.not_allowed", "{v}");
    // (Taking it emptied the pool: a new one may be built meanwhile.)
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        prepared_sandboxes(server).contains(&old),
        "the sandbox the refused request took waits again"
    );
    // The next request runs in it (it is handed out first).
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "exit 0"]}"#);
    assert_eq!(status, 200, "{v}");
    wait_until(
        10,
        "it ran; a replacement waits, with one workspace each",
        || {
            let now = prepared_sandboxes(server);
            !now.contains(&old) && !now.is_empty() && now.len() == count(&ahead)
        },
    );
    let taken = prepared_sandboxes(server)[0];
    let (status, v) = post(
        &s,
        None,
        r#"{"command": ["perl"], "files": [{"path": "in.txt", "content": "x"}]}"#,
    );
    assert_eq!(status, 422, "{v}");
    wait_until(10, "the one it took let go, its workspace removed", || {
        let now = prepared_sandboxes(server);
        !now.contains(&taken) && !now.is_empty() && now.len() == count(&ahead)
    });
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "ls"]}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "", "a fresh workspace: {v}");
}

/// A server whose log lines (stderr after the first line) a thread hands
/// over as they come, with `env` added to its environment.
fn start_logged(flags: &[&str], env: &[(&str, &str)]) -> (Server, LogLines) {
    start_logged_with("", flags, env)
}

/// [`start_logged`] with `extra` added to the config.
fn start_logged_with(extra: &str, flags: &[&str], env: &[(&str, &str)]) -> (Server, LogLines) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), extra);
    let mut child = corral()
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0"])
        .args(flags)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_string();
    assert!(
        line.starts_with("corral: serving on http://127.0.0.1:"),
        "the first line is still the plain announcement: {line}"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let server = Server {
        child,
        addr,
        dir: Some(dir),
    };
    (
        server,
        LogLines {
            rx,
            seen: Vec::new(),
        },
    )
}

/// The JSON log lines of a server, parsed as they arrive.
struct LogLines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<serde_json::Value>,
}

impl LogLines {
    /// Waits (at most 10 s) for an event whose message is `message` and
    /// that satisfies `matches`; returns it. Every line must be JSON.
    fn wait_for(
        &mut self,
        message: &str,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.wait_matching(&format!("`{message}` event"), |v| {
            v["fields"]["message"] == message && matches(v)
        })
    }

    /// Waits (at most 10 s) for an event whose `code` field is `code`.
    fn wait_for_code(&mut self, code: &str) -> serde_json::Value {
        self.wait_matching(&format!("event with code `{code}`"), |v| {
            v["fields"]["code"] == code
        })
    }

    /// Waits (at most 10 s) for an event that satisfies `matches`, named
    /// `what` in the failure.
    fn wait_matching(
        &mut self,
        what: &str,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = self.seen.iter().find(|v| matches(v)) {
                return v.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.seen.push(
                    serde_json::from_str(&line)
                        .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}")),
                ),
                Err(_) => panic!("no {what}; saw {:#?}", self.seen),
            }
        }
    }

    /// Everything until the server closes stderr (it exited).
    fn rest(&mut self) -> &[serde_json::Value] {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}")),
            );
        }
        &self.seen
    }
}

/// Stops a server as SIGTERM does and waits for it.
fn terminate(s: &mut Server) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = s.child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "a graceful stop exits 0");
}

/// A profile whose bind source this host lacks would refuse every run:
/// the server says so once, at start (a warning: the config may be shared
/// with machines that have it), naming the profile, the key and the path.
#[test]
fn a_profile_bind_this_host_lacks_is_logged_at_start() {
    let (_s, mut logs) = start_logged_with(
        "[profile.far]\nextends = \"code\"\n[profile.far.filesystem]\nread_only = [\"/nonexistent-corral-test/data\"]\n",
        &[],
        &[],
    );
    let warned = logs.wait_matching("the warning about profile `far`", |v| {
        v["fields"]["profile"] == "far"
    });
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert_eq!(
        (
            warned["fields"]["key"].as_str(),
            warned["fields"]["path"].as_str()
        ),
        (
            Some("filesystem.read_only"),
            Some("/nonexistent-corral-test/data")
        ),
        "{warned}"
    );
    assert!(
        warned["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not exist on this host")),
        "{warned}"
    );
}

#[test]
fn logs_are_json_lines_with_a_span_per_request_and_per_execution() {
    // The flag wins over the environment.
    let (mut s, mut logs) = start_logged(&["--log-level", "info"], &[("CORRAL_LOG", "off")]);
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "echo hi"]}"#);
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (status, _, _) = http(&s.addr, "GET", "/nope?token=secret", None, None);
    assert_eq!(status, 404);

    let run = logs.wait_for("execution finished", |e| e["span"]["execution_id"] == id);
    assert_eq!(run["level"], "INFO");
    assert_eq!(
        (
            run["span"]["name"].as_str(),
            run["span"]["outcome"].as_str(),
            run["span"]["exit_code"].as_i64(),
            run["span"]["tenant"].as_str(),
            run["span"]["profile"].as_str(),
        ),
        (
            Some("execution"),
            Some("exited"),
            Some(0),
            Some("anonymous"),
            Some("code")
        ),
        "{run}"
    );
    assert!(run["span"]["duration_ms"].is_u64(), "{run}");
    // The execution's span is a child of its request's.
    let parent = &run["spans"][0];
    assert_eq!(
        (parent["name"].as_str(), parent["path"].as_str()),
        (Some("request"), Some("/v1/executions")),
        "{run}"
    );
    let request_id = parent["request_id"].as_str().unwrap().to_string();
    assert_eq!(request_id.len(), 16, "{run}");

    let posted = logs.wait_for("request finished", |e| {
        e["span"]["request_id"] == request_id.as_str()
    });
    assert_eq!(
        (
            posted["span"]["method"].as_str(),
            posted["span"]["status"].as_u64(),
            posted["span"]["tenant"].as_str(),
        ),
        (Some("POST"), Some(200), Some("anonymous")),
        "{posted}"
    );
    // A refused execution is logged too (after its answer), with the
    // refusal's code.
    let (status, v) = post(&s, None, r#"{"command": ["perl", "-e", "1"]}"#);
    assert_eq!(status, 422, "{v}");
    let refused_id = v["id"]
        .as_str()
        .expect("a refusal's record has an id")
        .to_string();
    let refused = logs.wait_for("execution refused", |e| {
        e["span"]["execution_id"] == refused_id.as_str()
    });
    assert_eq!(
        (
            refused["span"]["outcome"].as_str(),
            refused["fields"]["code"].as_str(),
        ),
        (Some("refused"), v["error"]["code"].as_str()),
        "{refused} for {v}"
    );
    assert!(refused["span"]["duration_ms"].is_u64(), "{refused}");
    // A refusal of the API is an audit event, logged at warn under the
    // API's target, without a supervised server's field.
    let (status, _, _) = http_with(
        &s.addr,
        "POST",
        "/v1/executions",
        &[("Content-Type", "text/plain")],
        Some("{}"),
    );
    assert_eq!(status, 415);
    let api = logs.wait_for_code("api.refused");
    assert_eq!(
        (
            api["level"].as_str(),
            api["target"].as_str(),
            api["fields"]["tenant"].as_str()
        ),
        (Some("WARN"), Some("corral_server::api"), Some("anonymous")),
        "{api}"
    );
    assert!(api["fields"].get("server").is_none(), "{api}");
    let missing = logs.wait_for("request finished", |e| e["span"]["path"] == "/nope");
    assert_eq!(missing["span"]["status"], 404, "{missing}");
    assert_ne!(missing["span"]["request_id"], request_id.as_str());
    // The query (which could carry anything) is not logged.
    assert!(
        !missing.to_string().contains("secret"),
        "the query leaked: {missing}"
    );
    terminate(&mut s);
    let all = logs.rest();
    assert!(
        all.iter().any(|e| e["fields"]["message"] == "stopped"),
        "{all:#?}"
    );
}

#[test]
fn the_log_filter_comes_from_corral_log_and_a_bad_one_is_refused() {
    let (mut s, mut logs) = start_logged(&[], &[("CORRAL_LOG", "warn")]);
    let (status, v) = post(&s, None, r#"{"command": ["sh", "-c", "true"]}"#);
    assert_eq!(status, 200, "{v}");
    terminate(&mut s);
    let all = logs.rest();
    assert!(
        all.iter()
            .all(|e| e["level"] == "WARN" || e["level"] == "ERROR"),
        "CORRAL_LOG=warn let more through: {all:#?}"
    );

    let (_dir, cfg) = config("");
    let out = corral()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "loud",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("invalid log filter \"loud\" (from --log-level)"),
        "{}",
        text(&out.stderr)
    );
    let out = corral()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .env("CORRAL_LOG", "info,corral_server=loud")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("(from CORRAL_LOG)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_plan_larger_than_a_socket_message_reaches_the_sandbox_whole() {
    // Ten arguments of 25 KB: a plan of ~250 KB, more than one
    // SOCK_SEQPACKET message holds (~208 KiB), which the re-executed
    // helper used to be sent in ("Message too long").
    let s = start_server("", &[]);
    let big: Vec<String> = (0..10u8)
        .map(|i| char::from(b'a' + i).to_string().repeat(25_000))
        .collect();
    let mut command = vec![
        "sh".to_string(),
        "-c".into(),
        r#"for a; do printf '%s %s\n' "$(printf %.1s "$a")" "${#a}"; done"#.into(),
        "sh".into(),
    ];
    command.extend(big);
    let body = serde_json::json!({ "command": command }).to_string();
    let (status, v) = post(&s, None, &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    let expected: String = (0..10u8)
        .map(|i| format!("{} 25000\n", char::from(b'a' + i)))
        .collect();
    assert_eq!(v["stdout"], expected, "{v}");
}

/// (status, error code, head) of a raw HTTP/1.1 request to `s` with
/// `headers` (Host first, as given) and an optional body.
fn raw(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let (status, head, body) = raw_request(&s.addr, &req);
    let code = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default();
    (status, code, head.to_ascii_lowercase())
}

/// (what, path, headers, body, expected status, expected code).
type AttackCase<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a str,
    u16,
    &'a str,
);

#[test]
fn web_pages_cannot_drive_the_server_in_anonymous_or_tenant_mode() {
    // What a hostile page can send without a preflight (a "simple"
    // request: text/plain), from its own origin or under a rebinding
    // host name; MCP Inspector's CVE-2025-49596 class.
    for extra in [String::new(), tenant("alice", "alice-token")] {
        let s = start_server(&format!("code_mode = true\n{extra}"), &[]);
        let auth = if extra.is_empty() {
            ""
        } else {
            "Bearer alice-token"
        };
        let run = r#"{"language": "bash", "code": "echo pwned"}"#;
        let mut base = vec![("Host", s.addr.as_str())];
        if !auth.is_empty() {
            base.push(("Authorization", auth));
        }
        let with = |more: &[(&'static str, &'static str)]| {
            let mut h = base.clone();
            h.extend_from_slice(more);
            h
        };
        let cases: Vec<AttackCase> = vec![
            (
                "cross-origin text/plain POST",
                "/v1/executions",
                with(&[
                    ("Origin", "https://evil.example"),
                    ("Content-Type", "text/plain"),
                ]),
                run,
                403,
                "request.origin_refused",
            ),
            (
                "cross-origin JSON POST",
                "/v1/executions",
                with(&[
                    ("Origin", "https://evil.example"),
                    ("Content-Type", "application/json"),
                ]),
                run,
                403,
                "request.origin_refused",
            ),
            (
                "text/plain POST without an origin",
                "/v1/executions",
                with(&[("Content-Type", "text/plain")]),
                run,
                415,
                "unsupported_media_type",
            ),
            (
                "cross-origin MCP initialize",
                "/mcp",
                with(&[
                    ("Origin", "http://evil.example"),
                    ("Content-Type", "application/json"),
                    ("Accept", "application/json, text/event-stream"),
                ]),
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#,
                403,
                "request.origin_refused",
            ),
        ];
        for (what, path, headers, body, status, code) in cases {
            let (got, got_code, _) = raw(&s, "POST", path, &headers, body);
            assert_eq!(
                (got, got_code.as_str()),
                (status, code),
                "{what} ({extra:?})"
            );
        }
        // DNS rebinding: the page's own name, resolved to 127.0.0.1.
        let mut rebound = vec![("Host", "evil.example:80")];
        if !auth.is_empty() {
            rebound.push(("Authorization", auth));
        }
        let (got, code, _) = raw(&s, "GET", "/v1/executions", &rebound, "");
        assert_eq!(
            (got, code.as_str()),
            (403, "request.host_refused"),
            "rebinding ({extra:?})"
        );
        // Nothing ran.
        let (got, _, _) = raw(&s, "GET", "/v1/executions", &base, "");
        assert_eq!(got, 200);
        let token = (!auth.is_empty()).then_some("alice-token");
        let (_, _, list) = http(&s.addr, "GET", "/v1/executions", token, None);
        assert_eq!(json(&list)["items"], serde_json::json!([]), "{extra:?}");
    }
}

#[test]
fn an_allowed_origin_gets_cors_answers_and_no_other_does() {
    let s = start_server("allowed_origins = [\"http://app.test:3000\"]\n", &[]);
    let host = s.addr.clone();
    let (status, _, head) = raw(
        &s,
        "OPTIONS",
        "/v1/executions",
        &[
            ("Host", &host),
            ("Origin", "http://app.test:3000"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        "",
    );
    assert_eq!(status, 204, "{head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.test:3000"),
        "{head}"
    );
    assert!(head.contains("access-control-allow-headers:"), "{head}");
    let (status, _, head) = raw(
        &s,
        "POST",
        "/v1/executions",
        &[
            ("Host", &host),
            ("Origin", "http://app.test:3000"),
            ("Content-Type", "application/json"),
        ],
        r#"{"command": ["sh", "-c", "echo hi"]}"#,
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.test:3000"),
        "{head}"
    );
    let (status, code, head) = raw(
        &s,
        "OPTIONS",
        "/v1/executions",
        &[("Host", &host), ("Origin", "http://app.test:3001")],
        "",
    );
    assert_eq!((status, code.as_str()), (403, "request.origin_refused"));
    assert!(!head.contains("access-control-allow-origin"), "{head}");
}

#[test]
fn every_401_names_the_bearer_scheme() {
    let s = start_server(&tenant("alice", "alice-token"), &[]);
    let host = s.addr.clone();
    for (method, path, headers) in [
        ("GET", "/v1/limits", vec![("Host", host.as_str())]),
        (
            "GET",
            "/v1/limits",
            vec![("Host", host.as_str()), ("Authorization", "Bearer nope")],
        ),
        (
            "POST",
            "/mcp",
            vec![
                ("Host", host.as_str()),
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ],
        ),
    ] {
        let (status, code, head) = raw(&s, method, path, &headers, "{}");
        assert_eq!(status, 401, "{method} {path}: {head}");
        assert!(code.starts_with("auth."), "{method} {path}: {code}");
        assert!(
            head.contains("www-authenticate: bearer realm=\"corral\""),
            "{head}"
        );
    }
}

#[test]
fn every_refusal_leaves_an_audit_record_and_token_floods_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("audit.jsonl");
    let extra = format!("audit_jsonl = \"{}\"\n", jsonl.display())
        + &tenant("alice", "alice-token")
        + &tenant("bob", "bob-token");
    let cfg = serve_config(dir.path(), &extra);
    let s = start_server_in(dir, &cfg, &[]);
    let (status, v) = post(
        &s,
        Some("alice-token"),
        r#"{"command": ["sh", "-c", "true"]}"#,
    );
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    // A traversal, a forbidden profile, and a read of another tenant's
    // record.
    let (status, _) = post(
        &s,
        Some("bob-token"),
        r#"{"command": ["sh"], "files": [{"path": "../escape", "content": "x"}]}"#,
    );
    assert_eq!(status, 400);
    let (status, _) = post(
        &s,
        Some("bob-token"),
        r#"{"profile": "nope", "command": ["sh"]}"#,
    );
    assert_eq!(status, 403);
    let (status, _, _) = http(
        &s.addr,
        "GET",
        &format!("/v1/executions/{id}"),
        Some("bob-token"),
        None,
    );
    assert_eq!(status, 404);
    // Thirty wrong tokens from one address.
    for i in 0..30 {
        let (status, _) = post(&s, Some(&format!("guess-{i}")), "{}");
        assert_eq!(status, 401);
    }
    let mut events = Vec::new();
    wait_until(10, "the refusals reach the audit file", || {
        events = audit_events(&jsonl);
        events.iter().filter(|e| e["code"] == "api.refused").count() >= 3
            && events
                .iter()
                .filter(|e| e["code"] == "auth.refused")
                .count()
                >= 20
    });
    let api: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["code"] == "api.refused")
        .collect();
    let by_error = |code: &str| {
        api.iter()
            .find(|e| e["event"]["fields"]["error"] == code)
            .unwrap_or_else(|| panic!("no api.refused with {code}: {api:?}"))
    };
    let traversal = by_error("path.traversal");
    assert_eq!(traversal["tenant"], "bob");
    assert_eq!(by_error("profile.forbidden")["tenant"], "bob");
    let cross = by_error("execution.not_found");
    assert_eq!(cross["tenant"], "bob");
    assert!(cross["event"]["fields"]["path"]
        .as_str()
        .unwrap()
        .contains(&id));
    assert!(cross["event"]["fields"]["peer"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    // Twenty a minute per address are recorded; the rest only counted.
    std::thread::sleep(Duration::from_millis(500));
    let auth: Vec<serde_json::Value> = audit_events(&jsonl)
        .into_iter()
        .filter(|e| e["code"] == "auth.refused")
        .collect();
    assert_eq!(auth.len(), 20, "{auth:?}");
    assert_eq!(auth[0]["event"]["fields"]["error"], "auth.unknown_token");
    assert_eq!(auth[0]["event"]["level"], "warn");
}

#[test]
fn ten_thousand_input_files_are_written_in_linear_time_and_more_are_refused_up_front() {
    let s = start_server("max_request_bytes = \"16MiB\"\n", &[]);
    let files = |n: usize| {
        (0..n)
            .map(|i| serde_json::json!({"path": format!("d{}/f{i}", i % 100), "content": "x"}))
            .collect::<Vec<_>>()
    };
    let body = serde_json::json!({
        "command": ["sh", "-c", "find . -type f | wc -l"],
        "files": files(10_000),
    })
    .to_string();
    let t = Instant::now();
    let (status, v) = post(&s, None, &body);
    let took = t.elapsed();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"].as_str().unwrap().trim(), "10000");
    // Quadratic bookkeeping took a minute for 8,000 files.
    assert!(took < Duration::from_secs(10), "10,000 files took {took:?}");
    let body = serde_json::json!({"command": ["true"], "files": files(10_001)}).to_string();
    let (status, v) = post(&s, None, &body);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("request.invalid")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 10000"),
        "{v}"
    );
}

#[test]
fn a_stream_of_a_hundred_thousand_tiny_writes_arrives_byte_exact_with_event_ids() {
    let s = start_server("", &[]);
    let body = serde_json::json!({
        "command": ["python3", "-c", "import sys\nfor i in range(100000):\n    sys.stdout.write(f'{i}\\n'); sys.stdout.flush()\n"],
    })
    .to_string();
    let (status, _, raw) = http(&s.addr, "POST", "/v1/executions/stream", None, Some(&body));
    assert_eq!(status, 200, "{raw}");
    let events = sse_events(&raw);
    let stdout: String = events
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| d["data"].as_str().unwrap())
        .collect();
    let expected: String = (0..100_000).map(|i| format!("{i}\n")).collect();
    assert!(
        stdout == expected,
        "{} of {} bytes arrived",
        stdout.len(),
        expected.len()
    );
    let (last, result) = events.last().unwrap();
    assert_eq!(last, "result");
    assert_eq!(result["stream_dropped_bytes"], 0);
    assert_eq!(result["exit_code"], 0);
    // Merged: far fewer events than writes.
    assert!(events.len() < 50_000, "{} events", events.len());
    // Every event has an id, its position in the stream.
    let ids: Vec<u64> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert_eq!(ids.first(), Some(&1));
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids in order");
    assert!(ids.len() >= events.len());
}

#[test]
fn metrics_are_labelled_and_parse_in_both_exposition_formats() {
    let extra = tenant("alice", "alice-token") + &tenant("bob", "bob-token");
    let s = start_server(&extra, &[]);
    for (token, cmd) in [
        ("alice-token", r#"{"command": ["sh", "-c", "true"]}"#),
        ("alice-token", r#"{"command": ["sh", "-c", "true"]}"#),
        ("bob-token", r#"{"command": ["sh", "-c", "exit 3"]}"#),
    ] {
        let (status, v) = post(&s, Some(token), cmd);
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = post(&s, Some("bob-token"), r#"{"command": ["nope"]}"#);
    assert_eq!(status, 422, "{v}");
    let scrape = |accept: &str| {
        let (status, head, body) =
            http_with(&s.addr, "GET", "/metrics", &[("Accept", accept)], None);
        assert_eq!(status, 200);
        (head.to_ascii_lowercase(), body)
    };
    let (head, text) = scrape("text/plain");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let (head, om) = scrape("application/openmetrics-text; version=1.0.0");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(om.ends_with("# EOF\n"));
    for (format, body) in [("text", &text), ("openmetrics", &om)] {
        let v = parse_metrics(format, body);
        let runs = &v["corral_executions_total"];
        assert_eq!(
            runs["outcome=ok,profile=code,tenant=alice"], 2.0,
            "{format}: {v}"
        );
        assert_eq!(
            runs["outcome=error,profile=code,tenant=bob"], 1.0,
            "{format}: {v}"
        );
        assert_eq!(
            runs["outcome=refused,profile=code,tenant=bob"], 1.0,
            "{format}: {v}"
        );
        assert_eq!(
            v["corral_execution_duration_seconds_count"]["profile=code"], 4.0,
            "{format}: {v}"
        );
        assert_eq!(
            v["corral_build_info"][format!("version={}", env!("CARGO_PKG_VERSION"))],
            1.0,
            "{format}: {v}"
        );
        assert!(
            v["corral_audit_db_bytes"][""].as_f64().unwrap() > 0.0,
            "{format}: {v}"
        );
        // Every accepted execution counted its wait for a slot (none here:
        // HTTP never queues); no MCP session is open.
        assert_eq!(
            v["corral_queue_wait_seconds_count"]["via=http"], 4.0,
            "{format}: {v}"
        );
        assert_eq!(
            v["corral_queue_wait_seconds_bucket"]["le=0.01,via=http"], 4.0,
            "{format}: {v}"
        );
        assert_eq!(v["corral_mcp_sessions"][""], 0.0, "{format}: {v}");
    }
}

#[test]
fn audit_records_stay_small_whatever_the_program_prints() {
    // Each request is a few dozen bytes; each program prints a mebibyte of
    // control bytes (six mebibytes once JSON-escaped). The store used to
    // keep all of it; now it keeps digests and sizes.
    let s = start_server("", &[]);
    let body =
        r#"{"command": ["python3", "-c", "import sys; sys.stdout.write(chr(1) * (1 << 20))"]}"#;
    for _ in 0..5 {
        let (status, v) = post(&s, None, body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["stdout_bytes"], 1 << 20, "{v}");
    }
    let stored: u64 = ["audit.db", "audit.db-wal"]
        .iter()
        .map(|f| std::fs::metadata(s.path().join(f)).map_or(0, |m| m.len()))
        .sum();
    assert!(
        stored < 512 << 10,
        "5 MiB of output made a {stored}-byte audit store"
    );

    // Asked for, the text is kept up to the cap, and the cut is marked.
    let s = start_server(
        "audit_outputs = \"full\"\naudit_output_max_bytes = \"4KiB\"\n",
        &[],
    );
    let (status, v) = post(&s, None, body);
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().unwrap();
    let (_, _, record) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    let record = json(&record);
    assert_eq!(
        (
            record["stdout"].as_str().map(str::len),
            record["stdout_audit_truncated"].as_bool()
        ),
        (Some(4096), Some(true))
    );
    assert_eq!(record["stdout_bytes"], 1 << 20);
}

#[test]
fn a_run_larger_than_an_inline_message_reaches_its_sandbox_whole() {
    // A run's plan travels in the message that starts it when small, in a
    // sealed memfd when larger than 16 KiB: 40,000 bytes of environment
    // take the second way, to a sandbox built ahead (the program part) and
    // to one the run builds (its whole plan: other cgroup limits than the
    // sandbox built ahead was made for).
    let s = start_server("", &["--max-concurrent", "1"]);
    let big = "x".repeat(40_000);
    for limits in ["", r#", "limits": {"memory_bytes": 536870912}"#] {
        wait_until(10, "a sandbox built ahead", || {
            prepared_sandboxes(s.child.id()).len() == 1
        });
        let body = format!(
            r#"{{"command": ["sh", "-c", "printf %s \"$BIG\" | wc -c; echo \"$SMALL\""], "env": {{"BIG": "{big}", "SMALL": "end"}}{limits}}}"#
        );
        let (status, v) = post(&s, None, &body);
        assert_eq!(status, 200, "{limits}: {v}");
        assert_eq!(v["stdout"], "40000\nend\n", "{limits}: {v}");
    }
}

#[test]
fn workspace_mount_points_are_on_a_tmpfs_of_the_servers_own_and_go_with_it() {
    let s = start_server("", &["--max-concurrent", "1"]);
    let pid = s.child.id();
    wait_until(10, "a sandbox built ahead", || {
        prepared_sandboxes(pid).len() == 1
    });
    let names = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    // The server sees the workspace of its sandbox built ahead...
    let held = names(&s.work().join("ahead"));
    assert!(
        held.len() == 1 && held[0].starts_with("corral-ws-"),
        "the server's view of ahead/: {held:?}"
    );
    // ...on a tmpfs of its own mount namespace, which the host's disk does
    // not hold: the host sees the empty directory it is mounted on.
    let on_host = s.own_dir_on_host().join("workspaces");
    assert_eq!(names(&on_host), Vec::<String>::new(), "the host's view");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let base = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == on_host.to_str())
        .unwrap_or_else(|| panic!("no mount at {} in:\n{mountinfo}", on_host.display()));
    let (options, rest) = base.split_once(" - ").unwrap();
    assert!(rest.starts_with("tmpfs corral-mountpoints "), "{base}");
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(
            options.split([' ', ',']).any(|o| o == flag),
            "{flag}: {base}"
        );
    }
    // A run that builds its own sandbox (other cgroup limits than the one
    // built ahead) gets its workspace there too, while the host still sees
    // none.
    let addr = s.addr.clone();
    let run = std::thread::spawn(move || {
        let body = r#"{"command": ["sh", "-c", "mkdir output && pwd > output/where && sleep 1"],
                       "limits": {"memory_bytes": 536870912}}"#;
        http(&addr, "POST", "/v1/executions", None, Some(body))
    });
    let workspaces = |dir: &std::path::Path| -> Vec<String> {
        names(dir)
            .into_iter()
            .filter(|n| n.starts_with("corral-ws-"))
            .collect()
    };
    wait_until(10, "the run's workspace in the server's view", || {
        workspaces(&s.work()).len() == 1
    });
    assert_eq!(
        workspaces(&on_host),
        Vec::<String>::new(),
        "the host's view"
    );
    let (status, _, body) = run.join().unwrap();
    let v = json(&body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["outputs"][0]["content"], "/workspace\n", "{v}");
    wait_until(10, "the run's workspace removed", || {
        workspaces(&s.work()).is_empty()
    });
    // A graceful stop detaches the tmpfs and removes the server's own
    // directory from the host.
    let own = s.own_dir_on_host();
    let mut s = s;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!own.exists(), "{} was left on the host", own.display());
}

/// Bytes of the files under `dir` as the host sees them (no symlinks
/// followed).
fn host_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

#[test]
fn a_workspace_holds_workspace_size_and_never_touches_the_host_disk() {
    // The program tries to write 2 GiB in 64 MiB files (under any
    // per-file limit) and reports how far it got; then it waits, so the
    // host's view of the work directory can be measured while it runs.
    let s = start_server(
        "[profile.code.filesystem]\nworkspace_size = \"256MiB\"\n",
        &[],
    );
    let code = r#"
import errno, os, sys, time
written = 0
try:
    for n in range(32):
        with open(f"f{n}", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
except OSError as e:
    print(errno.errorcode[e.errno], written >> 20, flush=True)
time.sleep(3)
"#;
    let body = serde_json::json!({"command": ["python3", "-c", code]}).to_string();
    let addr = s.addr.clone();
    let run = std::thread::spawn(move || {
        let (status, _, body) = http(&addr, "POST", "/v1/executions", None, Some(&body));
        (status, json(&body))
    });
    std::thread::sleep(Duration::from_millis(2500));
    let on_disk = host_bytes(&s.own_dir_on_host());
    let (status, v) = run.join().unwrap();
    assert_eq!(status, 200, "{v}");
    let out = v["stdout"].as_str().unwrap_or_default();
    let (code, mib) = out.trim().split_once(' ').unwrap_or(("", ""));
    let mib: u64 = mib.parse().unwrap_or(u64::MAX);
    assert_eq!(code, "ENOSPC", "{v}");
    assert!((200..=256).contains(&mib), "stopped after {mib} MiB: {v}");
    assert!(
        on_disk < 1 << 20,
        "the host disk held {on_disk} bytes of the workspace"
    );
}

//! `corral serve`: a real server process, real HTTP requests, real
//! sandboxes behind it.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running `corral serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
    dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// sha256 hex via python (the tests avoid extra crates).
fn sha256(token: &str) -> String {
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
            token,
        ])
        .output()
        .unwrap();
    text(&out.stdout).trim().to_string()
}

fn start(extra_config: &str, flags: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let cfg = dir.path().join("corral.toml");
    let base = format!(
        "[profile.code]\n[profile.code.limits]\nallow_unenforced = {unenforced}\n[server]\naudit_db = \"{db}\"\nwork_dir = \"{work}\"\n{extra_config}",
        unenforced = !is_root(),
        db = dir.path().join("audit.db").display(),
        work = work.display(),
    );
    std::fs::write(&cfg, base).unwrap();
    start_with(dir, &cfg, flags)
}

fn start_with(dir: tempfile::TempDir, cfg: &std::path::Path, flags: &[&str]) -> Server {
    let mut child = corral()
        .arg("serve")
        .arg("--config")
        .arg(cfg)
        .args(["--listen", "127.0.0.1:0"])
        .args(flags)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    Server {
        child,
        addr,
        dir: Some(dir),
    }
}

/// A minimal HTTP/1.1 client: (status, headers, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, head.to_string(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn post(s: &Server, token: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    let (status, _, body) = http(&s.addr, "POST", "/v1/executions", token, Some(body));
    (status, json(&body))
}

#[test]
fn runs_a_command_and_keeps_its_record() {
    let s = start("", &[]);
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
    assert_eq!(json(&body)["stdout"], "42\n");
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
    let s = start("", &[]);
    let (status, v) = post(&s, None, r#"{"language": "python", "code": "print(1)"}"#);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("code_mode.disabled")),
        "{v}"
    );
    let s = start("", &["--code-mode"]);
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
    let extra = format!(
        "[[server.tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nprofiles = [\"code\"]\n[[server.tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\nprofiles = [\"code\"]\n",
        sha256("alice-token"),
        sha256("bob-token")
    );
    let s = start(&extra, &[]);
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
    let s = start("", &[]);
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
    let (status, _, _) = http(&s.addr, "GET", "/nope", None, None);
    assert_eq!(status, 404);
    let huge = format!(
        r#"{{"command": ["sh"], "stdin": "{}"}}"#,
        "x".repeat(9 << 20)
    );
    let (status, _, _) = http(&s.addr, "POST", "/v1/executions", None, Some(&huge));
    assert_eq!(status, 413);
}

#[test]
fn input_files_go_in_and_output_files_come_back() {
    let s = start("", &[]);
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
fn saturation_answers_429_with_retry_after_and_never_queues() {
    let s = start("", &["--max-concurrent", "2"]);
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
    let s = start("", &[]);
    let token = format!("corral-disconnect-{}", std::process::id());
    let body =
        format!(r#"{{"command": ["python3", "-c", "import time; time.sleep(60)", "{token}"]}}"#);
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let req = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).unwrap();
    let running = || process_running("python3", &token);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running() {
        assert!(Instant::now() < deadline, "the execution never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(5);
    while running() {
        assert!(
            Instant::now() < deadline,
            "the execution outlived its client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn killing_the_server_leaves_no_sandbox_and_records_survive_a_restart() {
    let s = start("", &[]);
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running() {
        assert!(Instant::now() < deadline, "the execution never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = s;
    let dir = s.dir.take().unwrap();
    s.child.kill().unwrap(); // SIGKILL: no chance to clean up
    s.child.wait().unwrap();
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while running() {
        assert!(
            Instant::now() < deadline,
            "a sandbox outlived its killed server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Same config, same audit database: the record is still there, and the
    // killed server's workspace is swept.
    let cfg = dir.path().join("corral.toml");
    let s = start_with(dir, &cfg, &[]);
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200);
    assert_eq!(json(&body)["stdout"], "kept\n");
    // Only the new server's own (empty) directory is left.
    let left: Vec<String> = std::fs::read_dir(s.dir.as_ref().unwrap().path().join("work"))
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
    let s = start("", &[]);
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

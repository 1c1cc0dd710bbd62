//! The MCP side of the service, driven by the official Python SDK (`mcp`
//! from PyPI, 2.x and the newest 1.x) and TypeScript SDK as clients:
//! streamable HTTP against `corral serve`, and stdio against `corral mcp`.
//!
//! The clients' interpreters are `$CORRAL_TEST_PYTHON`, else
//! `/opt/corral-test-venv/bin/python` (2.x), and `$CORRAL_TEST_PYTHON_MCP1`,
//! else `/opt/corral-test-venv-mcp1/bin/python` (1.x); scripts/test.sh
//! installs both. Their absence fails the tests: an interop suite that
//! silently skips proves nothing.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A client that runs a list of steps in one MCP session and prints one
/// JSON answer per step (the first: the negotiated protocol version).
/// argv[1] is the target: `{"url", "token"?}` or `{"command": [...]}`;
/// the steps come on stdin: `["list"]` or `["call", tool, arguments]`.
const CLIENT: &str = r#"
import asyncio, json, sys, traceback
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

async def drive(transport, steps):
    out = []
    async with Client(transport) as client:
        out.append({"protocol": client.protocol_version})
        for step in steps:
            if step[0] == "list":
                tools = await client.list_tools()
                out.append({"tools": sorted(t.name for t in tools.tools)})
                continue
            try:
                r = await client.call_tool(step[1], step[2])
            except MCPError as e:
                out.append({"rpc_error": str(e)})
                continue
            text = "".join(c.text for c in r.content if c.type == "text")
            out.append({"is_error": r.is_error, "text": text, "structured": r.structured_content})
    return out

async def main():
    target = json.loads(sys.argv[1])
    steps = json.load(sys.stdin)
    if "url" in target:
        headers = {"Authorization": "Bearer " + target["token"]} if target.get("token") else {}
        timeout = httpx2.Timeout(30.0, read=60.0)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            return await drive(streamable_http_client(target["url"], http_client=http), steps)
    cmd = target["command"]
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=target.get("env"))
    return await drive(stdio_client(params), steps)

try:
    out = asyncio.run(asyncio.wait_for(main(), 60))
except BaseException as e:
    out = [{"fatal": "".join(traceback.format_exception(e))[-4000:]}]
print(json.dumps(out))
"#;

/// Two sessions at once, each running `sleep 3` through run_code; prints
/// both answers.
const SATURATE: &str = r#"
import asyncio, json, sys
from mcp import Client

async def one(url, delay):
    await asyncio.sleep(delay)
    async with Client(url) as client:
        r = await client.call_tool("run_code", {"language": "bash", "code": "sleep 3; echo done"})
        return {"is_error": r.is_error, "structured": r.structured_content}

async def main():
    url = sys.argv[1]
    return await asyncio.gather(one(url, 0), one(url, 1))

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
"#;

/// One MCP session of the 2.x client ([`CLIENT`]) against `target`,
/// running `steps`.
fn session(target: Value, steps: Value) -> Vec<Value> {
    sdk_session(PySdk::V2, CLIENT, &target, &steps)
}

fn list() -> Value {
    json!(["list"])
}

fn call(tool: &str, args: Value) -> Value {
    json!(["call", tool, args])
}

/// A successful tool answer.
fn ok(v: &Value) -> &Value {
    assert_eq!(v["is_error"], false, "expected success: {v}");
    &v["structured"]
}

/// A tool error with this code.
fn refused(v: &Value, code: &str) {
    assert_eq!(v["is_error"], true, "expected a tool error {code}: {v}");
    assert_eq!(v["structured"]["error"]["code"], code, "{v}");
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains(code) && text.len() > code.len() + 10,
        "unclear message: {text}"
    );
}

impl Server {
    /// The client's target: this server's MCP endpoint, with `token`.
    fn target(&self, token: Option<&str>) -> Value {
        let mut t = json!({"url": format!("http://{}/mcp", self.addr)});
        if let Some(token) = token {
            t["token"] = json!(token);
        }
        t
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Waits until `dir` holds no session workspace (`corral-ws-*`).
fn assert_no_workspace_left(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("corral-ws-"))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "session workspaces left behind in {}: {left:?}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const FILE_TOOLS: [&str; 3] = ["list_files", "read_file", "write_file"];
const ALL_TOOLS: [&str; 4] = ["list_files", "read_file", "run_code", "write_file"];

#[test]
fn http_lists_run_code_only_in_code_mode() {
    let s = start_server("", &[]);
    let out = session(
        s.target(None),
        json!([
            list(),
            call(
                "run_code",
                json!({"language": "python", "code": "print(1)"})
            )
        ]),
    );
    // A session-based revision: the per-session workspace needs sessions.
    assert_eq!(out[0]["protocol"], "2025-11-25");
    assert_eq!(out[1]["tools"], json!(FILE_TOOLS));
    // Not listed, not callable either.
    assert!(
        out[2].get("rpc_error").is_some() || out[2]["is_error"] == true,
        "run_code ran without code mode: {}",
        out[2]
    );
    drop(s);
    // `extra` lands in [server].
    let s = start_server("code_mode = true\n", &[]);
    let out = session(s.target(None), json!([list()]));
    assert_eq!(out[1]["tools"], json!(ALL_TOOLS));
    let s = start_server("", &["--code-mode"]);
    let out = session(s.target(None), json!([list()]));
    assert_eq!(out[1]["tools"], json!(ALL_TOOLS));
}

#[test]
fn http_run_code_shares_the_session_workspace_with_the_file_tools() {
    let s = start_server("", &["--code-mode"]);
    let code = "import os\n\
                data = open('data/in.txt').read()\n\
                print(data.upper())\n\
                os.makedirs('out', exist_ok=True)\n\
                open('out/result.txt', 'w').write(data[::-1])\n";
    let out = session(
        s.target(None),
        json!([
            call(
                "run_code",
                json!({"language": "python", "code": "print(6 * 7)"})
            ),
            call(
                "write_file",
                json!({"path": "data/in.txt", "content": "hello mcp"})
            ),
            call(
                "run_code",
                json!({"language": "python", "code": code, "timeout_ms": 20000})
            ),
            call("read_file", json!({"path": "out/result.txt"})),
            call("list_files", json!({})),
            call("list_files", json!({"path": "out"})),
            call(
                "write_file",
                json!({"path": "bin.dat", "content": "AP8Q", "encoding": "base64"})
            ),
            call("read_file", json!({"path": "bin.dat"})),
            call(
                "run_code",
                json!({"language": "bash", "code": "echo oops >&2; exit 3"})
            ),
        ]),
    );
    let first = ok(&out[1]);
    assert_eq!(
        (first["stdout"].as_str(), first["exit_code"].as_i64()),
        (Some("42\n"), Some(0)),
        "{first}"
    );
    assert!(
        out[1]["text"].as_str().unwrap().contains("42"),
        "{}",
        out[1]
    );
    assert_eq!(ok(&out[2])["size_bytes"], 9);
    let run = ok(&out[3]);
    assert_eq!(run["stdout"], "HELLO MCP\n", "{run}");
    assert_eq!(run["timed_out"], false);
    // The requested timeout is what applied.
    assert_eq!(run["limits"]["timeout_ms"], 20000);
    assert_eq!(ok(&out[4])["content"], "pcm olleh");
    let names: Vec<(&str, &str)> = ok(&out[5])["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    // corral's own `.corral/` (the code file) is not shown.
    assert_eq!(names, [("data", "dir"), ("out", "dir")]);
    assert_eq!(ok(&out[6])["entries"][0]["name"], "result.txt");
    assert_eq!(ok(&out[7])["size_bytes"], 3);
    let bin = ok(&out[8]);
    assert_eq!(
        (bin["encoding"].as_str(), bin["content"].as_str()),
        (Some("base64"), Some("AP8Q"))
    );
    let failed = ok(&out[9]);
    assert_eq!(
        (failed["exit_code"].as_i64(), failed["stderr"].as_str()),
        (Some(3), Some("oops\n"))
    );
    // Audited like any execution, visible through the HTTP API.
    let id = run["id"].as_str().unwrap();
    let (status, _, body) = http(&s.addr, "GET", &format!("/v1/executions/{id}"), None, None);
    assert_eq!(status, 200, "{body}");
    // The record keeps the output's digest, not the output.
    let record = serde_json::from_str::<Value>(&body).unwrap();
    assert_eq!(record["stdout_sha256"], sha256("HELLO MCP\n"), "{record}");
    assert!(record.get("stdout").is_none(), "{record}");
    // The session ended with the client: its workspace is gone.
    assert_no_workspace_left(&s.work());
}

#[test]
fn http_file_tools_refuse_traversal_symlinks_reserved_names_and_oversize() {
    let s = start_server("", &["--code-mode"]);
    let hostname = std::fs::read("/etc/hostname").unwrap_or_default();
    let plant =
        "ln -s /etc/hostname leak; ln -s /etc etc; mkdir -p sub; ln -s /etc/passwd sub/pw; \
                 head -c 2000000 /dev/zero > big.bin; echo planted";
    let out = session(
        s.target(None),
        json!([
            call("read_file", json!({"path": "../x"})),
            call("write_file", json!({"path": "../x", "content": "x"})),
            call("list_files", json!({"path": ".."})),
            call("read_file", json!({"path": "/etc/passwd"})),
            call(
                "write_file",
                json!({"path": "/tmp/corral-mcp-escape", "content": "x"})
            ),
            call("run_code", json!({"language": "bash", "code": plant})),
            call("read_file", json!({"path": "leak"})),
            call("read_file", json!({"path": "etc/hostname"})),
            call("read_file", json!({"path": "sub/pw"})),
            call(
                "write_file",
                json!({"path": "leak", "content": "overwritten"})
            ),
            call(
                "write_file",
                json!({"path": "etc/corral-mcp-escape", "content": "x"})
            ),
            call("list_files", json!({"path": "etc"})),
            call(
                "write_file",
                json!({"path": ".corral/main.py", "content": "x"})
            ),
            call(
                "write_file",
                json!({"path": ".corral-anything", "content": "x"})
            ),
            call("read_file", json!({"path": ".corral/main.py"})),
            call("list_files", json!({"path": ".corral"})),
            call(
                "write_file",
                json!({"path": "huge.txt", "content": "a".repeat((1 << 20) + 1)})
            ),
            call("read_file", json!({"path": "big.bin"})),
            call("read_file", json!({"path": "missing.txt"})),
            call("read_file", json!({"path": "sub"})),
            call("list_files", json!({})),
            call("read_file", json!({"path": "./.corral/main.sh"})),
        ]),
    );
    refused(&out[22], "path.reserved");
    refused(&out[1], "path.traversal");
    refused(&out[2], "path.traversal");
    refused(&out[3], "path.traversal");
    refused(&out[4], "path.absolute");
    refused(&out[5], "path.absolute");
    assert_eq!(ok(&out[6])["stdout"], "planted\n");
    refused(&out[7], "path.symlink");
    refused(&out[8], "path.symlink");
    refused(&out[9], "path.symlink");
    refused(&out[10], "path.symlink");
    refused(&out[11], "path.symlink");
    refused(&out[12], "path.symlink");
    refused(&out[13], "path.reserved");
    refused(&out[14], "path.reserved");
    refused(&out[15], "path.reserved");
    refused(&out[16], "path.reserved");
    refused(&out[17], "file.too_large");
    refused(&out[18], "file.too_large");
    refused(&out[19], "file.not_found");
    refused(&out[20], "file.not_regular");
    // The listing shows the planted links as links, never what they point at.
    let entries = &ok(&out[21])["entries"];
    let kind = |name: &str| {
        entries
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["kind"].as_str().unwrap().to_string())
    };
    assert_eq!(kind("leak").as_deref(), Some("symlink"), "{entries}");
    assert_eq!(kind("etc").as_deref(), Some("symlink"), "{entries}");
    assert_eq!(kind("huge.txt"), None, "an oversized write left a file");
    // Nothing on the host was touched through the links.
    assert_eq!(std::fs::read("/etc/hostname").unwrap_or_default(), hostname);
    assert!(!Path::new("/etc/corral-mcp-escape").exists());
    assert!(!Path::new("/tmp/corral-mcp-escape").exists());
    assert_no_workspace_left(&s.work());
}

#[test]
fn sessions_have_their_own_workspaces() {
    let s = start_server("", &["--code-mode"]);
    let out = session(
        s.target(None),
        json!([call(
            "write_file",
            json!({"path": "mine.txt", "content": "first session"})
        )]),
    );
    ok(&out[1]);
    let out = session(
        s.target(None),
        json!([
            call("read_file", json!({"path": "mine.txt"})),
            call("list_files", json!({})),
            call(
                "run_code",
                json!({"language": "bash", "code": "ls -A | grep -v '^.corral' | wc -l"})
            ),
        ]),
    );
    refused(&out[1], "file.not_found");
    assert_eq!(ok(&out[2])["entries"], json!([]));
    assert_eq!(ok(&out[3])["stdout"], "0\n");
    assert_no_workspace_left(&s.work());
}

#[test]
fn http_mcp_needs_a_token_and_sessions_belong_to_their_tenant() {
    let extra = tenant("alice", "alice-token") + &tenant("bob", "bob-token");
    let s = start_server(&extra, &["--code-mode"]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let mcp_headers = |token: Option<&'static str>, session: Option<String>| {
        let mut h: Vec<(String, String)> = vec![
            ("Content-Type".into(), "application/json".into()),
            (
                "Accept".into(),
                "application/json, text/event-stream".into(),
            ),
        ];
        if let Some(t) = token {
            h.push(("Authorization".into(), format!("Bearer {t}")));
        }
        if let Some(id) = session {
            h.push(("Mcp-Session-Id".into(), id));
            h.push(("MCP-Protocol-Version".into(), "2025-06-18".into()));
        }
        h
    };
    let send = |method: &str, h: &[(String, String)], body: Option<&str>| {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        http_with(&s.addr, method, "/mcp", &h, body)
    };
    // No token, a wrong one: the API's 401.
    let (status, _, body) = send("POST", &mcp_headers(None, None), Some(init));
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("auth.missing"), "{body}");
    let (status, _, body) = send("POST", &mcp_headers(Some("wrong"), None), Some(init));
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("auth.unknown_token"), "{body}");
    // Alice opens a session; bob cannot use, list or close it.
    let (status, head, body) = send("POST", &mcp_headers(Some("alice-token"), None), Some(init));
    assert_eq!(status, 200, "{head}\n{body}");
    let id = header(&head, "mcp-session-id").unwrap().to_string();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, _) = send(
        "POST",
        &mcp_headers(Some("bob-token"), Some(id.clone())),
        Some(list),
    );
    assert_eq!(status, 404, "bob used alice's session");
    let (status, _, _) = send(
        "DELETE",
        &mcp_headers(Some("bob-token"), Some(id.clone())),
        None,
    );
    assert_eq!(status, 404, "bob closed alice's session");
    let (status, _, _) = send(
        "DELETE",
        &mcp_headers(Some("alice-token"), Some(id.clone())),
        None,
    );
    assert!(
        status == 200 || status == 204,
        "alice could not close her session: {status}"
    );
    // The Python client with a token works end to end, as its tenant.
    let out = session(
        s.target(Some("bob-token")),
        json!([call(
            "run_code",
            json!({"language": "python", "code": "print('bob')"})
        )]),
    );
    let run = ok(&out[1]);
    assert_eq!(
        (run["stdout"].as_str(), run["tenant"].as_str()),
        (Some("bob\n"), Some("bob"))
    );
    // And without one it is refused.
    let out = run_sdk_python(CLIENT, &[s.target(None).to_string()], "[]");
    assert!(out[0].get("fatal").is_some(), "{out}");
}

#[test]
fn run_code_answers_busy_when_saturated() {
    let s = start_server("", &["--code-mode", "--max-concurrent", "1"]);
    let out = run_sdk_python(SATURATE, &[format!("http://{}/mcp", s.addr)], "");
    let answers = out.as_array().unwrap();
    let busy: Vec<&Value> = answers.iter().filter(|a| a["is_error"] == true).collect();
    let done: Vec<&Value> = answers.iter().filter(|a| a["is_error"] == false).collect();
    assert_eq!((busy.len(), done.len()), (1, 1), "{out}");
    assert_eq!(busy[0]["structured"]["error"]["code"], "busy", "{out}");
    assert_eq!(done[0]["structured"]["stdout"], "done\n", "{out}");
}

/// One session against argv[1] (`/mcp`) with `server.mcp_session_queue =
/// 1`: calls wait behind the running one; a call the SDK times out on (it
/// sends `notifications/cancelled`) is killed and frees the session at
/// once; a call cancelled while it waits leaves the queue; a full queue
/// answers busy. argv[2] is `/metrics`, read while the session is open.
const QUEUE: &str = r#"
import asyncio, json, sys, time, urllib.request
from mcp import Client

def res(r):
    text = "".join(c.text for c in r.content if c.type == "text")
    return {"is_error": r.is_error, "text": text, "structured": r.structured_content}

def bash(code):
    return {"language": "bash", "code": code}

async def main():
    url, metrics = sys.argv[1], sys.argv[2]
    out = {}
    async with Client(url) as c:
        run = lambda code, **kw: c.call_tool("run_code", bash(code), **kw)
        t0 = time.monotonic()
        a, b = await asyncio.gather(run("sleep 1; echo one"), run("echo two"))
        out["queued"] = [res(a), res(b), time.monotonic() - t0]
        t0 = time.monotonic()
        try:
            await run("sleep 60; echo late", read_timeout_seconds=1)
            out["timed_out"] = "no"
        except Exception as e:
            out["timed_out"] = type(e).__name__
        out["after"] = [res(await run("echo after", read_timeout_seconds=20)), time.monotonic() - t0]
        long = asyncio.ensure_future(run("sleep 4; echo long"))
        await asyncio.sleep(0.7)
        try:
            await run("echo never", read_timeout_seconds=0.5)
            out["left_queue"] = "no"
        except Exception as e:
            out["left_queue"] = type(e).__name__
        # (The SDK sends its cancel as it raises; let it arrive.)
        await asyncio.sleep(0.5)
        # The queue (of one) has room again; with it taken, one more is busy.
        nxt = asyncio.ensure_future(run("echo next"))
        await asyncio.sleep(0.5)
        out["full"] = res(await run("echo extra"))
        out["next"] = res(await nxt)
        out["long"] = res(await long)
        out["metrics_open"] = urllib.request.urlopen(metrics).read().decode()
    return out

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 90))))
"#;

#[test]
fn a_session_queues_its_calls_and_a_cancelled_or_timed_out_call_frees_it_at_once() {
    let s = start_server("mcp_session_queue = 1", &["--code-mode"]);
    let metrics = format!("http://{}/metrics", s.addr);
    let out = run_sdk_python(QUEUE, &[format!("http://{}/mcp", s.addr), metrics], "");
    // Both ran, the second after the first (it waited, it was not busy).
    let q = &out["queued"];
    assert_eq!(ok(&q[0])["stdout"], "one\n", "{out}");
    assert_eq!(ok(&q[1])["stdout"], "two\n", "{out}");
    assert!(q[2].as_f64().unwrap() >= 1.0, "{out}");
    // The timed-out call was killed: the next one ran at once, not after
    // the sleep's 60 s.
    assert_ne!(out["timed_out"], "no", "{out}");
    assert_eq!(ok(&out["after"][0])["stdout"], "after\n", "{out}");
    assert!(out["after"][1].as_f64().unwrap() < 15.0, "{out}");
    // A call cancelled while waiting left the queue: the next took its place.
    assert_ne!(out["left_queue"], "no", "{out}");
    assert_eq!(ok(&out["next"])["stdout"], "next\n", "{out}");
    assert_eq!(ok(&out["long"])["stdout"], "long\n", "{out}");
    refused(&out["full"], "busy");
    let text = out["full"]["text"].as_str().unwrap();
    assert!(text.contains("mcp_session_queue"), "{text}");
    // The session was counted while open; the waits were measured.
    let open = parse_metrics("text", out["metrics_open"].as_str().unwrap());
    assert_eq!(open["corral_mcp_sessions"][""], 1.0, "{open}");
    let (_, _, body) = http(&s.addr, "GET", "/metrics", None, None);
    let now = parse_metrics("text", &body);
    // Executions that got the session's slot: one, two, late, after,
    // long, next (never and extra did not).
    assert_eq!(
        now["corral_queue_wait_seconds_count"]["via=mcp"], 6.0,
        "{now}"
    );
    // `next` waited for most of `long`'s 4 s (`one` and `two` came at
    // once: either may have waited for the other).
    assert!(
        now["corral_queue_wait_seconds_bucket"]["le=0.5,via=mcp"]
            .as_f64()
            .unwrap()
            <= 5.0,
        "{now}"
    );
    // Only `late` was cut short (killed: an error), by the cancel: no
    // execution lasted 10 s, let alone its 60.
    let runs = &now["corral_executions_total"];
    assert_eq!(
        runs["outcome=error,profile=code,tenant=anonymous"], 1.0,
        "{now}"
    );
    assert_eq!(
        runs["outcome=ok,profile=code,tenant=anonymous"], 5.0,
        "{now}"
    );
    assert_eq!(
        now["corral_execution_duration_seconds_bucket"]["le=10,profile=code"], 6.0,
        "{now}"
    );
    // The session is closed: no longer counted.
    assert_eq!(now["corral_mcp_sessions"][""], 0.0, "{now}");
}

#[test]
fn stdio_serves_the_same_tools() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), "");
    let bin = corral_bin().to_string_lossy().into_owned();
    let target = |code_mode: bool| {
        let mut cmd = vec![
            bin.clone(),
            "mcp".into(),
            "--config".into(),
            cfg.display().to_string(),
        ];
        if code_mode {
            cmd.push("--code-mode".into());
        }
        json!({"command": cmd, "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"}})
    };
    let out = session(target(false), json!([list()]));
    assert_eq!(out[1]["tools"], json!(FILE_TOOLS));
    let code = "const fs = require('fs');\n\
                console.log(fs.readFileSync('in/data.txt', 'utf8'));\n\
                fs.writeFileSync('from-node.txt', 'node wrote this');\n";
    let out = session(
        target(true),
        json!([
            list(),
            call(
                "write_file",
                json!({"path": "in/data.txt", "content": "over stdio"})
            ),
            call("run_code", json!({"language": "node", "code": code})),
            call("read_file", json!({"path": "from-node.txt"})),
            call(
                "run_code",
                json!({"language": "python", "code": "print('py')"})
            ),
            call(
                "run_code",
                json!({"language": "bash", "code": "ln -s /etc/hostname leak"})
            ),
            call("read_file", json!({"path": "leak"})),
            call("read_file", json!({"path": "../../etc/passwd"})),
            call("write_file", json!({"path": ".corral/x", "content": "x"})),
        ]),
    );
    assert_eq!(out[1]["tools"], json!(ALL_TOOLS));
    ok(&out[2]);
    let run = ok(&out[3]);
    assert_eq!(run["stdout"], "over stdio\n", "{run}");
    assert_eq!(run["tenant"], "local");
    assert_eq!(ok(&out[4])["content"], "node wrote this");
    assert_eq!(ok(&out[5])["stdout"], "py\n");
    ok(&out[6]);
    refused(&out[7], "path.symlink");
    refused(&out[8], "path.traversal");
    refused(&out[9], "path.reserved");
    // The server exits with its client and leaves nothing behind.
    let work = dir.path().join("work");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = std::fs::read_dir(&work)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "corral mcp left {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `corral mcp FLAGS --config CFG` with piped stdin and stdout, for tests
/// that speak JSON-RPC to it themselves.
fn stdio_child(cfg: &Path, flags: &[&str], stderr: Stdio) -> std::process::Child {
    corral()
        .arg("mcp")
        .args(flags)
        .arg("--config")
        .arg(cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// A session's first two messages: `initialize` (id 1) and `initialized`.
fn handshake() -> [Value; 2] {
    [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "corral-test", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ]
}

#[test]
fn stdio_writes_only_json_rpc_to_stdout_and_json_logs_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), "");
    // The most verbose filter: whatever the SDK and corral log must still
    // stay off stdout.
    let mut child = stdio_child(&cfg, &["--log-level", "trace"], Stdio::piped());
    let stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let mut stdin = child.stdin.take().unwrap();
    let [init, initialized] = handshake();
    let requests = [
        init,
        initialized,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "list_files", "arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "read_file", "arguments": {"path": "../x"}}}),
    ];
    for r in &requests {
        writeln!(stdin, "{r}").unwrap();
    }
    stdin.flush().unwrap();
    // Every line on stdout is a JSON-RPC message; wait for the answers to
    // both calls before closing stdin (which ends the session).
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 3 {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "stdout ended early"
        );
        let msg: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line}"));
        assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
        if let Some(id) = msg["id"].as_u64() {
            answered.insert(id);
        }
    }
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    for line in rest.lines() {
        let msg: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line}"));
        assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let logs: Vec<Value> = logs
        .join()
        .unwrap()
        .iter()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {l}"))
        })
        .collect();
    let event = |message: &str, tool: &str| {
        logs.iter()
            .find(|e| e["fields"]["message"] == message && e["span"]["tool"] == tool)
            .unwrap_or_else(|| panic!("no `{message}` of {tool} in {logs:#?}"))
    };
    let listed = event("tool call finished", "list_files");
    assert_eq!(
        (
            listed["span"]["name"].as_str(),
            listed["span"]["tenant"].as_str(),
            listed["span"]["outcome"].as_str()
        ),
        (Some("mcp_tool"), Some("local"), Some("ok")),
        "{listed}"
    );
    let refused = event("tool call refused", "read_file");
    assert_eq!(refused["span"]["outcome"], "path.traversal", "{refused}");
}

#[test]
fn stdio_sessions_that_run_nothing_leave_no_cgroup() {
    // Its warm helpers wait in cgroups (as root); a session that ends
    // while the pool is still being filled used to leave one behind.
    let handshake = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n"
    );
    // Its audit database in a directory of the test's (the current one
    // may not be writable, unprivileged).
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), "");
    for _ in 0..8 {
        let mut child = corral()
            .args(["mcp", "--log-level", "off", "--config"])
            .arg(&cfg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(handshake.as_bytes())
            .unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(out.contains("\"serverInfo\""), "{out}");
        assert!(child.wait().unwrap().success());
        let left = cgroups_of(pid);
        assert!(left.is_empty(), "corral mcp {pid} left {left:?}");
    }
}

#[test]
fn http_mcp_sessions_are_capped_per_tenant_and_a_deleted_one_makes_room() {
    let extra = tenant("alice", "alice-token") + &tenant("bob", "bob-token");
    let s = start_server(&extra, &[]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let open = |token: &str| {
        let auth = format!("Bearer {token}");
        let h = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", auth.as_str()),
        ];
        http_with(&s.addr, "POST", "/mcp", &h, Some(init))
    };
    let mut ids = Vec::new();
    let mut refused_at = None;
    // 200 opens by one tenant, bounded: the cap answers long before.
    for i in 0..200 {
        let (status, head, body) = open("alice-token");
        if status == 429 {
            assert!(body.contains("too many MCP sessions"), "{body}");
            refused_at = Some(i);
            break;
        }
        assert_eq!(status, 200, "{head}\n{body}");
        ids.push(header(&head, "mcp-session-id").unwrap().to_string());
    }
    assert_eq!(refused_at, Some(64), "the per-tenant cap");
    // Another tenant is not affected.
    assert_eq!(open("bob-token").0, 200);
    // Ending one makes room for one.
    let auth = "Bearer alice-token".to_string();
    let h = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", ids[0].as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (status, _, _) = http_with(&s.addr, "DELETE", "/mcp", &h, None);
    assert!(status == 204 || status == 200, "{status}");
    assert_eq!(open("alice-token").0, 200);
    assert_eq!(open("alice-token").0, 429);
}

/// The TypeScript SDK's counterpart of [`CLIENT`]: argv[2] the target,
/// the steps on stdin; prints one answer per step (no protocol line).
const NODE_CLIENT: &str = r#"
const { createRequire } = require("module");
const sdk = createRequire("/opt/corral-test-node/package.json");
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { StdioClientTransport } = sdk("@modelcontextprotocol/sdk/client/stdio.js");
(async () => {
  const target = JSON.parse(process.argv[2]);
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const steps = JSON.parse(input);
  const transport = target.url
    ? new StreamableHTTPClientTransport(new URL(target.url))
    : new StdioClientTransport({ command: target.command[0], args: target.command.slice(1), env: target.env, stderr: "ignore" });
  const client = new Client({ name: "size-test", version: "1.0.0" });
  await client.connect(transport);
  const out = [];
  for (const [, tool, args] of steps) {
    try {
      const r = await client.callTool({ name: tool, arguments: args }, undefined, { timeout: 120000 });
      const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join("");
      out.push({ is_error: !!r.isError, text, structured: r.structuredContent });
    } catch (e) {
      out.push({ rpc_error: String(e) });
    }
  }
  await client.close();
  console.log(JSON.stringify(out));
})().catch((e) => { console.log(JSON.stringify([{ fatal: String(e && e.stack || e) }])); process.exit(1); });
"#;

/// Runs [`NODE_CLIENT`] against `target` with `steps`.
fn node_session(target: Value, steps: Value) -> Vec<Value> {
    let sdk = Path::new("/opt/corral-test-node/node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.is_dir(),
        "the Node MCP tests need `npm install @modelcontextprotocol/sdk` in /opt/corral-test-node (scripts/test.sh does it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.cjs");
    std::fs::write(&script, NODE_CLIENT).unwrap();
    let mut child = std::process::Command::new("node")
        .arg(&script)
        .arg(target.to_string())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(steps.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the Node client printed no JSON ({e}); status={:?}\nstdout={}\nstderr={}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    let v = v.as_array().unwrap().clone();
    assert!(v[0].get("fatal").is_none(), "node client failed: {}", v[0]);
    assert_eq!(v.len(), steps.as_array().unwrap().len(), "{v:?}");
    v
}

/// Standard base64, decoded (the answers' `stdout_base64`).
fn unbase64(s: &str) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = ABC.iter().position(|&a| a == c).expect("base64 alphabet");
        let v = u32::try_from(v).unwrap();
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).unwrap());
        }
    }
    out
}

/// The calls of the size tests: a file kept across them, 600 KB of
/// ASCII, 3 MB of control bytes, 25 MB, a small `max_output_bytes`, one
/// above the ceiling, then the file read back by code.
fn big_output_steps() -> Value {
    let py = |code: &str| json!({"language": "python", "code": code});
    let mut small =
        py("import sys\nsys.stdout.write(''.join(f'{i:07d}\\n' for i in range(75000)))");
    small["max_output_bytes"] = json!(1000);
    let mut above = py("print(1)");
    above["max_output_bytes"] = json!(300_000);
    // The worst case at the ceiling: both streams base64.
    let mut both = py("import sys\nb = bytes(range(32)) * 93750\nsys.stdout.buffer.write(b)\nsys.stderr.buffer.write(b)");
    both["max_output_bytes"] = json!(262_144);
    let mut tiny = py("print(1)");
    tiny["max_output_bytes"] = json!(10);
    json!([
        call("write_file", json!({"path": "keep.txt", "content": "kept"})),
        call(
            "run_code",
            py("import sys\nsys.stdout.write(''.join(f'{i:07d}\\n' for i in range(75000)))")
        ),
        call(
            "run_code",
            py("import sys\nsys.stdout.buffer.write(bytes(range(32)) * 93750)")
        ),
        call(
            "run_code",
            py("import sys\nb = b'y' * 1000000\nfor _ in range(25): sys.stdout.buffer.write(b)\nsys.stderr.write('e' * 100)")
        ),
        call("run_code", small),
        call("run_code", above),
        call("run_code", py("print(open('keep.txt').read())")),
        call("run_code", both),
        call("run_code", tiny),
        call(
            "run_code",
            py("import sys\nb = b'z' * 1000000\nfor _ in range(100): sys.stdout.buffer.write(b)")
        ),
        // read_file in windows: 1 MiB of text, 300 kB of control bytes.
        call(
            "run_code",
            py("open('big.txt', 'w').write(''.join(f'{i:07d}\\n' for i in range(131072)))\nopen('ctl.bin', 'wb').write(bytes(range(32)) * 9375)")
        ),
        call("read_file", json!({"path": "big.txt"})),
        call("read_file", json!({"path": "big.txt", "offset": 1048560, "max_bytes": 262144})),
        call("read_file", json!({"path": "ctl.bin", "max_bytes": 262144})),
        call("read_file", json!({"path": "keep.txt"})),
        call("read_file", json!({"path": "keep.txt", "max_bytes": 0})),
    ])
}

/// What every client must have got back from [`big_output_steps`].
fn check_big_outputs(out: &[Value]) {
    ok(&out[0]);
    for (i, written) in [(1, 600_000), (2, 3_000_000), (3, 25_000_000)] {
        let r = ok(&out[i]);
        let size = r.to_string().len() + out[i]["text"].as_str().unwrap().len();
        assert!(size < 256 << 10, "call {i}: {size} bytes");
        assert_eq!(r["exit_code"], 0, "call {i}: {r}");
        assert_eq!(r["stdout_bytes"], written, "call {i}");
        assert_eq!(r["stdout_truncated"], true, "call {i}");
        assert_eq!(r["limits"]["output_bytes"], 65536, "call {i}");
        let t = out[i]["text"].as_str().unwrap();
        assert!(
            t.contains("truncated") && t.contains(&format!("{written} bytes")),
            "call {i}: {t}"
        );
    }
    // ASCII stays text: head and tail, one copy; the text is a preview.
    let r = ok(&out[1]);
    let s = r["stdout"].as_str().unwrap();
    assert!(s.starts_with("0000000\n0000001\n") && s.ends_with("0074998\n0074999\n"));
    assert!(
        s.contains("bytes elided]") && s.len() < 66_000,
        "{}",
        s.len()
    );
    assert!(out[1]["text"].as_str().unwrap().len() < 2000);
    // Control bytes come as base64, never as \u0000 escapes.
    let r = ok(&out[2]);
    assert!(r.get("stdout").is_none(), "{r}");
    let bytes = unbase64(r["stdout_base64"].as_str().unwrap());
    assert!(bytes.len() < 66_000);
    assert!(bytes.starts_with(&(0u8..32).chain(0..32).collect::<Vec<u8>>()));
    assert!(bytes.ends_with(&(0u8..32).collect::<Vec<u8>>()));
    assert!(out[2]["text"].as_str().unwrap().contains("stdout_base64"));
    // 25 MB (under the profile's kill ceiling), and the small stderr whole.
    let r = ok(&out[3]);
    assert_eq!(r["stderr"], "e".repeat(100));
    assert_eq!(r["stderr_truncated"], false);
    // A per-call budget, and its ceiling.
    let r = ok(&out[4]);
    let s = r["stdout"].as_str().unwrap();
    assert!(
        s.starts_with("0000000\n") && s.ends_with("0074999\n") && s.len() < 1100,
        "{s}"
    );
    assert_eq!(r["limits"]["output_bytes"], 1000);
    refused(&out[5], "limits.above_ceiling");
    // The session (and its workspace) survived all of it.
    assert_eq!(ok(&out[6])["stdout"], "kept\n");
    // At the ceiling, both streams base64: still one server-sent event.
    let r = ok(&out[7]);
    let size = r.to_string().len() + out[7]["text"].as_str().unwrap().len();
    assert!(size < 1 << 20, "{size} bytes");
    for stream in ["stdout", "stderr"] {
        let b = unbase64(r[format!("{stream}_base64")].as_str().unwrap());
        assert!(
            b.len() > 262_000 && b.len() < 262_300,
            "{stream}: {}",
            b.len()
        );
        assert_eq!(r[format!("{stream}_truncated")], true);
    }
    refused(&out[8], "limits.invalid");
    assert!(out[8]["text"]
        .as_str()
        .unwrap()
        .contains("max_output_bytes"));
    // Past the profile's output_kill_bytes (64 MiB): killed, and answered.
    let r = ok(&out[9]);
    assert_eq!(r["output_limit_exceeded"], true, "{r}");
    assert_eq!(r["stdout_truncated"], true);
    assert!(r["stdout"].as_str().unwrap().len() < 66_000);
    // read_file: one copy of a window, 64 KiB by default, marked truncated
    // with where to go on; the text is a summary.
    ok(&out[10]);
    let r = ok(&out[11]);
    let size = r.to_string().len() + out[11]["text"].as_str().unwrap().len();
    assert!(size < 256 << 10, "{size} bytes");
    assert_eq!(
        (
            &r["size_bytes"],
            &r["returned_bytes"],
            &r["truncated"],
            &r["next_offset"]
        ),
        (
            &json!(1_048_576),
            &json!(65_536),
            &json!(true),
            &json!(65_536)
        ),
        "{r}"
    );
    let c = r["content"].as_str().unwrap();
    assert!(c.starts_with("0000000\n0000001\n") && c.len() == 65_536);
    let t = out[11]["text"].as_str().unwrap();
    assert!(
        t.len() < 2000 && t.contains("continue with offset 65536"),
        "{t}"
    );
    // The last window: the file's end, nothing more.
    let r = ok(&out[12]);
    assert_eq!(r["content"], "0131070\n0131071\n", "{r}");
    assert_eq!(
        (&r["truncated"], r.get("next_offset")),
        (&json!(false), None)
    );
    // Control bytes come as base64, within one server-sent event.
    let r = ok(&out[13]);
    let size = r.to_string().len() + out[13]["text"].as_str().unwrap().len();
    assert!(size < 400 << 10, "{size} bytes");
    assert_eq!(
        (&r["encoding"], &r["returned_bytes"]),
        (&json!("base64"), &json!(262_144))
    );
    let b = unbase64(r["content"].as_str().unwrap());
    assert!(b.len() == 262_144 && b.starts_with(&(0u8..32).collect::<Vec<u8>>()));
    // A small text file: whole, as content and as the text.
    let r = ok(&out[14]);
    assert_eq!(
        (&r["content"], &r["truncated"]),
        (&json!("kept"), &json!(false))
    );
    assert_eq!(out[14]["text"], "kept");
    refused(&out[15], "limits.invalid");
}

fn stdio_target(dir: &Path) -> Value {
    let cfg = serve_config(dir, "");
    let bin = corral_bin().to_string_lossy().into_owned();
    json!({
        "command": [bin, "mcp", "--code-mode", "--log-level", "off", "--config", cfg.display().to_string()],
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"},
    })
}

#[test]
fn python_sdk_gets_big_outputs_cut_to_size_over_http_and_stdio() {
    let s = start_server("", &["--code-mode"]);
    let out = session(s.target(None), big_output_steps());
    check_big_outputs(&out[1..]);
    let dir = tempfile::tempdir().unwrap();
    let out = session(stdio_target(dir.path()), big_output_steps());
    check_big_outputs(&out[1..]);
}

#[test]
fn typescript_sdk_gets_big_outputs_cut_to_size_over_http_and_stdio() {
    let s = start_server("", &["--code-mode"]);
    let out = node_session(s.target(None), big_output_steps());
    check_big_outputs(&out);
    let dir = tempfile::tempdir().unwrap();
    let out = node_session(stdio_target(dir.path()), big_output_steps());
    check_big_outputs(&out);
}

/// Opens `argv[2]` sessions at once against `argv[1]` and, keeping all
/// of them open, has each write a file (which gives it a workspace);
/// prints each answer.
const HOLD_SESSIONS: &str = r#"
import asyncio, contextlib, json, sys
from mcp import Client

async def main():
    url, n = sys.argv[1], int(sys.argv[2])
    out = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(url)) for _ in range(n)]
        for i, c in enumerate(clients):
            r = await c.call_tool("write_file", {"path": f"f{i}", "content": "x"})
            text = "".join(p.text for p in r.content if p.type == "text")
            out.append({"is_error": r.is_error, "text": text, "structured": r.structured_content})
    return out

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
"#;

#[test]
fn session_workspaces_share_a_per_tenant_byte_budget() {
    // Each session workspace reserves its profile's workspace_size
    // (256 MiB): a 600 MiB budget holds two of them, not three.
    let s = start_server("tenant_workspace_bytes = \"600MiB\"\n", &[]);
    let url = format!("http://{}/mcp", s.addr);
    let out = run_sdk_python(HOLD_SESSIONS, &[url.clone(), "3".into()], "");
    let out = out.as_array().unwrap();
    ok(&out[0]);
    ok(&out[1]);
    refused(&out[2], "busy");
    let text = out[2]["text"].as_str().unwrap();
    assert!(text.contains("tenant_workspace_bytes"), "{text}");
    // The sessions are gone with their client: the budget is whole again.
    let out = run_sdk_python(HOLD_SESSIONS, &[url, "2".into()], "");
    for v in out.as_array().unwrap() {
        ok(v);
    }
    assert_no_workspace_left(&s.work());
}

#[test]
fn at_the_session_cap_the_least_recently_used_idle_session_makes_room() {
    let s = start_server("mcp_pressure_idle_secs = 1\n", &["--code-mode"]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let base = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let open = || {
        let (status, head, body) = http_with(&s.addr, "POST", "/mcp", &base, Some(init));
        assert_eq!(status, 200, "{head}\n{body}");
        header(&head, "mcp-session-id").unwrap().to_string()
    };
    let post = |id: &str, body: &str| {
        let mut h = base.to_vec();
        h.push(("Mcp-Session-Id", id));
        h.push(("MCP-Protocol-Version", "2025-06-18"));
        http_with(&s.addr, "POST", "/mcp", &h, Some(body))
    };
    let ping = |id: &str| post(id, r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).0;
    // The oldest session starts a long call: the oldest, but not idle.
    let busy = open();
    post(
        &busy,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"bash","code":"sleep 6; echo done-sleeping"}}}"#;
    let running = std::thread::scope(|scope| {
        let running = scope.spawn(|| post(&busy, call));
        let ids: Vec<String> = (0..63).map(|_| open()).collect();
        std::thread::sleep(Duration::from_millis(1500));
        // One of them is used again: now the second opened is the least
        // recently used idle one, and it is the one ended for the newcomer.
        assert_eq!(ping(&ids[0]), 200);
        let newcomer = open();
        assert_eq!(ping(&ids[1]), 404, "the idle session was not ended");
        assert_eq!(ping(&ids[0]), 200, "the session in use was ended");
        assert_eq!(ping(&newcomer), 200);
        running.join().unwrap()
    });
    let (status, _, body) = running;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("done-sleeping"),
        "the long call's session was ended under it: {body}"
    );
}

#[test]
fn mcp_tool_refusals_are_audit_events_like_the_apis() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("audit.jsonl");
    let extra =
        format!("audit_jsonl = \"{}\"\n", jsonl.display()) + &tenant("alice", "alice-token");
    let cfg = serve_config(dir.path(), &extra);
    let s = start_server_in(dir, &cfg, &[]);
    let out = session(
        s.target(Some("alice-token")),
        json!([call("read_file", json!({"path": "../../etc/passwd"}))]),
    );
    refused(&out[1], "path.traversal");
    let mut events = Vec::new();
    wait_until(10, "the MCP refusal reaches the audit file", || {
        events = audit_events(&jsonl);
        events.iter().any(|e| e["code"] == "api.refused")
    });
    let e = events.iter().find(|e| e["code"] == "api.refused").unwrap();
    assert_eq!(e["tenant"], "alice", "{e}");
    let f = &e["event"]["fields"];
    assert_eq!(
        (f["error"].as_str(), f["tool"].as_str(), f["via"].as_str()),
        (Some("path.traversal"), Some("read_file"), Some("mcp")),
        "{e}"
    );
}

// --- The Python SDK 1.x (`ClientSession`) ----------------------------------

/// The protocol revisions corral serves (those with sessions; see
/// corral-server's mcp module), newest last.
const SERVED_PROTOCOLS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// One MCP session of the 1.x client ([`SDK1_CLIENT`]) against `target`,
/// running `steps`.
fn session_v1(target: Value, steps: Value) -> Vec<Value> {
    sdk_session(PySdk::V1, SDK1_CLIENT, &target, &steps)
}

/// Files both ways between the file tools and code, an unknown tool (a
/// JSON-RPC error) and a refused path (a tool error) in between, and the
/// session still answering after each.
fn round_trip_steps() -> Value {
    let code = "import os\n\
                data = open('data/in.txt').read()\n\
                os.makedirs('out', exist_ok=True)\n\
                open('out/r.txt', 'w').write(data[::-1])\n\
                print(data.upper())\n";
    json!([
        list(),
        call(
            "write_file",
            json!({"path": "data/in.txt", "content": "hello one"})
        ),
        call("read_file", json!({"path": "data/in.txt"})),
        call("run_code", json!({"language": "python", "code": code})),
        call("read_file", json!({"path": "out/r.txt"})),
        call("no_such_tool", json!({})),
        call("read_file", json!({"path": "../x"})),
        call("list_files", json!({"path": "out"})),
    ])
}

/// What [`round_trip_steps`] must have given, after the protocol line.
fn check_round_trip(out: &[Value]) {
    assert_eq!(out[0]["tools"], json!(ALL_TOOLS), "{out:?}");
    assert_eq!(ok(&out[1])["size_bytes"], 9, "{out:?}");
    assert_eq!(ok(&out[2])["content"], "hello one", "{out:?}");
    assert_eq!(out[2]["text"], "hello one", "{out:?}");
    let run = ok(&out[3]);
    assert_eq!(
        (run["stdout"].as_str(), run["exit_code"].as_i64()),
        (Some("HELLO ONE\n"), Some(0)),
        "{run}"
    );
    assert_eq!(ok(&out[4])["content"], "eno olleh", "{out:?}");
    let rpc = out[5]["rpc_error"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", out[5]));
    assert!(
        rpc.contains("no_such_tool") || rpc.contains("not found"),
        "{rpc}"
    );
    refused(&out[6], "path.traversal");
    assert_eq!(ok(&out[7])["entries"][0]["name"], "r.txt", "{out:?}");
}

#[test]
fn python_sdk_1x_negotiates_lists_and_round_trips_files_over_http_and_stdio() {
    let s = start_server("", &["--code-mode"]);
    // The revision this SDK offers is the newest corral serves.
    let out = session_v1(s.target(None), round_trip_steps());
    assert_eq!(out[0]["protocol"], SERVED_PROTOCOLS[3], "{out:?}");
    check_round_trip(&out[1..]);
    // Older 1.x releases offered older revisions: each is kept.
    for version in &SERVED_PROTOCOLS[..3] {
        let mut target = s.target(None);
        target["protocol"] = json!(version);
        let out = session_v1(target, round_trip_steps());
        assert_eq!(out[0]["protocol"], *version, "{out:?}");
        check_round_trip(&out[1..]);
    }
    // A revision corral does not know: it answers its own, which the
    // client accepts.
    let mut target = s.target(None);
    target["protocol"] = json!("2099-01-01");
    let out = session_v1(target, json!([list()]));
    assert_eq!(out[0]["protocol"], SERVED_PROTOCOLS[3], "{out:?}");
    assert_eq!(out[1]["tools"], json!(ALL_TOOLS));
    assert_no_workspace_left(&s.work());
    // Over stdio: the same, with the newest and the oldest revision.
    let dir = tempfile::tempdir().unwrap();
    for version in [SERVED_PROTOCOLS[3], SERVED_PROTOCOLS[0]] {
        let mut target = stdio_target(dir.path());
        target["protocol"] = json!(version);
        let out = session_v1(target, round_trip_steps());
        assert_eq!(out[0]["protocol"], version, "{out:?}");
        check_round_trip(&out[1..]);
    }
}

#[test]
fn python_sdk_1x_with_a_token_runs_as_its_tenant() {
    let s = start_server(&tenant("carol", "carol-token"), &["--code-mode"]);
    let out = session_v1(
        s.target(Some("carol-token")),
        json!([call(
            "run_code",
            json!({"language": "bash", "code": "echo carol"})
        )]),
    );
    let run = ok(&out[1]);
    assert_eq!(
        (run["stdout"].as_str(), run["tenant"].as_str()),
        (Some("carol\n"), Some("carol"))
    );
    // Without one, the SDK cannot even initialize.
    let out = PySdk::V1.run(SDK1_CLIENT, &[s.target(None).to_string()], "[]");
    let fatal = out[0]["fatal"].as_str().unwrap_or_else(|| panic!("{out}"));
    assert!(fatal.contains("401"), "{fatal}");
}

#[test]
fn python_sdk_1x_gets_big_outputs_cut_to_size_over_http_and_stdio() {
    let s = start_server("", &["--code-mode"]);
    let out = session_v1(s.target(None), big_output_steps());
    check_big_outputs(&out[1..]);
    let dir = tempfile::tempdir().unwrap();
    let out = session_v1(stdio_target(dir.path()), big_output_steps());
    check_big_outputs(&out[1..]);
}

/// The 1.x client against argv[1] (`/mcp`): a call it times out on
/// (1.x sends no `notifications/cancelled`), the call after it, then a
/// call left running (a process tagged argv[2]) when the session ends.
/// Prints what happened and how long the tagged process outlived the
/// session.
const SDK1_NO_CANCEL: &str = r#"
import asyncio, json, os, sys, time, warnings
from datetime import timedelta
warnings.simplefilter("ignore", DeprecationWarning)
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

def tagged(marker):
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and int(p) != os.getpid() and marker.encode() in open(f"/proc/{p}/cmdline", "rb").read():
                return True
        except OSError:
            pass
    return False

async def main():
    url, marker = sys.argv[1], sys.argv[2]
    out = {}
    bash = lambda code: {"language": "bash", "code": code, "timeout_ms": 120000}
    async with streamablehttp_client(url) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            t0 = time.monotonic()
            try:
                await s.call_tool("run_code", bash("sleep 3; echo late"), timedelta(seconds=1))
                out["timed_out"] = None
            except McpError as e:
                out["timed_out"] = e.error.code
            a = await s.call_tool("run_code", bash("echo after"))
            out["after"] = [a.structuredContent, time.monotonic() - t0]
            try:
                await s.call_tool("run_code", bash(f"bash -c 'sleep 100; :' {marker}"), timedelta(seconds=1))
            except McpError as e:
                out["left_running"] = e.error.code
            out["seen"] = tagged(marker)
    # The session is closed (the SDK's DELETE).
    t1 = time.monotonic()
    while tagged(marker) and time.monotonic() - t1 < 20:
        await asyncio.sleep(0.05)
    out["outlived"] = time.monotonic() - t1
    return out

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
"#;

#[test]
fn python_sdk_1x_timeouts_send_no_cancel_and_ending_the_session_kills_at_once() {
    let s = start_server("", &["--code-mode"]);
    let marker = format!("sdk1-left-{}", std::process::id());
    let url = format!("http://{}/mcp", s.addr);
    let out = PySdk::V1.run(SDK1_NO_CANCEL, &[url, marker.clone()], "");
    // A client-side timeout (408 from the SDK itself) tells corral
    // nothing: the call runs on, and the next one waits for it, then runs.
    assert_eq!(out["timed_out"], 408, "{out}");
    let after = &out["after"];
    assert_eq!(after[0]["stdout"], "after\n", "{out}");
    assert!(after[1].as_f64().unwrap() >= 2.5, "{out}");
    assert_eq!(out["left_running"], 408, "{out}");
    assert_eq!(out["seen"], true, "the tagged call never ran: {out}");
    // Ending the session killed it at once, not after rmcp's 5 s drain.
    let outlived = out["outlived"].as_f64().unwrap();
    assert!(
        outlived < 3.0,
        "the call outlived its session by {outlived} s"
    );
    assert!(!process_running("", &marker));
    assert_no_workspace_left(&s.work());
}

/// A loopback TCP proxy in front of `upstream` that breaks the answer of
/// each request whose bytes hold `marker` right after its first
/// server-sent event (the priming event, with its id and `retry`), as a
/// network would. It rewrites `Host` to the upstream's (corral checks
/// it). Answers its address and the count of answers it broke.
fn breaking_proxy(
    upstream: &str,
    marker: &'static str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = listener.local_addr().unwrap().to_string();
    let broken = Arc::new(AtomicUsize::new(0));
    let (upstream, me2, count) = (upstream.to_string(), me.clone(), broken.clone());
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let server = TcpStream::connect(&upstream).unwrap();
            let armed = Arc::new(AtomicBool::new(false));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (host_from, host_to) = (format!("Host: {me2}"), format!("Host: {upstream}"));
            let arm = armed.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = c_in.read(&mut buf) {
                    let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if chunk.contains(marker) {
                        arm.store(true, Ordering::SeqCst);
                    }
                    let chunk = chunk.replace(&host_from, &host_to);
                    if s_out.write_all(chunk.as_bytes()).is_err() {
                        break;
                    }
                }
            });
            let count = count.clone();
            std::thread::spawn(move || {
                let (mut s_in, mut c_out) = (server, client);
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = s_in.read(&mut buf) {
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    let chunk = &buf[..n];
                    if armed.load(Ordering::SeqCst) && chunk.windows(6).any(|w| w == b"retry:") {
                        count.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                }
                let _ = c_out.shutdown(Shutdown::Both);
                let _ = s_in.shutdown(Shutdown::Both);
            });
        }
    });
    (me, broken)
}

#[test]
fn python_sdk_1x_resumes_a_call_whose_stream_broke_and_gets_its_answer() {
    let s = start_server("", &["--code-mode"]);
    let (proxy, broken) = breaking_proxy(&s.addr, "break-here");
    let bash = |code: &str| json!({"language": "bash", "code": code});
    // The SDK resumes (GET with Last-Event-ID) after the server's `retry`
    // (3 s): the first call has answered by then, the second not yet.
    let out = session_v1(
        json!({"url": format!("http://{proxy}/mcp")}),
        json!([
            call("run_code", bash("sleep 1; echo answered # break-here")),
            call("run_code", bash("sleep 5; echo live # break-here")),
            call("run_code", bash("echo after")),
        ]),
    );
    assert_eq!(broken.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(ok(&out[1])["stdout"], "answered\n", "{out:?}");
    assert_eq!(ok(&out[2])["stdout"], "live\n", "{out:?}");
    assert_eq!(ok(&out[3])["stdout"], "after\n", "{out:?}");
    // Each ran once: a broken stream is no cancel, and no retry.
    let (_, _, body) = http(&s.addr, "GET", "/metrics", None, None);
    let m = parse_metrics("text", &body);
    assert_eq!(
        m["corral_executions_total"]["outcome=ok,profile=code,tenant=anonymous"], 3.0,
        "{m}"
    );
}

/// `run_code` on a profile whose bind stopped answering (a hung NFS mount,
/// here a FUSE filesystem that answers nothing): the call is given up
/// after its plan's bound with `host.unanswered`, the next is refused at
/// once while that plan still waits, and the session's other tools work
/// all along.
#[test]
fn run_code_on_a_filesystem_that_stops_answering_is_given_up_and_the_session_goes_on() {
    let Some(fs) = HungFs::mount_answering(false) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = serve_config(
        dir.path(),
        &format!(
            "[profile.code.filesystem]\nread_only = [\"{}:/data\"]\n",
            fs.sub().display()
        ),
    );
    // A PATH whose commands resolve in the system trees: the plans are
    // what wait, not the start.
    let s = start_server_with_env(dir, &cfg, &["--code-mode"], &[("PATH", "/usr/bin:/bin")]);
    let started = Instant::now();
    let out = session(
        s.target(None),
        json!([
            call(
                "run_code",
                json!({"language": "bash", "code": "echo hi", "timeout_ms": 2000})
            ),
            call("run_code", json!({"language": "bash", "code": "echo hi"})),
            call(
                "write_file",
                json!({"path": "kept.txt", "content": "the session goes on"})
            ),
            call("read_file", json!({"path": "kept.txt"})),
        ]),
    );
    let took = started.elapsed();
    refused(&out[1], "host.unanswered");
    assert!(
        out[1]["text"]
            .as_str()
            .unwrap()
            .contains("waited on the host for 5 s"),
        "{}",
        out[1]
    );
    refused(&out[2], "host.unanswered");
    assert!(
        out[2]["text"].as_str().unwrap().contains("still waiting"),
        "{}",
        out[2]
    );
    ok(&out[3]);
    assert_eq!(ok(&out[4])["content"], "the session goes on");
    assert!(took < Duration::from_secs(20), "the session took {took:?}");
}

/// `corral mcp` told to stop (SIGTERM) while its client still holds its
/// input open and a `run_code` call runs: the call's sandbox is killed and
/// the execution recorded (cancelled) before corral exits, and the exit
/// does not wait for input that is not coming.
#[test]
fn stdio_stopped_by_a_signal_ends_its_running_call_and_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), "");
    let mut child = stdio_child(&cfg, &["--code-mode", "--log-level", "off"], Stdio::null());
    let mut stdin = child.stdin.take().unwrap();
    let [init, initialized] = handshake();
    for r in [
        init,
        initialized,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_code",
            "arguments": {"language": "bash", "code": "exec sleep 60.0417"}}}),
    ] {
        writeln!(stdin, "{r}").unwrap();
    }
    stdin.flush().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    assert!(
        stdout.read_line(&mut line).unwrap() > 0,
        "no answer to initialize"
    );
    wait_until(20, "the call's program", || {
        process_running("sleep", "60.0417")
    });
    let stopping = Instant::now();
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM")
        .success());
    let status = child.wait().unwrap();
    let took = stopping.elapsed();
    assert!(took < Duration::from_millis(1800), "the stop took {took:?}");
    assert_eq!(status.code(), Some(0), "{status:?}");
    drop(stdin);
    // The execution is on record, cancelled.
    let db = dir.path().join("audit.db");
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sqlite3, sys\n\
             rows = sqlite3.connect(sys.argv[1]).execute('SELECT result FROM executions').fetchall()\n\
             print(json.dumps([json.loads(r[0]) for r in rows]))\n",
        ])
        .arg(&db)
        .output()
        .expect("python3 reading the audit store");
    let records: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    assert_eq!(records.as_array().map(Vec::len), Some(1), "{records}");
    assert_eq!(records[0]["cancelled"], true, "{records}");
    assert!(
        !process_running("sleep", "60.0417"),
        "the call's program outlived corral"
    );
}

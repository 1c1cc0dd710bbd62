//! Shared helpers for the integration tests: run the real `corral` binary.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The corral binary under test: `CORRAL_BIN` when the suite runs as
/// another user from a copied location, else cargo's build.
pub fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

/// `program` with a clean, predictable environment.
fn clean_command(program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null());
    c
}

/// A `corral` command with a clean, predictable environment.
pub fn corral() -> Command {
    clean_command(corral_bin())
}

/// Adds `run`, plus `--allow-unenforced-limits` when the suite runs
/// unprivileged: the default profile sets cgroup limits, and this host has
/// no cgroup delegation for ordinary users (tests/limits.rs proves the
/// refusal without the flag).
fn add_run(c: &mut Command) {
    c.arg("run");
    if !is_root() {
        c.arg("--allow-unenforced-limits");
    }
}

/// `corral run` (see [`add_run`]).
pub fn corral_run() -> Command {
    let mut c = corral();
    add_run(&mut c);
    c
}

/// [`corral_run`] started through `bash -c script bash script_args...`:
/// the script opens descriptors for corral to inherit (no close-on-exec)
/// and ends with `exec "$@"`, where `$@` (after any `shift`) is `corral run`
/// with its flags. Same environment as [`corral`]; add `--` and the argv.
pub fn corral_run_via_bash(script: &str, script_args: &[&OsStr]) -> Command {
    let mut c = clean_command("bash");
    c.arg("-c")
        .arg(script)
        .arg("bash")
        .args(script_args)
        .arg(corral_bin());
    add_run(&mut c);
    c
}

/// Appends `corral run` (see [`add_run`]) to a command that starts corral
/// under another program (strace, unshare); the caller adds the rest. The
/// command's environment is left to the caller.
pub fn then_corral_run(cmd: &mut Command) -> &mut Command {
    cmd.arg(corral_bin());
    add_run(cmd);
    cmd
}

/// Runs `corral run -- argv` under `strace` with `strace_args` (the
/// trace goes to a file), stdin from /dev/null and a plain environment;
/// returns corral's output and the trace.
pub fn corral_run_under_strace(strace_args: &[&str], argv: &[&str]) -> (Output, String) {
    require_tool("strace");
    let dir = tempfile::tempdir().expect("temporary directory");
    let trace = dir.path().join("strace.log");
    let mut cmd = Command::new("strace");
    cmd.args(strace_args).arg("-o").arg(&trace);
    let out = then_corral_run(&mut cmd)
        .arg("--")
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .expect("spawn strace");
    let calls = std::fs::read_to_string(&trace).unwrap_or_default();
    (out, calls)
}

/// Runs `corral run [flags] -- argv` and returns the output.
pub fn run(flags: &[&str], argv: &[&str]) -> Output {
    let mut c = corral_run();
    c.args(flags).arg("--").args(argv);
    c.output().expect("spawn corral")
}

/// Runs `corral run --json` and parses the result object.
pub fn run_json(flags: &[&str], argv: &[&str]) -> (serde_json::Value, Output) {
    let mut all = vec!["--json"];
    all.extend_from_slice(flags);
    let out = run(&all, argv);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    (v, out)
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs a python snippet in the default sandbox; asserts success; returns stdout.
pub fn py(code: &str) -> String {
    let out = run(&[], &["python3", "-c", code]);
    assert!(
        out.status.success(),
        "python failed: status={:?} stdout={} stderr={}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a shell snippet in the default sandbox; returns (code, stdout, stderr).
pub fn sh(script: &str) -> (i32, String, String) {
    let out = run(&[], &["sh", "-c", script]);
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Fails the test with what to install when `tool` (strace, unshare) is
/// not on PATH: scripts/test.sh installs them; a bare `cargo test` on
/// another machine may lack them.
pub fn require_tool(tool: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    assert!(
        found,
        "this test needs `{tool}` on PATH (Debian: apt-get install {}; scripts/test.sh installs it)",
        if tool == "unshare" { "util-linux" } else { tool }
    );
}

pub fn is_root() -> bool {
    // SAFETY-free: geteuid via /proc to keep tests free of unsafe.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The uid the sandboxed program runs as.
pub fn sandbox_uid() -> u32 {
    if is_root() {
        65534
    } else {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(2).and_then(|u| u.parse().ok()))
            })
            .unwrap_or(0)
    }
}

/// A temporary workdir, mode 0700. Unprivileged: owned by the invoking
/// user. As root: owned by an ordinary user (uid 4242), which corral shows
/// to the program (uid 65534) through an idmapped mount; a root-owned
/// workdir is refused (tests/filesystem.rs proves both).
pub fn workdir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("corral-test-")
        .tempdir()
        .expect("tempdir");
    if is_root() {
        let status = Command::new("chown")
            .arg("4242:4242")
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(status.success());
    }
    dir
}

/// Writes a config file and returns its path (kept alive by the TempDir).
pub fn config(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("corral.toml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

/// Parses the JSON-lines security events corral wrote to stderr.
pub fn events(stderr: &[u8]) -> Vec<serde_json::Value> {
    text(stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "security")
        .collect()
}

/// Whether a process whose argv starts with `program` (any program when
/// empty) and mentions `token` is running. Tests tag the sandboxed programs
/// they want to find with a unique token in their arguments.
pub fn process_running(program: &str, token: &str) -> bool {
    let prefix = format!("{program}\0");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .any(|c| {
                    (program.is_empty() || c.starts_with(prefix.as_bytes()))
                        && String::from_utf8_lossy(&c).contains(token)
                })
        })
        .unwrap_or(false)
}

/// A host process that must survive an attack: `sleep 60` with only `env`
/// for environment, running as the sandbox's own uid (as root: 65534), so
/// that only isolation protects it.
pub fn victim(env: &[(&str, &str)]) -> Child {
    let mut c = Command::new("sleep");
    c.arg("60").env_clear().stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    if is_root() {
        use std::os::unix::process::CommandExt;
        c.uid(65534).gid(65534);
    }
    c.spawn().expect("spawn victim")
}

/// Polls `ok` every 20 ms until it holds; fails the test, saying `what`
/// did not happen, after `secs` seconds.
pub fn wait_until(secs: u64, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "after {secs} s: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A running `corral serve` on a loopback port, killed and reaped on drop.
pub struct Server {
    pub child: Child,
    /// `127.0.0.1:<port>`, as the server announced it.
    pub addr: String,
    /// The config, audit database and `work/` ([`serve_config`]); a test
    /// that restarts a server on them takes it ([`start_server_in`]).
    pub dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// The server's directory.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .expect("the server's directory was taken")
            .path()
    }

    /// This server's own directory, as the host sees it.
    pub fn own_dir_on_host(&self) -> PathBuf {
        self.path()
            .join("work")
            .join(format!("corral-serve-{}", self.child.id()))
    }

    /// This server's directory of workspaces, as the server sees it: a
    /// tmpfs mounted in its own mount namespace, so it is looked at
    /// through the server's root (`/proc/PID/root`).
    pub fn work(&self) -> PathBuf {
        let own = self.own_dir_on_host();
        PathBuf::from(format!("/proc/{}/root", self.child.id()))
            .join(own.strip_prefix("/").unwrap_or(&own))
            .join("workspaces")
    }
}

/// Writes the config the server tests share into `dir` and returns its
/// path: the audit database and `work/` in `dir`, limits that may go
/// unenforced when the suite runs unprivileged, then `extra` (bare keys in
/// it land in `[server]`).
pub fn serve_config(dir: &Path, extra: &str) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("create work dir");
    let cfg = dir.join("corral.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profile.code]\n[profile.code.limits]\nallow_unenforced = {}\n[server]\naudit_db = \"{}\"\nwork_dir = \"{}\"\n{extra}",
            !is_root(),
            dir.join("audit.db").display(),
            work.display(),
        ),
    )
    .expect("write config");
    cfg
}

/// `corral serve` on 127.0.0.1 (a free port) with [`serve_config`] plus
/// `extra` in a fresh directory, and `flags`.
pub fn start_server(extra: &str, flags: &[&str]) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = serve_config(dir.path(), extra);
    start_server_in(dir, &cfg, flags)
}

/// `corral serve --config cfg` on 127.0.0.1 (a free port), owning `dir`:
/// a restart on an earlier server's directory and audit database.
pub fn start_server_in(dir: tempfile::TempDir, cfg: &Path, flags: &[&str]) -> Server {
    start_server_with_env(dir, cfg, flags, &[])
}

/// [`start_server_in`] with `env` set in the server's environment.
pub fn start_server_with_env(
    dir: tempfile::TempDir,
    cfg: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let mut child = corral()
        .envs(env.iter().copied())
        .arg("serve")
        .arg("--config")
        .arg(cfg)
        .args(["--listen", "127.0.0.1:0"])
        .args(flags)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral serve");
    // Its first line on stderr names the address it listens on.
    let mut line = String::new();
    BufReader::new(child.stderr.take().expect("piped stderr"))
        .read_line(&mut line)
        .expect("read the server's first line");
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .unwrap_or_default()
        .to_string();
    let server = Server {
        child,
        addr,
        dir: Some(dir),
    };
    // A failed start is killed (by the drop) before the test fails: a
    // server left running would hold the test's stdout open.
    assert!(server.addr.starts_with("127.0.0.1:"), "{line}");
    server
}

/// sha256 hex via python (the tests avoid extra crates).
pub fn sha256(token: &str) -> String {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
            token,
        ])
        .output()
        .expect("python3 for sha256");
    assert!(out.status.success(), "sha256: {}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// A `[[server.tenant]]` entry: `name`, allowed the `code` profile, with
/// `token`.
pub fn tenant(name: &str, token: &str) -> String {
    format!(
        "[[server.tenant]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\nprofiles = [\"code\"]\n",
        sha256(token)
    )
}

/// A minimal HTTP/1.1 client for the server tests (a JSON body, an
/// optional bearer token): (status, head, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
    http_with(addr, method, path, &headers, body)
}

/// [`http`] with the request's headers as given (`Content-Type` only
/// counts with a body).
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        if body.is_some() || !name.eq_ignore_ascii_case("content-type") {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Length: {}\r\n\r\n{b}", b.len()));
    } else {
        req.push_str("\r\n");
    }
    raw_request(addr, &req)
}

/// Sends `req` as it is and reads the whole answer: (status, head, body).
pub fn raw_request(addr: &str, req: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the server");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    // A server may answer early (413) and close before it has read the
    // whole request: the rest of the write then fails, and the answer,
    // already received, is still there to read before the reset.
    let written = s.write_all(req.as_bytes());
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw);
    if raw.is_empty() {
        written.expect("write the request");
        read.expect("read the answer");
    }
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

/// Whether corral enforces a cgroup CPU limit on this host (root, and a
/// cpu controller it can use), as the long-running profiles ask: found by
/// running `mcp-python` once without accepting unenforced limits.
/// tests/profiles.rs proves both answers (the limit in force, or a refusal
/// naming it).
#[allow(dead_code)] // not every test binary runs long-running profiles
pub fn cpu_limit_enforceable() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let out = corral()
            .args([
                "run",
                "--json",
                "--profile",
                "mcp-python",
                "--",
                "python3",
                "-c",
                "pass",
            ])
            .output()
            .expect("spawn corral");
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|v| v["enforced"]["cgroup"]["cpu_millicores"] == 1000)
    })
}

/// An official Python MCP SDK the interop tests drive corral with, each
/// in a venv of its own (scripts/test.sh installs both).
#[allow(dead_code)] // not every test binary drives MCP
#[derive(Clone, Copy, Debug)]
pub enum PySdk {
    /// `mcp` 2.x (the `Client` API): `$CORRAL_TEST_PYTHON`, else
    /// `/opt/corral-test-venv/bin/python`. Its venv also holds the other
    /// Python tools the tests use (prometheus_client, schemathesis, ...).
    V2,
    /// The newest `mcp` 1.x (the `ClientSession` API):
    /// `$CORRAL_TEST_PYTHON_MCP1`, else `/opt/corral-test-venv-mcp1/bin/python`.
    V1,
}

impl PySdk {
    /// The venv's interpreter. Its absence fails the test: an interop
    /// test that silently skips proves nothing.
    pub fn python(self) -> PathBuf {
        let (var, venv, spec) = match self {
            PySdk::V2 => ("CORRAL_TEST_PYTHON", "/opt/corral-test-venv", "mcp"),
            PySdk::V1 => (
                "CORRAL_TEST_PYTHON_MCP1",
                "/opt/corral-test-venv-mcp1",
                "'mcp>=1,<2'",
            ),
        };
        let p = std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(venv).join("bin/python"));
        assert!(
            p.exists(),
            "the MCP interop tests need Python with the official `mcp` SDK ({self:?}) at {} \
             (set {var}, or run scripts/test.sh, which does \
             `python3 -m venv {venv} && {venv}/bin/pip install {spec}`)",
            p.display()
        );
        p
    }

    /// Runs the Python `script` with this SDK's [`PySdk::python`], `args`
    /// and `stdin`, in a clean environment; returns what it printed,
    /// parsed as JSON.
    pub fn run(self, script: &str, args: &[String], stdin: &str) -> serde_json::Value {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("script.py");
        std::fs::write(&file, script).expect("write script");
        let mut child = Command::new(self.python())
            .arg(&file)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the SDK's python");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("wait for python");
        let stdout = text(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "the Python script ({self:?}) printed no JSON ({e}); status={:?}\nstdout={stdout}\nstderr={}",
                out.status,
                text(&out.stderr)
            )
        })
    }
}

/// The interpreter of the venv with the official `mcp` SDK 2.x
/// ([`PySdk::V2`]).
#[allow(dead_code)] // not every test binary drives MCP
pub fn sdk_python() -> PathBuf {
    PySdk::V2.python()
}

/// Runs the Python `script` with [`sdk_python`] ([`PySdk::run`]).
#[allow(dead_code)] // not every test binary drives MCP
pub fn run_sdk_python(script: &str, args: &[String], stdin: &str) -> serde_json::Value {
    PySdk::V2.run(script, args, stdin)
}

/// A client of the official Python SDK 1.x ([`PySdk::V1`]: `ClientSession`
/// over `streamablehttp_client` or `stdio_client`) that runs a list of
/// steps in one MCP session and prints one JSON answer per step, the first
/// being the negotiated protocol revision. argv[1] is the target:
/// `{"url", "token"?}` or `{"command": [...], "env"?}`, either with
/// `"protocol"` to offer an older revision, as older 1.x releases did; the
/// steps come on stdin: `["list"]` or `["call", tool, arguments]`.
#[allow(dead_code)] // not every test binary drives MCP
pub const SDK1_CLIENT: &str = r#"
import asyncio, json, sys, traceback, warnings
import mcp.types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import McpError
# Deprecated since 1.24 for streamable_http_client (which it wraps), but the
# entry point 1.x clients have used since streamable HTTP came (1.8).
warnings.simplefilter("ignore", DeprecationWarning)
from mcp.client.streamable_http import streamablehttp_client

async def drive(read, write, steps):
    out = []
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out.append({"protocol": init.protocolVersion})
        for step in steps:
            if step[0] == "list":
                tools = await session.list_tools()
                out.append({"tools": sorted(t.name for t in tools.tools)})
                continue
            try:
                r = await session.call_tool(step[1], step[2])
            except McpError as e:
                out.append({"rpc_error": f"{e.error.code}: {e}"})
                continue
            text = "".join(c.text for c in r.content if c.type == "text")
            out.append({"is_error": r.isError, "text": text, "structured": r.structuredContent})
    return out

async def main():
    target = json.loads(sys.argv[1])
    steps = json.load(sys.stdin)
    if target.get("protocol"):
        # What ClientSession.initialize offers.
        mcp.types.LATEST_PROTOCOL_VERSION = target["protocol"]
    if "url" in target:
        headers = {"Authorization": "Bearer " + target["token"]} if target.get("token") else None
        async with streamablehttp_client(target["url"], headers=headers, timeout=30, sse_read_timeout=60) as (read, write, _):
            return await drive(read, write, steps)
    cmd = target["command"]
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=target.get("env"))
    async with stdio_client(params) as (read, write):
        return await drive(read, write, steps)

try:
    out = asyncio.run(asyncio.wait_for(main(), 60))
except BaseException as e:
    out = [{"fatal": "".join(traceback.format_exception(e))[-4000:]}]
print(json.dumps(out))
"#;

/// Runs a step-list client `script` of `sdk` (such as [`SDK1_CLIENT`])
/// against `target` with `steps`; fails the test unless the client
/// connected and answered every step: the protocol revision, then one
/// answer per step.
#[allow(dead_code)] // not every test binary drives MCP
pub fn sdk_session(
    sdk: PySdk,
    script: &str,
    target: &serde_json::Value,
    steps: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let out = sdk.run(script, &[target.to_string()], &steps.to_string());
    let out = out.as_array().expect("a JSON array").clone();
    assert!(
        out[0].get("fatal").is_none(),
        "the {sdk:?} client failed: {}",
        out[0]["fatal"].as_str().unwrap_or_default()
    );
    let n = steps.as_array().map_or(0, Vec::len);
    assert_eq!(out.len(), n + 1, "{out:?}");
    out
}

/// The cgroups named for `pid` (`<pid>-<n>`) in every hierarchy corral
/// uses, v1 (`<hierarchy>/corral/`) and v2 (`/sys/fs/cgroup/corral/`).
pub fn cgroups_of(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}-");
    let mut bases = vec![std::path::PathBuf::from("/sys/fs/cgroup/corral")];
    if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
        bases.extend(hierarchies.flatten().map(|h| h.path().join("corral")));
    }
    bases
        .iter()
        .filter_map(|b| std::fs::read_dir(b).ok())
        .flat_map(|d| d.flatten())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix)))
        .collect()
}

/// Parses `/metrics` with the official Prometheus client (`prometheus_client`
/// in the SDK venv) in `format` (`text` or `openmetrics`): {sample: {label
/// set: value}}, label sets as `k=v,...` sorted by name.
#[allow(dead_code)] // not every test binary reads metrics
pub fn parse_metrics(format: &str, body: &str) -> serde_json::Value {
    const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families as text
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
parse = om if sys.argv[1] == "openmetrics" else text
out = {}
for fam in parse(sys.stdin.read()):
    for s in fam.samples:
        key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        out.setdefault(s.name, {})[key] = s.value
print(json.dumps(out))
"#;
    run_sdk_python(PARSE, &[format.to_string()], body)
}

/// The `event` lines of the audit JSON-lines file.
pub fn audit_events(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "event")
        .collect()
}

/// Pids of the server's children started as sandbox helpers that have not
/// begun a sandbox: waiting for a plan (no child of their own).
pub fn waiting_helpers(server: u32) -> Vec<i32> {
    helpers_of(server)
        .into_iter()
        .filter(|pid| children_of(*pid).is_empty())
        .collect()
}

/// Sandboxes built ahead of their run, as (the server's child, init): a
/// helper and the init it started, or an init the server's fork server
/// cloned straight into its namespaces (the same pid twice).
pub fn prepared_sandboxes(server: u32) -> Vec<(i32, i32)> {
    let mut out: Vec<(i32, i32)> = helpers_of(server)
        .into_iter()
        .filter_map(|pid| children_of(pid).first().map(|init| (pid, *init)))
        .collect();
    out.extend(cloned_inits_of(server).into_iter().map(|init| (init, init)));
    out
}

/// The server's children that are a sandbox's init themselves (cloned by
/// a fork server, no helper above them): pid 1 of a pid namespace below
/// the server's (`NSpid` in /proc/PID/status, proc(5)).
pub fn cloned_inits_of(server: u32) -> Vec<i32> {
    children_of_process(server)
        .into_iter()
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|ids| ids.split_whitespace().collect::<Vec<_>>())
                .is_some_and(|ids| ids.len() >= 2 && ids.last() == Some(&"1"))
        })
        .collect()
}

/// The children of any thread of `pid`, as the kernel lists them.
pub fn children_of_process(pid: u32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .flat_map(|t| {
                    std::fs::read_to_string(t.path().join("children"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok())
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The server's children that run as sandbox helpers.
pub fn helpers_of(server: u32) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.split(' ').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(server) && cmdline.starts_with(b"corral-sandbox\0__sandbox-helper") {
            pids.push(pid);
        }
    }
    pids
}

/// The children of `pid` (its one thread's), as the kernel lists them.
pub fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A FUSE filesystem that answers root and holds every other uid's
/// requests (`lifecycle_support/hung_fs.py`), as a network filesystem
/// whose server went away does: a sandbox's init, which runs as another
/// uid, waits on it while it builds the root, until it is killed. Mounted
/// in a fresh directory; stopped and unmounted on drop.
pub struct HungFs {
    pub dir: tempfile::TempDir,
    pub daemon: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl HungFs {
    /// Mounts it; `None`, saying why (SKIP), where this host does not let
    /// a test mount a FUSE filesystem: not root, no `/dev/fuse`, no right
    /// to mount (a container).
    pub fn mount() -> Option<HungFs> {
        HungFs::mount_answering(true)
    }

    /// [`HungFs::mount`], or with `answering` false one that answers no
    /// one, root included.
    pub fn mount_answering(answering: bool) -> Option<HungFs> {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        if !is_root() {
            eprintln!("SKIP: mounting the test's FUSE filesystem needs root");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The sandbox's uid walks through it to the mount.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod the temporary directory");
        let script = dir.path().join("hung_fs.py");
        std::fs::write(&script, include_str!("../lifecycle_support/hung_fs.py"))
            .expect("write the FUSE filesystem's script");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("make the mount point");
        let mut daemon = std::process::Command::new("/usr/bin/python3")
            .arg(&script)
            .arg(&mnt)
            .args((!answering).then_some("none"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 for the test's FUSE filesystem");
        let stdout = daemon.stdout.take().expect("the daemon's stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut fs = HungFs { dir, daemon, lines };
        match fs.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line == "mounted" => Some(fs),
            first => {
                let status = fs.daemon.wait().expect("wait for the FUSE daemon");
                let mut why = String::new();
                if let Some(mut e) = fs.daemon.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut why);
                }
                assert_eq!(
                    status.code(),
                    Some(3),
                    "the FUSE filesystem failed ({first:?}): {why}"
                );
                eprintln!("SKIP: this host does not let a test mount FUSE: {why}");
                None
            }
        }
    }

    /// The directory in it that only root may use.
    pub fn sub(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt/sub")
    }

    /// Waits (20 s at most) for a line of the daemon's that starts with
    /// `prefix`.
    pub fn expect_line(&self, prefix: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return,
                Ok(_) => {}
                Err(e) => panic!("{what} ({e})"),
            }
        }
    }
}

impl Drop for HungFs {
    fn drop(&mut self) {
        // Its end of /dev/fuse closed, the kernel fails what it still
        // holds; the mount stays until unmounted.
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path().join("mnt"))
            .status();
    }
}

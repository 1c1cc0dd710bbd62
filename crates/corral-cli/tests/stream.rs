//! Live output (`corral run` without `--json`) is a pipe: the program's
//! bytes reach the reader as fast as it takes them and no faster, corral's
//! memory stays flat whatever is written, and nothing corral says enters
//! the program's stdout.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Writes 50 MB of `x` in 64 KiB writes, then `END <seconds the writes
/// took>`, and exits.
const WRITER: &str = "import sys, time\nw = sys.stdout.buffer\nb = b'x' * 65536\nt = time.monotonic()\n\
for _ in range(763):\n    w.write(b)\nw.flush()\nw.write(b'END %.1f\\n' % (time.monotonic() - t))\nw.flush()\n";

const WRITTEN: usize = 763 * 65536;

/// corral's own peak RSS (not its children's), from /proc.
fn vm_hwm_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// Starts the writer with `stdout` as corral's stdout, stalls `stall`
/// without reading, then reads everything through `read`. Returns what the
/// reader got and corral's VmHWM sampled just before its end.
fn stalled_reader(stdout: Stdio, stall: Duration, mut read: impl Read) -> (Vec<u8>, u64) {
    let mut child = corral_run()
        // A kill ceiling out of the way, and a kept-output budget that
        // used to be buffered for a stalled reader.
        .args(["--timeout", "120", "--output-limit", "1TiB"])
        .args(["--", "python3", "-c", WRITER])
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(stall);
    let mut out = Vec::with_capacity(WRITTEN + 64);
    let mut buf = vec![0u8; 1 << 16];
    let mut hwm = 0;
    loop {
        let n = read.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if hwm == 0 && out.len() >= WRITTEN {
            // corral lives until the program's last line has gone out.
            hwm = vm_hwm_bytes(pid);
        }
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    (out, hwm)
}

fn check(out: &[u8], hwm: u64, stall: Duration) {
    assert!(out.len() > WRITTEN, "{} bytes arrived", out.len());
    let (body, end) = out.split_at(WRITTEN);
    assert!(body.iter().all(|&b| b == b'x'), "only the program's bytes");
    let end = std::str::from_utf8(end).unwrap();
    let took: f64 = end
        .strip_prefix("END ")
        .and_then(|s| s.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("stdout ends with exactly the program's last line: {end:?}"))
        .parse()
        .unwrap();
    // The stalled reader held the program's writes back: corral did not
    // take the 50 MB into memory for it.
    assert!(
        took >= stall.as_secs_f64() - 1.0,
        "the writes took {took} s while the reader stalled {stall:?}"
    );
    assert!(hwm > 0 && hwm < 32 << 20, "corral's VmHWM {hwm} bytes");
}

#[test]
fn a_stalled_pipe_reader_blocks_the_writer_and_corral_stays_small() {
    let (r, w) = std::io::pipe().unwrap();
    let stall = Duration::from_secs(10);
    let (out, hwm) = stalled_reader(Stdio::from(OwnedFd::from(w)), stall, r);
    check(&out, hwm, stall);
}

#[test]
fn a_stalled_socket_reader_blocks_the_writer_and_corral_stays_small() {
    // Not a pipe: corral copies through a bounded buffer instead of
    // splicing, with the same backpressure.
    let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
    let stall = Duration::from_secs(3);
    let (out, hwm) = stalled_reader(Stdio::from(OwnedFd::from(w)), stall, r);
    check(&out, hwm, stall);
}

#[test]
fn output_goes_out_live_and_a_closed_reader_ends_the_writer_with_epipe() {
    // Live: the first line arrives while the program still runs.
    let mut child = corral_run()
        .args([
            "--",
            "python3",
            "-c",
            "import time\nprint('first', flush=True)\ntime.sleep(30)\n",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first\n");
    assert!(start.elapsed() < Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    // A reader that goes away: the program's next write fails as on a
    // pipe (SIGPIPE), instead of corral draining it forever.
    let start = Instant::now();
    let mut child = corral_run()
        .args([
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            "while :; do echo y; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 4];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"y\ny\n");
    drop(out);
    let status = child.wait().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "ended by the closed pipe, not the timeout"
    );
    assert_eq!(
        status.code(),
        Some(128 + 13),
        "SIGPIPE, as `yes | head` gives"
    );
}

// --- an MCP server over stdio, driven by the official MCP client ------------

/// The MCP server (official Python SDK, `MCPServer`): `blob` returns n
/// bytes of a pattern, `echo` a hash of what it got, `noise` writes numbered
/// lines to stderr.
const MCP_SERVER: &str = r#"
import hashlib, sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("corral-stream-test")

def pattern(n, seed):
    # Printable, varied, deterministic: a wrong or lost byte shows.
    line = "".join(chr(33 + (seed * 7 + i) % 90) for i in range(97)) + "\n"
    return (line * (n // len(line) + 1))[:n]

@server.tool()
def blob(n: int, seed: int) -> str:
    """n bytes of text."""
    return pattern(n, seed)

@server.tool()
def echo(text: str) -> str:
    """The sha256 of what came in."""
    return hashlib.sha256(text.encode()).hexdigest()

@server.tool()
def noise(lines: int) -> int:
    """Writes `lines` numbered lines to stderr."""
    w = sys.stderr.write
    for i in range(lines):
        w(f"noise {i}\n")
    sys.stderr.flush()
    return lines

server.run()
"#;

/// The client (official SDK, `mcp.client.stdio`): argv[1] is the server
/// command (JSON), argv[2] the file that gets the server's stderr. Prints
/// one JSON object of checks and timings.
const MCP_CLIENT: &str = r#"
import asyncio, hashlib, json, sys, time
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

def pattern(n, seed):
    line = "".join(chr(33 + (seed * 7 + i) % 90) for i in range(97)) + "\n"
    return (line * (n // len(line) + 1))[:n]

def text(r):
    assert not r.is_error, r
    return "".join(c.text for c in r.content if c.type == "text")

async def main():
    cmd = json.loads(sys.argv[1])
    out = {}
    with open(sys.argv[2], "w") as err:
        params = StdioServerParameters(command=cmd[0], args=cmd[1:])
        async with Client(stdio_client(params, errlog=err)) as c:
            # 10 MiB of results over 200 calls.
            t = time.monotonic()
            ok = True
            for i in range(200):
                ok &= text(await c.call_tool("blob", {"n": 52429, "seed": i})) == pattern(52429, i)
            out["many_calls_ok"] = ok
            out["many_calls_s"] = time.monotonic() - t
            # 5 MB each way.
            big = "".join(chr(97 + i % 26) for i in range(5_000_000))
            t = time.monotonic()
            out["echo_ok"] = text(await c.call_tool("echo", {"text": big})) == hashlib.sha256(big.encode()).hexdigest()
            out["blob_5mb_ok"] = text(await c.call_tool("blob", {"n": 5_000_000, "seed": 3})) == pattern(5_000_000, 3)
            out["big_s"] = time.monotonic() - t
            # 100k lines on stderr, then stdout still works.
            out["noise"] = int(text(await c.call_tool("noise", {"lines": 100000})))
            # Idle gaps: answers come promptly after them.
            gaps = []
            for _ in range(2):
                await asyncio.sleep(2)
                t = time.monotonic()
                ok &= text(await c.call_tool("blob", {"n": 100, "seed": 9})) == pattern(100, 9)
                gaps.append(time.monotonic() - t)
            out["after_idle_s"] = max(gaps)
            out["after_idle_ok"] = ok
    return out

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 240))))
"#;

/// One raw JSON-RPC session over stdio (no SDK on this side): initialize,
/// a 2 MB tool result (more than live output used to pass before holding
/// the rest back), end of input. Prints stdout exactly as received,
/// base64-encoded, so that corral's can be compared byte for byte with
/// the bare server's.
const RAW_SESSION: &str = r#"
import base64, json, signal, subprocess, sys
signal.alarm(120)
cmd = json.loads(sys.argv[1])
p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
def send(m):
    p.stdin.write(json.dumps(m).encode() + b"\n"); p.stdin.flush()
got = b""
def until(i):
    global got
    while True:
        line = p.stdout.readline()
        assert line, "the server ended early"
        got += line
        if json.loads(line).get("id") == i:
            return
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
until(1)
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "blob", "arguments": {"n": 2000000, "seed": 5}}})
until(2)
p.stdin.close()
got += p.stdout.read()
print(json.dumps({"stdout": base64.b64encode(got).decode(), "status": p.wait()}))
"#;

/// The same server in Node with the official TypeScript SDK
/// (`@modelcontextprotocol/sdk` from npm); argv[2] is the directory that
/// holds its `node_modules`.
const MCP_SERVER_NODE: &str = r#"
const { createRequire } = require("module");
const crypto = require("crypto");
const sdk = createRequire(process.argv[2] + "/package.json");
const { McpServer } = sdk("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = sdk("@modelcontextprotocol/sdk/server/stdio.js");
const { z } = sdk("zod");

function pattern(n, seed) {
  let line = "";
  for (let i = 0; i < 97; i++) line += String.fromCharCode(33 + ((seed * 7 + i) % 90));
  line += "\n";
  return line.repeat(Math.floor(n / line.length) + 1).slice(0, n);
}
const text = (t) => ({ content: [{ type: "text", text: t }] });
const server = new McpServer({ name: "corral-stream-test", version: "1.0.0" });
server.registerTool("blob", { inputSchema: { n: z.number().int(), seed: z.number().int() } },
  async ({ n, seed }) => text(pattern(n, seed)));
server.registerTool("echo", { inputSchema: { text: z.string() } },
  async ({ text: t }) => text(crypto.createHash("sha256").update(t, "utf8").digest("hex")));
server.registerTool("noise", { inputSchema: { lines: z.number().int() } }, async ({ lines }) => {
  let chunk = "";
  for (let i = 0; i < lines; i++) {
    chunk += `noise ${i}\n`;
    if (chunk.length > 60000) { process.stderr.write(chunk); chunk = ""; }
  }
  process.stderr.write(chunk);
  return text(String(lines));
});
server.connect(new StdioServerTransport());
"#;

/// Where scripts/test.sh installs the Node SDK (`npm install` there).
const NODE_SDK_DIR: &str = "/opt/corral-test-node";

/// Which MCP server runs in the sandbox.
#[derive(Clone, Copy)]
enum Runtime {
    /// `server.py` with the venv's python (allowed by path).
    Python,
    /// `server.cjs` with `node` (allowed in `code`).
    Node,
}

impl Runtime {
    /// The host directory with the runtime's SDK, bound read-only.
    fn sdk_dir(self) -> std::path::PathBuf {
        match self {
            Runtime::Python => sdk_python()
                .parent()
                .and_then(|p| p.parent())
                .unwrap()
                .to_path_buf(),
            Runtime::Node => {
                let dir = std::path::PathBuf::from(NODE_SDK_DIR);
                assert!(
                    dir.join("node_modules/@modelcontextprotocol/sdk").is_dir(),
                    "the Node MCP test needs `npm install @modelcontextprotocol/sdk` in {NODE_SDK_DIR} (scripts/test.sh does it)"
                );
                dir
            }
        }
    }

    /// The built-in profile for a server of this runtime.
    fn profile(self) -> &'static str {
        match self {
            Runtime::Python => "mcp-python",
            Runtime::Node => "mcp-node",
        }
    }

    /// The server's argv inside the sandbox (the script under /srv).
    fn argv(self) -> Vec<String> {
        match self {
            Runtime::Python => vec![sdk_python().display().to_string(), "/srv/server.py".into()],
            Runtime::Node => vec!["node".into(), "/srv/server.cjs".into(), NODE_SDK_DIR.into()],
        }
    }
}

/// A directory the sandbox can read holding the servers, and a config with
/// a profile `mcp` extending `runtime`'s built-in one (`mcp-python`,
/// `mcp-node`: no wall timeout, no output ceiling, execve restricted): its
/// SDK and the directory read-only, the venv's python allowed by path.
fn mcp_setup(runtime: Runtime) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, body) in [("server.py", MCP_SERVER), ("server.cjs", MCP_SERVER_NODE)] {
        let file = dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let cfg = dir.path().join("corral.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profile.mcp]\nextends = \"{}\"\n[profile.mcp.filesystem]\n\
             read_only = [\"{}\", \"{}:/srv\"]\n\
             [profile.mcp.commands]\nallow_paths = true\n",
            runtime.profile(),
            runtime.sdk_dir().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    (dir, cfg)
}

/// `corral run` of the server, as a JSON argv.
fn corral_server_argv(cfg: &std::path::Path, runtime: Runtime) -> Vec<String> {
    let mut argv = vec![corral_bin().display().to_string(), "run".into()];
    if !cpu_limit_enforceable() {
        // Its CPU limit (tests/profiles.rs shows the refusal otherwise).
        argv.push("--allow-unenforced-limits".into());
    }
    argv.extend(
        [
            "--config",
            &cfg.display().to_string(),
            "--profile",
            "mcp",
            "--",
        ]
        .map(String::from),
    );
    argv.extend(runtime.argv());
    argv
}

/// The official Python client drives `runtime`'s server through corral.
fn mcp_server_over_stdio_through_corral(runtime: Runtime) {
    let (dir, cfg) = mcp_setup(runtime);
    let errlog = dir.path().join("stderr.txt");
    let argv = serde_json::to_string(&corral_server_argv(&cfg, runtime)).unwrap();
    let v = run_sdk_python(MCP_CLIENT, &[argv, errlog.display().to_string()], "");
    assert_eq!(v["many_calls_ok"], true, "{v}");
    assert_eq!(v["echo_ok"], true, "{v}");
    assert_eq!(v["blob_5mb_ok"], true, "{v}");
    assert_eq!(v["after_idle_ok"], true, "{v}");
    // Promptly: the old live output held everything past 1 MiB until the
    // program ended, which for a server is never.
    assert!(v["many_calls_s"].as_f64().unwrap() < 30.0, "{v}");
    assert!(v["big_s"].as_f64().unwrap() < 30.0, "{v}");
    assert!(v["after_idle_s"].as_f64().unwrap() < 2.0, "{v}");
    // Every stderr line, in order, and nothing else (corral said nothing
    // but, unprivileged, the warning that its limits are not enforced).
    assert_eq!(v["noise"], 100000);
    let mut err = std::fs::read_to_string(&errlog).unwrap();
    if !is_root() {
        let warning = err
            .lines()
            .next()
            .filter(|l| l.contains("\"code\":\"limits.unenforced\""))
            .map(|l| l.len() + 1)
            .unwrap_or(0);
        err.drain(..warning);
    }
    let expected: String = (0..100000).map(|i| format!("noise {i}\n")).collect();
    assert!(err == expected, "stderr differs: {} bytes", err.len());
}

#[test]
fn a_python_mcp_server_over_stdio_through_corral() {
    mcp_server_over_stdio_through_corral(Runtime::Python);
}

#[test]
fn a_node_mcp_server_over_stdio_through_corral() {
    mcp_server_over_stdio_through_corral(Runtime::Node);
}

#[test]
fn an_mcp_session_s_stdout_through_corral_is_byte_for_byte_the_bare_server_s() {
    let (dir, cfg) = mcp_setup(Runtime::Python);
    let bare = vec![
        sdk_python().display().to_string(),
        dir.path().join("server.py").display().to_string(),
    ];
    let bare = run_sdk_python(RAW_SESSION, &[serde_json::to_string(&bare).unwrap()], "");
    let sandboxed = serde_json::to_string(&corral_server_argv(&cfg, Runtime::Python)).unwrap();
    let sandboxed = run_sdk_python(RAW_SESSION, &[sandboxed], "");
    assert_eq!(bare["status"], 0, "{bare}");
    assert_eq!(sandboxed["status"], 0, "{sandboxed}");
    let (b, s) = (
        bare["stdout"].as_str().unwrap(),
        sandboxed["stdout"].as_str().unwrap(),
    );
    // 2 MB of tool result inside, base64-encoded.
    assert!(b.len() > 2_000_000, "{}", b.len());
    assert!(b == s, "corral's stdout differs from the bare server's");
}

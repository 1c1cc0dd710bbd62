//! The supervisor end to end: `corral serve` runs `[[server.mcp_server]]`
//! processes (official Python and TypeScript SDK servers) in their own
//! sandboxes, and the official Python and TypeScript clients reach them at
//! `/mcp/servers/{name}` with bearer tokens, in both MCP revisions
//! (2026-07-28 session-less, 2025-11-25 with sessions). Tool filters,
//! declared environment, host names, per-tenant isolation, the log
//! limiter's accounting, crash loops, idle stops, corral's death, HTTP
//! edge cases and oversized answers.
//!
//! Each test builds its own server tree under /var/tmp (corral mounts the
//! tree at its own path; /tmp is reserved in the sandbox) with a `.venv`
//! whose `.pth` points at the SDK's venv, and tags it with a unique path
//! that the process checks look for.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Python server (official SDK, `MCPServer`): every tool the tests
/// need. Its own logging is off so that its stderr holds only what a tool
/// writes (the flood test counts lines exactly).
const PY_SERVER: &str = r#"
import json, logging, os, socket, subprocess, sys
from mcp.server.mcpserver import MCPServer

ID = os.urandom(8).hex()
server = MCPServer("sv-test")

@server.tool()
def whoami() -> str:
    """Host name, this process's random id and pid."""
    return json.dumps({"host": socket.gethostname(), "id": ID, "pid": os.getpid()})

@server.tool()
def env(name: str) -> str:
    """An environment variable."""
    return os.environ.get(name, "<unset>")

@server.tool()
def delete_city(city: str) -> str:
    """Hidden by the tool filter."""
    return "deleted " + city

@server.tool()
def write(name: str, text: str) -> str:
    """Writes /workspace/NAME."""
    with open("/workspace/" + name, "w") as f:
        f.write(text)
    return "written"

@server.tool()
def read(name: str) -> str:
    """Reads /workspace/NAME."""
    try:
        with open("/workspace/" + name) as f:
            return f.read()
    except FileNotFoundError:
        return "<missing>"

@server.tool()
def spawn(marker: str) -> str:
    """Starts a child that sleeps with MARKER in its argv."""
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return "spawned"

@server.tool()
def procs() -> str:
    """Every process's command line this process can see."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return json.dumps(out)

@server.tool()
def flood(lines: int) -> int:
    """Writes LINES lines to stderr."""
    w = sys.stderr.write
    for i in range(lines):
        w(f"flood {i}\n")
    sys.stderr.flush()
    return lines

@server.tool()
def blob(n: int) -> str:
    """N bytes of text."""
    return "x" * n

@server.tool()
def size(text: str) -> int:
    """The length of TEXT."""
    return len(text)

CANCELLED = [0]

@server.tool()
async def slow(secs: float) -> str:
    """Answers after SECS seconds."""
    import asyncio
    try:
        await asyncio.sleep(secs)
    except asyncio.CancelledError:
        CANCELLED[0] += 1
        raise
    return "slept"

@server.tool()
def cancelled() -> int:
    """How many `slow` calls were cancelled."""
    return CANCELLED[0]

@server.tool()
def die(code: int) -> str:
    """Ends the process at once, in the middle of the call."""
    os._exit(code)

logging.disable(logging.CRITICAL)
server.run()
"#;

/// A Python "server" that exits at once, successfully.
const PY_EXITS: &str = "import sys\nsys.exit(0)\n";

/// The Node server (official TypeScript SDK): `whoami`.
const NODE_SERVER: &str = r#"
const { createRequire } = require("module");
const os = require("os");
const sdk = createRequire("/opt/corral-test-node/package.json");
const { McpServer } = sdk("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = sdk("@modelcontextprotocol/sdk/server/stdio.js");
const server = new McpServer({ name: "sv-node", version: "1.0.0" });
server.registerTool("whoami", { description: "Host name and runtime." }, async () => ({
  content: [{ type: "text", text: JSON.stringify({ host: os.hostname(), runtime: "node " + process.version }) }],
}));
const { z } = sdk("zod");
// Its answer is `{"result":...,"jsonrpc":"2.0","id":N}`: the id comes
// last, after a result that may hold `"id"` keys of its own.
server.registerTool("blob", { description: "N bytes, after nested ids.", inputSchema: { n: z.number().int() } },
  async ({ n }) => ({
    content: [{ type: "text", text: "x".repeat(n) }],
    structuredContent: { id: 1, items: [{ id: 2 }] },
  }));
server.connect(new StdioServerTransport());
"#;

/// The official Python client over streamable HTTP: argv = url, token
/// ("" for none), mode (`auto`: 2026-07-28 through server/discover,
/// `legacy`: the 2025-11-25 handshake), steps as JSON (`["list"]`,
/// `["call", name, args]`, `["sleep", secs]`). Prints the protocol
/// revision and one result per step.
const PY_CLIENT: &str = r#"
import asyncio, json, sys
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    url, token, mode, steps = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    headers = {"Authorization": "Bearer " + token} if token else {}
    out = []
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as c:
            for s in steps:
                try:
                    if s[0] == "list":
                        r = await c.list_tools()
                        out.append({"tools": sorted(t.name for t in r.tools)})
                    elif s[0] == "sleep":
                        await asyncio.sleep(s[1])
                        out.append({})
                    else:
                        r = await c.call_tool(s[1], s[2])
                        out.append({"text": "".join(x.text for x in r.content if x.type == "text"),
                                    "is_error": bool(r.is_error)})
                except Exception as e:
                    out.append({"error": repr(e)})
            return {"protocol": c.protocol_version, "results": out}

try:
    print(json.dumps(asyncio.run(asyncio.wait_for(main(), 120))))
except BaseException as e:
    print(json.dumps({"fatal": repr(e)}))
"#;

/// The official TypeScript client: argv = url, token, tool to call, tool
/// to try although hidden ("" for none). Prints the tools, the call's
/// text, and what the hidden tool's call gave.
const NODE_CLIENT: &str = r#"
const { createRequire } = require("module");
const sdk = createRequire("/opt/corral-test-node/package.json");
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
(async () => {
  const [url, token, tool, hidden] = process.argv.slice(2);
  const client = new Client({ name: "sv-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer " + token } },
  }));
  const tools = await client.listTools();
  const r = await client.callTool({ name: tool, arguments: {} });
  let refused = null;
  if (hidden) {
    try {
      const h = await client.callTool({ name: hidden, arguments: { city: "x" } });
      refused = { result: h };
    } catch (e) {
      refused = { error: String(e) };
    }
  }
  console.log(JSON.stringify({ tools: tools.tools.map((t) => t.name).sort(), text: r.content[0].text, refused }));
  await client.close();
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// Where scripts/test.sh installs the Node SDK.
const NODE_SDK_DIR: &str = "/opt/corral-test-node";

/// The SDK's venv (its interpreter's prefix).
fn sdk_venv() -> PathBuf {
    sdk_python()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf()
}

/// The SDK venv's site-packages.
fn sdk_site_packages() -> String {
    let out = Command::new(sdk_python())
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// A server tree under /var/tmp, readable by the sandbox (0755/0644),
/// holding `files` and, with `venv`, a `.venv` whose `.pth` adds the SDK's
/// site-packages. Its unique path tags its processes.
fn tree(files: &[(&str, &str)], venv: bool) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("corral-sv-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, body) in files {
        let f = dir.path().join(name);
        std::fs::write(&f, body).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    if venv {
        let v = dir.path().join(".venv");
        // umask 022: the sandbox's uid (65534 as root) reads it.
        let out = Command::new("sh")
            .args([
                "-c",
                "umask 022 && exec /usr/bin/python3 -m venv --without-pip \"$0\"",
            ])
            .arg(&v)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert!(out.status.success(), "venv: {}", text(&out.stderr));
        let lib = std::fs::read_dir(v.join("lib"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("site-packages");
        let pth = lib.join("corral-sdk.pth");
        std::fs::write(&pth, format!("{}\n", sdk_site_packages())).unwrap();
        std::fs::set_permissions(&pth, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    dir
}

/// Profiles `mcp` (mcp-python with the SDK's venv visible) and `mcpnode`
/// (mcp-node with the Node SDK visible); their cgroup limits may go
/// unenforced where this host cannot enforce them (tests/profiles.rs).
fn profiles() -> String {
    let unenforced = !cpu_limit_enforceable();
    format!(
        "[profile.mcp]\nextends = \"mcp-python\"\n[profile.mcp.filesystem]\nread_only = [\"{}\"]\n\
         [profile.mcp.limits]\nallow_unenforced = {unenforced}\n\
         [profile.mcpnode]\nextends = \"mcp-node\"\n[profile.mcpnode.filesystem]\nread_only = [\"{NODE_SDK_DIR}\"]\n\
         [profile.mcpnode.limits]\nallow_unenforced = {unenforced}\n",
        sdk_venv().display()
    )
}

/// A `[[server.mcp_server]]` of the Python server in `tree`, then `more`
/// (keys of the entry, then its sub-tables).
fn py_entry(name: &str, tree: &Path, more: &str) -> String {
    format!(
        "[[server.mcp_server]]\nname = \"{name}\"\nruntime = \"python3\"\ndir = \"{}\"\nentry = \"server.py\"\nprofile = \"mcp\"\n{more}\n",
        tree.display()
    )
}

/// A running `corral serve` whose stderr goes to a file.
struct Serve {
    server: Server,
}

impl Serve {
    fn addr(&self) -> &str {
        &self.server.addr
    }

    fn url(&self, name: &str) -> String {
        format!("http://{}/mcp/servers/{name}", self.server.addr)
    }

    /// The Python client (see [`PY_CLIENT`]) against server `name`; it
    /// must connect (else: what corral logged, and whether it still runs).
    fn py(&self, name: &str, token: &str, mode: &str, steps: Value) -> Value {
        let v = py_client_any(&self.url(name), token, mode, steps);
        if v.get("fatal").is_some() {
            let status = std::fs::read_to_string(format!("/proc/{}/stat", self.server.child.id()));
            panic!(
                "the client failed: {v}\ncorral serve: {status:?}\nits log:\n{}",
                self.log()
            );
        }
        v
    }

    /// corral's own stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.server.path().join("serve.err")).unwrap_or_default()
    }

    /// The audit events written to `audit_jsonl` so far.
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.server.path().join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["kind"] == "event")
            .collect()
    }

    /// Events with `code` of server `name`.
    fn events_of(&self, name: &str, code: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["server"] == name && e["code"] == code)
            .collect()
    }

    /// Events with `code` of server `name`, once there are at least `n`
    /// (the audit writer stores them shortly after the fact), and a moment
    /// more for any extra one to show.
    fn events_n(&self, name: &str, code: &str, n: usize) -> Vec<Value> {
        wait_until(15, &format!("{n} {code} events of {name}"), || {
            self.events_of(name, code).len() >= n
        });
        std::thread::sleep(Duration::from_millis(300));
        self.events_of(name, code)
    }

    /// Server `name` in `GET /v1/mcp-servers` as `token` sees it.
    fn status(&self, token: Option<&str>, name: &str) -> Value {
        let (code, _, body) = http(self.addr(), "GET", "/v1/mcp-servers", token, None);
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no server {name} in {v}"))
    }

    /// SIGTERM, and waits for corral to end (it stops its servers first).
    fn terminate(&mut self) {
        let pid = self.server.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let start = Instant::now();
        loop {
            if self.server.child.try_wait().unwrap().is_some() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "corral did not end"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `corral serve` with [`serve_config`] plus `audit_jsonl`, `extra` and
/// [`profiles`], `env` in its environment, stderr kept in `serve.err`.
fn serve(extra: &str, env: &[(&str, &str)]) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(
        dir.path(),
        &format!(
            "audit_jsonl = \"{}\"\n{extra}\n{}",
            dir.path().join("audit.jsonl").display(),
            profiles()
        ),
    );
    let err = dir.path().join("serve.err");
    let mut c = corral();
    c.arg("serve")
        .arg("--config")
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.spawn().unwrap();
    let mut server = Server {
        child,
        addr: String::new(),
        dir: Some(dir),
    };
    let mut addr = None;
    wait_until(30, "corral serve announces its address", || {
        let log = std::fs::read_to_string(&err).unwrap_or_default();
        // Whole lines only: the file may hold half of the line so far.
        addr = log
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .find_map(|l| l.split("serving on http://").nth(1))
            .map(|a| a.trim().to_string());
        if addr.is_none() {
            if let Ok(Some(st)) = server.child.try_wait() {
                panic!("corral serve ended ({st}): {log}");
            }
        }
        addr.is_some()
    });
    server.addr = addr.unwrap();
    Serve { server }
}

/// Runs the Python client (see [`PY_CLIENT`]); it prints `{"fatal": ...}`
/// when it fails as a whole.
fn py_client_any(url: &str, token: &str, mode: &str, steps: Value) -> Value {
    run_sdk_python(
        PY_CLIENT,
        &[url.into(), token.into(), mode.into(), steps.to_string()],
        "",
    )
}

/// The text of a step's tool result, which must have succeeded.
fn ok_text(step: &Value) -> String {
    assert_eq!(step["is_error"], false, "{step}");
    step["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{step}"))
        .to_string()
}

/// `whoami` of the Python server, parsed.
fn whoami(step: &Value) -> Value {
    serde_json::from_str(&ok_text(step)).unwrap()
}

/// Runs the TypeScript client (see [`NODE_CLIENT`]).
fn node_client(url: &str, token: &str, tool: &str, hidden: &str) -> Value {
    assert!(
        Path::new(NODE_SDK_DIR)
            .join("node_modules/@modelcontextprotocol/sdk")
            .is_dir(),
        "the Node MCP tests need `npm install @modelcontextprotocol/sdk` in {NODE_SDK_DIR} (scripts/test.sh does it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.cjs");
    std::fs::write(&script, NODE_CLIENT).unwrap();
    let out = Command::new("node")
        .arg(&script)
        .args([url, token, tool, hidden])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the Node client printed no JSON ({e}); status={:?}\nstdout={}\nstderr={}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// A unique marker for this test run.
fn marker(what: &str) -> String {
    format!("{what}-{}-{:08x}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u32::from_le_bytes(b)
}

// --- 1. the official Python client, both revisions -------------------------

#[test]
fn python_server_supervised_for_the_python_client_in_both_revisions() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let key = marker("key");
    let region = marker("region");
    let secret = marker("secret");
    let s = serve(
        &format!(
            "{}{}",
            tenant("acme", "tok-acme"),
            py_entry(
                "weather",
                t.path(),
                &format!(
                    "tenants = [\"acme\"]\nenv = [\"WEATHER_API_KEY\", \"REGION\"]\n\
                     [server.mcp_server.env_values]\nREGION = \"{region}\"\n\
                     [server.mcp_server.tools]\nomit = [\"delete_city\"]\n"
                )
            )
        ),
        &[("WEATHER_API_KEY", &key), ("HOST_SECRET", &secret)],
    );
    let steps = serde_json::json!([
        ["list"],
        ["call", "env", {"name": "WEATHER_API_KEY"}],
        ["call", "env", {"name": "REGION"}],
        ["call", "env", {"name": "HOST_SECRET"}],
        ["call", "whoami", {}],
        ["call", "delete_city", {"city": "Oslo"}],
    ]);
    let mut ids = Vec::new();
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let v = s.py("weather", "tok-acme", mode, steps.clone());
        assert_eq!(v["protocol"], protocol, "{v}");
        let r = &v["results"];
        let tools = r[0]["tools"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert!(
            !tools.is_empty() && tools.iter().all(|t| t != "delete_city"),
            "{v}"
        );
        assert!(tools.iter().any(|t| t == "whoami"), "{v}");
        assert_eq!(ok_text(&r[1]), key, "{v}");
        assert_eq!(ok_text(&r[2]), region, "{v}");
        assert_eq!(ok_text(&r[3]), "<unset>", "{v}");
        let me = whoami(&r[4]);
        assert_eq!(me["host"], "mcp-acme", "{v}");
        ids.push(me["id"].clone());
        let hidden = r[5]["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(
            hidden.contains("-32602") && hidden.contains("Unknown tool: delete_city"),
            "{v}"
        );
    }
    // One process served both (per-tenant, one tenant).
    assert_eq!(ids[0], ids[1]);
    // The hidden call was refused by corral (audited), never forwarded.
    let refused = s.events_n("weather", "mcp.refused", 2);
    assert_eq!(refused.len(), 2, "{refused:?}");
    let calls = s.events_n("weather", "mcp.call", 8);
    assert!(calls
        .iter()
        .all(|c| c["event"]["fields"]["tool"] != "delete_city"));
    assert_eq!(calls.len(), 8, "{calls:?}");
    assert!(calls.iter().all(|c| c["tenant"] == "acme"
        && c["event"]["fields"]["outcome"] == "ok"
        && c["event"]["fields"]["duration_ms"].is_u64()));
    // The secrets never reached corral's log.
    let log = s.log();
    assert!(!log.contains(&key) && !log.contains(&secret));
}

// --- 2. the TypeScript client, and a Node server ---------------------------

#[test]
fn typescript_client_and_a_node_server_supervised() {
    let py = tree(&[("server.py", PY_SERVER)], true);
    let js = tree(&[("server.cjs", NODE_SERVER)], false);
    let s = serve(
        &format!(
            "{}{}[[server.mcp_server]]\nname = \"nodesv\"\nruntime = \"node\"\ndir = \"{}\"\nentry = \"server.cjs\"\nprofile = \"mcpnode\"\ntenants = [\"ts\"]\n",
            tenant("ts", "tok-ts"),
            py_entry(
                "weather",
                py.path(),
                "tenants = [\"ts\"]\n[server.mcp_server.tools]\nomit = [\"delete_city\"]\n"
            ),
            js.path().display()
        ),
        &[],
    );
    let v = node_client(&s.url("weather"), "tok-ts", "whoami", "delete_city");
    let tools = v["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "whoami"), "{v}");
    assert!(tools.iter().all(|t| t != "delete_city"), "{v}");
    let me: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert_eq!(me["host"], "mcp-ts", "{v}");
    let refused = v["refused"].to_string();
    assert!(refused.contains("Unknown tool: delete_city"), "{v}");
    // The Node server (runtime "node", TypeScript SDK).
    let v = node_client(&s.url("nodesv"), "tok-ts", "whoami", "");
    assert_eq!(v["tools"], serde_json::json!(["blob", "whoami"]), "{v}");
    let me: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert_eq!(me["host"], "mcp-ts", "{v}");
    assert!(me["runtime"].as_str().unwrap().starts_with("node v"), "{v}");
    let st = s.status(Some("tok-ts"), "nodesv");
    assert_eq!(st["runtime"], "node", "{st}");
    assert_eq!(st["state"], "ready", "{st}");
}

// --- 3. log flood -----------------------------------------------------------

#[test]
fn a_log_flood_is_dropped_counted_and_summarised_exactly() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let mut s = serve(
        &py_entry(
            "noisy",
            t.path(),
            "idle_stop_secs = 4\n[server.mcp_server.log]\nsummary_secs = 1\n",
        ),
        &[],
    );
    // Started, one call answered: whatever it printed so far.
    let v = s.py(
        "noisy",
        "",
        "auto",
        serde_json::json!([["call", "whoami", {}]]),
    );
    whoami(&v["results"][0]);
    let before = s.status(None, "noisy");
    let base =
        before["dropped_log_lines"].as_u64().unwrap() + before["logged_lines"].as_u64().unwrap();
    // The server prints nothing of its own and `corral run` nothing on
    // its stderr (its events go to the events file, unenforced limits
    // included): every line counted below is the flood's.
    assert_eq!(base, 0, "{before}");
    let v = s.py(
        "noisy",
        "",
        "auto",
        serde_json::json!([["call", "flood", {"lines": 100000}]]),
    );
    assert_eq!(ok_text(&v["results"][0]), "100000", "{v}");
    let summed = |s: &Serve| -> u64 {
        s.events_of("noisy", "mcp.log_rate_limit_exceeded")
            .iter()
            .map(|e| e["event"]["fields"]["dropped"].as_u64().unwrap())
            .sum()
    };
    // While it runs: the summaries catch up with the counter.
    let mut st = Value::Null;
    wait_until(15, "the summaries add up to the dropped count", || {
        st = s.status(None, "noisy");
        let dropped = st["dropped_log_lines"].as_u64().unwrap();
        dropped > 0 && summed(&s) == dropped
    });
    let dropped = st["dropped_log_lines"].as_u64().unwrap();
    let logged = st["logged_lines"].as_u64().unwrap();
    assert_eq!(dropped + logged, base + 100_000, "{st} (before: {before})");
    assert!(dropped >= 90_000, "{st}");
    // Idle stop ends the process (its last summary flushed): still exact.
    wait_until(20, "the idle process stops", || {
        s.status(None, "noisy")["instances"][0]["last_exit"]["requested"] == true
    });
    s.events_n("noisy", "mcp.server_exit", 1);
    let st = s.status(None, "noisy");
    let dropped = st["dropped_log_lines"].as_u64().unwrap();
    wait_until(10, "the last summary is stored", || summed(&s) == dropped);
    let total = dropped + st["logged_lines"].as_u64().unwrap();
    assert_eq!(total, base + 100_000, "{st} (before: {before})");
    // And after corral stops.
    s.terminate();
    assert_eq!(summed(&s), dropped);
    // corral's own log got the lines within the limit, not 100k.
    let log = s.log();
    let lines = log.lines().filter(|l| l.contains("flood ")).count();
    assert!(
        lines > 0 && lines < 1000,
        "{lines} flood lines in corral's log"
    );
    assert!(log.lines().count() < 2000, "{} lines", log.lines().count());
}

// --- 4. crash loop ----------------------------------------------------------

#[test]
fn a_server_that_exits_at_once_is_restarted_then_failed_with_clear_errors() {
    let t = tree(&[("server.py", PY_EXITS)], true);
    let s = serve(
        &py_entry(
            "crashy",
            t.path(),
            "[server.mcp_server.restart]\nmax_restarts = 2\nbackoff_initial_ms = 100\n",
        ),
        &[],
    );
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let started = Instant::now();
    let (code, _, body) = http(s.addr(), "POST", "/mcp/servers/crashy", None, Some(init));
    assert_eq!(code, 503, "{body}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], 1, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not start"),
        "{v}"
    );
    let mut st = Value::Null;
    wait_until(30, "the server is failed", || {
        st = s.status(None, "crashy");
        st["state"] == "failed"
    });
    assert_eq!(st["restarts"], 2, "{st}");
    assert_eq!(st["instances"][0]["restarts"], 2, "{st}");
    assert!(
        st["error"].as_str().unwrap().contains("max_restarts 2"),
        "{st}"
    );
    // Exactly 3 starts (no more restarts come).
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.status(None, "crashy")["restarts"], 2);
    assert_eq!(s.events_n("crashy", "mcp.server_start", 3).len(), 3);
    let loops = s.events_n("crashy", "mcp.crash_loop", 1);
    assert_eq!(loops.len(), 1, "{loops:?}");
    assert_eq!(loops[0]["event"]["fields"]["failures"], 3);
    let exits = s.events_n("crashy", "mcp.server_exit", 3);
    assert_eq!(exits.len(), 3, "{exits:?}");
    assert!(exits
        .iter()
        .all(|e| e["event"]["fields"]["requested"] == false
            && e["event"]["fields"]["exit_code"] == 0));
    // Requests now get an immediate, clear error, in both revisions.
    let started = Instant::now();
    let (code, _, body) = http(s.addr(), "POST", "/mcp/servers/crashy", None, Some(init));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("failing too often"), "{body}");
    let v = py_client_any(&s.url("crashy"), "", "auto", serde_json::json!([]));
    assert!(v["fatal"].as_str().is_some(), "{v}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

// --- 5. per-tenant isolation, shared mode ----------------------------------

#[test]
fn per_tenant_processes_are_isolated_and_shared_ones_are_shared() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(
        &format!(
            "{}{}{}{}",
            tenant("ta", "tok-a"),
            tenant("tb", "tok-b"),
            py_entry("iso", t.path(), "tenants = [\"ta\", \"tb\"]\n"),
            py_entry(
                "common",
                t.path(),
                "tenants = [\"ta\", \"tb\"]\nmode = \"shared\"\n"
            ),
        ),
        &[],
    );
    let file = marker("file");
    let sleeper = marker("sleeper");
    let a = s.py(
        "iso",
        "tok-a",
        "auto",
        serde_json::json!([
            ["call", "whoami", {}],
            ["call", "write", {"name": file, "text": "from a"}],
            ["call", "read", {"name": file}],
            ["call", "spawn", {"marker": sleeper}],
            ["sleep", 0.5],
            ["call", "procs", {}],
        ]),
    );
    let r = &a["results"];
    assert_eq!(ok_text(&r[2]), "from a", "{a}");
    let a_procs = ok_text(&r[5]);
    assert!(a_procs.contains(&sleeper), "A sees its own child: {a}");
    let b = s.py(
        "iso",
        "tok-b",
        "legacy",
        serde_json::json!([
            ["call", "whoami", {}],
            ["call", "read", {"name": file}],
            ["call", "procs", {}],
        ]),
    );
    let rb = &b["results"];
    let (wa, wb) = (whoami(&r[0]), whoami(&rb[0]));
    assert_ne!(wa["id"], wb["id"], "two processes: {a} {b}");
    assert_eq!(wa["host"], "mcp-ta");
    assert_eq!(wb["host"], "mcp-tb");
    assert_eq!(ok_text(&rb[1]), "<missing>", "B does not see A's file: {b}");
    let b_procs: Vec<String> = serde_json::from_str(&ok_text(&rb[2])).unwrap();
    assert!(!b_procs.is_empty());
    assert!(
        b_procs.iter().all(|p| !p.contains(&sleeper)),
        "B sees A's process: {b_procs:?}"
    );
    // The supervisor's view: one process each, different pids.
    let (sa, sb) = (
        s.status(Some("tok-a"), "iso"),
        s.status(Some("tok-b"), "iso"),
    );
    assert_eq!(sa["instances"].as_array().unwrap().len(), 1, "{sa}");
    assert_eq!(sb["instances"].as_array().unwrap().len(), 1, "{sb}");
    let (pa, pb) = (&sa["instances"][0]["pid"], &sb["instances"][0]["pid"]);
    assert!(pa.is_u64() && pb.is_u64() && pa != pb, "{sa} {sb}");
    // Shared: both tenants reach the same process.
    let ca = s.py(
        "common",
        "tok-a",
        "auto",
        serde_json::json!([["call", "whoami", {}]]),
    );
    let cb = s.py(
        "common",
        "tok-b",
        "legacy",
        serde_json::json!([["call", "whoami", {}]]),
    );
    let (wa, wb) = (whoami(&ca["results"][0]), whoami(&cb["results"][0]));
    assert_eq!(wa["id"], wb["id"], "{ca} {cb}");
    assert_eq!(wa["host"], "mcp-common");
    let (sa, sb) = (
        s.status(Some("tok-a"), "common"),
        s.status(Some("tok-b"), "common"),
    );
    assert_eq!(sa["instances"][0]["kind"], "shared");
    assert_eq!(sa["instances"][0]["pid"], sb["instances"][0]["pid"]);
}

// --- 6. idle stop and respawn ----------------------------------------------

#[test]
fn an_idle_process_stops_and_the_next_call_starts_a_new_one() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let tag = t.path().display().to_string();
    let s = serve(&py_entry("sleepy", t.path(), "idle_stop_secs = 2\n"), &[]);
    let v = s.py(
        "sleepy",
        "",
        "auto",
        serde_json::json!([["call", "whoami", {}]]),
    );
    let first = whoami(&v["results"][0]);
    let st = s.status(None, "sleepy");
    assert_eq!(st["state"], "ready", "{st}");
    let pid = st["instances"][0]["pid"].as_u64().unwrap();
    assert!(process_running("", &tag), "its process runs");
    let mut st = Value::Null;
    wait_until(20, "the idle process is stopped", || {
        st = s.status(None, "sleepy");
        st["state"] == "stopped"
    });
    assert_eq!(st["instances"][0]["last_exit"]["requested"], true, "{st}");
    assert!(st["instances"][0]["pid"].is_null(), "{st}");
    wait_until(10, "no process of the server is left", || {
        !process_running("", &tag)
    });
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let exits = s.events_n("sleepy", "mcp.server_exit", 1);
    assert_eq!(exits.len(), 1);
    assert_eq!(exits[0]["event"]["fields"]["requested"], true);
    // The next call starts a new process.
    let v = s.py(
        "sleepy",
        "",
        "legacy",
        serde_json::json!([["call", "whoami", {}]]),
    );
    let second = whoami(&v["results"][0]);
    assert_ne!(first["id"], second["id"]);
    let st = s.status(None, "sleepy");
    assert_eq!(st["state"], "ready", "{st}");
    let pid2 = st["instances"][0]["pid"].as_u64().unwrap();
    assert_ne!(pid, pid2);
    assert_eq!(st["restarts"], 0, "an idle stop is no failure: {st}");
    assert_eq!(s.events_n("sleepy", "mcp.server_start", 2).len(), 2);
    // The sandbox's own events of the first process, with its server.
    let runs = s.events_n("sleepy", "run.start", 2);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let ends = s.events_n("sleepy", "run.exit", 1);
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0]["tenant"], "anonymous", "{ends:?}");
}

// --- 7. corral killed -------------------------------------------------------

#[test]
fn killing_corral_serve_leaves_no_sandbox_process() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let tag = t.path().display().to_string();
    let mut s = serve(
        &format!(
            "{}{}",
            py_entry("a", t.path(), ""),
            py_entry("b", t.path(), "mode = \"shared\"\n")
        ),
        &[],
    );
    for name in ["a", "b"] {
        let v = s.py(
            name,
            "",
            "auto",
            serde_json::json!([["call", "spawn", {"marker": tag}]]),
        );
        assert_eq!(ok_text(&v["results"][0]), "spawned", "{v}");
    }
    let count = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .filter(|c| String::from_utf8_lossy(c).contains(&tag))
            .count()
    };
    // Per server: `corral run`, python, its sleeping child (at least).
    assert!(count() >= 6, "{} processes", count());
    assert!(process_running(&corral_bin().display().to_string(), &tag));
    s.server.child.kill().unwrap();
    s.server.child.wait().unwrap();
    wait_until(10, "every sandbox process is gone", || count() == 0);
}

// --- 8. HTTP edges ----------------------------------------------------------

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

/// A JSON-RPC error answer whose message contains `text`, answered
/// within 20 s of `started` (not by a request timeout).
fn assert_rpc_error(v: &Value, text: &str, started: Instant) {
    assert!(
        v["error"]["message"].as_str().unwrap_or("").contains(text),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// Opens a 2025-11-25 session on server `name` with `token` (`""`: none);
/// returns its id.
fn open_session(s: &Serve, name: &str, token: &str) -> String {
    let (c, head, body) = post(s, name, token, None, INIT);
    assert_eq!(c, 200, "{body}");
    head_value(&head, "mcp-session-id").unwrap_or_else(|| panic!("{head}"))
}

/// A header's value in a response head.
fn head_value(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// POST `body` to server `name` as `token` ("": none), in session
/// `session`.
fn post(
    s: &Serve,
    name: &str,
    token: &str,
    session: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let auth = format!("Bearer {token}");
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    if !token.is_empty() {
        headers.push(("Authorization", auth.as_str()));
    }
    if let Some(sid) = session {
        headers.push(("Mcp-Session-Id", sid));
        headers.push(("MCP-Protocol-Version", "2025-11-25"));
    }
    http_with(
        s.addr(),
        "POST",
        &format!("/mcp/servers/{name}"),
        &headers,
        Some(body),
    )
}

#[test]
fn http_edges_of_the_bridge() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let missing_var = marker("CORRAL_SV_UNSET").replace('-', "_").to_uppercase();
    let s = serve(
        &format!(
            "{}{}{}{}{}",
            tenant("ta", "tok-a"),
            tenant("tb", "tok-b"),
            py_entry("onlya", t.path(), "tenants = [\"ta\"]\n"),
            py_entry("both", t.path(), "tenants = [\"ta\", \"tb\"]\n"),
            py_entry(
                "broken",
                t.path(),
                &format!("tenants = [\"ta\"]\nenv = [\"{missing_var}\"]\n")
            ),
        ),
        &[],
    );
    // A tenant the server does not list: the same 404 as no server.
    let (c1, _, b1) = post(&s, "onlya", "tok-b", None, INIT);
    let (c2, _, b2) = post(&s, "nosuchserver", "tok-b", None, INIT);
    assert_eq!((c1, c2), (404, 404), "{b1} {b2}");
    assert_eq!(b1, b2);
    let (c, _, b) = http(s.addr(), "GET", "/v1/mcp-servers", Some("tok-b"), None);
    assert_eq!(c, 200);
    assert!(!b.contains("onlya") && b.contains("both"), "{b}");
    // No token: refused.
    let (c, _, _) = http(s.addr(), "POST", "/mcp/servers/both", None, Some(INIT));
    assert_eq!(c, 401);
    // A session of A's.
    let sid = open_session(&s, "both", "tok-a");
    let (c, _, body) = post(&s, "both", "tok-a", Some(&sid), LIST);
    assert_eq!(c, 200, "{body}");
    assert!(body.contains("whoami"), "{body}");
    // An unknown session, and A's session used by B: 404.
    let (c, _, body) = post(
        &s,
        "both",
        "tok-a",
        Some("00112233445566778899aabbccddeeff"),
        LIST,
    );
    assert_eq!(c, 404, "{body}");
    let (c, _, body) = post(&s, "both", "tok-b", Some(&sid), LIST);
    assert_eq!(c, 404, "{body}");
    // GET (no server stream): 405.
    let (c, head, _) = http(s.addr(), "GET", "/mcp/servers/both", Some("tok-a"), None);
    assert_eq!(c, 405, "{head}");
    // B cannot end A's session; A can, once.
    let auth_b = "Bearer tok-b".to_string();
    let auth_a = "Bearer tok-a".to_string();
    let del = |auth: &str| {
        http_with(
            s.addr(),
            "DELETE",
            "/mcp/servers/both",
            &[("Authorization", auth), ("Mcp-Session-Id", &sid)],
            None,
        )
        .0
    };
    assert_eq!(del(&auth_b), 404);
    assert_eq!(del(&auth_a), 204);
    assert_eq!(del(&auth_a), 404);
    let (c, _, body) = post(&s, "both", "tok-a", Some(&sid), LIST);
    assert_eq!(c, 404, "the ended session is unknown: {body}");
    // A server missing a declared variable is refused, naming it...
    let st = s.status(Some("tok-a"), "broken");
    assert_eq!(st["state"], "refused", "{st}");
    assert!(st["error"].as_str().unwrap().contains(&missing_var), "{st}");
    let (c, _, body) = post(&s, "broken", "tok-a", None, INIT);
    assert_eq!(c, 503, "{body}");
    assert!(body.contains(&missing_var), "{body}");
    wait_until(10, "the refusal is audited", || {
        s.events_of("broken", "mcp.server_refused").iter().any(|e| {
            e["event"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(&missing_var)
        })
    });
    // ...while the others work.
    let v = s.py(
        "onlya",
        "tok-a",
        "auto",
        serde_json::json!([["call", "whoami", {}]]),
    );
    assert_eq!(whoami(&v["results"][0])["host"], "mcp-ta");
}

// --- 9. oversized answers ---------------------------------------------------

#[test]
fn an_answer_over_max_message_bytes_fails_that_call_only() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let js = tree(&[("server.cjs", NODE_SERVER)], false);
    let s = serve(
        &format!(
            "{}[[server.mcp_server]]\nname = \"nodebig\"\nruntime = \"node\"\ndir = \"{}\"\n\
             entry = \"server.cjs\"\nprofile = \"mcpnode\"\nmax_message_bytes = \"1MiB\"\n",
            py_entry("big", t.path(), "max_message_bytes = \"1MiB\"\n"),
            js.path().display()
        ),
        &[],
    );
    for mode in ["legacy", "auto"] {
        let v = s.py(
            "big",
            "",
            mode,
            serde_json::json!([
                ["call", "blob", {"n": 1000}],
                ["call", "blob", {"n": 2 << 20}],
                ["call", "blob", {"n": 500_000}],
            ]),
        );
        let r = &v["results"];
        assert_eq!(ok_text(&r[0]).len(), 1000, "{v}");
        let err = r[1]["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(err.contains("max_message_bytes"), "{v}");
        assert_eq!(ok_text(&r[2]).len(), 500_000, "the next call works: {mode}");
    }
    // The same process throughout.
    let st = s.status(None, "big");
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["restarts"], 0, "{st}");
    assert_eq!(s.events_n("big", "mcp.server_start", 1).len(), 1);
    let calls = s.events_n("big", "mcp.call", 6);
    let too_large = calls
        .iter()
        .filter(|c| c["event"]["fields"]["outcome"] == "too_large")
        .count();
    assert_eq!(too_large, 2, "{calls:?}");
    // The TypeScript SDK writes the id last: still the right request
    // fails at once, not by the request timeout (60 s), and not another
    // request of the "id"s inside the result.
    let call = |id: u32, n: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"blob","arguments":{{"n":{n}}}}}}}"#
        )
    };
    let sid = open_session(&s, "nodebig", "");
    let started = Instant::now();
    let (c, _, body) = post(&s, "nodebig", "", Some(&sid), &call(7, 2 << 20));
    assert_eq!(c, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], 7, "{v}");
    assert_rpc_error(&v, "max_message_bytes", started);
    let (c, _, body) = post(&s, "nodebig", "", Some(&sid), &call(8, 1000));
    assert_eq!(c, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["result"]["content"][0]["text"].as_str().unwrap().len(),
        1000,
        "{v}"
    );
}

// --- per-session processes ---------------------------------------------------

#[test]
fn per_session_processes_start_per_session_and_end_with_it() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let tag = t.path().display().to_string();
    let s = serve(
        &py_entry("persess", t.path(), "mode = \"per-session\"\n"),
        &[],
    );
    let who = |sid: &str| {
        let (c, _, body) = post(
            &s,
            "persess",
            "",
            Some(sid),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#,
        );
        assert_eq!(c, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let text = v["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        serde_json::from_str::<Value>(text).unwrap()["id"].clone()
    };
    let session = || open_session(&s, "persess", "");
    let (s1, s2) = (session(), session());
    let (w1, w2) = (who(&s1), who(&s2));
    assert_ne!(w1, w2, "one process per session");
    assert_eq!(who(&s1), w1, "the same process for the same session");
    let st = s.status(None, "persess");
    let pids: Vec<u64> = st["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["pid"].as_u64())
        .collect();
    assert_eq!(pids.len(), 2, "{st}");
    assert!(st["instances"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["kind"] == "session"));
    // Ending a session ends its process, not the other's.
    let del = http_with(
        s.addr(),
        "DELETE",
        "/mcp/servers/persess",
        &[("Mcp-Session-Id", &s1)],
        None,
    );
    assert_eq!(del.0, 204);
    wait_until(15, "the ended session's process is gone", || {
        !Path::new(&format!("/proc/{}", pids[0])).exists()
            || !Path::new(&format!("/proc/{}", pids[1])).exists()
    });
    assert_eq!(who(&s2), w2);
    assert!(process_running("", &tag));
    // 2026-07-28 needs no session, but a process per session does: the
    // official client falls back to the handshake and works.
    let v = s.py(
        "persess",
        "",
        "auto",
        serde_json::json!([["call", "whoami", {}]]),
    );
    let w3 = whoami(&v["results"][0]);
    assert_eq!(v["protocol"], "2025-11-25", "{v}");
    assert_ne!(w3["id"], w1);
    assert_ne!(w3["id"], w2);
    // The client ended its session on close (DELETE): its process too.
    wait_until(15, "only the open session's process is left", || {
        let st = s.status(None, "persess");
        let live = st["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["pid"].is_u64())
            .count();
        live == 1
    });
    assert_eq!(who(&s2), w2);
}

// --- a crash in the middle of a call ----------------------------------------

#[test]
fn a_crash_during_a_call_fails_that_call_and_the_server_restarts() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(
        &py_entry(
            "fragile",
            t.path(),
            "[server.mcp_server.restart]\nbackoff_initial_ms = 300\n",
        ),
        &[],
    );
    let v = s.py(
        "fragile",
        "",
        "legacy",
        serde_json::json!([
            ["call", "whoami", {}],
            ["call", "die", {"code": 3}],
            ["sleep", 2],
            ["call", "whoami", {}],
        ]),
    );
    let r = &v["results"];
    let first = whoami(&r[0]);
    let err = r[1]["error"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(
        err.contains("ended before answering") && err.contains("exit status 3"),
        "{v}"
    );
    // The same session goes on, served by a new process.
    let second = whoami(&r[3]);
    assert_ne!(first["id"], second["id"], "{v}");
    let st = s.status(None, "fragile");
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["restarts"], 1, "{st}");
    assert_eq!(st["instances"][0]["last_exit"]["code"], 3, "{st}");
    assert_eq!(st["instances"][0]["last_exit"]["requested"], false, "{st}");
    let calls = s.events_n("fragile", "mcp.call", 3);
    assert!(
        calls
            .iter()
            .any(|c| c["event"]["fields"]["tool"] == "die"
                && c["event"]["fields"]["outcome"] == "gone"),
        "{calls:?}"
    );
}

// --- cancellation -------------------------------------------------------------

#[test]
fn a_client_cancellation_reaches_the_server_for_that_call_only() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(&py_entry("cancel", t.path(), ""), &[]);
    let sid = open_session(&s, "cancel", "");
    let slow = |id: &str, secs: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"slow","arguments":{{"secs":{secs}}}}}}}"#
        )
    };
    std::thread::scope(|scope| {
        let started = Instant::now();
        let cancelled = scope.spawn(|| post(&s, "cancel", "", Some(&sid), &slow("\"c1\"", 30)));
        let other = scope.spawn(|| post(&s, "cancel", "", Some(&sid), &slow("\"c2\"", 3)));
        std::thread::sleep(Duration::from_millis(1000));
        let (c, _, body) = post(
            &s,
            "cancel",
            "",
            Some(&sid),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c1","reason":"test"}}"#,
        );
        assert_eq!(c, 202, "{body}");
        let (c, _, body) = other.join().unwrap();
        assert_eq!(c, 200);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["id"], "c2", "{v}");
        assert_eq!(
            v["result"]["content"][0]["text"], "slept",
            "the other call goes on: {v}"
        );
        // The cancelled call ends at once, not by the request timeout
        // (60 s: the server, told of the cancellation, never answers it).
        let (c, _, body) = cancelled.join().unwrap();
        assert_eq!(c, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["id"], "c1", "{v}");
        assert_rpc_error(&v, "cancelled", started);
    });
    let calls = s.events_n("cancel", "mcp.call", 2);
    let outcomes: Vec<&Value> = calls
        .iter()
        .map(|c| &c["event"]["fields"]["outcome"])
        .collect();
    assert!(outcomes.contains(&&Value::from("cancelled")), "{calls:?}");
    assert!(outcomes.contains(&&Value::from("ok")), "{calls:?}");
    // The session goes on.
    let (c, _, body) = post(&s, "cancel", "", Some(&sid), LIST);
    assert_eq!(c, 200, "{body}");
    assert!(body.contains("slow"), "{body}");
}

#[test]
fn a_session_less_call_whose_client_goes_away_is_cancelled_at_the_server() {
    use std::io::Write as _;
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(&py_entry("gone", t.path(), ""), &[]);
    let modern = |body: &str| {
        let headers = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
        ];
        http_with(s.addr(), "POST", "/mcp/servers/gone", &headers, Some(body))
    };
    let count = || {
        let (c, _, body) = modern(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"cancelled","arguments":{}}}"#,
        );
        assert_eq!(c, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(count(), "0");
    // A 2026-07-28 call (no session, so no cancellation message can name
    // it): the client closes its connection a second in.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{"secs":30}}}"#;
    let mut conn = std::net::TcpStream::connect(s.addr()).unwrap();
    write!(
        conn,
        "POST /mcp/servers/gone HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nContent-Length: {}\r\n\r\n{body}",
        s.addr(),
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    drop(conn);
    wait_until(
        10,
        "the server is told the abandoned call is cancelled",
        || count() == "1",
    );
}

/// A standard-library MCP server that lists one tool twice.
const DUPLICATE_TOOLS: &str = r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("id") is None:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "dup", "version": "1"}}
    elif m["method"] == "tools/list":
        t = {"name": "x", "inputSchema": {"type": "object"}}
        r = {"tools": [t, t]}
    else:
        r = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}) + "\n")
    sys.stdout.flush()
"#;

#[test]
fn a_server_listing_a_tool_twice_is_refused_at_start() {
    let t = tree(&[("server.py", DUPLICATE_TOOLS)], true);
    let s = serve(&py_entry("dup", t.path(), ""), &[]);
    let (c, _, body) = post(&s, "dup", "", None, INIT);
    assert_eq!(c, 503, "{body}");
    assert!(body.contains("lists the tool `x` twice"), "{body}");
}

#[test]
fn sixteen_megabyte_messages_pass_both_ways() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(&py_entry("big", t.path(), ""), &[]);
    let sid = open_session(&s, "big", "");
    // The SDK answers with the text twice (content and structuredContent):
    // an answer of about 16.6 MB.
    let n = 8_300_000;
    let (c, _, body) = post(
        &s,
        "big",
        "",
        Some(&sid),
        &format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"blob","arguments":{{"n":{n}}}}}}}"#
        ),
    );
    assert_eq!(c, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["result"]["content"][0]["text"].as_str().map(str::len),
        Some(n),
        "{}",
        &body[..body.len().min(400)]
    );
    assert!(body.len() > 16_000_000, "{}", body.len());
    // A request of 16 MB.
    let n = 16_000_000;
    let text = "y".repeat(n);
    let (c, _, body) = post(
        &s,
        "big",
        "",
        Some(&sid),
        &format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"size","arguments":{{"text":"{text}"}}}}}}"#
        ),
    );
    assert_eq!(c, 200, "{}", &body[..body.len().min(300)]);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["content"][0]["text"], n.to_string(), "{v}");
}

// --- the official Python client 1.x through the bridge ---------------------

/// The 1.x client: argv = url, token. One session times out on a `slow`
/// call (1.x sends no cancel) and closes; the next ones read `cancelled`
/// until it counts one, for at most 5 s.
const SDK1_LEAVES_A_CALL: &str = r#"
import asyncio, json, sys, warnings
from datetime import timedelta
warnings.simplefilter("ignore", DeprecationWarning)
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

async def session(url, token, tool, args, timeout):
    async with streamablehttp_client(url, headers={"Authorization": "Bearer " + token}) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            try:
                c = await s.call_tool(tool, args, timedelta(seconds=timeout))
                return c.content[0].text
            except McpError as e:
                return e.error.code

async def main():
    url, token = sys.argv[1], sys.argv[2]
    left = await session(url, token, "slow", {"secs": 30}, 1)
    for _ in range(10):
        cancelled = await session(url, token, "cancelled", {}, 10)
        if cancelled != "0":
            break
        await asyncio.sleep(0.5)
    return {"left": left, "cancelled": cancelled}

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
"#;

#[test]
fn python_sdk_1x_client_through_the_bridge() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let key = marker("key");
    let s = serve(
        &format!(
            "{}{}",
            tenant("old", "tok-old"),
            py_entry(
                "weather",
                t.path(),
                "tenants = [\"old\"]\nenv = [\"WEATHER_API_KEY\"]\n\
                 [server.mcp_server.tools]\nomit = [\"delete_city\"]\n"
            )
        ),
        &[("WEATHER_API_KEY", &key)],
    );
    let steps = serde_json::json!([
        ["list"],
        ["call", "env", {"name": "WEATHER_API_KEY"}],
        ["call", "whoami", {}],
        ["call", "delete_city", {"city": "Oslo"}],
        ["call", "blob", {"n": 300_000}],
        ["call", "whoami", {}],
    ]);
    let mut ids = Vec::new();
    // The revision 1.x offers, and an older one (as older 1.x releases
    // offered): the bridge keeps the client's.
    for protocol in ["2025-11-25", "2025-03-26"] {
        let target =
            serde_json::json!({"url": s.url("weather"), "token": "tok-old", "protocol": protocol});
        let out = sdk_session(PySdk::V1, SDK1_CLIENT, &target, &steps);
        assert_eq!(out[0]["protocol"], protocol, "{out:?}");
        let tools = out[1]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{out:?}"));
        assert!(
            tools.iter().any(|t| t == "whoami") && tools.iter().all(|t| t != "delete_city"),
            "{out:?}"
        );
        assert_eq!(ok_text(&out[2]), key, "{out:?}");
        let me = whoami(&out[3]);
        assert_eq!(me["host"], "mcp-old", "{out:?}");
        // The hidden tool: corral's JSON-RPC error, and the session goes on.
        let hidden = out[4]["rpc_error"]
            .as_str()
            .unwrap_or_else(|| panic!("{out:?}"));
        assert!(
            hidden.contains("-32602") && hidden.contains("Unknown tool: delete_city"),
            "{hidden}"
        );
        assert_eq!(ok_text(&out[5]).len(), 300_000);
        assert_eq!(whoami(&out[6])["id"], me["id"], "{out:?}");
        ids.push(me["id"].clone());
    }
    // One per-tenant process served both sessions.
    assert_eq!(ids[0], ids[1]);
    // A call the client timed out on (no cancel) ends at the server as
    // the client closes its session, not 30 s later.
    let out = PySdk::V1.run(
        SDK1_LEAVES_A_CALL,
        &[s.url("weather"), "tok-old".into()],
        "",
    );
    assert_eq!(out["left"], 408, "{out}");
    assert_eq!(out["cancelled"], "1", "{out}");
    // Without the token the SDK cannot even initialize.
    let target = serde_json::json!({"url": s.url("weather")});
    let out = PySdk::V1.run(SDK1_CLIENT, &[target.to_string()], "[]");
    let fatal = out[0]["fatal"].as_str().unwrap_or_else(|| panic!("{out}"));
    assert!(fatal.contains("401"), "{fatal}");
}

// --- Soak: a server under mixed load stays flat -----------------------------

/// The soak's driver (Debian's python3, raw HTTP): for `secs` seconds,
/// rounds of executions of every kind (plain, failing, with input,
/// streamed, cancelled by a client that leaves, a large output, a timeout,
/// a memory limit when it is enforced, a background process left behind),
/// `/mcp` sessions with the file tools and `run_code`, and sessions of a
/// per-session and a shared supervised server; each answer is checked.
/// Prints the server's resources as JSON lines at two quiet moments:
/// after the first ten rounds (`warm`) and at the end (`quiet`).
const SOAK_DRIVER: &str = r#"
import glob, http.client, json, os, re, socket, sys, time
addr, pid, secs, memory = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
host, port = addr.rsplit(":", 1)
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}}
c = http.client.HTTPConnection(host, int(port), timeout=60)
def ex(body, path="/v1/executions"):
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    if r.status != 200:
        sys.exit(f"{path}: {r.status} {d[:300]!r}")
    return d if path.endswith("stream") else json.loads(d)
def session(path, calls):
    k = http.client.HTTPConnection(host, int(port), timeout=60)
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    k.request("POST", path, json.dumps(INIT), h)
    r = k.getresponse(); r.read()
    if r.status != 200:
        sys.exit(f"{path} initialize: {r.status}")
    h["mcp-session-id"] = r.getheader("mcp-session-id")
    h["mcp-protocol-version"] = "2025-11-25"
    k.request("POST", path, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), h)
    k.getresponse().read()
    for i, (name, args) in enumerate(calls, 1):
        k.request("POST", path, json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}), h)
        r = k.getresponse(); d = r.read()
        if r.status != 200 or b'"isError":true' in d:
            sys.exit(f"{path} {name}: {r.status} {d[:300]!r}")
    k.request("DELETE", path, headers=h)
    k.getresponse().read()
    k.close()
def leave_mid_run():
    s = socket.create_connection((host, int(port)))
    b = json.dumps({"command": ["sh", "-c", "sleep 5"]}).encode()
    s.sendall(b"POST /v1/executions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (addr.encode(), len(b)) + b)
    time.sleep(0.3)
    s.close()
def descendants():
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parent[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, grew = {pid}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in found} - found
        found |= new
        grew = bool(new)
    return len(found) - 1
def sample(kind, rounds):
    status = open(f"/proc/{pid}/status").read()
    print(json.dumps({
        "kind": kind, "rounds": rounds, "t": round(time.time() - start, 1),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(re.search(r"Threads:\s+(\d+)", status).group(1)),
        "rss_kib": int(re.search(r"VmRSS:\s+(\d+)", status).group(1)),
        "mounts": sum(1 for _ in open(f"/proc/{pid}/mountinfo")),
        "groups": len(glob.glob(f"/sys/fs/cgroup/*/corral/{pid}-*")) + len(glob.glob(f"/sys/fs/cgroup/corral/{pid}-*")),
        "processes": descendants(),
    }), flush=True)
PY = lambda code: {"command": ["python3", "-c", code]}
start = time.time()
rounds = 0
while rounds < 20 or time.time() - start < secs:
    rounds += 1
    if ex(PY("print(1)"))["stdout"] != "1\n":
        sys.exit("print(1)")
    if ex({"command": ["sh", "-c", "echo err >&2; exit 3"]})["exit_code"] != 3:
        sys.exit("exit 3")
    ex({"command": ["sh", "-c", "cat; ls"], "stdin": "in", "files": [{"path": "a.txt", "content": "abc"}]})
    if b"event: result" not in ex(PY("print('y' * 100)"), "/v1/executions/stream"):
        sys.exit("stream")
    if rounds % 5 == 1:
        session("/mcp", [("write_file", {"path": "x.py", "content": "print(2)", "encoding": "utf8"}),
                         ("run_code", {"language": "python", "code": "print(3)"}), ("list_files", {})])
        session("/mcp/servers/cold", [("whoami", {})])
        session("/mcp/servers/shared", [("whoami", {}), ("whoami", {})])
        leave_mid_run()
        ex(PY("import sys; sys.stdout.write('z' * 5000000)"))
        if not ex({"command": ["sh", "-c", "sleep 10"], "limits": {"timeout_ms": 1000}})["timed_out"]:
            sys.exit("timeout")
        if memory and not ex({"command": ["python3", "-c", "b = bytearray(400 << 20)"], "limits": {"memory_bytes": 64 << 20}})["oom_killed"]:
            sys.exit("memory")
        ex({"command": ["sh", "-c", "sleep 100 & echo left"]})
    if rounds == 10:
        # Quiet, as at the end: the client that left has been answered,
        # the shared server's idle stop (2 s) and every teardown are over.
        time.sleep(5)
        sample("warm", rounds)
time.sleep(5)
sample("quiet", rounds)
"#;

/// How long the soak runs: `CORRAL_SOAK_SECS` (scripts/soak.sh sets
/// hours), else 20 s, a smoke of it in the suite; at least 20 rounds,
/// ten of them between the two samples, however slow the machine.
fn soak_secs() -> u64 {
    std::env::var("CORRAL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

#[test]
fn a_server_under_mixed_load_keeps_its_descriptors_threads_memory_and_mounts_flat() {
    let t = tree(&[("server.py", PY_SERVER)], true);
    let s = serve(
        &format!(
            "code_mode = true\nmax_concurrent = 2\n{}{}",
            py_entry("cold", t.path(), "mode = \"per-session\"\n"),
            py_entry(
                "shared",
                t.path(),
                "mode = \"shared\"\nidle_stop_secs = 2\n"
            )
        ),
        &[],
    );
    let secs = soak_secs();
    let memory = if is_root() { "1" } else { "0" };
    let out = Command::new("/usr/bin/python3")
        .args(["-c", SOAK_DRIVER, s.addr()])
        .arg(s.server.child.id().to_string())
        .arg(secs.to_string())
        .arg(memory)
        .env_clear()
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the driver failed: {}\n{stdout}\ncorral's log:\n{}",
        text(&out.stderr),
        s.log()
    );
    eprintln!("{stdout}");
    let samples: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let [warm, quiet] = &samples[..] else {
        panic!("two samples: {stdout}")
    };
    let n = |v: &Value, k: &str| v[k].as_i64().unwrap();
    // What may differ between the two quiet moments: a descriptor or two
    // of a connection being closed, the blocking pool's idle threads (kept
    // 10 s), the allocator's arenas settling.
    let grew = |k: &str| n(quiet, k) - n(warm, k);
    assert!(grew("fds") <= 4, "descriptors grew: {warm} -> {quiet}");
    assert!(grew("threads") <= 4, "threads grew: {warm} -> {quiet}");
    assert!(
        grew("rss_kib") <= 24 << 10,
        "memory grew by {} KiB: {warm} -> {quiet}",
        grew("rss_kib")
    );
    // Nothing of a finished execution or session is left: its workspace
    // mount, its group, its processes (the sandboxes built ahead and the
    // per-session servers' are there at both moments, or fewer).
    assert!(grew("mounts") <= 0, "mounts left: {warm} -> {quiet}");
    assert!(grew("groups") <= 0, "cgroups left: {warm} -> {quiet}");
    assert!(grew("processes") <= 0, "processes left: {warm} -> {quiet}");
}

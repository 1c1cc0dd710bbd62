//! The built-in long-running profiles with real runtimes and the official
//! MCP SDK: `mcp-python` with a venv as its runtime tree, driven by the
//! official Python client over stdio exactly as an MCP client config
//! (`command` + `args`) launches a server; `mcp-node`'s execve allowlist
//! with node's `child_process`.
//!
//! The venv is `$CORRAL_TEST_PYTHON`'s (default `/opt/corral-test-venv`,
//! installed by scripts/test.sh); its absence fails the tests.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The venv with the `mcp` SDK: its interpreter drives the client, and the
/// venv itself is the server's runtime tree.
fn venv() -> PathBuf {
    sdk_python()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf()
}

/// An MCP server (official SDK) whose one tool reports what the sandbox
/// lets it do: which interpreter runs, HOME, and what happens when it
/// starts a subprocess of itself and of `/bin/sh`.
const SERVER: &str = r#"
import errno, json, os, subprocess, sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("probe")

def attempt(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return "ran:" + r.stdout.strip()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

@app.tool()
def probe() -> str:
    return json.dumps({
        "prefix": sys.prefix,
        "home": os.environ.get("HOME"),
        "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
        "self": attempt([sys.executable, "-c", "print('child')"]),
        "sh": attempt(["/bin/sh", "-c", "echo shell"]),
    })

app.run()
"#;

/// Launches `command` as a stdio MCP server with the official client,
/// calls `probe` and prints its structured result.
const CLIENT: &str = r#"
import asyncio, json, sys
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

async def main():
    cmd = json.loads(sys.argv[1])
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env={"PATH": "/usr/bin:/bin"})
    async with Client(stdio_client(params)) as client:
        tools = await client.list_tools()
        r = await client.call_tool("probe", {})
        text = "".join(c.text for c in r.content if c.type == "text")
        return {"tools": [t.name for t in tools.tools], "result": json.loads(text)}

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
"#;

#[test]
fn mcp_python_serves_the_official_client_from_a_venv_and_runs_nothing_else() {
    let venv = venv();
    let work = workdir();
    std::fs::write(work.path().join("server.py"), SERVER).unwrap();
    let mut command = vec![corral_bin().display().to_string(), "run".into()];
    if !cpu_limit_enforceable() {
        // No cgroup (unprivileged here) or no cpu controller: see
        // mcp_profiles_bound_the_cpu_or_refuse_naming_it.
        command.push("--allow-unenforced-limits".into());
    }
    command.extend(
        [
            "--profile",
            "mcp-python",
            "--runtime",
            venv.to_str().unwrap(),
            "--workdir",
            work.path().to_str().unwrap(),
            "--",
            "python3",
            "/workspace/server.py",
        ]
        .map(String::from),
    );
    let v = run_sdk_python(CLIENT, &[serde_json::to_string(&command).unwrap()], "");
    assert_eq!(v["tools"], serde_json::json!(["probe"]), "{v}");
    let r = &v["result"];
    // `python3` resolved to the venv's interpreter (the SDK imported).
    assert_eq!(r["prefix"], venv.to_str().unwrap(), "{v}");
    assert_eq!(r["home"], "/workspace", "{v}");
    assert_eq!(r["unbuffered"], "1", "{v}");
    // The allowed command may start itself; anything else is refused by
    // the kernel (Landlock's execute right), not by a missing file.
    assert_eq!(r["self"], "ran:child", "{v}");
    assert_eq!(r["sh"], "EACCES", "{v}");
}

#[test]
fn mcp_profiles_bound_the_cpu_or_refuse_naming_it() {
    // Without a wall timeout, a cgroup CPU share bounds a server: in force
    // where the host can enforce it, else a refusal naming it (fail
    // closed) until --allow-unenforced-limits accepts that.
    for (name, program, flag) in [("mcp-python", "python3", "-c"), ("mcp-node", "node", "-e")] {
        let out = corral()
            .args(["run", "--json", "--profile", name, "--", program, flag, "1"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if cpu_limit_enforceable() {
            assert_eq!(
                v["enforced"]["cgroup"]["cpu_millicores"], 1000,
                "{name}: {v}"
            );
            assert_eq!(v["enforced"]["cgroup"]["pids"], 256, "{name}: {v}");
        } else {
            assert_eq!(out.status.code(), Some(125), "{name}: {v}");
            assert_eq!(v["error"]["code"], "limits.unenforceable", "{name}: {v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains("--allow-unenforced-limits"), "{message}");
        }
    }
}

/// Runs `argv` with `flags` (the CPU limit of the `mcp-*` profiles left
/// unenforced where this host cannot enforce it, see
/// `mcp_profiles_bound_the_cpu_or_refuse_naming_it`); it must succeed and
/// print one JSON value, returned.
fn run_printing_json(flags: &[&str], argv: &[&str]) -> Value {
    let mut flags = flags.to_vec();
    if is_root() && !cpu_limit_enforceable() {
        flags.push("--allow-unenforced-limits");
    }
    let out = run(&flags, argv);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn mcp_node_lets_node_start_only_node() {
    let script = "const cp = require('child_process');\n\
        const self = cp.spawnSync(process.execPath, ['-e', 'console.log(\"child\")']);\n\
        const sh = cp.spawnSync('/bin/sh', ['-c', 'echo shell']);\n\
        require('fs').writeFileSync('/tmp/x.sh', '#!/bin/sh\\necho planted\\n', {mode: 0o755});\n\
        const planted = cp.spawnSync('/tmp/x.sh');\n\
        console.log(JSON.stringify({self: self.stdout.toString().trim(),\n\
          sh: sh.error && sh.error.code, planted: planted.error && planted.error.code}));";
    let v = run_printing_json(&["--profile", "mcp-node"], &["node", "-e", script]);
    assert_eq!(
        v,
        serde_json::json!({"self": "child", "sh": "EACCES", "planted": "EACCES"})
    );
}

/// What a program can run besides `execve` of a file: a binary written
/// into a memfd (outside the mounted tree, so outside Landlock's execute
/// right), and a file it wrote run through the dynamic loader, which
/// maps it rather than executing it. JSON: each route's outcome.
const WRITTEN_CODE: &str = r#"
import ctypes, glob, json, os, shutil, subprocess
out = {}
loader = sorted(glob.glob('/lib64/ld-linux*.so.*') + glob.glob('/lib/ld-linux*.so.*'))[0]
def memfd(flags, through_loader):
    try:
        fd = os.memfd_create('x', flags)
    except OSError as e:
        return 'create: %d' % e.errno
    with open('/bin/echo', 'rb') as f:
        os.write(fd, f.read())
    path = '/proc/self/fd/%d' % fd
    argv = [loader, path, 'ran'] if through_loader else [path, 'ran']
    try:
        r = subprocess.run(argv, pass_fds=[fd], capture_output=True, text=True)
        return r.stdout.strip() or 'failed'
    except OSError as e:
        return 'exec: %d' % e.errno
out['memfd'] = memfd(0, False)
# Sealed against execve (MFD_NOEXEC_SEAL), but the loader maps it.
out['memfd sealed, loader'] = memfd(8, True)
for place in ('/tmp', '/workspace', '/dev/shm'):
    copy = place + '/echo-copy'
    shutil.copy('/bin/echo', copy)
    os.chmod(copy, 0o755)
    r = subprocess.run([loader, copy, 'ran'], capture_output=True, text=True)
    out['loader ' + place] = r.stdout.strip() or 'failed'
# Code the interpreter generates itself still works (libffi's closures).
out['ctypes callback'] = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 7)()
print(json.dumps(out, sort_keys=True))
"#;

#[test]
fn restrict_exec_runs_no_code_the_sandbox_wrote_through_a_memfd_or_the_loader() {
    let v = run_printing_json(
        &["--profile", "mcp-python"],
        &["python3", "-c", WRITTEN_CODE],
    );
    assert_eq!(
        v,
        serde_json::json!({
            "memfd": "create: 1",
            "memfd sealed, loader": "create: 1",
            "loader /tmp": "failed",
            "loader /workspace": "failed",
            "loader /dev/shm": "failed",
            "ctypes callback": 7,
        })
    );
    // The control: without restrict_exec every route runs the copy.
    let v = run_printing_json(&[], &["python3", "-c", WRITTEN_CODE]);
    assert_eq!(
        v,
        serde_json::json!({
            "memfd": "ran",
            "memfd sealed, loader": "ran",
            "loader /tmp": "ran",
            "loader /workspace": "ran",
            "loader /dev/shm": "ran",
            "ctypes callback": 7,
        })
    );
}

#[test]
fn without_restrict_exec_the_same_subprocesses_run() {
    // The control for the two tests above: `code` does not restrict
    // execve, so the refusals there are the allowlist's.
    let out = run(
        &[],
        &[
            "python3",
            "-c",
            "import subprocess; print(subprocess.run(['/bin/sh', '-c', 'echo shell'], capture_output=True, text=True).stdout.strip())",
        ],
    );
    assert_eq!(text(&out.stdout), "shell\n", "{}", text(&out.stderr));
}

#[test]
fn a_runtime_under_a_reserved_path_is_refused_with_what_to_do() {
    let (v, out) = run_json(&["--runtime", "/tmp/some-venv"], &["sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("create it elsewhere"), "{message}");
}

#[test]
fn explain_names_the_long_running_profiles_limits() {
    for name in ["mcp-python", "mcp-node"] {
        let out = corral().args(["explain", name]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(s.contains("restrict"), "{name}: {s}");
        let timeout = s
            .lines()
            .find(|l| l.trim_start().starts_with("wall timeout:"));
        assert_eq!(
            timeout.map(|l| l.split(':').nth(1).unwrap_or("").trim()),
            Some("none"),
            "{name}: {s}"
        );
    }
}

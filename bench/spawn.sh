#!/usr/bin/env bash
# Spawn-to-ready of an MCP server from a deployed tree against `npx` of the
# same package from the same local registry, measured side by side in one
# run: from spawning the command to the server's answer to `initialize`
# over stdio.
#
#   ./bench/spawn.sh        RUNS=5 by default
#
# The package (`bench-mcp`, a stdio MCP server in Node's standard library)
# is served by tests/deploy_support/registry.py on 127.0.0.1; the tree is
# made once with `corral deploy` through corral's proxy. Compared:
#   npx cold   npx --yes with an empty npm cache (downloads, installs, runs)
#   npx warm   the same with the cache npx filled (npm still asks the
#              registry about the package)
#   bare tree  node TREE/index.js, no sandbox
#   corral     corral run --profile mcp-node --ro TREE -- node TREE/index.js
# and the same for a Python package (`bench-mcp-py` on the local PEP 503
# index, deployed with `corral deploy --package pypi:bench-mcp-py==1.0.0`):
#   uvx cold   uvx --from bench-mcp-py==1.0.0 with an empty uv cache
#   uvx warm   the same with the cache uvx filled
#   bare tree  TREE/.venv/bin/bench-mcp-py, no sandbox
#   corral     corral run --profile mcp-python --ro TREE --runtime TREE/.venv
#              -- python3 TREE/.venv/bin/bench-mcp-py (what the supervisor runs)
# uv: UV=path, else `uv` on PATH, else /opt/corral-test-venv/bin/uv (what
# scripts/test.sh installs); without one the Python rows are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
RUNS=${RUNS:-5}
PY=/usr/bin/python3
# Node reads this bundle at every start (about 40 ms here); corral's
# sandbox never passes it, so the bare runs go without it too.
unset NODE_EXTRA_CA_CERTS
cargo build --release -q -p corral
BIN=$PWD/${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
. bench/registry.sh
registry_workdir spawn
SERVER_JS='#!/usr/bin/env node
const rl = require("readline").createInterface({ input: process.stdin });
rl.on("line", (l) => { const m = JSON.parse(l); if (m.id === undefined) return;
  const result = m.method === "initialize"
    ? { protocolVersion: m.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "bench-mcp", version: "1.0.0" } }
    : { tools: [] };
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: m.id, result }) + "\n"); });'
SERVER_PY='import json, sys
def main():
    for line in sys.stdin:
        m = json.loads(line)
        if "id" not in m:
            continue
        result = ({"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "bench-mcp-py", "version": "1.0.0"}}
                  if m["method"] == "initialize" else {"tools": []})
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}) + "\n")
        sys.stdout.flush()'
spec() { # $1: the host name tarball URLs use
    $PY -c 'import json, sys; print(json.dumps({"host": sys.argv[1],
        "wheels": [{"name": "bench-mcp-py", "version": "1.0.0", "files": {"bench_mcp_py/__init__.py": sys.argv[3]}, "requires": [], "entry_points": {"bench-mcp-py": "bench_mcp_py:main"}}],
        "npm": [{"name": "bench-mcp", "version": "1.0.0", "files": {"server.js": sys.argv[2]}, "package": {"bin": {"bench-mcp": "server.js"}}}]}))' "$1" "$SERVER_JS" "$SERVER_PY"
}
PORT=$(start_registry registry.test "$W/reg")
BPORT=$(start_registry 127.0.0.1 "$W/reg-bare")
mkdir -p "$W/src"
echo '{"name": "bench-wrap", "version": "1.0.0", "main": "index.js", "dependencies": {"bench-mcp": "1.0.0"}}' > "$W/src/package.json"
echo 'require("bench-mcp/server.js");' > "$W/src/index.js"
chmod -R a+rX "$W/src"
UNENF=""
[ "$(id -u)" -eq 0 ] || UNENF="--allow-unenforced-limits"
"$BIN" deploy --json $UNENF --npm-registry "http://registry.test:$PORT/npm/" --add-host registry.test=127.0.0.1 \
    --allow-cidr "127.0.0.1/32:$PORT" "$W/src" --out "$W/tree" > "$W/deploy.json"
UV=${UV:-$(command -v uv || true)}
[ -n "$UV" ] || { [ -x /opt/corral-test-venv/bin/uv ] && UV=/opt/corral-test-venv/bin/uv; } || true
if [ -n "$UV" ]; then
    "$BIN" deploy --json $UNENF --uv "$UV" --index-url "http://registry.test:$PORT/simple/" --add-host registry.test=127.0.0.1 \
        --allow-cidr "127.0.0.1/32:$PORT" --package pypi:bench-mcp-py==1.0.0 --out "$W/tree-py" > "$W/deploy-py.json"
fi
cat > "$W/ready.py" <<'PY'
import json, os, shutil, statistics, subprocess, sys, time
runs = int(sys.argv[1]); cmds = json.loads(sys.argv[2]); cold_cache = sys.argv[3]; uv_cold = sys.argv[4]
INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}) + "\n"
def ready(cmd, env):
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    p.stdin.write(INIT.encode()); p.stdin.flush()
    line = p.stdout.readline()
    took = time.perf_counter() - t
    assert json.loads(line)["id"] == 1, line
    p.stdin.close(); p.kill(); p.wait()
    return took
for name, cmd, env_extra, cold in cmds:
    env = dict(os.environ, **env_extra)
    times = []
    for _ in range(runs):
        if cold:
            shutil.rmtree(uv_cold if cold == "uv" else cold_cache, ignore_errors=True)
        times.append(ready(cmd, env))
    print(f"{name:12s} median {statistics.median(times) * 1000:8.1f} ms   min {min(times) * 1000:8.1f}   max {max(times) * 1000:8.1f}")
PY
NPX=(npx --yes --registry "http://127.0.0.1:$BPORT/npm/" bench-mcp)
CMDS=$($PY -c '
import json, sys
w, binp, unenf, uv, bport, *npx = sys.argv[1:]
corral = [binp, "run", "--profile", "mcp-node", "--ro", w + "/tree"] + ([unenf] if unenf else []) + ["--", "node", w + "/tree/index.js"]
cmds = [
    ["npx cold", npx, {"npm_config_cache": w + "/npx-cold"}, True],
    ["npx warm", npx, {"npm_config_cache": w + "/npx-warm"}, False],
    ["bare tree", ["node", w + "/tree/index.js"], {}, False],
    ["corral", corral, {}, False],
]
if uv:
    uvx = [uv, "tool", "run", "--index-url", f"http://127.0.0.1:{bport}/simple/", "--from", "bench-mcp-py==1.0.0", "bench-mcp-py"]
    entry = w + "/tree-py/.venv/bin/bench-mcp-py"
    cmds += [
        ["uvx cold", uvx, {"UV_CACHE_DIR": w + "/uv-cold"}, "uv"],
        ["uvx warm", uvx, {"UV_CACHE_DIR": w + "/uv-warm"}, False],
        ["bare py tree", [entry], {}, False],
        ["corral py", [binp, "run", "--profile", "mcp-python", "--ro", w + "/tree-py", "--runtime", w + "/tree-py/.venv"] + ([unenf] if unenf else []) + ["--", "python3", entry], {}, False],
    ]
print(json.dumps(cmds))' "$W" "$BIN" "$UNENF" "$UV" "$BPORT" "${NPX[@]}")
# Fill the warm caches once.
npm_config_cache="$W/npx-warm" "${NPX[@]}" < /dev/null > /dev/null 2>&1 || true
[ -z "$UV" ] || UV_CACHE_DIR="$W/uv-warm" "$UV" tool run --index-url "http://127.0.0.1:$BPORT/simple/" --from bench-mcp-py==1.0.0 bench-mcp-py < /dev/null > /dev/null 2>&1 || true
echo "== corral $(git rev-parse --short HEAD), $(nproc) CPUs, uid $(id -u), $(date -u +%FT%TZ), RUNS=$RUNS"
$PY "$W/ready.py" "$RUNS" "$CMDS" "$W/npx-cold" "$W/uv-cold"

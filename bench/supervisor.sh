#!/usr/bin/env bash
# Supervisor benchmark: a real MCP server (official Python SDK, one `ping`
# tool) run bare over stdio and supervised by `corral serve` behind the
# bridge at /mcp/servers/{name}, measured side by side in one run.
#
#   ./bench/supervisor.sh        N=2000 STARTS=10 SECS=5 CLIENTS=4 by default
#
# - spawn-to-ready: bare = from spawning the server to its `initialize`
#   answer over stdio; supervised = from a client's `initialize` POST to
#   its answer, on a per-session server (every session starts a fresh
#   sandboxed process: corral run, namespaces, seccomp, Landlock, cgroup,
#   the server's own start and corral's handshake). STARTS of each, median.
# - added latency per tool call: N sequential `tools/call` round trips,
#   bare over stdio vs through the bridge (HTTP/1.1 keep-alive, one
#   session); p50 and p99 of each, and the difference.
# - calls/s: CLIENTS client processes (one tenant each) calling for SECS
#   seconds, against a `shared` server (one process) and a `per-tenant`
#   one (a process per tenant).
# The server runs the SDK's venv (/opt/corral-test-venv, which
# scripts/test.sh installs); the clients are raw JSON-RPC in
# /usr/bin/python3 so the SDK's client costs do not blur the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${N:-2000}
STARTS=${STARTS:-10}
SECS=${SECS:-5}
CLIENTS=${CLIENTS:-4}
SDK=${SDK:-/opt/corral-test-venv}
[ -x "$SDK/bin/python" ] || { echo "needs the MCP SDK venv at $SDK (scripts/test.sh installs it)" >&2; exit 2; }
cargo build --release -q -p corral
BIN=$PWD/${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
# Not under /tmp: a server's tree is mounted at its own path.
TREE=$(mktemp -d /var/tmp/corral-bench-sv.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TREE"; }
trap cleanup EXIT
chmod 755 "$TREE"
cat > "$TREE/server.py" <<'PY'
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")
@server.tool()
def ping() -> str:
    """pong"""
    return "pong"
server.run()
PY
/usr/bin/python3 -m venv --without-pip "$TREE/.venv"
echo "$SDK/lib/python3.11/site-packages" > "$TREE/.venv/lib/python3.11/site-packages/sdk.pth"
chmod -R a+rX "$TREE"
TENANTS=""
for i in $(seq 1 "$CLIENTS"); do
  h=$(printf %s "token-$i" | sha256sum | cut -d' ' -f1)
  TENANTS+=$'\n'"[[server.tenant]]"$'\n'"name = \"t$i\""$'\n'"token_sha256 = \"$h\""$'\n'"profiles = [\"mcp\"]"$'\n'
done
ALL=$(seq -s, 1 "$CLIENTS" | sed 's/\([0-9]*\)/"t\1"/g')
server() {
  printf '[[server.mcp_server]]\nname = "%s"\ntenants = [%s]\nruntime = "python3"\ndir = "%s"\nentry = "server.py"\nprofile = "mcp"\nmode = "%s"\nmax_processes = 64\nmax_processes_per_tenant = 64\n' "$1" "$ALL" "$TREE" "$2"
}
UNENFORCED=""
if [ "$(id -u)" != 0 ]; then UNENFORCED=$'\n[profile.mcp.limits]\nallow_unenforced = true'; fi
cat > "$TREE/corral.toml" <<TOML
[profile.mcp]
extends = "mcp-python"
[profile.mcp.filesystem]
read_only = ["$SDK"]$UNENFORCED
[server]
listen = "127.0.0.1:0"
audit_db = "$TREE/audit.db"
$TENANTS
$(server cold per-session)
$(server shared shared)
$(server pertenant per-tenant)
TOML
"$BIN" serve --config "$TREE/corral.toml" --log-level warn 2> "$TREE/serve.err" &
PID=$!
for _ in $(seq 100); do grep -q "serving on" "$TREE/serve.err" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/.*serving on http:\/\///p' "$TREE/serve.err" | head -1)
cat > "$TREE/client.py" <<'PY'
import http.client, json, multiprocessing, statistics, subprocess, sys, time
addr, tree, sdk, n, starts, secs, clients = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
CALL = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ping","arguments":{}}}'
def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]
# --- bare over stdio
def bare_start():
    t = time.perf_counter()
    p = subprocess.Popen([tree + "/.venv/bin/python3", tree + "/server.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdin.write(json.dumps(INIT).encode() + b"\n"); p.stdin.flush()
    assert json.loads(p.stdout.readline())["id"] == 0
    ready = time.perf_counter() - t
    p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'); p.stdin.flush()
    return p, ready
# --- through the bridge
class Bridge:
    def __init__(self, server, token):
        self.c = http.client.HTTPConnection(addr)
        self.path = "/mcp/servers/" + server
        self.h = {"content-type": "application/json", "accept": "application/json, text/event-stream", "authorization": "Bearer " + token}
    def post(self, body):
        self.c.request("POST", self.path, body, self.h)
        r = self.c.getresponse(); data = r.read()
        assert r.status == 200, (r.status, data)
        return r, data
    def init(self):
        r, _ = self.post(json.dumps(INIT))
        self.h["mcp-session-id"] = r.getheader("mcp-session-id")
        self.h["mcp-protocol-version"] = "2025-11-25"
    def end(self):
        self.c.request("DELETE", self.path, headers=self.h); self.c.getresponse().read()
def bridge_start():
    b = Bridge("cold", "token-1")
    t = time.perf_counter(); b.init(); ready = time.perf_counter() - t
    b.end(); return ready
out = {}
bare, sup = [], []
for _ in range(starts):
    p, r = bare_start(); bare.append(r); p.stdin.close(); p.wait()
    sup.append(bridge_start()); time.sleep(0.2)
out["spawn_to_ready_ms"] = {"bare": statistics.median(bare) * 1e3, "supervised": statistics.median(sup) * 1e3}
# latency
p, _ = bare_start()
lat_bare = []
for i in range(1, n + 1):
    t = time.perf_counter_ns(); p.stdin.write(CALL % i + b"\n"); p.stdin.flush(); assert p.stdout.readline(); lat_bare.append(time.perf_counter_ns() - t)
p.stdin.close(); p.wait()
b = Bridge("shared", "token-1"); b.init()
lat_br = []
for i in range(1, n + 1):
    t = time.perf_counter_ns(); b.post(CALL % i); lat_br.append(time.perf_counter_ns() - t)
b.end()
ms = lambda ns: ns / 1e6
out["call_ms"] = {k: {"p50": ms(pct(v, 50)), "p99": ms(pct(v, 99))} for k, v in (("bare", lat_bare), ("bridge", lat_br))}
out["added_ms"] = {q: out["call_ms"]["bridge"][q] - out["call_ms"]["bare"][q] for q in ("p50", "p99")}
# throughput
def worker(args):
    server, i = args
    b = Bridge(server, "token-%d" % i); b.init(); b.post(CALL % 1)
    end = time.perf_counter() + secs; k = 0
    while time.perf_counter() < end:
        b.post(CALL % (k + 2)); k += 1
    b.end(); return k
for server in ("shared", "pertenant"):
    with multiprocessing.Pool(clients) as pool:
        calls = pool.map(worker, [(server, i) for i in range(1, clients + 1)])
    out["calls_per_s_" + server] = sum(calls) / secs
print(json.dumps(out))
PY
RES=$(/usr/bin/python3 "$TREE/client.py" "$ADDR" "$TREE" "$SDK" "$N" "$STARTS" "$SECS" "$CLIENTS")
/usr/bin/python3 - "$RES" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); s = r["spawn_to_ready_ms"]; c = r["call_ms"]; a = r["added_ms"]
ratio = s["supervised"] / s["bare"]
print(f"spawn-to-ready (median): bare {s['bare']:.0f} ms, supervised {s['supervised']:.0f} ms = {ratio:.2f}x  [target <= 1.5x: {'PASS' if ratio <= 1.5 else 'MISS'}]")
print(f"tool call p50: bare {c['bare']['p50']:.3f} ms, bridge {c['bridge']['p50']:.3f} ms, added {a['p50']:.3f} ms  [target <= 1 ms: {'PASS' if a['p50'] <= 1 else 'MISS'}]")
print(f"tool call p99: bare {c['bare']['p99']:.3f} ms, bridge {c['bridge']['p99']:.3f} ms, added {a['p99']:.3f} ms")
print(f"calls/s with the clients in parallel: shared {r['calls_per_s_shared']:.0f}, per-tenant {r['calls_per_s_pertenant']:.0f}")
PY

#!/usr/bin/env bash
# stdio pass-through benchmark: what `corral run` costs a program that talks
# JSON-RPC over stdin/stdout (an MCP server over stdio), next to the same
# program run bare, in one run.
#
#   ./bench/stdio.sh        N=20000 MIB=1024 ROUNDS=5 by default
#
# N: sequential round trips per path per round (a ~100-byte request line, a
# ~100-byte response line); MIB: MiB of 64 KiB response lines per path per
# round (throughput); ROUNDS: rounds, the two paths alternating. The server
# and the client are /usr/bin/python3 (not a pyenv shim). The client spawns
# the server, waits for its first answer (start-up is not measured), then
# times the round trips and the bulk read. Only stdout passes through
# corral: the program's stdin is corral's own, inherited.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${N:-20000}
MIB=${MIB:-1024}
ROUNDS=${ROUNDS:-5}
PY=/usr/bin/python3
cargo build --release -q -p corral
BIN=$PWD/${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
TMP=$(mktemp -d /tmp/corral-stdio.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"
cat > "$TMP/server.py" <<'PY'
import sys
# A JSON-RPC-style line server: "bulk N" answers with N lines of 64 KiB,
# anything else is echoed back as the response.
inp, out = sys.stdin.buffer, sys.stdout.buffer
line64k = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"data":"' + b"x" * (65536 - 72) + b'"}}\n'
for req in inp:
    if req.startswith(b"bulk "):
        n = int(req[5:])
        for _ in range(n):
            out.write(line64k)
        out.write(b'{"jsonrpc":"2.0","id":"bulk","result":{}}\n')
    else:
        out.write(req)
    out.flush()
PY
cat > "$TMP/client.py" <<'PY'
import json, subprocess, sys, time
cmd = json.loads(sys.argv[1]); n = int(sys.argv[2]); mib = int(sys.argv[3])
p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1 << 20)
w, r = p.stdin, p.stdout
rl = r.readline
def send(b):
    w.write(b); w.flush()
req = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ping","arguments":{}}}\n'
send(req % 0); assert rl()  # started; not timed
lat = []
for i in range(1, n + 1):
    t = time.perf_counter_ns()
    send(req % i)
    if not rl():
        sys.exit("server ended")
    lat.append(time.perf_counter_ns() - t)
lines = mib * 16  # 64 KiB each
t = time.perf_counter()
send(b"bulk %d\n" % lines)
got = 0
while True:
    l = rl()
    if not l:
        sys.exit("server ended")
    got += len(l)
    if l.startswith(b'{"jsonrpc":"2.0","id":"bulk"'):
        break
secs = time.perf_counter() - t
w.close(); p.wait()
lat.sort()
print(json.dumps({"median_us": lat[len(lat) // 2] / 1000, "mean_us": sum(lat) / len(lat) / 1000,
                  "p99_us": lat[len(lat) * 99 // 100] / 1000, "mib_s": got / secs / (1 << 20), "bytes": got}))
PY
cat > "$TMP/cfg.toml" <<TOML
[profile.stdio]
extends = "code"
[profile.stdio.filesystem]
read_only = ["$TMP:/srv"]
[profile.stdio.limits]
timeout_secs = "none"
output_kill = "none"
TOML
$BIN check "$TMP/cfg.toml" >/dev/null
LIMIT_FLAGS=""
[ "$(id -u)" -eq 0 ] || LIMIT_FLAGS='"--allow-unenforced-limits",'
BARE="[\"$PY\", \"$TMP/server.py\"]"
CORRAL="[\"$BIN\", \"run\", $LIMIT_FLAGS \"--config\", \"$TMP/cfg.toml\", \"--profile\", \"stdio\", \"--\", \"python3\", \"/srv/server.py\"]"

echo "stdio pass-through: N=$N round trips, $MIB MiB, $ROUNDS rounds, $(nproc) cores, kernel $(uname -r), $(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
    # Which path goes first alternates between rounds.
    order="bare corral"
    [ $((round % 2)) -eq 0 ] && order="corral bare"
    for path in $order; do
        if [ "$path" = bare ]; then cmd=$BARE; else cmd=$CORRAL; fi
        printf '%s %s ' "$round" "$path" >> "$TMP/results"
        $PY "$TMP/client.py" "$cmd" "$N" "$MIB" >> "$TMP/results"
    done
done
$PY - "$TMP/results" <<'PY'
import json, sys, statistics as st
rows = {"bare": [], "corral": []}
for line in open(sys.argv[1]):
    rnd, path, js = line.split(" ", 2)
    rows[path].append(json.loads(js))
print(f"{'':8} {'median RTT':>12} {'mean RTT':>10} {'p99 RTT':>10} {'throughput':>14}   (medians over rounds)")
med = {}
for path, rs in rows.items():
    m = {k: st.median(r[k] for r in rs) for k in ("median_us", "mean_us", "p99_us", "mib_s")}
    med[path] = m
    print(f"{path:8} {m['median_us']:9.1f} us {m['mean_us']:7.1f} us {m['p99_us']:7.1f} us {m['mib_s']:8.0f} MiB/s")
    print(f"{'':8} rounds: " + ", ".join(f"{r['median_us']:.1f} us / {r['mib_s']:.0f} MiB/s" for r in rs))
b, c = med["bare"], med["corral"]
added = (c["median_us"] - b["median_us"]) / 1000
ratio = c["mib_s"] / b["mib_s"]
print(f"added per round trip (median): {added:+.3f} ms   target < 0.1 ms: {'PASS' if added < 0.1 else 'MISS'}")
print(f"throughput corral / bare: {ratio:.2f}x   target >= 0.9x: {'PASS' if ratio >= 0.9 else 'MISS'}")
PY

#!/bin/bash
# Interleaved A/B of the service's latency: two (or more) corral builds
# serve side by side, one keep-alive client sends `python3 -c 'print(1)'`
# to each in turn, block by block, next to bare python3 started by the same
# client; ROUNDS rounds, the servers' order reversed every other round.
# This VM's noise between minutes is as large as most single changes, so
# only interleaved runs like this one tell two builds apart.
#
#   ./bench/serve-ab.sh BIN_A BIN_B [BIN_C ...]
#       ROUNDS=6 rounds of BLOCKS=8 blocks of PER=20 requests per server
#       GAP=0 seconds of idle before each request (and each bare run):
#       GAP=0.1 PER=4 BLOCKS=10 measures one execution at a time, as an agent that
#       thinks between calls sends them, instead of back-to-back load
#
# Prints each round's p50 and p90 (ms) per binary with its p50 over bare
# python3, then the means over the rounds.
set -euo pipefail
(( $# >= 2 )) || { echo "usage: $0 BIN_A BIN_B [BIN_C ...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-6}
BLOCKS=${BLOCKS:-8}
PER=${PER:-20}
GAP=${GAP:-0}
PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/corral-serve-ab.XXXXXX)
chmod 711 "$TMP"   # sandboxes (uid 65534 under root) pass through to their workspace
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
unenforced=false
[ "$(id -u)" -eq 0 ] || unenforced=true
ADDRS=()
i=0
for bin in "$@"; do
    d="$TMP/s$i"
    mkdir -p "$d"
    chmod 711 "$d"
    cat > "$d/corral.toml" <<TOML
[profile.code]
[profile.code.limits]
allow_unenforced = $unenforced
[server]
max_concurrent = 2
audit_db = "$d/audit.db"
work_dir = "$d"
TOML
    "$bin" serve --config "$d/corral.toml" --listen 127.0.0.1:0 2> "$d/server.log" &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q "serving on" "$d/server.log" && break; sleep 0.05; done
    ADDRS+=("$(sed -n 's|.*serving on http://||p' "$d/server.log")")
    i=$((i + 1))
done
echo "serve-ab: $ROUNDS rounds x $BLOCKS blocks x $PER requests per server, ${GAP} s idle before each, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
BINS=("$@")
for j in "${!BINS[@]}"; do
    echo "  [$j] ${BINS[$j]} at ${ADDRS[$j]}"
done
"$PY" - "$ROUNDS" "$BLOCKS" "$PER" "$GAP" "$PY" "${ADDRS[@]}" <<'PY'
import http.client, json, statistics, subprocess, sys, time
rounds, blocks, per = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gap, py = float(sys.argv[4]), sys.argv[5]
addrs = sys.argv[6:]
body = json.dumps({"command": ["python3", "-c", "print(1)"]})
conns = [http.client.HTTPConnection(*a.rsplit(":", 1)) for a in addrs]
def one(c):
    time.sleep(gap)
    t = time.perf_counter()
    c.request("POST", "/v1/executions", body, {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    if r.status != 200 or json.loads(d).get("stdout") != "1\n":
        sys.exit(f"serve-ab: request failed: {r.status} {d[:300]!r}")
    return (time.perf_counter() - t) * 1000
def bare():
    time.sleep(gap)
    t = time.perf_counter()
    subprocess.run([py, "-c", "print(1)"], stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000
for c in conns:
    for _ in range(5):
        one(c)
over = {i: [] for i in range(len(addrs))}
every = {i: [] for i in range(len(addrs))}
every_bare = []
p90s = {i: [] for i in range(len(addrs))}
for rnd in range(rounds):
    order = list(range(len(addrs)))
    if rnd % 2:
        order.reverse()
    res = {i: [] for i in order}
    b = []
    for _ in range(blocks):
        for i in order:
            res[i] += [one(conns[i]) for _ in range(per)]
        b += [bare() for _ in range(per)]
    b50 = statistics.median(b)
    every_bare += b
    line = [f"round {rnd + 1}: bare p50 {b50:.2f}"]
    for i in range(len(addrs)):
        p50 = statistics.median(res[i])
        p90 = statistics.quantiles(res[i], n=10)[8]
        over[i].append(p50 - b50)
        every[i] += res[i]
        p90s[i].append(p90)
        line.append(f"[{i}] p50 {p50:.2f} ({p50 - b50:+.2f}) p90 {p90:.2f}")
    print("  ".join(line), flush=True)
for i in range(len(addrs)):
    print(f"[{i}] mean p50 over bare {statistics.mean(over[i]):+.2f} ms "
          f"(rounds {min(over[i]):+.2f} to {max(over[i]):+.2f}), mean p90 {statistics.mean(p90s[i]):.2f} ms; "
          f"p50 of all {len(every[i])} over that of all bare "
          f"{statistics.median(every[i]) - statistics.median(every_bare):+.2f} ms")
PY

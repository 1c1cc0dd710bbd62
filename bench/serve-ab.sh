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
#       PROG=sh runs `sh -c :` (bare: /bin/sh) instead of python3: corral's
#       own share of the path, without python's start-up and its noise
#
# Prints each round's p50 and p90 (ms) per binary with its p50 over bare
# python3, then the means over the rounds.
set -euo pipefail
(( $# >= 2 )) || { echo "usage: $0 BIN_A BIN_B [BIN_C ...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-6}
BLOCKS=${BLOCKS:-8}
PER=${PER:-20}
GAP=${GAP:-0}
PROG=${PROG:-python3}
case $PROG in python3|sh) ;; *) echo "PROG is python3 or sh" >&2; exit 2 ;; esac
PY=/usr/bin/python3
# shellcheck source=bench/serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"
make_server_dirs corral-serve-ab
echo "serve-ab: $ROUNDS rounds x $BLOCKS blocks x $PER requests of $PROG per server, ${GAP} s idle before each, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
start_servers 2 "$@"
"$PY" - "$ROUNDS" "$BLOCKS" "$PER" "$GAP" "$PY" "$PROG" "${ADDRS[@]}" <<'PY'
import http.client, json, statistics, subprocess, sys, time
rounds, blocks, per = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gap, py, prog = float(sys.argv[4]), sys.argv[5], sys.argv[6]
addrs = sys.argv[7:]
if prog == "sh":
    command, bare_argv, expected = ["sh", "-c", ":"], ["/bin/sh", "-c", ":"], ""
else:
    command, bare_argv, expected = ["python3", "-c", "print(1)"], [py, "-c", "print(1)"], "1\n"
body = json.dumps({"command": command})
conns = [http.client.HTTPConnection(*a.rsplit(":", 1)) for a in addrs]
def one(c):
    time.sleep(gap)
    t = time.perf_counter()
    c.request("POST", "/v1/executions", body, {"content-type": "application/json"})
    r = c.getresponse()
    d = r.read()
    if r.status != 200 or json.loads(d).get("stdout") != expected:
        sys.exit(f"serve-ab: request failed: {r.status} {d[:300]!r}")
    return (time.perf_counter() - t) * 1000
def bare():
    time.sleep(gap)
    t = time.perf_counter()
    subprocess.run(bare_argv, stdout=subprocess.DEVNULL, check=True)
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

#!/bin/bash
# Interleaved A/B of the service's throughput: two (or more) corral builds
# serve side by side; per round, bare python3 (`xargs -P P`) and then each
# server in turn (the order reversed every other round) get N executions
# of `python3 -c 'print(1)'` from P keep-alive clients. Only interleaved
# runs tell builds apart on a VM whose speed drifts between minutes; a
# full picture with bwrap and unshare next to it is ./bench/serve.sh.
#
#   ./bench/serve-tp-ab.sh BIN_A BIN_B [BIN_C ...]
#       ROUNDS=5 rounds of N=200 executions, P=2 clients (= max_concurrent)
#
# Prints each round's runs/s per binary with its ratio to bare python3,
# then the means.
set -euo pipefail
(( $# >= 2 )) || { echo "usage: $0 BIN_A BIN_B [BIN_C ...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-5} N=${N:-200} P=${P:-2}
PY=/usr/bin/python3
# shellcheck source=bench/serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"
make_server_dirs corral-serve-tp-ab
echo "serve-tp-ab: $ROUNDS rounds of N=$N executions, P=$P keep-alive clients per server, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
start_servers $P "$@"
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)" "$PY" - "$ROUNDS" "$N" "$P" "$PY" "${ADDRS[@]}" <<'PY'
import statistics, subprocess, sys, time
from serve_clients import run_executions
rounds, n, p, py = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
addrs = sys.argv[5:]
def run(addr, count):
    return count / run_executions(addr, count, p)
def bare():
    t = time.perf_counter()
    subprocess.run(f"seq {n} | xargs -P {p} -I{{}} {py} -c 'print(1)' >/dev/null", shell=True, check=True)
    return n / (time.perf_counter() - t)
for a in addrs:
    run(a, 2 * p)
rates = {i: [] for i in range(len(addrs))}
bares = []
for rnd in range(rounds):
    order = list(range(len(addrs)))
    if rnd % 2:
        order.reverse()
    b = bare()
    bares.append(b)
    for i in order:
        rates[i].append(run(addrs[i], n))
    print(f"round {rnd + 1}: bare {b:.1f}/s  " + "  ".join(
        f"[{i}] {rates[i][-1]:.1f}/s ({rates[i][-1] / b:.3f}x)" for i in range(len(addrs))), flush=True)
for i in range(len(addrs)):
    m = statistics.mean(rates[i])
    print(f"[{i}] mean {m:.1f} runs/s = {m / statistics.mean(bares):.3f}x bare "
          f"({statistics.mean(bares):.1f}/s); rounds {min(rates[i]):.1f} to {max(rates[i]):.1f}")
PY

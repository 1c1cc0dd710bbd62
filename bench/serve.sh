#!/usr/bin/env bash
# Service throughput: executions per second of `python3 -c 'print(1)'`
# through the HTTP API at the concurrency cap, next to bare python3 run the
# same number of times with the same parallelism, in one run.
#
#   ./bench/serve.sh          (N=200 requests, P=2 = the cap; both settable)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${N:-200}
P=${P:-2}
cargo build --release -q -p corral
BIN=$PWD/target/release/corral
TMP=$(mktemp -d /tmp/corral-serve-bench.XXXXXX)
chmod 711 "$TMP"   # sandboxes (uid 65534 under root) pass through to their workspace
cleanup() { [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
unenforced=false
[ "$(id -u)" -eq 0 ] || unenforced=true
cat > "$TMP/corral.toml" <<TOML
[profile.code]
[profile.code.limits]
allow_unenforced = $unenforced
[server]
max_concurrent = $P
audit_db = "$TMP/audit.db"
work_dir = "$TMP"
TOML
"$BIN" serve --config "$TMP/corral.toml" --listen 127.0.0.1:0 2> "$TMP/server.log" &
SERVER=$!
for _ in $(seq 100); do grep -q "serving on" "$TMP/server.log" && break; sleep 0.05; done
ADDR=$(sed -n 's|.*serving on http://||p' "$TMP/server.log")
BODY='{"command": ["python3", "-c", "print(1)"]}'
curl -sf -X POST -H 'content-type: application/json' -d "$BODY" "http://$ADDR/v1/executions" | grep -q '"stdout":"1\\n"'

rate() { # label, seconds
    awk -v l="$1" -v s="$2" -v n="$N" 'BEGIN { printf "%-28s %7.2f s  %7.1f runs/s\n", l, s, n / s }'
}
timed() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'; }

echo "service throughput: N=$N, P=$P (= max_concurrent), $(nproc) cores, kernel $(uname -r), $(date -u '+%F %H:%M UTC'), uid $(id -u)"
bare=$(timed sh -c "seq $N | xargs -P $P -I{} /usr/bin/python3 -c 'print(1)'")
api=$(timed sh -c "seq $N | xargs -P $P -I{} curl -sf -o /dev/null -X POST -H 'content-type: application/json' -d '$BODY' http://$ADDR/v1/executions")
bare2=$(timed sh -c "seq $N | xargs -P $P -I{} /usr/bin/python3 -c 'print(1)'")
bare=$(awk -v a="$bare" -v b="$bare2" 'BEGIN { print (a + b) / 2 }')
rate "bare python3 (mean of 2)" "$bare"
rate "corral serve (HTTP, audited)" "$api"
awk -v b="$bare" -v a="$api" 'BEGIN { r = b / a; printf "ratio corral/bare: %.2fx (target >= 0.9x): %s\n", r, (r >= 0.9 ? "PASS" : sprintf("MISS by %.0f%%", (0.9 - r) / 0.9 * 100)) }'
rows=$(python3 -c "import sqlite3; print(sqlite3.connect('$TMP/audit.db').execute('select count(*) from executions').fetchone()[0])")
echo "audit records written: $rows (expected $((N + 1)))"
left=$(ls "$TMP" | grep -c '^corral-serve-' || true)
echo "sandbox processes left: $(pgrep -fc 'corral-sandbox' || true)"

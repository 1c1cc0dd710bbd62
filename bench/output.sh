#!/usr/bin/env bash
# Output drain benchmark: how fast corral drains a flood, and how much
# memory corral needs while it does, next to a bare pipe.
#
#   ./bench/output.sh            (GIB=2 by default; GIB=8 for a longer run)
#
# The flood is python writing 64 KiB chunks of 'x' without a newline.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
GIB=${GIB:-2}
cargo build --release -q -p corral
BIN=target/$(rustc --print host-tuple)/release/corral
TMP=$(mktemp -d /tmp/corral-output.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/cfg.toml" <<TOML
[profile.flood]
extends = "code"
[profile.flood.limits]
timeout_secs = 600
output = "1MiB"
output_kill = "64GiB"
TOML
$BIN check "$TMP/cfg.toml" >/dev/null
FLOOD="import sys
b = b'x' * 65536
w = sys.stdout.buffer.write
for _ in range(($GIB << 30) // 65536):
    w(b)"
LIMIT_FLAGS=()
[ "$(id -u)" -eq 0 ] || LIMIT_FLAGS=(--allow-unenforced-limits)

measure() { # label, command...: prints seconds and max RSS (KiB) of the command's tree
    local label=$1; shift
    /usr/bin/time -f "%e %M" -o "$TMP/time" "$@" > "$TMP/out" 2>/dev/null || true
    read -r secs rss < "$TMP/time"
    awk -v l="$label" -v s="$secs" -v g="$GIB" -v r="$rss" 'BEGIN { printf "%-34s %8.2f s %8.2f GiB/s %10d KiB max RSS\n", l, s, g / s, r }'
}

echo "output drain: ${GIB} GiB from python3, $(nproc) cores, kernel $(uname -r), $(date -u '+%F %H:%M UTC')"
measure "bare: python3 | cat > /dev/null" sh -c "/usr/bin/python3 -c \"$FLOOD\" | cat > /dev/null"
measure "corral --json (head+tail kept)" $BIN run "${LIMIT_FLAGS[@]}" --config "$TMP/cfg.toml" --profile flood --json -- python3 -c "$FLOOD"
measure "corral streaming > /dev/null" $BIN run "${LIMIT_FLAGS[@]}" --config "$TMP/cfg.toml" --profile flood -- python3 -c "$FLOOD"
echo "(max RSS is the largest single process of the command's tree: corral, its helper or init, or python)"

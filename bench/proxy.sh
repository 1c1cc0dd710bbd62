#!/usr/bin/env bash
# Proxy benchmark: bulk throughput and added per-connection latency of
# corral's egress proxy (HTTP CONNECT and SOCKS5) next to a direct loopback
# connection, all in one run, all on 127.0.0.1.
#
#   ./bench/proxy.sh        GIB=2 ROUNDS=5 CONNS=2000 by default
#
# GIB: GiB sent per path per round; ROUNDS: throughput rounds (order
# rotated); CONNS: sequential connections per path for the latency part.
# The program is crates/corral-proxy/examples/bench.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
GIB=${GIB:-2}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-2000}
cargo build --release -q -p corral-proxy --example bench
BIN=${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/examples/bench
echo "proxy benchmark: $(nproc) cores, kernel $(uname -r), $(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" --gib "$GIB" --rounds "$ROUNDS" --conns "$CONNS"

#!/usr/bin/env bash
# The service's soak run: `corral serve` (release build) under mixed load
# for SECS seconds (default one hour): executions of every kind, `/mcp`
# sessions, per-session and shared supervised MCP servers. It fails if the
# server's descriptors, threads, mounts, cgroups or child processes grow
# between a quiet moment after the first rounds and one at the end, or its
# memory by more than 24 MiB (the test
# `a_server_under_mixed_load_keeps_its_descriptors_threads_memory_and_mounts_flat`
# in crates/corral-cli/tests/supervisor.rs, which the suite runs for 20 s).
#
#   scripts/soak.sh            SECS=3600 by default
#   SECS=86400 scripts/soak.sh a day
#
# Needs what scripts/test.sh installs (the MCP SDK venv); prints the two
# samples (JSON lines) and the test's verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
SECS=${SECS:-3600}
[ -x /opt/corral-test-venv/bin/python ] || { echo "needs the MCP SDK venv at /opt/corral-test-venv (scripts/test.sh installs it)" >&2; exit 2; }
cargo build --release -q -p corral
BIN=${CARGO_TARGET_DIR:-$PWD/target}/$(rustc --print host-tuple)/release/corral
echo "soak: $SECS s against $BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?')), $(date -u '+%Y-%m-%d %H:%M UTC')"
CORRAL_BIN=$BIN CORRAL_SOAK_SECS=$SECS exec cargo test -q -p corral --test supervisor \
    a_server_under_mixed_load_keeps_its_descriptors_threads_memory_and_mounts_flat -- --nocapture

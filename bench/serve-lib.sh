# Sourced by the service benchmarks (serve.sh, serve-ab.sh, serve-tp-ab.sh,
# serve-profile.sh): starts one `corral serve` on loopback.
#
# corral_bin: sets BIN to the corral to measure: $CORRAL_BIN when set (a
# prebuilt binary), else this checkout's release build, built now.
corral_bin() {
    if [ -n "${CORRAL_BIN:-}" ]; then
        BIN=$CORRAL_BIN
    else
        cargo build --release -q -p corral
        BIN=$PWD/${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
    fi
}

#
# bench_tmp NAME: sets TMP to a fresh directory /tmp/corral-NAME.XXXXXX
# (mode 0711: sandboxes running as uid 65534 under root pass through to
# their workspace), removed on exit once the server started for the run
# (SERVER_PID) is killed (a server already gone does not stop the clean-up:
# set -e applies in traps); a failing command names its line.
bench_tmp() {
    TMP=$(mktemp -d "/tmp/corral-$1.XXXXXX")
    chmod 711 "$TMP"
    trap 'if [ -n "${SERVER_PID:-}" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi
          wait 2>/dev/null || true
          rm -rf "$TMP"' EXIT
    trap 'echo "$(basename "$0"): line $LINENO failed: $BASH_COMMAND" >&2' ERR
}

# start_server BIN DIR CAP: writes DIR/corral.toml (the builtin `code`
# profile, its limits allowed to go unenforced when not root, CAP
# executions at once, the audit database and work_dir in DIR, mode 0711 so
# that sandboxes running as uid 65534 under root reach their workspace),
# starts BIN serving it on an ephemeral port, and sets SERVER_PID and
# SERVER_ADDR (host:port) once it listens.
start_server() {
    local bin=$1 dir=$2 cap=$3 unenforced=false
    [ "$(id -u)" -eq 0 ] || unenforced=true
    mkdir -p "$dir"
    chmod 711 "$dir"
    cat > "$dir/corral.toml" <<TOML
[profile.code]
[profile.code.limits]
allow_unenforced = $unenforced
[server]
max_concurrent = $cap
audit_db = "$dir/audit.db"
work_dir = "$dir"
TOML
    "$bin" serve --config "$dir/corral.toml" --listen 127.0.0.1:0 2> "$dir/server.log" &
    SERVER_PID=$!
    for _ in $(seq 100); do grep -q "serving on" "$dir/server.log" && break; sleep 0.05; done
    SERVER_ADDR=$(sed -n 's|.*serving on http://||p' "$dir/server.log")
}

# start_servers CAP BIN...: start_server for each BIN in $TMP/s0, s1, ...;
# appends to PIDS and ADDRS, and lists them.
start_servers() {
    local cap=$1 i=0 bin
    shift
    for bin in "$@"; do
        start_server "$bin" "$TMP/s$i" "$cap"
        PIDS+=("$SERVER_PID")
        ADDRS+=("$SERVER_ADDR")
        echo "  [$i] $bin at $SERVER_ADDR"
        i=$((i + 1))
    done
}

# make_server_dirs PREFIX: TMP, a fresh directory for the servers (mode
# 0711: sandboxes running as uid 65534 under root pass through to their
# workspace), and empty PIDS and ADDRS; on exit the servers are killed and
# TMP removed.
make_server_dirs() {
    TMP=$(mktemp -d "/tmp/$1.XXXXXX")
    chmod 711 "$TMP"
    PIDS=()
    ADDRS=()
    trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
}

#!/usr/bin/env bash
# The whole corral test suite, from a fresh Debian machine:
#   1. installs what the tests need (apt),
#   2. checks formatting and lints, builds, runs each fuzz target briefly,
#   3. runs every test as root,
#   4. runs every test again as an unprivileged user it creates.
# .ci/run calls exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: run as root (as root: ./scripts/test.sh; otherwise: sudo ./scripts/test.sh): the suite runs once as root and once as an unprivileged user it creates" >&2
    exit 2
fi
export PATH="$HOME/.cargo/bin:/usr/local/cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

# --- 1. packages the tests use inside and around sandboxes ---------------
need=()
for pkg in python3 python3-pip python3-venv nodejs curl gcc libc6-dev util-linux passwd iproute2 procps strace; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "== installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The official MCP client (Python `mcp` from PyPI) for tests/mcp.rs, in a
# venv every user can read: the unprivileged pass uses it too. Debian's own
# python3, whatever else is first on PATH.
venv=/opt/corral-test-venv
# prometheus_client parses /metrics in both exposition formats (serve.rs).
if ! "$venv/bin/python" -c 'import mcp, prometheus_client' >/dev/null 2>&1; then
    echo "== installing the Python MCP SDK and prometheus_client into $venv"
    (umask 022 && /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --disable-pip-version-check mcp prometheus_client)
fi
# The OpenAPI checks of tests/openapi.rs: the document's validity
# (openapi-spec-validator), a short property-based run against a live
# server (schemathesis), and a generated client (openapi-python-client).
if ! "$venv/bin/python" -c 'import openapi_spec_validator, schemathesis, openapi_python_client' >/dev/null 2>&1; then
    echo "== installing openapi-spec-validator, schemathesis and openapi-python-client into $venv"
    (umask 022 && "$venv/bin/pip" install --quiet --disable-pip-version-check openapi-spec-validator schemathesis openapi-python-client)
fi
# uv (a wheel with a static binary) for tests/deploy.rs's uv installs.
if [ ! -x "$venv/bin/uv" ]; then
    echo "== installing uv into $venv"
    (umask 022 && "$venv/bin/pip" install --quiet --disable-pip-version-check uv)
fi
chmod -R a+rX "$venv"
# The newest Python MCP SDK 1.x (`ClientSession` API) in a venv of its own,
# next to 2.x: issue #16 has corral driven by both (tests/mcp.rs).
venv1=/opt/corral-test-venv-mcp1
if ! "$venv1/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("mcp").split(".")[0] != "1")' >/dev/null 2>&1; then
    echo "== installing the Python MCP SDK 1.x into $venv1"
    (umask 022 && /usr/bin/python3 -m venv "$venv1" && "$venv1/bin/pip" install --quiet --disable-pip-version-check 'mcp>=1,<2')
fi
chmod -R a+rX "$venv1"
# The official MCP SDK for Node (`@modelcontextprotocol/sdk` from npm) for
# tests/stream.rs, in a directory every user can read, like the venv.
nodesdk=/opt/corral-test-node
if [ ! -f "$nodesdk/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
    echo "== installing the Node MCP SDK into $nodesdk"
    # NodeSource's nodejs ships npm; Debian's has it as a separate package.
    command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    (umask 022 && mkdir -p "$nodesdk" && cd "$nodesdk" \
        && { [ -f package.json ] || echo '{"name": "corral-test-node", "private": true}' > package.json; } \
        && npm install --silent --no-audit --no-fund @modelcontextprotocol/sdk)
fi
chmod -R a+rX "$nodesdk"
command -v cargo >/dev/null || { echo "scripts/test.sh: cargo not found; install Rust (rustup) first" >&2; exit 2; }

# --- 2. style and build ---------------------------------------------------
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== build"
cargo build --workspace --all-targets --quiet
# Every fuzz target builds and runs a few seconds from its seeds (nightly
# and cargo-fuzz are installed if missing; libFuzzer's output goes to
# fuzz/target/logs/). The long runs are scripts/fuzz.sh's job.
echo "== fuzz smoke (3 s per target)"
FUZZ_SECONDS=3 scripts/fuzz.sh

# --- 3. everything as root ------------------------------------------------
log=$(mktemp /tmp/corral-test-log.XXXXXX)
status=0
echo "== tests as root"
set +e -o pipefail
cargo test --workspace --quiet 2>&1 | tee -a "$log" || status=1

# --- 4. everything again as an unprivileged user --------------------------
# The user gets copies of the test binaries and of corral in a directory it
# can read (the checkout may live under /root).
user=corral-test
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
stage=$(mktemp -d /tmp/corral-unpriv.XXXXXX)
trap 'rm -rf "$stage" "$log"' EXIT
chmod 755 "$stage"
# The test binaries and corral itself, wherever cargo put them (under
# target/<host tuple>/: see .cargo/config.toml).
cargo test --workspace --no-run --message-format=json --quiet 2>/dev/null \
    | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        if m["profile"]["test"]:
            print(m["executable"])
        elif m["target"]["name"] == "corral" and "bin" in m["target"]["kind"]:
            print(m["executable"], file=sys.stderr)' > "$stage/tests.list" 2> "$stage/corral.path"
[ -s "$stage/corral.path" ] || { echo "scripts/test.sh: cargo did not name the corral binary" >&2; exit 1; }
cp "$(cat "$stage/corral.path")" "$stage/corral"
while read -r exe; do cp "$exe" "$stage/"; done < "$stage/tests.list"
chmod -R a+rX "$stage"
echo "== tests as $user (uid $(id -u "$user"))"
cd "$stage"
while read -r exe; do
    name=$(basename "$exe")
    echo "-- $name"
    runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$stage" CORRAL_BIN="$stage/corral" \
        "$stage/$name" --quiet 2>&1 | tee -a "$log" || status=1
done < "$stage/tests.list"

# One closing line for both passes.
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } } END { print p+0, f+0 }' "$log")
[ "$failed" -eq 0 ] || status=1
echo "suite: $passed passed, $failed failed"
exit $status

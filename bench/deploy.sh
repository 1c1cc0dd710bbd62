#!/usr/bin/env bash
# corral deploy benchmark: time to deploy a small Python server (three
# wheels, requirements.txt) and a small Node server (three npm packages, no
# lockfile) from local registries on loopback, cold (a fresh HOME: empty
# pip and npm caches) and warm (--cache DIR, warmed by one run), plus the
# no-op redeploy; next to the same installs run bare on the host (no
# sandbox, no proxy) in the same run.
#
#   ./bench/deploy.sh        RUNS=5 by default; run as root or as a user
#
# The registries are tests/deploy_support/registry.py (wheels and npm
# tarballs written at start, served on 127.0.0.1). corral reaches its own
# as registry.test through its proxy; the bare runs use a second one that
# names 127.0.0.1 in its tarball URLs. Nothing leaves loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
RUNS=${RUNS:-5}
PY=/usr/bin/python3
command -v hyperfine >/dev/null || { echo "bench/deploy.sh: needs hyperfine (apt-get install hyperfine)" >&2; exit 2; }
cargo build --release -q -p corral
BIN=$PWD/${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
. bench/registry.sh
registry_workdir deploy

spec() { # $1: the host name tarball URLs use
    cat <<EOF
{"host": "$1",
 "wheels": [
   {"name": "bench-a", "version": "1.0", "files": {"bench_a.py": "A = 1\ndef main():\n    print(A)\n"},
    "entry_points": {"bench-a": "bench_a:main"}},
   {"name": "bench-b", "version": "1.0", "files": {"bench_b.py": "B = 2\n"}},
   {"name": "bench-c", "version": "1.0", "files": {"bench_c.py": "C = 3\n"}}],
 "npm": [
   {"name": "bench-a", "version": "1.0.0", "files": {"index.js": "module.exports = 1;\n"}},
   {"name": "bench-b", "version": "1.0.0", "files": {"index.js": "module.exports = 2;\n"}},
   {"name": "bench-c", "version": "1.0.0", "files": {"index.js": "module.exports = 3;\n"}}]}
EOF
}
PORT=$(start_registry registry.test "$W/reg")
BPORT=$(start_registry 127.0.0.1 "$W/reg-bare")

mkdir -p "$W/py" "$W/node"
printf 'bench-a==1.0\nbench-b==1.0\nbench-c==1.0\n' > "$W/py/requirements.txt"
printf 'import bench_a, bench_b, bench_c\nprint(bench_a.A + bench_b.B + bench_c.C)\n' > "$W/py/server.py"
cat > "$W/node/package.json" <<'EOF'
{"name": "bench-server", "version": "1.0.0", "main": "index.js",
 "dependencies": {"bench-a": "1.0.0", "bench-b": "1.0.0", "bench-c": "1.0.0"}}
EOF
echo 'console.log(require("bench-a") + require("bench-b") + require("bench-c"));' > "$W/node/index.js"
chmod -R a+rX "$W/py" "$W/node"

FLAGS="--index-url http://registry.test:$PORT/simple/ --npm-registry http://registry.test:$PORT/npm/ --add-host registry.test=127.0.0.1 --allow-cidr 127.0.0.1/32:$PORT"
[ "$(id -u)" -eq 0 ] || FLAGS="$FLAGS --allow-unenforced-limits"
D="$BIN deploy $FLAGS"
BARE_PIP="$PY -m venv --without-pip $W/bare/.venv && $PY -m pip --python $W/bare/.venv/bin/python install -q --no-input --prefer-binary --index-url http://127.0.0.1:$BPORT/simple/ -r $W/py/requirements.txt"
BARE_NPM="mkdir -p $W/bare && cp $W/node/package.json $W/bare/ && cd $W/bare && npm install -q --no-audit --no-fund --ignore-scripts --omit=dev --registry http://127.0.0.1:$BPORT/npm/"

echo "== corral $(git rev-parse --short HEAD), $(nproc) CPUs, uid $(id -u), $(date -u +%FT%TZ)"
hf() { hyperfine -N --runs "$RUNS" --style basic "$@" 2>&1 | grep -E '^(Benchmark|  Time|  Range)'; }
# -N (no shell) cannot run the && chains: those use a shell.
hfs() { hyperfine --runs "$RUNS" --style basic "$@" 2>&1 | grep -E '^(Benchmark|  Time|  Range)'; }
for kind in py node; do
    out=$W/out-$kind
    hfs --prepare "chmod -R u+w $out 2>/dev/null; rm -rf $out" -n "$kind cold (fresh HOME)" "$D $W/$kind --out $out"
    hfs --warmup 1 --prepare "chmod -R u+w $out 2>/dev/null; rm -rf $out" -n "$kind warm (--cache)" "$D --cache $W/cache-$kind $W/$kind --out $out"
    hf -n "$kind no-op redeploy" "$D --cache $W/cache-$kind $W/$kind --out $out"
done
# Package sources (--package): the same registries, one package by name.
for spec in npm:bench-a@1.0.0 pypi:bench-a==1.0; do
    out=$W/out-pkg
    hfs --prepare "chmod -R u+w $out 2>/dev/null; rm -rf $out" -n "package $spec, cold" "$D --package $spec --out $out"
done
# uv instead of pip, when scripts/test.sh installed it.
UV=/opt/corral-test-venv/bin/uv
if [ -x "$UV" ]; then
    out=$W/out-uv
    hfs --prepare "chmod -R u+w $out 2>/dev/null; rm -rf $out" -n "py cold with uv" "$D --uv $UV $W/py --out $out"
fi
hfs --prepare "rm -rf $W/bare" -n "py bare pip, cold (PIP_NO_CACHE_DIR=1)" "PIP_NO_CACHE_DIR=1 sh -c '$BARE_PIP'"
hfs --warmup 1 --prepare "rm -rf $W/bare" -n "py bare pip, warm" "PIP_CACHE_DIR=$W/bare-cache sh -c '$BARE_PIP'"
hfs --prepare "rm -rf $W/bare $W/bare-npm" -n "node bare npm, cold" "sh -c '$BARE_NPM --cache $W/bare-npm'"
hfs --warmup 1 --prepare "rm -rf $W/bare" -n "node bare npm, warm" "sh -c '$BARE_NPM --cache $W/bare-npm-warm'"
# The trees work: run each entry the way a supervisor would.
$BIN run --profile mcp-python --runtime "$W/out-py/.venv" --ro "$W/out-py" $([ "$(id -u)" -eq 0 ] || echo --allow-unenforced-limits) -- python3 "$W/out-py/server.py"
$BIN run --profile mcp-node --ro "$W/out-node" $([ "$(id -u)" -eq 0 ] || echo --allow-unenforced-limits) -- node "$W/out-node/index.js"

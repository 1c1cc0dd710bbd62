#!/bin/bash
# Regenerates crates/corral-cli/link-order.txt, the order in which the
# linker lays out the functions that `corral run` executes (build.rs hands
# it to lld as `--symbol-ordering-file` for release builds).
#
# Why: corral's text is ~10 MB and each process of a launch faults in
# every 64 KiB window of it that it touches. The launcher, init and the
# program's process (a fork does not carry the file-backed page tables)
# each fault on their own. With the functions they run packed together,
# the launcher's text faults went 50 -> 16 and `corral run ... true` got
# 0.16 ms faster (docs/PERFORMANCE.md, issue 17).
#
# How: a release build with no order (CORRAL_LINK_ORDER=off); one launch
# of the benchmark's full sandbox with its init and program's process
# single-stepped (scripts/trace-sandbox-text.py: every function they run,
# exactly, in the order first run), and likewise one execution of `corral
# serve` (its sandbox built ahead by init cloned from a fork server); the
# launcher of one launch under valgrind's callgrind, which lists every
# function it runs up to its clone of init (valgrind cannot follow that
# clone: the sandbox fails, the launcher goes on to its error path); then
# RUNS launches under perf (CPU samples, and page faults with their
# addresses), each attributed to the launcher, init or the program's
# process (from perf's fork events), for what neither saw. The file lists
# the sandbox's functions first, so that they share as few 64 KiB windows
# as their size allows (init's exit unmaps every page it mapped, on the
# launch's critical path), then the launcher's as callgrind met them,
# then those perf saw init or the program run, then the rest perf saw.
# Symbols are mangled names; a name the build no longer has is skipped by
# the linker, so a stale file costs speed, never correctness. Rerun after
# larger changes to the launch path; bench/startup.sh notes when more than
# 5% of the names are missing from the build it measures.
#
#   scripts/link-order.sh           (as root: the cgroup path too)
#       RUNS=200 launches
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:/usr/local/cargo/bin:$PATH"
for tool in perf valgrind curl; do
    command -v $tool >/dev/null || {
        echo "$0: needs $tool (Debian: linux-perf, valgrind, curl)" >&2
        exit 1
    }
done
RUNS=${RUNS:-200}
TMP=$(mktemp -d /tmp/corral-link-order.XXXXXX)
tracer=
# A traced server left behind is killed with its tracer (PTRACE_O_EXITKILL).
trap '[ -n "$tracer" ] && kill "$tracer" 2>/dev/null; rm -rf "$TMP"' EXIT
echo "== release build without an order"
CORRAL_LINK_ORDER=off cargo build --release -q -p corral
BIN=${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)/release/corral
cp "$BIN" "$TMP/corral"
flags=()
[ "$(id -u)" -eq 0 ] || flags+=(--allow-unenforced-limits)
launches() {
    for ((i = 0; i < $1; i++)); do
        "$TMP/corral" run --config bench/startup-profile.toml --profile bench "${flags[@]}" -- true
    done
}
export -f launches
export TMP
echo "== one launch with init and the program's process single-stepped"
python3 scripts/trace-sandbox-text.py "$TMP/sandbox.txt" -- \
    "$TMP/corral" run --config bench/startup-profile.toml --profile bench "${flags[@]}" -- true \
    >/dev/null
echo "== one execution of corral serve with what its fork servers start single-stepped"
# The service's sandboxes: init cloned by a fork server, built ahead and
# given its program later, run functions `corral run` does not.
unenforced=false
[ "$(id -u)" -eq 0 ] || unenforced=true
# Sandboxes (uid 65534 under root) pass through to their workspace.
chmod 711 "$TMP"
mkdir -m 711 "$TMP/serve"
cat >"$TMP/serve/corral.toml" <<TOML
[profile.code.limits]
allow_unenforced = $unenforced
[server]
max_concurrent = 1
audit_db = "$TMP/serve/audit.db"
work_dir = "$TMP/serve"
TOML
python3 scripts/trace-sandbox-text.py "$TMP/serve.txt" -- \
    "$TMP/corral" serve --config "$TMP/serve/corral.toml" --listen 127.0.0.1:0 \
    2>"$TMP/serve/log" &
tracer=$!
for _ in $(seq 600); do
    grep -q "serving on" "$TMP/serve/log" && break
    kill -0 "$tracer" 2>/dev/null || { echo "$0: corral serve did not start:" >&2; cat "$TMP/serve/log" >&2; exit 1; }
    sleep 0.2
done
addr=$(sed -n 's|.*serving on http://||p' "$TMP/serve/log")
[ -n "$addr" ] || { echo "$0: corral serve did not say where it listens:" >&2; cat "$TMP/serve/log" >&2; exit 1; }
server=$(awk '{ print $1 }' /proc/"$tracer"/task/"$tracer"/children)
# A sandbox built ahead: an init of the server's in a pid namespace of its
# own (NSpid ends in 1) with the program's process waiting under it. (As
# root on cgroup v2 a helper holds it instead, and the trace covers that
# helper's path.)
built_ahead() {
    local pid
    for pid in $(cat /proc/"$server"/task/*/children 2>/dev/null); do
        grep -qE '^NSpid:.*[[:space:]]1$' /proc/"$pid"/status 2>/dev/null &&
            [ -n "$(cat /proc/"$pid"/task/*/children 2>/dev/null)" ] && return 0
    done
    return 1
}
for _ in $(seq 300); do built_ahead && break; sleep 0.2; done
built_ahead || echo "NOTE: no init cloned ahead by a fork server after 60 s; tracing the execution as it comes" >&2
curl -sf -m 300 -o /dev/null -X POST -H 'content-type: application/json' \
    -d '{"command": ["python3", "-c", "print(1)"]}' "http://$addr/v1/executions" ||
    { echo "$0: the traced execution failed; see $TMP/serve/log" >&2; exit 1; }
kill -TERM "$server"
for _ in $(seq 600); do kill -0 "$tracer" 2>/dev/null || break; sleep 0.2; done
kill -0 "$tracer" 2>/dev/null && { echo "$0: the tracer did not end with the server" >&2; exit 1; }
wait "$tracer"
tracer=
echo "== one launch under callgrind"
valgrind --tool=callgrind --demangle=no --callgrind-out-file="$TMP/callgrind.out" \
    "$TMP/corral" run --config bench/startup-profile.toml --profile bench "${flags[@]}" -- true \
    >/dev/null 2>"$TMP/callgrind.log" || true
echo "== $RUNS launches under perf"
perf record -q -F 25000 -e cpu-clock -o "$TMP/cpu.data" -- \
    bash -c "$(declare -p flags); launches $RUNS" >/dev/null
perf record -q -e page-faults -c 1 -d -o "$TMP/faults.data" -- \
    bash -c "$(declare -p flags); launches $((RUNS / 4))" >/dev/null
# Samples: the instruction pointer; faults: the address touched.
perf script -i "$TMP/cpu.data" --show-task-events --show-mmap-events \
    -F comm,pid,ip 2>/dev/null >"$TMP/cpu.txt"
perf script -i "$TMP/faults.data" --show-task-events --show-mmap-events \
    -F comm,pid,addr 2>/dev/null >"$TMP/faults.txt"
nm -n --no-demangle "$TMP/corral" >"$TMP/nm.txt"
readelf -S -W "$TMP/corral" | awk '$2 == ".text" { print $4, $6 }' >"$TMP/text.txt"
# The executable segment's file offset and address, to find the image's
# load address from perf's record of that mapping.
readelf -l -W "$TMP/corral" | awk '$1 == "LOAD" && / R E / { print $2, $3 }' >"$TMP/exec.txt"
python3 - "$TMP" crates/corral-cli/link-order.txt <<'EOF'
import bisect, collections, re, sys
tmp, out = sys.argv[1], sys.argv[2]
funcs = []
for line in open(f"{tmp}/nm.txt"):
    p = line.split()
    if len(p) == 3 and p[1] in "tTwW":
        funcs.append((int(p[0], 16), p[2]))
starts = [a for a, _ in funcs]
text_start, text_size = (int(x, 16) for x in open(f"{tmp}/text.txt").read().split())
exec_offset, exec_vaddr = (int(x, 16) for x in open(f"{tmp}/exec.txt").read().split())
parent = {}      # pid -> ppid, from fork events
image = {}       # pid -> load address of corral's image
ran = {"child": collections.Counter(), "launcher": collections.Counter()}
def role(pid):
    # The launcher exec'd corral; init is its child, the program init's.
    if pid in image and parent.get(pid) not in image:
        return "launcher"
    return "child"
def symbol(pid, addr):
    base = image.get(pid)
    while base is None and pid in parent:
        pid = parent[pid]
        base = image.get(pid)
    if base is None or not text_start <= addr - base < text_start + text_size:
        return None
    i = bisect.bisect_right(starts, addr - base) - 1
    return funcs[i][1] if i >= 0 else None
for data in ("faults", "cpu"):
    for line in open(f"{tmp}/{data}.txt"):
        m = re.search(r"PERF_RECORD_FORK\((\d+):\d+\):\((\d+):\d+\)", line)
        if m:
            parent[int(m.group(1))] = int(m.group(2))
            continue
        m = re.search(r"(\d+)/\d+: \[0x([0-9a-f]+)\(0x[0-9a-f]+\) @ 0x([0-9a-f]+) .*r-xp .*/corral$", line)
        if m and int(m.group(3), 16) == exec_offset & ~0xfff:
            image[int(m.group(1))] = int(m.group(2), 16) - (exec_vaddr & ~0xfff)
            continue
        fields = line.split()
        if "PERF_RECORD" in line or len(fields) < 3:
            continue
        pid = int(fields[1].split("/")[0])
        name = symbol(pid, int(fields[2], 16))
        if name:
            ran[role(pid)][name] += 1
known = {name for _, name in funcs}
order = [n.strip() for f in ("sandbox", "serve") for n in open(f"{tmp}/{f}.txt") if n.strip() in known]
order = [n for i, n in enumerate(order) if n not in order[:i]]
sandbox = len(order)
for line in open(f"{tmp}/callgrind.out"):
    m = re.match(r"c?fn=\(\d+\) (\S+)$", line.strip())
    if m and m.group(1) in known:
        order.append(m.group(1))
launcher = len(set(order)) - sandbox
order += [n for n, _ in ran["child"].most_common()]
order += [n for n, _ in ran["launcher"].most_common()]
seen = set()
order = [n for n in order if not (n in seen or seen.add(n))]
with open(out, "w") as f:
    f.write("\n".join(order) + "\n")
print(f"{out}: {len(order)} functions ({sandbox} traced in init or the program, "
      f"up to {launcher} more from callgrind, {len(ran['child'])} sampled in init or the program)")
EOF

#!/usr/bin/env bash
# bench/startup.sh: sandbox start-up latency and throughput, corral next to
# bare exec, util-linux unshare and bubblewrap, all measured in one run.
#
# Usage: ./bench/startup.sh      (root or not; as root it installs what is missing)
#
# Methodology (the same as shared/reference/startup-baselines.md, so the
# figures can be put side by side):
#   latency     hyperfine -N (no shell), all configs in interleaved blocks,
#               median and p99 computed from hyperfine's raw per-run times
#   throughput  `seq N | xargs -P P -I{} CMD`, wall-timed, interleaved
#               blocks, median of blocks
# Raw data (hyperfine JSON, throughput TSV, logs) stays in $BENCH_OUT
# (default: a fresh /tmp/corral-startup.XXXXXX); the path is printed at the end.
#
# Tunables (environment): LAT_RUNS (200), LAT_BLOCKS (4), WARMUP (20),
# TP_N (400), TP_PY_N (100), TP_BLOCKS (5).
# TIMELINE=N (default 0: off) adds the wall-clock timeline of N sequential
# launches of bwrap and of corral: when each process of the launch was
# forked, when it forked the next, when the program exec'd and exited, and
# how long each process outlived it (`perf record` of the sched_process_
# fork/exec/exit tracepoints only, so the tracing itself costs little;
# needs `perf`). Medians per step.
# PHASES=N (default 0: off) adds a CPU breakdown per process and per kernel
# entry point of N sequential launches of bwrap and of corral (`perf record`
# of the software cpu-clock event with call graphs; needs `perf`). It
# counts CPU, not waiting, so it holds up better than wall time on a shared
# machine; absolute figures include perf's own overhead (compare the two).
set -euo pipefail
export LC_ALL=C   # '.' as decimal separator in $EPOCHREALTIME and printf

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

LAT_RUNS=${LAT_RUNS:-200}
LAT_BLOCKS=${LAT_BLOCKS:-4}
WARMUP=${WARMUP:-20}
TP_N=${TP_N:-400}
TP_PY_N=${TP_PY_N:-100}
TP_BLOCKS=${TP_BLOCKS:-5}
TP_PAR=(2 8)
PY=/usr/bin/python3   # the workload and the analysis: the real binary, not a pyenv shim

die() { echo "startup.sh: $*" >&2; exit 1; }
log() { echo "== $*" >&2; }

# ---------------------------------------------------------------------------
# 1. Prerequisites: hyperfine and bubblewrap (apt-get, only as root), then a
#    release build of corral.
# ---------------------------------------------------------------------------
missing=()
command -v hyperfine >/dev/null || missing+=(hyperfine)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v unshare >/dev/null || missing+=(util-linux)
[[ -x $PY ]] || missing+=(python3)
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        log "installing ${missing[*]}"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    else
        die "missing ${missing[*]}; install them (or run this script as root)"
    fi
fi

log "cargo build --release -p corral"
(cd "$ROOT" && cargo build --release -p corral >&2)
CORRAL=${CARGO_TARGET_DIR:-$ROOT/target}/$(rustc --print host-tuple)/release/corral
[[ -x $CORRAL ]] || die "no corral binary at $CORRAL"

# ---------------------------------------------------------------------------
# 2. Workspace, corral config and the command lines under test. Each command
#    is a plain word list (no shell), so paths must not contain whitespace.
# ---------------------------------------------------------------------------
OUT=${BENCH_OUT:-$(mktemp -d /tmp/corral-startup.XXXXXX)}
mkdir -p "$OUT"
WS=$(mktemp -d /tmp/corral-startup-ws.XXXXXX)   # created once, as in the baselines
trap 'rm -rf "$WS"' EXIT
for p in "$OUT" "$WS" "$CORRAL"; do
    [[ $p != *[[:space:]]* ]] || die "path with whitespace not supported: $p"
done

CFG=$OUT/bench.toml
cp "$ROOT/bench/startup-profile.toml" "$CFG"
"$CORRAL" check "$CFG" >&2

UNSHARE="unshare --user --map-root-user --pid --fork --mount --ipc --uts --net"
# Config d of the baselines ("bwrap typical agent"), verbatim.
BWRAP="bwrap --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
--symlink usr/bin /bin --symlink usr/sbin /sbin --ro-bind /etc /etc --tmpfs /tmp \
--proc /proc --dev /dev --bind $WS /workspace --chdir /workspace \
--unshare-all --die-with-parent --new-session --clearenv"
CORRAL_RUN="$CORRAL run --config $CFG --profile bench --"

IDS=() CMDS=()
add() { IDS+=("$1"); CMDS+=("$2"); }
add bare       "/bin/true"
add unshare    "$UNSHARE /bin/true"
add bwrap      "$BWRAP /bin/true"
add corral     "$CORRAL_RUN true"
add py-bare    "$PY -c pass"
add py-unshare "$UNSHARE $PY -c pass"
add py-bwrap   "$BWRAP $PY -c pass"
add py-corral  "$CORRAL_RUN python3 -c pass"

# Every command must work before it is timed (hyperfine and xargs would
# stop on the first failure anyway, with a less helpful message).
for i in "${!IDS[@]}"; do
    read -ra argv <<<"${CMDS[$i]}"
    "${argv[@]}" </dev/null >/dev/null 2>"$OUT/check-${IDS[$i]}.err" ||
        die "${IDS[$i]} fails: ${CMDS[$i]} (see $OUT/check-${IDS[$i]}.err)"
done
for i in "${!IDS[@]}"; do printf '%s\t%s\n' "${IDS[$i]}" "${CMDS[$i]}"; done >"$OUT/commands.tsv"

# Machine facts, recorded before the run.
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "nproc=$(nproc)"
    echo "kernel=$(uname -r)"
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "uid=$(id -u)"
    echo "hyperfine=$(hyperfine --version | awk '{print $2}')"
    echo "bwrap=$(bwrap --version | awk '{print $2}')"
    echo "unshare=$(unshare --version | awk '{print $NF}')"
    echo "python=$($PY -c 'import platform; print(platform.python_version())')"
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) || rev="(not a git checkout)"
    if [[ $rev != "(not"* ]] && ! git -C "$ROOT" diff --quiet HEAD -- crates Cargo.toml Cargo.lock; then
        rev+="+uncommitted"
    fi
    echo "corral=$rev"
    echo "corral_size=$(stat -c %s "$CORRAL")"
    # The launch path's layout (crates/corral-cli/link-order.txt) names
    # functions by their mangled names, which change with the code: count
    # those this build no longer has (a stale file costs page faults).
    order=$ROOT/crates/corral-cli/link-order.txt
    if command -v nm >/dev/null && [[ -f $order ]]; then
        missing=$(comm -23 <(sort -u "$order") <(nm --no-demangle "$CORRAL" | awk '{print $NF}' | sort -u) | wc -l)
        echo "link_order=$missing/$(sort -u "$order" | wc -l)"
    fi
    echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"

# ---------------------------------------------------------------------------
# 3. Latency: LAT_BLOCKS hyperfine invocations of LAT_RUNS/LAT_BLOCKS runs
#    each, every config in every block; the config order rotates from block
#    to block so that none always runs first or last.
# ---------------------------------------------------------------------------
per_block=$(((LAT_RUNS + LAT_BLOCKS - 1) / LAT_BLOCKS))
n=${#IDS[@]}
for ((b = 0; b < LAT_BLOCKS; b++)); do
    log "latency block $((b + 1))/$LAT_BLOCKS ($per_block runs x $n configs)"
    args=()
    for ((k = 0; k < n; k++)); do
        i=$(((k + b) % n))
        args+=(-n "${IDS[$i]}" "${CMDS[$i]}")
    done
    hyperfine -N --style basic --warmup "$WARMUP" --runs "$per_block" \
        --export-json "$OUT/latency-$b.json" "${args[@]}" >>"$OUT/hyperfine.log" 2>&1 ||
        die "hyperfine failed; see $OUT/hyperfine.log"
done

# ---------------------------------------------------------------------------
# 4. Throughput: `seq N | xargs -P P -I{} CMD` (xargs execs CMD directly),
#    wall-timed. TP_BLOCKS interleaved blocks; each block runs every config
#    at every P. python3 configs use TP_PY_N launches (they are ~10x slower).
# ---------------------------------------------------------------------------
TP=$OUT/throughput.tsv
printf 'block\tP\tid\tN\tseconds\n' >"$TP"
for ((b = 0; b < TP_BLOCKS; b++)); do
    log "throughput block $((b + 1))/$TP_BLOCKS"
    for P in "${TP_PAR[@]}"; do
        for ((k = 0; k < n; k++)); do
            i=$(((k + b) % n))
            id=${IDS[$i]}
            N=$TP_N
            [[ $id == py-* ]] && N=$TP_PY_N
            read -ra argv <<<"${CMDS[$i]}"
            t0=$EPOCHREALTIME
            seq "$N" | xargs -P "$P" -I{} "${argv[@]}" >/dev/null 2>>"$OUT/throughput.err" ||
                die "throughput run of $id failed; see $OUT/throughput.err"
            t1=$EPOCHREALTIME
            printf '%d\t%d\t%s\t%d\t%s\n' "$b" "$P" "$id" "$N" \
                "$(awk -v a="$t0" -v z="$t1" 'BEGIN{printf "%.6f", z-a}')" >>"$TP"
        done
    done
done
echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

# ---------------------------------------------------------------------------
# 5. Report: absolute figures, ratios, and the targets with PASS/MISS.
#    Targets (issue 17): corral latency <= bwrap (goal 0.7x) and <= 1.5x bare
#    unshare (medians, /bin/true); corral throughput >= bwrap (goal 1.5x) at
#    each P.
#    The same text is saved as $OUT/report.txt.
# ---------------------------------------------------------------------------
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/report.txt"
import csv, glob, json, statistics, sys
from collections import defaultdict

out = sys.argv[1]
machine = dict(l.rstrip("\n").split("=", 1) for l in open(f"{out}/machine.txt") if "=" in l)

times = defaultdict(list)              # id -> seconds, all blocks merged
block_med = defaultdict(list)          # id -> median of each block (noise check)
for path in sorted(glob.glob(f"{out}/latency-*.json")):
    for r in json.load(open(path))["results"]:
        times[r["command"]].extend(r["times"])
        block_med[r["command"]].append(statistics.median(r["times"]))

def pct(xs, q):                        # linear interpolation between order statistics
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

lat = {i: {"med": pct(t, 0.5) * 1e3, "p99": pct(t, 0.99) * 1e3,
           "min": min(t) * 1e3, "n": len(t)} for i, t in times.items()}

blocks = defaultdict(list)             # (id, P) -> runs/s per block
for row in csv.DictReader(open(f"{out}/throughput.tsv"), delimiter="\t"):
    blocks[(row["id"], int(row["P"]))].append(int(row["N"]) / float(row["seconds"]))
tp = {k: statistics.median(v) for k, v in blocks.items()}
pars = sorted({p for _, p in tp})

print()
print(f"corral start-up benchmark  {machine['date']}")
print(f"machine: nproc={machine['nproc']}  kernel {machine['kernel']}  {machine['cpu']}  uid={machine['uid']}")
print(f"versions: corral {machine['corral']} ({int(machine['corral_size'])/1e6:.1f} MB binary), "
      f"bwrap {machine['bwrap']}, unshare {machine['unshare']}, hyperfine {machine['hyperfine']}, python {machine['python']}")
print(f"load average before {machine['load_before']}, after {machine.get('load_after', '?')}")
if "link_order" in machine:
    missing, named = (int(x) for x in machine["link_order"].split("/"))
    if missing * 20 > named:
        print(f"NOTE: {missing} of the {named} functions crates/corral-cli/link-order.txt lays out first "
              "are not in this build (renamed or changed since): corral's launch touches more pages "
              "than it needs to; regenerate the file with scripts/link-order.sh")
print()
ids = ["bare", "unshare", "bwrap", "corral", "py-bare", "py-unshare", "py-bwrap", "py-corral"]
hdr = f"{'config':<12}{'median ms':>10}{'p99 ms':>9}{'min ms':>8}{'runs':>6}"
hdr += "".join(f"{'P=%d /s' % p:>10}" for p in pars)
print(hdr)
print("-" * len(hdr))
for i in ids:
    if i not in lat:
        continue
    l = lat[i]
    line = f"{i:<12}{l['med']:>10.2f}{l['p99']:>9.2f}{l['min']:>8.2f}{l['n']:>6}"
    line += "".join(f"{tp.get((i, p), float('nan')):>10.0f}" for p in pars)
    print(line)
noisy = [i for i in ids if i in block_med and max(block_med[i]) > 1.3 * min(block_med[i])]
if noisy:
    print("NOTE: latency block medians differ by > 1.3x for " + ", ".join(noisy) +
          ": something else was using the CPU during some blocks; see latency-*.json")
print()
print("throughput: runs/s, median of blocks; block range:")
for i in ids:
    rng = "  ".join(f"P={p} {min(blocks[(i, p)]):.0f}-{max(blocks[(i, p)]):.0f}" for p in pars if (i, p) in blocks)
    print(f"  {i:<12}{rng}")

noisy = [f"{i} P={p}" for (i, p), v in sorted(blocks.items()) if max(v) > 1.3 * min(v)]
if noisy:
    print("  NOTE: block max/min > 1.3 for " + ", ".join(noisy) +
          ": something else was using the CPU; trust the medians less (rerun on a quiet machine)")

print()
print("ratios (corral / other; < 1 means corral is faster for latency, > 1 means more runs/s for throughput)")
for pre, name in (("", "/bin/true"), ("py-", "python3 -c pass")):
    c, w, u, bare = (lat[pre + x] for x in ("corral", "bwrap", "unshare", "bare"))
    print(f"  {name}: latency median corral/bwrap {c['med']/w['med']:.2f}x, corral/unshare {c['med']/u['med']:.2f}x; "
          f"p99 corral/bwrap {c['p99']/w['p99']:.2f}x")
    print(f"  {name}: overhead over bare (median): unshare +{u['med']-bare['med']:.2f} ms, "
          f"bwrap +{w['med']-bare['med']:.2f} ms, corral +{c['med']-bare['med']:.2f} ms")
    print("  " + name + ": throughput corral/bwrap " +
          ", ".join(f"P={p} {tp[(pre+'corral', p)]/tp[(pre+'bwrap', p)]:.2f}x" for p in pars))

print()
print("targets (/bin/true)")
def lat_target(label, other, factor):
    c, o = lat["corral"]["med"], lat[other]["med"]
    limit = factor * o
    if c <= limit:
        print(f"  PASS  {label}: {c:.2f} ms <= {limit:.2f} ms ({c/o:.2f}x), {limit-c:.2f} ms to spare")
    else:
        print(f"  MISS  {label}: {c:.2f} ms > {limit:.2f} ms ({c/o:.2f}x); "
              f"{c-limit:.2f} ms over, needs to be {c/limit:.2f}x faster")
# Issue 17: required latency <= bwrap and throughput >= bwrap (the full
# sandbox); the goal 0.7x latency and 1.5x throughput.
lat_target("required: latency <= bwrap", "bwrap", 1.0)
lat_target("goal: latency <= 0.7x bwrap", "bwrap", 0.7)
lat_target("latency <= 1.5x unshare", "unshare", 1.5)
for factor, kind in ((1.0, "required"), (1.5, "goal")):
    for p in pars:
        c, w = tp[("corral", p)], tp[("bwrap", p)]
        goal = factor * w
        if c >= goal:
            print(f"  PASS  {kind}: throughput >= {factor}x bwrap at P={p}: {c:.0f}/s >= {goal:.0f}/s ({c/w:.2f}x)")
        else:
            print(f"  MISS  {kind}: throughput >= {factor}x bwrap at P={p}: {c:.0f}/s < {goal:.0f}/s ({c/w:.2f}x); "
                  f"{goal-c:.0f}/s short, needs {goal/c:.2f}x more")
print()
print(f"raw data: {out}")
PYEOF

# ---------------------------------------------------------------------------
# 6. Optional: where each launch's CPU goes, per process of the tree (by
#    fork depth below the launcher) and per kernel entry point, bubblewrap
#    next to corral. Each sample is put under the outermost system call or
#    page fault on its kernel stack, else under the library it ran in.
# ---------------------------------------------------------------------------
TIMELINE=${TIMELINE:-0}
if ((TIMELINE > 0)); then
    command -v perf >/dev/null || die "TIMELINE needs perf (Debian: linux-perf)"
    timeline() { # timeline ID ROLES CMD...: the per-step wall clock of TIMELINE launches of CMD
        local id=$1 roles=$2
        shift 2
        perf record -q -a -o "$OUT/timeline-$id.data" \
            -e sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit -- \
            bash -c 'for ((i = 0; i < $0; i++)); do "$@" </dev/null >/dev/null 2>&1; done' "$TIMELINE" "$@" 2>>"$OUT/perf.log"
        perf script -i "$OUT/timeline-$id.data" -F pid,time,event,trace \
            >"$OUT/timeline-$id.txt" 2>>"$OUT/perf.log"
        "$PY" - "$OUT/timeline-$id.txt" "$id" "$roles" "$1" <<'PYEOF' | tee -a "$OUT/report.txt"
import re, statistics, sys
path, label, roles, launcher = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].rsplit("/", 1)[-1]
parent, forked, execd, exited, kids = {}, {}, {}, {}, {}
roots = []
for line in open(path, errors="replace"):
    m = re.match(r"\s*(\d+)\s+([\d.]+):\s+sched:(\S+):\s*(.*)", line)
    if not m:
        continue
    pid, t, ev, tr = int(m.group(1)), float(m.group(2)) * 1000, m.group(3), m.group(4)
    if ev == "sched_process_fork":
        child = int(re.search(r"child_pid=(\d+)", tr).group(1))
        parent[child] = pid
        forked[child] = t
        kids.setdefault(pid, []).append(child)
    elif ev == "sched_process_exec":
        fn = re.search(r"filename=(\S+)", tr).group(1)
        execd.setdefault(pid, []).append((t, fn))
        if fn.rsplit("/", 1)[-1] == launcher:
            roots.append(pid)
    elif ev == "sched_process_exit":
        exited.setdefault(pid, t)
steps = {}
def add(name, v):
    steps.setdefault(name, []).append(v)
n = len(roles)
for root in roots:
    chain = [root]  # the launch's processes, each the first child of the one before
    while len(chain) < n and kids.get(chain[-1]):
        chain.append(kids[chain[-1]][0])
    prog = chain[-1]
    if len(chain) < n or not execd.get(prog) or prog not in exited or root not in exited:
        continue
    t0 = execd[root][0][0]
    starts = [t0] + [forked[p] for p in chain[1:]]
    for i in range(n - 1):
        add(f"{roles[i]}: until it forks the {roles[i + 1]}", starts[i + 1] - starts[i])
    add(f"{roles[-1]}: until its execve", execd[prog][-1][0] - starts[-1])
    add(f"{roles[-1]}: after its execve, until its exit", exited[prog] - execd[prog][-1][0])
    last = exited[prog]
    for i in range(n - 2, -1, -1):
        add(f"{roles[i]}: exits after the {roles[i + 1]}", exited[chain[i]] - last)
        last = exited[chain[i]]
    add("total, execve to the launcher's exit", exited[root] - t0)
print(f"\n{label}: wall-clock timeline of {len(steps.get('total, execve to the launcher' + chr(39) + 's exit', []))} launches (median ms; sched tracepoints only)")
for name, vs in steps.items():
    print(f"  {name:<48}{statistics.median(vs):7.2f}")
PYEOF
    }
    timeline bwrap outer,pid1,program $BWRAP /bin/true
    timeline corral parent,init,program $CORRAL_RUN true
fi

PHASES=${PHASES:-0}
((PHASES > 0)) || exit 0
command -v perf >/dev/null || die "PHASES needs perf (Debian: linux-perf)"
phase() { # phase ID ROLES CMD...: record PHASES launches of CMD, print the breakdown
    local id=$1 roles=$2
    shift 2
    perf record -q -o "$OUT/phases-$id.data" -e cpu-clock -F 10000 -g -- \
        bash -c 'for ((i = 0; i < $0; i++)); do "$@" </dev/null >/dev/null 2>&1; done' "$PHASES" "$@" 2>>"$OUT/perf.log"
    perf script -i "$OUT/phases-$id.data" --show-task-events -F comm,pid,tid,ip,sym,dso \
        >"$OUT/phases-$id.txt" 2>>"$OUT/perf.log"
    "$PY" - "$OUT/phases-$id.txt" "$PHASES" "$id" "$roles" <<'PYEOF' | tee -a "$OUT/report.txt"
import re, sys, collections
n, label, roles = int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
parent, comm, samples, cur, stack = {}, {}, [], None, []
def flush():
    if cur:
        samples.append((cur[0], cur[1], list(stack)))
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"PERF_RECORD_FORK\((\d+):\d+\):\((\d+):\d+\)", line)
    if m:
        parent[int(m.group(1))] = int(m.group(2))
        continue
    if "PERF_RECORD" in line:
        continue
    if not line.strip():
        flush(); cur, stack = None, []
        continue
    if not line[0].isspace():
        flush(); stack = []
        f = line.split()
        pid = int(f[1].split("/")[0])
        cur = (f[0], pid); comm[pid] = f[0]
        continue
    stack.append(line.split(None, 1)[1].strip() if len(line.split(None, 1)) == 2 else "?")
flush()
def depth(p):  # processes between p and the launcher (the bash loop)
    d = 0
    while p in parent and comm.get(parent[p]) not in (None, "bash"):
        p, d = parent[p], d + 1
    return d
per_role, buckets = collections.Counter(), collections.defaultdict(collections.Counter)
for c, pid, st in samples:
    if c == "bash":
        continue
    role = roles[min(depth(pid), len(roles) - 1)]
    if c != label.split("-")[0] and role == roles[-1]:
        role += " after exec"
    key = None
    for fr in reversed(st):
        s = fr.split(" ")[0].split("+")[0]
        mm = re.match(r"(__x64_sys_|__do_sys_)(\w+)", s)
        if mm:
            key = mm.group(2); break
        if s == "asm_exc_page_fault":
            key = "page faults"; break
    if key is None:
        top = st[0] if st else "?"
        dso = top[top.rfind("(") + 1:-1].split("/")[-1] if "(" in top else "?"
        key = "kernel, other" if "kernel" in dso else "user: " + dso
    per_role[role] += 1
    buckets[role][key] += 1
ms = lambda v: v / 10 / n  # 10 kHz samples -> ms per launch
print(f"\n{label}: CPU per launch by process ({n} launches, perf cpu-clock; includes perf overhead)")
print(f"  total {ms(sum(per_role.values())):.2f} ms")
for role, v in sorted(per_role.items(), key=lambda x: -x[1]):
    top = ", ".join(f"{k} {ms(c):.2f}" for k, c in buckets[role].most_common(6))
    print(f"  {role:<22}{ms(v):6.2f} ms   {top}")
PYEOF
}
phase bwrap outer,pid1,program $BWRAP /bin/true
phase corral parent,init,program $CORRAL_RUN true

#!/usr/bin/env bash
# Where the service's CPU goes, per execution, next to bare python3: perf
# samples every CPU (cpu-clock, call graphs) while N executions of
# `python3 -c 'print(1)'` go through `corral serve` from P keep-alive
# clients (P = max_concurrent), and again while `xargs -P P` starts the
# same python N times. Each sample is put in a group by the process it
# ran in (the program after its execve, the sandbox's own processes, the
# server's threads, kernel threads, the clients, idle), and within a
# group under the outermost system call or page fault on its kernel
# stack, or the work function of a kernel worker. The groups of a row
# add up to the machine's cores x the wall time / N: idle is part of it.
# With as many cores as P (2 and 2 by default) idle is the time a wait on
# the request's path left a core with nothing to run; with more cores the
# spare ones add to it (the script says so).
#
#   ./bench/serve-profile.sh      (N=600, P=2; CORRAL_BIN=path measures a
#                                  prebuilt binary; TOP=6 items named per
#                                  group; needs perf and root for
#                                  system-wide sampling)
# perf's own overhead is in the figures (~5%); compare rows of one run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${N:-600}
P=${P:-2}
HZ=${HZ:-2999}
TOP=${TOP:-6}
PY=/usr/bin/python3
die() { echo "serve-profile.sh: $*" >&2; exit 1; }
command -v perf >/dev/null || die "needs perf (Debian: linux-perf)"
[ "$(id -u)" -eq 0 ] || die "needs root: perf samples every CPU, and the server's cgroups need root"
# The workload's processes are told apart by their command name, which is
# the name of the file executed: the sandbox runs python3 through its
# symlink's target, so the bare row runs that file too. The clients run
# as `python3`: the two names must differ.
WORKLOAD=$(readlink -f "$PY")
[ "$(basename "$WORKLOAD")" != python3 ] ||
    die "$PY is not a symlink to a versioned python (python3.N): the program and the clients would share a command name"
# shellcheck source=bench/serve-lib.sh
source bench/serve-lib.sh
corral_bin
bench_tmp serve-profile
start_server "$BIN" "$TMP/server" "$P"
[ -n "$SERVER_ADDR" ] || die "the server did not start: $(tail -5 "$TMP/server/server.log")"
# CLIENT COUNT P: COUNT executions from P keep-alive clients (a command, so
# that perf can run it too).
CLIENT=(env PYTHONPATH=bench "$PY" -c 'import sys; from serve_clients import run_executions
run_executions(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))' "$SERVER_ADDR")
"${CLIENT[@]}" $((4 * P)) "$P"   # the server's sandboxes built ahead, its caches warm
record() { # NAME CMD...: perf record of every CPU while CMD runs
    local name=$1
    shift
    # cpu-clock, not cycles: a halted CPU's idle time is sampled too.
    # --strict-freq: a rate above kernel.perf_event_max_sample_rate fails
    # instead of being lowered, which would scale every figure wrongly.
    perf record -q -a -g -e cpu-clock -F "$HZ" --strict-freq -o "$TMP/$name.data" -- "$@" \
        2>>"$TMP/perf.log" >/dev/null ||
        die "perf record, or the $name row's commands under it, failed: $(tail -3 "$TMP/perf.log")"
    perf script -i "$TMP/$name.data" -F comm,pid,tid,ip,sym >"$TMP/$name.txt" 2>>"$TMP/perf.log" ||
        die "perf script failed for $name: $(tail -3 "$TMP/perf.log")"
}
echo "service CPU per execution: N=$N, P=$P (= max_concurrent), $(nproc) cores, kernel $(uname -r), $(date -u '+%F %H:%M UTC')"
[ "$(nproc)" -eq "$P" ] ||
    echo "NOTE: $(nproc) cores for P=$P: idle includes the cores the executions never need"
record bare sh -c "seq $N | xargs -P $P -I{} $WORKLOAD -c 'print(1)'"
record corral "${CLIENT[@]}" "$N" "$P"
"$PY" - "$TMP" "$N" "$HZ" "$SERVER_PID" "$(basename "$WORKLOAD")" "$TOP" <<'PYEOF'
import collections, re, sys
tmp, n, hz, server, workload = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
top_n = int(sys.argv[6])
KTHREAD = re.compile(r"(kworker|ksoftirqd|rcu|migration|kdamond|kcompactd|khugepaged|kswapd|irq/)")
CLIENTS = {"python3", "xargs", "seq", "sh"}

def group(comm, pid):
    if comm == workload:
        return "the program (python3)"
    if comm.startswith("swapper"):
        return "idle"
    if pid == server:
        return "server threads"
    if KTHREAD.match(comm):
        return "kernel threads"
    if comm in CLIENTS:
        return "clients (HTTP / xargs)"
    if comm == "exe" or comm.startswith(("memfd:", "corral")):
        return "sandbox processes"
    return "other"

ENTRY = ("x64_sys_call", "do_syscall_64")

def bucket(frames):
    """A kernel worker's work function, else the outermost system call or
    page fault on the kernel stack (perf lists the innermost frame first),
    else user/kernel."""
    syms = [s for _, s in frames]
    if "process_one_work" in syms:
        i = syms.index("process_one_work")
        return syms[i - 1] if i > 0 else "work"
    for i in range(len(syms) - 1, -1, -1):
        if syms[i] == "asm_exc_page_fault":
            return "page faults"
        if syms[i] in ENTRY:
            j = i - 1
            while j >= 0 and syms[j] in ENTRY:
                j -= 1
            name = syms[j] if j >= 0 else "system call"
            return re.sub(r"^(__x64_sys_|__do_sys_|__se_sys_|ksys_)", "", name)
    kernel = frames and frames[0][0].startswith("ffff")
    return "kernel, other" if kernel else "user"

def load(name):
    per = collections.Counter()
    sub = collections.defaultdict(collections.Counter)
    head, frames = None, []
    def flush():
        if head is None:
            return
        g = group(*head)
        b = bucket(frames)
        if g == "kernel threads" and b == "kernel, other":
            b = re.split(r"[/:]", head[0])[0]  # softirqs, RCU: the thread's name
        if g == "the program (python3)":
            g += ", kernel" if b != "user" else ", user"
        per[g] += 1
        sub[g][b] += 1
    for line in open(f"{tmp}/{name}.txt", errors="replace"):
        if not line.strip():
            flush()
            head, frames = None, []
        elif not line[0].isspace():
            flush()
            m = re.match(r"(.*?)\s+(\d+)/(\d+)\s*$", line.rstrip())
            head, frames = ((m.group(1).strip(), m.group(2)) if m else ("?", "?")), []
        else:
            parts = line.split(None, 1)
            frames.append((parts[0], parts[1].strip() if len(parts) > 1 else "?"))
    flush()
    return per, sub

ms = lambda samples: samples / hz / n * 1000
rows = {name: load(name) for name in ("bare", "corral")}
order = ["the program (python3), user", "the program (python3), kernel", "sandbox processes",
         "server threads", "kernel threads", "clients (HTTP / xargs)", "idle", "other"]
print(f"{'ms of CPU per execution':<34}{'bare':>8}{'corral':>8}{'diff':>8}   corral's largest items")
for g in order:
    b, c = ms(rows["bare"][0][g]), ms(rows["corral"][0][g])
    if b == 0 and c == 0:
        continue
    top = lambda row: ", ".join(f"{k} {ms(v):.2f}" for k, v in rows[row][1][g].most_common(top_n) if ms(v) >= 0.01)
    print(f"  {g:<32}{b:8.2f}{c:8.2f}{c - b:+8.2f}   {top('corral')}")
    if g.startswith("the program") and b > 0:
        # The same program in both rows: where bare python's time goes too.
        print(f"  {'':<56}   bare: {top('bare')}")
tb, tc = (ms(sum(rows[r][0].values())) for r in ("bare", "corral"))
print(f"  {'total (cores x wall / N)':<32}{tb:8.2f}{tc:8.2f}{tc - tb:+8.2f}")
print(f"corral / bare, executions per second: {tb / tc:.2f}x (under perf)")
PYEOF

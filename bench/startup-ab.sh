#!/bin/bash
# Interleaved A/B of `corral run ... true`: two (or more) corral builds,
# `perf stat -r RUNS` of each in turn (in reverse every other round),
# PAIRS times, with the full sandbox of bench/startup.sh's profile.
# Prints elapsed time, CPU time (task-clock
# of corral and every process it starts), page faults and the whole
# machine's busy time per launch, then each binary's means.
# This VM's noise between minutes is as large as most single changes, so
# only interleaved runs like this one tell two builds apart.
#
#   ./bench/startup-ab.sh BIN_A BIN_B [BIN_C ...]
#       PAIRS=3 rounds of RUNS=200 launches per binary
set -euo pipefail
(($# >= 2)) || {
    echo "usage: $0 BIN_A BIN_B [BIN_C ...]" >&2
    exit 2
}
command -v perf >/dev/null || {
    echo "$0: needs perf (Debian: linux-perf)" >&2
    exit 1
}
PAIRS=${PAIRS:-3}
RUNS=${RUNS:-200}
TMP=$(mktemp -d /tmp/corral-startup-ab.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# The profile bench/startup.sh measures: `code` with `true` allowed.
PROFILE_TOML=$(cd "$(dirname "$0")" && pwd)/startup-profile.toml
flags=()
[ "$(id -u)" -eq 0 ] || flags+=(--allow-unenforced-limits)
for bin in "$@"; do
    "$bin" run --config "$PROFILE_TOML" --profile bench "${flags[@]}" -- true ||
        { echo "$0: $bin cannot run the benchmark's sandbox" >&2; exit 1; }
done
# Busy time of the whole machine (user, nice, system, irq, softirq,
# steal) from /proc/stat, in clock ticks: what every process of a launch
# costs, the kernel's workers included (the network namespace's cleanup,
# the cgroup's release), which perf's task-clock of corral's tree leaves out.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
tick_ms=$(awk -v hz="$(getconf CLK_TCK)" 'BEGIN { print 1000 / hz }')
bins=("$@")
sum_el=() sum_cpu=() sum_busy=()   # by position: a binary may be given twice (an A/A run)
printf '%-40s %12s %10s %8s %14s\n' binary "elapsed ms" "CPU ms" faults "machine CPU ms"
for ((round = 1; round <= PAIRS; round++)); do
    # Every other round in reverse: a build that always ran right after
    # another would meet that one's leftovers (its namespaces' cleanup in
    # the kernel's workers) at its own start.
    order=("${!bins[@]}")
    if ((round % 2 == 0)); then
        mapfile -t order < <(printf '%s\n' "${!bins[@]}" | tac)
    fi
    for i in "${order[@]}"; do
        bin=${bins[$i]}
        perf stat -r "$RUNS" -x, -e task-clock,page-faults -o "$TMP/stat" -- \
            "$bin" run --config "$PROFILE_TOML" --profile bench "${flags[@]}" -- true >/dev/null
        # perf's -x output has no elapsed time: a second, plain run for it,
        # which the machine's busy time is also taken around.
        before=$(busy_ticks)
        perf stat -r "$RUNS" -o "$TMP/elapsed" -- \
            "$bin" run --config "$PROFILE_TOML" --profile bench "${flags[@]}" -- true >/dev/null
        after=$(busy_ticks)
        el=$(awk '/elapsed/ { print $1 * 1000 }' "$TMP/elapsed")
        cpu=$(awk -F, '/task-clock/ { print $1 }' "$TMP/stat")
        faults=$(awk -F, '/page-faults/ { print $1 }' "$TMP/stat")
        busy=$(awk -v d=$((after - before)) -v t="$tick_ms" -v n="$RUNS" 'BEGIN { print d * t / n }')
        printf '%-40s %12.3f %10.3f %8d %14.3f\n' "$bin" "$el" "$cpu" "$faults" "$busy"
        sum_el[i]=$(awk -v a="${sum_el[i]:-0}" -v b="$el" 'BEGIN { print a + b }')
        sum_cpu[i]=$(awk -v a="${sum_cpu[i]:-0}" -v b="$cpu" 'BEGIN { print a + b }')
        sum_busy[i]=$(awk -v a="${sum_busy[i]:-0}" -v b="$busy" 'BEGIN { print a + b }')
    done
done
((PAIRS > 0)) || exit 0
echo "means over $PAIRS rounds:"
for i in "${!bins[@]}"; do
    awk -v bin="${bins[$i]}" -v n="$PAIRS" -v el="${sum_el[i]:-0}" -v cpu="${sum_cpu[i]:-0}" \
        -v busy="${sum_busy[i]:-0}" \
        'BEGIN { printf "%-40s %12.3f %10.3f %8s %14.3f\n", bin, el / n, cpu / n, "", busy / n }'
done

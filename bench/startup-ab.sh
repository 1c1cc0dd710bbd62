#!/bin/bash
# Interleaved A/B of `corral run ... true`: two (or more) corral builds,
# `perf stat -r RUNS` of each in turn, PAIRS times, with the full sandbox
# of bench/startup.sh's profile. Prints elapsed time, CPU time (task-clock
# of corral and every process it starts) and page faults per launch.
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
printf '%-40s %12s %10s %8s\n' binary "elapsed ms" "CPU ms" faults
for ((round = 1; round <= PAIRS; round++)); do
    for bin in "$@"; do
        perf stat -r "$RUNS" -x, -e task-clock,page-faults -o "$TMP/stat" -- \
            "$bin" run --config "$PROFILE_TOML" --profile bench "${flags[@]}" -- true >/dev/null
        # perf's -x output has no elapsed time: a second, plain run for it.
        perf stat -r "$RUNS" -o "$TMP/elapsed" -- \
            "$bin" run --config "$PROFILE_TOML" --profile bench "${flags[@]}" -- true >/dev/null
        awk -F, -v bin="$bin" -v el="$(awk '/elapsed/ { print $1 * 1000 }' "$TMP/elapsed")" '
            /task-clock/ { cpu = $1 }
            /page-faults/ { faults = $1 }
            END { printf "%-40s %12.3f %10.3f %8d\n", bin, el, cpu, faults }' "$TMP/stat"
    done
done

#!/usr/bin/env bash
# Fuzzes every parser corral runs on hostile bytes (cargo-fuzz, libFuzzer;
# the targets are in fuzz/fuzz_targets, see docs/SECURITY.md, "Fuzzing").
#
#   scripts/fuzz.sh                    # every target, 600 s each
#   FUZZ_SECONDS=60 scripts/fuzz.sh    # every target, 60 s each
#   scripts/fuzz.sh proxy_sni          # only the targets named
#
# Installs the nightly toolchain and cargo-fuzz when missing. Starts from
# the seeds in fuzz/corpus/<target>/ (read only); what libFuzzer finds goes
# to fuzz/target/corpus/<target>/, crashing inputs to fuzz/artifacts/<target>/,
# libFuzzer's output to fuzz/target/logs/<target>.log. Prints one line per
# target and exits non-zero if any target crashed, hung or did not build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:/usr/local/cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

seconds=${FUZZ_SECONDS:-600}
case "$seconds" in
    '' | *[!0-9]*) echo "scripts/fuzz.sh: FUZZ_SECONDS must be a number of seconds" >&2; exit 2 ;;
esac
logs=fuzz/target/logs
mkdir -p "$logs"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal >"$logs/install-nightly.log" 2>&1 \
        || { echo "fuzz: installing nightly failed, see $logs/install-nightly.log" >&2; exit 1; }
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install cargo-fuzz --locked >"$logs/install-cargo-fuzz.log" 2>&1 \
        || { echo "fuzz: installing cargo-fuzz failed, see $logs/install-cargo-fuzz.log" >&2; exit 1; }
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi

# Build the targets first, so a target that no longer builds fails here.
build=("")
[ "$#" -gt 0 ] && build=("${targets[@]}")
: >"$logs/build.log"
for t in "${build[@]}"; do
    (cd fuzz && cargo +nightly fuzz build $t >>"../$logs/build.log" 2>&1) \
        || { echo "fuzz: ${t:-the targets} did not build, see $logs/build.log" >&2; tail -20 "$logs/build.log" >&2; exit 1; }
done

status=0
for t in "${targets[@]}"; do
    work=fuzz/target/corpus/$t
    artifacts=fuzz/artifacts/$t
    mkdir -p "$work" "$artifacts" "fuzz/corpus/$t"
    log=$logs/$t.log
    # libFuzzer adds what it finds to the first directory only; the seeds
    # in the repository stay as they are.
    if (cd fuzz && cargo +nightly fuzz run "$t" "../$work" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
        -artifact_prefix="../$artifacts/" -print_final_stats=1) >"$log" 2>&1; then
        runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log" | tail -1)
        cov=$(sed -n 's/^#[0-9]*.*DONE *cov: \([0-9]*\).*corp: \([0-9]*\).*/cov \1, corpus \2/p' "$log" | tail -1)
        echo "fuzz: $t: ok, ${runs:-? runs}${cov:+, $cov}"
    else
        status=1
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        artifact=${artifact#../}
        echo "fuzz: $t: FAILED after ${runs:-?} runs${artifact:+, input in $artifact} (log: $log)"
        grep -m1 -E '^(==[0-9]+==ERROR|thread .* panicked|SUMMARY)' "$log" | sed 's/^/fuzz:   /' || true
    fi
done
exit $status

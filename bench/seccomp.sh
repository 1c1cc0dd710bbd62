#!/usr/bin/env bash
# What installing corral's seccomp filters costs a program's process, per
# kind of run, in microseconds: the time of the seccomp(2) calls in a
# fresh child (no_new_privs set), averaged over RUNS children.
#
#   ./bench/seccomp.sh [OTHER.rs]     RUNS=300 by default
#
# The programs are the ones this build prebuilt (build.rs writes them to
# $OUT_DIR/seccomp_programs.rs). Pass the same file of another build as
# OTHER.rs (build that commit, then `ls -t
# target/*/release/build/corral-launcher-*/out/seccomp_programs.rs`) to
# measure both side by side, interleaved, in one run.
#
# The kernel's cost is in converting and JIT-compiling each program and in
# building its action cache, for which it runs the filter once per
# syscall number with interrupts off: a longer path per number costs
# directly here. The harness is a small C program (cc is what cargo links
# with); it installs exactly the filters of each kind of run, in the order
# the program's process does.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
RUNS=${RUNS:-300}
cargo build --release -q -p corral
TARGET=${CARGO_TARGET_DIR:-target}/$(rustc --print host-tuple)
CURRENT=$(ls -t "$TARGET"/release/build/corral-launcher-*/out/seccomp_programs.rs | head -1)
OTHER=${1:-}
WORK=$(mktemp -d /tmp/corral-seccomp.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The generated Rust table -> a C header: p0..pN and their lengths, in the
# order of `Program::ALL`: main default, main default + AF_UNIX, main
# strict, main strict + AF_UNIX, init, reduced (six programs); builds
# before the clone3 answer moved into the main programs had a seventh,
# clone3, after the four main ones.
header() {
    /usr/bin/python3 - "$1" <<'EOF'
import re, sys
programs = [re.findall(r'\((\d+), (\d+), (\d+), (0x[0-9a-f]+)\)', line)
            for line in open(sys.argv[1]) if line.strip().startswith('&[')]
n = len(programs)
if n not in (6, 7):
    sys.exit(f"{sys.argv[1]}: {n} programs, expected 6 or 7 (a cross build prebuilds none)")
for i, p in enumerate(programs):
    print(f"static struct sock_filter p{i}[] = {{{','.join('{%s,%s,%s,%s}' % x for x in p)}}};")
print(f"static struct sock_filter *progs[] = {{{','.join(f'p{i}' for i in range(n))}}};")
print(f"static unsigned short lens[] = {{{','.join(f'sizeof p{i} / sizeof *p{i}' for i in range(n))}}};")
EOF
}

cat >"$WORK/install.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "programs.h"
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
/* usage: install RUNS PROGRAM...  -> mean microseconds to install them */
int main(int argc, char **argv) {
    int runs = atoi(argv[1]);
    double total = 0;
    for (int r = 0; r < runs; r++) {
        int fds[2];
        if (pipe(fds)) return perror("pipe"), 1;
        pid_t pid = fork();
        if (pid == 0) {
            double t0, took;
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) _exit(2);
            t0 = now_us();
            for (int i = 2; i < argc; i++) {
                int k = atoi(argv[i]);
                struct sock_fprog prog = {.len = lens[k], .filter = progs[k]};
                if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) _exit(3);
            }
            took = now_us() - t0;
            if (write(fds[1], &took, sizeof took) != sizeof took) _exit(4);
            _exit(0);
        }
        close(fds[1]);
        double took;
        int status;
        ssize_t got = read(fds[0], &took, sizeof took);
        close(fds[0]);
        waitpid(pid, &status, 0);
        if (got != sizeof took) {
            fprintf(stderr, "install: the child failed (status %d)\n", status);
            return 1;
        }
        total += took;
    }
    printf("%.1f\n", total / runs);
    return 0;
}
EOF
build() { # NAME PROGRAMS.rs
    header "$2" >"$WORK/programs.h"
    cc -O2 -I"$WORK" -o "$WORK/install-$1" "$WORK/install.c"
    grep -c '^static struct sock_filter p' "$WORK/programs.h" >"$WORK/count-$1"
    echo "$1: $2 ($(/usr/bin/python3 -c 'import re,sys; print(" ".join(str(len(re.findall(r"\(\d+, \d+, \d+, 0x", l))) for l in open(sys.argv[1]) if l.strip().startswith("&[")))' "$2") instructions)"
}
builds=(current)
build current "$CURRENT"
if [[ -n $OTHER ]]; then
    build other "$OTHER"
    builds=(other current)
fi

# Each kind of run installs these programs, in this order (seccomp.rs),
# by the layout of the build's table (six programs, or seven with clone3).
declare -A KINDS6=([default]="0" [default+unix]="1" [strict]="2" [reduced default]="5 0" [init]="4")
declare -A KINDS7=([default]="4 0" [default+unix]="4 1" [strict]="4 2" [reduced default]="4 6 0" [init]="5")
printf '\n%-18s' "filters (µs)"
for b in "${builds[@]}"; do printf '%10s' "$b"; done
echo
for name in default default+unix strict "reduced default" init; do
    printf '%-18s' "$name"
    for b in "${builds[@]}"; do
        if [[ $(cat "$WORK/count-$b") == 7 ]]; then
            read -ra progs <<<"${KINDS7[$name]}"
        else
            read -ra progs <<<"${KINDS6[$name]}"
        fi
        printf '%10s' "$("$WORK/install-$b" "$RUNS" "${progs[@]}")"
    done
    echo
done

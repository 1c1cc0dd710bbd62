# Sourced by bench/deploy.sh and bench/spawn.sh: a scratch directory and
# the local package registries (tests/deploy_support/registry.py on
# 127.0.0.1) they deploy from. The caller defines `spec HOST` (the
# registry's JSON spec) and sets PY before calling start_registry.

REG=$PWD/crates/corral-cli/tests/deploy_support/registry.py

# Makes $W, a fresh directory under /var/tmp (trees are bound into
# sandboxes at their own path: not under /tmp), removed on exit with the
# registries started in it.
registry_workdir() { # $1: a name for the directory
    W=$(mktemp -d "/var/tmp/corral-bench-$1.XXXXXX")
    chmod 755 "$W"
    trap registry_cleanup EXIT
}

registry_cleanup() {
    # start_registry runs in command substitutions: its processes are
    # found by their directory, not by a pid kept here.
    pkill -f "registry.py $W/" 2>/dev/null || true
    chmod -R u+w "$W" 2>/dev/null || true
    rm -rf "$W"
}

start_registry() { # $1: host name, $2: directory; prints the port
    mkdir -p "$2"
    $PY "$REG" "$2" "$(spec "$1")" > "$2.port" 2>/dev/null &
    for _ in $(seq 100); do grep -q PORT "$2.port" 2>/dev/null && break; sleep 0.05; done
    awk '{print $2}' "$2.port"
}

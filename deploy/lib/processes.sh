# Sourced (not run) by the deploy scripts that start long-running Flower processes:
#
#   source "$(dirname "$(readlink -f "$0")")/lib/processes.sh"
#   some-server & pids+=("$!")
#   wait_any; code=$?     # (under set +e) until the first of them exits, with its exit code
#
# Every process whose PID the script appends to `pids` is killed when the script exits,
# whether it ends normally, fails under `set -e`, or gets Ctrl-C (exit 130) or SIGTERM
# (exit 143, e.g. `docker stop`); the script then waits for them, so none outlives it.
# shellcheck shell=bash

pids=()

# shellcheck disable=SC2317  # called through the traps below
cleanup() {
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_any: wait until the first process in `pids` exits and return its exit code, like
# `wait -n "${pids[@]}"`, but without losing a Ctrl-C or SIGTERM. Bash runs a trap only once the
# running builtin returns, and a signal that lands just before `wait -n` starts (seen: 1 in 200
# tries) would wait for a child that never exits. So the wait also ends with a one-second tick;
# a pending trap then runs, and the wait starts again.
wait_any() {
    local finished code tick
    ((${#pids[@]})) || return 127  # nothing to wait for, as `wait -n` says
    while :; do
        sleep 1 &
        tick=$!
        finished=""
        if wait -n -p finished "${pids[@]}" "$tick"; then code=0; else code=$?; fi
        if [[ -n $finished && $finished != "$tick" ]]; then
            kill "$tick" 2>/dev/null || true
            wait "$tick" 2>/dev/null || true
            return "$code"
        fi
    done
}

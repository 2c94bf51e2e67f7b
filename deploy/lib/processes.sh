# Sourced (not run) by the deploy scripts that start long-running Flower processes:
#
#   source "$(dirname "$(readlink -f "$0")")/lib/processes.sh"
#   some-server & pids+=("$!")
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

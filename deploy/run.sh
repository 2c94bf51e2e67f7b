#!/usr/bin/env bash
# Launch one experiment on a running deployment (SuperLink + SuperNodes) and wait for it.
#
#   deploy/run.sh [--connection NAME] [--app DIR] [--experiment E] [--method M] [--seed S]
#                 [--set "dotted overrides"] [--output-dir DIR] [--resume] [--timeout SEC]
#
#   deploy/run.sh --connection fl --experiment smoke --method moon \
#       --set "server.round_timeout=300" --output-dir /srv/fl/results
#
# --connection  a [superlink.NAME] entry of $FLWR_HOME/config.toml (deploy/add_connection.sh)
#               [$FL_CONNECTION, else fl]
# --app         the app folder (pyproject.toml) shipped to the SuperLink as a FAB [repo root]
# --output-dir  where the ServerApp writes results: an absolute path ON THE MACHINE THAT RUNS
#               THE SERVERAPP (the SuperLink's SuperExec) [$FL_OUTPUT_DIR, else ./results]
# --timeout     seconds to wait for the run to finish before stopping it [86400]
#
# `flwr run --stream` exits 0 even when the run fails, so this script asks the SuperLink for
# the run's final status (`flwr list --run-id ID --format json`) and exits 0 only for
# `finished:completed`. When the output folder is readable here too, it also checks
# <output-dir>/<experiment>/<method>/seed<seed>/summary.json and prints it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
connection=${FL_CONNECTION:-fl}
app=$root
experiment=smoke
method=fedavg
seed=0
overrides=""
output_dir=${FL_OUTPUT_DIR:-$PWD/results}
resume=false
timeout_s=86400

# --- parse the command line ---------------------------------------------------------------
while [[ $# -gt 0 ]]; do
    case "$1" in
        --connection) connection="$2"; shift 2 ;;
        --app) app="$2"; shift 2 ;;
        --experiment) experiment="$2"; shift 2 ;;
        --method) method="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --set) overrides="$2"; shift 2 ;;
        --output-dir) output_dir="$2"; shift 2 ;;
        --resume) resume=true; shift ;;
        --timeout) timeout_s="$2"; shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $output_dir == /* ]] || { echo "run.sh: --output-dir must be absolute" >&2; exit 2; }
[[ $seed =~ ^[0-9]+$ ]] || { echo "run.sh: --seed must be an integer" >&2; exit 2; }
for v in "$experiment" "$method" "$output_dir"; do
    [[ $v != *"'"* ]] || { echo "run.sh: quotes are not allowed in '$v'" >&2; exit 2; }
done

# No dependency installation, telemetry or update checks from the CLI either.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

# --- submit the run and stream its logs -----------------------------------------------------
# The overrides travel in one TOML string (JSON string escaping is valid TOML).
set_toml=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$overrides")
run_config="experiment='$experiment' method='$method' seed=$seed output-dir='$output_dir' resume=$resume"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "flwr run $app $connection --stream --run-config \"$run_config\" --run-config 'set=$set_toml'"
set +e
timeout --signal=INT "$timeout_s" flwr run "$app" "$connection" --stream \
    --run-config "$run_config" --run-config "set=$set_toml" 2>&1 | tee "$log"
code=${PIPESTATUS[0]}
set -e
run_id=$(sed -n 's/.*Successfully started run \([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
if [[ -z $run_id ]]; then
    echo "run.sh: the run was not started (flwr exit code $code)" >&2
    exit 1
fi
if [[ $code -eq 124 ]]; then
    echo "run.sh: run $run_id did not finish within ${timeout_s}s; stopping it" >&2
    flwr stop "$run_id" "$connection" || true
fi

# --- ask the SuperLink for the final status (the stream may end a moment before it) ----------
status=unknown
for _ in $(seq 1 30); do
    status=$(flwr list --run-id "$run_id" "$connection" --format json 2>/dev/null |
        python3 -c 'import json, sys; r = json.load(sys.stdin).get("runs") or [{}]; print(r[0].get("status", "unknown"))' ||
        echo unknown)
    [[ $status == finished:* ]] && break
    sleep 2
done
echo "run $run_id: $status"
echo "FL_RUN_ID=$run_id"

# --- results, when the output folder is visible from here ----------------------------------
summary="$output_dir/$experiment/$method/seed$seed/summary.json"
if [[ -r $summary ]]; then
    echo "summary: $summary"
    cat "$summary"
    echo
else
    echo "results: $output_dir/$experiment/$method/seed$seed on the SuperLink's machine"
fi
[[ $status == finished:completed ]]

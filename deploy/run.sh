#!/usr/bin/env bash
# Launch one experiment on a running deployment (SuperLink + SuperNodes) and wait for it.
#
#   deploy/run.sh [--connection NAME] [--app DIR] [--experiment E] [--method M] [--seed S]
#                 [--set "dotted overrides"] [--output-dir DIR] [--resume | --fresh]
#                 [--timeout SEC]
#
#   deploy/run.sh --connection fl --experiment smoke --method moon \
#       --set "server.round_timeout=300" --output-dir /srv/fl/results
#
# --connection  a [superlink.NAME] entry of $FLWR_HOME/config.toml (deploy/add_connection.sh)
#               [$FL_CONNECTION, else fl]
# --app         the app folder (pyproject.toml) shipped to the SuperLink as a FAB [repo root]
# --output-dir  where the ServerApp writes results: an absolute path ON THE MACHINE THAT RUNS
#               THE SERVERAPP (the SuperLink's SuperExec) [$FL_OUTPUT_DIR, else ./results]
# --resume      continue the run in the output folder from its last checkpoint
# --fresh       start over where an unfinished run (with a checkpoint), or a completed run of
#               other settings, would be replaced; without --resume or --fresh the ServerApp
#               refuses to delete such a run
# --timeout     seconds to wait for the run to finish before stopping it; 0: no limit [86400]
#
# `flwr run --stream` exits 0 even when the run fails, so this script asks the SuperLink for
# the run's final status (`flwr list --run-id ID --format json`) and exits 0 only for
# `finished:completed`. When the output folder is readable here too, it also checks
# <output-dir>/<experiment>/<method>/seed<seed>/summary.json and prints it (only a summary this
# run wrote: one left by an earlier run is named as such).
#
# Before contacting the SuperLink it builds the run's configuration here as the ServerApp will
# (fl_app.config, with the app's code and the virtualenv's python3): an unknown experiment
# or method, or a bad --set, stops it with exit code 2.
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)  # also when run through a link
# shellcheck source=deploy/lib/args.sh
source "$root/deploy/lib/args.sh"
connection=${FL_CONNECTION:-fl}
app=$root
experiment=smoke
method=fedavg
seed=0
overrides=""
output_dir=${FL_OUTPUT_DIR:-$PWD/results}
resume=false
fresh=false
timeout_s=86400

# --- parse and check the command line --------------------------------------------------------
while [[ $# -gt 0 ]]; do
    case "$1" in
        --connection) need_value "$@"; connection="$2"; shift 2 ;;
        --app) need_value "$@"; app="$2"; shift 2 ;;
        --experiment) need_value "$@"; experiment="$2"; shift 2 ;;
        --method) need_value "$@"; method="$2"; shift 2 ;;
        --seed) need_value "$@"; seed="$2"; shift 2 ;;
        --set) need_value "$@"; overrides="$2"; shift 2 ;;
        --output-dir) need_value "$@"; output_dir="$2"; shift 2 ;;
        --resume) resume=true; shift ;;
        --fresh) fresh=true; shift ;;
        --timeout) need_value "$@"; timeout_s="$2"; shift 2 ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -n $connection ]] || die "--connection must not be empty"
[[ $resume == false || $fresh == false ]] || die "--resume and --fresh: choose one"
[[ -f $app/pyproject.toml ]] || die "--app $app is not an app folder (no pyproject.toml)"
[[ $output_dir == /* ]] || die "--output-dir must be absolute"
uint --seed "$seed"
uint --timeout "$timeout_s"
run_names "$experiment" "$method" "$output_dir"
# the configuration the ServerApp will build (presets, --set), checked here first
check_run_config "$app" "$experiment" "$method" "$seed" "$overrides" >/dev/null

# No dependency installation, telemetry or update checks from the CLI either.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

# --- submit the run and stream its logs -----------------------------------------------------
# The overrides travel in one TOML string that Flower's --run-config parser reads back as
# given: it takes a quoted value up to the next quote of the same kind, so a "basic" string
# (JSON escaping is valid TOML) when --set holds no ", else a 'literal' one (as the launcher's
# fl_app.launch.run_config_string does).
set_toml=$(python3 -c '
import json, sys
v = sys.argv[1]
if chr(34) not in v:
    print(json.dumps(v, ensure_ascii=False).replace(chr(127), "\\u007f"))
elif chr(39) not in v and v.isprintable():
    print(chr(39) + v + chr(39))
else:
    print("run.sh: --set holds both kinds of quotes, which flwr run --run-config cannot pass on: use one kind only", file=sys.stderr)
    sys.exit(2)
' "$overrides") || exit 2
run_config="experiment='$experiment' method='$method' seed=$seed output-dir='$output_dir' resume=$resume fresh=$fresh"
log=$(mktemp)
since=$(mktemp)  # the submission's time: only a summary.json at least as new is this run's
trap 'rm -f "$log" "$since"' EXIT
# Ctrl-C / SIGTERM: the run is stopped on the SuperLink (a run left going there would hold its
# output folder), and the script ends at once (130 / 143) instead of polling for a status.
# `timeout --foreground` keeps flwr in this job's process group, where a Ctrl-C reaches it.
stopped=""
trap 'stopped=130' INT
trap 'stopped=143' TERM
echo "flwr run $app $connection --stream --run-config \"$run_config\" --run-config 'set=$set_toml'"
set +e
timeout --foreground --signal=INT "$timeout_s" flwr run "$app" "$connection" --stream \
    --run-config "$run_config" --run-config "set=$set_toml" 2>&1 | tee "$log"
code=${PIPESTATUS[0]}
set -e
run_id=$(sed -n 's/.*Successfully started run \([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
if [[ -n $stopped ]]; then
    if [[ -n $run_id ]]; then
        echo "run.sh: interrupted; stopping run $run_id" >&2
        timeout 30 flwr stop "$run_id" "$connection" >/dev/null 2>&1 ||
            echo "run.sh: could not stop run $run_id (SuperLink unreachable?): flwr stop $run_id $connection" >&2
    fi
    exit "$stopped"
fi
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
    [[ -z $stopped ]] || exit "$stopped"
    status=$(timeout 20 flwr list --run-id "$run_id" "$connection" --format json 2>/dev/null |
        python3 -c 'import json, sys; r = json.load(sys.stdin).get("runs") or [{}]; print(r[0].get("status", "unknown"))' ||
        echo unknown)
    [[ $status == finished:* ]] && break
    sleep 2
done
echo "run $run_id: $status"
echo "FL_RUN_ID=$run_id"

# --- results, when the output folder is visible from here ----------------------------------
summary="$output_dir/$experiment/$method/seed$seed/summary.json"
if [[ -r $summary && ! $since -nt $summary ]]; then
    echo "summary: $summary"
    cat "$summary"
    echo
elif [[ -r $summary ]]; then
    echo "results: $output_dir/$experiment/$method/seed$seed (its summary.json is an earlier run's)"
else
    echo "results: $output_dir/$experiment/$method/seed$seed on the SuperLink's machine"
fi
[[ $status == finished:completed ]]

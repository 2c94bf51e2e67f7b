#!/usr/bin/env bash
# Start one SuperNode (one data holder, e.g. one GPU machine) and the SuperExec that runs
# its ClientApps, in the foreground (Ctrl-C / SIGTERM stops both).
#
#   deploy/start_supernode.sh --superlink HOST:9092 --partition-id I --num-partitions N \
#       --ca certs/ca.crt --key keys/node-I [--device cuda:0] [--state-dir DIR] \
#       [--data-dir DIR] [--port 9094]
#   deploy/start_supernode.sh --insecure --superlink 127.0.0.1:9092 ...   # local test only
#
# --superlink       the SuperLink's address; must be a name in its certificate
# --partition-id    which partition of the shared dataset this node trains on (0..N-1)
# --num-partitions  N, the experiment's num_clients
# --device          auto | cpu | cuda | cuda:K: where this node's ClientApps train; it
#                   overrides the run's client.device [the run's client.device, whose
#                   default auto trains on this machine's GPU when it has one]
# --state-dir       client state that must survive restarts (MOON/PMFL models), per run
#                   [$HOME/.contrastive-fl/node-I]; keep it when restarting the node
# --data-dir        optional: a folder with this node's own train.npz/test.npz (arrays x:
#                   uint8 (N,C,H,W), y) instead of a partition of the shared dataset
# --ca              ca.crt of the federation (docker/make_certs.sh)
# --key             this node's private key (docker/make_node_keys.sh), registered at the
#                   SuperLink with `flwr supernode register KEY.pub CONNECTION`
# --port            the SuperNode's Runtime API port, on 127.0.0.1 only (its SuperExec);
#                   unique per machine: 9094, 9095, ... for several nodes on one host [9094]
set -euo pipefail

# --- the command line, checked before anything is created -----------------------------------
# shellcheck source=deploy/lib/args.sh
source "$(dirname "$(readlink -f "$0")")/lib/args.sh"
superlink=""
pid=""
num=""
device=""
state_dir=""
data_dir=""
ca=""
key=""
port=9094
insecure=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --superlink) need_value "$@"; superlink="$2"; shift 2 ;;
        --partition-id) need_value "$@"; pid="$2"; shift 2 ;;
        --num-partitions) need_value "$@"; num="$2"; shift 2 ;;
        --device) need_value "$@"; device="$2"; shift 2 ;;
        --state-dir) need_value "$@"; state_dir="$2"; shift 2 ;;
        --data-dir) need_value "$@"; data_dir="$2"; shift 2 ;;
        --ca) need_value "$@"; ca="$2"; shift 2 ;;
        --key) need_value "$@"; key="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -n $superlink ]] || die "--superlink HOST:PORT is required"
[[ -n $pid ]] || die "--partition-id I is required"
[[ -n $num ]] || die "--num-partitions N is required"
uint --partition-id "$pid"
positive --num-partitions "$num"
((pid < num)) || die "--partition-id must be below --num-partitions (0..$((num - 1))), got $pid"
[[ -z $device || $device =~ ^(auto|cpu|cuda|cuda:[0-9]+)$ ]] || die "--device must be auto, cpu, cuda or cuda:K"
port_number --port "$port"
if [[ -n $data_dir ]]; then
    [[ -r $data_dir/train.npz ]] || die "$data_dir/train.npz not found"
    data_dir=$(cd "$data_dir" && pwd)
fi
if [[ $insecure -eq 0 ]]; then
    [[ -r $ca ]] || die "--ca FILE (the federation's ca.crt) is required (or --insecure)"
    [[ -r $key ]] || die "--key FILE (this node's private key) is required (or --insecure)"
    ca=$(cd "$(dirname "$ca")" && pwd)/$(basename "$ca")    # absolute: the node runs
    key=$(cd "$(dirname "$key")" && pwd)/$(basename "$key") # from --state-dir
fi

# --- environment: never install dependencies at run time, no telemetry ----------------------
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
for exe in flower-supernode flower-superexec; do
    command -v "$exe" >/dev/null || die "$exe not found (activate the venv)"
done

# --- state folder and node config ------------------------------------------------------------------
state_dir=${state_dir:-$HOME/.contrastive-fl/node-$pid}
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)  # the ClientApp runs elsewhere: absolute paths only
node_config="partition-id=$pid num-partitions=$num state-dir='$state_dir'"
[[ -z $device ]] || node_config+=" device='$device'"
[[ -z $data_dir ]] || node_config+=" data-dir='$data_dir'"

# --- TLS and authentication -------------------------------------------------------------------------
if [[ $insecure -eq 1 ]]; then
    echo "WARNING: --insecure: plain HTTP to the SuperLink; use on one machine only" >&2
    link_flags=(--insecure)
else
    link_flags=(--root-certificates "$ca" --auth-supernode-private-key "$key")
fi

# --- shared secret between this SuperNode and its SuperExec --------------------------------------
secret="$state_dir/superexec.secret"
if [[ ! -s $secret ]]; then
    (umask 077 && openssl rand -hex 32 | tr -d '\n' >"$secret")
fi

# --- stop both processes on exit ---------------------------------------------------------------------
# shellcheck source=deploy/lib/processes.sh
source "$(dirname "$(readlink -f "$0")")/lib/processes.sh"

# --- SuperNode: connects out to the SuperLink; Runtime API on 127.0.0.1:PORT --------------------
cd "$state_dir"
flower-supernode --isolation process --superlink "$superlink" "${link_flags[@]}" \
    --superexec-auth-secret-file "$secret" --host 127.0.0.1 --port "$port" \
    --node-config "$node_config" &
node_pid=$!
pids+=("$node_pid")

# --- SuperExec: runs one flwr-clientapp process per message (exits with the SuperNode) ----------
flower-superexec --insecure --runtime-api-address "127.0.0.1:$port" \
    --superexec-auth-secret-file "$secret" --parent-pid "$node_pid" &
pids+=("$!")
echo "SuperNode for partition $pid/$num, device ${device:-from client.device} -> $superlink (state in $state_dir)"

# --- run until one of them exits ---------------------------------------------------------------------
set +e
wait_any
code=$?
set -e
echo "start_supernode.sh: a process exited with code $code; stopping" >&2
exit "$code"

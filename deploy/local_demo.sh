#!/usr/bin/env bash
# A whole federation as separate processes on this machine, with TLS and SuperNode
# authentication exactly as on several machines: creates certificates and node keys,
# starts a SuperLink and N SuperNodes (each with its own SuperExec), registers the keys,
# runs one experiment with deploy/run.sh, then stops everything.
#
#   deploy/local_demo.sh [--nodes 3] [--experiment smoke] [--method fedavg] [--seed 0]
#                        [--set "dotted overrides"] [--dir DIR] [--port 9092]
#                        [--node-port 9094]
#
#   deploy/local_demo.sh --method moon --set "num_rounds=2 data.train_subset=3000"
#
# --nodes      number of SuperNodes = the experiment's num_clients (smoke: 3)
# --dir        working folder: certs/, keys/, superlink/, node-I/, flwr-home/, logs/ and
#              results/ [/tmp/contrastive-fl-local]
# --port       SuperLink port [9092]
# --node-port  SuperNode I serves its SuperExec on 127.0.0.1:(node-port + I) [9094]
#
# Run it from the repository with the project's virtualenv active (make install).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
nodes=3
experiment=smoke
method=fedavg
seed=0
overrides=""
dir=/tmp/contrastive-fl-local
port=9092
node_port=9094
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) nodes="$2"; shift 2 ;;
        --experiment) experiment="$2"; shift 2 ;;
        --method) method="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --set) overrides="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --node-port) node_port="$2"; shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "local_demo.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$dir/logs"
dir=$(cd "$dir" && pwd)
export FLWR_HOME="$dir/flwr-home"  # a private Flower home: your ~/.flwr stays untouched

# --- stop every process started here on exit -------------------------------------------------
# shellcheck source=deploy/lib/processes.sh
source "$root/deploy/lib/processes.sh"

# --- 1. TLS certificate for 127.0.0.1 and one key pair per SuperNode --------------------------
names=()
for ((i = 0; i < nodes; i++)); do names+=("node-$i"); done
"$root/docker/make_certs.sh" --out "$dir/certs" 127.0.0.1 localhost >"$dir/logs/certs.log" 2>&1
"$root/docker/make_node_keys.sh" --out "$dir/keys" "${names[@]}" >"$dir/logs/keys.log"

# --- 2. SuperLink (+ its SuperExec), listening on this machine only ----------------------------
"$root/deploy/start_superlink.sh" --certs "$dir/certs" --host 127.0.0.1 --port "$port" \
    --state-dir "$dir/superlink" >"$dir/logs/superlink.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 60); do
    grep -q "SuperLink listening" "$dir/logs/superlink.log" && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$dir/logs/superlink.log" >&2; exit 1; }
    sleep 1
done
grep -q "SuperLink listening" "$dir/logs/superlink.log" || { echo "SuperLink did not start" >&2; exit 1; }
echo "SuperLink up on 127.0.0.1:$port (log: $dir/logs/superlink.log)"

# --- 3. the CLI connection and the registration of every node key -------------------------------
"$root/deploy/add_connection.sh" --name local-tls --address "127.0.0.1:$port" \
    --root-certificates "$dir/certs/ca.crt" >/dev/null
"$root/docker/make_node_keys.sh" --out "$dir/keys" --register local-tls "${names[@]}"

# --- 4. SuperNodes, one partition each ------------------------------------------------------------
for ((i = 0; i < nodes; i++)); do
    "$root/deploy/start_supernode.sh" --superlink "127.0.0.1:$port" --partition-id "$i" \
        --num-partitions "$nodes" --ca "$dir/certs/ca.crt" --key "$dir/keys/node-$i" \
        --port "$((node_port + i))" --state-dir "$dir/node-$i" >"$dir/logs/node-$i.log" 2>&1 &
    pids+=("$!")
done
echo "$nodes SuperNodes started (logs: $dir/logs/node-*.log)"

# --- 5. the experiment -------------------------------------------------------------------------------
"$root/deploy/run.sh" --connection local-tls --app "$root" --experiment "$experiment" \
    --method "$method" --seed "$seed" --set "$overrides" --output-dir "$dir/results"

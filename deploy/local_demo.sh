#!/usr/bin/env bash
# A whole federation as separate processes on this machine, with TLS and SuperNode
# authentication exactly as on several machines: creates certificates and node keys,
# starts a SuperLink and N SuperNodes (each with its own SuperExec), registers the keys,
# runs one experiment with deploy/run.sh, then stops everything.
#
#   deploy/local_demo.sh [--nodes 3] [--experiment smoke] [--method fedavg] [--seed 0]
#                        [--set "dotted overrides"] [--dir DIR] [--port 9092]
#                        [--node-port 9094] [--resume | --fresh]
#
#   deploy/local_demo.sh --method moon --set "num_rounds=2 data.train_subset=3000"
#
# --nodes      number of SuperNodes = the experiment's num_clients (smoke: 3)
# --dir        working folder: certs/, keys/, superlink/, node-I/, flwr-home/, logs/ and
#              results/ [/tmp/contrastive-fl-local]
# --port       SuperLink port [9092]
# --node-port  SuperNode I serves its SuperExec on 127.0.0.1:(node-port + I) [9094]
# --resume     continue the run that an earlier demo in the same --dir left unfinished
# --fresh      start it over instead (without either, such a run is not replaced: run.sh), or
#              replace a completed run of the same method and seed made with another --set
#
# Run it from the repository with the project's virtualenv active (make install).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)  # also when run through a link
# shellcheck source=deploy/lib/args.sh
source "$root/deploy/lib/args.sh"
nodes=3
experiment=smoke
method=fedavg
seed=0
overrides=""
dir=/tmp/contrastive-fl-local
port=9092
node_port=9094
run_flags=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
        --experiment) need_value "$@"; experiment="$2"; shift 2 ;;
        --method) need_value "$@"; method="$2"; shift 2 ;;
        --seed) need_value "$@"; seed="$2"; shift 2 ;;
        --set) need_value "$@"; overrides="$2"; shift 2 ;;
        --dir) need_value "$@"; dir="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --node-port) need_value "$@"; node_port="$2"; shift 2 ;;
        --resume | --fresh) run_flags+=("$1"); shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done

# --- check everything before the first certificate is made or process started -----------------
positive --nodes "$nodes"
uint --seed "$seed"
port_number --port "$port"
port_number --node-port "$node_port"
((node_port + nodes - 1 <= 65535)) ||
    die "--node-port $node_port + --nodes $nodes: the last SuperNode's port would be above 65535"
((port < node_port || port >= node_port + nodes)) ||
    die "--port $port is one of the SuperNodes' ports $node_port..$((node_port + nodes - 1)) (--node-port)"
[[ -n $dir ]] || die "--dir must not be empty"
((${#run_flags[@]} <= 1)) || die "--resume and --fresh: choose one"
run_names "$experiment" "$method" "$dir"
# the ServerApp's own configuration check (presets, --set), and num_clients = --nodes: every
# SuperNode is one client, and the run would wait for nodes that are never started
# (and what the run would do to an earlier demo's results in --dir: refused before anything
# starts where the ServerApp would refuse it after the SuperLink and SuperNodes are up)
clients=$(check_run_config "$root" "$experiment" "$method" "$seed" "$overrides" \
    "$(realpath -m "$dir")/results" "${run_flags[@]}")
if [[ -n $clients && $clients != "$nodes" ]]; then
    die "--nodes $nodes, but experiment $experiment with method $method has num_clients=$clients" \
        "(one SuperNode per client): use --nodes $clients, or --set \"num_clients=$nodes\""
fi
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
node_pids=()
start_node() {  # start_node I: SuperNode I in the background (its pid in node_pids[I])
    "$root/deploy/start_supernode.sh" --superlink "127.0.0.1:$port" --partition-id "$1" \
        --num-partitions "$nodes" --ca "$dir/certs/ca.crt" --key "$dir/keys/node-$1" \
        --port "$((node_port + $1))" --state-dir "$dir/node-$1" >>"$dir/logs/node-$1.log" 2>&1 &
    node_pids[$1]=$!
    pids+=("$!")
}
for ((i = 0; i < nodes; i++)); do
    : >"$dir/logs/node-$i.log"
    start_node "$i"
done
# A SuperNode started again soon after an earlier demo in this --dir stopped cannot activate
# while the SuperLink still counts that node's earlier session as online (until its heartbeat
# expires, about a minute): it exits ("Failed to activate SuperNode"), and is started again
# here until every node is activated.
deadline=$((SECONDS + 180))
until (($(grep -c "Activated node_id" "$dir/logs/superlink.log") >= nodes)); do
    if ((SECONDS >= deadline)); then
        die "not every SuperNode was activated within 180 s (logs: $dir/logs/node-*.log)"
    fi
    stopped_nodes=()
    for ((i = 0; i < nodes; i++)); do
        kill -0 "${node_pids[i]}" 2>/dev/null || stopped_nodes+=("$i")
    done
    if ((${#stopped_nodes[@]})); then
        echo "SuperNode(s) ${stopped_nodes[*]} stopped before being activated (the SuperLink may" \
            "still count an earlier session as online); starting them again in 10 s"
        sleep 10
        for i in "${stopped_nodes[@]}"; do start_node "$i"; done
    fi
    sleep 1
done
echo "$nodes SuperNodes started and activated (logs: $dir/logs/node-*.log)"

# --- 5. the experiment -------------------------------------------------------------------------------
"$root/deploy/run.sh" --connection local-tls --app "$root" --experiment "$experiment" \
    --method "$method" --seed "$seed" --set "$overrides" --output-dir "$dir/results" \
    "${run_flags[@]}"

#!/usr/bin/env bash
# Start the SuperLink of a federation and the SuperExec that runs its ServerApps, in the
# foreground (Ctrl-C / SIGTERM stops both). TLS and SuperNode authentication are on unless
# --insecure is given (local tests on one machine only).
#
#   deploy/start_superlink.sh --certs DIR [--host 0.0.0.0] [--port 9092] [--state-dir DIR]
#   deploy/start_superlink.sh --insecure --host 127.0.0.1      # local test, no TLS/auth
#
# --certs      folder from docker/make_certs.sh: ca.crt, server.pem, server.key (the
#              certificate must name the address SuperNodes dial, and 127.0.0.1, or the
#              --host address when it is a specific one)
# --host       address to listen on [0.0.0.0: all; 127.0.0.1: this machine only; a specific
#              address: only it, and the SuperExec and health check dial it]
# --port       the SuperLink's one port (Fleet API for SuperNodes, Control API for `flwr`,
#              Runtime API for the SuperExec) [9092]
# --state-dir  SuperLink database (registered SuperNode keys, runs), SuperExec secret, logs
#              [$HOME/.contrastive-fl/superlink]
# --no-auth    TLS without SuperNode authentication (any SuperNode may join)
#
# Processes:
#   flower-superlink --isolation process ... (the database keeps registered keys and node
#       ids across restarts; SuperNodes reconnect by themselves)
#   flower-superexec --runtime-api-address HOST:PORT ... (starts one flwr-serverapp
#       process per run; its working directory is --state-dir, so give runs an absolute
#       output-dir)
set -euo pipefail

# --- the command line, checked before anything is created -----------------------------------
# shellcheck source=deploy/lib/args.sh
source "$(dirname "$(readlink -f "$0")")/lib/args.sh"
certs=""
host=0.0.0.0
port=9092
state_dir=${HOME}/.contrastive-fl/superlink
insecure=0
auth=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --certs) need_value "$@"; certs="$2"; shift 2 ;;
        --host) need_value "$@"; host="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --state-dir) need_value "$@"; state_dir="$2"; shift 2 ;;
        --insecure) insecure=1; auth=0; shift ;;
        --no-auth) auth=0; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -n $host ]] || die "--host must not be empty"
port_number --port "$port"
[[ -n $state_dir ]] || die "--state-dir must not be empty"
if [[ $insecure -eq 0 ]]; then
    [[ -n $certs ]] || die "--certs DIR is required (or --insecure)"
    [[ -d $certs ]] || die "--certs $certs: no such certificates folder; create it with" \
        "docker/make_certs.sh --out $certs NAME... (every name and address that SuperNodes and" \
        "the flwr CLI dial, e.g. 127.0.0.1 localhost on one machine; docs/deployment.md)"
    certs=$(cd "$certs" && pwd)
    for f in ca.crt server.pem server.key; do
        [[ -r $certs/$f ]] || { echo "start_superlink.sh: missing $certs/$f (docker/make_certs.sh)" >&2; exit 1; }
    done
fi

# --- environment: never install dependencies at run time, no telemetry ----------------------
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
for exe in flower-superlink flower-superexec; do
    command -v "$exe" >/dev/null || { echo "start_superlink.sh: $exe not found (activate the venv)" >&2; exit 1; }
done

# --- state folder and the SuperExec <-> SuperLink shared secret ------------------------------
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)
secret="$state_dir/superexec.secret"
if [[ ! -s $secret ]]; then
    (umask 077 && openssl rand -hex 32 | tr -d '\n' >"$secret")
fi

# --- TLS / authentication flags ----------------------------------------------------------------
# the address this machine's health check and SuperExec dial: the listening one, or loopback
# when listening on every interface
dial=$host
[[ $host == 0.0.0.0 || $host == "::" ]] && dial=127.0.0.1
link_tls=()
exec_tls=()
health_url="http://$dial:$port/health"
health_ca=""
if [[ $insecure -eq 1 ]]; then
    echo "WARNING: --insecure: no TLS and no SuperNode authentication; use on one machine only" >&2
    link_tls=(--insecure)
    exec_tls=(--insecure)
else
    link_tls=(--ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/server.pem" --ssl-keyfile "$certs/server.key")
    exec_tls=(--root-certificates "$certs/ca.crt")
    health_url="https://$dial:$port/health"
    health_ca="$certs/ca.crt"
    if [[ $auth -eq 1 ]]; then
        link_tls+=(--enable-supernode-auth)
    fi
fi

# --- stop both processes on exit ---------------------------------------------------------------
# shellcheck source=deploy/lib/processes.sh
source "$(dirname "$(readlink -f "$0")")/lib/processes.sh"

# --- SuperLink ------------------------------------------------------------------------------------
cd "$state_dir"
flower-superlink --isolation process --host "$host" --port "$port" "${link_tls[@]}" \
    --superexec-auth-secret-file "$secret" --database "$state_dir/state.db" \
    --disable-runtime-dependency-installation &
link_pid=$!
pids+=("$link_pid")

# Wait until its HTTPS endpoint answers (at most 60 s).
python3 - "$health_url" "$health_ca" <<'PY'
import ssl
import sys
import time
import urllib.request

url, ca = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile=ca) if ca else None
deadline = time.monotonic() + 60
while True:
    try:
        urllib.request.urlopen(url, timeout=5, context=ctx)
        break
    except OSError as err:
        if time.monotonic() > deadline:
            sys.exit(f"SuperLink not healthy after 60 s: {err}")
        time.sleep(1)
PY

# --- SuperExec for the ServerApp (exits with the SuperLink: --parent-pid) ---------------------------
flower-superexec --runtime-api-address "$dial:$port" "${exec_tls[@]}" \
    --superexec-auth-secret-file "$secret" --parent-pid "$link_pid" &
pids+=("$!")
echo "SuperLink listening on $host:$port (state in $state_dir); Ctrl-C stops it"

# --- run until one of them exits ------------------------------------------------------------------
set +e
wait_any
code=$?
set -e
echo "start_superlink.sh: a process exited with code $code; stopping" >&2
exit "$code"

#!/usr/bin/env bash
# Entry point of the docker-compose `cli` and `register-nodes` services: writes the `flwr`
# connection of the demo into $FLWR_HOME/config.toml, then runs the given command.
#
# Environment (defaults in brackets):
#   FL_CONNECTION  name of the connection                              [fl]
#   FL_SUPERLINK   SuperLink address host:port                         [superlink:9092]
#   FL_CA          CA certificate that signed the SuperLink's cert     [/srv/fl/pki/public/ca.crt]
#   FLWR_HOME      Flower's home folder (config, FAB cache)            [~/.flwr]
#
#   docker compose run --rm cli flwr supernode list fl
#   docker compose run --rm cli /app/deploy/run.sh --connection fl --experiment smoke
set -euo pipefail

if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ $# -eq 0 ] && exit 2 || exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
"$here/../deploy/add_connection.sh" \
    --name "${FL_CONNECTION:-fl}" \
    --address "${FL_SUPERLINK:-superlink:9092}" \
    --root-certificates "${FL_CA:-/srv/fl/pki/public/ca.crt}" \
    --default >/dev/null
exec "$@"

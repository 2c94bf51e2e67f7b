#!/usr/bin/env bash
# The docker-compose demo, run for real: build the image, start the federation of
# docker/docker-compose.yml (SuperLink, three SuperNodes and their SuperExecs, TLS and
# SuperNode authentication), run an experiment with `flwr run` (deploy/run.sh in the `cli`
# service), print its summary, and take everything down again.
#
#   docker/demo.sh [demo] [-- RUN.SH OPTIONS...]   all of it (the default); down -v at the
#                                                  end, also after a failure or Ctrl-C
#   docker/demo.sh build                           the engine and the image only
#   docker/demo.sh up                              build, then start the federation (left up)
#   docker/demo.sh run [-- RUN.SH OPTIONS...]      a run on the federation that is up
#   docker/demo.sh down                            docker compose down -v (keys, state, results)
#
# RUN.SH OPTIONS are deploy/run.sh's [--experiment smoke --method fedavg by default]; the
# results go to the `results` volume (/srv/fl/results), e.g.
#   docker/demo.sh -- --method moon --set "num_rounds=2"
#
# The image is built without any registry by default: a base image from this machine's
# Debian mirror (docker/base_image.sh, once per machine) and the wheels of this machine's
# pip (docker/wheelhouse.sh, once per set of requirements), served to the build on the
# loopback. FL_PUBLIC_BASE=1 builds from the Dockerfile's defaults instead (Docker Hub's
# python:3.11-slim-bookworm, torch from the PyTorch CPU index), as `docker compose build`
# does elsewhere.
#
# Environment:
#   FL_IMAGE            the app image                          [contrastive-fl:cpu]
#   FL_BASE_IMAGE       the base image (docker/base_image.sh)  [contrastive-fl-base:bookworm]
#   FL_WHEELHOUSE       the wheelhouse folder       [/var/cache/contrastive-fl/wheels]
#   FL_WHEELHOUSE_PORT  the loopback port it is served on during the build  [38765]
#   FL_PUBLIC_BASE      1: build from the public images instead (needs Docker Hub, PyPI)
#   FL_COMPOSE_PROJECT  the compose project name               [contrastive-fl]
#   FL_DOCKERD_LOG      where a dockerd this script starts logs [/var/log/contrastive-fl-dockerd.log]
#   FL_BUILD_LOCK       the lock that keeps builds one at a time [${TMPDIR:-/tmp}/contrastive-fl-build.lock]
#
# Needs the docker CLI and docker compose (the plugin, or Debian's docker-compose); when no
# engine answers and this runs as root, it starts /usr/sbin/dockerd (left running).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
image=${FL_IMAGE:-contrastive-fl:cpu}
base_image=${FL_BASE_IMAGE:-contrastive-fl-base:bookworm}
project=${FL_COMPOSE_PROJECT:-contrastive-fl}
compose_file=$root/docker/docker-compose.yml
# shellcheck source=deploy/lib/args.sh
source "$root/deploy/lib/args.sh"  # die, usage
say() { echo "demo.sh: $*"; }

action=demo
case "${1:-}" in
    demo | build | up | run | down) action=$1; shift ;;
    -h | --help) usage ;;
    -- | "") ;;
    *) die "unknown command $1 (demo, build, up, run or down; --help)" ;;
esac
[[ ${1:-} != -- ]] || shift
run_args=("$@")
if [[ ${#run_args[@]} -gt 0 && $action != demo && $action != run ]]; then
    die "$action takes no run.sh options"
fi

# --- the docker engine and compose ----------------------------------------------------------
command -v docker >/dev/null || die "no docker CLI: install Docker (apt-get install docker.io)"
engine() {
    docker info >/dev/null 2>&1 && return 0
    [[ $(id -u) -eq 0 && -x /usr/sbin/dockerd ]] ||
        die "no docker engine answers and this is not root with /usr/sbin/dockerd: start the engine (sudo dockerd &, or systemctl start docker)"
    local log=${FL_DOCKERD_LOG:-/var/log/contrastive-fl-dockerd.log}
    say "starting dockerd (log: $log)"
    nohup /usr/sbin/dockerd >"$log" 2>&1 &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && return 0
        sleep 1
    done
    tail -n 20 "$log" >&2
    die "dockerd did not answer within 60 s (log: $log)"
}
if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
    compose_cmd=(docker-compose)
else
    die "no docker compose: install the compose plugin or Debian's docker-compose (apt-get install docker-compose)"
fi
compose() { FL_IMAGE=$image "${compose_cmd[@]}" -p "$project" -f "$compose_file" "$@"; }

# --- the image ------------------------------------------------------------------------------
build() {
    local start=$SECONDS
    # One build at a time on this machine: .ci/run starts one in the background while the
    # tests run, and the compose test's build then waits for it and finds everything built.
    local lock=${FL_BUILD_LOCK:-${TMPDIR:-/tmp}/contrastive-fl-build.lock}
    exec 9>"$lock"
    if ! flock -n 9; then
        say "another build of the image runs on this machine ($lock): waiting for it"
        flock 9
    fi
    if [[ ${FL_PUBLIC_BASE:-0} == 1 ]]; then
        say "building $image from the public python:3.11-slim-bookworm and the PyTorch CPU index"
        docker build -f "$root/docker/Dockerfile" -t "$image" "$root"
    else
        "$root/docker/base_image.sh" --image "$base_image"
        "$root/docker/wheelhouse.sh"
        local wheels=${FL_WHEELHOUSE:-/var/cache/contrastive-fl/wheels} server
        # the wheelhouse on the loopback for the build (--network host), then stopped; a fixed
        # port, as the URL is part of the cache key of the build's pip layer
        local port=${FL_WHEELHOUSE_PORT:-38765}
        python3 -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null ||
            die "port 127.0.0.1:$port is taken: set FL_WHEELHOUSE_PORT to a free port (for the wheelhouse during the build)"
        python3 -m http.server --bind 127.0.0.1 --directory "$wheels" "$port" >/dev/null 2>&1 &
        server=$!
        for _ in $(seq 1 50); do
            python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null && break
            sleep 0.2
        done
        say "building $image on $base_image with the wheels of $wheels"
        local code=0
        docker build --network host -f "$root/docker/Dockerfile" \
            --build-arg "PYTHON_IMAGE=$base_image" \
            --build-arg "WHEELHOUSE_URL=http://127.0.0.1:$port/" \
            -t "$image" "$root" || code=$?
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        [[ $code -eq 0 ]] || die "docker build of $image failed (exit $code; its output above)"
    fi
    # the earlier image a rebuild left untagged (~7 GB each)
    docker image prune -f --filter label=org.opencontainers.image.title=contrastive-fl >/dev/null
    say "image $image built in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.2f GB", $1 / 1e9 }'))"
    exec 9>&-
}

# --- the federation -------------------------------------------------------------------------
up() {
    local start=$SECONDS
    say "starting the federation (project $project)"
    compose up -d --no-build
    # up -d returns once the one-shot services are done and the SuperLink is healthy; the
    # SuperNodes then connect by themselves (the run waits for them: server.wait_for_nodes)
    local svc state
    for svc in superlink superexec-serverapp supernode-0 supernode-1 supernode-2 \
        superexec-clientapp-0 superexec-clientapp-1 superexec-clientapp-2; do
        state=$(docker inspect -f '{{.State.Status}}' "$(compose ps -q "$svc")" 2>/dev/null || echo missing)
        [[ $state == running ]] || {
            compose logs --tail 30 "$svc" >&2 || true
            die "service $svc is $state after up (its log above)"
        }
    done
    say "federation up in $((SECONDS - start)) s"
}

run() {
    local start=$SECONDS
    local args=("${run_args[@]}")
    [[ ${#args[@]} -gt 0 ]] || args=(--experiment smoke --method fedavg)
    say "run: deploy/run.sh ${args[*]} --output-dir /srv/fl/results"
    local link
    link=$(compose ps -q superlink)
    [[ -n $link && $(docker inspect -f '{{.State.Status}}' "$link") == running ]] ||
        die "the federation is not up (project $project): docker/demo.sh up"
    compose run --rm -T --no-deps cli /app/deploy/run.sh "${args[@]}" --output-dir /srv/fl/results
    say "run finished in $((SECONDS - start)) s"
}

down() {
    say "taking the federation down (volumes included)"
    compose down -v --remove-orphans
}

engine
case $action in
    build) build ;;
    up) build; up ;;
    run) run ;;
    down) down ;;
    demo)
        build
        trap 'code=$?; down; exit $code' EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        up
        run
        ;;
esac

#!/usr/bin/env bash
# One-shot initialisation of the docker-compose demo's TLS material and SuperNode keys
# (the `pki` service). Idempotent: what exists is kept, so it runs on every `up`.
#
#   docker/init_pki.sh --ca DIR --link DIR --public DIR --node DIR [--node DIR ...] \
#       [--san NAME_OR_IP ...]
#
# Each folder is its own volume, mounted only where it is needed:
#   --ca DIR      ca.key ca.crt server.pem server.key          (this service only)
#   --link DIR    ca.crt server.pem server.key superexec.secret
#                 (superlink, superexec-serverapp)
#   --public DIR  ca.crt node-*.pub                            (register-nodes, cli)
#   --node DIR    the I-th --node gets node-I (private key), node-I.pub, ca.crt and
#                 superexec.secret (supernode-I and superexec-clientapp-I)
#   --san NAME    a name or address of the SuperLink for its certificate (repeatable;
#                 localhost and 127.0.0.1 are always added)
#
# Environment:
#   FL_SUPERLINK_SANS  more names/addresses, space separated (e.g. the host's DNS name or
#                      IP when SuperNodes on other machines dial it)
#   FL_OWNER           uid:gid that must own the files when run as root [1000:1000]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ca_dir=""
link_dir=""
public_dir=""
node_dirs=()
sans=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --ca) ca_dir="$2"; shift 2 ;;
        --link) link_dir="$2"; shift 2 ;;
        --public) public_dir="$2"; shift 2 ;;
        --node) node_dirs+=("$2"); shift 2 ;;
        --san) sans+=("$2"); shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "init_pki.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [[ -z $ca_dir || -z $link_dir || -z $public_dir || ${#node_dirs[@]} -eq 0 ]]; then
    echo "init_pki.sh: need --ca, --link, --public and at least one --node" >&2
    exit 2
fi
read -r -a extra <<<"${FL_SUPERLINK_SANS:-}"
sans+=("${extra[@]}")
[[ ${#sans[@]} -gt 0 ]] || sans=(localhost)
owner=${FL_OWNER:-1000:1000}

# A random shared secret for SuperExec <-> Runtime API request signing (HMAC), kept if present.
make_secret() {
    if [[ ! -s $1 ]]; then
        (umask 077 && openssl rand -hex 32 | tr -d '\n' >"$1")
        echo "created $1"
    fi
}

mkdir -p "$ca_dir" "$link_dir" "$public_dir"

# --- CA and SuperLink certificate (docker/make_certs.sh keeps an existing CA/certificate) ---
"$here/make_certs.sh" --out "$ca_dir" "${sans[@]}"
install -m 644 "$ca_dir/ca.crt" "$link_dir/ca.crt"
install -m 644 "$ca_dir/server.pem" "$link_dir/server.pem"
install -m 600 "$ca_dir/server.key" "$link_dir/server.key"
install -m 644 "$ca_dir/ca.crt" "$public_dir/ca.crt"
make_secret "$link_dir/superexec.secret"

# --- one key pair and one SuperExec secret per SuperNode ----------------------------------------
for i in "${!node_dirs[@]}"; do
    dir=${node_dirs[$i]}
    mkdir -p "$dir"
    "$here/make_node_keys.sh" --out "$dir" "node-$i"
    install -m 644 "$dir/node-$i.pub" "$public_dir/node-$i.pub"
    install -m 644 "$ca_dir/ca.crt" "$dir/ca.crt"
    make_secret "$dir/superexec.secret"
done

# --- hand everything to the services' user (this service runs as root in compose) ---------------
if [[ $(id -u) -eq 0 ]]; then
    chown -R "$owner" "$ca_dir" "$link_dir" "$public_dir" "${node_dirs[@]}"
fi
echo "PKI ready: CA in $ca_dir, keys for ${#node_dirs[@]} SuperNodes"

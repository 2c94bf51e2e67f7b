#!/usr/bin/env bash
# Per-SuperNode authentication keys, and their registration with the SuperLink.
#
#   docker/make_node_keys.sh [--out DIR] [--force] NAME...
#       create an ECDSA (P-384) key pair for every NAME that has none yet (no NAME.pub)
#   docker/make_node_keys.sh [--out DIR] --register CONNECTION NAME...
#       also register every NAME's public key with the SuperLink of the `flwr` connection
#       CONNECTION (a [superlink.CONNECTION] entry of $FLWR_HOME/config.toml); a key that
#       is already registered is left as it is, so this can run on every start
#
#   docker/make_node_keys.sh --out keys node-0 node-1 node-2
#   docker/make_node_keys.sh --out keys --register fl node-0 node-1 node-2
#
# Files written to DIR (default: ./keys):
#   NAME          private key of SuperNode NAME. SECRET: only on that SuperNode's machine
#                 (flower-supernode --auth-supernode-private-key DIR/NAME).
#   NAME.pub      its public key (OpenSSH format): what the SuperLink operator registers
#                 (flwr supernode register DIR/NAME.pub CONNECTION). Not secret.
#   NAME.node-id  the node id the SuperLink assigned at registration (with --register);
#                 needed to unregister the key later (flwr supernode unregister ID CONN).
#
# The SuperLink must run with --enable-supernode-auth (which requires TLS): it then accepts
# only SuperNodes whose key is registered, and a registered SuperNode keeps its node id
# across restarts. Rotating a key: create a new NAME (e.g. node-0-2025b), register it,
# restart the SuperNode with the new private key, then unregister the old node id. An
# unregistered public key cannot be registered again.
set -euo pipefail

out=keys
force=0
connection=""
names=()

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit "${1:-0}"
}

# --- parse the command line -----------------------------------------------------------------
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o | --out) out="$2"; shift 2 ;;
        -f | --force) force=1; shift ;;
        -r | --register) connection="$2"; shift 2 ;;
        -h | --help) usage 0 ;;
        -*) echo "make_node_keys.sh: unknown option $1" >&2; usage 2 ;;
        *) names+=("$1"); shift ;;
    esac
done
if [[ ${#names[@]} -eq 0 ]]; then
    echo "make_node_keys.sh: give at least one SuperNode name (e.g. node-0)" >&2
    usage 2
fi
command -v ssh-keygen >/dev/null || {
    echo "make_node_keys.sh: ssh-keygen is required (Debian: apt-get install openssh-client)" >&2
    exit 1
}
mkdir -p "$out"

for name in "${names[@]}"; do
    if [[ ! $name =~ ^[A-Za-z0-9._-]+$ ]]; then
        echo "make_node_keys.sh: bad name '$name' (letters, digits, . _ - only)" >&2
        exit 2
    fi
    key="$out/$name"

    # --- key pair: ECDSA P-384 without passphrase (the SuperNode reads it unattended) -------
    # A pair is created when NAME.pub is missing. A folder holding only NAME.pub (the
    # operator's copy of a SuperNode's public key) is fine for --register.
    if [[ $force -eq 1 || ! -s $key.pub ]]; then
        rm -f "$key" "$key.pub" "$key.node-id"
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "$name" -f "$key"
        chmod 600 "$key"
        chmod 644 "$key.pub"
        echo "created $key (private) and $key.pub (public)"
    elif [[ -z $connection ]]; then  # with --register, only the registration is news
        if [[ -s $key ]]; then
            echo "keeping $key"
        else
            echo "keeping $key.pub (its private key is not in $out)"
        fi
    fi

    # --- registration with the SuperLink (idempotent) ---------------------------------------
    if [[ -n $connection ]]; then
        command -v flwr >/dev/null || { echo "make_node_keys.sh: flwr CLI not found" >&2; exit 1; }
        # `flwr ... --format json` exits 0 even on failure: read the "success" field.
        reply=$(flwr supernode register "$key.pub" "$connection" --format json 2>&1) || true
        if grep -q '"success": true' <<<"$reply"; then
            sed -n 's/.*"node-id": *\([0-9]*\).*/\1/p' <<<"$reply" >"$key.node-id"
            echo "registered $name as node $(cat "$key.node-id")"
        elif grep -q 'Public key already in use' <<<"$reply"; then
            echo "$name is already registered (or was unregistered: then create a new key)"
        else
            echo "make_node_keys.sh: registering $name failed:" >&2
            echo "$reply" >&2
            exit 1
        fi
    fi
done

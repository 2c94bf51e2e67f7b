#!/usr/bin/env bash
# Create the TLS material of a Flower federation: a private certificate authority (CA) and
# a SuperLink server certificate signed by it, valid for the given host names and addresses.
#
#   docker/make_certs.sh [--out DIR] [--days N] [--new-ca] [--force] NAME_OR_IP...
#
#   docker/make_certs.sh --out certs superlink fl.example.org 192.0.2.10
#
# Files written to DIR (default: ./certs):
#   ca.key      CA private key. SECRET: only needed to issue or renew certificates; keep it
#               off the SuperLink machine if you can. Never copy it to SuperNodes.
#   ca.crt      CA certificate (public). Every SuperNode (--root-certificates), every
#               SuperExec that talks to the SuperLink over TLS (--root-certificates) and
#               every `flwr` CLI connection (root-certificates = ...) trusts the SuperLink
#               through it.
#   server.key  SuperLink TLS private key. SECRET: only on the SuperLink (--ssl-keyfile).
#   server.pem  SuperLink TLS certificate signed by the CA (--ssl-certfile), with a
#               subjectAltName entry for every NAME_OR_IP plus localhost and 127.0.0.1.
#               The SuperLink also gets --ssl-ca-certfile ca.crt.
#
# Clients verify the name they dial against the subjectAltName list: a SuperNode started
# with `--superlink 192.0.2.10:9092` needs 192.0.2.10 in the list, one started with
# `--superlink fl.example.org:9092` needs that DNS name.
#
# Re-running keeps an existing CA (so SuperNodes need no new ca.crt) and keeps an existing
# server certificate unless --force is given (then it is re-issued, e.g. to add a name or
# renew it). --new-ca replaces the CA as well: every party then needs the new ca.crt.
set -euo pipefail

out=certs
days=825
new_ca=0
force=0
names=()

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit "${1:-0}"
}

# --- parse the command line ---------------------------------------------------------------
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o | --out) out="$2"; shift 2 ;;
        -d | --days) days="$2"; shift 2 ;;
        --new-ca) new_ca=1; force=1; shift ;;
        -f | --force) force=1; shift ;;
        -h | --help) usage 0 ;;
        -*) echo "make_certs.sh: unknown option $1" >&2; usage 2 ;;
        *) names+=("$1"); shift ;;
    esac
done
if [[ ${#names[@]} -eq 0 ]]; then
    echo "make_certs.sh: give at least one host name or IP address of the SuperLink" >&2
    usage 2
fi
command -v openssl >/dev/null || { echo "make_certs.sh: openssl is required" >&2; exit 1; }

mkdir -p "$out"
umask 077  # private keys are created readable by their owner only

# --- subjectAltName list: every name given plus localhost/127.0.0.1 (co-located tools) ----
declare -A seen=()
san=""
for n in "${names[@]}" localhost 127.0.0.1; do
    [[ -n ${seen[$n]:-} ]] && continue
    seen[$n]=1
    if [[ $n =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $n == *:* ]]; then
        san+="${san:+,}IP:$n"   # IPv4 or IPv6 address
    else
        san+="${san:+,}DNS:$n"  # host name
    fi
done

# --- certificate authority -----------------------------------------------------------------
if [[ $new_ca -eq 1 || ! -s $out/ca.key || ! -s $out/ca.crt ]]; then
    echo "creating CA in $out (ca.key, ca.crt)"
    openssl ecparam -name secp384r1 -genkey -noout -out "$out/ca.key"
    openssl req -x509 -new -sha384 -key "$out/ca.key" -days "$((days + 365))" \
        -subj "/CN=contrastive-fl federation CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$out/ca.crt"
else
    echo "keeping the existing CA in $out"
fi

# --- SuperLink server certificate ------------------------------------------------------------
if [[ $force -eq 1 || ! -s $out/server.key || ! -s $out/server.pem ]]; then
    echo "issuing server.pem for ${san}"
    openssl ecparam -name prime256v1 -genkey -noout -out "$out/server.key"
    openssl req -new -sha256 -key "$out/server.key" -subj "/CN=${names[0]}" -out "$out/server.csr"
    ext=$(mktemp)
    trap 'rm -f "$ext"' EXIT
    printf '%s\n' \
        "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" \
        "subjectAltName=${san}" >"$ext"
    openssl x509 -req -sha256 -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
        -CAcreateserial -days "$days" -extfile "$ext" -out "$out/server.pem"
    rm -f "$out/server.csr" "$out/ca.srl"
else
    echo "keeping the existing server certificate (use --force to re-issue it)"
fi

# --- permissions and a final check ------------------------------------------------------------
chmod 600 "$out/ca.key" "$out/server.key"
chmod 644 "$out/ca.crt" "$out/server.pem"
openssl verify -CAfile "$out/ca.crt" "$out/server.pem" >/dev/null
echo "server.pem names: $(openssl x509 -in "$out/server.pem" -noout -ext subjectAltName | tail -n +2 | tr -d ' ')"
echo "done: $out/{ca.crt,ca.key,server.pem,server.key}"

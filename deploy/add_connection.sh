#!/usr/bin/env bash
# Add (or replace) a SuperLink connection for the `flwr` CLI in $FLWR_HOME/config.toml
# (default ~/.flwr/config.toml), the file `flwr run . <connection>` reads.
#
#   deploy/add_connection.sh --name fl --address 192.0.2.10:9092 \
#       --root-certificates /abs/path/ca.crt [--default]
#   deploy/add_connection.sh --name local-test --address 127.0.0.1:9092 --insecure
#
# --root-certificates: the CA certificate (ca.crt from docker/make_certs.sh) that signed the
#   SuperLink's certificate; the address must be one of the certificate's names.
# --insecure: plain HTTP, only for tests on one machine (SuperLink started with --insecure).
# --default: make it the connection used when `flwr` is given none.
set -euo pipefail

# shellcheck source=deploy/lib/args.sh
source "$(dirname "$(readlink -f "$0")")/lib/args.sh"
name=""
address=""
ca=""
insecure=0
make_default=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --name) need_value "$@"; name="$2"; shift 2 ;;
        --address) need_value "$@"; address="$2"; shift 2 ;;
        --root-certificates) need_value "$@"; ca="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --default) make_default=1; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
if [[ -z $name || -z $address ]] || [[ $insecure -eq 0 && -z $ca ]] || [[ $insecure -eq 1 && -n $ca ]]; then
    die "need --name, --address and either --root-certificates or --insecure"
fi
# the name is a TOML key of [superlink.NAME] and an argument of `flwr`: a dot would make it a
# nested table, a space or quote an invalid file
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] ||
    die "--name '$name': use letters, digits, '-' and '_' only (e.g. fl, fl-prod, local_test)"
[[ $address =~ ^[^[:space:]]+:([0-9]+)$ ]] || die "--address '$address' is not HOST:PORT"
port_number "the port of --address" "${BASH_REMATCH[1]}"
if [[ -n $ca ]]; then
    [[ -r $ca ]] || { echo "add_connection.sh: cannot read $ca" >&2; exit 1; }
    ca=$(cd "$(dirname "$ca")" && pwd)/$(basename "$ca")  # flwr needs an absolute path
fi

home=${FLWR_HOME:-$HOME/.flwr}
mkdir -p "$home"
cfg="$home/config.toml"

# --- rewrite config.toml: drop the old [superlink.NAME] table, append the new one ------------
python3 - "$cfg" "$name" "$address" "$ca" "$insecure" "$make_default" <<'PY'
import json
import re
import sys
import tomllib
from pathlib import Path

cfg, name, address, ca, insecure, make_default = sys.argv[1:]
path = Path(cfg)
text = path.read_text() if path.is_file() else '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
header = re.compile(r"^\s*\[([^\]]+)\]\s*$")
out, skip = [], False
for line in text.splitlines():
    m = header.match(line)
    if m:
        skip = m.group(1).strip().strip('"') == f"superlink.{name}" or m.group(1).strip() in (
            f'superlink."{name}"',
        )
    if not skip:
        out.append(line)
text = "\n".join(out).rstrip() + "\n\n"
# JSON string escapes are valid TOML: any address or path is written as it is
text += f"[superlink.{name}]\naddress = {json.dumps(address)}\n"
text += "insecure = true\n" if insecure == "1" else f"root-certificates = {json.dumps(ca)}\n"
if make_default == "1":
    if re.search(r'(?m)^default\s*=.*$', text):
        text = re.sub(r'(?m)^default\s*=.*$', f'default = "{name}"', text, count=1)
    else:
        text = text.replace("[superlink]\n", f'[superlink]\ndefault = "{name}"\n', 1)
tomllib.loads(text)  # refuse to write a file flwr could not read
path.write_text(text)
PY
echo "connection '$name' -> $address written to $cfg"

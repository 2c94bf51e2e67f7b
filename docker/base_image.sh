#!/usr/bin/env bash
# Build the demo's base image from a Debian mirror, without any container registry, once
# per machine: a bookworm root filesystem (debootstrap, variant minbase) with Python 3.11,
# venv, openssl, ssh-keygen and Debian's Fashion-MNIST, imported as a docker image. The
# Dockerfile is then built on it with --build-arg PYTHON_IMAGE=<this image>; elsewhere it
# defaults to the public python:3.11-slim-bookworm.
#
#   docker/base_image.sh [--image NAME] [--mirror URL] [--force]
#
# --image   the image to create                                 [contrastive-fl-base:bookworm]
# --mirror  the Debian mirror   [$FL_DEBIAN_MIRROR, else the first bookworm URI of apt's
#                                sources on this machine, else http://deb.debian.org/debian]
# --force   rebuild it even if it exists (otherwise an existing image is kept: exit 0)
#
# Needs root, debootstrap (apt-get install debootstrap) and a running docker engine.
# Takes 2-5 minutes; the image is ~250 MB.
set -euo pipefail

image=contrastive-fl-base:bookworm
mirror=${FL_DEBIAN_MIRROR:-}
force=false
die() { echo "base_image.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --image) [[ $# -ge 2 ]] || die "--image needs a value"; image="$2"; shift 2 ;;
        --mirror) [[ $# -ge 2 ]] || die "--mirror needs a value"; mirror="$2"; shift 2 ;;
        --force) force=true; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
done

docker info >/dev/null 2>&1 || die "no docker engine answers (start it: dockerd &, or docker/demo.sh does)"
if [[ $force == false ]] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "base image $image exists (--force rebuilds it)"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || die "debootstrap needs root: sudo $0"
command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
if [[ -z $mirror ]]; then
    # the mirror this machine's apt already uses (deb822 .sources or one-line .list)
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '/^URIs:/ { uri = $2 } /^Suites:/ && / bookworm( |$)/ && uri ~ /\/debian\/?$/ { print uri; exit }')
    mirror=${mirror:-http://deb.debian.org/debian}
fi

rootfs=$(mktemp -d /var/tmp/contrastive-fl-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror into $rootfs"
debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,openssl,openssh-client,dataset-fashion-mnist \
    bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    tail -n 30 "$rootfs.log" >&2
    die "debootstrap failed (full log: $rootfs.log)"
}
rm -f "$rootfs.log"
# apt inside the image fetches from deb.debian.org like the public images; no caches
echo "deb http://deb.debian.org/debian bookworm main" >"$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "debootstrap minbase bookworm: python3 python3-venv openssl openssh-client dataset-fashion-mnist" \
    - "$image" >/dev/null
echo "base image $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

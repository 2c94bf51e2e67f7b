#!/usr/bin/env bash
# Build the demo's base image from a Debian mirror, without any container registry, once
# per machine: a bookworm root filesystem (variant minbase) with Python 3.11, venv, openssl,
# ssh-keygen and Debian's Fashion-MNIST, imported as a docker image. The Dockerfile is then
# built on it with --build-arg PYTHON_IMAGE=<this image>; elsewhere it defaults to the public
# python:3.11-slim-bookworm.
#
#   docker/base_image.sh [--image NAME] [--mirror URL] [--force]
#
# --image   the image to create                                 [contrastive-fl-base:bookworm]
# --mirror  the Debian mirror   [$FL_DEBIAN_MIRROR, else the first bookworm URI of apt's
#                                sources on this machine, else http://deb.debian.org/debian]
# --force   rebuild it even if it exists (otherwise an existing image is kept: exit 0)
#
# Needs root, mmdebstrap (apt-get install mmdebstrap; debootstrap is used where only it is
# installed, ~6x slower) and a running docker engine. With mmdebstrap it takes 1-2 minutes
# (debootstrap: 5-9); the image is ~210 MB (documentation, manual pages and translations left
# out).
set -euo pipefail

image=contrastive-fl-base:bookworm
mirror=${FL_DEBIAN_MIRROR:-}
force=false
# shellcheck source=deploy/lib/args.sh
source "$(dirname "$(readlink -f "$0")")/../deploy/lib/args.sh"  # die, need_value, usage
while [[ $# -gt 0 ]]; do
    case "$1" in
        --image) need_value "$@"; image="$2"; shift 2 ;;
        --mirror) need_value "$@"; mirror="$2"; shift 2 ;;
        --force) force=true; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done

docker info >/dev/null 2>&1 || die "no docker engine answers (start it: dockerd &, or docker/demo.sh does)"
if [[ $force == false ]] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "base image $image exists (--force rebuilds it)"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || die "building a root filesystem needs root: sudo $0"
if command -v mmdebstrap >/dev/null; then
    tool=mmdebstrap
elif command -v debootstrap >/dev/null; then
    tool=debootstrap
else
    die "neither mmdebstrap nor debootstrap is installed: apt-get install mmdebstrap"
fi
if [[ -z $mirror ]]; then
    # the mirror this machine's apt already uses (deb822 .sources or one-line .list)
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '/^URIs:/ { uri = $2 } /^Suites:/ && / bookworm( |$)/ && uri ~ /\/debian\/?$/ { print uri; exit }')
    mirror=${mirror:-http://deb.debian.org/debian}
fi

packages=python3,python3-venv,ca-certificates,openssl,openssh-client,dataset-fashion-mnist
work=$(mktemp -d /var/tmp/contrastive-fl-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=/var/tmp/contrastive-fl-rootfs.log
echo "$tool bookworm from $mirror"
if [[ $tool == mmdebstrap ]]; then
    # one pass with apt (parallel downloads, no second stage), straight into a tarball; the
    # sources inside point at deb.debian.org like the public images'; no caches, no docs
    # shellcheck disable=SC2016  # $1 is the hook's argument (the root filesystem), for mmdebstrap
    mmdebstrap --variant=minbase --include="$packages" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='echo "deb http://deb.debian.org/debian bookworm main" >"$1/etc/apt/sources.list"' \
        bookworm "$work/rootfs.tar" "$mirror" >"$log" 2>&1 || {
        tail -n 30 "$log" >&2
        die "mmdebstrap failed (full log: $log)"
    }
    tarball() { cat "$work/rootfs.tar"; }
else
    debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" >"$log" 2>&1 || {
        tail -n 30 "$log" >&2
        die "debootstrap failed (full log: $log)"
    }
    echo "deb http://deb.debian.org/debian bookworm main" >"$work/rootfs/etc/apt/sources.list"
    rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/*.bin \
        "$work"/rootfs/var/cache/apt/archives/*.deb
    tarball() { tar -C "$work/rootfs" -c .; }
fi
rm -f "$log"
tarball | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "$tool minbase bookworm: ${packages//,/ }" \
    - "$image" >/dev/null
echo "base image $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

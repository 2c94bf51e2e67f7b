#!/usr/bin/env bash
# Collect the wheels of the project's pinned dependencies (pyproject.toml
# [project].dependencies) into a folder on this machine, with this machine's pip and its
# configuration (its indexes, find-links, certificates), so that the image build installs
# them from there (served on the loopback: --build-arg WHEELHOUSE_URL=..., no index, no
# network to PyPI from the build and no certificate in it). Kept between builds: a wheelhouse already holding these
# requirements is reused as it is.
#
#   docker/wheelhouse.sh [--dest DIR] [--python PY] [--force]
#
# --dest    the wheelhouse            [$FL_WHEELHOUSE, else /var/cache/contrastive-fl/wheels]
# --python  a Python 3.11 whose pip downloads (the image's Python is 3.11) [.venv/bin/python]
# --force   download again even if DIR holds these requirements
#
# torch comes from the same index as on the host: PyPI's torch 2.14.1 is the CUDA build
# with its nvidia-* runtime libraries (~2.7 GB of wheels); it trains on the CPU as well.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${FL_WHEELHOUSE:-/var/cache/contrastive-fl/wheels}
python=$root/.venv/bin/python
force=false
# shellcheck source=deploy/lib/args.sh
source "$(dirname "$(readlink -f "$0")")/../deploy/lib/args.sh"  # die, need_value, usage
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dest) need_value "$@"; dest="$2"; shift 2 ;;
        --python) need_value "$@"; python="$2"; shift 2 ;;
        --force) force=true; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -x $python ]] || die "no Python at $python: make install, or give --python"
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    die "$python is not Python 3.11 (the image's): give --python"

reqs=$("$python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$root/pyproject.toml")
if [[ $force == false && -f $dest/requirements.txt && $(cat "$dest/requirements.txt") == "$reqs" ]]; then
    echo "wheelhouse $dest holds these requirements (--force downloads again)"
    exit 0
fi
mkdir -p "$dest"
rm -f "$dest/requirements.txt"  # written back only once the download is complete
printf '%s\n' "$reqs" >"$dest/requirements.in"
echo "downloading the wheels of pyproject.toml's dependencies into $dest"
"$python" -m pip download --quiet --only-binary=:all: --dest "$dest" -r "$dest/requirements.in"
printf '%s\n' "$reqs" >"$dest/requirements.txt"
echo "wheelhouse $dest: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1)"

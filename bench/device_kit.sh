#!/usr/bin/env bash
# Build the device kit: the packages a lent GPU machine (nvidia-h200: Python 3.12, torch
# preinstalled, no network) lacks to run this project, as wheels in .devkit/ (ignored by
# git), which a device call carries (carry [".devkit"]) and bench/gpu_checks.sh installs.
#
#     bash bench/device_kit.sh [--python-version 3.12] [--dest .devkit] [--kinds KINDS.md]
#         [--limit-mib 60]
#
# What goes in and why: bench/device_kit.py (the versions are this checkout's .venv's, so
# run `make install` first; it downloads from PyPI). Prints the kit's size and the working
# tree's that travels with it (a device call carries 64 MiB in all) and exits non-zero,
# saying why, when the kit is over --limit-mib. A relative --dest is relative to the repo's
# root. 2.5-5 minutes of one core, most of it compressing Ray (xz -6); 55.6 MiB (Ray 24).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" bench/device_kit.py build "$@"

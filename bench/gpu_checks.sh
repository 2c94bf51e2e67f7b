#!/usr/bin/env bash
# The GPU checks of issue 51 as the one command a lent GPU machine runs (no network there),
# from the repo root, with the kit of bench/device_kit.sh carried as .devkit:
#
#     bash bench/gpu_checks.sh [--dry-run] [STEP...]   # default: env tests s1 s2 s5
#
# It installs the kit into /tmp/site (bench/device_kit.py install: the wheels, Ray unpacked,
# fallback wheels where the machine's version of a package misses what flwr asks), puts
# /tmp/site first on PYTHONPATH (then the repo) and /tmp/site/bin first on PATH (flwr starts
# flower-superlink, flower-superexec and flwr-simulation by name), and runs each step with
# its own timeout, going on past a failure, all of it logged to $OUT/log.txt. After each step
# the results it wrote (bench/results/*.json and *.md newer than the start) are copied to
# $OUT, or tarred into $OUT/results.tar.gz beside the .md files when more than 7, and the
# processes it left (those carrying this run's GPU_CHECKS_RUN) are ended.
#
# Steps, most valuable first; estimates for one H200 with 16 cores [timeout, minimum]:
#   install  the kit into /tmp/site (always first; once per machine)      ~20 s  [180, 30]
#   env      nvidia-smi -L; Python, torch, CUDA, flwr, ray versions; imports ~15 s  [60, 10]
#   tests    pytest tests/clients/test_gpu.py tests/clients/test_step_graph.py
#            (the CUDA tests, bf16 and channels-last cases among them)   ~2 min [240, 60]
#   s1       S1 on a GPU: s1_overhead.py --gpu-suite --rounds 4 (P1-size rounds, the CNN
#            with its CPU round, then ResNet-18-GN; s1_gpu.json/.md)   ~4.5 min [330, 120]
#   s2       = s2bf16 s2fp32: s2_method_cost.py --device cuda --model resnet18_gn --steps 24
#            --repeats 3, with client.precision=bf16 client.channels_last=true (tag bf16_cl),
#            then fp32 (tag fp32), on synthetic Fashion-MNIST       ~1.5 min each [150, 60]
#   s5       s5_gpu_sharing.py --shares 1,0.5,0.25 --rounds 3 (P1 with MOON, synthetic
#            Fashion-MNIST: 1, 2 and 4 clients on the GPU at once)     ~2 min [200, 90]
#   cpu_smoke = cpu_s1 cpu_tests (not in the default): a tiny S1 of ResNet-18-GN on the CPU
#            through flwr and Ray, and test_step_graph.py: the kit's imports and processes
#            without a GPU (how the kit was checked on a machine without one)
# In all ~12 min, over one command's 10: the steps share a budget of GPU_CHECKS_BUDGET
# seconds (540) from the start, each step's timeout is cut to what is left (15 s kept for
# the results), and a step that no longer has its minimum is SKIPPED; run those in a second
# command on the same machine, e.g. `bash bench/gpu_checks.sh s2fp32 s5` (the install is
# then skipped: the kit is already in /tmp/site).
#
# Settings (environment): OUT (default: a new folder under /tmp), GPU_CHECKS_KIT (.devkit),
# GPU_CHECKS_SITE (/tmp/site), GPU_CHECKS_BUDGET (540), S1_ROUNDS (4). The synthetic data
# go to a temporary folder. Exit status: 0 when no step failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

KIT=${GPU_CHECKS_KIT:-.devkit}
SITE=${GPU_CHECKS_SITE:-/tmp/site}
BUDGET=${GPU_CHECKS_BUDGET:-540}
S1_ROUNDS=${S1_ROUNDS:-4}
RESERVE=15
DRY=0
if [[ ${1:-} == --dry-run ]]; then
    DRY=1
    shift
fi
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(env tests s1 s2 s5)
OUT=${OUT:-$(mktemp -d /tmp/gpu-checks-out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-checks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STAMP=$WORK/stamp
touch "$STAMP"
DATA=$WORK/fmnist
RUN_ID="$$-$RANDOM-$(date +%s)"
START=$SECONDS
SUMMARY=()
FAILED=0
export PYTHONUNBUFFERED=1

# step NAME TIMEOUT MINIMUM CMD...: CMD under a timeout cut to the budget left, or skipped
step() {
    local name=$1 want=$2 min=$3
    shift 3
    local left=$((BUDGET - (SECONDS - START) - RESERVE))
    local t=$((want < left ? want : left))
    if ((DRY)); then
        echo "== $name [timeout $want s, minimum $min s]: $*"
        return 0
    fi
    if ((t < min)); then
        echo "== $name: SKIPPED (${left}s of the ${BUDGET}s budget left, it needs ${min}s)"
        SUMMARY+=("$(printf '%-10s %-24s' "$name" "SKIPPED (budget)")")
        return 0
    fi
    echo "== $name (timeout ${t}s, at $((SECONDS - START))s, $(date -u +%H:%M:%S) UTC): $*"
    local t0=$SECONDS rc=0 status=ok
    env GPU_CHECKS_RUN="$RUN_ID" timeout -k 10 "$t" "$@" || rc=$?
    if ((rc == 124 || rc == 137)); then
        status="TIMED OUT (${t}s)"
        FAILED=1
    elif ((rc != 0)); then
        status="FAILED (exit $rc)"
        FAILED=1
    fi
    echo "== $name: $status in $((SECONDS - t0))s"
    SUMMARY+=("$(printf '%-10s %-24s %5ds' "$name" "$status" $((SECONDS - t0)))")
    reap "$name"
    collect
}

# end the processes a step left (a SuperLink, Ray): those with this run's GPU_CHECKS_RUN
reap() {
    local pids=() p
    for p in /proc/[0-9]*; do
        if grep -qzxF "GPU_CHECKS_RUN=$RUN_ID" "$p/environ" 2>/dev/null; then
            pids+=("${p#/proc/}")
        fi
    done
    ((${#pids[@]})) || return 0
    echo "== $1 left ${#pids[@]} processes running: ending them"
    kill -TERM "${pids[@]}" 2>/dev/null
    sleep 3
    kill -KILL "${pids[@]}" 2>/dev/null
    return 0
}

# copy the results written since the start to $OUT (with log.txt at most 8 files)
collect() {
    local files=() mds=() f
    while IFS= read -r -d '' f; do
        files+=("$f")
        [[ $f == *.md ]] && mds+=("$f")
    done < <(find bench/results -maxdepth 1 -type f \( -name '*.json' -o -name '*.md' \) \
        -newer "$STAMP" -print0 | sort -z)
    rm -f "$OUT"/*.json "$OUT"/*.md "$OUT/results.tar.gz"
    ((${#files[@]})) || return 0
    if ((${#files[@]} <= 7)); then
        cp "${files[@]}" "$OUT"/
    else
        tar -czf "$OUT/results.tar.gz" "${files[@]}"
        ((${#mds[@]} <= 6)) && cp "${mds[@]}" "$OUT"/
    fi
    return 0
}

# synthetic Fashion-MNIST (full size, random pixels) for S2 and S5, written once, unless the
# step that reads it will be skipped (data MINIMUM)
data() {
    [[ -f $DATA/SYNTHETIC ]] && return 0
    ((DRY || BUDGET - (SECONDS - START) - RESERVE < $1)) && return 0
    echo "== writing synthetic Fashion-MNIST to $DATA"
    python3 -c "import sys; from pathlib import Path; from core.synthetic import write_synthetic
write_synthetic('fmnist', Path(sys.argv[1]), 60000, 10000)" "$DATA"
}

ENV_PY='import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN",
      torch.backends.cudnn.version(), "GPU available:", torch.cuda.is_available())
if torch.cuda.is_available():
    print("GPU", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0),
          "bf16:", torch.cuda.is_bf16_supported())
for n in ("flwr", "ray", "flwr-datasets", "datasets", "finch-clust", "torchvision", "numpy",
          "protobuf", "grpcio", "typer", "packaging", "pytest"):
    print(n, md.version(n))
import flwr, ray, datasets, finch, flwr_datasets.partitioner, flwr.simulation  # the kit
print("kit imports ok: flwr from", flwr.__file__, "ray from", ray.__file__)'

run_step() {
    case $1 in
    env)
        # shellcheck disable=SC2016  # $1 is bash -c's argument: the Python above
        step env 60 10 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
            command -v flwr flower-superlink flower-superexec flwr-simulation ps
            python3 -c "$1"' env "$ENV_PY"
        ;;
    tests)
        step tests 240 60 python3 -m pytest -p no:cacheprovider -rs \
            tests/clients/test_gpu.py tests/clients/test_step_graph.py
        ;;
    s1)
        step s1 330 120 python3 bench/s1_overhead.py --gpu-suite --rounds "$S1_ROUNDS"
        ;;
    s2)
        run_step s2bf16
        run_step s2fp32
        ;;
    s2bf16)
        data 60
        step s2bf16 150 60 python3 bench/s2_method_cost.py --device cuda --model resnet18_gn \
            --steps 24 --repeats 3 --tag bf16_cl \
            --set "client.precision=bf16 client.channels_last=true data.root=$DATA data.download=false"
        ;;
    s2fp32)
        data 60
        step s2fp32 150 60 python3 bench/s2_method_cost.py --device cuda --model resnet18_gn \
            --steps 24 --repeats 3 --tag fp32 --set "data.root=$DATA data.download=false"
        ;;
    s5)
        data 90
        step s5 200 90 python3 bench/s5_gpu_sharing.py --shares 1,0.5,0.25 --rounds 3 \
            --set "data.root=$DATA data.download=false"
        ;;
    cpu_smoke)
        run_step cpu_s1
        run_step cpu_tests
        ;;
    cpu_s1)
        step cpu_s1 300 60 python3 bench/s1_overhead.py --model resnet18_gn --clients 2 \
            --rounds 2 --steps 2 --batch-size 4 --name s1_cpu_smoke \
            --set "data.train_subset=200 data.test_subset=50"
        ;;
    cpu_tests)
        step cpu_tests 300 60 python3 -m pytest -p no:cacheprovider tests/clients/test_step_graph.py
        ;;
    *)
        echo "== unknown step '$1' (env tests s1 s2 s2bf16 s2fp32 s5 cpu_smoke cpu_s1 cpu_tests)"
        FAILED=1
        ;;
    esac
}

main() {
    echo "== gpu_checks: steps ${STEPS[*]}; budget ${BUDGET}s; kit $KIT -> $SITE; results -> $OUT"
    step install 180 30 python3 bench/device_kit.py install --kit "$KIT" --target "$SITE"
    export PYTHONPATH="$SITE:$PWD" PATH="$SITE/bin:$PATH"
    local s
    for s in "${STEPS[@]}"; do
        run_step "$s"
    done
    ((DRY)) && return "$FAILED"
    echo "== summary ($((SECONDS - START))s in all, results in $OUT):"
    printf '   %s\n' "${SUMMARY[@]}"
    ls -la "$OUT"
    return "$FAILED"
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"

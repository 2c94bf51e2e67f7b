"""Frozen forwards looped or vmapped: the cost behind ``clients.base.VMAP_MIN_MODELS``.

MOON evaluates 2 frozen models per step (the global and the previous local model), PMFL
N + 1 = 6 (its buffer of iterates and the global model). ``FrozenStack.z`` runs them as a
Python loop of forwards or as one ``torch.func.vmap``-ped call; which is faster depends on the
device (kernel launches vs batched kernels). This times both for 2, 3, 4 and 6 stacked
models on one batch (median of ``--repeats`` timings of ``--iters`` calls each, after a
warm-up) for the P1 CNN with MOON's projection head and, with ``--model resnet18_gn``, for
FedRCL's ResNet-18.

    .venv/bin/python bench/frozen_stack.py [--device cpu|cuda] [--model cnn|resnet18_gn]
        [--batch 64] [--threads 1]
Writes bench/results/frozen_stack_<device>[_<model>].json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs import write_table  # noqa: E402
from s2_method_cost import sync  # noqa: E402

from clients.base import VMAP_MIN_MODELS, FrozenStack  # noqa: E402
from core.models import build_model  # noqa: E402
from fl_app.config import load_config  # noqa: E402

MODELS = (2, 3, 4, 6)


def time_z(stack: FrozenStack, x: torch.Tensor, vmapped: bool, iters: int, repeats: int) -> float:
    """Median milliseconds of one ``stack.z(x)`` call (``iters`` calls per timing)."""
    for _ in range(3):
        stack.z(x, vmapped=vmapped)
    times = []
    for _ in range(repeats):
        sync(x.device)
        t0 = time.perf_counter()
        for _ in range(iters):
            stack.z(x, vmapped=vmapped)
        sync(x.device)
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", choices=["cnn", "resnet18_gn"], default="cnn")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = load_config("p1", "moon", f"model.name={args.model}")
    torch.manual_seed(0)
    module = build_model(cfg).to(device).eval()
    d = cfg["data"]
    x = torch.randn(args.batch, d["channels"], d["image_size"], d["image_size"], device=device)
    rows = []
    for m in MODELS:
        states = [build_model(cfg).state_dict() for _ in range(m)]
        stack = FrozenStack(module, states, device)
        loop = time_z(stack, x, False, args.iters, args.repeats)
        vm = time_z(stack, x, True, args.iters, args.repeats)
        looped, batched = stack.z(x, vmapped=False), stack.z(x, vmapped=True)
        rel = float((looped - batched).abs().max() / looped.abs().max())
        rows.append(
            {
                "models": m,
                "loop_ms": loop,
                "vmap_ms": vm,
                "vmap_speedup": loop / vm,
                "rel_diff": rel,
            }
        )
    out = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": args.model,
        "batch": args.batch,
        "threads": args.threads,
        "vmap_min_models": VMAP_MIN_MODELS,
        "rows": rows,
    }
    name = f"frozen_stack_{device.type}" + ("" if args.model == "cnn" else f"_{args.model}")
    print(write_table(ROOT / "bench" / "results", name, out, markdown(out)), end="")


def markdown(out: dict[str, Any]) -> str:
    """The table: per number of stacked models, ms per call looped and vmapped."""
    lines = [
        f"`FrozenStack.z` on {out['device_name']}, model {out['model']}, batch {out['batch']}"
        + (f", {out['threads']} CPU thread(s)" if out["device"] == "cpu" else "")
        + "; the code vmaps on CUDA from "
        f"{out['vmap_min_models']} models.",
        "",
        "| models | loop ms | vmap ms | vmap speed-up | max difference (relative) |",
        "|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['models']} | {r['loop_ms']:.3f} | {r['vmap_ms']:.3f} | "
            f"{r['vmap_speedup']:.2f}× | {r['rel_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

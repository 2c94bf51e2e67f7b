"""S2 — per-step cost of each method's local training relative to FedAvg (BENCHMARKS.md).

Every method trains the same client (Fashion-MNIST, P1 CNN, batch 64) for the same fixed
number of mini-batch steps, after one warm-up round that gives stateful methods their state
(MOON's previous model, PMFL's full buffer of N iterates, FedCCL's signals). Methods are
timed round-robin (repeat r runs every method once) so background load hits all alike.
Reported: median
seconds per step over repeats and the ratio to FedAvg, next to the forward-pass theory
(MOON 2 extra frozen forwards ≈ 1.67×, PMFL N=5 six extra ≈ 3×), and each method's
arithmetic: the matmul/convolution FLOPs of one local step (``torch.utils.flop_counter``,
forward and backward, frozen forwards included) and their ratio to FedAvg's: the arithmetic
each method must do on this model (not a time floor: matmuls run faster per FLOP here than
the CNN's training step).

    .venv/bin/python bench/s2_method_cost.py [--steps 60] [--repeats 5] [--threads 1]
        [--device cpu|cuda] [--cpu-too] [--model cnn|resnet18_gn] [--set "client.batch_size=256"]
        [--tag eager]
Writes bench/results/s2_method_cost.json and .md (``--device cuda``: s2_method_cost_cuda.*;
``--model resnet18_gn``: s2_method_cost_resnet18_gn.*; ``--tag T`` appends ``_T``), with
samples/s per method beside the ratios. On CUDA the clients replay their steps from a CUDA
graph where the method allows it (``client.cuda_graph``, the default); ``--set
client.cuda_graph=false --tag eager`` times the same steps launched one kernel at a time.
``--device cuda --cpu-too`` also times every method on the CPU in the same run (interleaved,
``--threads`` threads) and adds CPU samples/s and the GPU speed-up per method.
``--model resnet18_gn`` measures the same methods on FedRCL's backbone (ResNet-18 with
GroupNorm), where the forward and backward passes dominate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs import write_table  # noqa: E402

from core.data import load_client_data  # noqa: E402
from core.models import get_weights, set_weights  # noqa: E402
from core.state import StateStore  # noqa: E402
from fl_app import registry  # noqa: E402
from fl_app.config import load_config  # noqa: E402
from strategies.fedccl import round_payload  # noqa: E402

HEAD = "model.projection_dim=256"  # MOON/PMFL's projection head
MODELS = {"cnn": "P1 CNN", "resnet18_gn": "ResNet-18 (GroupNorm)"}


class Row(NamedTuple):
    """One row of the table: a method's preset with extra overrides, its forward-pass theory
    ratio and its target (``None``: a baseline or a diagnostic, not held to a target)."""

    method: str
    overrides: str
    theory: float
    target: float | None


ROWS = {
    "fedavg": Row("fedavg", "", 1.0, None),
    # FedAvg with MOON/PMFL's projection head: their baseline
    "fedavg_head": Row("fedavg", HEAD, 1.0, None),
    "fedprox": Row("fedprox", "", 1.0, 1.3),
    "moon": Row("moon", "", 5 / 3, 5 / 3 * 1.15),
    "fedrcl": Row("fedrcl", "", 1.0, 1.3),
    "fedccl": Row("fedccl", "", 1.0, 1.3),
    "fedrane": Row("fedrane", "", 1.0, 1.3),
    # diagnostics: FedRANE's two additions apart (message passing alone; L_CD alone)
    "fedrane_mp_only": Row("fedrane", "client.lam_cd=0", 1.0, None),
    "fedrane_cd_only": Row("fedrane", "client.lra_steps=0", 1.0, None),
    "pmfl": Row("pmfl", "", 3.0, 3.0 * 1.15),
}
BASELINES = ("fedavg", "fedavg_head")


def prepare(row: Row, steps: int, store_dir: Path, device: torch.device, extra: str) -> dict:
    """Build a row's client (state in ``store_dir``) and run one warm-up round that creates
    its state."""
    cfg = load_config(
        "p1",
        row.method,
        f"client.steps={steps} client.personalized_eval=false {row.overrides} {extra}",
    )
    cls = registry.resolve("client", cfg["client"]["name"])
    data = load_client_data(cfg, 0)
    store = StateStore(store_dir)
    torch.manual_seed(0)
    w0 = get_weights(cls.build_model(cfg))
    client = cls(cfg, data, 0, device, store)
    _, _, m = client.fit(w0, {"server-round": 1})
    signals = round_payload(m["signals"], m["signal_labels"], 10) if "signals" in m else {}
    return dict(
        cfg=cfg,
        cls=cls,
        data=data,
        store=store,
        w0=w0,
        signals=signals,
        device=device,
        graphed=client.graphed(),
    )


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a timer reads it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_client(p: dict, rnd: int, eager: bool = False) -> Any:
    """A prepared method's client at the start of round ``rnd`` (weights ``w0``, its state
    and the server's signals loaded), as the ClientApp builds it; ``eager``: without the
    CUDA graph."""
    cfg = p["cfg"]
    if eager:
        cfg = {**cfg, "client": {**cfg["client"], "cuda_graph": False}}
    client = p["cls"](cfg, p["data"], 0, p["device"], p["store"])
    client.round = rnd
    set_weights(client.model, p["w0"])
    client.setup_round({"server-round": rnd, **p["signals"]})
    return client


def time_once(p: dict, steps: int, rnd: int) -> tuple[float, float]:
    """Seconds per local step and seconds of end-of-round work, for one round."""
    client = round_client(p, rnd)
    sync(p["device"])
    t0 = time.perf_counter()
    client.train_local()
    sync(p["device"])
    per_step = (time.perf_counter() - t0) / steps
    t1 = time.perf_counter()
    client.finish_round()
    sync(p["device"])
    return per_step, time.perf_counter() - t1


def flops_per_step(p: dict, steps: int) -> float:
    """Matmul/convolution FLOPs of one local step (forward + backward), from one counted
    round of ``steps`` steps; the end-of-round work (e.g. FedCCL's signals) is not a step.
    Counted eagerly: the counter sees the operations Python runs, and a CUDA graph's replays
    run none."""
    client = round_client(p, 2, eager=True)
    with FlopCounterMode(display=False) as counter:
        client.train_local()
    return counter.get_total_flops() / steps


def _graph_note(out: dict) -> str:
    """The table's sentence on CUDA graphs (none on the CPU, or for results from before
    graphs); results from before the per-method ``graphed`` field had every method but PMFL
    graphed."""
    if out["device"] == "cpu" or "cuda_graph" not in out:
        return ""
    if not out["cuda_graph"]:
        return " Every step launched kernel by kernel (`client.cuda_graph=false`)."
    rows = out["methods"].values()
    if any("graphed" not in r for r in rows):
        return (
            " Full-size steps replay a CUDA graph where the method allows it "
            "(not PMFL: `client.cuda_graph`)."
        )
    eager = [m for m, r in out["methods"].items() if not r["graphed"]]
    return " Full-size steps replay a CUDA graph (`client.cuda_graph`)" + (
        f", except for {', '.join(eager)}." if eager else "."
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--set", default="", help="extra config overrides, e.g. data.root=/x")
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="cnn",
        help="cnn: the P1 CNN; resnet18_gn: FedRCL's backbone on the same data",
    )
    p.add_argument(
        "--cpu-too",
        action="store_true",
        help="with --device cuda: also time every method on the CPU (--threads threads) in the "
        "same run, interleaved, and report samples/s on both and the GPU speed-up",
    )
    p.add_argument(
        "--tag",
        default="",
        help="suffix of the result files, e.g. 'eager' with --set client.cuda_graph=false",
    )
    args = p.parse_args()
    if args.cpu_too and not args.device.startswith("cuda"):
        p.error("--cpu-too compares a CUDA run with the CPU: use it with --device cuda")
    extra = f"model.name={args.model} {args.set}"
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in ROWS}
    cpu_times: dict[str, list[float]] = {m: [] for m in ROWS}
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        prepared = {
            m: prepare(row, args.steps, Path(tmp) / m, device, extra) for m, row in ROWS.items()
        }
        on_cpu = {
            m: prepare(row, args.steps, Path(tmp) / f"{m}-cpu", cpu, extra)
            for m, row in (ROWS.items() if args.cpu_too else ())
        }
        flops = {m: flops_per_step(prepared[m], args.steps) for m in ROWS}
        for r in range(args.repeats):  # interleaved, so machine noise hits all methods alike
            for m in ROWS:
                times[m].append(time_once(prepared[m], args.steps, 2 + r))
                if on_cpu:
                    cpu_times[m].append(time_once(on_cpu[m], args.steps, 2 + r)[0])
    medians = {
        m: {
            "seconds_per_step": statistics.median(t for t, _ in v),
            "finish_round_seconds": statistics.median(f for _, f in v),
        }
        for m, v in times.items()
    }
    batch = prepared["fedavg"]["cfg"]["client"]["batch_size"]
    out = {
        "steps": args.steps,
        "repeats": args.repeats,
        "threads": args.threads,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch_size": batch,
        "model": MODELS[args.model],
        "overrides": args.set,
        "cuda_graph": device.type == "cuda" and prepared["fedavg"]["cfg"]["client"]["cuda_graph"],
        "methods": {},
    }
    for m, row in ROWS.items():
        baseline = "fedavg_head" if row.method in ("moon", "pmfl") else "fedavg"
        ratio = medians[m]["seconds_per_step"] / medians[baseline]["seconds_per_step"]
        out["methods"][m] = {
            **medians[m],
            "samples_per_second": batch / medians[m]["seconds_per_step"],
            "ratio": ratio,
            "theory": row.theory,
            "flops_per_step": flops[m],
            "flop_ratio": flops[m] / flops[baseline],
            "target": row.target,
            "meets_target": None if row.target is None else ratio <= row.target,
        }
        if device.type == "cuda":
            out["methods"][m]["graphed"] = prepared[m]["graphed"]
        if on_cpu:
            cpu_step = statistics.median(cpu_times[m])
            out["methods"][m]["cpu_samples_per_second"] = batch / cpu_step
            out["methods"][m]["speedup_over_cpu"] = cpu_step / medians[m]["seconds_per_step"]
    name = "s2_method_cost" + ("" if device.type == "cpu" else f"_{device.type}")
    name += "" if args.model == "cnn" else f"_{args.model}"
    name += f"_{args.tag}" if args.tag else ""
    print(write_table(ROOT / "bench" / "results", name, out, markdown(out)), end="")


def markdown(out: dict[str, Any]) -> str:
    """The S2 table (per method: ms and samples/s a step, ratio to its baseline, theory,
    target ✓/✗, FLOPs; with ``--cpu-too`` the CPU figures too) from the JSON figures."""
    on_cpu = any("speedup_over_cpu" in r for r in out["methods"].values())
    lines = [
        f"Model: {out['model']}. Device: {out['device_name']}, batch {out['batch_size']}, "
        f"{out['threads']} CPU thread(s). "
        "MOON and PMFL are compared with `fedavg_head` (FedAvg on the same model, with the "
        "projection head); the others with plain FedAvg."
        + (
            " `fedrane_mp_only` (`client.lam_cd=0`) and `fedrane_cd_only` "
            "(`client.lra_steps=0`) time FedRANE's two additions apart."
            if "fedrane_mp_only" in out["methods"]  # results from before these rows lack them
            else ""
        )
        + _graph_note(out),
        "",
        "| method | ms/step | samples/s | ratio to FedAvg | theory | target | "
        "MFLOP/step | FLOP ratio | end-of-round s |"
        + (" CPU samples/s | speed-up over CPU |" if on_cpu else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if on_cpu else ""),
    ]
    for m, r in out["methods"].items():
        if r["target"] is not None:
            target = f"≤ {r['target']:.2f} {'✓' if r['meets_target'] else '✗'}"
        else:
            target = "baseline" if m in BASELINES else "– (diagnostic)"
        lines.append(
            f"| {m} | {1000 * r['seconds_per_step']:.2f} | {r['samples_per_second']:.0f} | "
            f"{r['ratio']:.2f} | "
            f"{r['theory']:.2f} | {target} | {r['flops_per_step'] / 1e6:.1f} | "
            f"{r['flop_ratio']:.2f} | {r['finish_round_seconds']:.2f} |"
            + (
                f" {r['cpu_samples_per_second']:.0f} | {r['speedup_over_cpu']:.1f}× |"
                if on_cpu
                else ""
            )
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

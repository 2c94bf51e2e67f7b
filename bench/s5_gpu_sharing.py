"""S5 — simulated clients sharing one GPU through Ray's fractional GPU resources (issue 9).

Runs the same simulation (by default P1 with MOON: 10 clients, all in every round) through
``fl_app.launch`` once per GPU share (``--gpus-per-client``): ``0`` trains every client on the
CPU, ``1`` gives each client a whole GPU (one at a time on a one-GPU machine), ``0.5`` and
``0.25`` let two and four clients train on the GPU at once. While a run goes, ``nvidia-smi``
is asked every 0.2 s which processes hold a CUDA context; those whose command line is a Ray
worker's (``ray::...``) are the simulated clients, the rest (the ServerApp's evaluator) are
counted apart. So the table shows that the share is what Ray enforces (at most 1/share
clients on the GPU at once, none with share 0), and what it buys: the median seconds per
round (from round 2: round 1 includes starting the actors and CUDA), the clients' median
local-training seconds and the GPU memory the run held at its peak.

    .venv/bin/python bench/s5_gpu_sharing.py [--method moon] [--experiment p1] [--rounds 4]
        [--shares 0,1,0.5,0.25] [--num-cpus N] [--set "client.batch_size=128"]
Writes bench/results/s5_gpu_sharing.json and .md. Needs a CUDA GPU and ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.results import parse_rounds  # noqa: E402

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def parse_compute_apps(text: str) -> list[tuple[int, float]]:
    """``(pid, MiB)`` per line of ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits``; lines that are not two numbers (``[N/A]``, "No running
    processes found") are skipped."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                apps.append((int(parts[0]), float(parts[1])))
            except ValueError:
                apps.append((int(parts[0]), 0.0))
    return apps


def is_ray_worker(cmdline: str) -> bool:
    """A Ray worker process (a simulated client's actor): Ray sets its title to ``ray::...``."""
    return cmdline.startswith("ray::")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


class GpuSampler(threading.Thread):
    """Polls nvidia-smi until stopped: the most client (Ray worker) processes and other
    processes seen on the GPU at once, and the most GPU memory they held together."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period, self.stop = period, threading.Event()
        self.max_clients, self.max_others, self.max_mib, self.samples = 0, 0, 0.0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            res = subprocess.run(QUERY, capture_output=True, text=True)
            apps = parse_compute_apps(res.stdout)
            clients = sum(is_ray_worker(_cmdline(pid)) for pid, _ in apps)
            self.max_clients = max(self.max_clients, clients)
            self.max_others = max(self.max_others, len(apps) - clients)
            self.max_mib = max(self.max_mib, sum(m for _, m in apps))
            self.samples += 1
            time.sleep(self.period)


def expected_concurrency(share: float, num_clients: int, slots: int) -> int:
    """Clients that Ray lets train on the GPU at once: ``floor(1 / share)`` per GPU (none at
    share 0), no more than there are clients or CPU slots."""
    if share == 0:
        return 0
    return min(num_clients, slots, math.floor(1 / share + 1e-9))


def run_share(args: argparse.Namespace, share: float, out: Path) -> dict[str, Any]:
    """One simulation with ``share`` GPUs per client; its timings and what the GPU saw."""
    sampler = GpuSampler()
    sampler.start()
    t0 = time.time()
    cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", args.experiment]
    cmd += ["--method", args.method, "--output-dir", str(out), "--gpus-per-client", str(share)]
    cmd += ["--num-cpus", str(args.num_cpus)]
    cmd += ["--set", f"num_rounds={args.rounds} evaluation.plot=false {args.set}".strip()]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"the run with --gpus-per-client {share} failed")
    [log] = out.glob(f"{args.experiment}/{args.method}/seed*/rounds.jsonl")
    rounds = [r for r in parse_rounds(log.read_bytes()) if r["round"] > 0]
    steady = [r for r in rounds if r["round"] > 1] or rounds
    fits = [c["fit_seconds"] for r in steady for c in r.get("clients", {}).values()]
    examples = sum(c["num_examples"] for r in steady for c in r.get("clients", {}).values())
    num_clients = len(rounds[-1].get("participants", [])) or 1
    return {
        "gpus_per_client": share,
        "clients": num_clients,
        "expected_concurrent_on_gpu": expected_concurrency(share, num_clients, args.num_cpus),
        "max_concurrent_clients_on_gpu": sampler.max_clients,
        "max_other_processes_on_gpu": sampler.max_others,
        "peak_gpu_mib": sampler.max_mib,
        "median_round_seconds": statistics.median(r["round_seconds"] for r in steady),
        "median_client_fit_seconds": statistics.median(fits),
        "train_samples_per_second": examples / sum(fits),
        "final_accuracy": rounds[-1].get("accuracy"),
        "wall_seconds": wall,
        "gpu_samples": sampler.samples,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--experiment", default="p1")
    p.add_argument("--method", default="moon")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--shares", default="0,1,0.5,0.25", help="GPU shares per client, in order")
    p.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2, help="CPUs for Ray")
    p.add_argument("--set", default="", help="extra config overrides")
    args = p.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("S5 needs a CUDA GPU (and nvidia-smi): none is visible here")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in shares:
            rows.append(run_share(args, share, Path(tmp) / f"share{share}"))
            print(json.dumps(rows[-1]), flush=True)
    cpu = next((r for r in rows if r["gpus_per_client"] == 0), None)
    for r in rows:
        r["speedup_over_cpu"] = (
            cpu["median_round_seconds"] / r["median_round_seconds"] if cpu else None
        )
    out = {
        "experiment": args.experiment,
        "method": args.method,
        "rounds": args.rounds,
        "num_cpus": args.num_cpus,
        "overrides": args.set,
        "device_name": torch.cuda.get_device_name(0),
        "rows": rows,
    }
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "s5_gpu_sharing.json").write_text(json.dumps(out, indent=2) + "\n")
    md = markdown(out)
    (res / "s5_gpu_sharing.md").write_text(md)
    print(md, end="")


def markdown(out: dict[str, Any]) -> str:
    """The S5 table (per GPU share: clients on the GPU at once, expected and seen; seconds per
    round and speed-up over the CPU run; local-training throughput; peak GPU memory)."""
    lines = [
        f"{out['experiment'].upper()} with `{out['method']}`, {out['rounds']} rounds per share, "
        f"{out['num_cpus']} CPUs for Ray, one {out['device_name']}"
        + (f", `{out['overrides']}`" if out["overrides"] else "")
        + ". Clients on the GPU at once: what Ray allows (expected) and what `nvidia-smi` saw.",
        "",
        "| GPUs per client | clients on GPU: expected | seen | other GPU processes | s/round "
        "| speed-up over CPU | client fit s | train samples/s | peak GPU MiB | accuracy % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        speed = "–" if r["speedup_over_cpu"] is None else f"{r['speedup_over_cpu']:.2f}×"
        acc = "–" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.2f}"
        lines.append(
            f"| {r['gpus_per_client']:g} | {r['expected_concurrent_on_gpu']} | "
            f"{r['max_concurrent_clients_on_gpu']} | {r['max_other_processes_on_gpu']} | "
            f"{r['median_round_seconds']:.2f} | {speed} | {r['median_client_fit_seconds']:.2f} | "
            f"{r['train_samples_per_second']:.0f} | {r['peak_gpu_mib']:.0f} | {acc} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

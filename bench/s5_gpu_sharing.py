"""S5 — simulated clients sharing one GPU through Ray's fractional GPU resources (issue 9).

Runs the same simulation (by default P1 with MOON: 10 clients, all in every round) through
``fl_app.launch`` once per GPU share (``--gpus-per-client``): ``0`` trains every client on the
CPU, ``1`` gives each client a whole GPU (one at a time on a one-GPU machine), ``0.5`` and
``0.25`` let two and four clients train on the GPU at once. While a run goes, ``nvidia-smi``
is asked every 0.2 s which processes hold a CUDA context. Of those in the run's own process
tree (the local SuperLink and its descendants: the ServerApp, Ray and its actors), Ray's
workers (titled ``ray::...``) are the simulated clients and the rest (the ServerApp's
evaluator) are counted apart; processes of other programs are left out. So the table shows
that the share is what Ray enforces (at most 1/share clients on the GPU at once, none with
share 0), and what it buys: the median seconds per round (from round 2: round 1 includes
starting the actors and CUDA), the clients' median local-training seconds and the GPU
memory the run held at its peak.

    .venv/bin/python bench/s5_gpu_sharing.py [--method moon] [--experiment p1] [--rounds 4]
        [--shares 0,1,0.5,0.25] [--num-cpus N] [--set "client.batch_size=128"]
Writes bench/results/s5_gpu_sharing.json and .md. Needs a CUDA GPU and ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs import launch, write_table  # noqa: E402

from fl_app.launch import flwr_env, simulation_processes  # noqa: E402

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


def _cmdline(pid: int) -> str | None:
    """The process's command line; None when ``pid`` is not a process here (it ended, or
    nvidia-smi reports PIDs of another PID namespace, as in a container)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None


class GpuUse(NamedTuple):
    """One nvidia-smi sample, restricted to this run's processes."""

    clients: int  # Ray workers (simulated clients' actors) of this run holding a CUDA context
    others: int  # other processes of this run on the GPU (the ServerApp's evaluator)
    unresolved: int  # GPU processes whose PID is not a process here
    mib: float  # GPU memory held by this run's processes


def classify(
    apps: list[tuple[int, float]], ours: set[int], cmdline: Callable[[int], str | None]
) -> GpuUse:
    """Sort nvidia-smi's ``(pid, MiB)`` list into this run's clients and other processes;
    processes of other programs (not in ``ours``) are left out."""
    clients = others = unresolved = 0
    mib = 0.0
    for pid, used in apps:
        cmd = cmdline(pid)
        if cmd is None:
            unresolved += 1
        elif pid in ours:
            clients += is_ray_worker(cmd)
            others += not is_ray_worker(cmd)
            mib += used
    return GpuUse(clients, others, unresolved, mib)


def gpu_apps() -> list[tuple[int, float]]:
    return parse_compute_apps(subprocess.run(QUERY, capture_output=True, text=True).stdout)


def wait_for_idle_gpu(timeout: float = 60.0) -> None:
    """Wait until no Ray worker holds the GPU (the previous share's actors have exited)."""
    end = time.time() + timeout
    while time.time() < end:
        if not any(is_ray_worker(_cmdline(pid) or "") for pid, _ in gpu_apps()):
            return
        time.sleep(0.5)
    print(f"warning: Ray workers still hold the GPU after {timeout:.0f} s", file=sys.stderr)


class GpuSampler(threading.Thread):
    """Polls nvidia-smi until stopped: the most client (Ray worker) processes and other
    processes of the running simulation (:func:`fl_app.launch.simulation_processes`) seen on
    the GPU at once, and the most GPU memory they held together."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period, self.stop = period, threading.Event()
        self.max_clients, self.max_others, self.max_unresolved = 0, 0, 0
        self.max_mib, self.samples = 0.0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            use = classify(gpu_apps(), simulation_processes(flwr_env()), _cmdline)
            self.max_clients = max(self.max_clients, use.clients)
            self.max_others = max(self.max_others, use.others)
            self.max_unresolved = max(self.max_unresolved, use.unresolved)
            self.max_mib = max(self.max_mib, use.mib)
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
    wait_for_idle_gpu()
    sampler = GpuSampler()
    sampler.start()
    t0 = time.time()
    overrides = f"num_rounds={args.rounds} evaluation.plot=false {args.set}".strip()
    options = ("--gpus-per-client", str(share), "--num-cpus", str(args.num_cpus))
    try:
        _, records = launch(out, args.experiment, args.method, overrides, *options)
    finally:
        sampler.stop.set()
        sampler.join()
    wall = time.time() - t0
    rounds = [r for r in records if r["round"] > 0]
    steady = [r for r in rounds if r["round"] > 1]
    if not steady:
        raise SystemExit(f"the run with --gpus-per-client {share} recorded no round after 1")
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
        "max_unresolved_gpu_pids": sampler.max_unresolved,
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
    if args.rounds < 2:
        p.error("--rounds must be at least 2: round 1 includes starting the actors and CUDA")
    shares = [float(s) for s in args.shares.split(",")]
    import torch

    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        raise SystemExit("S5 needs a CUDA GPU and nvidia-smi: not both are here")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in shares:
            rows.append(run_share(args, share, Path(tmp) / f"share{share}"))
            print(json.dumps(rows[-1]), flush=True)
            r = rows[-1]
            if share and r["max_unresolved_gpu_pids"] and not r["max_concurrent_clients_on_gpu"]:
                print(
                    "warning: nvidia-smi lists PIDs that are not processes here (another PID "
                    "namespace?): the client counts of this table are not meaningful",
                    file=sys.stderr,
                )
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
    print(write_table(ROOT / "bench" / "results", "s5_gpu_sharing", out, markdown(out)), end="")


def markdown(out: dict[str, Any]) -> str:
    """The S5 table (per GPU share: clients on the GPU at once, expected and seen; seconds per
    round and speed-up over the CPU run; local-training throughput; peak GPU memory)."""
    lines = [
        f"{out['experiment'].upper()} with `{out['method']}`, {out['rounds']} rounds per share, "
        f"{out['num_cpus']} CPUs for Ray, one {out['device_name']}"
        + (f", `{out['overrides']}`" if out["overrides"] else "")
        + ". Client processes (Ray actors) holding the GPU at once: what Ray allows "
        "(expected) and what `nvidia-smi` saw; samples/s per client (while it trains).",
        "",
        "| GPUs per client | clients on GPU: expected | seen | other GPU processes | s/round "
        "| speed-up over CPU | client fit s | client samples/s | peak GPU MiB | accuracy % |",
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

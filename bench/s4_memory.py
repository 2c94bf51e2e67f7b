"""S4 — peak memory of the P3 simulation (250 nodes, about 25 a round, PMFL client state).

Runs ``flwr run`` (through fl_app.launch) on the p3 experiment for ``--rounds`` rounds and
samples, once a second, the proportional set size (PSS, shared pages counted once) of the
run's local SuperLink and all its descendants (ServerApp, Ray and its actors); other
simulations on the machine are not counted. Client state (PMFL's
buffer of N iterates per node) lives on disk, so memory must stay bounded as rounds go by.

    .venv/bin/python bench/s4_memory.py [--method pmfl] [--rounds 60] [--keep DIR]
Writes bench/results/s4_memory.json, .md and .png (memory over time); with ``--keep`` the
run's own results (summary, per-round log, client state) stay in DIR instead of a
temporary folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs import launch, write_table  # noqa: E402

from fl_app.launch import flwr_env, simulation_processes  # noqa: E402


def simulation_pss_mb(pids: set[int]) -> float:
    """Sum of PSS (MB) over ``pids`` (the simulation's processes: its SuperLink and everything
    it started, :func:`fl_app.launch.simulation_processes`)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="pmfl")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--participation", default="bernoulli")
    p.add_argument("--keep", type=Path, help="output directory to keep the run's results in")
    args = p.parse_args()
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.time()
        while not done.is_set():
            samples.append((time.time() - t0, simulation_pss_mb(simulation_processes(flwr_env()))))
            time.sleep(1.0)

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep.resolve() if args.keep else Path(tmp)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        t0 = time.time()
        overrides = f"num_rounds={args.rounds} server.participation={args.participation}"
        try:
            run, rounds = launch(out, "p3", args.method, overrides)
        finally:
            done.set()
            th.join()
        wall = time.time() - t0
        state_mb = sum(f.stat().st_size for f in run.rglob("*.pt")) / 2**20
    per_round = [r["round_seconds"] for r in rounds if r["round"] > 0]
    peak = max(m for _, m in samples)
    half = len(samples) // 2
    out_json = {
        "method": args.method,
        "rounds": args.rounds,
        "nodes": 250,
        "participation": args.participation,
        "peak_pss_mb": peak,
        "peak_pss_first_half_mb": max(m for _, m in samples[:half]),
        "peak_pss_second_half_mb": max(m for _, m in samples[half:]),
        "client_state_on_disk_mb": state_mb,
        "median_round_seconds": sorted(per_round)[len(per_round) // 2],
        "mean_participants": sum(len(r.get("participants", [])) for r in rounds[1:])
        / max(len(rounds) - 1, 1),
        "wall_seconds": wall,
        "samples": samples,
    }
    res = ROOT / "bench" / "results"
    md = write_table(res, "s4_memory", out_json, markdown(out_json))
    _plot(samples, res / "s4_memory.png", f"{args.method}, {args.rounds} rounds of P3")
    print(md)


def markdown(out: dict[str, Any]) -> str:
    """The S4 table (peak memory, state on disk, time per round) from the JSON figures."""
    return (
        "| method | rounds | peak PSS MB | peak 1st half | peak 2nd half | state on disk MB |"
        " s/round | nodes/round |\n|---|---|---|---|---|---|---|---|\n"
        f"| {out['method']} | {out['rounds']} | {out['peak_pss_mb']:.0f} | "
        f"{out['peak_pss_first_half_mb']:.0f} | {out['peak_pss_second_half_mb']:.0f}"
        f" | {out['client_state_on_disk_mb']:.0f} | {out['median_round_seconds']:.2f} | "
        f"{out['mean_participants']:.1f} |\n"
    )


def _plot(samples: list[tuple[float, float]], path: Path, title: str) -> None:
    """PSS of the whole simulation over wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([t / 60 for t, _ in samples], [m for _, m in samples], lw=1)
    ax.set_xlabel("minutes")
    ax.set_ylabel("PSS of the simulation (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""S1 — framework overhead: the same local training run (a) as a plain PyTorch loop in one
process and (b) through `flwr run` (Ray simulation), per round at steady state.

Same clients, model, seed and local work (``client.steps`` mini-batches per client), the same
FedAvg aggregation and central evaluation every round. (a) trains the clients one after the
other with one thread; (b) runs them in Flower's simulation with ``--actors`` Ray actors of
one CPU each (default 1: the same compute as (a), so the ratio is Flower's own cost; with 2
the clients of a round train in parallel on the two cores). Reported: median seconds per round over
rounds 2..R for both, ``steady_state_ratio = plain / flwr`` (≥ 0.9 is the target: Flower
costs at most ~10% per round), and the start-up time of (b) (until round 1 starts).

    .venv/bin/python bench/s1_overhead.py [--clients 4] [--rounds 6] [--steps 40] [--actors 1]
Writes bench/results/s1_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app import registry  # noqa: E402
from fl_app.config import load_config  # noqa: E402
from fl_app.data import load_client_data, load_test_set  # noqa: E402
from fl_app.models import get_weights, set_weights  # noqa: E402
from fl_app.training import evaluate_model  # noqa: E402


def overrides(args: argparse.Namespace) -> str:
    return (
        f"num_clients={args.clients} num_rounds={args.rounds} client.steps={args.steps} "
        "client.personalized_eval=false data.train_subset=20000 evaluation.plot=false"
    )


def plain_loop(args: argparse.Namespace) -> list[float]:
    torch.set_num_threads(1)
    cfg = load_config("smoke", "fedavg", overrides(args))
    cls = registry.resolve("client", "fedavg")
    torch.manual_seed(cfg["seed"])
    model = cls.build_model(cfg)
    weights = get_weights(model)
    test = load_test_set(cfg)
    data = [load_client_data(cfg, p) for p in range(args.clients)]
    per_round = []
    for rnd in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        res = [
            cls(cfg, data[p], p, torch.device("cpu")).fit(weights, {"server-round": rnd})
            for p in range(args.clients)
        ]
        n = np.array([r[1] for r in res], dtype=np.float64)
        weights = [
            (
                sum(r[0][i].astype(np.float64) * k for r, k in zip(res, n, strict=True)) / n.sum()
            ).astype(np.float32)
            for i in range(len(weights))
        ]
        set_weights(model, weights)
        evaluate_model(model, test, 512, torch.device("cpu"))
        per_round.append(time.perf_counter() - t0)
    return per_round


def flwr_loop(args: argparse.Namespace) -> tuple[list[float], float, float]:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "fl_app.launch",
                "--experiment",
                "smoke",
                "--output-dir",
                out,
                "--set",
                overrides(args),
                "--num-cpus",
                str(args.actors),
                "--cpus-per-client",
                "1",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        rounds = [
            json.loads(x)
            for x in (Path(out) / "smoke" / "fedavg" / "seed0" / "rounds.jsonl")
            .read_text()
            .splitlines()
        ]
    per_round = [r["round_seconds"] for r in rounds if r["round"] > 0]
    return per_round, wall, wall - sum(per_round)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--actors", type=int, default=1, help="Ray actors (CPUs) for the flwr run")
    args = p.parse_args()
    plain = plain_loop(args)
    flwr, wall, startup = flwr_loop(args)
    a, b = statistics.median(plain[1:]), statistics.median(flwr[1:])
    out = {
        "clients": args.clients,
        "rounds": args.rounds,
        "steps": args.steps,
        "actors": args.actors,
        "plain_seconds_per_round": a,
        "flwr_seconds_per_round": b,
        "steady_state_ratio": a / b,
        "flwr_startup_seconds": startup,
        "flwr_wall_seconds": wall,
        "plain_rounds": plain,
        "flwr_rounds": flwr,
    }
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "s1_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    md = (
        "| plain loop s/round | flwr simulation s/round | ratio plain/flwr | flwr start-up s |\n"
        "|---|---|---|---|\n"
        f"| {a:.2f} | {b:.2f} | {a / b:.2f} | {startup:.1f} |\n"
    )
    (res / "s1_overhead.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

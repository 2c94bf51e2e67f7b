"""S1 — framework overhead: the same local training run (a) as a plain PyTorch loop in one
process and (b) through `flwr run` (Ray simulation), per round at steady state.

Same clients, model, seed and local work (``client.steps`` mini-batches per client), the same
FedAvg aggregation and central evaluation every round. (a) trains the clients one after the
other with one thread; (b) runs them in Flower's simulation with ``--actors`` Ray actors of
one CPU each (default 1: the same compute as (a), so the ratio is Flower's own cost; with 2
the clients of a round train in parallel on the two cores). Reported: median seconds per
round over rounds 2..R for both ((a) runs before and after (b), so slow drifts of a shared
machine hit both), ``steady_state_ratio = plain / flwr`` (≥ 0.9 is the target: Flower costs
at most ~10% per round), and the start-up time of (b) (until round 1 starts).
Because training speed alone varies by 10–20% between processes on a shared machine, the
round is also split into phases (``phases``), and Flower's own cost per round (ClientApp
glue + transport + the server's extra work over the plain loop's) is reported with
``overhead_ratio = 1 − cost / flwr round``, which training-speed noise does not move.

    .venv/bin/python bench/s1_overhead.py [--clients 4] [--rounds 6] [--steps 40] [--actors 1]
        [--set "client.batch_size=64"] [--name s1_overhead]
Writes bench/results/<name>.json and .md (e.g. ``--clients 10 --steps 94 --set
client.batch_size=64 --name s1_overhead_p1`` for rounds of P1's size: 10 clients, batch 64,
one epoch of Fashion-MNIST in all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.9  # BENCHMARKS.md S1: steady_state_ratio = plain / flwr >= 0.9
sys.path.insert(0, str(ROOT))

from runs import launch, write_table  # noqa: E402

from core.data import load_client_data, load_test_set  # noqa: E402
from core.models import get_weights, set_weights  # noqa: E402
from core.training import evaluate_model  # noqa: E402
from fl_app import registry  # noqa: E402
from fl_app.config import load_config  # noqa: E402


def overrides(args: argparse.Namespace) -> str:
    return (
        f"num_clients={args.clients} num_rounds={args.rounds} client.steps={args.steps} "
        "client.personalized_eval=false data.train_subset=20000 evaluation.plot=false " + args.set
    )


def plain_loop(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Seconds per round, and per round the clients' summed ``fit_seconds``."""
    torch.set_num_threads(1)
    cfg = load_config("smoke", "fedavg", overrides(args))
    cls = registry.resolve("client", "fedavg")
    torch.manual_seed(cfg["seed"])
    model = cls.build_model(cfg)
    weights = get_weights(model)
    test = load_test_set(cfg)
    data = [load_client_data(cfg, p) for p in range(args.clients)]
    per_round, fit = [], []
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
        fit.append(sum(r[2]["fit_seconds"] for r in res))
    return per_round, fit


def flwr_loop(args: argparse.Namespace) -> tuple[list[dict[str, float]], float, float]:
    """Per round (from 1): its phases (see ``phases``); the run's wall time; start-up."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        options = ("--num-cpus", str(args.actors), "--cpus-per-client", "1")
        _, rounds = launch(Path(out), "smoke", "fedavg", overrides(args), *options)
        wall = time.perf_counter() - t0
    per_round = [phases(r) for r in rounds if r["round"] > 0]
    return per_round, wall, wall - sum(r["round"] for r in per_round)


def phases(record: dict) -> dict[str, float]:
    """Where a simulated round's time goes: ``fit`` (the clients' local optimisation, summed),
    ``client_glue`` (the ClientApp around it: decoding, building the client, weights in and
    out), ``transport`` (Flower: LinkState, Ray, the polling loops; the exchange minus the
    ClientApp time, which with one actor runs one client after the other), ``server`` (our
    aggregation, diagnostics and central evaluation)."""
    clients = record.get("clients", {}).values()
    fit = sum(c["fit_seconds"] for c in clients)
    app = sum(c["app_seconds"] for c in clients)
    return {
        "round": record["round_seconds"],
        "fit": fit,
        "client_glue": app - fit,
        "transport": record["exchange_seconds"] - app,
        "server": record["round_seconds"] - record["exchange_seconds"],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--actors", type=int, default=1, help="Ray actors (CPUs) for the flwr run")
    p.add_argument("--set", default="", help="extra config overrides for both runs")
    p.add_argument("--name", default="s1_overhead", help="results file name (no extension)")
    args = p.parse_args()
    # plain loop before and after the flwr run: slow drifts of this shared machine hit both
    before, fit_before = plain_loop(args)
    flwr, wall, startup = flwr_loop(args)
    after, fit_after = plain_loop(args)
    plain, plain_fit = before[1:] + after[1:], fit_before[1:] + fit_after[1:]
    a = statistics.median(plain)
    med = {k: statistics.median(r[k] for r in flwr[1:]) for k in flwr[0]}
    b = med["round"]
    # Flower's own cost per round, from the phases of the same run: what the flwr round
    # spends besides the clients' training and the plain loop's aggregation + evaluation
    plain_server = a - statistics.median(plain_fit)
    overhead = med["client_glue"] + med["transport"] + med["server"] - plain_server
    out = {
        "clients": args.clients,
        "overrides": overrides(args),
        "rounds": args.rounds,
        "steps": args.steps,
        "actors": args.actors,
        "plain_seconds_per_round": a,
        "flwr_seconds_per_round": b,
        "steady_state_ratio": a / b,
        "overhead_seconds_per_round": overhead,
        "overhead_ratio": 1 - overhead / b,
        "flwr_startup_seconds": startup,
        "flwr_wall_seconds": wall,
        "plain_fit_seconds_per_round": statistics.median(plain_fit),
        "flwr_phases_median": med,
        "plain_rounds_before": before,
        "plain_rounds_after": after,
        "flwr_rounds": flwr,
    }
    print(write_table(ROOT / "bench" / "results", args.name, out, markdown(out)))


def markdown(out: dict[str, Any]) -> str:
    """The S1 tables (ratio with ✓/✗, Flower's cost; seconds per round by phase) from the
    figures :func:`main` writes to the JSON file."""
    a, b = out["plain_seconds_per_round"], out["flwr_seconds_per_round"]
    plain_fit, med = out["plain_fit_seconds_per_round"], out["flwr_phases_median"]
    overhead = out["overhead_seconds_per_round"]
    return (
        "| plain loop s/round | flwr simulation s/round | ratio plain/flwr (target ≥ 0.9) "
        "| Flower's cost s/round | 1 − cost/round | flwr start-up s |\n"
        "|---|---|---|---|---|---|\n"
        f"| {a:.2f} | {b:.2f} | {a / b:.3f} {'✓' if a / b >= TARGET else '✗'} "
        f"| {overhead:.3f} | {1 - overhead / b:.3f} | {out['flwr_startup_seconds']:.1f} |\n\n"
        "Median seconds per round by phase (fit = the clients' local optimisation, summed):\n\n"
        "| run | fit | client glue | Flower transport | server | round |\n"
        "|---|---|---|---|---|---|\n"
        f"| plain loop | {plain_fit:.3f} | – | – | {a - plain_fit:.3f} | {a:.3f} |\n"
        f"| flwr simulation | {med['fit']:.3f} | {med['client_glue']:.3f} | "
        f"{med['transport']:.3f} | {med['server']:.3f} | {b:.3f} |\n"
    )


if __name__ == "__main__":
    main()

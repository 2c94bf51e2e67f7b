"""GNE's aggregation weights against the clients' sample shares, from finished runs.

For every run of a GNE-aggregated method (``aggregation_weights`` in its round log), reads
each client's weight per round and its share of the round's samples, and reports per run:
the correlation between a client's mean weight and its sample share, and the weight the
smallest and the largest client received on average. Explains what Nash bargaining does
with clients of very different sizes under epoch-based local training (README, P1).

    .venv/bin/python bench/gne_weights.py [--runs bench/results/p1]
        [--methods fedrane fedrcl_gne fedccl_gne] [--name gne_weights]
Writes bench/results/<name>.md and .json. It reads per-client records, which only a run's
full round log holds: a light run (bench/light.py) is refused with a message saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from light import LightRunError, full_records
from runs import write_table

ROOT = Path(__file__).resolve().parent.parent


def weight_shares(records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds × clients) GNE weights and sample shares, clients in partition order, from the
    round records that carry ``aggregation_weights``; rounds with a different set of
    clients than the first such round are skipped (P1 has every client every round)."""
    rows = [r for r in records if r.get("aggregation_weights")]
    if not rows:
        raise ValueError("no round carries aggregation_weights: not a GNE run")
    pids = sorted(rows[0]["aggregation_weights"], key=int)
    weights, shares = [], []
    for r in rows:
        if sorted(r["aggregation_weights"], key=int) != pids:
            continue
        n = np.array([r["clients"][p]["num_examples"] for p in pids], dtype=float)
        weights.append([r["aggregation_weights"][p] for p in pids])
        shares.append(n / n.sum())
    return np.asarray(weights), np.asarray(shares)


def summarise(weights: np.ndarray, shares: np.ndarray) -> dict[str, float]:
    """Correlation of mean weight and mean share over clients, and the mean weights of the
    smallest and the largest client next to their shares."""
    w, s = weights.mean(axis=0), shares.mean(axis=0)
    small, large = int(np.argmin(s)), int(np.argmax(s))
    return {
        "corr_weight_share": float(np.corrcoef(w, s)[0, 1]),
        "smallest_share": float(s[small]),
        "smallest_weight": float(w[small]),
        "largest_share": float(s[large]),
        "largest_weight": float(w[large]),
    }


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=Path, default=ROOT / "bench" / "results" / "p1")
    p.add_argument("--methods", nargs="+", default=["fedrane", "fedrcl_gne", "fedccl_gne"])
    p.add_argument("--name", default="gne_weights", help="bench/results/<name>.md/.json")
    args = p.parse_args()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method in args.methods:
        for sdir in sorted((args.runs / method).glob("seed*")):
            try:
                recs = full_records(sdir, "each client's aggregation weight and sample count")
            except LightRunError as err:
                return str(err)
            out.setdefault(method, {})[sdir.name] = summarise(*weight_shares(recs))
    if not out:
        return f"no runs of {args.methods} under {args.runs}"
    lines = [
        "| method | seed | corr(weight, sample share) | smallest client: share → weight | "
        "largest client: share → weight |",
        "|---|---|---|---|---|",
    ]
    for method, seeds in out.items():
        for seed, r in seeds.items():
            lines.append(
                f"| {method} | {seed.removeprefix('seed')} | {r['corr_weight_share']:+.2f} | "
                f"{100 * r['smallest_share']:.1f} % → {100 * r['smallest_weight']:.1f} % | "
                f"{100 * r['largest_share']:.1f} % → {100 * r['largest_weight']:.1f} % |"
            )
    res = ROOT / "bench" / "results"
    print(write_table(res, args.name, out, "\n".join(lines) + "\n"), end="")
    return None


if __name__ == "__main__":
    sys.exit(main())

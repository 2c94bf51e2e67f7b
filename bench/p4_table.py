"""P4 results table (BENCHMARKS.md: the FedRCL-style protocol) from finished runs.

    for k in 0 1 2; do for m in fedrcl fedscl moon fedavg; do
      make run EXPERIMENT=p4 METHOD=$m SEED=$k OUTPUT_DIR=/abs/p4runs; done; done
    .venv/bin/python bench/p4_table.py --runs /abs/p4runs [--name p4]

Reads <runs>/p4/<method>/seed*/, copies the runs in the light form (bench/light.py) to
bench/results/<name>/, and writes bench/results/<name>.md/.json and <name>_curves.png
(accuracy and FedRCL's effective rank against the round). Per method: EMA(0.9) of the
global test accuracy (FedRCL's metric, taken over the evaluated rounds), final accuracy, the
mean accuracy of the early rounds (evaluations up to round ``EARLY``, where FedRCL Fig. 1
shows FedSCL behind) and the final effective rank; then the protocol's target, checked on
the seed medians: FedRCL > MOON ≥ FedAvg in EMA accuracy, FedSCL below FedRCL early.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from runs import (
    copy_runs,
    finished_runs,
    lossy_lines,
    lossy_section,
    lost_count,
    per_seed_label,
    seeds_label,
    write_table,
)

from fl_app.results import Curve, curve, mean_curve

ROOT = Path(__file__).resolve().parent.parent
EARLY = 50  # the early rounds: FedRCL Fig. 1 compares FedSCL and FedRCL over the first 50


def early_mean(curve: Curve, until: int = EARLY) -> float:
    """Mean accuracy of the evaluations in rounds 1..``until`` (round 0, the untrained
    model, left out): how fast a method learns, one number per run."""
    early = [a for r, a in curve if 0 < r <= until]
    if not early:
        raise ValueError(f"no evaluation in rounds 1..{until}: evaluate more often")
    return float(np.mean(early))


def targets(table: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """The P4 target's checks on the seed medians, each ``(statement, holds)``; ``holds`` is
    None where a method it names was not run."""

    def med(method: str, key: str) -> float | None:
        row = table.get(method)
        return None if row is None else float(row[key]["median"])

    def check(a: float | None, b: float | None, strict: bool) -> bool | None:
        if a is None or b is None:
            return None
        return a > b if strict else a >= b

    ema = {m: med(m, "ema") for m in ("fedrcl", "moon", "fedavg")}
    early = {m: med(m, "early") for m in ("fedrcl", "fedscl")}
    return [
        ("FedRCL > MOON (EMA)", check(ema["fedrcl"], ema["moon"], strict=True)),
        ("MOON ≥ FedAvg (EMA)", check(ema["moon"], ema["fedavg"], strict=False)),
        (
            f"FedSCL below FedRCL early (mean accuracy, rounds ≤ {EARLY})",
            check(early["fedrcl"], early["fedscl"], strict=True),
        ),
    ]


def _stats(values: list[float]) -> dict[str, Any]:
    arr = np.array(values)
    return {
        "per_seed": [float(v) for v in arr],
        "median": float(np.median(arr)),
        "mean": float(arr.mean()),
        "std": float(arr.std()),
    }


def markdown(table: dict[str, dict[str, Any]], lossy: list[str] | None = None) -> str:
    """The table (methods by median EMA accuracy), the target's checks, and under a † the
    runs that lost client results (``lossy``, :func:`runs.lossy_lines`)."""
    lines = [
        "| method | seeds | EMA(0.9) accuracy %: median | mean ± std | per seed "
        f"| final % (mean) | early: rounds ≤ {EARLY} % (median) | effective rank, final (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in sorted(table.items(), key=lambda kv: -kv[1]["ema"]["median"]):
        e = r["ema"]
        rank = "–" if r["final_rank_mean"] is None else f"{r['final_rank_mean']:.1f}"
        lines.append(
            f"| {m} | {len(r['seeds'])} | {e['median']:.2f} | {e['mean']:.2f} ± {e['std']:.2f}"
            f" | {per_seed_label(e['per_seed'], r.get('lost_results'))} | {r['final_mean']:.2f}"
            f" | {r['early']['median']:.2f} | {rank} |"
        )
    lines += ["", "Target (BENCHMARKS.md P4), on the seed medians:"]
    for statement, holds in targets(table):
        verdict = "not run" if holds is None else ("holds" if holds else "missed")
        lines.append(f"- {statement}: {verdict}")
    lines += lossy_section(lossy or [])
    return "\n".join(lines) + "\n"


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", required=True, help="the runs' output_dir (holding p4/<method>/)")
    p.add_argument("--name", default="p4", help="results name: bench/results/<name>*")
    args = p.parse_args()
    res, base = ROOT / "bench" / "results", Path(args.runs) / "p4"
    # checked first, copied to bench/results/<name>/ once they pass
    found_runs = finished_runs(base)
    if not found_runs:
        return f"no finished P4 runs under {Path(args.runs) / 'p4'}: pass --runs <output_dir>"
    lengths = {s["num_rounds"] for found in found_runs.values() for s, _, _ in found}
    if len(lengths) > 1:  # an EMA or a final accuracy means something else at each length
        return f"the P4 runs differ in num_rounds ({sorted(lengths)}): table one length at a time"
    table: dict[str, dict[str, Any]] = {}
    accuracy: dict[str, list[Curve]] = {}
    ranks: dict[str, list[Curve]] = {}
    for method, found in found_runs.items():
        rows = [s for s, _, _ in found]
        accuracy[method] = [curve(recs) for _, recs, _ in found]
        ranks[method] = [curve(recs, "effective_rank") for _, recs, _ in found]
        finals = [c[-1][1] for c in ranks[method] if c]
        if 0 < len(finals) < len(rows):
            return (
                f"{method}: some runs have no effective rank:"
                " run them all with evaluation.effective_rank=true"
            )
        table[method] = {
            "seeds": [s["seed"] for s in rows],
            "lost_results": [lost_count(s) for s in rows],
            "rounds": rows[0]["num_rounds"],
            "ema": _stats([s["ema_accuracy"] * 100 for s in rows]),
            "final_mean": float(np.mean([s["final_accuracy"] for s in rows]) * 100),
            "early": _stats([early_mean(c) * 100 for c in accuracy[method]]),
            "final_rank_mean": float(np.mean(finals)) if finals else None,
        }
    copy_runs(found_runs, res / args.name)
    table_md = markdown(table, lossy_lines("", found_runs))
    print(write_table(res, args.name, table, table_md), end="")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, rank_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for m in sorted(accuracy):
        label = f"{m} ({seeds_label(len(accuracy[m]))})"
        acc_ax.plot(*mean_curve(accuracy[m]), label=label)
        if all(ranks[m]):
            rank_ax.plot(*mean_curve(ranks[m]), label=label)
    late = [a for curves in accuracy.values() for c in curves for r, a in c if r > EARLY // 2]
    if late:  # zoom past the first rounds' climb; short runs keep the whole range
        low = max(0.0, float(np.percentile(late, 2)) - 0.05)
        acc_ax.set_ylim(low, 1.0 if max(late) > 0.9 else 0.9)
    acc_ax.set_ylabel("global test accuracy")
    rank_ax.set_ylabel("effective rank of the test features")
    for ax in (acc_ax, rank_ax):
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.name}: Fashion-MNIST, 100 clients, 5 a round (seed mean)")
    fig.tight_layout()
    fig.savefig(res / f"{args.name}_curves.png", dpi=110)
    return None


if __name__ == "__main__":
    sys.exit(main())

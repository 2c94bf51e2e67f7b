"""Methods side by side: one table (and a curves plot) from the runs of one experiment.

    make compare RUNS=results/p1                           # after make run ... OUTPUT_DIR=results
    python -m fl_app.compare results/p1 --metric ema --baseline fedavg --plot p1.png
    python -m fl_app.compare bench/results/p1              # the committed P1 runs

Reads ``<runs>/<method>/seed<k>/summary.json`` (what ``make run`` writes under
``<output_dir>/<experiment>/``) and, for ``--plot``, each run's round log. Accuracy figures
are over the runs that completed all their rounds; a run that is still going, was
interrupted or failed is listed under the table instead, so a half-finished grid cannot pass
for a finished one. ``Δ`` compares each method with the baseline on the seeds both have (the
seed fixes the data partition, which moves accuracy by several points).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.results import Curve, curve, mean_curve, parse_rounds, read_round_log

METRICS = {  # --metric -> (summary.json key, column title)
    "last5": ("last5_accuracy", "last-5 accuracy %"),
    "final": ("final_accuracy", "final accuracy %"),
    "best": ("best_accuracy", "best accuracy %"),
    "ema": ("ema_accuracy", "EMA(0.9) accuracy %"),
    "top5": ("top5_accuracy", "top-5 accuracy %"),
}


@dataclass
class MethodRuns:
    """One method's runs: the summaries of the completed ones (by seed) and a line for each
    other run."""

    completed: dict[int, dict[str, Any]] = field(default_factory=dict)
    dirs: dict[int, Path] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)


def load_runs(base: Path) -> dict[str, MethodRuns]:
    """``{method: MethodRuns}`` for every ``base/<method>/seed<k>/summary.json``. A run is
    completed when its status says so and it ran all its rounds. Raises ValueError, naming
    what to pass instead, when ``base`` holds no run."""
    if not base.is_dir():
        raise ValueError(f"{base} is not a folder: pass <output_dir>/<experiment>, e.g. results/p1")
    out: dict[str, MethodRuns] = {}
    for sf in sorted(base.glob("*/seed*/summary.json")):
        method, seed_dir = sf.parent.parent.name, sf.parent
        try:
            seed = int(seed_dir.name.removeprefix("seed"))
            s = json.loads(sf.read_text())
        except (ValueError, json.JSONDecodeError) as err:
            raise ValueError(f"{sf}: not a run summary ({err})") from None
        runs = out.setdefault(method, MethodRuns())
        done = s.get("rounds_completed", 0)
        if s.get("status") == "completed" and done >= s.get("num_rounds", 0):
            runs.completed[seed], runs.dirs[seed] = s, seed_dir
        else:
            runs.unfinished.append(
                f"{method} seed {seed}: {s.get('status', 'no status')} after round {done} "
                f"of {s.get('num_rounds', '?')}"
            )
    if not out:
        below = {p.parents[2].name for p in base.glob("*/*/seed*/summary.json")}
        hint = (
            f"it holds the experiments {', '.join(sorted(below))}: pass {base}/<experiment>"
            if below
            else "pass <output_dir>/<experiment> of finished runs, e.g. results/p1"
        )
        raise ValueError(f"no runs (<method>/seed<k>/summary.json) under {base}: {hint}")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def comparison(
    runs: dict[str, MethodRuns], metric: str = "last5", baseline: str | None = None
) -> list[dict[str, Any]]:
    """One row of figures per method with a completed run, best median first: the metric's
    median, mean, standard deviation over seeds (population, as in the project's results
    tables) and per-seed values (fractions); the mean paired difference to ``baseline`` over
    the seeds both have (None without shared seeds, or for the baseline itself); the best
    accuracy and the last-5 personalised accuracy (P-FL), each a mean over seeds; the failed
    and dropped client results; the rounds; and the minutes a run."""
    key = METRICS[metric][0]
    base = runs[baseline].completed if baseline in runs else {}
    rows = []
    for method, mr in runs.items():
        seeds = sorted(s for s, summ in mr.completed.items() if summ.get(key) is not None)
        if not seeds:
            continue
        values = [mr.completed[s][key] for s in seeds]
        shared = [s for s in seeds if base.get(s, {}).get(key) is not None]
        delta = (
            statistics.fmean(mr.completed[s][key] - base[s][key] for s in shared)
            if shared and method != baseline
            else None
        )
        summaries = [mr.completed[s] for s in seeds]
        pfl = [x["last5_personal_accuracy"] for x in summaries if x.get("last5_personal_accuracy")]
        rows.append(
            {
                "method": method,
                "seeds": seeds,
                "values": values,
                "median": statistics.median(values),
                "mean": statistics.fmean(values),
                "std": statistics.pstdev(values),
                "delta": delta,
                "delta_seeds": len(shared) if delta is not None else 0,
                "best": statistics.fmean(x["best_accuracy"] for x in summaries),
                "personal": statistics.fmean(pfl) if pfl else None,
                "failed": sum(
                    x.get("failed_results", 0) + x.get("dropped_results", 0) for x in summaries
                ),
                "rounds": sorted({x["num_rounds"] for x in summaries}),
                "minutes": statistics.fmean(x.get("wall_seconds", 0.0) for x in summaries) / 60,
            }
        )
    return sorted(rows, key=lambda r: (-r["median"], r["method"]))


def markdown(
    rows: list[dict[str, Any]], runs: dict[str, MethodRuns], metric: str, baseline: str | None
) -> str:
    """The comparison as a markdown table, then the runs it leaves out."""
    title = METRICS[metric][1]
    head = (
        f"| method | seeds | {title}: median | mean ± std | per seed | Δ {baseline or 'baseline'}, "
        "same seeds | best % | P-FL % | failed/dropped results | rounds | min a run |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        delta = "–" if r["delta"] is None else f"{100 * r['delta']:+.2f} ({r['delta_seeds']})"
        per_seed = " / ".join(f"{100 * v:.1f}" for v in r["values"])
        lines.append(
            f"| {r['method']} | {len(r['seeds'])} | {_pct(r['median'])} | {_pct(r['mean'])} ± "
            f"{100 * r['std']:.2f} | {per_seed} | {delta} | {_pct(r['best'])} | "
            f"{_pct(r['personal'])} | {r['failed']} | {'/'.join(map(str, r['rounds']))} | "
            f"{r['minutes']:.1f} |"
        )
    notes = [u for mr in runs.values() for u in mr.unfinished]
    if any(len(r["rounds"]) > 1 for r in rows):
        notes.append("a method whose runs have different numbers of rounds mixes protocols")
    if notes:
        lines += ["", "Not in the figures:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, MethodRuns], rows: list[dict[str, Any]], path: Path) -> None:
    """Seed-mean test accuracy per round of every method in ``rows``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        mr = runs[r["method"]]
        curves: list[Curve] = [
            curve(parse_rounds(read_round_log(mr.dirs[s])), "accuracy") for s in r["seeds"]
        ]
        curves = [[(t, 100 * a) for t, a in c if t > 0] for c in curves]
        if all(curves):
            n = len(curves)
            ax.plot(*mean_curve(curves), label=f"{r['method']} ({n} seed{'s' * (n != 1)})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy %, mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fl_app.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", type=Path, help="<output_dir>/<experiment>, e.g. results/p1")
    p.add_argument("--metric", choices=sorted(METRICS), default="last5")
    p.add_argument(
        "--baseline", default="fedavg", help="method the Δ column compares with [fedavg]"
    )
    p.add_argument("--plot", type=Path, help="also write the seed-mean accuracy curves here")
    p.add_argument("--output", type=Path, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    baseline = args.baseline if args.baseline in runs else None
    rows = comparison(runs, args.metric, baseline)
    table = markdown(rows, runs, args.metric, baseline)
    if baseline is None:
        print(f"(no {args.baseline} runs under {args.runs}: no Δ column figures)", file=sys.stderr)
    print(table, end="")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(table)
    if args.plot and rows:
        plot(runs, rows, args.plot)
        print(f"curves: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""P3 results table (BENCHMARKS.md: PMFL participation heterogeneity) from finished runs.

One output_dir per participation pattern, as the runs were made:

    for pat in bernoulli markov cyclic; do for m in pmfl fedau fedavg; do
      make run EXPERIMENT=p3 METHOD=$m OUTPUT_DIR=/abs/p3runs/$pat \\
        SET="server.participation=$pat num_rounds=100"; done; done
    .venv/bin/python bench/p3_table.py --runs /abs/p3runs

Reads <runs>/<pattern>/p3/<method>/seed*/, copies the runs in the light form
(bench/light.py) to bench/results/<name>/<pattern>/, and writes bench/results/<name>.md/.json and
<name>_curves.png (``--name``, default p3): the last-5-evaluation global test accuracy (mean
over seeds, with the median for several seeds) per method and pattern.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from runs import collect, seeds_label, write_table

from fl_app.results import mean_curve

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = ("bernoulli", "markov", "cyclic")


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", required=True, help="folder holding one output_dir per pattern")
    p.add_argument(
        "--name", default="p3", help="results name: bench/results/<name>/, <name>.md/.json"
    )
    args = p.parse_args()
    res = ROOT / "bench" / "results"
    name = args.name
    found = {
        pat: collect(Path(args.runs) / pat / "p3", res / name / pat)
        for pat in PATTERNS
        if (Path(args.runs) / pat / "p3").is_dir()
    }
    if not any(found.values()):
        return f"no finished P3 runs under {args.runs}/<pattern>/p3: pass --runs"
    table: dict[str, dict[str, dict]] = {}
    for pat, runs in found.items():
        for method, rows in runs.items():
            acc = [s["last5_accuracy"] * 100 for s, _ in rows]
            table.setdefault(method, {})[pat] = {
                "seeds": [s["seed"] for s, _ in rows],
                "rounds": rows[0][0]["num_rounds"],
                "last5_median": float(np.median(acc)),
                "last5_mean": float(np.mean(acc)),
                "last5_std": float(np.std(acc)),
                "best_mean": float(np.mean([s["best_accuracy"] for s, _ in rows]) * 100),
                "seconds_per_round": float(
                    np.mean([s["wall_seconds"] / s["num_rounds"] for s, _ in rows])
                ),
            }
    pats = [p for p in PATTERNS if p in found]
    lines = [
        "| method | " + " | ".join(f"{p} last-5 % (best %)" for p in pats) + " |",
        "|---|" + "---|" * len(pats),
    ]
    for method in sorted(
        table, key=lambda m: -np.mean([c["last5_mean"] for c in table[m].values()])
    ):
        cells = []
        for pat in pats:
            c = table[method].get(pat)
            seeds = (
                ""
                if not c or len(c["seeds"]) == 1
                else f" ± {c['last5_std']:.2f} ({len(c['seeds'])} seeds, median"
                f" {c['last5_median']:.2f})"
            )
            cells.append(
                "–" if c is None else f"{c['last5_mean']:.2f}{seeds} ({c['best_mean']:.2f})"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    print(write_table(res, name, table, "\n".join(lines) + "\n"), end="")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pats), figsize=(5 * len(pats), 4), sharey=True, squeeze=False)
    for ax, pat in zip(axes[0], pats, strict=True):
        for method, rows in sorted(found[pat].items()):
            ax.plot(*mean_curve([c for _, c in rows]), label=f"{method} ({seeds_label(len(rows))})")
        ax.set_title(f"P3, {pat} participation")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("global test accuracy")
    fig.tight_layout()
    fig.savefig(res / f"{name}_curves.png", dpi=100)
    return None


if __name__ == "__main__":
    sys.exit(main())

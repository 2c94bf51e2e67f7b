"""FedCCL Table 8 on P1: clean, FGSM and PGD-20 accuracy of the global model, from runs.

    make run EXPERIMENT=p1 METHOD=fedavg SEED=0 OUTPUT_DIR=/abs/robust SET="evaluation.robust=true"
    make run EXPERIMENT=p1 METHOD=fedavg_plus SEED=0 OUTPUT_DIR=/abs/robust
    make run EXPERIMENT=p1 METHOD=fedccl_plus SEED=0 OUTPUT_DIR=/abs/robust
    .venv/bin/python bench/robust_table.py --runs /abs/robust

Reads <runs>/p1/<method>/seed*/ (runs with ``evaluation.robust``), copies summaries and round
logs to bench/results/<name>/ and writes bench/results/<name>.md/.json: per method the
last-5-round mean of the clean accuracy (whole test set) and of the FGSM and PGD-20
accuracies (first ``evaluation.robust_samples`` test samples), next to the paper's Table 8
(Fashion-MNIST).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from runs import collect, parse_rounds, read_rounds

ROOT = Path(__file__).resolve().parent.parent
PAPER = {  # FedCCL Table 8, Fashion-MNIST: clean, FGSM, PGD-20 (%)
    "fedavg": (78.77, 36.16, 0.17),
    "fedavg_plus": (62.32, 47.65, 0.43),
    "fedccl_plus": (67.64, 54.97, 0.51),
}
COLUMNS = ("accuracy", "robust_fgsm", "robust_pgd")


def last5(run: Path, key: str) -> float:
    """Mean of ``key`` over the last five evaluations in a run's round log (%)."""
    vals = [r[key] for r in parse_rounds(read_rounds(run)) if r.get(key) is not None]
    if not vals:
        raise SystemExit(f"{run} has no {key!r}: was it run with evaluation.robust=true?")
    return 100 * float(np.mean(vals[-5:]))


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", required=True, help="the runs' output_dir")
    p.add_argument("--name", default="p1_robust", help="results name (bench/results/<name>*)")
    args = p.parse_args()
    dest = ROOT / "bench" / "results" / args.name
    runs = collect(Path(args.runs) / "p1", dest)
    if not runs:
        return f"no finished P1 runs under {Path(args.runs) / 'p1'}"
    table = {}
    for method, found in runs.items():
        seeds = [s["seed"] for s, _ in found]
        per_seed = {k: [last5(dest / method / f"seed{s}", k) for s in seeds] for k in COLUMNS}
        table[method] = {"seeds": seeds, **{k: float(np.mean(v)) for k, v in per_seed.items()}}
        table[method]["per_seed"] = per_seed
    (ROOT / "bench" / "results" / f"{args.name}.json").write_text(
        json.dumps(table, indent=2) + "\n"
    )
    lines = [
        "| method | seeds | clean % | FGSM % | PGD-20 % | paper (FMNIST): clean / FGSM / PGD-20 |",
        "|---|---|---|---|---|---|",
    ]
    order = [m for m in PAPER if m in table] + sorted(set(table) - set(PAPER))
    for m in order:
        r = table[m]
        paper = " / ".join(f"{v:.2f}" for v in PAPER[m]) if m in PAPER else "–"
        lines.append(
            f"| {m} | {len(r['seeds'])} | {r['accuracy']:.2f} | {r['robust_fgsm']:.2f}"
            f" | {r['robust_pgd']:.2f} | {paper} |"
        )
    (ROOT / "bench" / "results" / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return None


if __name__ == "__main__":
    sys.exit(main())

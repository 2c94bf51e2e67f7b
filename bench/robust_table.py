"""FedCCL Table 8 on P1: clean, FGSM and PGD-20 accuracy of the global model, from runs.

    make run EXPERIMENT=p1 METHOD=fedavg SEED=0 OUTPUT_DIR=/abs/robust SET="evaluation.robust=true"
    make run EXPERIMENT=p1 METHOD=fedavg_plus SEED=0 OUTPUT_DIR=/abs/robust
    make run EXPERIMENT=p1 METHOD=fedccl_plus SEED=0 OUTPUT_DIR=/abs/robust
    .venv/bin/python bench/robust_table.py --runs /abs/robust --eps 0.1 0.2 0.3 0.5 0.85

Reads <runs>/p1/<method>/seed*/ (runs with ``evaluation.robust``), copies them in the light
form (bench/light.py) to bench/results/<name>/ and writes bench/results/<name>.md/.json: per
method the last-5-round mean of the clean accuracy (whole test set) and of the FGSM and PGD-20
accuracies (first ``evaluation.robust_samples`` test samples), averaged over seeds (each seed's
value in brackets when there are several), next to the paper's Table 8 (Fashion-MNIST).
With ``--eps``, the final global model of each method's first seed (its ``checkpoint.npz``)
is also attacked at each radius: bench/results/<name>_eps.md/.json/.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from runs import collect, per_seed_label, write_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clients.adversarial import robust_accuracy  # noqa: E402
from core.data import NORMALIZATION, TensorSplit  # noqa: E402
from core.params import Config  # noqa: E402
from core.training import evaluate_model  # noqa: E402
from fl_app import registry  # noqa: E402
from fl_app.config import load_config  # noqa: E402
from fl_app.results import read_records  # noqa: E402
from fl_app.server_app import CentralEvaluator, Checkpoint  # noqa: E402

PAPER = {  # FedCCL Table 8, Fashion-MNIST: clean, FGSM, PGD-20 (%)
    "fedavg": (78.77, 36.16, 0.17),
    "fedavg_plus": (62.32, 47.65, 0.43),
    "fedccl_plus": (67.64, 54.97, 0.51),
}
COLUMNS = ("accuracy", "robust_fgsm", "robust_pgd")


def last5(run: Path) -> dict[str, float]:
    """Mean of each of ``COLUMNS`` over the last five evaluations in a run's round records
    (%): its round log, or its light curve (which keeps every figure's last five)."""
    records = read_records(run)
    out = {}
    for key in COLUMNS:
        vals = [r[key] for r in records if r.get(key) is not None]
        if not vals:
            raise SystemExit(f"{run} has no {key!r}: was it run with evaluation.robust=true?")
        out[key] = 100 * float(np.mean(vals[-5:]))
    return out


def _cell(mean: float, per_seed: list[float]) -> str:
    """A table cell: the mean over seeds, with the per-seed values when there are several."""
    if len(per_seed) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({per_seed_label(per_seed)})"


def run_config(run: Path) -> Config:
    """The config a run was made with (its ``config.yaml``, validated)."""
    return load_config(overrides=yaml.safe_load((run / "config.yaml").read_text()))


def eps_sweep(run: Path, cfg: Config, eps_grid: list[float]) -> dict[str, list[float]]:
    """FGSM and PGD accuracy (%) of a run's final global model at each radius in
    ``eps_grid`` (standardised inputs), with the run's own config ``cfg`` (:func:`run_config`:
    its ``evaluation.robust_steps`` and ``robust_samples``); ``clean`` is the accuracy on the
    same samples."""
    loaded = Checkpoint(run).load()
    if loaded is None:
        raise SystemExit(f"{run} has no checkpoint.npz/.json to attack")
    _, arrays, _ = loaded
    ev = CentralEvaluator(cfg, registry.resolve("client", cfg["client"]["name"]))
    ev.load(arrays)
    e, bs = cfg["evaluation"], cfg["evaluation"]["batch_size"]
    n = min(len(ev.test), e["robust_samples"])
    _, clean = evaluate_model(ev.model, TensorSplit(ev.test.x[:n], ev.test.y[:n]), bs, ev.device)
    torch.manual_seed(cfg["seed"])  # PGD's random starts
    out: dict[str, list[float]] = {"clean": [100 * clean], "fgsm": [], "pgd": []}
    for eps in eps_grid:
        acc = robust_accuracy(ev.model, ev.test, eps, e["robust_steps"], n, bs, ev.device)
        out["fgsm"].append(100 * acc["robust_fgsm"])
        out["pgd"].append(100 * acc["robust_pgd"])
    return out


def write_sweep(runs: dict[str, Path], eps_grid: list[float], res: Path, name: str) -> None:
    """The ``--eps`` table, JSON and plot (accuracy against the attack radius) of one run per
    method (``{method: run directory}``), written to ``res``."""
    configs = {m: run_config(run) for m, run in runs.items()}
    sweep: dict[str, dict[str, Any]] = {
        m: {"run": run.name, **eps_sweep(run, configs[m], eps_grid)} for m, run in runs.items()
    }
    methods = list(runs)
    head = " | ".join(f"ε {e:g}" for e in eps_grid)
    lines = [
        f"| method | attack | clean | {head} |",
        "|---|---|---|" + "---|" * len(eps_grid),
    ]
    for m in methods:
        for attack, label in (("fgsm", "FGSM"), ("pgd", "PGD-20")):
            cells = " | ".join(f"{v:.1f}" for v in sweep[m][attack])
            lines.append(f"| {m} | {label} | {sweep[m]['clean'][0]:.1f} | {cells} |")
    figures = {"eps": eps_grid, **sweep}
    print(write_table(res, f"{name}_eps", figures, "\n".join(lines) + "\n"), end="")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfgs = configs.values()
    train_eps = sorted({c["client"]["adv_eps"] for c in cfgs if c["client"]["adversarial"]})
    pixel = sorted({1 / NORMALIZATION[c["data"]["dataset"]][1][0] for c in cfgs})
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, m in enumerate(methods):
        xs = [0.0, *eps_grid]
        for attack, style in (("fgsm", "-"), ("pgd", "--")):
            ys = [sweep[m]["clean"][0], *sweep[m][attack]]
            label = f"{m} {'FGSM' if attack == 'fgsm' else 'PGD-20'}"
            ax.plot(xs, ys, style, color=f"C{i}", marker="o", ms=3, label=label)
    for e in train_eps:
        ax.axvline(e, color="grey", lw=0.8, ls=":", label="training radius (client.adv_eps)")
    units = ", ".join(f"{u:.2f}" for u in pixel)
    ax.set_xlabel(f"L∞ radius ε (standardised inputs; 1 pixel unit = {units})")
    ax.set_ylabel("accuracy on the first test images (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(res / f"{name}_eps.png", dpi=110)


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", required=True, help="the runs' output_dir")
    p.add_argument("--name", default="p1_robust", help="results name (bench/results/<name>*)")
    p.add_argument(
        "--eps", type=float, nargs="+", help="also attack each final model at these radii"
    )
    args = p.parse_args()
    if args.eps and any(e <= 0 for e in args.eps):
        p.error("--eps radii must be > 0")
    res = ROOT / "bench" / "results"
    dest = res / args.name
    runs = collect(Path(args.runs) / "p1", dest)
    if not runs:
        return f"no finished P1 runs under {Path(args.runs) / 'p1'}"
    table: dict[str, dict[str, Any]] = {}
    for method, found in runs.items():
        seeds = [s["seed"] for s, _ in found]
        runs_last5 = [last5(dest / method / f"seed{s}") for s in seeds]
        per_seed = {k: [r[k] for r in runs_last5] for k in COLUMNS}
        table[method] = {"seeds": seeds, **{k: float(np.mean(v)) for k, v in per_seed.items()}}
        table[method]["per_seed"] = per_seed
    lines = [
        "| method | seeds | clean % | FGSM % | PGD-20 % | paper (FMNIST): clean / FGSM / PGD-20 |",
        "|---|---|---|---|---|---|",
    ]
    order = [m for m in PAPER if m in table] + sorted(set(table) - set(PAPER))
    for m in order:
        r = table[m]
        paper = " / ".join(f"{v:.2f}" for v in PAPER[m]) if m in PAPER else "–"
        cells = " | ".join(_cell(r[k], r["per_seed"][k]) for k in COLUMNS)
        lines.append(f"| {m} | {len(r['seeds'])} | {cells} | {paper} |")
    print(write_table(res, args.name, table, "\n".join(lines) + "\n"), end="")
    if args.eps:
        torch.set_num_threads(1)
        first = {m: Path(args.runs) / "p1" / m / f"seed{runs[m][0][0]['seed']}" for m in order}
        write_sweep(first, sorted(args.eps), res, args.name)
    return None


if __name__ == "__main__":
    sys.exit(main())

"""P1 results table (BENCHMARKS.md: FedCCL Table 4 protocol) from finished runs.

    .venv/bin/python bench/p1_table.py --runs results [--name p1]   # the P1 output_dir
Reads <runs>/p1/<method>/seed*/ (full runs or light ones), copies them in the light form
(bench/light.py) to bench/results/<name>/, and writes bench/results/<name>.md/.json and
<name>_curves.png (``--name`` keeps a variant of the protocol, e.g. P1 with
``data.domain=mixed``, beside the P1 tables; the paper's figures are quoted for ``p1`` and
``p1_full``, P1 with ``data.test_fraction=0``, only):
median and mean ± std over seeds of the last-5-round global test accuracy (FedCCL's metric),
best and P-FL accuracy, next to the paper's figures; and the FedCCL ablation table
(bench/results/<name>_fedccl_ablation.md: CE only = FedAvg, local only, global only, both,
averaged signals) next to the paper's Table 6.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from runs import collect, finished_runs, per_seed_label, seeds_label, setup_configs, write_table

from fl_app.results import matched_baseline, mean_curve, plain_fedavg

ROOT = Path(__file__).resolve().parent.parent
PAPER = {
    "fedavg": 73.66,
    "fedccl": 80.02,
    "fedprox": None,
    "moon": None,
    "fedrcl": None,
    "fedscl": None,
    "fedrane": None,
    "pmfl": None,
    "fedccl_m": None,
}
# one method as its paper defines it (client and server); the rest are combinations/ablations
PUBLISHED = {"fedavg", "fedprox", "moon", "fedrcl", "fedrane", "fedccl", "pmfl", "fedau"}
# FedCCL Table 6 (FMNIST, "intra-domain heterogeneity": the paper's own CE-only baseline is
# 78.38 there, not Table 4's FedAvg 73.66, so compare the gains over CE only)
CE_ONLY_PAPER = 78.38  # paper Table 6, CE only
ABLATION: dict[str, tuple[str, float | None]] = {  # method: (label, paper Table 6 %)
    "fedavg": ("CE only (FedAvg)", CE_ONLY_PAPER),
    "fedccl_local": ("+ local signals (`fedccl_local`)", 82.64),
    "fedccl_global": ("+ global signals (`fedccl_global`)", 82.45),
    "fedccl": ("+ both (`fedccl`)", 83.41),
    "fedccl_avg": ("both, averaged signals (`fedccl_avg`)", None),
}
PAPER_NOTE = (
    "paper (FedCCL Table 4, FMNIST): FedAvg 73.66, FedProc 77.65, FedPCL 72.33, "
    "FedProto 72.86, FPL 74.52, FedCCL 80.02"
)


def main() -> str | None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default="results")
    p.add_argument("--name", default="p1", help="results name (bench/results/<name>*)")
    args = p.parse_args()
    name, is_p1 = args.name, args.name in ("p1", "p1_full")  # the paper's domain-free P1
    source = Path(args.runs) / "p1"
    configs = setup_configs(finished_runs(source))
    runs = collect(source, ROOT / "bench" / "results" / name)
    if not runs:
        return f"no finished P1 runs under {Path(args.runs) / 'p1'}: pass --runs <output_dir>"
    table: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[list[tuple[int, float]]]] = {}
    for method, found in runs.items():
        rows = [s for s, _ in found]
        curves[method] = [c for _, c in found]
        last5 = np.array([r["last5_accuracy"] for r in rows]) * 100
        pers = [r["last5_personal_accuracy"] for r in rows if r.get("last5_personal_accuracy")]
        table[method] = {
            "seeds": [r["seed"] for r in rows],
            "last5_per_seed": [float(x) for x in last5],
            "last5_median": float(np.median(last5)),
            "last5_mean": float(last5.mean()),
            "last5_std": float(last5.std()),
            "best_mean": float(np.mean([r["best_accuracy"] for r in rows]) * 100),
            "personal_last5_mean": float(np.mean(pers) * 100) if pers else None,
            "paper": PAPER.get(method) if is_p1 else None,
        }
    for method, r in table.items():  # paired by seed (the seed fixes the partition), against
        # FedAvg on the method's own model and client optimiser only (BENCHMARKS.md)
        against = None
        if "fedavg" in table and method != "fedavg":
            against = matched_baseline(method, configs, "fedavg")[0]
        base = table.get(against, {}) if against else {}
        base_by_seed = dict(zip(base.get("seeds", []), base.get("last5_per_seed", []), strict=True))
        gains = [
            a - base_by_seed[s]
            for s, a in zip(r["seeds"], r["last5_per_seed"], strict=True)
            if s in base_by_seed
        ]
        cfg = configs.get(method)
        r["fedavg_kind"] = cfg is not None and plain_fedavg(cfg)  # a baseline: no Δ of its own
        r["matched_fedavg"] = against if gains else None
        r["gain_vs_matched_fedavg"] = float(np.mean(gains)) if gains else None
    res = ROOT / "bench" / "results"
    lines = [
        "| method | seeds | last-5 accuracy %: median | mean ± std | per seed "
        "| Δ matched FedAvg, same seeds | best % | P-FL % | paper % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in sorted(table.items(), key=lambda kv: -kv[1]["last5_mean"]):
        pfl = f"{r['personal_last5_mean']:.2f}" if r["personal_last5_mean"] else "–"
        paper = f"{r['paper']:.2f}" if r["paper"] else "–"
        per_seed = per_seed_label(r["last5_per_seed"])
        gain_s = gain_cell(m, r)
        lines.append(
            f"| {m} | {len(r['seeds'])} | {r['last5_median']:.2f}"
            f" | {r['last5_mean']:.2f} ± {r['last5_std']:.2f}"
            f" | {per_seed} | {gain_s} | {r['best_mean']:.2f} | {pfl} | {paper} |"
        )
    lines += [
        "",
        "Δ: the mean over shared seeds of the method minus FedAvg trained on the same model "
        "(projection head included) with the same client optimiser: `fedavg`, or the run "
        "named after the Δ (`fedavg_head`: FedAvg on the projection-head model); no Δ where "
        "no such FedAvg run exists.",
    ]
    if is_p1:
        lines += ["", PAPER_NOTE]
    print(write_table(res, name, table, "\n".join(lines) + "\n"), end="")
    (res / f"{name}_fedccl_ablation.md").write_text(ablation_table(table, is_p1))
    if curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = [
            ("methods as published", [m for m in sorted(curves) if m in PUBLISHED]),
            (
                "client × server combinations and ablations",
                ["fedavg", *(m for m in sorted(curves) if m not in PUBLISHED)],
            ),
        ]
        if len(curves) <= 10:  # one readable panel: no split
            panels = [("", sorted(curves))]
        fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4.2 * len(panels)), squeeze=False)
        for ax, (title, methods) in zip(axes[:, 0], panels, strict=True):
            for i, m in enumerate(m for m in methods if m in curves):
                seed_curves = curves[m]
                style = "-" if i < 10 else "--"  # ten colours, then dashed
                label = f"{m} ({seeds_label(len(seed_curves))})"
                ax.plot(*mean_curve(seed_curves), style, label=label)
            ax.set_xlabel("round")
            ax.set_ylabel("global test accuracy")
            ax.set_ylim(0.4, 0.9)
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
            ax.set_title(title, fontsize=10)
        fig.suptitle(
            "P1: Fashion-MNIST, 10 clients, Dirichlet α = 0.05" if is_p1 else f"{name} (P1 model)"
        )
        fig.tight_layout()
        fig.savefig(res / f"{name}_curves.png", dpi=110)
    return None


def gain_cell(method: str, row: dict[str, Any]) -> str:
    """The Δ cell: ``+1.23`` against ``fedavg``, ``+1.23 (vs fedavg_head)`` against another
    matched FedAvg, ``– (no matched FedAvg)`` when none was run; ``–`` for FedAvg."""
    gain, against = row["gain_vs_matched_fedavg"], row["matched_fedavg"]
    if method == "fedavg" or row.get("fedavg_kind"):
        return "–"
    if gain is None:
        return "– (no matched FedAvg)"
    return f"{gain:+.2f}" if against == "fedavg" else f"{gain:+.2f} (vs {against})"


def ablation_table(table: dict, with_paper: bool = True) -> str:
    """FedCCL's ablation rows of the P1 table beside the paper's Table 6 (Δ = gain over CE
    only: ours paired by seed with FedAvg, the paper's over its own CE-only row)."""
    lines = [
        "| configuration | seeds | last-5 %: median | mean ± std | per seed "
        "| Δ CE only, same seeds | paper Table 6 % (Δ) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, (label, paper) in ABLATION.items():
        r = table.get(m)
        if r is None:
            continue
        gain_s = gain_cell(m, r)
        paper = paper if with_paper else None
        paper_s = "–" if paper is None else f"{paper:.2f}"
        if paper is not None and m != "fedavg":
            paper_s += f" ({paper - CE_ONLY_PAPER:+.2f})"
        lines.append(
            f"| {label} | {len(r['seeds'])} | {r['last5_median']:.2f} "
            f"| {r['last5_mean']:.2f} ± {r['last5_std']:.2f} "
            f"| {per_seed_label(r['last5_per_seed'])} | {gain_s} | {paper_s} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""Does each method do what its paper says? The regime table (docs/BENCHMARKS.md, "Regimes").

    .venv/bin/python bench/regimes.py [--runs /abs/grid]

For each paper's own regime on Fashion-MNIST (``conf/experiments/regime_*.yaml``; PMFL's is
P3, and ``regime_pmfl`` its fuller form), every method of the protocol against its **matched
FedAvg**: FedAvg on the same model (projection head included) with the same client optimiser
(checked from the runs' configs, :func:`fl_app.results.matched_baseline`; a row without one
is refused), paired seed by seed.
``--runs`` is an ``output_dir`` of the grid (``bench/regime_grid.py``): its completed runs are
copied first into ``bench/results/regimes/<experiment>/<method>/seed<k>/`` (the light form of
``bench/light.py``: summary, config, curve), replacing a committed run of the same method and
seed. The table is built from the committed runs only and written to ``bench/results/regimes.json``
(a list of rows: ``protocol, method, seeds, accuracy, baseline, baseline_accuracy, delta,
verdict``, accuracies in % per seed) and ``regimes.md``, with ``regimes_curves.png``.

The verdict rule was declared before any run: every paper claims a gain over FedAvg, so a
row is *reproduced* when Δ > 0 on at least 2 of 3 seeds, *reversed* when Δ < 0 on every
seed, *not reproduced* otherwise, and *pending* while the pair has fewer than 3 seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs import (
    Run,
    copy_runs,
    finished_runs,
    lossy_lines,
    lossy_section,
    lost_count,
    per_seed_label,
    setup_configs,
    write_table,
)

from fl_app.results import curve, matched_baseline, mean_curve

ROOT = Path(__file__).resolve().parent.parent
SEEDS = (0, 1, 2)  # declared before any run


@dataclass(frozen=True)
class Protocol:
    """One paper's regime: where its runs are committed, its method and the rows shown."""

    name: str  # R-MOON, ...
    experiment: str  # conf/experiments/<experiment>.yaml
    paper: str
    method: str  # the method as its paper defines it (the verdict row)
    claim: str  # the paper's own dataset and gain over FedAvg
    rows: tuple[str, ...]  # the method first, then ablations and other baselines
    # committed runs: bench/results/<dir>/<method>/seed<k>/ for each dir (a later dir's runs
    # of a method replace an earlier's); the grid's runs are committed into the first
    # regimes/ dir
    runs: tuple[str, ...]


PROTOCOLS = (
    Protocol(
        "R-MOON",
        "regime_moon",
        "MOON",
        "moon",
        "CIFAR-10, simple CNN, 10 clients, Dirichlet 0.5, 100 rounds: 69.1 vs FedAvg 66.3 "
        "(+2.8; paper Table 1); FMNIST Dir(0.1) in FedRANE's Table 1: 84.07 vs 79.02",
        ("moon", "moon_mu1", "moon_mu01", "fedprox_head"),
        ("regimes/regime_moon",),
    ),
    Protocol(
        "R-FedRCL",
        "regime_fedrcl",
        "FedRCL",
        "fedrcl",
        "CIFAR-10, ResNet-18-GN, 100 clients at 5 %, Dirichlet 0.3, 1000 rounds: 88.44 vs "
        "FedAvg 83.18 (+5.26; 500 rounds 84.01 vs 75.63; paper Table 1)",
        ("fedrcl", "fedrcl_hard", "fedscl", "moon", "fedprox"),
        ("regimes/regime_fedrcl",),
    ),
    Protocol(
        "R-FedRANE",
        "regime_fedrane",
        "FedRANE",
        "fedrane",
        "FMNIST, ConvNet, 20 clients, Dirichlet 0.1: 88.92 vs FedAvg 79.02 (+9.9; paper "
        "Table 1; SphereFed 87.85, FedRANE w/o LRA 88.47, w/o GNE 88.64)",
        (
            "fedrane",
            "fedrane_wo_lra",
            "fedrane_wo_gne",
            "fedrane_authors",
            "fedrane_authors_wo_lra",
            "spherefed",
            "fedprox",
            "moon",
        ),
        ("regimes/regime_fedrane",),
    ),
    Protocol(
        "R-PMFL",
        "p3",
        "PMFL",
        "pmfl",
        "CIFAR-10, Bernoulli participation: 78.48 vs FedAU 77.98 (+0.50; paper Table I; "
        "FedAvg is not in its table)",
        (
            "pmfl",
            "pmfl_hist",
            "pmfl_literal",
            "pmfl_hist_literal",
            "pmfl_wo_hgm",
            "pmfl_wo_mct",
            "pmfl_wo_awc",
            "fedau_head",
        ),
        ("p3_streams/bernoulli", "regimes/p3"),
    ),
    Protocol(
        "R-PMFL-1000",
        "regime_pmfl",
        "PMFL",
        "pmfl",
        "SVHN (T = 1000), Bernoulli participation: 87.47 vs FedAU 86.89 (+0.58; paper Table I, "
        "test; FedAvg is not in its table)",
        ("pmfl", "fedau_head"),
        ("regimes/regime_pmfl",),
    ),
)


def verdict(deltas: list[float], seeds: int = len(SEEDS)) -> str:
    """The declared rule over the per-seed Δs of a method against its matched FedAvg."""
    if len(deltas) < seeds:
        return f"pending ({len(deltas)} of {seeds} seeds)"
    if sum(d > 0 for d in deltas) >= 2:
        return "reproduced"
    if all(d < 0 for d in deltas):
        return "reversed"
    return "not reproduced"


def _lost(found: list[Run], seeds: list[int]) -> list[int]:
    by_seed = {s["seed"]: lost_count(s) for s, _, _ in found}
    return [by_seed[k] for k in seeds]


def protocol_rows(p: Protocol, runs: dict[str, list[Run]]) -> list[dict[str, Any]]:
    """One row per method of ``p.rows`` that has completed runs: its last-5 accuracy per
    seed (%), its matched FedAvg and that baseline's accuracy on the same seeds, the Δs
    and the verdict. A method without a matched FedAvg run gets no Δ (``baseline`` None)."""
    configs = setup_configs(runs)
    out = []
    for method in p.rows:
        if method not in runs:
            continue
        mine = {s["seed"]: 100 * s["last5_accuracy"] for s, _, _ in runs[method]}
        against, differ = matched_baseline(method, configs, "fedavg")
        base = {s["seed"]: 100 * s["last5_accuracy"] for s, _, _ in runs.get(against or "", [])}
        seeds = [k for k in sorted(mine) if k in base]
        deltas = [mine[k] - base[k] for k in seeds]
        shown = seeds if against else sorted(mine)
        out.append(
            {
                "protocol": p.name,
                "experiment": p.experiment,
                "paper": p.paper,
                "claim": p.claim if method == p.method else None,
                "method": method,
                "seeds": shown,
                "accuracy": [mine[k] for k in shown],
                "lost_results": _lost(runs[method], shown),
                "baseline": against,
                "baseline_accuracy": [base[k] for k in seeds],
                "baseline_lost_results": _lost(runs.get(against or "", []), seeds),
                "delta": deltas,
                "verdict": verdict(deltas) if against else "no matched FedAvg run",
                "baseline_differs": differ if against is None else [],
            }
        )
    return out


def markdown(rows: list[dict[str, Any]], lossy: list[str] | None = None) -> str:
    """The table of ``rows`` (:func:`protocol_rows`), its legend, and under a † the runs
    that lost client results (``lossy``, :func:`runs.lossy_lines`)."""
    lines = [
        "| protocol | method | paper's claim | seeds | last-5 % per seed (median) "
        "| matched FedAvg | its last-5 % per seed | Δ per seed | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = r["accuracy"]
        med = f" ({statistics.median(acc):.2f})" if acc else ""
        delta = " / ".join(f"{d:+.2f}" for d in r["delta"]) or "–"
        lines.append(
            f"| {r['protocol']} | {r['method']} | {r['claim'] or '–'} "
            f"| {', '.join(map(str, r['seeds']))} | {per_seed_label(acc, r['lost_results'])}{med} "
            f"| {r['baseline'] or '–'} "
            f"| {per_seed_label(r['baseline_accuracy'], r['baseline_lost_results']) or '–'} "
            f"| {delta} | {r['verdict']} |"
        )
    lines += [
        "",
        "Δ = method − matched FedAvg (FedAvg on the same model, projection head included, "
        "with the same client optimiser), seed by seed. Verdict (declared before the runs): "
        "reproduced when Δ > 0 on at least 2 of 3 seeds, reversed when Δ < 0 on every seed, "
        "not reproduced otherwise. The rule reads every row as a claimed gain: for a baseline "
        "of a paper's table that the paper has below FedAvg (FedProx in FedRCL's and FedRANE's "
        'tables), "reproduced" says only that it is above the matched FedAvg, which is the '
        "paper's sign reversed; the README's protocol notes read those rows.",
    ]
    lines += lossy_section(lossy or [])
    return "\n".join(lines) + "\n"


def plot(protocols: dict[str, dict[str, list[Run]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(p, runs) for p in PROTOCOLS if (runs := protocols.get(p.name))]
    if not shown:
        return
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4), squeeze=False)
    for ax, (p, runs) in zip(axes[0], shown, strict=True):
        for method in (*p.rows, *(m for m in sorted(runs) if m not in p.rows)):
            if method in runs:
                style = "-" if method in (p.method, "fedavg_head", "fedavg") else "--"
                curves = [curve(recs) for _, recs, _ in runs[method]]
                ax.plot(*mean_curve(curves), style, label=f"{method} ({len(curves)})")
        ax.set_title(f"{p.name} ({p.experiment})", fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel("global test accuracy (seed mean)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _shown(
    p: Protocol, rows: list[dict[str, Any]], per_protocol: dict[str, dict[str, list[Run]]]
) -> dict[str, list[Run]]:
    """The runs of ``p`` that its table rows show: each row's method and its baseline, on
    the row's seeds."""
    runs = per_protocol[p.name]
    seeds: dict[str, set[int]] = {}
    for r in rows:
        if r["protocol"] == p.name:
            seeds.setdefault(r["method"], set()).update(r["seeds"])
            if r["baseline"]:
                seeds.setdefault(r["baseline"], set()).update(r["seeds"])
    return {m: [x for x in runs[m] if x[0]["seed"] in k] for m, k in seeds.items() if m in runs}


def main(argv: list[str] | None = None) -> str | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="an output_dir of the grid whose runs to commit first")
    ap.add_argument("--committed", help="read the committed runs from here [bench/results] (tests)")
    args = ap.parse_args(argv)
    results = ROOT / "bench" / "results"
    committed = Path(args.committed) if args.committed else results
    if args.runs:
        for p in PROTOCOLS:
            src = Path(args.runs) / p.experiment
            dest = next(d for d in p.runs if d.startswith("regimes/"))
            if src.is_dir():
                copy_runs(finished_runs(src), committed / dest)
    per_protocol = {
        p.name: {m: r for d in p.runs for m, r in finished_runs(committed / d).items()}
        for p in PROTOCOLS
    }
    rows = [r for p in PROTOCOLS for r in protocol_rows(p, per_protocol[p.name])]
    if not rows:
        return "no committed regime runs: pass --runs <the grid's output_dir>"
    lossy = [
        line for p in PROTOCOLS for line in lossy_lines(f"{p.name} ", _shown(p, rows, per_protocol))
    ]
    print(write_table(results, "regimes", rows, markdown(rows, lossy)), end="")
    plot(per_protocol, results / "regimes_curves.png")
    return None


if __name__ == "__main__":
    sys.exit(main())

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
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.results import (
    CURVE,
    ROUND_LOGS,
    Curve,
    curve,
    differing_keys,
    last_logged_round,
    matched_baseline,
    mean_curve,
    read_records,
    read_summary,
    run_completed,
    run_setup_config,
    saved_run_config,
)
from fl_app.rundir import run_dir_busy

METRICS = {  # --metric -> (summary.json key, column title)
    "last5": ("last5_accuracy", "last-5 accuracy %"),
    "final": ("final_accuracy", "final accuracy %"),
    "best": ("best_accuracy", "best accuracy %"),
    "ema": ("ema_accuracy", "EMA(0.9) accuracy %"),
    "top5": ("top5_accuracy", "top-5 accuracy %"),
}


SEED_DIR = re.compile(r"seed(\d+)")


@dataclass
class MethodRuns:
    """One method's runs: the summaries of the completed ones (by seed) and a line for each
    other run."""

    completed: dict[int, dict[str, Any]] = field(default_factory=dict)
    dirs: dict[int, Path] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)


def _summary(run: Path) -> dict[str, Any] | None:
    """A run directory's ``summary.json``, None when it has none yet; ValueError naming the
    file when it is not a run summary."""
    s = read_summary(run)
    if s is not None and not isinstance(s.get("num_rounds"), int):
        raise ValueError(f"{run / 'summary.json'}: not a run summary (no num_rounds)")
    return s


def load_runs(base: Path) -> dict[str, MethodRuns]:
    """``{method: MethodRuns}`` for every run directory ``base/<method>/seed<k>/``. A run is
    completed when its ``summary.json`` says so and it ran all its rounds; a run without a
    summary is still going (its ``run.lock`` is held) or was killed before it could write one.
    Other folders are ignored. Raises ValueError, naming what to pass instead, when ``base``
    holds no run, and naming the file when a summary is unreadable."""
    if not base.is_dir():
        raise ValueError(f"{base} is not a folder: pass <output_dir>/<experiment>, e.g. results/p1")
    out: dict[str, MethodRuns] = {}
    for run in sorted(base.glob("*/seed*/")):
        m = SEED_DIR.fullmatch(run.name)
        files = ("summary.json", *ROUND_LOGS, CURVE, "config.yaml")
        if not m or not any((run / f).is_file() for f in files):
            continue
        method, seed = run.parent.name, int(m.group(1))
        runs = out.setdefault(method, MethodRuns())
        s = _summary(run)
        if s is None:
            state = "running" if run_dir_busy(run) else "no summary.json (killed?)"
            runs.unfinished.append(
                f"{method} seed {seed}: {state}, {max(last_logged_round(run), 0)} round(s) logged"
            )
            continue
        done = s.get("rounds_completed", 0)
        if run_completed(s):
            runs.completed[seed], runs.dirs[seed] = s, run
        else:
            state = "running" if run_dir_busy(run) else s.get("status", "no status")
            runs.unfinished.append(
                f"{method} seed {seed}: {state} after round {done} of {s['num_rounds']}"
            )
    if not out:
        below = {p.parents[2].name for p in base.glob("*/*/seed*/summary.json")}
        hint = (
            f"its subfolders {', '.join(sorted(below))} hold runs: pass {base}/<one of them>"
            if below
            else "pass <output_dir>/<experiment> of finished runs, e.g. results/p1"
        )
        raise ValueError(f"no runs (<method>/seed<k>/) under {base}: {hint}")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def comparison(
    runs: dict[str, MethodRuns], metric: str = "last5", baseline: str | None = None
) -> list[dict[str, Any]]:
    """One row of figures per method with a completed run, best median first: the metric's
    median, mean, standard deviation over seeds (population, as in the project's results
    tables) and per-seed values (fractions); the mean paired difference to ``baseline`` over
    the seeds both have, taken against a baseline run on the same model and client
    optimiser only (:func:`fl_app.results.matched_baseline`: ``baseline`` itself, or another
    group of its kind such as ``fedavg_head``; None when there is none, without shared seeds,
    or for the baseline itself); the best
    accuracy and the last-5 personalised accuracy (P-FL; over the seeds that report it),
    each a mean over seeds; the failed
    and dropped client results; the rounds; and the minutes a run spent in its rounds (the
    ServerApp's ``wall_seconds``: Flower's and Ray's start-up are not in it)."""
    key = METRICS[metric][0]
    configs = {
        m: run_setup_config(mr.dirs[min(mr.completed)], mr.completed[min(mr.completed)])
        for m, mr in runs.items()
        if mr.completed
    }
    rows = []
    for method, mr in runs.items():
        seeds = sorted(s for s, summ in mr.completed.items() if summ.get(key) is not None)
        if not seeds:
            continue
        values = [mr.completed[s][key] for s in seeds]
        against: str | None = None
        differ: list[str] = []
        if baseline in runs and method != baseline:
            against, differ = matched_baseline(method, configs, baseline)
        base = runs[against].completed if against is not None else {}
        shared = [s for s in seeds if base.get(s, {}).get(key) is not None]
        delta = (
            statistics.fmean(mr.completed[s][key] - base[s][key] for s in shared)
            if shared
            else None
        )
        summaries = [mr.completed[s] for s in seeds]
        pfl = [
            float(x["last5_personal_accuracy"])
            for x in summaries
            if x.get("last5_personal_accuracy") is not None
        ]
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
                # the group Δ is taken against (the baseline or one of its kind on the same
                # model and optimiser), and how the baseline's training differs otherwise
                "delta_against": against if delta is not None else None,
                "baseline_differs": differ,
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
        "same seeds | best % | P-FL last-5 % | failed/dropped results | rounds | "
        "minutes of rounds a run |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        delta = "–" if r["delta"] is None else f"{100 * r['delta']:+.2f} ({r['delta_seeds']})"
        if r["delta"] is not None and r.get("baseline_differs"):
            delta += f" vs {r['delta_against']}"
        per_seed = " / ".join(f"{100 * v:.1f}" for v in r["values"])
        lines.append(
            f"| {r['method']} | {len(r['seeds'])} | {_pct(r['median'])} | {_pct(r['mean'])} ± "
            f"{100 * r['std']:.2f} | {per_seed} | {delta} | {_pct(r['best'])} | "
            f"{_pct(r['personal'])} | {r['failed']} | {'/'.join(map(str, r['rounds']))} | "
            f"{r['minutes']:.1f} |"
        )
    notes = [u for mr in runs.values() for u in mr.unfinished]
    shown = {r["method"] for r in rows}
    notes += [
        f"{m}: its completed runs have no {METRICS[metric][0]}"
        for m, mr in runs.items()
        if mr.completed and m not in shown
    ]
    if any(len(r["rounds"]) > 1 for r in rows):
        notes.append("a method whose runs have different numbers of rounds mixes protocols")
    if notes:
        lines += ["", "Not in the figures:"] + [f"- {n}" for n in notes]
    if cautions := caveats(rows, runs, metric):
        lines += ["", "Read with care:"] + [f"- {c}" for c in cautions]
    return "\n".join(lines) + "\n"


# Settings that may differ between the seeds of one method without making it another
# configuration (where the run went and what ran it).
_RUN_KEYS = frozenset({"seed", "output_dir", "client.device", "client.num_threads"})


def differing_settings(dirs: list[Path]) -> list[str]:
    """The config keys (dotted) whose values differ between the runs in ``dirs`` (their
    ``config.yaml``), besides the seed and where and on what they ran; runs without a
    readable config are left out."""
    configs = [c for d in dirs if (c := saved_run_config(d)) is not None]
    return differing_keys(configs, _RUN_KEYS) if len(configs) > 1 else []


def _numerics(runs: MethodRuns, seed: int) -> list[str]:
    """The ``numerics`` a completed run's summary lists (none: an older run, or not a list)."""
    lines = runs.completed.get(seed, {}).get("numerics")
    return [x for x in lines if isinstance(x, str)] if isinstance(lines, list) else []


def caveats(rows: list[dict[str, Any]], runs: dict[str, MethodRuns], metric: str) -> list[str]:
    """What a reader of the table should know: a row whose seeds ran with different
    settings (e.g. one seed with another ``SET``), runs that trained on different arithmetic
    (their summaries' ``numerics``: the same seed then differs from the first step), rows of
    different round counts, and a last-5 or top-5 metric over runs of 5 rounds or fewer (the
    mean of all their rounds)."""
    out = []
    for r in rows:
        mr = runs[r["method"]]
        differ = differing_settings([mr.dirs[k] for k in r["seeds"] if k in mr.dirs])
        if differ:
            out.append(
                f"{r['method']}: its seeds ran with different settings ({', '.join(differ[:8])}"
                f"{', …' if len(differ) > 8 else ''}): the row mixes configurations"
            )
    for r in rows:
        if not r.get("baseline_differs"):
            continue
        listed = ", ".join(r["baseline_differs"][:4])
        more = ", …" if len(r["baseline_differs"]) > 4 else ""
        if r.get("delta_against"):
            out.append(
                f"{r['method']}: Δ is against {r['delta_against']}, the baseline's kind on "
                f"{r['method']}'s model and optimiser (the baseline trained with {listed}{more})"
            )
        else:
            out.append(
                f"{r['method']}: no Δ: no baseline run on its model and client optimiser "
                f"(the baseline differs in {listed}{more}; e.g. fedavg_head is FedAvg on a "
                "projection-head model)"
            )
    arithmetic = sorted(
        {line for r in rows for k in r["seeds"] for line in _numerics(runs[r["method"]], k)}
    )
    if len(arithmetic) > 1:
        out.append(
            f"the runs trained on {len(arithmetic)} arithmetics ({'; '.join(arithmetic)}): "
            "one seed's runs differ between them from the first step, and the paired Δs "
            'carry that too (README, "Results files")'
        )
    counts = sorted({n for r in rows for n in r["rounds"]})
    if len(counts) > 1:
        out.append(f"the rows ran different numbers of rounds ({', '.join(map(str, counts))})")
    if metric in ("last5", "top5") and counts and counts[0] <= 5:
        out.append(
            f"runs of {counts[0]} rounds: {METRICS[metric][1]} is over all of their rounds, "
            "the first ones included (--metric final may say more)"
        )
    return out


def plot(runs: dict[str, MethodRuns], rows: list[dict[str, Any]], path: Path) -> list[str]:
    """Draws the seed-mean test accuracy per round of every method in ``rows`` (the seeds
    aligned by round number) into the image file ``path``, its format given by its extension
    (one of ``plot_formats()``), creating missing folders; returns a line for each run left
    out because its round log is missing or unreadable. Raises OSError with the reason when
    the image cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    left_out = []
    drawn = False
    for r in rows:
        curves: list[Curve] = []
        for seed in r["seeds"]:
            try:  # a full run's round log, or a light run's curve (bench/light.py)
                records = read_records(runs[r["method"]].dirs[seed])
            except (OSError, ValueError) as err:
                left_out.append(f"{r['method']} seed {seed}: no readable round log ({err})")
                continue
            curves.append([(t, 100 * a) for t, a in curve(records) if t > 0])
        if curves and all(curves):
            drawn = True
            n = len(curves)
            ax.plot(*mean_curve(curves), label=f"{r['method']} ({n} seed{'s' * (n != 1)})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy %, mean over seeds")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except (RuntimeError, ValueError) as err:  # e.g. .pgf without LaTeX, a Pillow without AVIF
        raise OSError(str(err)) from err
    finally:
        plt.close(fig)
    return left_out


def plot_formats() -> list[str]:
    """The file extensions (lower case, no dot) that ``--plot`` accepts: the formats
    matplotlib's ``savefig`` writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (a folder is there, a folder on the way is a
    file, the folder it would go in or the file itself is read-only), None when nothing is
    seen to stand in the way. Missing folders on the way are no problem: they get created.
    Writing can still fail later (a full disk), so writers still catch OSError."""
    try:
        if path.is_dir():
            return "it is a folder"
        if path.exists():  # an existing file (or /dev/stdout): only its own permission counts
            return None if os.access(path, os.W_OK) else "the file is read-only"
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            return f"{folder} is a file, not a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"no permission to write in {folder}"
    except OSError as err:
        return str(err)
    return None


def _plot_problem(path: Path) -> str | None:
    """Why ``--plot path`` cannot be written, in a line that says what to pass instead; None
    when it can (as far as can be seen before drawing)."""
    if (reason := _unwritable(path)) is not None:
        return f"cannot write the curves to {path}: {reason}; choose another --plot"
    formats = plot_formats()
    ext = os.path.splitext(path)[1][1:].lower()  # as savefig reads it
    if not ext:
        return (
            f"--plot {path} has no file extension, which sets the image format: "
            f"name it e.g. {path}.png (one of .{', .'.join(formats)})"
        )
    if ext not in formats:
        return (
            f"--plot {path}: matplotlib cannot write .{ext} images; "
            f"use one of .{', .'.join(formats)}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Prints the table of the runs under ``argv``'s folder, writes it to ``--output`` and the
    curves to ``--plot`` when given; returns 0, or 2 (the reason on stderr) when the folder
    holds no readable runs or a file cannot be written. ``--output`` and ``--plot`` are
    checked before any run is read (a folder, a file where a folder should be, a read-only
    place, an image extension matplotlib cannot write) so a bad path is told at once."""
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
    p.add_argument(
        "--plot",
        type=Path,
        help="also draw the seed-mean accuracy curves into this image file; its extension "
        "sets the format (.png, .pdf, .svg, ...)",
    )
    p.add_argument("--output", type=Path, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    problems: list[str] = []  # bad paths first, before reading any run
    if args.output and (reason := _unwritable(args.output)) is not None:
        problems.append(
            f"cannot write the table to {args.output}: {reason}; choose another --output"
        )
    if args.plot and (problem := _plot_problem(args.plot)) is not None:
        problems.append(problem)
    for problem in problems:
        print(f"compare: {problem}", file=sys.stderr)
    if problems:
        return 2
    try:
        runs = load_runs(args.runs)
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    baseline = args.baseline if args.baseline in runs and runs[args.baseline].completed else None
    rows = comparison(runs, args.metric, baseline)
    table = markdown(rows, runs, args.metric, baseline)
    if baseline is None:
        print(
            f"(no completed {args.baseline} runs under {args.runs}: no Δ figures)", file=sys.stderr
        )
    print(table, end="")
    if args.output:
        try:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(table)
        except OSError as err:
            why = f"cannot write the table to {args.output}: {err}; choose another --output"
            print(f"compare: {why}", file=sys.stderr)
            return 2
    if args.plot and rows:
        try:
            left_out = plot(runs, rows, args.plot)
        except OSError as err:
            why = f"cannot write the curves to {args.plot}: {err}; choose another --plot"
            print(f"compare: {why}", file=sys.stderr)
            return 2
        for line in left_out:
            print(f"not plotted: {line}", file=sys.stderr)
        print(f"curves: {args.plot}", file=sys.stderr)
    elif args.plot:
        print(f"no curves drawn to {args.plot}: no run has completed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

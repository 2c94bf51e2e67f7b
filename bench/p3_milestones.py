"""Accuracy along P3 runs: the last-5-evaluation accuracy at chosen rounds, per pattern,
method and seed. These are the figures the README's P3 notes quote ("last-5 at rounds
100 / 300 / 500 / 700 / 1000"), printed from a committed copy of the runs or from a runs
folder:

    .venv/bin/python bench/p3_milestones.py bench/results/p3_streams_1000 \\
        --rounds 100,300,500,700,1000
    .venv/bin/python bench/p3_milestones.py /abs/p3streams1000 --rounds 100,300,500,700,1000

A committed copy holds ``<pattern>/<method>/seed<k>/``, a runs folder (what
``p3_table.py --runs`` reads) ``<pattern>/p3/<method>/seed<k>/``; only finished runs count.
A light run (``bench/light.py``) gives the same figures at rounds up to 100 and at multiples
of 50, and refuses other rounds whose evaluations it left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from light import EVERY_ROUND_UNTIL, MILESTONE, dropped_in_window, dropped_rounds
from runs import finished_runs

from fl_app.results import Curve, curve

PATTERNS = ("bernoulli", "markov", "cyclic")


def last5_at(acc: Curve, rnd: int) -> float:
    """The mean of the last five evaluations made at or before round ``rnd`` (fewer if fewer
    were made), in percent. The evaluation of the initial model (round 0) does not count, as
    in the runs' own ``last5_accuracy``. Raises ``ValueError`` when no evaluation was made by
    round ``rnd``."""
    seen = [a for r, a in acc if 1 <= r <= rnd][-5:]
    if not seen:
        raise ValueError(f"no evaluation at or before round {rnd}: pick later rounds")
    return 100 * sum(seen) / len(seen)


def exact_last5_at(acc: Curve, rnd: int, run: Path) -> float:
    """:func:`last5_at` of the run in ``run`` (accuracy curve ``acc``), refusing with a
    ``ValueError`` a light run that left out one of the evaluations it averages (the light
    form keeps them at rounds up to 100 and at multiples of 50: ``bench/light.py``)."""
    missing = dropped_in_window([t for t, _ in acc], dropped_rounds(run), rnd)
    if missing:
        raise ValueError(
            f"{run} is a light run without the evaluations of rounds {missing}, which the "
            f"last-5 at round {rnd} averages: pick rounds up to {EVERY_ROUND_UNTIL} or "
            f"multiples of {MILESTONE}, or read the run's full round log"
        )
    return last5_at(acc, rnd)


def milestones(folder: Path, rounds: list[int]) -> list[tuple[str, str, int, list[float]]]:
    """``[(pattern, method, seed, [last-5 % at each of rounds]), ...]`` for every finished run
    under ``folder`` (a committed copy or a runs folder; full or light runs), in pattern,
    method and seed order."""
    rows = []
    for pat in PATTERNS:
        base = folder / pat / "p3" if (folder / pat / "p3").is_dir() else folder / pat
        for method, found in finished_runs(base).items():
            for summary, records, sdir in found:
                acc = curve(records)
                values = [exact_last5_at(acc, r, sdir) for r in rounds]
                rows.append((pat, method, summary["seed"], values))
    return rows


def markdown(rows: list[tuple[str, str, int, list[float]]], rounds: list[int]) -> str:
    """The rows of :func:`milestones` as a markdown table, one column per round."""
    lines = [
        "| pattern | method | seed | " + " | ".join(f"round {r}" for r in rounds) + " |",
        "|---|---|---|" + "---|" * len(rounds),
    ]
    for pat, method, seed, values in rows:
        lines.append(
            f"| {pat} | {method} | {seed} | " + " | ".join(f"{v:.1f}" for v in values) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="bench/results/<name> or a P3 runs folder")
    p.add_argument(
        "--rounds",
        default="100,300,500,700,1000",
        help="comma-separated rounds (default %(default)s)",
    )
    args = p.parse_args(argv)
    try:
        rounds = [int(r) for r in args.rounds.split(",")]
    except ValueError:
        return f"--rounds must be comma-separated whole numbers, got {args.rounds!r}"
    try:
        rows = milestones(args.folder, rounds)
    except ValueError as e:
        return str(e)
    if not rows:
        return f"no finished P3 runs under {args.folder}/<pattern>/[p3/]<method>/seed<k>"
    print(markdown(rows, rounds), end="")
    return None


if __name__ == "__main__":
    sys.exit(main())

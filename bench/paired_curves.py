"""How a method's accuracy curve runs against its matched FedAvg's, seed by seed: the figures
the README's protocol notes quote ("from round 50 on ahead in N of M evaluations, mean ±x";
"+x at round 5"), read from the committed runs under ``bench/results/regimes/``.

    python bench/paired_curves.py regime_fedrcl moon fedavg_head 0 1 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fl_app.results import Curve, curve, read_records

RUNS = Path(__file__).resolve().parent / "results" / "regimes"


def paired_differences(method: Curve, baseline: Curve) -> list[tuple[int, float]]:
    """``[(round, method − baseline in points), ...]`` over the rounds both curves evaluated
    (accuracies as fractions in, percentage points out), in round order."""
    m, b = dict(method), dict(baseline)
    return [(r, 100 * (m[r] - b[r])) for r in sorted(m.keys() & b.keys())]


def lead(diffs: list[tuple[int, float]], from_round: int = 50) -> tuple[int, int, float]:
    """``(ahead, evaluations, mean difference)`` over the rounds ``>= from_round``: how often
    the method is strictly above its baseline, out of how many shared evaluations, and by
    how much on average. ``ValueError`` when no shared round is that late."""
    late = [d for r, d in diffs if r >= from_round]
    if not late:
        raise ValueError(f"the two curves share no evaluation at round {from_round} or later")
    return sum(d > 0 for d in late), len(late), sum(late) / len(late)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("protocol", help="e.g. regime_fedrcl (a folder of bench/results/regimes)")
    p.add_argument("method")
    p.add_argument("baseline", help="its matched FedAvg, e.g. fedavg or fedavg_head")
    p.add_argument("seeds", nargs="+", type=int)
    p.add_argument("--from-round", type=int, default=50, help="where the lead is counted [50]")
    p.add_argument("--until", type=int, default=50, help="early rounds listed up to [50]")
    p.add_argument("--runs", type=Path, default=RUNS, help=f"committed runs [{RUNS}]")
    args = p.parse_args(argv)
    for seed in args.seeds:
        curves = [
            curve(read_records(args.runs / args.protocol / m / f"seed{seed}"))
            for m in (args.method, args.baseline)
        ]
        diffs = paired_differences(*curves)
        ahead, n, mean = lead(diffs, args.from_round)
        early = ", ".join(f"r{r} {d:+.2f}" for r, d in diffs if 0 < r <= args.until)
        print(
            f"{args.method} vs {args.baseline} seed {seed}: from round {args.from_round} "
            f"ahead in {ahead} of {n} (mean {mean:+.2f}); {early}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

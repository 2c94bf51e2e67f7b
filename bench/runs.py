"""The bench scripts' shared helpers: finished runs of one experiment, for the results tables
(``p1_table.py``, ``p3_table.py``), and writing a measurement's JSON with its table."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fl_app.results import parse_rounds

Curve = list[tuple[int, float]]


def collect(
    base: Path, dest: Path | None = None, gzip_rounds: bool = False
) -> dict[str, list[tuple[dict[str, Any], Curve]]]:
    """``{method: [(summary, accuracy curve), ...]}`` for every run under
        ``base/<method>/seed*/`` that completed all its rounds (others are skipped), in seed
        order. With ``dest``, each run's ``summary.json`` and ``rounds.jsonl`` are copied to
        ``dest/<method>/seed<k>/`` so that the committed tables keep their sources (the round
        log as ``rounds.jsonl.gz`` with ``gzip_rounds``: P3's per-node records are large). The round
    log may itself be gzipped, so the tables can be rebuilt from the committed copies."""
    out: dict[str, list[tuple[dict[str, Any], Curve]]] = {}
    for mdir in sorted(base.iterdir()) if base.is_dir() else []:
        for sdir in sorted(mdir.glob("seed*")):
            sf = sdir / "summary.json"
            if not sf.is_file():
                continue
            s = json.loads(sf.read_text())
            if s.get("status") != "completed" or s["rounds_completed"] < s["num_rounds"]:
                continue
            log = read_round_log(sdir)
            recs = parse_rounds(log)
            curve = [(r["round"], r["accuracy"]) for r in recs if r.get("accuracy") is not None]
            out.setdefault(mdir.name, []).append((s, curve))
            if dest is not None:
                d = dest / mdir.name / sdir.name
                if d.resolve() == sdir.resolve():  # regenerating from the committed copies
                    continue
                d.mkdir(parents=True, exist_ok=True)
                shutil.copy(sf, d / "summary.json")
                if gzip_rounds:
                    # mtime 0 and no name in the header: the same log gives the same bytes
                    (d / "rounds.jsonl.gz").write_bytes(gzip.compress(log, 9, mtime=0))
                else:
                    (d / "rounds.jsonl").write_bytes(log)
    return out


def read_round_log(run: Path) -> bytes:
    """A run's round log: ``rounds.jsonl``, or the committed ``rounds.jsonl.gz``."""
    plain = run / "rounds.jsonl"
    return (
        plain.read_bytes()
        if plain.is_file()
        else gzip.decompress((run / "rounds.jsonl.gz").read_bytes())
    )


def seeds_label(n: int) -> str:
    """``"1 seed"``, ``"3 seeds"``: the run count in plot legends."""
    return f"{n} seed{'s' * (n != 1)}"


def per_seed_label(values: list[float]) -> str:
    """``"81.7 / 79.1 / 79.2"``: one value per seed, for the tables' per-seed cells."""
    return " / ".join(f"{v:.1f}" for v in values)


def mean_curve(curves: list[Curve]) -> tuple[list[int], list[float]]:
    """Rounds and the seed-mean accuracy of several runs' curves, over their common length."""
    n = min(len(c) for c in curves)
    return [r for r, _ in curves[0][:n]], [
        sum(c[i][1] for c in curves) / len(curves) for i in range(n)
    ]


def write_table(
    root: Path, name: str, out: dict[str, Any], render: Callable[[dict[str, Any]], str]
) -> str:
    """Write a measurement's figures to ``root/bench/results/<name>.json`` and its table,
    ``render(out)``, to ``<name>.md`` beside it (the tests hold the two together); returns
    the table."""
    res = root / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    md = render(out)
    (res / f"{name}.md").write_text(md)
    return md

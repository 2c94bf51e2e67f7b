"""The bench scripts' shared helpers: finished runs of one experiment, for the results tables
(``p1_table.py``, ``p3_table.py``), read in either form (a full run directory or the light
form of :mod:`light`, which the tables commit); one simulation launched as a user launches
it (S1, S4, S5; its processes: :func:`fl_app.launch.simulation_processes`); writing a
measurement's JSON with its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from light import is_light, lost_results, make_light, write_light

from fl_app.results import (
    ROUND_LOG,
    Curve,
    curve,
    read_curve,
    read_records,
    read_rounds,
    run_completed,
    run_setup_config,
)

ROOT = Path(__file__).resolve().parent.parent

Run = tuple[dict[str, Any], list[dict[str, Any]], Path]  # summary, round records, directory


def finished_runs(base: Path) -> dict[str, list[Run]]:
    """``{method: [(summary, round records, run directory), ...]}`` for every run under
    ``base/<method>/seed*/`` that completed all its rounds (others are skipped), in seed
    order. A run may be full (its round log, gzipped in older committed copies: every
    record) or light (:func:`fl_app.results.read_records`: the global model's figures of the rounds
    its ``curve.json`` keeps, which give the tables the same numbers)."""
    out: dict[str, list[Run]] = {}
    for mdir in sorted(base.iterdir()) if base.is_dir() else []:
        for sdir in sorted(mdir.glob("seed*")):
            sf = sdir / "summary.json"
            if not sf.is_file():
                continue
            s = json.loads(sf.read_text())
            if not run_completed(s):
                continue
            out.setdefault(mdir.name, []).append((s, read_records(sdir), sdir))
    return out


def setup_configs(runs: dict[str, list[Run]]) -> dict[str, Any]:
    """``{method: the config its first run trained with}`` (:func:`run_setup_config`; None
    when unknown), what the tables' matched-FedAvg Δs compare."""
    return {m: run_setup_config(found[0][2], found[0][0]) for m, found in runs.items()}


def copy_runs(runs: dict[str, list[Run]], dest: Path) -> None:
    """Copy each run to ``dest/<method>/<seed dir>/`` in the light form
    (:func:`light.write_light`: ``summary.json``, ``config.yaml``, ``curve.json``), so that
    the committed tables keep their sources and what each run trained (the tables' Δs)
    without the per-client round logs; a committed run of the same method and seed there
    is replaced (its round log removed). Runs already there (regenerating from the committed
    copies, full or light) are left as they are."""
    for method, found in runs.items():
        for _, records, sdir in found:
            d = dest / method / sdir.name
            if d.resolve() != sdir.resolve():
                write_light(sdir, d, make_light(sdir, records))


def collect(base: Path, dest: Path | None = None) -> dict[str, list[tuple[dict[str, Any], Curve]]]:
    """``{method: [(summary, accuracy curve), ...]}`` of :func:`finished_runs`, each run copied
    to ``dest`` first when given (:func:`copy_runs`)."""
    runs = finished_runs(base)
    if dest is not None:
        copy_runs(runs, dest)
    return {m: [(s, curve(recs)) for s, recs, _ in found] for m, found in runs.items()}


def seeds_label(n: int) -> str:
    """``"1 seed"``, ``"3 seeds"``: the run count in plot legends."""
    return f"{n} seed{'s' * (n != 1)}"


def per_seed_label(values: list[float], lost: list[int] | None = None) -> str:
    """``"81.7 / 79.1† / 79.2"``: one value per seed, for the tables' per-seed cells, with a
    † after each run whose ``lost`` count (:func:`lost_count`, one per value) is not 0."""
    marks = ["†" if n else "" for n in lost] if lost is not None else [""] * len(values)
    return " / ".join(f"{v:.1f}{m}" for v, m in zip(values, marks, strict=True))


#: the legend of :func:`lossy_lines` under a table (docs/BENCHMARKS.md says what is done)
LOSSY_LEGEND = (
    "† A run whose rounds aggregated without some clients' results (a client past "
    "`server.round_timeout`, a client error, or a result the server rejected); its "
    "figures count as they are until a clean repeat replaces them (docs/BENCHMARKS.md, "
    '"Runs that lost client results"):'
)


def lost_count(summary: dict[str, Any]) -> int:
    """How many client results a run's rounds aggregated without (its summary's
    ``failed_results``: missing past ``server.round_timeout`` or a client error, and
    ``dropped_results``: rejected by the server's checks)."""
    return int(summary.get("failed_results") or 0) + int(summary.get("dropped_results") or 0)


def lost_note(run: Path, records: list[dict[str, Any]]) -> str:
    """Where a run lost results: e.g. ``"round 4: 4 missing — no reply before
    server.round_timeout"``, from its round ``records`` (:func:`light.lost_results`) when it is
    a full run, else from its light ``curve.json``'s ``lost_results``; ``""`` when that
    curve does not say (made before the key existed)."""
    light = is_light(run)
    entries = (read_curve(run).get("lost_results") or []) if light else lost_results(records)
    parts = []
    for e in entries:
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(e["counts"].items()))
        why = "; ".join(e["reasons"])
        parts.append(f"round {e['round']}: {counts}" + (f" — {why}" if why else ""))
    return "; ".join(parts)


def lossy_lines(label: str, runs: dict[str, list[Run]]) -> list[str]:
    """One line per run of ``runs`` that lost client results (:func:`lost_count`), naming it
    (``label``, method, seed), how many and, where its curve says, in which rounds and why
    (:func:`lost_note`)."""
    out = []
    for method in sorted(runs):
        for summary, records, run in runs[method]:
            if n := lost_count(summary):
                where = lost_note(run, records)
                out.append(
                    f"{label}{method} seed {summary['seed']}: {n} client result"
                    f"{'s' if n > 1 else ''} lost" + (f" ({where})" if where else "")
                )
    return out


def lossy_section(lines: list[str]) -> list[str]:
    """The markdown lines under a table for :func:`lossy_lines` (none when it is empty)."""
    return ["", LOSSY_LEGEND, "", *(f"- {line}" for line in lines)] if lines else []


def write_table(res: Path, name: str, figures: Any, table: str) -> str:
    """Write a table's figures to ``res/<name>.json`` and the table (markdown rendered from
    them) to ``<name>.md`` beside it, which the tests hold together; returns the table."""
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
    (res / f"{name}.md").write_text(table)
    return table


def launch(
    out: Path,
    experiment: str,
    method: str,
    overrides: str,
    *options: str,
    seed: int = 0,
    env: dict[str, str] | None = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """Run one simulation through ``fl_app.launch`` (what ``make run`` runs) with its results
    under ``out``: ``--seed seed``, ``--set overrides`` and any further launcher ``options``,
    in the environment ``env`` (default: this process's). Returns the run's directory and its
    round records; a failed run ends the script with the end of its log."""
    cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", experiment, "--method", method]
    cmd += ["--seed", str(seed), "--output-dir", str(out), "--set", overrides, *options]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"the {experiment} run of {method} failed: {' '.join(cmd[2:])}")
    run = out / experiment / method / f"seed{seed}"
    return run, read_rounds(run / ROUND_LOG)

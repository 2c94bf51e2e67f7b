"""The light form of a finished run, which ``bench/results`` commits from now on.

A run directory as a run writes it holds ``rounds.jsonl``: every round's record, with each
client's figures (hundreds of kB to MBs a run, gzipped). The light form keeps what the table
and plot scripts read and nothing else:

- ``summary.json`` and ``config.yaml``, as the run wrote them;
- ``curve.json``: per evaluated round only the global model's figures :data:`FIGURES`
  (``round`` and those of ``accuracy``, ``loss``, ``federated_accuracy``,
  ``effective_rank``, ``robust_fgsm``, ``robust_pgd`` that the record carries), on the
  rounds :func:`kept_rounds` keeps, ``dropped_rounds``: the evaluated rounds left out, and
  ``lost_results``: every round that aggregated without some of its clients' results
  (:func:`lost_results`: how many of each kind, and why), so that a table can say which runs
  lost clients and where (curves made before 2026-11-30 lack the key: their summary's
  ``failed_results``/``dropped_results`` still count them).

The rule (:func:`kept_rounds`) keeps an evaluated round (one that carries a figure) when

1. it is one of rounds 0-:data:`EVERY_ROUND_UNTIL` (every evaluation: the climb, P4's early
   rounds, every round of a 100-round run), or
2. it is a multiple of :data:`THIN` (the curve's shape after that), or
3. for some figure, it is one of the last :data:`WINDOW` rounds (round 0 aside) carrying
   that figure at or before a *milestone*: a multiple of :data:`MILESTONE`, or the run's
   last round. So every last-5 figure at a milestone is exact (the runs' last-5 and final
   figures, ``p3_milestones.py``'s rounds 100/300/.../1000 and 50/100/200/300), and so is
   every figure's last value.

Rounds without a figure (not evaluated) are left out. A run of at most
:data:`EVERY_ROUND_UNTIL` rounds therefore keeps every evaluation; a 1000-round run evaluated
every round about a quarter. A reader that needs the evaluations in a window ending
elsewhere asks :func:`dropped_in_window`, which names the rounds the light form lacks.
Scripts that need per-client records (``gne_weights.py``) read them through
:func:`full_records`, which refuses a light run with a message saying so.

    .venv/bin/python bench/light.py RUN_DIR... --out DEST    # DEST/<method>/seed<k>/
    .venv/bin/python bench/light.py --tree RUNS --out DEST   # every completed run under RUNS
    .venv/bin/python bench/light.py RUN_DIR... --in-place    # replace the round log

Only completed runs are made light (an error names the file that says otherwise); ``--tree``
lists the runs it leaves out for that.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fl_app.results import (  # the readers of both forms live with the results module
    CURVE,
    ROUND_LOGS,
    LightRunError,
    has_round_log,
    parse_rounds,
    read_curve,
    read_round_log,
    read_summary,
    run_completed,
)
from fl_app.results import (
    read_records as read_records,  # the scripts' and tests' reader of either form
)

#: the global model's per-round figures the light form keeps (every bench script's reads)
FIGURES = (
    "accuracy",
    "loss",
    "federated_accuracy",
    "effective_rank",
    "robust_fgsm",
    "robust_pgd",
)
EVERY_ROUND_UNTIL = 100  # every evaluation of rounds 0..100 is kept
THIN = 10  # after that, every evaluated multiple of 10
MILESTONE = 50  # and the last WINDOW evaluations at or before each multiple of 50
WINDOW = 5  # the last-5 figures
FORMAT = 1  # curve.json's "format"


def is_light(run: Path) -> bool:
    """Whether the run directory is in the light form: a ``curve.json`` and no round log (a
    directory with both is read from its round log, the fuller of the two)."""
    return (run / CURVE).is_file() and not has_round_log(run)


def figures(record: dict[str, Any]) -> dict[str, Any]:
    """The light record of one round record: its ``round`` and the :data:`FIGURES` it carries
    (not None), values unchanged; ``{}`` for a round without any (not evaluated)."""
    kept = {k: record[k] for k in FIGURES if record.get(k) is not None}
    return {"round": record["round"], **kept} if kept else {}


def _milestones(last: int) -> list[int]:
    """Every multiple of :data:`MILESTONE` up to ``last``, and ``last``."""
    return [*range(MILESTONE, last + 1, MILESTONE), last]


def kept_rounds(records: list[dict[str, Any]]) -> set[int]:
    """The rounds of the light records ``records`` (:func:`figures`, one per evaluated round,
    in round order) that the light form keeps: the module docstring's rule."""
    rounds = [r["round"] for r in records]
    keep = {t for t in rounds if t <= EVERY_ROUND_UNTIL or t % THIN == 0}
    last = max(rounds, default=0)
    for key in FIGURES:
        carrying = [r["round"] for r in records if key in r and r["round"] >= 1]
        for milestone in _milestones(last):
            keep.update([t for t in carrying if t <= milestone][-WINDOW:])
    return keep


def short_reason(reason: str, limit: int = 200) -> str:
    """A failure's reason on one line: a client error relayed by Ray keeps only the client's
    own message (after ``Message:``, without the trace, colour codes and repr around it),
    whitespace collapsed, cut at ``limit`` characters with an ellipsis."""
    text = re.sub(r"\x1b?\[\d+(;\d+)*m", "", reason)
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1].rstrip("'>) \n")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def lost_results(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per round whose record lists ``failures`` (results the round aggregated
    without: ``missing`` past ``server.round_timeout``, ``error`` on the client, ``rejected``
    by the server's checks), in round order: ``{"round", "counts": {kind: n}, "reasons":
    [each distinct reason (:func:`short_reason`), sorted]}``."""
    out = []
    for r in sorted(records, key=lambda r: r["round"]):
        failures = [f for f in r.get("failures") or [] if isinstance(f, dict)]
        if failures:
            counts = dict(Counter(str(f.get("kind", "unknown")) for f in failures))
            reasons = sorted({short_reason(str(f["reason"])) for f in failures if f.get("reason")})
            out.append({"round": r["round"], "counts": counts, "reasons": reasons})
    return out


def light_curve(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``curve.json`` object of a full run's round records: ``format``, ``figures``,
    ``dropped_rounds`` (evaluated rounds left out, ascending), ``lost_results``
    (:func:`lost_results`) and ``records`` (the kept light records, in round order)."""
    evaluated = [f for f in map(figures, sorted(records, key=lambda r: r["round"])) if f]
    keep = kept_rounds(evaluated)
    return {
        "format": FORMAT,
        "figures": list(FIGURES),
        "dropped_rounds": [r["round"] for r in evaluated if r["round"] not in keep],
        "lost_results": lost_results(records),
        "records": [r for r in evaluated if r["round"] in keep],
    }


def dumps_curve(curve: dict[str, Any]) -> str:
    """``curve.json``'s text: one line for the header keys, one per record (readable diffs;
    the same curve always gives the same text)."""
    head = {k: v for k, v in curve.items() if k != "records"}
    lines = [json.dumps(r) for r in curve["records"]]
    return json.dumps(head)[:-1] + ', "records": [\n' + ",\n".join(lines) + "\n]}\n"


def dropped_rounds(run: Path) -> frozenset[int]:
    """The evaluated rounds the light run in ``run`` left out (none for a full run)."""
    return frozenset(read_curve(run)["dropped_rounds"]) if is_light(run) else frozenset()


def dropped_in_window(
    kept: Iterable[int], dropped: Iterable[int], until: int, size: int = WINDOW
) -> list[int]:
    """The rounds of ``dropped`` among the last ``size`` evaluations (round 0 aside) at or
    before round ``until``, when the evaluated rounds are ``kept`` (of the figure read) and
    ``dropped`` (of any figure): empty when the kept ones are exactly that window."""
    candidates = sorted({t for t in (*kept, *dropped) if 1 <= t <= until})[-size:]
    gone = set(dropped)
    return [t for t in candidates if t in gone]


def full_records(run: Path, needs: str) -> list[dict[str, Any]]:
    """The round log's records of ``run`` for a script that reads per-client records; for a
    light run a :class:`LightRunError` saying that ``needs`` (what the script reads) is not
    in the light form and where to find it."""
    if is_light(run):
        raise LightRunError(
            f"{run} is a light run ({CURVE}, no round log): {needs} is only in the full round "
            f"log; give the run's own directory (its output_dir) or a run committed with "
            f"{ROUND_LOGS[1]}"
        )
    return parse_rounds(read_round_log(run))


def completed_summary(run: Path) -> dict[str, Any]:
    """The ``summary.json`` of ``run`` when it says the run completed all its rounds;
    :class:`LightRunError` naming the file otherwise."""
    path = run / "summary.json"
    try:
        summary = read_summary(run)
    except ValueError as err:
        raise LightRunError(str(err)) from None
    if summary is None:
        raise LightRunError(f"{path} is missing: not a finished run (only those are made light)")
    if not run_completed(summary):
        raise LightRunError(
            f"{path}: status {summary.get('status')!r}, round {summary.get('rounds_completed')}"
            f" of {summary.get('num_rounds')}: only a completed run is made light (finish it, "
            "e.g. with RESUME=1, first)"
        )
    return summary


def make_light(run: Path, records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``curve.json`` object of the completed run in ``run``: its own when it is light
    already, else made from its round records (``records`` when the caller has read them,
    else its round log). :class:`LightRunError` naming the file when the run did not complete
    or its round log is missing or ends before its summary's last round."""
    summary = completed_summary(run)
    if is_light(run):
        return read_curve(run)
    if records is None:
        if not has_round_log(run):
            raise LightRunError(f"{run}: no round log ({' or '.join(ROUND_LOGS)}) to make light")
        records = parse_rounds(read_round_log(run))
    last = max((r["round"] for r in records), default=-1)
    if last < summary["rounds_completed"]:
        log = next((run / n for n in ROUND_LOGS if (run / n).is_file()), run)
        raise LightRunError(
            f"{log}: ends at round {last}, its summary says {summary['rounds_completed']}"
        )
    return light_curve(records)


def write_light(run: Path, dest: Path, curve: dict[str, Any] | None = None) -> None:
    """Write the light form of the completed run ``run`` to ``dest``: ``summary.json``,
    ``config.yaml`` (when the run has one) and ``curve.json`` (``curve``, default
    :func:`make_light`'s, whose errors come before anything is written); a round log already
    in ``dest`` (a replaced committed run's) is removed, so ``dest`` holds one run. With
    ``dest`` = ``run`` the run is converted in place."""
    if curve is None:
        curve = make_light(run)
    dest.mkdir(parents=True, exist_ok=True)
    if dest.resolve() != run.resolve():
        shutil.copy(run / "summary.json", dest / "summary.json")
        if (run / "config.yaml").is_file():  # what it trained: model, optimiser (Δs)
            shutil.copy(run / "config.yaml", dest / "config.yaml")
        elif (dest / "config.yaml").is_file():
            (dest / "config.yaml").unlink()  # a replaced run's
    (dest / CURVE).write_text(dumps_curve(curve))
    for name in ROUND_LOGS:
        (dest / name).unlink(missing_ok=True)


def run_dirs(tree: Path) -> list[Path]:
    """Every run directory (``.../seed<k>/`` with a ``summary.json``) under ``tree``, in
    path order."""
    return sorted(p.parent for p in tree.rglob("seed*/summary.json"))


def main(argv: list[str] | None = None) -> str | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories (.../<method>/seed<k>)")
    p.add_argument("--tree", type=Path, help="every completed run under this folder")
    p.add_argument("--out", type=Path, help="write the light runs here")
    p.add_argument("--in-place", action="store_true", help="replace each run's round log")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.tree):
        return "give run directories or --tree RUNS (one of the two)"
    if (args.out is None) == (not args.in_place):
        return "give --out DEST, or --in-place to replace the runs' round logs"
    if args.tree:
        todo, left = [], []
        for run in run_dirs(args.tree):
            try:
                completed_summary(run)
                todo.append((run, run.relative_to(args.tree)))
            except LightRunError as err:
                left.append(str(err))
        for line in left:
            print(f"left out: {line}", file=sys.stderr)
    else:
        todo = [(run, Path(run.resolve().parent.name, run.resolve().name)) for run in args.runs]
    try:  # every run checked (and its curve made) before anything is written
        made = [
            (run, run if args.in_place else args.out / rel, make_light(run)) for run, rel in todo
        ]
    except LightRunError as err:
        return f"{err}; nothing was written"
    for run, dest, curve in made:
        write_light(run, dest, curve)
        print(f"{run} -> {dest / CURVE}")
    return None


if __name__ == "__main__":
    sys.exit(main())

"""bench/runs.py: the finished runs of an experiment read in either form (full or light),
runs copied for committing in the light form, replacing a committed run of the same seed,
and the runs that lost client results, marked and listed (from either form)."""

import json
import shutil
from pathlib import Path

import light
from runs import (
    collect,
    copy_runs,
    finished_runs,
    lossy_lines,
    lossy_section,
    lost_count,
    lost_note,
    per_seed_label,
)

from fl_app.results import curve
from tests.bench.conftest import RESULTS

MOON = RESULTS / "regimes" / "regime_moon"  # the committed R-MOON runs, 30 rounds each
UNFINISHED_SEED = 9  # a seed no committed run has


def _unfinished(path: Path) -> None:
    """A run directory whose summary says it was interrupted after round 3."""
    path.mkdir(parents=True)
    summary = {
        "status": "interrupted",
        "num_rounds": 30,
        "rounds_completed": 3,
        "seed": UNFINISHED_SEED,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "rounds.jsonl").write_text('{"round": 0, "accuracy": 0.1}\n')


def test_finished_runs_read_full_and_light_runs_alike(tmp_path):
    base = tmp_path / "regime_moon"
    light.main(["--tree", str(MOON), "--out", str(base)])
    shutil.copytree(MOON / "fedavg_head", base / "fedavg_head", dirs_exist_ok=True)  # mixed
    (base / "fedavg_head" / "seed0" / "curve.json").unlink()
    _unfinished(base / "moon" / f"seed{UNFINISHED_SEED}")
    full, mine = finished_runs(MOON), finished_runs(base)
    assert {m: [s for s, _, _ in f] for m, f in mine.items()} == {
        m: [s for s, _, _ in f] for m, f in full.items()
    }  # the same completed runs (the unfinished one left out), the same summaries
    for method, found in full.items():
        for (_, recs, _), (_, light_recs, _) in zip(found, mine[method], strict=True):
            assert curve(light_recs) == curve(recs)
    assert light.is_light(base / "moon" / "seed0")
    assert not light.is_light(base / "fedavg_head" / "seed0")


def test_copies_for_committing_are_light_and_replace_a_committed_run(tmp_path):
    dest = tmp_path / "committed"
    shutil.copytree(MOON / "moon" / "seed0", dest / "moon" / "seed0")  # committed in full
    runs = finished_runs(MOON)
    got = collect(MOON, dest)
    assert {m: [c for _, c in f] for m, f in got.items()} == {
        m: [curve(r) for _, r, _ in f] for m, f in runs.items()
    }
    for method, found in runs.items():
        for _, _, sdir in found:
            copy = dest / method / sdir.name
            assert sorted(p.name for p in copy.iterdir()) == [
                "config.yaml",
                "curve.json",
                "summary.json",
            ]
            # the committed source is full (seed 0) or already light (fedavg_head seed 1)
            assert light.read_records(copy) == [light.figures(r) for r in light.read_records(sdir)]
    copy_runs(finished_runs(dest), dest)  # copies of themselves: left as they are
    assert light.is_light(dest / "moon" / "seed0")


def test_lost_results_are_counted_marked_and_listed_with_where_the_curve_says(tmp_path):
    """failed and dropped results both count; a † marks each such seed; a listed run names
    the rounds and reasons of its light curve, or only the count when its curve lacks them
    (a full run, or a light one made before the key)."""
    assert lost_count({"failed_results": 2, "dropped_results": 1}) == 3
    assert lost_count({"seed": 0}) == 0
    assert per_seed_label([81.71, 79.14]) == "81.7 / 79.1"
    assert per_seed_label([81.71, 79.14], [0, 3]) == "81.7 / 79.1†"
    lost = [{"round": 4, "counts": {"missing": 2, "error": 1}, "reasons": ["OOM", "timeout"]}]
    old, new = tmp_path / "old", tmp_path / "new"
    for run, extra in ((old, {}), (new, {"lost_results": lost})):
        run.mkdir()
        (run / "curve.json").write_text(json.dumps({"records": [], **extra}))
    assert lost_note(old, []) == ""
    assert lost_note(new, []) == "round 4: 1 error, 2 missing — OOM; timeout"
    full = tmp_path / "full"  # a full run: read from its records' failures
    full.mkdir()
    (full / "rounds.jsonl").write_text("")
    failures = [{"kind": "missing", "reason": "timeout"}, {"kind": "error", "reason": "OOM"}]
    records = [{"round": 3}, {"round": 4, "failures": [*failures, failures[0]]}]
    assert lost_note(full, records) == lost_note(new, [])
    runs = {
        "moon": [({"seed": 0}, [], old), ({"seed": 2, "failed_results": 1}, [], old)],
        "fedavg": [({"seed": 1, "failed_results": 3}, [], new)],
    }
    lines = lossy_lines("P ", runs)
    assert lines == [
        "P fedavg seed 1: 3 client results lost (round 4: 1 error, 2 missing — OOM; timeout)",
        "P moon seed 2: 1 client result lost",
    ]
    section = lossy_section(lines)
    assert section[1].startswith("† A run whose rounds") and section[3:] == [
        f"- {x}" for x in lines
    ]
    assert lossy_section([]) == []

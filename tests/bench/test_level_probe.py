"""bench/level_probe.py: the committed table is its committed measurements with the rules
applied (``--rebuild``), and the rules pick what its docstring says."""

import contextlib
import copy
import io
import json
import sys

import level_probe

from tests.bench.conftest import RESULTS


def test_committed_table_is_rebuilt_from_its_measurements(tmp_path, monkeypatch):
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    (res / "level_probe.json").write_text((RESULTS / "level_probe.json").read_text())
    monkeypatch.setattr(level_probe, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["level_probe", "--rebuild"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert level_probe.main() is None
    for name in ("level_probe.md", "level_probe.json"):
        assert (res / name).read_text() == (RESULTS / name).read_text(), name


def test_rules_declared_then_fallback():
    figures = json.loads((RESULTS / "level_probe.json").read_text())
    assert figures["chosen_declared"] is None  # no candidate has 3 passing conv stages
    assert figures["chosen"]["model"] == "cnn4_narrow_gn" and figures["chosen"]["levels"] == [3, 4]
    # a candidate with 3 passing conv stages is taken by the declared rule, cheapest first
    edited = copy.deepcopy(figures)
    for lv in edited["candidates"]["cnn4_gn"]["levels"][1:]:
        lv["passes"] = True
    level_probe.decide(edited)
    assert edited["chosen_declared"]["model"] == "cnn4_gn"
    assert edited["chosen"]["levels"] == [1, 2, 3, 4]
    # the P1 CNN is a reference, never chosen; the first passing conv stage needs 32 channels
    edited["candidates"] = {"p1": figures["candidates"]["p1"]}
    for lv in edited["candidates"]["p1"]["levels"]:
        lv["passes"] = True
    level_probe.decide(edited)
    assert edited["chosen"] is None


def test_a_level_passes_on_its_trained_figures_only():
    assert level_probe.passes({"probe": 0.70, "top_pc": 0.50})
    assert not level_probe.passes({"probe": 0.69, "top_pc": 0.10})
    assert not level_probe.passes({"probe": 0.99, "top_pc": 0.51})

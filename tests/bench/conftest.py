"""Rebuilding the committed results tables from their committed run copies, in a scratch
project root, so that the scripts under test never write into ``bench/results``."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "bench"))  # the scripts import their shared `runs` module so


@pytest.fixture
def rebuild(tmp_path, monkeypatch) -> Callable[..., tuple[str | None, Path]]:
    """``rebuild(script_module, *argv)``: run the script's ``main`` with ``argv`` and ``ROOT``
    pointing at a scratch root (empty on a test's first call; later calls of the test share
    it); returns ``main``'s return value (an error message or ``None``) and the scratch
    root's ``bench/results``, where the script wrote."""

    def _rebuild(module: ModuleType, *argv: str | Path) -> tuple[str | None, Path]:
        root = tmp_path / "root"
        (root / "bench" / "results").mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(module, "ROOT", root)
        monkeypatch.setattr(sys, "argv", [module.__name__, *map(str, argv)])
        with contextlib.redirect_stdout(io.StringIO()):
            err = module.main()
        return err, root / "bench" / "results"

    return _rebuild


def linked_runs(tmp_path: Path, experiment: str, committed: str, light: bool = False) -> Path:
    """A runs folder laid out as runs are (``<runs>/<experiment>/<method>/seed<k>``) whose
    ``<experiment>`` is the committed copy ``bench/results/<committed>``, or with ``light``
    its light form (:func:`light_copy`)."""
    source = light_copy(tmp_path, committed) if light else RESULTS / committed
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / experiment).symlink_to(source)
    return runs


def rendered_and_committed(module: ModuleType, name: str) -> tuple[str, str]:
    """What ``module.markdown`` renders from the committed measurement
    ``bench/results/<name>.json``, and the committed table ``<name>.md``: a measured table
    (no runs to rebuild it from) must be the rendering of its own figures."""
    measured = json.loads((RESULTS / f"{name}.json").read_text())
    return module.markdown(measured), (RESULTS / f"{name}.md").read_text()


def light_copy(tmp_path: Path, committed: str) -> Path:
    """The committed runs ``bench/results/<committed>`` (full runs) converted to the light
    form (``bench/light.py --tree``) under ``tmp_path/light/<committed>``, laid out alike."""
    import light

    out = tmp_path / "light" / committed
    with contextlib.redirect_stdout(io.StringIO()):
        assert light.main(["--tree", str(RESULTS / committed), "--out", str(out)]) is None
    assert not list(out.rglob("rounds.jsonl*")) and list(out.rglob("curve.json"))
    return out

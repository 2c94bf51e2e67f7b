"""The static checks of ``make lint`` as tests, so that CI keeps the code ruff-clean, formatted
and type-checked (mypy, configured in pyproject.toml: fl_app, clients, strategies, bench and
tests)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "check", [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]], ids=" ".join
)
def test_static_check_passes(check: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *check], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{' '.join(check)} failed:\n{done.stdout}{done.stderr}"

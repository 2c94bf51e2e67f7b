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


# modules whose tests live elsewhere, with where and why
TESTED_ELSEWHERE = {
    # the two-node Ray cluster it builds is exercised by the deployment tests
    "bench/ray_cluster.py": "tests/deploy/test_ray_cluster.py",
}


def test_every_module_has_a_test_file_mirroring_it() -> None:
    """``pkg/mod.py`` is tested in ``tests/pkg/test_mod.py``, so a reader finds a module's
    tests without searching, and a new module without tests is noticed."""
    missing = []
    for package in ("core", "clients", "strategies", "fl_app", "bench"):
        for module in sorted((ROOT / package).glob("*.py")):
            if module.name == "__init__.py":
                continue
            name = f"{package}/{module.name}"
            test = TESTED_ELSEWHERE.get(name, f"tests/{package}/test_{module.name}")
            if not (ROOT / test).is_file():
                missing.append(f"{name} (expected {test})")
    assert not missing, "modules without a test file: " + ", ".join(missing)

"""bench/p3_table.py rebuilds each committed P3 table from the committed (gzipped) copies of
its runs, byte for byte, and from their light form alike."""

import p3_table
import pytest

from tests.bench.conftest import RESULTS, light_copy


@pytest.mark.parametrize(
    "name",
    ["p3", "p3_300", "p3_1000", "p3_psi", "p3_streams", "p3_streams_1000", "p3_streams_psi"],
)
def test_committed_p3_tables_are_rebuilt_from_their_runs(rebuild, tmp_path, name):
    runs = tmp_path / "runs"
    for pattern in p3_table.PATTERNS:  # the layout runs have: <runs>/<pattern>/p3/<method>
        if (RESULTS / name / pattern).is_dir():
            (runs / pattern).mkdir(parents=True)
            (runs / pattern / "p3").symlink_to(RESULTS / name / pattern)
    err, out = rebuild(p3_table, "--runs", runs, "--name", name)
    assert err is None
    for table in (f"{name}.md", f"{name}.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table


def test_light_runs_give_the_same_table(rebuild, tmp_path):
    """The ψ runs (300 rounds, 3 seeds), converted to the light form (thinned after round
    100), give the committed table; the table's copies of them are light."""
    name, runs = "p3_streams_psi", tmp_path / "runs"
    light = light_copy(tmp_path, name)
    for pattern in p3_table.PATTERNS:
        if (light / pattern).is_dir():
            (runs / pattern).mkdir(parents=True)
            (runs / pattern / "p3").symlink_to(light / pattern)
    err, out = rebuild(p3_table, "--runs", runs, "--name", name)
    assert err is None
    for table in (f"{name}.md", f"{name}.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table
    assert not list((out / name).rglob("rounds.jsonl*")) and list((out / name).rglob("curve.json"))

"""bench/p1_table.py rebuilds each committed P1 table (and its FedCCL ablation table) from the
committed copies of its runs, byte for byte: the README's P1 figures are what those runs say."""

import p1_table
import pytest

from tests.bench.conftest import RESULTS, linked_runs


@pytest.mark.parametrize("name", ["p1", "p1_full", "p1_domains", "p1_domains_imbalanced"])
def test_committed_p1_tables_are_rebuilt_from_their_runs(rebuild, tmp_path, name):
    err, out = rebuild(p1_table, "--runs", linked_runs(tmp_path, "p1", name), "--name", name)
    assert err is None
    for table in (f"{name}.md", f"{name}_fedccl_ablation.md", f"{name}.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table
    assert (out / f"{name}_curves.png").stat().st_size > 0
    # the scratch copies of the runs are what the table was built from
    assert sorted(p.name for p in (out / name).iterdir()) == sorted(
        p.name for p in (RESULTS / name).iterdir()
    )


def test_no_finished_runs_is_a_message_not_a_table(rebuild, tmp_path):
    err, out = rebuild(p1_table, "--runs", tmp_path / "nothing")
    assert err is not None and "no finished P1 runs" in err
    assert list(out.iterdir()) == []

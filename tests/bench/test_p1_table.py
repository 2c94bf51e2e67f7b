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


def test_light_runs_give_the_same_tables_and_are_committed_light(rebuild, tmp_path):
    """The committed full runs of P1 with data.test_fraction=0, converted to the light form,
    give the committed tables (built from the full runs) byte for byte; the table's own
    copies of its runs are light."""
    runs = linked_runs(tmp_path, "p1", "p1_full", light=True)
    err, out = rebuild(p1_table, "--runs", runs, "--name", "p1_full")
    assert err is None
    for table in ("p1_full.md", "p1_full_fedccl_ablation.md", "p1_full.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table
    copies = out / "p1_full"
    assert not list(copies.rglob("rounds.jsonl*"))
    assert len(list(copies.rglob("curve.json"))) == len(list(RESULTS.glob("p1_full/*/seed*")))


def test_no_finished_runs_is_a_message_not_a_table(rebuild, tmp_path):
    err, out = rebuild(p1_table, "--runs", tmp_path / "nothing")
    assert err is not None and "no finished P1 runs" in err
    assert list(out.iterdir()) == []

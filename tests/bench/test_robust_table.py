"""bench/robust_table.py rebuilds the committed FedCCL+ robustness table (clean, FGSM, PGD-20)
from the committed copies of its runs, full or light."""

import pytest
import robust_table

from tests.bench.conftest import RESULTS, linked_runs


@pytest.mark.parametrize("light", [False, True], ids=["full", "light"])
def test_committed_robustness_table_is_rebuilt_from_its_runs(rebuild, tmp_path, light):
    # light: the last five clean, FGSM and PGD evaluations are in the light curve
    runs = linked_runs(tmp_path, "p1", "p1_robust", light)
    err, out = rebuild(robust_table, "--runs", runs, "--name", "p1_robust")
    assert err is None
    for table in ("p1_robust.md", "p1_robust.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table

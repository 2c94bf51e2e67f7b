"""The committed S3 server-cost tables are what bench/s3_server_cost.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s3_server_cost

from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize("name", ["s3_server_cost"])
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(s3_server_cost, name)
    assert rendered == committed


def test_script_times_every_server_step_and_writes_its_files(rebuild):
    err, out = rebuild(s3_server_cost, "--threads", "1")
    assert err is None
    measured = json.loads((out / "s3_server_cost.json").read_text())
    assert set(measured["seconds"]) == {
        "gne_gram_k100_1m",
        "gne_solve_k100",
        "gne_apply_k100_1m",
        "finch_server_3000x128",
        "fedau_round_10000_nodes",
    }
    assert (out / "s3_server_cost.md").read_text() == s3_server_cost.markdown(measured)

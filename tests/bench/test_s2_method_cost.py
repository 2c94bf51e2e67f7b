"""The committed S2 per-method step-cost tables are what bench/s2_method_cost.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s2_method_cost

from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize(
    "name",
    [
        "s2_method_cost",
        "s2_method_cost_resnet18_gn",
        "s2_method_cost_cuda",
        "s2_method_cost_cuda_eager",
        "s2_method_cost_cuda_resnet18_gn",
        "s2_method_cost_cuda_resnet18_gn_eager",
        "s2_method_cost_cuda_resnet18_gn_h100_eager",
    ],
)
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(s2_method_cost, name)
    assert rendered == committed


def test_script_runs_every_row_and_writes_its_files(rebuild):
    """Two steps, one repeat: every method's client runs (the timings mean nothing here)."""
    err, out = rebuild(s2_method_cost, "--steps", "2", "--repeats", "1")
    assert err is None
    measured = json.loads((out / "s2_method_cost.json").read_text())
    assert set(measured["methods"]) == set(s2_method_cost.ROWS)
    assert all(r["seconds_per_step"] > 0 for r in measured["methods"].values())
    assert (out / "s2_method_cost.md").read_text() == s2_method_cost.markdown(measured)


def test_the_cuda_table_names_the_methods_that_ran_without_a_graph():
    out = {"device": "cuda", "cuda_graph": True, "methods": {"fedavg": {}, "fedccl_plus": {}}}
    assert "not PMFL" in s2_method_cost._graph_note(out)  # results from before the field
    out["methods"] = {"fedavg": {"graphed": True}, "fedccl_plus": {"graphed": False}}
    assert s2_method_cost._graph_note(out).endswith(
        "graph (`client.cuda_graph`), except for fedccl_plus."
    )
    out["methods"]["fedccl_plus"]["graphed"] = True
    assert s2_method_cost._graph_note(out).endswith("graph (`client.cuda_graph`).")
    assert "kernel by kernel" in s2_method_cost._graph_note({**out, "cuda_graph": False})
    assert s2_method_cost._graph_note({**out, "device": "cpu"}) == ""

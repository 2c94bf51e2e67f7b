"""The committed looped-vs-vmapped tables are what bench/frozen_stack.py renders from their
JSON, and the script runs end to end on the CPU (vmapped and looped outputs agreeing)."""

import json

import frozen_stack
import pytest

from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize(
    "name", ["frozen_stack_cpu", "frozen_stack_cuda", "frozen_stack_cuda_resnet18_gn"]
)
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(frozen_stack, name)
    assert rendered == committed


def test_script_times_both_forms_and_they_agree(rebuild):
    err, out = rebuild(frozen_stack, "--iters", "1", "--repeats", "1")
    assert err is None
    measured = json.loads((out / "frozen_stack_cpu.json").read_text())
    assert [r["models"] for r in measured["rows"]] == list(frozen_stack.MODELS)
    for r in measured["rows"]:
        assert r["loop_ms"] > 0 and r["vmap_ms"] > 0 and r["rel_diff"] < 1e-5
    assert (out / "frozen_stack_cpu.md").read_text() == frozen_stack.markdown(measured)

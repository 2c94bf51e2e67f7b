"""The committed S2 per-method step-cost tables are what bench/s2_method_cost.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s2_method_cost

from tests.bench.conftest import RESULTS


@pytest.mark.parametrize("name", ["s2_method_cost", "s2_method_cost_resnet18_gn"])
def test_committed_table_renders_from_its_json(name):
    measured = json.loads((RESULTS / f"{name}.json").read_text())
    assert s2_method_cost.markdown(measured) == (RESULTS / f"{name}.md").read_text()

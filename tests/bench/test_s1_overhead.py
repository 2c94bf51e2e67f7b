"""The committed S1 framework-overhead tables are what bench/s1_overhead.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s1_overhead

from tests.bench.conftest import RESULTS


@pytest.mark.parametrize("name", ["s1_overhead", "s1_overhead_p1"])
def test_committed_table_renders_from_its_json(name):
    measured = json.loads((RESULTS / f"{name}.json").read_text())
    assert s1_overhead.markdown(measured) == (RESULTS / f"{name}.md").read_text()

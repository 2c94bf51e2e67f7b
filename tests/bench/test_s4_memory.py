"""The committed S4 memory tables are what bench/s4_memory.py renders from the measurements in
their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s4_memory

from tests.bench.conftest import RESULTS


@pytest.mark.parametrize("name", ["s4_memory"])
def test_committed_table_renders_from_its_json(name):
    measured = json.loads((RESULTS / f"{name}.json").read_text())
    assert s4_memory.markdown(measured) == (RESULTS / f"{name}.md").read_text()

"""The committed S4 memory tables are what bench/s4_memory.py renders from the measurements in
their JSON files (so a table in the README cannot drift from its measurement)."""

import pytest
import s4_memory

from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize("name", ["s4_memory"])
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(s4_memory, name)
    assert rendered == committed

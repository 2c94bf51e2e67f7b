"""The committed S1 framework-overhead tables are what bench/s1_overhead.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import pytest
import s1_overhead

from tests.bench.conftest import rendered_and_committed


@pytest.mark.parametrize("name", ["s1_overhead", "s1_overhead_p1"])
def test_committed_table_renders_from_its_json(name):
    rendered, committed = rendered_and_committed(s1_overhead, name)
    assert rendered == committed

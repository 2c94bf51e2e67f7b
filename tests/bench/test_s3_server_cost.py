"""The committed S3 server-cost tables are what bench/s3_server_cost.py renders from the
measurements in their JSON files (so a table in the README cannot drift from its measurement)."""

import json

import pytest
import s3_server_cost

from tests.bench.conftest import RESULTS


@pytest.mark.parametrize("name", ["s3_server_cost"])
def test_committed_table_renders_from_its_json(name):
    measured = json.loads((RESULTS / f"{name}.json").read_text())
    assert s3_server_cost.markdown(measured) == (RESULTS / f"{name}.md").read_text()

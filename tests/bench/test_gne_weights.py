"""bench/gne_weights.py rebuilds both committed GNE-weight tables from the committed runs, and
refuses a light run (no per-client records) saying so."""

import gne_weights
import light
import pytest

from tests.bench.conftest import RESULTS


@pytest.mark.parametrize(
    ("name", "runs", "methods"),
    [
        ("gne_weights", "p1", ["fedrane", "fedrcl_gne", "fedccl_gne"]),
        ("gne_weights_steps80", "p1_explore/steps80", ["fedrcl_gne"]),
    ],
)
def test_committed_gne_weight_tables_are_rebuilt(rebuild, name, runs, methods):
    err, out = rebuild(gne_weights, "--runs", RESULTS / runs, "--name", name, "--methods", *methods)
    assert err is None
    for table in (f"{name}.md", f"{name}.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table


def test_a_light_run_is_refused_with_a_message(rebuild, tmp_path):
    run = RESULTS / "p1_explore" / "steps80" / "fedrcl_gne" / "seed0"
    light.write_light(run, tmp_path / "runs" / "fedrcl_gne" / "seed0")
    err, out = rebuild(gne_weights, "--runs", tmp_path / "runs", "--methods", "fedrcl_gne")
    assert err is not None and "is a light run" in err and "full round log" in err
    assert list(out.iterdir()) == []

"""S6 (the simulation on a Ray cluster): the committed table is what bench/s6_ray_cluster.py
renders from its JSON, and the measurement used the nodes it says. The measurement itself
needs root and runs minutes: `sudo .venv/bin/python bench/s6_ray_cluster.py`."""

import json

import s6_ray_cluster

from tests.bench.conftest import RESULTS, rendered_and_committed


def test_committed_table_renders_from_its_json():
    rendered, committed = rendered_and_committed(s6_ray_cluster, "s6_ray_cluster")
    assert rendered == committed


def test_each_setup_ran_on_the_nodes_it_names():
    setups = json.loads((RESULTS / "s6_ray_cluster_under_load.json").read_text())["setups"]
    assert [v["nodes_used"] for v in setups.values()] == [1, 1, 2]
    assert setups["local Ray, 2 CPUs"]["probe_s"] is None  # no cluster, no probe
    assert all(v["probe_s"] > 0 for k, v in setups.items() if "node" in k)

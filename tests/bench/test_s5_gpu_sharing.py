"""S5 (clients sharing a GPU): the committed table is what bench/s5_gpu_sharing.py renders from
its JSON, and the pieces that read nvidia-smi and Ray's processes parse what those print."""

import json

import pytest
import s5_gpu_sharing

from tests.bench.conftest import RESULTS, rendered_and_committed


def test_committed_table_renders_from_its_json():
    rendered, committed = rendered_and_committed(s5_gpu_sharing, "s5_gpu_sharing")
    assert rendered == committed


def test_committed_run_shows_ray_enforcing_each_share():
    """The measurement itself: with share s, nvidia-smi saw exactly min(10, 1/s) clients on
    the GPU at once, and none when the clients were given no share."""
    rows = json.loads((RESULTS / "s5_gpu_sharing.json").read_text())["rows"]
    assert {r["gpus_per_client"] for r in rows} >= {0.0, 1.0, 0.5, 0.25}
    for r in rows:
        assert r["max_concurrent_clients_on_gpu"] == r["expected_concurrent_on_gpu"]
        assert r["gpu_samples"] > 0


def test_parse_compute_apps():
    text = "1234, 742\n5678, 884\nNo running processes found\n91, [N/A]\n"
    assert s5_gpu_sharing.parse_compute_apps(text) == [(1234, 742.0), (5678, 884.0), (91, 0.0)]
    assert s5_gpu_sharing.parse_compute_apps("") == []


def test_classify_counts_only_this_runs_processes():
    """Clients are this run's Ray workers; a process of another program on the GPU is left
    out, and a PID that is not a process here (ended, or another PID namespace) is counted
    apart, never as a client."""
    titles = {
        1: "ray::ClientAppActor",
        2: "ray::ClientAppActor",
        3: "python -m flwr...",
        4: "ray::ClientAppActor",
        5: "other-program",
    }
    apps = [(1, 900.0), (2, 880.0), (3, 700.0), (4, 900.0), (5, 100.0), (6, 50.0)]
    use = s5_gpu_sharing.classify(apps, {1, 2, 3, 10}, titles.get)
    assert use == s5_gpu_sharing.GpuUse(clients=2, others=1, unresolved=1, mib=2480.0)
    assert s5_gpu_sharing.classify([], {1}, titles.get).clients == 0


def test_ray_workers_are_told_by_their_title():
    assert s5_gpu_sharing.is_ray_worker("ray::ClientAppActor.run")
    assert not s5_gpu_sharing.is_ray_worker("/usr/bin/python3 -m flwr.simulation ...")
    assert not s5_gpu_sharing.is_ray_worker("")


@pytest.mark.parametrize(
    ("share", "clients", "slots", "expected"),
    [
        (0, 10, 16, 0),
        (1, 10, 16, 1),
        (0.5, 10, 16, 2),
        (0.25, 10, 16, 4),
        (0.1, 10, 16, 10),
        (0.1, 5, 16, 5),
        (0.25, 10, 2, 2),
        (1 / 3, 10, 16, 3),
    ],
)
def test_expected_concurrency(share, clients, slots, expected):
    assert s5_gpu_sharing.expected_concurrency(share, clients, slots) == expected

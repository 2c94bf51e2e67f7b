"""fl_app/cluster.py: what the launcher checks on a Ray cluster before Flower starts. The
probe itself runs against a real two-node cluster in tests/deploy/test_ray_cluster.py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fl_app.cluster import (
    PACKAGES,
    ClusterError,
    Node,
    address_problem,
    cluster_problem,
    code_digest,
    probe_cluster,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = {"host": "head", "python": "3.11.7", "ray": "2.55.1", "torch": "2.14.1", "flwr": "1.41.0",
        "code": "abc", "data_problem": None, "sees_token": True}  # fmt: skip


def node(ip: str, cpus: float = 1, gpus: float = 0, **facts: object) -> Node:
    return Node(ip, cpus, gpus, {**HERE, "host": f"h{ip[-1]}", **facts})


def test_a_cluster_of_equal_nodes_that_can_host_a_client_passes():
    nodes = [node("10.0.0.1"), node("10.0.0.2", cpus=4, gpus=2)]
    assert cluster_problem(nodes, HERE, 1, 0.0, None) is None
    assert cluster_problem(nodes, HERE, 4, 0.5, Path("/shared/run")) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [("python", "3.11.9"), ("ray", "2.50.0"), ("torch", "2.13.0"), ("flwr", "1.40.0"),
     ("code", "def")],
)  # fmt: skip
def test_a_node_with_other_versions_or_code_is_named_with_what_differs(key, value):
    problem = cluster_problem(
        [node("10.0.0.1"), node("10.0.0.2", **{key: value})], HERE, 1, 0, None
    )
    assert problem is not None and problem.startswith("Ray node 10.0.0.2 (h2) differs")
    assert f"{key} {value} (here {HERE[key]})" in problem and "make install" in problem


@pytest.mark.parametrize(("cpus", "gpus"), [(2, 0.0), (1, 0.5), (1, 2.0)])
def test_no_node_large_enough_for_a_client_says_so(cpus, gpus):
    nodes = [node("10.0.0.1", cpus=1), node("10.0.0.2", cpus=1, gpus=1)]
    problem = cluster_problem(nodes, HERE, cpus, gpus, None)
    if gpus == 0.5:  # a share of node 2's GPU with 1 CPU fits
        assert problem is None
    else:
        assert problem is not None and problem.startswith(f"no Ray node has {cpus} CPU(s)")
        assert "lower --cpus-per-client/--gpus-per-client" in problem


def test_a_node_that_can_host_a_client_must_read_the_data():
    nodes = [node("10.0.0.1"), node("10.0.0.2", data_problem="Fashion-MNIST not found")]
    assert cluster_problem(nodes, HERE, 1, 0, None) == (
        "Ray node 10.0.0.2 (h2) cannot read the data: Fashion-MNIST not found"
    )
    # a node too small to host a client never reads it
    assert cluster_problem([nodes[0], node("10.0.0.3", cpus=0.5, data_problem="x")], HERE,
                           1, 0, None) is None  # fmt: skip


def test_a_method_with_client_state_needs_the_run_directory_on_every_node():
    nodes = [node("10.0.0.1"), node("10.0.0.2", sees_token=False)]
    assert cluster_problem(nodes, HERE, 1, 0, None) is None  # stateless: no shared folder
    problem = cluster_problem(nodes, HERE, 1, 0, Path("/runs/x"))
    assert problem is not None and "under /runs/x, which Ray node(s) 10.0.0.2 do not see" in problem
    assert "shared filesystem" in problem


def test_an_empty_cluster_is_refused():
    assert cluster_problem([], HERE, 1, 0, None) == "the Ray cluster has no alive node"


@pytest.mark.parametrize("address", ["nohost", "host:", ":6379", "h:0", "h:70000", "h:x"])
def test_a_malformed_address_is_refused_at_once(address):
    problem = address_problem(address)
    assert problem is not None and problem.startswith(f"Ray address {address!r}: use HOST:PORT")


def test_an_address_where_nothing_listens_fails_fast_not_after_rays_retries():
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterError, match=rf"nothing answers at the Ray address 127.0.0.1:{port}"):
        probe_cluster(f"127.0.0.1:{port}", {"dataset": "fmnist"}, None, timeout=20)
    assert address_problem("auto") is None  # Ray's own: this machine's cluster


def test_code_digest_is_the_same_for_a_copy_and_differs_after_an_edit(tmp_path):
    """The digest is over the modules as imported: an installed copy of the same commit
    (another node's) gives this checkout's digest, one edited file another."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    probe = (
        "import sys; sys.path.insert(0, '.'); import fl_app; from fl_app.cluster import "
        "code_digest; assert fl_app.__file__.startswith(sys.argv[1]); print(code_digest())"
    )

    def digest() -> str:
        res = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    assert digest() == code_digest()
    (tmp_path / "core" / "params.py").write_text((ROOT / "core" / "params.py").read_text() + "#\n")
    assert digest() != code_digest()

"""The simulation on a real two-node Ray cluster (issue 49), on this machine.

Two "machines" are Linux network namespaces on a bridge, each with one CPU for Ray: the head
(``ray start --head``, where the launcher, the local SuperLink and Flower's driver run) and a
worker (``ray start --address=HEAD``). The worker runs in a mount namespace that hides the
checkout: it imports the project from its own install (a wheel of this commit in a venv of
its own; the third-party packages it shares with this venv are bind-mounted elsewhere), as
a separate machine would. Then:

- MOON keeps client state in files under the run directory: with that directory out of the
  worker's sight the launch is refused before Flower starts, naming the node;
- a FedAvg smoke run launched with ``--ray-address`` trains clients on both nodes (the
  round log records each client's Ray node); the worker is killed mid-run (every process in
  its namespace, a power loss): the run stops at once with RayNodeLostError (exit 1), or
  completes; never hangs. ``--resume`` then completes the run on the head alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the scripts do
from ray_cluster import Cluster, namespace_cluster

from fl_app.results import ROUND_LOG, read_rounds

SMOKE = ("--experiment", "smoke")
RUN_SET = "data.train_subset=1500 data.test_subset=500 evaluation.plot=false"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
    reason="needs root, iproute2 (`ip netns`) and unshare to make two hosts on one machine",
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-cluster")


@pytest.fixture(scope="module")
def cluster(work: Path) -> Iterator[Cluster]:
    """A head and a worker with one CPU each; the worker sees neither the checkout nor
    ``work/private``."""
    (work / "private").mkdir()
    with namespace_cluster(work, [1, 1], hidden=[work / "private"]) as c:
        yield c


def rounds(out: Path) -> list[dict[str, Any]]:
    return read_rounds(out / ROUND_LOG)  # none until the run has written its first round


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the launcher hung (over {timeout:g} s):\n{out[-4000:]}")
    return proc.returncode, out


def test_moon_needs_its_run_directory_on_every_node(cluster: Cluster, work: Path) -> None:
    """MOON keeps each client's previous local model in files under the run directory: a
    worker that does not see it would train the client from nothing in its rounds."""
    private = work / "private"
    code, log = finish(
        cluster.launch(*SMOKE, "--method", "moon", "--output-dir", str(private), "--set", RUN_SET),
        300,
    )
    assert code == 2, log[-3000:]
    assert "which Ray node(s) " in log and "do not see" in log, log[-3000:]
    assert not (private / "smoke" / "moon" / "seed0" / "rounds.jsonl").exists()


def test_clients_run_on_both_nodes_and_losing_one_stops_the_run_then_resume_ends_it(
    cluster: Cluster, work: Path
) -> None:
    head, worker = cluster.ips
    results = work / "shared"
    out = results / "smoke" / "fedavg" / "seed0"
    args = [*SMOKE, "--method", "fedavg", "--output-dir", str(results),
            "--set", f"num_rounds=8 server.round_timeout=60 {RUN_SET}"]  # fmt: skip
    proc = cluster.launch(*args)
    deadline = time.time() + 300
    while len(rounds(out)) < 3:  # round 0 (the initial evaluation), rounds 1 and 2
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"no round 2 (exit {proc.poll()}):\n{finish(proc, 30)[1][-4000:]}")
        time.sleep(0.5)
    cluster.kill_node(1)
    code, log = finish(proc, 300)
    assert "Ray cluster at" in log and "2 nodes, 2 CPUs" in log, log[-3000:]
    placed = {c["ray_node_ip"] for r in rounds(out)[1:3] for c in r["clients"].values()}
    assert placed == {head, worker}, rounds(out)
    if code == 1:  # the usual case: a later round sent a client to the dead actor
        assert "cause: RayNodeLostError: round" in log and "Ray actor is gone" in log, log[-3000:]
        assert json.loads((out / "summary.json").read_text())["status"] == "failed"
        code, log = finish(cluster.launch(*args, "--resume"), 400)
        assert "1 node, 1 CPUs" in log and "resuming from the checkpoint" in log, log[-3000:]
        resumed = [r for r in rounds(out) if r["round"] > 2 and r.get("clients")]
        assert {c["ray_node_ip"] for r in resumed[-2:] for c in r["clients"].values()} == {head}
    assert code == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 8

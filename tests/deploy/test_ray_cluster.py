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

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PORT = 26379  # the head's GCS port: outside Ray's worker port range (10002-19999)
RUN_SET = "data.train_subset=1500 data.test_subset=500 evaluation.plot=false"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
    reason="needs root, iproute2 (`ip netns`) and unshare to make two hosts on one machine",
)


def run(argv: list[str], timeout: float = 60) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{argv} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@dataclass
class Cluster:
    """The two namespaces, their addresses and the work folder."""

    tag: str
    work: Path
    head_ip: str
    worker_ip: str
    private: Path  # a folder the worker does not see
    ray_tmp: Path  # Ray's folders (h: head, w: worker): short, for Ray's unix sockets

    @property
    def head(self) -> str:
        return f"{self.tag}-h"

    @property
    def worker(self) -> str:
        return f"{self.tag}-w"

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{PORT}"

    def head_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAY_TMPDIR": str(self.ray_tmp / "h"),  # where the driver finds its node
            "RAY_USAGE_STATS_ENABLED": "0",
            "FLWR_HOME": str(self.work / "flwr-home"),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39791",
            "FLWR_LOCAL_CONTROL_API_PORT": "39793",
        }

    def launch(self, *args: str) -> subprocess.Popen[str]:
        """``python -m fl_app.launch --ray-address HEAD ...`` on the head."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.head, sys.executable, "-m", "fl_app.launch",
             "--experiment", "smoke", "--ray-address", self.address, *args],
            cwd=ROOT, env=self.head_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip

    def kill_namespace(self, ns: str) -> None:
        """Power loss: SIGKILL every process in ``ns`` (all of them are this test's)."""
        for pid in run(["ip", "netns", "pids", ns], timeout=10).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def _network(tag: str, subnet: str) -> tuple[str, str]:
    switch = f"{tag}-s"
    run(["ip", "netns", "add", switch])
    run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", switch, "link", "set", "br0", "up"])
    ips = []
    for i, ns in enumerate((f"{tag}-h", f"{tag}-w"), start=1):
        run(["ip", "netns", "add", ns])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
             "netns", switch])  # fmt: skip
        run(["ip", "-n", switch, "link", "set", f"p{i}", "master", "br0", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{subnet}.{i}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        ips.append(f"{subnet}.{i}")
    return ips[0], ips[1]


def _worker_install(work: Path) -> tuple[Path, Path]:
    """A venv of the worker's own: this commit's wheel installed in it, the third-party
    packages read from a folder where the worker's namespace bind-mounts this venv's
    site-packages (a ``.pth`` line). Returns (its python, the mount point)."""
    wheels = work / "wheel"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)], timeout=300)  # fmt: skip
    venv = work / "worker-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", "--without-pip", str(venv)])
    site = next(venv.glob("lib/python3*/site-packages"))
    deps = work / "deps"
    deps.mkdir()
    (site / "deps.pth").write_text(f"{deps}\n")
    run([sys.executable, "-m", "zipfile", "-e", str(next(wheels.glob("*.whl"))), str(site)])
    return venv / "bin" / "python", deps


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("ray-cluster")
    tag = f"rc{os.getpid() % 100000}"
    head_ip, worker_ip = _network(tag, f"10.{80 + os.getpid() % 20}.{os.getpid() % 250}")
    # a socket path must stay under 107 bytes: Ray's folders in /tmp, not under pytest's
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    c = Cluster(tag, work, head_ip, worker_ip, work / "private", ray_tmp)
    c.private.mkdir()
    worker_log = (work / "worker.log").open("wb")
    try:
        python, deps = _worker_install(work)
        run(["ip", "netns", "exec", c.head, str(VENV_BIN / "ray"), "start", "--head",
             "--node-ip-address", head_ip, "--port", str(PORT), "--num-cpus", "1",
             "--include-dashboard", "false", "--disable-usage-stats",
             "--temp-dir", str(ray_tmp / "h")],
            timeout=120)  # fmt: skip
        site = sysconfig.get_paths()["purelib"]
        hide = f"mount -t tmpfs tmpfs {ROOT} && mount -t tmpfs tmpfs {c.private}"
        subprocess.Popen(
            ["ip", "netns", "exec", c.worker, "unshare", "-m", "--propagation", "private",
             "bash", "-c", f"mount --bind {site} {deps} && {hide} && exec {python} -m "
             f"ray.scripts.scripts start --address {c.address} --node-ip-address {worker_ip} "
             f"--num-cpus 1 --disable-usage-stats --temp-dir {ray_tmp / 'w'} --block"],
            env={**os.environ, "RAY_TMPDIR": str(ray_tmp / "w"),
                 "RAY_USAGE_STATS_ENABLED": "0"},
            stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.time() + 120
        while b"Ray runtime started" not in (work / "worker.log").read_bytes():
            assert time.time() < deadline, (work / "worker.log").read_text()
            time.sleep(1)
        yield c
    finally:
        for ns in (c.worker, c.head):
            with contextlib.suppress(subprocess.SubprocessError):
                c.kill_namespace(ns)
        time.sleep(1)
        for ns in (c.worker, c.head, f"{tag}-s"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        worker_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def rounds(out: Path) -> list[dict[str, Any]]:
    path = out / "rounds.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the launcher hung (over {timeout:g} s):\n{out[-4000:]}")
    return proc.returncode, out


def test_moon_needs_its_run_directory_on_every_node(cluster: Cluster) -> None:
    """MOON keeps each client's previous local model in files under the run directory: a
    worker that does not see it would train the client from nothing in its rounds."""
    code, log = finish(
        cluster.launch("--method", "moon", "--output-dir", str(cluster.private), "--set", RUN_SET),
        300,
    )
    assert code == 2, log[-3000:]
    assert "which Ray node(s) " in log and "do not see" in log, log[-3000:]
    assert not (cluster.private / "smoke" / "moon" / "seed0" / "rounds.jsonl").exists()


def test_clients_run_on_both_nodes_and_losing_one_stops_the_run_then_resume_ends_it(
    cluster: Cluster,
) -> None:
    results = cluster.work / "shared"
    out = results / "smoke" / "fedavg" / "seed0"
    args = ["--method", "fedavg", "--output-dir", str(results),
            "--set", f"num_rounds=8 server.round_timeout=60 {RUN_SET}"]  # fmt: skip
    proc = cluster.launch(*args)
    deadline = time.time() + 300
    while len(rounds(out)) < 3:  # round 0 (the initial evaluation), rounds 1 and 2
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"no round 2 (exit {proc.poll()}):\n{finish(proc, 30)[1][-4000:]}")
        time.sleep(0.5)
    cluster.kill_namespace(cluster.worker)
    code, log = finish(proc, 300)
    assert "Ray cluster at" in log and "2 nodes, 2 CPUs" in log, log[-3000:]
    placed = {c["ray_node_ip"] for r in rounds(out)[1:3] for c in r["clients"].values()}
    assert placed == {cluster.head_ip, cluster.worker_ip}, rounds(out)
    if code == 1:  # the usual case: a later round sent a client to the dead actor
        assert "cause: RayNodeLostError: round" in log and "Ray actor is gone" in log, log[-3000:]
        assert json.loads((out / "summary.json").read_text())["status"] == "failed"
        code, log = finish(cluster.launch(*args, "--resume"), 400)
        assert "1 node, 1 CPUs" in log and "resuming from the checkpoint" in log, log[-3000:]
        resumed = [r for r in rounds(out) if r["round"] > 2 and r.get("clients")]
        assert {c["ray_node_ip"] for r in resumed[-2:] for c in r["clients"].values()} == {
            cluster.head_ip
        }
    assert code == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 8

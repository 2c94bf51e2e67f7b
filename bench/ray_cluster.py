"""A Ray cluster of several "machines" on this one: Linux network namespaces on a bridge.

Used by tests/deploy/test_ray_cluster.py and bench/s6_ray_cluster.py (root, iproute2 and
unshare needed). The first node is the head (``ray start --head``; the launcher runs there,
in :meth:`Cluster.launch`), the others workers (``ray start --address=HEAD``). A worker runs
in a mount namespace that hides the checkout (and any folder given as ``hidden``): it
imports the project from its own install (this commit's wheel in a venv of its own, the
third-party packages read from this venv's site-packages, bind-mounted elsewhere), as a
separate machine would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PORT = 26379  # the head's GCS port: outside Ray's worker port range (10002-19999)


def run(argv: list[str], timeout: float = 60) -> str:
    """``argv``'s stdout; AssertionError with its output when it fails."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{argv} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@dataclass
class Cluster:
    """The nodes' namespaces (head first) and addresses, and the work folder."""

    tag: str
    work: Path
    namespaces: list[str]
    ips: list[str]
    ray_tmp: Path  # Ray's folders, one per node: short, for Ray's unix sockets

    @property
    def address(self) -> str:
        return f"{self.ips[0]}:{PORT}"

    def head_env(self) -> dict[str, str]:
        """The launcher's environment on the head: Ray's folder of the head node (where
        the driver finds its node) and a private Flower home on ports of its own."""
        return {
            **os.environ,
            "RAY_TMPDIR": str(self.ray_tmp / "0"),
            "RAY_USAGE_STATS_ENABLED": "0",
            "FLWR_HOME": str(self.work / "flwr-home"),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39791",
            "FLWR_LOCAL_CONTROL_API_PORT": "39793",
        }

    def launch(self, *args: str) -> subprocess.Popen[str]:
        """``python -m fl_app.launch --ray-address HEAD ARGS`` on the head, its output
        (stdout and stderr) on a pipe."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[0], sys.executable, "-m", "fl_app.launch",
             "--ray-address", self.address, *args],
            cwd=ROOT, env=self.head_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip

    def kill_node(self, index: int) -> None:
        """Power loss of node ``index`` (:func:`kill_namespace`)."""
        kill_namespace(self.namespaces[index])


def kill_namespace(ns: str) -> None:
    """SIGKILL every process in the network namespace ``ns`` (all of them are this
    cluster's)."""
    for pid in run(["ip", "netns", "pids", ns], timeout=10).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _network(tag: str, subnet: str, nodes: int) -> tuple[list[str], list[str]]:
    switch = f"{tag}-s"
    run(["ip", "netns", "add", switch])
    run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", switch, "link", "set", "br0", "up"])
    namespaces, ips = [], []
    for i in range(nodes):
        ns, ip = f"{tag}-{i}", f"{subnet}.{i + 1}"
        run(["ip", "netns", "add", ns])
        namespaces.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
             "netns", switch])  # fmt: skip
        run(["ip", "-n", switch, "link", "set", f"p{i}", "master", "br0", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        ips.append(ip)
    return namespaces, ips


def worker_install(work: Path) -> tuple[Path, Path]:
    """A venv of the workers' own: this commit's wheel installed in it, the third-party
    packages read from a folder where a worker's namespace bind-mounts this venv's
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


@contextlib.contextmanager
def namespace_cluster(
    work: Path, cpus: Sequence[int], hidden: Sequence[Path] = ()
) -> Iterator[Cluster]:
    """A running cluster of ``len(cpus)`` nodes with ``cpus[i]`` Ray CPUs each (node 0 the
    head); the workers do not see the checkout nor ``hidden``. Every process is killed and
    the namespaces removed on exit."""
    tag = f"rc{os.getpid() % 100000}"
    subnet = f"10.{80 + os.getpid() % 20}.{os.getpid() % 250}"
    # a unix socket path stays under 107 bytes: Ray's folders in /tmp, not under ``work``
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    namespaces: list[str] = []
    logs = []
    try:
        namespaces, ips = _network(tag, subnet, len(cpus))
        c = Cluster(tag, work, namespaces, ips, ray_tmp)
        run(["ip", "netns", "exec", namespaces[0], str(VENV_BIN / "ray"), "start", "--head",
             "--node-ip-address", ips[0], "--port", str(PORT), "--num-cpus", str(cpus[0]),
             "--include-dashboard", "false", "--disable-usage-stats",
             "--temp-dir", str(ray_tmp / "0")], timeout=120)  # fmt: skip
        if len(cpus) > 1:
            python, deps = worker_install(work)
            site = sysconfig.get_paths()["purelib"]
            hide = " && ".join(f"mount -t tmpfs tmpfs {p}" for p in (ROOT, *hidden))
        for i in range(1, len(cpus)):
            log = work / f"worker-{i}.log"
            logs.append(log.open("wb"))
            subprocess.Popen(
                ["ip", "netns", "exec", namespaces[i], "unshare", "-m", "--propagation",
                 "private", "bash", "-c", f"mount --bind {site} {deps} && {hide} && exec "
                 f"{python} -m ray.scripts.scripts start --address {c.address} "
                 f"--node-ip-address {ips[i]} --num-cpus {cpus[i]} --disable-usage-stats "
                 f"--temp-dir {ray_tmp / str(i)} --block"],
                env={**os.environ, "RAY_TMPDIR": str(ray_tmp / str(i)),
                     "RAY_USAGE_STATS_ENABLED": "0"},
                stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            deadline = time.time() + 120
            while b"Ray runtime started" not in log.read_bytes():
                assert time.time() < deadline, log.read_text()
                time.sleep(1)
        yield c
    finally:
        for ns in reversed(namespaces):
            with contextlib.suppress(AssertionError, subprocess.SubprocessError):
                kill_namespace(ns)
        time.sleep(1)
        for ns in [*namespaces, f"{tag}-s"]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for handle in logs:
            handle.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

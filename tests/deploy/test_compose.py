"""The docker-compose demo on a real Docker engine (docker/demo.sh, docker/docker-compose.yml).

`docker/demo.sh up` builds the image (the base image from the Debian mirror and the wheels of
this machine's pip, each made once per machine and reused) and starts the federation: the
one-shot PKI, the SuperLink with TLS, SuperNode authentication and its database, the node
registration, three SuperNodes and the four SuperExecs, each service a container of the one
image. Then one MOON run of the smoke experiment goes through `flwr run` (deploy/run.sh in the
`cli` service), and while the victim's ClientApp trains in round 2 its SuperNode container's
main process is killed with SIGKILL from the host, a crash as Docker sees one (``docker kill``
would count as a manual stop, which a restart policy does not undo). The test checks that

- round 2 finishes with the other two nodes and records the victim's missing result;
- Docker brings the container back by its restart policy (``restart: unless-stopped``: its
  restart count goes up and it runs again), the SuperExec container that ran on finds it by
  its service name, and the node's result is counted again in a later round, trained against
  its previous local model (MOON state read back from the node's state volume);
- the run ends ``finished:completed`` with every round recorded, and its summary is printed.

Everything is taken down with its volumes at the end (``docker/demo.sh down``), also on
failure; the base image, the app image and the wheelhouse are kept for the next run.
Skipped, with the reason, only where no Docker can run: no docker CLI or compose, or no
engine and not root to start one (as root, docker/demo.sh starts dockerd).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.harness import run_checked, started_at, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "docker" / "demo.sh"
PROJECT = "contrastive-fl-test"
NUM_NODES = 3
VICTIM = 1
ROUNDS = 6  # the victim is killed in round 2; rounds 3-6 leave room for its restart
# A round waits long enough for Flower to declare the killed node unavailable (two missed
# heartbeats of 30 s); a restarted node is refused for ~60 s while the SuperLink still counts
# it online, and Docker restarts it again with growing delays until it is let in.
RUN_SET = (
    "data.train_subset=1500 data.test_subset=500 evaluation.plot=false "
    "server.round_timeout=150 server.wait_for_nodes=300"
)
OUT = "/srv/fl/results/smoke/moon/seed0"


def _why_no_docker() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI (apt-get install docker.io; .ci/run installs it)"
    if shutil.which("docker-compose") is None and (
        subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
    ):
        return "no docker compose (apt-get install docker-compose)"
    engine = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    if not engine and (os.geteuid() != 0 or not Path("/usr/sbin/dockerd").exists()):
        return "no docker engine answers, and not root with /usr/sbin/dockerd to start one"
    return None


_REASON = _why_no_docker()
needs_docker = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


# The test's own compose project, its SuperLink on a free loopback port of the host (not
# 9092), so that a demo that is up beside it is left alone.
ENV = {**os.environ, "FL_COMPOSE_PROJECT": PROJECT, "FL_SUPERLINK_PUBLISH": "127.0.0.1:"}


def demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DEMO), *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def compose_ps(service: str) -> str:
    """The container id of ``service`` in the test's compose project."""
    res = run_checked(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}",
         "--filter", f"label=com.docker.compose.service={service}"],
        timeout=60,
    )  # fmt: skip
    ids = res.stdout.split()
    assert len(ids) == 1, f"{service}: containers {ids}"
    return ids[0]


def inspect(container: str, fmt: str) -> str:
    return run_checked(["docker", "inspect", "-f", fmt, container], timeout=60).stdout.strip()


def logs(service: str, n: int = 30) -> str:
    res = subprocess.run(
        ["docker", "logs", "--tail", str(n), compose_ps(service)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return f"--- {service}\n{res.stdout}{res.stderr}"


def records(server: str) -> list[dict[str, Any]]:
    """rounds.jsonl of the run, read in the ServerApp's container."""
    res = subprocess.run(
        ["docker", "exec", server, "cat", f"{OUT}/rounds.jsonl"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if res.returncode != 0:
        return []
    return [json.loads(x) for x in res.stdout.splitlines() if x.strip()]


def mtime(container: str, path: str) -> float:
    """When ``path`` in ``container`` was last written (the host's clock: one kernel)."""
    res = run_checked(
        ["docker", "exec", container, "python", "-c",
         "import os, sys; print(os.stat(sys.argv[1]).st_mtime)", path],
        timeout=60,
    )  # fmt: skip
    return float(res.stdout)


def clientapps_started_after(container: str, wall_time: float) -> list[int]:
    """Host pids of the container's flwr-clientapp processes that started after ``wall_time``."""
    res = subprocess.run(
        ["docker", "top", container, "-eo", "pid,args"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    pids = []
    for line in res.stdout.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if "flwr-clientapp" in args and (start := started_at(int(pid))) and start > wall_time:
            pids.append(int(pid))
    return pids


def victim_logs() -> str:
    """What a timed-out wait shows: the ServerApp's and the victim SuperNode's logs."""
    return "\n".join(logs(s) for s in ["superexec-serverapp", f"supernode-{VICTIM}"])


@pytest.fixture(scope="module")
def federation() -> Iterator[None]:
    """`docker/demo.sh up`: the image (built or reused) and the federation, running."""
    try:
        res = demo("up", timeout=2400)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        yield
    finally:
        demo("down", timeout=300)


@needs_docker
@pytest.mark.e2e
def test_compose_demo_survives_a_supernode_crash(federation: None) -> None:
    server = compose_ps("superexec-serverapp")
    victim = compose_ps(f"supernode-{VICTIM}")
    victim_exec = compose_ps(f"superexec-clientapp-{VICTIM}")
    assert inspect(victim, "{{.HostConfig.RestartPolicy.Name}}") == "unless-stopped"
    restarts = int(inspect(victim, "{{.RestartCount}}"))

    args = ["--experiment", "smoke", "--method", "moon", "--timeout", "1200",
            "--set", f"num_rounds={ROUNDS} {RUN_SET}"]  # fmt: skip
    cli = subprocess.Popen(
        [str(DEMO), "run", "--", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
    )  # fmt: skip
    try:
        # Round 1 with every node; its record is written once all have replied, so a
        # ClientApp of the victim's SuperExec that starts after it trains in round 2.
        wait_for("round 1", lambda: len(records(server)) >= 2, 600, victim_logs, every=2)
        assert records(server)[1]["num_results"] == NUM_NODES
        round1_end = mtime(server, f"{OUT}/rounds.jsonl")
        wait_for(
            "round 2 training on the victim",
            lambda: bool(clientapps_started_after(victim_exec, round1_end)),
            180,
            victim_logs,
            every=0.2,
        )
        assert len(records(server)) == 2, "round 2 ended before the node could be killed"
        # A crash: SIGKILL to the container's main process (flower-supernode), from the host.
        os.kill(int(inspect(victim, "{{.State.Pid}}")), signal.SIGKILL)

        # Docker restarts it by its policy (not `docker start` from here).
        wait_for(
            "the restart policy to restart the SuperNode",
            lambda: (
                int(inspect(victim, "{{.RestartCount}}")) > restarts
                and inspect(victim, "{{.State.Status}}") == "running"
            ),
            120,
            victim_logs,
            every=1.0,
        )
        # Round 2 finishes with the other two and records the victim's missing result.
        wait_for("round 2", lambda: len(records(server)) >= 3, 300, victim_logs, every=2)
        crash = records(server)[2]
        assert crash["round"] == 2 and VICTIM in crash["participants"]
        assert crash["num_results"] == NUM_NODES - 1
        assert str(VICTIM) not in crash["clients"]
        assert [f["kind"] for f in crash["failures"]] == ["error"], crash["failures"]

        out, _ = cli.communicate(timeout=1500)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 0, out[-5000:]
    assert "finished:completed" in out, out[-5000:]
    assert '"status": "completed"' in out, out[-3000:]  # the summary, printed by run.sh

    rounds = records(server)
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    rejoined = [r for r in rounds[3:] if str(VICTIM) in r.get("clients", {})]
    assert rejoined, [(r["round"], r["participants"]) for r in rounds]
    # trained against its previous local model, read back from its state volume
    assert rejoined[0]["clients"][str(VICTIM)]["moon_negatives"] == 1.0

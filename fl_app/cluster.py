"""The simulation on an existing Ray cluster: what the launcher checks before Flower starts.

Flower's Ray backend calls ``ray.init()`` without an address, so Ray's own ``RAY_ADDRESS``
decides where the simulated clients run: set in the environment of the local SuperLink, it
puts every ClientApp actor on the cluster the user already runs (``ray start --head`` on one
machine, ``ray start --address=HEAD:PORT`` on the others). The launcher process and Flower's
driver run on a node of that cluster (usually the head).

Nothing of the app travels with the run: Flower's actors unpickle the ClientApp by module
name, so every node imports ``fl_app``, ``clients``, ``strategies`` and ``core`` from its own
install (the same commit, ``make install`` on each machine, Ray started from that
environment). Before Flower starts, :func:`probe_cluster` runs one small task on every alive
node (:func:`node_facts`: versions, a digest of the project's code, whether the node can read
the dataset and see the run directory), and :func:`cluster_problem` turns what came back into
the one sentence that says what is wrong, or None.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The project's packages: what every node must import from an install of the same commit.
PACKAGES = ("core", "clients", "strategies", "fl_app")
#: What must be equal on the launcher's machine and on every node.
VERSIONS = ("python", "ray", "torch", "flwr", "code")
_CHILD = "import sys; from fl_app.cluster import main; sys.exit(main())"
PROBE_TIMEOUT_S = 120.0  # connect, start a worker on every node (imports torch), answer


class ClusterError(Exception):
    """The cluster could not be probed (unreachable, refused, a node that did not answer);
    the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One alive node of the cluster and what its probe task reported."""

    ip: str
    cpus: float
    gpus: float
    facts: dict[str, Any]


def code_digest() -> str:
    """SHA-256 (first 16 hex digits) over the project's modules as this interpreter imports
    them: every ``*.py`` file of :data:`PACKAGES`, by its path relative to the package's
    parent and its bytes. Equal digests: the same code, from a checkout or an installed
    wheel alike."""
    h = hashlib.sha256()
    for name in PACKAGES:
        module = __import__(name)
        base = Path(module.__file__ or "").resolve().parent
        for path in sorted(base.rglob("*.py")):
            h.update(str(path.relative_to(base.parent)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def node_facts(data_cfg: dict[str, Any], token: str | None) -> dict[str, Any]:
    """What one node reports (run there as a Ray task, and on the launcher's machine for
    comparison): its host name, the :data:`VERSIONS`, the dataset problem it sees (None: it
    can read ``data_cfg``'s dataset, :func:`core.datafiles.dataset_problem` from the task's
    working directory) and whether the file ``token`` exists there (a folder shared by every
    node)."""
    import flwr
    import ray
    import torch

    from core.datafiles import dataset_problem

    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "code": code_digest(),
        "data_problem": dataset_problem(data_cfg),
        "sees_token": bool(token) and Path(str(token)).is_file(),
    }


def cluster_problem(
    nodes: Sequence[Node],
    here: dict[str, Any],
    cpus_per_client: int,
    gpus_per_client: float,
    shared_dir: Path | None,
) -> str | None:
    """What stops a simulation on this cluster, in one sentence (None: nothing), from the
    probe's ``nodes`` and the launcher machine's own :func:`node_facts` (``here``):

    - a node whose Python, Ray, torch, Flower or project code differs from ``here`` (its
      actors would run other code, or fail to unpickle the ClientApp);
    - no node with ``cpus_per_client`` CPUs, or with the GPU share asked (Ray would never
      schedule a client: the run would wait for ever);
    - a node that can host a client but cannot read the dataset;
    - with ``shared_dir`` (the method keeps client state in files there), a node that can host
      a client but does not see that folder: a client trained there in one round and
      elsewhere in the next would start from nothing.
    """
    if not nodes:
        return "the Ray cluster has no alive node"
    for node in nodes:
        differs = [k for k in VERSIONS if node.facts.get(k) != here.get(k)]
        if differs:
            what = ", ".join(f"{k} {node.facts.get(k)} (here {here.get(k)})" for k in differs)
            return (
                f"Ray node {node.ip} ({node.facts.get('host')}) differs from this machine in "
                f"{what}: install the same commit on every node (make install) and start "
                "Ray there from that environment (.venv/bin/ray start --address=...)"
            )
    # a share of one GPU (0 < g <= 1) needs a node with a GPU, g > 1 whole GPUs: gpus >= g
    hosts = [n for n in nodes if n.cpus >= cpus_per_client and n.gpus >= gpus_per_client]
    if not hosts:
        most = max(nodes, key=lambda n: (n.cpus, n.gpus))
        return (
            f"no Ray node has {cpus_per_client} CPU(s) and {gpus_per_client} GPU(s) for a "
            f"client (the largest, {most.ip}, has {most.cpus:g} CPUs and {most.gpus:g} GPUs): "
            "lower --cpus-per-client/--gpus-per-client or add a larger node"
        )
    for node in hosts:
        if problem := node.facts.get("data_problem"):
            return f"Ray node {node.ip} ({node.facts.get('host')}) cannot read the data: {problem}"
    if shared_dir is not None:
        blind = [n.ip for n in hosts if not n.facts.get("sees_token")]
        if blind:
            return (
                f"this method keeps each client's state in files under {shared_dir}, which "
                f"Ray node(s) {', '.join(blind)} do not see: on a cluster that folder must be "
                "shared by every node at the same path (put --output-dir on a shared "
                "filesystem), or run the method on one machine"
            )
    return None


def probe(address: str, data_cfg: dict[str, Any], token: str | None) -> list[Node]:
    """Connect to the cluster at ``address`` and run :func:`node_facts` on every alive node
    (pinned to it, asking for no resources, with the ``PYTHONPATH`` Flower gives its actors);
    raises ClusterError naming the nodes that did not answer."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(
        address=address,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}},
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(num_cpus=0, max_retries=0)(node_facts)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(data_cfg, token)
            for n in alive
        ]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S * 0.75)
        answered = set(ready)
        silent = [
            n["NodeManagerAddress"] for n, r in zip(alive, refs, strict=True) if r not in answered
        ]
        if silent:
            raise ClusterError(
                f"Ray node(s) {', '.join(silent)} did not run the probe task in time: is the "
                "project installed there, and Ray started from that environment?"
            )
        nodes = []
        for n, ref in zip(alive, refs, strict=True):
            try:
                facts = ray.get(ref)
            except Exception as err:  # the node's own error, reported as such
                raise ClusterError(
                    f"the probe task failed on Ray node {n['NodeManagerAddress']}: "
                    f"{str(err).strip().splitlines()[-1]} (is the project installed there, "
                    "and Ray started from that environment?)"
                ) from None
            res = n.get("Resources", {})
            nodes.append(
                Node(n["NodeManagerAddress"], res.get("CPU", 0.0), res.get("GPU", 0.0), facts)
            )
        return nodes
    finally:
        ray.shutdown()


def address_problem(address: str, timeout: float = 5.0) -> str | None:
    """What is wrong with a Ray cluster address (None: nothing): it must read ``HOST:PORT``
    (the head's GCS port, ``ray start --head --port``), and something must accept a TCP
    connection there within ``timeout`` seconds (Ray itself retries an address where
    nothing listens for minutes). Ray's ``auto`` (the cluster this machine's node belongs
    to) is left to Ray."""
    if address == "auto":
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return (
            f"Ray address {address!r}: use HOST:PORT, the head's address and the --port "
            "of its `ray start --head` (Ray's default 6379)"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as err:
        return (
            f"nothing answers at the Ray address {address} ({err.strerror or err}): start "
            f"the head there (ray start --head --port={port}) or correct the address"
        )


def probe_cluster(
    address: str, data_cfg: dict[str, Any], token: Path | None, timeout: float = PROBE_TIMEOUT_S
) -> list[Node]:
    """:func:`probe` in a child process (``python -m fl_app.cluster``), so that the
    launcher never holds a Ray connection and a cluster that does not answer costs
    ``timeout`` seconds at most; raises ClusterError for an address that is malformed or
    where nothing listens (:func:`address_problem`), and with Ray's reason otherwise."""
    if problem := address_problem(address):
        raise ClusterError(problem)
    request = json.dumps({"data": data_cfg, "token": str(token) if token else None})
    try:
        res = subprocess.run(
            # imported, not run as __main__: Ray then ships node_facts by name, as Flower ships
            # the ClientApp, so a node without the project fails here and not in round 1
            [sys.executable, "-c", _CHILD, address],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"no answer from the Ray cluster at {address} within {timeout:g} s: is "
            "`ray start --head` running there, and is this machine one of its nodes?"
        ) from None
    if res.returncode != 0:
        lines = [x for x in (res.stdout + res.stderr).strip().splitlines() if x.strip()]
        raise ClusterError(
            f"cannot use the Ray cluster at {address}: {lines[-1] if lines else 'no output'}"
        )
    return [Node(**n) for n in json.loads(res.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    """The probe's child process (see :func:`probe_cluster`): ``ADDRESS`` on the command
    line and ``{"data": ..., "token": ...}`` on stdin; prints the alive nodes and their
    facts as one JSON line (exit 0), or the reason on the last line of stderr (exit 1)."""
    p = argparse.ArgumentParser(description="Probe a Ray cluster for the launcher.")
    p.add_argument("address")
    args = p.parse_args(argv)
    request = json.loads(sys.stdin.read())
    try:
        nodes = probe(args.address, request["data"], request["token"])
    except ClusterError as err:
        print(err, file=sys.stderr)
        return 1
    except Exception as err:  # Ray's reason (unreachable, version mismatch)
        print(f"{type(err).__name__}: {err}".replace("\n", " "), file=sys.stderr)
        return 1
    print(json.dumps([dataclasses.asdict(n) for n in nodes]))
    return 0

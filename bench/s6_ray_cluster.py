"""S6 — the simulation on a Ray cluster: rounds per second on one node and on two (the same
CPUs in all), and what joining a cluster adds to the start-up.

    sudo .venv/bin/python bench/s6_ray_cluster.py [--rounds 8] [--name s6_ray_cluster]

One FedAvg run (experiment smoke: 3 clients of 1,500 training samples in all, 3 local epochs,
one Ray CPU per client) in three set-ups: a local Ray with 2 CPUs (what ``make run`` starts), a
one-node cluster with 2 CPUs, and two nodes with one CPU each (bench/ray_cluster.py: network
namespaces on this machine, the worker with its own install of the project). Reported per
set-up: the launcher's wall time; the cluster probe (:mod:`fl_app.cluster`, from the
launcher's "checking" line to its answer); the start-up (the wall time less the rounds'
``round_seconds``: Flower's and Ray's start, the ServerApp's set-up, the probe, the final
summary); and the median ``round_seconds`` over rounds 2..R with its rounds per second.
Needs root, iproute2 and unshare. Writes bench/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray_cluster import ROOT, namespace_cluster

from fl_app.results import ROUND_LOG, read_rounds

RUN_SET = "data.train_subset=1500 data.test_subset=500 evaluation.plot=false"


def timed_run(start: Callable[[], subprocess.Popen[str]], out: Path) -> dict[str, Any]:
    """Run a launcher to its end, timing its output's lines; the figures of its run."""
    t0 = time.perf_counter()
    proc = start()
    assert proc.stdout is not None
    probe: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("checking the Ray cluster"):
            probe["start"] = time.perf_counter()
        elif line.startswith("Ray cluster at"):
            probe["end"] = time.perf_counter()
    wall = time.perf_counter() - t0
    if proc.wait() != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}):\n{''.join(lines[-40:])}")
    records = read_rounds(out / ROUND_LOG)
    rounds = {r["round"]: r["round_seconds"] for r in records if r["round"] >= 1}
    steady = statistics.median(v for k, v in rounds.items() if k >= 2)
    nodes = {c.get("ray_node_ip") for r in records for c in r.get("clients", {}).values()}
    return {
        "wall_s": round(wall, 2),
        "probe_s": round(probe["end"] - probe["start"], 2) if len(probe) == 2 else None,
        "startup_s": round(wall - sum(rounds.values()), 2),
        "round_s_median": round(steady, 3),
        "rounds_per_s": round(1 / steady, 3),
        "nodes_used": len(nodes),
    }


def markdown(report: dict[str, Any]) -> str:
    """The table of a measurement (the JSON this script writes), with its command."""
    rows = [
        f"| {k} | {v['nodes_used']} | {v['wall_s']} | {v['probe_s'] or '-'} | {v['startup_s']} | "
        f"{v['round_s_median']} | {v['rounds_per_s']} |"
        for k, v in report["setups"].items()
    ]
    return (
        f"`{report['command']}` (load average at the end {report['load_average_at_end']})\n\n"
        "| set-up | nodes used | wall s | probe s | start-up s | round s (median, 2..R) | "
        "rounds/s |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--name", default="s6_ray_cluster")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/s6_ray_cluster.py needs root (network namespaces)", file=sys.stderr)
        return 2
    run_args = ["--experiment", "smoke", "--method", "fedavg", "--fresh",
                "--set", f"num_rounds={args.rounds} {RUN_SET}"]  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="s6-") as tmp:
        work = Path(tmp)
        env = {
            **os.environ,
            "FLWR_HOME": str(work / "flwr-local"),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39891",
            "FLWR_LOCAL_CONTROL_API_PORT": "39893",
            "RAY_TMPDIR": str(work / "ray-local"),  # its own local Ray, never another's
        }
        local = work / "local"
        results["local Ray, 2 CPUs"] = timed_run(
            lambda: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fl_app.launch",
                    *run_args,
                    "--ray-address",
                    "local",
                    "--num-cpus",
                    "2",
                    "--output-dir",
                    str(local),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            local / "smoke" / "fedavg" / "seed0",
        )
        subprocess.run(  # its SuperLink and Ray: not beside the clusters' runs
            [sys.executable, "-c", "from fl_app.launch import stop_superlink_and_runs as s, "
             "flwr_env as e; s(e())"], cwd=ROOT, env=env, check=False, timeout=120,
        )  # fmt: skip
        for name, cpus in (("one node, 2 CPUs", [2]), ("two nodes, 1 + 1 CPUs", [1, 1])):
            d = work / name.split(",")[0].replace(" ", "-")
            d.mkdir()
            with namespace_cluster(d, cpus) as c:
                launch = functools.partial(c.launch, *run_args, "--output-dir", str(d / "out"))
                results[name] = timed_run(launch, d / "out" / "smoke" / "fedavg" / "seed0")
            print(name, results[name], flush=True)
    load = os.getloadavg()
    report = {
        "command": f"sudo .venv/bin/python bench/s6_ray_cluster.py --rounds {args.rounds}",
        "rounds": args.rounds,
        "load_average_at_end": [round(x, 2) for x in load],
        "setups": results,
    }
    dest = ROOT / "bench" / "results"
    (dest / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (dest / f"{args.name}.md").write_text(markdown(report))
    print((dest / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Deployment: the docker-compose demo, checked statically and run for real.

Static checks (any user): the compose file is valid, every Flower command in it is accepted
by Flower 1.41's own argument parsers and has TLS and SuperNode authentication on, and the
shell scripts are strict and parse (and pass shellcheck when it is installed).

Live checks (root with iproute2; no container engine needed): every compose service runs
as a real process on its own "host" (a Linux network namespace with its own address, see
harness.py): the one-shot PKI service makes the CA, the SuperLink certificate and node keys
(docker/make_certs.sh, docker/make_node_keys.sh), the SuperLink runs with TLS, SuperNode
authentication and a database, the node keys are registered, three SuperNodes (each with
its partition and its own SuperExec) join, and the `cli` service launches runs with
deploy/run.sh. Then:

- FedAvg (experiment smoke, 2 rounds) completes with all three nodes in every round;
- MOON (6 rounds): one SuperNode's container is killed while its ClientApp trains in round
  2; that round finishes with the other two and records the missing result as an error;
  the SuperNode alone is restarted (as a restart policy would) with the same partition, key
  and state folder but a new address behind its name (which did not resolve while it was
  down), its SuperExec, which ran on, finds it again, the node takes part in a
  later round, and its MOON state (previous local model) persisted on disk across the crash;
- a SuperNode with an unregistered key, and one without TLS, cannot join.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.harness import ComposeHosts, interpolate, wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "docker-compose.yml"
VENV_BIN = Path(sys.executable).parent
SCRIPTS = sorted([*(ROOT / "docker").glob("*.sh"), *(ROOT / "deploy").glob("*.sh")])
LIBS = sorted((ROOT / "deploy" / "lib").glob("*.sh"))

# Flower 1.41's own argument parsers of the three executables the compose file runs.
PARSERS = {
    "flower-superlink": ("flwr.superlink.cli.flower_superlink", "_parse_args_run_superlink"),
    "flower-supernode": ("flwr.supernode.cli.flower_supernode", "_parse_args_run_supernode"),
    "flower-superexec": ("flwr.supercore.cli.flower_superexec", "_parse_args"),
}
NUM_NODES = 3
VICTIM = 1  # partition whose SuperNode host is killed in the MOON run
MOON_ROUNDS = 6  # the victim is killed in round 2 and may rejoin in rounds 4-6
# Small runs: a Fashion-MNIST subset, no plots; a round waits long enough for Flower to
# declare a killed node unavailable (2 missed heartbeats of 30 s) and reply with an error.
RUN_SET = (
    "data.train_subset=1500 data.test_subset=500 evaluation.plot=false "
    "server.round_timeout=150 server.wait_for_nodes=120"
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 (`ip netns`) to build one network namespace per host",
)


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def parse_flower(argv: list[str]) -> Any:
    """Flower's own parse of a compose command, its ``${VAR:-default}`` at their defaults."""
    module, func = PARSERS[argv[0]]
    parser = getattr(importlib.import_module(module), func)()
    return parser.parse_args([interpolate(str(a), {}) for a in argv[1:]])


def node_config(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split())


# ----------------------------------------------------------------------------- static checks
def test_compose_file_is_valid() -> None:
    svc = services()
    names = set(svc)
    assert {"pki", "superlink", "superexec-serverapp", "register-nodes", "cli"} <= names
    for i in range(NUM_NODES):
        assert {f"supernode-{i}", f"superexec-clientapp-{i}"} <= names
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed: YAML structure checked only")
    res = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


def test_flower_commands_parse_and_are_secure() -> None:
    svc = services()
    parsed = {n: parse_flower(s["command"]) for n, s in svc.items() if "command" in s and
              str(s["command"][0]).startswith("flower-")}  # fmt: skip
    link = parsed["superlink"]
    assert not link.insecure and link.enable_supernode_auth
    assert link.ssl_certfile and link.ssl_keyfile and link.ssl_ca_certfile
    assert link.isolation == "process" and link.database.startswith("/srv/fl/")
    assert link.runtime_dependency_install is False
    assert link.superexec_auth_secret_file
    # A SuperExec dials its SuperLink/SuperNode by service name from its own container: in
    # network_mode service:X it would keep X's namespace when X is restarted, and be cut off
    exec_link = parsed["superexec-serverapp"]
    assert not exec_link.insecure and exec_link.root_certificates
    assert exec_link.runtime_api_address == f"superlink:{link.port}"
    assert not any("network_mode" in svc[n] for n in svc if n.startswith("superexec-"))
    partitions = []
    for i in range(NUM_NODES):
        node = parsed[f"supernode-{i}"]
        assert not node.insecure and node.root_certificates and node.auth_supernode_private_key
        assert node.superlink == f"superlink:{link.port}" and node.isolation == "process"
        cfg = node_config(node.node_config)
        assert cfg["num-partitions"] == str(NUM_NODES) and cfg["state-dir"].startswith("'/")
        partitions.append(int(cfg["partition-id"]))
        executor = parsed[f"superexec-clientapp-{i}"]
        assert (
            node.host == "0.0.0.0" and executor.runtime_api_address == f"supernode-{i}:{node.port}"
        )
        assert executor.superexec_auth_secret_file == node.superexec_auth_secret_file
    assert sorted(partitions) == list(range(NUM_NODES))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scripts_are_strict_and_parse(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert os.access(script, os.X_OK), f"{script} is not executable"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    if shutil.which("shellcheck"):
        res = subprocess.run(
            ["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, res.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scripts_print_their_usage_with_help(script: Path) -> None:
    """docs/deployment.md: every script prints its usage with ``--help`` (its header
    comment), and does nothing else."""
    res = subprocess.run(
        ["bash", str(script), "--help"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    header = script.read_text().splitlines()[1].lstrip("# ").strip()
    assert res.returncode == 0 and res.stdout.startswith(header), res.stdout + res.stderr


@pytest.mark.parametrize(("ending", "code"), [("sigterm", 143), ("sigint", 130), ("error", 1)])
def test_process_lib_stops_its_children_however_the_script_ends(
    tmp_path: Path, ending: str, code: int
) -> None:
    """deploy/lib/processes.sh, sourced by the scripts that start Flower processes: every
    PID in ``pids`` is killed and reaped when the script is stopped (``docker stop``,
    Ctrl-C) or fails under ``set -e``, and the script's exit code says which. The signal is
    sent as soon as the PIDs are printed, so it may land before ``wait_any`` starts waiting:
    a plain ``wait`` lost it there about once in 200 runs (CI of 13374fb)."""
    script = tmp_path / "starter.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f'source "{ROOT}/deploy/lib/processes.sh"\n'
        'sleep 300 & pids+=("$!")\nsleep 300 & pids+=("$!")\n'
        'echo "${pids[*]}"\n' + ("read -r _\nfalse\n" if ending == "error" else "wait_any\n")
    )
    proc = subprocess.Popen(
        ["bash", str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # bash cannot trap a signal ignored at its start (pytest run as a background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdin is not None
    children = [int(p) for p in proc.stdout.readline().split()]
    try:
        assert len(children) == 2 and all(Path(f"/proc/{p}").exists() for p in children)
        if ending == "error":
            proc.stdin.write("\n")
            proc.stdin.flush()
        else:
            proc.send_signal({"sigterm": signal.SIGTERM, "sigint": signal.SIGINT}[ending])
        assert proc.wait(timeout=30) == code
        alive = [p for p in children if Path(f"/proc/{p}").exists()]
        assert not alive, f"children {alive} outlived the script"
    finally:  # leave nothing behind when the check fails
        for pid in [*children, proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_wait_any_returns_the_exit_code_of_the_first_process_to_end(tmp_path: Path) -> None:
    """``wait_any`` (deploy/lib/processes.sh) ends when the first process in ``pids`` ends and
    returns its exit code, as ``wait -n`` would; the others are stopped on exit."""
    script = tmp_path / "first.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f'source "{ROOT}/deploy/lib/processes.sh"\n'
        'sleep 300 & pids+=("$!")\n(sleep 1.5; exit 3) & pids+=("$!")\n'
        'echo "${pids[0]}"\nset +e\nwait_any\ncode=$?\nset -e\necho "code $code"\nexit 7\n'
    )
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    first, said = res.stdout.split("\n")[:2]
    assert (res.returncode, said) == (7, "code 3"), res.stdout + res.stderr
    assert not Path(f"/proc/{first}").exists(), "the long-running process outlived the script"


# ----------------------------------------------------------------------------- live federation
@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeHosts]:
    """`docker compose up`: every service on its own network-namespace host."""
    hosts = ComposeHosts(COMPOSE, tmp_path_factory.mktemp("deploy"), ROOT, VENV_BIN)
    try:
        hosts.create_network()
        hosts.up("superexec-serverapp", timeout=120)
        for i in range(NUM_NODES):
            hosts.up(f"superexec-clientapp-{i}", timeout=120)
        yield hosts
    finally:
        hosts.close()


def run_command(method: str, rounds: int, timeout: int) -> list[str]:
    """deploy/run.sh inside the `cli` service, results to the results volume."""
    return [
        "/app/deploy/run.sh",
        "--connection", "fl",
        "--experiment", "smoke",
        "--method", method,
        "--set", f"num_rounds={rounds} {RUN_SET}",
        "--output-dir", "/srv/fl/results",
        "--timeout", str(timeout),
    ]  # fmt: skip


def run_dir(hosts: ComposeHosts, method: str) -> Path:
    return hosts.host_path("superexec-serverapp", "/srv/fl/results") / "smoke" / method / "seed0"


def records(out: Path) -> list[dict[str, Any]]:
    path = out / "rounds.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_status(hosts: ComposeHosts, log: str) -> str:
    """The run's final status as the SuperLink reports it (`flwr run` exits 0 regardless)."""
    m = re.search(r"FL_RUN_ID=(\d+)", log)
    assert m, log[-3000:]
    res = hosts.run("cli", ["flwr", "list", "--run-id", m.group(1), "fl", "--format", "json"])
    payload = res.stdout[res.stdout.index("{") :]
    return str(json.loads(payload)["runs"][0]["status"])


@needs_root
@pytest.mark.e2e
def test_fedavg_run_on_separate_hosts(federation: ComposeHosts) -> None:
    res = federation.run("cli", run_command("fedavg", rounds=2, timeout=240), timeout=300)
    assert res.returncode == 0, res.stdout[-5000:]
    assert run_status(federation, res.stdout) == "finished:completed"
    out = run_dir(federation, "fedavg")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert summary["final_accuracy"] > 0.2  # 10 classes: chance is 0.1
    rounds = records(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert r["participants"] == list(range(NUM_NODES))
        assert r["num_results"] == NUM_NODES and r["failures"] == []


@needs_root
@pytest.mark.e2e
def test_moon_survives_a_supernode_crash_and_restart(federation: ComposeHosts) -> None:
    hosts = federation
    out = run_dir(hosts, "moon")
    state_root = hosts.host_path(f"supernode-{VICTIM}", "/srv/fl/state")
    # Round 3 starts without the victim (a round samples the nodes connected at its start)
    # and lasts seconds; rounds 4-6 give the restarted node room to come back on any machine.
    cli = hosts.start("cli", run_command("moon", rounds=MOON_ROUNDS, timeout=480), key="cli-moon")

    def state_files() -> list[Path]:
        # one file per saved version (round r, session s), at most two kept
        return sorted(state_root.glob(f"*/client_{VICTIM}/moon_prev/r*s*.pt"))

    # Round 1 completes with every node; the victim's MOON state is on its disk.
    wait_for("round 1", lambda: len(records(out)) >= 2, 240, hosts.tails)
    assert records(out)[1]["num_results"] == NUM_NODES
    assert len(state_files()) == 1
    # Round 1's record is written once every node has replied, so a ClientApp that started
    # after it trains in round 2 (or later). A set of the ClientApps seen when the record
    # is noticed would not do: on a fast machine round 2's has often started by then.
    round1_end = (out / "rounds.jsonl").stat().st_mtime
    assert len(records(out)) == 2, "round 2 ended before its start could be told apart"

    def training_on_victim() -> bool:  # its SuperExec's ClientApp, in that container
        procs = hosts.ns_processes_started_after(f"superexec-clientapp-{VICTIM}", round1_end)
        return any("flwr-clientapp" in cmd for cmd in procs.values())

    # Kill the victim's SuperNode container while its ClientApp trains in round 2; its
    # SuperExec container runs on, as when Docker restarts only the SuperNode.
    wait_for("round 2 training on the victim", training_on_victim, 120, hosts.tails, every=0.1)
    old_address = hosts.ip_of[f"supernode-{VICTIM}"]
    hosts.take_down(f"supernode-{VICTIM}")  # its name stops resolving, as in Docker
    assert f"superexec-clientapp-{VICTIM}" in hosts.procs
    assert len(records(out)) == 2, "round 2 ended before the node could be killed"

    # Round 2 finishes with the others and reports the missing result.
    wait_for("round 2", lambda: len(records(out)) >= 3, 240, hosts.tails)
    crash = records(out)[2]
    assert crash["round"] == 2 and VICTIM in crash["participants"]
    assert crash["num_results"] == NUM_NODES - 1
    assert str(VICTIM) not in crash["clients"]
    assert [f["kind"] for f in crash["failures"]] == ["error"], crash["failures"]

    # Restart the SuperNode container alone (a restart policy): same partition, key (hence
    # node id) and state volume, but a new namespace and address behind its name. The
    # SuperExec that ran on must find it again and run its ClientApps, or the node never
    # trains again.
    restarted = time.time()
    hosts.restart_container(f"supernode-{VICTIM}")
    assert hosts.ip_of[f"supernode-{VICTIM}"] != old_address
    cli.popen.wait(timeout=480)
    log = cli.log.read_text(errors="replace")
    assert cli.popen.returncode == 0, log[-5000:]
    assert run_status(hosts, log) == "finished:completed"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == MOON_ROUNDS
    rejoined = [r for r in records(out)[3:] if str(VICTIM) in r.get("clients", {})]
    assert rejoined, [r["participants"] for r in records(out)]
    # Its first round back trained against its previous local model, read from disk.
    assert rejoined[0]["clients"][str(VICTIM)]["moon_negatives"] == 1.0
    files = state_files()
    assert 1 <= len(files) <= 2, files
    assert max(f.stat().st_mtime for f in files) > restarted


@needs_root
@pytest.mark.e2e
@pytest.mark.parametrize("variant", ["unregistered-key", "no-tls"])
def test_unknown_supernode_cannot_join(federation: ComposeHosts, variant: str) -> None:
    """A SuperNode like supernode-0, on a new host, with a key the SuperLink does not know
    (or without TLS), is refused."""
    hosts = federation
    name = f"intruder-{variant}"
    spec = copy.deepcopy(hosts.services["supernode-0"])
    spec["volumes"] = [f"{name}-pki:/srv/fl/pki/node:ro", f"{name}-state:/srv/fl/state"]
    spec.pop("depends_on", None)
    hosts.services[name] = spec
    keys = hosts.host_path(name, "/srv/fl/pki/node")
    subprocess.run(
        [str(ROOT / "docker" / "make_node_keys.sh"), "--out", str(keys), "node-0"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    shutil.copy(hosts.host_path("supernode-0", "/srv/fl/pki/node/ca.crt"), keys / "ca.crt")
    (keys / "superexec.secret").write_text("x" * 64)
    cmd = [str(a) for a in spec["command"]] + ["--max-retries", "3"]
    if variant == "no-tls":
        i = cmd.index("--root-certificates")
        del cmd[i : i + 2]
        i = cmd.index("--auth-supernode-private-key")
        del cmd[i : i + 2]
        cmd.append("--insecure")
    hosts.add_host(name)
    hosts.write_hosts_files()
    res = hosts.run(name, cmd, timeout=90)
    assert res.returncode != 0, res.stdout[-3000:]
    assert "Exit Code: 305" in res.stdout, res.stdout[-3000:]


@pytest.mark.parametrize("lib", LIBS, ids=lambda p: p.name)
def test_deploy_libs_parse(lib: Path) -> None:
    """The shared libraries the scripts source (not scripts themselves): processes.sh
    (stopping started processes) and args.sh (checking the command line)."""
    res = subprocess.run(["bash", "-n", str(lib)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    if shutil.which("shellcheck"):
        res = subprocess.run(
            ["shellcheck", "-S", "warning", "-s", "bash", str(lib)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout


def _supernode(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """deploy/start_supernode.sh --insecure with stand-ins for flower-supernode and
    flower-superexec on PATH that record their arguments and exit; started through a
    symlink, as from a bin folder. Returns the result and the recorded arguments."""
    bindir, record = tmp_path / "bin", tmp_path / "argv.txt"
    bindir.mkdir()
    # the node records and stays up; the executor records once the node has, and exits
    stubs = {
        "flower-supernode": f'echo "flower-supernode $*" >> "{record}"\nexec sleep 30',
        "flower-superexec": f'until grep -qs flower-supernode "{record}"; do sleep 0.05; done\n'
        f'echo "flower-superexec $*" >> "{record}"',
    }
    for exe, body in stubs.items():
        (bindir / exe).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bindir / exe).chmod(0o755)
    (bindir / "start_supernode").symlink_to(ROOT / "deploy" / "start_supernode.sh")
    base = ["--insecure", "--superlink", "127.0.0.1:1", "--partition-id", "0"]
    base += ["--num-partitions", "2", "--state-dir", str(tmp_path / "state")]
    res = subprocess.run(
        [str(bindir / "start_supernode"), *base, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    )
    return res, record.read_text() if record.exists() else ""


@pytest.mark.parametrize(
    ("args", "node_config"),
    [
        ((), "partition-id=0 num-partitions=2 state-dir='{state}'"),
        (
            ("--device", "cuda:1"),
            "partition-id=0 num-partitions=2 state-dir='{state}' device='cuda:1'",
        ),
        (("--device", "auto"), "partition-id=0 num-partitions=2 state-dir='{state}' device='auto'"),
    ],
)
def test_start_supernode_sets_the_device_only_when_asked(
    tmp_path: Path, args: tuple[str, ...], node_config: str
) -> None:
    """Without ``--device`` the node config has no device, so the run's ``client.device``
    (default auto: the GPU when there is one) decides; with it, the node's choice wins."""
    res, argv = _supernode(tmp_path, *args)
    assert res.returncode == 0, res.stderr
    want = node_config.format(state=(tmp_path / "state").resolve())
    assert f"--node-config {want}\n" in argv, argv
    assert "flower-superexec --insecure --runtime-api-address 127.0.0.1:9094" in argv


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU"])
def test_start_supernode_refuses_a_bad_device_before_starting_anything(
    tmp_path: Path, device: str
) -> None:
    res, argv = _supernode(tmp_path, "--device", device)
    assert res.returncode == 2 and argv == ""
    assert "--device must be auto, cpu, cuda or cuda:K" in res.stderr


# ----------------------------------------------------------------------------- argument checks
# The deploy scripts check every argument before they create a file or start a process, and
# stop with exit code 2 and a message naming the option (deploy/lib/args.sh).
PARSING_SCRIPTS = ["start_superlink.sh", "start_supernode.sh", "add_connection.sh",
                   "local_demo.sh", "run.sh"]  # fmt: skip
# programs a script must not reach with bad arguments: stand-ins record the call and fail
STANDINS = ("flower-superlink", "flower-supernode", "flower-superexec", "flwr", "openssl")


def value_options(script: str) -> list[str]:
    """The options of ``deploy/<script>`` that take a value (``--x) ...; shift 2 ;;``)."""
    text = (ROOT / "deploy" / script).read_text()
    return re.findall(r"^\s+(--[\w-]+)\)[^\n]*shift 2 ;;", text, re.M)


def _deploy(
    tmp_path: Path, script: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``deploy/<script> ARGS`` with HOME and FLWR_HOME under ``tmp_path`` and recording
    stand-ins for the programs of STANDINS first on PATH (then the project's virtualenv, for
    the config check's python3). Returns the result and the recorded calls."""
    bindir, record = tmp_path / "bin", tmp_path / "calls.txt"
    bindir.mkdir(exist_ok=True)
    for exe in STANDINS:
        (bindir / exe).write_text(f'#!/usr/bin/env bash\necho "{exe} $*" >> "{record}"\nexit 1\n')
        (bindir / exe).chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bindir), str(VENV_BIN), os.environ["PATH"]]),
        "HOME": str(tmp_path / "home"),
        "FLWR_HOME": str(tmp_path / "flwr-home"),
    }
    env.pop("FL_CONNECTION", None)
    env.pop("FL_OUTPUT_DIR", None)
    res = subprocess.run(
        ["bash", str(ROOT / "deploy" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    return res, record.read_text() if record.exists() else ""


def created(tmp_path: Path, before: set[Path]) -> list[str]:
    """What appeared under ``tmp_path`` besides the stand-ins and paths in ``before``."""
    bindir = tmp_path / "bin"
    return sorted(
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p not in before and p != bindir and bindir not in p.parents
    )


def refused(
    tmp_path: Path, script: str, *args: str, before: set[Path] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``deploy/<script> ARGS`` and check that it stopped with exit code 2 and its own
    message, having called none of the STANDINS and created nothing."""
    res, calls = _deploy(tmp_path, script, *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(f"{script}: "), res.stderr
    assert "Traceback" not in res.stderr and not re.search(r"line \d+:", res.stderr), res.stderr
    assert calls == "", calls
    assert created(tmp_path, before or set()) == [], res.stderr
    return res


def test_every_option_with_a_value_checks_that_it_has_one() -> None:
    """Each ``--x) ...; shift 2 ;;`` branch calls need_value first (a new option too)."""
    for script in PARSING_SCRIPTS:
        text = (ROOT / "deploy" / script).read_text()
        branches = re.findall(r"^\s+--[\w-]+\)[^\n]*shift 2 ;;", text, re.M)
        assert len(branches) >= 3, script
        for line in branches:
            assert re.match(r'\s+(--[\w-]+)\) need_value "\$@";', line), f"{script}: {line}"


@pytest.mark.parametrize(
    ("script", "option", "after"),
    [(s, o, a) for s in PARSING_SCRIPTS for o in value_options(s) for a in ((), ("--insecure",))],
    ids=lambda v: v if isinstance(v, str) else ("last" if not v else "before-another-option"),
)
def test_an_option_without_its_value_is_refused(
    tmp_path: Path, script: str, option: str, after: tuple[str, ...]
) -> None:
    """``start_superlink.sh --certs`` died with ``line 36: $2: unbound variable``: an option
    at the end of the line, or followed by the next option, says it needs a value."""
    args = [option, *after]
    if script == "local_demo.sh":  # never its default folder in /tmp
        args = ["--dir", str(tmp_path / "demo"), *args]
    res = refused(tmp_path, script, *args)
    assert f"{script}: {option} needs a value\n" == res.stderr


NUMBERS_SUPERNODE = [
    (("--partition-id", "08", "--num-partitions", "10"), "--partition-id must be a non-negative"),
    (("--partition-id", "-1"), "--partition-id must be a non-negative integer"),
    (("--partition-id", "1.0"), "--partition-id must be a non-negative integer"),
    (("--num-partitions", "010"), "--num-partitions must be a positive integer"),
    (("--num-partitions", "0"), "--num-partitions must be a positive integer"),
    (("--partition-id", "2"), "--partition-id must be below --num-partitions (0..1), got 2"),
    (("--port", "0"), "--port must be a port number from 1 to 65535"),
    (("--port", "65536"), "--port must be a port number from 1 to 65535"),
    (("--port", "09094"), "--port must be a port number from 1 to 65535"),
    (("--port", "x"), "--port must be a port number from 1 to 65535"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), NUMBERS_SUPERNODE)
def test_start_supernode_refuses_bad_numbers_before_starting_anything(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """``--partition-id 08`` made bash say ``08: value too great for base`` and then blame
    the wrong option; ids, counts and ports are plain decimal numbers, checked by name."""
    res, argv = _supernode(tmp_path, *args)
    assert res.returncode == 2 and argv == "", res.stderr
    assert res.stderr.startswith(f"start_supernode.sh: {message}"), res.stderr
    assert "value too great" not in res.stderr
    assert not (tmp_path / "state").exists()


def test_start_supernode_takes_two_digit_partition_ids(tmp_path: Path) -> None:
    res, argv = _supernode(tmp_path, "--partition-id", "10", "--num-partitions", "12")
    assert res.returncode == 0, res.stderr
    assert "--node-config partition-id=10 num-partitions=12 " in argv, argv


@pytest.mark.parametrize(
    "args",
    [("--ca", "/nonexistent/ca.crt", "--key", "/nonexistent/node-0"),
     ("--insecure", "--data-dir", "/nonexistent")],
    ids=["no-ca", "no-data"],
)  # fmt: skip
def test_start_supernode_checks_its_files_before_creating_its_state_folder(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    state = str(tmp_path / "state")
    refused(tmp_path, "start_supernode.sh", "--superlink", "127.0.0.1:9092", "--partition-id",
            "0", "--num-partitions", "2", "--state-dir", state, *args)  # fmt: skip


def test_start_superlink_without_certs_creates_nothing(tmp_path: Path) -> None:
    """It used to make its state folder and superexec.secret (default: under $HOME) before
    saying that --certs is required."""
    res = refused(tmp_path, "start_superlink.sh")
    assert "--certs DIR is required (or --insecure)" in res.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_start_superlink_says_how_to_make_a_missing_certificates_folder(
    tmp_path: Path, kind: str
) -> None:
    certs = tmp_path / "certs"
    if kind == "file":
        certs.write_text("not a folder")
    res = refused(tmp_path, "start_superlink.sh", "--certs", str(certs),
                  "--state-dir", str(tmp_path / "state"), before={certs})  # fmt: skip
    assert f"--certs {certs}: no such certificates folder" in res.stderr
    assert f"docker/make_certs.sh --out {certs} NAME..." in res.stderr
    assert "cd:" not in res.stderr


def test_start_superlink_checks_the_certificates_before_creating_its_state(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    state = tmp_path / "state"
    res, calls = _deploy(tmp_path, "start_superlink.sh", "--certs", str(certs),
                         "--state-dir", str(state))  # fmt: skip
    assert res.returncode == 1 and calls == "", res.stderr
    assert f"missing {certs}/ca.crt (docker/make_certs.sh)" in res.stderr
    assert not state.exists()


@pytest.mark.parametrize("port", ["0", "65536", "08", "9O92", "-1"])
def test_start_superlink_refuses_a_bad_port(tmp_path: Path, port: str) -> None:
    res = refused(tmp_path, "start_superlink.sh", "--insecure", "--port", port,
                  "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert (
        f"--port must be a port number from 1 to 65535 (no sign or leading zeros), got '{port}'"
        in res.stderr
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--name", "fl prod"), "--name 'fl prod': use letters, digits, '-' and '_' only"),
        (("--name", "my.link"), "--name 'my.link': use letters, digits, '-' and '_' only"),
        (("--name", 'a"b'), "use letters, digits, '-' and '_' only"),
        (("--name", ""), "need --name, --address and either --root-certificates or --insecure"),
        (("--address", "192.0.2.10"), "--address '192.0.2.10' is not HOST:PORT"),
        (("--address", "fl example:9092"), "is not HOST:PORT"),
        (("--address", "192.0.2.10:0"), "the port of --address must be a port number"),
        (("--address", "192.0.2.10:99999"), "the port of --address must be a port number"),
    ],
)
def test_add_connection_refuses_bad_names_and_addresses_before_writing(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """``--name "fl prod"`` ended in a TOMLDecodeError traceback, and ``--name my.link``
    wrote ``[superlink.my.link]``, a nested table that `flwr` cannot use; nothing is
    written now (not even $FLWR_HOME)."""
    base = ["--name", "fl", "--address", "192.0.2.10:9092", "--insecure"]
    res = refused(tmp_path, "add_connection.sh", *base, *args)
    assert message in res.stderr


def test_add_connection_writes_names_and_paths_toml_reads_back(tmp_path: Path) -> None:
    """A name of letters, digits, - and _ is one TOML key; an address or certificate path
    with a quote or backslash is written escaped."""
    folder = tmp_path / 'we"ird\\dir'
    folder.mkdir()
    (folder / "ca.crt").write_text("x")
    args = ["--name", "fl-prod_2", "--address", "[::1]:9092", "--default"]
    res, _ = _deploy(
        tmp_path, "add_connection.sh", *args, "--root-certificates", str(folder / "ca.crt")
    )
    assert res.returncode == 0, res.stderr
    cfg = tomllib.loads((tmp_path / "flwr-home" / "config.toml").read_text())["superlink"]
    assert cfg["default"] == "fl-prod_2"
    assert cfg["fl-prod_2"] == {
        "address": "[::1]:9092",
        "root-certificates": str(folder / "ca.crt"),
    }
    assert cfg["local"] == {"address": ":local:"}


LOCAL_DEMO_BAD = [
    (("--nodes", "0"), "--nodes must be a positive integer (1, 2, 3, ...; no sign or leading"),
    (("--nodes", "three"), "--nodes must be a positive integer"),
    (("--nodes", "03"), "--nodes must be a positive integer"),
    (("--seed", "-1"), "--seed must be a non-negative integer"),
    (("--port", "0"), "--port must be a port number from 1 to 65535"),
    (("--node-port", "65535"), "the last SuperNode's port would be above 65535"),
    (("--port", "9095"), "--port 9095 is one of the SuperNodes' ports 9094..9096"),
    (("--experiment", "nope"), "unknown experiment 'nope'; choose one of"),
    (("--method", "nope"), "unknown method 'nope'; choose one of"),
    (("--set", "client.lr=-1"), "'client.lr' = -1 is out of range"),
    (("--set", "client.nope=1"), "unknown key 'client.nope'"),
    (("--nodes", "2"), "--nodes 2, but experiment smoke with method fedavg has num_clients=3"),
    (("--dir", "/tmp/it's"), "quotes are not allowed in '/tmp/it's'"),
    (("--fresh", "--resume"), "--resume and --fresh: choose one"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), LOCAL_DEMO_BAD)
def test_local_demo_checks_its_arguments_before_starting_anything(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """It made certificates and started a SuperLink and SuperNodes before the run found an
    unknown experiment or method; now it stops first, with the ServerApp's own config
    check (fl_app.config) and --nodes = the experiment's num_clients."""
    res = refused(tmp_path, "local_demo.sh", "--dir", str(tmp_path / "demo"), *args)
    assert message in res.stderr
    assert not (tmp_path / "demo").exists()


def test_local_demo_refuses_to_replace_a_completed_demo_run_of_other_settings(
    tmp_path: Path,
) -> None:
    """A second demo in the same --dir with another --set was refused by the ServerApp only
    once the SuperLink and SuperNodes were up; now before anything starts, with the
    ServerApp's own message."""
    from fl_app.config import load_config
    from fl_app.rundir import RunRecorder

    cfg = load_config("smoke", "fedavg", f"output_dir={tmp_path / 'demo' / 'results'}")
    rec = RunRecorder(cfg)
    for rnd in range(cfg["num_rounds"] + 1):
        rec.write_round({"round": rnd, "accuracy": 0.5})
    rec.finish(plots=False)
    before = set(tmp_path.rglob("*"))
    res = refused(
        tmp_path, "local_demo.sh", "--dir", str(tmp_path / "demo"), "--set", "client.lr=0.2",
        before=before,
    )  # fmt: skip
    assert "holds a completed run with other settings (client.lr: 0.01 -> 0.2)" in res.stderr
    assert "FRESH=1" in res.stderr


RUN_BAD = [
    (("--experiment", "nope"), "unknown experiment 'nope'; choose one of"),
    (("--method", "nope"), "unknown method 'nope'; choose one of"),
    (("--set", "client.nope=1"), "unknown key 'client.nope'"),
    (("--set", "seed=3"), "'seed' cannot be given in SET / --set"),
    (("--set", "data.root='/x"), "No closing quotation"),
    (("--seed", "08"), "--seed must be a non-negative integer"),
    (("--timeout", "-1"), "--timeout must be a non-negative integer"),
    (("--set", "data.root='/a \"b\"'"), "--set holds both kinds of quotes"),
    (("--app", "/"), "--app / is not an app folder (no pyproject.toml)"),
    (("--resume", "--fresh"), "--resume and --fresh: choose one"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), RUN_BAD)
def test_run_checks_the_run_config_before_contacting_the_superlink(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    res = refused(tmp_path, "run.sh", "--output-dir", str(tmp_path / "results"), *args)
    assert message in res.stderr


def test_run_submits_a_valid_run_config(tmp_path: Path) -> None:
    """The config check lets a valid run through to `flwr run` (here a stand-in that fails,
    so the run is not started)."""
    res, calls = _deploy(tmp_path, "run.sh", "--output-dir", str(tmp_path / "results"),
                         "--method", "moon", "--set", "num_rounds=1 client.lr=0.05")  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "run.sh: the run was not started" in res.stderr
    assert calls.startswith(
        f"flwr run {ROOT} fl --stream --run-config experiment='smoke' method='moon'"
    )
    assert "resume=false fresh=false" in calls, calls
    res, calls = _deploy(tmp_path, "run.sh", "--output-dir", str(tmp_path / "results"), "--fresh")
    assert "resume=false fresh=true" in calls, calls  # the ServerApp may replace an unfinished run


def test_run_passes_a_set_with_double_quotes_to_flwr_as_given(tmp_path: Path) -> None:
    """JSON-escaped quotes (\\") are not read back by Flower's --run-config parser: a --set
    holding " travels as a 'literal' TOML string; --timeout 0 means no limit."""
    res, calls = _deploy(tmp_path, "run.sh", "--output-dir", str(tmp_path / "results"),
                         "--set", 'data.root="/srv/my data"', "--timeout", "0")  # fmt: skip
    assert res.returncode == 1 and "run.sh: the run was not started" in res.stderr, res.stderr
    assert """--run-config set='data.root="/srv/my data"'""" in calls, calls


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_stopped_by_a_signal_stops_the_run_and_ends_at_once(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """Ctrl-C on run.sh (or on local_demo.sh, which waits for it) went on to poll the
    SuperLink for the run's status for minutes, a SuperLink that local_demo's Ctrl-C had
    already stopped. Now the run is stopped there (`flwr stop`) and run.sh exits at once."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bindir.mkdir()
    (bindir / "flwr").write_text(
        "#!/usr/bin/env bash\n"
        f'echo "flwr $*" >> "{calls}"\n'
        'if [[ $1 == run ]]; then echo "Successfully started run 7"; sleep 60; fi\n'
    )
    (bindir / "flwr").chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join([str(bindir), str(VENV_BIN), os.environ["PATH"]])}
    env.update(HOME=str(tmp_path / "home"), FLWR_HOME=str(tmp_path / "flwr-home"))
    proc = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "run.sh"), "--output-dir", str(tmp_path / "results")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while "flwr run" not in (calls.read_text() if calls.exists() else ""):
        assert time.time() < deadline, "run.sh did not reach flwr run"
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, sig)  # what the terminal's Ctrl-C does: the whole job
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "interrupted; stopping run 7" in err and "flwr stop 7 fl" in calls.read_text()


def test_run_prints_only_a_summary_this_run_wrote(tmp_path: Path) -> None:
    """After a run that ended without writing its summary (a refused or killed run), run.sh
    printed the summary.json an earlier run had left, as if it were this run's result."""
    bindir, results = tmp_path / "bin", tmp_path / "results"
    bindir.mkdir()
    summary = results / "smoke" / "fedavg" / "seed0" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text('{"status": "completed", "note": "from the old run"}')
    os.utime(summary, (1e9, 1e9))  # written long before this run
    (bindir / "flwr").write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        '  run) echo "Successfully started run 5"; [[ -n $WRITE ]] && echo "{}" > "$WRITE" ;;\n'
        """  list) echo '{"runs": [{"status": "finished:failed"}]}' ;;\n"""
        "esac\n"
    )
    (bindir / "flwr").chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join([str(bindir), str(VENV_BIN), os.environ["PATH"]])}
    env.update(HOME=str(tmp_path / "home"), FLWR_HOME=str(tmp_path / "flwr-home"))
    cmd = ["bash", str(ROOT / "deploy" / "run.sh"), "--output-dir", str(results)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1 and "run 5: finished:failed" in res.stdout, res.stderr
    assert "the old run" not in res.stdout and "summary.json is an earlier run's" in res.stdout
    env["WRITE"] = str(summary)  # this time the run writes its summary
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert f"summary: {summary}" in res.stdout, res.stdout


@pytest.mark.parametrize("script", ["run.sh", "local_demo.sh"])
def test_scripts_find_their_libraries_when_run_through_a_link(tmp_path: Path, script: str) -> None:
    link = tmp_path / f"my-{script}"
    link.symlink_to(ROOT / "deploy" / script)
    res = subprocess.run(["bash", str(link), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--experiment" in res.stdout, res.stderr


def test_run_without_the_project_environment_warns_and_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the app's packages cannot be imported (python3 is not the project's
    virtualenv), run.sh cannot check the config itself: it says so and leaves the check to
    the ServerApp."""
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))  # after the app's folder
    res, calls = _deploy(tmp_path, "run.sh", "--output-dir", str(tmp_path / "results"))
    assert res.returncode == 1, res.stderr
    assert "run.sh: warning: cannot check the run configuration here" in res.stderr
    assert calls.startswith("flwr run "), res.stderr

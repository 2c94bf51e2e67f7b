"""Run an experiment in Flower's simulation the way ``make run`` does.

    python -m fl_app.launch --experiment smoke --method moon --set "client.mu=1" --seed 1

What it adds to a plain ``flwr run .``:
- validates the merged config first (errors name the key and the allowed values) and checks
  that the dataset's files are on this machine;
- passes the federation size the experiment needs
  (``--federation-config "num-supernodes=N client-resources-num-cpus=1"``);
- uses a private Flower home (``.flwr/`` in the checkout) and a local SuperLink started with
  runtime dependency installation, telemetry and update checks turned off, on its own ports,
  so nothing is downloaded or installed at run time;
- makes the output directory absolute (the local SuperLink's working directory is not yours);
- with ``--ray-address`` (or Ray's ``RAY_ADDRESS``), runs the clients on that existing Ray
  cluster instead of a local Ray, after checking every node (:mod:`fl_app.cluster`);
- waits for the run and exits non-zero when it did not finish ``completed``
  (``flwr run --stream`` exits 0 even on failure).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import http.client
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.data import DataError, fetch_dataset, partition_file_problem, partitions_of
from core.datafiles import DOWNLOADABLE, dataset_problem, fmnist_files, located
from core.params import Config, ConfigError
from fl_app.cluster import ClusterError, cluster_problem, node_facts, probe_cluster
from fl_app.config import (
    available,
    load_config,
    parse_overrides,
    participation_warning,
    reject_own_options,
    run_dir,
)
from fl_app.registry import resolve
from fl_app.rundir import (
    Action,
    Decision,
    RunDirBusyError,
    Stage,
    guard_run_dir,
    probe_run_dir,
    record_interrupted,
    resume_advice,
    run_dir_holder,
    wait_for_run_dir,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39191",
    "FLWR_LOCAL_CONTROL_API_PORT": "39193",
    "RAY_DEDUP_LOGS": "0",
}


def flwr_env(ray_address: str = "") -> dict[str, str]:
    """Environment for the flwr CLI and the local SuperLink it spawns; Flower's Ray backend
    joins the cluster at ``ray_address`` (Ray's ``RAY_ADDRESS``), and starts a local Ray
    without it (a ``RAY_ADDRESS`` of the caller's is not passed on)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    # flwr spawns flower-superlink & co. by name: make this interpreter's scripts visible.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("FLWR_HOME", str(ROOT / ".flwr"))
    env.setdefault("RAY_TMPDIR", "/tmp/ray-" + str(os.getuid()))
    for key, value in ENV.items():
        env.setdefault(key, value)
    return env


def _flwr() -> str:
    exe = Path(sys.executable).with_name("flwr")
    return str(exe) if exe.exists() else "flwr"


Process = tuple[int, int, str, str]  # pid, parent pid, state, command line


def processes() -> list[Process]:
    """Every process of this machine (its PID namespace), from ``ps``."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True
    ).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
    return rows


def descendants(roots: Iterable[int], table: list[Process]) -> list[Process]:
    """The processes of ``table`` below ``roots`` (children, their children, ...), by parent
    links; not the roots themselves."""
    children: dict[int, list[Process]] = {}
    for proc in table:
        children.setdefault(proc[1], []).append(proc)
    found, todo = [], list(roots)
    while todo:
        for proc in children.get(todo.pop(), []):
            found.append(proc)
            todo.append(proc[0])
    return found


def local_superlinks(
    env: dict[str, str], table: list[Process] | None = None
) -> list[tuple[int, str]]:
    """(pid, working directory) of local simulation SuperLinks on this launcher's port."""
    port = f"--port {env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}"
    found = []
    for pid, _, _, args in processes() if table is None else table:
        if "flower-superlink" in args and "--simulation" in args and port in args:
            found.append((pid, _cwd(pid)))
    return found


def simulation_processes(env: dict[str, str]) -> set[int]:
    """The local simulation SuperLink on ``env``'s port and everything it started (ServerApp,
    Ray and its actors): a running simulation's processes, not other programs'."""
    table = processes()
    links = [pid for pid, _ in local_superlinks(env, table)]
    return set(links) | {pid for pid, *_ in descendants(links, table)}


def running_simulation(pid: int, table: list[Process]) -> int | None:
    """The pid of a live ``flwr-simulation`` process below ``pid`` (a SuperLink's run in
    progress; a finished run leaves a zombie, state ``Z``), or None."""
    return next(
        (
            child
            for child, _, state, args in descendants([pid], table)
            if "flwr-simulation" in args and not state.startswith("Z")
        ),
        None,
    )


#: What a local SuperLink hands on to every run it starts, from the environment it was started
#: with, that decides where the run trains or what it computes: the Ray cluster its
#: simulations join (README, "Ray cluster"), the CPU kernels torch and its libraries dispatch
#: to (docs/BENCHMARKS.md, "Same seed, other arithmetic": one such setting changes a run from
#: its first step), and the GPUs it sees. A SuperLink whose values differ from the
#: launcher's is not its own (:func:`foreign_setting`).
INHERITED_ENV = (
    "RAY_ADDRESS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "CUDA_VISIBLE_DEVICES",
)


def started_env(pid: int) -> dict[str, str]:
    """The :data:`INHERITED_ENV` variables set in the environment process ``pid`` was
    started with (none if that is unreadable: the process is gone, or another user's)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    found = {}
    for entry in environ:
        key, sep, value = entry.decode(errors="replace").partition("=")
        if sep and key in INHERITED_ENV:
            found[key] = value
    return found


def _setting(var: str, value: str | None) -> str:
    return f"{var} unset" if value is None else f"{var}={value}"


def foreign_setting(pid: int, cwd: str, root: Path, env: dict[str, str]) -> str | None:
    """How the local SuperLink ``pid`` (working directory ``cwd``) differs from what this
    launcher needs, which it keeps for its life: started from another directory than
    ``root`` (its code would run), or with other :data:`INHERITED_ENV` values than ``env``'s
    (another Ray cluster, other CPU kernels, other GPUs). None when it is this launcher's."""
    if Path(cwd) != root:
        return f"was started from {cwd or 'another directory'}"
    started = started_env(pid)
    differs = []
    theirs, ours = started.get("RAY_ADDRESS", ""), env.get("RAY_ADDRESS", "")
    if theirs != ours:
        where = f"the Ray cluster at {theirs}" if theirs else "a local Ray"
        differs.append(f"runs its simulations on {where}, not on {ours or 'a local Ray'}")
    for var in INHERITED_ENV[1:]:
        if started.get(var) != env.get(var):
            differs.append(
                f"runs its simulations with {_setting(var, started.get(var))}, "
                f"not with {_setting(var, env.get(var))}"
            )
    return "; ".join(differs) or None


def foreign_run_in_progress(env: dict[str, str], root: Path) -> str | None:
    """Why this launcher must not take over the local SuperLink: one started from another
    directory (another checkout, whose launcher uses the same ports), or for another Ray
    cluster or other kernels (:func:`foreign_setting`), is running a simulation, which
    restarting it would end. None when there is none."""
    table = processes()
    for pid, cwd in local_superlinks(env, table):
        differs = foreign_setting(pid, cwd, root, env)
        if differs and (sim := running_simulation(pid, table)):
            return (
                f"the local SuperLink on port {env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']} "
                f"(pid {pid}) {differs} and is running a simulation (pid {sim}); every "
                "launcher of this machine uses this port. Wait until that run ends, or end "
                "it with `make clean-flwr` (which stops the SuperLink and its run), then try "
                "again"
            )
    return None


def _simulation_on_port(args: str, port: str) -> bool:
    """Whether a command line is a ``flwr-simulation`` of the SuperLink on ``port``."""
    return "flwr-simulation" in args and bool(
        re.search(rf"--runtime-api-address \S+:{port}(\s|$)", args)
    )


def orphaned_simulations(
    env: dict[str, str], table: list[Process], cwd: Path | None = None
) -> list[int]:
    """Live ``flwr-simulation`` processes of a SuperLink on ``env``'s port that no SuperLink
    runs any more (it was stopped or crashed; the run cannot go on without it), started from
    ``cwd`` if given. Flower's own shutdown does not always end them: its exit handler can
    wait on the gone SuperLink."""
    port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    under_a_link = {
        p[0] for p in descendants([pid for pid, _ in local_superlinks(env, table)], table)
    }
    return [
        pid
        for pid, _, state, args in table
        if _simulation_on_port(args, port)
        and not state.startswith("Z")
        and pid not in under_a_link
        and (cwd is None or _cwd(pid) == str(cwd))
    ]


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


TERM_GRACE_S = 10.0  # how long stopped processes get to exit before SIGKILL


def _identity(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process from ``/proc/<pid>/stat``; None once it is gone. The
    start time tells a process from a later one given the same pid; the command line does
    not (Ray's workers rename themselves)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]


def _ours(pid: int) -> bool:
    """Whether this user may signal ``pid`` (its own process, or any process for root)."""
    try:
        return os.getuid() == 0 or os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def _still_running(pid: int, start: str) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and not a zombie."""
    return (ident := _identity(pid)) is not None and ident[1] == start and ident[0] != "Z"


def process_identities(pids: Iterable[int]) -> dict[int, str]:
    """pid → start time of those of ``pids`` that run and belong to this user (see
    :func:`wait_for_exit`); another user's processes (a shared machine) are left out."""
    return {
        pid: ident[1]
        for pid in pids
        if (ident := _identity(pid)) and ident[0] != "Z" and _ours(pid)
    }


def wait_for_exit(identities: dict[int, str], timeout: float) -> bool:
    """True once none of the processes recorded by :func:`process_identities` runs (exited,
    zombie, or the pid reused), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if not any(_still_running(pid, start) for pid, start in identities.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def process_tree(roots: Iterable[int], table: list[Process]) -> dict[int, str]:
    """pid → start time of ``roots`` and everything below them in ``table`` that runs now (a
    SuperLink's SuperExec, ServerApp, Ray and its agents and actors, which start their own
    process groups and outlive a stopped parent). Take it before stopping anything: the
    parent links are lost once a parent exits."""
    roots = list(roots)
    return process_identities([*roots, *(p[0] for p in descendants(roots, table))])


def stop_processes(identities: dict[int, str]) -> None:
    """SIGTERM to the processes recorded by :func:`process_identities`, then SIGKILL to what
    still runs after ``TERM_GRACE_S`` seconds. A pid is signalled only while it is the
    process recorded (same start time), never a later one given the same pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in identities.items():
            if _still_running(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):  # gone since
                    os.kill(pid, sig)
        if wait_for_exit(identities, TERM_GRACE_S):
            return


def stop_local_superlink(env: dict[str, str], unless_cwd: Path | None = None) -> None:
    """Stop the project's local SuperLink with its runs' processes. It keeps the environment
    and working directory it was spawned with, and its working directory comes first on the
    ServerApp/ClientApp ``sys.path``: a SuperLink started from another checkout would run
    that checkout's code instead of the submitted app, and one started with another
    ``RAY_ADDRESS`` would run the clients elsewhere (with other CPU-kernel or GPU settings,
    :data:`INHERITED_ENV`, on other arithmetic). With ``unless_cwd``, only such a
    foreign one (:func:`foreign_setting`) is stopped (the launcher first checks that it
    runs nothing: :func:`foreign_run_in_progress`)."""
    table = processes()
    links = [
        pid
        for pid, cwd in local_superlinks(env, table)
        if unless_cwd is None or foreign_setting(pid, cwd, unless_cwd, env)
    ]
    if links:
        stop_processes(process_tree(links, table))


STOP_TIMEOUT_S = 60.0  # how long an interrupted launcher waits for its run to stop


FLOWER_DEFAULT_SUPERLINK_PORT = "39091"  # plain `flwr run`'s local SuperLink (flwr.cli.constant)


def stop_all_local_superlinks() -> None:
    """``make clean-flwr``: stop the launcher's local SuperLink and the one plain ``flwr run``
    starts on Flower's default port, with their runs' processes, and the processes of runs
    whose SuperLink is already gone; the next run starts a fresh SuperLink."""
    env = flwr_env()
    stop_superlink_and_runs(env)
    stop_superlink_and_runs(
        {**env, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": FLOWER_DEFAULT_SUPERLINK_PORT}
    )


def stop_superlink_and_runs(env: dict[str, str]) -> None:
    """The local SuperLink on ``env``'s port with its runs' processes, and the processes of
    runs on that port whose SuperLink is already gone."""
    stop_local_superlink(env)
    table = processes()
    stop_processes(process_tree(orphaned_simulations(env, table), table))


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_tree(directory: Path, env: dict[str, str]) -> dict[int, str]:
    """The processes of the run writing ``directory``: the tree below the ``flwr-simulation``
    of ``env``'s port that holds the directory's lock (ServerApp, Ray); empty when none does."""
    holder = run_dir_holder(directory)
    table = processes()
    port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    if holder is None or not any(
        pid == holder and _simulation_on_port(args, port) for pid, _, _, args in table
    ):
        return {}
    return process_tree([holder], table)


def _superlink_log(env: dict[str, str]) -> Path:
    return Path(env["FLWR_HOME"]) / "local-superlink" / "superlink.log"


def _superlink_gone(run_id: str, env: dict[str, str], out: Path, since: float) -> None:
    """The local SuperLink stopped under a run (``make clean-flwr``, or it crashed): end what
    is left of this checkout's runs, and say so. No ``flwr`` command is run, since it would
    start a fresh SuperLink that knows nothing of the run."""
    table = processes()
    stop_processes(process_tree(orphaned_simulations(env, table, cwd=ROOT), table))
    print(
        f"run {run_id} ended with the local SuperLink (stopped by `make clean-flwr`, or it "
        f"crashed: see {_superlink_log(env)}); {resume_advice(out, since)}",
        file=sys.stderr,
    )


def superlink_serving(env: dict[str, str], tries: int = 3) -> bool:
    """Whether the local SuperLink answers its health check (as ``flwr`` asks before it
    starts a fresh one), asked up to ``tries`` times 0.5 s apart; proxies are bypassed."""
    url = f"http://127.0.0.1:{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}/health"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for attempt in range(tries):
        if attempt:
            time.sleep(0.5)
        try:
            with opener.open(url, timeout=2) as res:
                if res.status == 200:
                    return True
        except (OSError, ValueError, http.client.HTTPException):
            pass
    return False


LINK_EXIT_WAIT_S = 5.0  # a SuperLink that does not answer, or a run that did not complete:
# how long to wait for the SuperLink's process to exit (stopped under the run)


def superlink_state(env: dict[str, str], link: dict[int, str]) -> str:
    """``serving``, ``gone`` (no answer and its process, recorded when the run was submitted
    with :func:`process_identities`, has exited) or ``unresponsive`` (no answer, process still
    there). Only a serving SuperLink may be asked by a ``flwr`` command: with none answering,
    the command starts a fresh one."""
    if superlink_serving(env):
        return "serving"
    return "gone" if wait_for_exit(link, LINK_EXIT_WAIT_S) else "unresponsive"


def _superlink_unresponsive(run_id: str, env: dict[str, str]) -> None:
    print(
        f"the local SuperLink does not answer on port "
        f"{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']} while its process runs: the state of "
        f"run {run_id} is unknown (see "
        f"{_superlink_log(env)}); `make clean-flwr` "
        "ends the SuperLink with its runs",
        file=sys.stderr,
    )


def run_status(run_id: str, env: dict[str, str]) -> str:
    """``finished:completed`` / ``finished:failed`` / ... of a run, via ``flwr list``."""
    res = subprocess.run(
        [_flwr(), "list", "--run-id", run_id, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        runs = json.loads(res.stdout).get("runs", [])
        return str(runs[0]["status"]) if runs else "unknown"
    except (json.JSONDecodeError, KeyError, IndexError):
        return "unknown"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def prefetch(data_cfg: dict[str, Any]) -> str | None:
    """With ``data.download`` on a dataset that can be downloaded, download it now, once, into
    ``data.root`` (relative: in the checkout, where the clients look), rather than in every
    simulated client at once; why that failed, or None."""
    if not data_cfg.get("download") or data_cfg["dataset"] not in DOWNLOADABLE:
        return None

    name, root = data_cfg["dataset"], data_cfg["root"]
    if root is not None:
        [root] = located(Path(str(root)), (ROOT,))
    if name == "fmnist" and fmnist_files(None if root is None else str(root)) is not None:
        return None  # already here (in data.root, or the default folders without one)
    print(f"fetching {name} into {root} (data.download=true)", flush=True)
    try:
        fetch_dataset(name, root)
    except DataError as err:
        return str(err)
    return None


def partitions(cfg: Config) -> str | None:
    """Why an existing ``data.partition_file`` does not fit this run (relative: in the
    checkout, as the clients read it), found before Flower starts; None if it fits or none
    is set."""
    if not cfg["data"].get("partition_file"):
        return None

    return partition_file_problem(cfg, ROOT)


def client_data_problem(cfg: Config) -> str | None:
    """:func:`check_client_data` in a child process, so that the launcher, which lives as long
    as the run, does not keep the dataset and the data libraries in its memory."""
    ctx = multiprocessing.get_context("fork")  # the launcher has not imported torch yet
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(check_client_data, cfg).result()


def check_client_data(cfg: Config) -> str | None:
    """Why the simulated clients could not get their data, found before Flower starts by
    doing once, here, what every client does: load the training set (its image shape and
    labels checked against ``data.channels/image_size/num_classes``) and split it among
    ``num_clients`` with ``data.partition`` (:func:`core.data.partitions_of`, the clients'
    own function). None if they can. Relative paths are taken from the checkout, as the
    clients take them. An existing ``data.partition_file`` decides the partitions instead;
    none is written here."""

    with contextlib.chdir(ROOT), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr-datasets' retries: the clients log them
        try:
            partitions_of(cfg["data"], cfg["num_clients"], cfg["seed"], save=False)
        except DataError as err:
            return str(err)
    return None


def check_cpus(num_cpus: int, cpus_per_client: int, on_cluster: bool = False) -> str | None:
    """What is wrong with the CPU options (None: nothing): Ray needs at least one CPU, and
    a client asking for more CPUs than Ray has is never scheduled (Flower's "ActorPool is
    empty" crash, after its start-up). ``on_cluster``: ``num_cpus`` is not used (the
    cluster's nodes are checked by :func:`check_cluster`)."""
    if not on_cluster and num_cpus < 1:
        return f"--num-cpus={num_cpus}: Ray needs at least 1 CPU"
    if cpus_per_client < 1:
        return f"--cpus-per-client={cpus_per_client}: each client needs at least 1 CPU"
    if not on_cluster and cpus_per_client > num_cpus:
        return (
            f"--cpus-per-client={cpus_per_client} exceeds --num-cpus={num_cpus}: no client "
            f"could be scheduled; use --cpus-per-client {num_cpus} or fewer"
        )
    return None


def check_resources(cfg: Config, gpus_per_client: float, cuda_available: bool) -> str | None:
    """What is wrong with the requested GPU share for this machine (None: nothing).

    Ray never schedules a client that asks for a GPU it does not have (the run would hang),
    and a client told to use ``cuda`` without one fails in every round; both are caught here,
    before Flower starts."""
    if gpus_per_client < 0 or (gpus_per_client > 1 and not float(gpus_per_client).is_integer()):
        return (
            f"--gpus-per-client={gpus_per_client}: use 0 (CPU), a fraction in (0, 1] "
            "(clients share a GPU) or a whole number of GPUs"
        )
    device = str(cfg["client"]["device"])
    if not cuda_available and (gpus_per_client > 0 or device.startswith("cuda")):
        asked = [f"--gpus-per-client={gpus_per_client}"] if gpus_per_client > 0 else []
        fix = ["--gpus-per-client 0 (make run GPUS=0)"] if gpus_per_client > 0 else []
        if device.startswith("cuda"):
            asked.append(f"client.device={device!r}")
            fix.append("client.device=auto or cpu")
        return f"no CUDA GPU is visible, but {' and '.join(asked)}: use {' and '.join(fix)}"
    if device.startswith("cuda") and gpus_per_client == 0:
        return (
            f"client.device={device!r} needs a GPU share per simulated client: pass "
            "--gpus-per-client (e.g. 0.25 lets four clients share a GPU; make run GPUS=0.25)"
        )
    return None


_CAUSE = re.compile(
    r"\b((?:Config|Data|AllClientsFailed|NoNodes|NoUpdates|RunDirBusy|RayNodeLost)Error): (.+)"
)


def failure_cause(line: str) -> str | None:
    """The project's own error in a line of the run's log (``DataError: ...``), if any: the
    reason a run stopped, which Flower's and Ray's tracebacks around it bury."""
    m = _CAUSE.search(line)
    return f"{m.group(1)}: {m.group(2).strip()}" if m else None


def run_config_string(value: str, what: str) -> str:
    """``value`` as a TOML string that ``flwr run --run-config`` reads back unchanged.

    Flower's parser takes a quoted value up to the next quote of the same kind, so a value
    may hold one kind of quote but not both: a value without ``"`` becomes a basic string
    (backslashes and control characters escaped, DEL too), one with ``"`` but no ``'`` a literal
    string. Raises ConfigError (naming ``what``) for a value with both."""
    if '"' not in value:  # raw non-ASCII: json's surrogate pairs (emoji) are no TOML
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if "'" not in value and value.isprintable():
        return f"'{value}'"
    raise ConfigError(
        f'{what} {value!r} holds both \' and " (or a control character next to a "), '
        "which `flwr run --run-config` cannot pass on: use one kind of quote only"
    )


def build_command(args: argparse.Namespace, num_clients: int, output_dir: str) -> list[str]:
    """The ``flwr run`` command of a launch (raises ConfigError for an output dir or SET
    that Flower's run config cannot carry, see :func:`run_config_string`)."""
    run_config = (
        f"experiment='{args.experiment}' method='{args.method}' seed={args.seed} "
        f"output-dir={run_config_string(output_dir, '--output-dir')} "
        f"resume={'true' if args.resume else 'false'} fresh={'true' if args.fresh else 'false'}"
    )
    cmd = [_flwr(), "run", str(ROOT), "--stream", "--run-config", run_config]
    if args.set:
        cmd += ["--run-config", f"set={run_config_string(args.set, '--set')}"]
    federation = (
        f"num-supernodes={num_clients} client-resources-num-cpus={args.cpus_per_client} "
        f"client-resources-num-gpus={args.gpus_per_client}"
    )
    if not args.ray_address:  # Ray refuses num_cpus when it joins an existing cluster
        federation += f" init-args-num-cpus={args.num_cpus}"
    return [*cmd, "--federation-config", federation]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The launcher's command line (``argv``, or ``sys.argv``); argparse exits 2 with its
    usage for an option it cannot read, and 0 after ``--help``. Nothing is checked here
    beyond the options' types."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--experiment",
        default="default",
        help=f"conf/experiments/<name>.yaml: {', '.join(available('experiments'))} (%(default)s)",
    )
    p.add_argument(
        "--method",
        default="fedavg",
        help=f"conf/methods/<name>.yaml: {', '.join(available('methods'))} (%(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds partitions, sampling, init (%(default)s)"
    )
    p.add_argument(
        "--set", default="", help='dotted overrides, e.g. "client.lr=0.1 data.alpha=0.5"'
    )
    p.add_argument(
        "--output-dir",
        default="results",
        help="results go to <dir>/<experiment>/<method>/seed<seed> (%(default)s)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over even where an unfinished run (with a checkpoint), or a completed "
        "run of other settings, would be replaced",
    )
    p.add_argument(
        "--num-cpus", type=int, default=os.cpu_count() or 2, help="CPUs given to Ray (%(default)s)"
    )
    p.add_argument(
        "--cpus-per-client",
        type=int,
        default=1,
        help="Ray CPUs per simulated client: clients at once = num-cpus / this (%(default)s)",
    )
    p.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        help="Ray GPU share per client: 0.25 lets four share a GPU; 0 = CPU (%(default)s)",
    )
    p.add_argument(
        "--ray-address",
        default=os.environ.get("RAY_ADDRESS", ""),
        help="run the clients on the existing Ray cluster at HOST:PORT (this machine one of "
        "its nodes; --num-cpus is then ignored); default: $RAY_ADDRESS, else a local Ray; "
        "'local' or '' for a local Ray",
    )
    args = p.parse_args(argv)
    if args.ray_address == "local":  # Ray's own word for "start a local Ray"
        args.ray_address = ""
    return args


class Refused(Exception):
    """A check that stops a launch before Flower starts: :func:`main` prints
    ``<kind>: <message>`` (kind ``config error``, ``data error`` or ``error``) and exits 2."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class Launch:
    """A launch that passed its checks (:func:`checks`): what :func:`supervise` runs."""

    cfg: Config
    out: Path  # the run directory
    cmd: list[str]  # the `flwr run` command
    env: dict[str, str]  # the flwr CLI's environment (:func:`flwr_env`)


def main(argv: list[str] | None = None) -> int:
    """``python -m fl_app.launch``: :func:`parse`, :func:`checks`, :func:`supervise`; the
    exit code (2: refused before Flower started, with the reason on stderr)."""
    args = parse(argv)
    try:
        launch = checks(args)
    except Refused as err:
        print(f"{err.kind}: {err}", file=sys.stderr)
        return 2
    return supervise(launch)


def checks(args: argparse.Namespace) -> Launch:
    """Everything that can stop a launch before Flower starts, in this order, each a
    :class:`Refused`: the CPU options, the config (with ``SET``) and the ``flwr run`` command
    it makes, what the run would do to its directory (:func:`fl_app.rundir.decide`, before
    any data is read or downloaded), the data the clients will read, another checkout's run
    on the SuperLink, the GPU share, a live run in the directory (its lock) and, with
    ``--ray-address``, the Ray cluster (:func:`check_cluster`). Prints the
    config's participation warning, and a note when the run replaces an earlier one. On
    return the run directory exists."""
    if problem := check_cpus(args.num_cpus, args.cpus_per_client, bool(args.ray_address)):
        raise Refused("config error", problem)
    cfg, cmd = _config(args)
    if warning := participation_warning(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    out = run_dir(cfg)
    decision = _run_dir_decision(args, cfg, out)
    # the simulation's clients read the data on this machine, in the checkout (a relative
    # data.root is taken from there, as they take it): a missing dataset stops here
    if problem := (
        dataset_problem(cfg["data"], bases=(ROOT,))
        or prefetch(cfg["data"])
        or partitions(cfg)
        or client_data_problem(cfg)
    ):
        raise Refused("data error", problem)
    env = flwr_env(args.ray_address)
    if problem := foreign_run_in_progress(env, ROOT):
        raise Refused("error", problem)
    if args.ray_address:  # the cluster's GPUs count, not this machine's
        if problem := check_resources(cfg, args.gpus_per_client, cuda_available=True):
            raise Refused("config error", problem)
    elif args.gpus_per_client != 0 or str(cfg["client"]["device"]).startswith("cuda"):
        import torch  # already loaded (core.data); CUDA is queried only when a GPU is asked for

        if problem := check_resources(cfg, args.gpus_per_client, torch.cuda.is_available()):
            raise Refused("config error", problem)
    if decision.action is Action.REPLACE:  # other settings only with --fresh (refused else)
        changes = decision.replaced
        other = f" of other settings ({'; '.join(changes)})" if changes else ""
        print(
            f"note: {out} holds an earlier run{other} ({decision.earlier}); this run replaces it",
            file=sys.stderr,
        )
    _probe(out)
    if args.ray_address:
        check_cluster(args, cfg, out)
    return Launch(cfg, out, cmd, env)


def check_cluster(args: argparse.Namespace, cfg: Config, out: Path) -> None:
    """Refused (an error) unless the Ray cluster at ``args.ray_address`` can run this
    simulation (:func:`fl_app.cluster.cluster_problem`): reachable from here, every node with
    the same versions and code, a node large enough for a client, the data readable on
    every node that can host one, and, for a method that keeps client state in files, the
    run directory seen by all of them (a token file written there for the probe)."""
    keeps_state = resolve("client", cfg["client"]["name"]).keeps_state(cfg)
    token = out / f".cluster-probe-{os.getpid()}"
    print(f"checking the Ray cluster at {args.ray_address} ...", file=sys.stderr, flush=True)
    try:
        token.write_text("seen\n")
        nodes = probe_cluster(args.ray_address, cfg["data"], token)
    except ClusterError as err:
        raise Refused("error", str(err)) from None
    finally:
        token.unlink(missing_ok=True)
    shared = out if keeps_state else None
    here = node_facts(cfg["data"], None)
    if problem := cluster_problem(nodes, here, args.cpus_per_client, args.gpus_per_client, shared):
        raise Refused("error", problem)
    print(
        f"Ray cluster at {args.ray_address}: {_plural(len(nodes), 'node')}, "
        f"{sum(n.cpus for n in nodes):g} CPUs, "
        f"{sum(n.gpus for n in nodes):g} GPUs ({', '.join(n.ip for n in nodes)})",
        file=sys.stderr,
        flush=True,
    )


def _config(args: argparse.Namespace) -> tuple[Config, list[str]]:
    """The run's merged config (``--set`` without the keys that have their own option; the
    output dir made absolute) and its ``flwr run`` command; Refused (config error) when
    either cannot be had."""
    output_dir = str(Path(args.output_dir).expanduser().resolve())
    try:
        overrides = parse_overrides(args.set)
        reject_own_options(overrides)
        overrides.update({"seed": args.seed, "output_dir": output_dir})
        cfg = load_config(args.experiment, args.method, overrides)
        return cfg, build_command(args, cfg["num_clients"], output_dir)
    except ConfigError as err:
        raise Refused("config error", str(err)) from None


def _run_dir_decision(args: argparse.Namespace, cfg: Config, out: Path) -> Decision:
    """What the run would do to ``out`` (:func:`fl_app.rundir.guard_run_dir` at
    :attr:`Stage.LAUNCH`); Refused when it must not go ahead: a config error for a resume
    (and for ``--resume --fresh``), an error for a run that would replace what it must not
    or a live run."""
    try:
        return guard_run_dir(cfg, out, resume=args.resume, fresh=args.fresh, stage=Stage.LAUNCH)
    except (ConfigError, RunDirBusyError) as err:
        raise Refused("config error" if args.resume else "error", str(err)) from None


def _probe(out: Path) -> None:
    """Create the run directory and take its lock once (:func:`fl_app.rundir.probe_run_dir`):
    fail now, not after Flower's start-up, when another run writes it or it cannot be
    created (Refused, an error)."""
    try:
        probe_run_dir(out)
    except RunDirBusyError as err:
        raise Refused("error", str(err)) from None
    except OSError as err:
        raise Refused(
            "error",
            f"cannot create the results directory {out} ({err.strerror or err}); "
            "choose another --output-dir (make run OUTPUT_DIR=...)",
        ) from None


@dataclasses.dataclass
class _Run:
    """What the streamed log of ``flwr run`` told so far."""

    run_id: str | None = None  # the run's id, once the SuperLink started it
    cause: str | None = None  # the last project error in the log (what stopped the run)
    link: dict[int, str] = dataclasses.field(default_factory=dict)  # the SuperLink's identity


def supervise(launch: Launch) -> int:
    """Start the run on a local SuperLink of this checkout (one started elsewhere is
    restarted, unless it runs a simulation: then exit 2), stream its log and wait for it.
    The exit code: 0 once it completed (its headline figures printed), 1 when it failed or
    its SuperLink went away or does not answer, 130 after Ctrl-C or SIGTERM (the run is
    stopped in the SuperLink and its summary marked interrupted)."""
    started = time.time()
    if problem := foreign_run_in_progress(launch.env, ROOT):  # again: one may have started
        print(f"error: {problem}", file=sys.stderr)
        return 2
    stop_local_superlink(launch.env, unless_cwd=ROOT)
    cfg = launch.cfg
    print(
        f"running {cfg['method']} on {cfg['experiment']} ({_plural(cfg['num_clients'], 'client')}"
        f", {_plural(cfg['num_rounds'], 'round')}); results in {launch.out}",
        flush=True,
    )
    proc = subprocess.Popen(
        launch.cmd,
        cwd=ROOT,
        env=launch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = _Run()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = _stream(proc, launch.env, run)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run lives in the SuperLink, stop it
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut this short
            signal.signal(sig, signal.SIG_IGN)
        proc.terminate()
        return _interrupted(launch, run, started)
    return _outcome(launch, run, code, started)


def _stream(proc: subprocess.Popen[str], env: dict[str, str], run: _Run) -> int:
    """Copy the run's log to stdout as it comes, noting in ``run`` its id (and the
    SuperLink's identity then) and the last project error; ``flwr``'s exit code."""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        m = re.search(r"Successfully started run (\d+)", line)
        if m:
            run.run_id = m.group(1)
            run.link = process_identities(pid for pid, _ in local_superlinks(env))
        run.cause = failure_cause(line) or run.cause  # the last one: what stopped the run
    return proc.wait()


def _interrupted(launch: Launch, run: _Run, started: float) -> int:
    """After Ctrl-C or SIGTERM: how the run had finished if it had (0 or 1), else stop it in
    the SuperLink (waiting for its ServerApp to release the directory, then ending the Ray
    processes it leaves), mark its summary interrupted and say how to go on; 130."""
    env, out, summary = launch.env, launch.out, launch.out / "summary.json"
    if finished := finished_status(summary, started):  # the log lags behind the run
        print(
            f"the run had already finished ({finished}) when interrupted: nothing to stop",
            file=sys.stderr,
        )
        if finished == "completed":
            return print_result(summary, out)
        print(f"cause: {run.cause}" if run.cause else f"see {_superlink_log(env)}", file=sys.stderr)
        return 1
    state = superlink_state(env, run.link) if run.run_id else "not started"
    if run.run_id and state == "gone":
        _superlink_gone(run.run_id, env, out, started)
    elif run.run_id and state == "unresponsive":
        _superlink_unresponsive(run.run_id, env)
    elif run.run_id:
        _stop_run(run.run_id, env, out)
    if record_interrupted(launch.cfg, started):
        print(f"{summary}: status interrupted", file=sys.stderr)
    if state != "unresponsive":
        print(
            f"interrupted: stopped run {run.run_id}; {resume_advice(out, started)}",
            file=sys.stderr,
        )
    return 130


def _stop_run(run_id: str, env: dict[str, str], out: Path) -> None:
    """``flwr stop`` the run writing ``out``, wait until its ServerApp released the
    directory, then end what is left of its process tree (Ray's agents outlive a stopped
    run); say so when it is still writing after :data:`STOP_TIMEOUT_S`."""
    tree = _run_tree(out, env)  # below the run's ServerApp process, which holds its directory
    subprocess.run([_flwr(), "stop", run_id], env=env, cwd=ROOT, capture_output=True)
    print(f"stopping run {run_id} ...", file=sys.stderr, flush=True)
    tree.update(_run_tree(out, env))  # what it started since
    if wait_for_run_dir(out, STOP_TIMEOUT_S):
        stop_processes(tree)
    else:
        print(
            f"run {run_id} is still writing {out} after {STOP_TIMEOUT_S:.0f} s; "
            f"`flwr stop {run_id}` (with FLWR_HOME={env['FLWR_HOME']}) or "
            "`make clean-flwr` (stops every run of the local SuperLink) ends it",
            file=sys.stderr,
        )


def _outcome(launch: Launch, run: _Run, code: int, started: float) -> int:
    """The exit code of a run whose log ended: 0 when it completed (its figures printed);
    1 when its SuperLink went away (summary marked interrupted) or does not answer, or when
    it did not finish ``completed`` with a summary of its own."""
    env, out, summary = launch.env, launch.out, launch.out / "summary.json"
    status = "not started"
    if run.run_id:
        # ask only a SuperLink that serves (`flwr list` would start a fresh one); a run that
        # did not complete may have been ended by its SuperLink's stop (make clean-flwr)
        state = superlink_state(env, run.link)
        if state == "serving":
            status = run_status(run.run_id, env)
            if status != "finished:completed" and wait_for_exit(run.link, LINK_EXIT_WAIT_S):
                state = "gone"
        if state == "gone":
            _superlink_gone(run.run_id, env, out, started)
            if record_interrupted(launch.cfg, started):
                print(f"{summary}: status interrupted", file=sys.stderr)
            return 1
        if state == "unresponsive":
            _superlink_unresponsive(run.run_id, env)
            return 1
    fresh = summary.is_file() and summary.stat().st_mtime >= started
    if code != 0 or status != "finished:completed" or not fresh:
        print(
            f"run failed: flwr exit code {code}, status {status!r}, "
            f"summary written: {fresh}. See the log above and "
            f"{_superlink_log(env)}" + (f"\ncause: {run.cause}" if run.cause else ""),
            file=sys.stderr,
        )
        return 1
    return print_result(summary, out)


def finished_status(summary: Path, since: float) -> str | None:
    """The status a run started at ``since`` wrote into its own ``summary.json``
    (``completed``, ``failed``), or None while it has written none."""
    try:
        if summary.stat().st_mtime < since:
            return None
        status = json.loads(summary.read_text()).get("status")
    except (OSError, json.JSONDecodeError):
        return None
    return str(status) if status in ("completed", "failed") else None


def print_result(summary: Path, out: Path) -> int:
    """Print a completed run's headline figures and where its results are; returns 0."""
    result = json.loads(summary.read_text())
    print(
        json.dumps(
            {
                k: round(v, 4) if isinstance(v := result.get(k), float) else v
                for k in (
                    "method",
                    "experiment",
                    "seed",
                    "rounds_completed",
                    "dropped_results",
                    "failed_results",
                    "final_accuracy",
                    "best_accuracy",
                    "last5_accuracy",
                    "wall_seconds",
                )
            },
            indent=2,
        )
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.datafiles import FMNIST_FILES
from core.params import ConfigError
from fl_app.config import config_from_run_config, load_config
from fl_app.launch import (
    ROOT,
    check_resources,
    descendants,
    failure_cause,
    flwr_env,
    foreign_run_in_progress,
    orphaned_simulations,
    process_identities,
    processes,
    running_simulation,
    stop_all_local_superlinks,
    stop_local_superlink,
    stop_processes,
    superlink_state,
)
from fl_app.rundir import RunDirBusyError, RunRecorder, Stage, guard_run_dir


@pytest.mark.parametrize(
    ("device", "gpus", "cuda", "problem"),
    [
        ("auto", 0, False, None),
        ("auto", 0.25, True, None),
        ("cuda:0", 0.5, True, None),
        ("auto", 2, True, None),
        ("cpu", 0, True, None),
        ("auto", 0.25, False, "no CUDA GPU is visible"),
        ("cuda", 0, False, "no CUDA GPU is visible"),
        ("cuda", 0, True, "needs a GPU share per simulated client"),
        ("cuda", 0, False, "but client.device='cuda': use client.device=auto or cpu"),
        ("auto", 0.5, False, "but --gpus-per-client=0.5: use --gpus-per-client 0"),
        ("auto", -1, True, "use 0 (CPU), a fraction"),
        ("auto", 1.5, True, "use 0 (CPU), a fraction"),
    ],
)
def test_check_resources(device, gpus, cuda, problem):
    cfg = load_config("tiny", "fedavg", f"client.device={device}")
    found = check_resources(cfg, gpus, cuda)
    assert found is None if problem is None else problem in found


def _launch_refusal(cfg, directory, *, resume=False):
    """What the launcher's own check of the run directory refuses before Flower starts
    (fl_app.rundir at Stage.LAUNCH, without --fresh), or None."""
    try:
        guard_run_dir(cfg, directory, resume=resume, fresh=False, stage=Stage.LAUNCH)
    except (ConfigError, RunDirBusyError) as err:
        return str(err)
    return None


def _launch(tmp_path, *extra):
    cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", "tiny"]
    cmd += ["--output-dir", str(tmp_path), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_launch_refuses_a_gpu_share_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = _launch(tmp_path, "--gpus-per-client", "0.5")
    assert res.returncode == 2 and "no CUDA GPU is visible" in res.stderr


def test_launch_refuses_a_results_directory_in_use(tmp_path):
    """Before Flower starts (no SuperLink is needed to see this error)."""
    busy = RunRecorder(load_config("tiny", "fedavg", f"output_dir={tmp_path}"))
    res = _launch(tmp_path)
    busy.finish()
    assert res.returncode == 2 and "is being written by another run" in res.stderr


@pytest.mark.parametrize("key", ["seed=3", "output_dir=elsewhere", "method=moon"])
def test_keys_with_their_own_option_are_refused_in_set(tmp_path, key):
    """``SET="seed=3"`` made the launcher watch seed0 while the ServerApp wrote seed3."""
    res = _launch(tmp_path, "--set", key)
    name = key.split("=")[0]
    assert res.returncode == 2 and f"'{name}' cannot be given in SET" in res.stderr
    assert f"{name.upper()}=... with make" in res.stderr
    with pytest.raises(ConfigError, match=f"'{name}' cannot be given in SET"):
        config_from_run_config({"experiment": "tiny", "method": "fedavg", "set": key})


def test_a_refused_resume_is_found_before_flower_starts(run_in_process, tmp_path):
    """The ServerApp's resume check, run by the launcher: exit code 2 at once, instead of
    the same ConfigError inside Flower's traceback after its start-up."""
    done = run_in_process("fedavg", set_="num_rounds=2", seed=5)
    out = done["dir"].parents[2]
    changed = load_config("tiny", "fedavg", f"output_dir={out} seed=5 num_rounds=3 client.lr=0.5")
    assert "client.lr: 0.05 -> 0.5" in _launch_refusal(changed, done["dir"], resume=True)
    same = load_config("tiny", "fedavg", f"output_dir={out} seed=5 num_rounds=3")
    assert _launch_refusal(same, done["dir"], resume=True) is None
    res = _launch(out, "--seed", "5", "--resume", "--set", "num_rounds=3 client.lr=0.5")
    assert res.returncode == 2 and "client.lr: 0.05 -> 0.5" in res.stderr
    assert "running fedavg" not in res.stdout  # Flower was not started


def test_a_resume_with_nothing_to_resume_stops_and_lists_the_runs_that_have_a_checkpoint(
    run_in_process, tmp_path
):
    """``RESUME=1`` with a mistyped seed used to start that run from round 1 (exit 0):
    now exit 2 before Flower starts, naming the runs that can be resumed, creating nothing."""
    done = run_in_process("fedavg", set_="num_rounds=2", seed=6)
    out = done["dir"].parents[2]
    res = _launch(out, "--seed", "7", "--resume")
    assert res.returncode == 2 and "nothing to resume" in res.stderr, res.stderr
    assert "fedavg/seed6" in res.stderr and "running fedavg" not in res.stdout
    assert not (done["dir"].parent / "seed7").exists()
    empty = tmp_path / "nothing"
    res = _launch(empty, "--resume")
    assert res.returncode == 2 and "no run of" in res.stderr and not empty.exists()


def test_rerunning_without_resume_does_not_delete_an_unfinished_run(run_in_process):
    """After a Ctrl-C, rerunning the command from the shell's history (without RESUME=1)
    replaced the interrupted run, checkpoint included: now exit 2, naming RESUME=1 and
    FRESH=1; a completed run is replaced with a note before Flower starts; a resume of a
    run that completed all its rounds is refused."""
    import json

    import yaml

    done = run_in_process("fedavg", set_="num_rounds=2", seed=11)
    out, run = done["dir"].parents[2], done["dir"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert _launch_refusal(cfg, run) is None  # completed: replacing it loses nothing unexpected
    res = _launch(out, "--seed", "11", "--resume", "--set", "num_rounds=2")
    expected = "completed all its 2 rounds (this run's num_rounds is 2); raise num_rounds above 2"
    assert res.returncode == 2 and expected in res.stderr
    res = _launch(out, "--seed", "11", "--set", "num_rounds=2 client.lr=0.5")  # another SET
    other = "holds a completed run with other settings (client.lr: 0.05 -> 0.5)"
    assert res.returncode == 2 and other in res.stderr and "running fedavg" not in res.stdout
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    problem = _launch_refusal(cfg, run)
    assert "holds an unfinished run (status interrupted, 2 round(s) completed" in problem
    assert "checkpoint at round 2): run config resume=true (make run: RESUME=1; " in problem
    assert "continues it; fresh=true (make run: FRESH=1; deploy/run.sh: --fresh)" in problem
    res = _launch(out, "--seed", "11", "--set", "num_rounds=2")
    assert res.returncode == 2 and problem in res.stderr and "running fedavg" not in res.stdout
    assert (run / "checkpoint.json").is_file()  # nothing deleted
    res = _launch(out, "--seed", "11", "--resume", "--fresh")
    assert res.returncode == 2 and "choose one" in res.stderr


def test_a_damaged_checkpoint_is_a_one_line_error_not_a_traceback(tmp_path):
    """Arrays of round 2 with the JSON of round 1 (a save cut between its two renames, then
    the temporary file lost): a resume says the checkpoint cannot be read, exit 2 (what the
    launcher advises after a stop: tests/fl_app/test_rundir.py)."""
    import numpy as np

    run = tmp_path / "tiny" / "fedavg" / "seed0"
    run.mkdir(parents=True)
    np.savez(run / "checkpoint.npz", round=np.int64(2))
    (run / "checkpoint.json").write_text('{"round": 1, "keys": []}')
    res = _launch(tmp_path, "--resume")
    assert res.returncode == 2 and "the checkpoint cannot be read" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("set_", "message"),
    [
        ("num_clients=5000", "cannot split 1347 training samples into 5000 clients"),
        ("data.image_size=32", "digits images have shape (1, 28, 28), but the config says"),
        ("data.partition=shards data.shards_per_client=500", "data.partition=shards needs"),
    ],
)
def test_data_the_clients_could_not_split_or_load_stops_before_flower(tmp_path, set_, message):
    """The clients' own loading and partitioning, done once by the launcher: such a run
    used to start Flower and fail in every simulated client (60,000 of them for a
    num_clients beyond the training set)."""
    from fl_app.launch import client_data_problem

    assert message in client_data_problem(load_config("tiny", "fedavg", set_))
    if set_.startswith("num_clients"):  # and through the launcher: exit 2, nothing written
        res = _launch(tmp_path, "--set", set_)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert "running fedavg" not in res.stdout and list(tmp_path.iterdir()) == []


def test_an_output_dir_that_cannot_be_created_is_a_one_line_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    res = _launch(afile)
    assert res.returncode == 2 and "cannot create the results directory" in res.stderr
    assert "Traceback" not in res.stderr and "choose another --output-dir" in res.stderr


@pytest.mark.parametrize(
    "odd", ["it's here $x", 'say "hi" \\ there', "ünï cödé", "tab\there", "emoji 😀", "del\x7f"]
)
def test_the_output_dir_and_set_reach_the_server_app_verbatim(tmp_path, odd):
    """A quote in the path ended the run config's string early: the results went to
    another folder. What Flower's own parser reads back must be what was given."""
    import argparse

    from flwr.common.config import parse_config_args

    from fl_app.launch import build_command

    path = str(tmp_path / odd)
    over = "client.lr=0.1 data.root='/my data'"  # a SET quoting a value
    args = argparse.Namespace(
        experiment="tiny",
        method="fedavg",
        seed=0,
        resume=False,
        fresh=True,
        set=over,
        cpus_per_client=1,
        gpus_per_client=0.0,
        num_cpus=2,
        ray_address="",
    )
    cmd = build_command(args, 3, path)
    run_configs = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--run-config"]
    parsed = parse_config_args(run_configs)
    assert parsed["output-dir"] == path and parsed["set"] == over
    assert parsed["resume"] is False and parsed["fresh"] is True  # FRESH=1 reaches the ServerApp
    args.set = odd  # not a valid SET, but it must arrive as given
    parsed = parse_config_args(build_command(args, 3, path)[-3:-2])
    assert parsed["set"] == odd


def test_a_value_with_both_quotes_is_refused_with_what_to_do(tmp_path):
    res = _launch(tmp_path / 'it\'s "both"')
    assert res.returncode == 2 and "use one kind of quote only" in res.stderr, res.stderr


def test_failure_cause_picks_the_projects_error_out_of_a_traceback_line():
    line = (
        "flwr.clientapp.exception.ClientAppException: \n"
        "Exception ClientAppException occurred. Message: core.data.DataError: cannot split "
        "2 training samples into 3 clients; lower num_clients or raise data.train_subset  "
    )
    assert failure_cause(line) == (
        "DataError: cannot split 2 training samples into 3 clients; lower num_clients or "
        "raise data.train_subset"
    )
    assert failure_cause("INFO : round 3/10: 3/3 results") is None


def test_clean_flwr_stops_the_launchers_and_plain_flwr_runs_local_superlinks(monkeypatch):
    """Stand-ins with a local SuperLink's command line (found by ``ps``, whatever COLUMNS
    says): the launcher's port and Flower's default one are both stopped. Unused ports, so
    that a real SuperLink (a developer's run) is left alone."""
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "49191")
    monkeypatch.setattr("fl_app.launch.FLOWER_DEFAULT_SUPERLINK_PORT", "49091")
    monkeypatch.setenv("COLUMNS", "60")
    ports = (flwr_env()["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"], "49091")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "flower-superlink"]
    procs = [
        subprocess.Popen([*sleeper, "--simulation", "--port", port, "--pad", "x" * 300])
        for port in ports
    ]
    try:
        stop_all_local_superlinks()
        assert [p.wait(timeout=10) for p in procs] == [-15, -15]  # SIGTERM
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("whole", [False, True])
def test_launch_refuses_a_missing_or_broken_dataset_before_flower_starts(tmp_path, whole):
    """One line and exit 2, and no run directory left behind (the check precedes it): for
    a missing dataset, and for IDX files that are there but not whole."""
    root = tmp_path / "fm"
    if whole:  # four files, none of them IDX
        root.mkdir()
        for stem in (s for pair in FMNIST_FILES.values() for s in pair):
            (root / stem).write_bytes(b"<html>proxy error</html>")
    res = _launch(tmp_path, "--set", f"data.dataset=fmnist data.root={root}")
    expected = (
        f"data error: {root}/train-images-idx3-ubyte is not an unsigned-byte IDX file"
        if whole
        else "data error: Fashion-MNIST not found"
    )
    assert res.returncode == 2 and res.stderr.startswith(expected), res.stderr
    assert [p.name for p in tmp_path.iterdir()] == (["fm"] if whole else [])


def test_descendants_follow_parent_links_below_the_roots():
    table = [(1, 0, "S", "a"), (2, 1, "S", "b"), (3, 2, "S", "c"), (4, 0, "S", "d")]
    assert sorted(p[0] for p in descendants([1], table)) == [2, 3]
    assert descendants([3], table) == []


def test_running_simulation_looks_below_the_superlink_and_skips_finished_runs():
    sim = "/venv/bin/python /venv/bin/flwr-simulation --token t"
    table = [(10, 1, "S", "flower-superlink --simulation"), (11, 10, "S", "flower-superexec")]
    assert running_simulation(10, [*table, (12, 11, "Z", "[flwr-simulation] <defunct>")]) is None
    assert running_simulation(10, [*table, (12, 11, "Sl", sim)]) == 12
    assert running_simulation(10, [*table, (12, 99, "Sl", sim)]) is None  # someone else's


def test_another_checkouts_superlink_is_not_stopped_while_it_runs_a_simulation(
    tmp_path, monkeypatch
):
    """Every checkout's launcher uses the same ports. A SuperLink started from elsewhere is
    restarted only when idle: with a run in progress the launcher refuses (exit 2) and
    leaves it alone. Stand-ins on an unused port, started in tmp_path (another directory)."""
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "49191")
    env = flwr_env()
    child = "import time; time.sleep(60)"
    parent = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {child!r}, 'flwr-simulation']); time.sleep(60)"
    )
    link = subprocess.Popen(
        [sys.executable, "-c", parent, "flower-superlink", "--simulation", "--port", "49191"],
        cwd=tmp_path,
    )
    try:
        for _ in range(100):  # until the stand-in run has started
            if (problem := foreign_run_in_progress(env, ROOT)) is not None:
                break
            time.sleep(0.1)
        assert problem is not None and f"was started from {tmp_path}" in problem
        assert "make clean-flwr" in problem
        res = _launch(tmp_path / "out")
        assert res.returncode == 2 and "is running a simulation" in res.stderr
        assert link.poll() is None  # still running
        assert foreign_run_in_progress(env, tmp_path) is None  # its own checkout may go on
        sim = running_simulation(link.pid, processes())
        assert sim is not None
        os.kill(sim, signal.SIGKILL)  # the run ends
        for _ in range(100):
            if foreign_run_in_progress(env, ROOT) is None:
                break
            time.sleep(0.1)
        stop_local_superlink(env, unless_cwd=ROOT)  # now idle: restarted as before
        assert link.wait(timeout=10) == -15
    finally:
        if sim := running_simulation(link.pid, processes()):
            os.kill(sim, signal.SIGKILL)
        link.kill()


# A stand-in simulation tree: the SuperExec stand-in starts its own session (as Flower's
# does), so it and what it starts outlive a stopped SuperLink unless they are stopped too.
_RUN = (
    "import os, signal, subprocess, sys, time\n"
    "if sys.argv[1] == 'stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # like an exit handler that hangs
    "else:\n"
    "    subprocess.Popen([sys.executable, '-c', __CODE__, 'stubborn', sys.argv[-1]],\n"
    "                     start_new_session=sys.argv[1] == 'link')\n"
    "with open(sys.argv[-1], 'a') as f: f.write(f'{os.getpid()}\\n')\n"
    "time.sleep(60)\n"
)


def _stand_in(role: str, *args: str, pids: Path) -> subprocess.Popen[bytes]:
    code = _RUN.replace("__CODE__", repr(_RUN))
    return subprocess.Popen([sys.executable, "-c", code, role, *args, str(pids)])


def _wait_for_pids(path: Path, count: int) -> list[int]:
    for _ in range(100):
        if path.is_file() and len(pids := path.read_text().split()) == count:
            return [int(p) for p in pids]
        time.sleep(0.1)
    raise AssertionError(f"{path}: {path.read_text() if path.is_file() else 'missing'}")


def _gone(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat")
    return not state.is_file() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_clean_flwr_stops_the_superlinks_whole_run_and_orphaned_runs(tmp_path, monkeypatch):
    """``make clean-flwr`` with a run in progress: the SuperLink, the processes below it
    (in their own session, one ignoring SIGTERM: killed after the grace time), and a run
    whose SuperLink had already gone (an orphaned ``flwr-simulation`` and its child). A run
    on another port is left alone."""
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "49191")
    monkeypatch.setattr("fl_app.launch.FLOWER_DEFAULT_SUPERLINK_PORT", "49091")
    monkeypatch.setattr("fl_app.launch.TERM_GRACE_S", 1.0)
    link_args = ("flower-superlink", "--simulation", "--port", "49191")
    orphan_args = ("flwr-simulation", "--runtime-api-address", "127.0.0.1:49191")
    other_args = ("flwr-simulation", "--runtime-api-address", "127.0.0.1:49192")
    files = [tmp_path / f"{name}.pids" for name in ("link", "orphan", "other")]
    procs = [
        _stand_in("link", *link_args, pids=files[0]),
        _stand_in("plain", *orphan_args, pids=files[1]),
        _stand_in("plain", *other_args, pids=files[2]),
    ]
    try:
        link_tree, orphan_tree, other_tree = (_wait_for_pids(f, 2) for f in files)
        env = flwr_env()
        table = processes()
        # the SuperLink's own run is not an orphan; the other port's is not this one's
        assert orphaned_simulations(env, table) == [procs[1].pid]
        assert orphaned_simulations(env, table, cwd=tmp_path) == []  # not started there
        assert orphaned_simulations(env, table, cwd=Path.cwd()) == [procs[1].pid]
        stop_all_local_superlinks()
        for p in procs[:2]:
            p.wait(timeout=10)
        assert all(_gone(pid) for pid in link_tree + orphan_tree)
        assert not any(_gone(pid) for pid in other_tree)
    finally:
        for pid in [int(p) for f in files if f.is_file() for p in f.read_text().split()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait()


def test_stop_processes_never_signals_a_pid_given_to_a_later_process():
    """A recorded process is identified by pid and start time: a different start time (the
    pid reused since) is left alone, the recorded one is ended (SIGTERM)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recorded = process_identities([child.pid])
        assert set(recorded) == {child.pid}
        stop_processes({child.pid: "1"})  # another process's start time
        with pytest.raises(subprocess.TimeoutExpired):  # a SIGTERM would end it in ms
            child.wait(timeout=1)
        stop_processes(recorded)
        assert child.wait(timeout=10) == -15
    finally:
        child.kill()


def test_superlink_state_tells_serving_gone_and_unresponsive(monkeypatch):
    """Only a SuperLink that answers its health check may be asked by a ``flwr`` command
    (which would start a fresh one otherwise); without an answer, the SuperLink recorded at
    submission is gone once its process has exited, unresponsive while it runs."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "49193")
    monkeypatch.setattr("fl_app.launch.LINK_EXIT_WAIT_S", 0.5)
    env = flwr_env()
    server = http.server.HTTPServer(("127.0.0.1", 49193), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    link = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recorded = process_identities([link.pid])
        assert superlink_state(env, recorded) == "serving"
        server.shutdown()
        server.server_close()
        assert superlink_state(env, recorded) == "unresponsive"  # its process still runs
        link.kill()
        link.wait()
        assert superlink_state(env, recorded) == "gone"
    finally:
        link.kill()


def test_an_interrupt_after_the_run_finished_reports_how_it_finished(tmp_path):
    """Ctrl-C while the streamed log lags behind a run that has already ended: the
    launcher reads the run's own summary and says it finished, instead of "interrupted"."""
    import json

    from fl_app.launch import finished_status

    summary = tmp_path / "summary.json"
    assert finished_status(summary, since=0.0) is None  # none written yet
    for status, expected in (("completed", "completed"), ("failed", "failed"), ("x", None)):
        summary.write_text(json.dumps({"status": status}))
        assert finished_status(summary, since=0.0) == expected
    summary.write_text(json.dumps({"status": "completed"}))
    os.utime(summary, (1000.0, 1000.0))  # an earlier run's summary
    assert finished_status(summary, since=2000.0) is None
    summary.write_text("{not json")
    assert finished_status(summary, since=0.0) is None


@pytest.mark.parametrize(
    ("value", "resumes"), [("", False), ("0", False), ("no", False), ("1", True), ("true", True)]
)
def test_make_run_resumes_only_when_asked(value, resumes):
    """``RESUME=0`` must not resume (a bare ``$(if $(RESUME),...)`` would); a value make
    cannot read is an error, not a guess."""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        ["make", "-n", "run", f"RESUME={value}"], cwd=root, capture_output=True, text=True
    )
    assert res.returncode == 0 and ("--resume" in res.stdout) is resumes
    bad = subprocess.run(["make", "check-resume", "RESUME=maybe"], cwd=root, capture_output=True)
    assert bad.returncode != 0 and b"RESUME=maybe: use RESUME=1" in bad.stderr
    bad = subprocess.run(["make", "check-resume", "FRESH=maybe"], cwd=root, capture_output=True)
    assert bad.returncode != 0 and b"FRESH=maybe: use FRESH=1" in bad.stderr
    both = subprocess.run(
        ["make", "check-resume", "RESUME=1", "FRESH=1"], cwd=root, capture_output=True
    )
    assert both.returncode != 0 and b"choose one" in both.stderr
    fresh = subprocess.run(["make", "-n", "run", "FRESH=1"], cwd=root, capture_output=True)
    assert fresh.returncode == 0 and b"--fresh" in fresh.stdout
    other = subprocess.run(["make", "-n", "lint", "RESUME=maybe"], cwd=root, capture_output=True)
    assert other.returncode == 0  # only `make run` reads RESUME


@pytest.mark.parametrize(
    ("num_cpus", "per_client", "message"),
    [
        (0, 1, "--num-cpus=0: Ray needs at least 1 CPU"),
        (2, 0, "--cpus-per-client=0: each client needs at least 1 CPU"),
        (2, 3, "--cpus-per-client=3 exceeds --num-cpus=2"),
        (2, 2, None),
    ],
)
def test_cpu_options_that_ray_cannot_schedule_stop_before_flower(num_cpus, per_client, message):
    from fl_app.launch import check_cpus, main

    problem = check_cpus(num_cpus, per_client)
    assert problem == message if message is None else message in problem
    if message:
        args = ["--experiment", "tiny", "--num-cpus", str(num_cpus)]
        assert main([*args, "--cpus-per-client", str(per_client)]) == 2


@pytest.mark.parametrize(
    ("dataset", "torchvision_class"), [("cifar10", "CIFAR10"), ("fmnist", "FashionMNIST")]
)
def test_a_dataset_download_that_fails_stops_before_flower_with_its_cause(
    monkeypatch, capsys, tmp_path, dataset, torchvision_class
):
    """``data.download=true``: the launcher downloads once, before the simulation's clients
    would each try at the same time; a failure (no network) is a data error, exit 2."""
    import urllib.error

    import torchvision.datasets as tvd

    from fl_app.launch import main

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(tvd, torchvision_class, offline)
    code = main(
        [
            "--experiment",
            "tiny",
            "--set",
            f"data.dataset={dataset} data.root={tmp_path}/d data.download=true",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"data error: could not download {dataset} into {tmp_path}/d" in err
    assert "Name or service not known" in err


def test_launch_warns_of_participation_that_expects_nobody_a_round(tmp_path):
    """The warning is printed before the run starts (this one then stops at its data)."""
    sets = (
        "server.participation=bernoulli server.participation_mean=0.01 server.participation_floor=0"
    )
    res = _launch(tmp_path, "--set", f"{sets} data.dataset=fmnist data.root={tmp_path / 'no'}")
    first, second = res.stderr.splitlines()[:2]
    assert first.startswith("warning: server.participation=bernoulli with num_clients=")
    assert "of rounds will train nobody" in first and second.startswith("data error:")


def test_fmnist_download_without_data_root_uses_the_default_folder_or_is_refused(
    monkeypatch, capsys, tmp_path
):
    """``data.download=true`` without ``data.root`` tried to download into a folder named
    "None" in the checkout; now Fashion-MNIST found in the default folders is used as it
    is (nothing fetched, nothing said), and without it the download is refused."""
    import gzip

    import numpy as np

    import core.datafiles as datafiles
    from fl_app.launch import ROOT, prefetch

    here = tmp_path / "default"
    here.mkdir()
    for prefix, n in (("train", 6), ("t10k", 2)):
        for kind, shape in (("images-idx3", (n, 28, 28)), ("labels-idx1", (n,))):
            data = np.zeros(shape, np.uint8)
            head = bytes([0, 0, 8, data.ndim]) + np.array(shape, ">u4").tobytes()
            (here / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(head + data.tobytes()))
    cfg = {"dataset": "fmnist", "root": None, "download": True}
    monkeypatch.setattr(datafiles, "FMNIST_ROOTS", (here,))
    assert prefetch(cfg) is None and "fetching" not in capsys.readouterr().out
    monkeypatch.setattr(datafiles, "FMNIST_ROOTS", (tmp_path / "none",))
    assert datafiles.dataset_problem(cfg) == datafiles.NO_DOWNLOAD_ROOT
    assert prefetch(cfg) == datafiles.NO_DOWNLOAD_ROOT
    assert not (ROOT / "None").exists()


# ----------------------------------------------------------------------------- Ray cluster
def test_on_a_ray_cluster_num_cpus_is_not_passed_and_not_checked():
    """Ray refuses ``num_cpus`` when it joins an existing cluster (Flower's init-args), so a
    launch on a cluster leaves it out; the cluster's nodes are checked instead."""
    from fl_app.launch import build_command, check_cpus, parse

    local = parse(["--ray-address", "local", "--num-cpus", "2"])
    on_cluster = parse(["--ray-address", "10.0.0.1:6379", "--num-cpus", "0"])
    assert local.ray_address == "" and on_cluster.ray_address == "10.0.0.1:6379"
    assert build_command(local, 3, "/o")[-1].endswith("init-args-num-cpus=2")
    federation = build_command(on_cluster, 3, "/o")[-1]
    assert "init-args" not in federation and "client-resources-num-cpus=1" in federation
    assert check_cpus(0, 1, on_cluster=True) is None
    assert check_cpus(8, 0, on_cluster=True) == (
        "--cpus-per-client=0: each client needs at least 1 CPU"
    )


def test_the_ray_address_reaches_the_superlink_and_a_stray_one_does_not(monkeypatch):
    from fl_app.launch import parse

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert parse([]).ray_address == "10.0.0.9:6379"  # Ray's own variable is honoured
    assert flwr_env("10.0.0.1:6379")["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert "RAY_ADDRESS" not in flwr_env("")  # --ray-address local: a local Ray


@contextlib.contextmanager
def started_with(env: dict[str, str]) -> Iterator[int]:
    """A process (``sleep``) started in ``ROOT`` with ``env``, as a local SuperLink is: its pid,
    once it has exec'd (until then, the forked child still shows this process's environment:
    on a loaded machine the first read came too early)."""
    proc = subprocess.Popen(["sleep", "60"], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
            assert time.monotonic() < deadline, "the child never exec'd sleep"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _without_inherited() -> dict[str, str]:
    from fl_app.launch import INHERITED_ENV

    return {k: v for k, v in os.environ.items() if k not in INHERITED_ENV}


def test_a_superlink_started_for_another_ray_cluster_is_foreign(tmp_path):
    """The local SuperLink keeps the RAY_ADDRESS it was started with: one for another
    cluster (or a local Ray) is restarted, and refused while it runs a simulation."""
    from fl_app.launch import foreign_setting

    with started_with({**_without_inherited(), "RAY_ADDRESS": "10.0.0.1:6379"}) as pid:
        cwd = str(ROOT)
        assert foreign_setting(pid, cwd, ROOT, {"RAY_ADDRESS": "10.0.0.1:6379"}) is None
        assert foreign_setting(pid, cwd, ROOT, {"RAY_ADDRESS": "10.0.0.2:6379"}) == (
            "runs its simulations on the Ray cluster at 10.0.0.1:6379, not on 10.0.0.2:6379"
        )
        assert foreign_setting(pid, cwd, ROOT, {}) == (
            "runs its simulations on the Ray cluster at 10.0.0.1:6379, not on a local Ray"
        )
        assert foreign_setting(pid, str(tmp_path), ROOT, {}) == f"was started from {tmp_path}"


def test_a_superlink_started_with_other_kernels_is_foreign():
    """A local SuperLink started with another CPU-kernel setting (or GPU list) would train
    every later run on other arithmetic than its launcher asked for (docs/BENCHMARKS.md,
    "Same seed, other arithmetic"): it is foreign, so the launcher restarts it, and refuses
    while it runs a simulation, naming the setting."""
    from fl_app.launch import foreign_setting

    base = _without_inherited()
    with started_with({**base, "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": ""}) as pid:
        cwd = str(ROOT)
        same = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": ""}
        assert foreign_setting(pid, cwd, ROOT, same) is None
        assert foreign_setting(pid, cwd, ROOT, {"MKL_CBWR": ""}) == (
            "runs its simulations with ATEN_CPU_CAPABILITY=avx2, not with ATEN_CPU_CAPABILITY unset"
        )
        # set to nothing is not unset (CUDA_VISIBLE_DEVICES="" hides every GPU)
        assert foreign_setting(pid, cwd, ROOT, {"ATEN_CPU_CAPABILITY": "avx2"}) == (
            "runs its simulations with MKL_CBWR=, not with MKL_CBWR unset"
        )
        assert foreign_setting(
            pid, cwd, ROOT, {**same, "CUDA_VISIBLE_DEVICES": "1", "RAY_ADDRESS": "h:6379"}
        ) == (
            "runs its simulations on a local Ray, not on h:6379; "
            "runs its simulations with CUDA_VISIBLE_DEVICES unset, "
            "not with CUDA_VISIBLE_DEVICES=1"
        )


def test_an_idle_superlink_with_other_kernels_is_restarted(monkeypatch):
    """What the launcher does before it submits: an idle local SuperLink of this checkout
    started with another ``ATEN_CPU_CAPABILITY`` is stopped (a fresh one starts with the
    launcher's environment); one started with the launcher's own is kept. Stand-ins on an
    unused port."""
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "49191")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    args = [sys.executable, "-c", "import time; time.sleep(60)", "flower-superlink"]
    args += ["--simulation", "--port", "49191"]
    for theirs, stopped in (({"ATEN_CPU_CAPABILITY": "avx2"}, True), ({}, False)):
        link = subprocess.Popen(args, cwd=ROOT, env={**flwr_env(), **theirs})
        try:
            for _ in range(100):  # until it has exec'd and shows its own environment
                if b"flower-superlink" in Path(f"/proc/{link.pid}/cmdline").read_bytes():
                    break
                time.sleep(0.05)
            assert foreign_run_in_progress(flwr_env(), ROOT) is None  # it runs nothing
            stop_local_superlink(flwr_env(), unless_cwd=ROOT)
            if stopped:
                assert link.wait(timeout=10) == -15
            else:
                time.sleep(0.5)
                assert link.poll() is None
        finally:
            link.kill()
            link.wait()


def test_a_cluster_that_cannot_be_reached_stops_the_launch_before_flower(capsys, tmp_path):
    from fl_app.launch import main

    args = ["--experiment", "tiny", "--output-dir", str(tmp_path), "--ray-address", "127.0.0.1:1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: nothing answers at the Ray address 127.0.0.1:1" in err

"""End to end through Flower's real simulation (`flwr run`, Ray): the smoke experiment."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _smoke_run_interrupted_at_round_1(tmp_path, act):
    """Launch a 50-round smoke run, call ``act(proc)`` once round 1 is logged (training has
    started), then wait for the launcher; returns its exit code and its whole output."""
    cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", "smoke"]
    cmd += ["--output-dir", str(tmp_path), "--set", "num_rounds=50"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "round 1/50" in line:
            act(proc)
            break
    rest, _ = proc.communicate(timeout=120)
    return proc.returncode, "".join(lines) + rest


@pytest.mark.e2e
def test_flwr_run_smoke_experiment(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "fl_app.launch",
        "--experiment",
        "smoke",
        "--method",
        "fedavg",
        "--output-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "smoke" / "fedavg" / "seed0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    assert summary["final_accuracy"] > 0.5  # 10 classes: chance is 0.1
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["num_results"] == 3 for r in rounds[1:])
    assert (out / "config.yaml").is_file() and (out / "curves.png").is_file()


@pytest.mark.e2e
def test_failed_run_exits_non_zero(tmp_path):
    """A run whose ServerApp fails (here: federation smaller than the experiment) must not
    look successful, although `flwr run --stream` itself exits 0."""
    from fl_app.launch import build_command, flwr_env, run_status

    class A:
        experiment, method, seed, set, resume, fresh = "smoke", "fedavg", 0, "", False, False
        cpus_per_client, gpus_per_client, num_cpus, ray_address = 1, 0.0, 2, ""

    cmd = build_command(A, 2, str(tmp_path))  # 2 SuperNodes for a 3-client experiment
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=flwr_env()
    )
    text = proc.stdout + proc.stderr
    run_id = text.split("Successfully started run ")[1].split()[0]
    assert run_status(run_id, flwr_env()) == "finished:failed"
    assert "num-supernodes=3" in text


@pytest.mark.e2e
def test_bad_config_fails_before_flower_starts(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fl_app.launch",
            "--experiment",
            "smoke",
            "--set",
            "data.alpha=-1",
            "--output-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "'data.alpha' = -1 is out of range" in proc.stderr


@pytest.mark.e2e
def test_flwr_run_fedccl_prototypes_cross_the_wire(tmp_path):
    """Signals go client → server (payload of the fit reply) and server → client (payload of
    the next round's message), through Flower's real simulation."""
    cmd = [
        sys.executable,
        "-m",
        "fl_app.launch",
        "--experiment",
        "smoke",
        "--method",
        "fedccl",
        "--output-dir",
        str(tmp_path),
        "--set",
        "num_rounds=2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "smoke" / "fedccl" / "seed0"
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    r1, r2 = rounds[1], rounds[2]
    assert r1["num_local_signals"] >= 10 and r1["classes_with_signal"] == 10
    assert all(c["received_signals"] == 0 for c in r1["clients"].values())
    assert all(c["received_signals"] == r1["num_local_signals"] for c in r2["clients"].values())


@pytest.mark.e2e
def test_interrupted_launch_stops_its_run(tmp_path):
    """SIGTERM/Ctrl-C on the launcher stops the run in the SuperLink too (it would go on in
    the background otherwise) and exits 130."""
    import signal
    import time

    from fl_app.launch import (
        flwr_env,
        process_tree,
        processes,
        run_status,
        wait_for_exit,
    )
    from fl_app.rundir import run_dir_holder, wait_for_run_dir
    from fl_app.server_app import STOPPED_REASON

    out = tmp_path / "smoke" / "fedavg" / "seed0"
    run_tree: dict[int, str] = {}

    def interrupt(proc):
        holder = run_dir_holder(out)  # the ServerApp's process, Ray below it
        assert holder is not None
        run_tree.update(process_tree([holder], processes()))
        assert len(run_tree) > 3, run_tree
        proc.send_signal(signal.SIGTERM)

    code, text = _smoke_run_interrupted_at_round_1(tmp_path, interrupt)
    assert code == 130, text[-3000:]
    run_id = text.split("Successfully started run ")[1].split()[0]
    assert run_status(run_id, flwr_env()) == "finished:stopped"
    assert wait_for_exit(run_tree, timeout=0)  # Ray's agents too: nothing of the run is left
    # the launcher returned once the run had stopped: no round is added afterwards, and the
    # run's summary says what happened
    assert wait_for_run_dir(out, timeout=0)  # no ServerApp holds the directory any more
    rounds = (out / "rounds.jsonl").read_text()
    time.sleep(3)
    assert (out / "rounds.jsonl").read_text() == rounds
    summary = json.loads((out / "summary.json").read_text())
    # written by the ServerApp's own Flower exit handler (the launcher's fallback gives no
    # reason): the `flwr stop` the launcher sent ends the simulation without unwinding the
    # ServerApp's thread, as a `flwr stop` from another shell does under plain `flwr run`
    assert (summary["status"], summary.get("reason")) == ("interrupted", STOPPED_REASON), summary
    assert summary["rounds_completed"] == len(rounds.splitlines()) - 1  # round 0: initial eval


@pytest.mark.e2e
def test_fab_ships_the_app_only(tmp_path):
    """What `flwr run` ships (the FAB) holds code and presets, whatever results, benchmarks
    or tests the checkout holds: Flower refuses a FAB over 10 MB."""
    import re
    import shutil
    import zipfile

    (ROOT / "results").mkdir(exist_ok=True)  # a run's output inside the checkout
    app = ROOT
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,31}", ROOT.name):
        # `flwr build` (not `flwr run`) wants the folder named like an app: build a copy of
        # the checkout, results and benchmarks included, under a valid name
        app = tmp_path / "contrastive-fl"
        shutil.copytree(ROOT, app, ignore=shutil.ignore_patterns(".git", ".venv", ".flwr"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "flwr"), "build", "--app", str(app)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (fab,) = tmp_path.glob("*.fab")  # written to the working directory, tmp_path
    names = zipfile.ZipFile(fab).namelist()
    assert "conf/base.yaml" in names and "fl_app/server_app.py" in names
    assert "clients/base.py" in names and "strategies/base.py" in names
    assert "core/data.py" in names
    tops = {n.split("/")[0] for n in names if "/" in n}
    assert tops <= {"core", "fl_app", "clients", "strategies", "conf", ".info"}, tops
    assert fab.stat().st_size < 2 * 1024 * 1024


@pytest.mark.e2e
def test_clean_flwr_during_a_run_ends_it(tmp_path):
    """``make clean-flwr`` while ``make run`` trains: the run's processes (the ServerApp in
    ``flwr-simulation``, Ray) end with the SuperLink instead of training on in the
    background, and the launcher says so and exits 1 without starting a fresh SuperLink."""
    import time

    from fl_app.launch import (
        flwr_env,
        local_superlinks,
        orphaned_simulations,
        processes,
        stop_superlink_and_runs,
    )

    code, text = _smoke_run_interrupted_at_round_1(
        tmp_path,
        lambda proc: stop_superlink_and_runs(flwr_env()),  # `make clean-flwr`, one port
    )
    assert code == 1, text[-3000:]
    assert "ended with the local SuperLink" in text, text[-3000:]
    time.sleep(2)  # anything left would still be running
    env = flwr_env()
    assert not local_superlinks(env)  # none started again
    assert orphaned_simulations(env, processes()) == []  # no run left on its port
    out = tmp_path / "smoke" / "fedavg" / "seed0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary

"""The run directory (fl_app.rundir): its lock, the recorder that holds it while a run writes
it, what a resume may change and what a new run may replace."""

import json
import logging
import subprocess
import sys
import threading

import pytest
import yaml

from fl_app.config import ConfigError, load_config
from fl_app.rundir import (
    RunDirBusyError,
    RunRecorder,
    RunStoppedError,
    check_resume_config,
    lock_run_dir,
    record_interrupted,
    release_run_dir,
    run_dir_busy,
    run_dir_holder,
)


def _cfg(tmp_path, seed=0):
    return load_config("tiny", "fedavg", f"output_dir={tmp_path} seed={seed}")


def test_recorder_writes_rounds_and_summary(tmp_path):
    rec = RunRecorder(_cfg(tmp_path))
    rec.write_round({"round": 0, "accuracy": 0.1})
    rec.write_round({"round": 1, "accuracy": 0.5, "failures": []})
    summary = rec.finish()
    lines = (rec.dir / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1]
    assert json.loads((rec.dir / "summary.json").read_text()) == summary
    assert summary["status"] == "completed" and summary["final_accuracy"] == 0.5


def test_diagnostic_plots_are_written_when_their_values_were_recorded(tmp_path):
    """``update_deviation.png`` (Dev^t per round) and the per-client heatmaps appear when a
    round recorded them, and are not written for a run that recorded none."""
    cfg = load_config("tiny", "fedavg", f"output_dir={tmp_path} evaluation.plot=true")
    rec = RunRecorder(cfg)
    rec.write_round({"round": 0, "accuracy": 0.1})
    for t in (1, 2, 3):
        rec.write_round(
            {
                "round": t,
                "accuracy": 0.2 * t,
                "update_deviation": 0.5 / t,
                "aggregation_weights": {"0": 0.4, "2": 0.6},
                "cos_global_client": {"0": 0.9, "2": 0.8},
            }
        )
    rec.finish()
    names = ("curves", "update_deviation", "aggregation_weights", "cos_global")
    for name in names:
        png = rec.dir / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    bare = RunRecorder(
        load_config("tiny", "fedavg", f"output_dir={tmp_path / 'b'} evaluation.plot=true")
    )
    bare.write_round({"round": 1, "accuracy": 0.3})
    bare.finish()
    assert sorted(p.name for p in bare.dir.glob("*.png")) == ["curves.png"]


def test_finish_writes_once_and_a_finished_run_logs_no_more_rounds(tmp_path):
    """Flower's exit handler finishes a run from outside (``flwr stop``) while the
    ServerApp's thread goes on: the first finish writes the summary, a later one (the
    ServerApp's own) returns it unchanged, and the next round is refused before it is
    logged (so it is not checkpointed either), from this thread or another one."""
    rec = RunRecorder(_cfg(tmp_path))
    rec.write_round({"round": 0, "accuracy": 0.1})
    rec.write_round({"round": 1, "accuracy": 0.4})
    assert not rec.finished
    first = rec.finish(status="interrupted", reason="stopped from outside")
    assert rec.finished and not run_dir_busy(rec.dir)  # the directory is released
    assert rec.finish(status="failed", reason="a later error") is first
    summary = json.loads((rec.dir / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("interrupted", "stopped from outside")
    assert summary["rounds_completed"] == 1
    with pytest.raises(RunStoppedError, match="stopped from outside"):
        rec.write_round({"round": 2, "accuracy": 0.5})
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            rec.write_round({"round": 2, "accuracy": 0.5})
        except BaseException as err:  # the assertion below names it
            errors.append(err)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert [type(e) for e in errors] == [RunStoppedError]
    assert len((rec.dir / "rounds.jsonl").read_text().splitlines()) == 2


def test_record_interrupted_summarises_a_stopped_run_and_never_a_live_one(tmp_path):
    cfg = _cfg(tmp_path)
    rec = RunRecorder(cfg)
    for t in range(3):
        rec.write_round({"round": t, "accuracy": 0.1 * (t + 1)})
    assert record_interrupted(cfg, since=0.0) is False  # the run still holds its directory
    assert not (rec.dir / "summary.json").exists()
    release_run_dir(rec._lock)  # the ServerApp process is gone without finishing
    assert record_interrupted(cfg, since=0.0) is True
    summary = json.loads((rec.dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == 2
    assert summary["final_accuracy"] == pytest.approx(0.3)
    assert (
        summary["wall_seconds"]
        == json.loads((rec.dir / "rounds.jsonl").read_text().splitlines()[-1])["wall_seconds"]
    )
    assert record_interrupted(cfg, since=0.0) is False  # a summary newer than ``since`` stays


def test_record_interrupted_leaves_an_earlier_runs_results_alone(tmp_path):
    """Ctrl-C before this run's recorder started (Flower's start-up, node discovery): the
    directory still holds an earlier, finished run, whose summary must not change."""
    import time

    rec = RunRecorder(_cfg(tmp_path))
    rec.write_round({"round": 0, "accuracy": 0.1})
    rec.write_round({"round": 1, "accuracy": 0.5})
    rec.finish()
    before = (rec.dir / "summary.json").read_bytes()
    time.sleep(0.05)
    assert record_interrupted(_cfg(tmp_path), since=time.time()) is False
    assert (rec.dir / "summary.json").read_bytes() == before


def test_second_run_on_the_same_directory_fails_without_touching_it(tmp_path):
    first = RunRecorder(_cfg(tmp_path))
    first.write_round({"round": 0, "accuracy": 0.1})
    before = (first.dir / "rounds.jsonl").read_text()
    # another process (a second `flwr run` of the same experiment, method and seed)
    code = (
        "from fl_app.config import load_config; from fl_app.rundir import RunRecorder;"
        f"RunRecorder(load_config('tiny', 'fedavg', 'output_dir={tmp_path}'))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert other.returncode != 0
    assert "is being written by another run (pid" in other.stderr
    assert "another seed or output_dir" in other.stderr
    with pytest.raises(RunDirBusyError):  # a second recorder in this process too
        RunRecorder(_cfg(tmp_path))
    assert (first.dir / "rounds.jsonl").read_text() == before
    RunRecorder(_cfg(tmp_path, seed=1)).finish()  # another seed is another directory
    first.finish()
    RunRecorder(_cfg(tmp_path), resume=True).finish()  # released once finished


def test_lock_goes_with_a_crashed_process(tmp_path):
    code = (
        "import os; from fl_app.config import load_config; from fl_app.rundir import "
        f"RunRecorder; RunRecorder(load_config('tiny', 'fedavg', 'output_dir={tmp_path}'));"
        "os._exit(3)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    RunRecorder(_cfg(tmp_path), resume=True).finish()


def test_check_resume_config(tmp_path, caplog):
    saved = _cfg(tmp_path)
    check_resume_config(saved, _cfg(tmp_path), 2, tmp_path)
    ok = load_config("tiny", "fedavg", f"output_dir={tmp_path} num_rounds=9 client.num_threads=4")
    check_resume_config(saved, ok, 2, tmp_path)
    bad = load_config("tiny", "fedavg", f"output_dir={tmp_path} client.lr=0.5 data.alpha=5.0")
    with pytest.raises(ConfigError) as err:
        check_resume_config(saved, bad, 2, tmp_path)
    msg = str(err.value)
    assert f"client.lr: {saved['client']['lr']} -> 0.5" in msg
    assert f"data.alpha: {saved['data']['alpha']} -> 5.0" in msg
    assert "OUTPUT_DIR" in msg and "FRESH=1" in msg and "SET" in msg
    with pytest.raises(ConfigError, match=r"num_rounds: 1 is below the checkpoint's round 2"):
        check_resume_config(saved, load_config("tiny", "fedavg", "num_rounds=1"), 2, tmp_path)
    # a key the code added since the checkpoint: a warning, not a refusal
    older = {k: v for k, v in saved.items() if k != "num_clients"}
    logger = logging.getLogger("fl_app")
    logger.addHandler(caplog.handler)
    try:
        check_resume_config(older, _cfg(tmp_path), 2, tmp_path)
    finally:
        logger.removeHandler(caplog.handler)
    assert "num_clients: (absent) -> " in caplog.text


def test_new_run_over_old_results_warns_and_replaces_them(tmp_path, caplog):
    first = RunRecorder(_cfg(tmp_path))
    first.write_round({"round": 0, "accuracy": 0.1})
    first.write_round({"round": 1, "accuracy": 0.5, "failures": []})
    first.finish(status="failed")
    (first.dir / "cos_global.png").write_bytes(b"a plot of the first run's rounds")
    logger = logging.getLogger("fl_app")
    logger.addHandler(caplog.handler)
    try:
        second = RunRecorder(_cfg(tmp_path))
    finally:
        logger.removeHandler(caplog.handler)
    assert not (first.dir / "cos_global.png").exists()  # no plot of the replaced run stays
    second.finish()
    assert str(first.dir) in caplog.text and "status failed, 1 round(s) completed" in caplog.text
    assert (first.dir / "rounds.jsonl").read_text() == ""


def test_refused_check_leaves_the_directory_and_releases_the_lock(tmp_path):
    first = RunRecorder(_cfg(tmp_path))
    first.write_round({"round": 0, "accuracy": 0.1})
    first.finish()
    files = {p.name: p.read_bytes() for p in first.dir.iterdir() if p.name != "run.lock"}

    def refuse(path):
        raise ConfigError(f"no resume of {path}")

    with pytest.raises(ConfigError, match="no resume of"):
        RunRecorder(_cfg(tmp_path), resume=True, check=refuse)
    assert {p.name: p.read_bytes() for p in first.dir.iterdir() if p.name != "run.lock"} == files
    RunRecorder(_cfg(tmp_path), resume=True).finish()  # the lock was released


def test_a_strategy_can_fix_keys_a_resume_may_otherwise_change(tmp_path):
    """PMFL's ψ schedule runs over num_rounds: a resume with another num_rounds would train
    the remaining rounds with another schedule."""
    saved = load_config("tiny", "pmfl", f"output_dir={tmp_path}")
    longer = load_config("tiny", "pmfl", f"output_dir={tmp_path} num_rounds=9")
    check_resume_config(saved, longer, 2, tmp_path)  # in general num_rounds may change
    with pytest.raises(ConfigError, match=r"num_rounds: 2 -> 9") as err:
        check_resume_config(saved, longer, 2, tmp_path, fixed=frozenset({"num_rounds"}))
    assert "num_rounds," not in str(err.value).split("may change only")[1]


def test_run_dir_holder_is_the_locking_process_on_this_host(tmp_path):
    """The launcher finds a run's ServerApp process (and Ray below it) from the lock line."""
    import os

    assert run_dir_holder(tmp_path) is None  # no lock file
    lock = lock_run_dir(tmp_path)
    assert run_dir_holder(tmp_path) == os.getpid()
    release_run_dir(lock)
    assert run_dir_holder(tmp_path) is None  # the line is cleared
    (tmp_path / "run.lock").write_text("pid 123 on another-host, since Thu Nov 26\n")
    assert run_dir_holder(tmp_path) is None  # not a process of this machine


def test_a_stop_inside_finish_still_leaves_the_summary(tmp_path, monkeypatch):
    """A signal in the thread that is finishing the run (deployment: the ServerApp runs in
    the main thread, where Flower's handler runs too): the handler's own finish returns at
    once, and the stop cut the first write short; the summary is written still, with the
    status the run had, and the directory is released."""
    import fl_app.rundir as rundir

    rec = RunRecorder(_cfg(tmp_path))
    rec.write_round({"round": 0, "accuracy": 0.1})
    rec.write_round({"round": 1, "accuracy": 0.4})
    real, statuses, nested = rundir.write_summary, [], []

    def stopped_once(*args, **kwargs):
        statuses.append(args[3])
        if len(statuses) == 1:  # Flower's handler, then the stop it raises
            nested.append(rec.finish(status="interrupted", reason="flwr stop"))
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(rundir, "write_summary", stopped_once)
    with pytest.raises(KeyboardInterrupt):
        rec.finish()
    assert nested == [{}] and statuses == ["completed", "completed"]
    summary = json.loads((rec.dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 1
    assert rec.finish(status="failed") == summary and not run_dir_busy(rec.dir)


def test_replaced_settings_count_what_a_run_trained_not_how_it_ran(tmp_path):
    """A completed run is replaced by its repeat (no settings named), also one that reads
    the same data from elsewhere or runs with other threads, device, graphs, timeouts,
    checkpoints or plots; another SET is named; an unfinished run, or a key the code added
    since (absent from the saved config), is not this function's concern."""
    from fl_app.rundir import replaced_settings

    cfg = load_config("smoke", "fedavg", f"output_dir={tmp_path}")  # reads files
    rec = RunRecorder(cfg)
    for rnd in range(cfg["num_rounds"] + 1):
        rec.write_round({"round": rnd, "accuracy": 0.5})
    rec.finish(plots=False)

    def changed(overrides):
        return replaced_settings(
            rec.dir, load_config("smoke", "fedavg", f"output_dir={tmp_path} {overrides}")
        )

    assert changed("") == []
    how = (
        "data.root=/elsewhere data.download=true client.num_threads=2 client.device=cpu "
        "client.cuda_graph=false server.round_timeout=5 server.wait_for_nodes=5 "
        "server.checkpoint_every=3 evaluation.plot=true"
    )
    assert changed(how) == []
    assert changed("client.lr=0.2 num_rounds=9") == [
        f"num_rounds: {cfg['num_rounds']} -> 9",
        f"client.lr: {cfg['client']['lr']} -> 0.2",
    ]
    saved = yaml.safe_load((rec.dir / "config.yaml").read_text())
    del saved["client"]["lr"]  # written by a version of the code without that key
    (rec.dir / "config.yaml").write_text(yaml.safe_dump(saved))
    assert changed("client.lr=0.2") == []
    summary = json.loads((rec.dir / "summary.json").read_text())
    (rec.dir / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    assert changed("client.lr=0.2 num_rounds=9") == []

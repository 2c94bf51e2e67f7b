"""The run directory (fl_app.rundir): its lock, the recorder that holds it while a run writes
it, what a resume may change and what a new run may replace."""

import json
import logging
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import yaml

from core.params import ConfigError
from fl_app.config import load_config
from fl_app.rundir import (
    Action,
    CheckpointFiles,
    Decision,
    RunDirBusyError,
    RunDirState,
    RunRecorder,
    RunStoppedError,
    Stage,
    check_resume_config,
    decide,
    guard_run_dir,
    lock_run_dir,
    record_interrupted,
    release_run_dir,
    resume_advice,
    run_dir_busy,
    run_dir_holder,
    survey,
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


def test_check_resume_config(tmp_path):
    """The refusal names every changed key; a key the code added or removed since is not
    refused but returned for a warning (logged by the caller: test_the_decision_table)."""
    saved = _cfg(tmp_path)
    assert check_resume_config(saved, _cfg(tmp_path), 2, tmp_path) == (None, [])
    ok = load_config("tiny", "fedavg", f"output_dir={tmp_path} num_rounds=9 client.num_threads=4")
    assert check_resume_config(saved, ok, 2, tmp_path) == (None, [])
    bad = load_config("tiny", "fedavg", f"output_dir={tmp_path} client.lr=0.5 data.alpha=5.0")
    msg, _ = check_resume_config(saved, bad, 2, tmp_path)
    assert msg is not None
    assert f"client.lr: {saved['client']['lr']} -> 0.5" in msg
    assert f"data.alpha: {saved['data']['alpha']} -> 5.0" in msg
    assert "OUTPUT_DIR" in msg and "FRESH=1" in msg and "SET" in msg
    fewer = load_config("tiny", "fedavg", "num_rounds=1")
    msg, _ = check_resume_config(saved, fewer, 2, tmp_path)
    assert re.search(r"num_rounds: 1 is below the checkpoint's round 2", msg or "")
    # a key the code added since the checkpoint: a warning, not a refusal
    older = {k: v for k, v in saved.items() if k != "num_clients"}
    msg, added_or_removed = check_resume_config(older, _cfg(tmp_path), 2, tmp_path)
    assert msg is None
    assert [k for k in added_or_removed if k.startswith("num_clients: (absent) -> ")]


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
    assert check_resume_config(saved, longer, 2, tmp_path)[0] is None  # in general it may
    msg, _ = check_resume_config(saved, longer, 2, tmp_path, fixed=frozenset({"num_rounds"}))
    assert re.search(r"num_rounds: 2 -> 9", msg or "")
    assert msg is not None and "num_rounds," not in msg.split("may change only")[1]


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
    since (absent from the saved config), is not this check's concern."""
    cfg = load_config("smoke", "fedavg", f"output_dir={tmp_path}")  # reads files
    rec = RunRecorder(cfg)
    for rnd in range(cfg["num_rounds"] + 1):
        rec.write_round({"round": rnd, "accuracy": 0.5})
    rec.finish(plots=False)

    def changed(overrides):
        other = load_config("smoke", "fedavg", f"output_dir={tmp_path} {overrides}")
        return survey(other, rec.dir, Stage.EARLY).other_settings(other)

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


def _unfinished(cfg, run):
    """The unfinished run that ``run`` holds, described (None: none)."""
    return survey(cfg, run, Stage.HELD).unfinished


def _replace(cfg, run, stage=Stage.EARLY):
    """The ServerApp's guard for a run of ``cfg`` without resume or fresh in ``run``."""
    return guard_run_dir(cfg, run, resume=False, fresh=False, stage=stage)


def test_the_guard_knows_finished_damaged_live_and_changed_unfinished_runs(run_in_process):
    """The cases around an unfinished run: a "completed" summary older than the checkpoint
    (a resume with more rounds, killed hard) is unfinished; a damaged checkpoint cannot be
    resumed, so nothing is kept for it; a live run is named as such, except by the run that
    holds the lock itself; with changed settings the advice is not to resume."""
    import yaml

    run = run_in_process("fedavg", set_="num_rounds=2", seed=5)["dir"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert _unfinished(cfg, run) is None  # completed through its checkpoint's round 2
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "rounds_completed": 1}))
    assert "checkpoint at round 2" in _unfinished(cfg, run)  # completed 1, checkpoint 2
    with pytest.raises(ConfigError, match="continues it; fresh=true"):
        _replace(cfg, run)
    lock = lock_run_dir(run)
    try:
        with pytest.raises(RunDirBusyError, match="being written by another run"):
            _replace(cfg, run)
        with pytest.raises(ConfigError, match="continues it"):
            _replace(cfg, run, Stage.HELD)  # the recorder's check, under its lock
    finally:
        release_run_dir(lock)
    changed = {**cfg, "client": {**cfg["client"], "lr": 0.5}}
    refused = r"(?s)cannot be resumed with this run's settings.*client.lr: 0.05 -> 0.5"
    with pytest.raises(ConfigError, match=refused):
        _replace(changed, run)
    npz = (run / "checkpoint.npz").read_bytes()
    for damaged in (b"", npz[: len(npz) // 2]):  # empty, cut off
        (run / "checkpoint.npz").write_bytes(damaged)
        with pytest.raises(ConfigError, match="the checkpoint in .* cannot be read"):
            CheckpointFiles(run).header()
        assert _unfinished(cfg, run) is None
    res = run_in_process("fedavg", set_="num_rounds=2", seed=5)  # replaces it, no traceback
    assert res["summary"]["status"] == "completed"


def test_after_a_stop_the_advice_is_to_resume_only_when_there_is_a_checkpoint(run_in_process):
    import time

    done = run_in_process("fedavg", set_="num_rounds=2", seed=8)
    # a launch stopped before its recorder started: the checkpoint is an earlier run's
    later = resume_advice(done["dir"], since=time.time() + 1)
    assert "stopped before training" in later and "is as it was" in later
    assert "--resume (make run ... RESUME=1) continues from its last checkpoint (round 2; " in (
        resume_advice(done["dir"])
    )
    assert "rounds.jsonl logs 2 round(s))" in resume_advice(done["dir"])
    fresh = resume_advice(done["dir"].parent / "seed9")
    assert "no checkpoint yet" in fresh and "(without --resume) starts it again" in fresh


def test_the_advice_after_a_stop_says_when_the_checkpoint_cannot_be_read(tmp_path):
    """Arrays of round 2 with the JSON of round 1 (a save cut between its two renames, then
    the temporary file lost): the launcher's advice says so (its refusal of the resume:
    tests/fl_app/test_launch.py)."""
    run = tmp_path / "tiny" / "fedavg" / "seed0"
    run.mkdir(parents=True)
    np.savez(run / "checkpoint.npz", round=np.int64(2))
    (run / "checkpoint.json").write_text('{"round": 1, "keys": []}')
    assert "its checkpoint cannot be read" in resume_advice(run)


def _checkpoint_of(tmp_path, rnd):
    from flwr.app import Array, ArrayRecord

    from fl_app.server_app import Checkpoint

    ckpt = Checkpoint(tmp_path)
    w = np.full(3, float(rnd), np.float32)
    ckpt.save(rnd, ArrayRecord({"w": Array(w)}), {"strategy": {"m": w * 2}, "n": rnd})
    return ckpt


def test_a_checkpoint_save_stopped_between_its_two_renames_is_completed(tmp_path):
    """The arrays of round 2 renamed into place, the JSON still round 1's (a stop between
    the renames): the next read completes round 2 from the temporary JSON, instead of
    resuming round 2's model with round 1's round number and strategy state."""
    _checkpoint_of(tmp_path, 1)
    round1_json = (tmp_path / "checkpoint.json").read_text()
    ckpt = _checkpoint_of(tmp_path, 2)
    (tmp_path / "checkpoint.json").replace(tmp_path / "checkpoint.tmp")
    (tmp_path / "checkpoint.json").write_text(round1_json)

    assert ckpt.header()[0] == 2
    assert (tmp_path / "checkpoint.tmp").exists()  # a check changes nothing: a writer may be
    # between its renames; the run that holds the directory completes the save
    rnd, arrays, state = ckpt.load()
    assert (rnd, state["n"]) == (2, 2)
    np.testing.assert_array_equal(arrays["w"].numpy(), [2, 2, 2])
    np.testing.assert_array_equal(state["strategy"]["m"], [4, 4, 4])
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_a_checkpoint_save_stopped_before_its_renames_leaves_the_previous_one(tmp_path):
    ckpt = _checkpoint_of(tmp_path, 1)
    (tmp_path / "checkpoint.tmp").write_text('{"round": 2, "ke')  # stopped while writing
    assert ckpt.load()[0] == 1
    (tmp_path / "checkpoint.tmp").write_text(json.dumps({"round": 2, "keys": ["w"]}))
    (tmp_path / "checkpoint.tmp.npz").write_bytes(b"model-sized")
    assert ckpt.load()[0] == 1  # written, but the arrays were not renamed after it
    ckpt.remove()
    assert not list(tmp_path.iterdir())


def test_checkpoint_files_of_different_rounds_are_refused(tmp_path):
    _checkpoint_of(tmp_path, 1)
    round1_json = (tmp_path / "checkpoint.json").read_text()
    ckpt = _checkpoint_of(tmp_path, 2)
    (tmp_path / "checkpoint.json").write_text(round1_json)
    with pytest.raises(ConfigError, match="holds round 2 but .*round 1.*without resume"):
        ckpt.load()


COMPLETED = "status completed, 2 round(s) completed"
STOPPED = "status interrupted, 2 round(s) completed"


def _configs(tmp_path):
    """The run's settings (``same``: those of the runs in the table, ``more``: 3 rounds
    instead of 2, ``lr``: another learning rate) and the settings an earlier run saved."""
    same = load_config("tiny", "fedavg", f"output_dir={tmp_path}")
    return {
        "same": same,
        "more": {**same, "num_rounds": 3},
        "lr": {**same, "client": {**same["client"], "lr": 0.5}},
        "retired": {**same, "retired_option": 1},  # a key this code no longer has
    }


def _state(kind, tmp_path):
    """A run directory of the decision table, as :func:`survey` would read it."""
    path = tmp_path / "tiny" / "fedavg" / "seed0"
    c = _configs(tmp_path)
    unreadable = ConfigError(f"the checkpoint in {path} cannot be read (EOFError: no data)")
    unreadable.__cause__ = EOFError("no data")
    states = {
        "empty": RunDirState(path),
        "elsewhere": RunDirState(path, resumable=("moon/seed1",)),  # another run has one
        "completed": RunDirState(path, 2, c["same"], None, c["same"], 2, COMPLETED),
        "completed-lr": RunDirState(path, 2, c["lr"], None, c["lr"], 2, COMPLETED),
        "unfinished": RunDirState(path, 2, c["same"], None, c["same"], None, STOPPED),
        "live": RunDirState(path, 2, c["same"], None, c["same"], None, STOPPED, busy=True),
        "pmfl-like": RunDirState(
            path, 2, c["same"], earlier=STOPPED, fixed=frozenset({"num_rounds"})
        ),
        "unreadable": RunDirState(path, checkpoint_error=unreadable),
        "no-config": RunDirState(path, 2, earlier=STOPPED),
        "config-yaml": RunDirState(path, 2, None, None, c["same"], None, STOPPED),
        "retired": RunDirState(path, 2, c["retired"], None, c["retired"], None, STOPPED),
    }
    return states[kind]


L, E, H = Stage.LAUNCH, Stage.EARLY, Stage.HELD
R, F = "resume", "fresh"
NOTHING = "nothing to resume: {path} holds no checkpoint (no run of {experiment} has one); "
UNFINISHED = (
    "{path} holds an unfinished run (status interrupted, 2 round(s) completed, checkpoint at "
    "round 2): run config resume=true (make run: RESUME=1; deploy/run.sh: --resume) continues "
    "it; fresh=true (make run: FRESH=1; deploy/run.sh: --fresh) starts it over and replaces it"
)
BOTH_AT_LAUNCH = "--resume and --fresh (RESUME=1 FRESH=1): choose one"
BOTH = "run config resume=true and fresh=true: choose one"
TABLE = [  # directory, flags, stage, this run's settings, action, in its message
    ("empty", "", E, "same", Action.START, ""),
    ("empty", F, L, "same", Action.START, ""),
    ("empty", R, E, "same", Action.START, ""),  # plain flwr run: from round 1, with a warning
    ("empty", R, L, "same", Action.REFUSE, NOTHING),
    ("elsewhere", R, L, "same", Action.REFUSE, "with one: moon/seed1); check METHOD, SEED"),
    ("empty", R + F, L, "same", Action.REFUSE, BOTH_AT_LAUNCH),
    ("completed", R + F, E, "same", Action.REFUSE, BOTH),
    ("completed", "", L, "same", Action.REPLACE, ""),  # a repeat
    ("completed", F, E, "same", Action.REPLACE, ""),
    ("completed", R, L, "same", Action.REFUSE, "all its 2 rounds (this run's num_rounds is 2)"),
    ("completed", R, E, "same", Action.RESUME, ""),  # the ServerApp's own check lets it be
    ("completed", R, L, "more", Action.RESUME, ""),
    ("completed", "", E, "more", Action.REFUSE, "(num_rounds: 2 -> 3), which a run without fresh"),
    ("completed", "", L, "more", Action.REFUSE, "RESUME=1) continues it to round 3"),
    ("completed-lr", "", E, "same", Action.REFUSE, "other settings (client.lr: 0.5 -> 0.05)"),
    ("completed-lr", F, L, "same", Action.REPLACE, ""),
    ("unfinished", "", E, "same", Action.REFUSE, UNFINISHED),
    ("unfinished", "", H, "same", Action.REFUSE, UNFINISHED),
    ("unfinished", "", L, "lr", Action.REFUSE, "cannot be resumed with this run's settings: "),
    ("unfinished", R, L, "same", Action.RESUME, ""),
    ("unfinished", R, H, "more", Action.RESUME, ""),
    ("unfinished", R, E, "lr", Action.REFUSE, "client.lr: 0.05 -> 0.5"),
    ("unfinished", F, E, "lr", Action.REPLACE, ""),
    ("live", "", L, "same", Action.BUSY, "{path} is being written by another run: wait for it"),
    ("live", "", E, "same", Action.BUSY, "or give this run another seed or output_dir"),
    ("live", "", H, "same", Action.REFUSE, UNFINISHED),  # the live run is this one
    ("live", F, E, "same", Action.REPLACE, ""),  # the lock refuses it: not this decision
    ("pmfl-like", R, E, "more", Action.REFUSE, "num_rounds: 2 -> 3"),
    ("unreadable", "", E, "same", Action.START, ""),  # nothing to resume, nothing to lose
    ("unreadable", R, E, "same", Action.REFUSE, "the checkpoint in {path} cannot be read (EOF"),
    ("unreadable", R, L, "same", Action.REFUSE, "{path}: the checkpoint cannot be read (no data)"),
    ("no-config", R, H, "lr", Action.RESUME, ""),  # nothing to compare with: a warning
    ("config-yaml", R, H, "lr", Action.REFUSE, "client.lr: 0.05 -> 0.5"),
    ("retired", R, H, "same", Action.RESUME, ""),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "flags", "stage", "settings", "action", "message"), TABLE)
def test_the_decision_table(tmp_path, kind, flags, stage, settings, action, message):
    """Every outcome of what a run may do to its directory, decided from what it holds and
    the user's flags alone, as the launcher and the ServerApp ask (same messages)."""
    state = _state(kind, tmp_path)
    cfg = _configs(tmp_path)[settings]
    decision = decide(state, cfg, resume=R in flags, fresh=F in flags, stage=stage)
    assert decision.action is action, decision
    expected = message.format(path=state.path, experiment=state.path.parent.parent)
    assert expected in decision.message and bool(decision.message) is bool(message)


def test_the_decision_says_what_a_run_replaces_and_what_to_log(tmp_path):
    """A replacement names the earlier run and, with fresh=true, the settings in which it
    differs; a resume's warnings are notes for the caller to log, except early in the
    ServerApp (the recorder asks again); the error behind a refusal is kept."""
    c = _configs(tmp_path)
    fresh = decide(_state("completed-lr", tmp_path), c["same"], resume=False, fresh=True, stage=L)
    assert fresh == Decision(
        Action.REPLACE, earlier=COMPLETED, replaced=("client.lr: 0.5 -> 0.05",)
    )
    again = decide(_state("completed", tmp_path), c["same"], resume=False, fresh=False, stage=L)
    assert again == Decision(Action.REPLACE, earlier=COMPLETED)

    def notes(kind, stage):
        state = _state(kind, tmp_path)
        return decide(state, c["same"], resume=True, fresh=False, stage=stage).notes

    path = _state("empty", tmp_path).path
    assert notes("no-config", H) == (
        (
            logging.WARNING,
            f"the checkpoint in {path} has no saved config and there is no config.yaml: "
            "cannot check that this run's config matches the one it resumes",
        ),
    )
    assert notes("config-yaml", L) == (
        (logging.INFO, f"the checkpoint in {path} has no saved config: comparing with config.yaml"),
    )
    retired = (
        logging.WARNING,
        f"resuming {path}: config keys added or removed since its checkpoint (taken as not "
        "changing what was trained): retired_option: 1 -> (absent)",
    )
    assert notes("retired", H) == notes("retired", L) == (retired,)
    assert notes("retired", E) == notes("no-config", E) == ()
    refused = decide(_state("unreadable", tmp_path), c["same"], resume=True, fresh=False, stage=E)
    assert isinstance(refused.cause, EOFError)


def test_survey_reads_what_the_decision_needs(tmp_path, run_in_process):
    """From a real run directory: its checkpoint, configs, completion and results; whether
    a live run holds it only where it is unfinished and not asked by that run itself; the
    experiment's runs with a checkpoint only for the launcher."""
    run = run_in_process("fedavg", set_="num_rounds=2", seed=4)["dir"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    state = survey(cfg, run, Stage.LAUNCH)
    assert (state.checkpoint, state.completed, state.earlier) == (2, 2, COMPLETED)
    assert state.checkpoint_config == state.config_yaml == cfg and state.unfinished is None
    assert state.resumable == () and not state.busy  # it has a checkpoint; it is completed
    elsewhere = survey(cfg, run.parent / "seed9", Stage.LAUNCH)
    assert elsewhere.resumable == ("fedavg/seed4",) and elsewhere.earlier is None
    assert survey(cfg, run.parent / "seed9", Stage.EARLY).resumable == ()
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    lock = lock_run_dir(run)
    try:
        assert survey(cfg, run, Stage.EARLY).busy
        assert not survey(cfg, run, Stage.HELD).busy  # the run that holds it asks
    finally:
        release_run_dir(lock)
    assert not survey(cfg, run, Stage.EARLY).busy

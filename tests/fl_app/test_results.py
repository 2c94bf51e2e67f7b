import json
import subprocess
import sys

import pytest

from fl_app.config import load_config
from fl_app.results import RunDirBusyError, RunRecorder, ema, summarize


def _cfg(tmp_path, seed=0):
    return load_config("tiny", "fedavg", f"output_dir={tmp_path} seed={seed}")


def test_ema_and_summary_by_hand(tmp_path):
    assert ema([1.0, 0.0, 1.0]) == pytest.approx(0.9 * (0.9 * 1.0) + 0.1)
    accs = [0.1, 0.5, 0.3, 0.6, 0.2, 0.4, 0.7]
    recs = [{"round": 0, "accuracy": 0.05}]
    recs += [{"round": i + 1, "accuracy": a, "failures": []} for i, a in enumerate(accs)]
    recs[2]["failures"] = [{"kind": "rejected"}, {"kind": "missing"}, {"kind": "error"}]
    s = summarize(recs, _cfg(tmp_path))
    assert s["rounds_completed"] == 7 and s["final_accuracy"] == 0.7
    assert s["best_accuracy"] == 0.7
    assert s["last5_accuracy"] == pytest.approx((0.3 + 0.6 + 0.2 + 0.4 + 0.7) / 5)
    assert s["top5_accuracy"] == pytest.approx((0.7 + 0.6 + 0.5 + 0.4 + 0.3) / 5)
    assert s["dropped_results"] == 1 and s["failed_results"] == 2


def test_recorder_writes_rounds_and_summary(tmp_path):
    rec = RunRecorder(_cfg(tmp_path))
    rec.write_round({"round": 0, "accuracy": 0.1})
    rec.write_round({"round": 1, "accuracy": 0.5, "failures": []})
    summary = rec.finish()
    lines = (rec.dir / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1]
    assert json.loads((rec.dir / "summary.json").read_text()) == summary
    assert summary["status"] == "completed" and summary["final_accuracy"] == 0.5


def test_second_run_on_the_same_directory_fails_without_touching_it(tmp_path):
    first = RunRecorder(_cfg(tmp_path))
    first.write_round({"round": 0, "accuracy": 0.1})
    before = (first.dir / "rounds.jsonl").read_text()
    # another process (a second `flwr run` of the same experiment, method and seed)
    code = (
        "from fl_app.config import load_config; from fl_app.results import RunRecorder;"
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
        "import os; from fl_app.config import load_config; from fl_app.results import "
        f"RunRecorder; RunRecorder(load_config('tiny', 'fedavg', 'output_dir={tmp_path}'));"
        "os._exit(3)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    RunRecorder(_cfg(tmp_path), resume=True).finish()

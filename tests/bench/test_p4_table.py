"""bench/p4_table.py: the early-rounds measure, the target's checks, and the committed P4
table rebuilt from the committed copies of its runs, byte for byte."""

import json

import light
import p4_table
import pytest

from fl_app.results import read_round_log
from tests.bench.conftest import RESULTS, linked_runs


def test_early_mean_averages_the_evaluations_up_to_the_cut_off_without_round_0():
    curve = [(0, 0.1), (5, 0.4), (50, 0.6), (55, 0.9)]
    assert p4_table.early_mean(curve, until=50) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no evaluation in rounds 1..3"):
        p4_table.early_mean(curve, until=3)


def _row(ema: float, early: float) -> dict:
    return {"ema": {"median": ema}, "early": {"median": early}}


def test_targets_check_the_protocols_ordering_on_the_medians():
    table = {
        "fedrcl": _row(80.0, 70.0),
        "moon": _row(79.0, 0.0),
        "fedavg": _row(79.0, 0.0),
        "fedscl": _row(0.0, 69.0),
    }
    assert [holds for _, holds in p4_table.targets(table)] == [True, True, True]
    table["moon"] = _row(80.0, 0.0)  # a tie is not "FedRCL > MOON", and is "MOON ≥ FedAvg"
    table["fedscl"] = _row(0.0, 70.0)
    assert [holds for _, holds in p4_table.targets(table)] == [False, True, False]
    del table["fedavg"]
    assert [holds for _, holds in p4_table.targets(table)] == [False, None, False]
    assert "MOON ≥ FedAvg (EMA): not run" in p4_table.markdown(
        {
            m: {
                **r,
                "seeds": [0],
                "final_mean": 1.0,
                "final_rank_mean": None,
                "ema": {**r["ema"], "mean": 1.0, "std": 0.0, "per_seed": [1.0]},
            }
            for m, r in table.items()
        }
    )


@pytest.mark.parametrize("name", ["p4", "p4_alpha005"])
def test_committed_p4_table_is_rebuilt_from_its_runs(rebuild, tmp_path, name):
    err, out = rebuild(p4_table, "--runs", linked_runs(tmp_path, "p4", name), "--name", name)
    assert err is None
    for table in (f"{name}.md", f"{name}.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table
    assert (out / f"{name}_curves.png").stat().st_size > 0


def test_light_runs_give_the_same_table(rebuild, tmp_path):
    """P4's runs (300 rounds, thinned after round 100 in the light form) give the committed
    table: EMA and final accuracy from the summaries, the early rounds (all kept) and the
    final effective rank (kept) from the light curves."""
    assert p4_table.EARLY <= light.EVERY_ROUND_UNTIL  # every early evaluation is kept
    runs = linked_runs(tmp_path, "p4", "p4", light=True)
    err, out = rebuild(p4_table, "--runs", runs, "--name", "p4")
    assert err is None
    for table in ("p4.md", "p4.json"):
        assert (out / table).read_text() == (RESULTS / table).read_text(), table
    assert not list((out / "p4").rglob("rounds.jsonl*"))


def test_no_finished_runs_is_a_message_not_a_table(rebuild, tmp_path):
    err, out = rebuild(p4_table, "--runs", tmp_path / "nothing")
    assert err is not None and "no finished P4 runs" in err
    assert list(out.iterdir()) == []


def _fake_runs(tmp_path, rounds: dict[str, int]):
    """Copies of committed seed-0 runs, cut to ``rounds[method]`` rounds."""
    base = tmp_path / "runs" / "p4"
    for method, n in rounds.items():
        src, dst = RESULTS / "p4" / method / "seed0", base / method / "seed0"
        dst.mkdir(parents=True)
        summary = json.loads((src / "summary.json").read_text())
        summary.update(num_rounds=n, rounds_completed=n)
        (dst / "summary.json").write_text(json.dumps(summary))
        log = read_round_log(src).decode()
        kept = [line for line in log.splitlines() if json.loads(line)["round"] <= n]
        (dst / "rounds.jsonl").write_text("\n".join(kept) + "\n")
    return tmp_path / "runs"


def test_runs_of_different_lengths_are_refused_before_anything_is_written(rebuild, tmp_path):
    err, out = rebuild(p4_table, "--runs", _fake_runs(tmp_path, {"fedavg": 300, "moon": 100}))
    assert err is not None and "differ in num_rounds ([100, 300])" in err
    assert list(out.iterdir()) == []


def test_short_runs_make_a_table_and_a_plot(rebuild, tmp_path):
    err, out = rebuild(p4_table, "--runs", _fake_runs(tmp_path, {"fedavg": 10, "fedrcl": 10}))
    assert err is None
    assert "| fedrcl | 1 |" in (out / "p4.md").read_text()
    assert (out / "p4_curves.png").stat().st_size > 0

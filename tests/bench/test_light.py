"""bench/light.py: the light form's sampling rule, its refusal of runs that did not complete,
its CLI, and reading a run in either form (the same records where the tables read them)."""

import json
import shutil
from pathlib import Path

import light
import pytest

from fl_app.results import curve, parse_rounds, read_round_log
from tests.bench.conftest import RESULTS

SMALL = RESULTS / "regimes" / "regime_moon" / "moon" / "seed0"  # 30 rounds, every one evaluated
LONG = RESULTS / "p3_psi" / "bernoulli" / "pmfl" / "seed0"  # 300 rounds, evaluated every 5


def _records(last: int, every: int = 1, **extra: float) -> list[dict]:
    """Round records of a run of ``last`` rounds evaluated every ``every``, with per-client
    records (which the light form drops) and ``extra`` figures on the evaluated rounds."""
    out: list[dict] = []
    for t in range(last + 1):
        rec: dict = {"round": t, "clients": {"0": {"num_examples": 5}}, "psi": 0.5}
        if t % every == 0 or t == last:
            rec.update(accuracy=t / 1000, loss=1 - t / 1000, **extra)
        out.append(rec)
    return out


def _run(path: Path, records: list[dict], status: str = "completed", done: int | None = None):
    """A run directory with ``records`` as its round log and a summary of ``status``."""
    last = max(r["round"] for r in records)
    path.mkdir(parents=True)
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"status": status, "num_rounds": last, "rounds_completed": last, "seed": 0}
    if done is not None:
        summary["rounds_completed"] = done
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "config.yaml").write_text("seed: 0\n")
    return path


def test_figures_keep_the_global_models_figures_only():
    rec = {"round": 3, "accuracy": 0.5, "loss": 1.0, "effective_rank": None, "clients": {}}
    assert light.figures({**rec, "psi": 0.1, "train": {"x": 1}}) == {
        "round": 3,
        "accuracy": 0.5,
        "loss": 1.0,
    }
    assert light.figures({"round": 4, "clients": {"0": {}}, "update_deviation": 2.0}) == {}


def test_a_100_round_run_keeps_every_evaluation():
    recs = [light.figures(r) for r in _records(100)]
    assert light.kept_rounds(recs) == set(range(101))


def test_a_long_run_keeps_the_start_every_10th_round_and_the_last_5_at_each_milestone():
    recs = [light.figures(r) for r in _records(1000)]
    kept = light.kept_rounds(recs)
    assert set(range(101)) <= kept
    assert {110, 120, 990} <= kept and 111 not in kept and 991 not in kept
    for milestone in (150, 500, 1000):  # the last five evaluations at or before it
        assert set(range(milestone - 4, milestone + 1)) <= kept
    assert 145 not in kept and 151 not in kept
    assert len(kept) == 101 + 90 + 18 * 4  # 0..100, 110..1000 by 10, 4 more at 150..1000


def test_every_figures_last_five_are_kept_even_when_evaluated_elsewhere():
    recs = [light.figures(r) for r in _records(1003)]
    for t in (993, 997, 1001):  # a figure evaluated on rounds of its own
        recs[t] = {**recs[t], "effective_rank": float(t)}
    kept = light.kept_rounds(recs)
    assert {993, 997, 1001} <= kept  # effective_rank's last five (it has three)
    assert set(range(999, 1004)) <= kept  # accuracy's last five at the last round


def test_light_curve_drops_what_it_does_not_keep_and_says_which_rounds():
    lc = light.light_curve(_records(300, every=5))
    kept = [r["round"] for r in lc["records"]]
    assert kept[:21] == list(range(0, 101, 5))
    assert 105 not in kept and 110 in kept and 130 in kept and 135 in kept  # window at 150
    assert set(lc["dropped_rounds"]) == set(range(0, 301, 5)) - set(kept)
    assert all(set(r) <= {"round", "accuracy", "loss"} for r in lc["records"])


def test_dropped_in_window_names_the_missing_evaluations():
    kept, dropped = [100, 110, 120, 130], [105, 115, 125]
    assert light.dropped_in_window(kept, dropped, 130) == [115, 125]
    assert light.dropped_in_window(kept, dropped, 104) == []  # 100 and before: none dropped
    assert light.dropped_in_window([0, 1, 2], [], 2) == []


def test_a_run_converts_and_reads_back_the_same_figures(tmp_path):
    light.write_light(LONG, tmp_path / "out")
    config = {"config.yaml"} if (LONG / "config.yaml").is_file() else set()
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"curve.json", "summary.json"} | config
    assert light.is_light(tmp_path / "out") and not light.is_light(LONG)
    full = parse_rounds(read_round_log(LONG))
    mine = light.read_records(tmp_path / "out")
    want = {r["round"]: light.figures(r) for r in full}
    assert all(r == want[r["round"]] for r in mine)  # the values themselves, unrounded
    assert curve(mine)[-5:] == curve(full)[-5:]
    assert light.dropped_rounds(tmp_path / "out") == frozenset(
        t for t, _ in curve(full) if t not in {r["round"] for r in mine}
    )
    assert light.dropped_rounds(LONG) == frozenset()
    again = tmp_path / "again"  # a light run copies as it is, byte for byte
    light.write_light(tmp_path / "out", again)
    assert (again / "curve.json").read_bytes() == (tmp_path / "out" / "curve.json").read_bytes()


def test_a_small_run_keeps_every_evaluated_round(tmp_path):
    light.write_light(SMALL, tmp_path / "out")
    full = parse_rounds(read_round_log(SMALL))
    assert light.read_records(tmp_path / "out") == [light.figures(r) for r in full]
    assert light.read_curve(tmp_path / "out")["dropped_rounds"] == []


@pytest.mark.parametrize(
    ("status", "done", "msg"),
    [
        ("interrupted", 7, "status 'interrupted', round 7 of 10"),
        ("completed", 7, "status 'completed', round 7 of 10"),
        ("failed", None, "status 'failed', round 10 of 10"),
    ],
)
def test_a_run_that_did_not_complete_is_refused_naming_its_summary(tmp_path, status, done, msg):
    run = _run(tmp_path / "p" / "m" / "seed0", _records(10), status, done)
    with pytest.raises(light.LightRunError, match="only a completed run") as err:
        light.write_light(run, tmp_path / "out")
    assert str(run / "summary.json") in str(err.value) and msg in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_files_are_named(tmp_path):
    run = tmp_path / "m" / "seed0"
    run.mkdir(parents=True)
    with pytest.raises(light.LightRunError, match=r"summary.json is missing"):
        light.make_light(run)
    short = _run(tmp_path / "s" / "seed0", _records(10))
    (short / "summary.json").write_text(
        json.dumps({"status": "completed", "num_rounds": 12, "rounds_completed": 12})
    )
    with pytest.raises(light.LightRunError, match=r"rounds.jsonl: ends at round 10, .* 12"):
        light.make_light(short)
    (short / "rounds.jsonl").unlink()
    with pytest.raises(light.LightRunError, match="no round log"):
        light.make_light(short)
    with pytest.raises(light.LightRunError, match="no round log .* and no curve.json"):
        light.read_records(short)
    (short / "curve.json").write_text("[1, 2]")
    with pytest.raises(light.LightRunError, match="curve.json: not a light run's curve"):
        light.read_records(short)


def test_full_records_refuse_a_light_run_saying_what_needs_the_round_log(tmp_path):
    light.write_light(SMALL, tmp_path / "out")
    with pytest.raises(light.LightRunError, match="light run .* the weights is only in the full"):
        light.full_records(tmp_path / "out", "the weights")
    assert light.full_records(SMALL, "the weights") == parse_rounds(read_round_log(SMALL))


def test_writing_over_a_committed_full_run_replaces_its_round_log(tmp_path):
    dest = tmp_path / "dest"
    shutil.copytree(SMALL, dest)
    light.write_light(_run(tmp_path / "new" / "seed0", _records(10)), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.yaml", "curve.json", "summary.json"]
    assert [r["round"] for r in light.read_records(dest)] == list(range(11))


def test_cli_converts_runs_a_tree_or_in_place_and_refuses_unfinished_runs(tmp_path, capsys):
    runs = tmp_path / "runs" / "p1"
    done = _run(runs / "fedavg" / "seed0", _records(10))
    late = _run(runs / "moon" / "seed1", _records(10), "interrupted", 4)
    assert light.main([str(done), "--out", str(tmp_path / "a")]) is None
    assert light.is_light(tmp_path / "a" / "fedavg" / "seed0")
    err = light.main([str(done), str(late), "--out", str(tmp_path / "b")])
    assert err is not None and str(late / "summary.json") in err and "nothing was written" in err
    assert not (tmp_path / "b").exists()
    assert light.main(["--tree", str(tmp_path / "runs"), "--out", str(tmp_path / "c")]) is None
    assert light.is_light(tmp_path / "c" / "p1" / "fedavg" / "seed0")
    assert not (tmp_path / "c" / "p1" / "moon").exists()
    assert f"left out: {late / 'summary.json'}" in capsys.readouterr().err
    assert light.main([str(done), "--in-place"]) is None
    assert light.is_light(done) and not (done / "rounds.jsonl").exists()
    assert "one of the two" in (light.main(["--out", str(tmp_path)]) or "")
    assert "--in-place" in (light.main([str(done)]) or "")


def test_lost_results_name_each_round_that_aggregated_without_some_clients(tmp_path):
    """A round's failures (missing past the timeout, client errors, rejected results) stay in
    the light form, counted by kind with their distinct reasons; a round without failures has
    no entry."""
    records = _records(4)
    records[2]["failures"] = [
        {"kind": "missing", "node_id": 1, "reason": "no reply before server.round_timeout"},
        {"kind": "missing", "node_id": 2, "reason": "no reply before server.round_timeout"},
        {"kind": "rejected", "node_id": 3, "reason": "update norm 9.1 above 5"},
    ]
    want = [
        {
            "round": records[2]["round"],
            "counts": {"missing": 2, "rejected": 1},
            "reasons": ["no reply before server.round_timeout", "update norm 9.1 above 5"],
        }
    ]
    assert light.lost_results(records) == want
    assert light.light_curve(records)["lost_results"] == want
    assert light.lost_results(_records(4)) == []
    run = _run(tmp_path / "p" / "m" / "seed0", records, "completed", None)
    light.write_light(run, tmp_path / "out")
    assert light.read_curve(tmp_path / "out")["lost_results"] == want


def test_a_relayed_client_error_keeps_the_clients_own_message_on_one_line():
    ray = (
        "code 2: <class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::"
        "ClientAppActor.run()\x1b[39m (pid=1, ip=192.0.2.2)\n  File x\nflwr.ClientAppException:"
        " \nException ClientAppException occurred. Message: client 86: non-finite loss in "
        "round 124; lower client.lr'>)"
    )
    assert light.short_reason(ray) == "client 86: non-finite loss in round 124; lower client.lr"
    assert light.short_reason("no reply before\n server.round_timeout") == (
        "no reply before server.round_timeout"
    )
    assert light.short_reason("x" * 300) == "x" * 199 + "…"

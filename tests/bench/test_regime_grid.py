"""bench/regime_grid.py: which runs of a declared grid it skips, continues or starts."""

import json

import regime_grid
import regimes

from fl_app.config import load_config
from fl_app.results import matched_baseline


def test_state_skips_completed_runs_and_starts_the_rest(tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text(
        json.dumps({"status": "completed", "rounds_completed": 3, "num_rounds": 3})
    )
    assert regime_grid.state(done) == "completed"
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "summary.json").write_text(
        json.dumps({"status": "interrupted", "rounds_completed": 1, "num_rounds": 3})
    )
    assert regime_grid.state(stopped) == "start"  # no checkpoint: nothing to continue
    assert regime_grid.state(tmp_path / "never") == "start"


def test_grids_pair_each_method_with_its_baseline_seed_by_seed(capsys, tmp_path, monkeypatch):
    grid = regime_grid.GRIDS["regimes_a"]
    assert grid[:2] == [("regime_moon", "moon", 0), ("regime_moon", "fedavg_head", 0)]
    for entries in regime_grid.GRIDS.values():
        assert len(set(entries)) == len(entries)
    monkeypatch.setattr(
        "sys.argv", ["regime_grid", "--out", str(tmp_path), "--grid", "regimes_a", "--dry-run"]
    )
    assert regime_grid.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "regime_moon moon seed0: start" and len(out) == len(grid)
    assert not (tmp_path / "logs").exists()


def _grid_methods() -> set[tuple[str, str]]:
    """Every (experiment, method) that some grid runs, whatever the seed."""
    return {(e, m) for entries in regime_grid.GRIDS.values() for e, m, _ in entries}


def test_every_grid_entry_is_a_valid_run_and_the_baselines_grid_is_matched_by_fedavg():
    for experiment, method in _grid_methods():
        load_config(experiment, method)  # raises ConfigError on a bad preset or key
    for experiment, method in {(e, m) for e, m, _ in regime_grid.GRIDS["regimes_baselines"]}:
        configs = {m: load_config(experiment, m) for m in (method, "fedavg")}
        assert matched_baseline(method, configs, "fedavg") == ("fedavg", []), (experiment, method)
    # FedRANE's code's FedProx mu; MOON contrasting h (no head) on FedRANE's ConvNet
    assert load_config("regime_fedrane", "fedprox")["client"]["mu"] == 0.0005
    assert load_config("regime_fedrane", "moon")["model"]["projection_dim"] == 0
    assert load_config("regime_moon", "moon")["model"]["projection_dim"] == 256


def test_every_grid_run_lands_in_a_row_of_the_regime_table():
    """A grid's run is committed by bench/regimes.py under its experiment's protocol and shown
    as a row of it (or as a row's matched FedAvg); P1's fedavg_head goes to P1's table."""
    protocols = {p.experiment: p for p in regimes.PROTOCOLS}
    for experiment, method in _grid_methods():
        if experiment == "p1":
            continue
        p = protocols[experiment]
        assert method in p.rows or method in ("fedavg", "fedavg_head"), (experiment, method)
        assert any(d.startswith("regimes/") for d in p.runs)

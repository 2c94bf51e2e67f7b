"""bench/regime_grid.py: which runs of a declared grid it skips, continues or starts."""

import itertools
import json
import os
import subprocess

import pytest
import regime_grid
import regimes

from core.params import ConfigError
from fl_app.config import load_config
from fl_app.results import matched_baseline


def _completed(run, rounds=3):
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        json.dumps({"status": "completed", "rounds_completed": rounds, "num_rounds": rounds})
    )


def test_state_skips_completed_runs_and_starts_the_rest(tmp_path):
    _completed(tmp_path / "done")
    assert regime_grid.state(tmp_path / "done") == "completed"
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


def test_the_issue46_queue_is_its_declared_grids_each_run_once_at_a_pinned_commit():
    queue = regime_grid.QUEUES["issue46"]
    runs = [(e, m, s) for e, m, s, _ in queue]
    assert len(set(runs)) == len(runs)
    left = ("regimes_fedrane", "regimes_baselines", "regimes_pmfl_full")
    left += ("regimes_moon_ablations", "regimes_fedrcl")
    assert set(runs) == {e for g in left for e in regime_grid.GRIDS[g]}
    grid, baseline = regime_grid.GRID_COMMIT, regime_grid.BASELINES_COMMIT
    assert (grid[:7], baseline[:7]) == ("2a47201", "bb862d9") and len(grid) == len(baseline) == 40
    # the other baselines at the commit that declares them, the protocols' own runs before
    baselines = set(regime_grid.GRIDS["regimes_baselines"])
    assert {c for *run, c in queue if tuple(run) in baselines} == {baseline}
    assert {c for *run, c in queue if tuple(run) not in baselines} == {grid}
    # the declared order of what is left: FedRANE's authors' client, R-FedRANE's MOON,
    # R-PMFL-1000 (its verdict pairs before FedAU), R-MOON's ablations, the rest of R-FedRCL,
    # R-FedRCL's FedProx last
    at = {run: i for i, run in enumerate(runs)}
    steps = [
        [("regime_fedrane", "fedrane_authors", s) for s in (1, 2)],
        [("regime_fedrane", "moon", s) for s in (0, 1, 2)],
        [("regime_pmfl", m, s) for s in (0, 1, 2) for m in ("pmfl", "fedavg_head")],
        [("regime_pmfl", "fedau_head", s) for s in (0, 1, 2)],
        [
            ("regime_moon", m, s)
            for m in ("moon_mu1", "moon_mu01", "fedprox_head")
            for s in (0, 1, 2)
        ],
        [("regime_fedrcl", m, s) for m in ("fedrcl_hard", "fedscl", "moon") for s in (0, 1, 2)],
        [("regime_fedrcl", "fedprox", s) for s in (0, 1, 2)],
    ]
    for before, after in itertools.pairwise(steps):
        assert max(at[r] for r in before) < min(at[r] for r in after), (before, after)
    assert [at[r] for r in steps[2]] == sorted(at[r] for r in steps[2])  # pair by pair


def test_committed_finds_a_run_in_its_protocols_committed_directories(tmp_path):
    _completed(tmp_path / "regimes" / "regime_fedrane" / "moon" / "seed1")
    assert regime_grid.committed("regime_fedrane", "moon", 1, tmp_path)
    assert not regime_grid.committed("regime_fedrane", "moon", 2, tmp_path)
    assert not regime_grid.committed("regime_moon", "moon", 1, tmp_path)  # another protocol's
    _completed(tmp_path / "p3_streams" / "bernoulli" / "pmfl" / "seed0")  # R-PMFL's first dir
    assert regime_grid.committed("p3", "pmfl", 0, tmp_path)
    partial = tmp_path / "regimes" / "regime_fedrane" / "moon" / "seed2"
    partial.mkdir()
    (partial / "summary.json").write_text(
        json.dumps({"status": "interrupted", "rounds_completed": 2, "num_rounds": 3})
    )
    assert not regime_grid.committed("regime_fedrane", "moon", 2, tmp_path)
    (partial / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match="seed2/summary.json cannot be read"):
        regime_grid.committed("regime_fedrane", "moon", 2, tmp_path)


def _git(path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # not a hook's repo
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _repo(path):
    """A git repository with two commits; returns their full hashes."""
    path.mkdir()
    _git(path, "init", "-q")
    heads = []
    for text in ("one", "two"):
        (path / "f.txt").write_text(text)
        _git(path, "add", "f.txt")
        _git(path, "commit", "-q", "-m", text)
        heads.append(_git(path, "rev-parse", "HEAD"))
    return heads


def test_worktree_checks_out_the_commit_once_and_refuses_anything_else(tmp_path, monkeypatch):
    first, second = _repo(tmp_path / "repo")
    monkeypatch.setattr(regime_grid, "ROOT", tmp_path / "repo")
    trees = tmp_path / "trees"
    wt = regime_grid.worktree(first, trees)
    assert wt == trees / first[:7] and (wt / "f.txt").read_text() == "one"
    assert regime_grid.worktree(first, trees) == wt  # there already: used as it is
    (wt / "f.txt").write_text("changed")
    with pytest.raises(ConfigError, match="not a clean checkout.*with changes"):
        regime_grid.worktree(first, trees)
    (wt / "f.txt").write_text("one")
    (wt / "extra.py").write_text("")  # untracked code the launcher would import
    with pytest.raises(ConfigError, match="not a clean checkout"):
        regime_grid.worktree(first, trees)
    (wt / "extra.py").unlink()
    _git(wt, "checkout", "-q", "--detach", second)  # the right folder at another commit
    with pytest.raises(ConfigError, match=f"not a clean checkout of {first}.* at {second}"):
        regime_grid.worktree(first, trees)
    # a plain folder inside a clean checkout at the commit: git would answer for the checkout
    inner = tmp_path / "repo" / "trees"
    (inner / second[:7]).mkdir(parents=True)
    (tmp_path / "repo" / ".git" / "info" / "exclude").write_text("trees/\n")
    with pytest.raises(ConfigError, match="its checkout .*repo at"):
        regime_grid.worktree(second, inner)
    (trees / "0000000").write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        regime_grid.worktree("0" * 40, trees)
    with pytest.raises(ConfigError, match="cannot make a worktree at 1111111"):
        regime_grid.worktree("1" * 40, trees)
    assert regime_grid.worktree(second, tmp_path / "other").joinpath("f.txt").read_text() == "two"


def test_a_queue_skips_committed_runs_and_launches_the_rest_from_their_worktrees(
    tmp_path, monkeypatch, capsys
):
    first, second = _repo(tmp_path / "repo")
    monkeypatch.setattr(regime_grid, "ROOT", tmp_path / "repo")
    results = tmp_path / "repo" / "bench" / "results"
    _completed(results / "regimes" / "regime_fedrane" / "moon" / "seed0")
    queue = [("regime_fedrane", "moon", s, first) for s in (0, 1)]
    queue.append(("regime_fedrane", "moon", 2, second))
    monkeypatch.setattr(regime_grid, "QUEUES", {"q": queue})
    launched = []

    def fake_run(cmd, log, cwd):
        launched.append((cmd[cmd.index("--seed") + 1], cmd[-1], cwd))
        return 0

    monkeypatch.setattr(regime_grid, "run_to_end", fake_run)
    out = tmp_path / "grid"
    monkeypatch.setattr("sys.argv", ["regime_grid", "--out", str(out), "--queue", "q"])
    assert regime_grid.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"regime_fedrane moon seed0 @{first[:7]}: committed"
    trees = out / "worktrees"
    assert launched == [
        ("1", "--fresh", trees / first[:7]),
        ("2", "--fresh", trees / second[:7]),
    ]
    log = (out / "logs" / "commits.txt").read_text().splitlines()
    assert [line.split()[1:] for line in log] == [
        ["regime_fedrane-moon-seed1", "start", first[:7]],
        ["regime_fedrane-moon-seed2", "start", second[:7]],
    ]

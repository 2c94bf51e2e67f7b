"""fl_app.compare: the side-by-side table of an experiment's runs, checked against the P1
table that bench/p1_table.py computed independently from the same committed runs, and on
small run folders for what it leaves out and how it fails."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fl_app import compare
from fl_app.config import load_config
from fl_app.results import mean_curve

ROOT = Path(__file__).resolve().parents[2]
P1_RUNS = ROOT / "bench" / "results" / "p1"


def test_committed_p1_runs_give_the_p1_tables_figures() -> None:
    expected = json.loads((ROOT / "bench" / "results" / "p1.json").read_text())
    rows = {
        r["method"]: r for r in compare.comparison(compare.load_runs(P1_RUNS), "last5", "fedavg")
    }
    assert set(rows) == set(expected)
    for method, want in expected.items():
        got = rows[method]
        assert got["seeds"] == want["seeds"], method
        assert [100 * v for v in got["values"]] == pytest.approx(want["last5_per_seed"]), method
        assert 100 * got["median"] == pytest.approx(want["last5_median"]), method
        assert 100 * got["mean"] == pytest.approx(want["last5_mean"]), method
        assert 100 * got["std"] == pytest.approx(want["last5_std"]), method
        assert 100 * got["best"] == pytest.approx(want["best_mean"]), method
        assert 100 * got["personal"] == pytest.approx(want["personal_last5_mean"]), method
        if method == "fedavg":
            assert got["delta"] is None
        else:
            assert got["delta_against"] == want["matched_fedavg"], method
            if want["gain_vs_matched_fedavg"] is None:
                assert got["delta"] is None, method
            else:
                assert 100 * got["delta"] == pytest.approx(want["gain_vs_matched_fedavg"]), method
    medians = [r["median"] for r in rows.values()]
    assert medians == sorted(medians, reverse=True)


def _run(base: Path, method: str, seed: int, acc: list[float], **summary: Any) -> Path:
    d = base / method / f"seed{seed}"
    d.mkdir(parents=True)
    s = {
        "method": method,
        "seed": seed,
        "status": "completed",
        "rounds_completed": len(acc),
        "num_rounds": len(acc),
        "last5_accuracy": sum(acc[-5:]) / len(acc[-5:]),
        "ema_accuracy": acc[-1] - 0.01,
        "final_accuracy": acc[-1],
        "best_accuracy": max(acc),
        "top5_accuracy": max(acc) - 0.02,
        "last5_personal_accuracy": 0.9,
        "failed_results": 0,
        "dropped_results": 0,
        "wall_seconds": 60.0,
    } | summary
    (d / "summary.json").write_text(json.dumps(s))
    records = [{"round": 0, "accuracy": 0.1}] + [
        {"round": t, "accuracy": a} for t, a in enumerate(acc, 1)
    ]
    (d / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return d


def test_unfinished_runs_are_listed_not_counted_and_delta_pairs_seeds(tmp_path: Path) -> None:
    _run(tmp_path, "fedavg", 0, [0.5, 0.6])
    _run(tmp_path, "fedavg", 1, [0.5, 0.7])
    _run(tmp_path, "fedprox", 1, [0.6, 0.8], failed_results=2)
    _run(tmp_path, "fedprox", 2, [0.9, 0.9])  # no fedavg seed 2: not in Δ
    _run(tmp_path, "fedprox", 3, [0.2], status="interrupted", num_rounds=5)
    runs = compare.load_runs(tmp_path)
    rows = {r["method"]: r for r in compare.comparison(runs, "final", "fedavg")}
    assert rows["fedprox"]["seeds"] == [1, 2] and rows["fedprox"]["values"] == [0.8, 0.9]
    assert rows["fedprox"]["delta"] == pytest.approx(0.1) and rows["fedprox"]["delta_seeds"] == 1
    assert rows["fedprox"]["failed"] == 2 and rows["fedavg"]["delta"] is None
    table = compare.markdown(list(rows.values()), runs, "final", "fedavg")
    assert "| fedprox | 2 | 85.00 | 85.00 ± 5.00 | 80.0 / 90.0 | +10.00 (1) |" in table
    assert "- fedprox seed 3: interrupted after round 1 of 5" in table
    # no baseline: no Δ figures, the rest unchanged
    no_base = compare.comparison(runs, "final", None)
    assert all(r["delta"] is None for r in no_base)


def test_runs_on_different_arithmetic_are_a_caveat(tmp_path: Path) -> None:
    """Summaries' ``numerics`` (core.training.numerics) that differ between the compared
    runs are named under the table; one arithmetic, or runs that do not record it, are not."""
    a, b = "torch 2.14.1, cpu AVX2", "torch 2.14.1, cpu AVX512"
    _run(tmp_path, "fedavg", 0, [0.5, 0.6], numerics=[a])
    _run(tmp_path, "fedprox", 0, [0.5, 0.7], numerics=[a])
    _run(tmp_path, "moon", 0, [0.5, 0.7])  # before numerics was recorded

    def notes() -> list[str]:
        runs = compare.load_runs(tmp_path)
        return compare.caveats(compare.comparison(runs, "final", "fedavg"), runs, "final")

    assert not any("arithmetic" in n for n in notes())
    _run(tmp_path, "fedprox", 1, [0.5, 0.7], numerics=[b])
    assert f"the runs trained on 2 arithmetics ({a}; {b})" in "\n".join(notes())


def test_delta_only_against_fedavg_on_the_same_model_and_optimiser(tmp_path: Path) -> None:
    """MOON has a projection head that FedAvg lacks: no Δ against fedavg (flagged under the
    table), but against fedavg_head (FedAvg on the head model) once it exists; a run whose
    config.yaml gives another client optimiser is not matched either."""
    _run(tmp_path, "fedavg", 0, [0.5, 0.6])
    _run(tmp_path, "moon", 0, [0.6, 0.8])
    runs = compare.load_runs(tmp_path)
    rows = {r["method"]: r for r in compare.comparison(runs, "final", "fedavg")}
    assert rows["moon"]["delta"] is None and rows["moon"]["delta_against"] is None
    assert any("model.projection_dim: 0 -> 256" in d for d in rows["moon"]["baseline_differs"])
    notes = compare.caveats(list(rows.values()), runs, "final")
    assert any(n.startswith("moon: no Δ: no baseline run on its model") for n in notes)
    _run(tmp_path, "fedavg_head", 0, [0.5, 0.7])
    runs = compare.load_runs(tmp_path)
    rows = {r["method"]: r for r in compare.comparison(runs, "final", "fedavg")}
    assert rows["moon"]["delta"] == pytest.approx(0.1)
    assert rows["moon"]["delta_against"] == "fedavg_head"
    assert rows["fedavg_head"]["delta"] is None  # another model: no method Δ
    table = compare.markdown(list(rows.values()), runs, "final", "fedavg")
    assert "| +10.00 (1) vs fedavg_head |" in table
    # a run whose saved config has another momentum (the default experiment has 0.9): not
    # matched by fedavg
    d = _run(tmp_path, "fedprox", 0, [0.7, 0.7])
    cfg = load_config(None, "fedprox", "client.momentum=0.5")
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = {
        r["method"]: r for r in compare.comparison(compare.load_runs(tmp_path), "final", "fedavg")
    }
    assert rows["fedprox"]["delta"] is None
    assert rows["fedprox"]["baseline_differs"] == ["client.momentum: 0.9 -> 0.5"]


def test_mixed_round_counts_are_flagged(tmp_path: Path) -> None:
    _run(tmp_path, "fedavg", 0, [0.5, 0.6])
    _run(tmp_path, "fedavg", 1, [0.5, 0.6, 0.7])
    runs = compare.load_runs(tmp_path)
    rows = compare.comparison(runs)
    assert rows[0]["rounds"] == [2, 3]
    assert "different numbers of rounds" in compare.markdown(rows, runs, "last5", None)


def test_bad_folders_and_summaries_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a folder"):
        compare.load_runs(tmp_path / "missing")
    _run(tmp_path / "p1", "fedavg", 0, [0.5])
    with pytest.raises(ValueError, match=r"its subfolders p1 hold runs: pass .*/<one of them>"):
        compare.load_runs(tmp_path)
    bad = tmp_path / "p1" / "moon" / "seed0"
    bad.mkdir(parents=True)
    (bad / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"moon/seed0/summary.json: not a run summary"):
        compare.load_runs(tmp_path / "p1")


def test_main_prints_the_table_writes_plot_and_exits_2_on_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "exp", "fedavg", 0, [0.5, 0.6, 0.7])
    _run(tmp_path / "exp", "fedrcl", 0, [0.6, 0.7, 0.8])
    out_md, png = tmp_path / "t.md", tmp_path / "c.png"
    code = compare.main(
        [str(tmp_path / "exp"), "--metric", "best", "--plot", str(png), "--output", str(out_md)]
    )
    printed = capsys.readouterr().out
    assert code == 0 and printed == out_md.read_text()
    assert printed.splitlines()[2].startswith("| fedrcl | 1 | 80.00 |")
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert compare.main([str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_bad_output_paths_exit_2_before_the_runs_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    no_runs = str(tmp_path / "nothing")  # a bad runs folder too: the path is told first
    for output, reason in [
        (afile / "x.md", f"{afile} is a file, not a folder"),
        (afile / "sub" / "x.md", f"{afile} is a file, not a folder"),
        (tmp_path, "it is a folder"),
    ]:
        assert compare.main([no_runs, "--output", str(output)]) == 2
        out, err = capsys.readouterr()
        assert out == "", output
        assert err == (
            f"compare: cannot write the table to {output}: {reason}; choose another --output\n"
        )


def test_plot_must_name_an_image_file_matplotlib_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "exp", "fedavg", 0, [0.5, 0.6])
    exp = str(tmp_path / "exp")
    assert compare.main([exp, "--plot", str(tmp_path / "curves.xyz")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # told before the table, not after
    formats = ", .".join(compare.plot_formats())
    assert f"matplotlib cannot write .xyz images; use one of .{formats}\n" in err
    assert {"png", "pdf", "svg"} <= set(compare.plot_formats())
    no_ext = tmp_path / "curves"
    assert compare.main([exp, "--plot", str(no_ext)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"--plot {no_ext} has no file extension" in err
    assert f"name it e.g. {no_ext}.png (one of .{formats})" in err
    assert not list(tmp_path.glob("curves*"))  # nothing written under another name
    for folder in (tmp_path / "exp", tmp_path / "plots.png"):
        folder.mkdir(exist_ok=True)
        assert compare.main([exp, "--plot", str(folder)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == (
            f"compare: cannot write the curves to {folder}: it is a folder; choose another --plot\n"
        )
    svg = tmp_path / "new" / "C.SVG"  # the extension's case does not matter, as for savefig
    assert compare.main([exp, "--plot", str(svg)]) == 0
    assert capsys.readouterr().err.endswith(f"curves: {svg}\n")
    assert svg.read_bytes().startswith(b"<?xml")


def test_unwritable_places_and_failed_writes_exit_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.figure

    _run(tmp_path / "exp", "fedavg", 0, [0.5, 0.6])
    exp = str(tmp_path / "exp")
    ro = tmp_path / "ro"
    ro.mkdir()
    access = os.access  # a read-only folder, even for root (who may write anywhere)
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != ro and access(p, mode))
    for option, what in (("--plot", "curves"), ("--output", "table")):
        target = ro / "sub" / "c.png"  # a missing folder is made in the nearest existing one
        assert compare.main([exp, option, str(target)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == (
            f"compare: cannot write the {what} to {target}: no permission to write in {ro}; "
            f"choose another {option}\n"
        )
    existing = ro / "table.md"  # a writable file there (or /dev/stdout) is writable
    existing.write_text("")
    assert compare.main([exp, "--output", str(existing)]) == 0
    assert existing.read_text().startswith("| method |")
    capsys.readouterr()
    monkeypatch.undo()

    # failures the checks cannot foresee: after the table, still a message and exit 2
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", refuse)
    png = tmp_path / "c.png"
    assert compare.main([exp, "--plot", str(png)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("| method |")
    assert f"compare: cannot write the curves to {png}: [Errno 13] Permission denied;" in err

    def no_latex(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("'xelatex' not found")  # what .pgf says without LaTeX

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", no_latex)
    assert compare.main([exp, "--plot", str(tmp_path / "c.pgf")]) == 2
    assert "c.pgf: 'xelatex' not found; choose another --plot" in capsys.readouterr().err
    monkeypatch.setattr(compare, "_unwritable", lambda path: None)
    assert compare.main([exp, "--output", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("| method |")
    assert f"compare: cannot write the table to {tmp_path}: [Errno 21] Is a directory" in err


def test_every_metric_reads_its_summary_key(tmp_path: Path) -> None:
    _run(tmp_path, "fedavg", 0, [0.2, 0.9, 0.4])
    runs = compare.load_runs(tmp_path)
    got = {m: compare.comparison(runs, m)[0]["median"] for m in compare.METRICS}
    want = {"final": 0.4, "ema": 0.39, "best": 0.9, "top5": 0.88, "last5": 0.5}
    assert got == pytest.approx(want)


def test_runs_without_a_summary_are_listed_as_running_or_killed(tmp_path: Path) -> None:
    _run(tmp_path, "fedavg", 0, [0.5, 0.6])
    for seed in (1, 2):  # a run in progress (lock held) and one killed before its summary
        d = _run(tmp_path, "fedavg", seed, [0.5, 0.6, 0.7])
        (d / "summary.json").unlink()
    lock = (tmp_path / "fedavg" / "seed1" / "run.lock").open("a+")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        runs = compare.load_runs(tmp_path)
    finally:
        lock.close()
    assert list(runs["fedavg"].completed) == [0]
    assert runs["fedavg"].unfinished == [
        "fedavg seed 1: running, 3 round(s) logged",
        "fedavg seed 2: no summary.json (killed?), 3 round(s) logged",
    ]


def test_other_folders_are_ignored_and_bad_summaries_named(tmp_path: Path) -> None:
    _run(tmp_path, "fedavg", 0, [0.5])
    (tmp_path / "fedavg" / "seed0.bak").mkdir()
    (tmp_path / "fedavg" / "seed0.bak" / "summary.json").write_text("{}")
    (tmp_path / "fedavg" / "notes").mkdir()
    assert list(compare.load_runs(tmp_path)["fedavg"].completed) == [0]
    bad = tmp_path / "moon" / "seed3"
    bad.mkdir(parents=True)
    (bad / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"moon/seed3/summary.json: not a run summary"):
        compare.load_runs(tmp_path)


def test_missing_round_logs_and_metrics_are_said_not_hidden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path, "fedavg", 0, [0.5, 0.6], status="interrupted")  # the baseline: unfinished
    (_run(tmp_path, "moon", 0, [0.6, 0.7]) / "rounds.jsonl").unlink()
    _run(tmp_path, "pmfl", 0, [0.6, 0.7], final_accuracy=None)
    assert (
        compare.main([str(tmp_path), "--metric", "final", "--plot", str(tmp_path / "c.png")]) == 0
    )
    out, err = capsys.readouterr()
    assert "- pmfl: its completed runs have no final_accuracy" in out
    assert "- fedavg seed 0: interrupted after round 2 of 2" in out
    assert "no completed fedavg runs" in err and "not plotted: moon seed 0" in err


def test_a_light_run_is_plotted_from_its_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed run in the light form (``curve.json``, no round log: bench/light.py)
    is drawn from its kept rounds, as a full run from its round log."""
    import json

    drawn: list[list[int]] = []  # the rounds of each method's first curve

    def mean_curve(curves: list[Any]) -> tuple[list[int], list[float]]:
        drawn.append([r for r, _ in curves[0]])
        return [1], [1.0]

    monkeypatch.setattr(compare, "mean_curve", mean_curve)
    light = _run(tmp_path, "moon", 0, [0.6, 0.7, 0.8])
    records = [{"round": r, "accuracy": a} for r, a in enumerate([0.1, 0.6, 0.7, 0.8])]
    (light / "rounds.jsonl").unlink()
    (light / "curve.json").write_text(json.dumps({"format": 1, "records": records}))
    _run(tmp_path, "fedavg", 0, [0.5, 0.6, 0.7])
    assert compare.main([str(tmp_path), "--plot", str(tmp_path / "c.png")]) == 0
    assert "not plotted" not in capsys.readouterr().err
    assert drawn == [[1, 2, 3], [1, 2, 3]] and (tmp_path / "c.png").is_file()


def test_seed_curves_are_averaged_by_round_number() -> None:
    rounds, means = mean_curve([[(1, 0.5), (2, 0.6), (4, 0.8)], [(2, 0.4), (4, 0.6), (6, 0.9)]])
    assert rounds == [2, 4] and means == pytest.approx([0.5, 0.7])


def test_a_plot_with_no_completed_run_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _run(tmp_path / "exp", "fedavg", 0, [0.5, 0.6, 0.7])
    (d / "summary.json").unlink()  # killed: listed, not counted
    png = tmp_path / "c.png"
    assert compare.main([str(tmp_path / "exp"), "--plot", str(png)]) == 0
    assert f"no curves drawn to {png}: no run has completed" in capsys.readouterr().err
    assert not png.exists()


def test_rows_that_mix_settings_or_short_runs_are_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A seed run with another SET lands in the same row: the table says which keys differ;
    rows of different round counts and a last-5 over 3-round runs are flagged too."""
    import yaml

    for seed, lr in ((0, 0.01), (1, 0.05)):
        d = _run(tmp_path / "exp", "fedavg", seed, [0.5, 0.6, 0.7])
        cfg = {"seed": seed, "output_dir": "/x", "client": {"lr": lr}, "server": {"name": "a"}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    _run(tmp_path / "exp", "moon", 0, [0.5, 0.6, 0.7, 0.8])
    assert compare.main([str(tmp_path / "exp")]) == 0
    out = capsys.readouterr().out
    assert "Read with care:" in out
    assert "- fedavg: its seeds ran with different settings (client.lr): the row mixes" in out
    assert "- the rows ran different numbers of rounds (3, 4)" in out
    assert "- runs of 3 rounds: last-5 accuracy % is over all of their rounds" in out
    assert compare.main([str(tmp_path / "exp"), "--metric", "final"]) == 0
    assert "runs of 3 rounds" not in capsys.readouterr().out
